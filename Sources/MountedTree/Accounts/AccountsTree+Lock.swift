#if canImport(Glibc)
import Glibc
#endif
import CredentialVault
import FuseLowLevel
import Posix

extension AccountsTree {
    /// Locks on a request of the signals (`DaemonSignals`, SIGUSR1), at the auto-lock, and
    /// takes unlinked fields out once their delay has passed.
    func startWatcher() {
        Threads.detach { [weak self] in
            while true {
                usleep(100_000)
                guard let self, self.running.load(ordering: .relaxed) else { return }
                if DaemonSignals.takeLockRequest() {
                    self.lock(reason: "SIGUSR1")
                } else if self.state.withLock({ $0.fields.session.autoLockDue }) {
                    let seconds = self.state.withLock { $0.fields.session.autoLockSeconds }
                    self.lock(reason: "auto-lock after \(seconds) s without a secret access")
                } else {
                    let invalidations = self.state.withLock { s -> [Invalidation] in
                        guard s.fields.session.isOpen else { return [] }
                        s.engine.commitDueRemovals(before: .now, &s.fields)
                        return s.takeInvalidations()
                    }
                    self.send(invalidations)
                }
            }
        }
    }

    /// Unlocks with a passphrase (already in secure memory). Wrong: EACCES; damaged: EIO.
    /// The key derivation runs outside the state lock: requests of accounts/ go on meanwhile;
    /// the lock is taken only to unwrap the master key and open the records.
    public func unlock(passphrase: SecureBytes) throws(Errno) {
        defer { SecureBytes.burnStack() }
        guard let vault = state.withLock({ $0.fields.vault }) else { throw .ioError }
        let kek: SecureBytes
        do throws(VaultError) {
            kek = try vault.passphraseKey(passphrase)
        } catch {
            throw error.errno
        }
        // Sizes cached as 0 while locked are dropped, so `ls -l` right after shows the real ones.
        let files = try state.withLock { (s) throws(Errno) -> [LocalInode] in
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
            s.fields.session.touched()
            s.fields.session.revealing = true
            return Array(s.engine.files.keys)
        }
        // The kernel forgets the locked sizes (0) before any request sees the vault open: an
        // invalidation landing while a reader's GETATTR is on its way makes the kernel drop
        // that answer and keep size 0, and the read after an unlock read nothing (found by
        // the concurrency suite). Meanwhile fields still answer as locked.
        pageCache.changed()
        for local in files { notifier.invalidateInode(space.inode(local)) }
        notifier.drain()
        state.withLock { s in
            s.fields.session.revealing = false
            Log.info("accounts unlocked")
        }
    }

    /// Zeroes every key and plaintext, and tells the kernel to forget every field it holds.
    public func lock(reason: String) {
        defer { SecureBytes.burnStack() }
        let invalidations = state.withLock { s -> [Invalidation] in
            let wasUnlocked = s.fields.session.isUnlocked
            // Fields unlinked a moment ago leave now, while the vault can still seal.
            if s.fields.session.isOpen {
                s.engine.keepKeysBeingRecreated(s.fields)
                s.engine.commitDueRemovals(before: nil, &s.fields)
            }
            s.settle()
            // Names in the views are made of fields: the kernel forgets those it was given.
            let viewNames = s.viewNamesToForget()
            s.fields.session.lock()
            let files = s.engine.wipeAll().map(Invalidation.inode) + s.takeInvalidations() + viewNames
            if wasUnlocked { Log.info("accounts locked (\(reason))") }
            return files
        }
        pageCache.changed()
        send(invalidations)
        notifier.drain()
        // What opening the records took from the heap goes back to the system too.
        Syscall.trimHeap()
    }

    /// For `.mtmfs/status`.
    public func statusLines() -> [String] {
        state.withLock { s in
            let session = s.fields.session
            var lines = ["state=\(session.isUnlocked ? "unlocked" : "locked")"]
            lines.append("auto_lock_in=\(session.autoLockIn)")
            lines.append("accounts=\(session.vault?.accountCount ?? 0)")
            if let problem = session.problem { lines.append("vault_error=\(problem)") }
            return lines
        }
    }
}
