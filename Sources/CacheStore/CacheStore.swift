#if canImport(Glibc)
import Glibc
#endif
import CSQLite
import Posix

/// One inode row of the cache (see `docs/cache-schema.md`).
public struct CacheInode: Hashable, Sendable {
    public var ino: Int64
    public var mode: UInt32
    public var uid: UInt32
    public var gid: UInt32
    public var size: Int64
    public var links: Int64
    public var accessNanoseconds: Int64
    public var modificationNanoseconds: Int64
    public var changeNanoseconds: Int64
    public var device: Int64
    /// Symbolic links: the target.
    public var target: String?
    /// Bytes of file data stored or allocated (chunk rows), what `st_blocks` counts: less
    /// than `size` for a sparse file, more after a `fallocate` that keeps the size.
    public var storedBytes: Int64 = 0

    public var isDirectory: Bool { mode & S_IFMT == S_IFDIR }
    public var isSymbolicLink: Bool { mode & S_IFMT == S_IFLNK }
}

/// What a `setattr` changes; nil leaves a field.
public struct CacheAttributeChanges: Sendable {
    public var mode: UInt32?
    public var uid: UInt32?
    public var gid: UInt32?
    public var size: Int64?
    public var accessNanoseconds: Int64?
    public var modificationNanoseconds: Int64?

    public init(mode: UInt32? = nil, uid: UInt32? = nil, gid: UInt32? = nil, size: Int64? = nil,
                accessNanoseconds: Int64? = nil, modificationNanoseconds: Int64? = nil) {
        self.mode = mode
        self.uid = uid
        self.gid = gid
        self.size = size
        self.accessNanoseconds = accessNanoseconds
        self.modificationNanoseconds = modificationNanoseconds
    }
}

/// A POSIX file tree in one SQLite database: inodes, directory entries, fixed-size data
/// chunks, symlink targets and extended attributes, with the errno rules of Linux ext4.
///
/// Changes are grouped into SQLite transactions (group commit, see `groupCommitDelay`);
/// each change is a savepoint in it, so a failing change rolls back alone. `synchronize()`
/// commits and makes everything durable (an fsync of the write-ahead log); checkpoints run
/// off the request path (`checkpointWhenQuiet`). Inodes that lost their last name but are
/// still open or known to the kernel stay until `released`/`forgot` drop the last reference; orphans
/// left by a crash are removed at open. Memory does not grow with file size: reads and
/// writes touch only their chunks.
///
/// Thread-safety: one connection behind a mutex; every public method takes it.
public final class CacheStore: @unchecked Sendable {
    public static let chunkSize = 64 * 1024
    public static let maximumNameLength = 255
    public static let rootInode: Int64 = 1
    static let schemaVersion: Int64 = 2

    let path: String
    let database: SQLiteDatabase
    private let lock = Lock()
    private var statements: [String: Statement] = [:]
    /// Kernel lookup references and open handles per inode (both keep an unlinked inode).
    private var lookups: [Int64: UInt64] = [:]
    private var opens: [Int64: Int] = [:]
    /// Files removed to stay under the size limit, and because their expiry time passed.
    private var evictions = 0
    private var expirations = 0
    /// When the open group of changes began (nil: none open), and how many it holds.
    private var batchStart: ContinuousClock.Instant?
    private var batchChanges = 0
    /// Posted when a group opens, for the thread that commits it when due.
    private let batchOpened = Semaphore()

    /// Changes are committed in groups: the first change after a commit opens one SQLite
    /// transaction, which is committed on fsync, once it holds `groupCommitSize` changes,
    /// or `groupCommitDelay` after it began (by whoever calls `commitWhenDue`). Many
    /// files' creates and writes then cost one WAL append and one round of locks instead of
    /// one each (creating a 1 KiB file: 345 → 230 µs; committing at every close as well
    /// made it 420 µs, so a close does not commit). Readers of the database file see a
    /// change within `groupCommitDelay`; a kill -9 of the daemon loses at most the changes
    /// of that last interval that were not fsynced; the database is consistent either way.
    public static let groupCommitDelay = 0.005
    static let groupCommitSize = 256

    /// The write-ahead log is copied into the database file (a checkpoint) by whoever calls
    /// `checkpointWhenQuiet`, once no change came for `checkpointQuiet` seconds or the log
    /// holds `checkpointLogLimit` bytes — not inside a request, as SQLite's automatic
    /// checkpoint did: it read back and rewrote every written page in the write that
    /// crossed 4 MB and synced the database in every fsync (35 % of the daemon's time in
    /// a 256 MiB write + fsync). fsync syncs only the log, which is what makes a change
    /// durable (`synchronize`).
    public static let checkpointQuiet = 0.1
    static let checkpointLogLimit: Int64 = 512 << 20
    /// Committed changes not yet checkpointed, and when the last change was committed.
    private var uncheckpointed = false
    private var lastCommit = ContinuousClock.now
    /// The checkpointer's own connection and lock: it never waits for the request path.
    private var checkpointer: SQLiteDatabase?
    private let checkpointLock = Lock()

    /// Files removed for the size limit, and for their expiry time, since the mount began.
    public func removals() -> (evictions: Int, expirations: Int) {
        lock.withLock { (evictions, expirations) }
    }

    /// Free space kept on the data directory's file system: writes that would eat into it
    /// get ENOSPC, so that deletes and checkpoints (which need room in the write-ahead log)
    /// still work on a full disk and space can be freed.
    public static let reservedBytes: UInt64 = 8 << 20

    func requireHeadroom(adding bytes: Int = 0) throws(Errno) {
        guard let free = freeBytesNow ?? freeDiskBytes() else { return }
        let needed = Self.reservedBytes + UInt64(bytes)
        if free >= needed { return }
        // Deleted files leave their pages on SQLite's free list, where new data goes first:
        // those count as room too (found by mtmfs-reliability: after `rm` on a full disk,
        // writes kept failing because the database file does not shrink).
        let pages = (try? database.scalarText("PRAGMA freelist_count")).flatMap { $0.flatMap { UInt64($0) } } ?? 0
        let pageSize = (try? database.scalarText("PRAGMA page_size")).flatMap { $0.flatMap { UInt64($0) } } ?? 0
        // The write-ahead log still needs real disk for the new pages (plus 1 MiB of margin).
        if free + pages * pageSize < needed || free < UInt64(bytes) + (1 << 20) { throw .noSpace }
    }

    /// Free bytes on the data directory's file system (nil when statvfs fails).
    func freeDiskBytes() -> UInt64? {
        var fs = statvfs()
        guard statvfs(path, &fs) == 0 else { return nil }
        return UInt64(fs.f_bavail) * UInt64(fs.f_frsize)
    }

    /// Measured once per change (lock held): its headroom check and the decision to keep
    /// grouping share one statvfs.
    var freeBytesNow: UInt64?

    /// The extended attribute that makes a file disappear at a time (Unix seconds or ISO 8601).
    public static let expiryAttribute = "user.cache.expires"

    /// Opens (creating the schema if the file is new) the cache database at `path`.
    public init(path: String, owner: (uid: UInt32, gid: UInt32)) throws(CacheStoreError) {
        self.path = path
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
            guard try database.scalarText("PRAGMA quick_check") == "ok" else {
                throw CacheStoreError.damaged("\(path) fails PRAGMA quick_check")
            }
            try database.execute("PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL; PRAGMA foreign_keys=OFF; PRAGMA journal_size_limit=4194304;")
            // Checkpoints are `checkpointWhenQuiet`'s, off the path of requests.
            try database.execute("PRAGMA wal_autocheckpoint=0;")
            let version = Int64(try database.scalarText("PRAGMA user_version") ?? "0") ?? 0
            if version == 0 {
                try createSchema(owner: owner)
            } else if version == 1 {
                try migrateFromVersion1()
            } else if version != Self.schemaVersion {
                throw CacheStoreError.damaged("\(path) has schema version \(version), this mtmfs knows \(Self.schemaVersion)")
            }
            // Inodes whose last name went while a crashed daemon still had them open.
            try database.execute("""
                BEGIN IMMEDIATE;
                DELETE FROM chunks WHERE ino IN (SELECT ino FROM inodes WHERE links = 0);
                DELETE FROM xattrs WHERE ino IN (SELECT ino FROM inodes WHERE links = 0);
                DELETE FROM inodes WHERE links = 0;
                COMMIT;
                """)
        } catch let error as CacheStoreError {
            throw error
        } catch let error as SQLiteError {
            throw .damaged("\(path): \(error)")
        } catch {
            throw .damaged("\(path): \(error)")
        }
    }

    func createSchema(owner: (uid: UInt32, gid: UInt32)) throws(SQLiteError) {
        let now = Self.now()
        try database.execute("""
            BEGIN IMMEDIATE;
            CREATE TABLE inodes(
                ino INTEGER PRIMARY KEY AUTOINCREMENT, mode INTEGER NOT NULL, uid INTEGER NOT NULL, gid INTEGER NOT NULL,
                size INTEGER NOT NULL DEFAULT 0, links INTEGER NOT NULL, atime INTEGER NOT NULL,
                mtime INTEGER NOT NULL, ctime INTEGER NOT NULL, rdev INTEGER NOT NULL DEFAULT 0,
                target TEXT, used INTEGER NOT NULL DEFAULT 0, expires INTEGER,
                stored INTEGER NOT NULL DEFAULT 0) STRICT;
            CREATE INDEX inodes_by_use ON inodes(used) WHERE links > 0;
            CREATE INDEX inodes_by_expiry ON inodes(expires) WHERE expires IS NOT NULL;
            CREATE TABLE entries(
                parent INTEGER NOT NULL, name TEXT NOT NULL, ino INTEGER NOT NULL,
                PRIMARY KEY(parent, name)) STRICT, WITHOUT ROWID;
            CREATE INDEX entries_by_inode ON entries(ino);
            CREATE TABLE chunks(
                ino INTEGER NOT NULL, idx INTEGER NOT NULL, data BLOB NOT NULL,
                PRIMARY KEY(ino, idx)) STRICT, WITHOUT ROWID;
            CREATE TABLE xattrs(
                ino INTEGER NOT NULL, name TEXT NOT NULL, value BLOB NOT NULL,
                PRIMARY KEY(ino, name)) STRICT, WITHOUT ROWID;
            INSERT INTO inodes(ino, mode, uid, gid, links, atime, mtime, ctime)
                VALUES(1, \(S_IFDIR | 0o755), \(owner.uid), \(owner.gid), 2, \(now), \(now), \(now));
            PRAGMA user_version=\(Self.schemaVersion);
            COMMIT;
            """)
    }

    /// Version 2 counts the bytes each inode's chunk rows hold (`stored`, for `st_blocks`
    /// and the size limit): added and counted once, in one transaction.
    func migrateFromVersion1() throws(SQLiteError) {
        try database.execute("""
            BEGIN IMMEDIATE;
            ALTER TABLE inodes ADD COLUMN stored INTEGER NOT NULL DEFAULT 0;
            UPDATE inodes SET stored = (SELECT coalesce(sum(length(data)), 0) FROM chunks WHERE chunks.ino = inodes.ino)
                WHERE mode & \(S_IFMT) = \(S_IFREG);
            PRAGMA user_version=2;
            COMMIT;
            """)
    }

    static func now() -> Int64 {
        var ts = timespec()
        clock_gettime(CLOCK_REALTIME, &ts)
        return Int64(ts.tv_sec) * 1_000_000_000 + Int64(ts.tv_nsec)
    }

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

    func withLock<T>(_ body: () throws(Errno) -> T) throws(Errno) -> T {
        try lock.withLock { () throws(Errno) -> T in try body() }
    }

    /// Runs `body` in one write transaction (rolled back if it throws). On a full disk the
    /// write-ahead log is checkpointed and truncated (giving its space back) and the body
    /// tried once more, so that a delete can still free space.
    func transaction<T>(_ body: () throws(Errno) -> T) throws(Errno) -> T {
        try withLock { () throws(Errno) -> T in
            var attempt = 0
            defer { freeBytesNow = nil }
            while true {
                attempt += 1
                freeBytesNow = freeDiskBytes()
                try openBatch()
                try run("SAVEPOINT change")
                do throws(Errno) {
                    let result = try body()
                    try run("RELEASE change")
                    batchChanges += 1
                    if batchChanges >= Self.groupCommitSize || !hasRoomForGroups(free: freeBytesNow) { try commitBatch() }
                    return result
                } catch {
                    if database.isInTransaction {
                        try? exec("ROLLBACK TO change")
                        try? exec("RELEASE change")
                    }
                    noticeRollback()
                    guard error == .noSpace, attempt == 1 else { throw error }
                    try? commitBatch()
                    try? exec("PRAGMA wal_checkpoint(TRUNCATE)")
                }
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
        batchOpened.post()
    }

    /// Commits the open group, if any (lock held). A failed commit loses the group: said
    /// in the log, and the error goes to the caller.
    func commitBatch() throws(Errno) {
        noticeRollback()
        guard batchStart != nil else { return }
        batchStart = nil
        do throws(Errno) {
            try run("COMMIT")
            uncheckpointed = true
            lastCommit = .now
            // Short of disk, the log is emptied at once: its pages are what fills the disk,
            // and a delete frees nothing until they are in the database file.
            if !hasRoomForGroups(free: freeDiskBytes()) {
                if (try? exec("PRAGMA wal_checkpoint(TRUNCATE)")) != nil { uncheckpointed = false }
            }
        } catch {
            Log.error("cache: \(batchChanges) changes could not be committed: \(error)")
            try? exec("ROLLBACK")
            throw error
        }
    }

    /// Groups only with plenty of free disk: SQLite answers a full disk by rolling back the
    /// whole transaction, which must then hold this one change only, not others already
    /// acknowledged (found by the full-disk test: a group that held an `rm` lost it).
    func hasRoomForGroups(free: UInt64?) -> Bool {
        guard let free else { return false }
        return free >= Self.reservedBytes + Self.groupRoom
    }

    /// A group holds at most `groupCommitSize` writes of at most 1 MiB (libfuse's max_write).
    static let groupRoom: UInt64 = 256 << 20

    /// SQLite rolls the whole transaction back on some errors (a full disk, I/O) of any
    /// statement, also of those run outside `transaction` (open and release bookkeeping):
    /// the group is then gone, and the next change opens a new one.
    func noticeRollback() {
        guard batchStart != nil, !database.isInTransaction else { return }
        Log.error("cache: \(batchChanges) changes were rolled back by SQLite after an error")
        batchStart = nil
    }

    /// For the committing thread: waits (at most `seconds`) for a group to open, then until
    /// it is `groupCommitDelay` old, and commits it.
    public func commitWhenDue(waitingAtMost seconds: Double) {
        guard batchOpened.wait(seconds: seconds) else { return }
        guard let started = lock.withLock({ batchStart }) else { return }
        let left = Self.groupCommitDelay - started.secondsElapsed
        if left > 0 { usleep(UInt32(left * 1e6)) }
        _ = try? withLock { () throws(Errno) in try commitBatch() }
    }

    /// Wakes a thread waiting in `commitWhenDue` (at shutdown).
    public func wakeCommitter() { batchOpened.post() }

    /// Committed changes wait for a checkpoint (the committing thread then comes back
    /// within `checkpointQuiet` rather than sleeping long).
    public var needsCheckpoint: Bool { lock.withLock { uncheckpointed } }

    /// Copies the write-ahead log into the database file once the store has been quiet for
    /// `checkpointQuiet` seconds, or at once when the log has grown past its limit. Runs on
    /// a connection of its own, without the store's lock: requests go on meanwhile.
    public func checkpointWhenQuiet() {
        let (pending, quiet) = lock.withLock { (uncheckpointed, lastCommit.secondsElapsed >= Self.checkpointQuiet && batchStart == nil) }
        guard pending else { return }
        var st = stat()
        let logBytes = stat(path + "-wal", &st) == 0 ? Int64(st.st_size) : 0
        guard quiet || logBytes >= Self.checkpointLogLimit else { return }
        checkpointLock.withLock {
            do {
                if checkpointer == nil {
                    let connection = try SQLiteDatabase(path: path)
                    // journal_mode reads the header: a connection that has read nothing yet
                    // does not know the database is in WAL mode and checkpoints nothing.
                    try connection.execute("PRAGMA busy_timeout=5000; PRAGMA wal_autocheckpoint=0; PRAGMA journal_mode=WAL;")
                    checkpointer = connection
                }
                let started = lock.withLock { lastCommit }
                let result = try checkpointer!.checkpoint(mode: SQLITE_CHECKPOINT_PASSIVE)
                Log.debug("cache: checkpoint copied \(result.copied) of \(result.log) log frames (\(logBytes) bytes)")
                // Everything copied, and nothing committed meanwhile: nothing is pending.
                if result.copied >= result.log {
                    lock.withLock { if lastCommit == started { uncheckpointed = false } }
                }
            } catch {
                Log.error("cache: checkpoint: \(error)")
            }
        }
    }

    func exec(_ sql: String) throws(Errno) {
        do {
            try database.execute(sql)
        } catch {
            throw Self.errno(error)
        }
    }

    func run(_ sql: String, _ values: Any?...) throws(Errno) {
        let statement = try statement(sql)
        statement.bindArray(values)
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

    func fetchInode(_ ino: Int64) throws(Errno) -> CacheInode {
        let statement = try statement("SELECT ino, mode, uid, gid, size, links, atime, mtime, ctime, rdev, target, stored FROM inodes WHERE ino = ?")
        statement.bind(ino)
        defer { statement.done() }
        guard try row(statement) else { throw .noSuchFileOrDirectory }
        return Self.inode(statement)
    }

    static func inode(_ s: Statement) -> CacheInode {
        CacheInode(ino: s.int(0), mode: UInt32(truncatingIfNeeded: s.int(1)), uid: UInt32(truncatingIfNeeded: s.int(2)),
                   gid: UInt32(truncatingIfNeeded: s.int(3)), size: s.int(4), links: s.int(5), accessNanoseconds: s.int(6),
                   modificationNanoseconds: s.int(7), changeNanoseconds: s.int(8), device: s.int(9),
                   target: s.isNull(10) ? nil : s.text(10), storedBytes: s.int(11))
    }

    func entry(_ parent: Int64, _ name: String) throws(Errno) -> Int64? {
        let statement = try statement("SELECT ino FROM entries WHERE parent = ? AND name = ?")
        statement.bind(parent, name)
        defer { statement.done() }
        return try row(statement) ? statement.int(0) : nil
    }

    func directory(_ ino: Int64) throws(Errno) -> CacheInode {
        let inode = try fetchInode(ino)
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

    // MARK: Reading the tree

    /// `reference`: the caller hands the inode to the kernel; count it in the same lock, so
    /// that no unlink can delete it in between.
    public func lookup(parent: Int64, name: String, reference: Bool = false) throws(Errno) -> CacheInode {
        try withLock { () throws(Errno) -> CacheInode in
            guard name.utf8.count <= Self.maximumNameLength else { throw .nameTooLong }
            _ = try directory(parent)
            guard let ino = try entry(parent, name) else { throw .noSuchFileOrDirectory }
            let inode = try fetchInode(ino)
            if reference { lookups[ino, default: 0] += 1 }
            return inode
        }
    }

    public func inode(_ ino: Int64) throws(Errno) -> CacheInode {
        try withLock { () throws(Errno) -> CacheInode in try fetchInode(ino) }
    }

    /// The names in a directory with their inodes, in name order.
    public func list(_ ino: Int64) throws(Errno) -> [(name: String, inode: CacheInode)] {
        try withLock { () throws(Errno) -> [(name: String, inode: CacheInode)] in
            _ = try directory(ino)
            let statement = try statement("""
                SELECT i.ino, i.mode, i.uid, i.gid, i.size, i.links, i.atime, i.mtime, i.ctime, i.rdev, i.target, i.stored, e.name
                FROM entries e JOIN inodes i ON i.ino = e.ino WHERE e.parent = ? ORDER BY e.name
                """)
            statement.bind(ino)
            defer { statement.done() }
            var result: [(name: String, inode: CacheInode)] = []
            while try row(statement) { result.append((statement.text(12), Self.inode(statement))) }
            return result
        }
    }

    // MARK: Names

    /// Creates a file, directory, symlink, FIFO, socket or device node named `name` in
    /// `parent` (device nodes are stored with their `device`, never opened as devices).
    /// `reference`: counts a kernel reference; `open`: counts an open handle too (both in
    /// the creating transaction, so that eviction cannot take the new file first).
    public func create(parent: Int64, name: String, mode: UInt32, uid: UInt32, gid: UInt32, device: Int64 = 0,
                       target: String? = nil, reference: Bool = false, open: Bool = false) throws(Errno) -> CacheInode {
        try Self.check(name)
        let type = mode & S_IFMT
        guard [S_IFREG, S_IFDIR, S_IFLNK, S_IFIFO, S_IFSOCK, S_IFBLK, S_IFCHR].contains(type) else { throw .invalidArgument }
        return try transaction { () throws(Errno) -> CacheInode in
            _ = try directory(parent)
            guard try entry(parent, name) == nil else { throw .fileExists }
            try requireHeadroom()
            let now = Self.now()
            let size = Int64(target?.utf8.count ?? 0)
            try run("INSERT INTO inodes(mode, uid, gid, size, links, atime, mtime, ctime, rdev, target, used) VALUES(?,?,?,?,?,?,?,?,?,?,?)",
                    Int64(mode), Int64(uid), Int64(gid), size, Int64(type == S_IFDIR ? 2 : 1), now, now, now, device, target, now)
            let ino = database.lastInsertedRow
            if reference || open { lookups[ino, default: 0] += 1 }
            if open { opens[ino, default: 0] += 1 }
            try run("INSERT INTO entries(parent, name, ino) VALUES(?,?,?)", parent, name, ino)
            if type == S_IFDIR {
                try run("UPDATE inodes SET links = links + 1, mtime = ?, ctime = ? WHERE ino = ?", now, now, parent)
            } else {
                try touch(parent)
            }
            return try fetchInode(ino)
        }
    }

    /// A new name for an existing non-directory.
    public func link(_ ino: Int64, parent: Int64, name: String, reference: Bool = false) throws(Errno) -> CacheInode {
        try Self.check(name)
        return try transaction { () throws(Errno) -> CacheInode in
            let inode = try fetchInode(ino)
            guard !inode.isDirectory else { throw .notPermitted }
            guard inode.links > 0 else { throw .noSuchFileOrDirectory }
            _ = try directory(parent)
            guard try entry(parent, name) == nil else { throw .fileExists }
            try run("INSERT INTO entries(parent, name, ino) VALUES(?,?,?)", parent, name, ino)
            try run("UPDATE inodes SET links = links + 1, ctime = ? WHERE ino = ?", Self.now(), ino)
            try touch(parent)
            if reference { lookups[ino, default: 0] += 1 }
            return try fetchInode(ino)
        }
    }

    public func unlink(parent: Int64, name: String) throws(Errno) {
        try transaction { () throws(Errno) in
            _ = try directory(parent)
            guard let ino = try entry(parent, name) else { throw .noSuchFileOrDirectory }
            guard try !fetchInode(ino).isDirectory else { throw .isDirectory }
            try removeName(parent: parent, name: name, ino: ino)
        }
    }

    public func removeDirectory(parent: Int64, name: String) throws(Errno) {
        try transaction { () throws(Errno) in
            _ = try directory(parent)
            guard let ino = try entry(parent, name) else { throw .noSuchFileOrDirectory }
            guard try fetchInode(ino).isDirectory else { throw .notDirectory }
            guard try isEmptyDirectory(ino) else { throw .directoryNotEmpty }
            try removeName(parent: parent, name: name, ino: ino)
        }
    }

    /// Drops one name; a directory loses its links (and its parent one); an inode without
    /// names and references is deleted with its data.
    func removeName(parent: Int64, name: String, ino: Int64) throws(Errno) {
        let inode = try fetchInode(ino)
        let now = Self.now()
        try run("DELETE FROM entries WHERE parent = ? AND name = ?", parent, name)
        if inode.isDirectory {
            try run("UPDATE inodes SET links = 0, ctime = ? WHERE ino = ?", now, ino)
            try run("UPDATE inodes SET links = links - 1, mtime = ?, ctime = ? WHERE ino = ?", now, now, parent)
        } else {
            try run("UPDATE inodes SET links = links - 1, ctime = ? WHERE ino = ?", now, ino)
            try touch(parent)
        }
        try deleteIfUnreferenced(ino)
    }

    func deleteIfUnreferenced(_ ino: Int64) throws(Errno) {
        guard ino != Self.rootInode, (lookups[ino] ?? 0) == 0, (opens[ino] ?? 0) == 0 else { return }
        guard try fetchInode(ino).links <= 0 else { return }
        try run("DELETE FROM chunks WHERE ino = ?", ino)
        try run("DELETE FROM xattrs WHERE ino = ?", ino)
        try run("DELETE FROM inodes WHERE ino = ?", ino)
    }

    /// rename(2) and renameat2(2) with RENAME_NOREPLACE (1) and RENAME_EXCHANGE (2).
    public func rename(parent: Int64, name: String, newParent: Int64, newName: String, flags: UInt32) throws(Errno) {
        try Self.check(newName)
        let noReplace = flags & 1 != 0, exchange = flags & 2 != 0
        // RENAME_WHITEOUT (overlay file systems' flag) and unknown flags are not offered.
        if noReplace && exchange || flags & ~3 != 0 { throw .invalidArgument }
        try transaction { () throws(Errno) in
            _ = try directory(parent)
            _ = try directory(newParent)
            guard let source = try entry(parent, name) else { throw .noSuchFileOrDirectory }
            let target = try entry(newParent, newName)
            let sourceInode = try fetchInode(source)
            if exchange {
                guard let target else { throw .noSuchFileOrDirectory }
                let targetInode = try fetchInode(target)
                if sourceInode.isDirectory { try refuseIntoItself(source, newParent) }
                if targetInode.isDirectory { try refuseIntoItself(target, parent) }
                try run("UPDATE entries SET ino = ? WHERE parent = ? AND name = ?", target, parent, name)
                try run("UPDATE entries SET ino = ? WHERE parent = ? AND name = ?", source, newParent, newName)
                if parent != newParent && sourceInode.isDirectory != targetInode.isDirectory {
                    let delta: Int64 = sourceInode.isDirectory ? 1 : -1
                    try run("UPDATE inodes SET links = links + ? WHERE ino = ?", delta, newParent)
                    try run("UPDATE inodes SET links = links - ? WHERE ino = ?", delta, parent)
                }
                for ino in [source, target] { try touch(ino, modified: false) }
                try touch(parent)
                if newParent != parent { try touch(newParent) }
                return
            }
            if let target {
                if noReplace { throw .fileExists }
                if target == source { return }  // two names of one inode: nothing to do
                let targetInode = try fetchInode(target)
                if sourceInode.isDirectory {
                    guard targetInode.isDirectory else { throw .notDirectory }
                    guard try isEmptyDirectory(target) else { throw .directoryNotEmpty }
                } else if targetInode.isDirectory {
                    throw .isDirectory
                }
            }
            if parent == newParent && name == newName { return }
            if sourceInode.isDirectory { try refuseIntoItself(source, newParent) }
            if let target { try removeName(parent: newParent, name: newName, ino: target) }
            try run("DELETE FROM entries WHERE parent = ? AND name = ?", parent, name)
            try run("INSERT INTO entries(parent, name, ino) VALUES(?,?,?)", newParent, newName, source)
            if sourceInode.isDirectory && parent != newParent {
                try run("UPDATE inodes SET links = links - 1 WHERE ino = ?", parent)
                try run("UPDATE inodes SET links = links + 1 WHERE ino = ?", newParent)
            }
            try touch(source, modified: false)
            try touch(parent)
            if newParent != parent { try touch(newParent) }
        }
    }

    /// EINVAL when `directory` is `destination` or one of its ancestors.
    func refuseIntoItself(_ directory: Int64, _ destination: Int64) throws(Errno) {
        var current = destination
        var steps = 0
        while true {
            if current == directory { throw .invalidArgument }
            if current == Self.rootInode { return }
            let statement = try statement("SELECT parent FROM entries WHERE ino = ? LIMIT 1")
            statement.bind(current)
            defer { statement.done() }
            guard try row(statement) else { return }
            current = statement.int(0)
            steps += 1
            if steps > 100_000 { throw .ioError }
        }
    }

    // MARK: Extended attributes (user.* only)

    static func checkAttributeName(_ name: String) throws(Errno) {
        guard name.hasPrefix("user."), name.utf8.count > 5 else { throw .notSupported }
        guard name.utf8.count <= 255 else { throw .outOfRange }
    }

    /// `flags`: XATTR_CREATE (1) fails if present, XATTR_REPLACE (2) if absent.
    public func setExtendedAttribute(_ ino: Int64, name: String, value: [UInt8], flags: Int32) throws(Errno) {
        try Self.checkAttributeName(name)
        guard value.count <= 65536 else { throw .fileTooLarge }
        let expiry = name == Self.expiryAttribute ? try Self.expiryTime(value) : nil
        try transaction { () throws(Errno) in
            let inode = try fetchInode(ino)
            // Expiry removes names: a directory's would orphan its subtree.
            if expiry != nil && inode.isDirectory { throw .notPermitted }
            let exists = try attribute(ino, name) != nil
            if flags & 1 != 0 && exists { throw .fileExists }
            if flags & 2 != 0 && !exists { throw .noData }
            try run("INSERT OR REPLACE INTO xattrs(ino, name, value) VALUES(?,?,?)", ino, name, value)
            if let expiry { try run("UPDATE inodes SET expires = ? WHERE ino = ?", expiry, ino) }
            try touch(ino, modified: false)
        }
    }

    func attribute(_ ino: Int64, _ name: String) throws(Errno) -> [UInt8]? {
        let statement = try statement("SELECT value FROM xattrs WHERE ino = ? AND name = ?")
        statement.bind(ino, name)
        defer { statement.done() }
        return try row(statement) ? statement.bytes(0) : nil
    }

    public func extendedAttribute(_ ino: Int64, name: String) throws(Errno) -> [UInt8] {
        try withLock { () throws(Errno) -> [UInt8] in
            guard let value = try attribute(ino, name) else { throw .noData }
            return value
        }
    }

    public func extendedAttributeNames(_ ino: Int64) throws(Errno) -> [String] {
        try withLock { () throws(Errno) -> [String] in
            let statement = try statement("SELECT name FROM xattrs WHERE ino = ? ORDER BY name")
            statement.bind(ino)
            defer { statement.done() }
            var names: [String] = []
            while try row(statement) { names.append(statement.text(0)) }
            return names
        }
    }

    public func removeExtendedAttribute(_ ino: Int64, name: String) throws(Errno) {
        try Self.checkAttributeName(name)
        try transaction { () throws(Errno) in
            guard try attribute(ino, name) != nil else { throw .noData }
            try run("DELETE FROM xattrs WHERE ino = ? AND name = ?", ino, name)
            if name == Self.expiryAttribute { try run("UPDATE inodes SET expires = NULL WHERE ino = ?", ino) }
            try touch(ino, modified: false)
        }
    }

    // MARK: References and durability

    public func lookedUp(_ ino: Int64, count: UInt64 = 1) {
        lock.withLock { lookups[ino, default: 0] += count }
    }

    public func forgot(_ ino: Int64, count: UInt64) {
        _ = try? withLock { () throws(Errno) in
            let left = (lookups[ino] ?? 0) > count ? lookups[ino]! - count : 0
            lookups[ino] = left == 0 ? nil : left
            if left == 0 { try deleteIfUnreferenced(ino) }
        }
    }

    /// An open handle: the file is in use (never evicted while open) and was used now.
    /// The time of use is kept to the minute (`useResolution`): an open within a minute of
    /// the last recorded one writes nothing, so reading files costs no commits (a write
    /// per open was half of an open+read+close of a cache file).
    public func opened(_ ino: Int64) {
        _ = try? withLock { () throws(Errno) in
            opens[ino, default: 0] += 1
            let now = Self.now()
            try run("UPDATE inodes SET used = ? WHERE ino = ? AND used < ?", now, ino, now - Self.useResolution)
        }
    }

    /// How precisely the least recently used order is kept (nanoseconds).
    static let useResolution: Int64 = 60_000_000_000

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
        (try? transaction { () throws(Errno) -> [(parent: Int64, name: String)] in
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
            let total = try statement("SELECT coalesce(sum(stored), 0) FROM inodes WHERE links > 0 AND mode & \(S_IFMT) = \(S_IFREG)")
            var used: Int64 = 0
            if try row(total) { used = total.int(0) }
            total.done()
            guard used > limit else { return removed }
            let oldest = try statement("SELECT ino, stored FROM inodes WHERE links > 0 AND mode & \(S_IFMT) = \(S_IFREG) ORDER BY used, ino")
            oldest.bind()
            var candidates: [(Int64, Int64)] = []
            while used > limit, try row(oldest) {
                let ino = oldest.int(0), size = oldest.int(1)
                guard (opens[ino] ?? 0) == 0 else { continue }
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

    func removeAllNames(_ ino: Int64) throws(Errno) -> [(parent: Int64, name: String)] {
        let names = try statement("SELECT parent, name FROM entries WHERE ino = ?")
        names.bind(ino)
        var found: [(parent: Int64, name: String)] = []
        while try row(names) { found.append((names.int(0), names.text(1))) }
        names.done()
        for (parent, name) in found { try removeName(parent: parent, name: name, ino: ino) }
        return found
    }

    public func released(_ ino: Int64) {
        _ = try? withLock { () throws(Errno) in
            let left = max(0, (opens[ino] ?? 0) - 1)
            opens[ino] = left == 0 ? nil : left
            if left == 0 { try deleteIfUnreferenced(ino) }
        }
    }

    /// Commits and makes every change durable: an fsync of the write-ahead log, which holds
    /// every change not yet checkpointed (a checkpoint syncs the database file before the
    /// log may be reused).
    public func synchronize() throws(Errno) {
        try withLock { () throws(Errno) in
            try commitBatch()
            let fd = open(path + "-wal", O_RDONLY | O_CLOEXEC)
            guard fd >= 0 else { return }  // no log: everything is in the database file
            defer { Glibc.close(fd) }
            if fsync(fd) != 0 { throw Errno.current }
        }
    }

    /// At unmount: commits, checkpoints everything and truncates the log.
    public func close() throws(Errno) {
        try withLock { () throws(Errno) in
            try commitBatch()
            try exec("PRAGMA wal_checkpoint(TRUNCATE)")
        }
    }

    deinit { try? commitBatch() }

    /// Files and bytes stored (holes not counted, preallocated bytes counted).
    public func usage() -> (files: Int64, bytes: Int64) {
        (try? withLock { () throws(Errno) -> (files: Int64, bytes: Int64) in
            let statement = try statement("SELECT count(*), coalesce(sum(stored), 0) FROM inodes WHERE mode & \(S_IFMT) = \(S_IFREG)")
            defer { statement.done() }
            guard try row(statement) else { return (0, 0) }
            return (statement.int(0), statement.int(1))
        }) ?? (0, 0)
    }
}

/// Why the cache cannot be opened.
public enum CacheStoreError: Error, CustomStringConvertible, Sendable {
    case damaged(String)
    public var description: String {
        switch self {
        case .damaged(let reason): "cache damaged: \(reason)"
        }
    }
}

extension Statement {
    func bindArray(_ values: [Any?]) {
        sqlite3_reset(handle)
        sqlite3_clear_bindings(handle)
        let transient = unsafeBitCast(-1, to: sqlite3_destructor_type.self)
        for (offset, value) in values.enumerated() {
            let index = Int32(offset + 1)
            switch value {
            case let number as Int64: sqlite3_bind_int64(handle, index, number)
            case let number as Int: sqlite3_bind_int64(handle, index, Int64(number))
            case let text as String: sqlite3_bind_text(handle, index, text, -1, transient)
            case let bytes as [UInt8]:
                bytes.withUnsafeBytes { sqlite3_bind_blob(handle, index, $0.baseAddress ?? UnsafeRawPointer(bitPattern: 1), Int32($0.count), transient) }
            case let buffer as UnsafeRawBufferPointer:
                sqlite3_bind_blob(handle, index, buffer.baseAddress ?? UnsafeRawPointer(bitPattern: 1), Int32(buffer.count), transient)
            default: sqlite3_bind_null(handle, index)
            }
        }
    }
}
