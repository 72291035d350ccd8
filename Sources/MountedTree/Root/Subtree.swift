#if canImport(Glibc)
import Glibc
#endif
import FuseLowLevel
import Posix

/// One top-level directory of the mount (`accounts`, `settings`, `cache`, `.mtmfs`), served
/// by one store. It answers every request whose inode lies in its `space`, including
/// `attributes(of: space.root)` for its own top directory.
///
/// The kernel's references are kept in the mount's one `NodeTable` (`nodes`): a subtree
/// counts each entry it hands out there, under its own lock, and hears when an inode's last
/// reference goes; FORGET and the bridge's `countLookup` need nothing else from it.
///
/// Thread-safety: as `FileSystem`: requests arrive on several threads at once, and each
/// subtree guards its own state.
public protocol Subtree: FileSystem {
    /// The name under the mount root.
    var name: String { get }
    /// The inode numbers it owns.
    var space: InodeSpace { get }
    /// The kernel's references, shared by every subtree of the mount.
    var nodes: NodeTable { get }
    /// The kernel's last reference to `inode` went. Called with no lock held; a lookup may
    /// have come since, so a subtree frees a node only if `nodes` still has no reference to
    /// it, looked at under the lock that its lookups count under.
    func lastReferenceGone(_ inode: InodeNumber)
}

public extension Subtree {
    func forget(inode: InodeNumber, lookups: UInt64) {
        if nodes.release(inode, count: lookups) { lastReferenceGone(inode) }
    }

    func countLookup(of inode: InodeNumber) { nodes.reference(inode) }

    func lastReferenceGone(_ inode: InodeNumber) {}
}

/// The owner and times that every synthesized directory shows: the user who mounted and
/// the moment the mount started.
///
/// Thread-safety: a value; `Sendable`.
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

