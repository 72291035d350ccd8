#if canImport(Glibc)
import Glibc
#endif
import CredentialVault
import SecureMemory
import FuseLowLevel
import Posix
import SecretService

extension AccountsTree {
    /// Everything `accounts/` holds: the vault, its session and fields (`fields`) and the
    /// files (`engine`). Account directories are here; files go to the engine.
    ///
    /// Thread-safety: a value behind `AccountsTree.state`.
    struct State: EditingTreeState, @unchecked Sendable {
        let ownership: Ownership
        var fields: AccountFields
        var engine: EditingEngine<AccountFields>
        /// The server directories of `by-server/` handed out since the unlock.
        var views = ServerDirectories()
        /// Told which accounts changed (for the Secret Service), as the engine is.
        let secretObservers: SecretObservers
        /// While locked, with the Secret Service served: the index as the lock found it, so
        /// that a search finds the items it will unlock (SPEC §2c). Gone at unlock.
        var lockedSearch: LockedSearchIndex?

        /// Every request but a release needs a vault (EIO while none can be read).
        func admit() throws(Errno) {
            guard fields.vault != nil else { throw .ioError }
        }

        /// Hands fields changed by the store (a removal, a URL's parts) to the engine.
        mutating func settle() {
            let changed = fields.changedKeys
            fields.changedKeys.removeAll()
            // (An attribute changed elsewhere may be gone: its file goes with it.)
            for key in changed {
                if key.isAttribute && !fields.hasValue(key) {
                    if engine.boundKeys.contains(key) {
                        engine.entryInvalidations.append((AccountFields.attributesDirectory(of: key.account), fields.name(of: key)))
                    }
                    engine.keyGone(key, fields)
                } else {
                    engine.keyChanged(key)
                }
            }
            // The bus is told of every account made, changed or removed, from either side.
            let accounts = Set(changed.map(\.account).compactMap { fields.uuid(of: $0) }).union(fields.touched)
            fields.touched.removeAll()
            if !accounts.isEmpty { secretObservers.notify(.items(Array(accounts))) }
        }

        mutating func takeSaves() -> [any DeferredSave] {
            guard let vault = fields.vault else { return [] }
            return vault.takePrepared().map { VaultSave(vault: vault, file: $0) }
        }

        /// A vault file that could not be written (ENOSPC): the accounts are made again from
        /// the files on disk, and every field is invalidated (rare: not worth finding which).
        mutating func savesFinished(failed: Bool) {
            guard failed, let vault = fields.vault else { return }
            vault.refreshFromFolder()
            fields.reconcileWithVault()
        }

        /// Whether the watcher has work now (a fold of the vault's own files).
        var backgroundWorkDue: Bool { fields.session.isOpen && fields.vault?.foldIsDue == true }

        mutating func takeInvalidations() -> [Invalidation] {
            settle()
            defer {
                engine.invalidations.removeAll()
                engine.entryInvalidations.removeAll()
            }
            return engine.invalidations.map(Invalidation.inode)
                + engine.entryInvalidations.map { Invalidation.entry(parent: $0.directory, name: $0.name) }
        }

        func attributes(_ local: LocalInode, _ space: InodeSpace) throws(Errno) -> Attributes {
            if let view = ViewNode(local) { return try viewAttributes(view, space) }
            if let node = ConflictNode(local) { return try conflictAttributes(node, space) }
            if let list = TrustedListNode(local) {
                guard fields.uuid(of: list.account) != nil else { throw .noSuchFileOrDirectory }
                return ownership.file(space.inode(local), mode: 0o400, size: 0)
            }
            if local.isFile {
                var attributes = try engine.attributes(of: local, as: space.inode(local), ownership: ownership, fields)
                if engine.files[local]?.key?.isTOTP == true { attributes.mode = (attributes.mode & ~0o777) | 0o400 }
                return attributes
            }
            guard local == .top || fields.owner(of: local) != nil else { throw .noSuchFileOrDirectory }
            return ownership.directory(space.inode(local), mode: 0o700)
        }

        func cache(for local: LocalInode) -> CachePolicy {
            if TrustedListNode(local) != nil || ConflictNode(local) != nil { return .none }
            if let view = ViewNode(local) { return view == .byServer || view == .byLabel ? AccountsTree.directoryCache : AccountsTree.viewCache }
            guard local.isFile else { return AccountsTree.directoryCache }
            return fields.session.isOpen ? AccountsTree.fieldCache : AccountsTree.lockedFieldCache
        }

        /// The account of a directory inode (ENOTDIR for a file, ENOENT for a removed account).
        func account(at directory: LocalInode) throws(Errno) -> AccountID {
            if directory.isFile { throw .notDirectory }
            guard let account = fields.account(at: directory) else { throw .noSuchFileOrDirectory }
            return account
        }

        /// Whether an account's `attributes/` still holds something: an attribute not being
        /// unlinked, or an editor's file (rmdir of it, and of the account, wait for them).
        func hasAttributesLeft(_ account: AccountID) -> Bool {
            engine.hasScratchFiles(in: AccountFields.attributesDirectory(of: account))
                || fields.attributes(of: account).contains { !engine.isLeaving(fields.attributeKey(account, $0)) }
        }

        /// The same for a directory whose files are keys: an account's, or its `attributes/`.
        func owner(at directory: LocalInode) throws(Errno) -> AccountID {
            if directory.isFile { throw .notDirectory }
            guard let account = fields.owner(of: directory) else { throw .noSuchFileOrDirectory }
            return account
        }

        // MARK: Names

        mutating func lookup(_ parent: LocalInode, _ name: String) throws(Errno) -> LocalInode {
            if let view = ViewNode(parent) { return try viewLookup(view, name).local }
            if let node = ConflictNode(parent) { return try conflictLookup(node, name) }
            if parent == .top, let view = ViewNode.names[name] { return view.local }
            guard parent == .top else {
                let account = try owner(at: parent)
                if fields.attributesOwner(parent) != nil { return try engine.lookup(name, in: parent, fields) }
                if name == TrustedListNode.name { return TrustedListNode(account: account).local }
                if name == ConflictNode.name {
                    guard !conflictFiles(of: account).isEmpty else { throw .noSuchFileOrDirectory }
                    return ConflictNode.directory(account).local
                }
                if name == AccountFields.attributesName, fields.account(at: parent) != nil {
                    try fields.session.requireOpen()
                    return AccountFields.attributesDirectory(of: account)
                }
                return try engine.lookup(name, in: parent, fields)
            }
            if engine.scratch(named: name, in: .top) != nil { return try engine.lookup(name, in: .top, fields) }
            guard let account = fields.account(named: name) else { throw .noSuchFileOrDirectory }
            return fields.id(of: account.uuid).directory
        }

        mutating func list(_ local: LocalInode) throws(Errno) -> [(String, LocalInode)] {
            if let view = ViewNode(local) { return try viewList(view).map { ($0.0, $0.1.local) } }
            if let node = ConflictNode(local) {
                guard case .directory(let account) = node else { throw .notDirectory }
                return conflictFiles(of: account)
            }
            var entries: [(String, LocalInode)] = []
            if local == .top {
                entries = [("by-label", ViewNode.byLabel.local), ("by-server", ViewNode.byServer.local)]
                for account in fields.vault?.accounts ?? [] {
                    entries.append((account.name, fields.id(of: account.uuid).directory))
                }
            } else if let account = fields.attributesOwner(local) {
                for attribute in fields.attributes(of: account) {
                    guard let name = AttributeFileName.fileName(of: attribute) else { continue }
                    let key = fields.attributeKey(account, attribute)
                    guard !engine.isHidden(key), engine.scratch(named: name, in: local) == nil else { continue }
                    entries.append((name, engine.file(for: key, fields)))
                }
            } else {
                let account = try account(at: local)
                for (index, name) in AccountFields.names.enumerated() {
                    if index == AccountFields.totpIndex && !fields.hasOTP(account) { continue }
                    let key = FieldKey(account: account, index: index)
                    guard !engine.isHidden(key), engine.scratch(named: name, in: local) == nil else { continue }
                    entries.append((name, engine.file(for: key, fields)))
                }
                // Listed while guarding is on (it means nothing otherwise; by name it always opens).
                if (try? fields.vault?.isGuarded()) == true {
                    entries.append((TrustedListNode.name, TrustedListNode(account: account).local))
                }
                if !conflictFiles(of: account).isEmpty { entries.append((ConflictNode.name, ConflictNode.directory(account).local)) }
                if fields.session.isOpen { entries.append((AccountFields.attributesName, AccountFields.attributesDirectory(of: account))) }
            }
            entries += engine.scratchFiles(in: local).map { ($0.name, $0.inode) }
            return entries
        }

        mutating func makeAccount(_ name: String, trusting creator: TrustedProgram?) throws(Errno) -> LocalInode {
            if ViewNode.names[name] != nil { throw .fileExists }
            try fields.session.requireOpen()
            // (The nil UUID is the vault's own: its guarding flag lives there, docs/vault-format-3.md.)
            guard let uuid = AccountName.uuidBytes(name), uuid.contains(where: { $0 != 0 }) else { throw .invalidArgument }
            guard let vault = fields.vault else { throw .ioError }
            if vault.hasAccount(uuid: uuid) || engine.scratch(named: name, in: .top) != nil { throw .fileExists }
            do {
                let guarded = (try? vault.isGuarded()) == true
                try vault.addAccount(uuid: uuid, name: name, trusting: guarded ? creator.map { [$0] } ?? [] : [])
            } catch {
                throw error.errno
            }
            Log.debug("vault saved: account \(name) added (\(vault.accountCount) accounts)")
            fields.touched.insert(uuid)
            return fields.id(of: uuid).directory
        }

        mutating func removeAccount(_ name: String) throws(Errno) {
            if ViewNode.names[name] != nil { throw .permissionDenied }
            try fields.session.requireOpen()
            guard let account = fields.account(named: name), let vault = fields.vault else {
                if engine.scratch(named: name, in: .top) != nil { throw .notDirectory }
                throw .noSuchFileOrDirectory
            }
            let id = fields.id(of: account.uuid)
            if engine.hasScratchFiles(in: id.directory) { throw .directoryNotEmpty }
            // Fields always exist: an account with any value is not empty (`rm -r` unlinks
            // each field first — they wait to leave — then removes the directory).
            for (index, field) in AccountField.allCases.enumerated() {
                let key = FieldKey(account: id, index: index)
                if engine.isLeaving(key) { continue }
                let value: SecureBytes
                do { value = try vault.field(field, of: account.uuid) } catch { throw error.errno }
                if value.count > 0 { throw .directoryNotEmpty }
            }
            if hasAttributesLeft(id) { throw .directoryNotEmpty }
            do {
                try vault.removeAccount(uuid: account.uuid)
            } catch {
                throw error.errno
            }
            Log.debug("vault saved: account \(name) removed (\(vault.accountCount) accounts)")
            for index in AccountFields.names.indices + fields.attributeNames.indices {
                engine.keyGone(FieldKey(account: id, index: index), fields)
            }
            fields.forgetAccount(id)
            fields.touched.insert(account.uuid)
        }

        mutating func create(_ parent: LocalInode, _ name: String, mode: mode_t, flags: Int32,
                             handle: FileHandle, requester: pid_t) throws(Errno) -> LocalInode {
            if ViewNode(parent) != nil { throw .permissionDenied }
            if parent == .top && ViewNode.names[name] != nil { throw .fileExists }
            try fields.session.requireOpen()
            guard parent != .top else { throw .permissionDenied }
            _ = try owner(at: parent)
            guard name.utf8.count <= 255 else { throw .nameTooLong }
            return try engine.create(name, in: parent, mode: mode, exclusive: flags & O_EXCL != 0,
                                     truncate: flags & O_TRUNC != 0, handle: handle, requester: requester, fields)
        }

        mutating func makeSymbolicLink(_ target: String, in parent: LocalInode, _ name: String,
                                       requester: pid_t) throws(Errno) -> LocalInode {
            if ViewNode(parent) != nil { throw .permissionDenied }
            if parent == .top && ViewNode.names[name] != nil { throw .fileExists }
            if parent == .top {
                if fields.account(named: name) != nil { throw .fileExists }
            } else {
                try fields.session.requireOpen()
                _ = try owner(at: parent)
            }
            if parent != .top && !EditorNames.isEditorFile(name) { throw .notPermitted }  // a field is no link
            return try engine.makeSymbolicLink(target, named: name, in: parent, requester: requester, fields)
        }

        mutating func unlink(_ parent: LocalInode, _ name: String) throws(Errno) {
            if ViewNode(parent) != nil { throw .permissionDenied }
            if parent == .top && ViewNode.names[name] != nil { throw .isDirectory }
            if parent == .top {
                if engine.scratch(named: name, in: .top) != nil { return try engine.unlink(name, in: .top, &fields) }
                if fields.account(named: name) != nil { throw .isDirectory }
                throw .noSuchFileOrDirectory
            }
            try fields.session.requireOpen()
            _ = try owner(at: parent)
            if name == AccountFields.attributesName && fields.account(at: parent) != nil { throw .isDirectory }
            try engine.unlink(name, in: parent, &fields)
        }

        mutating func rename(_ from: LocalInode, _ name: String, _ to: LocalInode, _ newName: String,
                             flags: RenameFlags, requester: pid_t) throws(Errno) {
            if ViewNode(from) != nil || ViewNode(to) != nil { throw .permissionDenied }
            if (from == .top && ViewNode.names[name] != nil) || (to == .top && ViewNode.names[newName] != nil) {
                throw .permissionDenied
            }
            try fields.session.requireOpen()
            guard from != .top, to != .top else { throw .notPermitted }
            guard try owner(at: from) == owner(at: to) else { throw .crossDevice }
            // A field and an attribute are not one another's (the engine's keys of two
            // directories: a move between them is refused by the store).
            for (directory, fileName) in [(from, name), (to, newName)]
            where fileName == AccountFields.attributesName && fields.account(at: directory) != nil {
                throw .permissionDenied
            }
            try engine.rename(name, in: from, to: newName, in: to, flags: flags, requester: requester, &fields)
        }
    }
}

/// A vault change file prepared under the tree's lock, written and synced after it.
final class VaultSave: DeferredSave, @unchecked Sendable {
    let vault: Vault
    let file: VaultFolder.PreparedFile

    init(vault: Vault, file: VaultFolder.PreparedFile) { (self.vault, self.file) = (vault, file) }

    func write() { file.write() }
    var failure: Errno? { file.error?.errno }
    func finish() { vault.finishPrepared(file) }
}
