@testable import CacheStore
import Foundation
import Posix
import Testing
#if canImport(Glibc)
import Glibc
#endif

extension StoreFixture {
    /// What a kill -9 of the daemon leaves on disk, now: a copy of the database, its log and
    /// the fsync journal (without SQLite's shared memory, which the next open rebuilds), in
    /// a directory of its own; without the journal when `journal` is false.
    func crashCopy(journal: Bool = true) throws -> String {
        let copy = directory + "/crashed-\(UUID().uuidString)"
        try FileManager.default.createDirectory(atPath: copy, withIntermediateDirectories: false)
        for suffix in ["", "-wal"] + (journal ? ["-fsync"] : []) where FileManager.default.fileExists(atPath: path + suffix) {
            try FileManager.default.copyItem(atPath: path + suffix, toPath: copy + "/cache.sqlite" + suffix)
        }
        return copy + "/cache.sqlite"
    }

    var journalIsEmpty: Bool { store.lock.withLock { store.journal.isEmpty } }

    /// A new file, after the open's first fsync (which goes the long way): the next fsyncs
    /// of a few writes go the short one.
    func fileAfterTheFirstFsync(_ name: String) throws -> Int64 {
        let ino = try file(name)
        try store.synchronize()
        return ino
    }
}

func read(_ store: CacheStore, _ ino: Int64, _ offset: Int64, _ count: Int) throws -> [UInt8] {
    var bytes: [UInt8] = []
    try store.read(ino, offset: offset, size: count) { bytes = Array($0) }
    return bytes
}

@Suite struct SyncJournalTests {
    /// An fsync with little written since everything was durable appends the writes to the
    /// journal and syncs it alone; after a crash the next open writes them again, with the
    /// file's size and time — and without the journal they would be gone.
    @Test func fsyncedWritesGoToTheJournalAndComeBackAfterACrash() throws {
        let f = try StoreFixture()
        let ino = try f.file("inner.db-wal")
        try f.write(ino, [UInt8](repeating: 1, count: 4096), at: 0)
        try f.store.synchronize()  // the first of an open goes the long way
        #expect(f.journalIsEmpty)
        try f.write(ino, [UInt8](repeating: 2, count: 4096), at: 4096)
        try f.write(ino, [UInt8](repeating: 3, count: 100), at: 10)
        try f.store.synchronize()
        #expect(!f.journalIsEmpty, "the short way")
        try f.write(ino, [UInt8](repeating: 4, count: 24), at: 8192)
        try f.store.synchronize()
        #expect(try f.query("SELECT size FROM inodes WHERE ino = \(ino)") == "4096", "not in the database yet")
        let modified = try f.store.inode(ino).modificationNanoseconds
        let expected = [UInt8](repeating: 1, count: 10) + [UInt8](repeating: 3, count: 100) + [UInt8](repeating: 1, count: 4096 - 110)
            + [UInt8](repeating: 2, count: 4096) + [UInt8](repeating: 4, count: 24)
        let crashed = try f.crashCopy()
        let crashedWithoutJournal = try f.crashCopy(journal: false)
        #expect(try CacheStore.check(path: crashed, progress: { _ in })?.contains("3 fsynced writes wait") == true)
        // A read of the file stores its buffers (a transaction: the journal drains first).
        #expect(try f.read(ino, 0, 9000) == expected)
        #expect(f.journalIsEmpty)
        do {
            let after = try CacheStore(path: crashed, owner: (0, 0))
            #expect(after.lock.withLock { after.journal.isEmpty })
            #expect(after.lock.withLock { after.journalDrains } == 1)
            #expect(try after.inode(ino).size == 8216)
            #expect(try after.inode(ino).modificationNanoseconds == modified)
            #expect(try read(after, ino, 0, 9000) == expected)
            #expect(try SQLiteDatabase(path: crashed, readOnly: true).scalarText("SELECT size FROM inodes WHERE ino = \(ino)") == "8216",
                    "stored and marked at open")
            try after.close()
            #expect(CacheStore.fileSize(crashed + "-fsync") == Int64(SyncJournal.capacity), "kept, to be written over")
        }
        #expect(try CacheStore.check(path: crashed, progress: { _ in }) == nil, "nothing waits once stored")
        // Opened again: nothing is written twice (the records are marked as stored).
        let again = try CacheStore(path: crashed, owner: (0, 0))
        #expect(again.lock.withLock { again.journalDrains } == 0)
        #expect(try read(again, ino, 0, 9000) == expected)

        let withoutJournal = try CacheStore(path: crashedWithoutJournal, owner: (0, 0))
        #expect(try withoutJournal.inode(ino).size == 4096, "what the journal carried")
    }

    /// The first transaction after short fsyncs stores every buffer and marks the records
    /// first (one drain); records written over later, or left from before, are never
    /// written again over newer data.
    @Test func aDrainStoresTheBuffersAndMarksTheRecords() throws {
        let f = try StoreFixture()
        let ino = try f.fileAfterTheFirstFsync("f")
        try f.write(ino, [UInt8](repeating: 2, count: 4096), at: 0)
        try f.store.synchronize()
        #expect(!f.journalIsEmpty)
        try f.file("g")  // a transaction: the journal drains first
        #expect(f.journalIsEmpty)
        #expect(f.store.lock.withLock { f.store.journalDrains } == 1)
        #expect(try f.query("SELECT value FROM state WHERE name = 'synced'") == "1")
        #expect(try f.query("SELECT size FROM inodes WHERE ino = \(ino)") == "4096")
        // Newer data the long way (a row changed since the last sync), then a crash: the
        // old record at the journal's start (numbered 1, marked) must not come back.
        try f.write(ino, [UInt8](repeating: 3, count: 4096), at: 0)
        try f.store.synchronize()
        #expect(f.journalIsEmpty, "the long way: a row changed since the last sync")
        let after = try CacheStore(path: try f.crashCopy(), owner: (0, 0))
        #expect(try read(after, ino, 0, 4096) == [UInt8](repeating: 3, count: 4096))
        #expect(after.lock.withLock { after.journalDrains } == 0)
        // Numbering goes on after the mark: a short fsync of the reopened store writes 2.
        try after.synchronize()
        _ = try [UInt8](repeating: 5, count: 10).withUnsafeBytes { (b) throws(Errno) in try after.write(ino, offset: 0, data: b, append: false) }
        try after.synchronize()
        #expect(after.lock.withLock { after.journal.lastSequence } == 2)
    }

    /// A record not wholly written (a crash inside the journal's write: that fsync never
    /// returned) ends the journal: the records before it come back, it does not.
    @Test func aTornRecordEndsTheJournal() throws {
        let f = try StoreFixture()
        let ino = try f.fileAfterTheFirstFsync("f")
        try f.write(ino, [UInt8](repeating: 7, count: 1000), at: 0)
        try f.store.synchronize()
        try f.write(ino, [UInt8](repeating: 8, count: 1000), at: 1000)
        try f.store.synchronize()
        let end = f.store.lock.withLock { f.store.journal.end }
        #expect(end == 2 * (SyncJournal.headerSize + 1000))
        let crashed = try f.crashCopy()
        let fd = open(crashed + "-fsync", O_WRONLY)
        var byte: UInt8 = 9
        #expect(pwrite(fd, &byte, 1, off_t(end - 1)) == 1)
        close(fd)
        let after = try CacheStore(path: crashed, owner: (0, 0))
        #expect(try after.inode(ino).size == 1000)
        #expect(try read(after, ino, 0, 2000) == [UInt8](repeating: 7, count: 1000))
    }

    /// Writes that outgrow the journal go the long way; so does everything after a row
    /// changed and before the next long sync.
    @Test func writesThatOutgrowTheJournalGoTheLongWay() throws {
        let f = try StoreFixture()
        let ino = try f.fileAfterTheFirstFsync("f")
        let piece = [UInt8](repeating: 6, count: 4096)
        // Every other 4 KiB: no chunk made whole, 5 MiB buffered.
        for index in 0..<1280 { try f.write(ino, piece, at: Int64(index) * 8192) }
        try f.store.synchronize()
        #expect(f.journalIsEmpty)
        #expect(try f.query("SELECT size FROM inodes WHERE ino = \(ino)") == "\(1279 * 8192 + 4096)")
        // Short again after that sync; a chmod (a row) makes the next one long.
        try f.write(ino, piece, at: 4096)
        try f.store.synchronize()
        #expect(!f.journalIsEmpty)
        _ = try f.store.setAttributes(ino, CacheAttributeChanges(mode: 0o600))
        #expect(f.journalIsEmpty, "drained before the chmod's transaction")
        try f.write(ino, piece, at: 12288)
        try f.store.synchronize()
        #expect(f.journalIsEmpty)
        let after = try CacheStore(path: try f.crashCopy(), owner: (0, 0))
        #expect(try read(after, ino, 0, 16384) == [UInt8](repeating: 6, count: 16384))
    }

    /// A chunk made whole by appends waits in its buffer while fsyncs go the short way
    /// (storing it would drain the journal: an fdatasync inside a write); once the writes
    /// outgrow the journal, chunks made whole are stored at once again.
    @Test func aChunkMadeWholeWaitsWhileFsyncsGoTheShortWay() throws {
        let f = try StoreFixture()
        let ino = try f.fileAfterTheFirstFsync("inner.db-wal")
        for index in 0..<16 {
            try f.write(ino, [UInt8](repeating: UInt8(index), count: 4096), at: Int64(index) * 4096)
            try f.store.synchronize()
        }
        #expect(f.store.lock.withLock { f.store.journalDrains } == 0)
        #expect(!f.journalIsEmpty)
        #expect(try f.query("SELECT count(*) FROM chunks") == "0")
        // Written again after a crash, the records make the chunk whole (stored in a group
        // of its own) before the drain.
        let after = try CacheStore(path: try f.crashCopy(), owner: (0, 0))
        #expect(try read(after, ino, 0, 65536) == (0..<16).flatMap { [UInt8](repeating: UInt8($0), count: 4096) })
        for index in 16..<1200 { try f.write(ino, [UInt8](repeating: 1, count: 4096), at: Int64(index) * 4096) }
        #expect(f.store.lock.withLock { f.store.journalDrains } == 1)
        #expect(try Int(f.query("SELECT count(*) FROM chunks") ?? "") ?? 0 >= 60)
        #expect(try f.read(ino, 15 * 4096, 2) == [15, 15])
    }

    /// A journal that cannot be written (here a directory in its place) leaves fsync the long
    /// way for the rest of the open: every fsync still succeeds and stores.
    @Test func aJournalThatCannotBeWrittenLeavesTheLongWay() throws {
        let f = try StoreFixture()
        try FileManager.default.createDirectory(atPath: f.path + "-fsync", withIntermediateDirectories: false)
        let ino = try f.file("f")
        try f.store.synchronize()
        for index in 0..<3 {
            try f.write(ino, [UInt8(index)], at: Int64(index))
            try f.store.synchronize()
            #expect(f.journalIsEmpty)
            #expect(try f.query("SELECT size FROM inodes WHERE ino = \(ino)") == "\(index + 1)")
        }
        #expect(!f.store.lock.withLock { f.store.shortFsyncs })
    }

    /// Decoding: records numbered one after another from one after the mark, each whole
    /// under the database's seed; anything else ends it.
    @Test func decodingStopsAtTheFirstRecordThatDoesNotFollow() {
        let entry = { (ino: Int64) in SyncJournal.Entry(ino: ino, offset: 0, bytes: [1, 2, 3], size: 3, modified: 5) }
        var records: [UInt8] = []
        SyncJournal.encode(entry(1), sequence: 5, seed: 77, into: &records)
        SyncJournal.encode(entry(2), sequence: 6, seed: 77, into: &records)
        SyncJournal.encode(entry(3), sequence: 4, seed: 77, into: &records)  // an older generation's
        let decoded = records.withUnsafeBytes { SyncJournal.decode($0, after: 4, seed: 77) }
        #expect(decoded.entries.map(\.sequence) == [5, 6])
        #expect(decoded.entries.map(\.entry) == [entry(1), entry(2)])
        #expect(decoded.end == 2 * (SyncJournal.headerSize + 3))
        #expect(records.withUnsafeBytes { SyncJournal.decode($0, after: 5, seed: 77) }.entries.isEmpty, "marked: the generation is stored")
        #expect(records.withUnsafeBytes { SyncJournal.decode($0, after: 3, seed: 77) }.entries.isEmpty,
                "a mark older than the journal (a database restored from a backup)")
        #expect(records.withUnsafeBytes { SyncJournal.decode($0, after: 4, seed: 78) }.entries.isEmpty, "another database's records")
        var gap: [UInt8] = []
        SyncJournal.encode(entry(1), sequence: 1, seed: 77, into: &gap)
        SyncJournal.encode(entry(2), sequence: 3, seed: 77, into: &gap)
        #expect(gap.withUnsafeBytes { SyncJournal.decode($0, after: 0, seed: 77) }.entries.map(\.sequence) == [1])
        #expect([UInt8](repeating: 0, count: 4096).withUnsafeBytes { SyncJournal.decode($0, after: 0, seed: 77) }.end == 0)
    }

    /// The journal is bound to its database: beside a copy of it from before (a backup put
    /// back) or beside another database, its records are not written into their inodes.
    @Test func aJournalBesideAnOlderOrAnotherDatabaseIsNotReplayed() throws {
        let f = try StoreFixture()
        let ino = try f.fileAfterTheFirstFsync("inner.db")
        try f.write(ino, [UInt8](repeating: 1, count: 4096), at: 0)
        try f.store.synchronize()
        #expect(!f.journalIsEmpty)
        _ = try f.read(ino, 0, 4096)  // stored and marked: the next fsyncs start a new generation
        try f.store.synchronize()
        let backup = try f.crashCopy(journal: false)
        for round in 0..<3 {
            try f.write(ino, [UInt8](repeating: 2, count: 4096), at: Int64(4096 * (round + 1)))
            try f.store.synchronize()
            if round < 2 { _ = try f.read(ino, 0, 1) }
        }
        #expect(!f.journalIsEmpty, "the last generation waits in the journal")
        // The backup put back beside the journal: its mark is older than the journal's records.
        let restored = URL(fileURLWithPath: backup).deletingLastPathComponent().path
        try FileManager.default.copyItem(atPath: f.path + "-fsync", toPath: restored + "/cache.sqlite-fsync")
        #expect(try CacheStore.check(path: backup, progress: { _ in }) == nil, "no records wait for this database")
        let older = try CacheStore(path: backup, owner: (0, 0))
        #expect(older.lock.withLock { older.journalDrains } == 0)
        #expect(try older.inode(ino).size == 4096)
        #expect(try read(older, ino, 0, 4096) == [UInt8](repeating: 1, count: 4096))
        try older.close()
        // Another database with the same inode numbers, its first generation beside the
        // journal of this one's first.
        let g = try StoreFixture()
        let other = try g.fileAfterTheFirstFsync("inner.db")
        #expect(other == ino)
        let first = try StoreFixture()
        let theirs = try first.fileAfterTheFirstFsync("inner.db")
        try first.write(theirs, [UInt8](repeating: 9, count: 100), at: 0)
        try first.store.synchronize()
        #expect(!first.journalIsEmpty)
        try g.store.close()
        let copy = try g.crashCopy(journal: false)
        try FileManager.default.copyItem(atPath: first.path + "-fsync", toPath: copy + "-fsync")
        let reopened = try CacheStore(path: copy, owner: (0, 0))
        #expect(reopened.lock.withLock { reopened.journalDrains } == 0)
        #expect(try reopened.inode(other).size == 0)
    }
}
