#if canImport(Glibc)
import Glibc
#endif
import CredentialVault
import SecureMemory
import Foundation
import Posix

/// The set-up (native, the FUSE floor, bindfs, gocryptfs, mtmfs side by side), the
/// workloads, and the report.
final class Bench {
    let options: Benchmark.Options
    let root: String
    let mtmfs: String
    /// `mtmfs-floor` beside this program, if built.
    let floorProgram: String?
    let mountPoint: String
    let dataDirectory: String
    var systems: [String: System] = [:]  // per workload family: name → directory
    var samples: [Sample] = []
    var notes: [String] = []
    var daemonPID: pid_t = 0
    var floorPID: pid_t = 0
    var passReady = false
    /// W25: the smallest vault store, synced to a bare remote; pass pushing to one too.
    var syncMount: String?
    var passSyncReady = false
    var manyAccountsMount = ""
    var vaultStores: [(accounts: Int, mount: String, daemon: pid_t)] = []
    var statusStores: [(files: Int, mount: String)] = []
    var guardStores: [GuardStore] = []
    var secretServices: [SecretService] = []
    static let account = "6ba7b810-9dad-11d1-80b4-00c04fd430c8"
    static let passphrase = "bench passphrase"

    var iterations: Int { options.quick ? 2_000 : 100_000 }
    var processRuns: Int { options.quick ? 20 : 200 }
    var smallFiles: Int { options.quick ? 300 : 10_000 }
    var bigBytes: Int { options.quick ? 16 << 20 : 256 << 20 }
    var manyAccounts: Int { options.quick ? 300 : 10_000 }
    var postmarkFiles: (files: Int, transactions: Int) { options.quick ? (200, 500) : (5_000, 20_000) }

    init(options: Benchmark.Options) throws {
        self.options = options
        var template = Array("/tmp/mtmfs-bench.XXXXXX".utf8CString)
        guard let made = mkdtemp(&template) else { throw BenchError("cannot make a directory in /tmp") }
        root = String(cString: made)
        chmod(root, 0o755)
        let here = URL(fileURLWithPath: "/proc/self/exe").resolvingSymlinksInPath().deletingLastPathComponent()
        let sibling = here.appendingPathComponent("mtmfs").path
        mtmfs = FileManager.default.isExecutableFile(atPath: sibling) ? sibling : "mtmfs"
        let floor = here.appendingPathComponent("mtmfs-floor").path
        floorProgram = FileManager.default.isExecutableFile(atPath: floor) ? floor : nil
        mountPoint = root + "/mtmfs"
        dataDirectory = root + "/data"
    }

    func tearDown() {
        Bench.stopNamespaceDaemons()
        for mount in Benchmark.mounts.reversed() { Spawn.run("fusermount3", ["-uz", mount]) }
        Benchmark.mounts.removeAll()
        Benchmark.stopHelpers()
        stopFloor()
        // gpg started an agent for the throwaway key (W1's pass): it would outlive the run.
        if FileManager.default.fileExists(atPath: root + "/gnupg") {
            Spawn.run("gpgconf", ["--homedir", root + "/gnupg", "--kill", "gpg-agent"])
        }
        Spawn.run("rm", ["-rf", root])
    }

    // MARK: Set-up

    func setUp() throws {
        for directory in ["native", "native/cache", "bindsrc", "bindsrc/cache", "bindfs", "mtmfs"] {
            mkdir(root + "/" + directory, 0o755)
        }
        for base in ["native", "bindsrc"] {
            try "correct-horse-battery-staple\n".write(toFile: "\(root)/\(base)/password", atomically: true, encoding: .utf8)
            try "42\n".write(toFile: "\(root)/\(base)/BenchKey", atomically: true, encoding: .utf8)
        }
        guard Spawn.run(mtmfs, ["init", "--kdf", "interactive", "--data-dir", dataDirectory], input: Bench.passphrase + "\n") == 0 else {
            throw BenchError("mtmfs init failed (is \(mtmfs) built?)")
        }
        // The package links the Swift runtime statically: a dynamic build starts slower and
        // holds more of its libraries' pages when idle (W8, every whole-process row).
        if Spawn.exists("ldd"), Spawn.output("ldd", [mtmfs]).output.contains("libswiftCore") {
            notes.append("mtmfs links the Swift runtime dynamically, unlike the package: its starts and W8 read higher "
                         + "(build with swift build -c release --static-swift-stdlib)")
        }
        let mountTime = try seconds {
            guard Spawn.run(mtmfs, ["mount", "--auto-lock", "0", "--data-dir", dataDirectory, mountPoint]) == 0 else {
                throw BenchError("mtmfs mount failed")
            }
        }
        Benchmark.mounts.append(mountPoint)
        samples.append(Sample(workload: "W9 mount to ready (s)", system: "mtmfs", value: mountTime))
        daemonPID = pid_t(statusValue("pid") ?? "") ?? 0
        samples.append(Sample(workload: "W8 daemon RSS idle (MB)", system: "mtmfs", value: rss()))
        let unlockTime = try seconds {
            guard Spawn.run(mtmfs, ["unlock", mountPoint], input: Bench.passphrase + "\n") == 0 else { throw BenchError("unlock failed") }
        }
        samples.append(Sample(workload: "W9 unlock, interactive KDF (s)", system: "mtmfs", value: unlockTime))
        mkdir("\(mountPoint)/accounts/\(Bench.account)", 0o700)
        try "correct-horse-battery-staple\n".write(toFile: "\(mountPoint)/accounts/\(Bench.account)/password", atomically: false, encoding: .utf8)
        try "42\n".write(toFile: "\(mountPoint)/settings/BenchKey", atomically: false, encoding: .utf8)
        systems = ["native": System(name: "native", directory: root + "/native")]
        if Spawn.exists("bindfs") && Spawn.run("bindfs", [root + "/bindsrc", root + "/bindfs"]) == 0 {
            Benchmark.mounts.append(root + "/bindfs")
            systems["bindfs"] = System(name: "bindfs", directory: root + "/bindfs")
        } else {
            notes.append("bindfs: skipped (not installed: mount-helpers/install-deps --bench)")
        }
        try setUpGocryptfs()
        try setUpFloor()
        guard !options.engineOnly, !options.metadataOnly else { return }
        if options.guardOnly || !(options.vaultOnly || options.daemonOnly) {
            guardStores = try setUpGuardStores()
            if options.guardOnly { return }
        }
        if options.secretServiceOnly {
            try (Bench.passphrase + "\n").write(toFile: root + "/w3-pass", atomically: true, encoding: .utf8)
            secretServices = try setUpSecretServices()
            return
        }
        if !options.vaultOnly {
            try idleRound()
            statusStores = try setUpStatusStores()
        }
        guard !options.daemonOnly else { return }
        try setUpPass()
        if options.vaultOnly {
            try (Bench.passphrase + "\n").write(toFile: root + "/w3-pass", atomically: true, encoding: .utf8)
        } else {
            try setUpManyAccounts()
        }
        vaultStores = try setUpVaultScale()
        if !options.vaultOnly { secretServices = try setUpSecretServices() }
    }

    /// gocryptfs: an encrypted directory (scrypt, default settings) mounted like the others.
    func setUpGocryptfs() throws {
        guard Spawn.exists("gocryptfs") else {
            notes.append("gocryptfs: skipped (not installed: mount-helpers/install-deps --bench)")
            return
        }
        let cipher = root + "/gocryptfs-cipher", plain = root + "/gocryptfs"
        mkdir(cipher, 0o700)
        mkdir(plain, 0o755)
        try "bench\n".write(toFile: root + "/gocryptfs-pass", atomically: true, encoding: .utf8)
        guard Spawn.run("gocryptfs", ["-init", "-q", "-passfile", root + "/gocryptfs-pass", cipher]) == 0,
              Spawn.run("gocryptfs", ["-q", "-passfile", root + "/gocryptfs-pass", cipher, plain]) == 0 else {
            notes.append("gocryptfs: skipped (init or mount failed)")
            return
        }
        Benchmark.mounts.append(plain)
        mkdir(plain + "/cache", 0o755)
        try "correct-horse-battery-staple\n".write(toFile: plain + "/password", atomically: true, encoding: .utf8)
        try "42\n".write(toFile: plain + "/BenchKey", atomically: true, encoding: .utf8)
        systems["gocryptfs"] = System(name: "gocryptfs", directory: plain)
    }

    /// The floor: `mtmfs-floor`, the least a libfuse low-level daemon does (a tree in memory,
    /// cache/'s kernel-cache settings), as our child in the foreground. Only the per-operation
    /// rows run on it (W1, W2, W4, W5, W10), and the big write (W13, W14): mtmfs ÷ floor is
    /// what mtmfs adds to FUSE's own cost.
    func setUpFloor() throws {
        guard let floorProgram else {
            notes.append("floor: skipped (mtmfs-floor is not built beside mtmfs-bench: swift build --product mtmfs-floor)")
            return
        }
        let mount = root + "/floor"
        mkdir(mount, 0o755)
        // A process group of its own: a Ctrl-C stops the bench, which then unmounts the floor,
        // instead of ending the floor under a workload.
        guard let pid = try? Spawn.start(floorProgram, ["-f", mount], stderr: .descriptor(2), ownProcessGroup: true) else {
            notes.append("floor: skipped (cannot start \(floorProgram))")
            return
        }
        let started = ContinuousClock.now
        while !((try? String(contentsOfFile: "/proc/self/mounts", encoding: .utf8)) ?? "").contains(" \(mount) fuse.mtmfs-floor ") {
            if waitpid(pid, nil, WNOHANG) == pid {
                notes.append("floor: skipped (mtmfs-floor ended before it mounted)")
                return
            }
            if started.secondsElapsed > 10 {
                floorPID = pid
                stopFloor()
                notes.append("floor: skipped (mtmfs-floor did not mount in 10 s)")
                return
            }
            usleep(20_000)
        }
        floorPID = pid
        Benchmark.mounts.append(mount)
        mkdir(mount + "/cache", 0o755)
        try "correct-horse-battery-staple\n".write(toFile: mount + "/password", atomically: false, encoding: .utf8)
        try "42\n".write(toFile: mount + "/BenchKey", atomically: false, encoding: .utf8)
        systems["floor"] = System(name: "floor", directory: mount)
    }

    /// Ends the floor's daemon: after its unmount (then it is on its way out), or instead of
    /// it (SIGTERM unmounts).
    func stopFloor() {
        guard floorPID > 0 else { return }
        kill(floorPID, SIGTERM)
        Spawn.wait(floorPID, timeout: 10)
        floorPID = 0
    }

    /// pass: a password store with a throwaway GPG key without a passphrase (W1 only).
    func setUpPass() throws {
        guard Spawn.exists("pass") && Spawn.exists("gpg") else {
            notes.append("pass: skipped (not installed: mount-helpers/install-deps --bench)")
            return
        }
        let home = root + "/gnupg"
        mkdir(home, 0o700)
        setenv("GNUPGHOME", home, 1)
        setenv("PASSWORD_STORE_DIR", root + "/pass-store", 1)
        guard Spawn.run("gpg", ["--batch", "--passphrase", "", "--quick-gen-key", "bench@mtmfs.invalid", "default", "default", "never"]) == 0,
              Spawn.run("pass", ["init", "bench@mtmfs.invalid"]) == 0,
              Spawn.run("pass", ["insert", "-m", "bench/password"], input: "correct-horse-battery-staple\n") == 0 else {
            notes.append("pass: skipped (gpg key or store set-up failed)")
            return
        }
        passReady = true
    }

    /// W3: 10,000 accounts. For mtmfs a second store whose vault gets them in one save
    /// (`Vault.addAccounts`; 10,000 mkdirs would rewrite the vault 10,000 times); for the
    /// others a directory of 10,000 directories.
    func setUpManyAccounts() throws {
        let count = manyAccounts
        let names = (0..<count).map { String(format: "%08x-0000-4000-8000-%012x", $0, $0) }
        for base in ["native", "bindsrc"] + (systems["gocryptfs"] != nil ? ["gocryptfs"] : []) {
            let directory = root + "/" + base + "/accounts"
            mkdir(directory, 0o700)
            for name in names { mkdir(directory + "/" + name, 0o700) }
        }
        let data = root + "/data-w3"
        guard Spawn.run(mtmfs, ["init", "--kdf", "interactive", "--data-dir", data], input: Bench.passphrase + "\n") == 0 else {
            throw BenchError("mtmfs init (W3) failed")
        }
        do {
            let vault = try Vault(path: data + "/vault")
            try vault.unlock(passphrase: try SecureBytes(copying: Array(Bench.passphrase.utf8)))
            try vault.addAccounts(names.map { (AccountName.uuidBytes($0)!, $0) })
            vault.lock()
        } catch {
            throw BenchError("W3 vault: \(error)")
        }
        let mount = root + "/mtmfs-w3"
        mkdir(mount, 0o755)
        try (Bench.passphrase + "\n").write(toFile: root + "/w3-pass", atomically: true, encoding: .utf8)
        guard Spawn.run(mtmfs, ["mount", "--auto-lock", "0", "--unlock", "--passphrase-file", root + "/w3-pass",
                                "--data-dir", data, mount]) == 0 else { throw BenchError("mtmfs mount (W3) failed") }
        Benchmark.mounts.append(mount)
        manyAccountsMount = mount
    }

    func statusValue(_ key: String) -> String? {
        guard let text = try? String(contentsOfFile: mountPoint + "/.mtmfs/status", encoding: .utf8) else { return nil }
        return text.split(separator: "\n").first { $0.hasPrefix(key + "=") }.map { String($0.dropFirst(key.count + 1)) }
    }

    func rss() -> Double { rss(of: daemonPID) }

    /// The file or directory a workload uses on each system; on the floor too `withFloor`
    /// (the per-operation rows W1, W2, W4, W5 and W10).
    func paths(_ kind: String, withFloor: Bool = false) -> [(String, String)] {
        var result: [(String, String)] = []
        for name in ["native", "floor", "bindfs", "gocryptfs", "mtmfs"] where withFloor || name != "floor" {
            let base: String
            switch name {
            case "mtmfs":
                switch kind {
                case "password": base = "\(mountPoint)/accounts/\(Bench.account)/password"
                case "key": base = "\(mountPoint)/settings/BenchKey"
                case "accounts": base = "\(manyAccountsMount)/accounts"
                default: base = "\(mountPoint)/cache"
                }
            default:
                guard let system = systems[name] else { continue }
                base = system.directory + "/" + (kind == "key" ? "BenchKey" : kind)
            }
            result.append((name, base))
        }
        return result
    }

    // MARK: Workloads

    func record(_ workload: String, _ system: String, _ value: Double) {
        samples.append(Sample(workload: workload, system: system, value: value))
    }

    func run() throws {
        try setUp()
        for round in 0..<options.rounds {
            guard Benchmark.interrupted == 0 else { throw BenchError("interrupted") }
            let rotate = { (list: [(String, String)]) in Array(list[(round % list.count)...] + list[..<(round % list.count)]) }
            if options.engineOnly {
                try engineRound(round, rotate: rotate)
                continue
            }
            if options.metadataOnly {
                for (system, directory) in rotate(paths("cache", withFloor: true)) {
                    try smallFileRound(system, directory + "/round\(round)")
                }
                continue
            }
            if options.vaultOnly {
                try vaultRound(vaultStores)
                continue
            }
            if options.guardOnly {
                guardRound(guardStores, round: round)
                continue
            }
            if options.secretServiceOnly {
                try secretServiceRound(secretServices)
                continue
            }
            try statusRound(statusStores)
            if options.daemonOnly { continue }
            for (system, path) in rotate(paths("password", withFloor: true)) {
                let runs = processRuns
                let total = seconds { for _ in 0..<runs { Spawn.run("/bin/cat", [path]) } }
                record("W1 cat a field, whole process (ms)", system, total / Double(runs) * 1000)
            }
            guardRound(guardStores, round: round)
            if passReady {
                let runs = max(5, processRuns / 10)
                let total = seconds { for _ in 0..<runs { Spawn.run("pass", ["show", "bench/password"]) } }
                record("W1 cat a field, whole process (ms)", "pass", total / Double(runs) * 1000)
            }
            for (system, path) in rotate(paths("password", withFloor: true)) {
                record("W2 open+read+close (µs)", system, try openReadClose(path, times: iterations) * 1e6)
            }
            for (system, directory) in rotate(paths("accounts")) {
                _ = Spawn.run("ls", ["-l", directory])  // warm
                let list = seconds { _ = Spawn.run("ls", ["-l", directory]) }
                record("W3 ls -l accounts/, \(manyAccounts) accounts, warm (ms)", system, list * 1000)
            }
            try vaultRound(vaultStores)
            try secretServiceRound(secretServices)
            for (system, path) in rotate(paths("key", withFloor: true)) {
                let n = iterations / 10
                record("W4 read a settings key (µs)", system, try openReadClose(path, times: n) * 1e6)
                record("W4 write a settings key (µs)", system, try writeValue(path, times: n / 4) * 1e6)
            }
            for (system, directory) in rotate(paths("cache", withFloor: true)) {
                try smallFileRound(system, directory + "/round\(round)")
            }
            if round == 0, daemonPID > 0 { record("W8 daemon RSS after W5 (MB)", "mtmfs", rss()) }
            for (system, directory) in rotate(paths("cache")) {
                try bigFileRound(system, directory + "/big\(round)")
            }
            if round == 0, daemonPID > 0 { record("W8 daemon RSS after W6 (MB)", "mtmfs", rss()) }
            if Spawn.exists("postmark") {
                for (system, directory) in rotate(paths("cache")) {
                    try postmark(system, directory + "/postmark\(round)")
                }
            }
            try engineRound(round, rotate: rotate)
        }
        report()
    }

    /// Seconds per open+read+close of one file, in one process.
    func openReadClose(_ path: String, times: Int) throws -> Double {
        var buffer = [UInt8](repeating: 0, count: 4096)
        return try seconds {
            for _ in 0..<times {
                let fd = open(path, O_RDONLY)
                guard fd >= 0 else { throw BenchError("open \(path): \(Errno.current)") }
                _ = read(fd, &buffer, buffer.count)
                close(fd)
            }
        } / Double(times)
    }

    func writeValue(_ path: String, times: Int) throws -> Double {
        try seconds {
            for index in 0..<times {
                let fd = open(path, O_WRONLY | O_TRUNC)
                guard fd >= 0 else { throw BenchError("open \(path): \(Errno.current)") }
                let text = Array("\(index)\n".utf8)
                _ = write(fd, text, text.count)
                close(fd)
            }
        } / Double(times)
    }

    func smallFileRound(_ system: String, _ directory: String) throws {
        let count = smallFiles
        let payload = [UInt8](repeating: 0x61, count: 1024)
        mkdir(directory, 0o755)
        let create = try seconds {
            for index in 0..<count {
                let fd = open("\(directory)/f\(index)", O_WRONLY | O_CREAT | O_TRUNC, 0o644)
                guard fd >= 0 else { throw BenchError("create: \(Errno.current)") }
                _ = write(fd, payload, payload.count)
                close(fd)
            }
        }
        record("W5 create \(count) × 1 KiB (ms)", system, create * 1000)
        _ = Spawn.run("ls", ["-l", directory])  // warm
        let list = seconds { _ = Spawn.run("ls", ["-l", directory]) }
        record("W5 ls -l, warm (ms)", system, list * 1000)
        var buffer = [UInt8](repeating: 0, count: 4096)
        let readAll = {
            for index in 0..<count {
                let fd = open("\(directory)/f\(index)", O_RDONLY)
                _ = read(fd, &buffer, buffer.count)
                close(fd)
            }
        }
        record("W5 read all, warm (ms)", system, seconds(readAll) * 1000)
        dropCaches()
        record("W5 read all, after drop_caches (ms)", system, seconds(readAll) * 1000)
        let remove = seconds { _ = Spawn.run("rm", ["-r", directory]) }
        record("W5 rm -r (ms)", system, remove * 1000)
    }

    func bigFileRound(_ system: String, _ path: String) throws {
        let total = bigBytes
        let write = try timedBigWrite(path, total: total)
        record("W6 sequential write + fsync (MB/s)", system, Double(total) / write / 1e6)
        var buffer = [UInt8](repeating: 0, count: 1 << 20)
        let readWhole = {
            let fd = open(path, O_RDONLY)
            while Glibc.read(fd, &buffer, buffer.count) > 0 {}
            close(fd)
        }
        dropCaches()
        record("W6 sequential read, cold (MB/s)", system, Double(total) / seconds(readWhole) / 1e6)
        record("W6 sequential read, warm (MB/s)", system, Double(total) / seconds(readWhole) / 1e6)
        unlink(path)
    }

    /// Seconds to write `total` bytes into a new file in 1 MiB writes and fsync it.
    func timedBigWrite(_ path: String, total: Int) throws -> Double {
        let block = [UInt8](repeating: 0x5A, count: 1 << 20)
        return try seconds {
            let fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0o644)
            guard fd >= 0 else { throw BenchError("create \(path): \(Errno.current)") }
            var written = 0
            while written < total { written += Glibc.write(fd, block, block.count) }
            fsync(fd)
            close(fd)
        }
    }

    /// Writes back and drops the kernel's page, dentry and inode caches (root only).
    func dropCaches() {
        sync()
        if let fd = Optional(open("/proc/sys/vm/drop_caches", O_WRONLY)), fd >= 0 {
            _ = write(fd, "3\n", 2)
            close(fd)
        }
    }

    /// W7 (and W12): postmark's small-file transactions in the cache directory, with its
    /// default file sizes (500 B–10 KB) or those given; transactions per second.
    func postmark(_ system: String, _ directory: String, sizes: (Int, Int)? = nil, subdirectories: Int = 0,
                  workload: String = "W7 postmark", counts: (files: Int, transactions: Int)? = nil) throws {
        mkdir(directory, 0o755)
        let (files, transactions) = counts ?? postmarkFiles
        var script = "set location \(directory)\nset number \(files)\nset transactions \(transactions)\n"
        if let sizes { script += "set size \(sizes.0) \(sizes.1)\n" }
        if subdirectories > 0 { script += "set subdirectories \(subdirectories)\n" }
        script += "run\nquit\n"
        let output = Spawn.standardOutput("postmark", [], input: script)
        // "… seconds of transactions (N per second)"
        guard let range = output.range(of: #"seconds of transactions \((\d+) per second\)"#, options: .regularExpression),
              let rate = Double(output[range].split(separator: "(")[1].split(separator: " ")[0]) else {
            notes.append("postmark on \(system): no rate in its output")
            return
        }
        record("\(workload) \(files) files, \(transactions) transactions (tx/s)", system, rate)
        _ = Spawn.run("rm", ["-rf", directory])
    }

    // MARK: Report

    static let targets: [String: String] = [
        "W1 cat a field, whole process (ms)": "≤ 1.10×", "W2 open+read+close (µs)": "≤ 3×",
        "W4 read a settings key (µs)": "≤ 3×", "W4 write a settings key (µs)": "≤ 20×",
        "W5 ls -l, warm (ms)": "≤ 3×", "W5 read all, warm (ms)": "≤ 2×",
        "W6 sequential write + fsync (MB/s)": "≥ 0.25×", "W6 sequential read, warm (MB/s)": "≥ 0.9×",
        "W6 sequential read, cold (MB/s)": "≥ 0.6×", "W5 create 10000 × 1 KiB (ms)": "≤ 1.0×",
        "W8 daemon RSS idle (MB)": "≤ 15 MB", "W8 daemon RSS after W6 (MB)": "≤ 64 MB",
    ]

    /// Targets by workload number (labels carry sizes that change with --quick).
    static func target(prefix workload: String) -> String {
        let byPrefix: [(String, String)] = [
            ("W3 ", "≤ 3×"), ("W7 ", "≥ 2× bindfs"), ("W10 ", "≤ best peer"), ("W11 ", "≤ best peer"),
            ("W12 ", "≥ best peer"), ("W13 largest", "≤ 64 MiB"), ("W13 ", "≥ best peer"),
            ("W14 longest", "≤ 100 ms"), ("W14 space", "≤ 60 s"), ("W15 ", "≤ 0.5 s"),
            ("W17 ", "same at every size"), ("W18 ", "≤ 1"), ("W19 ", "same at every size"),
            ("W20 guard on ÷", "≤ 1.2×"), ("W26 secret-tool", "≤ gnome-keyring"), ("W26 SearchItems, ", "≤ 1.5×"),
            ("W26 idle", "0"), ("W27 mtmfs run ÷", "≤ 2×"), ("W21 ", "≤ best peer"), ("W22 ", "≤ best peer"), ("W23 ", "≥ best peer"),
        ]
        return byPrefix.first { workload.hasPrefix($0.0) }?.1 ?? "report"
    }

    func report() {
        var workloads: [String] = []
        for sample in samples where !workloads.contains(sample.workload) { workloads.append(sample.workload) }
        func stats(_ workload: String, _ system: String) -> (median: Double, low: Double, high: Double)? {
            let values = samples.filter { $0.workload == workload && $0.system == system }.map(\.value).sorted()
            guard !values.isEmpty else { return nil }
            return (values[values.count / 2], values.first!, values.last!)
        }
        func format(_ value: Double) -> String { value >= 100 ? String(format: "%.0f", value) : String(format: "%.3g", value) }
        let systemsShown = ["native", "floor", "bindfs", "gocryptfs", "pass", "gnome-keyring", "mtmfs"].filter { name in samples.contains { $0.system == name } }
        var lines = ["| workload | " + systemsShown.joined(separator: " | ") + " | target |",
                     "|---|" + systemsShown.map { _ in "---:|" }.joined() + "---|"]
        var json: [[String: Any]] = []
        for workload in workloads {
            let native = stats(workload, "native")?.median
            let floorMedian = stats(workload, "floor")?.median  // the per-operation rows only
            var cells: [String] = []
            for system in systemsShown {
                guard let s = stats(workload, system) else { cells.append("—"); continue }
                var cell = "\(format(s.median)) (\(format(s.low))–\(format(s.high)))"
                if let native, system != "native", native > 0 { cell += String(format: " **%.2f×**", s.median / native) }
                if let floorMedian, system == "mtmfs", floorMedian > 0 {
                    cell += String(format: " · ÷ floor **%.2f×**", s.median / floorMedian)
                }
                cells.append(cell)
                json.append(["workload": workload, "system": system, "median": s.median, "min": s.low, "max": s.high,
                             "ratio_to_native": native.map { s.median / $0 } ?? NSNull(),
                             "ratio_to_floor": floorMedian.map { s.median / $0 } ?? NSNull()])
            }
            let target = Self.targets[workload] ?? Self.target(prefix: workload)
            lines.append("| \(workload) | " + cells.joined(separator: " | ") + " | \(target) |")
        }
        print("mtmfs-bench: \(options.rounds) rounds\(options.quick ? " (quick)" : ""), medians (min–max), ratio to native in the same run; "
              + "mtmfs ÷ floor where the floor (mtmfs-floor, a minimal FUSE daemon in memory) ran too\n")
        print(lines.joined(separator: "\n"))
        for note in notes { print("\n- \(note)") }
        if let path = options.json, let data = try? JSONSerialization.data(withJSONObject: json, options: [.prettyPrinted]) {
            _ = FileManager.default.createFile(atPath: path, contents: data)
        }
    }
}
