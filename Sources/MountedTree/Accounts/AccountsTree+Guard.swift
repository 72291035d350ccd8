#if canImport(Glibc)
import Glibc
#endif
import CredentialVault
import SecureMemory
import FuseLowLevel
import Posix

/// `accounts/<UUID>/trusted`: the account's trusted programs, one a line ("SHA256 PATH"),
/// read-only. Local inodes 2^47 + 2^46 + account serial (layout in `Identities.swift`).
///
/// Thread-safety: a value.
extension AccountsTree {
    /// Whether guarding covers an open (`State.guardedAccess`).
    enum Coverage {
        case uncovered
        case covered(AccessGuard.Access, [TrustedProgram])
        case refused
    }
}

struct TrustedListNode: Hashable {
    let account: AccountID

    static let name = "trusted"
    private static let bit: UInt64 = LocalInode.viewBit + (1 << 46)

    init(account: AccountID) { self.account = account }

    init?(_ local: LocalInode) {
        guard local.raw >= Self.bit, local.raw < Self.bit + (1 << 44) else { return nil }  // (then `ConflictNode`)
        account = AccountID(serial: local.raw - Self.bit)
    }

    var local: LocalInode { LocalInode(Self.bit + account.serial) }
}

/// Guarding (SPEC §3a): with it on, opening an account's `password`, writing any of its
/// fields or files, and removing it need the requesting program to be trusted with the
/// account — or allowed by a person at a prompt, which an OPEN waits for (postponed: the
/// worker thread serves other requests meanwhile).
extension AccountsTree {
    /// Who asks, when the vault is guarded (nil: not guarded, nothing to look up).
    /// Read before the tree's lock is taken: /proc and a program's hash take time. A
    /// request that finds the vault guarded only once it holds the lock (an unlock or
    /// `guard on` meanwhile) is looked at then (`requireTrust`).
    func requester(_ context: RequestContext) -> Requester? {
        guarded.load(ordering: .acquiring) ? access.inspector.inspect(thread: context.pid) : nil
    }

    /// Keeps `guarded` equal to the vault's flag (after an unlock, a lock, a change).
    func noteGuarding(_ s: State) {
        let on = s.fields.session.isUnlocked && ((try? s.fields.vault?.isGuarded()) ?? false) == true
        guarded.store(on, ordering: .releasing)
        if s.fields.session.isUnlocked { lastKnownGuarding.store(on ? .on : .off, ordering: .relaxed) }
    }

    // MARK: Opening

    /// An open: one visit under the tree's lock when guarding does not cover it; else
    /// decided now (trusted, allowed once for this run, refused outright) or by a person
    /// (postponed until the prompt's answer), and opened then. A decision is bound to the
    /// version of the trusted lists it read: if one changed before the open (an `untrust`),
    /// the open is decided again with the new list.
    func guardedOpen(_ inode: InodeNumber, flags: Int32, context: RequestContext, request: OpenRequest) throws(Errno) -> OpenedFile? {
        var attempt = try open(inode, flags: flags, decided: nil)
        for _ in 0..<4 {
            guard case .covered(let access, let trusted, let version) = attempt else { break }
            // Who asks is read outside the lock (/proc, and a program's hash the first time).
            let requester = self.access.inspector.inspect(thread: context.pid)
            let decision = self.access.decide(requester, access, trusted: trusted, trustVersion: version,
                                              asking: request.canPostpone ? .person : .nobody("not trusted"))
            if decision.undecided {
                noteReplacedProgram(requester, account: access.account, trusted: trusted)
                if let why = self.access.cannotAsk(requester) {
                    self.access.record(allowed: false, why, requester, access)
                    throw .permissionDenied
                }
            }
            switch decision.verdict {
            case .allowed:
                afterOpenDecision.withLock { $0 }?()
                let next = try open(inode, flags: flags, decided: .against(version))
                guard case .opened(let opened) = next else {
                    attempt = next  // a trusted list changed meanwhile: decided again
                    continue
                }
                guard request.canPostpone else {
                    self.access.record(decision)
                    return opened
                }
                // Answered first: the record (which walks the requester's parents) is not
                // something a trusted program should wait for.
                let pending = request.postpone()
                if !pending.reply(opened) { release(inode, handle: opened.handle, flags: flags) }
                self.access.record(decision)
                return nil
            case .denied:
                self.access.record(decision)
                throw .permissionDenied
            case .ask:
                let pending = request.postpone()
                ask(requester, access, pending: pending, inode: inode, flags: flags)
                return nil
            }
        }
        if case .opened(let opened) = attempt { return opened }
        throw .permissionDenied  // the lists kept changing under it
    }

    /// An OPEN postponed for a person's answer: opened and answered once allowed.
    func ask(_ requester: Requester, _ access: AccessGuard.Access, pending: PendingOpen,
             inode: InodeNumber, flags: Int32) {
        ask(requester, access, waiter: PromptWaiter(
            isInterrupted: { pending.isInterrupted },
            onInterrupt: { pending.onInterrupt($0) },
            allowed: { [weak self] in
                guard let self else { return pending.fail(.ioError) }
                self.answer(pending, inode: inode, flags: flags)
            },
            refused: { pending.fail($0) }))
    }

    /// The one prompt broker (`AccessGuard.ask`), with this tree keeping the trusted lists.
    func ask(_ requester: Requester, _ access: AccessGuard.Access, waiter: PromptWaiter) {
        self.access.ask(requester, access, waiter: waiter, keeper: self)
    }

    /// Opens for a postponed request that was allowed, and replies; an open whose
    /// requester was interrupted meanwhile (or whose reply the kernel no longer takes) is
    /// not left behind.
    private func answer(_ pending: PendingOpen, inode: InodeNumber, flags: Int32) {
        guard !pending.isInterrupted else { return pending.fail(.interrupted) }
        do {
            let opened = try openDecided(inode, flags: flags)
            if !pending.reply(opened) { release(inode, handle: opened.handle, flags: flags) }
        } catch {
            pending.fail(error)
        }
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
    func requireTrust(_ s: inout State, directory: LocalInode, _ looked: Requester?, context: RequestContext,
                      what: String) throws(Errno) {
        guard s.fields.session.isOpen, let vault = s.fields.vault,
              (try? vault.isGuarded()) == true, let id = s.fields.owner(of: directory),
              let uuid = s.fields.uuid(of: id) else { return }
        // Guarded only since the request was looked at (an unlock, `guard on`): looked at now.
        let requester = looked ?? access.inspector.inspect(thread: context.pid)
        let access = s.accessDescription(uuid, what: what, writing: true)
        let trusted = (try? vault.trustedPrograms(of: uuid)) ?? []
        // (Under the tree's lock: the list read is the one the change is made with.)
        let decision = self.access.decide(requester, access, trusted: trusted, trustVersion: vault.trustChanges,
                                          asking: .nobody("not trusted (only an open asks: open the password or a field for writing first)"))
        self.access.record(decision)
        guard decision.isAllowed else { throw .permissionDenied }
    }

    // MARK: The trusted list file

    func openTrustedList(_ node: TrustedListNode, flags: Int32) throws(Errno) -> OpenedFile {
        guard flags & O_ACCMODE == O_RDONLY else { throw .permissionDenied }
        let (handle, text) = try locked { (s) throws(Errno) -> (FileHandle, [UInt8]) in
            try s.fields.session.requireOpen()
            guard let uuid = s.fields.uuid(of: node.account) else { throw .noSuchFileOrDirectory }
            let list = try s.trustedPrograms(uuid)
            return (s.fields.session.newHandle(), Array(list.map { "\($0.hexDigest) \($0.path)\n" }.joined().utf8))
        }
        handleTexts.withLock { $0.attach(.plain(text), to: handle) }
        return OpenedFile(handle: handle.raw, directIO: true, noFlush: true)
    }

    func readTrustedList(handle: UInt64, offset: UInt64, size: Int, reply: (UnsafeRawBufferPointer) -> Void) throws(Errno) {
        try state.withLock { (s) throws(Errno) in
            // Opened before a lock: refused, as a field's descriptor is.
            guard s.fields.session.isCurrent(FileHandle(raw: handle)), s.fields.session.isOpen else { throw .permissionDenied }
        }
        // (Program paths and hashes, not secrets: an ordinary copy, replied after the lock.)
        let piece = try handleTexts.withLock { (texts) throws(Errno) -> ArraySlice<UInt8> in
            guard case .plain(let text) = texts[FileHandle(raw: handle)] else { throw .badFileDescriptor }
            guard offset < UInt64(text.count) else { return [] }
            let start = Int(offset)
            return text[start..<min(text.count, start + size)]
        }
        piece.withUnsafeBytes { reply($0) }
    }

    /// `.mtmfs/access`: the latest decisions of guarding, newest last.
    public func recentDecisions() -> String { access.recentDecisions() }

    // MARK: Commands (.mtmfs/guard, .mtmfs/trust)

    /// Turns guarding on or off; needs the passphrase (checked outside the tree's lock:
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

    /// EACCES unless `passphrase` is the vault's (the derivation runs outside the lock).
    func checkPassphrase(_ passphrase: SecureBytes) throws(Errno) {
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
}

extension AccountsTree {
    /// A narrowing of who may read `account`'s secrets (SPEC §3a: `untrust`, a trusted
    /// program replaced by another version): under the tree's lock, the handles open on them
    /// (and on their conflicts) are revoked. Returns the files whose pages go (`dropPages`,
    /// after the lock).
    func narrow(_ s: inout State, account: AccountID) -> [LocalInode] {
        let conflicts = [AccountField.password, .otp].map {
            ConflictNode.file(account, index: AccountField.allCases.firstIndex(of: $0)!).local
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

extension AccountsTree.State {
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
    func guardedAccess(_ local: LocalInode, writing: Bool) -> AccountsTree.Coverage {
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

extension AccountsTree: TrustKeeper {}
