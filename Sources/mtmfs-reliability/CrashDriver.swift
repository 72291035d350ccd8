#if canImport(Glibc)
import Glibc
#endif
import Foundation
import Posix
import TestSupport

/// Kills the daemon with SIGKILL at random moments of a mixed workload over all three stores,
/// then checks each store on disk and through a new mount.
///
/// After every kill: `Settings.plist` parses with plistlib, `PRAGMA integrity_check` is ok,
/// the vault unlocks with the passphrase, every acknowledged value is there (or a later one
/// that was in flight), every fsynced cache file has its exact bytes, the remount left exactly
/// the data files that rows name in `cache.data/`, and no editor's temp,
/// swap or backup file became a key, a field or a file.
final class CrashDriver {
    let rounds: Int
    var random: SplitMix
    let scratch = Scratch("reliability-crash")
    let tally = Tally("crash (SIGKILL of the daemon during the mixed workload)")
    var store: Store!

    /// Per value file: the values it may hold now (the last acknowledged one and every one
    /// attempted after it).
    var allowed: [String: Set<Int>] = [:]
    var accountDirectories: Set<String> = []
    var attemptedDirectories: Set<String> = []
    var files: [String: (n: Int, size: Int, hole: Range<Int>?)] = [:]
    /// FIFOs whose creation was acknowledged (their directory fsynced).
    var nodes: Set<String> = []
    var attemptedFiles: Set<String> = []
    var settingsKeys: [String] = []
    var fieldNames: [String] = []

    init(rounds: Int, seed: UInt64) {
        self.rounds = rounds
        random = SplitMix(seed: seed)
    }

    func run() -> Tally {
        defer { store?.unmount(); scratch.remove() }
        do {
            try setUp()
        } catch {
            tally.record("set-up", ["\(error)"])
            return tally
        }
        for round in 1...rounds {
            var problems: [String] = []
            let logs = startWorkersAndCrash(round: round)
            absorb(logs)
            if let problem = plistlibProblem(store.dataDirectory + "/Settings.plist") { problems.append(problem) }
            if let problem = integrityProblem(store.dataDirectory + "/cache.sqlite") { problems.append(problem) }
            do {
                try store.mount()
                if let problem = dataFolderProblem(store.dataDirectory) { problems.append(problem) }
                problems += verify()
            } catch {
                problems.append("remount: \(error)")
            }
            tally.record("round \(round)", problems)
            if !problems.isEmpty { complain("crash round \(round): \(problems.joined(separator: "; "))") }
            if !MountTable.isMounted(store.mountPoint) { break }
        }
        return tally
    }

    func setUp() throws {
        store = try Store(in: scratch)
        try store.mount()
        let account = "accounts/\(Workload.account)"
        guard mkdir(store.path(account), 0o700) == 0 else { throw SuiteError("mkdir \(account): \(errnoName(errno))") }
        for field in Workload.accountFields {
            let path = "\(account)/\(field)"
            guard writeFile(store.path(path), Array("v0\n".utf8)) == 0 else { throw SuiteError("write \(path)") }
            allowed[path] = [0]
        }
        for key in Workload.settingsKeys {
            let path = "settings/\(key)"
            guard writeFile(store.path(path), Array("v0\n".utf8)) == 0 else { throw SuiteError("write \(path)") }
            allowed[path] = [0]
        }
        guard mkdir(store.path("cache/crash"), 0o755) == 0 else { throw SuiteError("mkdir cache/crash") }
        settingsKeys = listing(store.path("settings")) ?? []
        fieldNames = listing(store.path(account)) ?? []
        accountDirectories = Set(listing(store.path("accounts")) ?? [])
    }

    /// Three workers (one per store) run for a random time, then the daemon is killed.
    func startWorkersAndCrash(round: Int) -> [String] {
        var workers: [pid_t] = []
        var logs: [String] = []
        for store in ["settings", "accounts", "cache"] {
            let log = scratch.sub("log-\(round)-\(store)")
            let workScratch = scratch.sub("work-\(store)")
            mkdir(workScratch, 0o755)
            logs.append(log)
            workers.append(Run.start(Run.suite, ["worker", store, self.store.mountPoint, log,
                                                 String(random.next() % 1_000_000_000), workScratch],
                                     stderr: scratch.sub("worker-errors")))
        }
        usleep(useconds_t(150_000 + random.next() % 1_350_000))
        store.crash()
        for worker in workers { Run.wait(worker, timeout: 30) }
        return logs
    }

    /// Folds the workers' logs into what each file may hold.
    func absorb(_ logs: [String]) {
        for log in logs {
            for line in (readText(log) ?? "").split(separator: "\n") {
                let parts = line.split(separator: " ").map(String.init)
                guard parts.count >= 3 else { continue }
                switch (parts[0], parts[1]) {
                case ("A", "value"): allowed[parts[2], default: []].insert(Int(parts[3])!)
                case ("K", "value"): allowed[parts[2]] = [Int(parts[3])!]
                case ("A", "mkdir"): attemptedDirectories.insert(parts[2])
                case ("K", "mkdir"): accountDirectories.insert(String(parts[2].dropFirst("accounts/".count)))
                case ("A", "file"): attemptedFiles.insert(parts[2])
                case ("K", "file"):
                    let hole = parts.count >= 7 ? Int(parts[5])!..<Int(parts[6])! : nil
                    files[parts[2]] = (Int(parts[3])!, Int(parts[4])!, hole)
                case ("A", "node"): attemptedFiles.insert(parts[2])
                case ("K", "node"): nodes.insert(parts[2])
                default: break
                }
            }
        }
    }

    /// Checks the remounted stores against the logs; then takes what is there as the new
    /// baseline and clears the cache files.
    func verify() -> [String] {
        var problems: [String] = []
        let status = store.status()
        if status["state"] != "unlocked" || status["vault_error"] != nil {
            problems.append("vault did not unlock: \(status)")
        }
        let keys = listing(store.path("settings")) ?? []
        if keys != settingsKeys { problems.append("settings keys \(keys) ≠ \(settingsKeys)") }
        let fields = listing(store.path("accounts/\(Workload.account)")) ?? []
        if fields != fieldNames { problems.append("fields \(fields) ≠ \(fieldNames)") }
        for (path, values) in allowed.sorted(by: { $0.key < $1.key }) {
            let (bytes, error) = readFile(store.path(path))
            let text = bytes.map { String(decoding: $0, as: UTF8.self) } ?? "<\(errnoName(error))>"
            guard text.hasPrefix("v"), text.hasSuffix("\n"), let n = Int(text.dropFirst().dropLast()), values.contains(n) else {
                problems.append("\(path) holds \(text.debugDescription), expected one of \(values.sorted().map { "v\($0)" })")
                continue
            }
            allowed[path] = [n]
        }
        let directories = Set(listing(store.path("accounts")) ?? []).subtracting(["active"])
        let possible = accountDirectories.union(attemptedDirectories.map { String($0.dropFirst("accounts/".count)) })
        if !accountDirectories.isSubset(of: directories) {
            problems.append("acknowledged accounts missing: \(accountDirectories.subtracting(directories).sorted())")
        }
        if !directories.isSubset(of: possible) {
            problems.append("unexpected entries in accounts/: \(directories.subtracting(possible).sorted())")
        }
        accountDirectories = directories
        attemptedDirectories = []
        let present = Set((listing(store.path("cache/crash")) ?? []).map { "cache/crash/" + $0 })
        if !present.isSubset(of: attemptedFiles) {
            problems.append("unexpected files in cache/crash: \(present.subtracting(attemptedFiles).sorted())")
        }
        for (path, file) in files.sorted(by: { $0.key < $1.key }) {
            let (bytes, error) = readFile(store.path(path))
            let expected = file.hole.map { punchedContent(file.n, size: file.size, from: $0.lowerBound, to: $0.upperBound) }
                ?? Workload.cacheContent(file.n, size: file.size)
            if bytes != expected {
                problems.append("\(path): fsynced \(file.size) bytes, found \(bytes.map { "\($0.count) other bytes" } ?? errnoName(error))")
            }
        }
        for path in nodes.sorted() {
            var st = stat()
            if lstat(store.path(path), &st) != 0 || st.st_mode & S_IFMT != S_IFIFO {
                problems.append("\(path): an acknowledged FIFO is missing or not a FIFO")
            }
        }
        for path in present { unlink(store.path(path)) }
        files = [:]
        nodes = []
        attemptedFiles = []
        let expectedData: Set<String> = ["vault", "device", "Settings.plist", "cache.sqlite", "cache.sqlite-wal", "cache.sqlite-shm",
                                         "cache.data", "mtmfs.lock", "mtmfs.log", "mtmfs.log.1"]
        let data = Set(listing(store.dataDirectory) ?? [])
        if !data.isSubset(of: expectedData) {
            problems.append("data directory holds \(data.subtracting(expectedData).sorted())")
        }
        return problems
    }
}
