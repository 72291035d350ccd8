#if canImport(Glibc)
import Glibc
#endif
import Foundation
import Testing
import TestSupport

/// `mtmfs sync` and `mtmfs init --from` (SPEC §2b) with the system's git and a bare
/// repository as the remote, two machines as two data directories mounted side by side.
@Suite struct SyncTests {
    static let uuid = "6ba7b810-9dad-41d1-80b4-00c04fd430c8"
    static let other = "0f8fad5b-d9cb-469f-a165-70867728950e"

    /// A bare remote, machine A (made by `init`, mounted, unlocked, one account, synced)
    /// and machine B (made by `init --from` the remote, mounted, unlocked).
    struct Machines {
        let remoteScratch = Scratch("sync-remote")
        let a: MountedStore
        let b: MountedStore
        var remote: String { remoteScratch.sub("vault.git") }

        init() throws {
            let remoteScratch = self.remoteScratch
            let remote = remoteScratch.sub("vault.git")
            try #require(Run.program("git", ["init", "-q", "--bare", remote]).status == 0)
            a = try MountedStore()
            try #require(Run.mtmfs("unlock", a.mountPoint, input: Run.passphrase + "\n").status == 0)
            try #require(mkdir(a.path("accounts/\(Self.uuidA)"), 0o700) == 0)
            try #require(Run.shell("printf 'ann\\n' > \(a.path("accounts/\(Self.uuidA)/username"))").status == 0)
            try #require(FileManager.default.fileExists(atPath: a.dataDirectory + "/vault/.git"), "init made no repository")
            try #require(Run.program("git", ["-C", a.dataDirectory + "/vault", "remote", "add", "origin", remote]).status == 0)
            let synced = Run.mtmfs("sync", a.mountPoint)
            try #require(synced.status == 0, "\(synced)")
            b = try MountedStore(initialize: { data in
                Run.program(Run.mtmfs, ["init", "--from", remote, "--data-dir", data], input: Run.passphrase + "\n")
            })
            try #require(Run.mtmfs("unlock", b.mountPoint, input: Run.passphrase + "\n").status == 0)
        }

        static var uuidA: String { SyncTests.uuid }

        func close() {
            a.close()
            b.close()
            remoteScratch.remove()
        }
    }

    func cat(_ store: MountedStore, _ relative: String) -> String {
        Run.program("cat", [store.path(relative)]).stdout
    }

    func write(_ store: MountedStore, _ relative: String, _ text: String) -> Bool {
        Run.shell("printf '%s\\n' '\(text)' > \(store.path(relative))").status == 0
    }

    @Test func changesTravelBothWaysAndConflictsShowOnBoth() throws {
        let m = try Machines()
        defer { m.close() }
        let field = "accounts/\(Self.uuid)/username"
        #expect(cat(m.b, field) == "ann\n", "init --from brings the accounts")
        #expect(try m.b.status()["state"] == "unlocked")
        let deviceA = try String(contentsOfFile: m.a.dataDirectory + "/device", encoding: .utf8)
        let deviceB = try String(contentsOfFile: m.b.dataDirectory + "/device", encoding: .utf8)
        #expect(deviceA.split(separator: "\n").first != deviceB.split(separator: "\n").first, "each machine its own device id")
        // Apart: one field on both, a new account on each.
        #expect(write(m.a, field, "from a"))
        usleep(5_000)
        #expect(write(m.b, field, "from b"))
        #expect(mkdir(m.b.path("accounts/\(Self.other)"), 0o700) == 0)
        #expect(write(m.b, "accounts/\(Self.other)/label", "made on b"))
        for store in [m.a, m.b, m.a] {
            let synced = Run.mtmfs("sync", store.mountPoint)
            #expect(synced.status == 0, "\(synced)")
        }
        for store in [m.a, m.b] {
            #expect(cat(store, field) == "from b\n", "the later value")
            #expect(cat(store, "accounts/\(Self.uuid)/conflicts/username").hasPrefix("from a\t"))
            #expect(cat(store, "accounts/\(Self.other)/label") == "made on b\n")
            #expect(try store.status()["conflicts"] == "1")
        }
        // Resolved on A, removed on B: both travel.
        #expect(write(m.a, field, "agreed"))
        #expect(Run.shell("rm -r \(m.b.path("accounts/\(Self.other)"))").status == 0)
        for store in [m.a, m.b, m.a] { #expect(Run.mtmfs("sync", store.mountPoint).status == 0) }
        for store in [m.a, m.b] {
            #expect(cat(store, field) == "agreed\n")
            #expect(try store.status()["conflicts"] == "0")
            #expect(!FileManager.default.fileExists(atPath: store.path("accounts/\(Self.other)")))
        }
        // The history holds no value and no name of a field's content.
        let log = Run.program("git", ["-C", m.remote, "log", "--all", "-p", "--format=%an %s"]).stdout
        #expect(!log.contains("agreed") && !log.contains("from a") && !log.contains("made on b") && log.contains("mtmfs"))
        let grep = Run.program("grep", ["-r", "-l", "-F", "-e", "agreed", "-e", "made on b", m.remote, m.a.dataDirectory + "/vault"])
        #expect(grep.stdout.isEmpty, "plaintext in \(grep.stdout)")
    }

    @Test func twoMachinesSyncingAtOnceBothLand() throws {
        let m = try Machines()
        defer { m.close() }
        #expect(write(m.a, "accounts/\(Self.uuid)/comment", "a at once"))
        #expect(write(m.b, "accounts/\(Self.uuid)/label", "b at once"))
        let first = Run.start(Run.mtmfs, ["sync", m.a.mountPoint])
        let second = Run.start(Run.mtmfs, ["sync", m.b.mountPoint])
        #expect(Run.wait(first, timeout: 60) == 0 && Run.wait(second, timeout: 60) == 0)
        for store in [m.a, m.b] { #expect(Run.mtmfs("sync", store.mountPoint).status == 0) }
        for store in [m.a, m.b] {
            #expect(cat(store, "accounts/\(Self.uuid)/comment") == "a at once\n")
            #expect(cat(store, "accounts/\(Self.uuid)/label") == "b at once\n")
        }
    }

    @Test func aFailedSyncChangesNothingAndAKilledOneIsCompletedByTheNext() throws {
        let m = try Machines()
        defer { m.close() }
        let vault = m.b.dataDirectory + "/vault"
        #expect(write(m.b, "accounts/\(Self.uuid)/comment", "kept"))
        let head = Run.program("git", ["-C", vault, "rev-parse", "HEAD"]).stdout
        #expect(Run.program("git", ["-C", vault, "remote", "set-url", "origin", m.remoteScratch.sub("gone.git")]).status == 0)
        let failed = Run.mtmfs("sync", m.b.mountPoint)
        #expect(failed.status == 1 && failed.stderr.contains("cannot reach origin"), "\(failed)")
        #expect(failed.stderr.split(separator: "\n").count == 1, "one line: \(failed.stderr)")
        #expect(Run.program("git", ["-C", vault, "rev-parse", "HEAD"]).stdout == head, "nothing committed")
        #expect(cat(m.b, "accounts/\(Self.uuid)/comment") == "kept\n")
        // A remote that holds another vault is refused.
        let stranger = try MountedStore()
        defer { stranger.close() }
        let strangerRemote = m.remoteScratch.sub("stranger.git")
        #expect(Run.program("git", ["init", "-q", "--bare", strangerRemote]).status == 0)
        #expect(Run.program("git", ["-C", stranger.dataDirectory + "/vault", "remote", "add", "origin", strangerRemote]).status == 0)
        #expect(Run.mtmfs("sync", stranger.mountPoint).status == 0)
        #expect(Run.program("git", ["-C", vault, "remote", "set-url", "origin", strangerRemote]).status == 0)
        let foreign = Run.mtmfs("sync", m.b.mountPoint)
        #expect(foreign.status == 1 && foreign.stderr.contains("another vault"), "\(foreign)")
        // Back to the real remote, with what a sync killed with -9 leaves: git's index lock
        // and a merge that did not finish.
        #expect(Run.program("git", ["-C", vault, "remote", "set-url", "origin", m.remote]).status == 0)
        #expect(FileManager.default.createFile(atPath: vault + "/.git/index.lock", contents: Data()))
        let next = Run.mtmfs("sync", m.b.mountPoint)
        #expect(next.status == 0, "\(next)")
        #expect(Run.mtmfs("sync", m.a.mountPoint).status == 0)
        #expect(cat(m.a, "accounts/\(Self.uuid)/comment") == "kept\n")
        // Without git's help: a usage error names the problem.
        #expect(Run.mtmfs("sync", "--data-dir", m.remoteScratch.sub("nowhere")).status == 1)
    }

    @Test func initFromRefusesAWrongPassphraseAndLeavesNoVault() throws {
        let m = try Machines()
        defer { m.close() }
        let scratch = Scratch("sync-from")
        defer { scratch.remove() }
        let wrong = Run.program(Run.mtmfs, ["init", "--from", m.remote, "--data-dir", scratch.sub("c")], input: "not it\n")
        #expect(wrong.status == 1 && wrong.stderr.contains("wrong passphrase"), "\(wrong)")
        #expect(!FileManager.default.fileExists(atPath: scratch.sub("c/vault")) && !FileManager.default.fileExists(atPath: scratch.sub("c/Settings.plist")))
        let missing = Run.program(Run.mtmfs, ["init", "--from", scratch.sub("none.git"), "--data-dir", scratch.sub("d")], input: "x\n")
        #expect(missing.status == 1 && missing.stderr.contains("cannot clone"), "\(missing)")
        let usage = Run.program(Run.mtmfs, ["init", "--from", m.remote, "--kdf", "sensitive", "--data-dir", scratch.sub("e")], input: "x\n")
        #expect(usage.status == 2, "\(usage)")
    }
}
