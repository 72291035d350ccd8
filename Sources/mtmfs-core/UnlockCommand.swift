import CredentialVault
import ScriptCommands
import MountedTree
import Posix
import SecureMemory
import Synchronization
#if canImport(Glibc)
import Glibc
#endif

/// `mtmfs unlock`: asks for the passphrase and unlocks a mount's accounts.
struct UnlockCommand: Command {
    static let name = "unlock"
    static let abstract = "unlock the accounts of a mount (asks for the passphrase)"
    static let usage = """
    Usage: mtmfs unlock [--recovery-key | --login [--wait SECONDS]] [--passphrase-file FILE] [MOUNT]

    Asks for the passphrase without echo on a terminal, or reads one line from standard
    input, or the first line of FILE. MOUNT may be left out when one mtmfs mount is up.
    A wrong passphrase exits 1. The passphrase never goes on a command line or into the
    environment.
    --recovery-key asks for the recovery key (`mtmfs recovery-key`) in its place.
    --login takes the login password (the login slot of `mtmfs passwd --login`; the PAM
    module runs this at login): MOUNT left out, the mount of the default data directory,
    waited for up to --wait SECONDS (default 0) when it is not up yet (exit 6 if it never is).
    """
    static let flags: Set<String> = ["--recovery-key", "--login"]
    static let options: Set<String> = ["--passphrase-file", "--wait"]

    let given: String?
    /// MOUNT resolved (nil for --login: its mount is looked for, and waited for, in `run`).
    let mountPoint: String?
    let passphraseFile: String?
    let kind: SlotKind
    let waitSeconds: Int

    init(_ arguments: Arguments) throws(CommandFailure) {
        given = try arguments.positionals(0...1, named: "").first
        passphraseFile = arguments.value("--passphrase-file")
        let login = arguments.has("--login")
        guard !(login && arguments.has("--recovery-key")) else { throw .usage("--login and --recovery-key exclude each other", command: Self.name) }
        kind = login ? .login : arguments.has("--recovery-key") ? .recovery : .passphrase
        guard let seconds = Int(arguments.value("--wait") ?? "0"), (0...3600).contains(seconds) else {
            throw .usage("--wait takes 0 to 3600 seconds", command: Self.name)
        }
        guard login || arguments.value("--wait") == nil else { throw .usage("--wait goes with --login", command: Self.name) }
        waitSeconds = seconds
        // (A wrong MOUNT says so before any prompt.)
        mountPoint = kind == .login ? nil : try MountChoice.resolve(given)
    }

    /// The mount the login password is for: MOUNT, else this user's mount of the default
    /// data directory, waited for (a user unit may start it just after the login).
    private func loginMount() throws(CommandFailure) -> String {
        if let given { return try MountChoice.resolve(given) }
        let dataDirectory = Paths.dataDirectory(nil)
        let deadline = ContinuousClock.now + .seconds(waitSeconds)
        while true {
            if let mount = MountTable.ownMount(of: dataDirectory), !StatusFile.read(mountPoint: mount.mountPoint).isEmpty {
                return mount.mountPoint
            }
            guard ContinuousClock.now < deadline else {
                throw CommandFailure("no mount of \(dataDirectory) is up" + (waitSeconds > 0 ? " after \(waitSeconds) s" : ""),
                                     exitCode: ExitCode.noMount)
            }
            usleep(100_000)
        }
    }

    func run() throws(CommandFailure) {
        if kind == .login {
            // The password is read first: the PAM module's pipe is emptied at once.
            let password = try PassphraseInput.read(prompt: "Login password: ", file: passphraseFile)
            defer { password.wipe() }
            let mountPoint = try loginMount()
            guard StatusFile.read(mountPoint: mountPoint)["state"] != "unlocked" else { return }
            try PassphraseInput.unlock(mountPoint: mountPoint, with: password, kind: .login)
            print("Unlocked the accounts of \(mountPoint).")
            return
        }
        guard let mountPoint else { return }  // (set for every kind but --login)
        // No passphrase asked for, no key derived: there is nothing to unlock.
        if StatusFile.read(mountPoint: mountPoint)["state"] == "unlocked" {
            print("The accounts of \(mountPoint) are already unlocked.")
            return
        }
        let passphrase = kind == .recovery
            ? try RecoveryKeyInput.read(prompt: "Recovery key for \(mountPoint): ", file: passphraseFile)
            : try PassphraseInput.read(prompt: "Passphrase for \(mountPoint): ", file: passphraseFile)
        defer { passphrase.wipe() }
        let result = Progress.whileWorking("deriving the key from the \(kind == .recovery ? "recovery key" : "passphrase")") {
            Result { () throws(CommandFailure) in try PassphraseInput.unlock(mountPoint: mountPoint, with: passphrase, kind: kind) }
        }
        try result.get()
        print("Unlocked the accounts of \(mountPoint).")
    }
}

/// `mtmfs lock`: locks at once.
struct LockCommand: Command {
    static let name = "lock"
    static let abstract = "lock the accounts of a mount at once"
    static let usage = """
    Usage: mtmfs lock [MOUNT]

    Zeroes the keys and every decrypted field in the daemon and drops the kernel's caches;
    files opened before get EACCES on their next read. MOUNT may be left out when one
    mtmfs mount is up.
    """
    static let flags: Set<String> = []
    static let options: Set<String> = []

    let mountPoint: String

    init(_ arguments: Arguments) throws(CommandFailure) {
        mountPoint = try MountChoice.resolve(try arguments.positionals(0...1, named: "").first)
    }

    func run() throws(CommandFailure) {
        do {
            let fd = try Syscall.open(mountPoint + "/.mtmfs/lock", O_WRONLY)
            defer { Syscall.close(fd) }
            try Syscall.writeAll(fd, Array("lock\n".utf8))
        } catch {
            throw CommandFailure("cannot lock \(mountPoint): \(error)")
        }
    }
}

/// `mtmfs passwd`: changes the passphrase by re-wrapping the master key.
struct PasswdCommand: Command {
    static let name = "passwd"
    static let abstract = "change the vault's passphrase (re-wraps the master key only)"
    static let usage = """
    Usage: mtmfs passwd [--data-dir DIR] [--kdf interactive|moderate|sensitive] [--recovery-key]
                        [--passphrase-file FILE --new-passphrase-file FILE] [--weak-passphrase]

    Asks for the current passphrase, then the new one twice. The data directory must not
    be mounted. The records are not re-encrypted: only the wrapped master key changes. A
    weak new passphrase is refused unless --weak-passphrase is given (see `mtmfs init`).
    --recovery-key asks for the recovery key in place of the current passphrase (a
    forgotten passphrase; --passphrase-file FILE then holds the key); the old passphrase
    no longer opens the vault afterwards.

    --login adds a login slot: asks the passphrase, then your login password twice
    (--new-passphrase-file FILE: its first line); the PAM module pam_mtmfs.so then unlocks
    at login with it. Whoever knows the login password can then unlock: the accounts are
    as safe as that password. A second --login replaces the slot; --remove-login removes it.
    --login-changed reads the old login password, then the new one (two lines; the PAM
    module runs it at a password change, also while mounted): the login slot follows.
    Exit 3: the old password opens no login slot.
    """
    static let flags: Set<String> = ["--weak-passphrase", "--recovery-key", "--login", "--remove-login", "--login-changed"]
    static let options: Set<String> = ["--data-dir", "--kdf", "--passphrase-file", "--new-passphrase-file"]

    let dataDirectory: String
    let kdf: KDFParameters?
    let currentFile: String?
    let newFile: String?
    let weakAllowed: Bool
    let withRecoveryKey: Bool
    /// `--login`, `--remove-login`, `--login-changed`: the login slot rather than the passphrase.
    let loginAction: String?

    init(_ arguments: Arguments) throws(CommandFailure) {
        _ = try arguments.positionals(0...0, named: "")
        weakAllowed = arguments.has("--weak-passphrase")
        withRecoveryKey = arguments.has("--recovery-key")
        let actions = ["--login", "--remove-login", "--login-changed"].filter { arguments.has($0) }
        guard actions.count + (withRecoveryKey ? 1 : 0) <= 1 else {
            throw .usage("--login, --remove-login, --login-changed and --recovery-key exclude each other", command: Self.name)
        }
        loginAction = actions.first
        dataDirectory = Paths.dataDirectory(arguments.value("--data-dir"))
        if let name = arguments.value("--kdf") {
            guard let kdf = KDFParameters.named(name) else { throw .usage("--kdf takes interactive, moderate or sensitive", command: Self.name) }
            self.kdf = kdf
        } else {
            kdf = nil
        }
        currentFile = arguments.value("--passphrase-file")
        newFile = arguments.value("--new-passphrase-file")
    }

    func run() throws(CommandFailure) {
        if loginAction == "--login-changed" { return try LoginSlot.passwordChanged(dataDirectory) }
        // Held until the new wrapping is written: no mount may start on the old file meanwhile.
        var (vault, claim) = try UnmountedVault.open(dataDirectory, holder: "mtmfs passwd")
        if let loginAction {
            return try LoginSlot.change(vault, dataDirectory: dataDirectory, remove: loginAction == "--remove-login",
                                        passphraseFile: currentFile, passwordFile: newFile)
        }
        defer { withExtendedLifetime(claim) {} }
        let path = vault.path
        if withRecoveryKey {
            try Self.changeWithRecoveryKey(vault, file: currentFile, then: { () throws(CommandFailure) in
                let new = try PassphraseInput.readNew(file: newFile)
                try PassphraseStrength.require(new, allowed: weakAllowed)
                return new
            }, parameters: kdf)
            print("The passphrase of \(dataDirectory) is changed.")
            return
        }
        let current = try PassphraseInput.read(prompt: "Current passphrase: ", file: currentFile)
        defer { current.wipe() }
        // A single file (format 1 or 2) is only read and converted, never written: it becomes
        // a folder first, as at a mount's first unlock.
        let converted = !vault.isFolder
        do {
            if converted {
                vault = try Progress.whileWorking("converting the vault to a folder") {
                    Result { () throws(VaultError) in try VaultConversion.convert(at: path, passphrase: current) }
                }.get()
            }
            try vault.unlock(passphrase: current)
        } catch {
            throw CommandFailure(error == .wrongPassphrase ? "wrong passphrase; nothing was changed" : error.description)
        }
        defer { vault.lock() }
        let new = try PassphraseInput.readNew(file: newFile)
        defer { new.wipe() }
        try PassphraseStrength.require(new, allowed: weakAllowed)
        do {
            try vault.changePassphrase(to: new, parameters: kdf ?? vault.kdfParameters)
        } catch {
            throw CommandFailure(error.description)
        }
        if converted {
            // The file still opens with the old passphrase: it goes now that the folder holds all.
            try? Syscall.unlink(VaultConversion.keptFilePath(for: path))
            print("The vault of \(dataDirectory) is now a folder (format 3).")
        }
        print("The passphrase of \(dataDirectory) is changed.")
    }

    /// A forgotten passphrase: the recovery key opens the vault, and a new passphrase slot
    /// retires every passphrase slot there was.
    private static func changeWithRecoveryKey(_ vault: Vault, file: String?, then newPassphrase: () throws(CommandFailure) -> SecureBytes,
                                              parameters: KDFParameters?) throws(CommandFailure) {
        guard vault.isFolder else {
            throw CommandFailure("this vault has no recovery key (a single-file vault: mount and unlock it once to convert it)")
        }
        // (Read as typed and parsed once here: `RecoveryKeyInput.read` would parse it twice.)
        let typed = try PassphraseInput.read(prompt: "Recovery key: ", file: file, echo: true)
        defer { typed.wipe() }
        let key = try RecoveryKeyInput.bytes(of: typed)
        defer { key.wipe() }
        do {
            try Progress.whileWorking("deriving the key from the recovery key") {
                Result { () throws(VaultError) in try vault.unlock(passphrase: key, kind: .recovery) }
            }.get()
        } catch {
            throw CommandFailure(error == .wrongPassphrase ? "that recovery key does not open this vault (a newer one replaced it?); nothing was changed"
                                                            : error.description)
        }
        defer { vault.lock() }
        let new = try newPassphrase()
        defer { new.wipe() }
        do {
            try vault.changePassphrase(to: new, parameters: parameters ?? vault.kdfParameters)
        } catch {
            throw CommandFailure(error.description)
        }
    }
}

/// Reading a recovery key (`mtmfs unlock --recovery-key`, `passwd --recovery-key`): on a
/// terminal it is shown as typed (it is long, and a person copies it from paper).
enum RecoveryKeyInput {
    static func read(prompt: String, file: String?) throws(CommandFailure) -> SecureBytes {
        let typed = try PassphraseInput.read(prompt: prompt, file: file, echo: true)
        // Checked here, before any key derivation: a mistyped letter says so at once.
        let key = try bytes(of: typed)
        key.wipe()
        return typed
    }

    /// The key's 16 bytes; a failure saying what is wrong with the letters.
    static func bytes(of typed: SecureBytes) throws(CommandFailure) -> SecureBytes {
        let parsed: SecureBytes?
        do { parsed = try RecoveryKey.parse(typed) } catch { throw CommandFailure("no secure memory for the recovery key: \(error)") }
        guard let parsed else {
            throw CommandFailure("that is not a recovery key: 32 letters in groups of four, the last four a check (a letter mistyped?)")
        }
        return parsed
    }
}

/// On a terminal, says that a slow step is working when it takes over half a second.
enum Progress {
    final class Flag: Sendable {
        let done = Atomic<Bool>(false)
    }

    static func whileWorking<T>(_ what: String, _ body: () -> T) -> T {
        guard isatty(2) == 1 else { return body() }
        let flag = Flag()
        Threads.detach {
            usleep(500_000)
            if !flag.done.load(ordering: .acquiring) { Terminal.error("mtmfs: \(what)…") }
        }
        defer { flag.done.store(true, ordering: .releasing) }
        return body()
    }
}

/// A data directory's vault opened by a command that writes key slots (`passwd`,
/// `recovery-key`): never while a mount serves it — its claim is held until the command
/// ends, so no mount starts meanwhile.
enum UnmountedVault {
    static func open(_ dataDirectory: String, holder: String) throws(CommandFailure) -> (Vault, DataDirectoryClaim) {
        let claim: DataDirectoryClaim
        do {
            claim = try DataDirectoryClaim(DataDirectory(path: dataDirectory), holder: .command(holder))
        } catch {
            if case .unreadable(_, .noSuchFileOrDirectory) = error {
                throw CommandFailure("no vault in \(dataDirectory): run `mtmfs init --data-dir \(dataDirectory)`")
            }
            throw CommandFailure(error.description)
        }
        try MountTable.refuseMounted(dataDirectory)  // a daemon of an earlier mtmfs takes no claim
        do {
            return (try Vault(path: dataDirectory + "/vault"), claim)
        } catch {
            throw CommandFailure(error == .io(.noSuchFileOrDirectory)
                                 ? "no vault in \(dataDirectory): run `mtmfs init --data-dir \(dataDirectory)`" : error.description)
        }
    }
}

extension UnmountedVault {
    /// Asks the passphrase and unlocks `vault`, a folder (a single file of an earlier format
    /// has no slots but the passphrase's: refused, saying how it becomes a folder).
    static func unlock(_ vault: Vault, passphraseFile: String?) throws(CommandFailure) {
        guard vault.isFolder else {
            throw CommandFailure("this vault is a single file (an earlier format): mount and unlock it once, which converts it, then run this again")
        }
        let passphrase = try PassphraseInput.read(prompt: "Passphrase: ", file: passphraseFile)
        defer { passphrase.wipe() }
        do {
            try Progress.whileWorking("deriving the key from the passphrase") {
                Result { () throws(VaultError) in try vault.unlock(passphrase: passphrase) }
            }.get()
        } catch {
            throw CommandFailure(error == .wrongPassphrase ? "wrong passphrase; nothing was changed" : error.description)
        }
    }
}

/// The login slot (`mtmfs passwd --login`, `--remove-login`, `--login-changed`): a key slot
/// opened by the user's login password, for pam_mtmfs.so to unlock with at login.
enum LoginSlot {
    /// Adds (or replaces) or removes it; the data directory unmounted, the passphrase asked.
    static func change(_ vault: Vault, dataDirectory: String, remove: Bool, passphraseFile: String?,
                       passwordFile: String?) throws(CommandFailure) {
        try UnmountedVault.unlock(vault, passphraseFile: passphraseFile)
        defer { vault.lock() }
        if remove {
            guard vault.hasSlot(.login) else { throw CommandFailure("\(dataDirectory) has no login slot", exitCode: ExitCode.noMatch) }
            do { try vault.removeSlots(.login) } catch { throw CommandFailure(error.description) }
            print("The login slot of \(dataDirectory) is removed: the login password no longer unlocks.")
            return
        }
        if passwordFile == nil && Terminal.isInteractive {
            Terminal.error("Your login password will unlock these accounts too: whoever knows it can read them.")
        }
        let password = try PassphraseInput.read(prompt: "Login password: ", file: passwordFile)
        defer { password.wipe() }
        if passwordFile == nil && Terminal.isInteractive {
            let again = try PassphraseInput.read(prompt: "Repeat the login password: ", file: nil)
            defer { again.wipe() }
            guard password.equals(again) else { throw CommandFailure("the two passwords differ; nothing was changed") }
        }
        do {
            try Progress.whileWorking("deriving the login slot's key") {
                Result { () throws(VaultError) in try vault.addSlot(.login, secret: password, parameters: vault.kdfParameters) }
            }.get()
        } catch {
            throw CommandFailure(error.description)
        }
        print("The login password now unlocks \(dataDirectory) too (with pam_mtmfs.so at login; see mtmfs(1)).")
    }

    /// The old and the new login password, two lines: through the mount when one serves the
    /// data directory (its daemon writes the slot), else on the folder itself.
    static func passwordChanged(_ dataDirectory: String) throws(CommandFailure) {
        let old = try PassphraseInput.read(prompt: "Old login password: ", file: nil)
        defer { old.wipe() }
        let new = try PassphraseInput.read(prompt: "New login password: ", file: nil)
        defer { new.wipe() }
        let noSlot = CommandFailure("the old login password opens no login slot of \(dataDirectory) (none made with `mtmfs passwd --login`?)",
                                    exitCode: ExitCode.noMatch)
        if let mount = MountTable.ownMount(of: dataDirectory) {
            let request: SecureBytes
            do throws(Errno) {
                request = try old.copy()
                try request.append(Array("\n".utf8))
                try new.withUnsafeBytes { (raw) throws(Errno) in try request.append(raw) }
            } catch {
                throw CommandFailure("no secure memory for the passwords: \(error)")
            }
            defer { request.wipe() }
            switch try ControlFile.write(mount.mountPoint, "login-changed", request) {
            case nil: return
            case .permissionDenied?: throw noSlot
            case let error?: throw CommandFailure("the login slot could not follow: \(error)")
            }
        }
        let (vault, claim) = try UnmountedVault.open(dataDirectory, holder: "mtmfs passwd --login-changed")
        defer { withExtendedLifetime(claim) {} }
        do {
            let prepared = try vault.prepareLoginChange(old: old, new: new)
            defer {
                prepared.key.wipe()
                prepared.slot.kek.wipe()
            }
            try vault.addSlot(prepared.slot, key: prepared.key)
        } catch {
            throw error == .wrongPassphrase ? noSlot : CommandFailure(error.description)
        }
    }
}
