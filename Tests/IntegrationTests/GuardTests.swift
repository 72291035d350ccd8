import CredentialVault
import SecureMemory
import Foundation
import Posix
import TestSupport
import Testing
#if canImport(Glibc)
import Glibc
#endif

/// A guarded vault mounted by a normal user (nobody: a root requester can write every file
/// and would be refused as running writable code), in a mount namespace of the test's own
/// where /dev/fuse is a 0666 copy (this machine's is 0600; nothing outside sees either).
/// Requesters run as nobody inside that namespace (`nsenter`), so the daemon sees real
/// programs; prompts go to a pinentry of the test's own that answers from a file and
/// records what it was asked.
final class GuardedMount {
    static let uuid = "6BA7B810-9DAD-11D1-80B4-00C04FD430C8"
    static let other = "F47AC10B-58CC-4372-A567-0E02B2C3D479"
    static let asNobody = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
    /// Run first in a new mount namespace: its copies of the FUSE mounts outside (other
    /// suites' daemons) go, or each would keep its daemon alive after its own unmount.
    static let dropOtherFuseMounts = #"awk '$3 ~ /^fuse/ {print $2}' /proc/self/mounts | while read -r m; do umount -l "$m" 2>/dev/null || true; done"#

    let scratch = Scratch("guard")
    var data: String { scratch.sub("data") }
    var mountPoint: String { scratch.sub("mnt") }
    /// Writable by nobody: copies of programs, the pinentry's record.
    var writable: String { scratch.sub("w") }
    var asked: String { writable + "/asked" }
    var answerFile: String { scratch.sub("answer") }
    var log: String { scratch.sub("daemon.log") }
    private(set) var daemon: pid_t = 0
    let pinentry: String
    let display: Bool
    /// With `secretService`: a session bus of the test's own, run as nobody, which the daemon
    /// serves the Secret Service on.
    private(set) var busAddress: String?
    private var busPid: pid_t = 0

    /// `pinentry`: nil for the test's own; `display`: whether the daemon has a DISPLAY
    /// (the requesters here have no terminal, so without one nothing can be asked).
    /// `writablePinentry`: the test's pinentry copied where the mount's user can change it.
    init(pinentry: String? = nil, display: Bool = true, guarded: Bool = true, writablePinentry: Bool = false,
         secretService: Bool = false) throws {
        self.pinentry = writablePinentry ? scratch.sub("w") + "/pinentry" : pinentry ?? scratch.sub("pinentry")
        self.display = display
        for directory in [data, mountPoint, writable] {
            mkdir(directory, 0o700)
            chown(directory, 65534, 65534)
        }
        try TestFile.writeProgram(Self.pinentryScript(answers: answerFile, record: asked), to: scratch.sub("pinentry"))
        if writablePinentry {
            try TestFile.writeProgram(Self.pinentryScript(answers: answerFile, record: asked), to: self.pinentry)
            chown(self.pinentry, 65534, 65534)
        }
        try (Run.passphrase + "\n").write(toFile: scratch.sub("pass"), atomically: true, encoding: .utf8)
        try "wrong\n".write(toFile: scratch.sub("wrong"), atomically: true, encoding: .utf8)
        chmod(scratch.sub("pass"), 0o644)
        chmod(scratch.sub("wrong"), 0o644)
        answer("cancel")
        let made = Run.program("setpriv", Array(Self.asNobody.dropFirst()) + ["env", "HOME=\(scratch.path)", Run.mtmfs, "init",
                               "--kdf", "interactive", "--data-dir", data, "--passphrase-file", scratch.sub("pass")]
                               + (guarded ? ["--guard"] : []))
        try #require(made.status == 0, "init: \(made)")
        if secretService {
            let bus = Run.program("setpriv", Array(Self.asNobody.dropFirst()) + [
                "dbus-daemon", "--session", "--fork", "--nopidfile", "--print-address=1", "--print-pid=1",
                "--address=unix:path=\(writable)/bus"])
            let lines = bus.stdout.split(separator: "\n").map(String.init)
            try #require(bus.status == 0 && lines.count >= 2, "dbus-daemon: \(bus)")
            (busAddress, busPid) = (lines[0], pid_t(lines[1]) ?? 0)
        }
        try mount()
        try #require(mtmfs("unlock", "--passphrase-file", scratch.sub("pass"), mountPoint).status == 0)
    }

    /// Mounts (again) in a new namespace; the daemon runs in the foreground as nobody.
    func mount() throws {
        let device = scratch.sub("fuse")
        let environment = "HOME=\(scratch.path)" + (display ? " DISPLAY=:mtmfs-test" : "")
            + (busAddress.map { " DBUS_SESSION_BUS_ADDRESS=\($0)" } ?? "")
        let service = busAddress == nil ? "" : "--secret-service"
        let script = """
            \(GuardedMount.dropOtherFuseMounts)
            [ -e \(device) ] || { mknod \(device) c 10 229 && chmod 0666 \(device); } &&
            mount --bind \(device) /dev/fuse &&
            exec \(Self.asNobody.joined(separator: " ")) env -u DISPLAY -u WAYLAND_DISPLAY \(environment) \
            \(Run.mtmfs) mount -f \(service) --data-dir \(data) --pinentry \(pinentry) \(mountPoint)
            """
        daemon = Run.start("unshare", ["-m", "--propagation", "private", "/bin/sh", "-c", script], stderr: log)
        try #require(daemon > 0)
        let mounted = Poll.until(seconds: 20) {
            ((try? String(contentsOfFile: "/proc/\(daemon)/mounts", encoding: .utf8)) ?? "").contains(" \(mountPoint) fuse.mtmfs ")
        }
        try #require(mounted, "the mount did not come up: \((try? String(contentsOfFile: log, encoding: .utf8)) ?? "")")
    }

    func unmount() {
        guard daemon > 0 else { return }
        Run.program("nsenter", ["-t", "\(daemon)", "-m", "fusermount3", "-u", mountPoint], timeout: 20)
        if Run.wait(daemon, timeout: 20) != 0 { kill(daemon, SIGKILL) }
        daemon = 0
    }

    func close() {
        unmount()
        if busPid > 0 {
            kill(busPid, SIGTERM)
            _ = Poll.until(seconds: 5) { !ProcessState.isRunning(self.busPid) }
        }
        scratch.remove()
    }

    /// Runs a program as nobody inside the mount's namespace.
    @discardableResult
    func run(_ program: String, _ arguments: [String], environment: [String] = [], timeout: Double = 120) -> CommandResult {
        Run.program("nsenter", ["-t", "\(daemon)", "-m"] + Self.asNobody + ["env", "-u", "DISPLAY", "HOME=\(scratch.path)"]
                    + busEnvironment + environment + [program] + arguments, timeout: timeout)
    }

    var busEnvironment: [String] { busAddress.map { ["DBUS_SESSION_BUS_ADDRESS=\($0)"] } ?? [] }

    @discardableResult
    func shell(_ line: String) -> CommandResult { run("/bin/sh", ["-c", line]) }

    /// Starts a program as nobody inside the namespace, in the background; its pid (that of
    /// the program itself: nsenter, setpriv and env each exec the next).
    func start(_ program: String, _ arguments: [String]) -> pid_t {
        Run.start("nsenter", ["-t", "\(daemon)", "-m"] + Self.asNobody + ["env", "-u", "DISPLAY"] + busEnvironment + [program] + arguments)
    }

    @discardableResult
    func mtmfs(_ arguments: String...) -> CommandResult { run(Run.mtmfs, arguments) }

    func path(_ relative: String) -> String { mountPoint + "/" + relative }
    var password: String { path("accounts/\(Self.uuid)/password") }

    /// What the test's pinentry answers next: ok (Allow once), notok (Always allow, then the
    /// passphrase), cancel (Deny), hang (never), passphrase (the passphrase when asked only
    /// for it), anything else a wrong passphrase.
    func answer(_ word: String) {
        try? (word + "\n").write(toFile: answerFile, atomically: true, encoding: .utf8)
        chmod(answerFile, 0o644)
    }

    /// How many questions (CONFIRM) the pinentry was asked, and all it was told.
    var prompts: Int { record.components(separatedBy: "CONFIRM").count - 1 }
    var record: String { (try? String(contentsOfFile: asked, encoding: .utf8)) ?? "" }
    var decisions: String { run("/bin/cat", [path(".mtmfs/access")]).stdout }
    var daemonLog: String { (try? String(contentsOfFile: log, encoding: .utf8)) ?? "" }

    /// The account with a password, made by mkdir (trusted with it from the start) and
    /// written by dd, allowed once at a prompt.
    func makeAccount(_ name: String = GuardedMount.uuid, password value: String = "hunter2") throws {
        try #require(run("/usr/bin/mkdir", [path("accounts/\(name)")]).status == 0)
        answer("ok")
        let written = shell("printf '%s\\n' '\(value)' | dd of=\(path("accounts/\(name)/password")) status=none")
        try #require(written.status == 0, "\(written)\nasked: \(record)\ndecisions: \(decisions)\nlog: \(daemonLog)")
        try #require(shell("echo 'mail for \(name)' > \(path("accounts/\(name)/label"))").status == 0)
        answer("cancel")
    }

    /// A copy of `/usr/bin/head` in a directory of the test's (root's: nobody cannot write
    /// it), trusted with the account; its path.
    func trustedReader() -> String {
        let bin = scratch.sub("bin")
        mkdir(bin, 0o755)
        let program = bin + "/reader"
        #expect(Run.shell("cp /usr/bin/head \(program) && chmod 755 \(program)").status == 0)
        #expect(mtmfs("trust", "--passphrase-file", scratch.sub("pass"), path("accounts/\(GuardedMount.uuid)"), program).status == 0)
        return program
    }

    /// The tests' pinentry (`TestPinentry`), with this suite's passphrase.
    static func pinentryScript(answers: String, record: String) -> String {
        TestPinentry.script(answers: answers, record: record, passphrase: Run.passphrase)
    }
}

@Suite(.serialized, .enabled(if: FuseAvailability.isAvailable))
struct GuardTests {
    /// Deny, allow once (asked again next time), always allow (no prompt next time, survives
    /// a remount, for that account only); what the prompt says; the decisions recorded
    /// without a value; the trusted list sealed, not in clear in the data directory.
    @Test func thePromptsAnswersAreHonoured() throws {
        let mount = try GuardedMount()
        defer { mount.close() }
        try mount.makeAccount()
        try mount.makeAccount(GuardedMount.other, password: "other-secret")
        let head = ["-c", "100"]

        mount.answer("cancel")
        let denied = mount.run("/usr/bin/head", head + [mount.password])
        #expect(denied.status == 1 && denied.stderr.contains("Permission denied"), "\(denied)")
        let asked = mount.prompts
        #expect(asked >= 1)
        #expect(mount.record.contains("SETDESC") && mount.record.contains("/usr/bin/head"), "\(mount.record)")
        #expect(mount.record.contains("SETOK Allow") && mount.record.contains("SETNOTOK") && mount.record.contains("SETCANCEL"))
        #expect(mount.record.contains("Run by:"), "the prompt names what ran the requester: \(mount.record)")

        mount.answer("ok")
        #expect(mount.run("/usr/bin/head", head + [mount.password]).stdout == "hunter2\n")
        mount.answer("cancel")
        #expect(mount.run("/usr/bin/head", head + [mount.password]).status == 1, "allowed once: asked again, denied")
        #expect(mount.prompts == asked + 2)

        // Always allow needs the passphrase (typed into the pinentry); a wrong one, or the
        // window closed, is a no.
        for refusal in ["notok-wrong", "close"] {
            mount.answer(refusal)
            #expect(mount.run("/usr/bin/head", head + [mount.password]).status == 1, "\(refusal)")
        }
        #expect(mount.record.contains("GETPIN"), "the passphrase was asked")
        #expect(!mount.run("/bin/cat", [mount.path("accounts/\(GuardedMount.uuid)/trusted")]).stdout.contains("/usr/bin/head"))
        mount.answer("notok")
        #expect(mount.run("/usr/bin/head", head + [mount.password]).stdout == "hunter2\n")
        mount.answer("cancel")
        let before = mount.prompts
        #expect(mount.run("/usr/bin/head", head + [mount.password]).stdout == "hunter2\n", "always: no prompt")
        #expect(mount.prompts == before)
        let trusted = mount.run("/bin/cat", [mount.path("accounts/\(GuardedMount.uuid)/trusted")]).stdout
        #expect(trusted.contains(" /usr/bin/head\n") && trusted.contains(" /usr/bin/mkdir\n"), "\(trusted)")
        // Per account: the other one asks (and is denied).
        #expect(mount.run("/usr/bin/head", head + [mount.path("accounts/\(GuardedMount.other)/password")]).status == 1)
        #expect(mount.prompts == before + 1)

        // The record: every decision, no value.
        let decisions = mount.decisions
        #expect(decisions.contains("denied (denied at the prompt) account=\(GuardedMount.uuid) field=password"), "\(decisions)")
        #expect(decisions.contains("allowed (allowed once at the prompt)"))
        #expect(decisions.contains("refused: a wrong passphrase"), "\(decisions)")
        #expect(decisions.contains("allowed (trusted)") && decisions.contains("program=/usr/bin/head"))
        for value in ["hunter2", "other-secret"] {
            #expect(!decisions.contains(value))
            #expect(!mount.daemonLog.contains(value))
        }
        // Not in clear in the data directory: no path, no hash (but in the daemon's log,
        // which says every decision as syslog does).
        let hash = String(trusted.prefix(64))
        #expect(Run.shell("grep -rlaF --exclude='mtmfs.log*' -e /usr/bin/head -e \(hash) \(mount.data)").stdout.isEmpty)

        // Survives a remount (and the passphrase).
        mount.unmount()
        try mount.mount()
        #expect(mount.mtmfs("unlock", "--passphrase-file", mount.scratch.sub("pass"), mount.mountPoint).status == 0)
        let again = mount.prompts
        #expect(mount.run("/usr/bin/head", head + [mount.password]).stdout == "hunter2\n")
        #expect(mount.prompts == again)
        let status = mount.mtmfs("status", mount.mountPoint).stdout
        #expect(status.contains("guard: on"), "\(status)")
        // Where any program of the user may trace another, status says so.
        let scope = (try? String(contentsOfFile: "/proc/sys/kernel/yama/ptrace_scope", encoding: .utf8))?
            .trimmingCharacters(in: .whitespacesAndNewlines)
        if scope == nil || scope == "0" {
            #expect(status.contains("warning: kernel.yama.ptrace_scope is"), "\(status)")
        } else {
            #expect(!status.contains("ptrace_scope"), "\(status)")
        }
    }

    /// trust/untrust need the passphrase (a wrong one exits 1 and changes nothing); guard
    /// off makes every program read as in §3, on again guards.
    @Test func trustUntrustAndGuardNeedThePassphrase() throws {
        let mount = try GuardedMount()
        defer { mount.close() }
        try mount.makeAccount()
        let account = mount.path("accounts/\(GuardedMount.uuid)")
        let list = { mount.run("/bin/cat", [account + "/trusted"]).stdout }
        let wrong = mount.mtmfs("trust", "--passphrase-file", mount.scratch.sub("wrong"), account, "cat")
        #expect(wrong.status == 1 && wrong.stderr.contains("wrong passphrase"), "\(wrong)")
        #expect(!list().contains("/usr/bin/cat"))
        // Through a view's link, by name in PATH.
        #expect(mount.run("/bin/ls", [mount.path("accounts/by-label/")]).stdout.contains("mail for"))
        let trusted = mount.mtmfs("trust", "--passphrase-file", mount.scratch.sub("pass"), account, "cat")
        #expect(trusted.status == 0, "\(trusted)")
        #expect(list().contains(" /usr/bin/cat\n"))
        let before = mount.prompts
        #expect(mount.run("/bin/cat", [mount.password]).stdout == "hunter2\n")
        #expect(mount.prompts == before)

        #expect(mount.mtmfs("untrust", "--passphrase-file", mount.scratch.sub("wrong"), account, "cat").status == 1)
        #expect(list().contains(" /usr/bin/cat\n"))
        #expect(mount.mtmfs("untrust", "--passphrase-file", mount.scratch.sub("pass"), account, "/bin/cat").status == 0)
        #expect(!list().contains("/usr/bin/cat"))
        #expect(mount.run("/bin/cat", [mount.password]).status == 1)

        #expect(mount.mtmfs("guard", "off", "--passphrase-file", mount.scratch.sub("wrong"), mount.mountPoint).status == 1)
        #expect(mount.run("/bin/cat", [mount.password]).status == 1, "a wrong passphrase leaves guarding on")
        #expect(mount.mtmfs("guard", "off", "--passphrase-file", mount.scratch.sub("pass"), mount.mountPoint).status == 0)
        let asked = mount.prompts
        #expect(mount.run("/bin/cat", [mount.password]).stdout == "hunter2\n", "guard off: as §3")
        #expect(mount.shell("echo other > \(account)/server").status == 0)
        #expect(mount.prompts == asked)
        // A descriptor opened while guarding was off ends when it goes on (never decided).
        let held = mount.shell("exec 3< \(mount.password); \(Run.mtmfs) guard on --passphrase-file \(mount.scratch.sub("pass")) "
                               + "\(mount.mountPoint) >/dev/null && cat <&3")
        #expect(held.status != 0 && !held.stdout.contains("hunter2"), "\(held)")
        // On again, even locked: the command unlocks with the passphrase first.
        #expect(mount.mtmfs("lock", mount.mountPoint).status == 0)
        #expect(mount.mtmfs("guard", "on", "--passphrase-file", mount.scratch.sub("pass"), mount.mountPoint).status == 0)
        #expect(mount.run("/bin/cat", [mount.password]).status == 1)
    }

    /// A program is known by its content: replaced by another version at the same path, it
    /// is asked about again; the account's list still names it by path.
    @Test func aReplacedProgramIsAskedAboutAgain() throws {
        let mount = try GuardedMount()
        defer { mount.close() }
        try mount.makeAccount()
        let program = mount.trustedReader()
        let account = mount.path("accounts/\(GuardedMount.uuid)")
        mount.answer("cancel")
        let asked = mount.prompts
        #expect(mount.run(program, ["-c", "100", mount.password]).stdout == "hunter2\n")
        #expect(mount.prompts == asked)
        #expect(Run.shell("cp /usr/bin/tail \(program).new && mv \(program).new \(program)").status == 0)
        let replaced = mount.run(program, ["-c", "100", mount.password])
        #expect(replaced.status == 1 && !replaced.stdout.contains("hunter2"), "\(replaced)")
        #expect(mount.prompts == asked + 1, "asked again")
        #expect(mount.run("/bin/cat", [account + "/trusted"]).stdout.contains(" \(program)\n"))
        // untrust by path takes the old version's entry off.
        #expect(mount.mtmfs("untrust", "--passphrase-file", mount.scratch.sub("pass"), account, program).status == 0)
        #expect(!mount.run("/bin/cat", [account + "/trusted"]).stdout.contains(program))
        // The record names what ran the requester.
        #expect(mount.decisions.contains(" by="), "\(mount.decisions)")
    }

    /// A program already checked is known by its file (the daemon keeps a descriptor of the
    /// code it has found): a change of that very file's owner is seen at the next open.
    @Test func aTrustedProgramItsUserMayWriteSinceIsRefused() throws {
        let mount = try GuardedMount()
        defer { mount.close() }
        try mount.makeAccount()
        let program = mount.trustedReader()
        mount.answer("ok")  // were anyone asked, they would allow: nobody may be
        let asked = mount.prompts
        #expect(mount.run(program, ["-c", "100", mount.password]).stdout == "hunter2\n")
        #expect(mount.run(program, ["-c", "100", mount.password]).stdout == "hunter2\n")
        chown(program, 65534, 65534)
        let owned = mount.run(program, ["-c", "100", mount.password])
        #expect(owned.status == 1 && !owned.stdout.contains("hunter2"), "\(owned)")
        #expect(mount.decisions.contains("it runs code from \(program), which its user (uid 65534) can write"), "\(mount.decisions)")
        chown(program, 0, 0)
        chmod(program, 0o757)
        let open = mount.run(program, ["-c", "100", mount.password])
        #expect(open.status == 1 && !open.stdout.contains("hunter2"), "\(open)")
        chmod(program, 0o755)
        #expect(mount.run(program, ["-c", "100", mount.password]).stdout == "hunter2\n")
        #expect(mount.prompts == asked, "nobody was asked")
    }

    /// Refused without asking: a traced trusted program, a user-writable copy of a trusted
    /// binary, a trusted binary with a user-writable LD_PRELOAD library.
    @Test func suspiciousRequestersAreRefusedWithoutAsking() throws {
        let mount = try GuardedMount()
        defer { mount.close() }
        try mount.makeAccount()
        #expect(mount.mtmfs("trust", "--passphrase-file", mount.scratch.sub("pass"),
                            mount.path("accounts/\(GuardedMount.uuid)"), "cat").status == 0)
        #expect(mount.run("/bin/cat", [mount.password]).stdout == "hunter2\n")
        mount.answer("ok")  // were anyone asked, they would allow: nobody may be
        let asked = mount.prompts

        let traced = mount.run("/usr/bin/strace", ["-f", "-o", "/dev/null", "/bin/cat", mount.password])
        #expect(traced.status == 1 && !traced.stdout.contains("hunter2"), "\(traced)")
        let copy = mount.writable + "/cat"
        #expect(mount.run("/bin/cp", ["/bin/cat", copy]).status == 0)
        let copied = mount.run(copy, [mount.password])
        #expect(copied.status == 1 && !copied.stdout.contains("hunter2"), "\(copied)")
        let library = mount.writable + "/libm.so.6"
        let libm = Run.shell("ls /lib/*/libm.so.6 /usr/lib/*/libm.so.6 2>/dev/null | head -1").stdout
            .trimmingCharacters(in: .whitespacesAndNewlines)
        #expect(mount.run("/bin/cp", [libm, library]).status == 0)
        let preloaded = mount.run("/bin/cat", [mount.password], environment: ["LD_PRELOAD=\(library)"])
        #expect(preloaded.status == 1 && !preloaded.stdout.contains("hunter2"), "\(preloaded)")
        #expect(mount.prompts == asked, "nobody was asked")

        let decisions = mount.decisions
        #expect(decisions.contains("being traced by pid"), "\(decisions)")
        #expect(decisions.contains("it runs code from \(copy), which its user"), "\(decisions)")
        #expect(decisions.contains("it runs code from \(library), which its user"), "\(decisions)")
        // The genuine one still reads.
        #expect(mount.run("/bin/cat", [mount.password]).stdout == "hunter2\n")
    }

    /// An untrusted program reads the other fields without a prompt, and cannot change
    /// `password` or `server`, remove a field or the account.
    @Test func untrustedWritersAreRefusedAndOtherFieldsStayReadable() throws {
        let mount = try GuardedMount()
        defer { mount.close() }
        try mount.makeAccount()
        let account = mount.path("accounts/\(GuardedMount.uuid)")
        mount.answer("cancel")
        let asked = mount.prompts
        #expect(mount.run("/usr/bin/head", ["-c", "100", account + "/label"]).stdout == "mail for \(GuardedMount.uuid)\n")
        #expect(mount.run("/usr/bin/head", ["-c", "100", account + "/url"]).status == 0)
        #expect(mount.prompts == asked, "no prompt for other fields")
        #expect(mount.shell("echo evil.example.org > \(account)/server").status != 0)
        #expect(mount.shell("echo stolen > \(account)/password").status != 0)
        #expect(mount.run("/usr/bin/truncate", ["-s", "0", account + "/password"]).status != 0)
        #expect(mount.run("/bin/rm", ["-f", account + "/comment"]).status != 0)
        #expect(mount.run("/bin/rm", ["-rf", account]).status != 0)
        #expect(mount.run("/bin/sed", ["-i", "s/hunter2/stolen/", account + "/password"]).status != 0)
        mount.answer("notok")
        #expect(mount.run("/bin/cat", [account + "/password"]).stdout == "hunter2\n", "unchanged")
        #expect(mount.run("/bin/cat", [account + "/server"]).stdout == "\n")
        #expect(mount.run("/bin/ls", [account]).stdout.contains("trusted"), "listed while guarding is on")
        // The list is read-only: written, renamed over or removed by a program not trusted with the account: EACCES.
        let list = mount.run("/bin/cat", [account + "/trusted"]).stdout
        #expect(mount.shell("echo x > \(account)/trusted").status != 0)
        #expect(mount.run("/bin/rm", ["-f", account + "/trusted"]).status != 0)
        #expect(mount.run("/bin/cat", [account + "/trusted"]).stdout == list)
        // A program trusted with the account removes it, `trusted` and all.
        #expect(mount.mtmfs("trust", "--passphrase-file", mount.scratch.sub("pass"), account, "rm").status == 0)
        let removed = mount.run("/bin/rm", ["-r", account])
        #expect(removed.status == 0, "\(removed)")
        #expect(!mount.run("/bin/ls", [mount.path("accounts")]).stdout.contains(GuardedMount.uuid))
    }

    /// `otp` and `totp` are guarded like `password` (SPEC §2d): a program not trusted with
    /// the account gets neither; a trusted one reads the code.
    /// `mtmfs run`, `read` and `inject` are doors, never a trusted middleman (SPEC §6):
    /// guarding decides on the program that runs them, one prompt for an account however
    /// many references name it; denied, the exit status is 7 and the command does not run.
    @Test func mtmfsRunReadAndInjectAskAboutTheirCaller() throws {
        let mount = try GuardedMount()
        defer { mount.close() }
        try mount.makeAccount()
        let reference = "mtmfs://\(GuardedMount.uuid)/password"
        let environmentFile = mount.writable + "/app.env"
        #expect(mount.shell("echo 'SAME=\(reference)' > \(environmentFile)").status == 0)
        let run = "\(Run.mtmfs) run --mount \(mount.mountPoint)"
        mount.answer("ok")
        let before = mount.prompts
        let allowed = mount.shell("PW=\(reference) \(run) --env-file \(environmentFile) -- /bin/sh -c "
                                  + "'test \"$PW\" = hunter2 && test \"$SAME\" = hunter2 && echo ok'; exit $?")
        #expect(allowed.stdout == "ok\n", "\(allowed)\nasked: \(mount.record)\ndecisions: \(mount.decisions)")
        #expect(mount.prompts == before + 1, "one prompt for the account")
        // Decided on the shell that ran `mtmfs run`, which the record names with it.
        let decisions = mount.decisions
        #expect(decisions.contains("allowed (allowed once at the prompt)") && decisions.contains("/usr/bin/dash"), "\(decisions)")
        #expect(!decisions.contains("program=\(Run.mtmfs)"), "\(decisions)")

        mount.answer("cancel")
        let refused = mount.shell("PW=\(reference) \(run) -- /bin/sh -c 'echo ran'; exit $?")
        #expect(refused.status == 7 && refused.stdout.isEmpty, "\(refused)")
        #expect(refused.stderr.split(separator: "\n").count == 1 && !refused.stderr.contains("hunter2"), "\(refused)")
        #expect(mount.prompts == before + 2)
        #expect(mount.shell("\(Run.mtmfs) read --mount \(mount.mountPoint) \(reference); exit $?").status == 7)
        #expect(mount.shell("echo '{{ \(reference) }}' | \(Run.mtmfs) inject --mount \(mount.mountPoint); exit $?").status == 7)
        // Once the shell is trusted with the account, it reads through `mtmfs run` unasked.
        #expect(mount.mtmfs("trust", "--passphrase-file", mount.scratch.sub("pass"),
                            mount.path("accounts/\(GuardedMount.uuid)"), "/usr/bin/dash").status == 0)
        let asked = mount.prompts
        #expect(mount.shell("PW=\(reference) \(run) -- /bin/sh -c 'test \"$PW\" = hunter2 && echo ok'; exit $?").stdout == "ok\n")
        #expect(mount.prompts == asked)
    }

    @Test func oneTimeCodesAreGuardedLikeThePassword() throws {
        let mount = try GuardedMount()
        defer { mount.close() }
        try mount.makeAccount()
        let account = mount.path("accounts/\(GuardedMount.uuid)")
        mount.answer("ok")
        let written = mount.shell("printf 'JBSWY3DPEHPK3PXP\\n' | dd of=\(account)/otp status=none")
        #expect(written.status == 0, "\(written)")
        mount.answer("cancel")
        #expect(mount.run("/bin/cat", [account + "/otp"]).status != 0, "otp to an untrusted program")
        #expect(mount.run("/bin/cat", [account + "/totp"]).status != 0, "totp to an untrusted program")
        #expect(mount.run("/bin/cat", [account + "/totp"]).stdout.isEmpty)
        let reader = mount.trustedReader()
        let code = mount.run(reader, ["-c", "20", account + "/totp"]).stdout
        #expect(code.count == 7 && code.dropLast().allSatisfy(\.isNumber), "a trusted program reads the code: \(code)")
        #expect(mount.decisions.contains("field=totp"), "the refusal is recorded: \(mount.decisions)")
    }

    /// `conflicts/password` is guarded like `password` (SPEC §2b, §3a): another machine's
    /// password, changed apart from this one's, goes only to a trusted program or a run
    /// allowed once at the password's prompt; any other is refused without being asked.
    @Test func aConflictingPasswordIsGuardedLikeThePassword() throws {
        let mount = try GuardedMount()
        defer { mount.close() }
        try mount.makeAccount()
        // Another machine: a copy of the folder with a device of its own, the password
        // changed there (the vault library writes its change file, as that machine's mount would).
        let other = mount.scratch.sub("other")
        try FileManager.default.createDirectory(atPath: other, withIntermediateDirectories: true)
        try FileManager.default.copyItem(atPath: mount.data + "/vault", toPath: other + "/vault")
        do {
            let vault = try Vault(path: other + "/vault")
            try Array(Run.passphrase.utf8).withUnsafeBytes { try vault.unlock(passphrase: SecureBytes(copying: $0)) }
            let uuid = try #require(AccountName.uuidBytes(GuardedMount.uuid))
            try Array("from the other machine".utf8).withUnsafeBytes { try vault.setFields([.password: SecureBytes(copying: $0)], of: uuid) }
            vault.lock()
        }
        // Here, meanwhile, another password (allowed once at the prompt).
        mount.answer("ok")
        #expect(mount.shell("printf 'from here\\n' | dd of=\(mount.password) status=none").status == 0)
        mount.answer("cancel")
        // What a synchroniser brings: the other machine's new files, owned by the mount's
        // user from the start (each made under a temporary name, then renamed into place, as
        // Syncthing does; a new device folder likewise).
        let here = Set(try FileManager.default.subpathsOfDirectory(atPath: mount.data + "/vault"))
        for relative in try FileManager.default.subpathsOfDirectory(atPath: other + "/vault")
        where relative.hasSuffix(".mtv") && !here.contains(relative) {
            let destination = mount.data + "/vault/" + relative
            let folder = (destination as NSString).deletingLastPathComponent
            if !FileManager.default.fileExists(atPath: folder) {
                let made = mount.data + "/vault/.syncthing.folder.tmp"
                mkdir(made, 0o700)
                chown(made, 65534, 65534)
                try #require(rename(made, folder) == 0)
            }
            let temporary = folder + "/.syncthing." + (relative as NSString).lastPathComponent + ".tmp"
            try FileManager.default.copyItem(atPath: other + "/vault/" + relative, toPath: temporary)
            chown(temporary, 65534, 65534)
            try #require(rename(temporary, destination) == 0)
        }
        let conflict = mount.path("accounts/\(GuardedMount.uuid)/conflicts/password")
        #expect(Poll.until(seconds: 10) { mount.run("/bin/ls", [mount.path("accounts/\(GuardedMount.uuid)/conflicts")]).stdout.contains("password") },
                "the conflict shows: \(mount.daemonLog)")
        // Untrusted: refused, without a prompt of its own (the decision says to open the
        // password first).
        let before = mount.prompts
        let untrusted = mount.run("/bin/cat", [conflict])
        #expect(untrusted.status != 0 && !untrusted.stdout.contains("machine"), "\(untrusted)")
        #expect(mount.prompts == before, "\(mount.record)")
        #expect(mount.decisions.contains("conflicts/password") && mount.decisions.contains("open the password first"), "\(mount.decisions)")
        // A run allowed once at the password's prompt reads its conflicts too.
        mount.answer("ok")
        let once = mount.run("/usr/bin/head", ["-q", "-c", "200", mount.password, conflict])
        #expect(once.stdout.hasPrefix("from here\nfrom the other machine\t"), "\(once)")
        #expect(mount.prompts == before + 1)
        mount.answer("cancel")
        // A trusted program reads it.
        let reader = mount.trustedReader()
        let read = mount.run(reader, ["-c", "200", conflict])
        #expect(read.stdout.hasPrefix("from the other machine\t"), "\(read)")
    }

    /// A prompt that never answers stalls nothing else, and a SIGINT of its requester ends
    /// the wait at once (EINTR; the pinentry is killed).
    @Test func aHangingPromptStallsNothingAndCtrlCEndsIt() throws {
        let mount = try GuardedMount()
        defer { mount.close() }
        try mount.makeAccount()
        try mount.makeAccount(GuardedMount.other, password: "other-secret")
        #expect(mount.mtmfs("trust", "--passphrase-file", mount.scratch.sub("pass"),
                            mount.path("accounts/\(GuardedMount.other)"), "cat").status == 0)
        mount.answer("hang")
        let before = mount.prompts
        let waiting = mount.start("/usr/bin/head", ["-c", "100", mount.password])
        defer { kill(waiting, SIGKILL); Run.wait(waiting, timeout: 5) }
        #expect(Poll.until(seconds: 10) { mount.prompts == before + 1 }, "the prompt is up")
        // One prompt at a time per program and account: a second head waits for the first's.
        let second = mount.start("/usr/bin/head", ["-c", "100", mount.password])
        defer { kill(second, SIGKILL); Run.wait(second, timeout: 5) }
        usleep(500_000)
        #expect(mount.prompts == before + 1, "no second prompt")
        // Ctrl-C ends a waiting request at once too.
        let waited = ContinuousClock.now
        kill(second, SIGINT)
        let secondStatus = Run.wait(second, timeout: 10)
        #expect(secondStatus == 128 + SIGINT || secondStatus == 1, "\(secondStatus)")
        #expect(waited.secondsElapsed < 3, "the waiting request ended at once (\(waited.secondsElapsed) s)")
        for (program, arguments) in [("/bin/ls", [mount.path("accounts")]),
                                     ("/bin/cat", [mount.path("accounts/\(GuardedMount.other)/password")]),
                                     ("/bin/cat", [mount.path("accounts/\(GuardedMount.uuid)/label")]),
                                     ("/bin/ls", [mount.path("settings")]),
                                     ("/bin/sh", ["-c", "echo x > \(mount.path("cache/file")) && cat \(mount.path("cache/file"))"])] {
            let started = ContinuousClock.now
            let result = mount.run(program, arguments, timeout: 10)
            #expect(result.status == 0, "\(program) \(arguments): \(result)")
            #expect(started.secondsElapsed < 3, "\(program) waited \(started.secondsElapsed) s")
        }
        let interrupted = ContinuousClock.now
        kill(waiting, SIGINT)
        let status = Run.wait(waiting, timeout: 10)
        #expect(status == 128 + SIGINT || status == 1, "head ended by the interrupt: \(status)")
        #expect(interrupted.secondsElapsed < 3, "the wait ended at once (\(interrupted.secondsElapsed) s)")
        #expect(Poll.until(seconds: 5) { mount.decisions.contains("interrupted while asked") }, "\(mount.decisions)")
        #expect(Poll.until(seconds: 5) { Run.shell("pgrep -f '^/bin/sh \(mount.scratch.sub("pinentry"))'").stdout.isEmpty },
                "the pinentry is gone")
    }

    /// A vault put back from an older copy with guarding off is not unlocked by a mount
    /// that saw guarding on; a new mount takes it as it is.
    @Test func aVaultRolledBackToGuardingOffIsNotUnlocked() throws {
        let mount = try GuardedMount()
        defer { mount.close() }
        try mount.makeAccount()
        let pass = mount.scratch.sub("pass")
        #expect(mount.mtmfs("guard", "off", "--passphrase-file", pass, mount.mountPoint).status == 0)
        #expect(mount.run("/bin/cp", ["-a", mount.data + "/vault", mount.writable + "/vault-old"]).status == 0)
        #expect(mount.mtmfs("guard", "on", "--passphrase-file", pass, mount.mountPoint).status == 0)
        // Put back by another program, as a restore from a backup does: read again, locked.
        let restore = "cp -a \(mount.writable)/vault-old \(mount.data)/vault.new && rm -r \(mount.data)/vault && mv \(mount.data)/vault.new \(mount.data)/vault"
        #expect(mount.shell(restore).status == 0)
        #expect(Poll.until(seconds: 5) { mount.mtmfs("status", mount.mountPoint).stdout.contains("accounts: locked") })
        let unlock = mount.mtmfs("unlock", "--passphrase-file", pass, mount.mountPoint)
        #expect(unlock.status == 1, "\(unlock)")
        #expect(mount.run("/bin/cat", [mount.password]).status == 1)
        #expect(mount.mtmfs("status", mount.mountPoint).stdout.contains("older copy put back"))
        // A new mount takes the file as it is (guarding off).
        mount.unmount()
        try mount.mount()
        #expect(mount.mtmfs("unlock", "--passphrase-file", pass, mount.mountPoint).status == 0)
        #expect(mount.run("/bin/cat", [mount.password]).stdout == "hunter2\n")
    }

    /// No pinentry, or no terminal and no display: EACCES at once, and the log says how to
    /// trust the program.
    @Test func noWayToAskIsRefusedAtOnce() throws {
        for (pinentry, display, reason) in [("/nonexistent/pinentry", true, "no pinentry program"),
                                            (nil, false, "no terminal or display"),
                                            ("writable", true, "can be changed by the mount's user")] {
            // A pinentry its user can change would answer for them (it could be anything's).
            let mount = try GuardedMount(pinentry: pinentry == "writable" ? nil : pinentry, display: display,
                                         writablePinentry: pinentry == "writable")
            mount.answer("ok")
            defer { mount.close() }
            #expect(mount.run("/usr/bin/mkdir", [mount.path("accounts/\(GuardedMount.uuid)")]).status == 0)
            let started = ContinuousClock.now
            let denied = mount.run("/bin/cat", [mount.password])
            #expect(denied.status == 1, "\(denied)")
            #expect(started.secondsElapsed < 3)
            #expect(mount.decisions.contains(reason), "\(mount.decisions)")
            #expect(mount.daemonLog.contains("to trust it: mtmfs trust \(mount.path("accounts/\(GuardedMount.uuid)")) /usr/bin/cat"),
                    "\(mount.daemonLog)")
            #expect(mount.prompts == 0, "nothing was asked")
        }
    }

    /// mtmfs's own command line asks for its caller: `mtmfs find --print password` run by a
    /// shell is decided on the shell (trusting mtmfs would trust every script that runs it).
    @Test func mtmfsItselfIsDecidedOnItsCaller() throws {
        let mount = try GuardedMount()
        defer { mount.close() }
        try mount.makeAccount()
        let find = "\(Run.mtmfs) find \(mount.mountPoint) --label 'mail for \(GuardedMount.uuid)' --print password; true"
        mount.answer("cancel")
        #expect(!mount.shell(find).stdout.contains("hunter2"))
        let decisions = mount.decisions
        #expect(decisions.contains("program=/usr/bin/dash") && decisions.contains("via=\(Run.mtmfs) (pid"), "\(decisions)")
        // So is mtmfs-core, which `mtmfs` becomes for the other commands: git's helper.
        mount.answer("ok")  // (writing a field needs trust too)
        #expect(mount.shell("echo https://mail.example.org > \(mount.path("accounts/\(GuardedMount.uuid)/url"))").status == 0)
        mount.answer("cancel")
        let core = (Run.mtmfs as NSString).deletingLastPathComponent + "/mtmfs-core"
        let helper = mount.shell("printf 'protocol=https\\nhost=mail.example.org\\n\\n' | \(Run.mtmfs) credential --mount \(mount.mountPoint) get; true")
        #expect(!helper.stdout.contains("hunter2"))
        #expect(mount.decisions.contains("via=\(core) (pid"), "\(mount.decisions)")
        // Trusting mtmfs changes nothing; trusting the shell does.
        let account = mount.path("accounts/\(GuardedMount.uuid)")
        #expect(mount.mtmfs("trust", "--passphrase-file", mount.scratch.sub("pass"), account, Run.mtmfs).status == 0)
        #expect(!mount.shell(find).stdout.contains("hunter2"))
        #expect(mount.mtmfs("trust", "--passphrase-file", mount.scratch.sub("pass"), account, "/bin/sh").status == 0)
        #expect(mount.shell(find).stdout.contains("hunter2"))
    }
}
