import Foundation
import Posix
import TestSupport
import Testing
#if canImport(Glibc)
import Glibc
#endif

/// pam_mtmfs.so and the login slot (SPEC §3), driven by a real PAM client (`pamtester`)
/// through a PAM service of the test's own (`/etc/pam.d/mtmfs-test-…`, removed after) with
/// pam_unix, for a user the test makes with a known password (removed after). The user's
/// mount runs in a mount namespace of the test's own whose /dev/fuse is a 0666 copy (this
/// machine's is 0600), and every PAM call runs there too, as a login program would.
@Suite(.serialized, .enabled(if: getuid() == 0 && FuseAvailability.isAvailable && Spawn.exists("pamtester")
                             && Spawn.exists("useradd") && Spawn.exists("unshare")
                             && FileManager.default.fileExists(atPath: "/usr/include/security/pam_modules.h")))
final class LoginUnlockTests {
    let scratch = Scratch("pam")
    let user = "mtmfs-pam-" + String(UInt32.random(in: 0...0xFFFF_FFFF), radix: 16)
    let service = "mtmfs-test-" + String(UInt32.random(in: 0...0xFFFF_FFFF), radix: 16)
    static let passphrase = "vault passphrase for the pam test"
    static let password = "Login-Pw-2026!x"
    static let newPassword = "Changed-Pw-77?y"
    var home: String { scratch.sub("home") }
    var mountPoint: String { home + "/m" }
    var module: String { scratch.sub("pam_mtmfs.so") }
    /// A process holding the namespace (its own /dev/fuse) that everything enters.
    var holder: pid_t = 0
    var daemon: pid_t = 0
    var userMade = false

    init() throws {
        chmod(scratch.path, 0o711)
        let built = Run.program(Run.repository + "/mount-helpers/build-pam", [module])
        try #require(built.status == 0, "build-pam: \(built)")
        chmod(module, 0o644)
        let made = Run.program("useradd", ["-M", "-d", home, "-s", "/bin/sh", user])
        try #require(made.status == 0, "useradd: \(made)")
        userMade = true
        try #require(Run.program("chpasswd", [], input: "\(user):\(Self.password)\n").status == 0)
        mkdir(home, 0o700)
        try #require(Run.program("chown", ["\(user):\(user)", home]).status == 0)
        // The service: pam_unix decides; pam_mtmfs is optional in every stack.
        let stack = """
            auth     required  pam_unix.so
            auth     optional  \(module)
            account  required  pam_permit.so
            session  required  pam_permit.so
            session  optional  \(module) mtmfs=\(Run.mtmfs) wait=20
            password required  pam_unix.so
            password optional  \(module) mtmfs=\(Run.mtmfs)

            """
        try stack.write(toFile: "/etc/pam.d/" + service, atomically: true, encoding: .utf8)
        try stack.split(separator: "\n").filter { !$0.contains(module) }.joined(separator: "\n")
            .appending("\n").write(toFile: "/etc/pam.d/" + service + "-plain", atomically: true, encoding: .utf8)
        let device = scratch.sub("fuse")
        holder = Run.start("unshare", ["-m", "--propagation", "private", "/bin/sh", "-c", """
            \(GuardedMount.dropOtherFuseMounts)
            mknod \(device) c 10 229 && chmod 0666 \(device) && mount --bind \(device) /dev/fuse && exec sleep 600
            """])
        try #require(holder > 0)
        try #require(Poll.until(seconds: 10) { (try? String(contentsOfFile: "/proc/\(self.holder)/mounts", encoding: .utf8))?.contains(" /dev/fuse ") == true })
    }

    deinit {
        unmount()
        if holder > 0 {
            kill(holder, SIGKILL)
            Run.wait(holder, timeout: 5)
        }
        if userMade {
            Run.program("pkill", ["-KILL", "-u", user])
            _ = Poll.until(seconds: 5) { Run.program("pgrep", ["-u", self.user]).status != 0 }
            Run.program("userdel", [user])
        }
        for name in [service, service + "-plain"] { try? FileManager.default.removeItem(atPath: "/etc/pam.d/" + name) }
        for directory in setuidDirectories { try? FileManager.default.removeItem(atPath: directory) }
        scratch.remove()
    }

    /// `arguments` in the namespace, as root.
    @discardableResult
    func inside(_ arguments: [String], input: String? = nil) -> CommandResult {
        Run.program("nsenter", ["-t", "\(holder)", "-m"] + arguments, input: input, timeout: 60)
    }

    /// `arguments` in the namespace, as the user with their own HOME.
    @discardableResult
    func asUser(_ arguments: [String], input: String? = nil) -> CommandResult {
        inside(["setpriv", "--reuid=\(user)", "--regid=\(user)", "--init-groups", "env", "-i", "HOME=\(home)",
                "PATH=/usr/bin:/bin"] + arguments, input: input)
    }

    func mount() throws {
        mkdir(mountPoint, 0o700)
        Run.program("chown", ["\(user):\(user)", mountPoint])
        daemon = Run.start("nsenter", ["-t", "\(holder)", "-m", "setpriv", "--reuid=\(user)", "--regid=\(user)", "--init-groups",
                                       "env", "-i", "HOME=\(home)", "PATH=/usr/bin:/bin", Run.mtmfs, "mount", "-f", mountPoint],
                           stderr: scratch.sub("daemon.log"))
        try #require(daemon > 0)
        try #require(Poll.until(seconds: 20) { self.state() != nil }, "\((try? String(contentsOfFile: scratch.sub("daemon.log"), encoding: .utf8)) ?? "")")
    }

    func unmount() {
        guard daemon > 0 else { return }
        inside(["fusermount3", "-u", mountPoint])
        if Run.wait(daemon, timeout: 20) != 0 { kill(daemon, SIGKILL) }
        daemon = 0
    }

    /// The mount's state (locked, unlocked), read as the user; nil while it is not up.
    func state() -> String? {
        let status = asUser(["cat", mountPoint + "/.mtmfs/status"])
        guard status.status == 0 else { return nil }
        return status.stdout.split(separator: "\n").first { $0.hasPrefix("state=") }.map { String($0.dropFirst(6)) }
    }

    /// A login through PAM as a login program does it: authenticate, then open a session.
    func login(_ password: String, service: String? = nil) -> Int32 {
        inside(["pamtester", service ?? self.service, user, "authenticate", "open_session"], input: password + "\n").status
    }

    /// Directories made for a set-user-ID program, removed at the end.
    var setuidDirectories: [String] = []

    /// A set-user-ID-root copy of `program`, on a file system that honours the bit (the
    /// scratch directory's, unless it is mounted nosuid: then /var/tmp's or /root's).
    func setuidCopy(_ program: String) throws -> String {
        var directory: String?
        for base in [scratch.path, "/var/tmp", "/root"] {
            var info = statvfs()
            guard statvfs(base, &info) == 0, info.f_flag & UInt(ST_NOSUID) == 0 else { continue }
            if base == scratch.path { directory = base; break }
            var template = Array((base + "/mtmfs-suid.XXXXXX").utf8CString)
            guard let made = mkdtemp(&template) else { continue }
            let path = String(cString: made)
            chmod(path, 0o755)
            setuidDirectories.append(path)
            directory = path
            break
        }
        let copy = try #require(directory, "no file system here honours set-user-ID") + "/" + (program as NSString).lastPathComponent
        try #require(Run.program("install", ["-m", "4755", "-o", "root", program, copy]).status == 0)
        return copy
    }

    func userProcesses() -> [String] {
        Run.program("pgrep", ["-a", "-u", user]).stdout.split(separator: "\n").map(String.init)
    }

    @Test func aLoginUnlocksAWrongPasswordNothingAndAPasswordChangeKeepsTheSlotInStep() throws {
        try #require(asUser([Run.mtmfs, "init", "--kdf", "interactive", "--weak-passphrase"], input: Self.passphrase + "\n").status == 0)
        // The login slot: the passphrase, then the login password (one line each on a pipe).
        let slot = asUser([Run.mtmfs, "passwd", "--login"], input: Self.passphrase + "\n" + Self.password + "\n")
        #expect(slot.status == 0, "\(slot)")

        // 1. The session comes before the mount (a user unit starts it just after): the
        //    unlock waits for it, detached, holding the password on no command line and in no
        //    environment; the login itself does not wait.
        let started = ContinuousClock.now
        #expect(login(Self.password) == 0)
        #expect(started.duration(to: .now) < .seconds(5))
        var waiting: [String] = []
        #expect(Poll.until(seconds: 5) {
            waiting = self.userProcesses().filter { $0.contains("unlock --login") }
            return !waiting.isEmpty
        })
        for line in waiting {
            let pid = try #require(Int32(line.split(separator: " ")[0]))
            for part in ["cmdline", "environ"] {
                let bytes = (try? Data(contentsOf: URL(fileURLWithPath: "/proc/\(pid)/\(part)"))) ?? Data()
                #expect(!bytes.isEmpty && bytes.range(of: Data(Self.password.utf8)) == nil, "the password in /proc/\(pid)/\(part)")
            }
        }
        try mount()
        #expect(Poll.until(seconds: 10) { self.state() == "unlocked" }, "the login did not unlock the mount")
        // Nothing of the login is left running: the daemon alone.
        #expect(Poll.until(seconds: 5) { self.userProcesses().allSatisfy { $0.contains(" mount -f ") } }, "\(userProcesses())")

        // 2. A wrong password: pam_unix's answer, as without the module; nothing unlocked.
        #expect(asUser([Run.mtmfs, "lock", mountPoint]).status == 0)
        #expect(state() == "locked")
        let wrong = login("not the password")
        #expect(wrong != 0 && wrong == login("not the password", service: service + "-plain"))
        #expect(login(Self.password, service: service + "-plain") == 0)
        usleep(1_500_000)
        #expect(state() == "locked")

        // 3. The password changed through PAM (a setuid-root PAM client run by the user, as
        //    passwd(1) is: pam_unix asks the current password): the login slot follows.
        let client = try setuidCopy("/usr/bin/pamtester")
        let change = asUser([client, service, user, "chauthtok"],
                            input: Self.password + "\n" + Self.newPassword + "\n" + Self.newPassword + "\n")
        #expect(change.status == 0, "\(change)")
        let old = asUser([Run.mtmfs, "unlock", "--login", mountPoint], input: Self.password + "\n")
        #expect(old.status == 1 && state() == "locked", "\(old)")
        #expect(login(Self.password) != 0)
        #expect(login(Self.newPassword) == 0)
        #expect(Poll.until(seconds: 10) { self.state() == "unlocked" }, "the new password did not unlock the mount")

        // 4. The passwords are in no file of the user's or the test's.
        for secret in [Self.password, Self.newPassword, Self.passphrase] {
            let found = Run.program("grep", ["-r", "-a", "-l", "-F", secret, home + "/.local", scratch.sub("daemon.log")])
            #expect(found.stdout.isEmpty, "\(secret) found in \(found.stdout)")
        }
        #expect(Poll.until(seconds: 5) { self.userProcesses().allSatisfy { $0.contains(" mount -f ") } }, "\(userProcesses())")

        // 5. Without a login slot a login unlocks nothing, and nothing waits.
        #expect(asUser([Run.mtmfs, "lock", mountPoint]).status == 0)
        unmount()
        let removed = asUser([Run.mtmfs, "passwd", "--remove-login"], input: Self.passphrase + "\n")
        #expect(removed.status == 0, "\(removed)")
        try mount()
        #expect(login(Self.newPassword) == 0)
        usleep(1_500_000)
        #expect(state() == "locked")
        #expect(Poll.until(seconds: 5) { self.userProcesses().allSatisfy { $0.contains(" mount -f ") } }, "\(userProcesses())")
    }
}

/// The login slot's commands without PAM: `passwd --login` and `--remove-login` (unmounted),
/// `unlock --login`, and `passwd --login-changed` both through a mount and on the folder.
@Suite struct LoginSlotTests {
    @Test func theLoginSlotOpensFollowsAPasswordChangeAndGoes() throws {
        let store = try MountedStore()
        defer { store.close() }
        let (data, mount) = (store.dataDirectory, store.mountPoint)
        // Refused while mounted, as passwd is.
        let mounted = Run.mtmfs("passwd", "--login", "--data-dir", data, input: Run.passphrase + "\nlogin one\n")
        #expect(mounted.status == 1 && mounted.stderr.contains("unmount"), "\(mounted)")
        // No login slot yet: the login password opens nothing; a change has nothing to follow.
        #expect(Run.mtmfs("unlock", "--login", mount, input: "login one\n").status == 1)
        let nothing = Run.mtmfs("passwd", "--login-changed", "--data-dir", data, input: "login one\nlogin two\n")
        #expect(nothing.status == 3, "\(nothing)")
        #expect(Run.mtmfs("unmount", mount).status == 0)

        let wrong = Run.mtmfs("passwd", "--login", "--data-dir", data, input: "not it\nlogin one\n")
        #expect(wrong.status == 1 && wrong.stderr.contains("wrong passphrase"), "\(wrong)")
        let added = Run.mtmfs("passwd", "--login", "--data-dir", data, input: Run.passphrase + "\nlogin one\n")
        #expect(added.status == 0, "\(added)")
        // On the folder: a wrong old password changes nothing (exit 3); the right one moves it.
        #expect(Run.mtmfs("passwd", "--login-changed", "--data-dir", data, input: "login zero\nlogin two\n").status == 3)
        let moved = Run.mtmfs("passwd", "--login-changed", "--data-dir", data, input: "login one\nlogin two\n")
        #expect(moved.status == 0, "\(moved)")

        #expect(Run.mtmfs("mount", "--data-dir", data, mount).status == 0)
        #expect(Run.mtmfs("unlock", "--login", mount, input: "login one\n").status == 1)
        #expect(Run.mtmfs("unlock", "--login", mount, input: "login two\n").status == 0)
        #expect(try store.status()["state"] == "unlocked")
        // Through the mount (its daemon writes the slot), locked or not.
        #expect(Run.mtmfs("lock", mount).status == 0)
        let live = Run.mtmfs("passwd", "--login-changed", "--data-dir", data, input: "login two\nlogin three\n")
        #expect(live.status == 0, "\(live)")
        #expect(Run.mtmfs("unlock", "--login", mount, input: "login two\n").status == 1)
        #expect(Run.mtmfs("unlock", "--login", mount, input: "login three\n").status == 0)
        // The passphrase still opens; a passphrase change keeps the login slot.
        #expect(Run.mtmfs("lock", mount).status == 0)
        #expect(Run.mtmfs("unlock", mount, input: Run.passphrase + "\n").status == 0)
        #expect(Run.mtmfs("unmount", mount).status == 0)
        #expect(Run.mtmfs("passwd", "--data-dir", data, "--kdf", "interactive", "--weak-passphrase",
                          input: Run.passphrase + "\nanother vault passphrase\n").status == 0)
        #expect(Run.mtmfs("mount", "--data-dir", data, mount).status == 0)
        #expect(Run.mtmfs("unlock", "--login", mount, input: "login three\n").status == 0)
        #expect(Run.mtmfs("unmount", mount).status == 0)

        // Removed: it opens nothing more; removing again says there is none.
        #expect(Run.mtmfs("passwd", "--remove-login", "--data-dir", data, input: "another vault passphrase\n").status == 0)
        #expect(Run.mtmfs("passwd", "--remove-login", "--data-dir", data, input: "another vault passphrase\n").status == 3)
        #expect(Run.mtmfs("mount", "--data-dir", data, mount).status == 0)
        #expect(Run.mtmfs("unlock", "--login", mount, input: "login three\n").status == 1)
        // No mount of the default data directory comes: the wait ends, exit 6 (what the PAM
        // module's unlock does when the user's unit never mounts).
        var environment = ProcessInfo.processInfo.environment
        environment["XDG_DATA_HOME"] = store.scratch.sub("no-such-home")
        let started = ContinuousClock.now
        let none = Run.program(Run.mtmfs, ["unlock", "--login", "--wait", "1"], input: "login three\n", environment: environment)
        let waited = started.duration(to: .now)
        #expect(none.status == 6 && none.stderr.contains("after 1 s"), "\(none)")
        #expect(waited >= .seconds(1) && waited < .seconds(10))
        // --wait needs --login; --login with --recovery-key is a wrong command line.
        #expect(Run.mtmfs("unlock", "--wait", "3", mount, input: "x\n").status == 2)
        #expect(Run.mtmfs("unlock", "--login", "--recovery-key", mount, input: "x\n").status == 2)
    }
}
