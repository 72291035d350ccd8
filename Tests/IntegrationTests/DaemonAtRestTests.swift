import Foundation
import Posix
import TestSupport
import Testing
#if canImport(Glibc)
import Glibc
#endif

/// A daemon that runs for months (SPEC §7): asleep when idle, outside changes through
/// inotify, status that costs no scan.
@Suite(.enabled(if: FuseAvailability.isAvailable, "needs /dev/fuse")) struct DaemonAtRestTests {
    /// Context switches of every thread of `pid` so far.
    static func switches(_ pid: pid_t) -> Int {
        let tasks = (try? FileManager.default.contentsOfDirectory(atPath: "/proc/\(pid)/task")) ?? []
        return tasks.reduce(0) { sum, task in
            let status = TestFile.read("/proc/\(pid)/task/\(task)/status") ?? ""
            return sum + status.split(separator: "\n").filter { $0.contains("ctxt_switches") }
                .compactMap { Int($0.split(separator: "\t").last?.trimmingCharacters(in: .whitespaces) ?? "") }.reduce(0, +)
        }
    }

    /// Unlocked with an auto-lock pending, a size limit, files that expire next week, a
    /// settings key just written: no thread wakes while nothing happens (25 a second before).
    @Test func idleDaemonSleeps() throws {
        let store = try MountedStore(options: ["--cache-limit", "10M", "--auto-lock", "600"])
        defer { store.close() }
        #expect(Run.mtmfs("unlock", store.mountPoint, input: Run.passphrase + "\n").status == 0)
        let nextWeek = Int(Date().timeIntervalSince1970) + 7 * 86_400
        let script = """
            set -e
            for i in $(seq 50); do echo $i > '\(store.path("cache"))'/f$i; done
            setfattr -n user.cache.expires -v \(nextWeek) '\(store.path("cache"))'/f1
            rm '\(store.path("cache"))'/f2
            echo 7 > '\(store.path("settings"))'/Count
            """
        #expect(Run.shell(script).status == 0)
        let pid = try #require(pid_t(try store.status()["pid"] ?? ""))
        // What follows the writes (group commit, checkpoint, removal delays) settles first.
        #expect(Poll.until(seconds: 10, every: 1) {
            let before = Self.switches(pid)
            usleep(1_500_000)
            return Self.switches(pid) - before <= 1
        })
        // Other suites run beside this one and may look at every mount (`mtmfs status`): the
        // quietest of three windows counts. A daemon that woke by itself every second or
        // more often would fail all three.
        var woke = Int.max
        for _ in 0..<3 where woke > 2 {
            let before = Self.switches(pid)
            sleep(3)
            woke = min(woke, Self.switches(pid) - before)
        }
        #expect(woke <= 2, "\(woke) context switches in the quietest 3 s of idleness")
    }

    /// Settings.plist and the vault replaced by rename (a restore, a sync, an editor): the
    /// mount shows the new file within a second, woken by inotify.
    @Test func filesReplacedByRenameShowAtOnce() throws {
        let store = try MountedStore()
        defer { store.close() }
        let data = store.dataDirectory
        // Settings: a new plist written aside and renamed over.
        let python = """
            import os, plistlib, sys
            d = plistlib.load(open(sys.argv[1], 'rb')); d['FromOutside'] = 'yes'
            plistlib.dump(d, open(sys.argv[1] + '.new', 'wb')); os.rename(sys.argv[1] + '.new', sys.argv[1])
            """
        #expect(Run.program("python3", ["-c", python, data + "/Settings.plist"]).status == 0)
        #expect(Poll.until(seconds: 1) { TestFile.read(store.path("settings/FromOutside")) == "yes\n" })

        // The vault: back its folder up, add an account through the mount, restore the backup.
        #expect(Run.shell("cp -a '\(data)/vault' '\(store.scratch.sub("vault.backup"))'").status == 0)
        #expect(Run.mtmfs("unlock", store.mountPoint, input: Run.passphrase + "\n").status == 0)
        let account = "1F2E3D4C-5B6A-4978-8695-A4B3C2D1E0F0"
        #expect(mkdir(store.path("accounts/\(account)"), 0o700) == 0)
        #expect(Run.shell("cp -a '\(store.scratch.sub("vault.backup"))' '\(data)/vault.new' && rm -r '\(data)/vault' && mv '\(data)/vault.new' '\(data)/vault'").status == 0)
        #expect(Poll.until(seconds: 1) { (try? store.status()["state"]) == "locked" }, "a replaced vault is locked")
        #expect(Poll.until(seconds: 1) { Run.shell("ls '\(store.path("accounts"))'").stdout == "by-label\nby-server\n" })
        // The restored file is what the mount now serves: the next change keeps it.
        #expect(Run.mtmfs("unlock", store.mountPoint, input: Run.passphrase + "\n").status == 0)
        #expect(mkdir(store.path("accounts/\(account)"), 0o700) == 0)
        #expect(Run.mtmfs("check", "--data-dir", data).status == 0)
    }

    /// `.mtmfs/status` has size 0 (as /proc's files): a `stat` renders nothing; a read
    /// gets the whole text.
    @Test func statusIsMadeWhenRead() throws {
        let store = try MountedStore()
        defer { store.close() }
        var st = stat()
        #expect(stat(store.path(".mtmfs/status"), &st) == 0 && st.st_size == 0)
        let text = TestFile.read(store.path(".mtmfs/status")) ?? ""
        #expect(text.hasPrefix("state=locked\n") && text.contains("cache_files=0\n") && text.hasSuffix("\n"), "\(text)")
        let python = Run.program("python3", ["-c", "import sys; print(open(sys.argv[1]).read().count('='))", store.path(".mtmfs/status")])
        #expect(Int(python.stdout.trimmingCharacters(in: .whitespacesAndNewlines)) ?? 0 >= 10, "\(python)")
    }
}
