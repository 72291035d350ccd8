import Foundation
import Posix
import TestSupport
import Testing
#if canImport(Glibc)
import Glibc
#endif

/// `mount-helpers/`: mount(8) and /etc/fstab through the helper; the dependency installer.
@Suite(.serialized, .enabled(if: FuseAvailability.isAvailable, "needs /dev/fuse")) struct MountHelperTests {
    /// mount(8) finds helpers in /sbin only: link ours there unless one is installed.
    static func helperInstalled() throws -> Bool {
        let helper = "/sbin/mount.fuse.mtmfs"
        if FileManager.default.fileExists(atPath: helper) { return true }  // follows links
        guard getuid() == 0 else { return false }
        unlink(helper)  // a link left dangling by a checkout that moved
        try FileManager.default.createSymbolicLink(atPath: helper, withDestinationPath: Run.repository + "/mount-helpers/mount.mtmfs")
        return true
    }

    var environment: [String: String] {
        var environment = ProcessInfo.processInfo.environment
        environment["MTMFS"] = Run.mtmfs
        return environment
    }

    @Test func mountTypeFuseMtmfsMountsAndUmountEndsTheDaemon() throws {
        guard try Self.helperInstalled() else { return }
        let scratch = Scratch()
        defer { scratch.remove() }
        let (data, mnt) = scratch.initializedStore()
        let mounted = Run.program("mount", ["-t", "fuse.mtmfs", "-o", "rw,nofail,x-systemd.automount", data, mnt],
                                  environment: environment)
        #expect(mounted.status == 0, "\(mounted)")
        #expect(MountTable.isMounted(mnt))
        #expect(try FileManager.default.contentsOfDirectory(atPath: mnt).sorted() == [".mtmfs", "accounts", "cache", "settings"])
        let pid = Int32(try String(contentsOfFile: mnt + "/.mtmfs/status", encoding: .utf8)
            .split(separator: "\n").first { $0.hasPrefix("pid=") }!.dropFirst(4))!
        let unmounted = Run.program("umount", [mnt])
        #expect(unmounted.status == 0, "\(unmounted)")
        #expect(Poll.until { !ProcessState.isRunning(pid) })
        #expect(!MountTable.isMounted(mnt))
    }

    @Test func fstabLineMountsWithFuseOptions() throws {
        guard try Self.helperInstalled() else { return }
        let scratch = Scratch()
        defer { scratch.remove() }
        let (data, mnt) = scratch.initializedStore()
        let fstab = scratch.sub("fstab")
        try "\(data) \(mnt) fuse.mtmfs noauto,user,allow_other,noatime 0 0\n"
            .write(toFile: fstab, atomically: true, encoding: .utf8)
        let mounted = Run.program("mount", ["--fstab", fstab, mnt], environment: environment)
        #expect(mounted.status == 0, "\(mounted)")
        let line = try String(contentsOfFile: "/proc/mounts", encoding: .utf8)
            .split(separator: "\n").first { $0.contains(" \(mnt) ") }.map(String.init) ?? ""
        #expect(line.contains("fuse.mtmfs") && line.contains("allow_other"), "\(line)")
        #expect(Run.mtmfs("unmount", mnt).status == 0)
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
