#if canImport(Glibc)
import Glibc
#endif
import CredentialVault
import Posix

/// The program behind one request (SPEC §3a): what the kernel runs for the requesting
/// thread, identified by its content's SHA-256, with what started it — or why it is denied
/// without asking (traced, code its user can write, a program that cannot be read).
///
/// Thread-safety: a value.
struct Requester: Sendable {
    /// The requesting thread (FUSE's "pid") and its process.
    let thread: pid_t
    let process: pid_t
    /// With `process`, names this process for good (pids are reused).
    let startTime: UInt64
    /// Its program (hash and path); nil when it could not be identified.
    let program: TrustedProgram?
    /// Why it is denied without asking; nil when it may be trusted or asked about.
    let refusal: String?
    /// Its parent process (what ran it).
    let parent: pid_t
    /// Its controlling terminal (`/dev/pts/N`), for the prompt.
    let terminal: String?

    var path: String { program?.path ?? "(unknown program)" }

    /// What ran it, nearest first, up to a session's leader: "/usr/bin/bash (1234)". Read
    /// when a prompt names it (the requester waits meanwhile, so its parents do too).
    var chain: [String] { parent > 1 ? RequesterInspector.chain(from: parent) : [] }

    /// One process's run of a program: what "Allow once" allows.
    var run: ProcessRun { ProcessRun(process: process, startTime: startTime, sha256: program?.sha256 ?? []) }

    /// A requester denied before anything is known about it.
    static func refused(_ thread: pid_t, _ reason: String) -> Requester {
        Requester(thread: thread, process: thread, startTime: 0, program: nil, refusal: reason, parent: 0, terminal: nil)
    }
}

/// One run of a program by one process (pid, start time, program hash).
///
/// Thread-safety: a value.
struct ProcessRun: Hashable, Sendable {
    let process: pid_t
    let startTime: UInt64
    let sha256: [UInt8]

    /// Whether that process still runs that run (not exited, pid not reused).
    var isRunning: Bool { ProcessInspection.stat(of: process)?.startTime == startTime }
}

/// Finds out who makes a request, from /proc. Hashes each program once per version of
/// its file (device, inode, size, modification and change times).
///
/// Thread-safety: the digest cache is behind a mutex; /proc is read without it.
final class RequesterInspector: Sendable {
    private struct FileVersion: Hashable {
        let device: UInt64, inode: UInt64, size: Int64, modified: Int64, changed: Int64
    }

    private let digests = Locked<[FileVersion: [UInt8]]>([:])
    private static let cacheLimit = 512

    /// Interpreters: trusting one trusts every script it runs (the prompt says so).
    static let interpreters: Set<String> = ["sh", "bash", "dash", "zsh", "ksh", "mksh", "fish", "csh", "tcsh", "busybox",
                                            "python", "python2", "python3", "perl", "ruby", "node", "nodejs", "lua",
                                            "php", "tclsh", "wish", "awk", "gawk", "mawk", "env", "osascript", "pwsh",
                                            "java", "deno", "bun", "guile", "racket", "sbcl", "R", "Rscript", "expect"]

    static func isInterpreter(_ path: String) -> Bool {
        let base = path.split(separator: "/").last.map(String.init) ?? path
        if interpreters.contains(base) { return true }
        // python3.11, perl5.36, lua5.4 …
        let stem = String(base.prefix { !$0.isNumber && $0 != "." && $0 != "-" })
        return stem != base && interpreters.contains(stem)
    }

    /// Who `thread` is. The caller of an OPEN sleeps until it is answered, so it cannot
    /// exit or exec meanwhile; it is pinned anyway (pidfd), and checked to be the same
    /// process after everything was read.
    func inspect(thread: pid_t) -> Requester {
        guard let status = ProcessInspection.decisionStatus(of: thread) else {
            return .refused(thread, "the requesting process is gone")
        }
        let process = status.process, credentials = status.credentials
        let pin: Int32
        do { pin = try ProcessInspection.pin(process) } catch { return .refused(thread, "the requesting process is gone") }
        defer { Syscall.close(pin) }
        guard let stat = ProcessInspection.stat(of: process) else { return .refused(thread, "the requesting process is gone") }

        var refusal: String?
        // Traced (a debugger, strace): its memory and its reads belong to the tracer.
        // (The thread's, and its process's when another thread asks: a tracer attaches to threads.)
        let processTracer = process == thread ? status.tracer : ProcessInspection.decisionStatus(of: process)?.tracer ?? 0
        if let tracer = [status.tracer, processTracer].first(where: { $0 != 0 }) {
            refusal = "it is being traced by pid \(tracer) (\(ProcessState.name(of: tracer) ?? "?"))"
        }

        let program = identify(thread)
        if program == nil && refusal == nil {
            refusal = "its program cannot be read (/proc/\(thread)/exe: a process that is not dumpable, or another user's)"
        }
        if refusal == nil { refusal = unsafeCode(of: thread, credentials) }

        let terminal = ProcessInspection.terminalPath(stat.terminal)
        // Still the process all of this was read from (pinned: its pid was not reused).
        guard ProcessInspection.isRunning(pinned: pin) else { return .refused(thread, "the requesting process is gone") }
        return Requester(thread: thread, process: process, startTime: stat.startTime, program: program,
                         refusal: refusal, parent: stat.parent, terminal: terminal)
    }

    /// The program of a thread: its executable's digest (through /proc/TID/exe, the file
    /// the kernel runs, even if renamed or removed since) and its path.
    private func identify(_ thread: pid_t) -> TrustedProgram? {
        guard let fd = try? Syscall.open("/proc/\(thread)/exe", O_RDONLY) else { return nil }
        defer { Syscall.close(fd) }
        var st = stat()
        guard fstat(fd, &st) == 0 else { return nil }
        let version = FileVersion(device: UInt64(st.st_dev), inode: UInt64(st.st_ino), size: Int64(st.st_size),
                                  modified: Int64(st.st_mtim.tv_sec) * 1_000_000_000 + Int64(st.st_mtim.tv_nsec),
                                  changed: Int64(st.st_ctim.tv_sec) * 1_000_000_000 + Int64(st.st_ctim.tv_nsec))
        let digest: [UInt8]
        if let known = digests.withLock({ $0[version] }) {
            digest = known
        } else {
            guard let made = try? ProgramDigest.sha256(of: fd) else { return nil }
            digest = made
            digests.withLock { cache in
                if cache.count >= Self.cacheLimit { cache.removeAll() }
                cache[version] = made
            }
        }
        let path = ProcessInspection.executablePath(of: thread) ?? "(unknown path)"
        return TrustedProgram(sha256: digest, path: path)
    }

    /// Why the code a thread maps makes it untrustworthy, if it does: a mapped file its
    /// user can write (a copied binary, an LD_PRELOAD library), a memfd, a file removed
    /// or replaced since it was mapped.
    private func unsafeCode(of thread: pid_t, _ credentials: ProcessInspection.Credentials) -> String? {
        guard let mappings = ProcessInspection.codeMappings(of: thread) else {
            return "its memory map cannot be read (/proc/\(thread)/maps)"
        }
        for mapping in mappings {
            switch mapping {
            case .anonymous:
                continue
            case .memfd(let name):
                return "it runs code from a file without a name (\(name))"
            case .deletedFile(let path):
                return "it runs code from a file removed since (\(path))"
            case .file(let path, let inode):
                guard let st = try? Syscall.stat(path), UInt64(st.st_ino) == inode else {
                    return "it runs code from a file replaced since (\(path))"
                }
                if credentials.mayWrite(st) {
                    return "it runs code from \(path), which its user (uid \(credentials.uid)) can write"
                }
            }
        }
        return nil
    }

    /// What ran a process: its parent, the parent's parent … up to the session leader.
    static func chain(from parent: pid_t) -> [String] {
        var chain: [String] = []
        var next = parent
        while next > 1 && chain.count < 12 {
            guard let parent = ProcessInspection.stat(of: next) else { break }
            let program = ProcessInspection.executablePath(of: next) ?? parent.command
            chain.append("\(program) (\(next))")
            if next == parent.session { break }  // a session leader (the login shell, a terminal's)
            next = parent.parent
        }
        return chain
    }
}
