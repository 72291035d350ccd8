import Foundation
import Posix
import TestSupport
import Testing
#if canImport(Glibc)
import Glibc
#endif

/// `mtmfs mount --lock-on-sleep --lock-with-screen` (SPEC §3): logind's PrepareForSleep(true)
/// and the user's session's Lock lock the accounts at once, as `mtmfs lock` does; another
/// user's session locking, or a wake-up, changes nothing. logind is a stand-in
/// (`Tests/LoginSession/fake_logind.py`) on a bus of the test's own, given to the daemon as
/// its system bus.
@Suite(.enabled(if: FuseAvailability.isAvailable && Spawn.exists("dbus-daemon")
                && Run.program("/usr/bin/python3", ["-c", "import dbus, gi"]).status == 0))
struct LockWithSessionTests {
    static let uuid = "3E7F1A2B-9C4D-4E5F-8A6B-7C8D9E0F1A2B"
    static let script = Run.repository + "/Tests/LoginSession/fake_logind.py"

    @Test func sleepAndTheSessionsLockLockTheAccounts() throws {
        let bus = try PrivateBus()
        defer { bus.close() }
        let scratch = Scratch("lock-session")
        defer { scratch.remove() }
        // The stand-in reads its commands from a FIFO the test holds open both ways (so that
        // neither side's open waits for the other).
        let fifo = scratch.sub("commands")
        try #require(mkfifo(fifo, 0o600) == 0)
        let commands = open(fifo, O_RDWR | O_CLOEXEC)
        try #require(commands >= 0)
        defer { close(commands) }
        var environment = bus.environment
        let logind = try Spawn.start("/usr/bin/python3", [Self.script, String(getuid())], stdin: .file(fifo),
                                     stdout: .file(scratch.sub("logind.out")), stderr: .file(scratch.sub("logind.err")),
                                     environment: environment.map { "\($0.key)=\($0.value)" }, ownProcessGroup: true)
        defer {
            kill(-logind, SIGKILL)
            Spawn.wait(logind, timeout: 5)
        }
        func logindSaid(_ line: String) -> Bool {
            ((try? String(contentsOfFile: scratch.sub("logind.out"), encoding: .utf8)) ?? "").contains(line)
        }
        try #require(Poll.until(seconds: 10) { logindSaid("ready") }, "\((try? String(contentsOfFile: scratch.sub("logind.err"), encoding: .utf8)) ?? "")")

        // The daemon's system bus is the test's.
        environment["DBUS_SYSTEM_BUS_ADDRESS"] = bus.address
        let data = scratch.sub("data"), mountPoint = scratch.sub("mnt")
        #expect(Run.initStore(data).status == 0)
        mkdir(mountPoint, 0o755)
        let mounted = Run.program(Run.mtmfs, ["mount", "--lock-on-sleep", "-o", "lock_with_screen", "--data-dir", data, mountPoint],
                                  environment: environment)
        try #require(mounted.status == 0, "\(mounted)")
        defer { if MountTable.isMounted(mountPoint) { Run.mtmfs("unmount", mountPoint) } }
        let password = mountPoint + "/accounts/\(Self.uuid)/password"
        func unlock() {
            #expect(Run.mtmfs("unlock", mountPoint, input: Run.passphrase + "\n").status == 0)
            #expect(Run.shell("cat \(password)").stdout == "hunter2\n")  // in the page cache now
        }
        func state() -> String? { try? MountStatus.read(mountPoint)["state"] }
        /// Sends `command` to logind; the seconds until the accounts were locked (nil: not in 2 s).
        func send(_ command: String) -> Double? {
            let started = ContinuousClock.now
            _ = Array((command + "\n").utf8).withUnsafeBytes { write(commands, $0.baseAddress, $0.count) }
            guard Poll.until(seconds: 2, every: 0.002, { state() == "locked" }) else { return nil }
            let elapsed = started.duration(to: .now)
            return Double(elapsed.components.seconds) + Double(elapsed.components.attoseconds) / 1e18
        }

        /// The fastest of up to three locks by `command` (one may stall while the other
        /// suites load this 2-core machine); nil when one does not lock at all.
        func fastestLock(_ command: String) -> Double? {
            var best = Double.infinity
            for attempt in 0..<3 {
                if attempt > 0 { unlock() }
                guard let took = send(command) else { return nil }
                best = min(best, took)
                if took < 0.1 { break }
            }
            return best
        }

        #expect(Run.mtmfs("unlock", mountPoint, input: Run.passphrase + "\n").status == 0)
        #expect(mkdir(mountPoint + "/accounts/\(Self.uuid)", 0o700) == 0)
        #expect(Run.shell("echo hunter2 > \(password)").status == 0)
        #expect(Run.shell("cat \(password)").stdout == "hunter2\n")

        // Suspend: locked within 100 ms; the field dropped from the page cache (EACCES).
        let slept = try #require(fastestLock("sleep"), "PrepareForSleep(true) did not lock")
        #expect(slept < 0.1, "locked \(Int(slept * 1000)) ms after PrepareForSleep(true)")
        let denied = Run.shell("cat \(password)")
        #expect(denied.status != 0 && denied.stderr.contains("Permission denied"), "\(denied)")

        // Waking up, and another user's session locking, lock nothing.
        unlock()
        #expect(send("wake") == nil)
        #expect(Poll.until(seconds: 5) { logindSaid("sent wake") })
        #expect(send("lock-other") == nil)
        #expect(Poll.until(seconds: 5) { logindSaid("sent lock-other") })
        #expect(state() == "unlocked")

        // This user's session locks: locked within 100 ms.
        let locked = try #require(fastestLock("lock"), "the session's Lock did not lock")
        #expect(locked < 0.1, "locked \(Int(locked * 1000)) ms after the session's Lock")
        #expect(Run.shell("cat \(password)").status != 0)
        // Said by .mtmfs/status and `mtmfs status`.
        #expect(try MountStatus.read(mountPoint)["lock_with"] == "sleep,screen")
        let status = Run.mtmfs("status", mountPoint)
        #expect(status.status == 0 && status.stdout.contains("locks at a suspend and the screen lock"), "\(status)")
    }

    /// With no system bus the mount says so in one line and goes on.
    @Test func noSystemBusIsSaidAndTheMountGoesOn() throws {
        let scratch = Scratch("lock-session")
        defer { scratch.remove() }
        let data = scratch.sub("data"), mountPoint = scratch.sub("mnt")
        #expect(Run.initStore(data).status == 0)
        mkdir(mountPoint, 0o755)
        var environment = ProcessInfo.processInfo.environment
        environment["DBUS_SYSTEM_BUS_ADDRESS"] = "unix:path=" + scratch.sub("no-bus")
        let mounted = Run.program(Run.mtmfs, ["mount", "--lock-on-sleep", "--lock-with-screen", "--data-dir", data, mountPoint],
                                  environment: environment)
        defer { if MountTable.isMounted(mountPoint) { Run.mtmfs("unmount", mountPoint) } }
        #expect(mounted.status == 0, "\(mounted)")
        let lines = (mounted.stdout + mounted.stderr).split(separator: "\n").filter { $0.contains("system bus") }
        #expect(lines.count == 1 && lines[0].contains("do not lock with the session"), "\(mounted)")
        #expect(Run.mtmfs("unlock", mountPoint, input: Run.passphrase + "\n").status == 0)
        #expect(try MountStatus.read(mountPoint)["state"] == "unlocked")
        #expect(try MountStatus.read(mountPoint)["lock_with"] == nil)
    }
}
