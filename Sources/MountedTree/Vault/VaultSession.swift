import CredentialVault
import Posix

/// The vault of a mount and its lock state: whether fields can be read and written, when
/// the vault locks by itself, and which file handles still count.
///
/// Invariants: a handle is honoured only while the lock generation it was made under is
/// current (every lock starts a new one); `isOpen` is false from a lock until an unlock
/// has made the kernel drop what it cached while locked (`Phase.revealing`).
///
/// The key derivation of an unlock happens outside the service's lock (see
/// `VaultService.unlock`); the session only takes the finished key.
/// Thread-safety: a value behind `VaultService`'s lock.
struct VaultSession {
    let vaultPath: String
    var vault: Vault?
    /// Why the vault cannot be used (damaged or unreadable), for status and logs.
    var problem: String?
    var autoLockSeconds: Int
    var lastSecretAccess = ContinuousClock.now
    /// Where the session is: no vault to use (`problem` says why), locked, unlocked while
    /// the kernel still drops what it cached while locked (fields answer as locked), or
    /// open. The keys are the vault's: unlocked means the vault holds them.
    enum Phase: Equatable { case unavailable, locked, revealing, open }

    var phase: Phase {
        guard let vault else { return .unavailable }
        guard vault.isUnlocked else { return .locked }
        return revealed ? .open : .revealing
    }

    /// Since the last unlock, the kernel was told to drop what it cached while locked
    /// (`reveal`); set back at every lock and unlock.
    private var revealed = false
    private var handles = HandleAllocator()
    /// Which handles are open on which file, and which of them a narrowing revoked.
    private(set) var openHandles = OpenHandles()

    init(vaultPath: String, autoLockSeconds: Int) {
        self.vaultPath = vaultPath
        self.autoLockSeconds = autoLockSeconds
        // A save cut short by a kill leaves its (sealed) temporary file behind.
        AtomicFile.removeStaleTemporaries(of: vaultPath)
        VaultConversion.finishInterruptedConversion(at: vaultPath)
        do {
            vault = try Vault(path: vaultPath)
            vault?.defersWrites = true  // (a folder's: written by the request after the service's lock, `VaultSave`)
        } catch {
            damage(error.description)
        }
    }

    /// Fields can be read and written.
    var isOpen: Bool { phase == .open }
    /// The vault holds its keys (open, or revealing).
    var isUnlocked: Bool { phase == .open || phase == .revealing }

    /// Unlocked: fields still answer as locked until `reveal`.
    mutating func unlocked() { revealed = false }

    /// The kernel was told to drop what it cached while locked: fields answer.
    mutating func reveal() { revealed = true }

    func requireOpen() throws(Errno) {
        guard isOpen else { throw .permissionDenied }
    }

    /// A secret was read or written: the auto-lock waits again.
    mutating func touched() { lastSecretAccess = .now }

    var autoLockDue: Bool {
        guard autoLockSeconds > 0, isUnlocked else { return false }
        return lastSecretAccess.secondsElapsed >= Double(autoLockSeconds)
    }

    /// When the vault locks by itself if no secret is accessed meanwhile (nil: locked, or never).
    var autoLockDeadline: ContinuousClock.Instant? {
        guard autoLockSeconds > 0, isUnlocked else { return nil }
        return lastSecretAccess.advanced(by: .seconds(autoLockSeconds))
    }

    /// Seconds until the auto-lock (0: locked or never).
    var autoLockIn: Int {
        guard isUnlocked, autoLockSeconds > 0 else { return 0 }
        return max(0, Int((Double(autoLockSeconds) - lastSecretAccess.secondsElapsed).rounded(.up)))
    }

    mutating func newHandle() -> FileHandle { handles.next() }

    /// Made under the current lock generation, and not revoked by a narrowing since.
    func isCurrent(_ handle: FileHandle) -> Bool { handles.isCurrent(handle) && !openHandles.isRevoked(handle) }

    /// A handle of `file` was opened (counted once the open succeeded) or let go.
    mutating func opened(_ handle: FileHandle, of file: LocalInode) { openHandles.opened(handle, of: file) }
    mutating func released(_ handle: FileHandle, of file: LocalInode) { openHandles.released(handle, of: file) }

    /// Revokes the handles open on the files `covers` takes in (a narrowing of who may read
    /// them): refused from now on, and those files uncached until they are closed.
    @discardableResult
    mutating func revokeHandles(where covers: (LocalInode) -> Bool) -> [LocalInode] { openHandles.revoke(where: covers) }

    /// Starts a new generation without locking: every earlier handle is refused (guarding
    /// turned on: none of them was decided).
    mutating func retireHandles() {
        handles.retireAll()
        revokeHandles { _ in true }
    }

    /// Zeroes the keys and starts a new generation: every earlier handle is refused.
    mutating func lock() {
        vault?.lock()
        revealed = false
        retireHandles()
    }

    /// Reads the vault file again (locked), after another program changed it.
    mutating func reload() {
        vault?.lock()
        do {
            vault = try Vault(path: vaultPath)
            vault?.defersWrites = true  // (a folder's: written by the request after the service's lock, `VaultSave`)
            if let problem { Log.info("vault readable again: \(vaultPath) (was: \(problem))") }
            problem = nil
        } catch {
            damage(error.description)
        }
    }

    mutating func damage(_ message: String) {
        problem = message
        vault?.lock()
        vault = nil
        Log.error("\(message); accounts/ answers EIO, the vault file is left as it is")
    }
}
