#if canImport(Glibc)
import Glibc
#endif
import CPosixShims

/// The calls on a file's bytes that the cache's data files are served by: positioned reads,
/// attributes, sparse-file operations and in-kernel copies.
extension Syscall {
    /// One `pread` into `buffer` at `position` (EINTR retried, short reads looped): the
    /// count read, less than the buffer only at end of file.
    public static func read(_ fd: Int32, into buffer: UnsafeMutableRawBufferPointer, at position: Int64) throws(Errno) -> Int {
        var done = 0
        while done < buffer.count {
            let n = try valueOrErrno { Glibc.pread(fd, buffer.baseAddress! + done, buffer.count - done, off_t(position + Int64(done))) }
            if n == 0 { break }
            done += n
        }
        return done
    }

    public static func fstat(_ fd: Int32) throws(Errno) -> stat {
        var st = Glibc.stat()
        _ = try valueOrErrno { Glibc.fstat(fd, &st) }
        return st
    }

    /// `fallocate(2)` with the flags as given (preallocate, keep size, punch hole, zero range).
    public static func allocate(_ fd: Int32, mode: Int32, offset: Int64, length: Int64) throws(Errno) {
        _ = try valueOrErrno { mtmfs_fallocate(fd, mode, offset, length) }
    }

    /// `lseek(2)` with `SEEK_DATA` (`data`) or `SEEK_HOLE`: ENXIO past the end or the last data.
    public static func seek(_ fd: Int32, from offset: Int64, data: Bool) throws(Errno) -> Int64 {
        Int64(try valueOrErrno { Glibc.lseek(fd, off_t(offset), data ? 3 : 4) })
    }

    /// `copy_file_range(2)` of up to `length` bytes between two descriptors (a reflink where
    /// the file system shares extents): the count copied, 0 at the source's end.
    public static func copyRange(from source: Int32, at sourceOffset: Int64, to destination: Int32, at destinationOffset: Int64,
                                 length: Int) throws(Errno) -> Int {
        var from = sourceOffset, to = destinationOffset
        return Int(try valueOrErrno { mtmfs_copy_file_range(source, &from, destination, &to, length) })
    }

    /// Sets a file's modification time (the access time left as it is).
    public static func setModificationTime(_ fd: Int32, seconds: Int64, nanoseconds: Int64) throws(Errno) {
        let omit = (1 << 30) - 2  // UTIME_OMIT (a macro Swift does not import): the access time stays
        var times = [timespec(tv_sec: 0, tv_nsec: omit), timespec(tv_sec: Int(seconds), tv_nsec: Int(nanoseconds))]
        _ = try valueOrErrno { futimens(fd, &times) }
    }
}
