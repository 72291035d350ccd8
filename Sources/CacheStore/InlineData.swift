#if canImport(Glibc)
import Glibc
#endif
import Posix

/// Small files' writes not yet in the database: per inode, the file's bytes (at most
/// `CacheStore.inlineLimit`, the run from its start), its size and modification time.
///
/// A 512-byte append to a 60 KiB row would otherwise rewrite the row (and its overflow
/// pages) in a savepoint of its own. Here it is a copy into memory; the bytes go to the
/// database as one row at the file's last close, at fsync, before a rename over another
/// file, `bufferDelay` after the first buffered write, or when all buffers exceed
/// `bufferLimit`. Reads are served from the buffer. A crash loses what was buffered and not
/// fsynced, never more, and never leaves half a change.
///
/// Thread-safety: a value inside `CacheStore`, behind its lock.
struct InlineBuffers {
    /// One small file being written.
    ///
    /// Thread-safety: a value, behind `CacheStore`'s lock.
    struct File {
        /// The file's bytes from its start (the rest up to `size` reads as zeros).
        var bytes: [UInt8]
        var size: Int64
        var modified: Int64
        /// Whether its mode has set-ID bits a write by a caller without CAP_FSETID drops
        /// (every change of mode goes through `setAttributes`, which stores the buffer first).
        var setID: Bool
    }

    var files: [Int64: File] = [:]
    /// Bytes held by all buffers.
    var bytes = 0
    /// When the oldest buffered write came (nil: nothing buffered).
    var since: ContinuousClock.Instant?

    /// An inode as read from its row, with the size and times of writes still buffered.
    func overlay(_ inode: CacheInode) -> CacheInode {
        guard let file = files[inode.ino] else { return inode }
        var inode = inode
        inode.size = file.size
        inode.storedBytes = Int64(file.bytes.count)
        inode.modificationNanoseconds = file.modified
        inode.changeNanoseconds = max(inode.changeNanoseconds, file.modified)
        return inode
    }

    mutating func put(_ ino: Int64, _ file: File) {
        bytes += file.bytes.count - (files[ino]?.bytes.count ?? 0)
        files[ino] = file
        if since == nil { since = .now }
    }

    /// Forgets an inode's buffer (stored, converted, or the inode is gone).
    mutating func discard(_ ino: Int64) {
        guard let file = files.removeValue(forKey: ino) else { return }
        bytes -= file.bytes.count
        if files.isEmpty { since = nil }
    }
}

extension CacheStore {
    /// All buffers together stay under this; past it, buffers are stored down to half.
    static let bufferLimit = 16 << 20
    /// Buffered data reaches the database at most this long after it was written.
    public static let bufferDelay = 0.25

    /// A small file as a write starts from (lock held): its buffer, else its row's bytes.
    func inlineBase(_ inode: CacheInode) throws(Errno) -> InlineBuffers.File {
        if let file = inline.files[inode.ino] { return file }
        return inlineBase(inode, bytes: try storedBytes(inode.ino))
    }

    /// The same with the bytes already read.
    func inlineBase(_ inode: CacheInode, bytes: [UInt8]) -> InlineBuffers.File {
        if let file = inline.files[inode.ino] { return file }
        return InlineBuffers.File(bytes: bytes, size: inode.size, modified: inode.modificationNanoseconds,
                                  setID: SetIDBits.wouldDrop(inode.mode))
    }

    /// An inode's row and, for a small file, its bytes (empty for a large one), in one query
    /// (lock held).
    func storedInodeAndBytes(_ ino: Int64) throws(Errno) -> (CacheInode, [UInt8]) {
        let statement = try statement("""
            SELECT i.ino, i.mode, i.uid, i.gid, i.size, i.links, i.atime, i.mtime, i.ctime, i.rdev, i.target, i.stored, i.data, c.data
            FROM inodes i LEFT JOIN contents c ON c.ino = i.ino WHERE i.ino = ?
            """)
        statement.bind(ino)
        defer { statement.done() }
        guard try row(statement) else { throw .noSuchFileOrDirectory }
        return (Self.inode(statement), statement.bytes(13))
    }

    /// A small file's bytes as the database holds them (lock held).
    func storedBytes(_ ino: Int64) throws(Errno) -> [UInt8] {
        let statement = try statement("SELECT data FROM contents WHERE ino = ?")
        statement.bind(ino)
        defer { statement.done() }
        return try row(statement) ? statement.bytes(0) : []
    }

    /// Copies a small file's bytes from `offset` into `buffer` (zeroed by the caller), from
    /// its buffer or its row (lock held).
    func readInline(_ ino: Int64, offset: Int64, into buffer: UnsafeMutableRawBufferPointer) throws(Errno) {
        func copy(_ bytes: UnsafeRawBufferPointer) {
            guard offset < Int64(bytes.count) else { return }
            let count = min(buffer.count, bytes.count - Int(offset))
            buffer.copy(UnsafeRawBufferPointer(rebasing: bytes[Int(offset)..<(Int(offset) + count)]), to: 0)
        }
        if let file = inline.files[ino] {
            file.bytes.withUnsafeBytes { copy($0) }
            return
        }
        let statement = try statement("SELECT data FROM contents WHERE ino = ?")
        statement.bind(ino)
        defer { statement.done() }
        if try row(statement) { copy(statement.blob(0)) }
    }

    /// Stores `ino`'s buffer as its row (lock held, inside a change). The buffer is dropped
    /// only once both statements succeeded: a failure (rolled back with the change) keeps it.
    func storeBuffer(_ ino: Int64) throws(Errno) {
        guard let file = inline.files[ino] else { return }
        if file.bytes.isEmpty {
            try run("DELETE FROM contents WHERE ino = ?", ino)
        } else {
            try run("INSERT OR REPLACE INTO contents(ino, data) VALUES(?, ?)", ino, file.bytes)
        }
        try run("UPDATE inodes SET size = ?, stored = ?, mtime = ?, ctime = max(ctime, ?) WHERE ino = ?",
                file.size, Int64(file.bytes.count), file.modified, file.modified, ino)
        batchBytes += file.bytes.count
        inline.discard(ino)
    }

    func storeAllBuffers() throws(Errno) { _ = try storeSomeBuffers(atLeast: .max) }

    /// Stores buffers, file by file, until at least `bytes` are written or none is left
    /// (lock held, inside a change); the bytes written.
    func storeSomeBuffers(atLeast bytes: Int) throws(Errno) -> Int {
        var written = 0
        for ino in Array(inline.files.keys) where written < bytes {
            written += inline.files[ino]?.bytes.count ?? 0
            try storeBuffer(ino)
        }
        return written
    }

    /// For the committing thread: once the oldest buffer is `bufferDelay` old, stores the
    /// buffers in slices of about `storeSlice` bytes with the lock let go between them (a
    /// write that comes meanwhile waits for one slice). A failure (a full disk) is said once and tried again later, waiting longer each
    /// time (up to 5 s): the buffers stay, fsync reports the error.
    public func storeBuffersWhenDue() {
        var left = Int.max  // what was buffered at the first pass
        while true {
            let more = lock.withLock { () -> Bool in
                guard !closed else { return false }
                guard let since = inline.since, since.secondsElapsed >= Self.bufferDelay + storeBackoff else { return false }
                if left == .max { left = inline.bytes }
                do throws(Errno) {
                    let written = try change { () throws(Errno) -> Int in try storeSomeBuffers(atLeast: Self.storeSlice) }
                    storeBackoff = 0
                    left -= written
                } catch {
                    if storeBackoff == 0 { Log.error("cache: buffered data could not be stored (trying again): \(error)") }
                    storeBackoff = min(5, max(0.25, storeBackoff * 2))
                    return false
                }
                return left > 0 && !inline.files.isEmpty
            }
            if !more { return }
        }
    }

    /// Bytes of buffers one slice of `storeBuffersWhenDue` writes (at least).
    static let storeSlice = 1 << 20

    /// When the oldest buffer is due (nil: nothing buffered), for the committing thread.
    public var buffersDue: Double? {
        lock.withLock { inline.since.map { max(0.01, Self.bufferDelay + storeBackoff - $0.secondsElapsed) } }
    }
}

extension UnsafeMutableRawBufferPointer {
    /// Copies `source` to `offset` of this buffer (the range lies inside it; an empty
    /// source, whose start may be nil, copies nothing).
    func copy(_ source: UnsafeRawBufferPointer, to offset: Int) {
        UnsafeMutableRawBufferPointer(rebasing: self[offset..<(offset + source.count)]).copyMemory(from: source)
    }
}
