#if canImport(Glibc)
import Glibc
#endif
import CSQLite
import Posix

/// A POSIX file tree in one SQLite database — inodes, directory entries, symlink targets,
/// extended attributes and the bytes of small files — with the bytes of large files in
/// sparse files of their own beside it (`DataFolder`), as Core Data keeps large values
/// beside its store. The errno rules are Linux ext4's.
///
/// Changes are grouped into SQLite transactions (`GroupCommit`): each change after the
/// first is a savepoint in the open group, so a failing change rolls back alone. A small
/// file's writes are buffered (`InlineBuffers`) and stored as one row; a large file's go
/// straight to its data file with `pwrite`, outside the store's lock, and its size, times
/// and blocks are the data file's. `synchronize` syncs the file's data file and, when the
/// tree changed since the last sync, commits and syncs the write-ahead log; checkpoints run
/// off the request path. Inodes that lost their last name but are still open or held
/// (`InodeHolders`: the kernel's references, counted by the mounted tree) stay until
/// `released`/`unheld` see the last reference go. Memory does not grow with file size:
/// a small file is buffered whole, a large one not at all.
///
/// Thread-safety: one connection behind a mutex; every public method takes it. What runs
/// while it is held: SQLite's statements and commits (appends to the write-ahead log, not
/// synced); an append's `pwrite` (its start is the file's size, read in the same visit, so
/// that two appenders never write at one end); a conversion's copy of a small file's bytes
/// (at most `inlineLimit`) into its new data file; and, when the log passes
/// `restartThreshold` while writes go on or is left larger than `keptLogSize` when quiet, a
/// RESTART checkpoint that starts it over (it syncs the log and the database file). Every
/// other write of a data file, every fsync of one and of the log, the PASSIVE checkpoints
/// and reads of data files run with the lock let go.
public final class CacheStore: @unchecked Sendable {
    public static let maximumNameLength = 255
    public static let rootInode: Int64 = 1
    static let schemaVersion: Int64 = 5
    /// A regular file's bytes stay in the database while they are one run from its start of
    /// at most this many bytes (the rest of its size reads as zeros); a write past it, or one
    /// that would leave a hole, a `fallocate` or a `copy_file_range` of a large range moves
    /// them to a data file of their own. Postmark's files (512 B to 64 KiB) stay inside,
    /// where SQLite wins; see docs/performance.md.
    public static let inlineLimit = 64 * 1024

    let path: String
    let database: SQLiteDatabase
    let folder: DataFolder
    /// Read once at open (the connection is used under `lock` only).
    var pageSize = 4096
    /// Incremental vacuum is on (databases made before it stay without).
    var vacuums = false
    /// Set by `close()`: background work stops.
    var closed = false
    let lock = Lock()
    var statements: [String: Statement] = [:]
    /// Who holds inodes besides open handles (the kernel, through the mounted tree).
    let holders: (any InodeHolders)?
    /// Open handles per inode (they keep an unlinked inode, and a file from eviction).
    var opens: [Int64: Int] = [:]
    /// Files removed to stay under the size limit, and because their expiry time passed.
    var evictions = 0
    var expirations = 0
    /// When the last change (not background work) was made, and since when free pages wait
    /// to be given back.
    var lastChange = ContinuousClock.now
    var vacuumWanted: ContinuousClock.Instant?
    /// Inodes that lost their last name while the kernel or an open handle still held them:
    /// deleted when the last reference goes (others need no look at the database then).
    var orphans: Set<Int64> = []
    /// Orphans nothing holds any more, let go while a group of changes was open: their rows
    /// are deleted with the group's commit (`deleteDoomed`), a few hundred in one go, not
    /// each in a change of its own while the next request waits for the lock (`rm -r`: a
    /// FORGET after every UNLINK). Unreachable meanwhile: no name, no reference, no handle.
    var doomed: Set<Int64> = []
    /// Small files' writes not yet in the database, and how much longer the committing
    /// thread waits after a failure to store them.
    var inline = InlineBuffers()
    var storeBackoff = 0.0
    /// Large files' state (`DataFiles`): the data files in use, conversions not yet recorded
    /// in their rows, rows behind their data files, and data files to remove.
    var data = DataFileState()

    // Group commit and durability (`GroupCommit`).
    /// When the open group of changes began (nil: none open), and how many it holds.
    var batchStart: ContinuousClock.Instant?
    var batchChanges = 0
    /// Bytes of file data the open group wrote (see `groupBytes`).
    var batchBytes = 0
    /// The connection's count of changed rows when the group opened: a group that changed
    /// nothing leaves no log to checkpoint.
    var batchTotalChanges: Int64 = 0
    /// The open group changed pages without changing rows (incremental vacuum).
    var batchMovedPages = false
    /// Changes of the tree (names, attributes, small files' bytes, a data file recorded) made
    /// since the store opened, and how many of them a sync of the log covers: an fsync syncs
    /// the log only when they differ. (A large file's size and blocks copied into its row
    /// are no such change: its data file has them.)
    var treeChanges: Int64 = 0
    var syncedTreeChanges: Int64 = 0
    /// Groups committed since the store opened, and how many of them are known durable (the
    /// log synced, or checkpointed whole): data files whose rows went are removed then.
    var commits = 0
    var durableCommits = 0
    /// The write-ahead log, opened at the first fsync and kept for the next ones.
    var logDescriptor: Int32?
    /// Wakes the committing thread (see `committerAwaitsGroup`), and at shutdown.
    let committerWake = Semaphore()
    /// The committing thread waits for a wake with no group open (`committerAwaitsGroup`),
    /// and, in a wait longer than `bufferDelay`, with nothing buffered (`committerAwaitsData`)
    /// (lock held). The store wakes it when the lock is let go with a group left open, or
    /// data buffered, that it does not know of — not when a group opens: a group opened and
    /// committed within one request (an fsync) needs no thread.
    var committerAwaitsGroup = false
    var committerAwaitsData = false
    /// Wakes of the committing thread posted by requests (`activity`: an idle store posts none).
    var committerWakes = 0
    /// Called (with the lock held: it must only wake a thread) when there is work for the
    /// maintenance thread (`maintain`, `reclaimStep`): a group committed (the size limit may
    /// be passed), data files to remove, an expiry time set.
    public var onBackgroundWork: (@Sendable () -> Void)? {
        get { lock.withLock { backgroundWork } }
        set { lock.withLock { backgroundWork = newValue } }
    }
    var backgroundWork: (@Sendable () -> Void)?
    /// Committed changes not yet checkpointed, and when the last change was committed.
    var uncheckpointed = false
    var lastCommit = ContinuousClock.now
    /// The checkpointer's own connection and lock: it never waits for the request path.
    var checkpointer: SQLiteDatabase?
    let checkpointLock = Lock()

    // Free space (`requireHeadroom`).
    var lastMeasurement: (free: UInt64, at: ContinuousClock.Instant)?
    /// Measured once per change (lock held): its headroom check and the decision to keep
    /// grouping share one statvfs.
    var freeBytesNow: UInt64?

    /// The extended attribute that makes a file disappear at a time (Unix seconds or ISO 8601).
    public static let expiryAttribute = "user.cache.expires"

    /// Whether this open ran the full integrity check (after an unclean shutdown).
    public internal(set) var checkedAtOpen = false

    /// Opens (creating the schema if the file is new, upgrading an older one) the cache
    /// database at `path` and its data folder beside it (`DataFolder.path(besides:)`). What
    /// takes long (the full check after an unclean shutdown, an upgrade) is said through
    /// `progress`, about once a second. After an unclean shutdown the full check runs, data
    /// files that no row names are removed and large files' rows are read again from their
    /// data files; a clean open reads only the header, the schema and the mark.
    public init(path: String, owner: (uid: UInt32, gid: UInt32), holders: (any InodeHolders)? = nil,
                progress: @escaping (String) -> Void = { _ in }) throws(CacheStoreError) {
        self.path = path
        self.holders = holders
        folder = DataFolder(path: DataFolder.path(besides: path))
        do {
            database = try SQLiteDatabase(path: path)
        } catch {
            throw .damaged("\(path): \(error.message)")
        }
        do {
            try database.execute("PRAGMA busy_timeout=5000;")
            guard try database.scalarText("PRAGMA application_id") == String(CacheDatabase.applicationID) else {
                throw CacheStoreError.damaged("\(path) is not an mtmfs cache database (application_id)")
            }
            // The header and schema are read here: a file that is not a database fails now.
            try database.execute("""
                PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL; PRAGMA foreign_keys=OFF;
                PRAGMA secure_delete=OFF; PRAGMA journal_size_limit=\(Self.keptLogSize);
                """)
            // A change in an open group is a savepoint, whose undo pages SQLite keeps in a
            // statement journal: a temporary file by default, made and removed for nearly
            // every change. Kept in memory, where it lives only as long as one change.
            try database.execute("PRAGMA temp_store=MEMORY;")
            // Checkpoints are the committing thread's, off the path of requests.
            try database.execute("PRAGMA wal_autocheckpoint=0;")
            database.countLogFrames()  // (after the pragma: it replaces the hook)
            try folder.make()
            let clean = try Schema.open(database, path: path, folder: folder, owner: owner, progress: progress)
            if !clean {
                try fullCheck(progress: progress, reason: "after an unclean shutdown")
                try Schema.sweep(database, folder: folder, progress: progress)
            }
            pageSize = database.pageSize
            vacuums = try database.scalarText("PRAGMA auto_vacuum") == "2"
            // Unclean from now on, until `close()` marks it clean again — durably, before any
            // request: a clean mark that a power cut brings back would have the next mount
            // trust rows that data files written meanwhile no longer match. A commit with
            // synchronous=FULL syncs the log (and, the first time, the folder that names
            // it: SQLite syncs the directory of a log it made).
            try database.execute("""
                PRAGMA synchronous=FULL; INSERT OR REPLACE INTO state(name, value) VALUES('clean', 0);
                PRAGMA synchronous=NORMAL;
                """)
            // Inodes whose last name went while a crashed daemon still had them open.
            for ino in try database.integers("SELECT ino FROM inodes WHERE links = 0") { orphans.insert(ino) }
            // fsynced writes of a daemon of schema 4 that were only in its fsync journal.
            try LegacyFsyncJournal.replay(into: self, progress: progress)
        } catch let error as CacheStoreError {
            throw error
        } catch let error as SQLiteError {
            throw .damaged("\(path): \(error)")
        } catch {
            throw .damaged("\(path): \(error)")
        }
        // Orphans left by a crash: deleted now that nothing holds them.
        if !orphans.isEmpty {
            _ = try? withLock { () throws(Errno) in
                for ino in orphans { try change { () throws(Errno) in try referenceDropped(ino) } }
                try commitBatch()
            }
        }
    }

    /// At unmount: every small file's buffer stored, every conversion recorded (its data
    /// file synced first), every large file's row brought up to date and its data file
    /// synced, everything checkpointed (every commit durable), the data files of deleted
    /// files removed and the folder synced — and only then the store marked clean, durably
    /// (the next open skips the full check and trusts every row). A crash or a failed sync
    /// anywhere before the mark leaves the store unclean: the next open checks and sweeps.
    public func close() throws(Errno) {
        // The checkpointer's connection first (its lock is taken before the store's); no
        // checkpoint opens another once `closed` is set.
        checkpointLock.withLock { checkpointer = nil }
        recordConversions(olderThan: nil)
        let written = try withLock { () throws(Errno) -> [DataFile] in
            closed = true
            try change { () throws(Errno) in
                try storeAllBuffers()
                try refreshRows(Array(data.staleRows))
            }
            try commitBatch()
            return takeUnsyncedDataFiles()
        }
        var durable = true
        for file in written {
            do throws(Errno) {
                try Syscall.fdatasync(file.fd)
            } catch {
                durable = false
                Log.error("cache: the data file \(folder.name(file.key)) could not be synced at unmount (\(error)); the next mount checks the store")
            }
        }
        let removable = try withLock { () throws(Errno) -> [Int64] in
            // SQLite syncs the log before it copies it, and the database after: every commit
            // (the deletions of rows among them) is durable once this returns.
            try exec("PRAGMA wal_checkpoint(TRUNCATE)")
            durableCommits = commits
            return takeRemovableDataFiles()
        }
        for key in removable { folder.remove(key) }
        if !removable.isEmpty {
            do throws(Errno) {
                try folder.sync()
            } catch {
                durable = false
                Log.error("cache: \(folder.path) could not be synced at unmount (\(error)); the next mount checks the store")
            }
        }
        try withLock { () throws(Errno) in
            defer {
                if let fd = logDescriptor { Syscall.close(fd) }
                logDescriptor = nil
                data.files.removeAll()
            }
            guard durable else { return }
            try exec("INSERT OR REPLACE INTO state(name, value) VALUES('clean', 1)")
            try exec("PRAGMA wal_checkpoint(TRUNCATE)")
        }
    }

    deinit {
        try? commitBatch()
        if let fd = logDescriptor { Syscall.close(fd) }
    }

    /// How often requests woke the committing thread since the store was opened.
    public func activity() -> (committerWakes: Int, dataFiles: Int) {
        lock.withLock { (committerWakes, data.files.count) }
    }

    /// Files and bytes stored (holes not counted, preallocated bytes counted): the kept
    /// totals, one row, whatever the store holds.
    public func usage() -> (files: Int64, bytes: Int64) {
        (try? withLock { () throws(Errno) -> (files: Int64, bytes: Int64) in
            let statement = try statement("SELECT files, bytes FROM totals WHERE id = 1")
            defer { statement.done() }
            guard try row(statement) else { return (0, 0) }
            return (statement.int(0), statement.int(1) + unrowedBytes(linkedOnly: false))
        }) ?? (0, 0)
    }

    /// Files removed for the size limit, and for their expiry time, since the mount began.
    public func removals() -> (evictions: Int, expirations: Int) {
        lock.withLock { (evictions, expirations) }
    }

    static func now() -> Int64 { WallClock.nanoseconds }

    // MARK: Plumbing

    func statement(_ sql: String) throws(Errno) -> Statement {
        if let statement = statements[sql] { return statement }
        do {
            let statement = try Statement(database, sql)
            statements[sql] = statement
            return statement
        } catch {
            throw Self.errno(error)
        }
    }

    static func errno(_ error: SQLiteError) -> Errno {
        switch error.code & 0xFF {
        case SQLITE_FULL: return .noSpace
        case SQLITE_TOOBIG: return .fileTooLarge
        default:
            Log.error("cache: \(error)")
            return .ioError
        }
    }

    func exec(_ sql: String) throws(Errno) {
        do {
            try database.execute(sql)
        } catch {
            throw Self.errno(error)
        }
    }

    func run(_ sql: String, _ values: any SQLiteBindable...) throws(Errno) {
        let statement = try statement(sql)
        statement.bind(values)
        do {
            try statement.run()
        } catch {
            throw Self.errno(error)
        }
    }

    func row(_ statement: Statement) throws(Errno) -> Bool {
        do {
            return try statement.step()
        } catch {
            throw Self.errno(error)
        }
    }

    /// An inode's row as the database holds it (lock held).
    func storedInode(_ ino: Int64) throws(Errno) -> CacheInode {
        let statement = try statement("SELECT ino, mode, uid, gid, size, links, atime, mtime, ctime, rdev, target, stored, data FROM inodes WHERE ino = ?")
        statement.bind(ino)
        defer { statement.done() }
        guard try row(statement) else { throw .noSuchFileOrDirectory }
        return Self.inode(statement)
    }

    /// An inode as a reader sees it (lock held): its row, with a small file's buffered
    /// writes, or a large file's data file, laid over it.
    func fetchInode(_ ino: Int64) throws(Errno) -> CacheInode {
        overlay(try storedInode(ino))
    }

    static func inode(_ s: Statement) -> CacheInode {
        CacheInode(ino: s.int(0), mode: UInt32(truncatingIfNeeded: s.int(1)), uid: UInt32(truncatingIfNeeded: s.int(2)),
                   gid: UInt32(truncatingIfNeeded: s.int(3)), size: s.int(4), links: s.int(5), accessNanoseconds: s.int(6),
                   modificationNanoseconds: s.int(7), changeNanoseconds: s.int(8), device: s.int(9),
                   target: s.isNull(10) ? nil : s.text(10), storedBytes: s.int(11), dataKey: s.isNull(12) ? nil : s.int(12))
    }

    /// The row of the inode `name` in `parent` names, in one query (lock held); nil when
    /// there is no such name.
    func entryInode(_ parent: Int64, _ name: String) throws(Errno) -> CacheInode? {
        let statement = try statement("""
            SELECT i.ino, i.mode, i.uid, i.gid, i.size, i.links, i.atime, i.mtime, i.ctime, i.rdev, i.target, i.stored, i.data
            FROM entries e JOIN inodes i ON i.ino = e.ino WHERE e.parent = ? AND e.name = ?
            """)
        statement.bind(parent, name)
        defer { statement.done() }
        return try row(statement) ? Self.inode(statement) : nil
    }

    func entry(_ parent: Int64, _ name: String) throws(Errno) -> Int64? {
        let statement = try statement("SELECT ino FROM entries WHERE parent = ? AND name = ?")
        statement.bind(parent, name)
        defer { statement.done() }
        return try row(statement) ? statement.int(0) : nil
    }

    func directory(_ ino: Int64) throws(Errno) -> CacheInode {
        let inode = try storedInode(ino)
        guard inode.isDirectory else { throw .notDirectory }
        guard inode.links > 0 else { throw .noSuchFileOrDirectory }
        return inode
    }

    func isEmptyDirectory(_ ino: Int64) throws(Errno) -> Bool {
        let statement = try statement("SELECT 1 FROM entries WHERE parent = ? LIMIT 1")
        statement.bind(ino)
        defer { statement.done() }
        return try !row(statement)
    }

    func touch(_ ino: Int64, modified: Bool = true) throws(Errno) {
        let now = Self.now()
        if modified {
            try run("UPDATE inodes SET mtime = ?, ctime = ? WHERE ino = ?", now, now, ino)
        } else {
            try run("UPDATE inodes SET ctime = ? WHERE ino = ?", now, ino)
        }
    }

    static func check(_ name: String) throws(Errno) {
        guard name.utf8.count <= maximumNameLength else { throw .nameTooLong }
        guard !name.isEmpty, name != ".", name != "..", !name.contains("/") else { throw .invalidArgument }
    }
}
