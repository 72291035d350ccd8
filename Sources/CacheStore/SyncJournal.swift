#if canImport(Glibc)
import Glibc
#endif
import Posix

/// The short way of an fsync: the writes buffered since everything was last durable in the
/// database, appended as records to a file of their own (`cache.sqlite-fsync`) and that
/// file synced — one `pwrite` and one `fdatasync` — instead of storing them into their
/// chunk rows, committing and syncing the write-ahead log (measured: 55–70 µs of SQLite
/// work and 30–37 µs of log frames before the sync, for a database inside committing one
/// row). The buffers stay; they reach the database as before (`dirtyDelay`, a read, a
/// close), and the change that opens the next transaction first stores every buffer,
/// marks the journal's records as stored and syncs (`CacheStore.drainJournal`).
///
/// Invariant: the journal holds records only while the database has committed nothing
/// since it was last synced (the first transaction after records drains them first). So
/// after a crash the records apply to exactly the state they were written against: at
/// open, those after the stored mark (`state` row `synced`) are written again, in order,
/// and drained (`CacheStore.recoverJournal`). Records are numbered without end across
/// generations: after a drain the file is written over from its start, and the first
/// record that is not whole (its checksum), or not numbered one after the previous one (the
/// first: one after the mark), ends the journal.
///
/// Bound to its database: the checksum is seeded with the database's identity (`state` row
/// `journal_id`, random, made at its first open by this version; databases made before
/// it read a journal left by the version before with seed 0, then get one), so records
/// beside another database fail their checksum; and a database restored from a backup,
/// whose mark is older than the journal's records, finds a first record that is not one
/// after its mark. Either way nothing is replayed into the wrong inodes.
///
/// Format (`docs/cache-schema.md`): records one after another from offset 0, each a
/// 56-byte header — magic `MMSJ`, data length (UInt32), sequence number, inode, offset,
/// the file's size and modification time after the write (Int64s), checksum (UInt64), all
/// little-endian — then the data. The file is made `capacity` bytes of zeros once and
/// kept, also across mounts (written over in place: a sync of data only, no size to
/// journal; made at each mount, the first short fsync of every mount would wait for
/// 4 MiB of zeros to be written and synced).
///
/// Thread-safety: none; it lives inside `CacheStore`, behind its lock.
struct SyncJournal {
    /// One write as it was buffered.
    struct Entry: Equatable {
        var ino: Int64
        var offset: Int64
        var bytes: [UInt8]
        /// The file's size and modification time after the write.
        var size: Int64
        var modified: Int64
    }

    /// What the journal holds at most, and what the writes of one fsync may take in it (more
    /// goes the long way, into the database).
    static let capacity = 4 << 20
    static let headerSize = 56
    static let magic: UInt32 = 0x4A53_4D4D  // "MMSJ" in the file

    let path: String
    /// The database's identity (see above): every record's checksum starts from it.
    var seed: UInt64 = 0
    /// Open once the journal was first used.
    var descriptor: Int32?
    /// Bytes of records since the journal was last drained (0: empty).
    var end = 0
    /// The last record's number (written, recovered, or marked as stored).
    var lastSequence: Int64 = 0
    /// The writes buffered since everything was last durable in the database, in order; nil
    /// once they outgrew the journal (until the next long fsync).
    private(set) var pending: [Entry]? = []
    private(set) var pendingBytes = 0

    init(path: String) { self.path = path }

    var isEmpty: Bool { end == 0 }
    /// Whether writes are still noted (they have not outgrown the journal).
    var isTaking: Bool { pending != nil }

    /// A write just buffered.
    mutating func note(_ ino: Int64, offset: Int64, _ data: UnsafeRawBufferPointer, size: Int64, modified: Int64) {
        guard pending != nil else { return }
        let cost = Self.headerSize + data.count
        guard pendingBytes + cost <= Self.capacity else { return giveUp() }
        pending?.append(Entry(ino: ino, offset: offset, bytes: Array(data), size: size, modified: modified))
        pendingBytes += cost
    }

    /// The writes noted so far cannot go the short way (they outgrew it, or could not be
    /// written): the next fsync takes the long one.
    mutating func giveUp() { (pending, pendingBytes) = (nil, 0) }

    /// Everything buffered was stored in the database (the long way): nothing is pending.
    mutating func startOver() { (pending, pendingBytes) = ([], 0) }

    /// Whether the writes noted fit in the journal after its records.
    var canTakePending: Bool {
        guard let pending, !pending.isEmpty else { return false }
        return end + pendingBytes <= Self.capacity
    }

    /// Appends the pending writes as records (not synced: the caller syncs the returned
    /// descriptor, after letting the store's lock go). On failure nothing counts as
    /// written, and the pending writes go the long way.
    mutating func appendPending() throws(Errno) -> Int32 {
        guard let entries = pending else { throw .invalidArgument }
        do throws(Errno) {
            let fd = try openFile()
            var records: [UInt8] = []
            records.reserveCapacity(pendingBytes)
            var sequence = lastSequence
            for entry in entries {
                sequence += 1
                Self.encode(entry, sequence: sequence, seed: seed, into: &records)
            }
            try Syscall.writeAll(fd, records, at: end)
            end += records.count
            lastSequence = sequence
            startOver()
            return fd
        } catch {
            giveUp()
            throw error
        }
    }

    /// The file, made `capacity` bytes of zeros the first time (later syncs write over
    /// blocks it has: no size change for the file system to journal). A file made here is
    /// synced with its directory before its first record: an fdatasync of a record would
    /// not make the new file's name durable.
    mutating func openFile() throws(Errno) -> Int32 {
        if let descriptor { return descriptor }
        let existed = (try? Syscall.lstat(path)) != nil
        let fd = try Syscall.open(path, O_RDWR | O_CREAT | O_CLOEXEC, mode: 0o600)
        var st = Glibc.stat()
        if fstat(fd, &st) != 0 || st.st_size < Self.capacity || !existed {
            do throws(Errno) {
                try Syscall.writeAll(fd, [UInt8](repeating: 0, count: Self.capacity), at: 0)
                try Syscall.fsync(fd)
                if let slash = path.lastIndex(of: "/") {
                    try AtomicFile.syncDirectory(String(path[..<slash]).isEmpty ? "/" : String(path[..<slash]))
                }
            } catch {
                Syscall.close(fd)
                throw error
            }
        }
        descriptor = fd
        return fd
    }

    /// Closes the file (everything in it is stored and durable).
    mutating func close() {
        if let descriptor { Syscall.close(descriptor) }
        descriptor = nil
        end = 0
    }

    // MARK: Records

    static func encode(_ entry: Entry, sequence: Int64, seed: UInt64, into records: inout [UInt8]) {
        let start = records.count
        records.append(contentsOf: repeatElement(0, count: headerSize))
        records.append(contentsOf: entry.bytes)
        records.withUnsafeMutableBytes { all in
            let header = UnsafeMutableRawBufferPointer(rebasing: all[start..<(start + headerSize)])
            header.storeBytes(of: magic.littleEndian, toByteOffset: 0, as: UInt32.self)
            header.storeBytes(of: UInt32(entry.bytes.count).littleEndian, toByteOffset: 4, as: UInt32.self)
            for (index, value) in [sequence, entry.ino, entry.offset, entry.size, entry.modified].enumerated() {
                header.storeBytes(of: value.littleEndian, toByteOffset: 8 + 8 * index, as: Int64.self)
            }
            let data = UnsafeRawBufferPointer(rebasing: all[(start + headerSize)..<(start + headerSize + entry.bytes.count)])
            let sum = checksum(UnsafeRawBufferPointer(rebasing: header[0..<48]), data, seed: seed)
            header.storeBytes(of: sum.littleEndian, toByteOffset: 48, as: UInt64.self)
        }
    }

    /// The records of the journal's last generation: from offset 0, numbered from one
    /// after `mark` on, in order, up to the first that is not whole (under `seed`) or not
    /// numbered one after the one before; and where they end.
    static func decode(_ file: UnsafeRawBufferPointer, after mark: Int64,
                       seed: UInt64) -> (entries: [(sequence: Int64, entry: Entry)], end: Int) {
        var entries: [(sequence: Int64, entry: Entry)] = []
        var offset = 0
        var previous = mark
        while offset + headerSize <= file.count {
            let header = UnsafeRawBufferPointer(rebasing: file[offset..<(offset + headerSize)])
            guard UInt32(littleEndian: header.loadUnaligned(fromByteOffset: 0, as: UInt32.self)) == magic else { break }
            let length = Int(UInt32(littleEndian: header.loadUnaligned(fromByteOffset: 4, as: UInt32.self)))
            guard length <= file.count - offset - headerSize else { break }
            let field = { (index: Int) in Int64(littleEndian: header.loadUnaligned(fromByteOffset: 8 + 8 * index, as: Int64.self)) }
            let data = UnsafeRawBufferPointer(rebasing: file[(offset + headerSize)..<(offset + headerSize + length)])
            let sum = UInt64(littleEndian: header.loadUnaligned(fromByteOffset: 48, as: UInt64.self))
            guard sum == checksum(UnsafeRawBufferPointer(rebasing: header[0..<48]), data, seed: seed) else { break }
            let sequence = field(0)
            guard sequence == previous &+ 1 else { break }
            let entry = Entry(ino: field(1), offset: field(2), bytes: Array(data), size: field(3), modified: field(4))
            guard entry.offset >= 0, entry.size >= entry.offset + Int64(length) else { break }
            entries.append((sequence, entry))
            previous = sequence
            offset += headerSize + length
        }
        return (entries, offset)
    }

    /// The number of the last record stored in the database (`state.synced`; 0: none yet).
    static func storedMark(in database: SQLiteDatabase) throws(SQLiteError) -> Int64 {
        try database.scalarText("SELECT value FROM state WHERE name = 'synced'").flatMap { Int64($0) } ?? 0
    }

    /// The database's identity (`state.journal_id`), nil for a database without one yet.
    static func storedIdentity(in database: SQLiteDatabase) throws(SQLiteError) -> UInt64? {
        try database.scalarText("SELECT value FROM state WHERE name = 'journal_id'").flatMap { Int64($0) }.map { UInt64(bitPattern: $0) }
    }

    /// Reads the journal at `path` (nothing if there is none) and decodes it (`decode`).
    static func read(path: String, after mark: Int64, seed: UInt64) throws(Errno) -> (entries: [(sequence: Int64, entry: Entry)], end: Int) {
        let fd: Int32
        do throws(Errno) {
            fd = try Syscall.open(path, O_RDONLY | O_CLOEXEC)
        } catch {
            if error == .noSuchFileOrDirectory { return ([], 0) }
            throw error
        }
        defer { Syscall.close(fd) }
        let bytes = try Syscall.readAll(fd)
        return bytes.withUnsafeBytes { decode($0, after: mark, seed: seed) }
    }

    /// A checksum that finds a record not wholly written, or written for another database
    /// (`seed`; not an adversary's change): four lanes of multiply–rotate over 64-bit
    /// words, about a byte a cycle.
    static func checksum(_ first: UnsafeRawBufferPointer, _ second: UnsafeRawBufferPointer, seed: UInt64) -> UInt64 {
        var lanes: (UInt64, UInt64, UInt64, UInt64) = (0x9E37_79B9_7F4A_7C15, 0xC2B2_AE3D_27D4_EB4F, 0x1656_67B1_9E37_79F9, 0x27D4_EB2F_1656_67C5)
        @inline(__always) func mix(_ lane: UInt64, _ word: UInt64) -> UInt64 {
            let m = lane ^ (word &* 0x87C3_7B91_1142_53D5)
            return ((m << 31) | (m >> 33)) &* 0x4CF5_AD43_2745_937F
        }
        var total: UInt64 = seed
        for part in [first, second] {
            let count = part.count
            var i = 0
            while i + 32 <= count {
                lanes.0 = mix(lanes.0, part.loadUnaligned(fromByteOffset: i, as: UInt64.self))
                lanes.1 = mix(lanes.1, part.loadUnaligned(fromByteOffset: i + 8, as: UInt64.self))
                lanes.2 = mix(lanes.2, part.loadUnaligned(fromByteOffset: i + 16, as: UInt64.self))
                lanes.3 = mix(lanes.3, part.loadUnaligned(fromByteOffset: i + 24, as: UInt64.self))
                i += 32
            }
            while i + 8 <= count {
                lanes.0 = mix(lanes.0, part.loadUnaligned(fromByteOffset: i, as: UInt64.self))
                i += 8
            }
            var tail: UInt64 = UInt64(count - i) << 56
            for (shift, byte) in part[i..<count].enumerated() { tail |= UInt64(byte) << (8 * UInt64(shift)) }
            lanes.1 = mix(lanes.1, tail)
            total &+= UInt64(count)
        }
        var h = mix(mix(mix(mix(total, lanes.0), lanes.1), lanes.2), lanes.3)
        h ^= h >> 29
        h = h &* 0xBF58_476D_1CE4_E5B9
        return h ^ (h >> 32)
    }
}

extension CacheStore {
    /// Stores every buffer and marks the journal's records as stored, so that a
    /// transaction may follow (lock held). No sync here, under the lock: the journal keeps
    /// the records until they are overwritten, and they are overwritten only by a short
    /// fsync, which waits for everything committed to be synced (`everythingSynced`: this
    /// commit makes the next fsync go the long way, whose sync of the log runs with the lock
    /// let go and covers this commit). A crash before then loses this commit and finds the
    /// records whole, after the old mark: they are written again at open. A failure changes
    /// nothing: the buffers stay, the journal too, and the caller's change fails. A group is
    /// open here only while records are written again at open (a chunk they made whole was
    /// stored): it is committed first.
    func drainJournal() throws(Errno) {
        guard !journal.isEmpty else { return }
        try commitBatch()
        let saved = dirty
        try run("BEGIN IMMEDIATE")
        do throws(Errno) {
            try flushAllDirty()
            try run("INSERT OR REPLACE INTO state(name, value) VALUES('synced', ?)", journal.lastSequence)
            try run("COMMIT")
        } catch {
            dirty = saved
            if database.isInTransaction { try? exec("ROLLBACK") }
            throw error
        }
        uncheckpointed = true
        lastCommit = .now
        journal.end = 0
        journal.startOver()
        journalDrains += 1
    }

    /// At open: the writes of fsyncs whose records were not yet stored when the daemon
    /// stopped (a crash, a power cut) are written again, in order, and drained.
    /// They are stored whatever the free space (they were fsynced: the room was there),
    /// and the database gets its identity here if it has none (`SyncJournal`).
    func recoverJournal(progress: (String) -> Void) throws(Errno) {
        let mark: Int64, identity: UInt64?
        do throws(SQLiteError) {
            mark = try SyncJournal.storedMark(in: database)
            identity = try SyncJournal.storedIdentity(in: database)
        } catch {
            throw Self.errno(error)
        }
        journal.seed = identity ?? 0
        let (entries, end) = try SyncJournal.read(path: journal.path, after: mark, seed: journal.seed)
        journal.lastSequence = max(mark, entries.last?.sequence ?? mark)
        guard !entries.isEmpty else { return bindJournal(identity) }
        replaying = true
        defer { replaying = false }
        for (_, entry) in entries {
            let result: Result<Void, Errno> = entry.bytes.withUnsafeBytes { bytes in
                do throws(Errno) {
                    _ = try write(entry.ino, offset: entry.offset, data: bytes, append: false, droppingSetID: false)
                    return .success(())
                } catch {
                    return .failure(error)
                }
            }
            if case .failure(let error) = result {
                guard error == .noSuchFileOrDirectory || error == .isDirectory else { throw error }
                Log.error("cache: an fsynced write to inode \(entry.ino) found no file to go to")
                continue
            }
            lock.withLock {
                guard var file = dirty.files[entry.ino] else { return }
                file.size = max(file.size, entry.size)
                file.modified = entry.modified
                dirty.files[entry.ino] = file
            }
        }
        try lock.withLock { () throws(Errno) in
            journal.end = end
            try drainJournal()
        }
        progress("stored \(entries.count) fsynced writes that were only in \(journal.path) when the daemon ended")
        bindJournal(identity)
    }

    /// Gives the database its identity if it has none (`SyncJournal`), once everything of
    /// the journal before it is stored: from now on its records are this database's.
    private func bindJournal(_ identity: UInt64?) {
        if let identity {
            journal.seed = identity
            return
        }
        do throws(Errno) {
            try lock.withLock { () throws(Errno) in
                try commitBatch()
                try run("INSERT OR REPLACE INTO state(name, value) VALUES('journal_id', random())")
            }
            do throws(SQLiteError) {
                journal.seed = try SyncJournal.storedIdentity(in: database) ?? 0
            } catch {
                journal.seed = 0
            }
        } catch {
            journal.seed = 0
            Log.warning("cache: the fsync journal's database identity could not be stored (\(error)): its records stay unbound")
        }
    }
}
