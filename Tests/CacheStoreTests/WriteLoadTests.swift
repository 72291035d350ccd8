@testable import CacheStore
import Foundation
import Posix
import Testing
#if canImport(Glibc)
import Glibc
#endif

/// The write-ahead log under load: bounded whatever the writer, its file kept and written
/// over, the space of deleted small files given back; the committing thread woken rarely.
@Suite struct WriteLoadTests {
    /// `megabytes` MiB of small files (60 KiB each, written and closed), `between` run
    /// after each; the largest log seen.
    func largestLog(_ f: StoreFixture, megabytes: Int, between: (CacheStore) -> Void = { _ in }) throws -> Int64 {
        let piece = [UInt8](repeating: 0x33, count: 60 << 10)
        var largest: Int64 = 0
        for index in 0..<(megabytes * 1024 / 60) {
            let ino = try f.file("f\(index)")
            _ = try f.store.open(ino, truncate: false)
            try f.write(ino, piece, at: 0)
            f.store.released(ino)
            between(f.store)
            largest = max(largest, CacheStore.fileSize(f.path + "-wal"))
        }
        return largest
    }

    /// A writer that never stops: the log stays under its bound when the committing thread
    /// does its work between writes, as the daemon's thread does.
    @Test func theLogStaysBounded() throws {
        let f = try StoreFixture()
        let largest = try largestLog(f, megabytes: 160) { store in
            store.commitWhenDue(waitingAtMost: 0)
            store.checkpointIfDue()
        }
        #expect(largest > 0 && largest <= CacheStore.logBound, "largest log \(largest)")
    }

    /// A writer the checkpoints cannot keep up with (here: no committing thread at all)
    /// waits for one of its own from `writerWaitThreshold` on: the log stays bounded.
    @Test func aWriterAheadOfTheCheckpointsWaitsForOne() throws {
        let f = try StoreFixture()
        let largest = try largestLog(f, megabytes: 160)
        #expect(largest > CacheStore.writerWaitThreshold / 2, "largest log \(largest)")
        #expect(largest <= CacheStore.writerWaitThreshold + Int64(CacheStore.groupBytes) + (4 << 20), "largest log \(largest)")
        try f.store.synchronize()
        let last = try f.store.lookup(parent: CacheStore.rootInode, name: "f\(160 * 1024 / 60 - 1)")
        #expect(try f.read(last.ino, 0, 2) == [0x33, 0x33])
    }

    /// Deleted small files leave free pages, which go back to the file system once the
    /// store is quiet.
    @Test func deletedSmallFilesGiveTheSpaceBack() throws {
        let f = try StoreFixture()
        _ = try largestLog(f, megabytes: 40)
        try f.store.synchronize()
        for index in 0..<(40 * 1024 / 60) { try f.store.unlink(parent: CacheStore.rootInode, name: "f\(index)") }
        try f.store.synchronize()
        Thread.sleep(forTimeInterval: CacheStore.vacuumQuiet + 0.1)
        var steps = 0
        while f.store.reclaimStep() { steps += 1 }
        #expect(steps > 0)
        try f.store.close()
        #expect(try f.query("SELECT count(*) FROM contents") == "0")
        #expect(try Syscall.stat(f.path).st_size < 8 << 20, "database file after the delete")
    }

    /// The log's file is kept once SQLite starts the log over, and written over from its
    /// start (commits after an fsync do not lengthen it); a quiet store whose file grew past
    /// `keptLogSize` gets it cut back to that size, not to nothing.
    @Test func theLogFileIsKeptAndWrittenOverUnlessLarge() throws {
        let f = try StoreFixture()
        let frames = [UInt8](repeating: 0x5a, count: 2 * 4120)
        func transaction(_ index: Int) throws {
            let ino = try f.file("t\(index)")
            try f.write(ino, frames, at: 0)
            try f.store.synchronize(ino)
        }
        for index in 0..<400 { try transaction(index) }
        usleep(UInt32(CacheStore.checkpointQuiet * 1.5e6))
        f.store.checkpointIfDue()  // everything copied, quiet: the file stays
        let kept = CacheStore.fileSize(f.path + "-wal")
        #expect(kept > 2 << 20 && kept <= CacheStore.keptLogSize, "log file \(kept) bytes")
        for index in 400..<420 { try transaction(index) }
        #expect(CacheStore.fileSize(f.path + "-wal") == kept, "written over from its start")
        // Past the kept size (one group of 8 MiB after another, no checkpoint between, short
        // of `writerWaitThreshold`, where a writer would checkpoint itself):
        _ = try largestLog(f, megabytes: 24)
        try f.store.synchronize()
        #expect(CacheStore.fileSize(f.path + "-wal") > CacheStore.keptLogSize)
        usleep(UInt32(CacheStore.checkpointQuiet * 1.5e6))
        f.store.checkpointIfDue()
        #expect(CacheStore.fileSize(f.path + "-wal") == CacheStore.keptLogSize, "cut back when quiet")
        usleep(UInt32(CacheStore.checkpointQuiet * 1.5e6))
        f.store.checkpointIfDue()  // the one frame of that cut copied: nothing more to do
        #expect(!f.store.needsCheckpoint)
        #expect(CacheStore.fileSize(f.path + "-wal") == CacheStore.keptLogSize)
    }

    /// A transaction of a database inside (appends, then fsync): the fsync commits the group
    /// it opened, and the thread is not woken for each.
    @Test func anFsyncPerTransactionWakesTheThreadRarely() throws {
        let f = try StoreFixture()
        let ino = try f.file("wal")
        try CommittingThread.running(f.store) {
            usleep(50_000)
            let before = f.store.lock.withLock { f.store.committerWakes }
            for index in 0..<200 {
                try f.write(ino, [UInt8](repeating: UInt8(index % 250), count: 4120), at: Int64(index) * 4120)
                try f.store.synchronize(ino)
            }
            let wakes = f.store.lock.withLock { f.store.committerWakes } - before
            #expect(wakes <= 20, "\(wakes) wakes for 200 transactions")
        }
    }
}
