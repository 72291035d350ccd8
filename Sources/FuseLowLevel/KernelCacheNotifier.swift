import Dispatch
import Posix

/// Tells the kernel to drop what it cached of an inode or a name, from any thread.
///
/// Subtrees are built before the mount exists, so they hold this and the mount is attached
/// later. Invalidations are sent from a serial queue of its own, never from inside a
/// request handler (where the kernel may hold the very locks the invalidation needs).
///
/// Thread-safety: every method may be called from any thread; the mount is behind a lock,
/// and queued invalidations go out in order.
public final class KernelCacheNotifier: Sendable {
    private let mount = Locked<FuseMount?>(nil)
    private let queue = DispatchQueue(label: "mtmfs.kernel-cache-notifier")

    public init() {}

    public func attach(_ fuse: FuseMount?) { mount.withLock { $0 = fuse } }

    /// Drops attributes and cached data of `inode`.
    public func invalidateInode(_ inode: InodeNumber) {
        queue.async { [self] in mount.withLock { $0 }?.invalidateInode(inode) }
    }

    /// Drops attributes and cached data of `inode` on the calling thread, before returning.
    /// Only from a request during which the kernel holds no lock of this inode's pages or
    /// of its directory (OPEN of the inode itself, say); never from LOOKUP, CREATE, READ,
    /// WRITE, RENAME or the like.
    public func invalidateInodeNow(_ inode: InodeNumber) {
        mount.withLock { $0 }?.invalidateInode(inode)
    }

    /// Drops the name `name` in directory `parent` (and with it the dentry → inode link).
    public func invalidateEntry(parent: InodeNumber, name: String) {
        queue.async { [self] in mount.withLock { $0 }?.invalidateEntry(parent: parent, name: name) }
    }

    /// Waits until every invalidation asked for so far has been sent (for tests and lock).
    public func drain() { queue.sync {} }
}
