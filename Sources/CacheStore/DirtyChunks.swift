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
    /// One chunk being written: the bytes written (at their offsets in the chunk; what lies
    /// between them is unknown until merged with the stored row) and which ranges they are.
    ///
    /// Thread-safety: a value inside `DirtyChunks`, behind `CacheStore`'s lock.
    struct Chunk {
        var bytes: [UInt8] = []
        /// Sorted, disjoint, not touching.
        var covered: [Range<Int>] = []

        var isWhole: Bool { covered.count == 1 && covered[0] == 0..<CacheStore.chunkSize }

        mutating func write(_ data: UnsafeRawBufferPointer, at offset: Int) {
            let end = offset + data.count
            if bytes.count < end { bytes += [UInt8](repeating: 0, count: end - bytes.count) }
            bytes.withUnsafeMutableBytes { $0.baseAddress!.advanced(by: offset).copyMemory(from: data.baseAddress!, byteCount: data.count) }
            var merged = offset..<end
            var kept: [Range<Int>] = []
            for range in covered {
                if range.upperBound < merged.lowerBound || range.lowerBound > merged.upperBound {
                    kept.append(range)
                } else {
                    merged = min(range.lowerBound, merged.lowerBound)..<max(range.upperBound, merged.upperBound)
                }
            }
            kept.append(merged)
            covered = kept.sorted { $0.lowerBound < $1.lowerBound }
        }

        /// `stored` (the row's bytes, a preallocated row already expanded to zeros) with the
        /// written ranges laid over it.
        func merged(into stored: [UInt8]) -> [UInt8] {
            var result = stored
            let end = covered.last?.upperBound ?? 0
            if result.count < end { result += [UInt8](repeating: 0, count: end - result.count) }
            for range in covered { result.replaceSubrange(range, with: bytes[range]) }
            return result
        }
    }

    /// One inode's buffered chunks, with the size and modification time they give it.
    ///
    /// Thread-safety: a value inside `DirtyChunks`, behind `CacheStore`'s lock.
    struct File {
        var chunks: [Int64: Chunk] = [:]
        var size: Int64
        var modified: Int64
        /// Bytes buffered (at most what the chunks will add to the stored bytes).
        var buffered: Int { chunks.values.reduce(0) { $0 + $1.bytes.count } }
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
        bytes -= file.chunks.values.reduce(0) { $0 + $1.bytes.count }
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
            let chunk = file.chunks[index]!
            if chunk.isWhole {
                stored += try putWholeChunk(ino, index, chunk.bytes)
                continue
            } else if let row = try chunkRow(ino, index), row.length >= chunk.covered.last!.upperBound {
                // A stored row long enough: the written ranges go in place, page by page.
                for range in chunk.covered {
                    let failure = chunk.bytes[range].withUnsafeBytes { bytes -> SQLiteError? in
                        do throws(SQLiteError) {
                            try writer.write(row: row.id, offset: range.lowerBound, bytes)
                            return nil
                        } catch {
                            return error
                        }
                    }
                    if let failure { throw Self.errno(failure) }
                }
            } else {
                let (existing, before) = try chunkForUpdate(ino, index)
                var merged = chunk.merged(into: existing)
                // Appended to, the file's last chunk gets room to grow (zeros past the end,
                // up to twice what it held): the appends that follow go in place, page by
                // page, instead of each rewriting the whole row (a log or a database's
                // write-ahead log grows by a few KiB an fsync).
                let lastIndex = (file.size - 1) / Int64(Self.chunkSize)
                if index == lastIndex, !existing.isEmpty, merged.count > existing.count {
                    let room = min(Self.chunkSize, max(merged.count, existing.count * 2))
                    merged += [UInt8](repeating: 0, count: room - merged.count)
                }
                try putChunk(ino, index, merged)
                stored += Int64(merged.count) - before
            }
            batchBytes += chunk.bytes.count
        }
        // The size goes with every flush: a chunk stored past the recorded size must never
        // show up later as old data when the file grows (a crash may leave zeros, no more).
        try run("UPDATE inodes SET size = max(size, ?), stored = stored + ?, mtime = ?, ctime = max(ctime, ?) WHERE ino = ?",
                file.size, stored, file.modified, file.modified, ino)
        var remaining = dirty.files.removeValue(forKey: ino)!
        for index in flushed {
            dirty.bytes -= remaining.chunks.removeValue(forKey: index)!.bytes.count
        }
        if !remaining.chunks.isEmpty { dirty.files[ino] = remaining }
        if dirty.files.isEmpty { dirty.since = nil }
    }

    func flushAllDirty() throws(Errno) {
        let writer = BlobWriter(database, table: "chunks", column: "data")
        defer { writer.close() }
        for ino in Array(dirty.files.keys) { try flushDirty(ino, blobs: writer) }
    }

    /// For the committing thread: writes every buffer once the oldest is `dirtyDelay` old.
    /// A failure (a full disk, say) is said once and tried again later, waiting longer each
    /// time (up to 5 s): the buffers stay, fsync reports the error.
    public func flushDirtyWhenDue() {
        lock.withLock {
            guard !closed, let since = dirty.since, since.secondsElapsed >= Self.dirtyDelay + dirtyBackoff else { return }
            do throws(Errno) {
                try change { () throws(Errno) in try flushAllDirty() }
                dirtyBackoff = 0
            } catch {
                if dirtyBackoff == 0 { Log.error("cache: buffered data could not be stored (trying again): \(error)") }
                dirtyBackoff = min(5, max(0.25, dirtyBackoff * 2))
            }
        }
    }

    /// When the oldest buffer is due (nil: nothing buffered), for the committing thread.
    public var dirtyDue: Double? {
        lock.withLock { dirty.since.map { max(0.01, Self.dirtyDelay + dirtyBackoff - $0.secondsElapsed) } }
    }
}
