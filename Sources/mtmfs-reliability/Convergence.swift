#if canImport(Glibc)
import Glibc
#endif
import Foundation
import Posix
import TestSupport

/// SPEC §2b through real mounts: three machines (data directories, each mounted and
/// unlocked) make random changes apart — fields written, accounts made and removed (`rm
/// -r`), conflicts resolved by writing the value shown — and are kept in step in random
/// orders and pairs: a synchroniser's copy of the files one lacks (under a temporary name,
/// then renamed, the sender's own deletions carried too, as Syncthing does) or `mtmfs sync`
/// through a shared bare git remote. After a full round every machine shows the same
/// accounts, and every value written is shown, among its field's `conflicts/`, replaced by
/// a write that had seen it, or removed by a removal that had seen it. A failure prints the
/// seed and the steps.
final class Convergence {
    let seeds: Int
    let steps: Int
    var random: SplitMix
    let tally = Tally("convergence (3 machines, random changes apart, synced by copies and by git: same accounts, no value lost)")

    static let names = ["6ba7b810-9dad-41d1-80b4-00c04fd430c8", "0f8fad5b-d9cb-469f-a165-70867728950e",
                        "7c9e6679-7425-40de-944b-e07fc1f90ae7", "16fd2706-8baf-433b-82eb-8c7fada847da"]
    static let fields = ["label", "username", "password", "comment"]

    init(seeds: Int, steps: Int, seed: UInt64) {
        (self.seeds, self.steps) = (seeds, steps)
        random = SplitMix(seed: seed)
    }

    func run() -> Tally {
        for _ in 0..<seeds {
            let seed = random.next()
            let scratch = Scratch("reliability-convergence")
            defer { scratch.remove() }
            do {
                tally.record("seed \(seed)", try round(seed: seed, scratch: scratch))
            } catch {
                tally.record("seed \(seed)", ["set-up: \(error)"])
            }
        }
        return tally
    }

    /// One value written: its account and field, and which earlier values its writer had.
    struct Written {
        let account: String, field: String, value: String
        let seen: Set<String>
    }

    struct Removal {
        let account: String
        let seen: Set<String>
    }

    func round(seed: UInt64, scratch: Scratch) throws -> [String] {
        var random = SplitMix(seed: seed)
        let first = try Store(in: scratch)
        let machines = [first, try Store(copying: first, in: scratch, name: "m1"), try Store(copying: first, in: scratch, name: "m2")]
        defer { machines.forEach { $0.unmount() } }
        let remote = scratch.sub("vault.git")
        guard Run.program("git", ["init", "-q", "--bare", remote]).status == 0 else { throw SuiteError("git init --bare failed") }
        for machine in machines {
            try machine.mount()
            let vault = machine.dataDirectory + "/vault"
            if !FileManager.default.fileExists(atPath: vault + "/.git") {
                _ = Run.program("git", ["-C", vault, "init", "-q", "-b", "main"])
            }
            guard Run.program("git", ["-C", vault, "remote", "add", "origin", remote]).status == 0 else {
                throw SuiteError("git remote add failed")
            }
        }
        var written: [Written] = []
        var removals: [Removal] = []
        // What each machine holds (its values, by text): what a write or a removal there has seen.
        var known: [Set<String>] = Array(repeating: [], count: 3)
        var hub: Set<String> = []  // what the bare remote holds
        var log: [String] = []
        var problems: [String] = []
        func note(_ line: String) { log.append(line) }

        for step in 0..<steps {
            let m = Int(random.next() % 3), machine = machines[m]
            let name = Self.names[Int(random.next() % UInt64(Self.names.count))]
            let account = machine.path("accounts/\(name)")
            switch random.next() % 100 {
            case 0..<40:
                if !FileManager.default.fileExists(atPath: account) {
                    guard mkdir(account, 0o700) == 0 else { problems.append("step \(step): mkdir \(name) on m\(m): errno \(errno)"); continue }
                    note("\(step) m\(m) mkdir \(name.prefix(4))")
                }
                let field = Self.fields[Int(random.next() % UInt64(Self.fields.count))]
                let value = "s\(step)m\(m)"
                let error = writeFile(account + "/" + field, Array((value + "\n").utf8))
                guard error == 0 else { problems.append("step \(step): write \(name)/\(field) on m\(m): errno \(error)"); continue }
                written.append(Written(account: name, field: field, value: value, seen: known[m]))
                known[m].insert(value)
                note("\(step) m\(m) \(name.prefix(4))/\(field)=\(value)")
            case 40..<52:
                guard FileManager.default.fileExists(atPath: account) else { continue }
                let removed = Run.program("rm", ["-r", account])
                guard removed.status == 0 else { problems.append("step \(step): rm -r \(name) on m\(m): \(removed.stderr)"); continue }
                removals.append(Removal(account: name, seen: known[m]))
                note("\(step) m\(m) rm -r \(name.prefix(4))")
            case 52..<62:
                // A conflict resolved: a new value written over the field (it has seen every
                // value this machine holds).
                guard let field = Self.fields.first(where: { FileManager.default.fileExists(atPath: account + "/conflicts/" + $0) }) else { continue }
                let value = "r\(step)m\(m)"
                guard writeFile(account + "/" + field, Array((value + "\n").utf8)) == 0 else { continue }
                written.append(Written(account: name, field: field, value: value, seen: known[m]))
                known[m].insert(value)
                note("\(step) m\(m) resolve \(name.prefix(4))/\(field) with \(value)")
            case 62..<88:
                let other = (m + 1 + Int(random.next() % 2)) % 3
                copyFiles(from: machines[m], to: machines[other])
                known[other].formUnion(known[m])
                if random.next() % 2 == 0 {
                    copyFiles(from: machines[other], to: machines[m])
                    known[m].formUnion(known[other])
                }
                note("\(step) copy m\(m) ↔ m\(other)")
            default:
                let synced = Run.program(Run.mtmfs, ["sync", machine.mountPoint])
                guard synced.status == 0 else { problems.append("step \(step): mtmfs sync on m\(m): \(synced.stderr)"); continue }
                hub.formUnion(known[m])
                known[m].formUnion(hub)
                note("\(step) m\(m) mtmfs sync")
            }
        }
        // A full round: every machine syncs with the hub twice, then copies to every other.
        for _ in 0..<2 {
            for machine in machines {
                let synced = Run.program(Run.mtmfs, ["sync", machine.mountPoint])
                if synced.status != 0 { problems.append("final mtmfs sync: \(synced.stderr)") }
            }
        }
        for a in machines { for b in machines where a !== b { copyFiles(from: a, to: b) } }
        let states = machines.map(state)
        for index in 1..<3 where states[index] != states[0] {
            problems.append("m\(index) differs from m0:\n  m0: \(states[0])\n  m\(index): \(states[index])")
        }
        // Every value written: shown, a conflict, replaced by one that had seen it, or removed.
        let shown = states[0]
        for value in written {
            if shown.contains("\(value.account.prefix(8))/\(value.field)=\(value.value)") || shown.contains("\(value.account.prefix(8))/\(value.field)~\(value.value)") { continue }
            if written.contains(where: { $0.account == value.account && $0.field == value.field && $0.value != value.value && $0.seen.contains(value.value) }) { continue }
            if removals.contains(where: { $0.account == value.account && $0.seen.contains(value.value) }) { continue }
            problems.append("\(value.account.prefix(8))/\(value.field)=\(value.value) is lost")
        }
        if !problems.isEmpty { problems.append("steps:\n" + log.joined(separator: "\n")) }
        return problems
    }

    /// What a synchroniser does: every change file `to` lacks, under a temporary name first,
    /// then renamed; the files of the sender's own device that it no longer has (a fold)
    /// deleted. Then waits until `to`'s mount has read them.
    func copyFiles(from: Store, to: Store) {
        let source = from.dataDirectory + "/vault", target = to.dataDirectory + "/vault"
        let files = Set(((try? FileManager.default.subpathsOfDirectory(atPath: source)) ?? []).filter { $0.hasSuffix(".mtv") && !$0.hasPrefix(".") })
        for relative in files.sorted() where !FileManager.default.fileExists(atPath: target + "/" + relative) {
            let folder = (target + "/" + relative as NSString).deletingLastPathComponent
            try? FileManager.default.createDirectory(atPath: folder, withIntermediateDirectories: true)
            let temporary = folder + "/.syncthing." + (relative as NSString).lastPathComponent + ".tmp"
            guard (try? FileManager.default.copyItem(atPath: source + "/" + relative, toPath: temporary)) != nil else { continue }
            try? FileManager.default.moveItem(atPath: temporary, toPath: target + "/" + relative)
        }
        if let device = deviceID(from) {
            for entry in (try? FileManager.default.contentsOfDirectory(atPath: target + "/" + device)) ?? []
            where entry.hasSuffix(".mtv") && !files.contains(device + "/" + entry) {
                try? FileManager.default.removeItem(atPath: target + "/" + device + "/" + entry)
            }
        }
        waitUntilRead(to)
    }

    func deviceID(_ store: Store) -> String? {
        (try? String(contentsOfFile: store.dataDirectory + "/device", encoding: .utf8))?.split(separator: "\n")
            .first { $0.hasPrefix("device ") }.map { String($0.dropFirst(7)) }
    }

    /// Until the mount's loaded and skipped files add up to the folder's (at most 5 s).
    func waitUntilRead(_ store: Store) {
        let folder = store.dataDirectory + "/vault"
        _ = Poll.until(seconds: 5) {
            let onDisk = ((try? FileManager.default.subpathsOfDirectory(atPath: folder)) ?? []).filter { $0.hasSuffix(".mtv") }.count
            let status = store.status()
            return (Int(status["vault_files"] ?? "") ?? 0) + (Int(status["vault_skipped"] ?? "") ?? 0) >= onDisk
        }
    }

    /// A machine's accounts as one line: each account's fields (`=` the value shown, `~`
    /// each other value) and whether a removal of it lost.
    func state(_ store: Store) -> String {
        waitUntilRead(store)
        let names = ((try? FileManager.default.contentsOfDirectory(atPath: store.path("accounts"))) ?? []).filter { $0.count == 36 }.sorted()
        return names.map { name in
            let account = store.path("accounts/\(name)")
            var parts = Self.fields.map { field -> String in
                let value = readText(account + "/" + field).map { String($0.dropLast()) } ?? "?"
                let others = (readText(account + "/conflicts/" + field) ?? "").split(separator: "\n")
                    .map { String($0.prefix { $0 != "\t" }) }.sorted()
                return "\(name.prefix(8))/\(field)=\(value)" + others.map { "\(name.prefix(8))/\(field)~\($0)" }.joined()
            }
            if FileManager.default.fileExists(atPath: account + "/conflicts/removed") { parts.append("removal-lost") }
            return parts.joined(separator: " ")
        }.joined(separator: " | ")
    }
}
