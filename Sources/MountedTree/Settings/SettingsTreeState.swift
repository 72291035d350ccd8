#if canImport(Glibc)
import Glibc
#endif
import FuseLowLevel
import Posix
import SettingsStore

extension SettingsTree {
    /// Everything `settings/` holds: the plist and its directories (`keys`) and the files
    /// (`engine`). Directory operations are here; file operations go to the engine.
    ///
    /// Thread-safety: a value behind `SettingsTree.state`.
    struct State: EditingTreeState, @unchecked Sendable {
        var keys: SettingsKeys
        var engine: EditingEngine<SettingsKeys>
        var handles = HandleAllocator()

        /// Every request but a release needs the plist read (EIO while it cannot be).
        mutating func admit() throws(Errno) { try keys.ensureLoaded() }

        mutating func newHandle() -> FileHandle { handles.next() }

        /// Hands the store's news to the engine: keys whose value went or changed.
        mutating func settle() {
            let gone = keys.gone
            keys.gone.removeAll()
            for key in gone { engine.keyGone(key, keys) }
            let changed = keys.changedKeys
            keys.changedKeys.removeAll()
            for key in changed {
                if keys.hasValue(key) {
                    engine.keyChanged(key)
                    continue
                }
                // Gone, or now a container (or a container gone or retyped): every key file
                // at or below it stops being its key.
                for bound in Array(engine.boundKeys) where PlistPath.isWithin(bound, key) {
                    if let parent = keys.directory(of: bound) { keys.entryInvalidations.append((parent, keys.fileName(of: bound))) }
                    engine.keyGone(bound, keys)
                }
            }
            engine.dropHidden { keys.value(at: $0) == nil }
            let removed = keys.removedDirectories
            keys.removedDirectories.removeAll()
            for directory in removed { engine.dropScratchFiles(in: directory) }
        }

        /// The kernel's last reference to a node went: a file goes as the engine decides, a
        /// directory unless editor's files still live in it.
        mutating func referenceGone(_ inode: LocalInode) {
            if inode.isFile {
                engine.referenceGone(inode)
            } else {
                keys.referenceGone(inode, keep: engine.hasScratchFiles(in: inode))
            }
        }

        mutating func takeSaves() -> [any DeferredSave] {
            defer { keys.saves.removeAll() }
            return keys.saves
        }

        /// A failed save: the plist is read again (once no other save is in flight; a later
        /// one that succeeded holds this change too), and what changed is invalidated.
        mutating func savesFinished(failed: Bool) {
            if failed { keys.refreshFromDisk() }
        }

        /// The invalidations queued so far (emptied).
        mutating func takeInvalidations() -> [Invalidation] {
            settle()
            var result = engine.invalidations.map(Invalidation.inode)
            result += keys.entryInvalidations.map { Invalidation.entry(parent: $0.parent, name: $0.name) }
            result += engine.entryInvalidations.map { Invalidation.entry(parent: $0.directory, name: $0.name) }
            engine.invalidations.removeAll()
            engine.entryInvalidations.removeAll()
            keys.entryInvalidations.removeAll()
            return result
        }

        func attributes(_ local: LocalInode, _ space: InodeSpace) throws(Errno) -> Attributes {
            if local.isFile {
                return try engine.attributes(of: local, as: space.inode(local), ownership: keys.ownership, keys)
            }
            guard let directory = keys.directoryNode(local), !directory.removed else { throw .noSuchFileOrDirectory }
            return keys.ownership.directory(space.inode(local), mode: directory.mode)
        }

        /// The container named `name` in the directory at `path` when there is one (and no
        /// editor's file shadows it).
        func container(_ name: String, in parent: LocalInode, path: [String]) -> PlistValue? {
            guard engine.scratch(named: name, in: parent) == nil, let component = keys.component(name, at: path),
                  !engine.isHidden(path + [component]), let value = keys.value(at: path + [component]),
                  value.isContainer else { return nil }
            return value
        }

        /// A name a file may be made under in the directory at `path`: an editor's file's
        /// name as it is, a key's by the naming rule, the key an XML plist can hold.
        func checkName(_ name: String, at path: [String]) throws(Errno) {
            guard name.utf8.count <= 255 else { throw .nameTooLong }
            guard name != ".", name != "..", !name.isEmpty, !name.contains("/") else { throw .invalidArgument }
            if let component = keys.component(name, at: path) {
                guard PlistText.isXMLText(component) else { throw .invalidArgument }
            } else if !EditorNames.isEditorFile(name) {
                throw .invalidArgument
            }
        }

        /// The key path `name` names in the directory at `path` (EINVAL: a name the naming
        /// rule does not make, `SettingsKeyName`).
        func keyPath(_ name: String, at path: [String]) throws(Errno) -> [String] {
            guard let component = keys.component(name, at: path) else { throw .invalidArgument }
            return path + [component]
        }

        // MARK: Names

        mutating func lookup(_ parent: LocalInode, _ name: String) throws(Errno) -> LocalInode {
            let path = try keys.path(of: parent)
            if container(name, in: parent, path: path) != nil {
                return keys.directory(at: try keyPath(name, at: path))
            }
            return try engine.lookup(name, in: parent, keys)
        }

        /// Names of a directory with their inodes (made on first sight, not counted).
        mutating func list(_ local: LocalInode) throws(Errno) -> [(String, LocalInode)] {
            let path = try keys.path(of: local)
            var names: [(component: String, name: String)] = []
            switch keys.value(at: path) {
            case .dictionary(let dictionary)?: names = dictionary.keys.map { ($0, SettingsKeyName.fileName(of: $0)) }
            case .array(let items)?: names = items.indices.map { (String($0), String($0)) }
            default: throw .noSuchFileOrDirectory
            }
            var entries: [(String, LocalInode)] = []
            for (component, name) in names where !engine.isHidden(path + [component]) {
                let key = path + [component]
                guard let value = keys.value(at: key) else { continue }
                if engine.scratch(named: name, in: local) != nil { continue }
                entries.append((name, value.isContainer ? keys.directory(at: key) : engine.file(for: key, keys)))
            }
            entries += engine.scratchFiles(in: local).map { ($0.name, $0.inode) }
            return entries
        }

        mutating func create(_ parent: LocalInode, _ name: String, mode: mode_t, flags: Int32,
                             handle: FileHandle, requester: pid_t) throws(Errno) -> LocalInode {
            let path = try keys.path(of: parent)
            try checkName(name, at: path)
            if container(name, in: parent, path: path) != nil {
                throw flags & O_EXCL != 0 ? .fileExists : .isDirectory
            }
            return try engine.create(name, in: parent, mode: mode, exclusive: flags & O_EXCL != 0,
                                     truncate: flags & O_TRUNC != 0, handle: handle, requester: requester, keys)
        }

        mutating func makeSymbolicLink(_ target: String, in parent: LocalInode, _ name: String,
                                       requester: pid_t) throws(Errno) -> LocalInode {
            let path = try keys.path(of: parent)
            try checkName(name, at: path)
            if container(name, in: parent, path: path) != nil { throw .fileExists }
            // A key is no link: only an editor's (emacs's lock) may be one.
            if !EditorNames.isEditorFile(name) && engine.scratch(named: name, in: parent) == nil { throw .notPermitted }
            return try engine.makeSymbolicLink(target, named: name, in: parent, requester: requester, keys)
        }

        mutating func makeDirectory(_ parent: LocalInode, _ name: String) throws(Errno) -> LocalInode {
            let path = try keys.path(of: parent)
            try checkName(name, at: path)
            let keyPath = try self.keyPath(name, at: path)
            guard engine.scratch(named: name, in: parent) == nil, keys.value(at: keyPath) == nil || engine.isHidden(keyPath) else {
                throw .fileExists
            }
            // The readers refuse deeper files: never write one.
            guard path.count + 2 < PropertyList.maximumDepth else { throw .invalidArgument }
            if keys.isArray(path) {
                guard case .array(let items)? = keys.value(at: path), PlistPath.arrayIndex(name) == items.count else {
                    throw .invalidArgument
                }
            } else if EditorNames.isEditorFile(name) && !engine.isHidden(keyPath) {
                throw .invalidArgument
            }
            try keys.update(keyPath, position: keys.tombstone(keyPath)?.position) { $0 = .dictionary(PlistDictionary()) }
            keys.unbury(keyPath)
            engine.keyGone(keyPath, keys)
            return keys.directory(at: keyPath)
        }

        mutating func removeDirectory(_ parent: LocalInode, _ name: String) throws(Errno) {
            guard let path = try? keyPath(name, at: try keys.path(of: parent)) else {
                if engine.scratch(named: name, in: parent) != nil { throw .notDirectory }
                throw .noSuchFileOrDirectory
            }
            guard let value = keys.value(at: path), !engine.isHidden(path) else {
                if engine.scratch(named: name, in: parent) != nil { throw .notDirectory }
                throw .noSuchFileOrDirectory
            }
            if engine.scratch(named: name, in: parent) != nil { throw .notDirectory }
            switch value {
            case .dictionary(let dictionary):
                // Keys unlinked a moment ago are still in the plist, waiting to leave it.
                if dictionary.keys.contains(where: { !engine.isLeaving(path + [$0]) }) { throw .directoryNotEmpty }
            case .array(let items):
                // Elements unlinked a moment ago are still in the plist, waiting to leave it.
                if items.indices.contains(where: { !engine.isLeaving(path + [String($0)]) }) { throw .directoryNotEmpty }
            default: throw .notDirectory
            }
            if let directory = keys.existingDirectory(at: path), engine.hasScratchFiles(in: directory) {
                throw .directoryNotEmpty
            }
            try keys.remove(path)
            engine.dropHidden { PlistPath.isWithin($0, path) }
        }

        mutating func unlink(_ parent: LocalInode, _ name: String) throws(Errno) {
            let path = try keys.path(of: parent)
            if container(name, in: parent, path: path) != nil { throw .isDirectory }
            try engine.unlink(name, in: parent, &keys)
        }

        mutating func rename(_ parent: LocalInode, _ name: String, _ newParent: LocalInode, _ newName: String,
                             flags: RenameFlags, requester: pid_t) throws(Errno) {
            let fromDirectory = try keys.path(of: parent)
            let toDirectory = try keys.path(of: newParent)
            try checkName(newName, at: toDirectory)
            if container(name, in: parent, path: fromDirectory) != nil {
                // A dictionary or array moves with everything below it.
                if flags.contains(.exchange) { throw .invalidArgument }
                let from = try keyPath(name, at: fromDirectory), to = try keyPath(newName, at: toDirectory)
                if engine.scratch(named: newName, in: newParent) != nil { throw .notDirectory }
                let targetExists = keys.value(at: to) != nil && !engine.isHidden(to)
                if flags.contains(.noReplace) && targetExists { throw .fileExists }
                if from == to { return }
                if keys.isArray(fromDirectory) || keys.isArray(toDirectory) { throw .invalidArgument }
                if !targetExists && engine.isLeaving(to) {
                    // Unlinked a moment ago: gone for this rename.
                    try keys.remove(to)
                    engine.keyGone(to, keys)
                } else if !targetExists && engine.isHidden(to) {
                    throw .fileExists
                }
                try keys.moveValue(from: from, to: to)
                keys.moveDirectories(from: from, to: to)
                engine.rebind { PlistPath.isWithin($0, from) ? to + $0.dropFirst(from.count) : nil }
                return
            }
            if container(newName, in: newParent, path: toDirectory) != nil {
                if engine.scratch(named: name, in: parent) == nil
                    && (try? keyPath(name, at: fromDirectory)).flatMap({ keys.value(at: $0) }) == nil {
                    throw .noSuchFileOrDirectory
                }
                throw .isDirectory
            }
            try engine.rename(name, in: parent, to: newName, in: newParent, flags: flags, requester: requester, &keys)
        }

        // MARK: Attributes

        mutating func setAttributes(_ local: LocalInode, _ changes: AttributeChanges, handle: FileHandle?) throws(Errno) {
            _ = try attributes(local, .settings)
            if let uid = changes.uid, uid != keys.ownership.uid { throw .notPermitted }
            if let gid = changes.gid, gid != keys.ownership.gid { throw .notPermitted }
            guard local.isFile else {
                if let mode = changes.mode { keys.setDirectoryMode(local, mode) }
                if changes.size != nil { throw .isDirectory }
                return
            }
            if let mode = changes.mode { engine.setMode(local, mode) }
            if let modified = changes.modificationTime { engine.setModified(local, modified) }
            if let size = changes.size {
                // ftruncate by an editor between truncate and write is never committed alone;
                // truncate(1) on a closed file is.
                try engine.truncate(local, to: Int(clamping: size), owner: handle, deferred: handle != nil, &keys)
            }
        }

        func type(of local: LocalInode) throws(Errno) -> PlistType? {
            guard local.isFile else {
                return keys.value(at: try keys.path(of: local))?.type
            }
            guard let file = engine.files[local] else { throw .noSuchFileOrDirectory }
            if file.symlinkTarget != nil { return nil }
            if let key = file.key { return keys.value(at: key)?.type }
            if let key = file.intendedKey { return keys.knownType(of: key, note: file.note) }
            return nil
        }

        /// Sets `user.plist.type`: a new key's type before its first value, or a key's type
        /// where its current text fits the new one (an empty dict and array convert).
        mutating func setType(_ local: LocalInode, _ type: PlistType) throws(Errno) {
            let path: [String]
            if local.isFile {
                guard let file = engine.files[local] else { throw .noSuchFileOrDirectory }
                guard let key = file.key else {
                    guard file.isLinkedScratch, file.symlinkTarget == nil else { throw .noSuchFileOrDirectory }
                    if type == .array || type == .dictionary { throw .invalidArgument }
                    engine.setNote(local, type)
                    return
                }
                path = key
            } else {
                path = try keys.path(of: local)
                if path.isEmpty { throw .invalidArgument }
            }
            guard let current = keys.value(at: path) else { throw .noSuchFileOrDirectory }
            if current.type == type { return }
            let converted: PlistValue
            switch (current, type) {
            case (.dictionary(let d), .array) where d.count == 0: converted = .array([])
            case (.array(let a), .dictionary) where a.isEmpty: converted = .dictionary(PlistDictionary())
            default:
                guard !current.isContainer, type != .array, type != .dictionary else { throw .invalidArgument }
                let text = try engine.withContent(local, keys) { Array($0) }
                guard let value = PlistText.parse(text, as: type) else { throw .invalidArgument }
                converted = value
            }
            try keys.update(path) { $0 = converted }
            engine.keyChanged(path)
        }
    }
}

extension SettingsDocument.Save: DeferredSave {
    var failure: Errno? { error?.errno }
}
