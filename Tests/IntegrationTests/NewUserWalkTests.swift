import Foundation
import TestSupport
import Testing
#if canImport(Glibc)
import Glibc
#endif

/// What a new user met walking the README, each as a user runs it (it failed before).
@Suite(.enabled(if: FuseAvailability.isAvailable, "needs /dev/fuse")) struct NewUserWalkTests {
    /// `init` of a data directory that holds a store says so before it asks anything.
    @Test func initRefusesAStoreBeforeAskingAPassphrase() throws {
        let store = try MountedStore()
        defer { store.close() }
        // No passphrase on standard input: a refusal that asked first would read nothing.
        let again = Run.program(Run.mtmfs, ["init", "--data-dir", store.dataDirectory], input: "")
        #expect(again.status == 1 && again.stderr.contains("already holds an mtmfs store") || again.stderr.contains("in use by"),
                "\(again)")
        #expect(!again.stdout.contains("passphrase") && !again.stderr.contains("passphrase:"), "\(again)")
    }

    /// `mount --unlock` with a wrong passphrase leaves no mount (`mount --unlock M && …`).
    @Test func aWrongPassphraseAtMountLeavesNoMount() throws {
        let scratch = Scratch("walk")
        defer { scratch.remove() }
        try #require(Run.initStore(scratch.sub("d")).status == 0)
        mkdir(scratch.sub("m"), 0o755)
        let mounted = Run.program(Run.mtmfs, ["mount", "--data-dir", scratch.sub("d"), "--unlock", scratch.sub("m")],
                                  input: "not the passphrase\n")
        defer { if MountTable.isMounted(scratch.sub("m")) { Run.mtmfs("unmount", scratch.sub("m")) } }
        #expect(mounted.status == 1 && mounted.stderr.contains("wrong passphrase") && mounted.stderr.contains("unmounted again"),
                "\(mounted)")
        #expect(!MountTable.isMounted(scratch.sub("m")))
    }

    /// A stale mount (its daemon killed) makes `status` exit 6, and says how to end it.
    @Test func statusOfAStaleMountFails() throws {
        let store = try MountedStore()
        defer { store.close() }
        try store.killDaemon(detach: false)
        let status = Run.mtmfs("status", store.mountPoint)
        #expect(status.status == 6 && status.stdout.contains("stale"), "\(status)")
        #expect(Run.mtmfs("unmount", store.mountPoint).status == 0)
    }

    /// A damaged `vault/id` is said at mount and shown as such, never "run mtmfs unlock".
    @Test func aDamagedVaultIsSaidAtMount() throws {
        let scratch = Scratch("walk")
        defer { scratch.remove() }
        try #require(Run.initStore(scratch.sub("d")).status == 0)
        try "not an id\n".write(toFile: scratch.sub("d") + "/vault/id", atomically: false, encoding: .utf8)
        mkdir(scratch.sub("m"), 0o755)
        let mounted = Run.program(Run.mtmfs, ["mount", "--data-dir", scratch.sub("d"), scratch.sub("m")])
        defer { Run.mtmfs("unmount", scratch.sub("m")) }
        #expect(mounted.status == 0 && mounted.stderr.contains("vault damaged"), "\(mounted)")
        let status = Run.mtmfs("status", scratch.sub("m"))
        #expect(status.stdout.contains("unavailable") && !status.stdout.contains("accounts: locked"), "\(status)")
    }

    /// The log a user can always read, named by `status`; never a value in it.
    @Test func theLogIsInTheDataDirectory() throws {
        let store = try MountedStore()
        defer { store.close() }
        #expect(Run.mtmfs("unlock", store.mountPoint, input: Run.passphrase + "\n").status == 0)
        let uuid = "3f2c9a1e-7b4d-4c8e-9f6a-5d4c3b2a1f0e"
        #expect(Run.shell("mkdir \(store.path("accounts/\(uuid)")) && echo hush-value-731 > \(store.path("accounts/\(uuid)/password"))").status == 0)
        let status = try store.status()
        #expect(status["log"] == store.dataDirectory + "/mtmfs.log")
        #expect(Run.mtmfs("status", store.mountPoint).stdout.contains("log: \(store.dataDirectory)/mtmfs.log"))
        #expect(Run.mtmfs("lock", store.mountPoint).status == 0)
        let log = (try? String(contentsOfFile: store.dataDirectory + "/mtmfs.log", encoding: .utf8)) ?? ""
        #expect(log.contains("accounts unlocked") && log.contains("accounts locked"), "\(log)")
        #expect(!log.contains("hush-value-731") && !log.contains(Run.passphrase))
    }

    /// find and status for scripts: JSON, and exit codes that tell failures apart.
    @Test func findAndStatusSpeakJSON() throws {
        let store = try MountedStore()
        defer { store.close() }
        #expect(Run.mtmfs("unlock", store.mountPoint, input: Run.passphrase + "\n").status == 0)
        let uuid = "8a6b4c2d-1e3f-4a5b-8c7d-9e0f1a2b3c4d"
        #expect(Run.shell("cd \(store.path("accounts")) && mkdir \(uuid) && echo https://git.example.org > \(uuid)/url && echo ann > \(uuid)/username").status == 0)
        let found = Run.mtmfs("find", store.mountPoint, "--server", "git.example.org", "--json")
        let objects = try #require(try JSONSerialization.jsonObject(with: Data(found.stdout.utf8)) as? [[String: Any]], "\(found)")
        #expect(objects.count == 1 && objects[0]["uuid"] as? String == uuid)
        #expect((objects[0]["fields"] as? [String: String])?["username"] == "ann")
        let status = Run.mtmfs("status", "--json", store.mountPoint)
        let mounts = try #require(try JSONSerialization.jsonObject(with: Data(status.stdout.utf8)) as? [[String: String]], "\(status)")
        #expect(mounts.first?["mount_point"] == store.mountPoint && mounts.first?["state"] == "unlocked")
        // The nil UUID holds the vault's guarding flag: it is no account.
        #expect(errnoOf { mkdir(store.path("accounts/00000000-0000-0000-0000-000000000000"), 0o700) } == EINVAL)
    }
}
