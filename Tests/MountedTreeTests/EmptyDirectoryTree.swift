import FuseLowLevel
@testable import MountedTree
import Posix

/// A subtree that is an empty directory, for the router's tests: nothing can be created in it.
final class EmptyDirectoryTree: Subtree {
    let name: String
    let space: InodeSpace
    let ownership: Ownership
    let nodes = NodeTable()

    init(name: String, space: InodeSpace, ownership: Ownership) {
        self.name = name
        self.space = space
        self.ownership = ownership
    }

    func lookup(parent: InodeNumber, name: String, context: RequestContext) throws(Errno) -> Entry {
        throw .noSuchFileOrDirectory
    }

    func attributes(of inode: InodeNumber, context: RequestContext) throws(Errno) -> (Attributes, CachePolicy) {
        guard inode == space.root else { throw .noSuchFileOrDirectory }
        return (ownership.directory(inode), .short)
    }

    func open(_ inode: InodeNumber, flags: Int32, context: RequestContext) throws(Errno) -> OpenedFile {
        throw .isDirectory
    }

    func read(_ inode: InodeNumber, handle: UInt64, offset: UInt64, size: Int, context: RequestContext,
              reply: (UnsafeRawBufferPointer) -> Void) throws(Errno) {
        throw .isDirectory
    }

    func listDirectory(_ inode: InodeNumber, context: RequestContext) throws(Errno) -> [DirectoryEntry] {
        guard inode == space.root else { throw .notDirectory }
        return []
    }
}
