#if canImport(Glibc)
import Glibc
#endif
import Posix

/// File data: chunk rows of `chunkSize` bytes (see `docs/cache-schema.md`).
///
/// A missing row is a hole (reads as zeros, stores nothing). A row with an empty blob is a
/// preallocated chunk (`fallocate`): it reads as zeros like a hole but counts as allocated,
/// as ext4's unwritten extents do. Every change keeps `inodes.stored`, the bytes the rows
/// hold (an empty row counting as a whole chunk), so `st_blocks` and the size limit never
/// need a scan of the chunks.
extension CacheStore {
    /// `fallocate(2)` flags that the store understands.
    ///
    /// Thread-safety: constants only.
    public enum AllocationMode {
        public static let keepSize: Int32 = 0x01
        public static let punchHole: Int32 = 0x02
        public static let zeroRange: Int32 = 0x10
    }

    /// At most this much is copied by one `copyRange` (the caller asks again for the rest),
    /// so that one call never holds the store long.
    public static let copyLimit = 16 << 20

    /// Bytes a chunk row of `length` stored bytes holds: an empty row is a whole chunk.
    static func allocated(_ length: Int) -> Int64 { length == 0 ? Int64(chunkSize) : Int64(length) }

    /// SQL for the bytes the rows of one inode hold in a range of chunks (`allocated` in SQL).
    static let allocatedInRange = "SELECT coalesce(sum(CASE length(data) WHEN 0 THEN \(chunkSize) ELSE length(data) END), 0) FROM chunks WHERE ino = ? AND idx BETWEEN ? AND ?"

    func allocatedBytes(_ ino: Int64, chunks first: Int64, _ last: Int64) throws(Errno) -> Int64 {
        guard first <= last else { return 0 }
        let ino = key(ino)
        let statement = try statement(Self.allocatedInRange)
        statement.bind(ino, first, last)
        defer { statement.done() }
        return try row(statement) ? statement.int(0) : 0
    }

    /// One stored piece of a chunk: its row, where it starts within the chunk and the bytes
    /// it holds (0: the chunk is preallocated, and this row is its only one).
    ///
    /// Thread-safety: a value.
    struct StoredPiece {
        var id: Int64
        var start: Int
        var length: Int
        var end: Int { start + length }
    }

    /// A chunk's stored pieces in order (empty: a hole).
    func chunkPieces(_ ino: Int64, _ index: Int64) throws(Errno) -> [StoredPiece] {
        let statement = try statement("SELECT id, start, length(data) FROM chunks WHERE ino = ? AND idx = ? ORDER BY start")
        statement.bind(key(ino), index)
        defer { statement.done() }
        var pieces: [StoredPiece] = []
        while try row(statement) { pieces.append(StoredPiece(id: statement.int(0), start: Int(statement.int(1)), length: Int(statement.int(2)))) }
        return pieces
    }

    /// Stores a whole chunk (lock held, inside a change); returns what it adds to the
    /// bytes the file holds.
    func putWholeChunk(_ ino: Int64, _ index: Int64, _ bytes: some SQLiteBindable) throws(Errno) -> Int64 {
        let before = try allocatedBytes(ino, chunks: index, index)
        try putChunk(ino, index, bytes)
        batchBytes += Self.chunkSize
        return Int64(Self.chunkSize) - before
    }

    /// A chunk's bytes to update as a whole: a hole gives no bytes, a preallocated chunk a
    /// whole chunk of zeros, pieces their bytes up to the last one's end with zeros between.
    func chunkForUpdate(_ ino: Int64, _ index: Int64) throws(Errno) -> [UInt8] {
        let statement = try statement("SELECT start, data FROM chunks WHERE ino = ? AND idx = ? ORDER BY start")
        statement.bind(key(ino), index)
        defer { statement.done() }
        var bytes: [UInt8] = []
        while try row(statement) {
            let start = Int(statement.int(0)), data = statement.blob(1)
            if data.isEmpty { return [UInt8](repeating: 0, count: Self.chunkSize) }
            if bytes.count < start + data.count { bytes += repeatElement(0, count: start + data.count - bytes.count) }
            bytes.withUnsafeMutableBytes { $0.copy(data, to: start) }
        }
        return bytes
    }

    /// Replaces a chunk's pieces with one piece from its start (empty: preallocated).
    func putChunk(_ ino: Int64, _ index: Int64, _ bytes: some SQLiteBindable) throws(Errno) {
        let ino = key(ino)
        try run("DELETE FROM chunks WHERE ino = ? AND idx = ? AND start > 0", ino, index)
        try run("INSERT OR REPLACE INTO chunks(ino, idx, start, data) VALUES(?,?,0,?)", ino, index, bytes)
    }

    /// Stores `bytes` at `range` of chunk `index`, whose stored `pieces` are given and kept
    /// up to date (lock held, inside a change); returns what the stored bytes grow by.
    /// A stored piece that covers the range takes the bytes in place (only the pages they
    /// fall on are written); otherwise the range and the pieces it overlaps or touches become
    /// one new piece — only what was written is stored, holes stay holes. With `room`
    /// (the file's last chunk, appended to) a piece that grows past the chunk's last end
    /// gets zeros after it — up to twice what that piece held in the first chunk, the rest
    /// of the chunk after it — so that the next appends go in place (a log, or a database's
    /// write-ahead log growing a few KiB an fsync). (A file written at once is stored as
    /// written: only a piece appended to in a later flush gets room — and then, the file
    /// being one that grows (`growing`), each new chunk it enters gets its room at once.)
    func storePiece(_ ino: Int64, _ index: Int64, at range: Range<Int>, _ bytes: UnsafeRawBufferPointer,
                    pieces: inout [StoredPiece], room: Bool, writer: BlobWriter) throws(Errno) -> Int64 {
        if let covering = pieces.first(where: { $0.length > 0 && $0.start <= range.lowerBound && $0.end >= range.upperBound }) {
            do throws(SQLiteError) {
                try writer.write(row: covering.id, offset: range.lowerBound - covering.start, bytes)
            } catch {
                throw Self.errno(error)
            }
            return 0
        }
        if pieces.count == 1, pieces.first?.length == 0 {
            // Preallocated: the chunk is stored whole, zeros around the bytes.
            var whole = [UInt8](repeating: 0, count: Self.chunkSize)
            whole.withUnsafeMutableBytes { $0.copy(bytes, to: range.lowerBound) }
            try putChunk(ino, index, whole)
            pieces = [StoredPiece(id: database.lastInsertedRow, start: 0, length: Self.chunkSize)]
            return 0
        }
        let touching = pieces.filter { $0.start <= range.upperBound && $0.end >= range.lowerBound }
        let lower = min(range.lowerBound, touching.first?.start ?? range.lowerBound)
        let upper = max(range.upperBound, touching.last?.end ?? range.upperBound)
        var length = upper - lower
        if room, let last = pieces.last, upper > last.end, touching.last?.id == last.id {
            // Past the first chunk the file is growing (a log, a write-ahead log): the rest
            // of the chunk at once, as one change of the tree's pages, not a rewrite at each
            // doubling (each of which frees and takes a dozen pages of the tree).
            length = index > 0 ? Self.chunkSize - lower : min(Self.chunkSize - lower, max(length, 2 * last.length))
            if growing.count >= 4096 { growing.removeAll() }
            growing.insert(ino)
        } else if room, pieces.isEmpty, index > 0, lower == 0, growing.contains(ino) {
            // A file known to grow by appends enters a new chunk: its room now, rather than a
            // small piece that the next append replaces (a commit of 5–9 frames, then one of
            // 20–30, at every chunk a write-ahead log crosses).
            length = Self.chunkSize
        }
        var merged = [UInt8](repeating: 0, count: length)
        if let lastTouching = touching.last {
            let key = key(ino)
            let statement = try statement("SELECT start, data FROM chunks WHERE ino = ? AND idx = ? AND start BETWEEN ? AND ?")
            statement.bind(key, index, Int64(lower), Int64(lastTouching.start))
            defer { statement.done() }
            while try row(statement) {
                let start = Int(statement.int(0)), data = statement.blob(1)
                merged.withUnsafeMutableBytes { $0.copy(data, to: start - lower) }
            }
            statement.done()
            // (The one at `lower`, if any, is replaced by the insert.)
            try run("DELETE FROM chunks WHERE ino = ? AND idx = ? AND start BETWEEN ? AND ?", key, index, Int64(lower + 1), Int64(lastTouching.start))
        }
        merged.withUnsafeMutableBytes { $0.copy(bytes, to: range.lowerBound - lower) }
        try run("INSERT OR REPLACE INTO chunks(ino, idx, start, data) VALUES(?,?,?,?)", key(ino), index, Int64(lower), merged)
        let piece = StoredPiece(id: database.lastInsertedRow, start: lower, length: length)
        pieces.removeAll { $0.start <= range.upperBound && $0.end >= range.lowerBound }
        pieces.insert(piece, at: pieces.firstIndex { $0.start > lower } ?? pieces.count)
        return Int64(length - touching.reduce(0) { $0 + $1.length })
    }

    /// Fills `buffer` (zeroed by the caller) with the file's bytes from `offset` (lock held).
    func copyOut(_ ino: Int64, offset: Int64, into buffer: UnsafeMutableRawBufferPointer) throws(Errno) {
        guard buffer.count > 0 else { return }
        let ino = key(ino)
        let length = Int64(buffer.count)
        let first = offset / Int64(Self.chunkSize), last = (offset + length - 1) / Int64(Self.chunkSize)
        let statement = try statement("SELECT idx, start, data FROM chunks WHERE ino = ? AND idx BETWEEN ? AND ?")
        statement.bind(ino, first, last)
        defer { statement.done() }
        while try row(statement) {
            let chunkStart = statement.int(0) * Int64(Self.chunkSize) + statement.int(1)
            let data = statement.blob(2)
            let from = max(offset, chunkStart), to = min(offset + length, chunkStart + Int64(data.count))
            guard from < to else { continue }
            buffer.copy(UnsafeRawBufferPointer(rebasing: data[Int(from - chunkStart)..<Int(to - chunkStart)]), to: Int(from - offset))
        }
    }

    /// A new buffer (the caller deallocates it) holding `count` bytes of the file from `offset`.
    func zeroedBuffer(_ ino: Int64, offset: Int64, count: Int) throws(Errno) -> UnsafeMutableRawBufferPointer {
        let buffer = UnsafeMutableRawBufferPointer.allocate(byteCount: count, alignment: 16)
        buffer.initializeMemory(as: UInt8.self, repeating: 0)
        do throws(Errno) {
            try copyOut(ino, offset: offset, into: buffer)
        } catch {
            buffer.deallocate()
            throw error
        }
        return buffer
    }

    /// Buffered data reaches the database before a read of it (lock held). A failure there
    /// is the reader's EIO (read(2) has no ENOSPC).
    func flushBeforeReading(_ ino: Int64) throws(Errno) {
        guard dirty.files[ino] != nil else { return }
        do throws(Errno) {
            try change { () throws(Errno) in try flushDirty(ino) }
        } catch {
            Log.error("cache: buffered data of inode \(ino) could not be stored for a read: \(error)")
            throw .ioError
        }
    }

    /// A regular file's row for a data operation: EISDIR for a directory, EINVAL otherwise.
    func regularFile(_ ino: Int64) throws(Errno) -> CacheInode {
        let inode = try fetchInode(ino)
        guard !inode.isDirectory else { throw .isDirectory }
        guard inode.mode & S_IFMT == S_IFREG else { throw .invalidArgument }
        return inode
    }

    // MARK: Reading and writing

    /// Reads up to `size` bytes at `offset`; holes read as zeros.
    /// The bytes are copied out under the store's lock and handed to `reply` after it is
    /// released: no other request of cache/ waits for a reply to reach the kernel.
    public func read(_ ino: Int64, offset: Int64, size: Int, into reply: (UnsafeRawBufferPointer) -> Void) throws(Errno) {
        let buffer = try withLock { () throws(Errno) -> UnsafeMutableRawBufferPointer? in
            try flushBeforeReading(ino)
            let inode = try fetchInode(ino)
            guard offset < inode.size, size > 0 else { return nil }
            return try zeroedBuffer(ino, offset: offset, count: Int(min(Int64(size), inode.size - offset)))
        }
        defer { buffer?.deallocate() }
        reply(buffer.map { UnsafeRawBufferPointer($0) } ?? UnsafeRawBufferPointer(start: nil, count: 0))
    }

    /// Writes `data` at `offset` (at the end with `append`); returns the bytes written.
    /// Whole chunks go to the database at once (with the new size, in one change); parts of
    /// chunks are buffered (`DirtyChunks`) until the chunk is whole or the data is needed
    /// there. A write that fails changes nothing, buffers included.
    public func write(_ ino: Int64, offset: Int64, data: UnsafeRawBufferPointer, append: Bool) throws(Errno) -> Int {
        try write(ino, offset: offset, data: data, append: append, droppingSetID: false).written
    }

    /// The same, and with `droppingSetID` (a writer without CAP_FSETID) the file's set-ID
    /// bits go first, in the same visit (`SetIDBits`); `modeChanged` says whether they did.
    /// The mode is known from the buffers' state: no row is read for a file written to.
    public func write(_ ino: Int64, offset: Int64, data: UnsafeRawBufferPointer, append: Bool,
                      droppingSetID: Bool) throws(Errno) -> (written: Int, modeChanged: Bool) {
        guard !data.isEmpty else { return (0, false) }
        makeRoomInLog()
        return try withLock { () throws(Errno) -> (written: Int, modeChanged: Bool) in
            // A change opens a transaction, and the first after short fsyncs drains the
            // journal, which stores every buffer, this file's too. So a write that commits
            // drains first, and looks at its buffers only after: no change of this write can
            // take them out from under it (the journal stays empty until the next fsync).
            var before = try writeBase(ino)
            let start = append ? before.size : offset
            guard start >= 0, start <= Int64.max - Int64(data.count) else { throw .fileTooLarge }
            let end = start + Int64(data.count)
            // The pieces: whole chunks, and the parts of chunks at the ends.
            var whole: [(index: Int64, piece: UnsafeRawBufferPointer)] = []
            var parts: [(index: Int64, within: Int, piece: UnsafeRawBufferPointer)] = []
            var position = 0
            while position < data.count {
                let absolute = start + Int64(position)
                let index = absolute / Int64(Self.chunkSize)
                let within = Int(absolute % Int64(Self.chunkSize))
                let count = min(Self.chunkSize - within, data.count - position)
                let piece = UnsafeRawBufferPointer(rebasing: data[position..<(position + count)])
                if count == Self.chunkSize { whole.append((index, piece)) } else { parts.append((index, within, piece)) }
                position += count
            }
            let dropsSetID = droppingSetID && before.setID
            if (dropsSetID || !whole.isEmpty) && !journal.isEmpty {
                try drainJournal()
                before = try writeBase(ino)
            }
            let now = Self.now()
            if dropsSetID {
                try change { () throws(Errno) in
                    let mode = mode_t(try fetchInode(ino).mode)
                    try run("UPDATE inodes SET mode = ?, ctime = max(ctime, ?) WHERE ino = ?", Int64(SetIDBits.killed(mode)), now, ino)
                }
                before.fresh?.setID = false
                dirty.files[ino]?.setID = false
            }
            try requireHeadroom(adding: data.count)
            if let last = whole.last {
                // Stored with the size they reach, so that no chunk lies past the recorded end.
                try change { () throws(Errno) in
                    var stored: Int64 = 0
                    for (index, piece) in whole { stored += try putWholeChunk(ino, index, piece) }
                    let reached = last.index * Int64(Self.chunkSize) + Int64(Self.chunkSize)
                    try run("UPDATE inodes SET size = max(size, ?), stored = stored + ?, mtime = ?, ctime = ? WHERE ino = ?",
                            reached, stored, now, now, ino)
                }
            }
            // From here nothing throws until the buffers are back in the table; taken out,
            // they change in place (no copy on write of a chunk per write).
            guard var file = dirty.files.removeValue(forKey: ino) ?? before.fresh else {
                Log.error("cache: broken invariant: the buffers of inode \(ino) went during its write (answered EIO)")
                throw .ioError
            }
            var completed: [Int64] = []
            for (index, _) in whole {
                if let superseded = file.chunks.removeValue(forKey: index) { dirty.bytes -= superseded.count }
            }
            for (index, within, piece) in parts {
                var chunk = file.chunks.removeValue(forKey: index) ?? DirtyChunks.Chunk()
                let had = chunk.count
                chunk.write(piece, at: within)
                dirty.bytes += chunk.count - had
                if chunk.isWhole { completed.append(index) }
                file.chunks[index] = consume chunk
            }
            file.size = max(file.size, end)
            file.modified = now
            // Kept for fsync's short way only while it may be taken: nothing committed since
            // the last sync (a writer of whole chunks commits: it copies nothing here).
            if everythingSynced {
                journal.note(ino, offset: start, data, size: file.size, modified: now)
            } else {
                journal.giveUp()
            }
            dirty.files[ino] = consume file
            if dirty.since == nil { dirty.since = .now }  // (the committing thread writes it within `dirtyDelay`)
            // Chunks made whole, or too much buffered: stored now. If that fails the data
            // stays buffered (the write itself succeeded) and goes later or at fsync. Not
            // a chunk made whole while the next fsync may go the short way: storing it is a
            // transaction, which drains the journal first — an fdatasync inside a WRITE (a
            // database inside appending its log completes a chunk every 16 pages); it
            // waits, at most 4 MiB of writes, for the drain that comes anyway.
            if (!completed.isEmpty && !journal.isTaking) || dirty.bytes > Self.dirtyLimit {
                do throws(Errno) {
                    try change { () throws(Errno) in
                        // Over the limit: written down to half of it, not all (the request waits for it).
                        if dirty.bytes > Self.dirtyLimit {
                            _ = try flushSomeDirty(atLeast: dirty.bytes - Self.dirtyLimit / 2)
                        } else {
                            try flushDirty(ino, only: completed)
                        }
                    }
                } catch {
                    Log.error("cache: buffered data of inode \(ino) could not be stored yet: \(error)")
                }
            }
            return (data.count, dropsSetID)
        }
    }

    /// What a write starts from (lock held): the file's size and whether its mode has set-ID
    /// bits, and the buffer to start when it has none (`fresh`: as an fsync left it, else
    /// from its row; nil while it has buffers).
    func writeBase(_ ino: Int64) throws(Errno) -> (size: Int64, setID: Bool, fresh: DirtyChunks.File?) {
        if let file = dirty.files[ino] { return (file.size, file.setID, nil) }
        if let known = settledFile(ino) { return (known.size, known.setID, known) }
        let inode = try fetchInode(ino)
        guard !inode.isDirectory else { throw .isDirectory }
        let fresh = DirtyChunks.File(size: inode.size, modified: inode.modificationNanoseconds, setID: SetIDBits.wouldDrop(inode.mode))
        return (fresh.size, fresh.setID, fresh)
    }

    public func setAttributes(_ ino: Int64, _ changes: CacheAttributeChanges) throws(Errno) -> CacheInode {
        try transaction { () throws(Errno) -> CacheInode in
            if changes.size == 0 { dirty.discard(ino) } else { try flushDirty(ino) }
            var inode = try fetchInode(ino)
            let now = Self.now()
            if let size = changes.size { try setSize(of: &inode, to: size, at: now) }
            if let mode = changes.mode { inode.mode = (inode.mode & S_IFMT) | (mode & 0o7777) }
            if let uid = changes.uid { inode.uid = uid }
            if let gid = changes.gid { inode.gid = gid }
            if let atime = changes.accessNanoseconds { inode.accessNanoseconds = atime }
            if let mtime = changes.modificationNanoseconds { inode.modificationNanoseconds = mtime }
            inode.changeNanoseconds = now
            try saveAttributes(inode)
            return inode
        }
    }

    /// Cuts a file to `size`, or lengthens it with a hole (lock held, inside a change, its
    /// buffers already stored or dropped): the chunks past the end go (`cutOff`) and the
    /// last one is trimmed. The row is the caller's to save.
    func setSize(of inode: inout CacheInode, to size: Int64, at now: Int64) throws(Errno) {
        guard !inode.isDirectory else { throw .isDirectory }
        guard size >= 0 else { throw .invalidArgument }
        let ino = inode.ino
        if size < inode.size {
            let lastIndex = size == 0 ? -1 : (size - 1) / Int64(Self.chunkSize)
            try cutOff(ino, after: lastIndex)
            let keep = size - lastIndex * Int64(Self.chunkSize)
            if lastIndex >= 0 && keep < Int64(Self.chunkSize) {
                // The last chunk is cut at the end: pieces past it go, a piece across it is
                // cut there, a preallocated chunk becomes zeros up to it.
                let dataKey = key(ino)
                try run("UPDATE chunks SET data = zeroblob(?) WHERE ino = ? AND idx = ? AND length(data) = 0", keep, dataKey, lastIndex)
                try run("DELETE FROM chunks WHERE ino = ? AND idx = ? AND start >= ?", dataKey, lastIndex, keep)
                try run("UPDATE chunks SET data = substr(data, 1, ? - start) WHERE ino = ? AND idx = ? AND start + length(data) > ?",
                        keep, dataKey, lastIndex, keep)
            }
            inode.storedBytes = try allocatedBytes(ino, chunks: 0, max(0, lastIndex))
        }
        inode.size = size
        inode.modificationNanoseconds = now
    }

    /// Writes an inode's attributes to its row.
    func saveAttributes(_ inode: CacheInode) throws(Errno) {
        try run("UPDATE inodes SET mode = ?, uid = ?, gid = ?, size = ?, stored = ?, atime = ?, mtime = ?, ctime = ? WHERE ino = ?",
                Int64(inode.mode), Int64(inode.uid), Int64(inode.gid), inode.size, inode.storedBytes,
                inode.accessNanoseconds, inode.modificationNanoseconds, inode.changeNanoseconds, inode.ino)
    }

    /// Removes the chunks after `lastIndex`. Few: at once. Many (a big file cut short, as by
    /// `> file` or O_TRUNC), with few kept: the kept ones move to a new key for the inode
    /// and the old key's chunks go in slices (`reclaimStep`), so the request does not hold
    /// the store while gigabytes are deleted.
    func cutOff(_ ino: Int64, after lastIndex: Int64) throws(Errno) {
        let old = key(ino)
        // Counted only up to the threshold: the request never walks the whole file.
        let limit = Self.deleteAtOnce + 1
        let count = try statement("""
            SELECT (SELECT count(*) FROM (SELECT 1 FROM chunks WHERE ino = ? AND idx > ? LIMIT ?)),
                   (SELECT count(*) FROM (SELECT 1 FROM chunks WHERE ino = ? AND idx <= ? LIMIT ?))
            """)
        count.bind(old, lastIndex, limit, old, lastIndex, limit)
        guard try row(count) else { count.done(); return }
        let (dropped, kept) = (count.int(0), count.int(1))
        count.done()
        guard dropped > Self.deleteAtOnce && kept <= Self.deleteAtOnce else {
            try run("DELETE FROM chunks WHERE ino = ? AND idx > ?", old, lastIndex)
            return
        }
        let new = nextDataKey
        nextDataKey -= 1
        try run("UPDATE chunks SET ino = ? WHERE ino = ? AND idx <= ?", new, old, lastIndex)
        try run("UPDATE inodes SET data = ? WHERE ino = ?", new, ino)
        dataKeys[ino] = new
        reclaimQueue.append((old, nil))
        backgroundWork?()
    }

    // MARK: fallocate, SEEK_DATA/SEEK_HOLE, copy_file_range

    /// `fallocate(2)` as ext4 answers it, at chunk granularity:
    /// - mode 0 and `keepSize`: every chunk of the range becomes allocated (a preallocated
    ///   row where there was a hole, a partial row filled up with zeros); mode 0 extends the
    ///   size. ENOSPC, with nothing changed, when the data directory's disk lacks the room.
    /// - `punchHole | keepSize`: whole chunks of the range are dropped, the parts of the
    ///   others zeroed; the size stays.
    /// - `zeroRange` (with or without `keepSize`): the range reads as zeros and is allocated.
    /// Other modes (collapse and insert range among them): EOPNOTSUPP.
    public func allocate(_ ino: Int64, mode: Int32, offset: Int64, length: Int64) throws(Errno) {
        let keepSize = mode & AllocationMode.keepSize != 0
        let operation = mode & ~AllocationMode.keepSize
        guard operation == 0 || operation == AllocationMode.punchHole || operation == AllocationMode.zeroRange else {
            throw .notSupported
        }
        if operation == AllocationMode.punchHole && !keepSize { throw .notSupported }
        guard offset >= 0, length > 0 else { throw .invalidArgument }
        let (end, overflow) = offset.addingReportingOverflow(length)
        guard !overflow else { throw .fileTooLarge }
        try transaction { () throws(Errno) in
            try flushDirty(ino)
            let inode = try regularFile(ino)
            let size = Int64(Self.chunkSize)
            let first = offset / size, last = (end - 1) / size
            // The whole chunks of the range, and the partly covered ones at its ends.
            let wholeFirst = offset % size == 0 ? first : first + 1
            let wholeLast = end % size == 0 ? last : last - 1
            let edges = Set([first, last]).filter { $0 < wholeFirst || $0 > wholeLast }
            let before = try allocatedBytes(ino, chunks: first, last)
            if operation != AllocationMode.punchHole {
                try requireHeadroom(adding: Int(clamping: (last - first + 1) * size - before))
            }
            for index in edges.sorted() {
                let from = Int(max(offset, index * size) - index * size)
                let to = Int(min(end, (index + 1) * size) - index * size)
                let pieces = try chunkPieces(ino, index)
                guard !pieces.isEmpty else {
                    // A hole: punched already; allocated (reading as zeros) otherwise.
                    if operation != AllocationMode.punchHole { try putChunk(ino, index, [UInt8]()) }
                    continue
                }
                // A preallocated chunk reads as zeros already and stays allocated.
                guard let first = pieces.first, first.length > 0 else { continue }
                var chunk = try chunkForUpdate(ino, index)
                if operation == AllocationMode.punchHole {
                    guard from < chunk.count else { continue }
                    let upTo = min(to, chunk.count)
                    chunk.withUnsafeMutableBytes { _ = $0[from..<upTo].initializeMemory(as: UInt8.self, repeating: 0) }
                } else {
                    // Allocated chunks are whole: a partial row is filled up with zeros.
                    if chunk.count < Self.chunkSize { chunk += [UInt8](repeating: 0, count: Self.chunkSize - chunk.count) }
                    if operation == AllocationMode.zeroRange {
                        chunk.withUnsafeMutableBytes { _ = $0[from..<to].initializeMemory(as: UInt8.self, repeating: 0) }
                    }
                }
                try putChunk(ino, index, chunk)
            }
            if wholeFirst <= wholeLast {
                if operation != 0 {
                    try run("DELETE FROM chunks WHERE ino = ? AND idx BETWEEN ? AND ?", key(ino), wholeFirst, wholeLast)
                } else {
                    try fillPartialChunks(ino, wholeFirst, wholeLast)
                }
                if operation != AllocationMode.punchHole { try preallocate(ino, wholeFirst, wholeLast) }
            }
            let after = try allocatedBytes(ino, chunks: first, last)
            let newSize = keepSize ? inode.size : max(inode.size, end)
            let now = Self.now()
            let dataChanged = operation != 0 || newSize != inode.size
            try run("UPDATE inodes SET size = ?, stored = stored + ?, mtime = ?, ctime = ? WHERE ino = ?",
                    newSize, after - before, dataChanged ? now : inode.modificationNanoseconds, now, ino)
        }
    }

    /// Preallocated rows for every hole among chunks `first...last` (one statement).
    private func preallocate(_ ino: Int64, _ first: Int64, _ last: Int64) throws(Errno) {
        try run("""
            WITH RECURSIVE range(i) AS (SELECT ? UNION ALL SELECT i + 1 FROM range WHERE i < ?)
            INSERT OR IGNORE INTO chunks(ino, idx, start, data) SELECT ?, i, 0, x'' FROM range
            """, first, last, key(ino))
    }

    /// Fills the partly stored chunks among `first...last` up to whole chunks with zeros.
    private func fillPartialChunks(_ ino: Int64, _ first: Int64, _ last: Int64) throws(Errno) {
        let statement = try statement("""
            SELECT idx FROM chunks WHERE ino = ? AND idx BETWEEN ? AND ? GROUP BY idx
                HAVING count(*) > 1 OR min(start) > 0 OR max(length(data)) BETWEEN 1 AND \(Self.chunkSize - 1)
            """)
        statement.bind(key(ino), first, last)
        var partial: [Int64] = []
        while try row(statement) { partial.append(statement.int(0)) }
        statement.done()
        for index in partial {
            var chunk = try chunkForUpdate(ino, index)
            chunk += [UInt8](repeating: 0, count: Self.chunkSize - chunk.count)
            try putChunk(ino, index, chunk)
        }
    }

    /// `lseek(2)` with `SEEK_DATA` (`data`) or `SEEK_HOLE`, from the chunk map: a row's bytes
    /// are data, and so is a preallocated chunk (as ext4 reports its unwritten extents);
    /// missing rows and the end of the file are holes.
    /// ENXIO at or past the end, and for SEEK_DATA with no data after `offset`.
    public func seek(_ ino: Int64, offset: Int64, data: Bool) throws(Errno) -> Int64 {
        try withLock { () throws(Errno) -> Int64 in
            try flushBeforeReading(ino)
            let inode = try fetchInode(ino)
            guard offset >= 0, offset < inode.size else { throw .noSuchDeviceOrAddress }
            let statement = try statement("SELECT idx, start, length(data) FROM chunks WHERE ino = ? AND idx >= ? ORDER BY idx, start")
            statement.bind(key(ino), offset / Int64(Self.chunkSize))
            defer { statement.done() }
            var position = offset
            while try row(statement) {
                let start = statement.int(0) * Int64(Self.chunkSize) + statement.int(1)
                let end = min(start + Self.allocated(Int(statement.int(2))), inode.size)
                if end <= position { continue }
                if data { return max(position, start) }
                if start > position { return position }
                position = end
                if position >= inode.size { return inode.size }
            }
            if data { throw .noSuchDeviceOrAddress }
            return position
        }
    }

    /// `copy_file_range(2)` inside the store: up to `length` bytes (at most `copyLimit`, and
    /// none past the source's end) from one file to another, without the data leaving
    /// SQLite where both offsets fall on chunk boundaries (rows are copied, holes kept).
    /// Returns the bytes copied.
    public func copyRange(from source: Int64, offset sourceOffset: Int64, to destination: Int64,
                          offset destinationOffset: Int64, length: Int) throws(Errno) -> Int {
        try transaction { () throws(Errno) -> Int in
            try flushDirty(source)
            try flushDirty(destination)
            let from = try regularFile(source)
            _ = try regularFile(destination)
            guard sourceOffset >= 0, destinationOffset >= 0 else { throw .invalidArgument }
            guard sourceOffset < from.size, length > 0 else { return 0 }
            let count = Int64(min(length, Self.copyLimit, Int(clamping: from.size - sourceOffset)))
            guard destinationOffset <= Int64.max - count else { throw .fileTooLarge }
            if source == destination && sourceOffset < destinationOffset + count && destinationOffset < sourceOffset + count {
                throw .invalidArgument
            }
            try requireHeadroom(adding: Int(count))
            let size = Int64(Self.chunkSize)
            let first = destinationOffset / size, last = (destinationOffset + count - 1) / size
            let before = try allocatedBytes(destination, chunks: first, last)
            let writer = BlobWriter(database, table: "chunks", column: "data")
            defer { writer.close() }
            var done: Int64 = 0
            while done < count {
                let target = destinationOffset + done, origin = sourceOffset + done
                let index = target / size, within = Int(target % size)
                let piece = min(size - Int64(within), count - done)
                if within == 0 && piece == size && origin % size == 0 {
                    // A whole chunk: its pieces (holes stay holes).
                    try run("DELETE FROM chunks WHERE ino = ? AND idx = ?", key(destination), index)
                    try run("INSERT INTO chunks(ino, idx, start, data) SELECT ?, ?, start, data FROM chunks WHERE ino = ? AND idx = ?",
                            key(destination), index, key(source), origin / size)
                } else {
                    let bytes = try zeroedBuffer(source, offset: origin, count: Int(piece))
                    defer { bytes.deallocate() }
                    var pieces = try chunkPieces(destination, index)
                    _ = try storePiece(destination, index, at: within..<(within + Int(piece)), UnsafeRawBufferPointer(bytes),
                                       pieces: &pieces, room: false, writer: writer)
                }
                done += piece
            }
            let after = try allocatedBytes(destination, chunks: first, last)
            let now = Self.now()
            try run("UPDATE inodes SET size = max(size, ?), stored = stored + ?, mtime = ?, ctime = ? WHERE ino = ?",
                    destinationOffset + count, after - before, now, now, destination)
            return Int(count)
        }
    }
}
