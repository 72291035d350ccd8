#if canImport(Glibc)
import Glibc
#endif
import FuseLowLevel
import Posix
import SettingsStore
import Synchronization

/// `settings/`: the keys of `Settings.plist` as files, dictionaries and arrays as
/// directories, so that every common editor and tool can save a key (SPEC §4).
///
/// Files — keys, editors' scratch files, the rules of every save strategy — are the
/// editing engine's (`EditingEngine`, shared with `accounts/`); this type adds directories
/// (containers of the plist), `user.plist.type`, and a watcher that shows another
/// program's change within a second (it polls the file's identity and tells the kernel what
/// changed; a commit re-reads the file first, so it merges with such a change at key
/// granularity). Persistence is `SettingsKeys`.
///
/// Node lifetimes come from the kernel: a file or directory the kernel has forgotten, that
/// no descriptor holds, is freed.
///
/// Thread-safety: all state is behind one mutex; kernel invalidations are sent after it is
/// released, from the notifier's own queue.
public final class SettingsTree: EditingTree {
    public let name = "settings"
    public let space = InodeSpace.settings
    public let nodes: NodeTable
    let notifier: KernelCacheNotifier
    let state: Locked<State>
    private let watching = Atomic<Bool>(true)
    /// Wakes the watcher: a key unlinked (a new deadline), shutdown.
    let wakeup = Wakeup()
    /// Readers keep the kernel's pages of a key until it changes.
    let pageCache = PageCacheGate()

    static let cache = CachePolicy(entryTimeout: 1, attributeTimeout: 1)
    static let typeAttribute = "user.plist.type"

    /// Outside changes of the plist come from inotify on its directory (an editor's
    /// rename, `cp`, a `git pull`), unlinked keys leave at their deadline: one thread asleep
    /// in between (see `Wakeup`), never polling.
    public init(plistPath: String, ownership: Ownership, notifier: KernelCacheNotifier, nodes: NodeTable) {
        self.notifier = notifier
        self.nodes = nodes
        let counted = SubtreeNodes(table: nodes, space: .settings)
        self.state = Locked(State(keys: SettingsKeys(plistPath: plistPath, ownership: ownership, nodes: counted),
                                  engine: EditingEngine(since: ownership.since, nodes: counted)))
        let wakeup = self.wakeup
        let watch = FileWatch.logging(plistPath, otherwise: "outside changes of the settings show every second instead")
        Threads.detach { [weak self] in
            var due: ContinuousClock.Instant? = nil
            var creators: [Int32] = []
            while true {
                let ready = wakeup.wait(until: watch == nil ? .now + .seconds(1) : due,
                                        watching: (watch.map { [$0.fd] } ?? []) + creators)
                guard let self, self.watching.load(ordering: .relaxed) else { return }
                let changed = watch.map { ready.contains($0.fd) && $0.changed() } ?? true
                let (invalidations, saves) = self.state.withLock { s in
                    s.engine.commitDueRemovals(before: .now, &s.keys)
                    if changed { s.keys.refreshFromDisk() }
                    // Editor's files whose program exited (their creators' pidfds turned readable).
                    s.engine.settleScratch(&s.keys)
                    s.engine.creatorsChanged = false
                    creators = s.engine.creatorDescriptors
                    due = s.engine.nextRemovalDue
                    return (s.takeInvalidations(), s.takeSaves())
                }
                self.send(invalidations)
                _ = self.writeOutside(saves)
            }
        }
    }

    /// For `.mtmfs/status`: `settings_error=…` while `Settings.plist` cannot be read.
    public func statusLines() -> [String] {
        state.withLock { s in
            if s.keys.document == nil { s.keys.refreshFromDisk() }
            return s.keys.damage.map { ["settings_error=\($0)"] } ?? []
        }
    }

    /// Why `Settings.plist` cannot be read now (nil: it can), for the mount to say at start.
    public var problem: String? { state.withLock { $0.keys.damage } }

    deinit {
        watching.store(false, ordering: .relaxed)
        wakeup.wake()
    }

    public func shutDown() {
        watching.store(false, ordering: .relaxed)
        wakeup.wake()
        let saves = state.withLock { s in
            s.engine.settleScratch(&s.keys)  // (copies whose program exited and the watcher has not seen yet)
            s.engine.commitDueRemovals(before: nil, &s.keys)
            _ = s.takeInvalidations()
            return s.takeSaves()
        }
        _ = writeOutside(saves)
    }

    /// The entry of a node handed to the kernel (a lookup's, a listing's), counted as its
    /// reference here, under the lock that found the node.
    private func handOut(_ s: State, _ local: LocalInode) throws(Errno) -> Entry {
        let entry = Entry(attributes: try s.attributes(local, space), cache: Self.cache)
        nodes.reference(entry.inode)
        return entry
    }

    /// A top-level string key's value (for `accounts/active`), or nil when absent or unreadable.
    public func stringValue(forKey key: String) -> String? {
        state.withLock { s in
            guard !s.engine.isHidden([key]), case .string(let value)? = s.keys.value(at: [key]) else { return nil }
            return value
        }
    }

    /// Sets a top-level string key (for `accounts/active`), keeping its position.
    public func setString(_ value: String, forKey key: String) throws(Errno) {
        try locked { (s) throws(Errno) in
            try s.keys.update([key]) { $0 = .string(value) }
            s.engine.keyChanged([key])
            s.engine.unhide([key])  // set again after an unlink: it stays
        }
    }

    /// Files and directories held, editor's files linked, hidden keys (for tests and status).
    var census: (files: Int, scratch: Int, hidden: Int, directories: Int) {
        state.withLock { s in
            let files = s.engine.census
            return (files.files, files.scratch, files.hidden, s.keys.directories.count)
        }
    }

    // MARK: FileSystem

    public func lookup(parent: InodeNumber, name: String, context: RequestContext) throws(Errno) -> Entry {
        try locked { (s) throws(Errno) in
            let made = try s.lookup(space.local(of: parent), name)
            return try handOut(s, made)
        }
    }

    public func lastReferenceGone(_ inode: InodeNumber) {
        pageCache.forget(inode)
        let saves = state.withLock { s in
            s.referenceGone(space.local(of: inode))
            return s.takeSaves()
        }
        _ = writeOutside(saves)
    }

    public func attributes(of inode: InodeNumber, context: RequestContext) throws(Errno) -> (Attributes, CachePolicy) {
        // The top directory answers even when the file is damaged, so that `ls` of the
        // mount root shows it; everything inside answers EIO.
        if inode == space.root {
            return (state.withLock { s in s.keys.ownership.directory(inode, mode: s.keys.directories[.top]!.mode) }, Self.cache)
        }
        return try locked { (s) throws(Errno) in (try s.attributes(space.local(of: inode), space), Self.cache) }
    }

    public func setAttributes(of inode: InodeNumber, _ changes: AttributeChanges, handle: UInt64?,
                              context: RequestContext) throws(Errno) -> (Attributes, CachePolicy) {
        try locked { (s) throws(Errno) in
            let local = space.local(of: inode)
            try s.setAttributes(local, changes, handle: handle.map(FileHandle.init(raw:)))
            return (try s.attributes(local, space), Self.cache)
        }
    }

    public func readLink(_ inode: InodeNumber, context: RequestContext) throws(Errno) -> String {
        try locked { (s) throws(Errno) in
            guard let target = s.engine.files[space.local(of: inode)]?.symlinkTarget else { throw .invalidArgument }
            return target
        }
    }

    public func makeNode(parent: InodeNumber, name: String, mode: mode_t, device: dev_t,
                         context: RequestContext) throws(Errno) -> Entry {
        guard mode & S_IFMT == S_IFREG else { throw .notPermitted }
        return try locked { (s) throws(Errno) in
            let handle = s.newHandle()
            let local = try s.create(space.local(of: parent), name, mode: mode, flags: O_CREAT | O_EXCL, handle: handle,
                                     requester: context.pid)
            try s.engine.release(local, handle: handle, &s.keys)
            return try handOut(s, local)
        }
    }

    public func makeDirectory(parent: InodeNumber, name: String, mode: mode_t,
                              context: RequestContext) throws(Errno) -> Entry {
        try locked { (s) throws(Errno) in
            let made = try s.makeDirectory(space.local(of: parent), name)
            return try handOut(s, made)
        }
    }

    public func unlink(parent: InodeNumber, name: String, context: RequestContext) throws(Errno) {
        try locked { (s) throws(Errno) in try s.unlink(space.local(of: parent), name) }
    }

    public func removeDirectory(parent: InodeNumber, name: String, context: RequestContext) throws(Errno) {
        try locked { (s) throws(Errno) in try s.removeDirectory(space.local(of: parent), name) }
    }

    public func makeSymbolicLink(target: String, parent: InodeNumber, name: String,
                                 context: RequestContext) throws(Errno) -> Entry {
        try locked { (s) throws(Errno) in
            let made = try s.makeSymbolicLink(target, in: space.local(of: parent), name, requester: context.pid)
            return try handOut(s, made)
        }
    }

    public func rename(parent: InodeNumber, name: String, newParent: InodeNumber, newName: String,
                       flags: RenameFlags, context: RequestContext) throws(Errno) {
        try locked { (s) throws(Errno) in
            try s.rename(space.local(of: parent), name, space.local(of: newParent), newName, flags: flags, requester: context.pid)
        }
    }

    public func link(_ inode: InodeNumber, newParent: InodeNumber, newName: String,
                     context: RequestContext) throws(Errno) -> Entry {
        throw .notPermitted
    }

    public func open(_ inode: InodeNumber, flags: Int32, context: RequestContext) throws(Errno) -> OpenedFile {
        let reader = flags & O_ACCMODE == O_RDONLY
        let handle = try locked { (s) throws(Errno) in
            let local = space.local(of: inode)
            guard local.isFile else { throw .isDirectory }
            let handle = s.newHandle()
            try s.engine.open(local, handle: handle, truncate: flags & O_TRUNC != 0 && !reader, s.keys)
            return handle
        }
        // A reader reads the kernel's pages of the key while it has not changed, and its close
        // validates and commits nothing: no READ and no FLUSH round trip for it.
        let keep = reader && pageCache.admit(inode, notifier: notifier)
        return OpenedFile(handle: handle.raw, directIO: reader && !keep, keepCache: keep, noFlush: reader)
    }

    public func create(parent: InodeNumber, name: String, mode: mode_t, flags: Int32,
                       context: RequestContext) throws(Errno) -> (Entry, OpenedFile) {
        try locked { (s) throws(Errno) in
            let handle = s.newHandle()
            let local = try s.create(space.local(of: parent), name, mode: mode, flags: flags, handle: handle,
                                     requester: context.pid)
            return (try handOut(s, local), OpenedFile(handle: handle.raw))
        }
    }

    /// The bytes are copied under the lock and replied after it (settings are no secret).
    public func read(_ inode: InodeNumber, handle: UInt64, offset: UInt64, size: Int, context: RequestContext,
                     reply: (UnsafeRawBufferPointer) -> Void) throws(Errno) {
        let bytes = try locked { (s) throws(Errno) -> [UInt8] in
            try s.engine.withContent(space.local(of: inode), s.keys) { content in
                guard offset < UInt64(content.count) else { return [] }
                let start = Int(offset)
                return Array(content[start..<min(content.count, start + size)])
            }
        }
        bytes.withUnsafeBytes { reply($0) }
    }

    public func write(_ inode: InodeNumber, handle: UInt64, offset: UInt64, data: UnsafeRawBufferPointer,
                      flags: Int32, context: RequestContext) throws(Errno) -> Int {
        // The kernel copied these bytes into its pages of the key before asking, and keeps
        // them there even when the write is refused: those pages are not the key's.
        pageCache.changed()
        return try locked { (s) throws(Errno) in
            try s.engine.write(space.local(of: inode), at: offset, data, append: flags & O_APPEND != 0,
                               owner: FileHandle(raw: handle), s.keys)
            return data.count
        }
    }

    public func flush(_ inode: InodeNumber, handle: UInt64, context: RequestContext) throws(Errno) {
        try locked { (s) throws(Errno) in
            try s.engine.flush(space.local(of: inode), handle: FileHandle(raw: handle), &s.keys)
        }
    }

    public func release(_ inode: InodeNumber, handle: UInt64, flags: Int32) {
        // The open is let go even while the plist cannot be read.
        lockedAlways { s in try? s.engine.release(space.local(of: inode), handle: FileHandle(raw: handle), &s.keys) }
    }

    public func synchronize(_ inode: InodeNumber, handle: UInt64, dataOnly: Bool) throws(Errno) {
        try locked { (s) throws(Errno) in
            try s.engine.commit(space.local(of: inode), by: FileHandle(raw: handle), finalClose: false, &s.keys)
        }
    }

    public func listDirectory(_ inode: InodeNumber, context: RequestContext) throws(Errno) -> [DirectoryEntry] {
        try locked { (s) throws(Errno) in
            let names = try s.list(space.local(of: inode))
            return try names.map { (name, local) throws(Errno) in DirectoryEntry(name: name, entry: try handOut(s, local)) }
        }
    }

    /// Each entry listed is counted as a kernel reference under the lock of the listing: a
    /// key that leaves before the reply reaches the kernel keeps its file for it.
    public func countsListing(of inode: InodeNumber) -> Bool { true }

    public func setExtendedAttribute(_ inode: InodeNumber, name: String, value: [UInt8], flags: Int32,
                                     context: RequestContext) throws(Errno) {
        guard name == Self.typeAttribute else { throw .notSupported }
        guard let text = String(validating: PlistText.stripOneNewline(value), as: UTF8.self),
              let type = PlistType(rawValue: text) else { throw .invalidArgument }
        try locked { (s) throws(Errno) in try s.setType(space.local(of: inode), type) }
    }

    public func extendedAttribute(_ inode: InodeNumber, name: String,
                                  context: RequestContext) throws(Errno) -> [UInt8] {
        guard name == Self.typeAttribute else { throw .noData }
        return try locked { (s) throws(Errno) in
            guard let type = try s.type(of: space.local(of: inode)) else { throw .noData }
            return Array(type.rawValue.utf8)
        }
    }

    public func extendedAttributeNames(_ inode: InodeNumber, context: RequestContext) throws(Errno) -> [String] {
        try locked { (s) throws(Errno) in try s.type(of: space.local(of: inode)) == nil ? [] : [Self.typeAttribute] }
    }

    public func removeExtendedAttribute(_ inode: InodeNumber, name: String,
                                        context: RequestContext) throws(Errno) {
        throw name == Self.typeAttribute ? .notPermitted : .noData
    }
}
