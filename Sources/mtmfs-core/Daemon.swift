#if canImport(Glibc)
import Glibc
#endif
import FuseLowLevel
import CredentialVault
import ScriptCommands
import MountAssembly
import MountedTree
import Posix

/// Starting the mount daemon and hearing from it.
///
/// `mtmfs mount` starts a copy of itself (`mount --ready-fd 3 …`) in a new session, with
/// standard input and output on /dev/null and the write end of a pipe as fd 3. The
/// daemon writes `ready` once the mount answers a stat, or `error: MESSAGE` if it cannot
/// mount, and closes the pipe. So `mtmfs mount … && ls MOUNT` never races the mount.
enum Daemon {
    /// Starts the daemon and waits for its word; returns its pid once the mount is ready.
    static func start(dataDirectory: String, mountPoint: String, options: [String],
                      autoLockSeconds: Int = 900, cacheLimit: Int64? = nil, pinentry: String = "pinentry",
                      debug: Bool = false, discardDataDirectory: Bool = false) throws(CommandFailure) -> pid_t {
        if let problem = FuseDevice.problem() { throw CommandFailure("cannot mount on \(mountPoint): \(problem)") }
        let pipe: (read: Int32, write: Int32)
        do {
            pipe = try Syscall.pipe()
        } catch {
            throw CommandFailure("cannot start the daemon: \(error)")
        }
        var arguments = [Paths.executable(), "mount", "--ready-fd", "3", "--data-dir", dataDirectory,
                         "--auto-lock", String(autoLockSeconds)]
        if let cacheLimit { arguments += ["--cache-limit", String(cacheLimit)] }
        if debug { arguments.append("--debug") }
        if discardDataDirectory { arguments.append("--discard-data-dir") }
        // A relative path means the caller's directory; the daemon runs in /.
        arguments += ["--pinentry", pinentry.contains("/") ? Paths.absolute(pinentry) : pinentry]
        for option in options { arguments += ["-o", option] }
        arguments.append(mountPoint)

        let started = Result { () throws(Errno) in
            try Spawn.start(arguments[0], Array(arguments.dropFirst()), stdin: .null, stdout: .null, stderr: .null,
                            passing: [(pipe.write, as: 3)])
        }
        Syscall.close(pipe.write)
        defer { Syscall.close(pipe.read) }
        let pid: pid_t
        do {
            pid = try started.get()
        } catch {
            throw CommandFailure("cannot start the daemon \(arguments[0]): \(error)")
        }
        // Lines: `note: …` (a step that takes long: said on standard error, a terminal's
        // line rewritten in place), then `ready` or `error: …`.
        var word = ""
        var pending: [UInt8] = []
        var noted = false
        reading: while true {
            var buffer = [UInt8](repeating: 0, count: 512)
            let n = read(pipe.read, &buffer, buffer.count)
            if n < 0 && errno == EINTR { continue }
            if n <= 0 { word = String(decoding: pending, as: UTF8.self); break }
            pending += buffer[0..<n]
            while let newline = pending.firstIndex(of: 0x0A) {
                let line = String(decoding: pending[..<newline], as: UTF8.self)
                pending.removeSubrange(...newline)
                if line.hasPrefix("note: ") {
                    let text = "mtmfs: " + line.dropFirst("note: ".count)
                    if isatty(2) == 1 {
                        Terminal.error("\r\u{1B}[K" + text, newline: false)
                    } else {
                        Terminal.error(text)
                    }
                    noted = true
                } else {
                    word = line
                    break reading
                }
            }
        }
        if noted && isatty(2) == 1 { Terminal.error("") }
        if word == "ready" { return pid }
        let status = Spawn.wait(pid)
        if word.hasPrefix("error: ") {
            throw CommandFailure(String(word.dropFirst("error: ".count)))
        }
        throw CommandFailure("the daemon exited before the mount was ready (status \(status)); run `mtmfs mount -f …` to see why")
    }

    /// The daemon side: detach, mount, report, serve until the mount ends.
    static func serve(dataDirectory: String, mountPoint: String, options: [String], autoLockSeconds: Int,
                      cacheLimit: Int64?, pinentry: String, readyFD: Int32?) throws(CommandFailure) {
        if let readyFD {
            setsid()
            _ = fcntl(readyFD, F_SETFD, FD_CLOEXEC)
            Log.use(.syslog)
        }
        // Besides syslog (or the terminal): a file in the data directory a user can always read.
        Log.alsoWrite(to: Paths.absolute(dataDirectory) + "/mtmfs.log")
        chdir("/")
        Syscall.limitHeapArenas(2)
        try? Syscall.forbidCoreDumps()
        try? Syscall.raiseOpenFileLimit()
        KeyDerivationChild.use()
        let report: @Sendable (String) -> Void = { word in
            guard let readyFD else { return }
            try? Syscall.writeAll(readyFD, Array((word + "\n").utf8))
            Syscall.close(readyFD)
        }
        // Said while mounting (before `ready`): to the waiting `mtmfs mount`, or the terminal.
        let note: (String) -> Void = { text in
            Log.info(text)
            if let readyFD {
                try? Syscall.writeAll(readyFD, Array(("note: " + text + "\n").utf8))
            } else {
                Terminal.error("mtmfs: " + text)
            }
        }
        let mount: MtmfsMount
        do {
            mount = try MtmfsMount(dataDirectory: DataDirectory(path: dataDirectory), mountPoint: mountPoint,
                                   options: options, autoLockSeconds: autoLockSeconds, cacheLimit: cacheLimit,
                                   pinentry: pinentry.contains("/") ? Paths.absolute(pinentry) : pinentry, progress: note)
        } catch {
            // In the foreground the command's own failure line says it (one line, not two).
            if readyFD != nil { Log.error(error.description) }
            report("error: \(error.description)")
            throw CommandFailure(error.description)
        }
        let status = mount.run {
            if readyFD == nil {
                Terminal.error("mtmfs: \(dataDirectory) mounted on \(mountPoint); Ctrl-C or `mtmfs unmount \(mountPoint)` ends it")
            }
            report("ready")
        }
        if status != 0 { throw CommandFailure("the FUSE loop ended with an error (\(status))") }
    }
}

extension String {
    func trimmingSuffix(_ suffix: String) -> String {
        hasSuffix(suffix) ? String(dropLast(suffix.count)) : self
    }
}

/// The daemon's key derivations run in a child process: its own executable (the running
/// file, even once a package upgrade replaced it) with a command no user types.
enum KeyDerivationChild {
    static let command = "internal-derive-key"

    static func use() { KeyDerivation.useChildProcess(["/proc/self/exe", command]) }
}

