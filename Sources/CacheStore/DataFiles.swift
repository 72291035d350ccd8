#if canImport(Glibc)
import Glibc
#endif
import Posix

/// The folder beside the database that holds large files' bytes (`DATA_DIR/cache.data/`):
/// one sparse file per large file, named by its data key (`inodes.data`, a random positive
/// number) in decimal, mode 0600. Holes,
/// `fallocate`, `SEEK_DATA`/`SEEK_HOLE`, `copy_file_range` and the blocks a file takes are
/// the host file system's.
///
/// Thread-safety: a value; its calls are plain system calls on the folder.
struct DataFolder: Sendable {
    let path: String

    /// `cache.sqlite` → `cache.data` (any other name gets `.data` added).
    static func path(besides database: String) -> String {
        (database.hasSuffix(".sqlite") ? String(database.dropLast(7)) : database) + ".data"
    }

    func name(_ key: Int64) -> String { path + "/" + String(key) }

    func make() throws(Errno) {
        do throws(Errno) {
            try Syscall.mkdir(path, mode: 0o700)
        } catch where error == .fileExists {
        }
    }

    /// A new data file for `key`, empty (one left by a crash is written over).
    func create(_ key: Int64) throws(Errno) -> DataFile {
        DataFile(key: key, fd: try Syscall.open(name(key), O_RDWR | O_CREAT | O_TRUNC, mode: 0o600))
    }

    /// The data file of `key`. One lost in a crash before it was synced is made again,
    /// empty (said in the log): the file reads as empty, as ext4 shows a file whose data
    /// never reached the disk.
    func open(_ key: Int64) throws(Errno) -> DataFile {
        do throws(Errno) {
            return DataFile(key: key, fd: try Syscall.open(name(key), O_RDWR))
        } catch where error == .noSuchFileOrDirectory {
            Log.error("cache: the data file of inode \(key) is missing from \(path): the file reads as empty")
            return DataFile(key: key, fd: try Syscall.open(name(key), O_RDWR | O_CREAT, mode: 0o600))
        }
    }

    func remove(_ key: Int64) {
        do throws(Errno) {
            try Syscall.unlink(name(key))
        } catch where error == .noSuchFileOrDirectory {
        } catch {
            Log.error("cache: the data file \(name(key)) could not be removed: \(error)")
        }
    }

    /// The keys of the data files present (other names are not the store's and are left).
    func keys() -> [Int64] {
        ((try? Syscall.listDirectory(path)) ?? []).compactMap { name in Int64(name).flatMap { $0 > 0 && String($0) == name ? $0 : nil } }
    }

    /// Makes the folder's names durable (after data files were made in it).
    func sync() throws(Errno) { try AtomicFile.syncDirectory(path) }
}

/// An open data file. Its descriptor closes when the last reference goes: a request that
/// took it from the store keeps it open outside the store's lock, whatever a release
/// meanwhile does.
///
/// Thread-safety: `setID` is the store's, under its lock; `hostPages` has its own locks;
/// the descriptor's calls are the kernel's to order.
final class DataFile: @unchecked Sendable {
    let key: Int64
    let fd: Int32
    /// Whether the file's mode has set-ID bits a write by a caller without CAP_FSETID drops
    /// (kept by the store, under its lock: no row is read for a write).
    var setID = false
    /// What its streams leave in the host's page cache (write-behind, drop-behind).
    let hostPages = HostPages()

    init(key: Int64, fd: Int32) {
        self.key = key
        self.fd = fd
    }

    deinit { Syscall.close(fd) }

    static func nanoseconds(_ time: timespec) -> Int64 { Int64(time.tv_sec) * 1_000_000_000 + Int64(time.tv_nsec) }

    /// The inode as its data file has it: size, blocks, modification time; the change time
    /// is the later of the row's and the data file's (a write changes both times).
    func overlay(_ inode: CacheInode) -> CacheInode {
        guard let st = try? Syscall.fstat(fd) else { return inode }
        return Self.overlay(inode, st)
    }

    static func overlay(_ inode: CacheInode, _ st: stat) -> CacheInode {
        var inode = inode
        inode.size = Int64(st.st_size)
        inode.storedBytes = Int64(st.st_blocks) * 512
        inode.modificationNanoseconds = nanoseconds(st.st_mtim)
        inode.changeNanoseconds = max(inode.changeNanoseconds, nanoseconds(st.st_ctim))
        return inode
    }
}

/// What the store keeps of large files beside their rows (behind the store's lock).
///
/// Thread-safety: a value inside `CacheStore`, behind its lock.
struct DataFileState {
    /// Data files held open: those of the files open (`CacheStore.opens`).
    var files: [Int64: DataFile] = [:]
    /// Files whose bytes moved to a data file that their row does not name yet: its key, and
    /// since when. The row still holds the bytes as they were before, until the data file
    /// is synced (`recordConversions`). A crash before then leaves the row as it was and
    /// the data file unnamed (removed at the next mount): a name never points at a data
    /// file whose bytes were not synced. (Keys, not descriptors: a burst of new large files
    /// holds no descriptor per file.)
    var unrecorded: [Int64: (key: Int64, since: ContinuousClock.Instant)] = [:]
    /// Large files written (or cut, or allocated) since their row last took the size,
    /// blocks and times of their data file: open files (a reader gets those from the data
    /// file itself); their rows catch up at the last close.
    var staleRows: Set<Int64> = []
    /// Large files whose data file was written (or cut, or allocated) since it was last
    /// synced: an fsync of the file syncs it, and the unmount syncs all of them before it
    /// marks the store clean (a clean mark trusts the sizes rows copied from data files).
    var unsynced: Set<Int64> = []
    /// Data files whose rows were deleted, each with the commit that must be durable before
    /// it goes (the row could come back with a crash before that).
    var doomed: [(key: Int64, commit: Int)] = []
    /// A data file was made since the folder was last synced.
    var folderUnsynced = false
}

extension CacheStore {
    /// Conversions stay unrecorded at most this long: then the committing thread syncs
    /// their data files and records them (an fsync or a rename over another file records
    /// one at once).
    static let recordDelay = 5.0

    /// An inode as a reader sees it (lock held): a small file's buffer, a large file's data
    /// file, laid over its row.
    func overlay(_ inode: CacheInode) -> CacheInode {
        if let file = data.files[inode.ino] { return file.overlay(inode) }
        let unrecorded = data.unrecorded[inode.ino]?.key
        if let key = unrecorded ?? (data.staleRows.contains(inode.ino) ? inode.dataKey : nil),
           let st = try? Syscall.stat(folder.name(key)) {
            return DataFile.overlay(inode, st)
        }
        return inline.overlay(inode)
    }

    /// The key of a large file's data file (lock held); nil for a small file.
    func dataKey(_ inode: CacheInode) -> Int64? {
        data.files[inode.ino]?.key ?? data.unrecorded[inode.ino]?.key ?? inode.dataKey
    }

    /// Whether a file's bytes are in a data file (lock held).
    func isExternal(_ inode: CacheInode) -> Bool { dataKey(inode) != nil }

    /// The data file of a large file (lock held), nil for a small one. Held open in `data`
    /// while the file is open; otherwise the caller's reference is the only one.
    func dataFile(_ inode: CacheInode) throws(Errno) -> DataFile? {
        if let file = data.files[inode.ino] { return file }
        guard let key = dataKey(inode) else { return nil }
        let file = try folder.open(key)
        file.setID = SetIDBits.wouldDrop(inode.mode)
        if (opens[inode.ino] ?? 0) > 0 { data.files[inode.ino] = file }
        return file
    }

    /// Whether `key` is a data file in use: open, or moved to and not yet recorded (lock held).
    func keyHeld(_ key: Int64) -> Bool {
        data.files.values.contains { $0.key == key } || data.unrecorded.values.contains { $0.key == key }
    }

    /// A large file was written (lock held): its row is behind, and its data file unsynced.
    /// Called after the bytes went to the data file, so that a sync that takes the file off
    /// `unsynced` before it starts covers every write noted before.
    func noteWritten(_ ino: Int64) {
        data.staleRows.insert(ino)
        data.unsynced.insert(ino)
    }

    /// Blocks that large files hold beyond what their rows say (lock held): files written
    /// since their row was brought up to date, and those whose conversion is unrecorded. The
    /// status and the size limit count them (a few open files: one `fstat` each).
    func unrowedBytes(linkedOnly: Bool) -> Int64 {
        var extra: Int64 = 0
        for ino in data.staleRows.union(data.unrecorded.keys) {
            guard let row = try? storedInode(ino), !linkedOnly || row.links > 0 else { continue }
            extra += storedNow(row) - row.storedBytes
        }
        return extra
    }

    /// The bytes a file stores now (lock held): a large file's data file's blocks (one
    /// `fstat` or `stat`), else its row's count.
    func storedNow(_ inode: CacheInode) -> Int64 {
        if let file = data.files[inode.ino], let st = try? Syscall.fstat(file.fd) { return Int64(st.st_blocks) * 512 }
        if let key = dataKey(inode), let st = try? Syscall.stat(folder.name(key)) { return Int64(st.st_blocks) * 512 }
        return inode.storedBytes
    }

    /// A small file's bytes move to a new data file (lock held): the row's bytes as `base`
    /// has them, then the file's size; the row is recorded later (`recordConversions`).
    /// Nothing in the database changes here, so no rollback can undo it; a failure (a full
    /// disk) removes the new file and leaves the file small.
    func convert(_ ino: Int64, from base: InlineBuffers.File) throws(Errno) -> DataFile {
        let file = try folder.create(newDataKey())
        do throws(Errno) {
            try requireHeadroom(adding: base.bytes.count)
            try Syscall.writeAll(file.fd, base.bytes, at: 0)
            if base.size > Int64(base.bytes.count) { try Syscall.truncate(file.fd, to: base.size) }
            try Syscall.setModificationTime(file.fd, seconds: base.modified / 1_000_000_000, nanoseconds: base.modified % 1_000_000_000)
        } catch {
            folder.remove(file.key)
            throw error
        }
        inline.discard(ino)
        file.setID = base.setID
        if (opens[ino] ?? 0) > 0 { data.files[ino] = file }
        data.unrecorded[ino] = (file.key, .now)
        data.folderUnsynced = true
        noteWritten(ino)
        return file
    }

    /// Records conversions (lock not held): those older than `age` (nil: all; `only`: that
    /// file's alone). Their data files are synced, then the folder, then each row names its
    /// data file and its inline bytes go, in one change — so a crash never leaves a row
    /// naming bytes that were not synced. A sync that fails leaves the conversion to try
    /// again (said in the log).
    func recordConversions(olderThan age: Double?, only: Int64? = nil) {
        let due = lock.withLock { () -> [(ino: Int64, file: DataFile)] in
            data.unrecorded.compactMap { ino, moved in
                guard only == nil || only == ino, age.map({ moved.since.secondsElapsed >= $0 }) ?? true,
                      let file = data.files[ino] ?? (try? folder.open(moved.key)) else { return nil }
                return (ino, file)
            }
        }
        guard !due.isEmpty else { return }
        var synced: [(ino: Int64, file: DataFile)] = []
        for (ino, file) in due {
            do throws(Errno) {
                try Syscall.fdatasync(file.fd)
                synced.append((ino, file))
            } catch {
                Log.error("cache: the data file \(folder.name(file.key)) could not be synced (\(error)); inode \(ino) stays in the database for now")
            }
        }
        let folderSynced = lock.withLock { () -> Bool in
            let was = data.folderUnsynced
            data.folderUnsynced = false
            return was
        }
        if folderSynced {
            do throws(Errno) {
                try folder.sync()
            } catch {
                lock.withLock { data.folderUnsynced = true }
                Log.error("cache: \(folder.path) could not be synced (\(error)); its new files stay unrecorded for now")
                return
            }
        }
        _ = try? withLock { () throws(Errno) in
            for (ino, file) in synced where data.unrecorded[ino]?.key == file.key {
                do throws(Errno) {
                    try change { () throws(Errno) in
                        let st = try Syscall.fstat(file.fd)
                        try run("UPDATE inodes SET data = ?, size = ?, stored = ?, mtime = ?, ctime = max(ctime, ?) WHERE ino = ?",
                                file.key, Int64(st.st_size), Int64(st.st_blocks) * 512, DataFile.nanoseconds(st.st_mtim),
                                DataFile.nanoseconds(st.st_ctim), ino)
                        try run("DELETE FROM contents WHERE ino = ?", ino)
                        data.unrecorded[ino] = nil
                        if (opens[ino] ?? 0) == 0 { data.staleRows.remove(ino) }
                    }
                } catch {
                    Log.error("cache: the data file of inode \(ino) could not be recorded: \(error)")
                }
            }
        }
    }

    /// The data files written since they were last synced (lock held), taken off the list:
    /// opened without being made again when missing (a row whose file is gone stays so).
    func takeUnsyncedDataFiles() -> [DataFile] {
        defer { data.unsynced.removeAll() }
        return data.unsynced.compactMap { ino in
            if let file = data.files[ino] { return file }
            guard let row = try? storedInode(ino), let key = dataKey(row),
                  let fd = try? Syscall.open(folder.name(key), O_RDONLY | O_CLOEXEC) else { return nil }
            return DataFile(key: key, fd: fd)
        }
    }

    /// The rows of `inos` (large files) take their data files' size, blocks and times (lock
    /// held, inside a change). Not a change of the tree: the data files have it already.
    func refreshRows(_ inos: [Int64]) throws(Errno) {
        for ino in inos {
            defer { data.staleRows.remove(ino) }
            guard data.unrecorded[ino] == nil else { continue }  // (recorded with its own size)
            let st: stat
            if let file = data.files[ino] {
                st = try Syscall.fstat(file.fd)
            } else {
                guard let row = try? storedInode(ino), let key = dataKey(row), let found = try? Syscall.stat(folder.name(key)) else { continue }
                st = found
            }
            try run("UPDATE inodes SET size = ?, stored = ?, mtime = ?, ctime = max(ctime, ?) WHERE ino = ? AND data IS NOT NULL",
                    Int64(st.st_size), Int64(st.st_blocks) * 512, DataFile.nanoseconds(st.st_mtim), DataFile.nanoseconds(st.st_ctim), ino)
        }
    }

    /// A large file's row is deleted (lock held, inside a change): its data file goes once
    /// that deletion is durable (`takeRemovableDataFiles`).
    func forgetDataFile(_ inode: CacheInode) {
        data.files[inode.ino] = nil
        data.staleRows.remove(inode.ino)
        data.unsynced.remove(inode.ino)
        if let key = data.unrecorded.removeValue(forKey: inode.ino)?.key ?? inode.dataKey {
            data.doomed.append((key, commits + 1))
            backgroundWork?()
        }
    }

    /// A data key no file has: random (a new one for every move out, so that a data file
    /// waiting for removal never shares its name with a newer one).
    func newDataKey() -> Int64 {
        while true {
            let key = Int64.random(in: 1...Int64.max)
            if (try? keyInUse(key)) == false && !keyHeld(key) { return key }
        }
    }

    /// Whether a row names data file `key` (lock held).
    func keyInUse(_ key: Int64) throws(Errno) -> Bool {
        let statement = try statement("SELECT 1 FROM inodes WHERE data = ?")
        statement.bind(key)
        defer { statement.done() }
        return try row(statement)
    }

    /// The data files whose deletion is durable now (lock held), taken off the list: the
    /// caller removes them after letting the lock go. One whose row came back (a group
    /// rolled back after the deletion) stays.
    func takeRemovableDataFiles() -> [Int64] {
        guard data.doomed.contains(where: { $0.commit <= durableCommits }) else { return [] }
        let durable = durableCommits
        let due = data.doomed.filter { $0.commit <= durable }.map(\.key)
        data.doomed.removeAll { $0.commit <= durable }
        return due.filter { key in !keyHeld(key) && (try? keyInUse(key)) == false }
    }
}
