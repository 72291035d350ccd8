#if canImport(Glibc)
import Glibc
#endif
import CSQLite
import Posix

/// The cache database's schema (version 5, `docs/cache-schema.md`): made when the file is
/// new, upgraded from every earlier version, checked against the data folder.
///
/// Thread-safety: stateless; it works on the connection it is given, before the store is
/// shared (or read only, for `mtmfs check`).
enum Schema {
    /// Opens the schema at `database`: made if the file is new, upgraded if older (the
    /// bytes of large files move out to `folder`). Returns whether the last shutdown was
    /// clean (a database without the mark counts as unclean: its first open checks).
    static func open(_ database: SQLiteDatabase, path: String, folder: DataFolder, owner: (uid: UInt32, gid: UInt32),
                     progress: (String) -> Void) throws -> Bool {
        let version = Int64(try database.scalarText("PRAGMA user_version") ?? "0") ?? 0
        switch version {
        case 0:
            try create(database, owner: owner)
            return true
        case 1...4:
            if version == 1 { try upgradeFromVersion1(database, progress: progress) }
            if version <= 2 { try upgradeFromVersion2(database, progress: progress) }
            let mark = version > 1 ? try database.scalarText("SELECT value FROM state WHERE name = 'clean'") : nil
            try moveDataOut(database, folder: folder, progress: progress)
            return mark == "1"
        case CacheStore.schemaVersion:
            return try database.scalarText("SELECT value FROM state WHERE name = 'clean'") == "1"
        default:
            throw CacheStoreError.damaged("\(path) has schema version \(version), this mtmfs knows \(CacheStore.schemaVersion)")
        }
    }

    static func create(_ database: SQLiteDatabase, owner: (uid: UInt32, gid: UInt32)) throws(SQLiteError) {
        let now = CacheStore.now()
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
            \(dataIndex)
            CREATE TABLE entries(
                parent INTEGER NOT NULL, name TEXT NOT NULL, ino INTEGER NOT NULL,
                PRIMARY KEY(parent, name)) STRICT, WITHOUT ROWID;
            CREATE INDEX entries_by_inode ON entries(ino);
            \(contentsTable)
            CREATE TABLE xattrs(
                ino INTEGER NOT NULL, name TEXT NOT NULL, value BLOB NOT NULL,
                PRIMARY KEY(ino, name)) STRICT, WITHOUT ROWID;
            INSERT INTO inodes(ino, mode, uid, gid, links, atime, mtime, ctime)
                VALUES(1, \(S_IFDIR | 0o755), \(owner.uid), \(owner.gid), 2, \(now), \(now), \(now));
            CREATE TABLE state(name TEXT PRIMARY KEY, value INTEGER NOT NULL) STRICT, WITHOUT ROWID;
            \(totalsTable)
            INSERT INTO totals(id, files, bytes, linked_bytes) VALUES(1, 0, 0, 0);
            PRAGMA user_version=\(CacheStore.schemaVersion);
            COMMIT;
            """)
    }

    /// Large files by their data file's key (a key is checked for use before it is given,
    /// and before its file is removed).
    static let dataIndex = "CREATE INDEX IF NOT EXISTS inodes_by_data ON inodes(data) WHERE data IS NOT NULL;"

    /// A small file's bytes: its first `length(data)` bytes (the rest of its size reads as
    /// zeros). A rowid table keyed by the inode: one row, read and written whole.
    static let contentsTable = "CREATE TABLE contents(ino INTEGER PRIMARY KEY, data BLOB NOT NULL) STRICT;"

    /// The totals of regular files and their stored bytes, kept by triggers in the
    /// transaction of every change (so a crash cannot leave them wrong): `.mtmfs/status` and
    /// the size limit read one row instead of summing every inode.
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

    /// Whether the kept totals equal a count (nil: equal; else what differs).
    static func totalsProblem(_ database: SQLiteDatabase) throws(SQLiteError) -> String? {
        let kept = try database.integerRow("SELECT files, bytes, linked_bytes FROM totals WHERE id = 1")
        let counted = try database.integerRow(countedTotals)
        guard kept != counted else { return nil }
        return "kept totals (files, bytes, linked bytes) \(kept) differ from the count \(counted)"
    }

    // MARK: The data folder

    /// Large files whose data file is missing (their inodes), and the keys of data files
    /// that no row names.
    static func dataFileProblems(_ database: SQLiteDatabase, folder: DataFolder) throws -> (missing: [Int64], unnamed: [Int64]) {
        let rows = try database.pairs("SELECT ino, data FROM inodes WHERE data IS NOT NULL")
        let present = Set(folder.keys())
        let named = Set(rows.map(\.1))
        return (rows.filter { !present.contains($0.1) }.map(\.0).sorted(), present.subtracting(named).sorted())
    }

    /// After an unclean shutdown: data files that no row names (a conversion the crash
    /// kept from being recorded, a deletion not yet carried out) are removed, and every
    /// large file's row takes its size, blocks and times from its data file again (the
    /// copies in rows follow the data files with a delay, and that part is not synced).
    static func sweep(_ database: SQLiteDatabase, folder: DataFolder, progress: (String) -> Void) throws {
        let (missing, unnamed) = try dataFileProblems(database, folder: folder)
        for key in unnamed { folder.remove(key) }
        if !unnamed.isEmpty { progress("removed \(unnamed.count) data file(s) that no file names (left by the crash)") }
        for ino in missing {
            Log.error("cache: the data file of inode \(ino) is missing from \(folder.path) (lost in a crash before it was synced): the file reads as empty")
        }
        let rows = try database.pairs("SELECT ino, data FROM inodes WHERE data IS NOT NULL")
        guard !rows.isEmpty else { return }
        try database.execute("BEGIN IMMEDIATE")
        do {
            for (ino, key) in rows {
                let st = try? Syscall.stat(folder.name(key))
                try database.execute("""
                    UPDATE inodes SET size = \(st.map { Int64($0.st_size) } ?? 0), stored = \(st.map { Int64($0.st_blocks) * 512 } ?? 0),
                        mtime = \(st.map { DataFile.nanoseconds($0.st_mtim) } ?? 0), ctime = max(ctime, \(st.map { DataFile.nanoseconds($0.st_ctim) } ?? 0))
                        WHERE ino = \(ino)
                    """)
            }
            try database.execute("COMMIT")
        } catch {
            try? database.execute("ROLLBACK")
            throw error
        }
    }

    // MARK: Upgrades

    /// Version 2 counts the bytes each inode's chunk rows hold (`stored`), keeps the
    /// clean-shutdown mark (`state`), keeps chunks in a rowid table, and uses incremental
    /// vacuum: all done once, then the file is rebuilt (VACUUM).
    static func upgradeFromVersion1(_ database: SQLiteDatabase, progress: (String) -> Void) throws(SQLiteError) {
        progress("upgrading the cache database to schema version 2 (once)…")
        try database.execute("""
            BEGIN IMMEDIATE;
            ALTER TABLE inodes ADD COLUMN stored INTEGER NOT NULL DEFAULT 0;
            ALTER TABLE inodes ADD COLUMN data INTEGER;
            UPDATE inodes SET stored = (SELECT coalesce(sum(length(data)), 0) FROM chunks WHERE chunks.ino = inodes.ino)
                WHERE mode & \(S_IFMT) = \(S_IFREG);
            CREATE TABLE state(name TEXT PRIMARY KEY, value INTEGER NOT NULL) STRICT, WITHOUT ROWID;
            ALTER TABLE chunks RENAME TO chunks_v1;
            CREATE TABLE chunks(id INTEGER PRIMARY KEY, ino INTEGER NOT NULL, idx INTEGER NOT NULL, data BLOB NOT NULL) STRICT;
            CREATE UNIQUE INDEX chunks_by_position ON chunks(ino, idx);
            INSERT INTO chunks(ino, idx, data) SELECT ino, idx, data FROM chunks_v1 ORDER BY ino, idx;
            DROP TABLE chunks_v1;
            PRAGMA user_version=2;
            COMMIT;
            PRAGMA auto_vacuum=INCREMENTAL;
            VACUUM;
            """)
    }

    /// Version 3 adds the totals (counted once here).
    static func upgradeFromVersion2(_ database: SQLiteDatabase, progress: (String) -> Void) throws(SQLiteError) {
        progress("upgrading the cache database to schema version 3 (once)…")
        try database.execute("""
            BEGIN IMMEDIATE;
            \(totalsTable)
            INSERT INTO totals(id, files, bytes, linked_bytes) SELECT 1, * FROM (\(countedTotals));
            PRAGMA user_version=3;
            COMMIT;
            """)
    }

    /// Versions 3 and 4 kept every file's bytes in 64 KiB chunk rows (version 4 as pieces
    /// within chunks, at `start`; an empty row a preallocated chunk). Version 5 keeps a small
    /// file's bytes in one `contents` row and a large file's in a data file: each file moves
    /// in a transaction of its own (its data file written and synced first), with the log
    /// emptied every `upgradeSlice` bytes, so the log stays bounded and the database does not
    /// grow; a crash leaves files moved and files not, and the next open goes on (a data file
    /// half written by the crash is written again).
    static func moveDataOut(_ database: SQLiteDatabase, folder: DataFolder, progress: (String) -> Void) throws {
        progress("upgrading the cache database to schema version 5 (once; large files move to \(folder.path))…")
        let started = ContinuousClock.now
        var lastSaid = 0
        try database.execute("CREATE TABLE IF NOT EXISTS contents(ino INTEGER PRIMARY KEY, data BLOB NOT NULL) STRICT;")
        guard try database.scalarText("SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = 'chunks'") == "1" else {
            // Moved already (the version mark was all that was left to write).
            try database.execute("\(dataIndex) PRAGMA user_version=\(CacheStore.schemaVersion);")
            return
        }
        let hasStart = try database.scalarText("SELECT count(*) FROM pragma_table_info('chunks') WHERE name = 'start'") == "1"
        // A key no inode uses any more (data cut off by a truncation not yet deleted) goes.
        try database.execute("""
            DELETE FROM chunks WHERE ino < 0 AND ino NOT IN (SELECT data FROM inodes WHERE data IS NOT NULL);
            DELETE FROM chunks WHERE ino > 0 AND ino IN (SELECT ino FROM inodes WHERE data IS NOT NULL AND data < 0);
            """)
        var moved: Int64 = 0
        while let key = try database.integers("SELECT ino FROM chunks ORDER BY ino LIMIT 1").first {
            let row = try database.integerRow("SELECT ino, size FROM inodes WHERE \(key < 0 ? "data" : "ino") = \(key)")
            if row.count == 2 {
                moved += try moveFile(database, ino: row[0], size: row[1], key: key, folder: folder, hasStart: hasStart)
            } else {
                try database.execute("DELETE FROM chunks WHERE ino = \(key)")  // no inode: nothing to keep
            }
            if moved >= upgradeSlice {
                moved = 0
                try database.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            }
            let seconds = Int(started.secondsElapsed)
            if seconds > lastSaid {
                lastSaid = seconds
                progress("upgrading the cache database to schema version 5 (once; large files move to \(folder.path))… \(seconds) s")
            }
        }
        try database.execute("""
            BEGIN IMMEDIATE;
            UPDATE inodes SET data = NULL WHERE data < 0;
            DROP TABLE chunks;
            \(dataIndex)
            PRAGMA user_version=\(CacheStore.schemaVersion);
            COMMIT;
            PRAGMA wal_checkpoint(TRUNCATE);
            """)
    }

    /// Bytes moved between two emptyings of the log during the upgrade.
    static let upgradeSlice: Int64 = 32 << 20

    /// Moves one file's chunk rows (under `key`): into a `contents` row when they are one run
    /// from the start of at most `inlineLimit` bytes, else into a data file. Returns the
    /// bytes moved.
    static func moveFile(_ database: SQLiteDatabase, ino: Int64, size: Int64, key: Int64, folder: DataFolder,
                         hasStart: Bool) throws -> Int64 {
        let chunk = Int64(64 * 1024)
        let pieces = try Statement(database, "SELECT idx, \(hasStart ? "start" : "0"), data FROM chunks WHERE ino = ? ORDER BY idx, 2")
        pieces.bind(key)
        // One run from 0 that fits: inline.
        var run: [UInt8] = []
        var dense = true
        while try pieces.step() {
            let at = pieces.int(0) * chunk + pieces.int(1), bytes = pieces.blob(2)
            guard dense, !bytes.isEmpty, at == Int64(run.count), run.count + bytes.count <= CacheStore.inlineLimit else {
                dense = false
                break
            }
            run += bytes
        }
        pieces.done()
        if dense {
            let kept = Array(run.prefix(Int(clamping: size)))
            try database.execute("BEGIN IMMEDIATE")
            do {
                if !kept.isEmpty { try Statement(database, "INSERT OR REPLACE INTO contents(ino, data) VALUES(?, ?)").bind(ino, kept).run() }
                try database.execute("DELETE FROM chunks WHERE ino = \(key); UPDATE inodes SET data = NULL, stored = \(kept.count) WHERE ino = \(ino);")
                try database.execute("COMMIT")
            } catch {
                try? database.execute("ROLLBACK")
                throw error
            }
            return Int64(kept.count)
        }
        // A data file, written piece by piece (memory stays one piece), synced with its
        // folder before the row names it.
        let file = try folder.create(ino)
        var moved: Int64 = 0
        pieces.bind(key)
        while try pieces.step() {
            let at = pieces.int(0) * chunk + pieces.int(1), bytes = pieces.blob(2)
            if bytes.isEmpty {
                try Syscall.allocate(file.fd, mode: CacheStore.AllocationMode.keepSize, offset: at, length: chunk)
            } else {
                try Syscall.writeAll(file.fd, bytes, at: Int(at))
            }
            moved += Int64(max(bytes.count, 1))
        }
        pieces.done()
        try Syscall.truncate(file.fd, to: size)
        try Syscall.fdatasync(file.fd)
        try folder.sync()
        let stored = Int64(try Syscall.fstat(file.fd).st_blocks) * 512
        try database.execute("BEGIN IMMEDIATE")
        do {
            try database.execute("DELETE FROM chunks WHERE ino = \(key); UPDATE inodes SET data = \(ino), stored = \(stored) WHERE ino = \(ino);")
            try database.execute("COMMIT")
        } catch {
            try? database.execute("ROLLBACK")
            throw error
        }
        return moved
    }
}

// MARK: Checks

extension CacheStore {
    /// The full check of a cache database and its data folder, read only (also while it is
    /// mounted): what `mtmfs check` runs. Throws what is wrong; returns what is right but
    /// worth saying (data files that no row names, which the next mount removes), or nil.
    /// With `repair` (not while mounted) those data files are removed.
    @discardableResult
    public static func check(path: String, repair: Bool = false, progress: @escaping (String) -> Void) throws(CacheStoreError) -> String? {
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
            if version >= 3, let problem = try Schema.totalsProblem(database) {
                throw CacheStoreError.damaged("\(path): \(problem)")
            }
            guard version != 0 else { return nil }  // (made by init: the schema comes at the first mount)
            guard version == schemaVersion else { return "schema version \(version): upgraded at the next mount" }
            let folder = DataFolder(path: DataFolder.path(besides: path))
            let (missing, unnamed) = try Schema.dataFileProblems(database, folder: folder)
            if !missing.isEmpty {
                throw CacheStoreError.damaged("\(path): the data files of \(missing.count) file(s) are missing from \(folder.path) (inodes \(missing.prefix(5).map(String.init).joined(separator: ", ")))")
            }
            guard !unnamed.isEmpty else { return nil }
            if repair {
                for key in unnamed { folder.remove(key) }
                return "removed \(unnamed.count) data file(s) that no file names from \(folder.path)"
            }
            return "\(unnamed.count) data file(s) in \(folder.path) are named by no file (normal while mounted; the next mount removes them, or mtmfs check --repair)"
        } catch let error as CacheStoreError {
            throw error
        } catch {
            throw .damaged("\(path): \(error)")
        }
    }

    /// `PRAGMA integrity_check` and the totals, after an unclean shutdown.
    func fullCheck(progress: @escaping (String) -> Void, reason: String) throws {
        try Self.integrityCheck(database, path: path, reason: reason, progress: progress)
        // Triggers keep the totals in every transaction; a count that differs means the file
        // was changed by hand: the totals are counted again (the data itself is intact).
        if let problem = try Schema.totalsProblem(database) {
            Log.error("cache: \(problem); counted again")
            try database.execute("DELETE FROM totals; INSERT INTO totals(id, files, bytes, linked_bytes) SELECT 1, * FROM (\(Schema.countedTotals));")
        }
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
}
