import Posix

/// The editing engine's files by local inode. An entry is changed in place through
/// `modify` (ENOENT when there is none) or `update` (nothing when there is none), and read
/// as an optional: no path of the engine assumes an entry is there.
///
/// Thread-safety: a value, inside the engine.
struct EditedFiles<File> {
    private var entries: [LocalInode: File] = [:]

    subscript(inode: LocalInode) -> File? { entries[inode] }
    var keys: Dictionary<LocalInode, File>.Keys { entries.keys }
    var count: Int { entries.count }

    mutating func insert(_ file: File, at inode: LocalInode) { entries[inode] = file }

    @discardableResult
    mutating func remove(_ inode: LocalInode) -> File? { entries.removeValue(forKey: inode) }

    /// Runs `body` on the entry, in place (a copy would copy its buffer); ENOENT when
    /// there is none.
    mutating func modify<T>(_ inode: LocalInode, _ body: (inout File) throws(Errno) -> T) throws(Errno) -> T {
        guard let index = entries.index(forKey: inode) else { throw .noSuchFileOrDirectory }
        return try body(&entries.values[index])
    }

    /// Runs `body` on the entry, in place; nothing when there is none.
    mutating func update(_ inode: LocalInode, _ body: (inout File) -> Void) {
        guard let index = entries.index(forKey: inode) else { return }
        body(&entries.values[index])
    }
}
