import MountedTree
import ScriptCommands
import Posix

/// `mtmfs mount`: mounts a data directory; returns once the mount answers.
struct MountCommand: Command {
    static let name = "mount"
    static let abstract = "mount a data directory (returns once the mount is ready)"
    static let usage = """
    Usage: mtmfs mount [--data-dir DIR] [-f] [-o OPTIONS] [--unlock [--passphrase-file FILE]]
                       [--auto-lock SECONDS] [--cache-limit BYTES] [--pinentry PROGRAM]
                       [--secret-service[=replace]] [--lock-on-sleep] [--lock-with-screen]
                       [--debug] MOUNT

    Mounts the stores of DIR on the empty directory MOUNT. Without -f the daemon detaches,
    logs to syslog, and this command returns only once MOUNT answers, so the next line of a
    script can use it. The daemon unmounts cleanly on SIGTERM, SIGINT and SIGHUP.

    Options:
      --data-dir DIR   the data directory (default $XDG_DATA_HOME/mtmfs)
      -f               stay in the foreground, log to standard error
      -o OPTIONS       FUSE mount options, comma-separated (e.g. allow_other)
      --unlock         ask for the passphrase now and unlock once mounted
      --passphrase-file FILE   with --unlock: read it from FILE's first line
      --auto-lock SECONDS      lock after this long without a secret access
                               (default 900; 0 never)
      --cache-limit BYTES      keep cache/ under this size (K, M, G suffixes):
                               least recently used closed files are removed
      --pinentry PROGRAM       what asks whether a program may read a password, on
                               a guarded vault (GnuPG's pinentry protocol; default
                               pinentry, on the requester's terminal or the desktop)
      --secret-service[=replace]  also serve the accounts to desktop programs on the
                       session bus (org.freedesktop.secrets); =replace takes the
                       name from its owner where it allows (-o secret_service)
      --lock-on-sleep  lock the accounts when the system suspends or hibernates
                       (logind's PrepareForSleep; -o lock_on_sleep)
      --lock-with-screen  lock the accounts when this user's session is locked
                       (logind's Lock: a screen locker, loginctl lock-session;
                       -o lock_with_screen)
      --debug          log every request (operation, inode, caller, result) and
                       store event; names and values are never logged
    """
    /// (`--discard-data-dir`: the demo's daemon removes its throwaway data directory when
    /// the mount ends; set only by `mtmfs demo`.)
    static let flags: Set<String> = ["-f", "--foreground", "--unlock", "--debug", "--secret-service", "--discard-data-dir",
                                     "--lock-on-sleep", "--lock-with-screen"]
    static let options: Set<String> = ["--data-dir", "-o", "--ready-fd", "--auto-lock", "--passphrase-file", "--cache-limit", "--pinentry",
                                       "--secret-service"]

    let dataDirectory: String
    let mountPoint: String
    let options: [String]
    let foreground: Bool
    /// Set only in the daemon that `mtmfs mount` starts (see `Daemon`).
    let readyFD: Int32?
    let autoLockSeconds: Int
    let discardDataDirectory: Bool
    let unlock: Bool
    let passphraseFile: String?
    let cacheLimit: Int64?
    let debug: Bool
    let pinentry: String

    init(_ arguments: Arguments) throws(CommandFailure) {
        let positionals = try arguments.positionals(1...1, named: "the mount point (mtmfs mount MOUNT)")
        dataDirectory = Paths.dataDirectory(arguments.value("--data-dir"))
        var options = arguments.allValues("-o").flatMap { $0.split(separator: ",").map(String.init) }
        // --secret-service travels to the daemon as its -o option.
        if let mode = arguments.value("--secret-service") {
            guard mode == "replace" else { throw .usage("--secret-service takes no value but replace", command: Self.name) }
            options.append("secret_service=replace")
        } else if arguments.has("--secret-service") {
            options.append("secret_service")
        }
        // So do --lock-on-sleep and --lock-with-screen.
        if arguments.has("--lock-on-sleep") { options.append("lock_on_sleep") }
        if arguments.has("--lock-with-screen") { options.append("lock_with_screen") }
        guard options.allSatisfy({ !$0.hasPrefix("secret_service") || $0 == "secret_service" || $0 == "secret_service=replace" }) else {
            throw .usage("-o secret_service takes no value but replace", command: Self.name)
        }
        self.options = options
        foreground = arguments.has("-f") || arguments.has("--foreground")
        guard let seconds = Int(arguments.value("--auto-lock") ?? "900"), seconds >= 0 else {
            throw .usage("--auto-lock takes a number of seconds (0: never)", command: Self.name)
        }
        autoLockSeconds = seconds
        discardDataDirectory = arguments.has("--discard-data-dir")
        unlock = arguments.has("--unlock")
        debug = arguments.has("--debug")
        pinentry = arguments.value("--pinentry") ?? "pinentry"
        guard !pinentry.isEmpty else { throw .usage("--pinentry takes a program", command: Self.name) }
        passphraseFile = arguments.value("--passphrase-file")
        if let text = arguments.value("--cache-limit") {
            guard let bytes = Self.byteCount(text) else {
                throw .usage("--cache-limit takes a size in bytes, e.g. 500M", command: Self.name)
            }
            cacheLimit = bytes
        } else {
            cacheLimit = nil
        }
        if let fd = arguments.value("--ready-fd") {
            guard let number = Int32(fd) else { throw .usage("--ready-fd takes a number", command: Self.name) }
            readyFD = number
            mountPoint = positionals[0]  // already checked by the parent
        } else {
            readyFD = nil
            mountPoint = try MountPointCheck.validate(positionals[0])
        }
    }

    func run() throws(CommandFailure) {
        if debug { Log.enableDebug() }
        if readyFD != nil || foreground {
            if readyFD == nil {
                do {
                    try DataDirectory(path: dataDirectory).check()
                } catch {
                    throw CommandFailure(error.description)
                }
            }
            defer {
                // The demo's data directory goes with its mount (never another: /tmp's demo names only).
                if discardDataDirectory, dataDirectory.hasPrefix("/tmp/mtmfs-demo-data.") {
                    _ = Spawn.run("rm", ["-rf", "--", dataDirectory])
                }
            }
            try Daemon.serve(dataDirectory: dataDirectory, mountPoint: mountPoint, options: options,
                             autoLockSeconds: autoLockSeconds, cacheLimit: cacheLimit, pinentry: pinentry, readyFD: readyFD)
            return
        }
        do {
            try DataDirectory(path: dataDirectory).check()
            // Said before a passphrase is asked for; the daemon takes the claim itself.
            try DataDirectoryClaim.checkFree(DataDirectory(path: dataDirectory))
        } catch {
            throw CommandFailure(error.description)
        }
        try MountTable.refuseMounted(dataDirectory)
        // --unlock asks before mounting, so that a script's prompt comes first.
        let passphrase = unlock ? try PassphraseInput.read(prompt: "Passphrase: ", file: passphraseFile) : nil
        defer { passphrase?.wipe() }
        _ = try Daemon.start(dataDirectory: dataDirectory, mountPoint: mountPoint, options: options,
                             autoLockSeconds: autoLockSeconds, cacheLimit: cacheLimit, pinentry: pinentry, debug: debug)
        if let passphrase {
            do {
                try PassphraseInput.unlock(mountPoint: mountPoint, with: passphrase)
            } catch {
                // `mount --unlock M && …` must not go on with a mount it did not unlock: the
                // mount goes again, and nothing is left to clean up.
                let unmounted = (try? UnmountCommand(Arguments([mountPoint], command: UnmountCommand.name, flags: UnmountCommand.flags,
                                                               options: UnmountCommand.options)).run()) != nil
                throw CommandFailure("\(error.description); " + (unmounted ? "\(mountPoint) was unmounted again"
                                                                  : "\(mountPoint) stays mounted: `mtmfs unlock \(mountPoint)`"))
            }
        }
    }

    /// `123`, `64K`, `500M`, `2G` (powers of 1024).
    static func byteCount(_ text: String) -> Int64? {
        let units: [Character: Int64] = ["K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40]
        var digits = Substring(text)
        var scale: Int64 = 1
        if let last = digits.last?.uppercased().first, let unit = units[last] {
            scale = unit
            digits = digits.dropLast()
        }
        guard let value = Int64(digits), value >= 0, value <= Int64.max / scale else { return nil }
        return value * scale
    }
}
