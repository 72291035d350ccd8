#if canImport(Glibc)
import Glibc
#endif
import FuseLowLevel
import Posix

/// The mount root: a fixed directory of subtrees, each request routed by the tag of its
/// inode to the subtree that owns it. Nothing can be created, removed or renamed at the
/// root itself (EACCES); a rename or link between subtrees is EXDEV.
///
/// Thread-safety: immutable after init; the subtrees are thread-safe themselves.
public final class RootTree: FileSystem {
    public static let rootInode: InodeNumber = 1

    let subtrees: [Subtree]
    /// Subtree by tag, for constant-time routing.
    private let byTag: [Subtree?]
    let ownership: Ownership
    let statisticsSource: @Sendable () -> FileSystemStatistics

    public init(subtrees: [Subtree], ownership: Ownership,
                statistics: @escaping @Sendable () -> FileSystemStatistics = { FileSystemStatistics() }) {
        self.subtrees = subtrees
        self.ownership = ownership
        self.statisticsSource = statistics
        var byTag = [Subtree?](repeating: nil, count: 256)
        for subtree in subtrees {
            precondition(byTag[Int(subtree.space.tag)] == nil, "two subtrees share a tag")
            byTag[Int(subtree.space.tag)] = subtree
        }
        self.byTag = byTag
    }

    @inline(__always)
    private func owner(of inode: InodeNumber) throws(Errno) -> Subtree {
        guard let subtree = byTag[Int(InodeSpace.tag(of: inode))] else { throw .noSuchFileOrDirectory }
        return subtree
    }

    private func rootEntry(_ subtree: Subtree, context: RequestContext) throws(Errno) -> Entry {
        let (attributes, cache) = try subtree.attributes(of: subtree.space.root, context: context)
        return Entry(attributes: attributes, cache: cache)
    }

    // MARK: FileSystem

    public func lookup(parent: InodeNumber, name: String, context: RequestContext) throws(Errno) -> Entry {
        if parent == Self.rootInode {
            guard let subtree = subtrees.first(where: { $0.name == name }) else { throw .noSuchFileOrDirectory }
            let entry = try rootEntry(subtree, context: context)
            subtree.countLookup(of: entry.inode)  // a top directory never goes: no lock to count under
            return entry
        }
        return try owner(of: parent).lookup(parent: parent, name: name, context: context)
    }

    public func absentNameTimeout(parent: InodeNumber) -> Double {
        guard parent != Self.rootInode else { return 0 }
        return (try? owner(of: parent))?.absentNameTimeout(parent: parent) ?? 0
    }

    public func forget(inode: InodeNumber, lookups: UInt64) {
        guard inode != Self.rootInode, let subtree = try? owner(of: inode) else { return }
        subtree.forget(inode: inode, lookups: lookups)
    }

    public func countLookup(of inode: InodeNumber) {
        guard inode != Self.rootInode, let subtree = try? owner(of: inode) else { return }
        subtree.countLookup(of: inode)
    }

    public func attributes(of inode: InodeNumber, context: RequestContext) throws(Errno) -> (Attributes, CachePolicy) {
        if inode == Self.rootInode {
            return (ownership.directory(inode, links: UInt32(2 + subtrees.count)), .short)
        }
        return try owner(of: inode).attributes(of: inode, context: context)
    }

    public func setAttributes(of inode: InodeNumber, _ changes: AttributeChanges, handle: UInt64?,
                              context: RequestContext) throws(Errno) -> (Attributes, CachePolicy) {
        if inode == Self.rootInode { throw .permissionDenied }
        return try owner(of: inode).setAttributes(of: inode, changes, handle: handle, context: context)
    }

    public func readLink(_ inode: InodeNumber, context: RequestContext) throws(Errno) -> String {
        if inode == Self.rootInode { throw .invalidArgument }
        return try owner(of: inode).readLink(inode, context: context)
    }

    public func makeNode(parent: InodeNumber, name: String, mode: mode_t, device: dev_t,
                         context: RequestContext) throws(Errno) -> Entry {
        if parent == Self.rootInode { throw .permissionDenied }
        return try owner(of: parent).makeNode(parent: parent, name: name, mode: mode, device: device,
                                              context: context)
    }

    public func makeDirectory(parent: InodeNumber, name: String, mode: mode_t,
                              context: RequestContext) throws(Errno) -> Entry {
        if parent == Self.rootInode { throw .permissionDenied }
        return try owner(of: parent).makeDirectory(parent: parent, name: name, mode: mode, context: context)
    }

    public func unlink(parent: InodeNumber, name: String, context: RequestContext) throws(Errno) {
        if parent == Self.rootInode { throw .permissionDenied }
        try owner(of: parent).unlink(parent: parent, name: name, context: context)
    }

    public func removeDirectory(parent: InodeNumber, name: String, context: RequestContext) throws(Errno) {
        if parent == Self.rootInode { throw .permissionDenied }
        try owner(of: parent).removeDirectory(parent: parent, name: name, context: context)
    }

    public func makeSymbolicLink(target: String, parent: InodeNumber, name: String,
                                 context: RequestContext) throws(Errno) -> Entry {
        if parent == Self.rootInode { throw .permissionDenied }
        return try owner(of: parent).makeSymbolicLink(target: target, parent: parent, name: name,
                                                      context: context)
    }

    public func rename(parent: InodeNumber, name: String, newParent: InodeNumber, newName: String,
                       flags: RenameFlags, context: RequestContext) throws(Errno) {
        if parent == Self.rootInode || newParent == Self.rootInode { throw .permissionDenied }
        guard InodeSpace.tag(of: parent) == InodeSpace.tag(of: newParent) else { throw .crossDevice }
        try owner(of: parent).rename(parent: parent, name: name, newParent: newParent, newName: newName,
                                     flags: flags, context: context)
    }

    public func link(_ inode: InodeNumber, newParent: InodeNumber, newName: String,
                     context: RequestContext) throws(Errno) -> Entry {
        if newParent == Self.rootInode || inode == Self.rootInode { throw .permissionDenied }
        guard InodeSpace.tag(of: inode) == InodeSpace.tag(of: newParent) else { throw .crossDevice }
        return try owner(of: inode).link(inode, newParent: newParent, newName: newName, context: context)
    }

    public func open(_ inode: InodeNumber, flags: Int32, context: RequestContext) throws(Errno) -> OpenedFile {
        if inode == Self.rootInode { throw .isDirectory }
        return try owner(of: inode).open(inode, flags: flags, context: context)
    }

    public func open(_ inode: InodeNumber, flags: Int32, context: RequestContext, request: OpenRequest) throws(Errno) -> OpenedFile? {
        if inode == Self.rootInode { throw .isDirectory }
        return try owner(of: inode).open(inode, flags: flags, context: context, request: request)
    }

    public func create(parent: InodeNumber, name: String, mode: mode_t, flags: Int32,
                       context: RequestContext) throws(Errno) -> (Entry, OpenedFile) {
        if parent == Self.rootInode { throw .permissionDenied }
        return try owner(of: parent).create(parent: parent, name: name, mode: mode, flags: flags,
                                            context: context)
    }

    public func read(_ inode: InodeNumber, handle: UInt64, offset: UInt64, size: Int, context: RequestContext,
                     reply: (UnsafeRawBufferPointer) -> Void) throws(Errno) {
        try owner(of: inode).read(inode, handle: handle, offset: offset, size: size, context: context, reply: reply)
    }

    public func write(_ inode: InodeNumber, handle: UInt64, offset: UInt64, data: UnsafeRawBufferPointer,
                      flags: Int32, context: RequestContext) throws(Errno) -> Int {
        try owner(of: inode).write(inode, handle: handle, offset: offset, data: data, flags: flags,
                                   context: context)
    }

    public func writeDroppingSetID(_ inode: InodeNumber, handle: UInt64, offset: UInt64, data: UnsafeRawBufferPointer,
                                   flags: Int32, context: RequestContext) throws(Errno) -> (written: Int, modeChanged: Bool) {
        try owner(of: inode).writeDroppingSetID(inode, handle: handle, offset: offset, data: data, flags: flags,
                                                context: context)
    }

    public func write(_ inode: InodeNumber, handle: UInt64, offset: UInt64, data: UnsafeRawBufferPointer, flags: Int32,
                      droppingSetID: Bool, context: RequestContext, request: WriteRequest) throws(Errno) -> (written: Int, modeChanged: Bool)? {
        try owner(of: inode).write(inode, handle: handle, offset: offset, data: data, flags: flags,
                                   droppingSetID: droppingSetID, context: context, request: request)
    }

    public func flush(_ inode: InodeNumber, handle: UInt64, context: RequestContext) throws(Errno) {
        try owner(of: inode).flush(inode, handle: handle, context: context)
    }

    public func release(_ inode: InodeNumber, handle: UInt64, flags: Int32) {
        (try? owner(of: inode))?.release(inode, handle: handle, flags: flags)
    }

    public func synchronize(_ inode: InodeNumber, handle: UInt64, dataOnly: Bool) throws(Errno) {
        try owner(of: inode).synchronize(inode, handle: handle, dataOnly: dataOnly)
    }

    public func synchronizeDirectory(_ inode: InodeNumber) throws(Errno) {
        if inode == Self.rootInode { return }
        try owner(of: inode).synchronizeDirectory(inode)
    }

    public func openDirectory(_ inode: InodeNumber, context: RequestContext) throws(Errno) {
        if inode == Self.rootInode { return }
        try owner(of: inode).openDirectory(inode, context: context)
    }

    public func pagesListing(of inode: InodeNumber) -> Bool {
        inode != Self.rootInode && ((try? owner(of: inode))?.pagesListing(of: inode) ?? false)
    }

    public func countsListing(of inode: InodeNumber) -> Bool {
        inode != Self.rootInode && ((try? owner(of: inode))?.countsListing(of: inode) ?? false)
    }

    public func listDirectory(_ inode: InodeNumber, after name: String?, limit: Int,
                              context: RequestContext) throws(Errno) -> [DirectoryEntry] {
        try owner(of: inode).listDirectory(inode, after: name, limit: limit, context: context)
    }

    public func listDirectory(_ inode: InodeNumber, context: RequestContext) throws(Errno) -> [DirectoryEntry] {
        guard inode == Self.rootInode else { return try owner(of: inode).listDirectory(inode, context: context) }
        var entries: [DirectoryEntry] = []
        for subtree in subtrees {
            // A store that cannot answer (damaged, say) still shows its name.
            if let entry = try? rootEntry(subtree, context: context) {
                entries.append(DirectoryEntry(name: subtree.name, entry: entry))
            }
        }
        return entries
    }

    public func allocate(_ inode: InodeNumber, handle: UInt64, mode: Int32, offset: UInt64, length: UInt64,
                         context: RequestContext) throws(Errno) {
        if inode == Self.rootInode { throw .notSupported }
        try owner(of: inode).allocate(inode, handle: handle, mode: mode, offset: offset, length: length, context: context)
    }

    public func seek(_ inode: InodeNumber, handle: UInt64, offset: UInt64, whence: Int32,
                     context: RequestContext) throws(Errno) -> UInt64 {
        if inode == Self.rootInode { throw .invalidArgument }
        return try owner(of: inode).seek(inode, handle: handle, offset: offset, whence: whence, context: context)
    }

    /// Between subtrees: EXDEV, and the kernel copies through reads and writes.
    public func copyRange(from source: InodeNumber, handle sourceHandle: UInt64, offset sourceOffset: UInt64,
                          to destination: InodeNumber, handle destinationHandle: UInt64, offset destinationOffset: UInt64,
                          length: Int, context: RequestContext) throws(Errno) -> Int {
        guard source != Self.rootInode, InodeSpace.tag(of: source) == InodeSpace.tag(of: destination) else {
            throw .crossDevice
        }
        return try owner(of: source).copyRange(from: source, handle: sourceHandle, offset: sourceOffset,
                                               to: destination, handle: destinationHandle, offset: destinationOffset,
                                               length: length, context: context)
    }

    public func statistics(_ inode: InodeNumber) throws(Errno) -> FileSystemStatistics {
        statisticsSource()
    }

    public func setExtendedAttribute(_ inode: InodeNumber, name: String, value: [UInt8], flags: Int32,
                                     context: RequestContext) throws(Errno) {
        if inode == Self.rootInode { throw .notSupported }
        try owner(of: inode).setExtendedAttribute(inode, name: name, value: value, flags: flags,
                                                  context: context)
    }

    public func extendedAttribute(_ inode: InodeNumber, name: String,
                                  context: RequestContext) throws(Errno) -> [UInt8] {
        if inode == Self.rootInode { throw .noData }
        return try owner(of: inode).extendedAttribute(inode, name: name, context: context)
    }

    public func extendedAttributeNames(_ inode: InodeNumber, context: RequestContext) throws(Errno) -> [String] {
        if inode == Self.rootInode { return [] }
        return try owner(of: inode).extendedAttributeNames(inode, context: context)
    }

    public func removeExtendedAttribute(_ inode: InodeNumber, name: String,
                                        context: RequestContext) throws(Errno) {
        if inode == Self.rootInode { throw .noData }
        try owner(of: inode).removeExtendedAttribute(inode, name: name, context: context)
    }

    public func shutDown() {
        for subtree in subtrees { subtree.shutDown() }
    }
}
