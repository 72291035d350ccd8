import Foundation
import Posix
import TestSupport
import Testing
#if canImport(Glibc)
import Glibc
#endif

/// `mtmfs mount` / `unmount` / `status`: readiness, errors, signals, stale mounts.
@Suite(.enabled(if: FuseAvailability.isAvailable, "needs /dev/fuse")) struct MountLifecycleTests {
    @Test func mountIsReadyOnTheNextLineEveryTime() throws {
        let scratch = Scratch()
        defer { scratch.remove() }
        let (data, mnt) = scratch.initializedStore()
        let script = """
            set -e
            for i in $(seq 20); do
              "$0" mount --data-dir "$1" "$2"
              ls "$2" | tr '\\n' ' '; echo
              "$0" unmount "$2"
            done
            """
        let result = Run.program("/bin/sh", ["-c", script, Run.mtmfs, data, mnt], timeout: 120)
        #expect(result.status == 0, "\(result)")
        let lines = result.stdout.split(separator: "\n")
        #expect(lines.count == 20)
        #expect(lines.allSatisfy { $0 == "accounts cache settings " }, "\(result.stdout)")
        #expect(!MountTable.isMounted(mnt))
    }

    @Test func unmountWaitsForTheDaemonToExit() throws {
        let store = try MountedStore()
        defer { store.close() }
        let pid = try #require(Int32(try store.status()["pid"] ?? ""))
        #expect(ProcessState.isRunning(pid))
        let result = Run.mtmfs("unmount", store.mountPoint)
        #expect(result.status == 0, "\(result)")
        #expect(!ProcessState.isRunning(pid), "daemon still alive after unmount returned")
        #expect(!MountTable.isMounted(store.mountPoint))
    }

    /// Foundation (with ICU) was 8 MB of the daemon's 22 MB resident: it must not come back
    /// through a stray `import Foundation` in a module the daemon uses.
    @Test func daemonLoadsNoFoundation() throws {
        let store = try MountedStore()
        defer { store.close() }
        let pid = try #require(Int32(try store.status()["pid"] ?? ""))
        let maps = Run.program("/bin/cat", ["/proc/\(pid)/maps"]).stdout  // procfs: no short reads
        #expect(maps.contains("libswiftCore"), "not the daemon's map")
        let foundation = maps.split(separator: "\n").filter { $0.contains("Foundation") || $0.contains("ICU") }
        #expect(foundation.isEmpty, "\(foundation)")
    }

    /// Root's mounts read ahead 1 MiB (the kernel's 128 KiB made cold reads 25 % slower).
    @Test func rootMountReadsAheadOneMebibyte() throws {
        let store = try MountedStore()
        defer { store.close() }
        let device = Run.program("mountpoint", ["-d", store.mountPoint]).stdout.split(separator: "\n").first ?? ""
        let readAhead = Run.program("/bin/cat", ["/sys/class/bdi/\(device)/read_ahead_kb"])
        #expect(geteuid() != 0 || readAhead.stdout == "1024\n", "\(device): \(readAhead)")
    }

    @Test func mountPointErrors() throws {
        let scratch = Scratch()
        defer { scratch.remove() }
        let data = scratch.sub("data")
        #expect(Run.initStore(data).status == 0)

        let missing = Run.mtmfs("mount", "--data-dir", data, scratch.sub("nowhere"))
        #expect(missing.status == 1)
        #expect(missing.stderr.contains("does not exist: create it with `mkdir -p"), "\(missing)")

        _ = FileManager.default.createFile(atPath: scratch.sub("file"), contents: Data())
        let notDirectory = Run.mtmfs("mount", "--data-dir", data, scratch.sub("file"))
        #expect(notDirectory.status == 1)
        #expect(notDirectory.stderr.contains("is not a directory"), "\(notDirectory)")

        mkdir(scratch.sub("full"), 0o755)
        _ = FileManager.default.createFile(atPath: scratch.sub("full/x"), contents: Data())
        let notEmpty = Run.mtmfs("mount", "--data-dir", data, scratch.sub("full"))
        #expect(notEmpty.status == 1)
        #expect(notEmpty.stderr.contains("is not empty"), "\(notEmpty)")

        mkdir(scratch.sub("mnt"), 0o755)
        #expect(Run.mtmfs("mount", "--data-dir", data, scratch.sub("mnt")).status == 0)
        let twice = Run.mtmfs("mount", "--data-dir", data, scratch.sub("mnt"))
        #expect(twice.status == 1)
        #expect(twice.stderr.contains("is already an mtmfs mount: unmount it first"), "\(twice)")
        #expect(Run.mtmfs("unmount", scratch.sub("mnt")).status == 0)

        for result in [missing, notDirectory, notEmpty, twice] {
            #expect(result.stderr.split(separator: "\n").count == 1, "not one line: \(result)")
        }
        #expect(MountTable.mtmfsMountPoints().allSatisfy { !$0.hasPrefix(scratch.path) })
    }

    @Test func dataDirectoryErrors() throws {
        let scratch = Scratch()
        defer { scratch.remove() }
        mkdir(scratch.sub("mnt"), 0o755)

        let missing = Run.mtmfs("mount", "--data-dir", scratch.sub("nodata"), scratch.sub("mnt"))
        #expect(missing.status == 1)
        #expect(missing.stderr.contains("run `mtmfs init --data-dir"), "\(missing)")

        mkdir(scratch.sub("empty"), 0o700)
        let uninitialized = Run.mtmfs("mount", "--data-dir", scratch.sub("empty"), scratch.sub("mnt"))
        #expect(uninitialized.status == 1)
        #expect(uninitialized.stderr.contains("holds no mtmfs store: run `mtmfs init"), "\(uninitialized)")

        // Unreadable: a store owned by root, mounted by nobody (root itself bypasses modes).
        #expect(Run.initStore(scratch.sub("private")).status == 0)
        chmod(scratch.sub("mnt"), 0o777)
        let unreadable = Run.program("setpriv", ["--reuid", "65534", "--regid", "65534", "--clear-groups",
                                                 Run.mtmfs, "mount", "--data-dir", scratch.sub("private"),
                                                 scratch.sub("mnt")])
        #expect(unreadable.status == 1, "\(unreadable)")
        #expect(unreadable.stderr.contains("is unreadable"), "\(unreadable)")

        let unknown = Run.mtmfs("mount", "--frob", scratch.sub("mnt"))
        #expect(unknown.status == 2)
        #expect(unknown.stderr.contains("unknown option --frob; see `mtmfs mount --help`"), "\(unknown)")
        let noMountPoint = Run.mtmfs("mount")
        #expect(noMountPoint.status == 2)
        #expect(!MountTable.isMounted(scratch.sub("mnt")))
    }

    /// A daemon started with `&` from a script ignores SIGINT by inheritance; it must
    /// still unmount on SIGINT and SIGTERM.
    @Test(arguments: ["INT", "TERM"])
    func backgroundedForegroundDaemonUnmountsOnSignal(signal: String) throws {
        let scratch = Scratch()
        defer { scratch.remove() }
        let (data, mnt) = scratch.initializedStore()
        let start = Run.program("/bin/sh", ["-c", "\"$0\" mount -f --data-dir \"$1\" \"$2\" >/dev/null 2>&1 & echo $!",
                                            Run.mtmfs, data, mnt])
        let pid = try #require(Int32(start.stdout.trimmingCharacters(in: .whitespacesAndNewlines)))
        #expect(Poll.until { MountTable.isMounted(mnt) && FileManager.default.fileExists(atPath: mnt + "/accounts") })
        #expect(Run.program("kill", ["-\(signal)", "\(pid)"]).status == 0)
        #expect(Poll.until { !MountTable.isMounted(mnt) }, "still mounted after SIG\(signal)")
        #expect(Poll.until { !ProcessState.isRunning(pid) }, "daemon alive after SIG\(signal)")
    }

    @Test(arguments: ["INT", "TERM", "HUP"])
    func detachedDaemonUnmountsOnSignal(signal: String) throws {
        let store = try MountedStore()
        defer { store.close() }
        let pid = try #require(Int32(try store.status()["pid"] ?? ""))
        #expect(Run.program("kill", ["-\(signal)", "\(pid)"]).status == 0)
        #expect(Poll.until { !MountTable.isMounted(store.mountPoint) })
        #expect(Poll.until { !ProcessState.isRunning(pid) })
    }

    @Test func staleMountIsReportedAndCleanedUp() throws {
        let store = try MountedStore()
        defer { store.close() }
        let pid = try #require(Int32(try store.status()["pid"] ?? ""))
        kill(pid, SIGKILL)
        #expect(Poll.until { !ProcessState.isRunning(pid) })
        var fs = statvfs()
        #expect([ENOTCONN, ECONNABORTED].contains(errnoOf { statvfs(store.mountPoint, &fs) }))

        let again = Run.mtmfs("mount", "--data-dir", store.dataDirectory, store.mountPoint)
        #expect(again.status == 1)
        #expect(again.stderr.contains("stale FUSE mount (Transport endpoint is not connected): run `fusermount3 -uz"), "\(again)")

        let status = Run.mtmfs("status", store.mountPoint)
        #expect(status.stdout.contains("stale (its daemon is gone"), "\(status)")

        let unmount = Run.mtmfs("unmount", store.mountPoint)
        #expect(unmount.status == 0, "\(unmount)")
        #expect(!MountTable.isMounted(store.mountPoint))
        #expect(Run.mtmfs("mount", "--data-dir", store.dataDirectory, store.mountPoint).status == 0)
    }

    @Test func busyMountIsReportedAndLazyUnmountDetaches() throws {
        let store = try MountedStore()
        defer { store.close() }
        // A process with its working directory inside keeps the mount busy.
        let holder = Run.program("/bin/sh", ["-c", "cd \"$0\" && sleep 30 >/dev/null 2>&1 & echo $!", store.path("cache")])
        let pid = try #require(Int32(holder.stdout.trimmingCharacters(in: .whitespacesAndNewlines)))
        defer { kill(pid, SIGKILL) }
        #expect(Poll.until { (try? String(contentsOfFile: "/proc/\(pid)/cwd/../.mtmfs/status", encoding: .utf8)) != nil })
        let busy = Run.mtmfs("unmount", store.mountPoint)
        #expect(busy.status == 1 && busy.stderr.contains("is busy: close the files and shells using it"), "\(busy)")
        #expect(MountTable.isMounted(store.mountPoint))
        // Lazily detached, the daemon serves until its last user leaves: unmount waits for that.
        let lazy = Run.program("/bin/sh", ["-c", "(sleep 0.5; kill -9 \(pid)) & \"$0\" unmount --lazy \"$1\"",
                                           Run.mtmfs, store.mountPoint])
        #expect(lazy.status == 0, "\(lazy)")
        #expect(!MountTable.isMounted(store.mountPoint))
    }

    @Test func unmountAndStatusOfSomethingElse() throws {
        let scratch = Scratch()
        defer { scratch.remove() }
        let unmount = Run.mtmfs("unmount", scratch.path)
        #expect(unmount.status == 6)  // no mount (mtmfs(1), EXIT STATUS)
        #expect(unmount.stderr.contains("is not an mtmfs mount"), "\(unmount)")
        let status = Run.mtmfs("status", scratch.path)
        #expect(status.status == 6)
        #expect(status.stderr.contains("is not an mtmfs mount"), "\(status)")
    }

    @Test func statusSummarizesAMount() throws {
        let store = try MountedStore()
        defer { store.close() }
        let result = Run.mtmfs("status", store.mountPoint)
        #expect(result.status == 0, "\(result)")
        #expect(result.stdout.contains("\(store.mountPoint): mounted from \(store.dataDirectory)"), "\(result)")
        #expect(result.stdout.contains("accounts: locked"), "\(result)")
        #expect(result.stdout.contains("cache: 0 file(s), 0 bytes"), "\(result)")
        let all = Run.mtmfs("status")
        #expect(all.stdout.contains(store.mountPoint))
    }

    @Test func foregroundMountReportsErrorsOnStandardError() throws {
        let scratch = Scratch()
        defer { scratch.remove() }
        mkdir(scratch.sub("mnt"), 0o755)
        let result = Run.mtmfs("mount", "-f", "--data-dir", scratch.sub("none"), scratch.sub("mnt"))
        #expect(result.status == 1)
        #expect(result.stderr.contains("run `mtmfs init"), "\(result)")
    }
}
