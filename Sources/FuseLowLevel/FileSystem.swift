#if canImport(Glibc)
import Glibc
#endif
import Posix

/// A FUSE inode number (`fuse_ino_t`). The root of a mount is always 1.
public typealias InodeNumber = UInt64

/// A point in time with nanoseconds, as stored in `struct stat`.
///
/// Thread-safety: a value; `Sendable`.
public struct Timestamp: Hashable, Sendable, Comparable {
    public var seconds: Int64
    public var nanoseconds: Int64

    public init(seconds: Int64, nanoseconds: Int64 = 0) {
        self.seconds = seconds
        self.nanoseconds = nanoseconds
    }

    /// The current `CLOCK_REALTIME` time.
    public static func now() -> Timestamp {
        let ts = WallClock.now()
        return Timestamp(seconds: Int64(ts.tv_sec), nanoseconds: Int64(ts.tv_nsec))
    }

    public static func < (a: Timestamp, b: Timestamp) -> Bool {
        (a.seconds, a.nanoseconds) < (b.seconds, b.nanoseconds)
    }

    var cValue: timespec { timespec(tv_sec: Int(seconds), tv_nsec: Int(nanoseconds)) }
}

/// What `stat` shows for one inode. `mode` includes the file-type bits (`S_IFDIR`, …).
///
/// Thread-safety: a value; `Sendable`.
public struct Attributes: Hashable, Sendable {
    public var inode: InodeNumber
    public var mode: mode_t
    public var linkCount: UInt32
    public var uid: uid_t
    public var gid: gid_t
    public var size: UInt64
    /// 512-byte blocks actually used; defaults to the size rounded up.
    public var blocks: UInt64
    public var accessTime: Timestamp
    public var modificationTime: Timestamp
    public var changeTime: Timestamp
    /// The device a block or character device node stands for (`st_rdev`).
    public var device: UInt64 = 0

    public init(inode: InodeNumber, mode: mode_t, linkCount: UInt32 = 1, uid: uid_t, gid: gid_t,
                size: UInt64 = 0, blocks: UInt64? = nil, accessTime: Timestamp,
                modificationTime: Timestamp, changeTime: Timestamp) {
        self.inode = inode
        self.mode = mode
        self.linkCount = linkCount
        self.uid = uid
        self.gid = gid
        self.size = size
        self.blocks = blocks ?? (size + 511) / 512
        self.accessTime = accessTime
        self.modificationTime = modificationTime
        self.changeTime = changeTime
    }

    public var isDirectory: Bool { mode & S_IFMT == S_IFDIR }
}

/// How long the kernel may trust what it was told about a name and its attributes.
///
/// This is the per-subtree caching switch: secrets use `.none` (or long timeouts with
/// explicit invalidation), a store that invalidates on every change may use `.long`.
///
/// Thread-safety: a value; `Sendable`.
public struct CachePolicy: Hashable, Sendable {
    /// Seconds the kernel may keep a name → inode answer (and a negative answer).
    public var entryTimeout: Double
    /// Seconds the kernel may keep attributes.
    public var attributeTimeout: Double

    public init(entryTimeout: Double, attributeTimeout: Double) {
        self.entryTimeout = entryTimeout
        self.attributeTimeout = attributeTimeout
    }

    /// Nothing is cached: every access reaches the daemon.
    public static let none = CachePolicy(entryTimeout: 0, attributeTimeout: 0)
    /// One second, libfuse's default: changes made behind the kernel's back show within it.
    public static let short = CachePolicy(entryTimeout: 1, attributeTimeout: 1)
    /// An hour: for trees whose owner invalidates the kernel's copy on every change.
    public static let long = CachePolicy(entryTimeout: 3600, attributeTimeout: 3600)
}

/// The answer to a lookup: an inode the kernel now holds one more reference to.
///
/// Thread-safety: a value; `Sendable`.
public struct Entry: Hashable, Sendable {
    public var attributes: Attributes
    public var cache: CachePolicy
    public var generation: UInt64

    public init(attributes: Attributes, cache: CachePolicy, generation: UInt64 = 0) {
        self.attributes = attributes
        self.cache = cache
        self.generation = generation
    }

    public var inode: InodeNumber { attributes.inode }
}

/// Who made a request (`fuse_req_ctx`).
///
/// Thread-safety: a value; `Sendable`.
public struct RequestContext: Hashable, Sendable {
    public var uid: uid_t
    public var gid: gid_t
    public var pid: pid_t
    public var umask: mode_t
    /// The open file a getattr comes through (fstat, and the kernel's size check before a
    /// read of cached pages), when it comes through one.
    public var fileHandle: UInt64?

    public init(uid: uid_t, gid: gid_t, pid: pid_t, umask: mode_t, fileHandle: UInt64? = nil) {
        self.uid = uid
        self.gid = gid
        self.pid = pid
        self.umask = umask
        self.fileHandle = fileHandle
    }
}

/// What an `open`, `create` or `opendir` hands back to the kernel.
///
/// Thread-safety: a value; `Sendable`.
public struct OpenedFile: Hashable, Sendable {
    /// The file system's own handle; passed back on read, write, flush, release.
    public var handle: UInt64
    /// Bypass the page cache: every read and write reaches the daemon.
    public var directIO: Bool
    /// Keep the page cache from an earlier open (the file system invalidates it on change).
    public var keepCache: Bool
    /// Closing a descriptor sends no FLUSH (FOPEN_NOFLUSH): for descriptors whose close has
    /// nothing to commit or report. Saves a synchronous round trip per close; RELEASE still
    /// comes, after close returned.
    public var noFlush: Bool

    public init(handle: UInt64 = 0, directIO: Bool = false, keepCache: Bool = false, noFlush: Bool = false) {
        self.handle = handle
        self.directIO = directIO
        self.keepCache = keepCache
        self.noFlush = noFlush
    }
}

/// One name in a directory listing, with the entry `readdirplus` hands to the kernel.
///
/// Thread-safety: a value; `Sendable`.
public struct DirectoryEntry: Hashable, Sendable {
    public var name: String
    public var entry: Entry

    public init(name: String, entry: Entry) {
        self.name = name
        self.entry = entry
    }
}

/// The attribute changes of one `setattr` call; `nil` leaves a field as it is.
///
/// Thread-safety: a value; `Sendable`.
public struct AttributeChanges: Hashable, Sendable {
    public var mode: mode_t?
    public var uid: uid_t?
    public var gid: gid_t?
    public var size: UInt64?
    public var accessTime: Timestamp?
    public var modificationTime: Timestamp?

    public init(mode: mode_t? = nil, uid: uid_t? = nil, gid: gid_t? = nil, size: UInt64? = nil,
                accessTime: Timestamp? = nil, modificationTime: Timestamp? = nil) {
        self.mode = mode
        self.uid = uid
        self.gid = gid
        self.size = size
        self.accessTime = accessTime
        self.modificationTime = modificationTime
    }
}

/// File system statistics (`statvfs`).
///
/// Thread-safety: a value; `Sendable`.
public struct FileSystemStatistics: Hashable, Sendable {
    public var blockSize: UInt64 = 4096
    public var blocks: UInt64 = 0
    public var freeBlocks: UInt64 = 0
    public var availableBlocks: UInt64 = 0
    public var files: UInt64 = 0
    public var freeFiles: UInt64 = 0
    public var maximumNameLength: UInt64 = 255

    public init() {}
}

/// The `lseek(2)` whences that reach a FUSE file system (Glibc hides them behind _GNU_SOURCE).
///
/// Thread-safety: constants only.
public enum SeekWhence {
    /// `SEEK_DATA`: the next offset at or after the given one that holds data.
    public static let data: Int32 = 3
    /// `SEEK_HOLE`: the next offset at or after the given one inside a hole (or the end).
    public static let hole: Int32 = 4
}

/// Flags of `rename(2)` / `renameat2(2)`.
///
/// Thread-safety: a value; `Sendable`.
public struct RenameFlags: OptionSet, Hashable, Sendable {
    public let rawValue: UInt32
    public init(rawValue: UInt32) { self.rawValue = rawValue }
    /// `RENAME_NOREPLACE`
    public static let noReplace = RenameFlags(rawValue: 1)
    /// `RENAME_EXCHANGE`
    public static let exchange = RenameFlags(rawValue: 2)
}

/// A file system served through libfuse's low-level (inode-based) API.
///
/// Each method is one FUSE request. Implementations answer with a value or throw the
/// `Errno` the caller should see; the defaults answer as a read-only tree without that
/// operation would. Requests arrive concurrently on several threads and must never block
/// on an actor or a `Task`: implementations protect their state with locks.
///
/// Reference counting: every `Entry` returned by `lookup`, `mkdir`, `mknod`, `symlink`,
/// `link` and `create`, and every non-dot entry handed out by a `readdirplus`
/// (`countLookup(of:)`), is one reference that the kernel later drops with `forget`.
///
/// Thread-safety: every method may be called from several threads at once; conformers
/// guard their own state with locks.
public protocol FileSystem: AnyObject, Sendable {
    func lookup(parent: InodeNumber, name: String, context: RequestContext) throws(Errno) -> Entry
    func forget(inode: InodeNumber, lookups: UInt64)
    func countLookup(of inode: InodeNumber)
    func attributes(of inode: InodeNumber, context: RequestContext) throws(Errno) -> (Attributes, CachePolicy)
    func setAttributes(of inode: InodeNumber, _ changes: AttributeChanges, handle: UInt64?,
                       context: RequestContext) throws(Errno) -> (Attributes, CachePolicy)
    func readLink(_ inode: InodeNumber, context: RequestContext) throws(Errno) -> String
    func makeNode(parent: InodeNumber, name: String, mode: mode_t, device: dev_t,
                  context: RequestContext) throws(Errno) -> Entry
    func makeDirectory(parent: InodeNumber, name: String, mode: mode_t,
                       context: RequestContext) throws(Errno) -> Entry
    func unlink(parent: InodeNumber, name: String, context: RequestContext) throws(Errno)
    func removeDirectory(parent: InodeNumber, name: String, context: RequestContext) throws(Errno)
    func makeSymbolicLink(target: String, parent: InodeNumber, name: String,
                          context: RequestContext) throws(Errno) -> Entry
    func rename(parent: InodeNumber, name: String, newParent: InodeNumber, newName: String,
                flags: RenameFlags, context: RequestContext) throws(Errno)
    func link(_ inode: InodeNumber, newParent: InodeNumber, newName: String,
              context: RequestContext) throws(Errno) -> Entry
    func open(_ inode: InodeNumber, flags: Int32, context: RequestContext) throws(Errno) -> OpenedFile
    /// An open that may wait for a person: answers now (a value), or returns nil after
    /// `request.postpone()` and answers through the `PendingOpen` later. Defaults to `open`.
    func open(_ inode: InodeNumber, flags: Int32, context: RequestContext, request: OpenRequest) throws(Errno) -> OpenedFile?
    func create(parent: InodeNumber, name: String, mode: mode_t, flags: Int32,
                context: RequestContext) throws(Errno) -> (Entry, OpenedFile)
    /// Reads by handing the bytes to `reply` (called exactly once on success) without a
    /// copy: secrets answer from secure memory this way. (`read(…) -> [UInt8]` is the same
    /// as an array, for callers that want one.)
    func read(_ inode: InodeNumber, handle: UInt64, offset: UInt64, size: Int, context: RequestContext,
              reply: (UnsafeRawBufferPointer) -> Void) throws(Errno)
    func write(_ inode: InodeNumber, handle: UInt64, offset: UInt64, data: UnsafeRawBufferPointer,
               flags: Int32, context: RequestContext) throws(Errno) -> Int
    /// A write whose caller lacks CAP_FSETID (the kernel's FUSE_WRITE_KILL_SUIDGID: every
    /// write of a normal user): the file's set-ID bits go with it. Returns the bytes written
    /// and whether the mode changed (the kernel's cached attributes are then stale). By
    /// default the attributes are asked and changed before the write; a tree that knows the
    /// mode at hand decides in the write itself.
    func writeDroppingSetID(_ inode: InodeNumber, handle: UInt64, offset: UInt64, data: UnsafeRawBufferPointer,
                            flags: Int32, context: RequestContext) throws(Errno) -> (written: Int, modeChanged: Bool)
    /// A write as the bridge makes it (`droppingSetID`: by a caller without CAP_FSETID) that
    /// may be answered later: nil after `request.postpone()`, the `PendingWrite` answering.
    /// Defaults to `write` or `writeDroppingSetID`.
    func write(_ inode: InodeNumber, handle: UInt64, offset: UInt64, data: UnsafeRawBufferPointer, flags: Int32,
               droppingSetID: Bool, context: RequestContext, request: WriteRequest) throws(Errno) -> (written: Int, modeChanged: Bool)?
    func flush(_ inode: InodeNumber, handle: UInt64, context: RequestContext) throws(Errno)
    func release(_ inode: InodeNumber, handle: UInt64, flags: Int32)
    func synchronize(_ inode: InodeNumber, handle: UInt64, dataOnly: Bool) throws(Errno)
    /// fsync(2) of a directory: its names (and everything before) become durable.
    func synchronizeDirectory(_ inode: InodeNumber) throws(Errno)
    func openDirectory(_ inode: InodeNumber, context: RequestContext) throws(Errno)
    /// The whole listing of a directory, taken once per `opendir` (a snapshot the kernel
    /// pages through), without "." and "..".
    func listDirectory(_ inode: InodeNumber, context: RequestContext) throws(Errno) -> [DirectoryEntry]
    /// Whether `inode` is listed page by page (`listDirectory(_:after:limit:context:)`, each
    /// page asked when the kernel reaches it) instead of as one snapshot taken at opendir:
    /// for directories of any size, so that an open listing holds one page, not all.
    func pagesListing(of inode: InodeNumber) -> Bool
    /// Whether the listings of `inode` count each entry they return as one kernel
    /// reference, under the same lock as the listing itself: a name unlinked between the
    /// listing and its reply then keeps its inode for the kernel that is handed it. The
    /// bridge forgets the entries it does not hand out (and, for a plain READDIR, those it
    /// does). Otherwise the bridge counts each entry it sends (`countLookup`).
    func countsListing(of inode: InodeNumber) -> Bool
    /// At most `limit` entries after the one named `name` (from the first with nil), in a
    /// fixed order of names; without "." and "..".
    func listDirectory(_ inode: InodeNumber, after name: String?, limit: Int,
                       context: RequestContext) throws(Errno) -> [DirectoryEntry]
    func statistics(_ inode: InodeNumber) throws(Errno) -> FileSystemStatistics
    func setExtendedAttribute(_ inode: InodeNumber, name: String, value: [UInt8], flags: Int32,
                              context: RequestContext) throws(Errno)
    func extendedAttribute(_ inode: InodeNumber, name: String,
                           context: RequestContext) throws(Errno) -> [UInt8]
    func extendedAttributeNames(_ inode: InodeNumber, context: RequestContext) throws(Errno) -> [String]
    func removeExtendedAttribute(_ inode: InodeNumber, name: String,
                                 context: RequestContext) throws(Errno)
    /// fallocate(2): `mode` holds its `FALLOC_FL_*` flags.
    func allocate(_ inode: InodeNumber, handle: UInt64, mode: Int32, offset: UInt64, length: UInt64,
                  context: RequestContext) throws(Errno)
    /// lseek(2) with `SEEK_DATA` or `SEEK_HOLE` (the kernel answers other whences itself).
    func seek(_ inode: InodeNumber, handle: UInt64, offset: UInt64, whence: Int32,
              context: RequestContext) throws(Errno) -> UInt64
    /// copy_file_range(2) between two files of this mount: the bytes copied (may be fewer
    /// than asked; the caller asks again). EOPNOTSUPP or EXDEV make the kernel copy
    /// through reads and writes instead.
    func copyRange(from source: InodeNumber, handle sourceHandle: UInt64, offset sourceOffset: UInt64,
                   to destination: InodeNumber, handle destinationHandle: UInt64, offset destinationOffset: UInt64,
                   length: Int, context: RequestContext) throws(Errno) -> Int
    /// Called once, when the loop has ended (unmount or signal): flush everything.
    func shutDown()
    /// How long the kernel may remember that a name is absent from `parent` (0: not at all).
    /// Only where every name comes through the kernel (it then replaces the negative entry
    /// itself at a create): never where names appear from outside (a synced vault, another
    /// program's plist).
    func absentNameTimeout(parent: InodeNumber) -> Double
}

public extension FileSystem {
    /// A read's bytes as an array (a copy: not for secrets).
    func read(_ inode: InodeNumber, handle: UInt64, offset: UInt64, size: Int,
              context: RequestContext) throws(Errno) -> [UInt8] {
        var bytes: [UInt8] = []
        try read(inode, handle: handle, offset: offset, size: size, context: context) { bytes = Array($0) }
        return bytes
    }
    func forget(inode: InodeNumber, lookups: UInt64) {}
    func open(_ inode: InodeNumber, flags: Int32, context: RequestContext, request: OpenRequest) throws(Errno) -> OpenedFile? {
        try open(inode, flags: flags, context: context)
    }
    func countLookup(of inode: InodeNumber) {}
    func setAttributes(of inode: InodeNumber, _ changes: AttributeChanges, handle: UInt64?,
                       context: RequestContext) throws(Errno) -> (Attributes, CachePolicy) {
        throw .permissionDenied
    }
    func readLink(_ inode: InodeNumber, context: RequestContext) throws(Errno) -> String {
        throw .invalidArgument
    }
    func makeNode(parent: InodeNumber, name: String, mode: mode_t, device: dev_t,
                  context: RequestContext) throws(Errno) -> Entry { throw .permissionDenied }
    func makeDirectory(parent: InodeNumber, name: String, mode: mode_t,
                       context: RequestContext) throws(Errno) -> Entry { throw .permissionDenied }
    func unlink(parent: InodeNumber, name: String, context: RequestContext) throws(Errno) {
        throw .permissionDenied
    }
    func removeDirectory(parent: InodeNumber, name: String, context: RequestContext) throws(Errno) {
        throw .permissionDenied
    }
    func makeSymbolicLink(target: String, parent: InodeNumber, name: String,
                          context: RequestContext) throws(Errno) -> Entry { throw .permissionDenied }
    func rename(parent: InodeNumber, name: String, newParent: InodeNumber, newName: String,
                flags: RenameFlags, context: RequestContext) throws(Errno) { throw .permissionDenied }
    func link(_ inode: InodeNumber, newParent: InodeNumber, newName: String,
              context: RequestContext) throws(Errno) -> Entry { throw .permissionDenied }
    func create(parent: InodeNumber, name: String, mode: mode_t, flags: Int32,
                context: RequestContext) throws(Errno) -> (Entry, OpenedFile) { throw .permissionDenied }
    func write(_ inode: InodeNumber, handle: UInt64, offset: UInt64, data: UnsafeRawBufferPointer,
               flags: Int32, context: RequestContext) throws(Errno) -> Int { throw .badFileDescriptor }
    func writeDroppingSetID(_ inode: InodeNumber, handle: UInt64, offset: UInt64, data: UnsafeRawBufferPointer,
                            flags: Int32, context: RequestContext) throws(Errno) -> (written: Int, modeChanged: Bool) {
        let changed = dropSetID(of: inode, context: context)
        return (try write(inode, handle: handle, offset: offset, data: data, flags: flags, context: context), changed)
    }
    func write(_ inode: InodeNumber, handle: UInt64, offset: UInt64, data: UnsafeRawBufferPointer, flags: Int32,
               droppingSetID: Bool, context: RequestContext, request: WriteRequest) throws(Errno) -> (written: Int, modeChanged: Bool)? {
        guard droppingSetID else {
            return (try write(inode, handle: handle, offset: offset, data: data, flags: flags, context: context), false)
        }
        return try writeDroppingSetID(inode, handle: handle, offset: offset, data: data, flags: flags, context: context)
    }

    /// Drops the set-ID bits of `inode` through its attributes, if it has any a kill drops;
    /// true when the mode changed. What cannot be done is logged: the request goes on.
    func dropSetID(of inode: InodeNumber, context: RequestContext) -> Bool {
        guard let (current, _) = try? attributes(of: inode, context: context), SetIDBits.wouldDrop(current.mode) else { return false }
        do {
            _ = try setAttributes(of: inode, AttributeChanges(mode: SetIDBits.killed(current.mode)), handle: nil, context: context)
            return true
        } catch {
            Log.error("the set-ID bits of inode \(inode) could not be dropped: \(error)")
            return false
        }
    }
    func flush(_ inode: InodeNumber, handle: UInt64, context: RequestContext) throws(Errno) {}
    func release(_ inode: InodeNumber, handle: UInt64, flags: Int32) {}
    func synchronize(_ inode: InodeNumber, handle: UInt64, dataOnly: Bool) throws(Errno) {}
    func synchronizeDirectory(_ inode: InodeNumber) throws(Errno) {}
    func openDirectory(_ inode: InodeNumber, context: RequestContext) throws(Errno) {}
    func pagesListing(of inode: InodeNumber) -> Bool { false }
    func countsListing(of inode: InodeNumber) -> Bool { false }
    func listDirectory(_ inode: InodeNumber, after name: String?, limit: Int,
                       context: RequestContext) throws(Errno) -> [DirectoryEntry] {
        let all = try listDirectory(inode, context: context)
        let start = name.flatMap { name in all.firstIndex { $0.name == name }.map { $0 + 1 } } ?? 0
        return Array(all[start...].prefix(limit))
    }
    /// Not ENOSYS: that would turn fallocate off for the whole connection.
    func allocate(_ inode: InodeNumber, handle: UInt64, mode: Int32, offset: UInt64, length: UInt64,
                  context: RequestContext) throws(Errno) { throw .notSupported }
    /// A file without holes: data up to its size, the one hole at its end. (ENOSYS would
    /// make the kernel answer so for the whole connection, cache/ included.)
    func seek(_ inode: InodeNumber, handle: UInt64, offset: UInt64, whence: Int32,
              context: RequestContext) throws(Errno) -> UInt64 {
        let size = try attributes(of: inode, context: context).0.size
        guard offset < size else { throw .noSuchDeviceOrAddress }
        return whence == SeekWhence.data ? offset : size
    }
    func copyRange(from source: InodeNumber, handle sourceHandle: UInt64, offset sourceOffset: UInt64,
                   to destination: InodeNumber, handle destinationHandle: UInt64, offset destinationOffset: UInt64,
                   length: Int, context: RequestContext) throws(Errno) -> Int { throw .notSupported }
    func statistics(_ inode: InodeNumber) throws(Errno) -> FileSystemStatistics { FileSystemStatistics() }
    func setExtendedAttribute(_ inode: InodeNumber, name: String, value: [UInt8], flags: Int32,
                              context: RequestContext) throws(Errno) { throw .notSupported }
    func extendedAttribute(_ inode: InodeNumber, name: String,
                           context: RequestContext) throws(Errno) -> [UInt8] { throw .noData }
    func extendedAttributeNames(_ inode: InodeNumber, context: RequestContext) throws(Errno) -> [String] { [] }
    func removeExtendedAttribute(_ inode: InodeNumber, name: String,
                                 context: RequestContext) throws(Errno) { throw .noData }
    func shutDown() {}
    func absentNameTimeout(parent: InodeNumber) -> Double { 0 }
}
