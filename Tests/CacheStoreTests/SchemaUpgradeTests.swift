@testable import CacheStore
import Foundation
import Posix
import Testing
#if canImport(Glibc)
import Glibc
#endif

/// Stores of schema versions 3 and 4 (every byte in 64 KiB chunk rows) open as version 5:
/// small files' bytes into `contents`, large and sparse ones into data files, resumably;
/// a version 4 daemon's fsync journal is written back first.
@Suite struct SchemaUpgradeTests {
    /// A database of schema version 4 (or 3: chunks without `start`), made by hand as those
    /// versions made them, in a directory of its own.
    final class OldStore {
        let directory: String
        var path: String { directory + "/cache.sqlite" }
        let database: SQLiteDatabase

        init(version: Int) throws {
            directory = FileManager.default.temporaryDirectory.appendingPathComponent("mtmfs-upgrade-\(UUID().uuidString)").path
            try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
            try CacheDatabase.createEmpty(at: directory + "/cache.sqlite")
            database = try SQLiteDatabase(path: directory + "/cache.sqlite")
            let chunks = version >= 4
                ? "CREATE TABLE chunks(id INTEGER PRIMARY KEY, ino INTEGER NOT NULL, idx INTEGER NOT NULL, start INTEGER NOT NULL DEFAULT 0, data BLOB NOT NULL) STRICT; CREATE UNIQUE INDEX chunks_by_position ON chunks(ino, idx, start);"
                : "CREATE TABLE chunks(id INTEGER PRIMARY KEY, ino INTEGER NOT NULL, idx INTEGER NOT NULL, data BLOB NOT NULL) STRICT; CREATE UNIQUE INDEX chunks_by_position ON chunks(ino, idx);"
            try database.execute("""
                CREATE TABLE inodes(ino INTEGER PRIMARY KEY AUTOINCREMENT, mode INTEGER NOT NULL, uid INTEGER NOT NULL, gid INTEGER NOT NULL,
                    size INTEGER NOT NULL DEFAULT 0, links INTEGER NOT NULL, atime INTEGER NOT NULL, mtime INTEGER NOT NULL,
                    ctime INTEGER NOT NULL, rdev INTEGER NOT NULL DEFAULT 0, target TEXT, used INTEGER NOT NULL DEFAULT 0,
                    expires INTEGER, stored INTEGER NOT NULL DEFAULT 0, data INTEGER) STRICT;
                CREATE TABLE entries(parent INTEGER NOT NULL, name TEXT NOT NULL, ino INTEGER NOT NULL, PRIMARY KEY(parent, name)) STRICT, WITHOUT ROWID;
                \(chunks)
                CREATE TABLE xattrs(ino INTEGER NOT NULL, name TEXT NOT NULL, value BLOB NOT NULL, PRIMARY KEY(ino, name)) STRICT, WITHOUT ROWID;
                CREATE TABLE state(name TEXT PRIMARY KEY, value INTEGER NOT NULL) STRICT, WITHOUT ROWID;
                INSERT INTO inodes(ino, mode, uid, gid, links, atime, mtime, ctime) VALUES(1, \(S_IFDIR | 0o755), 0, 0, 2, 0, 0, 0);
                \(Schema.totalsTable)
                INSERT INTO totals(id, files, bytes, linked_bytes) VALUES(1, 0, 0, 0);
                INSERT INTO state(name, value) VALUES('clean', 1);
                PRAGMA user_version=\(version);
                """)
        }

        deinit { try? FileManager.default.removeItem(atPath: directory) }

        /// A file named `name` of `size` bytes, its chunk rows under `key` (its number by default).
        @discardableResult
        func file(_ name: String, size: Int64, key: Int64? = nil, pieces: [(idx: Int64, start: Int64, bytes: [UInt8])]) throws -> Int64 {
            try database.execute("INSERT INTO inodes(mode, uid, gid, size, links, atime, mtime, ctime, data) VALUES(\(S_IFREG | 0o644), 0, 0, \(size), 1, 0, 0, 0, \(key.map(String.init) ?? "NULL"))")
            let ino = try database.integers("SELECT max(ino) FROM inodes").first!
            try database.execute("INSERT INTO entries(parent, name, ino) VALUES(1, '\(name)', \(ino))")
            for piece in pieces { try addChunk(key ?? ino, piece.idx, start: piece.start, piece.bytes) }
            let stored = pieces.reduce(0) { $0 + ($1.bytes.isEmpty ? 65536 : $1.bytes.count) }
            try database.execute("UPDATE inodes SET stored = \(stored) WHERE ino = \(ino)")
            return ino
        }

        func addChunk(_ key: Int64, _ idx: Int64, start: Int64, _ bytes: [UInt8]) throws {
            let hex = bytes.map { String(format: "%02x", $0) }.joined()
            let hasStart = try database.scalarText("SELECT count(*) FROM pragma_table_info('chunks') WHERE name = 'start'") == "1"
            try database.execute(hasStart
                ? "INSERT INTO chunks(ino, idx, start, data) VALUES(\(key), \(idx), \(start), x'\(hex)')"
                : "INSERT INTO chunks(ino, idx, data) VALUES(\(key), \(idx), x'\(hex)')")
        }

        func open() throws -> (CacheStore, [String]) {
            var said: [String] = []
            let store = try CacheStore(path: path, owner: (0, 0)) { said.append($0) }
            return (store, said)
        }

        var dataFiles: [String] { ((try? FileManager.default.contentsOfDirectory(atPath: directory + "/cache.data")) ?? []).sorted() }
    }

    static func bytes(_ count: Int, _ seed: Int) -> [UInt8] { (0..<count).map { UInt8(truncatingIfNeeded: $0 &* 31 &+ seed) } }

    @Test func versionFourMovesLargeAndSparseFilesOutAndKeepsSmallOnesInside() throws {
        let old = try OldStore(version: 4)
        let small = try old.file("small", size: 5, pieces: [(0, 0, Array("hello".utf8))])
        let room = try old.file("room", size: 60, pieces: [(0, 0, Self.bytes(100, 1))])  // zeros of room past the end
        let sparse = try old.file("sparse", size: 200_704, pieces: [(0, 10, Self.bytes(100, 2)), (3, 0, Self.bytes(4096, 3))])
        let preallocated = try old.file("preallocated", size: 131_072, pieces: [(0, 0, Self.bytes(10, 4)), (1, 0, [])])
        let cut = try old.file("cut", size: 1000, key: -1, pieces: [(0, 0, Self.bytes(1000, 5))])
        try old.addChunk(-2, 0, start: 0, Self.bytes(64, 6))  // cut off, never deleted: goes
        let big = try old.file("big", size: 3 * 65536, pieces: [(0, 0, Self.bytes(65536, 7)), (1, 0, Self.bytes(65536, 8)), (2, 0, Self.bytes(65536, 9))])
        let (store, said) = try old.open()
        #expect(said.contains { $0.contains("schema version 5") }, "\(said)")
        #expect(try old.database.scalarText("PRAGMA user_version") == "5")
        #expect(try old.database.scalarText("SELECT count(*) FROM sqlite_master WHERE name = 'chunks'") == "0")
        #expect(old.dataFiles == ["\(sparse)", "\(preallocated)", "\(big)"].sorted())
        #expect(try read(store, small, 0, 10) == Array("hello".utf8))
        #expect(try read(store, room, 0, 100) == Array(Self.bytes(100, 1)[0..<60]))
        #expect(try read(store, sparse, 0, 110) == [UInt8](repeating: 0, count: 10) + Self.bytes(100, 2))
        #expect(try read(store, sparse, 3 * 65536, 4096) == Self.bytes(4096, 3))
        #expect(try store.inode(sparse).size == 200_704)
        #expect(try read(store, preallocated, 0, 12) == Self.bytes(10, 4) + [0, 0])
        #expect(try store.inode(preallocated).storedBytes >= 65536, "the preallocated chunk stays allocated")
        #expect(try read(store, cut, 0, 1000) == Self.bytes(1000, 5))
        #expect(try read(store, big, 65536, 65536) == Self.bytes(65536, 8))
        #expect(try store.inode(small).storedBytes == 5 && store.inode(room).storedBytes == 60)
        try store.close()
        try CacheStore.check(path: old.path) { _ in }
    }

    /// Version 3 rows (whole chunks, no `start`), and an upgrade a crash stopped half way:
    /// one file moved, another's data file half written. The next open goes on.
    @Test func aVersionThreeUpgradeStoppedHalfWayGoesOn() throws {
        let old = try OldStore(version: 3)
        let moved = try old.file("moved", size: 10, pieces: [(0, 0, Self.bytes(10, 1))])
        let large = try old.file("large", size: 65636, pieces: [(0, 0, Self.bytes(65536, 2)), (1, 0, Self.bytes(100, 3))])
        let small = try old.file("small", size: 20, pieces: [(0, 0, Self.bytes(20, 4))])
        // What a crash leaves: `moved` in contents already, a partial data file for `large`.
        try old.database.execute("CREATE TABLE contents(ino INTEGER PRIMARY KEY, data BLOB NOT NULL) STRICT;")
        try old.database.execute("INSERT INTO contents(ino, data) SELECT ino, data FROM chunks WHERE ino = \(moved); DELETE FROM chunks WHERE ino = \(moved);")
        try FileManager.default.createDirectory(atPath: old.directory + "/cache.data", withIntermediateDirectories: false)
        #expect(FileManager.default.createFile(atPath: old.directory + "/cache.data/\(large)", contents: Data(repeating: 0xEE, count: 70_000)))
        let (store, _) = try old.open()
        #expect(try read(store, moved, 0, 20) == Self.bytes(10, 1))
        #expect(try read(store, large, 0, 65636) == Self.bytes(65536, 2) + Self.bytes(100, 3))
        #expect(try store.inode(large).size == 65636)
        #expect(try read(store, small, 0, 20) == Self.bytes(20, 4))
        #expect(old.dataFiles == ["\(large)"])
        try store.close()
        try CacheStore.check(path: old.path) { _ in }
    }

    /// The fsync journal of a version 4 daemon that stopped: the records after the mark are
    /// written into their files (older ones, and one that does not follow, are not), then
    /// the journal and its state go.
    @Test func aVersionFourFsyncJournalIsWrittenBackAtTheUpgrade() throws {
        let old = try OldStore(version: 4)
        let ino = try old.file("db", size: 5, pieces: [(0, 0, Array("hello".utf8))])
        try old.database.execute("INSERT INTO state(name, value) VALUES('synced', 5), ('journal_id', 12345), ('clean', 0) ON CONFLICT(name) DO UPDATE SET value = excluded.value")
        var journal: [UInt8] = []
        for (sequence, offset, bytes, size) in [(5, 0, Array("OLD".utf8), 5), (6, 3, Array("XY".utf8), 5), (7, 5, Array("Z".utf8), 6), (9, 0, Array("!".utf8), 6)] {
            Self.encode(sequence: Int64(sequence), ino: ino, offset: Int64(offset), bytes: bytes, size: Int64(size), seed: 12345, into: &journal)
        }
        // Record 5 is before the mark: the journal's first that counts must be 6 — so the
        // file starts with 6 and 7, then a record that does not follow.
        journal.removeFirst(56 + 3)
        #expect(FileManager.default.createFile(atPath: old.path + "-fsync", contents: Data(journal)))
        let (store, said) = try old.open()
        #expect(try read(store, ino, 0, 10) == Array("helXYZ".utf8))
        #expect(said.contains { $0.contains("stored 2 fsynced writes") }, "\(said)")
        #expect(!FileManager.default.fileExists(atPath: old.path + "-fsync"))
        #expect(try old.database.scalarText("SELECT count(*) FROM state WHERE name IN ('synced', 'journal_id')") == "0")
        try store.close()
    }

    static func encode(sequence: Int64, ino: Int64, offset: Int64, bytes: [UInt8], size: Int64, seed: UInt64, into records: inout [UInt8]) {
        var header = [UInt8](repeating: 0, count: 56)
        header.withUnsafeMutableBytes { h in
            h.storeBytes(of: LegacyFsyncJournal.magic.littleEndian, toByteOffset: 0, as: UInt32.self)
            h.storeBytes(of: UInt32(bytes.count).littleEndian, toByteOffset: 4, as: UInt32.self)
            for (index, value) in [sequence, ino, offset, size, Int64(1_000_000_000)].enumerated() {
                h.storeBytes(of: value.littleEndian, toByteOffset: 8 + 8 * index, as: Int64.self)
            }
        }
        let sum = header.withUnsafeBytes { h in
            bytes.withUnsafeBytes { LegacyFsyncJournal.checksum(UnsafeRawBufferPointer(rebasing: h[0..<48]), $0, seed: seed) }
        }
        header.withUnsafeMutableBytes { $0.storeBytes(of: sum.littleEndian, toByteOffset: 48, as: UInt64.self) }
        records += header + bytes
    }
}
