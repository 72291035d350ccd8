@testable import CacheStore
import Foundation
import Posix
import Testing
#if canImport(Glibc)
import Glibc
#endif

/// Small files: their bytes in one `contents` row, buffered while written, read back from
/// the buffer, stored at close, fsync or when due; moved to a data file once a write would
/// take them past `inlineLimit` or leave a hole.
@Suite struct InlineDataTests {
    /// Writes buffer and read back at once; the row is written once, at the close.
    @Test func smallWritesBufferReadBackAndAreStoredAsOneRow() throws {
        let f = try StoreFixture()
        let ino = try f.file("notes")
        _ = try f.store.open(ino, truncate: false)
        var expected: [UInt8] = []
        for index in 0..<100 {
            let piece = [UInt8](repeating: UInt8(index), count: 512)  // postmark's block size
            _ = try piece.withUnsafeBytes { buffer in try f.store.write(ino, offset: 0, data: buffer, append: true) }
            expected += piece
        }
        #expect(try f.store.inode(ino).size == 51_200)
        #expect(try f.read(ino, 0, 60_000) == expected)
        #expect(try f.query("SELECT count(*) FROM contents") == "0", "nothing stored before it is needed")
        f.store.released(ino)
        try f.store.synchronize()  // (committed: what another connection sees)
        #expect(try f.query("SELECT length(data) FROM contents WHERE ino = \(ino)") == "51200")
        #expect(try f.query("SELECT size || ' ' || stored || ' ' || (data IS NULL) FROM inodes WHERE ino = \(ino)") == "51200 51200 1")
        #expect(f.dataFiles.isEmpty, "a small file has no data file")
        #expect(try f.read(ino, 512 * 99, 512) == [UInt8](repeating: 99, count: 512))
        // A write into the middle of the stored row, then an fsync: the row again, once.
        try f.write(ino, [1, 2, 3], at: 10)
        try f.store.synchronize(ino)
        #expect(try f.query("SELECT hex(substr(data, 10, 5)) FROM contents WHERE ino = \(ino)") == "0001020300")
        #expect(errno { try f.write(CacheStore.rootInode, [1], at: 0) } == .isDirectory)
    }

    /// A file made longer than its bytes (truncate) keeps the rest as a hole inside the
    /// database: it reads as zeros, counts no blocks, and SEEK_HOLE finds it.
    @Test func aTrailingHoleStaysInsideAndReadsAsZeros() throws {
        let f = try StoreFixture()
        let ino = try f.file("sparse")
        try f.write(ino, [UInt8](repeating: 5, count: 1000), at: 0)
        _ = try f.store.setAttributes(ino, CacheAttributeChanges(size: 10 << 20))
        let inode = try f.store.inode(ino)
        #expect(inode.size == 10 << 20 && inode.storedBytes == 1000)
        #expect(try f.read(ino, 990, 20) == [UInt8](repeating: 5, count: 10) + [UInt8](repeating: 0, count: 10))
        #expect(try f.store.seek(ino, offset: 0, data: false) == 1000)
        #expect(try f.store.seek(ino, offset: 500, data: true) == 500)
        #expect(errno { _ = try f.store.seek(ino, offset: 5000, data: true) } == .noSuchDeviceOrAddress)
        #expect(try f.store.seek(ino, offset: 5000, data: false) == 5000)
        // Written on from its bytes' end: still inside.
        try f.write(ino, [6, 6], at: 1000)
        try f.store.synchronize(ino)
        #expect(f.dataFiles.isEmpty)
        // Cut short into its bytes: they are cut too, and growing again shows zeros.
        _ = try f.store.setAttributes(ino, CacheAttributeChanges(size: 100))
        _ = try f.store.setAttributes(ino, CacheAttributeChanges(size: 200))
        #expect(try f.read(ino, 90, 20) == [UInt8](repeating: 5, count: 10) + [UInt8](repeating: 0, count: 10))
        try f.store.synchronize()
        #expect(try f.query("SELECT length(data) FROM contents WHERE ino = \(ino)") == "100")
    }

    /// A write past `inlineLimit`, or one that would leave a hole, moves the file's bytes to
    /// a data file of its own: what was stored and buffered goes with them.
    @Test func aWritePastTheLimitOrAfterAHoleMovesTheBytesOut() throws {
        let f = try StoreFixture()
        let grown = try f.file("grown"), holed = try f.file("holed")
        let head = (0..<CacheStore.inlineLimit).map { UInt8(truncatingIfNeeded: $0 &* 13) }
        try f.write(grown, head, at: 0)
        try f.store.synchronize(grown)  // stored inside, and then:
        try f.write(grown, [9, 9], at: Int64(CacheStore.inlineLimit))
        #expect(f.dataFiles.count == 1)
        #expect(try f.read(grown, 0, CacheStore.inlineLimit + 10) == head + [9, 9])
        try f.write(holed, [1, 2, 3], at: 0)
        try f.write(holed, [4], at: 4096)
        #expect(f.dataFiles.count == 2)
        #expect(try f.read(holed, 0, 5000) == [1, 2, 3] + [UInt8](repeating: 0, count: 4093) + [4])
        #expect(try f.store.inode(holed).size == 4097)
    }

    /// Data buffered while the thread sleeps long (idle) wakes it: the data reaches the
    /// database when due (0.25 s after the write), not an hour later.
    @Test func bufferedDataWakesAnIdleThreadAndIsStoredWhenDue() throws {
        let f = try StoreFixture()
        let ino = try f.file("late")
        try f.store.synchronize()
        try CommittingThread.running(f.store) {
            usleep(400_000)  // the checkpoint done: the thread waits long
            try f.write(ino, [7, 7, 7], at: 0)
            let started = ContinuousClock.now
            while try f.query("SELECT count(*) FROM contents") != "1" && started.secondsElapsed < 3 { usleep(5_000) }
            #expect(started.secondsElapsed >= 0.2 && started.secondsElapsed < 1.5, "stored after \(started.secondsElapsed) s")
        }
    }

    /// With data buffered (the thread waits until it is due, 0.25 s), a group that a request
    /// leaves open still reaches the database within the group delay, not the buffer's.
    @Test func aGroupLeftOpenIsCommittedWhileDataWaits() throws {
        let f = try StoreFixture()
        let ino = try f.file("buffered")
        try CommittingThread.running(f.store) {
            usleep(50_000)
            try f.write(ino, [1, 2, 3], at: 0)  // buffered, due in 0.25 s
            usleep(20_000)
            try f.file("new")  // a group left open
            let started = ContinuousClock.now
            while try f.query("SELECT count(*) FROM entries WHERE name = 'new'") != "1" && started.secondsElapsed < 1 { usleep(2_000) }
            #expect(started.secondsElapsed < 0.15, "seen after \(started.secondsElapsed) s")
        }
    }

    /// Buffers past `bufferLimit` are stored down to half of it by the write that passes it.
    @Test func buffersPastTheLimitAreStoredByTheWrite() throws {
        let f = try StoreFixture()
        let piece = [UInt8](repeating: 3, count: 60_000)
        for index in 0..<(CacheStore.bufferLimit / piece.count + 2) { try f.write(try f.file("f\(index)"), piece, at: 0) }
        let held = f.store.lock.withLock { f.store.inline.bytes }
        #expect(held <= CacheStore.bufferLimit, "\(held) bytes buffered")
        #expect(Int(try f.query("SELECT count(*) FROM contents") ?? "0")! > 0)
    }
}

/// The committing thread as the daemon runs it, for the length of `body`.
enum CommittingThread {
    static func running(_ store: CacheStore, _ body: () throws -> Void) throws {
        let running = Locked(true)
        let done = Semaphore()
        _ = Threads.detach {
            while running.withLock({ $0 }) { store.committingPass(idleSleep: 3600) }
            done.post()
        }
        defer {
            running.withLock { $0 = false }
            store.wakeCommitter()
            done.wait(seconds: 10)
        }
        try body()
    }
}
