#if canImport(Glibc)
import Glibc
#endif
import CredentialVault
import SecureMemory
import FuseLowLevel
import Posix
import SecretService

/// Everything `accounts/` holds, behind the vault service's one lock: the vault, its session
/// and fields (`fields`), the files open on them (`engine`: a field being edited is vault
/// state every door must see alike), the names the views handed out, and the index a lock
/// keeps for the bus. Its reading as a tree of nodes is the FUSE door's (`AccountNodes.swift`).
///
/// Thread-safety: a value behind `VaultService.state`.
struct VaultState: EditingTreeState, @unchecked Sendable {
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
    /// With it, the items as the lock found them (label, attributes, times: no secret),
    /// which the bus shows while locked, as gnome-keyring does. Gone at unlock.
    var lockedItems: [[UInt8]: SecretItem] = [:]

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

    /// Whether guarding covers an open (`guardedAccess`).
    enum Coverage {
        case uncovered
        case covered(AccessGuard.Access, [TrustedProgram])
        case refused
    }

    /// Whether the file `local` holds a secret of `account` that guarding keeps: its
    /// password or otp (and the code made of it), an older text of them still open, or an
    /// editor's file in its directory.
    func isSecret(_ local: LocalInode, of account: AccountID) -> Bool {
        guard let file = engine.files[local] else { return false }
        if case .scratch(let directory, _) = file.role { return directory == account.directory }
        guard let key = file.key ?? file.detachedFrom ?? file.intendedKey, key.account == account else { return false }
        return key.isTOTP || key.field == .password || key.field == .otp
    }

    /// What opening `local` would touch, when guarding covers it: the password (read or
    /// written), any field written, any editor's file of an account. Uncovered: guarding
    /// off, another field read, not an account's file. Refused: a file of accounts/ that
    /// belongs to no account any more (the old text of a field replaced while open, which
    /// another program could reopen through /proc/PID/fd).
    func guardedAccess(_ local: LocalInode, writing: Bool) -> Coverage {
        guard let vault = fields.vault, (try? vault.isGuarded()) == true, local.isFile, let file = engine.files[local] else {
            return .uncovered
        }
        let what: String
        let directory: LocalInode?
        if let key = file.key {
            guard writing || key.field == .password || key.field == .otp || key.isTOTP else { return .uncovered }
            what = key.isAttribute ? "attribute " + fields.name(of: key) : AccountFields.names[key.index]
            directory = key.account.directory
        } else {
            // An editor's file: a backup may hold an old password, a swap file a new one.
            what = "files"
            if case .scratch(let parent, _) = file.role {
                directory = parent
            } else {
                directory = (file.intendedKey ?? file.detachedFrom)?.account.directory
            }
        }
        guard let directory, let id = fields.owner(of: directory), let uuid = fields.uuid(of: id),
              let trusted = try? trustedPrograms(uuid) else { return .refused }
        return .covered(accessDescription(uuid, what: what, writing: writing), trusted)
    }

    func accessDescription(_ uuid: [UInt8], what: String, writing: Bool) -> AccessGuard.Access {
        let name = fields.vault?.name(of: uuid) ?? "?"
        var label = ""
        if let value = try? fields.vault?.storedField(.label, of: uuid) {
            label = value.withUnsafeBytes { String(decoding: $0, as: UTF8.self) }
        }
        return AccessGuard.Access(account: uuid, accountName: name, what: what, writing: writing, label: label)
    }

    func trustedPrograms(_ uuid: [UInt8]) throws(Errno) -> [TrustedProgram] {
        guard let vault = fields.vault else { throw .ioError }
        do { return try vault.trustedPrograms(of: uuid) } catch { throw error.errno }
    }
}

/// A vault change file prepared under the service's lock, written and synced after it.
final class VaultSave: DeferredSave, @unchecked Sendable {
    let vault: Vault
    let file: VaultFolder.PreparedFile

    init(vault: Vault, file: VaultFolder.PreparedFile) { (self.vault, self.file) = (vault, file) }

    func write() { file.write() }
    var failure: Errno? { file.error?.errno }
    func finish() { vault.finishPrepared(file) }
}
