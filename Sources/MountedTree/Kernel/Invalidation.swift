/// Something the kernel must forget, collected under a tree's lock and sent once it is
/// released (through `KernelCacheNotifier`, whose queue never blocks a request).
///
/// Thread-safety: a value; `Sendable`.
enum Invalidation: Sendable {
    /// The attributes and cached pages of a file or directory.
    case inode(LocalInode)
    /// A name in a directory (and with it the name → inode link).
    case entry(parent: LocalInode, name: String)
}
