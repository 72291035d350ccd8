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
    Usage: mtmfs unlock [--recovery-key] [--passphrase-file FILE] [MOUNT]

    Asks for the passphrase without echo on a terminal, or reads one line from standard
    input, or the first line of FILE. MOUNT may be left out when one mtmfs mount is up.
    A wrong passphrase exits 1. The passphrase never goes on a command line or into the
    environment.
    --recovery-key asks for the recovery key (`mtmfs recovery-key`) in its place.
    """
    static let flags: Set<String> = ["--recovery-key"]
    static let options: Set<String> = ["--passphrase-file"]

    let mountPoint: String
    let passphraseFile: String?
    let kind: SlotKind

    init(_ arguments: Arguments) throws(CommandFailure) {
        mountPoint = try MountChoice.resolve(try arguments.positionals(0...1, named: "").first)
        passphraseFile = arguments.value("--passphrase-file")
        kind = arguments.has("--recovery-key") ? .recovery : .passphrase
    }

    func run() throws(CommandFailure) {
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
    """
    static let flags: Set<String> = ["--weak-passphrase", "--recovery-key"]
    static let options: Set<String> = ["--data-dir", "--kdf", "--passphrase-file", "--new-passphrase-file"]

    let dataDirectory: String
    let kdf: KDFParameters?
    let currentFile: String?
    let newFile: String?
    let weakAllowed: Bool
    let withRecoveryKey: Bool

    init(_ arguments: Arguments) throws(CommandFailure) {
        _ = try arguments.positionals(0...0, named: "")
        weakAllowed = arguments.has("--weak-passphrase")
        withRecoveryKey = arguments.has("--recovery-key")
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
        // Held until the new wrapping is written: no mount may start on the old file meanwhile.
        var (vault, claim) = try UnmountedVault.open(dataDirectory, holder: "mtmfs passwd")
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
        let typed = try RecoveryKeyInput.read(prompt: "Recovery key: ", file: file)
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
