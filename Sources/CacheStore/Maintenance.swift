#if canImport(Glibc)
import Glibc
#endif
import CSQLite
import Posix

/// Background work of the maintenance thread: expiry (`user.cache.expires`), the size limit
/// (`--cache-limit`), the data files of deleted files removed once their deletion is
/// durable, and free pages given back to the file system by incremental vacuum, a few
/// megabytes at a time. Each step holds the store's lock for a few milliseconds at most;
/// a data file is removed with the lock let go.
extension CacheStore {
    /// Unix seconds (an integer) or ISO 8601, as nanoseconds; EINVAL otherwise.
    static func expiryTime(_ value: [UInt8]) throws(Errno) -> Int64 {
        var text = String(decoding: value, as: UTF8.self)
        while text.last == "\n" || text.last == "\r" || text.last == "\0" { text.removeLast() }
        if let seconds = Int64(text), seconds >= 0, seconds < Int64.max / 1_000_000_000 { return seconds * 1_000_000_000 }
        guard let seconds = ISO8601.unixSeconds(text) else { throw .invalidArgument }
        // Nanoseconds run out in 2262: later times are "never" in practice.
        return seconds >= Double(Int64.max / 1_000_000_000) ? Int64.max : Int64(max(0, seconds) * 1_000_000_000)
    }

    /// Removes every name of files whose expiry time has passed, then of the least recently
    /// used closed files while the stored bytes exceed `limit` (nil: no limit). Returns the
    /// names removed, for the kernel to forget.
    public func maintain(limit: Int64?) -> [(parent: Int64, name: String)] {
        // Looked at first without a transaction: a pass with nothing to do writes nothing.
        let work = (try? withLock { () throws(Errno) -> Bool in
            let due = try statement("SELECT 1 FROM inodes WHERE expires IS NOT NULL AND expires <= ? AND links > 0 LIMIT 1")
            due.bind(Self.now())
            defer { due.done() }
            if try row(due) { return true }
            guard let limit else { return false }
            return try linkedTotal() > limit
        }) ?? true
        guard work else { return [] }
        return (try? transaction { () throws(Errno) -> [(parent: Int64, name: String)] in
            var removed: [(parent: Int64, name: String)] = []
            let expired = try statement("SELECT ino FROM inodes WHERE expires IS NOT NULL AND expires <= ? AND links > 0")
            expired.bind(Self.now())
            var due: [Int64] = []
            while try row(expired) { due.append(expired.int(0)) }
            expired.done()
            for ino in due where (opens[ino] ?? 0) == 0 {
                removed += try removeAllNames(ino)
                expirations += 1
            }
            guard let limit else { return removed }
            var used = try linkedTotal()
            guard used > limit else { return removed }
            let oldest = try statement("SELECT ino, stored FROM inodes WHERE links > 0 AND mode & \(S_IFMT) = \(S_IFREG) ORDER BY used, ino")
            oldest.bind()
            var candidates: [(Int64, Int64)] = []
            while used > limit, try row(oldest) {
                let ino = oldest.int(0)
                guard (opens[ino] ?? 0) == 0 else { continue }
                // A closed file whose move is unrecorded: its data file's blocks.
                let size = data.unrecorded[ino] == nil ? oldest.int(1) : ((try? storedInode(ino)).map(storedNow) ?? 0)
                candidates.append((ino, size))
                used -= size
            }
            oldest.done()
            for (ino, _) in candidates {
                removed += try removeAllNames(ino)
                evictions += 1
            }
            return removed
        }) ?? []
    }

    /// How long until the next file expires (its `user.cache.expires`, found through the
    /// expiry index; zero when one is due); nil when none will.
    public var nextExpiry: Duration? {
        (try? withLock { () throws(Errno) -> Duration? in
            let next = try statement("SELECT min(expires) FROM inodes WHERE expires IS NOT NULL AND links > 0")
            defer { next.done() }
            next.bind()
            guard try row(next), !next.isNull(0) else { return nil }
            return .nanoseconds(max(0, next.int(0) - Self.now()))
        }) ?? nil
    }

    /// Stored bytes of the regular files that have a name (what `--cache-limit` bounds): the
    /// kept total, one row, and what large files hold beyond their rows.
    public var linkedBytes: Int64 { (try? withLock { () throws(Errno) -> Int64 in try linkedTotal() }) ?? 0 }

    func linkedTotal() throws(Errno) -> Int64 {
        let total = try statement("SELECT linked_bytes FROM totals WHERE id = 1")
        defer { total.done() }
        return (try row(total) ? total.int(0) : 0) + unrowedBytes(linkedOnly: true)
    }

    func removeAllNames(_ ino: Int64) throws(Errno) -> [(parent: Int64, name: String)] {
        let names = try statement("SELECT parent, name FROM entries WHERE ino = ?")
        names.bind(ino)
        var found: [(parent: Int64, name: String)] = []
        while try row(names) { found.append((names.int(0), names.text(1))) }
        names.done()
        for (parent, name) in found { try removeName(parent: parent, name: name, ino: ino) }
        return found
    }

    // MARK: Space given back

    /// Free pages that start incremental vacuum, and pages given back by one step.
    static let vacuumThreshold: Int64 = 2048
    static let vacuumStep = 512
    /// Vacuum waits for the store to be quiet this long (a busy store reuses its free pages
    /// itself, and shrinking a file that grows again at once is wasted work) — but never
    /// longer than `vacuumPatience` once there is something to give back.
    static let vacuumQuiet = 1.0
    static let vacuumPatience = 30.0

    /// When `reclaimStep` has work next: now while data files wait to be removed; for free
    /// pages to give back, once the store is quiet (or its patience runs out); nil: nothing.
    public var reclaimDue: ContinuousClock.Instant? {
        lock.withLock { () -> ContinuousClock.Instant? in
            if closed { return nil }
            if data.doomed.contains(where: { $0.commit <= durableCommits }) { return .now }
            guard vacuums, (database.freePages ?? 0) >= Self.vacuumThreshold else { return nil }
            return min(lastChange.advanced(by: .seconds(Self.vacuumQuiet)),
                       (vacuumWanted ?? .now).advanced(by: .seconds(Self.vacuumPatience)))
        }
    }

    /// One step of background work: the data files whose deletion is durable removed (with
    /// the lock let go: an unlink of gigabytes holds no request), or one step of incremental
    /// vacuum; true while work remains.
    public func reclaimStep() -> Bool {
        let removable = lock.withLock { closed ? [] : takeRemovableDataFiles() }
        if !removable.isEmpty {
            for key in removable { folder.remove(key) }
            return true
        }
        let due = lock.withLock { () -> Bool in
            if closed { return false }
            guard vacuums, (database.freePages ?? 0) >= Self.vacuumThreshold else {
                vacuumWanted = nil
                return false
            }
            let wanted = vacuumWanted ?? .now
            vacuumWanted = wanted
            return lastChange.secondsElapsed >= Self.vacuumQuiet || wanted.secondsElapsed >= Self.vacuumPatience
        }
        guard due else { return false }
        return (try? withLock { () throws(Errno) -> Bool in
            try change(refresh: true) { () throws(Errno) -> Bool in
                guard (database.freePages ?? 0) >= Self.vacuumThreshold else { return false }
                try exec("PRAGMA incremental_vacuum(\(Self.vacuumStep))")
                batchMovedPages = true
                return true
            }
        }) ?? false
    }

    /// Data files of deleted files still to be removed.
    public var reclaimPending: Int { lock.withLock { data.doomed.count } }

    /// The holders let go of `ino` (the kernel's last reference went): an orphan nothing
    /// holds any more is deleted. Other inodes cost no query.
    public func unheld(_ ino: Int64) {
        _ = try? withLock { () throws(Errno) in
            guard orphans.contains(ino), !isHeld(ino) else { return }
            guard batchStart != nil, database.isInTransaction else {
                // No group open: deleted now (nothing else is coming to carry it).
                try change { () throws(Errno) in try referenceDropped(ino) }
                return
            }
            orphans.remove(ino)
            doomed.insert(ino)
            if doomed.count >= Self.groupCommitSize { try deleteDoomed() }
        }
    }

    /// Deletes the rows of the doomed orphans in the open group (lock held); those it could
    /// not delete stay doomed (links 0: a start deletes them too).
    func deleteDoomed() throws(Errno) {
        while let ino = doomed.first {
            try deleteInode(ino)
            doomed.remove(ino)
        }
    }
}

// MARK: Free space

extension CacheStore {
    /// Free space kept on the data directory's file system: writes that would eat into it
    /// get ENOSPC, so that deletes and checkpoints (which need room in the write-ahead log)
    /// still work on a full disk and space can be freed.
    public static let reservedBytes: UInt64 = 8 << 20

    func requireHeadroom(adding bytes: Int = 0) throws(Errno) {
        guard let free = freeBytesNow ?? freeDiskBytes() else { return }
        let needed = Self.reservedBytes + UInt64(bytes)
        if free >= needed { return }
        // Deleted rows leave their pages on SQLite's free list, where new data goes first:
        // those count as room too (the database file does not shrink at once).
        let pages = (try? database.scalarText("PRAGMA freelist_count")).flatMap { $0.flatMap { UInt64($0) } } ?? 0
        // The write-ahead log still needs real disk for the new pages (plus 1 MiB of margin).
        if free + pages * UInt64(pageSize) < needed || free < UInt64(bytes) + (1 << 20) { throw .noSpace }
    }

    /// Free bytes on the data directory's file system (nil when statvfs fails). With more
    /// than `measuredRoom` free, one measurement serves the changes of the next
    /// `measurementLife` seconds (a statvfs per write cost as much as a small write).
    /// Closer to full, every change measures.
    func freeDiskBytes() -> UInt64? {
        if let last = lastMeasurement, last.free > Self.measuredRoom, last.at.secondsElapsed < Self.measurementLife {
            return last.free
        }
        guard let free = try? Syscall.availableBytes(onFileSystemOf: path) else { return nil }
        lastMeasurement = (free, .now)
        return free
    }

    static let measuredRoom: UInt64 = 2 << 30
    static let measurementLife = 0.05
}
