#if canImport(Glibc)
import Glibc
#endif
import CredentialVault
import SecureMemory
import FuseLowLevel
import Posix
import Synchronization

/// The vault service: the one owner of `accounts/`' vault — its session (locked, unlocking,
/// unlocked: `VaultSession.Phase`), the folder and the other machines' files arriving in it,
/// the index, guarding's trusted lists and decisions (`VaultService+Access.swift`), and who
/// is told what changed. Its doors translate requests and own nothing of the vault: the FUSE
/// tree (`AccountsTree`), the Secret Service's objects (`VaultSecretStore`) and the control
/// files (`.mtmfs/lock`, `unlock`, `guard`, `trust`, `find`, `access`, `status`).
///
/// One lock (`state`), under which nothing slow happens: a key derivation, the decryption
/// and merge of arriving files' parsing, a fold's and a save's writes and fsyncs, `/proc`
/// reads and prompts all run with it let go, and come back to it with what they read
/// checked against what moved meanwhile (the vault object, the folder's scan generation,
/// the trusted lists' version). Kernel notifications are sent after it is released. What
/// changed goes out as it happens: the kernel's copies of the fields and names it touched
/// (`notifier`), and the accounts it touched to the bus (`secretObservers`).
public final class VaultService: EditingLock, @unchecked Sendable {
    let space = InodeSpace.accounts
    let notifier: KernelCacheNotifier
    /// Readers keep the kernel's pages of a field until it changes or the vault locks.
    let pageCache = PageCacheGate()
    let state: Locked<VaultState>
    let running = Atomic<Bool>(true)
    /// Wakes the watcher: a new deadline (an unlock, an unlinked field), SIGUSR1, shutdown.
    let wakeup = Wakeup()
    /// Who may read a password (SPEC §3a): requesters, prompts, decisions.
    let access: AccessGuard
    /// The vault is unlocked and guarded (a mirror of its sealed flag, read without the lock).
    let guarded = Atomic<Bool>(false)
    /// Guarding as last seen unlocked (status while locked).
    let lastKnownGuarding = Atomic<KnownGuarding>(.unknown)
    /// The text each open `trusted` or `conflicts/` file reads, by handle (the handles are the
    /// vault session's, whose lock generation is in them: a lock empties the table, wiping
    /// the conflicts, and refuses the handles of before).
    let handleTexts = Locked(OpenFiles<HandleText>())
    /// The last guarding change on this mount turned it off (`mtmfs guard off`): then a
    /// vault read again with guarding off is no roll-back.
    let guardingTurnedOff = Atomic<Bool>(false)
    /// READs of fields answered (`.mtmfs/status` `field_reads`): a read the kernel served
    /// from its pages does not count.
    let fieldReads = Atomic<UInt64>(0)
    /// The last scan of the vault folder: how long it read and opened files without the
    /// service's lock, and how long it then held the lock to merge them (the debug log says it).
    let lastFolderScan = Locked<(unlocked: Duration, held: Duration)>((.zero, .zero))
    /// Tests: runs between a folder scan's read (the service's lock let go) and its merge.
    let afterFolderScanRead = Locked<(@Sendable (VaultFolder.Scan) -> Void)?>(nil)
    /// Tests: runs as vault change files are about to be written and synced (the service's
    /// lock let go), with how many.
    let whileSavesWrite = Locked<(@Sendable () -> Void)?>(nil)
    /// How long the last unlock held the service's lock (the key derivation is outside it).
    let lastUnlockHeld = Locked<Duration>(.zero)
    /// Told of every change of the accounts (the Secret Service's signals).
    let secretObservers = SecretObservers()
    /// The Secret Service is served: a lock keeps the index for its searches (`VaultState.lockedSearch`).
    let servesSecretService = Atomic<Bool>(false)

    public init(vaultPath: String, ownership: Ownership, notifier: KernelCacheNotifier,
                autoLockSeconds: Int, prompts: PromptSettings, nodes: NodeTable) {
        self.notifier = notifier
        self.access = AccessGuard(settings: prompts)
        let session = VaultSession(vaultPath: vaultPath, autoLockSeconds: autoLockSeconds)
        self.state = Locked(VaultState(ownership: ownership, fields: AccountFields(session: session),
                                       engine: EditingEngine(since: ownership.since, nodes: SubtreeNodes(table: nodes, space: .accounts)),
                                       secretObservers: secretObservers))
        startWatcher()
    }

    /// At unmount: prompts cancelled, the vault locked, the watcher ended.
    public func shutDown() {
        running.store(false, ordering: .relaxed)
        access.cancelAll()
        lock(reason: "unmount")
        wakeup.wake()
    }

    func savesWillWrite() { whileSavesWrite.withLock { $0 }?() }

    /// Files held, editor's files linked, hidden fields (for tests and status).
    var census: (files: Int, scratch: Int, hidden: Int) { state.withLock { $0.engine.census } }

    /// Locks on a request of the signals (`DaemonSignals`, SIGUSR1), at the auto-lock, and
    /// takes unlinked fields out once their delay has passed.
    /// The watcher: one thread asleep until the next thing due (the auto-lock, an unlinked
    /// field's removal), until woken (SIGUSR1, an unlock, a new removal, shutdown), or until
    /// the vault file changes (inotify on its directory). Idle and locked, or unlocked with
    /// no auto-lock, it does not wake at all.
    func startWatcher() {
        let wakeup = self.wakeup
        let path = state.withLock { $0.fields.session.vaultPath }
        let watch = FileWatch.logging(path, otherwise: "a vault replaced by another program is not noticed")
        Threads.detach { [weak self] in
            // A folder's files brought by git or a synchroniser show while mounted (watched
            // from when the vault is a folder: a single file becomes one at its first unlock).
            var folderWatch: FolderWatch?
            // The programs that made editor's files, watched for their exit (`settleScratch`).
            var creators: [Int32] = []
            while true {
                if folderWatch == nil, Vault.isFolder(path) {
                    folderWatch = FolderWatch.logging(path, otherwise: "files brought into the vault folder show only at the next unlock")
                }
                guard let deadline = self?.nextDeadline() else { return }
                let ready = wakeup.wait(until: deadline, watching: [watch?.fd, folderWatch?.fd].compactMap { $0 } + creators)
                guard let self, self.running.load(ordering: .relaxed) else { return }
                if let watch, ready.contains(watch.fd), watch.changed() { self.reloadIfReplaced() }
                if let folderWatch, ready.contains(folderWatch.fd), folderWatch.changed() { self.folderChanged() }
                if LockSignal.take() {
                    self.lock(reason: "SIGUSR1")
                } else if self.state.withLock({ $0.fields.session.autoLockDue }) {
                    let seconds = self.state.withLock { $0.fields.session.autoLockSeconds }
                    self.lock(reason: "auto-lock after \(seconds) s without a secret access")
                } else {
                    creators = self.lockedAlways { s -> [Int32] in
                        s.engine.creatorsChanged = false
                        guard s.fields.session.isOpen else { return [] }
                        s.engine.commitDueRemovals(before: .now, &s.fields)
                        s.engine.settleScratch(&s.fields)
                        return s.engine.creatorDescriptors
                    }
                    self.foldIfDue()
                }
            }
        }
    }

    /// Another program replaced or changed the vault file (a restore from backup, a sync):
    /// the mount's copy would overwrite it at the next change. The vault is locked (the new
    /// file may have another passphrase) and read again, so `ls accounts/` shows what the
    /// file holds; a file that cannot be read leaves accounts/ answering EIO until it can.
    func reloadIfReplaced() {
        let replaced = state.withLock { s -> Bool in
            s.fields.vault.map { $0.isReplaced } ?? (FileIdentity(of: s.fields.session.vaultPath) != nil)
        }
        guard replaced else { return }
        lock(reason: "the vault file was changed by another program")
        let top = state.withLock { s -> [LocalInode] in
            s.fields.session.reload()
            return [.top] + (s.fields.vault?.accounts ?? []).map { s.fields.id(of: $0.uuid).directory }
        }
        Log.warning("the vault file was changed by another program: read again (\(top.count - 1) accounts), locked")
        for local in top { notifier.invalidateInode(space.inode(local)) }
    }

    /// Files of the vault folder came or went (not this mount's own, or not only): the
    /// folder is read again, and what changed is invalidated — the fields of the accounts
    /// whose changes came or went, the listing, and the names of accounts that went.
    ///
    /// In three steps, so that no request waits for the disk or the cipher: the scan's
    /// basis and a copy of the key are taken under the service's lock; the new files are read,
    /// another machine's synced, parsed and opened with it let go; they are merged under
    /// it again (a scan that a lock or unlock overtook is dropped and made again).
    func folderChanged() {
        for _ in 0..<3 {
            let start = ContinuousClock.now
            guard let (vault, basis, key) = state.withLock({ s -> (Vault, VaultFolder.ScanBasis, SecureBytes?)? in
                guard let vault = s.fields.vault, !vault.isReplaced, let (basis, key) = vault.folderScanBasis() else { return nil }
                return (vault, basis, key)
            }) else { return }
            let arena = SecureArena()
            let found = VaultFolder.scan(basis, key: key, arena: arena)
            key?.wipe()
            let scanned = ContinuousClock.now
            afterFolderScanRead.withLock { $0 }?(found)
            let (applied, invalidations) = state.withLock { s -> (VaultFolder.Applied, [Invalidation]) in
                guard s.fields.vault === vault, !vault.isReplaced else {
                    found.wipe()
                    arena.releaseAll()
                    return (.unchanged, [])
                }
                let before = Set(vault.accounts.map(\.uuid))
                let applied = vault.applyFolderScan(found, arena: arena)
                guard case .changed(let affected) = applied else { return (applied, []) }
                // The bus is told of the accounts whose changes came or went (also those the
                // kernel never looked up), and only they are invalidated.
                s.fields.touched.formUnion(affected.subtracting([Vault.vaultRecordUUID]))
                s.fields.touched.formUnion(Set(vault.accounts.map(\.uuid)).subtracting(before))
                // (The vault's own record — guarding — changes every account's directory.)
                let gone = s.fields.reconcileWithVault(affected: affected.contains(Vault.vaultRecordUUID) ? nil : affected)
                return (applied, s.takeInvalidations() + [.inode(.top)] + gone.map { .entry(parent: .top, name: $0) })
            }
            let held = scanned.duration(to: .now)
            lastFolderScan.withLock { $0 = (start.duration(to: scanned), held) }
            if applied == .stale { continue }
            guard !invalidations.isEmpty else { return }
            Log.info("vault folder changed by another program: read again")
            Log.debug("vault folder scan: \(start.duration(to: scanned)) reading and opening without the service's lock, \(held) merging under it")
            send(invalidations)
            return
        }
    }

    /// When the watcher must next look (nil inside: no deadline); nil when the tree is shut down.
    func nextDeadline() -> ContinuousClock.Instant?? {
        guard running.load(ordering: .relaxed) else { return nil }
        return .some(state.withLock { s in
            s.backgroundWorkDue ? .now
                : [s.fields.session.autoLockDeadline, s.fields.session.isOpen ? s.engine.nextRemovalDue : nil].compactMap { $0 }.min()
        })
    }

    /// Folds this device's vault files into one when enough have piled up (`Vault.foldIsDue`):
    /// prepared under the lock, written and synced with it let go, finished under it again.
    /// Runs on the watcher, never on a request.
    func foldIfDue() {
        let work = state.withLock { s -> (Vault, VaultFolder.PreparedFold)? in
            guard s.fields.session.isOpen, let vault = s.fields.vault,
                  let fold = try? vault.prepareFold() else { return nil }
            return (vault, fold)
        }
        guard let (vault, fold) = work else { return }
        fold.file.write()
        state.withLock { s in
            vault.finishFold(fold)  // (a vault read again meanwhile: only this one's files go)
            if let error = fold.file.error { Log.warning("vault fold not written (\(error.description)): the files stay as they are") }
        }
        // What the fold's merge and its file took from the heap goes back to the system.
        Syscall.trimHeap()
    }

    /// SIGUSR1 locks this tree's vault (see `LockSignal`).
    public func catchLockSignal() { LockSignal.catchRequests(waking: wakeup) }

    /// Unlocks with a passphrase (already in secure memory) — or, with `kind`, a recovery
    /// key or the login password, tried on the slots of that kind alone. Wrong: EACCES;
    /// damaged: EIO. The key derivation runs outside the state lock: requests of accounts/
    /// go on meanwhile; the lock is taken only to unwrap the master key and open the records.
    public func unlock(passphrase: SecureBytes, kind: SlotKind = .passphrase) throws(Errno) {
        defer { SecureBytes.burnStack() }
        guard var vault = state.withLock({ $0.fields.vault }) else { throw .ioError }
        // (A single file has the passphrase's slot alone: it is converted by a passphrase.)
        let converted = !vault.isFolder && kind == .passphrase
        if converted { vault = try convert(vault, passphrase: passphrase) }
        let kek: SecureBytes
        do throws(VaultError) {
            kek = try vault.passphraseKey(passphrase, kind: kind)
        } catch {
            // (A folder's key slots are opened here: a wrong passphrase shows now.)
            Log.warning(error == .wrongPassphrase ? "unlock refused: wrong passphrase" : error.description)
            throw error.errno
        }
        // Sizes cached as 0 while locked are dropped, so `ls -l` right after shows the real ones.
        let files = try state.withLock { (s) throws(Errno) -> [LocalInode] in
            // (A leaf lock: nothing is taken under it.)
            let taken = ContinuousClock.now
            defer { lastUnlockHeld.withLock { $0 = taken.duration(to: .now) } }
            guard s.fields.vault === vault else {
                kek.wipe()
                throw .tryAgain
            }
            do throws(VaultError) {
                try vault.unlock(withPassphraseKey: kek)
            } catch {
                if case .damaged = error { s.fields.session.damage(error.description) }
                Log.warning(error == .wrongPassphrase ? "unlock refused: wrong passphrase" : error.description)
                throw error.errno
            }
            // Guarding seen on by this mount and off in the file now, without `mtmfs guard
            // off` here: an older copy of the vault was put back. Not taken.
            if lastKnownGuarding.load(ordering: .relaxed) == .on, !guardingTurnedOff.load(ordering: .relaxed),
               (try? vault.isGuarded()) == false {
                vault.lock()
                let message = "the vault file now has guarding off, which this mount saw on: an older copy put back? "
                    + "Not unlocked; remount to accept it"
                Log.error(message)
                s.fields.session.problem = message
                throw .ioError  // not a wrong passphrase: `mtmfs unlock` points to the status
            }
            s.fields.session.touched()
            s.fields.session.unlocked()
            s.lockedSearch = nil  // (its key wiped: the vault's own index serves again)
            s.lockedItems = [:]
            noteGuarding(s)
            return Array(s.engine.files.keys)
        }
        // The kernel is told to forget the locked sizes (0) before any request sees the vault
        // open: an invalidation landing while a reader's GETATTR is on its way makes the
        // kernel drop that answer and keep size 0, and the read after an unlock read nothing
        // (found by the concurrency suite). Meanwhile fields still answer as locked; once
        // they answer, a reader's OPEN takes its field's invalidation out of the outbox and
        // sends its own (`PageCacheGate.admit`): nothing here waits for the sending thread.
        pageCache.changed()
        for local in files { notifier.invalidateInode(space.inode(local)) }
        // What opening the records needed only for a while goes back to the system.
        Syscall.trimHeap()
        // The single file a conversion kept goes once a later unlock of the folder worked.
        let kept = VaultConversion.keptFilePath(for: vault.path)
        if !converted, (try? Syscall.lstat(kept)) != nil {
            try? Syscall.unlink(kept)
            Log.info("vault.v2 (the single-file vault kept at its conversion) removed: the folder unlocked again")
        }
        // The auto-lock has a deadline now: the watcher learns it.
        defer {
            wakeup.wake()
            secretObservers.notify(.lockState)
        }
        state.withLock { s in
            s.fields.session.reveal()
            Log.info("accounts unlocked")
        }
        Log.debug("unlock: the service's lock held \(lastUnlockHeld.withLock { $0 }) to open the vault")
    }

    /// A single-file vault (format 1 or 2) becomes a folder at its first unlock (SPEC §2b):
    /// written beside it from a second opening of the file (outside the service's lock: that
    /// derives keys), then, under the lock, the file is renamed `vault.v2`, the folder takes
    /// its name and is the tree's vault from then on. Nothing can change meanwhile (the
    /// vault is locked: every write gets EACCES). Returns the vault to unlock.
    func convert(_ vault: Vault, passphrase: SecureBytes) throws(Errno) -> Vault {
        let path = vault.path, converting = VaultConversion.conversionPath(for: path)
        VaultConversion.removeConversionLeftover(at: converting)
        do throws(VaultError) {
            let source = try Vault(path: path)
            try source.unlock(passphrase: passphrase)
            defer { source.lock() }
            try VaultConversion.write(source, asFolderAt: converting, passphrase: passphrase)
        } catch {
            VaultConversion.removeConversionLeftover(at: converting)
            if error != .wrongPassphrase { Log.error("vault not converted to a folder: \(error.description)") }
            throw error.errno
        }
        let folder = try state.withLock { (s) throws(Errno) -> Vault in
            guard s.fields.vault === vault else {
                VaultConversion.removeConversionLeftover(at: converting)
                throw .tryAgain
            }
            do throws(VaultError) {
                try VaultConversion.swapInConverted(at: path)
                // The renames durable before a change is written to the folder: undone by a
                // power cut, the next unlock would take the folder for a leftover.
                do throws(Errno) {
                    try AtomicFile.syncDirectory(AtomicFile.parentDirectory(of: path))
                } catch {
                    throw VaultError.io(error)
                }
                let folder = try Vault(path: path)
                folder.defersWrites = true
                s.fields.session.vault = folder
                return folder
            } catch {
                Log.error("vault not converted to a folder: \(error.description)")
                throw error.errno
            }
        }
        Log.info("vault converted to a folder (format 3); the single file is kept as vault.v2 until a later unlock")
        return folder
    }

    /// Zeroes every key and plaintext, and tells the kernel to forget every field it holds.
    /// Under the service's lock nothing reads or syncs the disk: the changes sealed on the way
    /// (removals due) are written after it, as a request's are.
    public func lock(reason: String) {
        defer { SecureBytes.burnStack() }
        // What the bus shows of locked items (labels, attributes), read before the lock
        // with the service's lock taken a few hundred items at a time.
        let views = servesSecretService.load(ordering: .relaxed) ? VaultSecretStore.views(of: self) : [:]
        let (invalidations, saves) = state.withLock { s -> ([Invalidation], [any DeferredSave]) in
            let wasUnlocked = s.fields.session.isUnlocked
            // Fields unlinked a moment ago leave now, while the vault can still seal.
            if s.fields.session.isOpen {
                s.engine.keepKeysBeingRecreated(s.fields)
                s.engine.commitDueRemovals(before: nil, &s.fields)
            }
            s.settle()
            let saves = s.takeSaves()  // sealed: written below without the keys
            // Names in the views are made of fields: the kernel forgets those it was given.
            let viewNames = s.viewNamesToForget()
            if wasUnlocked && servesSecretService.load(ordering: .relaxed) {
                s.lockedSearch = s.fields.vault?.takeIndexForLockedSearch()
                s.lockedItems = views
            }
            s.fields.session.lock()
            noteGuarding(s)
            handleTexts.withLock { $0.releaseAll() }.forEach { $0.wipe() }
            let files = s.engine.wipeAll().map(Invalidation.inode) + s.takeInvalidations() + viewNames
            if wasUnlocked { Log.info("accounts locked (\(reason))") }
            return (files, saves)
        }
        if let failure = writeOutside(saves) { Log.error("a vault change could not be written at lock: \(failure)") }
        // An unlock that read the folder while those were being written did not see them.
        if state.withLock({ $0.fields.vault?.folderNeedsScan == true }) { folderChanged() }
        // Sent by the notifier's thread, not waited for here (a lock may come from a request);
        // `.mtmfs/lock` answers its writer once they are sent (`KernelCacheNotifier.whenSent`).
        pageCache.changed()
        send(invalidations)
        secretObservers.notify(.lockState)
        // What opening the records took from the heap goes back to the system too.
        Syscall.trimHeap()
    }

    /// `kernel.yama.ptrace_scope`: 0 lets every program of a user trace (and read) any
    /// other; "none" when Yama is absent (the same).
    static var ptraceScope: String {
        guard let fd = try? Syscall.open("/proc/sys/kernel/yama/ptrace_scope", O_RDONLY) else { return "none" }
        defer { Syscall.close(fd) }
        let text = String(decoding: (try? Syscall.readAll(fd)) ?? [], as: UTF8.self)
        return text.filter { $0.isNumber }.isEmpty ? "none" : text.filter { $0.isNumber }
    }

    /// For `.mtmfs/status`. (/proc is read before the state lock is taken.)
    public func statusLines() -> [String] {
        let ptraceScope = Self.ptraceScope
        return state.withLock { s in
            let session = s.fields.session
            var lines = ["state=\(session.isUnlocked ? "unlocked" : "locked")"]
            lines.append("auto_lock_in=\(session.autoLockIn)")
            lines.append("accounts=\(session.vault?.accountCount ?? 0)")
            lines.append("guard=" + lastKnownGuarding.load(ordering: .relaxed).status)
            lines.append("ptrace_scope=" + ptraceScope)
            if let vault = session.vault, let files = vault.folderFiles {
                lines.append("vault_files=\(files.loaded)")
                lines.append("vault_skipped=\(files.skipped.count)")
                for (relative, why) in files.skipped.sorted(by: { $0.key < $1.key }).prefix(20) {
                    lines.append("vault_skipped_file=\(relative): \(why)")
                }
                if session.isOpen { lines.append("conflicts=\(vault.conflictCount)") }
            }
            if let problem = session.problem { lines.append("vault_error=\(problem)") }
            lines.append("field_reads=\(fieldReads.load(ordering: .relaxed))")
            lines.append("revoked_open=\(session.openHandles.revokedOpen)")
            return lines
        }
    }

    /// The fields a question to `.mtmfs/find` may name (the password is not one).
    static let searchableFields: [String: AccountField] = [
        "label": .label, "protocol": .protocol, "server": .server, "port": .port,
        "path": .path, "comment": .comment, "username": .username,
    ]

    /// Answers a question written to `.mtmfs/find` (what `mtmfs find` and the git credential
    /// helper ask): lines `FIELD=VALUE`, each value to match exactly (an empty one matches an
    /// empty field); the answer is the names of the matching accounts, one a line, in the
    /// vault's order. Accounts are found through the vault's index (no scan): candidates
    /// from the smallest group a criterion names, each then compared. An empty question
    /// lists every account. Locked: EACCES; a line that is not `FIELD=VALUE` of a
    /// searchable field: EINVAL.
    public func find(_ question: UnsafeRawBufferPointer) throws(Errno) -> String {
        var criteria: [AccountField: [UInt8]] = [:]
        for line in question.split(separator: 0x0A, omittingEmptySubsequences: true) {
            var line = Array(line)
            if line.last == 0x0D { line.removeLast() }
            guard let equals = line.firstIndex(of: UInt8(ascii: "=")),
                  let field = Self.searchableFields[String(decoding: line[..<equals], as: UTF8.self)],
                  criteria[field] == nil else { throw .invalidArgument }
            criteria[field] = Array(line[(equals + 1)...])
        }
        let names = try locked { (s) throws(Errno) -> [String] in
            try s.fields.session.requireOpen()
            guard let vault = s.fields.vault else { throw .ioError }
            return Self.matches(criteria, in: vault).compactMap { vault.name(of: $0) }
        }
        return names.map { $0 + "\n" }.joined()
    }

    /// The accounts that match every criterion: candidates from the smallest indexed group
    /// the criteria name (or every account, for no criterion), each then compared.
    static func matches(_ criteria: [AccountField: [UInt8]], in vault: Vault) -> [[UInt8]] {
        var groups: [[[UInt8]]] = []
        for attribute in IndexedAttribute.allCases {
            guard let value = criteria[attribute.field] else { continue }
            groups.append(value.withUnsafeBytes { (try? vault.accounts(with: attribute, equalTo: $0)) ?? [] })
        }
        if let server = criteria[.server], let username = criteria[.username] {
            groups.append(server.withUnsafeBytes { s in
                username.withUnsafeBytes { u in (try? vault.accounts(server: s, username: u)) ?? [] }
            })
        }
        let candidates = groups.min { $0.count < $1.count } ?? vault.accounts.map(\.uuid)
        return candidates.filter { uuid in
            criteria.allSatisfy { field, wanted in
                let stored = try? vault.storedField(field, of: uuid)
                return (stored?.withUnsafeBytes { $0.elementsEqual(wanted) }) ?? wanted.isEmpty
            }
        }
    }
}

/// Guarding as the mount last saw it unlocked: what `.mtmfs/status` says while locked, and
/// what tells a vault read again with guarding off from a roll-back.
///
/// Thread-safety: a value, kept in an `Atomic`.
enum KnownGuarding: UInt8, AtomicRepresentable {
    case unknown, off, on

    var status: String {
        switch self {
        case .unknown: "unknown"
        case .off: "off"
        case .on: "on"
        }
    }
}

