@testable import CacheStore
import Foundation
import Posix
import Testing
#if canImport(Glibc)
import Glibc
#endif

/// Large files: their bytes in a data file of their own beside the database, written in
/// place; recorded in their row only once synced; removed only once their deletion is
/// durable; holes, fallocate, SEEK_DATA and copies the host file system's.
@Suite struct DataFileTests {
    func row(_ f: StoreFixture, _ ino: Int64) throws -> String? {
        try f.query("SELECT size || ' ' || iif(data IS NULL, 'inline', 'file') || ' ' || (SELECT count(*) FROM contents WHERE contents.ino = inodes.ino) FROM inodes WHERE ino = \(ino)")
    }

    /// The bytes move out at the write that takes the file past the limit; the row names the
    /// data file once an fsync synced it; later fsyncs of the file sync it alone (no commit,
    /// the log not synced: the tree did not change).
    @Test func aLargeFileIsRecordedOnceSyncedAndThenSyncsAlone() throws {
        let f = try StoreFixture()
        let ino = try f.file("big")
        try f.write(ino, [UInt8](repeating: 1, count: 1000), at: 0)
        try f.store.synchronize(ino)
        #expect(try row(f, ino) == "1000 inline 1")
        let payload = (0..<200_000).map { UInt8(truncatingIfNeeded: $0 &* 31) }
        try f.write(ino, payload, at: 0)
        #expect(f.dataFiles.count == 1)
        #expect(try row(f, ino) == "1000 inline 1", "not recorded before its data file is synced")
        #expect(try f.store.inode(ino).size == 200_000)
        try f.store.synchronize(ino)
        #expect(try row(f, ino) == "200000 file 0")
        // Written in place, then synced: one sync of the data file.
        let before = f.store.lock.withLock { (f.store.commits, f.store.treeChanges, f.store.syncedTreeChanges) }
        #expect(before.1 == before.2)
        try f.write(ino, [7, 7, 7], at: 100)
        try f.store.synchronize(ino)
        let after = f.store.lock.withLock { (f.store.commits, f.store.treeChanges) }
        #expect(after.0 == before.0 && after.1 == before.1, "no commit, no change of the tree")
        #expect(try f.read(ino, 99, 5) == [payload[99], 7, 7, 7, payload[103]])
        let host = try Syscall.stat(f.dataFolder + "/" + f.dataFiles[0])
        #expect(try f.query("SELECT data FROM inodes WHERE ino = \(ino)") == f.dataFiles[0], "named by its data key")
        #expect(host.st_size == 200_000 && host.st_mode & 0o777 == 0o600)
        #expect(try f.store.inode(ino).storedBytes == Int64(host.st_blocks) * 512)
    }

    /// A crash before the conversion is recorded leaves the file as it was in the database,
    /// and the next open removes the data file that no row names; after the fsync that
    /// recorded it, the data file is the file.
    @Test func aCrashBeforeTheDataFileIsRecordedLeavesTheRowAsItWas() throws {
        let f = try StoreFixture()
        let ino = try f.file("grows")
        try f.write(ino, Array("synced".utf8), at: 0)
        try f.store.synchronize(ino)
        try f.write(ino, [UInt8](repeating: 2, count: 100_000), at: 6)
        let early = try f.crashCopy()
        var said: [String] = []
        let reopened = try CacheStore(path: early, owner: (0, 0)) { said.append($0) }
        #expect(try read(reopened, ino, 0, 100) == Array("synced".utf8))
        #expect(try reopened.inode(ino).size == 6)
        #expect(try FileManager.default.contentsOfDirectory(atPath: DataFolder.path(besides: early)).isEmpty)
        #expect(said.contains { $0.contains("removed 1 data file(s)") }, "\(said)")
        try f.store.synchronize(ino)
        let late = try f.crashCopy()
        let recovered = try CacheStore(path: late, owner: (0, 0))
        #expect(try recovered.inode(ino).size == 100_006)
        #expect(try read(recovered, ino, 0, 8) == Array("synced".utf8) + [2, 2])
    }

    /// A deleted file's data file stays until the deletion is durable (a crash could bring
    /// the row back), then goes: the space is the host's again.
    @Test func aDeletedFilesDataFileGoesOnceTheDeletionIsDurable() throws {
        let f = try StoreFixture()
        let ino = try f.file("big")
        try f.write(ino, [UInt8](repeating: 4, count: 4 << 20), at: 0)
        try f.store.synchronize(ino)
        try f.store.unlink(parent: CacheStore.rootInode, name: "big")
        #expect(f.store.reclaimPending == 1)
        _ = f.store.reclaimStep()
        #expect(f.dataFiles.count == 1, "kept until the deletion is durable")
        try f.store.synchronize()
        while f.store.reclaimStep() {}
        #expect(f.dataFiles.isEmpty)
        #expect(f.store.reclaimPending == 0)
        // An open file that lost its name keeps its data file until the last close.
        let open = try f.file("open")
        try f.write(open, [UInt8](repeating: 5, count: 100_000), at: 0)
        _ = try f.store.open(open, truncate: false)
        try f.store.unlink(parent: CacheStore.rootInode, name: "open")
        #expect(try f.read(open, 99_990, 10) == [UInt8](repeating: 5, count: 10))
        f.store.released(open)
        try f.store.close()
        #expect(f.dataFiles.isEmpty, "removed at the unmount")
    }

    /// Cut short, a large file's data file is cut; cut to nothing, the file is small again.
    @Test func cuttingALargeFileToNothingMakesItSmallAgain() throws {
        let f = try StoreFixture()
        let ino = try f.file("big")
        let payload = (0..<300_000).map { UInt8(truncatingIfNeeded: $0 &* 7 &+ 1) }
        try f.write(ino, payload, at: 0)
        try f.store.synchronize(ino)
        _ = try f.store.setAttributes(ino, CacheAttributeChanges(size: 100_000))
        #expect(try f.read(ino, 0, 200_000) == Array(payload[0..<100_000]))
        #expect(try Syscall.stat(f.dataFolder + "/" + f.dataFiles[0]).st_size == 100_000)
        _ = try f.store.setAttributes(ino, CacheAttributeChanges(size: 3 << 20))
        #expect(try f.read(ino, 2 << 20, 16) == [UInt8](repeating: 0, count: 16), "growing again shows zeros")
        // O_TRUNC: small again, and the data file goes once that is durable.
        _ = try f.store.open(ino, truncate: true)
        try f.store.synchronize()
        #expect(try row(f, ino) == "0 inline 0")
        try f.write(ino, [1, 2], at: 0)
        f.store.released(ino)
        try f.store.synchronize()
        while f.store.reclaimStep() {}
        #expect(f.dataFiles.isEmpty)
        #expect(try row(f, ino) == "2 inline 1")
    }

    /// fallocate, SEEK_DATA/SEEK_HOLE and copy_file_range are the host's: a small file
    /// moves out first; a copy between large files keeps the source's holes.
    @Test func allocationSeekingAndCopiesAreTheHostFileSystems() throws {
        let f = try StoreFixture()
        let ino = try f.file("allocated")
        try f.write(ino, [1, 2, 3], at: 0)
        try f.store.allocate(ino, mode: 0, offset: 0, length: 1 << 20)
        #expect(f.dataFiles.count == 1, "a small file moves out first")
        #expect(try f.store.inode(ino).size == 1 << 20)
        #expect(try f.store.inode(ino).storedBytes >= 1 << 20, "preallocated blocks count")
        #expect(try f.read(ino, 0, 4) == [1, 2, 3, 0])
        #expect(errno { try f.store.allocate(ino, mode: 0x08, offset: 0, length: 4096) } == .notSupported)  // collapse range
        #expect(errno { try f.store.allocate(ino, mode: CacheStore.AllocationMode.punchHole, offset: 0, length: 4096) } == .notSupported)
        #expect(errno { try f.store.allocate(ino, mode: 0, offset: -1, length: 4096) } == .invalidArgument)
        // A hole punched into written data: blocks given back, and SEEK_HOLE/SEEK_DATA find it.
        let written = try f.file("written")
        try f.write(written, [UInt8](repeating: 1, count: 1 << 20), at: 0)
        try f.store.allocate(written, mode: CacheStore.AllocationMode.punchHole | CacheStore.AllocationMode.keepSize,
                             offset: 64 << 10, length: 512 << 10)
        #expect(try f.store.inode(written).storedBytes <= 1 << 19)
        #expect(try f.store.inode(written).size == 1 << 20)
        #expect(try f.store.seek(written, offset: 0, data: false) == 64 << 10)
        #expect(try f.store.seek(written, offset: 64 << 10, data: true) == 576 << 10)
        #expect(try f.read(written, (64 << 10) - 1, 2) == [1, 0])
        // A sparse source: data at 0 and at 8 MiB, a hole between.
        let source = try f.file("source"), copy = try f.file("copy")
        try f.write(source, [UInt8](repeating: 9, count: 100_000), at: 0)
        try f.write(source, [UInt8](repeating: 8, count: 4096), at: 8 << 20)
        var done = 0
        while done < (8 << 20) + 4096 {
            let n = try f.store.copyRange(from: source, offset: Int64(done), to: copy, offset: Int64(done), length: (8 << 20) + 4096 - done)
            guard n > 0 else { break }
            done += n
        }
        #expect(done == (8 << 20) + 4096)
        #expect(try f.read(copy, (8 << 20) - 2, 4) == [0, 0, 8, 8])
        #expect(try f.read(copy, 99_998, 4) == [9, 9, 0, 0])
        #expect(try f.store.inode(copy).storedBytes < 1 << 20, "the hole stays a hole")
        // Into a small file, within the limit: a write, still inside.
        let small = try f.file("small")
        #expect(try f.store.copyRange(from: source, offset: 10, to: small, offset: 0, length: 100) == 100)
        #expect(try f.read(small, 0, 200) == [UInt8](repeating: 9, count: 100))
        #expect(f.dataFiles.count == 4, "allocated, written, source and copy: not the small one")
    }

    /// A large file renamed over another is synced and recorded first: the new name never
    /// points at a row whose data file a crash could lose.
    @Test func aLargeFileRenamedOverAnotherIsRecordedFirst() throws {
        let f = try StoreFixture()
        let target = try f.file("config")
        try f.write(target, Array("old".utf8), at: 0)
        try f.store.synchronize(target)
        let temporary = try f.file("config.tmp")
        try f.write(temporary, [UInt8](repeating: 6, count: 150_000), at: 0)
        try f.store.synchronize()
        #expect(try row(f, temporary) == "0 inline 0")
        try f.store.rename(parent: CacheStore.rootInode, name: "config.tmp", newParent: CacheStore.rootInode, newName: "config", flags: 0)
        // Recorded in the rename's group or an earlier one: committed no later than the rename.
        #expect(f.store.lock.withLock { f.store.data.unrecorded.isEmpty })
        try f.store.synchronize()
        #expect(try row(f, temporary) == "150000 file 0")
        let crashed = try CacheStore(path: try f.crashCopy(), owner: (0, 0))
        let found = try crashed.lookup(parent: CacheStore.rootInode, name: "config")
        #expect(found.ino == temporary && found.size == 150_000)
    }

    /// Small writes each followed by an fsync, then whole chunks (an outside exerciser's
    /// reduction: the daemon once trapped here): every byte, also after a crash.
    @Test func wholeChunksAfterFsyncsKeepEveryByte() throws {
        let f = try StoreFixture()
        let ino = try f.file("db.bin")
        var expected = [UInt8](repeating: 0, count: 65536 + 131072)
        for i in 0..<4 {
            try f.write(ino, [UInt8](repeating: 0x61, count: 100), at: Int64(300 * i))
            expected.replaceSubrange((300 * i)..<(300 * i + 100), with: repeatElement(0x61, count: 100))
            try f.store.synchronize(ino)
        }
        try f.write(ino, [UInt8](repeating: 0x62, count: 100), at: 5000)
        expected.replaceSubrange(5000..<5100, with: repeatElement(0x62, count: 100))
        try f.write(ino, [UInt8](repeating: 0x63, count: 131072), at: 65536)
        expected.replaceSubrange(65536..<(65536 + 131072), with: repeatElement(0x63, count: 131072))
        #expect(try f.store.inode(ino).size == Int64(expected.count))
        #expect(try f.read(ino, 0, expected.count) == expected)
        try f.write(ino, [UInt8](repeating: 0x64, count: 10), at: 70000)
        expected.replaceSubrange(70000..<70010, with: repeatElement(0x64, count: 10))
        try f.store.synchronize(ino)
        let reopened = try CacheStore(path: try f.crashCopy(), owner: (0, 0))
        #expect(try read(reopened, ino, 0, expected.count) == expected)
    }

    /// Appends that take a file out of the database, by a writer without CAP_FSETID: the
    /// set-ID bits go with the first, and every byte lands at the end.
    @Test func appendsDroppingSetIDBitsAcrossTheMoveKeepEveryByte() throws {
        let f = try StoreFixture()
        let ino = try f.file("log")
        _ = try f.store.setAttributes(ino, CacheAttributeChanges(mode: 0o6755))
        var expected: [UInt8] = []
        var changed: [Bool] = []
        for size in [700, 700, 50, 3 * 65536, 10] {
            let bytes = (0..<size).map { UInt8(truncatingIfNeeded: $0 &* 7 &+ size) }
            var written = 0, modeChanged = false
            try bytes.withUnsafeBytes { buffer in
                (written, modeChanged) = try f.store.write(ino, offset: 0, data: buffer, append: true, droppingSetID: true)
            }
            #expect(written == size)
            changed.append(modeChanged)
            expected += bytes
            try f.store.synchronize(ino)
        }
        #expect(changed == [true, false, false, false, false])
        #expect(try f.store.inode(ino).mode & 0o7777 == 0o755)
        #expect(try f.read(ino, 0, expected.count + 10) == expected)
        // Given back and dropped again by a write into the data file.
        _ = try f.store.setAttributes(ino, CacheAttributeChanges(mode: 0o4755))
        let dropped = try [UInt8(3)].withUnsafeBytes { (buffer) throws(Errno) in
            try f.store.write(ino, offset: 0, data: buffer, append: false, droppingSetID: true).modeChanged
        }
        #expect(try dropped && (f.store.inode(ino).mode & 0o7777) == 0o755)
    }
}
