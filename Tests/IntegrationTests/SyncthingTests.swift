#if canImport(Glibc)
import Glibc
#endif
import Foundation
import Testing
import TestSupport

/// Two real Syncthing instances on loopback (Debian's `syncthing`; discovery, relays and
/// NAT off, static `tcp://127.0.0.1:PORT` addresses, homes of their own) keep two mounted
/// data directories' vault folders in step while they are mounted (SPEC §2b).
@Suite(.serialized) struct SyncthingTests {
    static let uuid = "6ba7b810-9dad-41d1-80b4-00c04fd430c8"

    /// One Syncthing instance: its home, device id, ports, and the running process.
    final class Instance {
        let home: String
        let id: String
        let port: Int
        let guiPort: Int
        var pid: pid_t = 0

        init(home: String, port: Int, guiPort: Int) throws {
            (self.home, self.port, self.guiPort) = (home, port, guiPort)
            let generated = Run.program("syncthing", ["generate", "--home=\(home)", "--no-default-folder", "--skip-port-probing"])
            try #require(generated.status == 0, "\(generated)")
            let shown = Run.program("syncthing", ["serve", "--home=\(home)", "--device-id"])
            id = shown.stdout.trimmingCharacters(in: .whitespacesAndNewlines)
            try #require(shown.status == 0 && id.count > 50, "\(shown)")
        }

        /// The configuration: one folder shared with `peer`, nothing outside loopback.
        func configure(folder: String, peer: Instance) throws {
            func device(_ instance: Instance, _ name: String) -> String {
                "<device id=\"\(instance.id)\" name=\"\(name)\" compression=\"metadata\" introducer=\"false\" autoAcceptFolders=\"false\">"
                    + "<address>tcp://127.0.0.1:\(instance.port)</address></device>"
            }
            let config = """
                <configuration version="36">
                    <folder id="mtmfs-vault" label="vault" path="\(folder)" type="sendreceive" rescanIntervalS="3600"
                            fsWatcherEnabled="true" fsWatcherDelayS="1" ignorePerms="false" autoNormalize="true">
                        <device id="\(id)"></device>
                        <device id="\(peer.id)"></device>
                    </folder>
                    \(device(self, "self"))
                    \(device(peer, "peer"))
                    <gui enabled="true" tls="false"><address>127.0.0.1:\(guiPort)</address><apikey>mtmfs-test-key</apikey></gui>
                    <options>
                        <listenAddress>tcp://127.0.0.1:\(port)</listenAddress>
                        <globalAnnounceEnabled>false</globalAnnounceEnabled>
                        <localAnnounceEnabled>false</localAnnounceEnabled>
                        <relaysEnabled>false</relaysEnabled>
                        <natEnabled>false</natEnabled>
                        <urAccepted>-1</urAccepted>
                        <autoUpgradeIntervalH>0</autoUpgradeIntervalH>
                        <crashReportingEnabled>false</crashReportingEnabled>
                        <startBrowser>false</startBrowser>
                    </options>
                </configuration>
                """
            try config.write(toFile: home + "/config.xml", atomically: true, encoding: .utf8)
            // Syncthing's folder marker, and git's repository kept to each machine.
            try FileManager.default.createDirectory(atPath: folder + "/.stfolder", withIntermediateDirectories: true)
            try ".git\n".write(toFile: folder + "/.stignore", atomically: true, encoding: .utf8)
        }

        func start() {
            pid = Run.start("syncthing", ["serve", "--home=\(home)", "--no-browser", "--no-restart", "--no-upgrade",
                                          "--logfile=\(home)/log"])
        }

        func stop() {
            guard pid > 0 else { return }
            kill(-pid, SIGTERM)
            if Run.wait(pid, timeout: 20) != 0 { kill(-pid, SIGKILL) }
            pid = 0
        }
    }

    func cat(_ store: MountedStore, _ relative: String) -> String { Run.program("cat", [store.path(relative)]).stdout }

    @Test func twoSyncthingInstancesKeepTwoMountsInStep() throws {
        let a = try MountedStore()
        defer { a.close() }
        #expect(Run.mtmfs("unlock", a.mountPoint, input: Run.passphrase + "\n").status == 0)
        let account = "accounts/\(Self.uuid)"
        #expect(mkdir(a.path(account), 0o700) == 0)
        #expect(Run.shell("echo ann > \(a.path(account + "/username"))").status == 0)
        let b = try MountedStore(prepare: { data in
            try FileManager.default.removeItem(atPath: data + "/vault")
            try FileManager.default.copyItem(atPath: a.dataDirectory + "/vault", toPath: data + "/vault")
        })
        defer { b.close() }
        #expect(Run.mtmfs("unlock", b.mountPoint, input: Run.passphrase + "\n").status == 0)
        #expect(cat(b, account + "/username") == "ann\n")

        let homes = Scratch("syncthing")
        defer { homes.remove() }
        let base = 20_000 + Int(getpid() % 20_000)
        let one = try Instance(home: homes.sub("a"), port: base, guiPort: base + 1)
        let two = try Instance(home: homes.sub("b"), port: base + 2, guiPort: base + 3)
        try one.configure(folder: a.dataDirectory + "/vault", peer: two)
        try two.configure(folder: b.dataDirectory + "/vault", peer: one)
        one.start()
        two.start()
        defer {
            one.stop()
            two.stop()
        }
        // A change on one reaches the other's mount while it is mounted.
        #expect(Run.shell("echo from-a > \(a.path(account + "/password"))").status == 0)
        #expect(Poll.until(seconds: 90, every: 0.2) { cat(b, account + "/password") == "from-a\n" },
                "not synced: \((try? String(contentsOfFile: homes.sub("b/log"), encoding: .utf8))?.suffix(2000) ?? "")")
        #expect(Run.shell("echo from-b > \(b.path(account + "/comment"))").status == 0)
        let back = Poll.until(seconds: 60, every: 0.2) { cat(a, account + "/comment") == "from-b\n" }
        if !back {
            let listing = Run.program("ls", ["-laR", a.dataDirectory + "/vault", b.dataDirectory + "/vault"]).stdout
            let logA = (try? String(contentsOfFile: homes.sub("a/log"), encoding: .utf8))?.suffix(3000) ?? ""
            let logB = (try? String(contentsOfFile: homes.sub("b/log"), encoding: .utf8))?.suffix(3000) ?? ""
            Issue.record("not synced back:\n\(listing)\nA: \(logA)\nB: \(logB)")
        }
        // One field changed on both while the second instance is down: once it is back,
        // both show the later value and the other in conflicts/.
        two.stop()
        #expect(Run.shell("echo label-a > \(a.path(account + "/label"))").status == 0)
        usleep(5_000)
        #expect(Run.shell("echo label-b > \(b.path(account + "/label"))").status == 0)
        two.start()
        for store in [a, b] {
            #expect(Poll.until(seconds: 90, every: 0.2) {
                cat(store, account + "/label") == "label-b\n" && cat(store, account + "/conflicts/label").hasPrefix("label-a\t")
            }, "\(store.mountPoint): \(cat(store, account + "/label")) / \(cat(store, account + "/conflicts/label"))")
        }
        // Nothing Syncthing wrote was loaded as a change, and nothing is left skipped.
        for store in [a, b] {
            #expect(Poll.until(seconds: 10) { (try? store.status()["vault_skipped"]) == "0" }, "\((try? store.status()) ?? [:])")
        }
    }
}
