#if canImport(Glibc)
import Glibc
#endif
import Posix

/// File data written through the store and not yet in the database: the chunks that small
/// writes are filling, per inode, with the file's new size and modification time.
///
/// A write of 4 KiB into a 64 KiB chunk row would otherwise read and rewrite the whole row
/// in its own savepoint. Here it is a copy into memory; the chunk goes to the database
/// once it is whole, or when the data must be there: a read of the file, a change to its
/// size, times or blocks, an fsync, the last close, `CacheStore.dirtyDelay` after the first
/// buffered write, or when all buffers together exceed `CacheStore.dirtyLimit`. A crash
/// loses what was buffered and not fsynced, never more, and never leaves half a change.
///
/// Thread-safety: none; it lives inside `CacheStore`, behind its lock.
struct DirtyChunks {
    /// One chunk being written: the pieces written, each with its bytes (what lies between
    /// them is unknown until merged with the stored row). Only what was written is held: a
    /// few 4 KiB writes scattered over a chunk buffer a few 4 KiB, not the chunk up to them.
    ///
    /// Thread-safety: a value inside `DirtyChunks`, behind `CacheStore`'s lock.
    struct Chunk {
        /// Sorted, disjoint, not touching.
        private(set) var pieces: [(range: Range<Int>, bytes: [UInt8])] = []
        /// Bytes buffered: what the pieces hold.
        private(set) var count = 0

        var isWhole: Bool { pieces.count == 1 && pieces.first?.range == 0..<CacheStore.chunkSize }
        mutating func write(_ data: UnsafeRawBufferPointer, at offset: Int) {
            guard data.count > 0 else { return }
            let new = offset..<(offset + data.count)
            // The pieces it overlaps or touches become one with it.
            let first = pieces.firstIndex { $0.range.upperBound >= new.lowerBound } ?? pieces.count
            var last = first
            while last < pieces.count && pieces[last].range.lowerBound <= new.upperBound { last += 1 }
            if last - first == 1 && pieces[first].range.lowerBound <= new.lowerBound {
                // Within or past the end of one piece (a sequential writer): grown in place.
                let base = pieces[first].range.lowerBound
                let grow = new.upperBound - pieces[first].range.upperBound
                if grow > 0 {
                    pieces[first].bytes.append(contentsOf: repeatElement(0, count: grow))
                    pieces[first].range = base..<new.upperBound
                    count += grow
                }
                pieces[first].bytes.withUnsafeMutableBytes { $0.copy(data, to: new.lowerBound - base) }
                return
            }
            let merging = pieces[first..<last]
            let union = min(new.lowerBound, merging.first?.range.lowerBound ?? new.lowerBound)
                ..< max(new.upperBound, merging.last?.range.upperBound ?? new.upperBound)
            var bytes = [UInt8](repeating: 0, count: union.count)
            bytes.withUnsafeMutableBytes { buffer in
                for piece in merging { piece.bytes.withUnsafeBytes { buffer.copy($0, to: piece.range.lowerBound - union.lowerBound) } }
                buffer.copy(data, to: new.lowerBound - union.lowerBound)
            }
            count += union.count - merging.reduce(0) { $0 + $1.range.count }
            pieces.replaceSubrange(first..<last, with: [(union, bytes)])
        }

        /// The whole chunk's bytes (`isWhole`).
        var whole: [UInt8] { pieces.first?.bytes ?? [] }
    }

    /// One inode's buffered chunks, with the size and modification time they give it.
    ///
    /// Thread-safety: a value inside `DirtyChunks`, behind `CacheStore`'s lock.
    struct File {
        var chunks: [Int64: Chunk] = [:]
        var size: Int64
        var modified: Int64
        /// Whether its mode has set-ID bits a write by a caller without CAP_FSETID drops (every
        /// change of mode goes through `setAttributes`, which takes the buffers out first).
        var setID: Bool
        /// Bytes buffered (at most what the chunks will add to the stored bytes).
        var buffered: Int { chunks.values.reduce(0) { $0 + $1.count } }
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
        inode.modificationNanoseconds = file.modified
        inode.changeNanoseconds = max(inode.changeNanoseconds, file.modified)
        // Blocks count buffered data too (`du` right after a write is not 0).
        inode.storedBytes = max(inode.storedBytes, min(inode.size, inode.storedBytes + Int64(file.buffered)))
        return inode
    }

    /// Forgets an inode's buffers (the inode is gone, or its data was cut off).
    mutating func discard(_ ino: Int64) {
        guard let file = files.removeValue(forKey: ino) else { return }
        bytes -= file.chunks.values.reduce(0) { $0 + $1.count }
        if files.isEmpty { since = nil }
    }
}

extension CacheStore {
    /// All buffers together stay under this; past it, everything buffered is written.
    static let dirtyLimit = 16 << 20
    /// Buffered data reaches the database at most this long after it was written.
    public static let dirtyDelay = 0.25

    /// Writes `ino`'s buffered chunks (those in `only`, or all) into the database, with its
    /// size and modification time (lock held, inside a change). The buffers are dropped only
    /// once every statement succeeded: a failure (rolled back with the change) keeps them.
    func flushDirty(_ ino: Int64, only indices: [Int64]? = nil, blobs: BlobWriter? = nil) throws(Errno) {
        guard let file = dirty.files[ino] else { return }
        let writer = blobs ?? BlobWriter(database, table: "chunks", column: "data")
        defer { if blobs == nil { writer.close() } }
        var stored: Int64 = 0
        let flushed = (indices ?? Array(file.chunks.keys)).filter { file.chunks[$0] != nil }.sorted()
        for index in flushed {
            guard let chunk = file.chunks[index] else { continue }
            if chunk.isWhole {
                stored += try putWholeChunk(ino, index, chunk.whole)
                continue
            }
            // The pieces written go where they lie: in place into a stored piece that covers
            // them, else as pieces of their own (merged with those they touch).
            var pieces = try chunkPieces(ino, index)
            let appending = index == (file.size - 1) / Int64(Self.chunkSize)
            for piece in chunk.pieces {
                var failure: Errno?
                piece.bytes.withUnsafeBytes { bytes in
                    do throws(Errno) {
                        stored += try storePiece(ino, index, at: piece.range, bytes, pieces: &pieces, room: appending, writer: writer)
                    } catch {
                        failure = error
                    }
                }
                if let failure { throw failure }
            }
            batchBytes += chunk.count
        }
        // The size goes with every flush: a chunk stored past the recorded size must never
        // show up later as old data when the file grows (a crash may leave zeros, no more).
        try run("UPDATE inodes SET size = max(size, ?), stored = stored + ?, mtime = ?, ctime = max(ctime, ?) WHERE ino = ?",
                file.size, stored, file.modified, file.modified, ino)
        var remaining = file
        dirty.files[ino] = nil
        for index in flushed {
            dirty.bytes -= remaining.chunks.removeValue(forKey: index)?.count ?? 0
        }
        if !remaining.chunks.isEmpty { dirty.files[ino] = remaining }
        if dirty.files.isEmpty { dirty.since = nil }
    }

    func flushAllDirty() throws(Errno) { _ = try flushSomeDirty(atLeast: .max) }

    /// For the committing thread: writes every buffer once the oldest is `dirtyDelay` old,
    /// in slices of about `flushSlice` bytes with the store's lock let go between them (a
    /// write that comes meanwhile waits for one slice, not for every buffer: 20 MB of them
    /// took 75 ms). Stops once as much as was buffered at the start is written.
    /// A failure (a full disk, say) is said once and tried again later, waiting longer each
    /// time (up to 5 s): the buffers stay, fsync reports the error.
    public func flushDirtyWhenDue() {
        var left = Int.max  // what was buffered at the first pass
        while true {
            let more = lock.withLock { () -> Bool in
                guard !closed, let since = dirty.since, since.secondsElapsed >= Self.dirtyDelay + dirtyBackoff else { return false }
                if left == .max { left = dirty.bytes }
                do throws(Errno) {
                    let written = try change { () throws(Errno) -> Int in try flushSomeDirty(atLeast: Self.flushSlice) }
                    dirtyBackoff = 0
                    left -= written
                } catch {
                    if dirtyBackoff == 0 { Log.error("cache: buffered data could not be stored (trying again): \(error)") }
                    dirtyBackoff = min(5, max(0.25, dirtyBackoff * 2))
                    return false
                }
                return left > 0 && !dirty.files.isEmpty
            }
            if !more { return }
        }
    }

    /// Bytes of buffers one slice of `flushDirtyWhenDue` writes (at least).
    static let flushSlice = 1 << 20

    /// Writes buffered chunks, file by file and chunk by chunk, until at least `bytes` are
    /// written or nothing is left (lock held, inside a change); the bytes written.
    func flushSomeDirty(atLeast bytes: Int) throws(Errno) -> Int {
        let writer = BlobWriter(database, table: "chunks", column: "data")
        defer { writer.close() }
        var written = 0
        for ino in Array(dirty.files.keys) {
            guard written < bytes, let file = dirty.files[ino] else { break }
            var chosen: [Int64] = []
            for (index, chunk) in file.chunks.sorted(by: { $0.key < $1.key }) where written < bytes {
                chosen.append(index)
                written += chunk.count
            }
            try flushDirty(ino, only: chosen, blobs: writer)
        }
        return written
    }

    /// When the oldest buffer is due (nil: nothing buffered), for the committing thread.
    public var dirtyDue: Double? {
        lock.withLock { dirty.since.map { max(0.01, Self.dirtyDelay + dirtyBackoff - $0.secondsElapsed) } }
    }
}

extension UnsafeMutableRawBufferPointer {
    /// Copies `source` to `offset` of this buffer (the range lies inside it; an empty
    /// source, whose start may be nil, copies nothing).
    func copy(_ source: UnsafeRawBufferPointer, to offset: Int) {
        UnsafeMutableRawBufferPointer(rebasing: self[offset..<(offset + source.count)]).copyMemory(from: source)
    }
}
