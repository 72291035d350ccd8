#if canImport(Glibc)
import Glibc
#endif
import Foundation
import Posix

/// What a finished program printed and how it ended (128 + signal when killed).
struct Finished {
    var status: Int32
    var output: String
    var errors: String
}

/// Starting programs: to their end with output captured, or in the background.
enum Program {
    /// $MTMFS_BIN (e.g. a sanitizer build), else the `mtmfs` built next to this executable,
    /// else the one on PATH.
    static let mtmfs: String = ProcessInfo.processInfo.environment["MTMFS_BIN"] ?? sibling("mtmfs")
    /// This executable (the suite runs copies of itself as workers).
    static let suite: String = URL(fileURLWithPath: "/proc/self/exe").resolvingSymlinksInPath().path

    static func sibling(_ name: String) -> String {
        let here = URL(fileURLWithPath: "/proc/self/exe").resolvingSymlinksInPath().deletingLastPathComponent()
        let candidate = here.appendingPathComponent(name).path
        return FileManager.default.isExecutableFile(atPath: candidate) ? candidate : name
    }

    /// Runs to the end (SIGKILL after `timeout` seconds); stdin from `input`.
    @discardableResult
    static func run(_ program: String, _ arguments: [String], input: String = "",
                    timeout: Double = 120) -> Finished {
        var template = Array("/tmp/mtmfs-reliability-io.XXXXXX".utf8CString)
        let scratch = String(cString: mkdtemp(&template)!)
        defer { try? FileManager.default.removeItem(atPath: scratch) }
        _ = FileManager.default.createFile(atPath: scratch + "/in", contents: Data(input.utf8))
        let pid = start(program, arguments, stdin: scratch + "/in", stdout: scratch + "/out",
                        stderr: scratch + "/err")
        guard pid > 0 else { return Finished(status: 127, output: "", errors: "cannot run \(program)") }
        let status = wait(pid, timeout: timeout)
        return Finished(status: status,
                        output: (try? String(contentsOfFile: scratch + "/out", encoding: .utf8)) ?? "",
                        errors: (try? String(contentsOfFile: scratch + "/err", encoding: .utf8)) ?? "")
    }

    /// One line of `sh -c`.
    @discardableResult
    static func shell(_ line: String, input: String = "", timeout: Double = 120) -> Finished {
        run("/bin/sh", ["-c", line], input: input, timeout: timeout)
    }

    /// Starts a program in the background (output appended to files); its pid, 0 when it
    /// cannot start.
    static func start(_ program: String, _ arguments: [String], stdin: String = "/dev/null",
                      stdout: String = "/dev/null", stderr: String = "/dev/null") -> pid_t {
        (try? Spawn.start(program, arguments, stdin: .file(stdin), stdout: .file(stdout, append: true),
                          stderr: .file(stderr, append: true))) ?? 0
    }

    /// Reaps `pid`; SIGKILL after `timeout` seconds. The exit status, or 128 + signal.
    @discardableResult
    static func wait(_ pid: pid_t, timeout: Double = 120) -> Int32 { Spawn.wait(pid, timeout: timeout) }

    static func exists(_ program: String) -> Bool { shell("command -v \(program)").status == 0 }
}

/// A temporary directory for one part of the suite; `remove()` unmounts what is below it.
final class Scratch {
    let path: String

    init(_ label: String) {
        var template = Array("/tmp/mtmfs-reliability-\(label).XXXXXX".utf8CString)
        path = String(cString: mkdtemp(&template)!)
        chmod(path, 0o755)
    }

    func sub(_ name: String) -> String { path + "/" + name }

    /// `--keep`: leave the directories (logs, data) for a look after a failure.
    nonisolated(unsafe) static var keep = false

    func remove() {
        if Scratch.keep { say("  (kept \(path))"); return }
        for mountPoint in Mounts.below(path) { Program.run("fusermount3", ["-uz", mountPoint]) }
        try? FileManager.default.removeItem(atPath: path)
    }
}

enum Mounts {
    /// FUSE mount points below `path` (from /proc/self/mountinfo).
    static func below(_ path: String) -> [String] {
        guard let text = try? String(contentsOfFile: "/proc/self/mountinfo", encoding: .utf8) else { return [] }
        return text.split(separator: "\n").compactMap { line -> String? in
            let fields = line.split(separator: " ").map(String.init)
            guard fields.count > 4, fields[4].hasPrefix(path + "/") else { return nil }
            return fields[4]
        }.reversed()
    }

    static func isMounted(_ path: String) -> Bool {
        below((path as NSString).deletingLastPathComponent).contains(path)
    }
}

/// The passphrase of every store the suite makes.
let suitePassphrase = "reliability passphrase"

/// An initialized data directory and its mount point; mounts and unmounts on request.
final class Store {
    let dataDirectory: String
    let mountPoint: String
    let passphraseFile: String
    var daemon: pid_t = 0

    init(in scratch: Scratch, dataDirectory: String? = nil, kdf: String = "interactive") throws {
        self.dataDirectory = dataDirectory ?? scratch.sub("data")
        mountPoint = scratch.sub("mnt")
        passphraseFile = scratch.sub("passphrase")
        mkdir(mountPoint, 0o755)
        _ = FileManager.default.createFile(atPath: passphraseFile, contents: Data((suitePassphrase + "\n").utf8),
                                       attributes: [.posixPermissions: 0o600])
        let initialized = Program.run(Program.mtmfs, ["init", "--kdf", kdf, "--data-dir", self.dataDirectory],
                                      input: suitePassphrase + "\n")
        guard initialized.status == 0 else { throw SuiteError("mtmfs init: \(initialized.errors)") }
    }

    /// A copy of another store's data directory (to damage it), with its own mount point.
    init(copying other: Store, in scratch: Scratch, name: String) throws {
        dataDirectory = scratch.sub(name)
        mountPoint = scratch.sub(name + "-mnt")
        passphraseFile = other.passphraseFile
        mkdir(mountPoint, 0o755)
        let copied = Program.run("cp", ["-a", other.dataDirectory, dataDirectory])
        guard copied.status == 0 else { throw SuiteError("cp: \(copied.errors)") }
    }

    func path(_ relative: String) -> String { mountPoint + "/" + relative }

    /// Mounts (unlocked unless told otherwise); throws with mtmfs's message.
    func mount(unlocked: Bool = true, options: [String] = []) throws {
        var arguments = ["mount", "--auto-lock", "0", "--data-dir", dataDirectory]
        if unlocked { arguments += ["--unlock", "--passphrase-file", passphraseFile] }
        let mounted = Program.run(Program.mtmfs, arguments + options + [mountPoint])
        guard mounted.status == 0 else { throw SuiteError("mtmfs mount: \(mounted.errors)\(mounted.output)") }
        daemon = pid_t(status()["pid"] ?? "") ?? 0
    }

    func unmount() {
        if Mounts.isMounted(mountPoint) { Program.run(Program.mtmfs, ["unmount", mountPoint]) }
        if Mounts.isMounted(mountPoint) { Program.run("fusermount3", ["-uz", mountPoint]) }
    }

    /// SIGKILL to the daemon, then the lazy unmount a crashed daemon needs.
    func crash() {
        if daemon > 0 { kill(daemon, SIGKILL) }
        for _ in 0..<500 where ProcessState.isRunning(daemon) { usleep(2_000) }
        Program.run("fusermount3", ["-uz", mountPoint])
        daemon = 0
    }

    func status() -> [String: String] {
        guard let text = try? String(contentsOfFile: path(".mtmfs/status"), encoding: .utf8) else { return [:] }
        var values: [String: String] = [:]
        for line in text.split(separator: "\n") {
            let parts = line.split(separator: "=", maxSplits: 1, omittingEmptySubsequences: false)
            if parts.count == 2 { values[String(parts[0])] = String(parts[1]) }
        }
        return values
    }

    func lock() -> Bool { Program.run(Program.mtmfs, ["lock", mountPoint]).status == 0 }
    func unlock() -> Bool {
        Program.run(Program.mtmfs, ["unlock", "--passphrase-file", passphraseFile, mountPoint]).status == 0
    }
}

struct SuiteError: Error, CustomStringConvertible {
    let description: String
    init(_ description: String) { self.description = description }
}

/// Counts what one part tried and what survived, and keeps what failed.
final class Tally {
    let name: String
    private(set) var tried = 0
    private(set) var survived = 0
    private(set) var failures: [String] = []

    init(_ name: String) { self.name = name }

    /// One case: it survived when `problems` is empty.
    func record(_ label: String, _ problems: [String]) {
        tried += 1
        if problems.isEmpty {
            survived += 1
        } else {
            failures.append("\(label): " + problems.joined(separator: "; "))
        }
    }

    /// Many cases at once: `tried` of them, each failure one that did not survive.
    func record(tried count: Int, failures newFailures: [String]) {
        tried += count
        survived += count - newFailures.count
        failures += newFailures
    }

    var line: String { "\(name): \(tried) tried, \(survived) survived" }
}

// MARK: Small file helpers

/// The bytes of a file (nil when it cannot be read) and the errno of the failure.
func readFile(_ path: String) -> (bytes: [UInt8]?, error: Int32) {
    let fd = open(path, O_RDONLY | O_CLOEXEC)
    guard fd >= 0 else { return (nil, errno) }
    defer { close(fd) }
    var result: [UInt8] = []
    var buffer = [UInt8](repeating: 0, count: 1 << 16)
    while true {
        let n = buffer.withUnsafeMutableBytes { read(fd, $0.baseAddress, $0.count) }
        if n < 0 {
            if errno == EINTR { continue }
            return (nil, errno)
        }
        if n == 0 { return (result, 0) }
        result += buffer[0..<n]
    }
}

func readText(_ path: String) -> String? { readFile(path).bytes.map { String(decoding: $0, as: UTF8.self) } }

/// open(O_TRUNC)+write+optional fsync+close; 0 or the errno of the step that failed.
@discardableResult
func writeFile(_ path: String, _ bytes: [UInt8], flags: Int32 = O_WRONLY | O_CREAT | O_TRUNC,
               sync: Bool = false) -> Int32 {
    let fd = open(path, flags | O_CLOEXEC, 0o600)
    guard fd >= 0 else { return errno }
    var offset = 0
    while offset < bytes.count {
        let n = bytes.withUnsafeBytes { write(fd, $0.baseAddress! + offset, $0.count - offset) }
        if n < 0 {
            if errno == EINTR { continue }
            let failure = errno
            close(fd)
            return failure
        }
        offset += n
    }
    if sync && fsync(fd) != 0 {
        let failure = errno
        close(fd)
        return failure
    }
    return close(fd) == 0 ? 0 : errno
}

func errnoName(_ code: Int32) -> String { code == 0 ? "ok" : String(cString: strerror(code)) }

/// The contents of a directory, sorted (nil when it cannot be listed).
func listing(_ path: String) -> [String]? {
    (try? FileManager.default.contentsOfDirectory(atPath: path))?.sorted()
}

/// Python's plistlib reads the file: nil, or why not.
func plistlibProblem(_ path: String) -> String? {
    let parsed = Program.run("python3", ["-c", "import plistlib,sys; plistlib.load(open(sys.argv[1],'rb'))", path])
    return parsed.status == 0 ? nil : "plistlib: \(parsed.errors.split(separator: "\n").last ?? "")"
}

/// `PRAGMA integrity_check` through the sqlite3 shell: nil, or what it said.
func integrityProblem(_ database: String) -> String? {
    let checked = Program.run("sqlite3", [database, "PRAGMA integrity_check"])
    let said = checked.output.trimmingCharacters(in: .whitespacesAndNewlines)
    return checked.status == 0 && said == "ok" ? nil : "integrity_check: \(said) \(checked.errors)"
}

/// A line to standard output at once (the suite's progress shows while it runs).
func say(_ line: String) {
    let bytes = Array((line + "\n").utf8)
    _ = bytes.withUnsafeBytes { write(1, $0.baseAddress, $0.count) }
}

/// A line to standard error.
func complain(_ line: String) {
    let bytes = Array((line + "\n").utf8)
    _ = bytes.withUnsafeBytes { write(2, $0.baseAddress, $0.count) }
}
