import MountedTree

/// `mtmfs mount`: mounts a data directory; returns once the mount answers.
struct MountCommand: Command {
    static let name = "mount"
    static let abstract = "mount a data directory (returns once the mount is ready)"
    static let usage = """
    Usage: mtmfs mount [--data-dir DIR] [-f] [-o OPTIONS] MOUNT

    Mounts the stores of DIR on the empty directory MOUNT. Without -f the daemon detaches,
    logs to syslog, and this command returns only once MOUNT answers, so the next line of a
    script can use it. The daemon unmounts cleanly on SIGTERM, SIGINT and SIGHUP.

    Options:
      --data-dir DIR   the data directory (default $XDG_DATA_HOME/mtmfs)
      -f               stay in the foreground, log to standard error
      -o OPTIONS       FUSE mount options, comma-separated (e.g. allow_other)
    """
    static let flags: Set<String> = ["-f", "--foreground"]
    static let options: Set<String> = ["--data-dir", "-o", "--ready-fd"]

    let dataDirectory: String
    let mountPoint: String
    let options: [String]
    let foreground: Bool
    /// Set only in the daemon that `mtmfs mount` starts (see `Daemon`).
    let readyFD: Int32?

    init(_ arguments: Arguments) throws(CommandFailure) {
        let positionals = try arguments.positionals(1...1, named: "the mount point (mtmfs mount MOUNT)")
        dataDirectory = Paths.dataDirectory(arguments.value("--data-dir"))
        options = arguments.allValues("-o").flatMap { $0.split(separator: ",").map(String.init) }
        foreground = arguments.has("-f") || arguments.has("--foreground")
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
        if readyFD != nil || foreground {
            if readyFD == nil {
                do {
                    try DataDirectory(path: dataDirectory).check()
                } catch {
                    throw CommandFailure(error.description)
                }
            }
            try Daemon.serve(dataDirectory: dataDirectory, mountPoint: mountPoint, options: options,
                             readyFD: readyFD)
            return
        }
        do {
            try DataDirectory(path: dataDirectory).check()
        } catch {
            throw CommandFailure(error.description)
        }
        _ = try Daemon.start(dataDirectory: dataDirectory, mountPoint: mountPoint, options: options)
    }
}
