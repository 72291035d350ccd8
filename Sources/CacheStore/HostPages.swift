#if canImport(Glibc)
import Glibc
#endif
import Posix

/// What a large file's data file leaves in the host's page cache, and when its disk works.
///
/// Write-behind: a write that ends past a multiple of `stride` starts the writeback of the
/// stride before that point (outside the store's lock, without waiting). FUSE hands a
/// daemon a stream's writes one at a time, so the disk would otherwise sit idle until the
/// fsync, which then waits for all of it: with it, the fsync waits for the last stride
/// (W13). Random small writes cross a boundary rarely; a file removed soon after may have
/// been written to disk for nothing, as the kernel's own 30 s writeback would have done.
///
/// Drop-behind: the kernel keeps its own copy of every page written or read through the
/// mount (FUSE's page cache), which serves the next reads, so without it a stream's bytes
/// took their memory twice. The host's pages of the strides two and more behind a stream
/// go (`POSIX_FADV_DONTNEED`: pages still dirty or under writeback stay, so each boundary
/// tries the six strides before it too). Only as far back as the stream runs: a file
/// written in place (a database inside) keeps its pages, as a partial write there would
/// read them back from the disk.
///
/// Thread-safety: each stream's position is behind its own lock; the calls on the
/// descriptor are the kernel's to order.
final class HostPages: Sendable {
    static let stride: Int64 = 8 << 20

    /// Where the run of writes that each began where the one before ended started, and
    /// where the last one ended.
    private let writes = Locked((start: Int64(0), end: Int64(0)))
    /// Where the run of reads near one another (within a stride: the kernel's readahead
    /// sends them out of order) started, and the furthest end read.
    private let reads = Locked((start: Int64(0), end: Int64(0)))

    /// `count` bytes were written at `start` of the data file `fd`.
    func wrote(_ fd: Int32, from start: Int64, count: Int) {
        let end = start + Int64(count)
        let streamStart = writes.withLock { stream in
            if start != stream.end { stream.start = start }
            stream.end = end
            return stream.start
        }
        guard end / Self.stride > start / Self.stride else { return }
        let boundary = end / Self.stride * Self.stride
        Syscall.startWriteBack(fd, offset: boundary - Self.stride, length: Self.stride)
        Self.drop(fd, behind: boundary, since: streamStart)
    }

    /// `count` bytes were read at `start` of the data file `fd`.
    func read(_ fd: Int32, from start: Int64, count: Int) {
        let end = start + Int64(count)
        let (streamStart, before) = reads.withLock { stream in
            let before = stream.end
            if abs(start - stream.end) > Self.stride { stream = (start, end) }
            stream.end = max(stream.end, end)
            return (stream.start, before)
        }
        guard end / Self.stride > before / Self.stride else { return }
        Self.drop(fd, behind: end / Self.stride * Self.stride, since: streamStart)
    }

    /// Drops the pages from `streamStart` (at most eight strides back) to two strides
    /// before `boundary`.
    private static func drop(_ fd: Int32, behind boundary: Int64, since streamStart: Int64) {
        let behind = boundary - 2 * stride
        let from = max(streamStart, behind - 6 * stride)
        if behind > from { Syscall.dropCachedPages(fd, offset: from, length: behind - from) }
    }
}
