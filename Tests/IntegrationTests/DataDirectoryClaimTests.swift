import Foundation
import Posix
import TestSupport
import Testing
#if canImport(Glibc)
import Glibc
#endif

/// One data directory, one daemon (SPEC §6): a second mount, `init` or `passwd` on a
/// mounted data directory is refused with one line naming the mount, the first mount's
/// data stays whole, and a killed daemon's claim goes with it.
@Suite(.enabled(if: FuseAvailability.isAvailable, "needs /dev/fuse")) struct DataDirectoryClaimTests {
    static let account = "0A1B2C3D-4E5F-4A6B-8C7D-9E0F1A2B3C4D"

    /// Unlocks `mount` and makes an account with a label there.
    static func addAccount(_ mountPoint: String, label: String) throws {
        let unlock = Run.mtmfs("unlock", mountPoint, input: Run.passphrase + "\n")
        try #require(unlock.status == 0, "\(unlock)")
        try #require(mkdir(mountPoint + "/accounts/" + account, 0o700) == 0, "mkdir: \(Errno.current)")
        try TestFile.write(label + "\n", to: mountPoint + "/accounts/\(account)/label")
    }

    /// The label of the test account, read through a fresh unlocked mount of `data`.
    static func labelAfterRemount(data: String, on mountPoint: String) throws -> String {
        let mounted = Run.mtmfs("mount", "--data-dir", data, mountPoint)
        try #require(mounted.status == 0, "\(mounted)")
        defer { Run.mtmfs("unmount", mountPoint) }
        let unlock = Run.mtmfs("unlock", mountPoint, input: Run.passphrase + "\n")
        try #require(unlock.status == 0, "\(unlock)")
        return TestFile.read(mountPoint + "/accounts/\(account)/label") ?? "(unreadable)"
    }

    static func expectRefusal(_ result: CommandResult, naming mountPoint: String, pid: String,
                              sourceLocation: SourceLocation = #_sourceLocation) {
        #expect(result.status == 1, "\(result)", sourceLocation: sourceLocation)
        let lines = result.stderr.split(separator: "\n")
        #expect(lines.count == 1, "one line: \(result)", sourceLocation: sourceLocation)
        #expect(result.stderr.contains("is in use by the mtmfs mount on \(mountPoint) (pid \(pid))"),
                "\(result)", sourceLocation: sourceLocation)
        #expect(result.stderr.contains("mtmfs unmount \(mountPoint)"), "\(result)", sourceLocation: sourceLocation)
    }

    @Test func secondMountInitAndPasswdAreRefusedAndTheFirstMountsDataStays() throws {
        let store = try MountedStore()
        defer { store.close() }
        try Self.addAccount(store.mountPoint, label: "made through the first mount")
        let pid = try #require(try store.status()["pid"])
        let second = store.scratch.sub("mnt2")
        mkdir(second, 0o755)

        Self.expectRefusal(Run.mtmfs("mount", "--data-dir", store.dataDirectory, second), naming: store.mountPoint, pid: pid)
        // Refused before the passphrase is asked for.
        Self.expectRefusal(Run.mtmfs("mount", "--unlock", "--data-dir", store.dataDirectory, second, input: ""),
                           naming: store.mountPoint, pid: pid)
        // In the foreground, the daemon itself refuses (no parent checked first).
        Self.expectRefusal(Run.program(Run.mtmfs, ["mount", "-f", "--data-dir", store.dataDirectory, second], timeout: 30),
                           naming: store.mountPoint, pid: pid)
        #expect(!MountTable.isMounted(second))
        Self.expectRefusal(Run.program(Run.mtmfs, ["init", "--kdf", "interactive", "--data-dir", store.dataDirectory],
                                       input: "other\n"), naming: store.mountPoint, pid: pid)
        Self.expectRefusal(Run.program(Run.mtmfs, ["passwd", "--data-dir", store.dataDirectory],
                                       input: Run.passphrase + "\nnew one\nnew one\n"), naming: store.mountPoint, pid: pid)

        // Reading is allowed while mounted.
        let check = Run.mtmfs("check", "--data-dir", store.dataDirectory)
        #expect(check.status == 0, "\(check)")

        // The first mount still serves, and its change is on disk after it ends.
        #expect(TestFile.read(store.path("accounts/\(Self.account)/label"))
                == "made through the first mount\n")
        let unmounted = Run.mtmfs("unmount", store.mountPoint)
        #expect(unmounted.status == 0, "\(unmounted)")
        #expect(try Self.labelAfterRemount(data: store.dataDirectory, on: second) == "made through the first mount\n")
        // The passphrase was not changed by the refused passwd.
        let unlocked = Run.mtmfs("mount", "--unlock", "--data-dir", store.dataDirectory, second, input: Run.passphrase + "\n")
        #expect(unlocked.status == 0, "\(unlocked)")
        Run.mtmfs("unmount", second)
    }

    /// The refused second daemon never opens the cache: the first one's clean shutdown is
    /// not taken for an unclean one, and a real crash still is.
    @Test func cleanShutdownMarkIsReadTruthfully() throws {
        let store = try MountedStore()
        defer { store.close() }
        let second = store.scratch.sub("mnt2")
        mkdir(second, 0o755)
        let refused = Run.mtmfs("mount", "--data-dir", store.dataDirectory, second)
        #expect(refused.status == 1, "\(refused)")
        #expect(!refused.stderr.contains("unclean"), "\(refused)")
        #expect(Run.mtmfs("unmount", store.mountPoint).status == 0)

        let clean = Run.mtmfs("mount", "--data-dir", store.dataDirectory, store.mountPoint)
        #expect(clean.status == 0, "\(clean)")
        #expect(!clean.stderr.contains("unclean"), "\(clean)")

        // Killed: the claim goes with the process, the next mount works and says why it checks.
        try Self.addAccount(store.mountPoint, label: "before the crash")
        try store.killDaemon(detach: true)
        let afterCrash = Run.mtmfs("mount", "--data-dir", store.dataDirectory, second)
        #expect(afterCrash.status == 0, "\(afterCrash)")
        #expect(afterCrash.stderr.contains("after an unclean shutdown"), "\(afterCrash)")
        Run.mtmfs("unmount", second)
        #expect(try Self.labelAfterRemount(data: store.dataDirectory, on: second) == "before the crash\n")
    }

    @Test func unlockOfAnUnlockedMountSaysSoWithoutAPassphrase() throws {
        let store = try MountedStore()
        defer { store.close() }
        let first = Run.mtmfs("unlock", store.mountPoint, input: Run.passphrase + "\n")
        #expect(first.status == 0, "\(first)")
        #expect(first.stdout.contains("Unlocked"), "\(first)")
        // No standard input at all: it is not asked for.
        let again = Run.mtmfs("unlock", store.mountPoint, input: "")
        #expect(again.status == 0, "\(again)")
        #expect(again.stdout == "The accounts of \(store.mountPoint) are already unlocked.\n", "\(again)")
        #expect(try store.status()["state"] == "unlocked")

        #expect(Run.mtmfs("lock", store.mountPoint).status == 0)
        let wrong = Run.mtmfs("unlock", store.mountPoint, input: "not it\n")
        #expect(wrong.status == 1, "\(wrong)")
        #expect(wrong.stderr.contains("wrong passphrase; the accounts stay locked"), "\(wrong)")
    }
}
