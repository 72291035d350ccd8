#if canImport(Glibc)
import Glibc
#endif
import Posix

/// File data: a small file's bytes in its `contents` row (buffered while written), a large
/// file's in its data file, read and written with `pread`/`pwrite` outside the store's lock
/// (see `docs/cache-schema.md`, "File data").
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
    /// so that one call never holds a request long.
    public static let copyLimit = 16 << 20

    /// A regular file's row for a data operation: EISDIR for a directory, EINVAL otherwise.
    func regularFile(_ ino: Int64) throws(Errno) -> CacheInode {
        let inode = try storedInode(ino)
        guard !inode.isDirectory else { throw .isDirectory }
        guard inode.isRegular else { throw .invalidArgument }
        return inode
    }

    // MARK: Open and close

    /// An open of a file in one visit to the store: its row, cut to size 0 first with
    /// `truncate` (a large file cut to nothing is small again: its data file goes). The
    /// file is then in use (never evicted while open) and used now; the time of use is kept
    /// to the minute (`useResolution`), so reading files costs no commits. A directory is
    /// EISDIR.
    public func open(_ ino: Int64, truncate: Bool) throws(Errno) -> CacheInode {
        try withLock { () throws(Errno) -> CacheInode in
            var inode = try storedInode(ino)
            guard !inode.isDirectory else { throw .isDirectory }
            if truncate && fetchInode(inode).size != 0 {
                try change { () throws(Errno) in try cutToNothing(inode, at: Self.now()) }
                inode = try storedInode(ino)
            }
            let now = Self.now()
            try run("UPDATE inodes SET used = ? WHERE ino = ? AND used < ?", now, ino, now - Self.useResolution)
            opens[ino, default: 0] += 1
            if isExternal(inode) && data.files[ino] == nil {
                do throws(Errno) {
                    data.files[ino] = try dataFile(inode)
                } catch {
                    opens[ino]! -= 1
                    if opens[ino] == 0 { opens[ino] = nil }
                    throw error
                }
            }
            return overlay(inode)  // (the row read above: `used` is not an attribute)
        }
    }

    /// How precisely the least recently used order is kept (nanoseconds).
    static let useResolution: Int64 = 60_000_000_000

    /// A handle closed: the last one stores a small file's buffer, brings a large file's
    /// row up to date (unless its move is unrecorded) and closes its data file.
    public func released(_ ino: Int64) {
        _ = try? withLock { () throws(Errno) in
            let left = max(0, (opens[ino] ?? 0) - 1)
            opens[ino] = left == 0 ? nil : left
            guard left == 0 else { return }
            if orphans.contains(ino) {
                try change { () throws(Errno) in try referenceDropped(ino) }
                return
            }
            if inline.files[ino] != nil {
                do throws(Errno) {
                    try change { () throws(Errno) in try storeBuffer(ino) }
                } catch {
                    Log.error("cache: the data written to inode \(ino) could not be stored at its close: \(error)")
                }
            }
            if data.staleRows.contains(ino) { try change(refresh: true) { () throws(Errno) in try refreshRows([ino]) } }
            data.files[ino] = nil
            if data.unrecorded[ino] != nil { backgroundWork?() }  // (the size limit counts it)
        }
    }

    /// An inode as a reader sees it, from its row (lock held).
    func fetchInode(_ inode: CacheInode) -> CacheInode { overlay(inode) }

    // MARK: Reading and writing

    /// Reads up to `size` bytes at `offset`; holes read as zeros. The bytes are read outside
    /// the store's lock (a small file's are copied out under it) and handed to `reply`:
    /// no other request of cache/ waits for a read of the disk or a reply to the kernel.
    public func read(_ ino: Int64, offset: Int64, size: Int, into reply: (UnsafeRawBufferPointer) -> Void) throws(Errno) {
        enum Source { case none, copied(UnsafeMutableRawBufferPointer), file(DataFile, Int) }
        let source = try withLock { () throws(Errno) -> Source in
            let stored = try storedInode(ino)
            guard !stored.isDirectory else { throw .isDirectory }
            let inode = overlay(stored)
            guard offset >= 0, offset < inode.size, size > 0 else { return .none }
            let count = Int(min(Int64(size), inode.size - offset))
            if let file = try dataFile(stored) { return .file(file, count) }
            let buffer = UnsafeMutableRawBufferPointer.allocate(byteCount: count, alignment: 16)
            buffer.initializeMemory(as: UInt8.self, repeating: 0)
            do throws(Errno) {
                try readInline(ino, offset: offset, into: buffer)
            } catch {
                buffer.deallocate()
                throw error
            }
            return .copied(buffer)
        }
        switch source {
        case .none:
            reply(UnsafeRawBufferPointer(start: nil, count: 0))
        case .copied(let buffer):
            defer { buffer.deallocate() }
            reply(UnsafeRawBufferPointer(buffer))
        case .file(let file, let count):
            let buffer = UnsafeMutableRawBufferPointer.allocate(byteCount: count, alignment: 4096)
            defer { buffer.deallocate() }
            let read = try Syscall.read(file.fd, into: buffer, at: offset)
            reply(UnsafeRawBufferPointer(rebasing: buffer[0..<read]))
            file.hostPages.read(file.fd, from: offset, count: read)
        }
    }

    /// Writes `data` at `offset` (at the end with `append`); returns the bytes written.
    public func write(_ ino: Int64, offset: Int64, data: UnsafeRawBufferPointer, append: Bool) throws(Errno) -> Int {
        try write(ino, offset: offset, data: data, append: append, droppingSetID: false).written
    }

    /// The same, and with `droppingSetID` (a writer without CAP_FSETID) the file's set-ID
    /// bits go first, in the same visit (`SetIDBits`); `modeChanged` says whether they did.
    /// The mode is known from the file's buffer or open data file: no row is read for a
    /// file being written. A small file's write goes into its buffer; one that would take
    /// it past `inlineLimit` or leave a hole first moves its bytes to a data file. A large
    /// file's write is a `pwrite` after the lock is let go (an append's, with the size it
    /// needs, under it).
    public func write(_ ino: Int64, offset: Int64, data bytes: UnsafeRawBufferPointer, append: Bool,
                      droppingSetID: Bool) throws(Errno) -> (written: Int, modeChanged: Bool) {
        guard !bytes.isEmpty else { return (0, false) }
        makeRoomInLog()
        let (file, start, modeChanged) = try withLock { () throws(Errno) -> (DataFile?, Int64, Bool) in
            var file = data.files[ino]
            var base = file == nil ? inline.files[ino] : nil
            if file == nil && base == nil {
                // (Its row and a small file's bytes in one query: the first write of a file.)
                let (inode, bytes) = try storedInodeAndBytes(ino)
                guard !inode.isDirectory else { throw .isDirectory }
                file = try dataFile(inode)
                if file == nil { base = inlineBase(inode, bytes: bytes) }
            }
            var modeChanged = false
            if droppingSetID && (file?.setID ?? base?.setID ?? false) {
                let now = Self.now()
                try change { () throws(Errno) in
                    let mode = mode_t(try storedInode(ino).mode)
                    try run("UPDATE inodes SET mode = ?, ctime = max(ctime, ?) WHERE ino = ?", Int64(SetIDBits.killed(mode)), now, ino)
                }
                file?.setID = false
                base?.setID = false
                modeChanged = true
            }
            if var base {
                let start = append ? base.size : offset
                guard start >= 0, start <= Int64.max - Int64(bytes.count) else { throw .fileTooLarge }
                let end = start + Int64(bytes.count)
                if start <= Int64(base.bytes.count) && end <= Int64(Self.inlineLimit) {
                    try requireHeadroom(adding: bytes.count)
                    let at = Int(start)
                    if Int(end) > base.bytes.count { base.bytes += repeatElement(0, count: Int(end) - base.bytes.count) }
                    base.bytes.withUnsafeMutableBytes { $0.copy(bytes, to: at) }
                    base.size = max(base.size, end)
                    base.modified = Self.now()
                    inline.put(ino, base)
                    if inline.bytes > Self.bufferLimit {
                        do throws(Errno) {
                            try change { () throws(Errno) in _ = try storeSomeBuffers(atLeast: inline.bytes - Self.bufferLimit / 2) }
                        } catch {
                            Log.error("cache: buffered data could not be stored yet: \(error)")
                        }
                    }
                    return (nil, start, modeChanged)
                }
                file = try convert(ino, from: base)
            }
            guard let file else { throw .ioError }
            let start = append ? Int64(try Syscall.fstat(file.fd).st_size) : offset
            guard start >= 0, start <= Int64.max - Int64(bytes.count) else { throw .fileTooLarge }
            try requireHeadroom(adding: bytes.count)
            if append {
                // The size and the write in one visit: two appenders never write at one end.
                try Syscall.writeAll(file.fd, bytes, at: Int(start))
                noteWritten(ino)
            }
            return (file, start, modeChanged)
        }
        if let file {
            if !append {
                try Syscall.writeAll(file.fd, bytes, at: Int(start))
                lock.withLock { noteWritten(ino) }
            }
            file.hostPages.wrote(file.fd, from: start, count: bytes.count)
        }
        return (bytes.count, modeChanged)
    }

    /// A file cut to size 0 (lock held, inside a change): a small file's bytes go with its
    /// buffer; a large file becomes small again, and its data file goes once that is durable.
    func cutToNothing(_ inode: CacheInode, at now: Int64) throws(Errno) {
        inline.discard(inode.ino)
        if isExternal(inode) {
            forgetDataFile(inode)
            try run("UPDATE inodes SET data = NULL WHERE ino = ?", inode.ino)
        }
        try run("DELETE FROM contents WHERE ino = ?", inode.ino)
        try run("UPDATE inodes SET size = 0, stored = 0, mtime = ?, ctime = ? WHERE ino = ?", now, now, inode.ino)
    }

    /// chmod, chown, truncate, utimens in one change. A large file's size and modification
    /// time are set on its data file (which has them); the rest is the row's.
    public func setAttributes(_ ino: Int64, _ changes: CacheAttributeChanges) throws(Errno) -> CacheInode {
        try transaction { () throws(Errno) -> CacheInode in
            var inode = try storedInode(ino)
            let now = Self.now()
            if let size = changes.size {
                guard !inode.isDirectory else { throw .isDirectory }
                guard size >= 0 else { throw .invalidArgument }
                if size == 0 {
                    try cutToNothing(inode, at: now)
                    inode = try storedInode(ino)
                } else if let file = try dataFile(inode) {
                    try Syscall.truncate(file.fd, to: size)
                    noteWritten(ino)
                } else {
                    var base = try inlineBase(inode)
                    if Int64(base.bytes.count) > size { base.bytes.removeLast(base.bytes.count - Int(size)) }
                    base.size = size
                    base.modified = now
                    inline.put(ino, base)
                }
            }
            if let mtime = changes.modificationNanoseconds, let file = try dataFile(inode) {
                // Floor division: times before 1970 keep nanoseconds in 0 ..< 1e9.
                var seconds = mtime / 1_000_000_000, rest = mtime % 1_000_000_000
                if rest < 0 { seconds -= 1; rest += 1_000_000_000 }
                try Syscall.setModificationTime(file.fd, seconds: seconds, nanoseconds: rest)
                noteWritten(ino)
            } else if let mtime = changes.modificationNanoseconds, inline.files[ino] != nil {
                inline.files[ino]?.modified = mtime
            }
            try storeBuffer(ino)
            inode = try storedInode(ino)
            if let mode = changes.mode { inode.mode = (inode.mode & S_IFMT) | (mode & 0o7777) }
            try run("UPDATE inodes SET mode = ?, uid = ?, gid = ?, atime = ?, mtime = ?, ctime = ? WHERE ino = ?",
                    Int64(inode.mode), Int64(changes.uid ?? inode.uid), Int64(changes.gid ?? inode.gid),
                    changes.accessNanoseconds ?? inode.accessNanoseconds,
                    changes.modificationNanoseconds ?? (changes.size != nil ? now : inode.modificationNanoseconds), now, ino)
            if data.staleRows.contains(ino) { try refreshRows([ino]) }
            data.files[ino]?.setID = SetIDBits.wouldDrop(inode.mode)
            return try fetchInode(ino)
        }
    }

    // MARK: fallocate, SEEK_DATA/SEEK_HOLE, copy_file_range

    /// `fallocate(2)` as the host file system answers it: a small file first moves to a
    /// data file (its bytes are then the host's to allocate, punch and zero). Modes other
    /// than preallocation, keep size, punch hole (with keep size) and zero range:
    /// EOPNOTSUPP. ENOSPC, with nothing changed, where the reserve would be eaten into.
    public func allocate(_ ino: Int64, mode: Int32, offset: Int64, length: Int64) throws(Errno) {
        let keepSize = mode & AllocationMode.keepSize != 0
        let operation = mode & ~AllocationMode.keepSize
        guard operation == 0 || operation == AllocationMode.punchHole || operation == AllocationMode.zeroRange else {
            throw .notSupported
        }
        if operation == AllocationMode.punchHole && !keepSize { throw .notSupported }
        guard offset >= 0, length > 0 else { throw .invalidArgument }
        let (_, overflow) = offset.addingReportingOverflow(length)
        guard !overflow else { throw .fileTooLarge }
        let file = try withLock { () throws(Errno) -> DataFile in
            let inode = try regularFile(ino)
            if operation != AllocationMode.punchHole { try requireHeadroom(adding: Int(clamping: length)) }
            if let file = try dataFile(inode) { return file }
            return try convert(ino, from: try inlineBase(inode))
        }
        try Syscall.allocate(file.fd, mode: mode, offset: offset, length: length)
        lock.withLock { noteWritten(ino) }
    }

    /// `lseek(2)` with `SEEK_DATA` (`data`) or `SEEK_HOLE`: a large file's from its data
    /// file; a small file's bytes are data and the rest of its size a hole. ENXIO at or
    /// past the end, and for SEEK_DATA with no data after `offset`.
    public func seek(_ ino: Int64, offset: Int64, data wantsData: Bool) throws(Errno) -> Int64 {
        try withLock { () throws(Errno) -> Int64 in
            let stored = try storedInode(ino)
            let inode = overlay(stored)
            guard offset >= 0, offset < inode.size else { throw .noSuchDeviceOrAddress }
            if let file = try dataFile(stored) { return try Syscall.seek(file.fd, from: offset, data: wantsData) }
            let length = Int64(inline.files[ino]?.bytes.count ?? Int(stored.storedBytes))
            if wantsData {
                guard offset < length else { throw .noSuchDeviceOrAddress }
                return offset
            }
            return offset < length ? length : offset
        }
    }

    /// `copy_file_range(2)` inside the store: up to `length` bytes (at most `copyLimit`,
    /// none past the source's end). Into a large file (a small destination that the copy
    /// would take past `inlineLimit` first becomes one) the source's data ranges go with
    /// the host's `copy_file_range` (a reflink where the host file system shares extents)
    /// and its holes as holes; into a small one, as a write. Returns the bytes copied.
    public func copyRange(from source: Int64, offset sourceOffset: Int64, to destination: Int64,
                          offset destinationOffset: Int64, length: Int) throws(Errno) -> Int {
        guard sourceOffset >= 0, destinationOffset >= 0 else { throw .invalidArgument }
        let plan = try withLock { () throws(Errno) -> (count: Int64, from: DataFile?, to: DataFile?) in
            let from = overlay(try regularFile(source))
            let to = try regularFile(destination)
            guard sourceOffset < from.size, length > 0 else { return (0, nil, nil) }
            let count = Int64(min(length, Self.copyLimit, Int(clamping: from.size - sourceOffset)))
            guard destinationOffset <= Int64.max - count else { throw .fileTooLarge }
            if source == destination && sourceOffset < destinationOffset + count && destinationOffset < sourceOffset + count {
                throw .invalidArgument
            }
            try requireHeadroom(adding: Int(count))
            var target = try dataFile(to)
            if target == nil, destinationOffset + count > Int64(Self.inlineLimit) {
                target = try convert(destination, from: try inlineBase(to))
            }
            return (count, try dataFile(from), target)
        }
        guard plan.count > 0 else { return 0 }
        guard let target = plan.to else {
            // Into a small file: at most `inlineLimit` bytes, read and written.
            let buffer = UnsafeMutableRawBufferPointer.allocate(byteCount: Int(plan.count), alignment: 16)
            defer { buffer.deallocate() }
            var got = 0
            try read(source, offset: sourceOffset, size: Int(plan.count)) { bytes in
                buffer.copy(bytes, to: 0)
                got = bytes.count
            }
            return try write(destination, offset: destinationOffset, data: UnsafeRawBufferPointer(rebasing: buffer[0..<got]), append: false)
        }
        defer { lock.withLock { noteWritten(destination) } }
        if let origin = plan.from {
            try copyRanges(from: origin, at: sourceOffset, to: target, at: destinationOffset, count: plan.count)
        } else {
            var bytes: [UInt8] = []
            try read(source, offset: sourceOffset, size: Int(plan.count)) { bytes = Array($0) }
            try Syscall.writeAll(target.fd, bytes, at: Int(destinationOffset))
        }
        let end = destinationOffset + plan.count
        if Int64(try Syscall.fstat(target.fd).st_size) < end { try Syscall.truncate(target.fd, to: end) }
        return Int(plan.count)
    }

    /// Between two data files: each data range of the source with the host's copy, each
    /// hole punched into the destination (outside the store's lock).
    private func copyRanges(from origin: DataFile, at sourceOffset: Int64, to target: DataFile, at destinationOffset: Int64,
                            count: Int64) throws(Errno) {
        var done: Int64 = 0
        while done < count {
            let at = sourceOffset + done
            let dataStart: Int64
            do throws(Errno) {
                dataStart = min(try Syscall.seek(origin.fd, from: at, data: true), sourceOffset + count)
            } catch where error == .noSuchDeviceOrAddress {
                dataStart = sourceOffset + count
            }
            if dataStart > at {
                let targetSize = Int64(try Syscall.fstat(target.fd).st_size)
                let holeAt = destinationOffset + done, holeEnd = min(destinationOffset + (dataStart - sourceOffset), targetSize)
                if holeEnd > holeAt {
                    try Syscall.allocate(target.fd, mode: AllocationMode.punchHole | AllocationMode.keepSize,
                                         offset: holeAt, length: holeEnd - holeAt)
                }
                done = dataStart - sourceOffset
                continue
            }
            let dataEnd = min((try? Syscall.seek(origin.fd, from: at, data: false)) ?? sourceOffset + count, sourceOffset + count)
            var copied: Int64 = 0
            while copied < dataEnd - at {
                let n = try Syscall.copyRange(from: origin.fd, at: at + copied, to: target.fd, at: destinationOffset + done + copied,
                                              length: Int(dataEnd - at - copied))
                guard n > 0 else { break }
                copied += Int64(n)
            }
            done += max(copied, dataEnd - at)
        }
    }
}
