#if canImport(Glibc)
import Glibc
#endif
import Foundation
import Posix

/// W18 and W19: a daemon that runs for months (SPEC §7).
///
/// W18: the context switches of every thread of each daemon while nothing happens, per
/// minute: bindfs and gocryptfs beside mtmfs locked, unlocked with the auto-lock pending, and
/// with `--cache-limit` over 100,000 cache files, one of which expires next week.
/// W19: `stat` and `cat` of `.mtmfs/status` with 10, 100,000 and 1,000,000 files in cache/
/// (stores filled through SQL, then mounted): what bookkeeping costs as the store grows.
extension Bench {
    var idleSeconds: Double { options.quick ? 5 : 30 }
    var statusStoreSizes: [Int] { options.quick ? [10, 10_000] : [10, 100_000, 1_000_000] }

    /// Every thread's context switches of `pid` so far.
    func switches(_ pid: pid_t) -> Int {
        let tasks = (try? FileManager.default.contentsOfDirectory(atPath: "/proc/\(pid)/task")) ?? []
        return tasks.reduce(0) { sum, task in
            let status = (try? String(contentsOfFile: "/proc/\(pid)/task/\(task)/status", encoding: .utf8)) ?? ""
            return sum + status.split(separator: "\n").filter { $0.contains("ctxt_switches") }
                .compactMap { Int($0.split(separator: "\t").last?.trimmingCharacters(in: .whitespaces) ?? "") }.reduce(0, +)
        }
    }

    /// The pid of the FUSE daemon serving `mountPoint` (any program: bindfs, gocryptfs).
    func daemon(of mountPoint: String, named program: String) -> pid_t? {
        let pids = Spawn.standardOutput("pgrep", ["-f", program]).split(separator: "\n").compactMap { pid_t($0) }
        return pids.first { pid in
            let line = (try? String(contentsOfFile: "/proc/\(pid)/cmdline", encoding: .utf8)) ?? ""
            return line.contains(mountPoint)
        }
    }

    /// Wakeups a minute of `pid`, over `idleSeconds` after a second of settling.
    func idleWakeups(_ pid: pid_t) -> Double {
        sleep(1)
        let before = switches(pid)
        usleep(UInt32(idleSeconds * 1_000_000))
        return Double(switches(pid) - before) * 60 / idleSeconds
    }

    /// A data directory whose cache holds `files` one-line files (rows made by SQL, as many
    /// files made through a mount would leave them), mounted.
    func filledStore(_ name: String, files: Int, options mountOptions: [String] = []) throws -> (mount: String, pid: pid_t) {
        let data = root + "/data-" + name, mount = root + "/mtmfs-" + name
        guard Spawn.run(mtmfs, ["init", "--kdf", "interactive", "--data-dir", data], input: Bench.passphrase + "\n") == 0 else {
            throw BenchError("mtmfs init (\(name)) failed")
        }
        // The cache is schema'd at its first open: mount once, then fill, then mount again.
        mkdir(mount, 0o755)
        guard Spawn.run(mtmfs, ["mount", "--data-dir", data, mount]) == 0, Spawn.run(mtmfs, ["unmount", mount]) == 0 else {
            throw BenchError("mtmfs mount (\(name)) failed")
        }
        let sql = """
            BEGIN;
            WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < \(files))
            INSERT INTO inodes(mode, uid, gid, size, links, atime, mtime, ctime, used, stored)
                SELECT \(S_IFREG | 0o644), \(getuid()), \(getgid()), 2, 1, 0, 0, 0, i, 2 FROM n;
            INSERT INTO entries(parent, name, ino) SELECT 1, 'f' || ino, ino FROM inodes WHERE ino > 1;
            INSERT INTO contents(ino, data) SELECT ino, X'310A' FROM inodes WHERE ino > 1;
            UPDATE inodes SET expires = \(Int(Date().timeIntervalSince1970) + 7 * 86_400) * 1000000000 WHERE ino = 2;
            COMMIT;
            """
        guard Spawn.run("sqlite3", [data + "/cache.sqlite"], input: sql) == 0 else {
            throw BenchError("filling \(name) with \(files) files (sqlite3 missing? mount-helpers/install-deps --bench)")
        }
        guard Spawn.run(mtmfs, ["mount", "--auto-lock", "0"] + mountOptions + ["--data-dir", data, mount]) == 0 else {
            throw BenchError("mtmfs mount (\(name)) failed")
        }
        Benchmark.mounts.append(mount)
        let status = (try? String(contentsOfFile: mount + "/.mtmfs/status", encoding: .utf8)) ?? ""
        let pid = status.split(separator: "\n").first { $0.hasPrefix("pid=") }.flatMap { pid_t($0.dropFirst(4)) } ?? 0
        return (mount, pid)
    }

    /// W18, once (not per round: each takes `idleSeconds`). The peers are measured once and
    /// shown beside each of mtmfs's three states.
    func idleRound() throws {
        var peers: [(String, Double)] = []
        if let bindfs = systems["bindfs"], let pid = daemon(of: bindfs.directory, named: "bindfs") {
            peers.append(("bindfs", idleWakeups(pid)))
        }
        if let gocryptfs = systems["gocryptfs"], let pid = daemon(of: gocryptfs.directory, named: "gocryptfs") {
            peers.append(("gocryptfs", idleWakeups(pid)))
        }
        func row(_ label: String, _ pid: pid_t) {
            let workload = "W18 idle wakeups a minute, \(label)"
            record(workload, "mtmfs", idleWakeups(pid))
            for (peer, value) in peers { record(workload, peer, value) }
        }
        let locked = try filledStore("w18-locked", files: 10)
        row("locked", locked.pid)
        let unlocked = try filledStore("w18-unlocked", files: 10, options: ["--auto-lock", "900"])
        guard Spawn.run(mtmfs, ["unlock", unlocked.mount], input: Bench.passphrase + "\n") == 0 else {
            throw BenchError("unlock (W18) failed")
        }
        row("unlocked, auto-lock pending", unlocked.pid)
        let files = options.quick ? 10_000 : 100_000
        let limited = try filledStore("w18-limit", files: files, options: ["--cache-limit", "1G"])
        row("--cache-limit, \(files) files, one expiring", limited.pid)
    }

    /// W19, once per round for each store size.
    func setUpStatusStores() throws -> [(files: Int, mount: String)] {
        try statusStoreSizes.map { files in (files, try filledStore("w19-\(files)", files: files).mount) }
    }

    func statusRound(_ stores: [(files: Int, mount: String)]) throws {
        let runs = options.quick ? 200 : 2_000
        for store in stores {
            let path = store.mount + "/.mtmfs/status"
            var st = stat()
            let statTime = seconds { for _ in 0..<runs { stat(path, &st) } }
            record("W19 stat .mtmfs/status, \(store.files) cache files (µs)", "mtmfs", statTime / Double(runs) * 1e6)
            let text = try String(contentsOfFile: path, encoding: .utf8)
            guard text.contains("cache_files=\(store.files)\n") else {
                throw BenchError("W19: status of \(store.files) files says \(text)")
            }
            let readTime = try seconds { for _ in 0..<(runs / 10) { _ = try String(contentsOfFile: path, encoding: .utf8) } }
            record("W19 read .mtmfs/status, \(store.files) cache files (µs)", "mtmfs", readTime / Double(runs / 10) * 1e6)
        }
    }
}
