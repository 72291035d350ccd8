#if canImport(Glibc)
import Glibc
#endif
import CredentialVault
import Foundation
import Posix

/// W16: what one change to a field costs as the vault grows. Each size gets its own store
/// of fully filled accounts (all eight fields set), built in one save, mounted unlocked; a
/// change is `echo v > accounts/U/password` (open with O_TRUNC, write, close: the vault is
/// re-sealed and rewritten atomically with two fsyncs). Beside it: `pass insert -f` of one
/// entry (its cost does not depend on the store's size: one file per entry), and the
/// daemon's memory once unlocked.
extension Bench {
    var vaultSizes: [Int] { options.quick ? [10, 100, 300] : [10, 1_000, 10_000] }

    func setUpVaultScale() throws -> [(accounts: Int, mount: String, daemon: pid_t)] {
        var stores: [(Int, String, pid_t)] = []
        for count in vaultSizes {
            let data = root + "/data-w16-\(count)", mount = root + "/mtmfs-w16-\(count)"
            guard Spawn.run(mtmfs, ["init", "--kdf", "interactive", "--data-dir", data], input: Bench.passphrase + "\n") == 0 else {
                throw BenchError("mtmfs init (W16) failed")
            }
            do {
                let vault = try Vault(path: data + "/vault")
                try vault.unlock(passphrase: Array(Bench.passphrase.utf8).withUnsafeBytes { SecureBytes(copying: $0) })
                // In batches of 1,000: every value is its own `sodium_malloc` region here (a few
                // memory maps each), and 80,000 at once would pass vm.max_map_count.
                for batch in stride(from: 0, to: count, by: 1_000) {
                let accounts = (batch..<min(count, batch + 1_000)).map { index -> (uuid: [UInt8], name: String, fields: [AccountField: SecureBytes]) in
                    let name = String(format: "%08x-0000-4000-8000-%012x", index, index)
                    let values: [AccountField: String] = [
                        .label: "Account \(index)", .protocol: "https", .server: "host\(index).example.com", .port: "443",
                        .path: "/login", .comment: "bench account number \(index)", .username: "user\(index)@example.com",
                        .password: "pw-\(index)-correct-horse-battery-staple",
                    ]
                    return (AccountName.uuidBytes(name)!, name,
                            values.mapValues { text in Array(text.utf8).withUnsafeBytes { SecureBytes(copying: $0) } })
                }
                try vault.addAccounts(accounts)
                }
                vault.lock()
            } catch {
                throw BenchError("W16 vault: \(error)")
            }
            mkdir(mount, 0o755)
            guard Spawn.run(mtmfs, ["mount", "--auto-lock", "0", "--unlock", "--passphrase-file", root + "/w3-pass",
                                    "--data-dir", data, mount]) == 0 else { throw BenchError("mtmfs mount (W16) failed") }
            Benchmark.mounts.append(mount)
            let status = (try? String(contentsOfFile: mount + "/.mtmfs/status", encoding: .utf8)) ?? ""
            let pid = status.split(separator: "\n").first { $0.hasPrefix("pid=") }.flatMap { pid_t($0.dropFirst(4)) } ?? 0
            stores.append((count, mount, pid))
            let files = (try? FileManager.default.subpathsOfDirectory(atPath: data + "/vault")) ?? []
            let vaultBytes = files.reduce(0) { total, file in
                total + ((try? FileManager.default.attributesOfItem(atPath: data + "/vault/" + file))
                    .flatMap { $0[.type] as? FileAttributeType == .typeRegular ? $0[.size] as? Int : 0 } ?? 0)
            }
            record("W16 vault folder, \(count) full accounts (MB)", "mtmfs", Double(vaultBytes) / 1e6)
            record("W16 daemon RSS unlocked, \(count) full accounts (MB)", "mtmfs", rss(of: pid))
            let maps = (try? String(contentsOfFile: "/proc/\(pid)/maps", encoding: .utf8))?.split(separator: "\n").count ?? 0
            record("W16 daemon memory maps unlocked, \(count) full accounts", "mtmfs", Double(maps))
            guard Spawn.run(mtmfs, ["lock", mount]) == 0 else { throw BenchError("mtmfs lock (W16) failed") }
            record("W16 daemon RSS locked again, \(count) full accounts (MB)", "mtmfs", rss(of: pid))
            guard Spawn.run(mtmfs, ["unlock", "--passphrase-file", root + "/w3-pass", mount]) == 0 else {
                throw BenchError("mtmfs unlock (W16) failed")
            }
        }
        return stores
    }

    /// One round: ms per field change at each vault size (and `pass insert -f`).
    func vaultRound(_ stores: [(accounts: Int, mount: String, daemon: pid_t)]) throws {
        let changes = options.quick ? 5 : 20
        for store in stores {
            let path = store.mount + "/accounts/" + String(format: "%08x-0000-4000-8000-%012x", 0, 0) + "/password"
            let total = try seconds {
                for change in 0..<changes {
                    try "pw-\(change)-\(store.accounts)\n".write(toFile: path, atomically: false, encoding: .utf8)
                }
            }
            record("W16 change a field, \(store.accounts) full accounts (ms)", "mtmfs", total / Double(changes) * 1000)
        }
        if passReady {
            let total = seconds {
                for change in 0..<changes { Spawn.run("pass", ["insert", "-m", "-f", "bench/password"], input: "pw-\(change)\n") }
            }
            record("W16 change a field, \(vaultSizes.last!) full accounts (ms)", "pass", total / Double(changes) * 1000)
        }
        try findRound(stores)
    }

    /// W17: finding an account by what it is for, at each vault size: `cat` of a password
    /// through `accounts/by-server/H/U/` and `mtmfs find --server H --username U --print
    /// password` (whole processes), for the last account made (a scan would meet it last);
    /// `pass show` of one entry beside them.
    func findRound(_ stores: [(accounts: Int, mount: String, daemon: pid_t)]) throws {
        let runs = options.quick ? 5 : 20
        for store in stores {
            let last = store.accounts - 1
            let server = "host\(last).example.com", username = "user\(last)@example.com"
            let path = store.mount + "/accounts/by-server/\(server)/\(username)/password"
            guard Spawn.standardOutput("/bin/cat", [path]) == "pw-\(last)-correct-horse-battery-staple\n" else {
                throw BenchError("W17: \(path) does not read the account's password")
            }
            let cat = seconds { for _ in 0..<runs { Spawn.run("/bin/cat", [path]) } }
            record("W17 cat by-server/H/U/password, \(store.accounts) full accounts (ms)", "mtmfs", cat / Double(runs) * 1000)
            let arguments = ["find", store.mount, "--server", server, "--username", username, "--print", "password"]
            guard Spawn.standardOutput(mtmfs, arguments) == "pw-\(last)-correct-horse-battery-staple\n" else {
                throw BenchError("W17: mtmfs find does not print the account's password")
            }
            let find = seconds { for _ in 0..<runs { Spawn.run(mtmfs, arguments) } }
            record("W17 mtmfs find --print password, \(store.accounts) full accounts (ms)", "mtmfs", find / Double(runs) * 1000)
        }
        if passReady {
            let show = seconds { for _ in 0..<runs { Spawn.run("pass", ["show", "bench/password"]) } }
            record("W17 pass show (ms)", "pass", show / Double(runs) * 1000)
        }
    }

    func rss(of pid: pid_t) -> Double {
        guard let text = try? String(contentsOfFile: "/proc/\(pid)/status", encoding: .utf8),
              let line = text.split(separator: "\n").first(where: { $0.hasPrefix("VmRSS:") }) else { return 0 }
        return Double(line.split(separator: " ").dropFirst().first ?? "0").map { $0 / 1024 } ?? 0
    }
}
