import FuseLowLevel

/// A range of inode numbers owned by one subtree: the top byte is the subtree's tag, the
/// rest is the subtree's own number. The mount root is inode 1 (tag 0); each subtree's own
/// top directory is local number 1.
///
/// Thread-safety: a value; `Sendable`.
public struct InodeSpace: Hashable, Sendable {
    public let tag: UInt8

    public init(tag: UInt8) {
        precondition(tag != 0, "tag 0 is the mount root's")
        self.tag = tag
    }

    public static let control = InodeSpace(tag: 1)
    public static let accounts = InodeSpace(tag: 2)
    public static let settings = InodeSpace(tag: 3)
    public static let cache = InodeSpace(tag: 4)

    static let localMask: UInt64 = (1 << 56) - 1

    /// The global inode number of local number `local` (which must fit in 56 bits).
    @inline(__always)
    public func inode(_ local: UInt64) -> InodeNumber {
        (UInt64(tag) << 56) | (local & Self.localMask)
    }

    /// The local number of a global inode of this space.
    @inline(__always)
    public func local(_ inode: InodeNumber) -> UInt64 { inode & Self.localMask }

    /// The subtree's top directory.
    public var root: InodeNumber { inode(1) }

    /// The tag of any global inode number (0 for the mount root).
    @inline(__always)
    public static func tag(of inode: InodeNumber) -> UInt8 { UInt8(truncatingIfNeeded: inode >> 56) }

    public func contains(_ inode: InodeNumber) -> Bool { Self.tag(of: inode) == tag }
}
