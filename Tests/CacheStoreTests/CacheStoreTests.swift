@testable import CacheStore
import Foundation
import Posix
import Testing
#if canImport(Glibc)
import Glibc
#endif

/// The cache store without a mount: the errno rules, group commit, buffered writes, the
/// bounded log and deletion in slices, each against a real SQLite database in /tmp.
final class StoreFixture {
    let directory: String
    let store: CacheStore
    /// Who holds inodes here, as a kernel would: what the store hands out with `reference`.
    let held = Holders()
    var path: String { directory + "/cache.sqlite" }

    init() throws {
        directory = FileManager.default.temporaryDirectory.appendingPathComponent("mtmfs-store-\(UUID().uuidString)").path
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        try CacheDatabase.createEmpty(at: directory + "/cache.sqlite")
        store = try CacheStore(path: directory + "/cache.sqlite", owner: (0, 0), holders: held)
    }

    /// Counts references as the mounted tree's node table does; `drop` is a kernel's FORGET.
    final class Holders: InodeHolders, @unchecked Sendable {
        private let counts = Locked<[Int64: Int]>([:])
        func hold(_ ino: Int64) { counts.withLock { $0[ino, default: 0] += 1 } }
        func isHeld(_ ino: Int64) -> Bool { counts.withLock { $0[ino] != nil } }
        func drop(_ ino: Int64, from store: CacheStore) {
            let last = counts.withLock { counts -> Bool in
                counts[ino]! -= 1
                if counts[ino] == 0 { counts[ino] = nil; return true }
                return false
            }
            if last { store.unheld(ino) }
        }
    }

    deinit { try? FileManager.default.removeItem(atPath: directory) }

    @discardableResult
    func file(_ name: String, in parent: Int64 = CacheStore.rootInode) throws -> Int64 {
        try store.create(parent: parent, name: name, mode: S_IFREG | 0o644, uid: 0, gid: 0).ino
    }

    func write(_ ino: Int64, _ bytes: [UInt8], at offset: Int64) throws {
        _ = try bytes.withUnsafeBytes { (buffer) throws(Errno) in try store.write(ino, offset: offset, data: buffer, append: false) }
    }

    func read(_ ino: Int64, _ offset: Int64, _ count: Int) throws -> [UInt8] {
        var bytes: [UInt8] = []
        try store.read(ino, offset: offset, size: count) { bytes = Array($0) }
        return bytes
    }

    /// What another connection (the `sqlite3` shell, say) sees.
    func query(_ sql: String) throws -> String? {
        try SQLiteDatabase(path: path, readOnly: true).scalarText(sql)
    }
}

func errno(_ body: () throws -> Void) -> Errno? {
    do { try body(); return nil } catch let error as Errno { return error } catch { return nil }
}

@Suite struct CacheStoreTests {
    @Test func namesFollowExt4sErrnos() throws {
        let f = try StoreFixture()
        let s = f.store, root = CacheStore.rootInode
        let dir = try s.create(parent: root, name: "d", mode: S_IFDIR | 0o755, uid: 0, gid: 0).ino
        try f.file("x", in: dir)
        #expect(errno { _ = try s.create(parent: root, name: "d", mode: S_IFDIR | 0o755, uid: 0, gid: 0) } == .fileExists)
        #expect(errno { try s.removeDirectory(parent: root, name: "d") } == .directoryNotEmpty)
        #expect(errno { try s.unlink(parent: root, name: "d") } == .isDirectory)
        #expect(errno { try s.rename(parent: root, name: "d", newParent: dir, newName: "inside", flags: 0) } == .invalidArgument)
        #expect(errno { try s.rename(parent: root, name: "nothing", newParent: root, newName: "y", flags: 0) } == .noSuchFileOrDirectory)
        #expect(errno { try s.rename(parent: dir, name: "x", newParent: root, newName: "d", flags: 0) } == .isDirectory)
        #expect(errno { try s.rename(parent: dir, name: "x", newParent: root, newName: "d", flags: 4) } == .invalidArgument)
        #expect(errno { _ = try s.create(parent: root, name: String(repeating: "n", count: 256), mode: S_IFREG, uid: 0, gid: 0) } == .nameTooLong)
        #expect(errno { _ = try s.lookup(parent: root, name: "missing") } == .noSuchFileOrDirectory)
    }

    /// A change that fails inside an open group is undone alone: the others of the group
    /// stay and are committed.
    @Test func aFailingChangeRollsBackAloneInItsGroup() throws {
        let f = try StoreFixture()
        try f.file("kept")
        #expect(errno { try f.store.rename(parent: CacheStore.rootInode, name: "missing", newParent: CacheStore.rootInode, newName: "x", flags: 0) } != nil)
        try f.file("kept too")
        try f.store.synchronize()
        #expect(try f.query("SELECT group_concat(name, ',') FROM (SELECT name FROM entries ORDER BY name)") == "kept,kept too")
        // The first change of a group (no savepoint: it is the transaction) fails: undone, no
        // transaction left open, and the next change opens a group of its own.
        #expect(errno { try f.store.rename(parent: CacheStore.rootInode, name: "missing", newParent: CacheStore.rootInode, newName: "x", flags: 0) } != nil)
        #expect(f.store.lock.withLock { !f.store.database.isInTransaction && f.store.batchStart == nil })
        try f.file("after")
        try f.store.synchronize()
        #expect(try f.query("SELECT count(*) FROM entries") == "3")
    }

    /// Small writes are buffered: read back at once, stored whole, and in the database after
    /// an fsync; a failed write (a directory) changes nothing.
    @Test func bufferedWritesReadBackAndReachTheDatabase() throws {
        let f = try StoreFixture()
        let ino = try f.file("f")
        try f.write(ino, Array(repeating: 7, count: 100), at: 10)
        try f.write(ino, Array(repeating: 9, count: 5), at: 200_000)
        #expect(try f.store.inode(ino).size == 200_005)
        #expect(try f.query("SELECT count(*) FROM chunks") == "0", "nothing stored before it is needed")
        #expect(try f.read(ino, 0, 120) == Array(repeating: 0, count: 10) + Array(repeating: 7, count: 100) + Array(repeating: 0, count: 10))
        #expect(try f.read(ino, 200_000, 10) == Array(repeating: 9, count: 5))
        try f.write(ino, Array(repeating: 1, count: 4096), at: 65536 * 5)
        try f.store.synchronize()
        // Size 5 × 64 KiB + 4 KiB; stored: what was written — 100 bytes at 10 in chunk 0,
        // 5 at 3,392 in chunk 3, 4 KiB in chunk 5; no zeros before them.
        #expect(try f.query("SELECT size || ' ' || stored FROM inodes WHERE ino = \(ino)") == "331776 4201")
        #expect(try f.query("SELECT group_concat(idx || ':' || start || '+' || length(data), ' ') FROM (SELECT * FROM chunks WHERE ino = \(ino) ORDER BY idx)")
                == "0:10+100 3:3392+5 5:0+4096")
        // A later small write into a stored chunk goes in place.
        try f.write(ino, [42], at: 11)
        try f.store.synchronize()
        #expect(try f.read(ino, 10, 3) == [7, 42, 7])
        #expect(errno { try f.write(CacheStore.rootInode, [1], at: 0) } == .isDirectory)
    }

    /// A write by a caller without CAP_FSETID drops the set-ID bits in the store, knowing the
    /// mode from the file's buffers: S_ISUID always, S_ISGID only with group execute; a
    /// chmod between writes is seen; a file without the bits changes nothing.
    @Test func aWriteWithoutFsetidDropsTheSetIDBitsWithTheModeAtHand() throws {
        let f = try StoreFixture()
        let ino = try f.file("s")
        func weakWrite(_ byte: UInt8) throws -> Bool {
            try [byte].withUnsafeBytes { (buffer) throws(Errno) in
                try f.store.write(ino, offset: 0, data: buffer, append: true, droppingSetID: true).modeChanged
            }
        }
        func mode() throws -> mode_t { try f.store.inode(ino).mode & 0o7777 }
        #expect(try weakWrite(1) == false && mode() == 0o644)
        _ = try f.store.setAttributes(ino, CacheAttributeChanges(mode: 0o6755))
        try f.write(ino, [2], at: 1)  // buffered by a writer with CAP_FSETID: the bits stay
        #expect(try mode() == 0o6755)
        #expect(try weakWrite(3) == true && mode() == 0o755)
        #expect(try weakWrite(4) == false && mode() == 0o755)
        _ = try f.store.setAttributes(ino, CacheAttributeChanges(mode: 0o2644))  // S_ISGID without group execute stays
        #expect(try weakWrite(5) == false && mode() == 0o2644)
        _ = try f.store.setAttributes(ino, CacheAttributeChanges(mode: 0o4711))
        #expect(try weakWrite(6) == true && mode() == 0o711)
        try f.store.synchronize()
        #expect(try f.query("SELECT mode & 4095 FROM inodes WHERE ino = \(ino)") == "\(0o711)")
        #expect(try f.read(ino, 0, 10) == [1, 2, 3, 4, 5, 6])
    }

    /// A writer that never stops: the log stays under its bound when the committing thread
    /// does its work between writes, as the daemon's thread does.
    @Test func theLogStaysBounded() throws {
        let (largest, _, _) = try largestLog(streaming: 160) { store in
            store.commitWhenDue(waitingAtMost: 0)
            store.checkpointIfDue()
        }
        #expect(largest > 0 && largest <= CacheStore.logBound, "largest log \(largest)")
    }

    /// The largest write-ahead log seen while `megabytes` MiB of 0x33 are written to one
    /// file, a MiB a write, `between` run after each write; the store and the file.
    func largestLog(streaming megabytes: Int,
                    between: (CacheStore) -> Void = { _ in }) throws -> (largest: Int64, fixture: StoreFixture, ino: Int64) {
        let f = try StoreFixture()
        let ino = try f.file("stream")
        let megabyte = [UInt8](repeating: 0x33, count: 1 << 20)
        var largest: Int64 = 0
        for index in 0..<megabytes {
            try f.write(ino, megabyte, at: Int64(index) << 20)
            between(f.store)
            largest = max(largest, CacheStore.fileSize(f.path + "-wal"))
        }
        return (largest, f, ino)
    }

    /// A writer the checkpoints cannot keep up with (here: no committing thread at all)
    /// waits for one of its own from `writerWaitThreshold` on: the log stays bounded.
    @Test func aWriterAheadOfTheCheckpointsWaitsForOne() throws {
        let (largest, f, ino) = try largestLog(streaming: 160)
        #expect(largest > CacheStore.writerWaitThreshold / 2, "largest log \(largest)")
        #expect(largest <= CacheStore.writerWaitThreshold + Int64(CacheStore.groupBytes) + (2 << 20), "largest log \(largest)")
        try f.store.synchronize()
        #expect(try f.read(ino, 159 << 20, 2) == [0x33, 0x33])
        #expect(try f.read(ino, 0, 2) == [0x33, 0x33])
    }

    /// A big file's data goes in slices after its last name and reference, and the space
    /// comes back to the file system.
    @Test func deletionRunsInSlicesAndGivesTheSpaceBack() throws {
        let f = try StoreFixture()
        let ino = try f.file("big")
        let megabyte = [UInt8](repeating: 0x44, count: 1 << 20)
        for index in 0..<40 { try f.write(ino, megabyte, at: Int64(index) << 20) }
        try f.store.synchronize()
        try f.store.unlink(parent: CacheStore.rootInode, name: "big")
        #expect(f.store.reclaimPending == 1, "queued, not deleted in the request")
        var slices = 0
        while f.store.reclaimStep() { slices += 1 }
        #expect(slices >= 40 * 16 / CacheStore.reclaimSlice, "\(slices) slices")
        #expect(f.store.reclaimPending == 0)
        // Vacuum waits for a quiet store (CacheStore.vacuumQuiet).
        Thread.sleep(forTimeInterval: CacheStore.vacuumQuiet + 0.1)
        while f.store.reclaimStep() {}
        try f.store.close()
        #expect(try f.query("SELECT count(*) FROM chunks") == "0")
        #expect(try f.query("SELECT count(*) FROM inodes WHERE ino = \(ino)") == "0")
        var st = stat()
        stat(f.path, &st)
        #expect(st.st_size < 8 << 20, "database file \(st.st_size) bytes after the delete")
    }

    /// An unlinked file still open keeps its data until its last close; a forget of an
    /// inode that still has names touches nothing.
    @Test func orphansLiveUntilTheLastReference() throws {
        let f = try StoreFixture()
        let ino = try f.file("open")
        try f.write(ino, [1, 2, 3], at: 0)
        _ = try f.store.open(ino, truncate: false)
        try f.store.unlink(parent: CacheStore.rootInode, name: "open")
        #expect(try f.read(ino, 0, 3) == [1, 2, 3])
        f.store.released(ino)
        #expect(errno { _ = try f.store.inode(ino) } == .noSuchFileOrDirectory)
        let named = try f.store.create(parent: CacheStore.rootInode, name: "named", mode: S_IFREG | 0o644, uid: 0, gid: 0,
                                       reference: true).ino
        #expect(try f.store.lookup(parent: CacheStore.rootInode, name: "named", reference: true).ino == named)
        f.held.drop(named, from: f.store)
        f.held.drop(named, from: f.store)
        #expect(try f.store.inode(named).links == 1)
        // Held and unlinked: an orphan until the last reference goes.
        let held = try f.store.create(parent: CacheStore.rootInode, name: "held", mode: S_IFREG | 0o644, uid: 0, gid: 0,
                                      reference: true).ino
        try f.store.unlink(parent: CacheStore.rootInode, name: "held")
        #expect(try f.store.inode(held).links == 0)
        f.held.drop(held, from: f.store)
        #expect(errno { _ = try f.store.inode(held) } == .noSuchFileOrDirectory)
    }
}

/// A big file cut short (`> file`, O_TRUNC, truncate): the request moves the few chunks it
/// keeps to a new key and leaves the rest to the slices; the file reads right at once, grows
/// again without old data showing, and all of it survives a reopen.
@Suite struct CacheStoreTruncationTests {
    @Test func aBigFileCutShortKeepsItsHeadAndDropsTheRestInSlices() throws {
        let f = try StoreFixture()
        let ino = try f.file("big")
        let megabyte = (0..<(1 << 20)).map { UInt8(truncatingIfNeeded: $0 &* 7 &+ 1) }
        for index in 0..<40 { try f.write(ino, megabyte, at: Int64(index) << 20) }
        try f.store.synchronize()
        _ = try f.store.setAttributes(ino, CacheAttributeChanges(size: 100_000))
        #expect(f.store.reclaimPending == 1, "the cut-off data is queued, not deleted in the request")
        #expect(try f.store.inode(ino).size == 100_000)
        #expect(try f.store.inode(ino).storedBytes == 100_000)
        #expect(try f.read(ino, 0, 200_000) == Array(megabyte[0..<100_000]))
        // Growing again shows zeros, never the old data.
        _ = try f.store.setAttributes(ino, CacheAttributeChanges(size: 3 << 20))
        #expect(try f.read(ino, 2 << 20, 16) == Array(repeating: 0, count: 16))
        try f.write(ino, [9, 9, 9], at: 1 << 20)
        while f.store.reclaimStep() {}
        #expect(f.store.reclaimPending == 0)
        #expect(try f.read(ino, (1 << 20) - 1, 5) == [0, 9, 9, 9, 0])
        try f.store.close()
        #expect(try f.query("SELECT count(*) FROM chunks") == "3", "chunks 0, 1 and 16 of the new key only")
        let reopened = try CacheStore(path: f.path, owner: (0, 0))
        var bytes: [UInt8] = []
        try reopened.read(ino, offset: 0, size: 8) { bytes = Array($0) }
        #expect(bytes == Array(megabyte[0..<8]))
        try reopened.read(ino, offset: 1 << 20, size: 3) { bytes = Array($0) }
        #expect(bytes == [9, 9, 9])
        // Cut to nothing and deleted: every chunk goes.
        _ = try reopened.setAttributes(ino, CacheAttributeChanges(size: 0))
        try reopened.unlink(parent: CacheStore.rootInode, name: "big")
        while reopened.reclaimStep() {}
        try reopened.close()
        #expect(try f.query("SELECT count(*) FROM chunks") == "0")
    }
}

/// The totals of files and stored bytes (schema version 3): kept by triggers with every
/// change, read as one row, compared with a count by `check`, made once for a version 2 store.
@Suite struct CacheTotalsTests {
    func counted(_ f: StoreFixture) throws -> (Int64, Int64) {
        let database = try SQLiteDatabase(path: f.path, readOnly: true)
        let row = try database.integerRow("SELECT count(*), coalesce(sum(stored), 0) FROM inodes WHERE mode & \(S_IFMT) = \(S_IFREG)")
        return (row[0], row[1])
    }

    @Test func keptWithEveryChangeAndReadAsOneRow() throws {
        let f = try StoreFixture()
        let s = f.store, root = CacheStore.rootInode
        #expect(s.usage() == (0, 0))
        let a = try f.file("a"), b = try f.file("b")
        try f.write(a, [UInt8](repeating: 1, count: 100_000), at: 0)
        try f.write(b, [1, 2, 3], at: 1 << 20)  // a hole before it
        try s.synchronize()
        #expect(s.usage() == (try counted(f)))
        #expect(s.usage().files == 2)
        _ = try s.link(b, parent: root, name: "b2")
        _ = try s.setAttributes(a, CacheAttributeChanges(size: 10))
        try s.unlink(parent: root, name: "b")
        _ = try s.create(parent: root, name: "d", mode: S_IFDIR | 0o755, uid: 0, gid: 0)
        try s.synchronize()
        #expect(s.usage() == (try counted(f)), "a directory is no file; a second name is no second file")
        #expect(s.linkedBytes == s.usage().bytes)
        // An open file that lost its names still counts, not against the size limit.
        _ = try s.open(a, truncate: false)
        try s.unlink(parent: root, name: "a")
        try s.synchronize()
        #expect(s.usage() == (try counted(f)))
        #expect(s.linkedBytes == s.usage().bytes - 10)
        s.released(a)
        try s.synchronize()
        #expect(s.usage() == (try counted(f)))
        try s.close()
        try CacheStore.check(path: f.path) { _ in }
    }

    @Test func checkFindsTotalsChangedByHandAndAVersion2StoreGetsThem() throws {
        let f = try StoreFixture()
        let ino = try f.file("x")
        try f.write(ino, [UInt8](repeating: 7, count: 5000), at: 0)
        try f.store.close()
        let database = try SQLiteDatabase(path: f.path)
        try database.execute("UPDATE totals SET bytes = bytes + 1")
        #expect(throws: CacheStoreError.self) { try CacheStore.check(path: f.path) { _ in } }
        // A store of version 2 (no totals): counted once at open.
        try database.execute("DROP TRIGGER totals_insert; DROP TRIGGER totals_delete; DROP TRIGGER totals_update; DROP TABLE totals; PRAGMA user_version=2;")
        var said: [String] = []
        let upgraded = try CacheStore(path: f.path, owner: (0, 0)) { said.append($0) }
        #expect(said.contains { $0.contains("schema version 3") } && said.contains { $0.contains("schema version 4") }, "\(said)")
        #expect(upgraded.usage() == (1, 5000))
        try upgraded.close()
        try CacheStore.check(path: f.path) { _ in }
        #expect(try f.query("PRAGMA user_version") == "4")
    }
}

/// A readdirplus listing counts the kernel's references in the same visit to the store as
/// the listing: a name unlinked before the reply reaches the kernel keeps its inode (an
/// orphan) until the kernel forgets it — no inode the kernel can reach is lost.
@Suite struct CountedListingTests {
    @Test func aListedNameUnlinkedAtOnceKeepsItsInodeUntilForgotten() throws {
        let f = try StoreFixture()
        let s = f.store, root = CacheStore.rootInode
        var inodes: [Int64] = []
        for index in 0..<20 {
            let ino = try f.file("f\(index)")
            try f.write(ino, Array("data \(index)".utf8), at: 0)
            inodes.append(ino)
        }
        let listed = try s.list(root, after: nil, limit: 10, referencing: true)
        #expect(listed.map(\.name) == (0..<20).map { "f\($0)" }.sorted().prefix(10).map { $0 })
        // Every name unlinked, as another process would between the listing and its reply.
        for index in 0..<20 { try s.unlink(parent: root, name: "f\(index)") }
        for entry in listed {
            // Still reachable by the kernel's reference: attributes, and its bytes.
            let inode = try s.inode(entry.inode.ino)
            #expect(inode.links == 0)
            #expect(try f.read(entry.inode.ino, 0, 64).starts(with: Array("data ".utf8)))
        }
        // The names not listed had no reference: gone at once.
        let unlisted = Set(inodes).subtracting(listed.map(\.inode.ino))
        for ino in unlisted { #expect(errno { _ = try s.inode(ino) } == .noSuchFileOrDirectory) }
        // The kernel forgets them (or the bridge does, for entries it did not send): gone.
        for entry in listed { f.held.drop(entry.inode.ino, from: s) }
        for entry in listed { #expect(errno { _ = try s.inode(entry.inode.ino) } == .noSuchFileOrDirectory) }
        #expect(try s.list(root).isEmpty)
    }
}

/// A file appended to a few KiB an fsync (a log, a database's write-ahead log): its last
/// chunk gets room to grow, so that the appends after go in place instead of rewriting the
/// row; the room is zeros past the end, counted as stored, and never shows as data.
@Suite struct CacheAppendRoomTests {
    @Test func appendsGrowTheLastChunkInPlaceAndTheRoomReadsAsZeros() throws {
        let f = try StoreFixture()
        f.store.lock.withLock { f.store.shortFsyncs = false }  // each fsync stores its buffers
        let ino = try f.file("wal")
        let frame = (0..<4120).map { UInt8(truncatingIfNeeded: $0 &* 13 &+ 5) }
        var expected: [UInt8] = []
        var rowIDs: [String?] = []
        for _ in 0..<6 {
            try f.write(ino, frame, at: Int64(expected.count))
            expected += frame
            try f.store.synchronize()
            rowIDs.append(try f.query("SELECT id FROM chunks WHERE idx = 0"))
        }
        #expect(try f.read(ino, 0, 1 << 20) == expected)
        let rowLength = Int(try f.query("SELECT length(data) FROM chunks WHERE idx = 0") ?? "0") ?? 0
        // Rows of 4120, 8240, then room for 16480 (the 4th append goes in place), then room
        // for 32960 (the 6th goes in place): 24720 bytes written, in a row of 32960.
        #expect(rowLength == 32960)
        #expect(rowIDs[2] == rowIDs[3] && rowIDs[4] == rowIDs[5], "appends into the room go in place")
        #expect(rowIDs[3] != rowIDs[4], "a row that must grow is replaced")
        #expect(try f.store.inode(ino).storedBytes == Int64(rowLength), "the room is counted as stored")
        #expect(try f.store.inode(ino).size == Int64(expected.count))
        // Grown by truncate, the file shows zeros where the room was.
        _ = try f.store.setAttributes(ino, CacheAttributeChanges(size: 40_000))
        #expect(try f.read(ino, Int64(expected.count), 40_000) == [UInt8](repeating: 0, count: 40_000 - expected.count))
        // Cut short, the row is cut with it (no old bytes come back when it grows again).
        _ = try f.store.setAttributes(ino, CacheAttributeChanges(size: 100))
        _ = try f.store.setAttributes(ino, CacheAttributeChanges(size: 9000))
        #expect(try f.read(ino, 0, 9000) == Array(expected[0..<100]) + [UInt8](repeating: 0, count: 8900))
        #expect(try f.store.inode(ino).storedBytes == 100)
    }

    /// Past its first chunk a growing file gets the rest of a chunk at once: the piece that
    /// starts a chunk is replaced once, by the whole chunk, and written in place after.
    @Test func pastTheFirstChunkAChunkIsReplacedOnceThenFilledInPlace() throws {
        let f = try StoreFixture()
        f.store.lock.withLock { f.store.shortFsyncs = false }  // each fsync stores its buffers
        let ino = try f.file("wal")
        let frame = (0..<4120).map { UInt8(truncatingIfNeeded: $0 &* 7 &+ 1) }
        var expected: [UInt8] = []
        var seen: [Int64: Set<String>] = [1: [], 2: []]
        while expected.count < 3 * 65536 {
            try f.write(ino, frame, at: Int64(expected.count))
            expected += frame
            try f.store.synchronize()
            for index in [Int64(1), 2] where expected.count > Int(index) * 65536 {
                seen[index]!.insert(try f.query("SELECT group_concat(id || ':' || start || '+' || length(data)) FROM chunks WHERE idx = \(index)") ?? "")
            }
        }
        // Grown by appends in chunk 0 (its room doubled), the file is known to grow: each
        // later chunk is made with its room when the file enters it, and filled in place.
        #expect(seen[1] == ["\(seen[1]!.first!.prefix { $0 != ":" }):0+65536"] && seen[2]!.count == 1, "made once: \(seen)")
        #expect(seen[2]!.first!.hasSuffix(":0+65536"))
        #expect(try f.read(ino, 0, 1 << 20) == expected)
        #expect(try f.store.inode(ino).size == Int64(expected.count))
        #expect(try f.store.inode(ino).storedBytes == 4 * 65536, "full chunks, chunk 3 with its room")
        #expect(try f.query("SELECT count(*) FROM chunks WHERE ino = \(ino)") == "4")
    }

    /// A file that never grew by appends gets no room in a new chunk: a tail written at
    /// once, or a byte far past its end, is stored as written — also after another file
    /// was found growing.
    @Test func aNewChunkOfAFileThatDoesNotGrowGetsNoRoom() throws {
        let f = try StoreFixture()
        let log = try f.file("log")
        for offset in stride(from: 0, to: 3 * 4120, by: 4120) {
            try f.write(log, [UInt8](repeating: 9, count: 4120), at: Int64(offset))
            try f.store.synchronize()
        }
        let copied = try f.file("copied")
        try f.write(copied, [UInt8](repeating: 1, count: 2 * 65536 + 1000), at: 0)
        try f.store.synchronize()
        let far = try f.file("far")
        try f.write(far, [1], at: 5 * 65536 + 10)
        try f.store.synchronize()
        func pieces(_ ino: Int64) throws -> String? {
            try f.query("SELECT group_concat(idx || ':' || start || '+' || length(data)) FROM (SELECT * FROM chunks WHERE ino = \(ino) ORDER BY idx)")
        }
        #expect(try pieces(copied) == "0:0+65536,1:0+65536,2:0+1000")
        #expect(try pieces(far) == "5:10+1")
        #expect(try f.store.inode(copied).storedBytes == 2 * 65536 + 1000 && f.store.inode(far).storedBytes == 1)
    }

    @Test func aChunkInTheMiddleGetsNoRoom() throws {
        let f = try StoreFixture()
        f.store.lock.withLock { f.store.shortFsyncs = false }  // each fsync stores its buffers
        let ino = try f.file("sparse")
        try f.write(ino, [1], at: 5 * 65536)
        try f.store.synchronize()
        try f.write(ino, [UInt8](repeating: 2, count: 100), at: 0)
        try f.store.synchronize()
        try f.write(ino, [UInt8](repeating: 3, count: 100), at: 100)
        try f.store.synchronize()
        #expect(try f.query("SELECT length(data) FROM chunks WHERE idx = 0") == "200", "only what was written")
    }
}

/// The committing thread, run as the daemon runs it: woken only when a request leaves a
/// group open or data buffered that it does not know of.
@Suite struct CommittingThreadTests {
    /// Runs `body` with the committing thread's passes running beside it.
    static func withCommittingThread(_ store: CacheStore, _ body: () throws -> Void) throws {
        let running = Locked(true)
        let finished = Semaphore()
        _ = Threads.detach {
            while running.withLock({ $0 }) { store.committingPass(idleSleep: 3600) }
            finished.post()
        }
        defer {
            running.withLock { $0 = false }
            store.wakeCommitter()
            finished.wait(seconds: 10)
        }
        try body()
    }

    /// A transaction of a database inside (appends, then fsync): the fsync commits the group
    /// it opened, and the thread is not woken for each (it was, 3.5 times a transaction).
    @Test func anFsyncPerTransactionWakesTheThreadRarely() throws {
        let f = try StoreFixture()
        let ino = try f.file("wal")
        try Self.withCommittingThread(f.store) {
            usleep(50_000)
            let before = f.store.lock.withLock { f.store.committerWakes }
            for index in 0..<200 {
                try f.write(ino, [UInt8](repeating: UInt8(index % 250), count: 4120), at: Int64(index) * 4120)
                try f.store.synchronize()
            }
            let wakes = f.store.lock.withLock { f.store.committerWakes } - before
            #expect(wakes <= 20, "\(wakes) wakes for 200 transactions")
        }
    }

    /// A write right after an fsync starts its buffer from what the fsync stored (no row
    /// read), and from the row again once any row changed: a truncate, a chmod between them.
    @Test func aWriteAfterAnFsyncStartsFromWhatItStoredUntilARowChanges() throws {
        let f = try StoreFixture()
        let ino = try f.file("db-wal")
        try f.write(ino, [UInt8](repeating: 1, count: 4096), at: 0)
        try f.store.synchronize()
        #expect(f.store.lock.withLock { f.store.settledFile(ino)?.size } == 4096)
        try f.write(ino, [UInt8](repeating: 2, count: 4096), at: 4096)  // from the fsync's state
        try f.store.synchronize()
        #expect(try f.store.inode(ino).size == 8192)
        // Cut short after the fsync: the next write must not bring the old size back.
        _ = try f.store.setAttributes(ino, CacheAttributeChanges(size: 100))
        #expect(f.store.lock.withLock { f.store.settledFile(ino) } == nil)
        try f.write(ino, [9], at: 200)
        try f.store.synchronize()
        #expect(try f.store.inode(ino).size == 201)
        #expect(try f.read(ino, 0, 300) == [UInt8](repeating: 1, count: 100) + [UInt8](repeating: 0, count: 100) + [9])
        // Set-ID bits given after the fsync: a write without CAP_FSETID still drops them.
        _ = try f.store.setAttributes(ino, CacheAttributeChanges(mode: 0o4755))
        let dropped = try [UInt8(3)].withUnsafeBytes { (buffer) throws(Errno) in
            try f.store.write(ino, offset: 0, data: buffer, append: false, droppingSetID: true).modeChanged
        }
        #expect(dropped)
        #expect(try f.store.inode(ino).mode & 0o7777 == 0o755)
    }

    /// The log's file is kept once SQLite starts the log over, and written over from its
    /// start (commits after an fsync do not lengthen it); a quiet store whose file grew past
    /// `keptLogSize` gets it cut back to that size, not to nothing.
    @Test func theLogFileIsKeptAndWrittenOverUnlessLarge() throws {
        let f = try StoreFixture()
        f.store.lock.withLock { f.store.shortFsyncs = false }  // every fsync commits to the log
        let ino = try f.file("db-wal")
        let frames = [UInt8](repeating: 0x5a, count: 2 * 4120)
        for index in 0..<400 {
            try f.write(ino, frames, at: Int64(index) * 8240)
            try f.store.synchronize()
        }
        usleep(UInt32(CacheStore.checkpointQuiet * 1.5e6))
        f.store.checkpointIfDue()  // everything copied, quiet: the file stays
        let kept = CacheStore.fileSize(f.path + "-wal")
        #expect(kept > 4 << 20 && kept <= CacheStore.keptLogSize, "log file \(kept) bytes")
        for index in 0..<20 {
            try f.write(ino, frames, at: Int64(index) * 8240)
            try f.store.synchronize()
        }
        #expect(CacheStore.fileSize(f.path + "-wal") == kept, "written over from its start")
        // Past the kept size (one group of 8 MiB after another, no checkpoint between, short
        // of `writerWaitThreshold`, where a writer would checkpoint itself):
        let megabyte = [UInt8](repeating: 0x33, count: 1 << 20)
        for index in 0..<24 { try f.write(ino, megabyte, at: Int64(index) << 20) }
        try f.store.synchronize()
        #expect(CacheStore.fileSize(f.path + "-wal") > CacheStore.keptLogSize)
        usleep(UInt32(CacheStore.checkpointQuiet * 1.5e6))
        f.store.checkpointIfDue()
        #expect(CacheStore.fileSize(f.path + "-wal") == CacheStore.keptLogSize, "cut back when quiet")
        usleep(UInt32(CacheStore.checkpointQuiet * 1.5e6))
        f.store.checkpointIfDue()  // the one frame of that cut copied: nothing more to do
        #expect(!f.store.needsCheckpoint)
        #expect(CacheStore.fileSize(f.path + "-wal") == CacheStore.keptLogSize)
        #expect(try f.read(ino, 23 << 20, 3) == [0x33, 0x33, 0x33])
    }

    /// Data buffered while the thread sleeps long (idle) wakes it: the data reaches the
    /// database when due (0.25 s after the write), not an hour later.
    @Test func bufferedDataWakesAnIdleThreadAndIsStoredWhenDue() throws {
        let f = try StoreFixture()
        let ino = try f.file("late")
        try f.store.synchronize()
        try Self.withCommittingThread(f.store) {
            usleep(400_000)  // the checkpoint done: the thread waits long
            try f.write(ino, [7, 7, 7], at: 5)
            let started = ContinuousClock.now
            while try f.query("SELECT count(*) FROM chunks") != "1" && started.secondsElapsed < 3 { usleep(5_000) }
            #expect(started.secondsElapsed >= 0.2 && started.secondsElapsed < 1.5, "stored after \(started.secondsElapsed) s")
        }
    }

    /// With data buffered (the thread waits until it is due, 0.25 s), a group that a request
    /// leaves open still reaches the database within the group delay, not the buffer's.
    /// (It waited 0.25 s: a 1 GiB write let the log grow to 80 MiB.)
    @Test func aGroupLeftOpenIsCommittedWhileDataWaits() throws {
        let f = try StoreFixture()
        let ino = try f.file("buffered")
        try Self.withCommittingThread(f.store) {
            usleep(50_000)
            try f.write(ino, [1, 2, 3], at: 10)  // buffered, due in 0.25 s
            usleep(20_000)
            try f.file("new")  // a group left open
            let started = ContinuousClock.now
            while try f.query("SELECT count(*) FROM entries WHERE name = 'new'") != "1" && started.secondsElapsed < 1 { usleep(2_000) }
            #expect(started.secondsElapsed < 0.15, "seen after \(started.secondsElapsed) s")
        }
    }
}

/// The log's content, not its file's size, decides a checkpoint: SQLite starts the log over
/// without shrinking the file.
@Suite struct LogFrameCountTests {
    @Test func framesCountFromWhereTheLogStartedOver() throws {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("mtmfs-frames-\(UUID().uuidString)").path
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let database = try SQLiteDatabase(path: directory + "/db", create: true)
        try database.execute("PRAGMA journal_mode=WAL; PRAGMA wal_autocheckpoint=0; CREATE TABLE t(v BLOB)")
        database.countLogFrames()
        try database.execute("INSERT INTO t VALUES (zeroblob(1000000))")
        let many = database.logFrames
        #expect(many > 200)
        _ = try database.checkpoint(mode: 0)  // SQLITE_CHECKPOINT_PASSIVE
        try database.execute("INSERT INTO t VALUES (x'01')")  // the log starts over
        #expect(database.logFrames > 0 && database.logFrames < 10)
        let logFile = try Syscall.stat(directory + "/db-wal")
        #expect(Int(logFile.st_size) > many * 4096, "the file kept its size")
    }
}

/// A chunk's buffer holds what was written, piece by piece.
@Suite struct DirtyChunkTests {
    static func write(_ chunk: inout DirtyChunks.Chunk, _ byte: UInt8, _ count: Int, at offset: Int) {
        [UInt8](repeating: byte, count: count).withUnsafeBytes { chunk.write($0, at: offset) }
    }

    @Test func scatteredWritesHoldOnlyTheirBytes() {
        var chunk = DirtyChunks.Chunk()
        Self.write(&chunk, 1, 4096, at: 40_960)
        Self.write(&chunk, 2, 4096, at: 8192)
        #expect(chunk.count == 8192)
        #expect(chunk.pieces.map(\.range) == [8192..<12288, 40_960..<45_056])
        // Touching and overlapping pieces become one.
        Self.write(&chunk, 3, 4096, at: 12_288)
        Self.write(&chunk, 4, 100, at: 40_000)
        Self.write(&chunk, 5, 2000, at: 39_000)
        #expect(chunk.pieces.map(\.range) == [8192..<16_384, 39_000..<45_056])
        #expect(chunk.count == 8192 + 6056)
        let (first, second) = (chunk.pieces[0].bytes, chunk.pieces[1].bytes)
        #expect(first[0..<4096].allSatisfy { $0 == 2 } && first[4096...].allSatisfy { $0 == 3 })
        #expect(second[0..<2000].allSatisfy { $0 == 5 } && second[2000...].allSatisfy { $0 == 1 })
    }

    @Test func aSequentialWriterFillsOnePieceToAWholeChunk() {
        var chunk = DirtyChunks.Chunk()
        for offset in stride(from: 0, to: CacheStore.chunkSize, by: 4096) {
            Self.write(&chunk, UInt8(offset / 4096), 4096, at: offset)
            #expect(chunk.pieces.count == 1)
        }
        #expect(chunk.isWhole && chunk.count == CacheStore.chunkSize)
        #expect(chunk.whole[4096 * 15] == 15)
        // A rewrite inside changes bytes, not the count.
        Self.write(&chunk, 99, 10, at: 5)
        #expect(chunk.count == CacheStore.chunkSize && chunk.whole[5] == 99 && chunk.whole[15] == 0)
    }
}
