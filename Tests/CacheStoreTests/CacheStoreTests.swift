@testable import CacheStore
import Foundation
import Posix
import Testing
#if canImport(Glibc)
import Glibc
#endif

/// The cache store without a mount: the errno rules, group commit, the orphans and the
/// totals, each against a real SQLite database (and data folder) in /tmp.
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


extension StoreFixture {
    /// What a kill -9 of the daemon leaves on disk, now: a copy of the database, its log and
    /// the data folder (without SQLite's shared memory, which the next open rebuilds), in a
    /// directory of its own.
    func crashCopy() throws -> String {
        let copy = directory + "/crashed-\(UUID().uuidString)"
        try FileManager.default.createDirectory(atPath: copy, withIntermediateDirectories: false)
        for suffix in ["", "-wal"] where FileManager.default.fileExists(atPath: path + suffix) {
            try FileManager.default.copyItem(atPath: path + suffix, toPath: copy + "/cache.sqlite" + suffix)
        }
        if FileManager.default.fileExists(atPath: dataFolder) {
            try FileManager.default.copyItem(atPath: dataFolder, toPath: copy + "/cache.data")
        }
        return copy + "/cache.sqlite"
    }

    /// The folder of large files' data files.
    var dataFolder: String { directory + "/cache.data" }
    /// The data files present, by name.
    var dataFiles: [String] { ((try? FileManager.default.contentsOfDirectory(atPath: dataFolder)) ?? []).sorted() }
}

func read(_ store: CacheStore, _ ino: Int64, _ offset: Int64, _ count: Int) throws -> [UInt8] {
    var bytes: [UInt8] = []
    try store.read(ino, offset: offset, size: count) { bytes = Array($0) }
    return bytes
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
        // Both large: their rows name their data files once synced.
        try s.synchronize(a)
        try s.synchronize(b)
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
        let aStored = Int64(try f.query("SELECT stored FROM inodes WHERE ino = \(a)") ?? "") ?? -1
        #expect(s.linkedBytes == s.usage().bytes - aStored)
        s.released(a)
        try s.synchronize()
        #expect(s.usage() == (try counted(f)))
        try s.close()
        try CacheStore.check(path: f.path) { _ in }
        // A large file's row holds what its data file takes on the host once it is closed.
        let key = try f.query("SELECT data FROM inodes WHERE ino = \(b)") ?? ""
        let onHost = Int64(try Syscall.stat(f.dataFolder + "/" + key).st_blocks) * 512
        #expect(try f.query("SELECT stored FROM inodes WHERE ino = \(b)") == "\(onHost)")
        #expect(s.usage().bytes == onHost, "the one file left")
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
        #expect(said.contains { $0.contains("schema version 3") } && said.contains { $0.contains("schema version 5") }, "\(said)")
        #expect(upgraded.usage() == (1, 5000))
        try upgraded.close()
        try CacheStore.check(path: f.path) { _ in }
        #expect(try f.query("PRAGMA user_version") == "5")
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
