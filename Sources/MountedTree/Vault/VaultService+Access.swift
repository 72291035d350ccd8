#if canImport(Glibc)
import Glibc
#endif
import CredentialVault
import SecureMemory
import FuseLowLevel
import Posix

/// Guarding (SPEC §3a): with it on, opening an account's `password`, writing any of its
/// fields or files, and removing it need the requesting program to be trusted with the
/// account — or allowed by a person at a prompt, which an OPEN waits for (postponed: the
/// worker thread serves other requests meanwhile).
extension VaultService {
    /// Who asks, when the vault is guarded (nil: not guarded, nothing to look up).
    /// Read before the service's lock is taken: /proc and a program's hash take time. A
    /// request that finds the vault guarded only once it holds the lock (an unlock or
    /// `guard on` meanwhile) is looked at then (`requireTrust`).
    func requester(_ context: RequestContext) -> Requester? {
        guarded.load(ordering: .acquiring) ? access.inspector.inspect(thread: context.pid) : nil
    }

    /// Keeps `guarded` equal to the vault's flag (after an unlock, a lock, a change).
    func noteGuarding(_ s: VaultState) {
        let on = s.fields.session.isUnlocked && ((try? s.fields.vault?.isGuarded()) ?? false) == true
        guarded.store(on, ordering: .releasing)
        if s.fields.session.isUnlocked { lastKnownGuarding.store(on ? .on : .off, ordering: .relaxed) }
    }

    /// The one prompt broker (`AccessGuard.ask`), with this tree keeping the trusted lists.
    func ask(_ requester: Requester, _ access: AccessGuard.Access, waiter: PromptWaiter) {
        self.access.ask(requester, access, waiter: waiter, keeper: self)
    }

    /// The trusted list of an account, read under the lock (for the prompt broker).
    func trustedPrograms(of account: [UInt8]) -> [TrustedProgram] {
        (try? locked { (s) throws(Errno) in try s.trustedPrograms(account) }) ?? []
    }

    /// Adds a program to an account's trusted list ("Always allow").
    func trust(_ program: TrustedProgram, account uuid: [UInt8]) throws(Errno) {
        try locked { (s) throws(Errno) in
            try s.fields.session.requireOpen()
            guard let vault = s.fields.vault else { throw .ioError }
            do throws(VaultError) {
                var list = try vault.trustedPrograms(of: uuid)
                list.removeAll { $0.sha256 == program.sha256 }
                list.append(program)
                try vault.setTrustedPrograms(list, of: uuid)
            } catch {
                throw error.errno
            }
        }
    }

    // MARK: Other requests

    /// For a request that changes an account (a write, an editor's file, a rename, an
    /// unlink, a truncation, a removal) without a prompt: trusted, or allowed once for this
    /// run, or EACCES.
    func requireTrust(_ s: inout VaultState, directory: LocalInode, _ looked: Requester?, context: RequestContext,
                      what: String) throws(Errno) {
        guard s.fields.session.isOpen, let vault = s.fields.vault,
              (try? vault.isGuarded()) == true, let id = s.fields.owner(of: directory),
              let uuid = s.fields.uuid(of: id) else { return }
        // Guarded only since the request was looked at (an unlock, `guard on`): looked at now.
        let requester = looked ?? access.inspector.inspect(thread: context.pid)
        let access = s.accessDescription(uuid, what: what, writing: true)
        let trusted = (try? vault.trustedPrograms(of: uuid)) ?? []
        // (Under the service's lock: the list read is the one the change is made with.)
        let decision = self.access.decide(requester, access, trusted: trusted, trustVersion: vault.trustChanges,
                                          asking: .nobody("not trusted (only an open asks: open the password or a field for writing first)"))
        self.access.record(decision)
        guard decision.isAllowed else { throw .permissionDenied }
    }

    /// `.mtmfs/access`: the latest decisions of guarding, newest last.
    public func recentDecisions() -> String { access.recentDecisions() }

    // MARK: Commands (.mtmfs/guard, .mtmfs/trust)

    /// Turns guarding on or off; needs the passphrase (checked outside the service's lock:
    /// a key derivation takes a second). Locked: EACCES (unlock first).
    public func setGuarding(_ on: Bool, passphrase: SecureBytes) throws(Errno) {
        try checkPassphrase(passphrase)
        let files = try locked { (s) throws(Errno) -> [LocalInode] in
            try s.fields.session.requireOpen()
            guard let vault = s.fields.vault else { throw .ioError }
            do throws(VaultError) { try vault.setGuarded(on) } catch { throw error.errno }
            noteGuarding(s)
            // Descriptors opened before were never decided: they end here (EACCES).
            if on { s.fields.session.retireHandles() }
            guardingTurnedOff.store(!on, ordering: .relaxed)
            Log.info("guarding turned \(on ? "on" : "off")")
            return Array(s.engine.files.keys)
        }
        // Pages a reader kept of a password from before go; the handles open then stay
        // revoked (`retireHandles`), and their files uncached until they are closed.
        pageCache.changed()
        for local in files { notifier.invalidateInode(space.inode(local)) }
    }

    /// Adds (`trust`) or removes programs of an account's trusted list; needs the
    /// passphrase. `programs` are paths the daemon reads and hashes itself; removing
    /// matches a path or a hash (a program replaced since is still found by its path).
    public func changeTrust(adding: Bool, accountName: String, programs: [String], passphrase: SecureBytes) throws(Errno) {
        var found: [TrustedProgram] = []
        for path in programs {
            guard path.hasPrefix("/") else { throw .invalidArgument }
            let fd: Int32
            do {
                fd = try Syscall.open(path, O_RDONLY)
            } catch {
                // A program gone is still taken off by its path.
                guard !adding else { throw error }
                found.append(TrustedProgram(sha256: [], path: path))
                continue
            }
            defer { Syscall.close(fd) }
            var st = stat()
            guard fstat(fd, &st) == 0, st.st_mode & S_IFMT == S_IFREG else { throw .invalidArgument }
            found.append(TrustedProgram(sha256: try ProgramDigest.sha256(of: fd), path: path))
        }
        try checkPassphrase(passphrase)
        let narrowed = try locked { (s) throws(Errno) -> [LocalInode] in
            try s.fields.session.requireOpen()
            guard let vault = s.fields.vault, let account = vault.account(named: accountName) else { throw .noSuchFileOrDirectory }
            do throws(VaultError) {
                var list = try vault.trustedPrograms(of: account.uuid)
                for program in found {
                    if adding {
                        list.removeAll { $0.sha256 == program.sha256 }
                        list.append(program)
                    } else {
                        list.removeAll { $0.sha256 == program.sha256 || $0.path == program.path }
                    }
                }
                try vault.setTrustedPrograms(list, of: account.uuid)
            } catch {
                throw error.errno
            }
            Log.info("trusted programs of account \(accountName): \(found.count) \(adding ? "added" : "removed") (passphrase given)")
            // Fewer programs may read it: what was open on its secrets reads nothing more.
            guard !adding, let id = s.fields.existingID(of: account.uuid) else { return [] }
            return narrow(&s, account: id)
        }
        dropPages(narrowed)
    }

    /// The login password changed (the PAM module, `mtmfs passwd --login-changed`): the
    /// login slot that `old` opens is rewritten for `new`, locked or not. Wrong `old`, or no
    /// login slot: EACCES. Both key derivations run outside the service's lock; only the
    /// slot's write is under it.
    public func loginPasswordChanged(old: SecureBytes, new: SecureBytes) throws(Errno) {
        defer { SecureBytes.burnStack() }
        guard let vault = state.withLock({ $0.fields.vault }), vault.isFolder else { throw .notSupported }
        let prepared: (key: SecureBytes, slot: VaultFolder.PreparedSlot)
        do throws(VaultError) { prepared = try vault.prepareLoginChange(old: old, new: new) } catch {
            Log.warning(error == .wrongPassphrase ? "login slot not changed: the old login password does not open it" : error.description)
            throw error.errno
        }
        defer {
            prepared.key.wipe()
            prepared.slot.kek.wipe()
        }
        try state.withLock { (s) throws(Errno) in
            guard s.fields.vault === vault else { throw .tryAgain }
            do throws(VaultError) { try vault.addSlot(prepared.slot, key: prepared.key) } catch { throw error.errno }
        }
        Log.info("the login slot follows the new login password")
    }

    /// EACCES unless `passphrase` is the vault's (the derivation runs outside the lock).
    public func checkPassphrase(_ passphrase: SecureBytes) throws(Errno) {
        defer { SecureBytes.burnStack() }
        let vault = try locked { (s) throws(Errno) -> Vault in
            try s.fields.session.requireOpen()
            guard let vault = s.fields.vault else { throw .ioError }
            return vault
        }
        let kek: SecureBytes
        do { kek = try vault.passphraseKey(passphrase) } catch { throw error.errno }
        try locked { (s) throws(Errno) in
            guard s.fields.vault === vault else {
                kek.wipe()
                throw .tryAgain
            }
            do throws(VaultError) { try vault.checkPassphraseKey(kek) } catch {
                Log.warning("a guarding or trust change refused: wrong passphrase")
                throw error.errno
            }
        }
    }

    /// A narrowing of who may read `account`'s secrets (SPEC §3a: `untrust`, a trusted
    /// program replaced by another version): under the service's lock, the handles open on them
    /// (and on their conflicts) are revoked. Returns the files whose pages go (`dropPages`,
    /// after the lock).
    func narrow(_ s: inout VaultState, account: AccountID) -> [LocalInode] {
        let conflicts = [AccountField.password, .otp].compactMap { field in
            AccountField.allCases.firstIndex(of: field).map { ConflictNode.file(account, index: $0).local }
        }
        let secrets = Set(s.engine.files.keys.filter { s.isSecret($0, of: account) } + conflicts)
        s.fields.session.revokeHandles { secrets.contains($0) }
        return Array(secrets)
    }

    /// The kernel drops the pages of `files`, sent by the notifier's thread (no request waits
    /// for it); the next open that may cache them drops them again first (`PageCacheGate`).
    func dropPages(_ files: [LocalInode]) {
        for local in files {
            let inode = space.inode(local)
            pageCache.forget(inode)
            notifier.invalidateInode(inode)
        }
    }

    /// A requester whose program is at a trusted program's path but is another version:
    /// the trusted one was replaced, which narrows who may read the account.
    func noteReplacedProgram(_ requester: Requester, account uuid: [UInt8], trusted: [TrustedProgram]) {
        guard let program = requester.program,
              trusted.contains(where: { $0.path == program.path && $0.sha256 != program.sha256 }) else { return }
        let files = state.withLock { s -> [LocalInode] in
            guard let id = s.fields.existingID(of: uuid) else { return [] }
            return narrow(&s, account: id)
        }
        dropPages(files)
    }
}

extension VaultService: TrustKeeper {}

