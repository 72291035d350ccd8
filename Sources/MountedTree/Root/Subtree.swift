#if canImport(Glibc)
import Glibc
#endif
import FuseLowLevel
import Posix

/// One top-level directory of the mount (`accounts`, `settings`, `cache`, `.mtmfs`), served
/// by one store. It answers every request whose inode lies in its `space`, including
/// `attributes(of: space.root)` for its own top directory.
public protocol Subtree: FileSystem {
    /// The name under the mount root.
    var name: String { get }
    /// The inode numbers it owns.
    var space: InodeSpace { get }
}

/// The owner and times that every synthesized directory shows: the user who mounted and
/// the moment the mount started.
public struct Ownership: Hashable, Sendable {
    public var uid: uid_t
    public var gid: gid_t
    public var since: Timestamp

    public init(uid: uid_t, gid: gid_t, since: Timestamp) {
        self.uid = uid
        self.gid = gid
        self.since = since
    }

    public static func currentProcess() -> Ownership {
        Ownership(uid: getuid(), gid: getgid(), since: .now())
    }

    public func directory(_ inode: InodeNumber, mode: mode_t = 0o755, links: UInt32 = 2) -> Attributes {
        Attributes(inode: inode, mode: S_IFDIR | mode, linkCount: links, uid: uid, gid: gid,
                   size: 0, accessTime: since, modificationTime: since, changeTime: since)
    }

    public func file(_ inode: InodeNumber, mode: mode_t, size: UInt64,
                     modified: Timestamp? = nil) -> Attributes {
        let time = modified ?? since
        return Attributes(inode: inode, mode: S_IFREG | mode, linkCount: 1, uid: uid, gid: gid,
                          size: size, accessTime: time, modificationTime: time, changeTime: time)
    }
}

/// A subtree that is an empty directory: what a store's place shows before the store is
/// served. Nothing can be created in it.
public final class EmptyDirectoryTree: Subtree {
    public let name: String
    public let space: InodeSpace
    let ownership: Ownership

    public init(name: String, space: InodeSpace, ownership: Ownership) {
        self.name = name
        self.space = space
        self.ownership = ownership
    }

    public func lookup(parent: InodeNumber, name: String, context: RequestContext) throws(Errno) -> Entry {
        throw .noSuchFileOrDirectory
    }

    public func attributes(of inode: InodeNumber, context: RequestContext) throws(Errno) -> (Attributes, CachePolicy) {
        guard inode == space.root else { throw .noSuchFileOrDirectory }
        return (ownership.directory(inode), .short)
    }

    public func open(_ inode: InodeNumber, flags: Int32, context: RequestContext) throws(Errno) -> OpenedFile {
        throw .isDirectory
    }

    public func read(_ inode: InodeNumber, handle: UInt64, offset: UInt64, size: Int,
                     context: RequestContext) throws(Errno) -> [UInt8] {
        throw .isDirectory
    }

    public func listDirectory(_ inode: InodeNumber, context: RequestContext) throws(Errno) -> [DirectoryEntry] {
        guard inode == space.root else { throw .notDirectory }
        return []
    }
}
