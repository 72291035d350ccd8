#if canImport(Glibc)
import Glibc
#endif
import CredentialVault
import SecureMemory
import CSodium
import Foundation
import Posix
import SettingsStore
import TestSupport

/// Damaged and tampered stores: each must give a clear error, never crash the daemon, never
/// be overwritten, and leave the other two stores working.
///
/// In-process (the store libraries, fast): every single-byte flip and every truncation of
/// a change file of the vault folder (skipped, the rest loads); change files renamed,
/// moved, replayed, withheld or copied from another vault, and another vault's id; random,
/// mutated, deeply nested and huge plists. Through a mount (the daemon): the vault's id and
/// a change file damaged, broken plists, and SQLite files with a flipped byte in each page.
final class DamagedStores {
    let short: Bool
    var random: SplitMix
    let scratch = Scratch("reliability-damage")
    /// The directories of the stores `makeStore` made, removed with the part's own.
    var storeScratches: [Scratch] = []
    var base: Store!
    let uuidA = "3f2504e0-4f89-41d3-9a0c-0305e82c3301"
    let uuidB = "3f2504e0-4f89-41d3-9a0c-0305e82c3302"

    init(short: Bool, seed: UInt64) {
        self.short = short
        random = SplitMix(seed: seed)
    }

    func run() -> [Tally] {
        defer {
            scratch.remove()
            for store in storeScratches { store.remove() }
        }
        let setUp = Tally("damage: set-up")
        do {
            base = try makeStore(name: "base", fields: ["password": "alpha", "username": "ann"])
        } catch {
            setUp.record("base store", ["\(error)"])
            return [setUp]
        }
        return [vaultInProcess(), vaultTampering(), vaultThroughMount(), plistInProcess(), plistThroughMount(), sqliteThroughMount()]
    }

    /// A store with two accounts and a few cache files, unmounted.
    func makeStore(name: String, fields: [String: String]) throws -> Store {
        let sub = Scratch("reliability-damage-\(name)")
        storeScratches.append(sub)
        let store = try Store(in: sub)
        try store.mount()
        defer { store.unmount() }
        for uuid in [uuidA, uuidB] {
            guard mkdir(store.path("accounts/\(uuid)"), 0o700) == 0 else { throw SuiteError("mkdir account") }
            for (field, value) in fields where writeFile(store.path("accounts/\(uuid)/\(field)"), Array((value + "\n").utf8)) != 0 {
                throw SuiteError("write \(field)")
            }
        }
        mkdir(store.path("cache/dir"), 0o755)
        for index in 0..<12 {
            guard writeFile(store.path("cache/dir/f\(index)"), Workload.cacheContent(index, size: index * 9_000), sync: true) == 0 else {
                throw SuiteError("write cache")
            }
        }
        return store
    }

    var vaultPath: String { base.dataDirectory + "/vault" }

    /// The base vault's change files (relative to its folder), oldest first.
    func changeFiles(_ folder: String) -> [String] {
        ((try? FileManager.default.subpathsOfDirectory(atPath: folder)) ?? []).filter { $0.hasSuffix(".mtv") }.sorted()
    }

    // MARK: Vault, in process

    /// The base vault's master key, unwrapped once (the probes then need no key derivation).
    lazy var masterKey: SecureBytes? = {
        guard let passphrase = try? SecureBytes(copying: Array(suitePassphrase.utf8)) else { return nil }
        return try? VaultFolder(path: vaultPath, deviceFile: scratch.sub("probe-device")).masterKey(passphrase: passphrase)
    }()

    /// A copy of the base folder with `damage` done to it, opened and unlocked with the
    /// master key: nil when what happened is what must (`expect`), else what did.
    func folderOutcome(_ damage: (String) -> Void, expect: (VaultFolder?, [[UInt8]: VaultMerge.Account]) -> String?) -> String? {
        let probe = scratch.sub("probe-\(random.next() % 1_000_000_000)")
        defer { try? FileManager.default.removeItem(atPath: probe) }
        guard (try? FileManager.default.copyItem(atPath: vaultPath, toPath: probe)) != nil, let key = masterKey else { return "no copy or key" }
        damage(probe)
        let folder: VaultFolder
        do {
            folder = try VaultFolder(path: probe, deviceFile: probe + ".device")
            try folder.open(with: key, arena: SecureArena())
        } catch .damaged, .weakParameters {
            return expect(nil, [:])
        } catch {
            return "open: \(error)"
        }
        defer { folder.close() }
        return expect(folder, VaultMerge.accounts(folder.changes))
    }

    /// A damaged change file is skipped (and named); every other file still loads.
    func skippedAlone(_ relative: String) -> (VaultFolder?, [[UInt8]: VaultMerge.Account]) -> String? {
        { folder, _ in
            guard let folder else { return "the whole vault refused" }
            return folder.skipped[relative] == nil ? "loaded" : nil
        }
    }

    func vaultInProcess() -> Tally {
        let tally = Tally("damage: change-file single-byte flips and truncations (in process)")
        let files = changeFiles(vaultPath)
        guard let target = files.last, let original = readFile(vaultPath + "/" + target).bytes else {
            tally.record("the base vault", ["no change file"])
            return tally
        }
        tally.record("the undamaged vault", folderOutcome({ _ in }, expect: { folder, accounts in
            folder?.skipped.isEmpty == true && accounts.count == 2 ? nil : "does not load whole"
        }).map { [$0] } ?? [])
        let step = short ? 5 : 1
        for offset in stride(from: 0, to: original.count, by: step) {
            var bytes = original
            bytes[offset] ^= UInt8(1 + random.next() % 255)
            tally.record("flip at \(offset)", folderOutcome({ writeFile($0 + "/" + target, bytes) }, expect: skippedAlone(target)).map { [$0] } ?? [])
        }
        for length in stride(from: 0, to: original.count, by: step) {
            tally.record("truncated to \(length)", folderOutcome({ writeFile($0 + "/" + target, Array(original[..<length])) },
                                                            expect: skippedAlone(target)).map { [$0] } ?? [])
        }
        return tally
    }

    // MARK: Vault tampering

    func vaultTampering() -> Tally {
        let tally = Tally("damage: vault files renamed, moved, copied from another vault, withheld, replayed")
        let files = changeFiles(vaultPath)
        guard files.count >= 2, let last = files.last else {
            tally.record("parse", ["expected change files, found \(files.count)"])
            return tally
        }
        let device = String(last.split(separator: "/")[0])
        let name = String(last.split(separator: "/")[1])
        // The same clock, another random part: a name its header does not match.
        let renamed = device + "/" + String(name.prefix(17)) + "00000000.mtv"
        tally.record("a change file renamed", folderOutcome({ folder in
            try? FileManager.default.moveItem(atPath: folder + "/" + last, toPath: folder + "/" + renamed)
        }, expect: skippedAlone(renamed)).map { [$0] } ?? [])
        let moved = "0123456789abcdef/" + name
        tally.record("a change file moved to another device", folderOutcome({ folder in
            try? FileManager.default.createDirectory(atPath: folder + "/0123456789abcdef", withIntermediateDirectories: true)
            try? FileManager.default.moveItem(atPath: folder + "/" + last, toPath: folder + "/" + moved)
        }, expect: skippedAlone(moved)).map { [$0] } ?? [])
        let replayed = device + "/" + String(name.prefix(17)) + "ffffffff.mtv"
        tally.record("a change file replayed under another name", folderOutcome({ folder in
            try? FileManager.default.copyItem(atPath: folder + "/" + files[0], toPath: folder + "/" + replayed)
        }, expect: skippedAlone(replayed)).map { [$0] } ?? [])
        tally.record("a change file withheld (deleted): the rest loads", folderOutcome({ folder in
            try? FileManager.default.removeItem(atPath: folder + "/" + last)
        }, expect: { folder, _ in folder?.skipped.isEmpty == true ? nil : "refused or skipped" }).map { [$0] } ?? [])
        do {
            let other = try makeStore(name: "other", fields: ["password": "alpha", "username": "ann"])
            let otherFolder = other.dataDirectory + "/vault"
            let foreign = changeFiles(otherFolder).last ?? ""
            tally.record("a change file copied from another vault", folderOutcome({ folder in
                try? FileManager.default.createDirectory(atPath: folder + "/" + String(foreign.split(separator: "/")[0]), withIntermediateDirectories: true)
                try? FileManager.default.copyItem(atPath: otherFolder + "/" + foreign, toPath: folder + "/" + foreign)
            }, expect: skippedAlone(foreign)).map { [$0] } ?? [])
            tally.record("the id of another vault", folderOutcome({ folder in
                writeFile(folder + "/id", readFile(otherFolder + "/id").bytes ?? [])
            }, expect: { folder, accounts in
                guard let folder else { return nil }
                return accounts.values.contains { !$0.fields.isEmpty } || folder.skipped.count < self.changeFiles(folder.path).count ? "files opened under another vault's id" : nil
            }).map { [$0] } ?? [])
        } catch {
            tally.record("other vault", ["\(error)"])
        }
        return tally
    }

    // MARK: Through a mount

    /// Mounts a copy of the base store with `damage` applied to one file, then checks: the
    /// daemon runs, the damaged store answers EIO (or works, when `mayWork`), the others work,
    /// and a store reported as damaged is byte-for-byte untouched after the unmount.
    func mountDamaged(_ label: String, file: String, mayWork: Bool = false, _ damage: ([UInt8]) -> [UInt8]) -> [String] {
        var problems: [String] = []
        do {
            let name = "case-\(random.next() % 1_000_000_000)"
            let store = try Store(copying: base, in: scratch, name: name)
            defer {
                store.unmount()
                try? FileManager.default.removeItem(atPath: store.dataDirectory)
                rmdir(store.mountPoint)
            }
            let path = store.dataDirectory + "/" + file
            let damaged = damage(readFile(path).bytes ?? [])
            writeFile(path, damaged)
            try store.mount(unlocked: false)
            let unlocked = store.unlock()
            // The damaged store.
            var failed = false
            switch file.split(separator: "/").first.map(String.init) ?? file {
            case "vault" where file == "vault/id" && Self.isVaultID(damaged):
                // Still an id, another one (a flip of one hex digit into another): the vault
                // of that id, whose slots and files open under none (vault-format-3.md §8:
                // unlock says a wrong passphrase, nothing is read).
                if unlocked { problems.append("unlock succeeded under another vault's id") }
                if readFile(store.path("accounts/\(uuidA)/password")).bytes != nil { problems.append("a field reads under another vault's id") }
            case "vault":
                let listed = listing(store.path("accounts"))
                let read = readFile(store.path("accounts/\(uuidA)/password"))
                failed = listed == nil || read.error == EIO
                if !failed && !mayWork { problems.append("accounts/ works on a damaged vault") }
                if unlocked && !mayWork { problems.append("unlock succeeded") }
                if failed && store.status()["vault_error"] == nil { problems.append("status names no vault error") }
            case "Settings.plist":
                let listed = listing(store.path("settings"))
                failed = listed == nil
                if failed && errno != EIO { problems.append("settings/ gave \(errnoName(errno)), not EIO") }
                if !failed && !mayWork { problems.append("settings/ works on a damaged plist") }
            default:
                var errors = 0
                if let names = listing(store.path("cache/dir")) {
                    for name in names where readFile(store.path("cache/dir/" + name)).bytes == nil { errors += 1 }
                } else {
                    errors += 1
                }
                failed = errors > 0
            }
            // The daemon and the other stores.
            if !ProcessState.isRunning(store.daemon) { problems.append("the daemon died") }
            if file != "Settings.plist" && readText(store.path("settings/IsFirstRun")) == nil { problems.append("settings/ broken") }
            if !file.hasPrefix("vault") && listing(store.path("accounts")) == nil { problems.append("accounts/ broken") }
            if (!file.hasPrefix("vault") || mayWork) && unlocked == false { problems.append("unlock failed on an undamaged vault") }
            if file != "cache.sqlite" {
                let error = writeFile(store.path("cache/probe"), Array("x".utf8), sync: true)
                if error != 0 || readText(store.path("cache/probe")) != "x" { problems.append("cache/ broken") }
            }
            store.unmount()
            if failed && readFile(path).bytes != damaged { problems.append("the damaged \(file) was rewritten") }
        } catch {
            problems.append("\(error)")
        }
        return problems
    }

    /// Whether `bytes` is a vault id file: 32 hex digits, in either case, and one `\n` or none.
    static func isVaultID(_ bytes: [UInt8]) -> Bool {
        let digits = bytes.last == 0x0A ? bytes.dropLast() : bytes[...]
        return digits.count == 32 && digits.allSatisfy { (0x30...0x39).contains($0) || (0x41...0x46).contains($0) || (0x61...0x66).contains($0) }
    }

    /// Through a mount: the folder's id damaged (nothing opens: EIO, the status says why)
    /// and a change file damaged (skipped: the mount unlocks and serves the rest).
    func vaultThroughMount() -> Tally {
        let tally = Tally("damage: vault id and change-file flips and truncations through a mount")
        for offset in stride(from: 0, to: 33, by: short ? 11 : 1) {
            let mask = UInt8(1 + random.next() % 255)
            tally.record("id flip at \(offset)", mountDamaged("flip", file: "vault/id") { bytes in
                var bytes = bytes
                guard offset < bytes.count else { return bytes }
                // (Not a letter's other case: the id is read in either case, the same id.)
                let lower = { (c: UInt8) in c >= 0x41 && c <= 0x5A ? c + 0x20 : c }
                bytes[offset] ^= lower(bytes[offset] ^ mask) == lower(bytes[offset]) ? mask ^ 0x01 : mask
                return bytes
            })
        }
        tally.record("id truncated", mountDamaged("truncate", file: "vault/id") { Array($0.prefix(20)) })
        guard let target = changeFiles(vaultPath).last else {
            tally.record("change files", ["none"])
            return tally
        }
        let size = (readFile(vaultPath + "/" + target).bytes ?? []).count
        for offset in stride(from: 0, to: size, by: short ? 97 : 7) {
            let mask = UInt8(1 + random.next() % 255)
            tally.record("change file flip at \(offset)", mountDamaged("flip", file: "vault/" + target, mayWork: true) { bytes in
                var bytes = bytes
                bytes[offset] ^= mask
                return bytes
            })
        }
        return tally
    }

    // MARK: Plists

    func plistOutcome(_ bytes: [UInt8]) -> String? {
        let started = Date()
        _ = try? PropertyList.decode(bytes)
        let took = Date().timeIntervalSince(started)
        return took > 2 ? "decoding took \(took) s" : nil
    }

    static func deepXML(_ depth: Int) -> [UInt8] {
        Array(("<?xml version=\"1.0\" encoding=\"UTF-8\"?><plist version=\"1.0\"><dict><key>K</key>"
               + String(repeating: "<array>", count: depth) + String(repeating: "</array>", count: depth)
               + "</dict></plist>").utf8)
    }

    /// A binary plist of `depth` nested one-element arrays (object i holds object i+1),
    /// with 4-byte offsets and object references.
    static func deepBinary(_ depth: Int) -> [UInt8] {
        func big(_ value: Int, _ width: Int) -> [UInt8] { (0..<width).reversed().map { UInt8(value >> ($0 * 8) & 0xFF) } }
        var bytes = Array("bplist00".utf8)
        var offsets: [Int] = []
        for index in 0..<depth {
            offsets.append(bytes.count)
            bytes += index == depth - 1 ? [0xA0] : [0xA1] + big(index + 1, 4)
        }
        let table = bytes.count
        for offset in offsets { bytes += big(offset, 4) }
        return bytes + [0, 0, 0, 0, 0, 0, 4, 4] + big(depth, 8) + big(0, 8) + big(table, 8)
    }

    func plistInProcess() -> Tally {
        let tally = Tally("damage: plists decoded in process (random, flipped, deep, huge)")
        let xml = readFile(base.dataDirectory + "/Settings.plist").bytes ?? []
        let binary: [UInt8] = (try? PropertyList.decode(xml)).map { PropertyList.encode($0.0, as: .binary) } ?? []
        let randomCount = short ? 300 : 5_000
        for index in 0..<randomCount {
            let length = Int(random.next() % 2_048)
            var bytes = (0..<length).map { _ in UInt8(truncatingIfNeeded: random.next()) }
            switch index % 3 {
            case 0: bytes = Array("bplist00".utf8) + bytes
            case 1: bytes = Array("<?xml version=\"1.0\"?><plist><dict>".utf8) + bytes
            default: break
            }
            tally.record("random \(index)", plistOutcome(bytes).map { [$0] } ?? [])
        }
        for (name, original) in [("XML", xml), ("binary", binary)] {
            for offset in original.indices {
                var bytes = original
                bytes[offset] ^= UInt8(1 + random.next() % 255)
                tally.record("\(name) flip at \(offset)", plistOutcome(bytes).map { [$0] } ?? [])
            }
            for length in 0..<original.count {
                tally.record("\(name) truncated to \(length)", plistOutcome(Array(original.prefix(length))).map { [$0] } ?? [])
            }
        }
        for depth in [600, 10_000, 200_000] {
            for (name, bytes) in [("XML", Self.deepXML(depth)), ("binary", Self.deepBinary(depth))] {
                var problems = plistOutcome(bytes).map { [$0] } ?? []
                if (try? PropertyList.decode(bytes)) != nil { problems.append("accepted \(depth) levels") }
                tally.record("\(name) nested \(depth) deep", problems)
            }
        }
        let huge = Array("<?xml version=\"1.0\"?><plist version=\"1.0\"><dict><key>K</key><string>".utf8)
            + [UInt8](repeating: 0x61, count: 64 << 20) + Array("</string></dict></plist>".utf8)
        tally.record("64 MiB string value", plistOutcome(huge).map { [$0] } ?? [])
        return tally
    }

    func plistThroughMount() -> Tally {
        let tally = Tally("damage: broken Settings.plist through a mount")
        var cases: [(String, [UInt8])] = [
            ("empty", []),
            ("random bytes", (0..<4_096).map { _ in UInt8(truncatingIfNeeded: random.next()) }),
            ("XML nested 100000 deep", Self.deepXML(100_000)),
            ("binary nested 100000 deep", Self.deepBinary(100_000)),
            ("bplist header only", Array("bplist00".utf8)),
            ("not a dictionary", Array("<?xml version=\"1.0\"?><plist version=\"1.0\"><array/></plist>".utf8)),
        ]
        let xml = readFile(base.dataDirectory + "/Settings.plist").bytes ?? []
        for length in stride(from: 1, to: xml.count, by: short ? 61 : 13) { cases.append(("truncated to \(length)", Array(xml.prefix(length)))) }
        for (label, bytes) in cases {
            tally.record(label, mountDamaged(label, file: "Settings.plist", mayWork: label.hasPrefix("truncated")) { _ in bytes })
        }
        return tally
    }

    // MARK: SQLite

    func sqliteThroughMount() -> Tally {
        let tally = Tally("damage: cache.sqlite with a flipped byte in each page, through a mount")
        Run.program("sqlite3", [base.dataDirectory + "/cache.sqlite", "PRAGMA wal_checkpoint(TRUNCATE)"])
        let size = (readFile(base.dataDirectory + "/cache.sqlite").bytes ?? []).count
        let pages = size / 4_096
        let chosen = short ? Array(stride(from: 0, to: pages, by: max(1, pages / 10))) : Array(0..<pages)
        for page in chosen {
            for spot in [16, 100, 2_048] where page > 0 || spot == 16 || spot == 100 {
                let offset = page * 4_096 + spot
                let mask = UInt8(1 + random.next() % 255)
                tally.record("page \(page) byte \(spot)", mountDamaged("page", file: "cache.sqlite", mayWork: true) { bytes in
                    var bytes = bytes
                    if offset < bytes.count { bytes[offset] ^= mask }
                    return bytes
                })
            }
        }
        tally.record("random bytes", mountDamaged("random", file: "cache.sqlite") { bytes in
            bytes.map { _ in UInt8(truncatingIfNeeded: self.random.next()) }
        })
        return tally
    }
}
