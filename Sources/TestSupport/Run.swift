#if canImport(Glibc)
import Glibc
#endif
import Foundation
import Posix

/// What a finished program printed and how it ended: its exit status, 128 + the signal
/// that ended it (SIGKILL after a timeout gives 137), or 127 when it could not start.
///
/// Thread-safety: a plain value; `Sendable`.
public struct CommandResult: Sendable, CustomStringConvertible {
    public var status: Int32
    public var stdout: String
    public var stderr: String

    public init(status: Int32, stdout: String, stderr: String) {
        self.status = status
        self.stdout = stdout
        self.stderr = stderr
    }

    public var description: String { "exit \(status)\nstdout: \(stdout)\nstderr: \(stderr)" }
}

/// Running programs for the integration tests and the reliability suite: the built `mtmfs`,
/// shell lines, helpers; to their end with both outputs captured, or in the background.
/// Children start through `Spawn` (posix_spawn and waitpid: Foundation's `Process` can hang
/// in `waitUntilExit` when tests spawn concurrently).
///
/// Thread-safety: no shared state; each call has its own temporary files, so callers on
/// many threads may run programs at once.
public enum Run {
    /// $MTMFS_BIN (e.g. a sanitizer build), else the `mtmfs` built next to the running
    /// executable or test bundle (`swift build` first), else the one on PATH.
    public static let mtmfs: String = {
        if let given = ProcessInfo.processInfo.environment["MTMFS_BIN"] { return given }
        var directory = URL(fileURLWithPath: "/proc/self/exe").resolvingSymlinksInPath().deletingLastPathComponent()
        // swift-testing may run from inside the .xctest bundle on some layouts.
        for _ in 0..<3 {
            let candidate = directory.appendingPathComponent("mtmfs").path
            var isDirectory: ObjCBool = false
            if FileManager.default.fileExists(atPath: candidate, isDirectory: &isDirectory), !isDirectory.boolValue,
               FileManager.default.isExecutableFile(atPath: candidate) {
                return candidate
            }
            directory = directory.deletingLastPathComponent()
        }
        return "mtmfs"
    }()

    /// Runs a program to its end, killed with SIGKILL after `timeout` seconds. Standard input
    /// is `input` (empty when nil); standard output and error are captured through files in a
    /// private temporary directory. `environment` replaces ours when given.
    @discardableResult
    public static func program(_ path: String, _ arguments: [String], input: String? = nil,
                               environment: [String: String]? = nil, timeout: Double = 120) -> CommandResult {
        let directory = temporaryDirectory("/tmp/mtmfs-run.XXXXXX")
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let inPath = directory + "/in", outPath = directory + "/out", errPath = directory + "/err"
        _ = FileManager.default.createFile(atPath: inPath, contents: Data((input ?? "").utf8))
        let env = environment.map { $0.filter { $0.key != Leftovers.variable }.map { "\($0.key)=\($0.value)" } + [Leftovers.marker] }
        Leftovers.arm()
        let pid: pid_t
        do {
            pid = try Spawn.start(path, arguments, stdin: .file(inPath), stdout: .file(outPath), stderr: .file(errPath),
                                  environment: env, ownProcessGroup: true)
        } catch {
            return CommandResult(status: 127, stdout: "", stderr: "cannot run \(path): \(error)")
        }
        let status = Spawn.wait(pid, timeout: timeout)
        return CommandResult(status: status,
                             stdout: (try? String(contentsOfFile: outPath, encoding: .utf8)) ?? "",
                             stderr: (try? String(contentsOfFile: errPath, encoding: .utf8)) ?? "")
    }

    /// One line of `sh -c`; a timeout kills the shell with everything it started.
    @discardableResult
    public static func shell(_ line: String, input: String? = nil, timeout: Double = 120) -> CommandResult {
        program("/bin/sh", ["-c", line], input: input, timeout: timeout)
    }

    /// Starts a program in the background, its output appended to files; its pid, 0 when it
    /// cannot start. Reap it with `wait`.
    public static func start(_ program: String, _ arguments: [String], stdin: String = "/dev/null",
                             stdout: String = "/dev/null", stderr: String = "/dev/null") -> pid_t {
        Leftovers.arm()
        return (try? Spawn.start(program, arguments, stdin: .file(stdin), stdout: .file(stdout, append: true),
                                 stderr: .file(stderr, append: true), ownProcessGroup: true)) ?? 0
    }

    /// Reaps `pid`, SIGKILL after `timeout` seconds: the exit status, or 128 + signal.
    @discardableResult
    public static func wait(_ pid: pid_t, timeout: Double = 120) -> Int32 { Spawn.wait(pid, timeout: timeout) }
}

/// A new directory from a mkdtemp template; a failure ends the process (nothing can be
/// tested without /tmp).
func temporaryDirectory(_ template: String) -> String {
    var bytes = Array(template.utf8CString)
    guard let made = mkdtemp(&bytes) else { fatalError("mkdtemp \(template): \(Errno.current)") }
    return String(cString: made)
}
