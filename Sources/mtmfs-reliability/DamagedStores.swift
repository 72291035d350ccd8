#if canImport(Glibc)
import Glibc
#endif
import CredentialVault
import CSodium
import Foundation
import Posix
import SettingsStore
import TestSupport

/// Damaged and tampered stores: each must give a clear error, never crash the daemon, never
/// be overwritten, and leave the other two stores working.
///
/// In-process (the store libraries, fast): every single-byte flip and every truncation of
/// a small vault; records swapped, dropped, copied from another vault or replayed, with the
/// checksum recomputed the way an attacker would; random, mutated, deeply nested and huge
/// plists. Through a mount (the daemon): vault flips and truncations, broken plists, and
/// SQLite files with a flipped byte in each page.
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

    // MARK: Vault, in process

    /// Opens and unlocks `bytes` as a vault: nil when it is refused as damaged, else what happened.
    func vaultOutcome(_ bytes: [UInt8]) -> String? {
        let path = scratch.sub("probe.vault")
        writeFile(path, bytes)
        do {
            let vault = try Vault(path: path)
            let passphrase = Array(suitePassphrase.utf8)
            let secret = passphrase.withUnsafeBytes { SecureBytes(copying: $0) }
            do {
                try vault.unlock(passphrase: secret)
                return "unlocked"
            } catch .damaged, .weakParameters {
                return nil
            } catch {
                return "unlock: \(error)"
            }
        } catch .damaged, .weakParameters {
            return nil
        } catch {
            return "open: \(error)"
        }
    }

    func vaultInProcess() -> Tally {
        let tally = Tally("damage: vault single-byte flips and truncations (in process)")
        let original = readFile(vaultPath).bytes ?? []
        tally.record("the undamaged vault", vaultOutcome(original) == "unlocked" ? [] : ["does not unlock"])
        for offset in original.indices {
            var bytes = original
            bytes[offset] ^= UInt8(1 + random.next() % 255)
            tally.record("flip at \(offset)", vaultOutcome(bytes).map { [$0] } ?? [])
        }
        for length in 0..<original.count {
            tally.record("truncated to \(length)", vaultOutcome(Array(original[..<length])).map { [$0] } ?? [])
        }
        return tally
    }

    // MARK: Vault tampering with a recomputed checksum

    /// Where each record lies (docs/vault-format.md): the whole record and its sealed part.
    struct RecordSpan { var whole: Range<Int>; var sealed: Range<Int> }

    static func records(_ bytes: [UInt8]) -> (spans: [RecordSpan], end: Int) {
        func u32(_ at: Int) -> Int { bytes[at..<at + 4].reduce(0) { $0 << 8 | Int($1) } }
        var spans: [RecordSpan] = []
        var at = 136
        for _ in 0..<u32(132) {
            let start = at
            let nameLength = Int(bytes[at + 16])
            let nonce = at + 17 + nameLength
            let length = u32(nonce + 24)
            at = nonce + 28 + length
            spans.append(RecordSpan(whole: start..<at, sealed: nonce..<at))
        }
        return (spans, at)
    }

    static func withChecksum(_ body: [UInt8]) -> [UInt8] {
        var hash = [UInt8](repeating: 0, count: 32)
        crypto_generichash(&hash, 32, body, UInt64(body.count), nil, 0)
        return body + hash
    }

    func vaultTampering() -> Tally {
        let tally = Tally("damage: vault records swapped, dropped, copied, replayed (checksum recomputed)")
        let original = readFile(vaultPath).bytes ?? []
        let body = Array(original.dropLast(32))
        let (spans, _) = Self.records(body)
        guard spans.count == 2 else {
            tally.record("parse", ["expected 2 records, found \(spans.count)"])
            return tally
        }
        tally.record("re-sealed checksum alone", vaultOutcome(Self.withChecksum(body)) == "unlocked" ? [] : ["the untouched body no longer unlocks"])
        // Swap the sealed parts (nonce, length, ciphertext) of the two records.
        var swapped = body
        let first = Array(body[spans[0].sealed]), second = Array(body[spans[1].sealed])
        swapped.replaceSubrange(spans[1].sealed, with: first)
        swapped.replaceSubrange(spans[0].sealed, with: second)
        tally.record("records swapped", vaultOutcome(Self.withChecksum(swapped)).map { [$0] } ?? [])
        // Drop the second record (count 1).
        var dropped = body
        dropped.removeSubrange(spans[1].whole)
        dropped[135] = 1
        tally.record("record dropped", vaultOutcome(Self.withChecksum(dropped)).map { [$0] } ?? [])
        // Append a copy of the first record under the second's place (a duplicate).
        var duplicated = body
        duplicated.replaceSubrange(spans[1].whole, with: body[spans[0].whole])
        tally.record("record duplicated", vaultOutcome(Self.withChecksum(duplicated)).map { [$0] } ?? [])
        // A record copied from another vault (same UUID, other store id, other passphrase key).
        do {
            let other = try makeStore(name: "other", fields: ["password": "alpha", "username": "ann"])
            let otherBody = Array((readFile(other.dataDirectory + "/vault").bytes ?? []).dropLast(32))
            let otherSpans = Self.records(otherBody).spans
            var copied = body
            copied.replaceSubrange(spans[0].sealed, with: otherBody[otherSpans[0].sealed])
            tally.record("record copied from another vault", vaultOutcome(Self.withChecksum(copied)).map { [$0] } ?? [])
            // The other vault's manifest and records, with this vault's header.
            var transplanted = Array(body[..<136]) + Array(otherBody[136...])
            transplanted = Self.withChecksum(transplanted)
            tally.record("records and manifest of another vault", vaultOutcome(transplanted).map { [$0] } ?? [])
        } catch {
            tally.record("other vault", ["\(error)"])
        }
        // An older version of a record replayed: change a field, then put the old record back.
        do {
            try base.mount()
            let changed = writeFile(base.path("accounts/\(uuidA)/password"), Array("beta\n".utf8))
            base.unmount()
            guard changed == 0 else { throw SuiteError("cannot change a field") }
            let newer = Array((readFile(vaultPath).bytes ?? []).dropLast(32))
            let newerSpans = Self.records(newer).spans
            var replayed = newer
            replayed.replaceSubrange(newerSpans[0].sealed, with: body[spans[0].sealed])
            tally.record("older record replayed", vaultOutcome(Self.withChecksum(replayed)).map { [$0] } ?? [])
            var replayedAll = Array(body)
            replayedAll = Self.withChecksum(replayedAll)
            tally.record("whole older vault (a rollback: accepted, it is a valid vault)", vaultOutcome(replayedAll) == "unlocked" ? [] : ["refused"])
        } catch {
            tally.record("replay", ["\(error)"])
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
            switch file {
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
            if file != "vault" && listing(store.path("accounts")) == nil { problems.append("accounts/ broken") }
            if file != "vault" && unlocked == false { problems.append("unlock failed on an undamaged vault") }
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

    func vaultThroughMount() -> Tally {
        let tally = Tally("damage: vault flips and truncations through a mount")
        let size = (readFile(vaultPath).bytes ?? []).count
        let step = short ? 29 : 1
        for offset in stride(from: 0, to: size, by: step) {
            let mask = UInt8(1 + random.next() % 255)
            tally.record("flip at \(offset)", mountDamaged("flip", file: "vault") { bytes in
                var bytes = bytes
                bytes[offset] ^= mask
                return bytes
            })
        }
        for length in stride(from: 0, to: size, by: short ? 97 : 7) {
            tally.record("truncated to \(length)", mountDamaged("truncate", file: "vault") { Array($0.prefix(length)) })
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
