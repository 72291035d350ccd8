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
    /// The requesting thread's process (FUSE's "pid" is the thread).
    let process: pid_t
    /// Its program (hash and path); nil when it could not be identified.
    let program: TrustedProgram?
    /// Why it is denied without asking; nil when it may be trusted or asked about.
    let refusal: String?
    /// Its parent process (what ran it).
    let parent: pid_t

    // What only a program not trusted needs ("allow once", a prompt) is read when needed:
    // the requester waits for its OPEN's answer meanwhile, so it is the same process.

    /// Its controlling terminal (`/dev/pts/N`), for the prompt.
    var terminal: String? { ProcessInspection.stat(of: process).flatMap { ProcessInspection.terminalPath($0.terminal) } }
    /// When the request came through mtmfs's own command line (`mtmfs find --print`,
    /// `git-credential-mtmfs`): that command, "PATH (pid N)". The program decided on is
    /// then its caller: trusting mtmfs would trust every script that runs it.
    var via: String? = nil
    /// The caller's own process when the request came `via` mtmfs's command line (`process`
    /// stays the one whose request waits), for the prompt to name.
    var viaCaller: pid_t? = nil

    /// The program's path as shown (control characters made visible).
    var path: String { Requester.printable(program?.path ?? "(unknown program)") }

    /// Text from a process (a path, a command name) made safe to show and record: control
    /// characters and bidirectional overrides become "?", so that no line can be forged.
    static func printable(_ text: String) -> String {
        // Printable ASCII, as nearly every path is: nothing to change.
        if text.utf8.allSatisfy({ $0 >= 0x20 && $0 < 0x7F }) { return text }
        return String(String.UnicodeScalarView(text.unicodeScalars.map { scalar in
            let value = scalar.value
            let hidden = value < 0x20 || value == 0x7F || (0x80...0x9F).contains(value) || (0x202A...0x202E).contains(value)
                || (0x2066...0x2069).contains(value) || value == 0x200E || value == 0x200F
            return hidden ? "?" : scalar
        }))
    }

    /// What ran it, nearest first, up to a session's leader: "/usr/bin/bash (1234)". Read
    /// when a prompt names it (the requester waits meanwhile, so its parents do too).
    var chain: [String] { parent > 1 ? RequesterInspector.chain(from: parent).map(Requester.printable) : [] }

    /// One process's run of a program: what "Allow once" allows (its start time, with the
    /// pid, names the process for good: pids are reused).
    var run: ProcessRun {
        ProcessRun(process: process, startTime: ProcessInspection.stat(of: process)?.startTime ?? 0, sha256: program?.sha256 ?? [])
    }

    /// Its program is mtmfs itself (the command line).
    let isMtmfs: Bool

    /// A requester denied before anything is known about it.
    static func refused(_ thread: pid_t, _ reason: String) -> Requester {
        Requester(process: thread, program: nil, refusal: reason, parent: 0, isMtmfs: false)
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
    private let digests = Locked<[FileIdentity: [UInt8]]>([:])
    private static let cacheLimit = 512
    /// The file system types of block devices, kept a few seconds: a block device holds one
    /// file system while it is mounted, and another takes an unmount and a mount (a removable
    /// disk's, through udisks, without root). Devices without one — tmpfs, overlay, FUSE —
    /// are asked every time: any user can unmount a FUSE mount of theirs and get its number
    /// back for another at once.
    private let blockDeviceTypes = Locked<[dev_t: (type: Int64, at: ContinuousClock.Instant)]>([:])
    private let daemonUser = geteuid()
    /// Mapped code already found where its path says, by device and inode: an `O_PATH`
    /// descriptor of each, so that the next process that maps it (every `cat` maps the same
    /// libc) is checked with an `fstat` of that very file — its mode and owner now — instead
    /// of a walk of its path through `/proc/PID/root`, which also leaves the kernel a /proc
    /// entry to take down at the process's exit. Only files of the daemon's root file
    /// system, which stays mounted while the daemon runs: a descriptor held on another
    /// would keep it from being unmounted.
    private let knownCode = Locked<[CodeFile: Int32]>([:])
    private let rootDevice: UInt64
    private static let knownCodeLimit = 256

    struct CodeFile: Hashable { let device: UInt64, inode: UInt64 }
    /// The daemon's own programs, its core and the `mtmfs` front beside it (`ProgramFiles`):
    /// the same files (or the same bytes) run as a command are mtmfs's command line, whose
    /// caller is what a decision is about.
    private let own: (versions: [FileIdentity], paths: [String], digests: Locked<[[UInt8]]?>)

    init() {
        let paths = ["/proc/self/exe"] + (ProgramFiles.running().map { ProgramFiles.fronts(besideCore: $0) } ?? [])
        own = (paths.compactMap { (try? Syscall.stat($0)).map(FileIdentity.init) }, paths, Locked(nil))
        rootDevice = (try? Syscall.stat("/")).map { UInt64($0.st_dev) } ?? .max
    }

    deinit {
        knownCode.withLock { known in for fd in known.values { Syscall.close(fd) } }
    }

    /// The mapped file `device`/`inode` as it is now: through the descriptor kept for it,
    /// else through its path as the thread sees it (`seen`), checked to be that very file
    /// (nil when it is not: replaced since) and kept for the next time.
    private func codeFile(_ seen: String, device: UInt64, inode: UInt64) -> stat? {
        let key = CodeFile(device: device, inode: inode)
        var st = stat()
        if let fd = knownCode.withLock({ $0[key] }), fstat(fd, &st) == 0 { return st }
        guard let named = try? Syscall.stat(seen), UInt64(named.st_ino) == inode, UInt64(named.st_dev) == device else { return nil }
        guard device == rootDevice, let fd = try? Syscall.openPath(seen) else { return named }
        // Kept only if the descriptor names the same file (the path may have changed between).
        guard fstat(fd, &st) == 0, UInt64(st.st_ino) == inode, UInt64(st.st_dev) == device else {
            Syscall.close(fd)
            return named
        }
        knownCode.withLock { known in
            if known.count >= Self.knownCodeLimit {
                for fd in known.values { Syscall.close(fd) }
                known.removeAll()
            }
            if let other = known.updateValue(fd, forKey: key) { Syscall.close(other) }
        }
        return named
    }

    /// The digests of the daemon's own programs, made at the first guarded request that
    /// needs them.
    private func ownDigests() -> [[UInt8]] {
        own.digests.withLock { digests in
            if let digests { return digests }
            let made = own.paths.compactMap { path -> [UInt8]? in
                guard let fd = try? Syscall.open(path, O_RDONLY) else { return nil }
                defer { Syscall.close(fd) }
                return try? ProgramDigest.sha256(of: fd)
            }
            digests = made
            return made
        }
    }

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
        let requester = inspectOne(thread: thread)
        guard requester.isMtmfs, requester.parent > 1 else { return requester }
        // mtmfs's command line asks for its caller: the caller is the one decided on, and
        // both must pass (neither traced, neither running writable code).
        var caller = inspectOne(thread: requester.parent)
        caller = Requester(process: requester.process, program: caller.program,
                           refusal: requester.refusal ?? caller.refusal.map { "its caller: " + $0 },
                           parent: caller.parent, isMtmfs: false)
        caller.via = "\(requester.path) (pid \(requester.process))"
        caller.viaCaller = requester.parent
        return caller
    }

    private func inspectOne(thread: pid_t) -> Requester {
        guard let status = ProcessInspection.decisionStatus(of: thread) else {
            return .refused(thread, "the requesting process is gone")
        }
        let process = status.process, credentials = status.credentials
        let pin: Int32
        do { pin = try ProcessInspection.pin(process) } catch { return .refused(thread, "the requesting process is gone") }
        defer { Syscall.close(pin) }
        // Its parent from the pidfd (Linux 6.13), else from /proc/PID/stat.
        guard let parent = ProcessInspection.parent(pinned: pin) ?? ProcessInspection.stat(of: process)?.parent else {
            return .refused(thread, "the requesting process is gone")
        }

        var refusal: String?
        // Traced (a debugger, strace): its memory and its reads belong to the tracer. A
        // tracer attaches to threads, and any thread's tracer reaches the whole process.
        var tracer = status.tracer
        if tracer == 0 && status.threads != 1 {
            let threads = ProcessInspection.threads(of: process)
            if threads != [thread] {
                tracer = threads.lazy.compactMap { ProcessInspection.decisionStatus(of: $0)?.tracer }.first { $0 != 0 } ?? 0
            }
        }
        if tracer != 0 {
            refusal = "it is being traced by pid \(tracer) (\(Requester.printable(ProcessState.name(of: tracer) ?? "?")))"
        }

        let mappings = ProcessInspection.codeMappings(of: thread)
        let (program, isMtmfs, exeProblem) = identify(thread, mappings: mappings ?? [])
        if refusal == nil { refusal = exeProblem }
        if program == nil && refusal == nil {
            refusal = "its program cannot be read (/proc/\(thread)/exe: a process that is not dumpable, or another user's)"
        }
        if refusal == nil {
            refusal = mappings.map { unsafeCode(of: thread, $0, credentials) } ?? "its memory map cannot be read (/proc/\(thread)/maps)"
        }

        // Still the process all of this was read from (pinned: its pid was not reused).
        guard ProcessInspection.isRunning(pinned: pin) else { return .refused(thread, "the requesting process is gone") }
        return Requester(process: process, program: program, refusal: refusal, parent: parent, isMtmfs: isMtmfs)
    }

    /// The program of a thread: its executable's digest (through /proc/TID/exe, the file
    /// the kernel runs, even if renamed or removed since) and its path — checked to name
    /// that file in the thread's own mount namespace, else marked unverified; whether it
    /// is mtmfs itself; and why it cannot be trusted, if it cannot (on a FUSE file system,
    /// whose owner may show the hash other bytes than the kernel runs).
    private func identify(_ thread: pid_t, mappings: [ProcessInspection.CodeMapping]) -> (TrustedProgram?, isMtmfs: Bool, problem: String?) {
        // The file the kernel runs (the link followed), opened only to be hashed.
        let exe = "/proc/\(thread)/exe"
        guard let st = try? Syscall.stat(exe) else { return (nil, false, nil) }
        let version = FileIdentity(st)
        let digest: [UInt8]
        if let known = digests.withLock({ $0[version] }) {
            digest = known
        } else {
            guard let fd = try? Syscall.open(exe, O_RDONLY) else { return (nil, false, nil) }
            defer { Syscall.close(fd) }
            var opened = stat()
            guard fstat(fd, &opened) == 0, FileIdentity(opened) == version, let made = try? ProgramDigest.sha256(of: fd) else {
                return (nil, false, nil)
            }
            digest = made
            digests.withLock { cache in
                if cache.count >= Self.cacheLimit { cache.remove(at: cache.startIndex) }
                cache[version] = made
            }
        }
        // Its path: the one its code mapping shows (the kernel's name of that very file, which
        // `unsafeCode` finds in the thread's mount namespace the first time, or refuses);
        // else read and checked here.
        let mapped = mappings.lazy.compactMap { mapping -> String? in
            guard case .file(let path, let device, let inode) = mapping, device == UInt64(st.st_dev), inode == UInt64(st.st_ino)
            else { return nil }
            return path
        }.first
        var path = mapped ?? ProcessInspection.executablePath(of: thread) ?? "(unknown path)"
        if mapped == nil {
            if let named = try? Syscall.stat("/proc/\(thread)/root" + path), named.st_dev == st.st_dev, named.st_ino == st.st_ino {
                // the path names the file the kernel runs
            } else {
                path += " (path not verified)"
            }
        }
        let isMtmfs = own.versions.contains(version) || ownDigests().contains(digest)
        let problem = fileSystemType(exe, device: st.st_dev) == ProcessInspection.fuseMagic
            ? "its program is on a FUSE file system (\(Requester.printable(path)))" : nil
        return (TrustedProgram(sha256: digest, path: path), isMtmfs, problem)
    }

    private func fileSystemType(_ path: String, device: dev_t) -> Int64? {
        cachedType(device) { ProcessInspection.fileSystemType(path) }
    }

    private func cachedType(_ device: dev_t, _ ask: () -> Int64?) -> Int64? {
        guard ProcessInspection.majorNumber(UInt64(device)) != 0 else { return ask() }  // not a block device
        let now = ContinuousClock.now
        if let known = blockDeviceTypes.withLock({ $0[device] }), known.at.duration(to: now) < .seconds(5) { return known.type }
        guard let type = ask() else { return nil }
        blockDeviceTypes.withLock { types in
            if types.count >= 64 { types.removeAll() }
            types[device] = (type, now)
        }
        return type
    }

    /// Why the code a thread maps makes it untrustworthy, if it does: a mapped file its
    /// user can write (a copied binary, an LD_PRELOAD library), a memfd, a file removed
    /// or replaced since it was mapped.
    private func unsafeCode(of thread: pid_t, _ mappings: [ProcessInspection.CodeMapping],
                            _ credentials: ProcessInspection.Credentials) -> String? {
        for mapping in mappings {
            switch mapping {
            case .anonymous:
                continue
            case .memfd(let name):
                return "it runs code from a file without a name (\(name))"
            case .deletedFile(let path):
                return "it runs code from a file removed since (\(path))"
            case .file(let path, let device, let inode):
                // The very file it mapped: known, or found by its path as the thread sees it
                // (its mount namespace).
                let seen = "/proc/\(thread)/root" + path
                let shown = Requester.printable(path)
                guard let st = codeFile(seen, device: device, inode: inode) else {
                    return "it runs code from a file replaced since (\(shown))"
                }
                // (An ACL entry can grant its user write access only when the mask allows it;
                // `access` asks the kernel then, as the daemon runs as that user.)
                if credentials.mayWrite(st) || (credentials.uid == daemonUser && ProcessInspection.Credentials.aclMayGrantWrite(st)
                                                && (try? Syscall.access(seen, W_OK)) != nil) {
                    return "it runs code from \(shown), which its user (uid \(credentials.uid)) can write"
                }
                if fileSystemType(seen, device: st.st_dev) == ProcessInspection.fuseMagic {
                    return "it runs code from a FUSE file system (\(shown))"
                }
            }
        }
        return nil
    }

    /// What ran a process: its parent, the parent's parent … up to the session leader.
    /// Ancestors live long and are asked about again and again (every `cat` of a script
    /// has the same shell): the chain above a process is kept a few seconds with a pidfd of
    /// that process, which says whether it still runs without reading /proc (a pid reused
    /// is another process, and the pidfd of the old one reads as ended).
    static func chain(from parent: pid_t) -> [String] {
        let now = ContinuousClock.now
        let kept = chains.withLock { chains -> [String]? in
            guard let kept = chains[parent] else { return nil }
            if kept.at.duration(to: now) < .seconds(5) && ProcessInspection.isRunning(pinned: kept.pin) { return kept.chain }
            Syscall.close(kept.pin)
            chains[parent] = nil
            return nil
        }
        if let kept { return kept }
        // Pinned first, read, then checked: the chain read is that process's.
        guard let pin = try? ProcessInspection.pin(parent) else { return [] }
        var chain: [String] = []
        var next = parent
        var current = ProcessInspection.stat(of: parent)
        while next > 1, chain.count < 12, let process = current {
            let program = ProcessInspection.executablePath(of: next) ?? process.command
            chain.append("\(program) (\(next))")
            if next == process.session { break }  // a session leader (the login shell, a terminal's)
            next = process.parent
            current = ProcessInspection.stat(of: next)
        }
        guard ProcessInspection.isRunning(pinned: pin) else {
            Syscall.close(pin)
            return chain
        }
        chains.withLock { kept in
            if kept.count >= 64 {
                for entry in kept.values { Syscall.close(entry.pin) }
                kept.removeAll()
            }
            if let replaced = kept.updateValue((pin, now, chain), forKey: parent) { Syscall.close(replaced.pin) }
        }
        return chain
    }

    private static let chains = Locked<[pid_t: (pin: Int32, at: ContinuousClock.Instant, chain: [String])]>([:])
}
