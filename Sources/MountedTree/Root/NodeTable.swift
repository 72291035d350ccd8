import FuseLowLevel
import Posix

/// The kernel's references to the inodes of one mount, for every subtree: one count per
/// inode, taken for each entry handed to the kernel (lookup, create, mkdir, mknod,
/// symlink, link, each entry of a READDIRPLUS) and dropped by FORGET. A subtree hears when
/// an inode's last reference went (`Subtree.lastReferenceGone`) and frees what only the
/// kernel kept alive: an unlinked file of `cache/`, an editor's file of `settings/`, the
/// file of a key that left.
///
/// The rule that keeps a node from going while the kernel is handed it: a subtree counts
/// a reference under its own lock, in the same visit that finds the node; and at the last
/// FORGET it frees the node under that lock only if no reference came back meanwhile
/// (`isReferenced`). The table's own lock is taken inside a subtree's, never around one.
///
/// Thread-safety: one mutex over the counts; never held while calling out.
public final class NodeTable: Sendable {
    private let counts = Locked<[InodeNumber: UInt64]>([:])

    public init() {}

    /// One more kernel reference to `inode`.
    public func reference(_ inode: InodeNumber, count: UInt64 = 1) {
        counts.withLock { $0[inode, default: 0] += count }
    }

    /// The kernel dropped `count` references; true when none is left (and there was one).
    public func release(_ inode: InodeNumber, count: UInt64) -> Bool {
        counts.withLock { counts in
            guard let held = counts[inode] else { return false }
            guard held > count else {
                counts[inode] = nil
                return true
            }
            counts[inode] = held - count
            return false
        }
    }

    public func isReferenced(_ inode: InodeNumber) -> Bool {
        counts.withLock { $0[inode] != nil }
    }

    /// Inodes the kernel holds (for status and tests).
    public var referencedInodes: Int { counts.withLock { $0.count } }
}

/// One subtree's view of the mount's `NodeTable`, by its local inode numbers.
///
/// Thread-safety: a value; the table is thread-safe.
struct SubtreeNodes: Sendable {
    let table: NodeTable
    let space: InodeSpace

    func reference(_ local: LocalInode) { table.reference(space.inode(local)) }
    func isReferenced(_ local: LocalInode) -> Bool { table.isReferenced(space.inode(local)) }
}
