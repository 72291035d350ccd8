#if canImport(Glibc)
import Glibc
#endif
import CredentialVault
import SecureMemory
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
            try makeFilledStore(data, mount: mount, count: count, workload: "W16")
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
            let unlock = try seconds {
                guard Spawn.run(mtmfs, ["unlock", "--passphrase-file", root + "/w3-pass", mount]) == 0 else {
                    throw BenchError("mtmfs unlock (W16) failed")
                }
            }
            record("W24 unlock, \(count) full accounts, interactive KDF (s)", "mtmfs", unlock)
        }
        if let largest = stores.last { try unlockAfterManyChanges(largest) }
        try setUpSync(stores[0])
        return stores
    }

    /// W24: the unlock of the largest vault again after many changes of one field through
    /// the mount (each a change file; the daemon folds its own files in the background),
    /// beside its unlock before them; the folder's size and files, the daemon's memory.
    func unlockAfterManyChanges(_ store: (Int, String, pid_t)) throws {
        let (count, mount, pid) = store
        let changes = options.changes ?? (options.quick ? 1_000 : 20_000)
        let path = mount + "/accounts/" + String(format: "%08x-0000-4000-8000-%012x", 1, 1) + "/comment"
        let writing = try seconds {
            for change in 0..<changes {
                let fd = open(path, O_WRONLY | O_TRUNC)
                guard fd >= 0 else { throw BenchError("W24: open \(path): errno \(errno)") }
                let text = Array("change \(change)\n".utf8)
                let written = write(fd, text, text.count)
                close(fd)
                guard written == text.count else { throw BenchError("W24: write \(path) failed") }
            }
        }
        record("W24 change a field, \(count) full accounts, during \(changes) changes (ms)", "mtmfs", writing / Double(changes) * 1000)
        usleep(1_500_000)  // the background fold
        let data = root + "/data-w16-\(count)/vault"
        let files = (try? FileManager.default.subpathsOfDirectory(atPath: data))?.filter { $0.hasSuffix(".mtv") } ?? []
        let bytes = files.reduce(0) { $0 + ((try? FileManager.default.attributesOfItem(atPath: data + "/" + $1)[.size] as? Int) ?? 0) }
        record("W24 vault folder after \(changes) changes, \(count) full accounts (MB)", "mtmfs", Double(bytes) / 1e6)
        record("W24 vault change files after \(changes) changes, \(count) full accounts", "mtmfs", Double(files.count))
        record("W24 daemon RSS unlocked after \(changes) changes, \(count) full accounts (MB)", "mtmfs", rss(of: pid))
        guard Spawn.run(mtmfs, ["lock", mount]) == 0 else { throw BenchError("mtmfs lock (W24) failed") }
        let unlock = try seconds {
            guard Spawn.run(mtmfs, ["unlock", "--passphrase-file", root + "/w3-pass", mount]) == 0 else {
                throw BenchError("mtmfs unlock (W24) failed")
            }
        }
        record("W24 unlock, \(count) full accounts after \(changes) changes, interactive KDF (s)", "mtmfs", unlock)
    }

    /// W25: one change carried to a local bare remote: `mtmfs sync` (commit, fetch, merge,
    /// push) of the smallest store beside `pass git push` of one `pass insert` (pass commits
    /// at the insert; only the push is timed).
    func setUpSync(_ store: (Int, String, pid_t)) throws {
        guard Spawn.exists("git") else {
            notes.append("W25: skipped (git is not installed)")
            return
        }
        let remote = root + "/w25-mtmfs.git", vault = root + "/data-w16-\(store.0)/vault"
        guard Spawn.run("git", ["init", "-q", "--bare", remote]) == 0,
              Spawn.run("git", ["-C", vault, "remote", "add", "origin", remote]) == 0,
              Spawn.run(mtmfs, ["sync", store.1]) == 0 else { throw BenchError("W25: mtmfs sync set-up failed") }
        syncMount = store.1
        if passReady, let store = ProcessInfo.processInfo.environment["PASSWORD_STORE_DIR"] {
            let passRemote = root + "/w25-pass.git"
            guard Spawn.run("git", ["init", "-q", "--bare", passRemote]) == 0, Spawn.run("pass", ["git", "init"]) == 0,
                  Spawn.run("git", ["-C", store, "remote", "add", "origin", passRemote]) == 0,
                  Spawn.run("pass", ["git", "push", "-q", "origin", "HEAD"]) == 0 else {
                notes.append("W25: pass git set-up failed")
                return
            }
            passSyncReady = true
        }
    }

    func syncRound() throws {
        guard let mount = syncMount else { return }
        let runs = options.quick ? 3 : 10
        let path = mount + "/accounts/" + String(format: "%08x-0000-4000-8000-%012x", 0, 0) + "/label"
        var total = 0.0
        for run in 0..<runs {
            try "synced \(run)\n".write(toFile: path, atomically: false, encoding: .utf8)
            total += try seconds {
                guard Spawn.run(mtmfs, ["sync", mount]) == 0 else { throw BenchError("W25: mtmfs sync failed") }
            }
        }
        record("W25 carry one change to a local bare remote (ms)", "mtmfs", total / Double(runs) * 1000)
        guard passSyncReady else { return }
        var passTotal = 0.0
        for run in 0..<runs {
            Spawn.run("pass", ["insert", "-m", "-f", "bench/synced"], input: "synced \(run)\n")
            passTotal += seconds { Spawn.run("pass", ["git", "push", "-q", "origin", "HEAD"]) }
        }
        record("W25 carry one change to a local bare remote (ms)", "pass", passTotal / Double(runs) * 1000)
    }

    /// A data directory made with `init` and `count` full accounts (`fillVault`), and an
    /// empty directory to mount it on.
    func makeFilledStore(_ data: String, mount: String, count: Int, workload: String) throws {
        guard Spawn.run(mtmfs, ["init", "--kdf", "interactive", "--data-dir", data], input: Bench.passphrase + "\n") == 0 else {
            throw BenchError("mtmfs init (\(workload)) failed")
        }
        try fillVault(data, count: count, workload: workload)
        mkdir(mount, 0o755)
    }

    /// `count` fully filled accounts (all eight fields; account N has server
    /// hostN.example.com and username userN@example.com), added to an initialized store in one save.
    func fillVault(_ data: String, count: Int, workload: String) throws {
        do {
            let vault = try Vault(path: data + "/vault")
            try vault.unlock(passphrase: try SecureBytes(copying: Array(Bench.passphrase.utf8)))
            // In batches of 1,000: every value is its own `sodium_malloc` region here (a few
            // memory maps each), and 80,000 at once would pass vm.max_map_count.
            for batch in stride(from: 0, to: count, by: 1_000) {
                let accounts = try (batch..<min(count, batch + 1_000)).map { index -> (uuid: [UInt8], name: String, fields: [AccountField: SecureBytes]) in
                    let name = String(format: "%08x-0000-4000-8000-%012x", index, index)
                    let values: [AccountField: String] = [
                        .label: "Account \(index)", .protocol: "https", .server: "host\(index).example.com", .port: "443",
                        .path: "/login", .comment: "bench account number \(index)", .username: "user\(index)@example.com",
                        .password: "pw-\(index)-correct-horse-battery-staple",
                    ]
                    return (AccountName.uuidBytes(name)!, name,
                            try values.mapValues { text in try SecureBytes(copying: Array(text.utf8)) })
                }
                try vault.addAccounts(accounts)
            }
            vault.lock()
        } catch {
            throw BenchError("\(workload) vault: \(error)")
        }
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
        try syncRound()
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
        if let store = stores.first { try scriptRound(store, runs: runs) }
    }

    /// W27: a script's secrets — `mtmfs run -- true` with three references in its
    /// environment (`mtmfs://by-server/H/U/password`), whole process, against `cat` of the
    /// three files through the mount (what `$(cat …)` three times would cost at best).
    func scriptRound(_ store: (accounts: Int, mount: String, daemon: pid_t), runs: Int) throws {
        let indexes = 0..<min(3, store.accounts)
        let paths = indexes.map { store.mount + "/accounts/by-server/host\($0).example.com/user\($0)@example.com/password" }
        let references = indexes.map { "SECRET_\($0)=mtmfs://by-server/host\($0).example.com/user\($0)@example.com/password" }
        let environment = Spawn.environment(with: references)
        let check = Spawn.output(mtmfs, ["run", "--mount", store.mount, "--no-masking", "--", "/bin/sh", "-c", "echo \"$SECRET_2\""],
                                 environment: environment)
        guard check.output == "pw-2-correct-horse-battery-staple\n" else {
            throw BenchError("W27: mtmfs run does not give the command its secrets: \(check)")
        }
        func wholeProcess(_ program: String, _ arguments: [String], _ environment: [String]? = nil) -> Double {
            seconds {
                for _ in 0..<runs {
                    guard let pid = try? Spawn.start(program, arguments, environment: environment) else { continue }
                    Spawn.wait(pid)
                }
            } / Double(runs) * 1000
        }
        // The same accounts named by UUID (the by-server link's target): no view name, so no
        // listing of the view's directory to find another account sharing it.
        let uuids = indexes.compactMap { index in
            (try? FileManager.default.destinationOfSymbolicLink(atPath: store.mount + "/accounts/by-server/host\(index).example.com/user\(index)@example.com"))
                .flatMap { $0.split(separator: "/").last.map(String.init) }
        }
        guard uuids.count == indexes.count else { throw BenchError("W27: the by-server links do not name their accounts") }
        let byUUID = Spawn.environment(with: uuids.enumerated().map { "SECRET_\($0.offset)=mtmfs://\($0.element)/password" })
        let cat = wholeProcess("/bin/cat", paths)
        let run = wholeProcess(mtmfs, ["run", "--mount", store.mount, "--", "true"], environment)
        let runByUUID = wholeProcess(mtmfs, ["run", "--mount", store.mount, "--", "true"], byUUID)
        let bare = wholeProcess(mtmfs, ["run", "--mount", store.mount, "--", "true"], Spawn.environment(with: []))
        record("W27 cat of 3 secrets' files, whole process (ms)", "mtmfs", cat)
        record("W27 mtmfs run -- true, 3 references, whole process (ms)", "mtmfs", run)
        record("W27 mtmfs run -- true, the 3 references by UUID (ms)", "mtmfs", runByUUID)
        record("W27 mtmfs run -- true, no reference (ms)", "mtmfs", bare)
        if cat > 0 {
            record("W27 mtmfs run ÷ cat of the 3 files, same round (×)", "mtmfs", run / cat)
            record("W27 mtmfs run ÷ cat, references by UUID (×)", "mtmfs", runByUUID / cat)
        }
    }

    func rss(of pid: pid_t) -> Double {
        guard let text = try? String(contentsOfFile: "/proc/\(pid)/status", encoding: .utf8),
              let line = text.split(separator: "\n").first(where: { $0.hasPrefix("VmRSS:") }) else { return 0 }
        return Double(line.split(separator: " ").dropFirst().first ?? "0").map { $0 / 1024 } ?? 0
    }
}
