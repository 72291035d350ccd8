#if canImport(Glibc)
import Glibc
#endif
import Foundation
import Posix
import TestSupport

extension Run {
    /// This executable (the suite runs copies of itself as workers).
    static let suite: String = URL(fileURLWithPath: "/proc/self/exe").resolvingSymlinksInPath().path
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
        let initialized = Run.program(Run.mtmfs, ["init", "--kdf", kdf, "--data-dir", self.dataDirectory],
                                      input: suitePassphrase + "\n")
        guard initialized.status == 0 else { throw SuiteError("mtmfs init: \(initialized.stderr)") }
    }

    /// A copy of another store's data directory (to damage it), with its own mount point.
    init(copying other: Store, in scratch: Scratch, name: String) throws {
        dataDirectory = scratch.sub(name)
        mountPoint = scratch.sub(name + "-mnt")
        passphraseFile = other.passphraseFile
        mkdir(mountPoint, 0o755)
        let copied = Run.program("cp", ["-a", other.dataDirectory, dataDirectory])
        guard copied.status == 0 else { throw SuiteError("cp: \(copied.stderr)") }
    }

    func path(_ relative: String) -> String { mountPoint + "/" + relative }

    /// Mounts (unlocked unless told otherwise); throws with mtmfs's message.
    func mount(unlocked: Bool = true, options: [String] = []) throws {
        var arguments = ["mount", "--auto-lock", "0", "--data-dir", dataDirectory]
        if unlocked { arguments += ["--unlock", "--passphrase-file", passphraseFile] }
        let mounted = Run.program(Run.mtmfs, arguments + options + [mountPoint])
        guard mounted.status == 0 else { throw SuiteError("mtmfs mount: \(mounted.stderr)\(mounted.stdout)") }
        daemon = pid_t(status()["pid"] ?? "") ?? 0
    }

    /// Unmounts, and waits until the daemon is gone (a lazy unmount returns before it has
    /// closed its stores, and a check of the files on disk must not race it).
    func unmount() {
        if MountTable.isMounted(mountPoint) { Run.program(Run.mtmfs, ["unmount", mountPoint]) }
        if MountTable.isMounted(mountPoint) { Run.program("fusermount3", ["-uz", mountPoint]) }
        if daemon > 0 { Poll.until(seconds: 30, every: 0.01) { !ProcessState.isRunning(daemon) } }
        daemon = 0
    }

    /// SIGKILL to the daemon, then the lazy unmount a crashed daemon needs.
    func crash() {
        if daemon > 0 { kill(daemon, SIGKILL) }
        Poll.until(seconds: 1, every: 0.002) { !ProcessState.isRunning(daemon) }
        Run.program("fusermount3", ["-uz", mountPoint])
        daemon = 0
    }

    /// The values of .mtmfs/status; empty when it cannot be read.
    func status() -> [String: String] { (try? MountStatus.read(mountPoint)) ?? [:] }

    func lock() -> Bool { Run.program(Run.mtmfs, ["lock", mountPoint]).status == 0 }
    func unlock() -> Bool {
        Run.program(Run.mtmfs, ["unlock", "--passphrase-file", passphraseFile, mountPoint]).status == 0
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
    let parsed = Run.program("python3", ["-c", "import plistlib,sys; plistlib.load(open(sys.argv[1],'rb'))", path])
    return parsed.status == 0 ? nil : "plistlib: \(parsed.stderr.split(separator: "\n").last ?? "")"
}

/// `PRAGMA integrity_check` through the sqlite3 shell: nil, or what it said.
func integrityProblem(_ database: String) -> String? {
    let checked = Run.program("sqlite3", [database, "PRAGMA integrity_check"])
    let said = checked.stdout.trimmingCharacters(in: .whitespacesAndNewlines)
    return checked.status == 0 && said == "ok" ? nil : "integrity_check: \(said) \(checked.stderr)"
}

/// After a mount of a store that crashed: the data files of `cache.data/` are exactly those
/// its rows name (the mount removed the ones a crash left unnamed, and none is missing).
func dataFolderProblem(_ dataDirectory: String) -> String? {
    let named = Run.program("sqlite3", [dataDirectory + "/cache.sqlite", "SELECT data FROM inodes WHERE data IS NOT NULL"])
    guard named.status == 0 else { return "listing the rows' data files: \(named.stderr)" }
    let rows = Set(named.stdout.split(separator: "\n").map(String.init))
    let files = Set(listing(dataDirectory + "/cache.data") ?? [])
    guard rows != files else { return nil }
    return "cache.data: files no row names \(files.subtracting(rows).sorted()), rows whose file is missing \(rows.subtracting(files).sorted())"
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
