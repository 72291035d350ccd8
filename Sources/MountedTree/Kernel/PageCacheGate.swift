import FuseLowLevel
import Posix

/// Decides at each open of a file whether the kernel may keep the pages (and attributes) it
/// cached at earlier opens: FUSE then serves `cat` from the page cache, with no READ round
/// trip. Every change of content anywhere in the subtree bumps a generation; an inode that
/// was opened since the last bump keeps its pages, any other is first invalidated on the
/// spot, from the OPEN request (the kernel holds no lock of that inode while it waits for
/// OPEN), after every invalidation still queued, so the open that follows a change never
/// sees old content or an old size (the asynchronous invalidations sent for the change
/// reach descriptors that were open, and mappings).
///
/// Thread-safety: all state is behind one lock, never held while the kernel is notified.
final class PageCacheGate: Sendable {
    /// The generation and the inodes opened since it began.
    ///
    /// Thread-safety: used only under `PageCacheGate.state`'s lock.
    private struct State {
        var generation: UInt64 = 0
        /// Inodes opened, with the generation of their last open.
        var opened: [InodeNumber: UInt64] = [:]
    }
    private let state = Locked(State())

    /// Some content changed: every inode's pages are suspect until its next open.
    func changed() {
        state.withLock { s in
            s.generation &+= 1
            s.opened.removeAll(keepingCapacity: true)
        }
    }

    /// The kernel forgot `inode` (and its pages with it): nothing to remember for it.
    func forget(_ inode: InodeNumber) {
        state.withLock { _ = $0.opened.removeValue(forKey: inode) }
    }

    /// Called at an open that will let the kernel keep pages: when `inode` changed (or may
    /// have) since its last open, its pages and attributes are dropped now, by this request.
    /// False when the open must not rely on the kernel's cache (answer with direct I/O).
    ///
    /// An invalidation of this inode queued for an earlier change and landing while the
    /// reader's GETATTR is on its way makes the kernel drop that answer (its attribute
    /// version is older) and keep a stale size: a file read right after an unlock would keep
    /// the size it had while locked (0) and read nothing. So the queued ones are taken out
    /// (this open's own invalidation supersedes them), without waiting for the thread that
    /// sends them. One being sent right now, or queued before a lock's barrier, cannot be:
    /// the open waits for it a little (50 ms at most), then reads directly. It also reads
    /// directly when all workers but one are already sending such an invalidation (they may
    /// be waiting for page locks that only a free worker's answer would release).
    func admit(_ inode: InodeNumber, notifier: KernelCacheNotifier) -> Bool {
        let fresh = state.withLock { s -> Bool in
            if s.opened[inode] == s.generation { return true }
            s.opened[inode] = s.generation
            return false
        }
        guard !fresh else { return true }
        let racing = notifier.supersede(inode)
        let sent = notifier.invalidateInodeNow(inode)
        if racing || !sent { forget(inode) }  // the next open looks again
        return !racing && sent
    }
}
