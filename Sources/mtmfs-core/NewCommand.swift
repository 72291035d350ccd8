#if canImport(Glibc)
import Glibc
#endif
import CredentialVault
import ScriptCommands
import Posix
import SecureMemory

/// `mtmfs new`: an account in one step, through the mount (as `mkdir` and `echo` would
/// make it: guarding trusts the program that runs `mtmfs new` with it), its password made
/// by `mtmfs generate`'s rules when asked.
struct NewCommand: Command {
    static let name = "new"
    static let abstract = "make an account (label, url, username; a generated password)"
    static let usage = """
    Usage: mtmfs new [--mount MOUNT] --label L [--url U] [--username N] [--comment C]
                     [--generate [--length N] [--no-symbols] | [--words N]]

    Makes an account in the unlocked mount and prints its directory. --generate sets its
    password to a new one (as `mtmfs generate` makes it; its strength goes to standard
    error); read it with `mtmfs read mtmfs://UUID/password`. A value the field refuses (a
    URL that is none) is an error and leaves no account behind.

    Exit status: 0 made; 5 locked; 6 no mount; 7 guarding refused; 2 wrong command line or
    value; 1 anything else.
    """
    static let flags: Set<String> = ["--generate", "--no-symbols"]
    static let options: Set<String> = ["--mount", "--label", "--url", "--username", "--comment", "--length", "--words"]

    let arguments: Arguments
    let fields: [(String, String)]

    init(_ arguments: Arguments) throws(CommandFailure) {
        _ = try arguments.positionals(0...0, named: "")
        guard arguments.value("--label") != nil else { throw .usage("--label is needed", command: Self.name) }
        let given = ["label", "url", "username", "comment"].compactMap { name in arguments.value("--" + name).map { (name, $0) } }
        if given.contains(where: { $0.1.contains("\n") }) { throw .usage("a value cannot hold a newline", command: Self.name) }
        if !arguments.has("--generate") && (arguments.value("--length") != nil || arguments.value("--words") != nil) {
            throw .usage("--length and --words go with --generate", command: Self.name)
        }
        self.arguments = arguments
        fields = given
    }

    func run() throws(CommandFailure) {
        let mountPoint = try MountChoice.resolve(arguments.value("--mount"))
        let generated = arguments.has("--generate") ? try PasswordGenerator.make(arguments, command: Self.name) : nil
        defer { generated?.0.wipe() }
        let uuid = AccountName.string(Self.randomUUID())
        let directory = mountPoint + "/accounts/" + uuid
        do {
            try Syscall.mkdir(directory, mode: 0o700)
        } catch {
            throw Self.failure(error, "make the account", mountPoint: mountPoint)
        }
        do throws(CommandFailure) {
            for (name, value) in fields {
                try Self.write(Array((value + "\n").utf8), to: directory + "/" + name, mountPoint: mountPoint)
            }
            if let (password, _, _) = generated {
                do throws(Errno) { try password.append([0x0A]) } catch { throw CommandFailure("no secure memory for the password (\(error))") }
                try password.withUnsafeBytes { (bytes) throws(CommandFailure) in try Self.write(bytes, to: directory + "/password", mountPoint: mountPoint) }
            }
        } catch {
            // Nothing half made stays (removed by this process: the one guarding trusts with it).
            Self.remove(directory)
            throw error
        }
        print(directory)
        if let (_, bits, what) = generated { Terminal.error("mtmfs new: a password of about \(Int(bits)) bits (\(what))") }
    }

    /// Removes an account directory as `rm -r` does: its files, then the directory.
    static func remove(_ directory: String) {
        for name in (try? Syscall.listDirectory(directory)) ?? [] {
            let path = directory + "/" + name
            if (try? Syscall.lstat(path)).map({ $0.st_mode & S_IFMT == S_IFDIR }) == true {
                for inner in (try? Syscall.listDirectory(path)) ?? [] { try? Syscall.unlink(path + "/" + inner) }
                try? Syscall.removeDirectory(path)
            } else {
                try? Syscall.unlink(path)
            }
        }
        try? Syscall.removeDirectory(directory)
    }

    /// A random (version 4) UUID from libsodium's randomness.
    static func randomUUID() -> [UInt8] {
        var bytes = Sodium.randomBytes(16)
        bytes[6] = bytes[6] & 0x0F | 0x40
        bytes[8] = bytes[8] & 0x3F | 0x80
        return bytes
    }

    static func write(_ bytes: [UInt8], to path: String, mountPoint: String) throws(CommandFailure) {
        let result = bytes.withUnsafeBytes { raw in Result { () throws(CommandFailure) in try write(raw, to: path, mountPoint: mountPoint) } }
        try result.get()
    }

    static func write(_ bytes: UnsafeRawBufferPointer, to path: String, mountPoint: String) throws(CommandFailure) {
        let name = String(path.split(separator: "/").last ?? "")
        do throws(Errno) {
            let fd = try Syscall.open(path, O_WRONLY | O_CREAT | O_TRUNC, mode: 0o600)
            defer { Syscall.close(fd) }
            try Syscall.writeAll(fd, bytes)
            try Syscall.fsync(fd)
        } catch {
            throw failure(error, "write \(name)", mountPoint: mountPoint)
        }
    }

    static func failure(_ error: Errno, _ what: String, mountPoint: String) -> CommandFailure {
        switch error {
        case .invalidArgument: return CommandFailure("cannot \(what): the field refuses that value (EINVAL)", exitCode: ExitCode.usage)
        case .permissionDenied:
            if StatusFile.read(mountPoint: mountPoint)["state"] == "locked" {
                return CommandFailure("the accounts of \(mountPoint) are locked: run `mtmfs unlock \(mountPoint)`", exitCode: ExitCode.locked)
            }
            return CommandFailure("guarding refused to \(what) (see \(mountPoint)/.mtmfs/access)", exitCode: ExitCode.refused)
        default: return CommandFailure("cannot \(what) in \(mountPoint): \(error)")
        }
    }
}
