#if canImport(Glibc)
import Glibc
#endif
import CSQLite
import Posix

/// Transactions: every change is one of a group of changes committed together (a savepoint
/// in it, the first being the transaction itself)
/// (see `groupCommitDelay`), and the write-ahead log is checkpointed off the request path.
extension CacheStore {
    /// Changes are committed in groups: the first change after a commit opens one SQLite
    /// transaction, which is committed on fsync, once it holds `groupCommitSize` changes,
    /// `groupBytes` of data, or `groupCommitDelay` after it began (by the committing thread,
    /// `commitWhenDue`). Many files' creates and small writes then cost one log append and
    /// one round of locks instead of one each. Readers of the database file see a change
    /// within `groupCommitDelay`; a kill -9 of the daemon loses at most the changes of that
    /// last interval that were not fsynced; the database is consistent either way.
    public static let groupCommitDelay = 0.005
    static let groupCommitSize = 256

    /// The write-ahead log is copied into the database file (a checkpoint) by the committing
    /// thread once no change came for `checkpointQuiet` seconds or the log has grown — not
    /// inside a request, as SQLite's automatic checkpoint would.
    public static let checkpointQuiet = 0.1
    /// See `checkpointIfDue`: the log is copied from `checkpointThreshold` bytes on, started
    /// over under the lock from `restartThreshold` on, and never holds much more than `logBound`.
    static let checkpointThreshold: Int64 = 8 << 20
    static let restartThreshold: Int64 = 16 << 20
    public static let logBound: Int64 = 64 << 20
    /// The log's file is kept up to this size, written over from its start each time SQLite
    /// starts the log over (`journal_size_limit`): a commit that overwrites blocks the file
    /// has costs a flush of the data, one that lengthens it a journal commit of the host
    /// file system too.
    static let keptLogSize: Int64 = 16 << 20

    func withLock<T>(_ body: () throws(Errno) -> T) throws(Errno) -> T {
        try lock.withLock { () throws(Errno) -> T in
            defer {
                if (committerAwaitsGroup && batchStart != nil) || (committerAwaitsData && (inline.since != nil || !data.unrecorded.isEmpty)) {
                    (committerAwaitsGroup, committerAwaitsData) = (false, false)
                    committerWakes += 1
                    committerWake.post()
                }
            }
            return try body()
        }
    }

    /// Runs `body` in one write transaction (rolled back if it throws). On a full disk the
    /// write-ahead log is checkpointed and truncated (giving its space back) and the body
    /// tried once more, so that a delete can still free space.
    func transaction<T>(_ body: () throws(Errno) -> T) throws(Errno) -> T {
        try withLock { () throws(Errno) -> T in try change(body) }
    }

    /// `transaction` with the lock already held: one savepoint in the open group (the first
    /// change of a group is the transaction itself). What the store keeps in memory beside
    /// the database (small files' buffers, large files' state, the orphans) is restored with
    /// the savepoint when the body throws. `refresh`: the change only copies what data files
    /// hold into their rows — background work, and no change of the tree for an fsync to sync.
    func change<T>(refresh: Bool = false, _ body: () throws(Errno) -> T) throws(Errno) -> T {
            if !refresh { lastChange = .now }
            var attempt = 0
            defer { freeBytesNow = nil }
            while true {
                attempt += 1
                freeBytesNow = freeDiskBytes()
                // The first change of a group needs no savepoint: undoing it is undoing the
                // transaction (two statements less for an fsync's store, the usual group of one).
                let first = batchStart == nil || !database.isInTransaction
                try openBatch()
                if !first { try run("SAVEPOINT change") }
                let saved = (inline, data, orphans)
                do throws(Errno) {
                    let result = try body()
                    if !first { try run("RELEASE change") }
                    batchChanges += 1
                    if !refresh { treeChanges += 1 }
                    if batchChanges >= Self.groupCommitSize || batchBytes >= Self.groupBytes
                        || !hasRoomForGroups(free: freeBytesNow) { try commitBatch() }
                    return result
                } catch {
                    (inline, data, orphans) = saved
                    if database.isInTransaction && first {
                        try? exec("ROLLBACK")
                        batchStart = nil
                    } else if database.isInTransaction {
                        try? exec("ROLLBACK TO change")
                        try? exec("RELEASE change")
                    }
                    noticeRollback()
                    guard error == .noSpace, attempt == 1 else { throw error }
                    try? commitBatch()
                    truncateLog()
                }
            }
    }

    /// Opens a group of changes unless one is open (lock held).
    func openBatch() throws(Errno) {
        noticeRollback()
        guard batchStart == nil else { return }
        try run("BEGIN IMMEDIATE")
        batchStart = .now
        batchChanges = 0
        batchBytes = 0
        batchTotalChanges = database.totalChanges
        batchMovedPages = false
    }

    /// Commits the open group, if any (lock held). A failed commit loses the group: said
    /// in the log, and the error goes to the caller.
    func commitBatch() throws(Errno) {
        noticeRollback()
        guard batchStart != nil else { return }
        if !doomed.isEmpty {
            do throws(Errno) {
                try deleteDoomed()
            } catch {
                Log.error("cache: \(doomed.count) deleted files' rows could not be deleted: \(error)")
            }
        }
        batchStart = nil
        do throws(Errno) {
            let changedRows = database.totalChanges != batchTotalChanges || batchMovedPages
            try run("COMMIT")
            // A group that changed nothing wrote nothing to the log: no checkpoint, no work.
            guard changedRows else { return }
            commits += 1
            uncheckpointed = true
            lastCommit = .now
            backgroundWork?()  // the size limit may be passed now
            // Short of disk, the log is emptied at once: its pages are what fills the disk,
            // and a delete frees nothing until they are in the database file.
            if !hasRoomForGroups(free: freeDiskBytes()) {
                truncateLog()
            }
        } catch {
            Log.error("cache: \(batchChanges) changes could not be committed: \(error)")
            try? exec("ROLLBACK")
            throw error
        }
    }

    /// Copies the whole log into the database and truncates it, under the lock (short of
    /// disk: the log's pages are what fills it, and a delete frees nothing until they are
    /// copied); true when done, and then every commit is durable.
    @discardableResult
    func truncateLog() -> Bool {
        guard (try? database.checkpoint(mode: SQLITE_CHECKPOINT_TRUNCATE, waitingAtMost: 1)) != nil else { return false }
        database.noteLogCopied()
        uncheckpointed = false
        noteDurable(commits)
        return true
    }

    /// Groups only with plenty of free disk: SQLite answers a full disk by rolling back the
    /// whole transaction, which must then hold this one change only, not others already
    /// acknowledged (an `rm` in the same group would be lost with it).
    func hasRoomForGroups(free: UInt64?) -> Bool {
        guard let free else { return false }
        return free >= Self.reservedBytes + Self.groupRoom
    }

    /// A group is committed once its changes wrote `groupBytes` of file data, so that the
    /// log (which a checkpoint cannot copy before the commit) stays small.
    static let groupBytes = 8 << 20
    /// Room a group may need: `groupBytes` plus one write of 1 MiB (libfuse's max_write),
    /// with a wide margin for the pages SQLite rewrites around them.
    static let groupRoom: UInt64 = 64 << 20

    /// SQLite rolls the whole transaction back on some errors (a full disk, I/O) of any
    /// statement, also of those run outside `transaction` (open and release bookkeeping):
    /// the group is then gone, and the next change opens a new one.
    func noticeRollback() {
        guard batchStart != nil, !database.isInTransaction else { return }
        Log.error("cache: \(batchChanges) changes were rolled back by SQLite after an error")
        batchStart = nil
    }

    /// One pass of the committing thread: a group committed when due, buffered data
    /// stored when due, the log checkpointed when due; idle, it sleeps up to `idleSleep`.
    public func committingPass(idleSleep: Double) {
        let unrecordedDue = lock.withLock { data.unrecorded.values.map(\.since).min().map { max(0.01, Self.recordDelay - $0.secondsElapsed) } }
        commitWhenDue(waitingAtMost: min(needsCheckpoint ? Self.checkpointQuiet : idleSleep, buffersDue ?? idleSleep,
                                         unrecordedDue ?? idleSleep))
        storeBuffersWhenDue()
        recordConversions(olderThan: Self.recordDelay)
        checkpointIfDue()
        // Data files whose deletion a checkpoint or an fsync made durable, with the lock let go.
        for key in lock.withLock({ closed ? [] : takeRemovableDataFiles() }) { folder.remove(key) }
    }

    /// For the committing thread: with a group open, waits until it is `groupCommitDelay`
    /// old and commits it (a younger one, opened after an fsync committed that one, is left
    /// for the next pass); with none, waits (at most `seconds`: with data buffered, until
    /// it is due) until a request leaves a group open, or data buffered where there was none.
    public func commitWhenDue(waitingAtMost seconds: Double) {
        let started = lock.withLock { () -> ContinuousClock.Instant? in
            // Buffered data needs a wake only from a long wait: one that ends within
            // `bufferDelay` (a checkpoint pending, say) comes back in time to store it.
            if batchStart == nil {
                (committerAwaitsGroup, committerAwaitsData) = (true, inline.since == nil && data.unrecorded.isEmpty && seconds > Self.bufferDelay)
            }
            return batchStart
        }
        guard let started else {
            committerWake.wait(seconds: seconds)
            lock.withLock { (committerAwaitsGroup, committerAwaitsData) = (false, false) }
            return
        }
        let left = Self.groupCommitDelay - started.secondsElapsed
        if left > 0 { usleep(UInt32(min(left, seconds) * 1e6)) }
        _ = try? withLock { () throws(Errno) in
            if let open = batchStart, open.secondsElapsed >= Self.groupCommitDelay * 0.99 { try commitBatch() }
        }
    }

    /// Wakes a thread waiting in `commitWhenDue` (at shutdown).
    public func wakeCommitter() { committerWake.post() }

    /// Committed changes wait for a checkpoint (the committing thread then comes back
    /// within `checkpointQuiet` rather than sleeping long).
    public var needsCheckpoint: Bool { lock.withLock { uncheckpointed || data.doomed.contains { $0.commit > durableCommits } } }

    /// The write-ahead log stays under `logBound`, whatever the write load:
    /// - once the store is quiet for `checkpointQuiet`, or the log holds `checkpointThreshold`
    ///   bytes, a PASSIVE checkpoint copies it into the database file on a connection of its
    ///   own, without the store's lock, while requests go on;
    /// - a writer that never pauses keeps the log from being reused (SQLite starts it over
    ///   only when everything in it was copied and no transaction is open), so when it
    ///   still holds `restartThreshold` bytes after that, the store's lock is taken, the
    ///   group committed, and a RESTART checkpoint copies the little the PASSIVE one left,
    ///   so that the next commit starts the log over (and SQLite cuts its file back to
    ///   `keptLogSize`). Requests wait only for that remainder;
    /// - a quiet store whose log file is larger than `keptLogSize` gets the same, and one
    ///   commit that changes a row and back, which starts the log over and so cuts the file
    ///   back to `keptLogSize`; a smaller one keeps it, to be written over.
    /// - a writer faster than the checkpoints (a slow or busy disk) waits for one: once the
    ///   log holds `writerWaitThreshold` bytes, a write first runs `checkpointIfDue` itself,
    ///   after the one under way (`makeRoomInLog`), so the log never holds much more than
    ///   that threshold and one group, whatever the disk's speed.
    public func checkpointIfDue() { checkpoint(pressed: false) }

    /// From `writerWaitThreshold` bytes in the log, a writer checkpoints before it writes
    /// (without the store's lock; see `checkpointIfDue`).
    static let writerWaitThreshold: Int64 = 32 << 20

    func logBytes(frames: Int) -> Int64 { Int64(frames) * Int64(pageSize + 24) }

    /// For a write (store's lock not held): waits for a checkpoint if the log is large.
    func makeRoomInLog() {
        guard logBytes(frames: lock.withLock { database.logFrames }) >= Self.writerWaitThreshold else { return }
        checkpoint(pressed: true)
    }

    func checkpoint(pressed: Bool) {
        let (pending, quiet, frames) = lock.withLock {
            (uncheckpointed && !closed, lastCommit.secondsElapsed >= Self.checkpointQuiet && batchStart == nil, database.logFrames)
        }
        guard pending else { return }
        // What the log holds (not its file's size, which stays after SQLite starts it over:
        // judged by the file, every pass past 8 MiB would checkpoint — two syncs — again).
        // The file's size still counts past `logBound` × 3/4: the bound holds even if the
        // count were wrong.
        let fileBytes = Self.fileSize(path + "-wal")
        let held = max(logBytes(frames: frames), fileBytes >= Self.logBound / 4 * 3 ? fileBytes : 0)
        guard quiet || held >= Self.checkpointThreshold else { return }
        checkpointLock.withLock {
            if lock.withLock({ closed }) { return }
            // A writer that waited for the checkpoint under way may find nothing left to do.
            if pressed, logBytes(frames: lock.withLock { database.logFrames }) < Self.writerWaitThreshold { return }
            do {
                let connection: SQLiteDatabase
                if let checkpointer {
                    connection = checkpointer
                } else {
                    connection = try SQLiteDatabase(path: path)
                    // journal_mode reads the header: a connection that has read nothing yet
                    // does not know the database is in WAL mode and checkpoints nothing.
                    try connection.execute("PRAGMA busy_timeout=5000; PRAGMA wal_autocheckpoint=0; PRAGMA journal_mode=WAL;")
                    checkpointer = connection
                }
                let (started, committed) = lock.withLock { (lastCommit, commits) }
                let result = try connection.checkpoint(mode: SQLITE_CHECKPOINT_PASSIVE)
                Log.debug("cache: checkpoint copied \(result.copied) of \(result.log) log frames (\(held) bytes)")
                // Everything copied (the log synced first, the database after): every commit
                // made before is durable, and with nothing committed meanwhile nothing is pending.
                if result.copied >= result.log {
                    lock.withLock {
                        if lastCommit == started { uncheckpointed = false }
                        noteDurable(committed)
                    }
                }
                let pageSize = Int64(self.pageSize)
                let complete = result.copied >= result.log
                // Over the threshold while writes go on, or everything copied while quiet and
                // the file left large: the log started over under the lock.
                let large = quiet && complete && Self.fileSize(path + "-wal") > Self.keptLogSize
                if large || (!quiet && Int64(result.log) * (pageSize + 24) >= Self.restartThreshold) {
                    lock.withLock {
                        do {
                            try commitBatch()
                            try database.checkpoint(mode: SQLITE_CHECKPOINT_RESTART, waitingAtMost: 0.05)
                            database.noteLogCopied()
                            if lastCommit == started { uncheckpointed = false }
                            if large {
                                // A commit that leaves a row as it was starts the log over, and
                                // SQLite cuts the file back to `keptLogSize` with it (not to
                                // nothing: the next commits write over what is kept). A change
                                // and its undo: an update to the same value writes no page.
                                try exec("""
                                    BEGIN IMMEDIATE; UPDATE totals SET files = files + 1 WHERE id = 1;
                                    UPDATE totals SET files = files - 1 WHERE id = 1; COMMIT;
                                    """)
                                uncheckpointed = true
                            }
                        } catch {
                            if batchStart == nil && database.isInTransaction { try? exec("ROLLBACK") }
                            Log.error("cache: checkpoint (restart): \(error)")
                        }
                    }
                }
            } catch {
                Log.error("cache: checkpoint: \(error)")
            }
        }
    }

    static func fileSize(_ path: String) -> Int64 {
        (try? Syscall.stat(path)).map { Int64($0.st_size) } ?? 0
    }
}

// MARK: Durability

extension CacheStore {
    /// fsync of `ino` (nil: of a directory, the tree alone). A large file's data file is
    /// synced first (with the folder, the first time after it was made), and an unrecorded
    /// conversion recorded after that; then, when the tree changed since the log was last
    /// synced (names, attributes, small files' bytes — this file's buffer stored now), the
    /// open group is committed and the log synced (`fdatasync`, as SQLite syncs it: data and
    /// size, not times). No sync runs under the store's lock: requests of other files never
    /// wait for the disk. A large file written in place that nothing else changed costs one
    /// `fdatasync` of its data file.
    public func synchronize(_ ino: Int64? = nil) throws(Errno) {
        let file = try withLock { () throws(Errno) -> DataFile? in
            guard let ino else { return nil }
            let inode = try storedInode(ino)
            if inline.files[ino] != nil { try change { () throws(Errno) in try storeBuffer(ino) } }
            let file = try dataFile(inode)
            if file != nil { data.unsynced.remove(ino) }
            return file
        }
        if let file, let ino {
            do throws(Errno) {
                try Syscall.fdatasync(file.fd)
            } catch {
                lock.withLock { _ = data.unsynced.insert(ino) }
                throw error
            }
            if lock.withLock({ data.unrecorded[ino] != nil }) {
                recordConversions(olderThan: nil, only: ino)
                guard lock.withLock({ data.unrecorded[ino] == nil }) else { throw .ioError }
            }
        }
        let (log, covered) = try withLock { () throws(Errno) -> (Int32?, (tree: Int64, commits: Int)?) in
            guard treeChanges != syncedTreeChanges else { return (nil, nil) }
            try commitBatch()
            return (logFile(), (treeChanges, commits))
        }
        guard let covered else { return }
        if let log { try Syscall.fdatasync(log) }
        lock.withLock {
            syncedTreeChanges = max(syncedTreeChanges, covered.tree)
            noteDurable(covered.commits)
        }
    }

    /// Commits up to `commit` are durable (lock held): data files whose rows they deleted
    /// may go (the maintenance thread removes them).
    func noteDurable(_ commit: Int) {
        guard commit > durableCommits else { return }
        durableCommits = commit
        if data.doomed.contains(where: { $0.commit <= commit }) { backgroundWork?() }
    }

    /// The write-ahead log's descriptor, opened once (nil: no log, all is in the database
    /// file) (lock held). SQLite keeps the file while a connection is open: truncated or
    /// started over, never replaced.
    func logFile() -> Int32? {
        if logDescriptor == nil { logDescriptor = try? Syscall.open(path + "-wal", O_RDONLY | O_CLOEXEC) }
        return logDescriptor
    }
}
