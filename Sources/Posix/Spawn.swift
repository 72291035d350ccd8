#if canImport(Glibc)
import Glibc
#endif

/// Starting and reaping child processes with posix_spawn: the one place that does it, for
/// the command line (fusermount3), the benchmark, the reliability suite and the tests.
/// (Foundation's `Process` can hang in `waitUntilExit` when several threads spawn, and
/// leaks under LeakSanitizer.)
///
/// Thread-safety: stateless; any thread may spawn and reap its own children.
public enum Spawn {
    /// Where a child's standard stream goes.
    ///
    /// Thread-safety: a value; `Sendable`.
    public enum Stream: Sendable {
        /// A file opened for the child: read-only for fd 0, else created and written
        /// (appended to with `append`).
        case file(String, append: Bool = false)
        /// A descriptor of ours, duplicated onto the child's.
        case descriptor(Int32)
        /// Ours, as it is (the child shares our terminal or pipe).
        case inherited

        public static let null = Stream.file("/dev/null")
    }

    /// Starts `program` (looked up in PATH) with `arguments`; the child's pid.
    /// `environment` replaces ours when given ("NAME=value" strings; `rawEnvironment`: the
    /// same as C strings the caller owns, for values that must not be copied). With
    /// `ownProcessGroup` the child leads a new process group, so that `wait`'s timeout
    /// ends it with everything it started (a shell's editor), and SIGINT and SIGQUIT act on
    /// it by default; not for a child that must read the terminal.
    public static func start(_ program: String, _ arguments: [String], stdin: Stream = .null,
                             stdout: Stream = .null, stderr: Stream = .null,
                             closing: [Int32] = [], environment: [String]? = nil,
                             ownProcessGroup: Bool = false, passing: [(Int32, as: Int32)] = [],
                             rawEnvironment: UnsafePointer<UnsafeMutablePointer<CChar>?>? = nil,
                             defaultSignals: [Int32] = []) throws(Errno) -> pid_t {
        var actions = posix_spawn_file_actions_t()
        posix_spawn_file_actions_init(&actions)
        defer { posix_spawn_file_actions_destroy(&actions) }
        var attributes = posix_spawnattr_t()
        posix_spawnattr_init(&attributes)
        defer { posix_spawnattr_destroy(&attributes) }
        if ownProcessGroup {
            // A job of its own: Ctrl-C's signals act on it even when ours are ignored (a
            // shell's background job ignores SIGINT and SIGQUIT, and passes that on).
            var defaults = sigset_t()
            sigemptyset(&defaults)
            sigaddset(&defaults, SIGINT)
            sigaddset(&defaults, SIGQUIT)
            posix_spawnattr_setsigdefault(&attributes, &defaults)
            var none = sigset_t()  // and none blocked (the spawning thread's mask is inherited)
            sigemptyset(&none)
            posix_spawnattr_setsigmask(&attributes, &none)
            posix_spawnattr_setflags(&attributes, Int16(POSIX_SPAWN_SETPGROUP | POSIX_SPAWN_SETSIGDEF | POSIX_SPAWN_SETSIGMASK))
            posix_spawnattr_setpgroup(&attributes, 0)
        }
        if !ownProcessGroup && !defaultSignals.isEmpty {
            // Signals we ignore while the child runs (a wrapper's SIGINT) act on it by default.
            var defaults = sigset_t()
            sigemptyset(&defaults)
            for signal in defaultSignals { sigaddset(&defaults, signal) }
            posix_spawnattr_setsigdefault(&attributes, &defaults)
            posix_spawnattr_setflags(&attributes, Int16(POSIX_SPAWN_SETSIGDEF))
        }
        for (fd, stream) in [(Int32(0), stdin), (1, stdout), (2, stderr)] {
            switch stream {
            case .file(let path, let append):
                let flags = fd == 0 ? O_RDONLY : O_WRONLY | O_CREAT | (append ? O_APPEND : O_TRUNC)
                posix_spawn_file_actions_addopen(&actions, fd, path, flags, 0o600)
            case .descriptor(let source):
                posix_spawn_file_actions_adddup2(&actions, source, fd)
            case .inherited:
                break
            }
        }
        // Descriptors of ours the child gets under other numbers (a daemon's ready pipe as fd 3).
        for (source, target) in passing { posix_spawn_file_actions_adddup2(&actions, source, target) }
        for fd in closing { posix_spawn_file_actions_addclose(&actions, fd) }
        var cArguments: [UnsafeMutablePointer<CChar>?] = ([program] + arguments).map { strdup($0) } + [nil]
        defer { cArguments.forEach { free($0) } }
        var cEnvironment: [UnsafeMutablePointer<CChar>?]? = environment.map { $0.map { strdup($0) } + [nil] }
        defer { cEnvironment?.forEach { free($0) } }
        var pid: pid_t = 0
        let rc: Int32
        if let rawEnvironment {
            // ("NAME=value" strings the caller keeps, in memory of its choosing: a secret's.)
            rc = posix_spawnp(&pid, program, &actions, &attributes, &cArguments,
                              UnsafeMutablePointer(mutating: rawEnvironment))
        } else if cEnvironment != nil {
            rc = posix_spawnp(&pid, program, &actions, &attributes, &cArguments, &cEnvironment!)
        } else {
            rc = posix_spawnp(&pid, program, &actions, &attributes, &cArguments, environ)
        }
        guard rc == 0 else { throw Errno(rc) }
        return pid
    }

    /// Reaps `pid`: its exit status, or 128 + the signal that ended it. With a `timeout`
    /// (seconds) the child is killed with SIGKILL once it has run that long: with its whole
    /// process group when it leads one (`ownProcessGroup`).
    @discardableResult
    public static func wait(_ pid: pid_t, timeout: Double? = nil) -> Int32 {
        var status: Int32 = 0
        if let timeout {
            let started = ContinuousClock.now
            while true {
                let reaped = waitpid(pid, &status, WNOHANG)
                if reaped == pid { break }
                if reaped == -1 && errno != EINTR { return -1 }
                if started.secondsElapsed > timeout {
                    kill(getpgid(pid) == pid ? -pid : pid, SIGKILL)
                    while waitpid(pid, &status, 0) == -1 && errno == EINTR {}
                    break
                }
                usleep(2_000)
            }
        } else {
            while waitpid(pid, &status, 0) == -1 {
                if errno != EINTR { return -1 }
            }
        }
        return (status & 0x7f) == 0 ? (status >> 8) & 0xff : 128 + (status & 0x7f)
    }

    /// Runs a program to its end: its exit status. `input`, when given, is its standard
    /// input (else /dev/null); what it prints is discarded.
    @discardableResult
    public static func run(_ program: String, _ arguments: [String], input: String? = nil) -> Int32 {
        collect(program, arguments, input: input, output: .none).status
    }

    /// Runs a program to its end: what it printed on standard output (its standard error
    /// discarded), with `input` as its standard input.
    public static func standardOutput(_ program: String, _ arguments: [String], input: String = "") -> String {
        collect(program, arguments, input: input, output: .standardOutput).output
    }

    /// Runs a program to its end with its output (stdout and stderr together) collected
    /// through a pipe; standard input is /dev/null.
    public static func output(_ program: String, _ arguments: [String], environment: [String]? = nil) -> (status: Int32, output: String) {
        collect(program, arguments, input: nil, output: .both, environment: environment)
    }

    /// Our environment with `settings` ("NAME=value") put in place of any of those names.
    public static func environment(with settings: [String]) -> [String] {
        let names = Set(settings.map { $0.prefix { $0 != "=" } })
        var result: [String] = []
        var entry = environ
        while let pointer = entry.pointee {
            let text = String(cString: pointer)
            if !names.contains(text.prefix { $0 != "=" }) { result.append(text) }
            entry += 1
        }
        return result + settings
    }

    /// Whether `program` is found in PATH (an executable file there; no shell started).
    public static func exists(_ program: String) -> Bool {
        if program.contains("/") { return access(program, X_OK) == 0 }
        let path = getenv("PATH").map { String(cString: $0) } ?? "/usr/bin:/bin"
        return path.split(separator: ":").contains { access(String($0) + "/" + program, X_OK) == 0 }
    }

    private enum Collected { case none, standardOutput, both }

    /// Runs a program to its end, its standard input `input` (else /dev/null) and what it
    /// prints collected as asked. The input is written by a thread of its own, so that a
    /// child that prints before it has read all of it cannot block on a full pipe.
    private static func collect(_ program: String, _ arguments: [String], input: String?,
                                output: Collected, environment: [String]? = nil) -> (status: Int32, output: String) {
        let stdin = input == nil ? nil : try? Syscall.pipe()
        let stdout = output == .none ? nil : try? Syscall.pipe()
        let opened = [stdin?.read, stdin?.write, stdout?.read, stdout?.write].compactMap { $0 }
        guard (input == nil || stdin != nil) && (output == .none || stdout != nil) else {
            opened.forEach { Syscall.close($0) }
            return (127, output == .both ? "cannot run \(program): no pipe" : "")
        }
        let printed: Spawn.Stream = stdout.map { .descriptor($0.write) } ?? .null
        let pid: pid_t
        do {
            pid = try start(program, arguments, stdin: stdin.map { .descriptor($0.read) } ?? .null, stdout: printed,
                            stderr: output == .both ? printed : .null,
                            closing: [stdin?.write, stdout?.read].compactMap { $0 }, environment: environment)
        } catch {
            opened.forEach { Syscall.close($0) }
            return (127, output == .both ? "cannot run \(program): \(error)" : "")
        }
        if let stdin, let input {
            Syscall.close(stdin.read)
            let writer = stdin.write, bytes = Array(input.utf8)
            if !Threads.detach({
                try? Syscall.writeAll(writer, bytes)
                Syscall.close(writer)
            }) {
                Syscall.close(writer)
            }
        }
        var bytes: [UInt8] = []
        if let stdout {
            Syscall.close(stdout.write)
            bytes = (try? Syscall.readAll(stdout.read)) ?? []
            Syscall.close(stdout.read)
        }
        return (wait(pid), String(decoding: bytes, as: UTF8.self))
    }
}
