import Foundation
import Posix
import TestSupport
import Testing
#if canImport(Glibc)
import Glibc
#endif

// Running programs, scratch directories, the mount table and `FuseAvailability` come from
// TestSupport (shared with mtmfs-reliability); what is here belongs to these tests alone.

extension Run {
    /// The repository root (for mount-helpers/).
    static let repository: String = {
        var url = URL(fileURLWithPath: #filePath)
        for _ in 0..<3 { url = url.deletingLastPathComponent() }
        return url.path
    }()

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
}

extension Scratch {
    /// An initialized data directory `data` and an empty mount point `mnt` in here.
    func initializedStore() -> (data: String, mnt: String) {
        let data = sub("data"), mnt = sub("mnt")
        #expect(Run.initStore(data).status == 0)
        mkdir(mnt, 0o755)
        return (data, mnt)
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
    init(options: [String] = [], prepare: (String) throws -> Void = { _ in }, initialize: ((String) -> CommandResult)? = nil) throws {
        let initialized = initialize?(dataDirectory) ?? Run.initStore(dataDirectory)
        try #require(initialized.status == 0, "init: \(initialized)")
        try prepare(dataDirectory)
        mkdir(mountPoint, 0o755)
        let mounted = Run.program(Run.mtmfs, ["mount", "--data-dir", dataDirectory] + options + [mountPoint])
        if mounted.status != 0 { scratch.remove() }
        try #require(mounted.status == 0, "mount: \(mounted)")
    }

    func path(_ relative: String) -> String { mountPoint + "/" + relative }

    /// The key=value lines of .mtmfs/status.
    func status() throws -> [String: String] { try MountStatus.read(mountPoint) }

    /// Kills the daemon with SIGKILL and waits until it is gone; with `detach`, also takes
    /// the dead mount away (the state after a crash, ready for a new mount).
    func killDaemon(detach: Bool) throws {
        let pid = try #require(Int32(try status()["pid"] ?? ""))
        kill(pid, SIGKILL)
        #expect(Poll.until { !ProcessState.isRunning(pid) })
        if detach { Run.program("fusermount3", ["-uz", mountPoint]) }
    }

    func close() {
        if MountTable.isMounted(mountPoint) {
            Run.mtmfs("unmount", mountPoint)
        }
        scratch.remove()
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

/// A terminal program driven through tmux (nano, prompts without echo), on a tmux server of
/// its own whose socket lives in the session's scratch directory (the default one,
/// /tmp/tmux-UID, would outlive the tests).
final class TerminalSession {
    let name = "mtmfs-test-\(getpid())-\(Int.random(in: 0...1_000_000_000))"
    private let scratch = Scratch("tmux")
    private var tmux: [String] { ["-S", scratch.sub("socket")] }

    init(_ command: String, directory: String? = nil) {
        var arguments = tmux + ["new-session", "-d", "-s", name, "-x", "120", "-y", "24"]
        if let directory { arguments += ["-c", directory] }
        Run.program("tmux", arguments + [command])
        usleep(400_000)
    }

    /// Sends keys (tmux names such as "C-o" and "Enter", or text), then lets it react.
    func send(_ keys: String...) {
        Run.program("tmux", tmux + ["send-keys", "-t", name] + keys)
        usleep(300_000)
    }

    var screen: String { Run.program("tmux", tmux + ["capture-pane", "-p", "-t", name]).stdout }

    func close() {
        Run.program("tmux", tmux + ["kill-server"])
        scratch.remove()
    }
}
