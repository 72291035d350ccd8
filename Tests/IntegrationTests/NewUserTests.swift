import Foundation
import TestSupport
import Testing
#if canImport(Glibc)
import Glibc
#endif

/// Rough edges a new user hits, each through the real CLI or a real mount.
@Suite(.enabled(if: FuseAvailability.isAvailable, "needs /dev/fuse")) struct NewUserTests {
    static let asNobody = ["--reuid=65534", "--regid=65534", "--clear-groups"]

    /// `mtmfs status` speaks only of the caller's own mounts; another user's mount is
    /// neither listed nor called stale.
    @Test func statusShowsOnlyTheCallersOwnMounts() throws {
        let store = try MountedStore()
        defer { store.close() }
        let mine = Run.mtmfs("status")
        // (A test beside this one may have killed its own mount's daemon meanwhile: status
        // exits 6 for that stale mount, and says so of it alone.)
        let othersStale = !mine.stderr.isEmpty && mine.stderr.split(separator: "\n").allSatisfy {
            $0.contains("stale") && !$0.contains(store.mountPoint)
        }
        #expect(mine.status == 0 || (mine.status == 6 && othersStale), "\(mine)")
        #expect(mine.stdout.contains(store.mountPoint + ": mounted from"), "\(mine)")
        let theirs = Run.program("setpriv", Self.asNobody + [Run.mtmfs, "status"])
        #expect(!theirs.stdout.contains(store.mountPoint) && !theirs.stdout.contains("stale"), "\(theirs)")
        #expect(theirs.status == 6 && theirs.stderr.contains("you have no mtmfs mount up"), "\(theirs)")
        let named = Run.program("setpriv", Self.asNobody + [Run.mtmfs, "status", store.mountPoint])
        #expect(named.status == 1 && named.stderr.contains("is another user's mtmfs mount"), "\(named)")
        #expect(!named.stdout.contains("stale") && !named.stderr.contains("stale"), "\(named)")
    }

    /// A mount whose daemon is gone is the one thing status calls stale.
    @Test func statusCallsOnlyADeadDaemonStale() throws {
        let store = try MountedStore()
        defer { store.close() }
        try store.killDaemon(detach: false)
        let status = Run.mtmfs("status", store.mountPoint)
        #expect(status.stdout.contains("stale (its daemon is gone"), "\(status)")
        #expect(Run.mtmfs("unmount", store.mountPoint).status == 0)
    }

    /// /dev/fuse that users may not open (mode 0600, as on some hosts and containers): the
    /// mount says so and what fixes it. A 0600 copy of the device is bound over /dev/fuse
    /// in a mount namespace of the test's own, so nothing else on the machine sees it.
    @Test func unusableDevFuseIsNamed() throws {
        let scratch = Scratch()
        defer { scratch.remove() }
        let data = scratch.sub("data"), mnt = scratch.sub("mnt")
        mkdir(mnt, 0o755)
        #expect(Run.initStore(data).status == 0)
        chown(scratch.path, 65534, 65534)
        #expect(Run.shell("chown -R 65534:65534 \(data) \(mnt)").status == 0)
        let script = """
            mknod \(scratch.path)/fuse c 10 229 && chmod 0600 \(scratch.path)/fuse &&
            mount --bind \(scratch.path)/fuse /dev/fuse &&
            exec setpriv \(Self.asNobody.joined(separator: " ")) env HOME=\(scratch.path) \(Run.mtmfs) mount --data-dir \(data) \(mnt)
            """
        let result = Run.program("unshare", ["-m", "--propagation", "private", "/bin/sh", "-c", script])
        #expect(result.status == 1, "\(result)")
        #expect(result.stderr.contains("permission denied on /dev/fuse (mode 600"), "\(result)")
        #expect(result.stderr.contains("chmod 0666 /dev/fuse"), "\(result)")
        #expect(result.stderr.split(separator: "\n").count == 1, "one line: \(result)")
    }

    /// The demo shows the commands it ran with their output, and lists apart (without a
    /// prompt) the ones it leaves for the user to try.
    @Test func demoSeparatesWhatItRanFromWhatToTry() throws {
        let scratch = Scratch()
        defer { scratch.remove() }
        let mnt = scratch.sub("m")
        // A new user's shell after README's "Try it": no mtmfs on PATH.
        var environment = ProcessInfo.processInfo.environment
        environment["PATH"] = "/usr/sbin:/usr/bin:/sbin:/bin"
        let demo = Run.program(Run.mtmfs, ["demo", mnt], environment: environment)
        // The demo's data directory goes with its mount (the test takes it away if not).
        let demoData = (try? MountStatus.read(mnt))?["data_dir"]
        defer {
            Run.mtmfs("unmount", mnt)
            if let demoData, demoData.hasPrefix("/tmp/mtmfs-demo-data.") { try? FileManager.default.removeItem(atPath: demoData) }
        }
        #expect(demo.status == 0, "\(demo)")
        let lines = demo.stdout.split(separator: "\n", omittingEmptySubsequences: false).map(String.init)
        let tryIndex = try #require(lines.firstIndex { $0.hasPrefix("Try these yourself") })
        #expect(!lines[tryIndex...].contains { $0.hasPrefix("$ ") }, "no prompt after the heading")
        #expect(lines[tryIndex...].contains { $0.contains("sqlite3 ") && $0.contains("cache.sqlite") })
        #expect(!lines[..<tryIndex].contains { $0.contains("sqlite3 ") }, "sqlite3 is not shown as run")
        // The commands it suggests run as printed, in that same shell.
        let done = try #require(lines.first { $0.hasPrefix("When done: ") })
        #expect(done.hasSuffix(" unmount \(mnt)"), "\(done)")
        let lock = try #require(lines.first { $0.hasSuffix(" lock \(mnt)") })
        let locked = Run.program("/bin/sh", ["-c", lock], environment: environment)
        #expect(locked.status == 0, "\(lock): \(locked)")
        #expect((try? MountStatus.read(mnt))?["state"] == "locked")
        let unmounted = Run.program("/bin/sh", ["-c", String(done.dropFirst("When done: ".count))], environment: environment)
        #expect(unmounted.status == 0, "\(done): \(unmounted)")
        #expect(!MountTable.isMounted(mnt))
        #expect(demoData.map { !FileManager.default.fileExists(atPath: $0) } == true, "the demo's data directory left behind")
        // Every command shown as run is followed by its output or by the next command.
        for (index, line) in lines.enumerated() where line.hasPrefix("$ ls") || line.hasPrefix("$ cat") {
            #expect(index + 1 < lines.count && !lines[index + 1].isEmpty && !lines[index + 1].hasPrefix("$ "), "\(line)")
        }
    }

    /// A bool or number saved with a trailing blank line (nano after Enter) or an indent is
    /// accepted; a string keeps its bytes exactly.
    @Test func nonStringKeysIgnoreSurroundingWhitespace() throws {
        let store = try MountedStore()
        defer { store.close() }
        let s = store.path("settings")
        #expect(Run.shell("printf 'false\\n\\n' > \(s)/IsFirstRun && cat \(s)/IsFirstRun").stdout == "false\n")
        #expect(Run.shell("printf '42\\n' > \(s)/Count && printf '  7 \\r\\n\\n' > \(s)/Count && cat \(s)/Count").stdout == "7\n")
        #expect(Run.shell("getfattr --only-values -n user.plist.type \(s)/Count").stdout == "integer")
        #expect(Run.shell("printf ' two words \\n\\n' > \(s)/Name && cat \(s)/Name | od -c | head -1").stdout.contains("t   w   o"))
        #expect(Run.shell("cat \(s)/Name").stdout == " two words \n\n")
        let bad = Run.program("python3", ["-c", "import sys\nwith open(sys.argv[1], 'w') as f: f.write('fa lse\\n')", s + "/IsFirstRun"])
        #expect(bad.status != 0 && bad.stderr.contains("Invalid argument"), "\(bad)")
        #expect(Run.shell("cat \(s)/IsFirstRun").stdout == "false\n")
        let plist = Run.program("plistutil", ["-i", store.dataDirectory + "/Settings.plist", "-f", "xml"])
        #expect(plist.stdout.contains("<key>IsFirstRun</key>\n\t<false/>") && plist.stdout.contains("<integer>7</integer>"), "\(plist)")
    }
}
