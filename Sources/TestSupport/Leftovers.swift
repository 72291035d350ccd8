#if canImport(Glibc)
import Glibc
#endif
import Posix
import Synchronization

/// The check that a test run leaves nothing behind: no process it started, however deep
/// (a shell's editor, a daemon that outlived its mount), and no mount below its scratch
/// directories.
///
/// Every program started through `Run` carries `MTMFS_TEST_OWNER=<this pid>` in its
/// environment, and so does everything it starts in turn (the `mtmfs` daemon included).
/// When this process exits (after the last test), the check waits up to 10 s for such
/// processes to end and for mounts below the scratch directories made here to go, then
/// names what is left on standard error, kills it, detaches the mounts, and makes the
/// process exit 1: `swift test` fails.
///
/// Thread-safety: `arm()` may be called from any thread, any number of times; the scratch
/// list is behind a mutex.
public enum Leftovers {
    public static let variable = "MTMFS_TEST_OWNER"
    static let scratchPaths = Mutex<[String]>([])

    /// `NAME=value` of the marker, for a child given an environment of its own.
    public static var marker: String {
        arm()
        return "\(variable)=" + (getenv(variable).map { String(cString: $0) } ?? "")
    }

    /// Sets the marker for every child to come and registers the check at exit (once). A
    /// process that a test run started keeps its parent's marker, and leaves the check to it.
    public static func arm() { _ = armed }

    private static let armed: Void = {
        setenv(variable, String(getpid()), 0)
        atexit { Leftovers.checkAtExit() }
    }()

    static func remember(scratch path: String) {
        arm()
        scratchPaths.withLock { $0.append(path) }
    }

    /// Processes other than this one whose environment carries our marker.
    public static func processes() -> [(pid: pid_t, command: String)] {
        let needle = Array(marker.utf8)
        let me = getpid()
        return ((try? Syscall.listDirectory("/proc")) ?? []).compactMap { name in
            guard let pid = pid_t(name), pid != me,
                  let fd = try? Syscall.open("/proc/\(pid)/environ", O_RDONLY) else { return nil }
            let environment = (try? Syscall.readAll(fd)) ?? []
            Syscall.close(fd)
            guard contains(environment, needle) else { return nil }
            var command = "?"
            if let fd = try? Syscall.open("/proc/\(pid)/cmdline", O_RDONLY) {
                command = String(decoding: ((try? Syscall.readAll(fd)) ?? []).map { $0 == 0 ? 0x20 : $0 }, as: UTF8.self)
                Syscall.close(fd)
            }
            return (pid, command)
        }
    }

    /// Mounts below the scratch directories this process made.
    public static func mounts() -> [String] {
        let paths = scratchPaths.withLock { $0 }
        return MountTable.entries().map(\.mountPoint).filter { point in paths.contains { point.hasPrefix($0 + "/") } }
    }

    /// Whether `environment` (NUL-separated `NAME=value` strings) holds `variable` exactly.
    static func contains(_ environment: [UInt8], _ variable: [UInt8]) -> Bool {
        environment.split(separator: 0).contains { $0.elementsEqual(variable) }
    }

    static func checkAtExit() {
        guard getenv(variable).map({ String(cString: $0) }) == String(getpid()) else { return }  // a child's copy
        guard !Scratch.keep else { return }  // kept for a look, mounts included
        Poll.until(seconds: 10, every: 0.1) { processes().isEmpty && mounts().isEmpty }
        let leftProcesses = Self.processes(), leftMounts = Self.mounts()
        guard !leftProcesses.isEmpty || !leftMounts.isEmpty else { return }
        var report = "\nTestSupport: the tests left things behind:\n"
        for (pid, command) in leftProcesses { report += "  process \(pid): \(command)\n" }
        for point in leftMounts { report += "  mount: \(point)\n" }
        try? Syscall.writeAll(2, Array(report.utf8))
        for (pid, _) in leftProcesses { kill(pid, SIGKILL) }
        for path in scratchPaths.withLock({ $0 }) { MountTable.unmountAll(below: path) }
        fflush(nil)  // _exit skips stdio's buffers: the test runner's last lines too
        _exit(1)
    }
}
