import Foundation
import Posix
import Testing
#if canImport(Glibc)
import Glibc
#endif

/// What a finished command printed and how it ended.
struct CommandResult: CustomStringConvertible {
    var status: Int32
    var stdout: String
    var stderr: String
    var description: String { "exit \(status)\nstdout: \(stdout)\nstderr: \(stderr)" }
}

/// Runs programs for the tests: the built `mtmfs`, shell lines, helpers.
enum Run {
    /// The `mtmfs` built next to this test bundle (`swift build` first), or $MTMFS_BIN.
    static let mtmfs: String = {
        if let given = ProcessInfo.processInfo.environment["MTMFS_BIN"] { return given }
        let runner = URL(fileURLWithPath: "/proc/self/exe").resolvingSymlinksInPath()
        var directory = runner.deletingLastPathComponent()
        // swift-testing may run from inside the .xctest bundle on some layouts.
        for _ in 0..<3 {
            let candidate = directory.appendingPathComponent("mtmfs").path
            if FileManager.default.isExecutableFile(atPath: candidate) { return candidate }
            directory = directory.deletingLastPathComponent()
        }
        return "mtmfs"
    }()

    /// The repository root (for mount-helpers/).
    static let repository: String = {
        var url = URL(fileURLWithPath: #filePath)
        for _ in 0..<3 { url = url.deletingLastPathComponent() }
        return url.path
    }()

    /// Runs a program to its end (killed after `timeout` seconds) with posix_spawn and
    /// waitpid; output goes through temporary files. (Foundation's Process can hang in
    /// waitUntilExit when tests spawn concurrently.)
    @discardableResult
    static func program(_ path: String, _ arguments: [String], input: String? = nil,
                        environment: [String: String]? = nil, timeout: TimeInterval = 60) -> CommandResult {
        let scratch = Scratch()
        defer { scratch.remove() }
        let inPath = scratch.sub("in"), outPath = scratch.sub("out"), errPath = scratch.sub("err")
        _ = FileManager.default.createFile(atPath: inPath, contents: Data((input ?? "").utf8))
        let env = (environment ?? ProcessInfo.processInfo.environment).map { "\($0.key)=\($0.value)" }
        let pid: pid_t
        do {
            pid = try Spawn.start(path, arguments, stdin: .file(inPath), stdout: .file(outPath), stderr: .file(errPath),
                                  environment: env)
        } catch {
            return CommandResult(status: 127, stdout: "", stderr: "cannot run \(path): \(error)")
        }
        let exitStatus = Spawn.wait(pid, timeout: timeout)
        return CommandResult(status: exitStatus,
                             stdout: (try? String(contentsOfFile: outPath, encoding: .utf8)) ?? "",
                             stderr: (try? String(contentsOfFile: errPath, encoding: .utf8)) ?? "")
    }

    /// The passphrase of every test store.
    static let passphrase = "test passphrase"

    /// `mtmfs init` with the test passphrase on standard input and the cheapest KDF.
    @discardableResult
    static func initStore(_ dataDirectory: String) -> CommandResult {
        program(mtmfs, ["init", "--kdf", "interactive", "--data-dir", dataDirectory], input: passphrase + "\n")
    }

    @discardableResult
    static func mtmfs(_ arguments: String..., input: String? = nil) -> CommandResult {
        program(mtmfs, arguments, input: input)
    }

    /// One line of `sh -c`.
    @discardableResult
    static func shell(_ line: String, input: String? = nil, timeout: TimeInterval = 60) -> CommandResult {
        program("/bin/sh", ["-c", line], input: input, timeout: timeout)
    }
}

/// A fresh temporary directory, removed (after unmounting anything below it) on `remove()`.
final class Scratch {
    let path: String

    init() {
        var template = Array("/tmp/mtmfs-test.XXXXXX".utf8CString)
        path = String(cString: mkdtemp(&template)!)
        chmod(path, 0o755)
    }

    func sub(_ name: String) -> String { path + "/" + name }

    /// An initialized data directory `data` and an empty mount point `mnt` in here.
    func initializedStore() -> (data: String, mnt: String) {
        let data = sub("data"), mnt = sub("mnt")
        #expect(Run.initStore(data).status == 0)
        mkdir(mnt, 0o755)
        return (data, mnt)
    }

    func remove() {
        MountTable.unmountAll(below: path)
        try? FileManager.default.removeItem(atPath: path)
    }
}

/// An initialized data directory mounted on a fresh mount point; `close()` unmounts for
/// sure (lazily, if anything is left) and removes everything.
final class MountedStore {
    let scratch = Scratch()
    var dataDirectory: String { scratch.sub("data") }
    var mountPoint: String { scratch.sub("mnt") }

    /// `prepare` runs between init and mount, with the data directory (to damage a store,
    /// or to put another Settings.plist in place).
    init(options: [String] = [], prepare: (String) throws -> Void = { _ in }) throws {
        let initialized = Run.initStore(dataDirectory)
        try #require(initialized.status == 0, "init: \(initialized)")
        try prepare(dataDirectory)
        mkdir(mountPoint, 0o755)
        let mounted = Run.program(Run.mtmfs, ["mount", "--data-dir", dataDirectory] + options + [mountPoint])
        if mounted.status != 0 { scratch.remove() }
        try #require(mounted.status == 0, "mount: \(mounted)")
    }

    func path(_ relative: String) -> String { mountPoint + "/" + relative }

    /// The key=value lines of .mtmfs/status.
    func status() throws -> [String: String] {
        let text = try String(contentsOfFile: path(".mtmfs/status"), encoding: .utf8)
        var values: [String: String] = [:]
        for line in text.split(separator: "\n") {
            let parts = line.split(separator: "=", maxSplits: 1, omittingEmptySubsequences: false)
            if parts.count == 2 { values[String(parts[0])] = String(parts[1]) }
        }
        return values
    }

    /// Kills the daemon with SIGKILL and waits until it is gone; with `detach`, also takes
    /// the dead mount away (the state after a crash, ready for a new mount).
    func killDaemon(detach: Bool) throws {
        let pid = try #require(Int32(try status()["pid"] ?? ""))
        kill(pid, SIGKILL)
        #expect(MountTable.wait { !isRunning(pid) })
        if detach { Run.program("fusermount3", ["-uz", mountPoint]) }
    }

    func close() {
        if MountTable.isMounted(mountPoint) {
            Run.mtmfs("unmount", mountPoint)
        }
        scratch.remove()
    }
}

enum MountTable {
    /// Mount points of type fuse.mtmfs (from /proc/self/mountinfo, unescaped enough for tests).
    static func mtmfsMountPoints() -> [String] {
        guard let text = try? String(contentsOfFile: "/proc/self/mountinfo", encoding: .utf8) else { return [] }
        return text.split(separator: "\n").compactMap { line in
            let fields = line.split(separator: " ").map(String.init)
            guard let dash = fields.firstIndex(of: "-"), dash + 1 < fields.count,
                  fields[dash + 1] == "fuse.mtmfs" else { return nil }
            return fields[4].replacingOccurrences(of: "\\040", with: " ")
        }
    }

    static func isMounted(_ path: String) -> Bool { mtmfsMountPoints().contains(path) }

    /// Teardown's safety net: no test may leave a mount behind.
    static func unmountAll(below path: String) {
        for mountPoint in mtmfsMountPoints() where mountPoint.hasPrefix(path + "/") {
            Run.program("fusermount3", ["-uz", mountPoint])
        }
    }

    /// Waits up to `seconds` for `condition`.
    static func wait(seconds: Double = 10, until condition: () -> Bool) -> Bool {
        let deadline = Date().addingTimeInterval(seconds)
        while Date() < deadline {
            if condition() { return true }
            usleep(20_000)
        }
        return condition()
    }
}

/// Tests run in parallel in one process and spawn programs: a descriptor a test holds
/// must be O_CLOEXEC, or a child's exit closes its copy and FUSE sends a FLUSH for the
/// test's open file (which commits a pending value early).

/// The errno a file operation ended with (0 for success).
func errnoOf(_ body: () -> Int32) -> Int32 {
    errno = 0
    return body() == -1 ? errno : 0
}

/// True while `pid` runs; an exited, not yet reaped daemon (a zombie) counts as gone.
func isRunning(_ pid: pid_t) -> Bool {
    guard kill(pid, 0) == 0 || errno != ESRCH else { return false }
    guard let text = try? String(contentsOfFile: "/proc/\(pid)/stat", encoding: .utf8),
          let close = text.lastIndex(of: ")") else { return false }
    let state = text[text.index(after: close)...].trimmingCharacters(in: .whitespaces).first
    return state != "Z" && state != "X"
}

/// A terminal program driven through tmux (nano, prompts without echo).
final class TerminalSession {
    let name = "mtmfs-test-\(getpid())-\(Int.random(in: 0...1_000_000_000))"

    init(_ command: String, directory: String? = nil) {
        var arguments = ["new-session", "-d", "-s", name, "-x", "120", "-y", "24"]
        if let directory { arguments += ["-c", directory] }
        Run.program("tmux", arguments + [command])
        usleep(400_000)
    }

    /// Sends keys (tmux names such as "C-o" and "Enter", or text), then lets it react.
    func send(_ keys: String...) {
        Run.program("tmux", ["send-keys", "-t", name] + keys)
        usleep(300_000)
    }

    var screen: String { Run.program("tmux", ["capture-pane", "-p", "-t", name]).stdout }

    func close() { Run.program("tmux", ["kill-session", "-t", name]) }
}
