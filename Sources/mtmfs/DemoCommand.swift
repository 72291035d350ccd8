#if canImport(Glibc)
import Glibc
#endif
import MountedTree
import Posix

/// `mtmfs demo`: a throwaway store, mounted, with a short tour printed.
struct DemoCommand: Command {
    static let name = "demo"
    static let abstract = "make a demo store, mount it and print a short tour"
    static let usage = """
    Usage: mtmfs demo [MOUNT]

    Creates a throwaway data directory under /tmp, mounts it on MOUNT (default
    ./mtmfs-demo, created if missing) and prints a tour. End it with `mtmfs unmount MOUNT`.
    """
    static let flags: Set<String> = []
    static let options: Set<String> = []

    let given: String

    init(_ arguments: Arguments) throws(CommandFailure) {
        given = try arguments.positionals(0...1, named: "").first ?? "mtmfs-demo"
    }

    func run() throws(CommandFailure) {
        let absolute = Paths.absolute(given)
        if (try? Syscall.lstat(absolute)) == nil {
            do {
                try Syscall.mkdir(absolute, mode: 0o755)
            } catch {
                throw CommandFailure("cannot create the mount point \(given): \(error)")
            }
        }
        let mountPoint = try MountPointCheck.validate(given)
        var template = Array("/tmp/mtmfs-demo-data.XXXXXX".utf8CString)
        guard let created = mkdtemp(&template) else {
            throw CommandFailure("cannot create a demo data directory in /tmp: \(Errno.current)")
        }
        let dataDirectory = DataDirectory(path: String(cString: created))
        do {
            try dataDirectory.initialize()
        } catch {
            throw CommandFailure(error.description)
        }
        _ = try Daemon.start(dataDirectory: dataDirectory.path, mountPoint: mountPoint, options: [])
        print(tour(mountPoint: mountPoint, dataDirectory: dataDirectory.path))
    }

    func tour(mountPoint: String, dataDirectory: String) -> String {
        let shown = given
        let top = ((try? Syscall.listDirectory(mountPoint)) ?? []).sorted().joined(separator: "  ")
        let status = String(decoding: (try? readFile(mountPoint + "/.mtmfs/status")) ?? [], as: UTF8.self)
        return """
        mtmfs demo: a throwaway store in \(dataDirectory),
        mounted on \(mountPoint).

        $ ls -A \(shown)
        \(top)

        $ cat \(shown)/.mtmfs/status
        \(status.trimmingSuffix("\n"))

        The tree:
          \(shown)/accounts/   service accounts from the encrypted vault (locked until unlocked)
          \(shown)/settings/   the keys of Settings.plist, one file per key
          \(shown)/cache/      a file tree stored in SQLite
          \(shown)/.mtmfs/     status and control files

        Look around with ls and cat; `mtmfs status` summarizes every mount.
        When done: mtmfs unmount \(shown)
        """
    }

    private func readFile(_ path: String) throws(Errno) -> [UInt8] {
        let fd = try Syscall.open(path, O_RDONLY)
        defer { Syscall.close(fd) }
        return try Syscall.readAll(fd)
    }
}
