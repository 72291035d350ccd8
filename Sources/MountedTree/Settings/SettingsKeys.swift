#if canImport(Glibc)
import Glibc
#endif
import CredentialVault
import FuseLowLevel
import Posix
import SettingsStore

/// How a key of a dictionary is named in `settings/` (SPEC §4), so that every key is a
/// file: as it is, but `%` is `%25` and `/` is `%2F`, a key `.` or `..` is `%2E` or
/// `%2E%2E` and the empty key `%` (the rule of `attributes/`, `AttributeFileName`); a name
/// over 255 bytes is cut at a character boundary and ends with `~` and the first 8 hex
/// digits of the SHA-256 of the key's UTF-8 bytes. A name the rule does not make (`a%2Eb`,
/// `50%`) names no key: creating it is EINVAL.
///
/// Thread-safety: pure functions.
enum SettingsKeyName {
    static let suffixLength = 9  // "~" and 8 hex digits

    static func fileName(of key: String) -> String {
        let escaped = AttributeFileName.escaped(key)
        guard escaped.utf8.count > 255 else { return escaped }
        var cut = Substring(escaped)
        while cut.utf8.count > 255 - suffixLength { cut = cut.dropLast() }
        return String(cut) + "~" + ProgramDigest.hex(Array(ProgramDigest.sha256(Array(key.utf8)).prefix(4)))
    }

    /// The key `name` shows among `keys` (nil: none; a cut name only names a key there is).
    static func key(of name: String, among keys: () -> [String]) -> String? {
        if name.utf8.count > 255 - suffixLength, name.utf8.count <= 255, isCut(name) {
            if let key = keys().first(where: { fileName(of: $0) == name }) { return key }
        }
        guard let key = AttributeFileName.unescaped(name), fileName(of: key) == name else { return nil }
        return key
    }

    private static func isCut(_ name: String) -> Bool {
        let bytes = Array(name.utf8)
        guard bytes.count > suffixLength, bytes[bytes.count - suffixLength] == UInt8(ascii: "~") else { return false }
        return bytes.suffix(8).allSatisfy { ($0 >= 0x30 && $0 <= 0x39) || ($0 >= 0x61 && $0 <= 0x66) }
    }
}

/// The keys of `Settings.plist` as the editing engine sees them (its `EditedStore`), and the
/// directories of `settings/` (dictionaries and arrays) with their inode numbers.
///
/// Persistence: every change re-reads the file if another program changed it, applies the
/// change, and saves atomically in the file's format (`SettingsDocument`); nothing changes in
/// memory when a save fails. A removed key's type and position are remembered for a while
/// (`tombstones`) so that an editor's recreation keeps them.
///
/// Thread-safety: a value type behind `SettingsTree`'s lock.
struct SettingsKeys: EditedStore {
    typealias Key = [String]
    typealias Buffer = PlainBuffer
    typealias Note = PlistType

    /// A directory the kernel knows: a dictionary or an array of the plist.
    ///
    /// Thread-safety: a value inside `SettingsKeys`, behind `SettingsTree`'s lock.
    struct Directory {
        var path: [String]
        var mode: mode_t = 0o755
        /// Its value left the plist (or stopped being a container).
        var removed = false
    }

    let plistPath: String
    let ownership: Ownership
    /// The kernel's references: each directory handed out is counted there, in the same
    /// visit (under the tree's lock) that found or made it.
    let nodes: SubtreeNodes
    var document: SettingsDocument?
    var damage: String?
    var lastLoadAttempt: ContinuousClock.Instant?
    private(set) var directories: [LocalInode: Directory] = [.top: Directory(path: [])]
    private var directoryFor: [[String]: LocalInode] = [[]: .top]
    private var nextDirectory: UInt64 = 0
    /// Type and position of keys removed lately, for their recreation (the last 256).
    private var tombstones: [[String]: (type: PlistType, position: Int)] = [:]
    private var tombstoneOrder: [[String]] = []
    /// Keys whose values left or moved while the engine may hold their files (drained by
    /// the tree into `EditingEngine.keyGone`), and names the kernel must forget.
    var gone: [[String]] = []
    var changedKeys: [[String]] = []
    /// Saves prepared under the tree's lock, written once it is let go (`EditingTree.locked`).
    var saves: [SettingsDocument.Save] = []
    /// Directories whose values left (their editor's files go too).
    var removedDirectories: [LocalInode] = []
    var entryInvalidations: [(parent: LocalInode, name: String)] = []

    static let maximumValueSize = 1 << 20
    static let maximumScratchSize = 64 << 20

    init(plistPath: String, ownership: Ownership, nodes: SubtreeNodes) {
        self.plistPath = plistPath
        self.ownership = ownership
        self.nodes = nodes
        load()
    }

    // MARK: Loading and outside changes

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

    func value(at path: [String]) -> PlistValue? { root.value(at: path[...]) }

    /// Picks up another program's change (the watcher calls it).
    mutating func refreshFromDisk() {
        guard let document else {
            load()
            if self.document != nil { reconcile(previous: .dictionary(PlistDictionary())) }
            return
        }
        let previous = root
        do {
            guard try document.reloadIfChanged() else { return }
        } catch {
            if damage != error.description { Log.error("\(error.description); settings/ answers EIO, the file is left as it is") }
            self.document = nil
            damage = error.description
            return
        }
        reconcile(previous: previous)
    }

    /// After the plist changed under us: keys whose value went or changed, and directories
    /// that are no longer containers, are reported for the kernel to forget.
    mutating func reconcile(previous: PlistValue) {
        for (inode, directory) in directories where inode != .top && !directory.removed {
            if value(at: directory.path)?.isContainer != true { removeDirectories(below: directory.path) }
        }
        changedKeys += changed(between: previous, and: root, at: [])
    }

    /// Key paths (not containers) whose values differ between two roots.
    private func changed(between old: PlistValue?, and new: PlistValue?, at path: [String]) -> [[String]] {
        switch (old, new) {
        case (.dictionary(let a)?, .dictionary(let b)?):
            return Set(a.keys + b.keys).flatMap { changed(between: a[$0], and: b[$0], at: path + [$0]) }
        case (.array(let a)?, .array(let b)?):
            return (0..<max(a.count, b.count)).flatMap { index in
                changed(between: index < a.count ? a[index] : nil, and: index < b.count ? b[index] : nil,
                        at: path + [String(index)])
            }
        default:
            return old == new || path.isEmpty ? [] : [path]
        }
    }

    /// Re-reads the file if another program changed it, applies `change` at the root and
    /// prepares its save, which the tree writes and syncs once its lock is let go
    /// (`saves`). The change is in memory from now on; a save that then fails answers its
    /// request with the error, and the file is read again (`savesFinished`).
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
        saves.append(document.prepare(dictionary))
    }

    mutating func update(_ path: [String], position: Int? = nil,
                         _ change: (inout PlistValue?) throws(Errno) -> Void) throws(Errno) {
        try updateRoot { (root) throws(Errno) in try root.modify(at: path[...], position: position, change) }
    }

    // MARK: Directories

    /// The key path of a directory inode (ENOENT once its value left, ENOTDIR for a file).
    func path(of directory: LocalInode) throws(Errno) -> [String] {
        guard let node = directories[directory] else {
            throw directory.isFile ? .notDirectory : .noSuchFileOrDirectory
        }
        guard !node.removed else { throw .noSuchFileOrDirectory }
        return node.path
    }

    func directoryNode(_ inode: LocalInode) -> Directory? { directories[inode] }

    /// The inode of the container at `path`, if the kernel was given one.
    func existingDirectory(at path: [String]) -> LocalInode? { directoryFor[path] }

    /// The inode of the container at `path`, made on first sight (with no kernel reference).
    mutating func directory(at path: [String]) -> LocalInode {
        if let inode = directoryFor[path] { return inode }
        let inode = LocalInode.directory(nextDirectory)
        nextDirectory += 1
        directories[inode] = Directory(path: path)
        directoryFor[path] = inode
        return inode
    }

    /// The kernel's last reference went (if none came back since, the directory may go).
    /// `keep`: editor's files still live in it (their table is keyed by its inode).
    mutating func referenceGone(_ inode: LocalInode, keep: Bool) {
        guard inode != .top, let node = directories[inode], !nodes.isReferenced(inode), !keep || node.removed else { return }
        directories[inode] = nil
        if directoryFor[node.path] == inode { directoryFor[node.path] = nil }
    }

    mutating func setDirectoryMode(_ inode: LocalInode, _ mode: mode_t) { directories[inode]?.mode = mode & 0o7777 }

    /// Directories at or below `path` stop being theirs; their names are invalidated.
    mutating func removeDirectories(below path: [String]) {
        for (inode, node) in directories where inode != .top && !node.removed && PlistPath.isWithin(node.path, path) {
            directories[inode]!.removed = true
            removedDirectories.append(inode)
            directoryFor[node.path] = nil
            if let parent = directoryFor[Array(node.path.dropLast())] {
                entryInvalidations.append((parent, fileName(of: node.path)))
            }
            if !nodes.isReferenced(inode) { directories[inode] = nil }
        }
    }

    /// Directories at or below `from` now stand for the same place below `to`.
    mutating func moveDirectories(from: [String], to: [String]) {
        for (inode, node) in directories where !node.removed && PlistPath.isWithin(node.path, from) {
            let moved = to + node.path.dropFirst(from.count)
            if directoryFor[node.path] == inode { directoryFor[node.path] = nil }
            directoryFor[moved] = inode
            directories[inode]!.path = moved
        }
    }

    // MARK: Tombstones

    func tombstone(_ path: [String]) -> (type: PlistType, position: Int)? { tombstones[path] }

    mutating func bury(_ path: [String], type: PlistType, position: Int) {
        if tombstones.updateValue((type, position), forKey: path) == nil { tombstoneOrder.append(path) }
        while tombstoneOrder.count > 256 { tombstones[tombstoneOrder.removeFirst()] = nil }
    }

    mutating func unbury(_ path: [String]) {
        guard tombstones.removeValue(forKey: path) != nil else { return }
        tombstoneOrder.removeAll { $0 == path }
    }

    // MARK: Names

    static func checkName(_ name: String) throws(Errno) {
        guard name.utf8.count <= 255 else { throw .nameTooLong }
        guard !name.isEmpty, name != ".", name != "..", !name.contains("/"), PlistText.isXMLText(name) else {
            throw .invalidArgument
        }
    }

    /// The key a name in the directory at `path` stands for: an array's index as it is, a
    /// dictionary's key by `SettingsKeyName` (nil: a name the rule does not make).
    func component(_ name: String, at path: [String]) -> String? {
        if case .array? = value(at: path) { return name }
        return SettingsKeyName.key(of: name) {
            if case .dictionary(let dictionary)? = value(at: path) { return dictionary.keys }
            return []
        }
    }

    /// The file name of the last component of `key` in its directory.
    func fileName(of key: [String]) -> String {
        guard let last = key.last else { return "" }
        return isArray(Array(key.dropLast())) ? last : SettingsKeyName.fileName(of: last)
    }

    func isArray(_ path: [String]) -> Bool {
        if case .array? = value(at: path) { true } else { false }
    }

    // MARK: EditedStore

    func key(named name: String, in directory: LocalInode, isHidden: ([String]) -> Bool) -> [String]? {
        guard let node = directories[directory], !node.removed else { return nil }
        switch value(at: node.path) {
        case .array(let items)?:
            guard let index = PlistPath.arrayIndex(name), index <= items.count else { return nil }
            return node.path + [name]
        case .dictionary?:
            guard let component = component(name, at: node.path) else { return nil }
            let path = node.path + [component]
            let isKey = value(at: path) != nil || isHidden(path) || tombstones[path] != nil
                || !EditorNames.isEditorFile(name)
            return isKey ? path : nil
        default:
            return nil
        }
    }

    func directory(of key: [String]) -> LocalInode? { directoryFor[Array(key.dropLast())] }

    func hasValue(_ key: [String]) -> Bool {
        guard let value = value(at: key) else { return false }
        return !value.isContainer
    }

    func withText<T>(of key: [String], _ body: (UnsafeRawBufferPointer) -> T) throws(Errno) -> T {
        (value(at: key).map(PlistText.render) ?? []).withUnsafeBytes(body)
    }

    func limit(for key: [String]) -> Int { Self.maximumValueSize + 2 }
    var scratchLimit: Int { Self.maximumScratchSize }
    func mode(forNewFile requested: mode_t) -> mode_t { requested }

    /// The type a key's text must fit, where one is known before its first value.
    func knownType(of key: [String], note: PlistType?) -> PlistType? {
        value(at: key)?.type ?? tombstones[key]?.type ?? note
    }

    func accepts(_ text: UnsafeRawBufferPointer, for key: [String], note: PlistType?) -> Bool {
        guard let type = knownType(of: key, note: note), type != .array, type != .dictionary else { return true }
        return PlistText.parse(Array(text), as: type) != nil
    }

    mutating func commit(_ text: PlainBuffer, to key: [String], note: PlistType?) throws(Errno) -> Committed<[String], PlainBuffer> {
        let existing = value(at: key)
        if existing?.isContainer == true { throw .isDirectory }
        let type = existing?.type ?? tombstones[key]?.type ?? note ?? PlistText.inferType(of: text.bytes)
        guard PlistText.stripOneNewline(text.bytes).count <= Self.maximumValueSize else { throw .fileTooLarge }
        guard let value = PlistText.parse(text.bytes, as: type) else { throw .invalidArgument }
        let position = existing == nil ? tombstones[key]?.position : nil
        try update(key, position: position) { $0 = value }
        unbury(key)
        return Committed(shown: PlainBuffer(PlistText.shownText(text.bytes, as: type)))
    }

    /// Removes a key (or container) from the plist, remembering its type and position.
    mutating func remove(_ key: [String]) throws(Errno) {
        guard let value = value(at: key) else { throw .noSuchFileOrDirectory }
        let position = root.position(of: key)
        try update(key) { $0 = nil }
        if let position { bury(key, type: value.type, position: position) }
        if value.isContainer { removeDirectories(below: key) }
        gone.append(key)
        if case .array(let items)? = self.value(at: Array(key.dropLast())) {
            // Later elements moved down one: their names now mean other values.
            let parent = Array(key.dropLast())
            for index in (PlistPath.arrayIndex(key.last!) ?? 0)...items.count {
                let element = parent + [String(index)]
                removeDirectories(below: element)
                gone.append(element)
                if let directory = directoryFor[parent] { entryInvalidations.append((directory, String(index))) }
            }
        }
    }

    mutating func move(_ key: [String], onto target: [String]) throws(Errno) {
        guard value(at: key) != nil else { throw .noSuchFileOrDirectory }
        if isArray(Array(key.dropLast())) || isArray(Array(target.dropLast())) { throw .invalidArgument }
        try moveValue(from: key, to: target)
    }

    /// `rename` of a key or container onto `to` (absent, or of the same kind): the target
    /// keeps its type (the source's text must fit it) and the source goes. Both are read
    /// from the file as it is at the save (another program's change made meanwhile counts).
    mutating func moveValue(from: [String], to: [String]) throws(Errno) {
        var replacedContainer = false
        try updateRoot { (root) throws(Errno) in
            guard let source = root.value(at: from[...]) else { throw .noSuchFileOrDirectory }
            if let target = root.value(at: to[...]) {
                if source.isContainer != target.isContainer { throw source.isContainer ? .notDirectory : .isDirectory }
                if source.isContainer {
                    if case .dictionary(let d) = target, d.count > 0 { throw .directoryNotEmpty }
                    if case .array(let a) = target, !a.isEmpty { throw .directoryNotEmpty }
                }
                let replacement: PlistValue
                if source.isContainer || source.type == target.type {
                    replacement = source
                } else {
                    guard let converted = PlistText.parse(PlistText.render(source), as: target.type) else { throw .invalidArgument }
                    replacement = converted
                }
                try root.modify(at: to[...], position: nil) { $0 = replacement }
                try root.modify(at: from[...], position: nil) { $0 = nil }
                replacedContainer = target.isContainer
            } else {
                guard !PlistPath.isWithin(to, from) else { throw .invalidArgument }
                let position = from.dropLast() == to.dropLast() ? root.position(of: from) : nil
                try root.modify(at: from[...], position: nil) { $0 = nil }
                try root.modify(at: to[...], position: position) { $0 = source }
            }
        }
        if replacedContainer { removeDirectories(below: to) }
        unbury(to)
    }

    /// An editor's file may be made anywhere; any other name that is no key is refused:
    /// in an array an index past the end (or not an index: `List/x`, `List/02`), in a
    /// dictionary a name the naming rule does not make — EINVAL, never a file that vanishes.
    func admitsScratch(named name: String, in directory: LocalInode, count: Int, moved: Bool) throws(Errno) {
        let path = try path(of: directory)
        guard EditorNames.isEditorFile(name) else { throw .invalidArgument }
        if moved && isArray(path) { throw .invalidArgument }
    }

    /// `mv K K~` (vim, emacs): also an array's element, within its array (its value stays
    /// in place while the editor writes the new one).
    func mayRenameAway(_ key: [String], to directory: LocalInode) throws(Errno) {
        let target = try path(of: directory)
        let parent = Array(key.dropLast())
        if (isArray(parent) || isArray(target)) && parent != target { throw .invalidArgument }
    }

    func removesAtOnce(_ key: [String]) -> Bool { false }

    func settledKey(named name: String, in directory: LocalInode) -> [String]? {
        guard let node = directories[directory], !node.removed, case .dictionary? = value(at: node.path),
              let component = component(name, at: node.path), (try? Self.checkName(component)) != nil else { return nil }
        return node.path + [component]
    }

    /// An array's element (or a key below one): its removal renumbers the later elements.
    func renumbersOnRemoval(_ key: [String]) -> Bool {
        (1..<max(1, key.count)).contains { isArray(Array(key.prefix($0))) }
    }

    /// Later elements first, deeper keys before the keys above them.
    func removesBefore(_ a: [String], _ b: [String]) -> Bool {
        for (x, y) in zip(a, b) where x != y {
            if let i = PlistPath.arrayIndex(x), let j = PlistPath.arrayIndex(y) { return i > j }
            return x > y
        }
        return a.count > b.count
    }
}
