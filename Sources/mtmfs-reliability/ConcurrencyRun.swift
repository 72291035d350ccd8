#if canImport(Glibc)
import Glibc
#endif
import Foundation
import Posix
import TestSupport

/// Eight processes of mixed operations on all three stores while the suite locks and
/// unlocks the vault over and over. Each process owns its objects (an account, two
/// settings keys, a cache directory) and keeps a model of them; the only error allowed is
/// EACCES on a field while locked. At the end the mount, and a fresh mount after it, must
/// equal the models.
final class ConcurrencyRun {
    let processes: Int
    let seconds: Double
    let seed: UInt64
    let scratch = Scratch("reliability-concurrency")
    let tally = Tally("concurrency (operations by 8 processes with lock/unlock toggling, then final state)")

    init(processes: Int, seconds: Double, seed: UInt64) {
        self.processes = processes
        self.seconds = seconds
        self.seed = seed
    }

    static func account(_ index: Int) -> String { String(format: "7f1c%04x-0000-4000-8000-%012x", index, index) }
    static let fields = ["username", "password", "comment"]

    func run() -> Tally {
        defer { scratch.remove() }
        do {
            let store = try Store(in: scratch)
            defer { store.unmount() }
            try store.mount()
            for index in 0..<processes {
                let account = "accounts/\(Self.account(index))"
                guard mkdir(store.path(account), 0o700) == 0, mkdir(store.path("cache/p\(index)"), 0o755) == 0 else {
                    throw SuiteError("set-up: \(errnoName(errno))")
                }
                for field in Self.fields where writeFile(store.path("\(account)/\(field)"), Array("init\n".utf8)) != 0 {
                    throw SuiteError("set-up: write \(account)/\(field)")
                }
            }
            var actors: [pid_t] = []
            for index in 0..<processes {
                actors.append(Run.start(Run.suite, ["actor", String(index), store.mountPoint, String(seconds),
                                                    String(seed &+ UInt64(index)), scratch.sub("model-\(index)")],
                                        stderr: scratch.sub("actor-errors")))
            }
            var toggles = 0
            var toggleFailures: [String] = []
            while actors.contains(where: { waitpid($0, nil, WNOHANG) == 0 }) {
                usleep(useconds_t(150_000 + Int.random(in: 0..<250_000)))
                let ok = toggles % 2 == 0 ? store.lock() : store.unlock()
                if !ok { toggleFailures.append("\(toggles % 2 == 0 ? "lock" : "unlock") failed") }
                toggles += 1
            }
            tally.record(tried: toggles, failures: toggleFailures)
            guard store.unlock() || store.status()["state"] == "unlocked" else { throw SuiteError("final unlock failed") }
            var models: [[String]] = []
            for index in 0..<processes {
                let text = readText(scratch.sub("model-\(index)")) ?? ""
                let lines = text.split(separator: "\n").map(String.init)
                models.append(lines)
                let summary = lines.first { $0.hasPrefix("ops ") }?.split(separator: " ") ?? []
                let operations = summary.count > 1 ? Int(summary[1]) ?? 0 : 0
                let unexpected = lines.filter { $0.hasPrefix("unexpected ") }.map { "process \(index): \($0.dropFirst(11))" }
                if summary.isEmpty { tally.record("process \(index)", ["no model written (crashed?)"]) }
                tally.record(tried: operations, failures: unexpected)
            }
            tally.record("final state, same mount", compare(models, store))
            store.unmount()
            try store.mount()
            tally.record("final state, after remount", compare(models, store))
            var stores: [String] = []
            if let problem = plistlibProblem(store.dataDirectory + "/Settings.plist") { stores.append(problem) }
            store.unmount()
            if let problem = integrityProblem(store.dataDirectory + "/cache.sqlite") { stores.append(problem) }
            tally.record("stores on disk", stores)
        } catch {
            tally.record("run", ["\(error)"])
        }
        return tally
    }

    /// Every `value`, `file` and `absent` line of the models against the mount.
    func compare(_ models: [[String]], _ store: Store) -> [String] {
        var problems: [String] = []
        for lines in models {
            for line in lines {
                let parts = line.split(separator: " ", maxSplits: 3).map(String.init)
                switch parts.first {
                case "value":
                    let found = readText(store.path(parts[1]))
                    if found != parts[2] + "\n" { problems.append("\(parts[1]): \(found.debugDescription) ≠ \(parts[2])") }
                case "file":
                    let found = readFile(store.path(parts[1])).bytes
                    if found != Workload.cacheContent(Int(parts[2])!, size: Int(parts[3])!) {
                        problems.append("\(parts[1]): content differs (\(found?.count ?? -1) bytes)")
                    }
                case "absent":
                    if access(store.path(parts[1]), F_OK) == 0 { problems.append("\(parts[1]) exists, removed in the model") }
                default: break
                }
            }
        }
        return problems
    }

    // MARK: One process

    /// A process of the run: its own account, keys and cache directory; writes its model.
    static func act(index: Int, mountPoint: String, seconds: Double, seed: UInt64, model: String) -> Int32 {
        var random = SplitMix(seed: seed)
        let account = "\(mountPoint)/accounts/\(Self.account(index))"
        var fields = Dictionary(uniqueKeysWithValues: Self.fields.map { ($0, "init") })
        var keys: [String: String] = [:]
        var files: [String: (n: Int, size: Int)] = [:]
        var removed: Set<String> = []
        var unexpected: [String] = []
        var operations = 0
        var n = index * 10_000_000
        let deadline = Date().addingTimeInterval(seconds)
        func expect(_ what: String, _ error: Int32, allowing allowed: Set<Int32> = []) {
            if error != 0 && !allowed.contains(error) { unexpected.append("\(what): \(errnoName(error))") }
        }
        while Date() < deadline && unexpected.count < 20 {
            operations += 1
            n += 1
            let field = Self.fields[Int(random.next() % 3)]
            let key = "Concurrent\(index)K\(random.next() % 2)"
            let file = "cache/p\(index)/f\(random.next() % 5)"
            switch random.next() % 8 {
            case 0:  // write a field: committed exactly when close succeeds
                let value = "a\(n)"
                let error = writeFile("\(account)/\(field)", Array((value + "\n").utf8))
                if error == 0 { fields[field] = value }
                expect("write \(field)", error, allowing: [EACCES])
            case 1:  // read a field: the model's value, or EACCES while locked
                let (bytes, error) = readFile("\(account)/\(field)")
                expect("read \(field)", error, allowing: [EACCES])
                if let bytes, String(decoding: bytes, as: UTF8.self) != fields[field]! + "\n" {
                    unexpected.append("read \(field): \(String(decoding: bytes, as: UTF8.self).debugDescription) ≠ \(fields[field]!)")
                }
            case 2:  // write a settings key (not behind the lock: no error allowed)
                let value = "s\(n)"
                let error = writeFile("\(mountPoint)/settings/\(key)", Array((value + "\n").utf8))
                if error == 0 { keys[key] = value }
                expect("write settings/\(key)", error)
            case 3:
                guard let value = keys[key] else { continue }
                let (bytes, error) = readFile("\(mountPoint)/settings/\(key)")
                expect("read settings/\(key)", error)
                if let bytes, String(decoding: bytes, as: UTF8.self) != value + "\n" {
                    unexpected.append("read settings/\(key): \(String(decoding: bytes, as: UTF8.self).debugDescription) ≠ \(value)")
                }
            case 4, 5:  // write a cache file
                let size = Int(random.next() % 100_000)
                let error = writeFile("\(mountPoint)/\(file)", Workload.cacheContent(n, size: size), sync: random.next() % 4 == 0)
                if error == 0 { files[file] = (n, size); removed.remove(file) }
                expect("write \(file)", error)
            case 6:  // read a cache file back
                guard let expected = files[file] else { continue }
                let (bytes, error) = readFile("\(mountPoint)/\(file)")
                expect("read \(file)", error)
                if let bytes, bytes != Workload.cacheContent(expected.n, size: expected.size) {
                    unexpected.append("read \(file): \(bytes.count) bytes differ from the \(expected.size) written")
                }
            default:  // rename over another file, or unlink
                guard let moved = files[file] else { continue }
                let target = "cache/p\(index)/f\(random.next() % 5)"
                if target == file || random.next() % 3 == 0 {
                    expect("unlink \(file)", unlink("\(mountPoint)/\(file)") == 0 ? 0 : errno)
                    files[file] = nil
                    removed.insert(file)
                } else {
                    expect("rename \(file)", rename("\(mountPoint)/\(file)", "\(mountPoint)/\(target)") == 0 ? 0 : errno)
                    files[target] = moved
                    files[file] = nil
                    removed.remove(target)
                    removed.insert(file)
                }
            }
        }
        var lines = ["ops \(operations)"]
        lines += fields.map { "value accounts/\(Self.account(index))/\($0.key) \($0.value)" }
        lines += keys.map { "value settings/\($0.key) \($0.value)" }
        lines += files.map { "file \($0.key) \($0.value.n) \($0.value.size)" }
        lines += removed.map { "absent \($0)" }
        lines += unexpected.map { "unexpected \($0)" }
        return writeFile(model, Array((lines.joined(separator: "\n") + "\n").utf8)) == 0 ? 0 : 1
    }
}
