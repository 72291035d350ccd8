#if canImport(Glibc)
import Glibc
#endif
import CredentialVault
import ScriptCommands
import SecureMemory
import MountedTree
import Posix

/// `mtmfs guard on|off`: whether a password goes only to the programs trusted with its
/// account (SPEC §3a). Sealed in the vault; needs the passphrase.
struct GuardCommand: Command {
    static let name = "guard"
    static let abstract = "turn guarding on or off: passwords only for trusted programs"
    static let usage = """
    Usage: mtmfs guard on|off [--passphrase-file FILE] [MOUNT]

    With guarding on, opening an account's password, writing any of its fields and
    removing it need the requesting program to be trusted with the account (see
    `mtmfs trust`); another program makes the mount ask through its pinentry (Allow once,
    Always allow, Deny). The setting is sealed in the vault, so it needs the passphrase
    (asked as `mtmfs unlock` asks it); a locked mount is unlocked with it first. A wrong
    passphrase exits 1 and changes nothing. MOUNT may be left out when one mtmfs mount
    is up.
    """
    static let flags: Set<String> = []
    static let options: Set<String> = ["--passphrase-file"]

    let on: Bool
    let mountPoint: String
    let passphraseFile: String?

    init(_ arguments: Arguments) throws(CommandFailure) {
        let positionals = try arguments.positionals(1...2, named: "on or off")
        guard positionals[0] == "on" || positionals[0] == "off" else {
            throw .usage("say on or off (mtmfs guard on|off [MOUNT])", command: Self.name)
        }
        on = positionals[0] == "on"
        mountPoint = try MountChoice.resolve(positionals.count > 1 ? positionals[1] : nil)
        passphraseFile = arguments.value("--passphrase-file")
    }

    func run() throws(CommandFailure) {
        let passphrase = try PassphraseInput.read(prompt: "Passphrase for \(mountPoint): ", file: passphraseFile)
        defer { passphrase.wipe() }
        try ControlCommand.unlockIfLocked(mountPoint, passphrase)
        try Progress.whileWorking("checking the passphrase") {
            Result { () throws(CommandFailure) in
                try ControlCommand.send(mountPoint, file: "guard", words: [on ? "on" : "off"], passphrase: passphrase,
                                        refused: "wrong passphrase; guarding is unchanged")
            }
        }.get()
        print(on ? "Guarding is on for \(mountPoint): a password goes only to the programs trusted with its account."
                 : "Guarding is off for \(mountPoint): every program of yours reads every password while unlocked.")
    }
}

/// `mtmfs trust` and `mtmfs untrust`: an account's trusted programs.
struct TrustCommand: Command {
    static let name = "trust"
    static let abstract = "trust programs with an account's password (guarded vaults)"
    static let usage = """
    Usage: mtmfs trust [--passphrase-file FILE] ACCOUNT_DIR PROGRAM…

    Adds each PROGRAM (a path, or a name found in PATH) to the trusted programs of the
    account ACCOUNT_DIR (MOUNT/accounts/UUID, or a link to it in by-server/ or by-label/):
    it may then read the password and change the fields without being asked. A program is
    known by its content's SHA-256: a new version of it is asked about again. An
    interpreter (sh, python3, …) trusted runs every script with that trust. Needs the
    passphrase (so that no program can trust itself); a wrong one exits 1 and changes
    nothing. The list is MOUNT/accounts/UUID/trusted.
    """
    static let flags: Set<String> = []
    static let options: Set<String> = ["--passphrase-file"]

    let account: (mountPoint: String, name: String)
    let programs: [String]
    let passphraseFile: String?

    init(_ arguments: Arguments) throws(CommandFailure) {
        try self.init(arguments, command: Self.name, mustExist: true)
    }

    init(_ arguments: Arguments, command: String, mustExist: Bool) throws(CommandFailure) {
        let positionals = try arguments.positionals(2...Int.max, named: "an account directory and a program")
        account = try ControlCommand.account(positionals[0])
        programs = try positionals.dropFirst().map { (name) throws(CommandFailure) in
            try ControlCommand.program(name, mustExist: mustExist)
        }
        passphraseFile = arguments.value("--passphrase-file")
    }

    func run() throws(CommandFailure) {
        try change(adding: true)
        for program in programs { print("Trusted with \(account.name): \(program)") }
    }

    func change(adding: Bool) throws(CommandFailure) {
        let passphrase = try PassphraseInput.read(prompt: "Passphrase for \(account.mountPoint): ", file: passphraseFile)
        defer { passphrase.wipe() }
        try ControlCommand.unlockIfLocked(account.mountPoint, passphrase)
        try Progress.whileWorking("checking the passphrase") {
            Result { () throws(CommandFailure) in
                try ControlCommand.send(account.mountPoint, file: "trust", words: [adding ? "trust" : "untrust", account.name] + programs,
                                        passphrase: passphrase, refused: "wrong passphrase; the trusted programs are unchanged")
            }
        }.get()
    }
}

struct UntrustCommand: Command {
    static let name = "untrust"
    static let abstract = "take programs off an account's trusted list"
    static let usage = """
    Usage: mtmfs untrust [--passphrase-file FILE] ACCOUNT_DIR PROGRAM…

    Removes each PROGRAM from the trusted programs of ACCOUNT_DIR: the entries of its
    path, and those of its current content's SHA-256. Needs the passphrase; a wrong one
    exits 1 and changes nothing.
    """
    static let flags: Set<String> = []
    static let options: Set<String> = ["--passphrase-file"]

    let trust: TrustCommand

    init(_ arguments: Arguments) throws(CommandFailure) {
        trust = try TrustCommand(arguments, command: Self.name, mustExist: false)
    }

    func run() throws(CommandFailure) {
        try trust.change(adding: false)
        for program in trust.programs { print("No longer trusted with \(trust.account.name): \(program)") }
    }
}

/// Writing a command with its passphrase to a mount's control file.
enum ControlCommand {
    /// Guarding and trust change a sealed vault: a locked mount is unlocked first.
    static func unlockIfLocked(_ mountPoint: String, _ passphrase: SecureBytes) throws(CommandFailure) {
        guard StatusFile.read(mountPoint: mountPoint)["state"] != "unlocked" else { return }
        try Progress.whileWorking("deriving the key from the passphrase") {
            Result { () throws(CommandFailure) in try PassphraseInput.unlock(mountPoint: mountPoint, with: passphrase) }
        }.get()
        print("Unlocked the accounts of \(mountPoint).")
    }

    /// Writes "WORD\tWORD…\nPASSPHRASE" in one write, composed in secure memory.
    static func send(_ mountPoint: String, file: String, words: [String], passphrase: SecureBytes,
                     refused: String) throws(CommandFailure) {
        let message = SecureBytes()
        defer { message.wipe() }
        do throws(Errno) {
            try message.append(Array((words.joined(separator: "\t") + "\n").utf8))
            try passphrase.withUnsafeBytes { (raw) throws(Errno) in try message.append(raw) }
        } catch {
            throw CommandFailure("no secure memory for the passphrase: \(error)")
        }
        switch try ControlFile.write(mountPoint, file, message) {
        case nil: return
        case .permissionDenied?: throw CommandFailure(refused)
        case .noSuchFileOrDirectory?: throw CommandFailure("no such account or program (see the mount's log)")
        case .invalidArgument?: throw CommandFailure("refused: not a regular file, or a malformed request")
        case let error?: throw CommandFailure("\(file) failed: \(error)")
        }
    }

    /// MOUNT/accounts/NAME from an account directory (or a view's link to one).
    static func account(_ given: String) throws(CommandFailure) -> (mountPoint: String, name: String) {
        guard let path = Paths.resolved(Paths.absolute(given)) else { throw CommandFailure("\(given): no such account directory") }
        var parts = path.split(separator: "/", omittingEmptySubsequences: true).map(String.init)
        guard parts.count >= 2, let name = parts.popLast(), parts.popLast() == "accounts", AccountName.uuidBytes(name) != nil else {
            throw CommandFailure("\(given) is not an account directory (MOUNT/accounts/UUID)")
        }
        let mountPoint = "/" + parts.joined(separator: "/")
        guard MountTable.mtmfsMount(at: mountPoint) != nil else {
            throw CommandFailure("\(given) is not in an mtmfs mount (\(mountPoint) is not one)")
        }
        return (mountPoint, name)
    }

    /// A program's full path: as given when it holds a slash, else found in PATH; links
    /// resolved (the file the kernel runs is what is hashed).
    static func program(_ given: String, mustExist: Bool) throws(CommandFailure) -> String {
        var candidate: String?
        if given.contains("/") {
            candidate = Paths.absolute(given)
        } else {
            let path = getenv("PATH").map { String(cString: $0) } ?? "/usr/local/bin:/usr/bin:/bin"
            for directory in path.split(separator: ":") where !directory.isEmpty {
                let full = String(directory) + "/" + given
                if (try? Syscall.access(full, X_OK)) != nil { candidate = full; break }
            }
        }
        guard let candidate else { throw CommandFailure("\(given): no such program in PATH") }
        guard !candidate.contains("\t") && !candidate.contains("\n") else {
            throw CommandFailure("\(given): a program path with a tab or a newline cannot be trusted")
        }
        if let resolved = Paths.resolved(candidate) {
            guard let st = try? Syscall.stat(resolved), st.st_mode & S_IFMT == S_IFREG else {
                throw CommandFailure("\(given) is not a program (not a regular file)")
            }
            return resolved
        }
        guard !mustExist else { throw CommandFailure("\(given): no such program") }
        return candidate
    }
}
