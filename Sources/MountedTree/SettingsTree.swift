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
/// Model. Every name in the tree is a node with a stable inode:
/// - a *key* node is bound to a key path of the plist; its text is the rendered value (or
///   the text the user last wrote for it); writes go to a pending buffer that is validated
///   against the key's type and committed (plist rewritten atomically) at flush, fsync or
///   release — never the empty intermediate state an editor's truncate leaves;
/// - a *scratch* node is an editor's temporary, swap, lock or backup file, held in memory
///   only: it never reaches the disk and never becomes a key, unless it is renamed onto a
///   key (which sets the key, keeping its type and position) or, for a name that looks like
///   a key, written and closed (a new key, type inferred or set with `user.plist.type`).
/// - a key renamed to a scratch name (vim's and emacs's `K~`) is *hidden*: it stays in the
///   plist with its last good value until the editor recreates it, renames the backup back,
///   or deletes the backup without recreating it.
/// - an unlinked key is hidden too, and leaves the plist `removalDelay` later (at once on
///   unmount) unless a new file takes its name first: `mv`/`install` from another file
///   system (unlink K, create K) then replace the value in one rewrite, so a crash between
///   their two steps cannot lose the key (found by the reliability suite's crash driver).
///
/// Another program's change to the file shows within a second (a watcher polls the file's
/// identity and tells the kernel what changed); a commit re-reads the file first, so it
/// merges with such a change at key granularity.
///
/// Thread-safety: all state is behind one mutex; kernel invalidations are sent after it is
/// released, from the notifier's own queue.
public final class SettingsTree: Subtree {
    public let name = "settings"
    public let space = InodeSpace.settings
    let notifier: KernelCacheNotifier
    let state: Locked<State>
    private let watching = Atomic<Bool>(true)
    /// Readers keep the kernel's pages of a key until it changes.
    let pageCache = PageCacheGate()

    /// Largest value a key takes (EFBIG beyond), and largest scratch file.
    static let maximumValueSize = 1 << 20
    static let maximumScratchSize = 64 << 20
    static let cache = CachePolicy(entryTimeout: 1, attributeTimeout: 1)
    static let typeAttribute = "user.plist.type"

    public init(plistPath: String, ownership: Ownership, notifier: KernelCacheNotifier,
                watchInterval: Double = 0.2) {
        self.notifier = notifier
        self.state = Locked(State(plistPath: plistPath, ownership: ownership, space: .settings))
        Threads.detach { [weak self] in
            while true {
                usleep(UInt32(watchInterval * 1_000_000))
                guard let self, self.watching.load(ordering: .relaxed) else { return }
                let invalidations = self.state.withLock { s in
                    s.commitDueRemovals(before: .now)
                    return s.refreshFromDisk()
                }
                self.send(invalidations)
            }
        }
    }

    deinit { watching.store(false, ordering: .relaxed) }

    public func shutDown() {
        watching.store(false, ordering: .relaxed)
        state.withLock { s in
            s.commitDueRemovals(before: nil)
            s.invalidations.removeAll()
        }
    }

    /// How long an unlinked key stays in the plist (hidden) waiting for a new file of its name.
    static let removalDelay: Duration = .seconds(1)

    /// Sends the invalidations of a change; a changed inode also closes the page cache gate.
    func send(_ invalidations: [Invalidation]) {
        if invalidations.contains(where: { if case .inode = $0 { true } else { false } }) { pageCache.changed() }
        for invalidation in invalidations {
            switch invalidation {
            case .inode(let inode): notifier.invalidateInode(inode)
            case .entry(let parent, let name): notifier.invalidateEntry(parent: parent, name: name)
            }
        }
    }

    /// Runs `body` under the lock, then sends the invalidations it queued.
    private func locked<T: Sendable>(_ body: (inout State) throws(Errno) -> T) throws(Errno) -> T {
        let (result, invalidations) = try state.withLock { (state) throws(Errno) -> (T, [Invalidation]) in
            try state.ensureLoaded()
            let result = try body(&state)
            defer { state.invalidations.removeAll() }
            return (result, state.invalidations)
        }
        send(invalidations)
        return result
    }

    /// A top-level string key's value (for `accounts/active`), or nil when absent or unreadable.
    public func stringValue(forKey key: String) -> String? {
        state.withLock { s in
            guard case .string(let value)? = s.value(at: [key]) else { return nil }
            return value
        }
    }

    /// Sets a top-level string key (for `accounts/active`), keeping its position.
    public func setString(_ value: String, forKey key: String) throws(Errno) {
        try locked { (s) throws(Errno) in
            try s.update([key]) { $0 = .string(value) }
            if let inode = s.inodeForPath[[key]] {
                s.nodes[inode]?.display = nil
                s.nodes[inode]?.modified = .now()
                s.invalidations.append(.inode(s.space.inode(inode)))
            }
        }
    }

    // MARK: FileSystem

    public func lookup(parent: InodeNumber, name: String, context: RequestContext) throws(Errno) -> Entry {
        try locked { (s) throws(Errno) in try s.lookup(s.local(parent), name) }
    }

    public func attributes(of inode: InodeNumber, context: RequestContext) throws(Errno) -> (Attributes, CachePolicy) {
        // The top directory answers even when the file is damaged, so that `ls` of the
        // mount root shows it; everything inside answers EIO.
        if inode == space.root {
            return state.withLock { s in (s.attributes(of: 1, node: s.nodes[1]!), Self.cache) }
        }
        return try locked { (s) throws(Errno) in
            let local = s.local(inode)
            return (s.attributes(of: local, node: try s.node(local)), Self.cache)
        }
    }

    public func setAttributes(of inode: InodeNumber, _ changes: AttributeChanges, handle: UInt64?,
                              context: RequestContext) throws(Errno) -> (Attributes, CachePolicy) {
        try locked { (s) throws(Errno) in
            let local = s.local(inode)
            try s.setAttributes(local, changes, handle: handle)
            return (s.attributes(of: local, node: try s.node(local)), Self.cache)
        }
    }

    public func readLink(_ inode: InodeNumber, context: RequestContext) throws(Errno) -> String {
        try locked { (s) throws(Errno) in
            guard case .symlink(let target) = try s.node(s.local(inode)).kind else { throw .invalidArgument }
            return target
        }
    }

    public func makeNode(parent: InodeNumber, name: String, mode: mode_t, device: dev_t,
                         context: RequestContext) throws(Errno) -> Entry {
        guard mode & S_IFMT == S_IFREG else { throw .notPermitted }
        return try locked { (s) throws(Errno) in try s.create(s.local(parent), name, mode: mode, exclusive: true).0 }
    }

    public func makeDirectory(parent: InodeNumber, name: String, mode: mode_t,
                              context: RequestContext) throws(Errno) -> Entry {
        try locked { (s) throws(Errno) in try s.makeDirectory(s.local(parent), name) }
    }

    public func unlink(parent: InodeNumber, name: String, context: RequestContext) throws(Errno) {
        try locked { (s) throws(Errno) in try s.unlink(s.local(parent), name) }
    }

    public func removeDirectory(parent: InodeNumber, name: String, context: RequestContext) throws(Errno) {
        try locked { (s) throws(Errno) in try s.removeDirectory(s.local(parent), name) }
    }

    public func makeSymbolicLink(target: String, parent: InodeNumber, name: String,
                                 context: RequestContext) throws(Errno) -> Entry {
        try locked { (s) throws(Errno) in try s.makeSymbolicLink(target, in: s.local(parent), name) }
    }

    public func rename(parent: InodeNumber, name: String, newParent: InodeNumber, newName: String,
                       flags: RenameFlags, context: RequestContext) throws(Errno) {
        try locked { (s) throws(Errno) in
            try s.rename(s.local(parent), name, s.local(newParent), newName, flags: flags)
        }
    }

    public func link(_ inode: InodeNumber, newParent: InodeNumber, newName: String,
                     context: RequestContext) throws(Errno) -> Entry {
        throw .notPermitted
    }

    public func open(_ inode: InodeNumber, flags: Int32, context: RequestContext) throws(Errno) -> OpenedFile {
        let reader = flags & O_ACCMODE == O_RDONLY
        let handle = try locked { (s) throws(Errno) in
            let local = s.local(inode)
            let node = try s.node(local)
            if node.isDirectory { throw .isDirectory }
            let handle = s.newHandle()
            if flags & O_TRUNC != 0 && !reader { try s.truncate(local, to: 0, deferred: true, owner: handle) }
            return handle
        }
        // A reader reads the kernel's pages of the key while it has not changed, and its close
        // validates and commits nothing: no READ and no FLUSH round trip for it.
        if reader { pageCache.admit(inode, notifier: notifier) }
        return OpenedFile(handle: handle, keepCache: reader, noFlush: reader)
    }

    public func create(parent: InodeNumber, name: String, mode: mode_t, flags: Int32,
                       context: RequestContext) throws(Errno) -> (Entry, OpenedFile) {
        try locked { (s) throws(Errno) in
            let (entry, local) = try s.create(s.local(parent), name, mode: mode, exclusive: flags & O_EXCL != 0)
            let handle = s.newHandle()
            if flags & O_TRUNC != 0 { try s.truncate(local, to: 0, deferred: true, owner: handle) }
            return (entry, OpenedFile(handle: handle))
        }
    }

    public func read(_ inode: InodeNumber, handle: UInt64, offset: UInt64, size: Int,
                     context: RequestContext) throws(Errno) -> [UInt8] {
        try locked { (s) throws(Errno) in
            let content = s.content(of: try s.node(s.local(inode)))
            guard offset < UInt64(content.count) else { return [] }
            let start = Int(offset)
            return Array(content[start..<min(content.count, start + size)])
        }
    }

    public func write(_ inode: InodeNumber, handle: UInt64, offset: UInt64, data: UnsafeRawBufferPointer,
                      flags: Int32, context: RequestContext) throws(Errno) -> Int {
        // The kernel copied these bytes into its pages of the key before asking, and keeps
        // them there even when the write is refused: those pages are not the key's.
        pageCache.changed()
        return try locked { (s) throws(Errno) in
            try s.write(s.local(inode), at: offset, Array(data), append: flags & O_APPEND != 0, owner: handle)
            return data.count
        }
    }

    public func flush(_ inode: InodeNumber, handle: UInt64, context: RequestContext) throws(Errno) {
        try locked { (s) throws(Errno) in try s.commit(s.local(inode), by: handle) }
    }

    public func release(_ inode: InodeNumber, handle: UInt64, flags: Int32) {
        _ = try? locked { (s) throws(Errno) in try s.commit(s.local(inode), finalClose: true, by: handle) }
    }

    public func synchronize(_ inode: InodeNumber, handle: UInt64, dataOnly: Bool) throws(Errno) {
        try locked { (s) throws(Errno) in try s.commit(s.local(inode), by: handle) }
    }

    public func listDirectory(_ inode: InodeNumber, context: RequestContext) throws(Errno) -> [DirectoryEntry] {
        try locked { (s) throws(Errno) in try s.list(s.local(inode)) }
    }

    public func setExtendedAttribute(_ inode: InodeNumber, name: String, value: [UInt8], flags: Int32,
                                     context: RequestContext) throws(Errno) {
        guard name == Self.typeAttribute else { throw .notSupported }
        guard let text = String(validating: PlistTextNewline.strip(value), as: UTF8.self),
              let type = PlistType(rawValue: text) else { throw .invalidArgument }
        try locked { (s) throws(Errno) in try s.setType(s.local(inode), type) }
    }

    public func extendedAttribute(_ inode: InodeNumber, name: String,
                                  context: RequestContext) throws(Errno) -> [UInt8] {
        guard name == Self.typeAttribute else { throw .noData }
        return try locked { (s) throws(Errno) in
            guard let type = try s.type(of: s.local(inode)) else { throw .noData }
            return Array(type.rawValue.utf8)
        }
    }

    public func extendedAttributeNames(_ inode: InodeNumber, context: RequestContext) throws(Errno) -> [String] {
        try locked { (s) throws(Errno) in try s.type(of: s.local(inode)) == nil ? [] : [Self.typeAttribute] }
    }

    public func removeExtendedAttribute(_ inode: InodeNumber, name: String,
                                        context: RequestContext) throws(Errno) {
        throw name == Self.typeAttribute ? .notPermitted : .noData
    }
}

enum PlistTextNewline {
    static func strip(_ bytes: [UInt8]) -> [UInt8] {
        var end = bytes.count
        if end > 0 && bytes[end - 1] == 0x0A { end -= 1; if end > 0 && bytes[end - 1] == 0x0D { end -= 1 } }
        return Array(bytes[0..<end])
    }
}

/// Something the kernel must forget, sent once the lock is released.
enum Invalidation: Sendable {
    case inode(InodeNumber)
    case entry(parent: InodeNumber, name: String)
}

extension SettingsTree {
    /// One name in the tree.
    struct Node: Sendable {
        enum Kind: Equatable { case directory, file, symlink(String) }
        enum Binding: Equatable { case key([String]), scratch, removed }

        var parent: UInt64
        var name: String
        var kind: Kind
        var binding: Binding
        /// Scratch (and removed) files: their bytes.
        var bytes: [UInt8] = []
        /// A key file's uncommitted content (after a truncate or write).
        var pending: [UInt8]?
        /// The pending content had a write refused: it is never committed.
        var rejected = false
        /// Data was written into `pending` (not only truncated): a flush commits it.
        var pendingWritten = false
        /// The handle that truncated or wrote `pending` (0: none): only its close commits.
        var pendingOwner: UInt64 = 0
        /// The text last written to a key, shown while it still means the stored value.
        var display: [UInt8]?
        /// A scratch file with a key-like name (or a recreated key): the key it becomes
        /// when written and closed.
        var intendedKey: [String]?
        /// Data written since created (a scratch with a key-like name commits only then).
        var written = false
        /// A scratch file that holds a hidden key's old text (`K~` after `mv K K~`).
        var detachedFrom: [String]?
        /// The type set with `user.plist.type` before the first commit.
        var declaredType: PlistType?
        var mode: mode_t
        var modified: Timestamp
        var changed: Timestamp

        var isDirectory: Bool { kind == .directory }
    }

    struct State: Sendable {
        let plistPath: String
        let ownership: Ownership
        let space: InodeSpace
        var document: SettingsDocument?
        var damage: String?
        var nodes: [UInt64: Node] = [:]
        var inodeForPath: [[String]: UInt64] = [[]: 1]
        var scratchIn: [UInt64: [String: UInt64]] = [:]
        var hidden: Set<[String]> = []
        var tombstones: [[String]: (type: PlistType, position: Int)] = [:]
        /// Unlinked keys still in the plist (hidden), and when they leave it.
        var pendingRemovals: [[String]: ContinuousClock.Instant] = [:]
        var nextInode: UInt64 = 2
        var invalidations: [Invalidation] = []
        var lastLoadAttempt: ContinuousClock.Instant?
        var nextHandle: UInt64 = 0

        mutating func newHandle() -> UInt64 {
            nextHandle += 1
            return nextHandle
        }

        init(plistPath: String, ownership: Ownership, space: InodeSpace) {
            self.plistPath = plistPath
            self.ownership = ownership
            self.space = space
            nodes[1] = Node(parent: 0, name: "", kind: .directory, binding: .key([]), mode: 0o755,
                            modified: ownership.since, changed: ownership.since)
            load()
        }

        // MARK: Loading and external changes

        mutating func load() {
            lastLoadAttempt = .now
            AtomicFile.removeStaleTemporaries(of: plistPath)
            do {
                document = try SettingsDocument(path: plistPath)
                if let damage { Log.info("settings readable again: \(plistPath) (was: \(damage))") }
                damage = nil
            } catch {
                if damage != error.description { Log.error("\(error.description); settings/ answers EIO, the file is left as it is") }
                document = nil
                damage = error.description
            }
        }

        /// EIO while the file is damaged (a retry at most every 200 ms).
        mutating func ensureLoaded() throws(Errno) {
            if document == nil && (lastLoadAttempt?.secondsElapsed ?? .infinity) > 0.2 {
                load()
                if document != nil { reconcile(previous: .dictionary(PlistDictionary())) }
            }
            guard document != nil else { throw .ioError }
        }

        var root: PlistValue { .dictionary(document?.root ?? PlistDictionary()) }

        /// Called by the watcher: picks up another program's change.
        mutating func refreshFromDisk() -> [Invalidation] {
            guard let document else {
                if (lastLoadAttempt?.secondsElapsed ?? .infinity) > 0.2 {
                    load()
                    if self.document != nil { reconcile(previous: PlistValue.dictionary(PlistDictionary())) }
                }
                defer { invalidations.removeAll() }
                return invalidations
            }
            let previous = root
            do {
                guard try document.reloadIfChanged() else { return [] }
            } catch {
                if damage != error.description { Log.error("\(error.description); settings/ answers EIO, the file is left as it is") }
                self.document = nil
                damage = error.description
                return []
            }
            reconcile(previous: previous)
            defer { invalidations.removeAll() }
            return invalidations
        }

        /// After the plist changed under us: drop bindings whose key is gone, forget the
        /// text shown for keys whose value changed, and tell the kernel.
        mutating func reconcile(previous: PlistValue) {
            for (path, inode) in inodeForPath where !path.isEmpty {
                let old = Self.value(in: previous, at: path[...])
                let new = Self.value(in: root, at: path[...])
                if new == nil {
                    unbind(inode, path: path)
                    invalidations.append(.entry(parent: space.inode(nodes[inode]?.parent ?? 1), name: path.last!))
                } else if old != new {
                    nodes[inode]?.display = nil
                    nodes[inode]?.modified = .now()
                    nodes[inode]?.changed = .now()
                    if old?.type != new?.type && (old?.isContainer == true || new?.isContainer == true) {
                        unbind(inode, path: path)
                        invalidations.append(.entry(parent: space.inode(nodes[inode]?.parent ?? 1), name: path.last!))
                    }
                    invalidations.append(.inode(space.inode(inode)))
                }
            }
            hidden = hidden.filter { Self.value(in: root, at: $0[...]) != nil }
        }

        // MARK: Paths and values

        func local(_ inode: InodeNumber) -> UInt64 { space.local(inode) }

        func node(_ local: UInt64) throws(Errno) -> Node {
            guard let node = nodes[local], node.binding != .removed || !node.isDirectory else { throw .noSuchFileOrDirectory }
            return node
        }

        /// The key path of a directory node (a dict or an array).
        func directoryPath(_ local: UInt64) throws(Errno) -> [String] {
            let node = try node(local)
            guard node.isDirectory else { throw .notDirectory }
            guard case .key(let path) = node.binding else { throw .noSuchFileOrDirectory }
            return path
        }

        static func value(in container: PlistValue, at path: ArraySlice<String>) -> PlistValue? {
            guard let first = path.first else { return container }
            switch container {
            case .dictionary(let dictionary):
                return dictionary[first].flatMap { value(in: $0, at: path.dropFirst()) }
            case .array(let items):
                guard let index = arrayIndex(first), index < items.count else { return nil }
                return value(in: items[index], at: path.dropFirst())
            default:
                return nil
            }
        }

        static func arrayIndex(_ name: String) -> Int? {
            guard name == "0" || (!name.hasPrefix("0") && !name.hasPrefix("-")) else { return nil }
            return Int(name)
        }

        func value(at path: [String]) -> PlistValue? {
            if hidden.contains(path) { return nil }
            return Self.value(in: root, at: path[...])
        }

        /// Applies `change` to the value at `path` (nil: absent) inside `container`.
        static func modify(_ container: inout PlistValue, at path: ArraySlice<String>, position: Int?,
                           _ change: (inout PlistValue?) throws(Errno) -> Void) throws(Errno) {
            guard let first = path.first else { throw .invalidArgument }
            switch container {
            case .dictionary(var dictionary):
                if path.count == 1 {
                    var value = dictionary[first]
                    let existed = value != nil
                    try change(&value)
                    if let value, !existed, let position {
                        dictionary.insert(value, forKey: first, at: position)
                    } else {
                        dictionary[first] = value
                    }
                } else {
                    guard var child = dictionary[first] else { throw .noSuchFileOrDirectory }
                    try modify(&child, at: path.dropFirst(), position: position, change)
                    dictionary[first] = child
                }
                container = .dictionary(dictionary)
            case .array(var items):
                guard let index = arrayIndex(first), index <= items.count else { throw .noSuchFileOrDirectory }
                if path.count == 1 {
                    var value: PlistValue? = index < items.count ? items[index] : nil
                    try change(&value)
                    if index == items.count {
                        if let value { items.append(value) }
                    } else if let value {
                        items[index] = value
                    } else {
                        items.remove(at: index)
                    }
                } else {
                    guard index < items.count else { throw .noSuchFileOrDirectory }
                    var child = items[index]
                    try modify(&child, at: path.dropFirst(), position: position, change)
                    items[index] = child
                }
                container = .array(items)
            default:
                throw .notDirectory
            }
        }

        /// Re-reads the file if another program changed it, applies `change` at `path`, and
        /// saves atomically. Nothing changes in memory if the save fails.
        mutating func update(_ path: [String], position: Int? = nil,
                             _ change: (inout PlistValue?) throws(Errno) -> Void) throws(Errno) {
            try updateRoot { (root) throws(Errno) in try Self.modify(&root, at: path[...], position: position, change) }
        }

        /// Several changes in one atomic save.
        mutating func updateRoot(_ change: (inout PlistValue) throws(Errno) -> Void) throws(Errno) {
            guard let document else { throw .ioError }
            let previous = root
            do {
                if try document.reloadIfChanged() { reconcile(previous: previous) }
            } catch {
                throw error.errno
            }
            var newRoot = root
            try change(&newRoot)
            guard case .dictionary(let dictionary) = newRoot else { throw .ioError }
            do {
                try document.save(dictionary)
            } catch {
                Log.error(error.description)
                throw error.errno
            }
            Log.debug("Settings.plist saved (\(dictionary.count) keys)")
        }

        func position(of path: [String]) -> Int? {
            guard case .dictionary(let dictionary)? = Self.value(in: root, at: path.dropLast()[...]) else { return nil }
            return dictionary.index(of: path.last!)
        }

        // MARK: Nodes

        mutating func newInode() -> UInt64 {
            defer { nextInode += 1 }
            return nextInode
        }

        /// The node bound to a key path, made on first sight.
        mutating func boundNode(for path: [String], parent: UInt64, value: PlistValue) -> UInt64 {
            if let inode = inodeForPath[path], nodes[inode] != nil { return inode }
            let inode = newInode()
            let time = ownership.since
            nodes[inode] = Node(parent: parent, name: path.last!, kind: value.isContainer ? .directory : .file,
                                binding: .key(path), mode: value.isContainer ? 0o755 : 0o644,
                                modified: time, changed: time)
            inodeForPath[path] = inode
            return inode
        }

        /// A key's node stops being the key: it keeps its last text, like an unlinked file.
        mutating func unbind(_ inode: UInt64, path: [String]) {
            guard var node = nodes[inode] else { return }
            if !node.isDirectory { node.bytes = content(of: node) }
            node.binding = .removed
            node.pending = nil
            nodes[inode] = node
            if inodeForPath[path] == inode { inodeForPath[path] = nil }
            // Bindings below a removed directory go too.
            if node.isDirectory {
                for (other, otherInode) in inodeForPath where other.count > path.count && Array(other.prefix(path.count)) == path {
                    unbind(otherInode, path: other)
                }
            }
        }

        /// Moves every binding at or below `from` to `to`.
        mutating func rebind(from: [String], to: [String], newParent: UInt64) {
            for (path, inode) in inodeForPath where path.count >= from.count && Array(path.prefix(from.count)) == from {
                let moved = to + path.dropFirst(from.count)
                inodeForPath[path] = nil
                inodeForPath[moved] = inode
                nodes[inode]?.binding = .key(moved)
                if path == from {
                    nodes[inode]?.name = to.last!
                    nodes[inode]?.parent = newParent
                }
            }
        }

        func scratch(in directory: UInt64, _ name: String) -> UInt64? { scratchIn[directory]?[name] }

        func content(of node: Node) -> [UInt8] {
            switch node.binding {
            case .scratch, .removed:
                if case .symlink(let target) = node.kind { return Array(target.utf8) }
                return node.bytes
            case .key(let path):
                if let pending = node.pending { return pending }
                if let display = node.display { return display }
                return Self.value(in: root, at: path[...]).map(PlistText.render) ?? []
            }
        }

        func attributes(of local: UInt64, node: Node) -> Attributes {
            let inode = space.inode(local)
            var attributes: Attributes
            switch node.kind {
            case .directory:
                attributes = ownership.directory(inode, mode: node.mode)
            case .file:
                attributes = ownership.file(inode, mode: node.mode, size: UInt64(content(of: node).count),
                                            modified: node.modified)
            case .symlink(let target):
                attributes = ownership.file(inode, mode: 0o777, size: UInt64(target.utf8.count), modified: node.modified)
                attributes.mode = S_IFLNK | 0o777
            }
            attributes.modificationTime = node.modified
            attributes.changeTime = node.changed
            if node.binding == .removed { attributes.linkCount = 0 }
            return attributes
        }

        func entry(_ local: UInt64) -> Entry {
            Entry(attributes: attributes(of: local, node: nodes[local]!), cache: SettingsTree.cache)
        }

        /// Editors' and tools' temporary, swap, lock and backup names: never keys.
        static func isScratchName(_ name: String) -> Bool {
            if name.hasPrefix(".") || name.hasSuffix("~") || name.hasSuffix(".swp") || name.hasSuffix(".swx")
                || name.hasSuffix(".swo") || name.hasSuffix(".save") || name.hasSuffix(".tmp") || name.hasSuffix(".bak") {
                return true
            }
            if name.hasPrefix("#") && name.hasSuffix("#") && name.count > 1 { return true }  // emacs auto-save
            if name.contains(".save.") { return true }  // nano's K.save.1
            if !name.isEmpty && name.allSatisfy(\.isNumber) { return true }  // vim's 4913 probe (in dicts)
            let utf8 = Array(name.utf8)
            let alphanumeric = { (c: UInt8) in (c >= 0x30 && c <= 0x39) || (c >= 0x41 && c <= 0x5A) || (c >= 0x61 && c <= 0x7A) }
            if name.hasPrefix("sed") && utf8.count == 9 && utf8[3...].allSatisfy(alphanumeric) { return true }  // sed -i
            if name.hasPrefix("XX") && utf8.count == 8 && utf8[2...].allSatisfy(alphanumeric) { return true }   // perl -i
            if name.hasPrefix("tmp") && utf8.count == 11 && utf8[3...].allSatisfy({ alphanumeric($0) || $0 == UInt8(ascii: "_") }) {
                return true  // Python's tempfile
            }
            if name.hasSuffix("___jb_tmp___") || name.hasSuffix("___jb_old___") { return true }  // JetBrains safe write
            return false
        }

        static func checkName(_ name: String) throws(Errno) {
            guard !name.isEmpty, name != ".", name != "..", !name.contains("/"), PlistText.isXMLText(name) else {
                throw .invalidArgument
            }
            guard name.utf8.count <= 255 else { throw .nameTooLong }
        }

        /// A key the kernel can show as a file name (others are left out of listings).
        static func isListable(_ name: String) -> Bool {
            !name.isEmpty && name != "." && name != ".." && !name.contains("/") && !name.contains("\0") && name.utf8.count <= 255
        }

        // MARK: Operations

        mutating func lookup(_ parent: UInt64, _ name: String) throws(Errno) -> Entry {
            let path = try directoryPath(parent)
            if let inode = scratch(in: parent, name) { return entry(inode) }
            guard let value = value(at: path + [name]) else { throw .noSuchFileOrDirectory }
            let inode = boundNode(for: path + [name], parent: parent, value: value)
            return entry(inode)
        }

        mutating func list(_ local: UInt64) throws(Errno) -> [DirectoryEntry] {
            let path = try directoryPath(local)
            var names: [String] = []
            switch value(at: path) {
            case .dictionary(let dictionary)?:
                names = dictionary.keys.filter { !hidden.contains(path + [$0]) && Self.isListable($0) }
            case .array(let items)?: names = items.indices.map(String.init)
            default: throw .noSuchFileOrDirectory
            }
            var entries: [DirectoryEntry] = []
            for name in names {
                guard let value = value(at: path + [name]) else { continue }
                let inode = boundNode(for: path + [name], parent: local, value: value)
                entries.append(DirectoryEntry(name: name, entry: entry(inode)))
            }
            for (name, inode) in (scratchIn[local] ?? [:]).sorted(by: { $0.key < $1.key }) {
                entries.append(DirectoryEntry(name: name, entry: entry(inode)))
            }
            return entries
        }

        /// A new file: scratch; with a key-like name (or a key's old name) it becomes that
        /// key when written and closed.
        mutating func create(_ parent: UInt64, _ name: String, mode: mode_t, exclusive: Bool) throws(Errno) -> (Entry, UInt64) {
            try Self.checkName(name)
            let path = try directoryPath(parent)
            var existing = scratch(in: parent, name)
            if existing == nil, value(at: path + [name]) != nil { existing = space.local(try lookup(parent, name).inode) }
            if let existing {
                if exclusive { throw .fileExists }
                if nodes[existing]!.isDirectory { throw .isDirectory }
                return (entry(existing), existing)
            }
            let now = Timestamp.now()
            var node = Node(parent: parent, name: name, kind: .file, binding: .scratch, mode: mode & 0o7777,
                            modified: now, changed: now)
            switch value(at: path) {
            case .array(let items)?:
                if Self.arrayIndex(name) == items.count { node.intendedKey = path + [name] }
            case .dictionary?:
                if !Self.isScratchName(name) || hidden.contains(path + [name]) || tombstones[path + [name]] != nil {
                    node.intendedKey = path + [name]
                }
            default:
                throw .noSuchFileOrDirectory
            }
            let inode = newInode()
            nodes[inode] = node
            scratchIn[parent, default: [:]][name] = inode
            return (entry(inode), inode)
        }

        mutating func makeSymbolicLink(_ target: String, in parent: UInt64, _ name: String) throws(Errno) -> Entry {
            try Self.checkName(name)
            let path = try directoryPath(parent)
            guard scratch(in: parent, name) == nil, value(at: path + [name]) == nil else { throw .fileExists }
            let now = Timestamp.now()
            let inode = newInode()
            nodes[inode] = Node(parent: parent, name: name, kind: .symlink(target), binding: .scratch,
                                mode: 0o777, modified: now, changed: now)
            scratchIn[parent, default: [:]][name] = inode
            return entry(inode)
        }

        mutating func makeDirectory(_ parent: UInt64, _ name: String) throws(Errno) -> Entry {
            try Self.checkName(name)
            let path = try directoryPath(parent)
            guard scratch(in: parent, name) == nil, value(at: path + [name]) == nil else { throw .fileExists }
            // The readers refuse deeper files: never write one.
            guard path.count + 2 < PropertyList.maximumDepth else { throw .invalidArgument }
            if case .array(let items)? = value(at: path) {
                guard Self.arrayIndex(name) == items.count else { throw .invalidArgument }
            } else if Self.isScratchName(name) && !hidden.contains(path + [name]) {
                throw .invalidArgument
            }
            hidden.remove(path + [name])
            try update(path + [name], position: tombstones[path + [name]]?.position) { $0 = .dictionary(PlistDictionary()) }
            tombstones[path + [name]] = nil
            let inode = boundNode(for: path + [name], parent: parent, value: .dictionary(PlistDictionary()))
            return entry(inode)
        }

        mutating func removeDirectory(_ parent: UInt64, _ name: String) throws(Errno) {
            let path = try directoryPath(parent) + [name]
            guard let value = value(at: path) else {
                if scratch(in: parent, name) != nil { throw .notDirectory }
                throw .noSuchFileOrDirectory
            }
            switch value {
            case .dictionary(let dictionary):
                // Keys unlinked a moment ago are still in the plist, waiting to leave it.
                let left = dictionary.keys.filter { pendingRemovals[path + [$0]] == nil || !hidden.contains(path + [$0]) }
                if !left.isEmpty { throw .directoryNotEmpty }
            case .array(let items): if !items.isEmpty { throw .directoryNotEmpty }
            default: throw .notDirectory
            }
            try removeKey(path, parent: parent)
        }

        /// Removes a key from the plist, remembering its type and position for a recreation.
        mutating func removeKey(_ path: [String], parent: UInt64) throws(Errno) {
            guard let value = Self.value(in: root, at: path[...]) else { throw .noSuchFileOrDirectory }
            let position = self.position(of: path)
            try update(path) { $0 = nil }
            if let position { tombstones[path] = (value.type, position) }
            hidden.remove(path)
            if let inode = inodeForPath[path] { unbind(inode, path: path) }
            if case .array(let items)? = Self.value(in: root, at: path.dropLast()[...]) {
                // Later elements moved down one: their names now mean other inodes.
                let removedIndex = Self.arrayIndex(path.last!) ?? 0
                for index in removedIndex...items.count {
                    let elementPath = Array(path.dropLast()) + [String(index)]
                    if let inode = inodeForPath[elementPath] { unbind(inode, path: elementPath) }
                    invalidations.append(.entry(parent: space.inode(parent), name: String(index)))
                }
            }
        }

        mutating func unlink(_ parent: UInt64, _ name: String) throws(Errno) {
            let directory = try directoryPath(parent)
            if let inode = scratch(in: parent, name) {
                let node = nodes[inode]!
                scratchIn[parent]?[name] = nil
                nodes[inode]?.binding = .removed
                // The backup of a hidden key, deleted while the key was not recreated:
                // the key is gone for good.
                if let path = node.detachedFrom, hidden.contains(path), !isBeingRecreated(path, near: parent) {
                    try removeKey(path, parent: inodeForPath[Array(path.dropLast())] ?? parent)
                }
                return
            }
            let path = directory + [name]
            guard let value = value(at: path) else { throw .noSuchFileOrDirectory }
            if value.isContainer { throw .isDirectory }
            if case .array? = Self.value(in: root, at: directory[...]) {
                try removeKey(path, parent: parent)  // later elements renumber: no waiting
                return
            }
            // Hidden now, out of the plist once `removalDelay` passes without a new file.
            if let position = position(of: path) { tombstones[path] = (value.type, position) }
            hidden.insert(path)
            pendingRemovals[path] = ContinuousClock.now.advanced(by: SettingsTree.removalDelay)
            if let inode = inodeForPath[path] { unbind(inode, path: path) }
        }

        /// Takes the unlinked keys whose time has come out of the plist (one rewrite each);
        /// those a new file took meanwhile are no longer hidden and stay. No deadline: all of them.
        mutating func commitDueRemovals(before deadline: ContinuousClock.Instant?) {
            for (path, due) in pendingRemovals where deadline.map({ due <= $0 }) ?? true {
                pendingRemovals[path] = nil
                guard hidden.contains(path), Self.value(in: root, at: path[...]) != nil else { continue }
                do {
                    try removeKey(path, parent: inodeForPath[Array(path.dropLast())] ?? 1)
                } catch {
                    Log.error("settings: cannot remove \(path.joined(separator: "/")) from the plist: \(error)")
                }
            }
        }

        /// A fresh file in the key's directory will become the key (the editor's new copy).
        func isBeingRecreated(_ path: [String], near parent: UInt64) -> Bool {
            let directory = inodeForPath[Array(path.dropLast())] ?? parent
            return (scratchIn[directory] ?? [:]).values.contains { nodes[$0]?.intendedKey == path }
        }

        mutating func truncate(_ local: UInt64, to size: UInt64, deferred: Bool, owner: UInt64 = 0) throws(Errno) {
            var node = try node(local)
            guard !node.isDirectory else { throw .isDirectory }
            var content = self.content(of: node)
            guard size <= UInt64(Self.limit(for: node)) else { throw .fileTooLarge }
            if Int(size) < content.count { content.removeSubrange(Int(size)...) } else { content += [UInt8](repeating: 0, count: Int(size) - content.count) }
            switch node.binding {
            case .key:
                node.pending = content
                node.rejected = false
                node.pendingWritten = false
                node.pendingOwner = owner
            case .scratch, .removed:
                node.bytes = content
            }
            node.modified = .now()
            node.changed = node.modified
            nodes[local] = node
            if !deferred { try commit(local, finalClose: true, by: owner) }
        }

        static func limit(for node: Node) -> Int {
            node.binding == .scratch && node.intendedKey == nil ? SettingsTree.maximumScratchSize : SettingsTree.maximumValueSize + 2
        }

        mutating func write(_ local: UInt64, at offset: UInt64, _ data: [UInt8], append: Bool, owner: UInt64) throws(Errno) {
            var node = try node(local)
            guard !node.isDirectory else { throw .isDirectory }
            if node.binding != .removed, case .scratch = node.binding, node.intendedKey == nil, case .file = node.kind {
                // Temporary and swap files: written in place (no copy of the whole file per write).
                let start = append ? node.bytes.count : Int(clamping: offset)
                guard start <= SettingsTree.maximumScratchSize, data.count <= SettingsTree.maximumScratchSize - start else {
                    throw .fileTooLarge
                }
                if start + data.count > nodes[local]!.bytes.count {
                    nodes[local]!.bytes.append(contentsOf: repeatElement(0, count: start + data.count - nodes[local]!.bytes.count))
                }
                nodes[local]!.bytes.replaceSubrange(start..<(start + data.count), with: data)
                nodes[local]!.written = true
                nodes[local]!.modified = .now()
                nodes[local]!.changed = nodes[local]!.modified
                return
            }
            var content = content(of: node)
            // An empty value reads as "\n"; appending to it starts from nothing, so that
            // `: > K; echo v >> K` gives "v" as it would in a plain file.
            var start = append ? content.count : Int(clamping: offset)
            if content == [0x0A] && (append || offset == 1) && node.binding != .scratch {
                content = []
                start = 0
            }
            guard start + data.count <= Self.limit(for: node) else {
                // The value is cut short: it must never be committed.
                if case .key = node.binding { node.rejected = true; nodes[local] = node }
                throw .fileTooLarge
            }
            if start > content.count { content += [UInt8](repeating: 0, count: start - content.count) }
            let end = start + data.count
            if end > content.count { content += [UInt8](repeating: 0, count: end - content.count) }
            content.replaceSubrange(start..<end, with: data)
            // A write that is the whole value (the usual `echo v > key`) is checked at once.
            if start == 0 && data.count == content.count, let type = knownType(of: node),
               PlistText.parse(content, as: type) == nil {
                if case .key = node.binding { node.rejected = true; nodes[local] = node }
                throw .invalidArgument
            }
            switch node.binding {
            case .key:
                node.pending = content
                node.pendingWritten = true
                node.pendingOwner = owner
            case .scratch, .removed:
                node.bytes = content
                node.written = true
            }
            node.modified = .now()
            node.changed = node.modified
            nodes[local] = node
        }

        /// The type a file's content must fit, where one is known before its first commit.
        func knownType(of node: Node) -> PlistType? {
            switch node.binding {
            case .key(let path): return Self.value(in: root, at: path[...])?.type
            case .scratch:
                guard let path = node.intendedKey else { return nil }
                return Self.value(in: root, at: path[...])?.type ?? tombstones[path]?.type ?? node.declaredType
            case .removed: return nil
            }
        }

        /// Makes written content the key's value (validating it), or does nothing.
        ///
        /// A flush (any close, fsync) commits what was written. A truncation alone is
        /// committed only at the last close (`finalClose`): shells open, dup2 and close the
        /// descriptor before writing, and that close must not commit an empty value.
        mutating func commit(_ local: UInt64, finalClose: Bool = false, by handle: UInt64) throws(Errno) {
            guard let node = nodes[local], !node.isDirectory else { return }
            switch node.binding {
            case .key(let path):
                // Only the descriptor that truncated or wrote commits: another one's late
                // release must not commit a half-written value.
                guard let pending = node.pending, node.pendingOwner == handle,
                      node.pendingWritten || node.rejected || finalClose else { return }
                nodes[local]?.pending = nil
                nodes[local]?.pendingWritten = false
                if node.rejected {
                    nodes[local]?.rejected = false
                    throw .invalidArgument
                }
                let type = Self.value(in: root, at: path[...])?.type ?? .string
                try setValue(from: pending, at: path, type: type)
                // (setValue may have re-read the file: only a node still bound gets the text.)
                if nodes[local]?.binding == .key(path) { nodes[local]?.display = PlistText.shownText(pending, as: type) }
            case .scratch:
                guard let path = node.intendedKey, node.written else { return }
                try adopt(local, as: path)
            case .removed:
                return
            }
        }

        mutating func setValue(from bytes: [UInt8], at path: [String], type: PlistType) throws(Errno) {
            guard PlistTextNewline.strip(bytes).count <= SettingsTree.maximumValueSize else { throw .fileTooLarge }
            guard let value = PlistText.parse(bytes, as: type) else { throw .invalidArgument }
            let position = Self.value(in: root, at: path[...]) == nil ? tombstones[path]?.position : nil
            try update(path, position: position) { $0 = value }
        }

        /// A scratch node becomes the key at `path`: its content is validated against the
        /// key's type (kept from the key, its tombstone, the xattr, or inferred), saved, and
        /// the node takes the key's place.
        mutating func adopt(_ local: UInt64, as path: [String]) throws(Errno) {
            let node = nodes[local]!
            let existing = Self.value(in: root, at: path[...])
            if existing?.isContainer == true { throw .isDirectory }
            let type = existing?.type ?? tombstones[path]?.type ?? node.declaredType ?? PlistText.inferType(of: node.bytes)
            try setValue(from: node.bytes, at: path, type: type)
            tombstones[path] = nil
            hidden.remove(path)
            if let previous = inodeForPath[path], previous != local { unbind(previous, path: path) }
            let parent = inodeForPath[Array(path.dropLast())] ?? node.parent
            scratchIn[node.parent]?[node.name] = nil
            var adopted = node
            adopted.binding = .key(path)
            adopted.parent = parent
            adopted.name = path.last!
            adopted.display = PlistText.shownText(node.bytes, as: type)
            adopted.bytes = []
            adopted.intendedKey = nil
            adopted.detachedFrom = nil
            adopted.modified = .now()
            adopted.changed = adopted.modified
            nodes[local] = adopted
            inodeForPath[path] = local
        }

        mutating func rename(_ parent: UInt64, _ name: String, _ newParent: UInt64, _ newName: String,
                             flags: RenameFlags) throws(Errno) {
            try Self.checkName(newName)
            if flags.contains(.exchange) { throw .invalidArgument }
            let fromDirectory = try directoryPath(parent)
            let toDirectory = try directoryPath(newParent)
            let toPath = toDirectory + [newName]
            let targetScratch = scratch(in: newParent, newName)
            let targetValue = value(at: toPath)
            if flags.contains(.noReplace) && (targetScratch != nil || targetValue != nil) { throw .fileExists }
            if parent == newParent && name == newName { return }
            let toArray: Bool = if case .array? = value(at: toDirectory) { true } else { false }

            if let source = scratch(in: parent, name) {
                let node = nodes[source]!
                if targetValue?.isContainer == true { throw .isDirectory }
                let becomesKey = targetValue != nil || hidden.contains(toPath) || tombstones[toPath] != nil
                    || (toArray ? Self.arrayIndex(newName).map { idx in
                        if case .array(let items)? = value(at: toDirectory) { return idx == items.count } else { return false }
                    } ?? false : !Self.isScratchName(newName))
                if case .symlink = node.kind, becomesKey { throw .invalidArgument }
                if toArray && !becomesKey { throw .invalidArgument }
                if becomesKey {
                    // Validate and save first: on EINVAL nothing has moved.
                    var moved = node
                    moved.parent = newParent
                    moved.name = newName
                    nodes[source] = moved
                    do {
                        try adopt(source, as: toPath)
                    } catch {
                        nodes[source] = node
                        throw error
                    }
                    scratchIn[parent]?[name] = nil
                    if let targetScratch { dropScratch(targetScratch, in: newParent, newName) }
                    return
                }
                if let targetScratch { dropScratch(targetScratch, in: newParent, newName) }
                scratchIn[parent]?[name] = nil
                nodes[source]?.parent = newParent
                nodes[source]?.name = newName
                nodes[source]?.changed = .now()
                scratchIn[newParent, default: [:]][newName] = source
                return
            }

            let fromPath = fromDirectory + [name]
            guard let sourceValue = value(at: fromPath) else { throw .noSuchFileOrDirectory }
            let sourceInode = boundNode(for: fromPath, parent: parent, value: sourceValue)
            let fromArray: Bool = if case .array? = value(at: fromDirectory) { true } else { false }
            if fromArray || toArray { throw .invalidArgument }

            if !sourceValue.isContainer && Self.isScratchName(newName) && targetValue == nil {
                // `mv K K~` (vim, emacs): K is hidden, its text lives on in the scratch K~.
                if let targetScratch { dropScratch(targetScratch, in: newParent, newName) }
                var node = nodes[sourceInode]!
                node.bytes = content(of: node)
                node.binding = .scratch
                node.pending = nil
                node.display = nil
                node.detachedFrom = fromPath
                node.parent = newParent
                node.name = newName
                node.changed = .now()
                nodes[sourceInode] = node
                inodeForPath[fromPath] = nil
                hidden.insert(fromPath)
                scratchIn[newParent, default: [:]][newName] = sourceInode
                return
            }
            if let targetValue {
                if sourceValue.isContainer != targetValue.isContainer { throw sourceValue.isContainer ? .notDirectory : .isDirectory }
                if sourceValue.isContainer {
                    if case .dictionary(let d) = targetValue, d.count > 0 { throw .directoryNotEmpty }
                    if case .array(let a) = targetValue, !a.isEmpty { throw .directoryNotEmpty }
                }
                // The source's text must fit the target key's type, which is kept.
                let replacement: PlistValue
                if sourceValue.isContainer || sourceValue.type == targetValue.type {
                    replacement = sourceValue
                } else {
                    guard let converted = PlistText.parse(content(of: nodes[sourceInode]!), as: targetValue.type) else { throw .invalidArgument }
                    replacement = converted
                }
                try updateRoot { (root) throws(Errno) in
                    try Self.modify(&root, at: toPath[...], position: nil) { $0 = replacement }
                    try Self.modify(&root, at: fromPath[...], position: nil) { $0 = nil }
                }
                if let targetInode = inodeForPath[toPath] { unbind(targetInode, path: toPath) }
            } else {
                guard toPath.count <= fromPath.count || Array(toPath.prefix(fromPath.count)) != fromPath else { throw .invalidArgument }
                let samePlace = fromDirectory == toDirectory
                let position = samePlace ? self.position(of: fromPath) : nil
                try updateRoot { (root) throws(Errno) in
                    try Self.modify(&root, at: fromPath[...], position: nil) { $0 = nil }
                    try Self.modify(&root, at: toPath[...], position: position) { $0 = sourceValue }
                }
            }
            hidden.remove(toPath)
            if let targetScratch { dropScratch(targetScratch, in: newParent, newName) }
            tombstones[toPath] = nil
            rebind(from: fromPath, to: toPath, newParent: newParent)
            nodes[sourceInode]?.changed = .now()
        }

        mutating func dropScratch(_ inode: UInt64, in directory: UInt64, _ name: String) {
            scratchIn[directory]?[name] = nil
            nodes[inode]?.binding = .removed
            nodes[inode]?.bytes = []
        }

        mutating func setAttributes(_ local: UInt64, _ changes: AttributeChanges, handle: UInt64?) throws(Errno) {
            var node = try node(local)
            if let uid = changes.uid, uid != ownership.uid { throw .notPermitted }
            if let gid = changes.gid, gid != ownership.gid { throw .notPermitted }
            if let mode = changes.mode { node.mode = mode & 0o7777 }
            if let modified = changes.modificationTime { node.modified = modified }
            node.changed = .now()
            nodes[local] = node
            if let size = changes.size {
                // ftruncate by an editor between truncate and write is never committed alone;
                // truncate(1) on a closed file is.
                try truncate(local, to: size, deferred: handle != nil, owner: handle ?? 0)
            }
        }

        func type(of local: UInt64) throws(Errno) -> PlistType? {
            let node = try node(local)
            if case .symlink = node.kind { return nil }
            switch node.binding {
            case .key(let path): return Self.value(in: root, at: path[...])?.type
            case .scratch: return knownType(of: node)
            case .removed: return nil
            }
        }

        /// Sets `user.plist.type`: a new key's type before its first value, or a key's type
        /// where its current text fits the new one (an empty dict and array convert).
        mutating func setType(_ local: UInt64, _ type: PlistType) throws(Errno) {
            let node = try node(local)
            switch node.binding {
            case .scratch:
                guard node.intendedKey != nil || !node.isDirectory else { throw .invalidArgument }
                if type == .array || type == .dictionary { throw .invalidArgument }
                nodes[local]?.declaredType = type
            case .key(let path):
                guard let current = Self.value(in: root, at: path[...]) else { throw .noSuchFileOrDirectory }
                if current.type == type { return }
                let converted: PlistValue
                switch (current, type) {
                case (.dictionary(let d), .array) where d.count == 0: converted = .array([])
                case (.array(let a), .dictionary) where a.isEmpty: converted = .dictionary(PlistDictionary())
                default:
                    guard !current.isContainer, type != .array, type != .dictionary,
                          let value = PlistText.parse(content(of: node), as: type) else { throw .invalidArgument }
                    converted = value
                }
                try update(path) { $0 = converted }
                nodes[local]?.display = nil
                invalidations.append(.inode(space.inode(local)))
            case .removed:
                throw .noSuchFileOrDirectory
            }
        }
    }
}
