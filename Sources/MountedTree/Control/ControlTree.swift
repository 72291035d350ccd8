#if canImport(Glibc)
import Glibc
#endif
import FuseLowLevel
import Posix

/// The `.mtmfs/` directory: small control files whose contents are computed on open
/// (`status`), whose writes are commands (`unlock`, `lock`), or whose write is a question
/// that the same descriptor then reads the answer of (`find`, as Plan 9's factotum `rpc`).
///
/// Reads see a snapshot taken at open, so a reader paging through `status` never sees two
/// versions mixed. Nothing here is cached by the kernel (direct I/O, zero timeouts).
///
/// Thread-safety: the handle table is behind a mutex; the providers must be thread-safe.
public final class ControlTree: Subtree {
    /// One control file.
    ///
    /// Thread-safety: a value; its closures are `@Sendable` and run on any request thread.
    public struct File: Sendable {
        public var name: String
        public var mode: mode_t
        /// Produces the contents at open; nil for a write-only file.
        public var contents: (@Sendable () -> String)?
        /// Receives each write (the bytes as written, in libfuse's buffer: a passphrase
        /// must be copied only into secure memory); throws to refuse it.
        public var command: (@Sendable (UnsafeRawBufferPointer) throws(Errno) -> Void)?
        /// Answers each write (the whole question in one write); the answer replaces what
        /// the descriptor reads, from offset 0.
        public var query: (@Sendable (UnsafeRawBufferPointer) throws(Errno) -> String)?
        /// When set, a command's write is answered only once the work it started on other
        /// threads is done: this is handed the answer to run then (the writer waits in
        /// write(2), no worker thread does).
        public var answerWhenDone: (@Sendable (_ answer: @escaping @Sendable () -> Void) -> Void)?

        public init(name: String, mode: mode_t, contents: (@Sendable () -> String)? = nil,
                    command: (@Sendable (UnsafeRawBufferPointer) throws(Errno) -> Void)? = nil,
                    query: (@Sendable (UnsafeRawBufferPointer) throws(Errno) -> String)? = nil,
                    answerWhenDone: (@Sendable (_ answer: @escaping @Sendable () -> Void) -> Void)? = nil) {
            self.name = name
            self.mode = mode
            self.contents = contents
            self.command = command
            self.query = query
            self.answerWhenDone = answerWhenDone
        }
    }

    public let name = ".mtmfs"
    public let space = InodeSpace.control
    public let nodes: NodeTable
    let files: [File]
    let ownership: Ownership
    private let handles = Locked(OpenFiles<[UInt8]>())

    public init(files: [File], ownership: Ownership, nodes: NodeTable) {
        self.files = files
        self.ownership = ownership
        self.nodes = nodes
    }

    /// File i has local inode number i + 2 (1 is the directory).
    private func file(_ inode: InodeNumber) throws(Errno) -> File {
        let index = Int(space.local(inode)) - 2
        guard index >= 0, index < files.count else { throw .noSuchFileOrDirectory }
        return files[index]
    }

    /// Size 0, as /proc's files: the contents are made when a descriptor opens the file
    /// (direct I/O reads them to the end), not for every `stat` or lookup.
    private func attributes(ofFile index: Int) -> Attributes {
        ownership.file(space.inode(UInt64(index + 2)), mode: files[index].mode, size: 0, modified: .now())
    }

    public func lookup(parent: InodeNumber, name: String, context: RequestContext) throws(Errno) -> Entry {
        guard parent == space.root else { throw .notDirectory }
        guard let index = files.firstIndex(where: { $0.name == name }) else { throw .noSuchFileOrDirectory }
        let entry = Entry(attributes: attributes(ofFile: index), cache: .none)
        nodes.reference(entry.inode)  // the files never go: no lock to count under
        return entry
    }

    public func attributes(of inode: InodeNumber, context: RequestContext) throws(Errno) -> (Attributes, CachePolicy) {
        if inode == space.root { return (ownership.directory(inode, mode: 0o755), .none) }
        _ = try file(inode)
        return (attributes(ofFile: Int(space.local(inode)) - 2), .none)
    }

    public func setAttributes(of inode: InodeNumber, _ changes: AttributeChanges, handle: UInt64?,
                              context: RequestContext) throws(Errno) -> (Attributes, CachePolicy) {
        // `echo x > .mtmfs/lock` truncates first: accept a truncation, refuse the rest.
        guard changes.mode == nil, changes.uid == nil, changes.gid == nil else { throw .notPermitted }
        return try attributes(of: inode, context: context)
    }

    public func open(_ inode: InodeNumber, flags: Int32, context: RequestContext) throws(Errno) -> OpenedFile {
        if inode == space.root { throw .isDirectory }
        let file = try file(inode)
        let accessMode = flags & O_ACCMODE
        let wantsRead = accessMode == O_RDONLY || accessMode == O_RDWR
        let wantsWrite = accessMode == O_WRONLY || accessMode == O_RDWR
        if file.query != nil {
            guard accessMode == O_RDWR else { throw .permissionDenied }  // ask and read on one descriptor
        } else {
            if wantsRead && file.contents == nil { throw .permissionDenied }
            if wantsWrite && file.command == nil { throw .permissionDenied }
        }
        let snapshot = wantsRead ? Array((file.contents?() ?? "").utf8) : []
        let handle = handles.withLock { $0.open(snapshot) }
        return OpenedFile(handle: handle.raw, directIO: true)
    }

    public func read(_ inode: InodeNumber, handle: UInt64, offset: UInt64, size: Int, context: RequestContext,
                     reply: (UnsafeRawBufferPointer) -> Void) throws(Errno) {
        let bytes = try handles.withLock { (state) throws(Errno) -> [UInt8] in
            guard let snapshot = state[FileHandle(raw: handle)] else { throw .badFileDescriptor }
            guard offset < UInt64(snapshot.count) else { return [] }
            let start = Int(offset)
            return Array(snapshot[start..<min(snapshot.count, start + size)])
        }
        bytes.withUnsafeBytes { reply($0) }
    }

    public func write(_ inode: InodeNumber, handle: UInt64, offset: UInt64, data: UnsafeRawBufferPointer,
                      flags: Int32, context: RequestContext) throws(Errno) -> Int {
        let file = try file(inode)
        if let query = file.query {
            let answer = Array(try query(data).utf8)
            try handles.withLock { (state) throws(Errno) in
                guard state.replace(FileHandle(raw: handle), with: answer) else { throw .badFileDescriptor }
            }
            return data.count
        }
        guard let command = file.command else { throw .badFileDescriptor }
        try command(data)
        return data.count
    }

    public func write(_ inode: InodeNumber, handle: UInt64, offset: UInt64, data: UnsafeRawBufferPointer, flags: Int32,
                      droppingSetID: Bool, context: RequestContext, request: WriteRequest) throws(Errno) -> (written: Int, modeChanged: Bool)? {
        // Control files have no set-ID bits to drop.
        let written = try write(inode, handle: handle, offset: offset, data: data, flags: flags, context: context)
        guard let answerWhenDone = try file(inode).answerWhenDone, let pending = request.postpone() else { return (written, false) }
        answerWhenDone { pending.reply(written) }
        return nil
    }

    public func release(_ inode: InodeNumber, handle: UInt64, flags: Int32) {
        _ = handles.withLock { $0.release(FileHandle(raw: handle)) }
    }

    public func listDirectory(_ inode: InodeNumber, context: RequestContext) throws(Errno) -> [DirectoryEntry] {
        guard inode == space.root else { throw .notDirectory }
        return files.indices.map { index in
            DirectoryEntry(name: files[index].name, entry: Entry(attributes: attributes(ofFile: index), cache: .none))
        }
    }
}
