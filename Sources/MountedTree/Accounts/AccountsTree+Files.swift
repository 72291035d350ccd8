#if canImport(Glibc)
import Glibc
#endif
import CredentialVault
import SecureMemory
import FuseLowLevel
import Posix

/// The opens of `accounts/` that are more than a field's: guarded opens (decided by the
/// service's access policy, postponed for a prompt), and the files made of text at their
/// open — `trusted` and `conflicts/`.
extension AccountsTree {
    /// Views are never cached by the kernel: every change of a field moves a name at once,
    /// and a lock empties them, with nothing to invalidate but the names already handed out.
    static let viewCache = CachePolicy.none

    // MARK: Opening

    /// An open: one visit under the service's lock when guarding does not cover it; else
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
                service.noteReplacedProgram(requester, account: access.account, trusted: trusted)
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
        service.ask(requester, access, waiter: PromptWaiter(
            isInterrupted: { pending.isInterrupted },
            onInterrupt: { pending.onInterrupt($0) },
            allowed: { [weak self] in
                guard let self else { return pending.fail(.ioError) }
                self.answer(pending, inode: inode, flags: flags)
            },
            refused: { pending.fail($0) }))
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

    // MARK: The trusted list file

    func openTrustedList(_ node: TrustedListNode, flags: Int32) throws(Errno) -> OpenedFile {
        guard flags & O_ACCMODE == O_RDONLY else { throw .permissionDenied }
        let (handle, text) = try locked { (s) throws(Errno) -> (FileHandle, [UInt8]) in
            try s.fields.session.requireOpen()
            guard let uuid = s.fields.uuid(of: node.account) else { throw .noSuchFileOrDirectory }
            let list = try s.trustedPrograms(uuid)
            return (s.fields.session.newHandle(), Array(list.map { "\($0.hexDigest) \($0.path)\n" }.joined().utf8))
        }
        service.handleTexts.withLock { $0.attach(.plain(text), to: handle) }
        return OpenedFile(handle: handle.raw, directIO: true, noFlush: true)
    }

    func readTrustedList(handle: UInt64, offset: UInt64, size: Int, reply: (UnsafeRawBufferPointer) -> Void) throws(Errno) {
        try state.withLock { (s) throws(Errno) in
            // Opened before a lock: refused, as a field's descriptor is.
            guard s.fields.session.isCurrent(FileHandle(raw: handle)), s.fields.session.isOpen else { throw .permissionDenied }
        }
        // (Program paths and hashes, not secrets: an ordinary copy, replied after the lock.)
        let piece = try service.handleTexts.withLock { (texts) throws(Errno) -> ArraySlice<UInt8> in
            guard case .plain(let text) = texts[FileHandle(raw: handle)] else { throw .badFileDescriptor }
            guard offset < UInt64(text.count) else { return [] }
            let start = Int(offset)
            return text[start..<min(text.count, start + size)]
        }
        piece.withUnsafeBytes { reply($0) }
    }

    /// An open of a conflicts file: its text made now (into secure memory), served by
    /// direct I/O from the handle; password's only for a trusted program when guarded.
    func openConflicts(_ node: ConflictNode, flags: Int32, context: RequestContext) throws(Errno) -> OpenedFile {
        guard case .file(let account, let index) = node else { throw .isDirectory }
        guard flags & O_ACCMODE == O_RDONLY else { throw .permissionDenied }
        let field: AccountField? = index == ConflictNode.removedIndex ? nil : AccountField.allCases[index]
        let secret = field == .password || field == .otp
        let requester = secret ? service.requester(context) : nil
        let (handle, text) = try locked { (s) throws(Errno) -> (FileHandle, SecureBytes) in
            try s.fields.session.requireOpen()
            guard let conflicts = s.conflicts(of: account), let uuid = s.fields.uuid(of: account) else { throw .noSuchFileOrDirectory }
            let others = field.map { conflicts.fields[$0] ?? [] } ?? conflicts.removals
            guard !others.isEmpty else { throw .noSuchFileOrDirectory }
            if secret, let vault = s.fields.vault, (try? vault.isGuarded()) == true {
                let who = requester ?? self.access.inspector.inspect(thread: context.pid)
                let access = s.accessDescription(uuid, what: "conflicts/\(field?.rawValue ?? "")", writing: false)
                // (Under the service's lock: the text is made with the list decided against.)
                let decision = self.access.decide(who, access, trusted: try s.trustedPrograms(uuid), trustVersion: vault.trustChanges,
                                                  asking: .nobody("not trusted (conflicts do not ask: open the password first)"))
                self.access.record(decision)
                guard decision.isAllowed else { throw .permissionDenied }
            }
            s.fields.session.touched()
            let handle = s.fields.session.newHandle()
            s.fields.session.opened(handle, of: node.local)
            return (handle, try ConflictNode.text(others, values: field != nil))
        }
        service.handleTexts.withLock { $0.attach(.secret(text), to: handle) }
        return OpenedFile(handle: handle.raw, directIO: true, noFlush: true)
    }

    func readConflicts(handle: UInt64, offset: UInt64, size: Int, reply: (UnsafeRawBufferPointer) -> Void) throws(Errno) {
        try state.withLock { (s) throws(Errno) in
            guard s.fields.session.isCurrent(FileHandle(raw: handle)), s.fields.session.isOpen else { throw .permissionDenied }
        }
        let piece = try service.handleTexts.withLock { (texts) throws(Errno) -> SecureBytes? in
            guard case .secret(let text) = texts[FileHandle(raw: handle)] else { throw .badFileDescriptor }
            guard offset < UInt64(text.count) else { return nil }
            return try text.withUnsafeBytes { (all) throws(Errno) in
                let start = Int(offset)
                return try SecureBytes.allocate(copying: UnsafeRawBufferPointer(rebasing: all[start..<min(all.count, start + size)]), in: replies)
            }
        }
        defer { piece?.wipe() }
        guard let piece else { return reply(UnsafeRawBufferPointer(start: nil, count: 0)) }
        piece.withUnsafeBytes { reply($0) }
    }

    func releaseConflicts(_ node: ConflictNode, handle: UInt64) {
        service.handleTexts.withLock { $0.release(FileHandle(raw: handle)) }?.wipe()
        state.withLock { $0.fields.session.released(FileHandle(raw: handle), of: node.local) }
    }
}

