#if canImport(Glibc)
import Glibc
#endif
import CredentialVault
import MountedTree
import Posix
import ScriptCommands
import SecureMemory

/// `mtmfs recovery-key`: a key slot opened by 128 random bits shown once, for the day the
/// passphrase is forgotten (SPEC §3). A new one retires the one before.
struct RecoveryKeyCommand: Command {
    static let name = "recovery-key"
    static let abstract = "make a recovery key: shown once, it opens the vault if the passphrase is lost"
    static let usage = """
    Usage: mtmfs recovery-key [--data-dir DIR] [--passphrase-file FILE]

    Asks for the passphrase, then shows a new recovery key once: 32 letters in groups of
    four. Write it down and keep it apart from this computer: whoever has it can open the
    vault, as with the passphrase. `mtmfs unlock --recovery-key` unlocks with it and
    `mtmfs passwd --recovery-key` sets a new passphrase with it. A new recovery key
    replaces the one before, which then opens nothing. The data directory must not be
    mounted (as for `mtmfs passwd`).
    """
    static let flags: Set<String> = []
    static let options: Set<String> = ["--data-dir", "--passphrase-file"]

    let dataDirectory: String
    let passphraseFile: String?

    init(_ arguments: Arguments) throws(CommandFailure) {
        _ = try arguments.positionals(0...0, named: "")
        dataDirectory = Paths.dataDirectory(arguments.value("--data-dir"))
        passphraseFile = arguments.value("--passphrase-file")
    }

    func run() throws(CommandFailure) {
        let (vault, claim) = try UnmountedVault.open(dataDirectory, holder: "mtmfs recovery-key")
        defer { withExtendedLifetime(claim) {} }
        try UnmountedVault.unlock(vault, passphraseFile: passphraseFile)
        defer { vault.lock() }
        let key: SecureBytes, text: SecureBytes
        do throws(Errno) {
            key = try RecoveryKey.generate()
            text = try RecoveryKey.text(of: key)
        } catch {
            throw CommandFailure("no secure memory for the recovery key: \(error)")
        }
        defer {
            key.wipe()
            text.wipe()
        }
        do {
            try Progress.whileWorking("deriving the recovery key's slot") {
                Result { () throws(VaultError) in try vault.addSlot(.recovery, secret: key, parameters: vault.kdfParameters) }
            }.get()
        } catch {
            throw CommandFailure(error.description)
        }
        // The letters go from secure memory to standard output, never through a String (nor
        // stdio's buffer: every part is written to the descriptor itself).
        let before = "The recovery key of \(dataDirectory), shown this once:\n\n    "
        let after = """


        Write it down and keep it apart from this computer: it opens the vault as the
        passphrase does. `mtmfs unlock --recovery-key` unlocks with it; `mtmfs passwd
        --recovery-key` sets a new passphrase with it. A new recovery key replaces this one.

        """
        do throws(Errno) {
            try Syscall.writeAll(1, Array(before.utf8))
            try text.withUnsafeBytes { (raw) throws(Errno) in try Syscall.writeAll(1, raw) }
            try Syscall.writeAll(1, Array(after.utf8))
        } catch {
            throw CommandFailure("the recovery key is made but could not be shown (\(error)): run `mtmfs recovery-key` again to replace it")
        }
    }
}
