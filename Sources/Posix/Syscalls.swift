#if canImport(Glibc)
import Glibc
#endif
import CPosixShims

/// libc calls for files and processes, as most of mtmfs makes them.
///
/// Each function returns its result or throws the `Errno` the call set, retrying `EINTR`
/// where the call may be restarted. Which modules call libc directly instead, and why, is
/// listed in `docs/design.md` ("Where libc is called").
///
/// Thread-safety: stateless; `errno` is per thread.
public enum Syscall {
    /// Runs `body` until it returns something other than -1 with `EINTR`; -1 becomes a thrown `Errno`.
    @inline(__always)
    public static func valueOrErrno<T: FixedWidthInteger>(
        retryOnInterrupt: Bool = true, _ body: () -> T
    ) throws(Errno) -> T {
        while true {
            let result = body()
            if result != -1 { return result }
            let error = Errno.current
            if retryOnInterrupt && error == .interrupted { continue }
            throw error
        }
    }

    public static func open(_ path: String, _ flags: Int32, mode: mode_t = 0) throws(Errno) -> Int32 {
        try valueOrErrno { mtmfs_open(path, flags | O_CLOEXEC, UInt32(mode)) }
    }

    /// An `O_PATH` descriptor: names the file (for `fstat`, `fstatfs`) without opening it for
    /// reading or writing, and keeps it from being freed while held.
    /// With `noFollow`, a symbolic link itself, not what it points to.
    public static func openPath(_ path: String, noFollow: Bool = false) throws(Errno) -> Int32 {
        try open(path, MTMFS_O_PATH | (noFollow ? O_NOFOLLOW : 0))
    }

    public static func openat(_ dirfd: Int32, _ path: String, _ flags: Int32, mode: mode_t = 0) throws(Errno) -> Int32 {
        try valueOrErrno { mtmfs_openat(dirfd, path, flags | O_CLOEXEC, UInt32(mode)) }
    }

    public static func close(_ fd: Int32) {
        // close is never retried on Linux: the descriptor is gone even on EINTR.
        _ = Glibc.close(fd)
    }

    /// Writes all of `bytes`, looping over short writes: at the file's offset, or with
    /// `pwrite` at `position` when given.
    public static func writeAll(_ fd: Int32, _ bytes: UnsafeRawBufferPointer, at position: Int? = nil) throws(Errno) {
        var offset = 0
        while offset < bytes.count {
            let start = bytes.baseAddress! + offset, count = bytes.count - offset
            let n = try valueOrErrno {
                if let position { Glibc.pwrite(fd, start, count, off_t(position + offset)) } else { Glibc.write(fd, start, count) }
            }
            offset += n
        }
    }

    public static func writeAll(_ fd: Int32, _ bytes: [UInt8], at position: Int? = nil) throws(Errno) {
        let result: Result<Void, Errno> = bytes.withUnsafeBytes { buffer in
            do throws(Errno) { try writeAll(fd, buffer, at: position); return .success(()) } catch { return .failure(error) }
        }
        try result.get()
    }

    /// One `read` into `buffer` (EINTR retried): the count read, 0 at end of file.
    public static func read(_ fd: Int32, into buffer: UnsafeMutableRawBufferPointer) throws(Errno) -> Int {
        guard let base = buffer.baseAddress, buffer.count > 0 else { return 0 }
        return try valueOrErrno { Glibc.read(fd, base, buffer.count) }
    }

    /// Fills `buffer` from `fd`, looping over short reads: false at an early end of file.
    public static func readExactly(_ fd: Int32, into buffer: UnsafeMutableRawBufferPointer) throws(Errno) -> Bool {
        var done = 0
        while done < buffer.count {
            let n = try read(fd, into: UnsafeMutableRawBufferPointer(rebasing: buffer[done...]))
            if n == 0 { return false }
            done += n
        }
        return true
    }

    /// Runs `body` with SIGPIPE blocked on this thread: a write to a pipe whose reader is
    /// gone fails with EPIPE instead of ending the process (one that does not ignore SIGPIPE
    /// itself: a test runner, a command). A SIGPIPE raised meanwhile is taken, not delivered.
    public static func withoutBrokenPipeSignal<T>(_ body: () -> T) -> T {
        var pipeSignal = sigset_t()
        sigemptyset(&pipeSignal)
        sigaddset(&pipeSignal, SIGPIPE)
        var previous = sigset_t()
        pthread_sigmask(SIG_BLOCK, &pipeSignal, &previous)
        defer {
            var pending = sigset_t()
            sigpending(&pending)
            if sigismember(&pending, SIGPIPE) == 1 && sigismember(&previous, SIGPIPE) == 0 {
                var now = timespec()
                _ = sigtimedwait(&pipeSignal, nil, &now)
            }
            pthread_sigmask(SIG_SETMASK, &previous, nil)
        }
        return body()
    }

    /// Reads until end of file.
    public static func readAll(_ fd: Int32) throws(Errno) -> [UInt8] {
        var result: [UInt8] = []
        var chunk = [UInt8](repeating: 0, count: 65536)
        while true {
            let n = try chunk.withUnsafeMutableBytes { buffer in
                Result { () throws(Errno) in try valueOrErrno { Glibc.read(fd, buffer.baseAddress!, buffer.count) } }
            }.get()
            if n == 0 { return result }
            result.append(contentsOf: chunk[0..<n])
        }
    }

    public static func fsync(_ fd: Int32) throws(Errno) {
        _ = try valueOrErrno { Glibc.fsync(fd) }
    }

    /// Every file of the file system that holds `path` made durable (`syncfs`): for files
    /// written by another program that did not sync them (git's checkout and objects).
    public static func syncFileSystem(holding path: String) throws(Errno) {
        let fd = try open(path, O_RDONLY | O_CLOEXEC)
        defer { close(fd) }
        _ = try valueOrErrno { mtmfs_syncfs(fd) }
    }

    /// The data and what is needed to read it back (the size), not the times: a file
    /// overwritten in place is synced without a journal commit.
    public static func fdatasync(_ fd: Int32) throws(Errno) {
        _ = try valueOrErrno { Glibc.fdatasync(fd) }
    }

    /// Starts the writeback of the dirty pages in `length` bytes at `offset` and returns
    /// (`SYNC_FILE_RANGE_WRITE`): nothing is made durable by it, but a later fsync finds
    /// less left to write. Best effort: a failure changes nothing that matters.
    public static func startWriteBack(_ fd: Int32, offset: Int64, length: Int64) {
        _ = try? valueOrErrno { mtmfs_start_writeback(fd, offset, length) }
    }

    /// Drops the clean pages of `length` bytes at `offset` from the page cache
    /// (`POSIX_FADV_DONTNEED`); pages still dirty or under writeback stay. Best effort.
    public static func dropCachedPages(_ fd: Int32, offset: Int64, length: Int64) {
        _ = posix_fadvise(fd, off_t(offset), off_t(length), POSIX_FADV_DONTNEED)
    }

    /// Takes an exclusive `flock` on `fd` without waiting: `.tryAgain` when another open
    /// file description holds it. The lock goes with the last descriptor of that description
    /// (so with the process, however it ends).
    public static func lockExclusively(_ fd: Int32) throws(Errno) {
        _ = try valueOrErrno { mtmfs_flock(fd, LOCK_EX | LOCK_NB) }
    }

    public static func truncate(_ fd: Int32, to length: Int64) throws(Errno) {
        _ = try valueOrErrno { Glibc.ftruncate(fd, off_t(length)) }
    }

    public static func rename(_ from: String, _ to: String) throws(Errno) {
        _ = try valueOrErrno { Glibc.rename(from, to) }
    }

    public static func unlink(_ path: String) throws(Errno) {
        _ = try valueOrErrno { Glibc.unlink(path) }
    }

    public static func removeDirectory(_ path: String) throws(Errno) {
        _ = try valueOrErrno { Glibc.rmdir(path) }
    }

    public static func mkdir(_ path: String, mode: mode_t) throws(Errno) {
        _ = try valueOrErrno { Glibc.mkdir(path, mode) }
    }

    public static func chmod(_ path: String, mode: mode_t) throws(Errno) {
        _ = try valueOrErrno { Glibc.chmod(path, mode) }
    }

    public static func stat(_ path: String) throws(Errno) -> stat {
        var st = Glibc.stat()
        _ = try valueOrErrno { fstatat(AT_FDCWD, path, &st, 0) }
        return st
    }

    public static func lstat(_ path: String) throws(Errno) -> stat {
        var st = Glibc.stat()
        _ = try valueOrErrno { fstatat(AT_FDCWD, path, &st, AT_SYMLINK_NOFOLLOW) }
        return st
    }

    public static func access(_ path: String, _ mode: Int32) throws(Errno) {
        _ = try valueOrErrno { Glibc.access(path, mode) }
    }

    /// The whole file at `path` (open, read to the end, close).
    public static func readFile(_ path: String) throws(Errno) -> [UInt8] {
        let fd = try open(path, O_RDONLY | O_CLOEXEC)
        defer { close(fd) }
        return try readAll(fd)
    }

    /// Waits until one of `descriptors` can be read (or has hung up): those that can.
    public static func waitReadable(_ descriptors: [Int32]) -> [Int32] {
        var polled = descriptors.map { pollfd(fd: $0, events: Int16(POLLIN), revents: 0) }
        while poll(&polled, nfds_t(polled.count), -1) < 0 && errno == EINTR {}
        return polled.filter { $0.revents != 0 }.map(\.fd)
    }

    /// The link count and file type (`S_IFMT` bits) the kernel keeps for `fd` (an `O_PATH`
    /// descriptor) from the lookup that found it, without asking the file system again.
    public static func cachedLinkCount(_ fd: Int32) throws(Errno) -> (count: UInt32, type: mode_t) {
        var count: UInt32 = 0, mode: UInt32 = 0
        _ = try valueOrErrno { mtmfs_cached_link_count(fd, &count, &mode) }
        return (count, mode_t(mode) & S_IFMT)
    }

    /// The target of the symbolic link `fd` names (an `O_PATH | O_NOFOLLOW` descriptor).
    public static func linkTarget(_ fd: Int32) throws(Errno) -> String {
        var buffer = [CChar](repeating: 0, count: Int(PATH_MAX))
        let length = try valueOrErrno { readlinkat(fd, "", &buffer, buffer.count) }
        return String(decoding: buffer.prefix(length).map { UInt8(bitPattern: $0) }, as: UTF8.self)
    }

    /// The names in a directory, without "." and "..".
    public static func listDirectory(_ path: String) throws(Errno) -> [String] {
        guard let dir = opendir(path) else { throw Errno.current }
        defer { closedir(dir) }
        var names: [String] = []
        while let entry = readdir(dir) {
            let name = withUnsafePointer(to: entry.pointee.d_name) {
                $0.withMemoryRebound(to: CChar.self, capacity: 256) { String(cString: $0) }
            }
            if name != "." && name != ".." { names.append(name) }
        }
        return names
    }

    /// A pipe whose ends close on exec (atomically: a child another thread spawns meanwhile
    /// inherits neither).
    public static func pipe() throws(Errno) -> (read: Int32, write: Int32) {
        var fds: [Int32] = [0, 0]
        _ = try valueOrErrno { mtmfs_pipe_cloexec(&fds) }
        return (fds[0], fds[1])
    }

    /// Bytes available to an unprivileged writer on the file system holding `path`.
    public static func availableBytes(onFileSystemOf path: String) throws(Errno) -> UInt64 {
        var fs = Glibc.statvfs()
        let rc: Int32 = statvfs(path, &fs)
        guard rc == 0 else { throw Errno.current }
        return UInt64(fs.f_bavail) * UInt64(fs.f_frsize)
    }

    /// Makes the process not dumpable (no core file, no ptrace by other users) and sets the
    /// core-file size limit to zero.
    public static func forbidCoreDumps() throws(Errno) {
        _ = try valueOrErrno { mtmfs_prctl_set_dumpable(0) }
        _ = try valueOrErrno { mtmfs_disable_core_files() }
    }

    /// Raises the soft limit of open descriptors to the hard one: the daemon holds one per
    /// open large file of `cache/`, and 1,024 (a common soft limit) is few for a file server.
    public static func raiseOpenFileLimit() throws(Errno) {
        _ = try valueOrErrno { mtmfs_raise_open_file_limit() }
    }

    /// Gives the free pages of the heap back to the system (glibc's `malloc_trim`): after a
    /// burst of allocations that will not come back soon (opening every record of a vault).
    public static func trimHeap() {
        _ = mtmfs_malloc_trim()
    }

    /// Caps glibc's malloc arenas at `count` (`M_ARENA_MAX`), before threads start: by
    /// default each request thread that meets a busy arena gets one of its own, and memory
    /// freed in eight arenas stays resident, in pieces `malloc_trim` cannot give back
    /// (measured: a burst of 3,000 field saves at 2,000 accounts left 6.5 MB more resident
    /// with eight, 2.5 MB with two, the same live heap).
    public static func limitHeapArenas(_ count: Int32) {
        _ = mtmfs_limit_malloc_arenas(count)
    }
}
