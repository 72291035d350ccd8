import CredentialVault
import MountedTree

/// `mtmfs init`: creates a data directory with empty stores.
struct InitCommand: Command {
    static let name = "init"
    static let abstract = "create a data directory with empty stores"
    static let usage = """
    Usage: mtmfs init [--data-dir DIR] [--kdf interactive|moderate|sensitive] [--guard] [--passphrase-file FILE]

    Creates DIR (mode 0700) with an empty credential vault, the default Settings.plist and
    an empty cache.sqlite. Asks for the vault's new passphrase twice without echo on a
    terminal, reads one line from standard input otherwise, or the first line of FILE.
    A directory that already holds a store is left alone (exit 1).

    Options:
      --data-dir DIR          where the stores live (default $XDG_DATA_HOME/mtmfs,
                              else ~/.local/share/mtmfs)
      --kdf LEVEL             Argon2id cost: interactive, moderate (default), sensitive
      --guard                 guard the accounts from the start: a password goes only
                              to the programs trusted with its account (mtmfs guard)
      --passphrase-file FILE  read the passphrase from FILE's first line
    """
    static let flags: Set<String> = ["--guard"]
    static let options: Set<String> = ["--data-dir", "--kdf", "--passphrase-file"]

    let dataDirectory: DataDirectory
    let kdf: KDFParameters
    let passphraseFile: String?
    let guarded: Bool

    init(_ arguments: Arguments) throws(CommandFailure) {
        _ = try arguments.positionals(0...0, named: "")
        dataDirectory = DataDirectory(path: Paths.dataDirectory(arguments.value("--data-dir")))
        guard let kdf = KDFParameters.named(arguments.value("--kdf") ?? "moderate") else {
            throw .usage("--kdf takes interactive, moderate or sensitive", command: Self.name)
        }
        self.kdf = kdf
        passphraseFile = arguments.value("--passphrase-file")
        guarded = arguments.has("--guard")
    }

    func run() throws(CommandFailure) {
        let passphrase = try PassphraseInput.readNew(file: passphraseFile)
        defer { passphrase.wipe() }
        let result = Progress.whileWorking("deriving the key from the passphrase") {
            Result { () throws(DataDirectoryError) in try dataDirectory.initialize(passphrase: passphrase, kdf: kdf, guarded: guarded) }
        }
        do {
            try result.get()
        } catch {
            throw CommandFailure(error.description)
        }
        print("Initialized an mtmfs store in \(dataDirectory.path)" + (guarded ? " (guarded: see `mtmfs trust --help`)" : ""))
    }
}
