import Foundation
import Posix
import TestSupport
import Testing
#if canImport(Glibc)
import Glibc
#endif

/// `mount-helpers/`: mount(8) and /etc/fstab through the helper; the dependency installer.
@Suite(.serialized, .enabled(if: FuseAvailability.isAvailable, "needs /dev/fuse")) struct MountHelperTests {
    /// mount(8) finds helpers in /sbin only. The tests install nothing there: `script` runs
    /// as root in a private mount namespace (`unshare -m`) where an overlay puts this
    /// checkout's helper into /sbin, seen by nothing outside. What it mounts is seen only
    /// inside, so the script checks and unmounts for itself (its EXIT trap detaches whatever
    /// is left). Arguments: $1 the mtmfs binary (also $MTMFS), $2 the scratch directory.
    /// Nil where the tests do not run as root (no namespace, no helper: nothing to test).
    static func inHelperNamespace(_ scratch: Scratch, _ script: String) -> CommandResult? {
        guard getuid() == 0 else { return nil }
        let extra = scratch.sub("sbin-extra")
        mkdir(extra, 0o755)
        symlink(Run.repository + "/mount-helpers/mount.mtmfs", extra + "/mount.fuse.mtmfs")
        let sbin = URL(fileURLWithPath: "/sbin").resolvingSymlinksInPath().path
        let wrapped = """
            set -eu
            \(GuardedMount.dropOtherFuseMounts)
            mount -t overlay overlay -o "lowerdir=$2/sbin-extra:\(sbin)" "\(sbin)"
            trap 'for m in $(awk -v p="$2/" '"'"'index($2, p) == 1 && $3 ~ /^fuse/ {print $2}'"'"' /proc/mounts); do fusermount3 -uz "$m"; done' EXIT
            \(script)
            """
        var environment = ProcessInfo.processInfo.environment
        environment["MTMFS"] = Run.mtmfs
        let result = Run.program("unshare", ["-m", "--propagation", "private", "/bin/sh", "-c", wrapped, "sh", Run.mtmfs, scratch.path],
                                 environment: environment, timeout: 120)
        // A daemon unmounted last ends after the script (saving its vault, letting its lock
        // go): the scratch is removed only once no process runs from it, or that daemon
        // writes into a directory being removed and leaves it behind.
        // (The daemons mount(8) starts carry the test run's marker, as every child does.)
        #expect(Poll.until(seconds: 10) { !Leftovers.processes().contains { $0.command.contains(scratch.path + "/") } },
                "a daemon of \(scratch.path) still runs")
        return result
    }

    @Test func mountTypeFuseMtmfsMountsAndUmountEndsTheDaemon() throws {
        let scratch = Scratch()
        defer { scratch.remove() }
        let (data, mnt) = scratch.initializedStore()
        let result = Self.inHelperNamespace(scratch, """
            mount -t fuse.mtmfs -o rw,nofail,x-systemd.automount "\(data)" "\(mnt)"
            echo "listing: $(ls -A "\(mnt)" | tr '\\n' ' ')"
            pid=$(sed -n 's/^pid=//p' "\(mnt)/.mtmfs/status")
            umount "\(mnt)"
            for i in $(seq 500); do kill -0 "$pid" 2>/dev/null || break; sleep 0.02; done
            kill -0 "$pid" 2>/dev/null && echo "daemon alive" || echo "daemon gone"
            grep -q " \(mnt) " /proc/mounts && echo "still mounted" || echo "unmounted"
            """)
        guard let result else { return }
        #expect(result.status == 0, "\(result)")
        #expect(result.stdout == "listing: .mtmfs accounts cache settings \ndaemon gone\nunmounted\n", "\(result)")
    }

    @Test func fstabLineMountsWithFuseOptions() throws {
        let scratch = Scratch()
        defer { scratch.remove() }
        let (data, mnt) = scratch.initializedStore()
        let fstab = scratch.sub("fstab")
        try "\(data) \(mnt) fuse.mtmfs noauto,user,allow_other,noatime 0 0\n"
            .write(toFile: fstab, atomically: true, encoding: .utf8)
        let result = Self.inHelperNamespace(scratch, """
            mount --fstab "\(fstab)" "\(mnt)"
            grep " \(mnt) " /proc/mounts
            "$1" unmount "\(mnt)"
            """)
        guard let result else { return }
        #expect(result.status == 0, "\(result)")
        #expect(result.stdout.contains("fuse.mtmfs") && result.stdout.contains("allow_other"), "\(result)")
    }

    /// A data directory mounted through mount(8) is not mounted again through it, nor through
    /// `mtmfs mount`; the first mount's account survives both attempts.
    @Test func secondMountThroughTheHelperIsRefused() throws {
        let scratch = Scratch()
        defer { scratch.remove() }
        let (data, mnt) = scratch.initializedStore()
        let second = scratch.sub("mnt2")
        mkdir(second, 0o755)
        let account = "5A0C1E2D-3B4F-4A5C-9D6E-7F8091A2B3C4"
        let result = Self.inHelperNamespace(scratch, """
            mount -t fuse.mtmfs "\(data)" "\(mnt)"
            echo "\(Run.passphrase)" | "$1" unlock "\(mnt)" >/dev/null
            mkdir "\(mnt)/accounts/\(account)"
            echo first > "\(mnt)/accounts/\(account)/label"
            if mount -t fuse.mtmfs "\(data)" "\(second)" 2>"$2/helper.err"; then echo "helper: mounted"; else echo "helper: refused"; fi
            if "$1" mount --data-dir "\(data)" "\(second)" 2>"$2/mount.err"; then echo "mtmfs: mounted"; else echo "mtmfs: refused"; fi
            umount "\(mnt)"
            mount -t fuse.mtmfs "\(data)" "\(second)"
            echo "\(Run.passphrase)" | "$1" unlock "\(second)" >/dev/null
            echo "label: $(cat "\(second)/accounts/\(account)/label")"
            umount "\(second)"
            """)
        guard let result else { return }
        #expect(result.status == 0, "\(result)")
        #expect(result.stdout == "helper: refused\nmtmfs: refused\nlabel: first\n", "\(result)")
        for name in ["helper.err", "mount.err"] {
            let text = (try? String(contentsOfFile: scratch.sub(name), encoding: .utf8)) ?? ""
            #expect(text.contains("is in use by the mtmfs mount on \(mnt) (pid "), "\(name): \(text)")
            #expect(text.split(separator: "\n").count == 1, "\(name): one line: \(text)")
        }
    }

    var environment: [String: String] {
        var environment = ProcessInfo.processInfo.environment
        environment["MTMFS"] = Run.mtmfs
        return environment
    }

    @Test func helperRejectsAMissingMountPoint() throws {
        let result = Run.program(Run.repository + "/mount-helpers/mount.mtmfs", ["/nonexistent-data", "/nonexistent-mnt"],
                                 environment: environment)
        #expect(result.status == 1)
        #expect(result.stderr.contains("does not exist"), "\(result)")
        let usage = Run.program(Run.repository + "/mount-helpers/mount.mtmfs", ["only-one"])
        #expect(usage.status == 2)
    }

    @Test func installDepsIsQuickWhenEverythingIsPresent() throws {
        let result = Run.program(Run.repository + "/mount-helpers/install-deps", [])
        #expect(result.status == 0, "\(result)")
        #expect(!result.stdout.contains("installing"), "\(result)")
    }
}
