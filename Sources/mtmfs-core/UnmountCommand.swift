#if canImport(Glibc)
import Glibc
#endif
import Posix
import ScriptCommands

/// `mtmfs unmount`: unmounts and waits until the daemon has flushed and exited.
struct UnmountCommand: Command {
    static let name = "unmount"
    static let abstract = "unmount and wait until the daemon has flushed and exited"
    static let usage = """
    Usage: mtmfs unmount [--lazy] MOUNT

    Unmounts MOUNT (fusermount3 -u) and waits until the daemon has written everything and
    exited. A stale mount ("Transport endpoint is not connected") is detached lazily.

    Options:
      --lazy   detach now even if files are open (fusermount3 -uz)
    """
    static let flags: Set<String> = ["--lazy", "-z"]
    static let options: Set<String> = []

    let given: String
    let path: String
    let lazy: Bool

    init(_ arguments: Arguments) throws(CommandFailure) {
        given = try arguments.positionals(1...1, named: "the mount point (mtmfs unmount MOUNT)")[0]
        let absolute = Paths.absolute(given)
        // realpath of a stale mount fails: fall back to the path as given.
        path = Paths.resolved(absolute) ?? absolute
        lazy = arguments.has("--lazy") || arguments.has("-z")
    }

    func run() throws(CommandFailure) {
        guard MountTable.mtmfsMount(at: path) != nil else {
            throw CommandFailure("\(given) is not an mtmfs mount (see `mtmfs status`)", exitCode: ExitCode.noMount)
        }
        let stale = MountTable.isStale(path)
        let pid = StatusFile.read(mountPoint: path)["pid"].flatMap { pid_t($0) }
        let (status, output) = Subprocess.run("fusermount3", ["-u"] + (lazy || stale ? ["-z"] : []) + [path])
        guard status == 0 else {
            if output.contains("busy") {
                throw CommandFailure("\(given) is busy: close the files and shells using it (`fuser -vm \(given)`), or use --lazy")
            }
            throw CommandFailure("fusermount3 could not unmount \(given): \(output.split(whereSeparator: \.isWhitespace).joined(separator: " "))")
        }
        guard let pid else { return }
        // The daemon flushes its stores on the way out; wait for that (30 s at most).
        for _ in 0..<3000 {
            if !ProcessState.isRunning(pid) { return }
            usleep(10_000)
        }
        throw CommandFailure("unmounted \(given), but the daemon (pid \(pid)) is still running after 30 s")
    }
}

/// Runs a helper program and collects its exit status and combined output.
enum Subprocess {
    static func run(_ program: String, _ arguments: [String]) -> (Int32, String) {
        Spawn.output(program, arguments)
    }
}
