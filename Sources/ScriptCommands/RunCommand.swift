#if canImport(Glibc)
import Glibc
#endif
import Posix
import SecureMemory

/// `mtmfs run -- COMMAND…`: COMMAND runs with every `mtmfs://` reference of the
/// environment (and of `--env-file`) replaced by its secret — in COMMAND's environment
/// alone: not in ours (`/proc/PID/environ` of `mtmfs run` shows the references), not on a
/// command line. Its output passes through with each secret concealed.
package struct RunCommand: Command {
    package static let name = "run"
    package static let abstract = "run a command with secrets in its environment alone (mtmfs:// references)"
    package static let usage = """
    Usage: mtmfs run [--mount MOUNT] [--env-file FILE] [--no-masking] -- COMMAND [ARGUMENT…]

    Runs COMMAND with every environment variable whose value is a reference
    mtmfs://ACCOUNT/FIELD set to that secret, for COMMAND alone. ACCOUNT is a UUID,
    by-label/LABEL or by-server/HOST/USER (the names `ls accounts/by-label` shows); FIELD
    is a field (password, username, totp, …) or attributes/NAME.
        GITHUB_TOKEN=mtmfs://by-label/GitHub/password mtmfs run -- ./deploy.sh
    --env-file FILE adds NAME=VALUE lines (blank lines and # comments skipped; a VALUE may
    be a reference). COMMAND's output and errors pass through with every secret replaced
    by <concealed by mtmfs> (also one split across writes); --no-masking gives COMMAND the
    terminal itself. The exit status is COMMAND's (128 + N when signal N ended it).

    Guarding decides on the program that runs `mtmfs run` (your script or shell), as for an
    open: one prompt per account. MOUNT may be left out when one mtmfs mount is up.

    Exit status when COMMAND did not run: 3 no such account or field; 4 a view name several
    accounts share; 5 locked; 6 no mount; 7 guarding refused; 2 wrong command line or a
    malformed reference; 1 anything else (COMMAND not found: 127).
    """
    package static let flags: Set<String> = ["--no-masking"]
    package static let options: Set<String> = ["--mount", "--env-file"]

    package let mount: String?
    package let envFile: String?
    package let masking: Bool
    package let command: [String]

    package init(_ arguments: Arguments) throws(CommandFailure) {
        mount = arguments.value("--mount")
        envFile = arguments.value("--env-file")
        masking = !arguments.has("--no-masking")
        command = try arguments.positionals(1...Int.max, named: "COMMAND")
    }

    package func run() throws(CommandFailure) {
        let environment: SecretEnvironment
        if let envFile {
            // Ours, then the file's (a later name wins).
            var settings: [(name: String, value: String)] = []
            var entry = environ
            while let pointer = entry.pointee {
                let text = String(cString: pointer)
                if let equals = text.firstIndex(of: "=") {
                    settings.append((String(text[..<equals]), String(text[text.index(after: equals)...])))
                }
                entry += 1
            }
            environment = try SecretEnvironment(settings + Self.environmentFile(envFile), mount: mount)
        } else {
            environment = try SecretEnvironment(inheriting: environ, mount: mount)
        }
        let status: Int32
        do {
            status = try Self.run(command, environment: environment, masking: masking)
        } catch {
            environment.wipe()
            throw error
        }
        environment.wipe()
        exit(status)
    }

    /// `NAME=VALUE` lines of an environment file (`export ` before a name and quotes around
    /// a value taken off).
    package static func environmentFile(_ path: String) throws(CommandFailure) -> [(name: String, value: String)] {
        let bytes: [UInt8]
        do { bytes = try Syscall.readFile(path) } catch {
            throw CommandFailure("cannot read the environment file \(Terminal.printable(path)): \(error)")
        }
        var settings: [(name: String, value: String)] = []
        for (number, raw) in String(decoding: bytes, as: UTF8.self).split(separator: "\n", omittingEmptySubsequences: false).enumerated() {
            var line = raw.trimmed(of: " \t\r")
            if line.isEmpty || line.hasPrefix("#") { continue }
            if line.hasPrefix("export ") { line = line.dropFirst(7).trimmed(of: " \t") }
            guard let equals = line.firstIndex(of: "="), equals != line.startIndex else {
                throw CommandFailure("\(Terminal.printable(path)):\(number + 1): not NAME=VALUE", exitCode: ExitCode.usage)
            }
            var value = String(line[line.index(after: equals)...])
            if value.count >= 2, let first = value.first, first == "\"" || first == "'", value.last == first {
                value = String(value.dropFirst().dropLast())
            }
            settings.append((String(line[..<equals]), value))
        }
        return settings
    }

    /// `SIG_IGN` as a number (the handler value of an ignored signal).
    package static let ignore = 1

    /// The child whose signals are passed on (SIGTERM, SIGHUP to `mtmfs run` end it too).
    nonisolated(unsafe) static var child: pid_t = 0

    /// Runs `command` and waits for it: its exit status.
    package static func run(_ command: [String], environment: SecretEnvironment, masking: Bool) throws(CommandFailure) -> Int32 {
        // Ctrl-C and Ctrl-\ reach the command from the terminal: it decides, and we wait for
        // its end (and its last output). Those we ignored from the start stay ignored for it.
        var inheritedIgnored: Set<Int32> = []
        for signal in [SIGINT, SIGQUIT] {
            var old = sigaction()
            sigaction(signal, nil, &old)
            if let handler = old.__sigaction_handler.sa_handler, unsafeBitCast(handler, to: Int.self) == Self.ignore {
                inheritedIgnored.insert(signal)
            }
            Glibc.signal(signal, SIG_IGN)
        }
        Glibc.signal(SIGPIPE, SIG_IGN)
        for signal in [SIGTERM, SIGHUP] {
            Glibc.signal(signal) { received in if RunCommand.child > 0 { kill(RunCommand.child, received) } }
        }
        let defaults = [SIGINT, SIGQUIT].filter { !inheritedIgnored.contains($0) } + [SIGPIPE, SIGTERM, SIGHUP]
        var pipes: [(read: Int32, write: Int32)] = []
        defer { for pipe in pipes { Syscall.close(pipe.read) } }
        if masking {
            do {
                pipes = [try Syscall.pipe(), try Syscall.pipe()]
            } catch {
                throw CommandFailure("cannot make a pipe for the command's output: \(error)")
            }
        }
        let pid: pid_t
        do {
            pid = try environment.withPointers { (pointers) throws(Errno) in
                try Spawn.start(command[0], Array(command.dropFirst()), stdin: .inherited,
                                stdout: masking ? .descriptor(pipes[0].write) : .inherited,
                                stderr: masking ? .descriptor(pipes[1].write) : .inherited,
                                rawEnvironment: pointers, defaultSignals: defaults)
            }
        } catch {
            for pipe in pipes { Syscall.close(pipe.write) }
            let missing = error == .noSuchFileOrDirectory
            throw CommandFailure("cannot run \(Terminal.printable(command[0])): \(missing ? "no such program" : "\(error)")",
                                 exitCode: missing ? 127 : 126)
        }
        child = pid
        // The secrets are the child's now; ours go (the masker keeps its copies).
        environment.wipeEntries()
        for pipe in pipes { Syscall.close(pipe.write) }
        if masking { relay(pipes.map(\.read), child: pid, secrets: environment.secrets) }
        let status = Spawn.wait(pid)
        child = 0
        return status
    }

    /// Copies the child's output and errors to ours, concealing `secrets`, until both end —
    /// or the child has ended (what a program it left running writes later is not waited for).
    package static func relay(_ streams: [Int32], child: pid_t, secrets: [SecureBytes]) {
        let maskers = streams.map { _ in OutputMasker(secrets: secrets) }
        // Made at the first bytes to copy (a command that writes nothing costs no secure
        // memory for them).
        let buffer = SecureBytes()
        defer { buffer.wipe() }
        let pinned = try? ProcessInspection.pin(child)
        defer { if let pinned { Syscall.close(pinned) } }
        var open = Dictionary(uniqueKeysWithValues: zip(streams, [Int32(1), 2]))
        var maskerOf = Dictionary(uniqueKeysWithValues: zip(streams, maskers))
        var childEnded = false
        while !open.isEmpty {
            let ready = childEnded ? Array(open.keys) : Syscall.waitReadable(Array(open.keys) + [pinned].compactMap { $0 })
            if let pinned, ready.contains(pinned) {
                // Ended: what it wrote is drained without waiting for more.
                childEnded = true
                for fd in open.keys { _ = fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK) }
            }
            for fd in ready where fd != pinned {
                guard let target = open[fd], let masker = maskerOf[fd] else { continue }
                var waiting: Int32 = 0
                if ioctl(fd, UInt(FIONREAD), &waiting) == 0 && waiting == 0 {
                    // Ready with nothing to read: the end of the stream (or, once the
                    // command has ended, nothing more from what it left running).
                    finish(masker, to: target, closing: fd, &open, &maskerOf)
                    continue
                }
                if buffer.isWiped {
                    do {
                        try buffer.resize(to: 65_536)
                    } catch {
                        // No secure memory for the bytes: they are not looked at, nor shown.
                        return
                    }
                }
                let count = buffer.withUnsafeMutableBytes { bytes in
                    var n: Int
                    repeat { n = read(fd, bytes.baseAddress, bytes.count) } while n < 0 && errno == EINTR
                    return n
                }
                if count < 0 && errno == EAGAIN {
                    if childEnded { finish(masker, to: target, closing: fd, &open, &maskerOf) }
                    continue
                }
                guard count > 0 else {
                    finish(masker, to: target, closing: fd, &open, &maskerOf)
                    continue
                }
                var failed = false
                buffer.withUnsafeBytes { bytes in
                    do throws(Errno) {
                        try masker.feed(UnsafeRawBufferPointer(rebasing: bytes[0..<count])) { piece in
                            if (try? Syscall.writeAll(target, piece)) == nil { failed = true }
                        }
                    } catch {
                        failed = true
                    }
                }
                if failed {
                    // Our output is gone (a closed pipe): the child's writes fail from now on,
                    // as they would have without us in between.
                    masker.finish { _ in }
                    open[fd] = nil
                    Syscall.close(fd)
                }
            }
        }
    }

    private static func finish(_ masker: OutputMasker, to target: Int32, closing fd: Int32,
                               _ open: inout [Int32: Int32], _ maskers: inout [Int32: OutputMasker]) {
        masker.finish { piece in _ = try? Syscall.writeAll(target, piece) }
        open[fd] = nil
        maskers[fd] = nil
    }
}

/// The environment a command gets from `mtmfs run`: every variable of ours and of the
/// environment file, with each reference replaced by its secret. The entries holding a
/// secret ("NAME=secret\0") are in secure memory, wiped once the command has started; the
/// secrets stay (secure) for the output's masking.
///
/// Thread-safety: none of its own; one thread.
package final class SecretEnvironment {
    /// The distinct secret values, for masking.
    private(set) var secrets: [SecureBytes] = []
    /// "NAME=value" of the variables without a secret: our own environment's entries as they
    /// are, or copies (`owned`) of an environment file's.
    private var plain: [UnsafeMutablePointer<CChar>] = []
    private var owned = false
    /// Every "NAME=secret\0" one after another.
    private var entries = SecureBytes()
    private var entryStarts: [Int] = []

    /// Our environment: an entry whose value is not a reference passes as it is, neither
    /// copied nor read past its `=`; only the references are made strings.
    package convenience init(inheriting environment: UnsafeMutablePointer<UnsafeMutablePointer<CChar>?>,
                             mount given: String?) throws(CommandFailure) {
        var plain: [UnsafeMutablePointer<CChar>] = [], references: [(name: String, reference: String)] = []
        var entry = environment
        while let pointer = entry.pointee {
            entry += 1
            guard let equals = strchr(pointer, 0x3D), strncmp(equals + 1, SecretReference.scheme, 8) == 0 else {
                plain.append(pointer)
                continue
            }
            let name = UnsafeRawBufferPointer(start: pointer, count: pointer.distance(to: equals))
            references.append((String(decoding: name, as: UTF8.self), String(cString: equals + 1)))
        }
        try self.init(plain: plain, owned: false, references: references, mount: given)
    }

    /// `settings` in order, the last of a name winning (an environment file's after ours).
    package convenience init(_ settings: [(name: String, value: String)], mount given: String?) throws(CommandFailure) {
        var order: [String] = []
        var values: [String: String] = [:]
        for (name, value) in settings {
            if values[name] == nil { order.append(name) }
            values[name] = value
        }
        var plain: [UnsafeMutablePointer<CChar>] = [], references: [(name: String, reference: String)] = []
        for name in order {
            guard let value = values[name] else { continue }
            if SecretReference.isReference(value) {
                references.append((name, value))
            } else if let copy = strdup(name + "=" + value) {
                plain.append(copy)
            }
        }
        try self.init(plain: plain, owned: true, references: references, mount: given)
    }

    private init(plain: [UnsafeMutablePointer<CChar>], owned: Bool, references: [(name: String, reference: String)],
                 mount given: String?) throws(CommandFailure) {
        self.plain = plain
        self.owned = owned
        var reader = SecretReader(mount: given)
        var named: [(name: String, secret: SecureBytes)] = []
        do throws(CommandFailure) {
            for (name, reference) in references {
                named.append((name, try reader.secret(try SecretReference(reference))))
            }
            // Every entry in one secure allocation, made once its size is known.
            do throws(Errno) {
                if !named.isEmpty {
                    entries = try SecureBytes.allocate(count: named.reduce(0) { $0 + $1.name.utf8.count + $1.secret.count + 2 },
                                                       in: reader.arena)
                }
                entries.withUnsafeMutableBytes { buffer in
                    var start = 0
                    for (name, secret) in named {
                        entryStarts.append(start)
                        for byte in (name + "=").utf8 {
                            buffer[start] = byte
                            start += 1
                        }
                        secret.withUnsafeBytes { UnsafeMutableRawBufferPointer(rebasing: buffer[start...]).copyMemory(from: $0) }
                        start += secret.count + 1  // (and its NUL, already zero)
                    }
                }
            } catch {
                throw CommandFailure("no secure memory for the secrets (\(error))")
            }
        } catch {
            secrets = reader.values
            wipe()
            throw error
        }
        secrets = reader.values
    }

    deinit {
        if owned { plain.forEach { free($0) } }
    }

    /// The environment as C strings (secret ones in place), for a spawn.
    package func withPointers<T>(_ body: (UnsafePointer<UnsafeMutablePointer<CChar>?>) throws(Errno) -> T) throws(Errno) -> T {
        var pointers: [UnsafeMutablePointer<CChar>?] = plain
        return try entries.withUnsafeMutableBytes { (bytes) throws(Errno) -> T in
            // (No secret entry: no memory, and no pointer into it.)
            if let base = bytes.baseAddress {
                for start in entryStarts { pointers.append((base + start).assumingMemoryBound(to: CChar.self)) }
            }
            pointers.append(nil)
            return try pointers.withUnsafeBufferPointer { (all) throws(Errno) -> T in
                guard let first = all.baseAddress else { throw .invalidArgument }  // (never: the list ends with nil)
                return try body(first)
            }
        }
    }

    /// Zeroes the entries (the child has its copy).
    package func wipeEntries() { entries.wipe() }

    /// Zeroes everything.
    package func wipe() {
        entries.wipe()
        for secret in secrets { secret.wipe() }
    }
}

extension StringProtocol {
    /// Without the characters of `set` at either end.
    package func trimmed(of set: String) -> String {
        let trimmed = self.drop { set.contains($0) }
        return String(trimmed.reversed().drop { set.contains($0) }.reversed())
    }
}
