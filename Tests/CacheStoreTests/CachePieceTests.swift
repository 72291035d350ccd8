@testable import CacheStore
import Foundation
import Posix
import TestSupport
import Testing
#if canImport(Glibc)
import Glibc
#endif

/// Schema version 4: a chunk is stored as the pieces written, so a write stores what it
/// covers — no zero-filled chunk for data never written — and every operation on file data
/// keeps its results over pieces.
@Suite struct CachePieceTests {
    /// 1,000 scattered 4 KiB writes into a 32 MiB sparse file store 4 KiB each.
    @Test func scatteredWritesStoreWhatTheyCover() throws {
        let f = try StoreFixture()
        let ino = try f.file("sparse")
        _ = try f.store.setAttributes(ino, CacheAttributeChanges(size: 32 << 20))
        var generator = SplitMix(seed: 7)
        var blocks = Set<Int64>()
        for _ in 0..<1000 {
            let block = Int64.random(in: 0..<(31 * 256), using: &generator)  // (not in the last chunk: no room there)
            blocks.insert(block)
            try f.write(ino, [UInt8](repeating: UInt8(truncatingIfNeeded: block | 1), count: 4096), at: block * 4096)
        }
        try f.store.synchronize()
        #expect(try f.store.inode(ino).storedBytes == Int64(blocks.count) * 4096, "no zeros stored around the writes")
        #expect(try f.query("SELECT sum(length(data)) FROM chunks") == String(blocks.count * 4096))
        for block in blocks.sorted().prefix(50) {
            #expect(try f.read(ino, block * 4096, 4096) == [UInt8](repeating: UInt8(truncatingIfNeeded: block | 1), count: 4096))
        }
        // Holes between the pieces: SEEK_HOLE finds the end of a run of written blocks,
        // SEEK_DATA the next one, at 4 KiB, not 64 KiB.
        let sorted = blocks.sorted()
        let first = sorted[0]
        var runEnd = first + 1
        while blocks.contains(runEnd) { runEnd += 1 }
        #expect(try f.store.seek(ino, offset: first * 4096, data: false) == runEnd * 4096)
        let next = sorted.first { $0 > runEnd }!
        #expect(try f.store.seek(ino, offset: runEnd * 4096, data: true) == next * 4096)
        #expect(try f.read(ino, runEnd * 4096, 4096) == [UInt8](repeating: 0, count: 4096))
        try f.store.close()
        try CacheStore.check(path: f.path) { _ in }
    }

    /// Random writes, truncations, hole punches, preallocations, zeroed ranges and copies,
    /// against a model in memory: every read equals the model, SEEK_DATA/HOLE never skip
    /// data, and the pieces stay disjoint, inside their chunks and counted in `stored`.
    @Test(arguments: [1, 2, 3, 4])
    func randomOperationsKeepTheirResults(seed: UInt64) throws {
        let f = try StoreFixture()
        let a = try f.file("a"), b = try f.file("b")
        var model: [Int64: [UInt8]] = [a: [], b: []]
        var generator = SplitMix(seed: seed)
        let span = 6 * CacheStore.chunkSize
        func random(_ range: Range<Int>) -> Int { Int.random(in: range, using: &generator) }
        func place(_ bytes: [UInt8], at offset: Int, in ino: Int64) {
            if model[ino]!.count < offset + bytes.count { model[ino]! += [UInt8](repeating: 0, count: offset + bytes.count - model[ino]!.count) }
            model[ino]!.replaceSubrange(offset..<(offset + bytes.count), with: bytes)
        }
        for step in 0..<400 {
            let ino = random(0..<4) == 0 ? b : a
            let sizes = [1, 100, 4096, 4120, 5000, 65536, 70000]
            switch random(0..<20) {
            case 0..<11:
                let count = sizes[random(0..<sizes.count)]
                let offset = random(0..<span)
                let bytes = (0..<count).map { _ in UInt8(random(1..<256)) }
                try f.write(ino, bytes, at: Int64(offset))
                place(bytes, at: offset, in: ino)
            case 11..<13:
                let size = random(0..<span)
                _ = try f.store.setAttributes(ino, CacheAttributeChanges(size: Int64(size)))
                if size < model[ino]!.count { model[ino]!.removeSubrange(size...) } else { place([], at: size, in: ino) }
            case 13:
                let offset = random(0..<span), length = random(1..<(2 * CacheStore.chunkSize))
                try f.store.allocate(ino, mode: CacheStore.AllocationMode.punchHole | CacheStore.AllocationMode.keepSize,
                                     offset: Int64(offset), length: Int64(length))
                let end = min(offset + length, model[ino]!.count)
                if offset < end { model[ino]!.replaceSubrange(offset..<end, with: [UInt8](repeating: 0, count: end - offset)) }
            case 14:
                let offset = random(0..<span), length = random(1..<(2 * CacheStore.chunkSize))
                let keep = random(0..<2) == 0
                try f.store.allocate(ino, mode: keep ? CacheStore.AllocationMode.keepSize : 0, offset: Int64(offset), length: Int64(length))
                if !keep && model[ino]!.count < offset + length { place([], at: offset + length, in: ino) }
            case 15:
                let offset = random(0..<span), length = random(1..<(2 * CacheStore.chunkSize))
                try f.store.allocate(ino, mode: CacheStore.AllocationMode.zeroRange, offset: Int64(offset), length: Int64(length))
                place([UInt8](repeating: 0, count: length), at: offset, in: ino)
            case 16..<18:
                let (source, destination) = ino == a ? (b, a) : (a, b)
                guard !model[source]!.isEmpty else { continue }
                // Whole chunks, or any offsets.
                let aligned = random(0..<2) == 0
                var from = random(0..<model[source]!.count), to = random(0..<span)
                if aligned { from -= from % CacheStore.chunkSize; to -= to % CacheStore.chunkSize }
                let length = aligned ? CacheStore.chunkSize * random(1..<3) : random(1..<100_000)
                let copied = try f.store.copyRange(from: source, offset: Int64(from), to: destination, offset: Int64(to), length: length)
                #expect(copied == min(length, model[source]!.count - from))
                place(Array(model[source]![from..<(from + copied)]), at: to, in: destination)
            case 18:
                try f.store.synchronize()
            default:
                // SEEK_DATA and SEEK_HOLE never skip data.
                let size = model[ino]!.count
                guard size > 0 else { continue }
                let offset = random(0..<size)
                // (ENXIO: no data after it.)
                var data = Int64(size)
                do {
                    data = try f.store.seek(ino, offset: Int64(offset), data: true)
                } catch {
                    #expect(error == .noSuchDeviceOrAddress)
                }
                #expect(model[ino]![offset..<Int(data)].allSatisfy { $0 == 0 }, "seed \(seed) step \(step): data skipped")
                let hole = try f.store.seek(ino, offset: Int64(offset), data: false)
                #expect(hole >= Int64(offset) && hole <= Int64(size))
            }
            if step % 25 == 0 || step == 399 {
                for ino in [a, b] {
                    #expect(try f.store.inode(ino).size == Int64(model[ino]!.count), "seed \(seed) step \(step)")
                    #expect(try f.read(ino, 0, span * 2) == model[ino]!, "seed \(seed) step \(step)")
                }
            }
        }
        try f.store.close()
        let database = try SQLiteDatabase(path: f.path, readOnly: true)
        #expect(try CacheStore.piecesProblem(database) == nil)
        try CacheStore.check(path: f.path) { _ in }
        let reopened = try CacheStore(path: f.path, owner: (0, 0))
        for ino in [a, b] {
            var bytes: [UInt8] = []
            try reopened.read(ino, offset: 0, size: span * 2) { bytes = Array($0) }
            #expect(bytes == model[ino]!, "seed \(seed), after a reopen")
        }
        try reopened.close()
    }

    /// A store of schema version 3 (one row per chunk, no `start`) is upgraded at open: the
    /// same bytes, holes and preallocated chunks, row ids kept, checked.
    @Test func versionThreeStoresAreUpgraded() throws {
        let f = try StoreFixture()
        let ino = try f.file("f")
        let bytes = (0..<200_000).map { UInt8(truncatingIfNeeded: $0 &* 31 &+ 3) }
        try f.write(ino, bytes, at: 0)
        try f.store.allocate(ino, mode: CacheStore.AllocationMode.keepSize, offset: 10 * 65536, length: 65536)
        _ = try f.store.setAttributes(ino, CacheAttributeChanges(size: 20 * 65536))
        try f.store.close()
        let ids = try f.query("SELECT group_concat(id || ':' || idx || ':' || length(data), ' ') FROM (SELECT * FROM chunks ORDER BY id)")
        let database = try SQLiteDatabase(path: f.path)
        try database.execute("""
            CREATE TABLE v3(id INTEGER PRIMARY KEY, ino INTEGER NOT NULL, idx INTEGER NOT NULL, data BLOB NOT NULL) STRICT;
            INSERT INTO v3 SELECT id, ino, idx, data FROM chunks; DROP TABLE chunks; ALTER TABLE v3 RENAME TO chunks;
            CREATE UNIQUE INDEX chunks_by_position ON chunks(ino, idx); PRAGMA user_version=3;
            """)
        var said: [String] = []
        let upgraded = try CacheStore(path: f.path, owner: (0, 0)) { said.append($0) }
        #expect(said.contains { $0.contains("schema version 4") }, "\(said)")
        var read: [UInt8] = []
        try upgraded.read(ino, offset: 0, size: 300_000) { read = Array($0) }
        #expect(read == bytes + [UInt8](repeating: 0, count: 100_000))
        #expect(try upgraded.seek(ino, offset: 200_000, data: true) == 10 * 65536, "the preallocated chunk is data")
        #expect(try upgraded.inode(ino).storedBytes == 200_000 + 65536)
        // New writes store pieces in the upgraded table.
        let nine = [UInt8](repeating: 9, count: 10)
        #expect(try nine.withUnsafeBytes { buffer in try upgraded.write(ino, offset: 15 * 65536 + 100, data: buffer, append: false) } == 10)
        try upgraded.close()
        #expect(try f.query("PRAGMA user_version") == "4")
        #expect(try f.query("SELECT group_concat(id || ':' || idx || ':' || length(data), ' ') FROM (SELECT * FROM chunks WHERE start = 0 ORDER BY id)") == ids)
        #expect(try f.query("SELECT idx || ':' || start || ':' || length(data) FROM chunks WHERE start > 0") == "15:100:10")
        try CacheStore.check(path: f.path) { _ in }
    }

    /// The upgrade moves the rows in slices, each its own transaction: a store of more
    /// rows than a slice is upgraded whole, and one left half moved by a crash (both tables
    /// there, still version 3) is finished at the next open.
    @Test(arguments: [false, true])
    func theUpgradeMovesSlicesAndGoesOnAfterACrash(interrupted: Bool) throws {
        let f = try StoreFixture()
        let count = CacheStore.upgradeSlice + 100
        var inodes: [Int64] = []
        for index in 0..<count {
            let ino = try f.file("f\(index)")
            try f.write(ino, Array("file \(index)".utf8), at: 0)
            inodes.append(ino)
        }
        try f.store.close()
        let database = try SQLiteDatabase(path: f.path)
        try database.execute("""
            CREATE TABLE v3(id INTEGER PRIMARY KEY, ino INTEGER NOT NULL, idx INTEGER NOT NULL, data BLOB NOT NULL) STRICT;
            INSERT INTO v3 SELECT id, ino, idx, data FROM chunks; DROP TABLE chunks; ALTER TABLE v3 RENAME TO chunks;
            CREATE UNIQUE INDEX chunks_by_position ON chunks(ino, idx); PRAGMA user_version=3;
            """)
        if interrupted {
            // What a crash after the first slices leaves.
            try database.execute("""
                ALTER TABLE chunks RENAME TO chunks_v3; DROP INDEX chunks_by_position;
                \(CacheStore.chunksTable)
                INSERT INTO chunks(id, ino, idx, start, data) SELECT id, ino, idx, 0, data FROM chunks_v3 ORDER BY id LIMIT 300;
                DELETE FROM chunks_v3 WHERE id <= (SELECT max(id) FROM chunks);
                """)
        }
        let upgraded = try CacheStore(path: f.path, owner: (0, 0)) { _ in }
        for (index, ino) in inodes.enumerated() {
            var bytes: [UInt8] = []
            try upgraded.read(ino, offset: 0, size: 100) { bytes = Array($0) }
            #expect(bytes == Array("file \(index)".utf8))
        }
        try upgraded.close()
        #expect(try f.query("PRAGMA user_version") == "4")
        #expect(try f.query("SELECT count(*) FROM chunks") == String(count))
        #expect(try f.query("SELECT count(*) FROM sqlite_master WHERE name = 'chunks_v3'") == "0")
        try CacheStore.check(path: f.path) { _ in }
    }

    /// `mtmfs check` knows the pieces: overlapping ones, one outside its chunk, and a
    /// file whose `stored` is not what its pieces hold are damage.
    @Test func checkFindsPiecesThatCannotBe() throws {
        for damage in [
            "INSERT INTO chunks(ino, idx, start, data) SELECT ino, 0, 50, x'00' FROM inodes WHERE ino > 1",  // overlaps 0..<100
            "UPDATE chunks SET start = 65500",  // past the chunk's end
            "UPDATE inodes SET stored = 7 WHERE ino > 1; UPDATE totals SET bytes = 7, linked_bytes = 7",
        ] {
            let f = try StoreFixture()
            let ino = try f.file("f")
            try f.write(ino, [UInt8](repeating: 1, count: 100), at: 0)
            try f.store.close()
            try CacheStore.check(path: f.path) { _ in }
            try SQLiteDatabase(path: f.path).execute(damage)
            #expect(throws: CacheStoreError.self, "\(damage)") { try CacheStore.check(path: f.path) { _ in } }
        }
    }
}
