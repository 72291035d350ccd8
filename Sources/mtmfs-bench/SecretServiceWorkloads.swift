#if canImport(Glibc)
import Glibc
#endif
import Foundation
import Posix

/// W26: the Secret Service (SPEC §2c) beside gnome-keyring, each on a session bus of its
/// own: `secret-tool lookup` as a whole process (the way a shell script or git's libsecret
/// helper asks), SearchItems round trips among 10 and among many accounts (a Python
/// client on one connection, timed inside it: what a browser or an IDE pays per lookup),
/// and the daemon's idle wakeups a minute with the bus served.
extension Bench {
    /// A Secret Service under measurement: its bus, the daemon serving it, and an account it
    /// holds (server and user).
    struct SecretService {
        let name: String
        let address: String
        let daemon: pid_t
        let accounts: Int
        let server: String
        let user: String
    }

    var secretServiceSizes: [Int] { options.quick ? [10, 1_000] : [10, 10_000] }

    /// A session bus of the bench's own (ended at tear-down): its address.
    func startBus() throws -> String {
        let started = Spawn.standardOutput("dbus-daemon", ["--session", "--fork", "--nopidfile", "--print-address=1", "--print-pid=1"])
        let lines = started.split(separator: "\n").map(String.init)
        guard lines.count >= 2, let pid = pid_t(lines[1]) else { throw BenchError("W26: dbus-daemon did not start") }
        Benchmark.helpers.append(pid)
        return lines[0]
    }

    func onBus(_ address: String, _ program: String, _ arguments: [String]) -> [String] {
        ["DBUS_SESSION_BUS_ADDRESS=\(address)", "HOME=\(root)/w26-home", program] + arguments
    }

    func setUpSecretServices() throws -> [SecretService] {
        guard Spawn.exists("dbus-daemon"), Spawn.exists("secret-tool"), access("/usr/bin/python3", X_OK) == 0 else {
            notes.append("W26: skipped (dbus-daemon, secret-tool or python3 missing: mount-helpers/install-deps --test)")
            return []
        }
        mkdir(root + "/w26-home", 0o700)
        var services: [SecretService] = []
        for count in secretServiceSizes {
            let data = root + "/data-w26-\(count)", mount = root + "/mtmfs-w26-\(count)"
            try makeFilledStore(data, mount: mount, count: count, workload: "W26")
            let address = try startBus()
            guard Spawn.run("/usr/bin/env", onBus(address, mtmfs, ["mount", "--secret-service", "--auto-lock", "0", "--unlock",
                                                                 "--passphrase-file", root + "/w3-pass", "--data-dir", data, mount])) == 0 else {
                throw BenchError("mtmfs mount --secret-service (W26) failed")
            }
            Benchmark.mounts.append(mount)
            let status = (try? String(contentsOfFile: mount + "/.mtmfs/status", encoding: .utf8)) ?? ""
            let pid = status.split(separator: "\n").first { $0.hasPrefix("pid=") }.flatMap { pid_t($0.dropFirst(4)) } ?? 0
            let last = count - 1
            services.append(SecretService(name: "mtmfs", address: address, daemon: pid, accounts: count,
                                          server: "host\(last).example.com", user: "user\(last)@example.com"))
        }
        if Spawn.exists("gnome-keyring-daemon") {
            let address = try startBus()
            let run = root + "/w26-run"
            mkdir(run, 0o700)
            try "bench".write(toFile: root + "/w26-keyring-password", atomically: true, encoding: .utf8)
            let pid = try Spawn.start("/usr/bin/env", ["DBUS_SESSION_BUS_ADDRESS=\(address)", "HOME=\(root)/w26-home",
                                                       "XDG_RUNTIME_DIR=\(run)", "gnome-keyring-daemon", "--unlock",
                                                       "--components=secrets", "--foreground"],
                                      stdin: .file(root + "/w26-keyring-password"), stdout: .null, stderr: .null)
            Benchmark.helpers.append(pid)
            var up = false
            for _ in 0..<100 where !up {
                up = Spawn.run("/usr/bin/env", onBus(address, "busctl", ["--user", "status", "org.freedesktop.secrets"])) == 0
                if !up { usleep(100_000) }
            }
            let count = secretServiceSizes[0]
            let fill = """
                import secretstorage
                c = secretstorage.dbus_init()
                col = secretstorage.get_default_collection(c)
                for i in range(\(count)):
                    col.create_item('Account %d' % i, {'server': 'host%d.example.com' % i, 'user': 'user%d@example.com' % i},
                                    b'pw-%d-correct-horse-battery-staple' % i)
                """
            if up, Spawn.run("/usr/bin/env", onBus(address, "/usr/bin/python3", ["-c", fill])) == 0 {
                services.append(SecretService(name: "gnome-keyring", address: address, daemon: pid, accounts: count,
                                              server: "host\(count - 1).example.com", user: "user\(count - 1)@example.com"))
            } else {
                notes.append("W26: gnome-keyring skipped (it did not start on its bus, or its items could not be made)")
            }
        } else {
            notes.append("W26: gnome-keyring skipped (not installed: mount-helpers/install-deps --test)")
        }
        for service in services {
            record("W26 idle wakeups a minute, Secret Service served (\(service.accounts) accounts)", service.name, idleWakeups(service.daemon))
        }
        return services
    }

    /// One round: a whole `secret-tool lookup`, and SearchItems round trips.
    func secretServiceRound(_ services: [SecretService]) throws {
        let runs = options.quick ? 5 : 40
        let calls = options.quick ? 50 : 500
        var searches: [Int: Double] = [:]  // mtmfs's, by size
        for service in services {
            let lookup = onBus(service.address, "secret-tool", ["lookup", "server", service.server, "user", service.user])
            guard Spawn.standardOutput("/usr/bin/env", lookup) == "pw-\(service.accounts - 1)-correct-horse-battery-staple" else {
                throw BenchError("W26: secret-tool lookup on \(service.name) does not print the password")
            }
            let total = seconds { for _ in 0..<runs { Spawn.run("/usr/bin/env", lookup) } }
            record("W26 secret-tool lookup, whole process, \(service.accounts) accounts (ms)", service.name, total / Double(runs) * 1000)
            let client = """
                import sys, time, secretstorage
                c = secretstorage.dbus_init()
                attributes = {'server': sys.argv[1], 'user': sys.argv[2]}
                assert len(list(secretstorage.search_items(c, attributes))) == 1
                started = time.monotonic()
                for _ in range(\(calls)): found = list(secretstorage.search_items(c, attributes))
                print((time.monotonic() - started) / \(calls) * 1e6)
                """
            let output = Spawn.standardOutput("/usr/bin/env", onBus(service.address, "/usr/bin/python3", ["-c", client, service.server, service.user]))
            guard let microseconds = Double(output.trimmingCharacters(in: .whitespacesAndNewlines)) else {
                throw BenchError("W26: the SearchItems client on \(service.name) failed")
            }
            record("W26 SearchItems round trip, \(service.accounts) accounts (µs)", service.name, microseconds)
            if service.name == "mtmfs" {
                searches[service.accounts] = microseconds
                // A lock with the bus served keeps every item's label and attributes for it
                // (read before the lock) and signals every item; the unlock signals them again.
                let mount = root + "/mtmfs-w26-\(service.accounts)"
                let lock = seconds { Spawn.run("/usr/bin/env", onBus(service.address, mtmfs, ["lock", mount])) }
                let unlock = seconds {
                    Spawn.run("/usr/bin/env", onBus(service.address, mtmfs, ["unlock", "--passphrase-file", root + "/w3-pass", mount]))
                }
                record("W26 mtmfs lock, bus served, \(service.accounts) accounts (ms)", service.name, lock * 1000)
                record("W26 mtmfs unlock, bus served, \(service.accounts) accounts (ms)", service.name, unlock * 1000)
            }
        }
        if let small = searches[secretServiceSizes[0]], let large = searches[secretServiceSizes[1]], small > 0 {
            record("W26 SearchItems, \(secretServiceSizes[1]) ÷ \(secretServiceSizes[0]) accounts, same round (×)", "mtmfs", large / small)
        }
    }
}
