#if canImport(Glibc)
import Glibc
#endif

/// Durable, atomic replacement of a whole file.
///
/// The new contents go to a temporary file created with `O_EXCL` and the requested mode in
/// the same directory, which is written, fsynced and renamed over the target; the directory
/// is then fsynced. A crash at any instant leaves either the old or the new file, never a
/// mix, and the temporary file never has a mode wider than the final one.
///
/// Thread-safety: stateless; each call makes its own temporary file. Concurrent replaces of
/// one path are not ordered: the last rename wins.
public enum AtomicFile {
    public static func replace(_ path: String, with contents: [UInt8], mode: mode_t = 0o600) throws(Errno) {
        let result = contents.withUnsafeBytes { bytes in Result { () throws(Errno) in try replace(path, with: bytes, mode: mode) } }
        try result.get()
    }

    /// As `replace(_:with:mode:)`, from bytes the caller keeps (a secret's memory).
    public static func replace(_ path: String, with contents: UnsafeRawBufferPointer, mode: mode_t = 0o600) throws(Errno) {
        let directory = parentDirectory(of: path)
        let base = path.split(separator: "/").last.map(String.init) ?? path
        var temporary = ""
        var fd: Int32 = -1
        for attempt in 0..<100 {
            temporary = "\(directory)/.\(base).tmp-\(getpid())-\(attempt)-\(UInt32.random(in: 0...UInt32.max))"
            do {
                fd = try Syscall.open(temporary, O_WRONLY | O_CREAT | O_EXCL, mode: mode)
                break
            } catch where error == .fileExists {
                continue
            }
        }
        guard fd >= 0 else { throw Errno.fileExists }
        do {
            try Syscall.writeAll(fd, contents)
            _ = try Syscall.valueOrErrno { fchmod(fd, mode) }
            try Syscall.fsync(fd)
            Syscall.close(fd)
            fd = -1
            try Syscall.rename(temporary, path)
        } catch {
            if fd >= 0 { Syscall.close(fd) }
            try? Syscall.unlink(temporary)
            throw error
        }
        try syncDirectory(directory)
    }

    /// Removes temporary files that `replace` left for `path` when its process died
    /// (a kill -9 between create and rename); those of live processes are kept.
    public static func removeStaleTemporaries(of path: String) {
        let directory = parentDirectory(of: path)
        let base = path.split(separator: "/").last.map(String.init) ?? path
        let prefix = ".\(base).tmp-"
        guard let names = try? Syscall.listDirectory(directory) else { return }
        for name in names where name.hasPrefix(prefix) {
            let pid = name.dropFirst(prefix.count).split(separator: "-").first.flatMap { pid_t($0) }
            if let pid, pid != getpid(), ProcessState.isRunning(pid), ProcessState.name(of: pid) == ProcessState.name(of: getpid()) {
                continue  // a live process of this program may be writing it (a pid reused by another program is not)
            }
            try? Syscall.unlink(directory + "/" + name)
        }
    }

    /// fsync of a directory, so that a rename or a create in it is durable.
    public static func syncDirectory(_ directory: String) throws(Errno) {
        let dirfd = try Syscall.open(directory, O_RDONLY | O_DIRECTORY)
        defer { Syscall.close(dirfd) }
        try Syscall.fsync(dirfd)
    }

    public static func parentDirectory(of path: String) -> String {
        guard let slash = path.lastIndex(of: "/") else { return "." }
        let parent = String(path[..<slash])
        return parent.isEmpty ? "/" : parent
    }
}
