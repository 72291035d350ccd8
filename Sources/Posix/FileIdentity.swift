#if canImport(Glibc)
import Glibc
#endif

/// Which file a path holds, and which version of it: device, inode, size and times. Two
/// saves of the same size within a clock tick share a modification time, but not an
/// inode: every save renames a new file into place.
///
/// Thread-safety: a value.
public struct FileIdentity: Hashable, Sendable {
    let device: UInt64, inode: UInt64, size: Int64
    let modified: Int64, changed: Int64

    public init(_ st: stat) {
        device = UInt64(st.st_dev)
        inode = UInt64(st.st_ino)
        size = Int64(st.st_size)
        modified = Int64(st.st_mtim.tv_sec) * 1_000_000_000 + Int64(st.st_mtim.tv_nsec)
        changed = Int64(st.st_ctim.tv_sec) * 1_000_000_000 + Int64(st.st_ctim.tv_nsec)
    }

    /// The file at `path` now; nil when there is none.
    public init?(of path: String) {
        guard let st = try? Syscall.stat(path) else { return nil }
        self.init(st)
    }

    public init?(of fd: Int32) {
        var st = stat()
        guard fstat(fd, &st) == 0 else { return nil }
        self.init(st)
    }
}
