#if canImport(Glibc)
import Glibc
#endif
import CredentialVault
import SecureMemory
import Foundation
import Posix
import TestSupport

/// A daemon that runs for months (SPEC §7): many editor saves, mixing every save
/// strategy, over settings keys and account fields, with locks and unlocks between
/// batches. The daemon's resident memory after all of them must stay within 2 MB of what it
/// held after the first 1,000; every save must leave its value. Then: `stat` and `ls` of
/// accounts/ during a SENSITIVE unlock (seconds of key derivation) never wait 100 ms.
///
/// The data directory lives in /dev/shm where there is one: the part measures memory,
/// not the disk's fsync.
final class Soak {
    let saves: Int
    var random: SplitMix
    let scratch: Scratch
    let memory = Tally("soak (RSS after many editor saves ≤ RSS after the first 1,000 + 2 MB)")
    let values = Tally("soak (every save leaves its value, no stray name)")
    let stall = Tally("unlock stall (stat/ls of accounts/ during a SENSITIVE unlock wait < 100 ms)")
    let scale = Tally("vault scale (10,000 full accounts: unlocked ≤ 64 MB and < 1,000 memory maps, less once locked)")

    static let account = Workload.account
    static let keys = (0..<8).map { "settings/SoakKey\($0)" }
    static let fields = ["username", "comment", "label", "password"].map { "accounts/\(account)/\($0)" }

    init(saves: Int, seed: UInt64) {
        self.saves = saves
        random = SplitMix(seed: seed)
        let base = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : nil
        scratch = Scratch("reliability-soak", in: base)
    }

    func run() -> [Tally] {
        defer { scratch.remove() }
        do {
            try soak()
            try unlockStall()
            try vaultScale()
        } catch {
            memory.record("set-up", ["\(error)"])
        }
        return [values, memory, stall, scale]
    }

    // MARK: Saves

    /// One save of `text` at `path` the way `strategy` does it; 0 or the errno of the first
    /// call that failed.
    static func save(_ path: String, _ text: String, strategy: Int) -> Int32 {
        let directory = (path as NSString).deletingLastPathComponent
        let name = (path as NSString).lastPathComponent
        let bytes = Array((text + "\n").utf8)
        func check(_ result: Int32) -> Int32 { result == 0 ? 0 : errno }
        switch strategy % 7 {
        case 0:  // vim: swap file, 4913 probe, rename to K~, new file, fsync, unlink K~
            let swap = directory + "/." + name + ".swp"
            let swapFD = open(swap, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0o600)
            defer { if swapFD >= 0 { close(swapFD); unlink(swap) } }
            let probe = directory + "/4913"
            let probeFD = open(probe, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0o644)
            if probeFD >= 0 { close(probeFD); unlink(probe) }
            if rename(path, path + "~") != 0 { return errno }
            let error = writeFile(path, bytes, sync: true)
            if error != 0 { rename(path + "~", path); return error }
            return check(unlink(path + "~"))
        case 1:  // nano, cp, ed, `>`: truncate and write in place
            return writeFile(path, bytes)
        case 2:  // sed -i: temporary file, rename onto the key
            let temp = directory + "/sed" + String(format: "%06d", strategy % 1_000_000)
            let error = writeFile(temp, bytes, flags: O_RDWR | O_CREAT | O_EXCL)
            if error != 0 { unlink(temp); return error }
            if rename(temp, path) != 0 { let failure = errno; unlink(temp); return failure }
            return 0
        case 3:  // install, git checkout, mv from another file system: unlink, then O_EXCL
            if unlink(path) != 0 { return errno }
            return writeFile(path, bytes, flags: O_WRONLY | O_CREAT | O_EXCL)
        case 4:  // emacs: lock link, auto-save file, rename to K~, new file, delete the rest
            let lock = directory + "/.#" + name, autosave = directory + "/#" + name + "#"
            symlink("user@host.1:1", lock)
            writeFile(autosave, bytes)
            if rename(path, path + "~") != 0 { return errno }
            let error = writeFile(path, bytes, flags: O_WRONLY | O_CREAT | O_EXCL, sync: true)
            if error != 0 { rename(path + "~", path) }
            unlink(autosave)
            unlink(lock)
            unlink(path + "~")
            return error
        case 5:  // Python: tempfile.NamedTemporaryFile(dir=…, delete=False) + os.replace
            let temp = directory + "/tmp" + String(format: "%08d", strategy % 100_000_000)
            let error = writeFile(temp, bytes, flags: O_RDWR | O_CREAT | O_EXCL, sync: true)
            if error != 0 { unlink(temp); return error }
            if rename(temp, path) != 0 { let failure = errno; unlink(temp); return failure }
            return 0
        default:  // `: > K` then `>>`
            let error = writeFile(path, [])
            if error != 0 { return error }
            return writeFile(path, bytes, flags: O_WRONLY | O_APPEND)
        }
    }

    func soak() throws {
        let store = try Store(in: scratch)
        defer { store.unmount() }
        try store.mount()
        guard mkdir(store.path("accounts/\(Self.account)"), 0o700) == 0 else { throw SuiteError("mkdir account: \(errnoName(errno))") }
        for key in Self.keys where writeFile(store.path(key), Array("start\n".utf8)) != 0 {
            throw SuiteError("cannot make \(key)")
        }
        let targets = Self.keys + Self.fields
        var failures: [String] = []
        var baseline = 0
        let lockEvery = max(500, saves / 20)
        for round in 0..<saves {
            if round > 0 && round % lockEvery == 0 {
                guard store.lock(), store.unlock() else { throw SuiteError("lock/unlock failed at save \(round)") }
            }
            let target = targets[Int(random.next() % UInt64(targets.count))]
            let strategy = Int(random.next() % 1_000_000)
            let text = "v\(round)-\(strategy)"
            let error = Self.save(store.path(target), text, strategy: strategy)
            if error != 0 {
                failures.append("save \(round) of \(target) (strategy \(strategy % 7)): \(errnoName(error))")
            } else if round % 97 == 0, readText(store.path(target)) != text + "\n" {
                failures.append("save \(round) of \(target) (strategy \(strategy % 7)): read \(readText(store.path(target)) ?? "nothing")")
            }
            if round + 1 == min(1_000, saves) {
                baseline = settledResidentKiB(store.daemon)
                say(String(format: "  soak: RSS after %d saves: %.1f MB", round + 1, Double(baseline) / 1024))
            }
        }
        let final = settledResidentKiB(store.daemon)
        say(String(format: "  soak: RSS after %d saves: %.1f MB", saves, Double(final) / 1024))
        let settingsNames = Set(listing(store.path("settings")) ?? [])
        let accountNames = Set(listing(store.path("accounts/\(Self.account)")) ?? [])
        let expectedSettings = Set(Self.keys.map { ($0 as NSString).lastPathComponent } + ["ActiveServiceAccountUUID", "IsFirstRun"])
        let expectedFields = Set(["label", "protocol", "server", "port", "path", "comment", "username", "password", "otp", "url", "attributes"])
        if settingsNames != expectedSettings { failures.append("settings/ lists \(settingsNames.symmetricDifference(expectedSettings)) too") }
        if accountNames != expectedFields { failures.append("the account lists \(accountNames.symmetricDifference(expectedFields)) too") }
        values.record(tried: saves, failures: failures)
        memory.record("\(saves) saves: \(baseline / 1024) MB after 1,000, \(final / 1024) MB after all",
                      final <= baseline + 2048 ? [] : ["grew \(final - baseline) KiB"])
    }

    /// The daemon's memory maps.
    func mapCount(_ pid: pid_t) -> Int {
        (try? String(contentsOfFile: "/proc/\(pid)/maps", encoding: .utf8))?.split(separator: "\n").count ?? 0
    }

    /// The daemon's resident memory once its delayed work (removals, checkpoints) is done.
    func settledResidentKiB(_ pid: pid_t) -> Int {
        usleep(1_500_000)
        guard let status = try? String(contentsOfFile: "/proc/\(pid)/status", encoding: .utf8),
              let line = status.split(separator: "\n").first(where: { $0.hasPrefix("VmRSS:") }) else { return 0 }
        return Int(line.split(separator: " ", omittingEmptySubsequences: true).dropFirst().first ?? "") ?? 0
    }

    // MARK: Unlock stall

    func unlockStall() throws {
        let stallScratch = Scratch("reliability-stall")
        defer { stallScratch.remove() }
        let store = try Store(in: stallScratch, kdf: "sensitive")
        defer { store.unmount() }
        try store.mount(unlocked: true)
        let account = store.path("accounts/\(Self.account)")
        guard mkdir(account, 0o700) == 0, writeFile(account + "/username", Array("someone\n".utf8)) == 0 else {
            throw SuiteError("set-up of the stall check failed")
        }
        guard store.lock() else { throw SuiteError("lock failed") }
        // `mtmfs unlock` in a child process: this one keeps asking meanwhile.
        let started = Date()
        let unlocking = Run.start(Run.mtmfs, ["unlock", "--passphrase-file", store.passphraseFile, store.mountPoint])
        let done = Locked(false)
        Threads.detach {
            _ = Run.wait(unlocking, timeout: 120)
            done.withLock { $0 = true }
        }
        var longest = 0.0, requests = 0, longestAt = 0.0
        var stat_ = stat()
        while !done.withLock({ $0 }) && Date().timeIntervalSince(started) < 60 {
            let before = Date()
            _ = listing(store.path("accounts"))
            _ = listing(account)
            _ = stat(account + "/username", &stat_)
            let took = Date().timeIntervalSince(before)
            if took > longest { (longest, longestAt) = (took, before.timeIntervalSince(started)) }
            requests += 3
        }
        let unlockSeconds = Date().timeIntervalSince(started)
        say(String(format: "  unlock stall: SENSITIVE unlock took %.2f s; %d requests meanwhile, longest %.1f ms (%.2f s in)",
                   unlockSeconds, requests, longest * 1000, longestAt))
        var problems: [String] = []
        if longest >= 0.1 { problems.append(String(format: "a request waited %.1f ms", longest * 1000)) }
        if requests < 10 { problems.append("only \(requests) requests during the unlock") }
        if readText(account + "/username") != "someone\n" { problems.append("the field does not read after the unlock") }
        stall.record("stat/ls during a SENSITIVE unlock", problems)
    }

    // MARK: Vault scale

    /// SPEC §2: 10,000 fully filled accounts unlock, serve and lock like a small vault. The
    /// vault gets them in saves of 1,000 through `Vault.addAccounts` (10,000 mkdirs would
    /// rewrite it 10,000 times), then is mounted unlocked.
    func vaultScale() throws {
        let scaleScratch = Scratch("reliability-vault-scale", in: access("/dev/shm", W_OK) == 0 ? "/dev/shm" : nil)
        defer { scaleScratch.remove() }
        let store = try Store(in: scaleScratch)
        let count = 10_000
        let name = { (index: Int) in String(format: "%08x-0000-4000-8000-%012x", index, index) }
        do {
            let vault = try Vault(path: store.dataDirectory + "/vault")
            try vault.unlock(passphrase: try SecureBytes(copying: Array(suitePassphrase.utf8)))
            for batch in stride(from: 0, to: count, by: 1_000) {
                let accounts = try (batch..<min(count, batch + 1_000)).map { index in
                    let values: [AccountField: String] = [
                        .label: "Account \(index)", .protocol: "https", .server: "host\(index).example.com", .port: "443",
                        .path: "/login", .comment: "account number \(index)", .username: "user\(index)@example.com",
                        .password: "pw-\(index)-correct-horse-battery-staple",
                    ]
                    return (uuid: AccountName.uuidBytes(name(index))!, name: name(index),
                            fields: try values.mapValues { text in try SecureBytes(copying: Array(text.utf8)) })
                }
                try vault.addAccounts(accounts)
            }
            vault.lock()
        } catch {
            throw SuiteError("building a vault of \(count) accounts: \(error)")
        }
        defer { store.unmount() }
        try store.mount(unlocked: true)
        let last = store.path("accounts/\(name(count - 1))")
        var problems: [String] = []
        if readText(last + "/password") != "pw-\(count - 1)-correct-horse-battery-staple\n" { problems.append("a field does not read") }
        if readText(last + "/url") != "https://host\(count - 1).example.com:443/login\n" { problems.append("url does not read") }
        let unlocked = settledResidentKiB(store.daemon), maps = mapCount(store.daemon)
        guard store.lock() else { throw SuiteError("lock failed") }
        let locked = settledResidentKiB(store.daemon)
        if readFile(last + "/password").error != EACCES { problems.append("a field reads after the lock") }
        say(String(format: "  vault scale: %d full accounts: %.1f MB unlocked, %d memory maps, %.1f MB locked again",
                   count, Double(unlocked) / 1024, maps, Double(locked) / 1024))
        if unlocked > 64 * 1024 { problems.append("\(unlocked / 1024) MB unlocked") }
        if maps >= 1_000 { problems.append("\(maps) memory maps") }
        if locked >= unlocked { problems.append("the lock gave nothing back (\(locked / 1024) MB)") }
        scale.record("\(count) full accounts", problems)
    }
}
