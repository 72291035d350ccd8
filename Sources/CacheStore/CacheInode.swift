#if canImport(Glibc)
import Glibc
#endif

/// One inode row of the cache (see `docs/cache-schema.md`), with what a large file's data
/// file says of its size, times and blocks laid over it.
///
/// Thread-safety: a value; `Sendable`.
public struct CacheInode: Hashable, Sendable {
    public var ino: Int64
    public var mode: UInt32
    public var uid: UInt32
    public var gid: UInt32
    public var size: Int64
    public var links: Int64
    public var accessNanoseconds: Int64
    public var modificationNanoseconds: Int64
    public var changeNanoseconds: Int64
    public var device: Int64
    /// Symbolic links: the target.
    public var target: String?
    /// Bytes of file data stored or allocated, what `st_blocks` counts: less than `size` for
    /// a sparse file, more after a `fallocate` that keeps the size.
    public var storedBytes: Int64 = 0
    /// The key of the file's data file (`inodes.data`); nil: its bytes are in the database.
    var dataKey: Int64?

    public var isDirectory: Bool { mode & S_IFMT == S_IFDIR }
    public var isSymbolicLink: Bool { mode & S_IFMT == S_IFLNK }
    var isRegular: Bool { mode & S_IFMT == S_IFREG }
}

/// What a `setattr` changes; nil leaves a field.
///
/// Thread-safety: a value; `Sendable`.
public struct CacheAttributeChanges: Sendable {
    public var mode: UInt32?
    public var uid: UInt32?
    public var gid: UInt32?
    public var size: Int64?
    public var accessNanoseconds: Int64?
    public var modificationNanoseconds: Int64?

    public init(mode: UInt32? = nil, uid: UInt32? = nil, gid: UInt32? = nil, size: Int64? = nil,
                accessNanoseconds: Int64? = nil, modificationNanoseconds: Int64? = nil) {
        self.mode = mode
        self.uid = uid
        self.gid = gid
        self.size = size
        self.accessNanoseconds = accessNanoseconds
        self.modificationNanoseconds = modificationNanoseconds
    }
}

/// Why the cache cannot be opened.
///
/// Thread-safety: a value; `Sendable`.
public enum CacheStoreError: Error, CustomStringConvertible, Sendable {
    case damaged(String)
    public var description: String {
        switch self {
        case .damaged(let reason): "cache damaged: \(reason)"
        }
    }
}
