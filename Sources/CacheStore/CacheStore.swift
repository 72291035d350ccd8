#if canImport(Glibc)
import Glibc
#endif
import CSQLite
import Posix

/// One inode row of the cache (see `docs/cache-schema.md`).
///
/// Thread-safety: a value; `Sendable`.
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
///
/// Thread-safety: a value; `Sendable`.
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
/// each change after the first is a savepoint in it (the first is the transaction itself),
/// so a failing change rolls back alone. `synchronize()`
/// makes everything durable: commits and syncs the write-ahead log, or appends the few
/// writes since the last sync to the fsync journal and syncs that (`SyncJournal`); checkpoints run
/// off the request path (`checkpointIfDue`). Writes of parts of chunks are buffered
/// (`DirtyChunks`); big files' data is deleted in slices (`reclaimStep`). Inodes that lost
/// their last name but are still open or held (`InodeHolders`: the kernel's references,
/// counted by the mounted tree) stay until `released`/`unheld` see the last reference go;
/// orphans left by a crash are removed after open. Memory does not grow with file size:
/// reads and writes touch only their chunks.
///
/// Thread-safety: one connection behind a mutex; every public method takes it.
public final class CacheStore: @unchecked Sendable {
    public static let chunkSize = 64 * 1024
    public static let maximumNameLength = 255
    public static let rootInode: Int64 = 1
    static let schemaVersion: Int64 = 4

    let path: String
    let database: SQLiteDatabase
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
    /// When the open group of changes began (nil: none open), and how many it holds.
    var batchStart: ContinuousClock.Instant?
    var batchChanges = 0
    /// Bytes of file data the open group wrote (see `groupBytes`).
    var batchBytes = 0
    /// The connection's count of changed rows when the group opened: a group that changed
    /// nothing (a maintenance pass that found nothing to do) leaves no log to checkpoint.
    var batchTotalChanges: Int64 = 0
    /// The open group changed pages without changing rows (incremental vacuum).
    var batchMovedPages = false
    /// Data to delete in slices: the chunks under `key`, then (when set) the inode row of
    /// `inode` (a file without names or references).
    var reclaimQueue: [(key: Int64, inode: Int64?)] = []
    /// Inodes whose chunks are stored under another key than their number (`inodes.data`):
    /// a big file cut short gets a new key and its old chunks go in slices (`cutOff`).
    var dataKeys: [Int64: Int64] = [:]
    var nextDataKey: Int64 = -1
    /// When the last change (not a reclaim step) was made, and since when free pages wait to
    /// be given back.
    var lastChange = ContinuousClock.now
    var vacuumWanted: ContinuousClock.Instant?
    /// Inodes that lost their last name while the kernel or an open handle still held them:
    /// deleted when the last reference goes (others need no look at the database then).
    var orphans: Set<Int64> = []
    /// File data written but not yet in the database (see `DirtyChunks`), and how much
    /// longer the committing thread waits after a failure to store it.
    var dirty = DirtyChunks()
    var dirtyBackoff = 0.0
    /// Files that grew by appends in later flushes (a log, a database's write-ahead log):
    /// each new chunk of theirs gets its room when it is made (`storePiece`). Only a hint,
    /// kept in memory and bounded: a file not in it gets its room at its second append.
    var growing: Set<Int64> = []
    /// The files an fsync just stored, as the rows hold them, while no row has changed
    /// since (`settledAt`, SQLite's count of changed rows): a write right after an fsync (a
    /// database inside writing its next transaction) starts its buffer from here instead of
    /// reading the row again (a row read makes that first WRITE cost twice the next ones).
    var settled: [Int64: DirtyChunks.File] = [:]
    var settledAt: Int64 = -1
    /// The write-ahead log, opened at the first fsync and kept for the next ones (SQLite
    /// keeps the file while a connection is open: truncated or started over, never replaced).
    var logDescriptor: Int32?
    /// fsync's short way (see `SyncJournal`), and the connection's count of changed rows
    /// when everything committed was last made durable (-1: not yet in this open; the
    /// short way needs it equal to the count now).
    var journal: SyncJournal
    var syncedChanges: Int64 = -1
    /// Set while `recoverJournal` stores fsynced writes again: the free space reserve does
    /// not apply to them.
    var replaying = false
    /// Whether fsync may go the short way (tests of the long way turn it off).
    var shortFsyncs = true
    /// Drains of the journal: fsyncs that went the long way, the journal folded into the
    /// database (`activity`, shown in `.mtmfs/status`).
    var journalDrains = 0
    /// Wakes the committing thread (see `committerAwaitsGroup`), and at shutdown.
    let committerWake = Semaphore()
    /// The committing thread waits for a wake with no group open (`committerAwaitsGroup`),
    /// and, in a wait longer than `dirtyDelay`, with nothing buffered (`committerAwaitsData`)
    /// (lock held). The store wakes it
    /// when the lock is let go with a group left open, or data buffered, that it does not
    /// know of — not when a group opens: a group opened and committed within one request
    /// (an fsync) needs no thread (a database inside, a transaction an fsync, woke it 3.5
    /// times a transaction, each wake contending for the lock, to find nothing).
    var committerAwaitsGroup = false
    var committerAwaitsData = false
    /// Wakes of the committing thread posted by requests (`activity`, shown in
    /// `.mtmfs/status`: an idle store posts none).
    var committerWakes = 0
    /// Called (with the lock held: it must only wake a thread) when there is work for the
    /// thread that runs `maintain` and `reclaimStep`: a group committed (the size limit may
    /// be passed), data queued for deletion, an expiry time set.
    public var onBackgroundWork: (@Sendable () -> Void)? {
        get { lock.withLock { backgroundWork } }
        set { lock.withLock { backgroundWork = newValue } }
    }
    var backgroundWork: (@Sendable () -> Void)?

    /// Changes are committed in groups: the first change after a commit opens one SQLite
    /// transaction, which is committed on fsync, once it holds `groupCommitSize` changes,
    /// or `groupCommitDelay` after it began (by whoever calls `commitWhenDue`). Many
    /// files' creates and writes then cost one WAL append and one round of locks instead of
    /// one each (a close does not commit: that would cost more than it saves). Readers of the database file see a
    /// change within `groupCommitDelay`; a kill -9 of the daemon loses at most the changes
    /// of that last interval that were not fsynced; the database is consistent either way.
    public static let groupCommitDelay = 0.005
    static let groupCommitSize = 256

    /// The write-ahead log is copied into the database file (a checkpoint) by whoever calls
    /// `checkpointIfDue`, once no change came for `checkpointQuiet` seconds or the log has
    /// grown — not inside a request, as SQLite's automatic checkpoint would (it rewrites
    /// every page of the log in the write that crosses its limit and syncs the database in
    /// every fsync). fsync syncs only the log (or the fsync journal), which is what makes a change durable
    /// (`synchronize`).
    public static let checkpointQuiet = 0.1
    /// See `checkpointIfDue`: the log is copied from `checkpointThreshold` bytes on, started
    /// over under the lock from `restartThreshold` on, and never holds much more than `logBound`.
    static let checkpointThreshold: Int64 = 8 << 20
    static let restartThreshold: Int64 = 16 << 20
    public static let logBound: Int64 = 64 << 20
    /// The log's file is kept up to this size, written over from its start each time SQLite
    /// starts the log over (`journal_size_limit` cuts it back to this then; a quiet store
    /// whose file is larger gets the log started over at once, see `checkpointIfDue`). A
    /// commit that overwrites blocks the file already has costs an `fdatasync` of the data
    /// and a flush of the disk; one that lengthens the file pays a journal commit of the
    /// file system too. Measured with the
    /// kernel's FUSE tracepoints (a database inside, 500 transactions): the daemon's
    /// `fdatasync` 305–366 µs with the file started at 0, 155–188 µs written over.
    static let keptLogSize: Int64 = 16 << 20
    /// Committed changes not yet checkpointed, and when the last change was committed.
    var uncheckpointed = false
    var lastCommit = ContinuousClock.now
    /// The checkpointer's own connection and lock: it never waits for the request path.
    var checkpointer: SQLiteDatabase?
    let checkpointLock = Lock()

    /// Files removed for the size limit, and for their expiry time, since the mount began.
    public func removals() -> (evictions: Int, expirations: Int) {
        lock.withLock { (evictions, expirations) }
    }

    /// Free space kept on the data directory's file system: writes that would eat into it
    /// get ENOSPC, so that deletes and checkpoints (which need room in the write-ahead log)
    /// still work on a full disk and space can be freed.
    public static let reservedBytes: UInt64 = 8 << 20

    func requireHeadroom(adding bytes: Int = 0) throws(Errno) {
        guard !replaying else { return }  // (fsynced writes stored again at open: they had their room)
        guard let free = freeBytesNow ?? freeDiskBytes() else { return }
        let needed = Self.reservedBytes + UInt64(bytes)
        if free >= needed { return }
        // Deleted files leave their pages on SQLite's free list, where new data goes first:
        // those count as room too (the database file does not shrink, so without them every
        // write after an `rm` on a full disk would still fail).
        let pages = (try? database.scalarText("PRAGMA freelist_count")).flatMap { $0.flatMap { UInt64($0) } } ?? 0
        let pageSize = (try? database.scalarText("PRAGMA page_size")).flatMap { $0.flatMap { UInt64($0) } } ?? 0
        // The write-ahead log still needs real disk for the new pages (plus 1 MiB of margin).
        if free + pages * pageSize < needed || free < UInt64(bytes) + (1 << 20) { throw .noSpace }
    }

    /// Free bytes on the data directory's file system (nil when statvfs fails). With more
    /// than `measuredRoom` free, far from every threshold, one measurement serves the
    /// changes of the next `measurementLife` seconds (no writer fills 2 GiB in 50 ms: this
    /// store writes a few hundred MB a second): a statvfs per write cost as much as a small
    /// write itself. Closer to full, every change measures.
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
    var lastMeasurement: (free: UInt64, at: ContinuousClock.Instant)?

    /// Measured once per change (lock held): its headroom check and the decision to keep
    /// grouping share one statvfs.
    var freeBytesNow: UInt64?

    /// The extended attribute that makes a file disappear at a time (Unix seconds or ISO 8601).
    public static let expiryAttribute = "user.cache.expires"

    /// Whether this open ran the full integrity check (after an unclean shutdown).
    public private(set) var checkedAtOpen = false

    /// Opens (creating the schema if the file is new) the cache database at `path`. What
    /// takes long (the full check after an unclean shutdown, an upgrade) is said through
    /// `progress`, about once a second.
    /// The full `PRAGMA integrity_check` reads every page (seconds for gigabytes): it runs
    /// here only after an unclean shutdown (`check(path:progress:)` runs it on demand).
    public init(path: String, owner: (uid: UInt32, gid: UInt32), holders: (any InodeHolders)? = nil,
                progress: @escaping (String) -> Void = { _ in }) throws(CacheStoreError) {
        self.path = path
        self.holders = holders
        journal = SyncJournal(path: path + "-fsync")
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
            // A change in an open group is a savepoint, whose undo pages SQLite keeps in a statement journal:
            // by default a temporary file in /var/tmp, made, written and removed for nearly
            // every change (postmark: 2,132 of them in 8,000 transactions). Kept in memory,
            // where it lives only as long as one change.
            try database.execute("PRAGMA temp_store=MEMORY;")
            // Checkpoints are the committing thread's, off the path of requests.
            try database.execute("PRAGMA wal_autocheckpoint=0;")
            database.countLogFrames()  // (after the pragma: it replaces the hook)
            let version = Int64(try database.scalarText("PRAGMA user_version") ?? "0") ?? 0
            var clean = true
            if version == 0 {
                try createSchema(owner: owner)
            } else if version == 1 {
                clean = false  // no mark yet: the first open under version 2 checks
                try migrateFromVersion1(progress: progress)
                try migrateFromVersion2(progress: progress)
                try database.execute("PRAGMA user_version=\(Self.schemaVersion);")
            } else if version == 2 || version == 3 {
                if version == 2 { try migrateFromVersion2(progress: progress) }
                try migrateFromVersion3(progress: progress)
                clean = try database.scalarText("SELECT value FROM state WHERE name = 'clean'") == "1"
            } else if version != Self.schemaVersion {
                throw CacheStoreError.damaged("\(path) has schema version \(version), this mtmfs knows \(Self.schemaVersion)")
            } else {
                clean = try database.scalarText("SELECT value FROM state WHERE name = 'clean'") == "1"
            }
            if !clean { try fullCheck(progress: progress, reason: "after an unclean shutdown") }
            pageSize = database.pageSize
            vacuums = try database.scalarText("PRAGMA auto_vacuum") == "2"
            // Unclean from now on, until `close()` marks it clean again.
            try database.execute("INSERT OR REPLACE INTO state(name, value) VALUES('clean', 0);")
            // Inodes whose last name went while a crashed daemon still had them open, or
            // whose data was still being deleted: their chunks go in slices (`reclaimStep`).
            for (ino, key) in try database.pairs("SELECT ino, data FROM inodes WHERE data IS NOT NULL") { dataKeys[ino] = key }
            nextDataKey = min(-1, (try database.integers("SELECT coalesce(min(ino), 0) FROM chunks").first ?? 0) - 1,
                              (dataKeys.values.min() ?? 0) - 1)
            reclaimQueue = try database.pairs("SELECT ino, coalesce(data, ino) FROM inodes WHERE links = 0").map { ($0.1, $0.0) }
            // Keys of chunks cut off by a truncation that a crash interrupted.
            reclaimQueue += try database.integers(
                "SELECT DISTINCT ino FROM chunks WHERE ino < 0 AND ino NOT IN (SELECT data FROM inodes WHERE data IS NOT NULL)"
            ).map { ($0, nil) }
            reclaimQueue += try database.integers(
                "SELECT ino FROM inodes WHERE data IS NOT NULL AND EXISTS (SELECT 1 FROM chunks WHERE chunks.ino = inodes.ino)"
            ).map { ($0, nil) }
            // fsyncs that went the short way and were not stored before the stop.
            try recoverJournal(progress: progress)
        } catch let error as CacheStoreError {
            throw error
        } catch let error as SQLiteError {
            throw .damaged("\(path): \(error)")
        } catch {
            throw .damaged("\(path): \(error)")
        }
    }

    /// The full check of a cache database, read only (also while it is mounted): what
    /// `mtmfs check` runs. Throws what is wrong; returns what is right but worth saying
    /// (fsynced writes waiting in the fsync journal), or nil.
    @discardableResult
    public static func check(path: String, progress: @escaping (String) -> Void) throws(CacheStoreError) -> String? {
        do {
            let database = try SQLiteDatabase(path: path, readOnly: true)
            try database.execute("PRAGMA busy_timeout=5000;")
            guard try database.scalarText("PRAGMA application_id") == String(CacheDatabase.applicationID) else {
                throw CacheStoreError.damaged("\(path) is not an mtmfs cache database (application_id)")
            }
            let version = Int64(try database.scalarText("PRAGMA user_version") ?? "0") ?? 0
            guard version <= schemaVersion else {
                throw CacheStoreError.damaged("\(path) has schema version \(version), this mtmfs knows \(schemaVersion)")
            }
            try integrityCheck(database, path: path, reason: "on demand", progress: progress)
            if version >= 3, let problem = try totalsProblem(database) {
                throw CacheStoreError.damaged("\(path): \(problem)")
            }
            if version >= 4, let problem = try piecesProblem(database) {
                throw CacheStoreError.damaged("\(path): \(problem)")
            }
            // Records of the fsync journal not yet stored: normal while mounted (the next
            // transaction stores them), and after a crash (the next mount does).
            let mark = version < schemaVersion ? 0 : try SyncJournal.storedMark(in: database)
            let seed = version < schemaVersion ? 0 : try SyncJournal.storedIdentity(in: database) ?? 0
            let waiting = try SyncJournal.read(path: path + "-fsync", after: mark, seed: seed).entries
            return waiting.isEmpty ? nil
                : "\(waiting.count) fsynced writes wait in \(path)-fsync, to be stored by the mount (or the next one)"
        } catch let error as CacheStoreError {
            throw error
        } catch {
            throw .damaged("\(path): \(error)")
        }
    }

    /// `PRAGMA integrity_check`, saying every second that it is still working.
    func fullCheck(progress: @escaping (String) -> Void, reason: String) throws {
        try Self.integrityCheck(database, path: path, reason: reason, progress: progress)
        // Triggers keep the totals in every transaction; a count that differs means the file
        // was changed by hand: the totals are counted again (the data itself is intact).
        if let problem = try Self.totalsProblem(database) {
            Log.error("cache: \(problem); counted again")
            try database.execute("DELETE FROM totals; INSERT INTO totals(id, files, bytes, linked_bytes) SELECT 1, * FROM (\(Self.countedTotals));")
        }
        // Pieces that overlap or lie outside their chunk cannot come from a crash (every
        // change is one transaction): said, and mounted all the same (reads lay them in order).
        if let problem = try Self.piecesProblem(database) { Log.error("cache: \(problem)") }
        checkedAtOpen = true
    }

    static func integrityCheck(_ database: SQLiteDatabase, path: String, reason: String,
                               progress: @escaping (String) -> Void) throws {
        let megabytes = ((try? Syscall.stat(path)).map { Int($0.st_size) } ?? 0) >> 20
        progress("checking the cache database (\(megabytes) MiB) \(reason)…")
        let started = ContinuousClock.now
        var lastSaid = 0
        let result = try database.withProgress(every: 100_000, {
            let seconds = Int(started.secondsElapsed)
            if seconds > lastSaid {
                lastSaid = seconds
                progress("checking the cache database (\(megabytes) MiB) \(reason)… \(seconds) s")
            }
        }) { () throws(SQLiteError) in try database.scalarText("PRAGMA integrity_check") }
        guard result == "ok" else {
            throw CacheStoreError.damaged("\(path) fails PRAGMA integrity_check: \(result ?? "no answer")")
        }
        progress("checked the cache database in \(Int(started.secondsElapsed * 1000)) ms: ok")
    }

    func createSchema(owner: (uid: UInt32, gid: UInt32)) throws(SQLiteError) {
        let now = Self.now()
        // (Incremental vacuum was chosen when the file was made: `CacheDatabase.createEmpty`.)
        try database.execute("""
            BEGIN IMMEDIATE;
            CREATE TABLE inodes(
                ino INTEGER PRIMARY KEY AUTOINCREMENT, mode INTEGER NOT NULL, uid INTEGER NOT NULL, gid INTEGER NOT NULL,
                size INTEGER NOT NULL DEFAULT 0, links INTEGER NOT NULL, atime INTEGER NOT NULL,
                mtime INTEGER NOT NULL, ctime INTEGER NOT NULL, rdev INTEGER NOT NULL DEFAULT 0,
                target TEXT, used INTEGER NOT NULL DEFAULT 0, expires INTEGER,
                stored INTEGER NOT NULL DEFAULT 0, data INTEGER) STRICT;
            CREATE INDEX inodes_by_use ON inodes(used) WHERE links > 0;
            CREATE INDEX inodes_by_expiry ON inodes(expires) WHERE expires IS NOT NULL;
            CREATE TABLE entries(
                parent INTEGER NOT NULL, name TEXT NOT NULL, ino INTEGER NOT NULL,
                PRIMARY KEY(parent, name)) STRICT, WITHOUT ROWID;
            CREATE INDEX entries_by_inode ON entries(ino);
            \(Self.chunksTable)
            CREATE TABLE xattrs(
                ino INTEGER NOT NULL, name TEXT NOT NULL, value BLOB NOT NULL,
                PRIMARY KEY(ino, name)) STRICT, WITHOUT ROWID;
            INSERT INTO inodes(ino, mode, uid, gid, links, atime, mtime, ctime)
                VALUES(1, \(S_IFDIR | 0o755), \(owner.uid), \(owner.gid), 2, \(now), \(now), \(now));
            CREATE TABLE state(name TEXT PRIMARY KEY, value INTEGER NOT NULL) STRICT, WITHOUT ROWID;
            \(Self.totalsTable)
            INSERT INTO totals(id, files, bytes, linked_bytes) VALUES(1, 0, 0, 0);
            PRAGMA user_version=\(Self.schemaVersion);
            COMMIT;
            """)
    }

    /// Version 3 keeps the totals of regular files and their stored bytes in a row of their
    /// own, kept by triggers in the transaction of every change (so a crash cannot leave
    /// them wrong): `.mtmfs/status` and the size limit read one row instead of summing
    /// every inode. `mtmfs check` compares them with a count.
    static let totalsTable = """
        CREATE TABLE totals(
            id INTEGER PRIMARY KEY CHECK (id = 1), files INTEGER NOT NULL, bytes INTEGER NOT NULL,
            linked_bytes INTEGER NOT NULL) STRICT;
        CREATE TRIGGER totals_insert AFTER INSERT ON inodes WHEN new.mode & \(S_IFMT) = \(S_IFREG) BEGIN
            UPDATE totals SET files = files + 1, bytes = bytes + new.stored,
                linked_bytes = linked_bytes + iif(new.links > 0, new.stored, 0);
        END;
        CREATE TRIGGER totals_delete AFTER DELETE ON inodes WHEN old.mode & \(S_IFMT) = \(S_IFREG) BEGIN
            UPDATE totals SET files = files - 1, bytes = bytes - old.stored,
                linked_bytes = linked_bytes - iif(old.links > 0, old.stored, 0);
        END;
        CREATE TRIGGER totals_update AFTER UPDATE OF stored, links ON inodes
            WHEN new.mode & \(S_IFMT) = \(S_IFREG) AND (old.stored != new.stored OR (old.links > 0) != (new.links > 0)) BEGIN
            UPDATE totals SET bytes = bytes - old.stored + new.stored,
                linked_bytes = linked_bytes - iif(old.links > 0, old.stored, 0) + iif(new.links > 0, new.stored, 0);
        END;
        """

    /// What the totals must be, counted from the inodes (one pass over the table).
    static let countedTotals = """
        SELECT count(*), coalesce(sum(stored), 0), coalesce(sum(iif(links > 0, stored, 0)), 0)
            FROM inodes WHERE mode & \(S_IFMT) = \(S_IFREG)
        """

    /// Version 3 adds the totals (counted once here).
    func migrateFromVersion2(progress: (String) -> Void) throws(SQLiteError) {
        progress("upgrading the cache database to schema version 3 (once)…")
        try database.execute("""
            BEGIN IMMEDIATE;
            \(Self.totalsTable)
            INSERT INTO totals(id, files, bytes, linked_bytes) SELECT 1, * FROM (\(Self.countedTotals));
            PRAGMA user_version=3;
            COMMIT;
            """)
    }

    /// Whether the kept totals equal a count (nil: equal; else what differs).
    static func totalsProblem(_ database: SQLiteDatabase) throws(SQLiteError) -> String? {
        let kept = try database.integerRow("SELECT files, bytes, linked_bytes FROM totals WHERE id = 1")
        let counted = try database.integerRow(countedTotals)
        guard kept != counted else { return nil }
        return "kept totals (files, bytes, linked bytes) \(kept) differ from the count \(counted)"
    }

    /// Chunks are a rowid table (with a unique index on the position) so that a write into
    /// part of a stored piece changes only the pages it covers (incremental BLOB I/O, which
    /// SQLite offers for rowid tables only). Version 4: a chunk is stored as the pieces that
    /// were written (`start` within the chunk), so a write stores what it covers; `start`
    /// comes before `data`, so that reading it never walks a piece's overflow pages.
    static let chunksTable = """
        CREATE TABLE chunks(
            id INTEGER PRIMARY KEY, ino INTEGER NOT NULL, idx INTEGER NOT NULL,
            start INTEGER NOT NULL DEFAULT 0, data BLOB NOT NULL) STRICT;
        CREATE UNIQUE INDEX chunks_by_position ON chunks(ino, idx, start);
        """

    /// Version 4 stores pieces of chunks (a `start` within the chunk): the table is rebuilt
    /// once, every row a piece at 0 with its row id kept. The rows move in slices of
    /// `upgradeSlice`, each slice one transaction that copies them and deletes the old ones
    /// (whose pages the next slice reuses), with the log emptied between slices: the file
    /// grows by one slice, not by a copy of the whole cache, and the log stays under its
    /// bound. A crash between slices leaves both tables; the next open goes on where it was.
    func migrateFromVersion3(progress: (String) -> Void) throws(SQLiteError) {
        progress("upgrading the cache database to schema version 4 (once; it moves the file data)…")
        let moving = try database.scalarText("SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = 'chunks_v3'") == "1"
        if !moving {
            try database.execute("""
                BEGIN IMMEDIATE;
                ALTER TABLE chunks RENAME TO chunks_v3;
                DROP INDEX chunks_by_position;
                \(Self.chunksTable)
                COMMIT;
                """)
        }
        let started = ContinuousClock.now
        var lastSaid = 0
        while try database.scalarText("SELECT EXISTS (SELECT 1 FROM chunks_v3)") == "1" {
            try database.execute("""
                BEGIN IMMEDIATE;
                INSERT INTO chunks(id, ino, idx, start, data)
                    SELECT id, ino, idx, 0, data FROM chunks_v3 ORDER BY id LIMIT \(Self.upgradeSlice);
                DELETE FROM chunks_v3 WHERE id <= (SELECT max(id) FROM chunks);
                COMMIT;
                PRAGMA wal_checkpoint(TRUNCATE);
                """)
            let seconds = Int(started.secondsElapsed)
            if seconds > lastSaid {
                lastSaid = seconds
                progress("upgrading the cache database to schema version 4 (once; it moves the file data)… \(seconds) s")
            }
        }
        try database.execute("BEGIN IMMEDIATE; DROP TABLE chunks_v3; PRAGMA user_version=4; COMMIT;")
    }

    /// Rows of chunks one slice of the upgrade to version 4 moves (at most 32 MiB).
    static let upgradeSlice = 512

    /// What is wrong with the pieces of chunks (nil: nothing): every piece lies inside its
    /// chunk and is not empty (an empty row is a preallocated chunk, alone in it), pieces of
    /// a chunk do not overlap, and each named file's `stored` is what its pieces hold (a deleted one's go in slices).
    static func piecesProblem(_ database: SQLiteDatabase) throws(SQLiteError) -> String? {
        let outside = try database.integers("""
            SELECT count(*) FROM chunks WHERE start < 0 OR start + length(data) > \(chunkSize)
                OR (length(data) = 0 AND start != 0)
            """).first ?? 0
        let overlapping = try database.integers("""
            SELECT count(*) FROM (SELECT start,
                lag(start + max(length(data), 1)) OVER (PARTITION BY ino, idx ORDER BY start) AS previous FROM chunks)
                WHERE previous > start
            """).first ?? 0
        let miscounted = try database.integers("""
            SELECT count(*) FROM inodes WHERE mode & \(S_IFMT) = \(S_IFREG) AND links > 0 AND stored !=
                (SELECT coalesce(sum(iif(length(data) = 0, \(chunkSize), length(data))), 0) FROM chunks
                 WHERE chunks.ino = coalesce(inodes.data, inodes.ino))
            """).first ?? 0
        var problems: [String] = []
        if outside > 0 { problems.append("\(outside) pieces of chunks lie outside their chunk") }
        if overlapping > 0 { problems.append("\(overlapping) pieces of chunks overlap others") }
        if miscounted > 0 { problems.append("\(miscounted) files' stored bytes differ from their pieces") }
        return problems.isEmpty ? nil : problems.joined(separator: "; ")
    }

    /// Version 2 counts the bytes each inode's chunk rows hold (`stored`, for `st_blocks`
    /// and the size limit), keeps the clean-shutdown mark (`state`), keeps chunks in a rowid
    /// table, and uses incremental vacuum: all done once, then the file is rebuilt (VACUUM).
    func migrateFromVersion1(progress: (String) -> Void) throws(SQLiteError) {
        progress("upgrading the cache database to schema version 2 (once)…")
        try database.execute("""
            BEGIN IMMEDIATE;
            ALTER TABLE inodes ADD COLUMN stored INTEGER NOT NULL DEFAULT 0;
            ALTER TABLE inodes ADD COLUMN data INTEGER;
            UPDATE inodes SET stored = (SELECT coalesce(sum(length(data)), 0) FROM chunks WHERE chunks.ino = inodes.ino)
                WHERE mode & \(S_IFMT) = \(S_IFREG);
            CREATE TABLE state(name TEXT PRIMARY KEY, value INTEGER NOT NULL) STRICT, WITHOUT ROWID;
            ALTER TABLE chunks RENAME TO chunks_v1;
            \(Self.chunksTable)
            INSERT INTO chunks(ino, idx, start, data) SELECT ino, idx, 0, data FROM chunks_v1 ORDER BY ino, idx;
            DROP TABLE chunks_v1;
            PRAGMA user_version=2;
            COMMIT;
            PRAGMA auto_vacuum=INCREMENTAL;
            VACUUM;
            """)
    }

    /// The key an inode's chunks are stored under (its number, unless cut short once).
    func key(_ ino: Int64) -> Int64 { dataKeys[ino] ?? ino }

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

    func fetchInode(_ ino: Int64) throws(Errno) -> CacheInode {
        let statement = try statement("SELECT ino, mode, uid, gid, size, links, atime, mtime, ctime, rdev, target, stored FROM inodes WHERE ino = ?")
        statement.bind(ino)
        defer { statement.done() }
        guard try row(statement) else { throw .noSuchFileOrDirectory }
        return dirty.overlay(Self.inode(statement))
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

    // MARK: References and durability

    /// The holders let go of `ino` (the kernel's last reference went): an orphan nothing
    /// holds any more is deleted. Other inodes cost no query.
    public func unheld(_ ino: Int64) {
        _ = try? withLock { () throws(Errno) in
            if orphans.contains(ino) { try change { () throws(Errno) in try referenceDropped(ino) } }
        }
    }


    /// An open of a file in one visit to the store: its row, cut to size 0 first with
    /// `truncate`. The file is then in use (never evicted while open) and used now; the
    /// time of use is kept to the minute (`useResolution`), so an open within a minute of
    /// the last recorded one writes nothing and reading files costs no commits. A directory
    /// is EISDIR.
    public func open(_ ino: Int64, truncate: Bool) throws(Errno) -> CacheInode {
        try withLock { () throws(Errno) -> CacheInode in
            var inode = try fetchInode(ino)
            guard !inode.isDirectory else { throw .isDirectory }
            if truncate && inode.size != 0 {
                try change { () throws(Errno) in
                    dirty.discard(ino)
                    let now = Self.now()
                    try setSize(of: &inode, to: 0, at: now)
                    inode.changeNanoseconds = now
                    try saveAttributes(inode)
                }
            }
            opens[ino, default: 0] += 1
            let now = Self.now()
            try run("UPDATE inodes SET used = ? WHERE ino = ? AND used < ?", now, ino, now - Self.useResolution)
            return inode
        }
    }

    /// How precisely the least recently used order is kept (nanoseconds).
    static let useResolution: Int64 = 60_000_000_000

    /// A handle closed: the last one writes the file's buffered data.
    public func released(_ ino: Int64) {
        _ = try? withLock { () throws(Errno) in
            let left = max(0, (opens[ino] ?? 0) - 1)
            opens[ino] = left == 0 ? nil : left
            guard left == 0 else { return }
            if orphans.contains(ino) {
                try change { () throws(Errno) in try referenceDropped(ino) }
            } else if dirty.files[ino] != nil {
                do throws(Errno) {
                    try change { () throws(Errno) in try flushDirty(ino) }
                } catch {
                    Log.error("cache: the data written to inode \(ino) could not be stored at its close: \(error)")
                }
            }
        }
    }

    /// Commits and makes every change durable: an fdatasync of the write-ahead log, which
    /// holds every change not yet checkpointed (a checkpoint syncs the database file before
    /// the log may be reused or cut). As SQLite syncs its log: the data and the size, not
    /// the times — the log is mostly overwritten in place, and an fsync there paid a
    /// journal commit for its mtime each time (a second flush of the disk). That sync runs
    /// after the store's lock is let go: requests of other files do not wait for the disk,
    /// and whatever was committed before it is covered (a drain of the fsync journal that
    /// comes first, when short fsyncs left records, too).
    ///
    /// With everything committed already durable and the writes buffered since then few
    /// enough, those writes go the short way instead: appended to the journal, which alone
    /// is synced (`SyncJournal`).
    public func synchronize() throws(Errno) {
        enum Way { case journal(Int32), log(Int32?, changes: Int64) }
        let way = try withLock { () throws(Errno) -> Way in
            if journal.canTakePending, batchStart == nil, !database.isInTransaction, everythingSynced {
                do throws(Errno) {
                    return .journal(try journal.appendPending())
                } catch {
                    // Said once: the rest of this mount goes the long way.
                    Log.error("cache: the fsync journal \(journal.path) cannot be written (\(error)): fsyncs store into the database")
                    shortFsyncs = false
                }
            }
            try drainJournal()
            let stored = dirty.files.mapValues { file in var left = file; left.chunks = [:]; return left }
            if !stored.isEmpty { try change { () throws(Errno) in try flushAllDirty() } }
            try commitBatch()
            if !stored.isEmpty { (settled, settledAt) = (stored, database.totalChanges) }
            // Everything buffered is in the database now: later writes are the pending ones.
            journal.startOver()
            return .log(logFile(), changes: database.totalChanges)
        }
        switch way {
        case .journal(let fd):
            try Syscall.fdatasync(fd)
        case .log(let fd, let changes):
            if let fd { try Syscall.fdatasync(fd) }
            lock.withLock { syncedChanges = max(syncedChanges, changes) }
        }
    }

    /// The write-ahead log's descriptor, opened once (nil: no log, all is in the database
    /// file) (lock held).
    func logFile() -> Int32? {
        if logDescriptor == nil { logDescriptor = try? Syscall.open(path + "-wal", O_RDONLY | O_CLOEXEC) }
        return logDescriptor
    }

    /// Whether the short way is open to writes now: nothing committed since everything was
    /// last made durable (lock held).
    var everythingSynced: Bool { shortFsyncs && database.totalChanges == syncedChanges }

    /// A buffer for a file with none, as an fsync left its row (see `settled`), or nil.
    func settledFile(_ ino: Int64) -> DirtyChunks.File? {
        guard settledAt == database.totalChanges else { return nil }
        return settled[ino]
    }

    /// At unmount: writes what is buffered, commits, marks the store clean (the next open
    /// skips the full check), checkpoints everything and truncates the log.
    public func close() throws(Errno) {
        // The checkpointer's connection first (its lock is taken before the store's); no
        // checkpoint opens another once `closed` is set.
        checkpointLock.withLock { checkpointer = nil }
        try withLock { () throws(Errno) in
            closed = true
            try change { () throws(Errno) in try flushAllDirty() }
            try commitBatch()
            try exec("INSERT OR REPLACE INTO state(name, value) VALUES('clean', 1)")
            try exec("PRAGMA wal_checkpoint(TRUNCATE)")
            if let fd = logDescriptor { Syscall.close(fd) }
            logDescriptor = nil
            // Drained by the flush above, and the mark checkpointed: nothing in it counts.
            // The file stays, for the next mount's fsyncs to write over (making it is a
            // write and a sync of 4 MiB).
            journal.close()
        }
    }

    deinit {
        try? commitBatch()
        if let fd = logDescriptor { Syscall.close(fd) }
    }

    /// How often fsyncs went the long way (the journal drained into the database) and how
    /// often requests woke the committing thread, since the store was opened.
    public func activity() -> (journalDrains: Int, committerWakes: Int) {
        lock.withLock { (journalDrains, committerWakes) }
    }

    /// Files and bytes stored (holes not counted, preallocated bytes counted): the kept
    /// totals, one row, whatever the store holds.
    public func usage() -> (files: Int64, bytes: Int64) {
        (try? withLock { () throws(Errno) -> (files: Int64, bytes: Int64) in
            let statement = try statement("SELECT files, bytes FROM totals WHERE id = 1")
            defer { statement.done() }
            guard try row(statement) else { return (0, 0) }
            return (statement.int(0), statement.int(1))
        }) ?? (0, 0)
    }
}

/// Why the cache cannot be opened.
///
/// Thread-safety: a value; `Sendable`.
public enum CacheStoreError: Error, CustomStringConvertible, Sendable {
    case damaged(String)
    public var description: String {
        switch self {
        case .damaged(let reason): "cache damaged: \(reason)"
        }
    }
}
