#if canImport(Glibc)
import Glibc
#endif
import CredentialVault
import ScriptCommands
import MountedTree
import Posix

/// `mtmfs init`: creates a data directory with empty stores.
struct InitCommand: Command {
    static let name = "init"
    static let abstract = "create a data directory with empty stores"
    static let usage = """
    Usage: mtmfs init [--data-dir DIR] [--kdf interactive|moderate|sensitive] [--guard] [--passphrase-file FILE]
                      [--weak-passphrase]
           mtmfs init --from URL [--data-dir DIR] [--passphrase-file FILE]

    Creates DIR (mode 0700) with an empty credential vault (a folder, made a git repository
    when git is installed: see `mtmfs sync`), the default Settings.plist and an empty
    cache.sqlite. Asks for the vault's new passphrase twice without echo on a terminal,
    reads one line from standard input otherwise, or the first line of FILE. A directory
    that already holds a store is left alone (exit 1). A weak passphrase (under 2^27
    guesses by a zxcvbn-like estimate: common passwords and words, years, runs, repeats) is
    refused unless --weak-passphrase is given.

    With --from, the vault is a clone of the git repository at URL (another machine's,
    after its `mtmfs sync`): the passphrase asked for, once, is that vault's, and is
    checked; this machine gets a device id of its own. Settings and cache start empty.

    Options:
      --data-dir DIR          where the stores live (default $XDG_DATA_HOME/mtmfs,
                              else ~/.local/share/mtmfs)
      --kdf LEVEL             Argon2id cost: interactive, moderate (default), sensitive
      --guard                 guard the accounts from the start: a password goes only
                              to the programs trusted with its account (mtmfs guard)
      --passphrase-file FILE  read the passphrase from FILE's first line
      --from URL              clone the vault of another machine from its git remote
      --weak-passphrase       take a passphrase the estimate finds weak
    """
    static let flags: Set<String> = ["--guard", "--weak-passphrase"]
    static let options: Set<String> = ["--data-dir", "--kdf", "--passphrase-file", "--from"]

    let dataDirectory: DataDirectory
    let kdf: KDFParameters
    let passphraseFile: String?
    let guarded: Bool
    let from: String?
    let weakAllowed: Bool

    init(_ arguments: Arguments) throws(CommandFailure) {
        _ = try arguments.positionals(0...0, named: "")
        dataDirectory = DataDirectory(path: Paths.dataDirectory(arguments.value("--data-dir")))
        guard let kdf = KDFParameters.named(arguments.value("--kdf") ?? "moderate") else {
            throw .usage("--kdf takes interactive, moderate or sensitive", command: Self.name)
        }
        self.kdf = kdf
        passphraseFile = arguments.value("--passphrase-file")
        guarded = arguments.has("--guard")
        from = arguments.value("--from")
        weakAllowed = arguments.has("--weak-passphrase")
        if from != nil, arguments.value("--kdf") != nil || guarded {
            throw .usage("--from takes the vault as it is: no --kdf or --guard", command: Self.name)
        }
    }

    func run() throws(CommandFailure) {
        // Before any passphrase is asked: a store already there (or mounted) is refused now.
        do { try dataDirectory.checkInitializable() } catch { throw CommandFailure(error.description) }
        if let from { return try clone(from) }
        let passphrase = try PassphraseInput.readNew(file: passphraseFile)
        defer { passphrase.wipe() }
        try PassphraseStrength.require(passphrase, allowed: weakAllowed)
        let result = Progress.whileWorking("deriving the key from the passphrase") {
            Result { () throws(DataDirectoryError) in try dataDirectory.initialize(passphrase: passphrase, kdf: kdf, guarded: guarded) }
        }
        do {
            try result.get()
        } catch {
            throw CommandFailure(error.description)
        }
        makeRepository()
        print("Initialized an mtmfs store in \(dataDirectory.path)" + (guarded ? " (guarded: see `mtmfs trust --help`)" : ""))
    }

    /// The vault folder becomes a git repository when git is installed (else `mtmfs sync`
    /// makes it one later).
    func makeRepository() {
        guard VaultRepository.gitIsInstalled else { return }
        do {
            try VaultRepository(folder: dataDirectory.vaultPath).initialize()
        } catch {
            Terminal.error("mtmfs: \(error.description) (`mtmfs sync` tries again)")
        }
    }

    /// `--from URL`: the vault cloned, opened with its passphrase, then the other stores.
    func clone(_ url: String) throws(CommandFailure) {
        guard VaultRepository.gitIsInstalled else { throw CommandFailure("mtmfs init --from needs git, which is not installed (apt install git)") }
        let passphrase = try PassphraseInput.read(prompt: "Passphrase of the vault at \(url): ", file: passphraseFile)
        defer { passphrase.wipe() }
        let directory = dataDirectory
        let result = Result { () throws(DataDirectoryError) in
            try directory.initialize { (vaultPath) throws(DataDirectoryError) in
                func discard() {
                    _ = Spawn.run("rm", ["-rf", "--", vaultPath])
                    try? Syscall.unlink(directory.path + "/device")
                }
                let cloned = Progress.whileWorking("cloning \(url)") {
                    Spawn.output("env", ["GIT_TERMINAL_PROMPT=0", "LC_ALL=C", "git", "-c", "core.hooksPath=/dev/null",
                                         "clone", "-q", "--template=", "--", url, vaultPath])
                }
                guard cloned.status == 0 else {
                    discard()
                    throw .cannotCreate(directory.path, "cannot clone \(url): \(VaultRepository.lastLine(cloned.output))")
                }
                // A bare remote whose HEAD names another branch than the one pushed (git's
                // default `master`, mtmfs's `main`): the clone checked out nothing.
                let repository = VaultRepository(folder: vaultPath)
                if (try? Syscall.lstat(vaultPath + "/id")) == nil {
                    let branches = repository.git(["for-each-ref", "--format=%(refname:short)", "refs/remotes/origin"]).output
                        .split(separator: "\n").map(String.init).filter { $0 != "origin/HEAD" && $0 != "origin" }
                    if let branch = branches.first(where: { $0 == "origin/main" }) ?? branches.first {
                        _ = repository.git(["checkout", "-q", "-B", String(branch.dropFirst("origin/".count)), "--track", branch])
                    }
                }
                // git syncs neither the files it checks out nor (by default) its objects.
                if let problem = repository.makeDurable() {
                    discard()
                    throw .cannotCreate(directory.path, problem)
                }
                do throws(VaultError) {
                    guard Vault.isFolder(vaultPath), (try? Syscall.lstat(vaultPath + "/id")) != nil else {
                        throw .damaged("\(url) holds no mtmfs vault (no id file)")
                    }
                    let vault = try Vault(path: vaultPath)
                    try Progress.whileWorking("deriving the key from the passphrase") {
                        Result { () throws(VaultError) in try vault.unlock(passphrase: passphrase) }
                    }.get()
                    vault.lock()
                    try? repository.writeExclusions()
                } catch {
                    discard()
                    throw .cannotCreate(directory.path, error == .wrongPassphrase ? "wrong passphrase for the vault at \(url)" : error.description)
                }
            }
        }
        do {
            try result.get()
        } catch {
            throw CommandFailure(error.description)
        }
        print("Initialized an mtmfs store in \(dataDirectory.path) with the vault of \(url)")
    }
}
