import CSodium
@testable import CredentialVault
import SecureMemory
import Foundation
import Testing

func secret(_ text: String) -> SecureBytes { try! SecureBytes(copying: Array(text.utf8)) }
func text(_ bytes: SecureBytes) -> String { bytes.withUnsafeBytes { String(decoding: $0, as: UTF8.self) } }

/// Counts up from 0: the deterministic source of the format's test vector.
final class CountingRandom: RandomSource, @unchecked Sendable {
    var next: UInt8 = 0
    func bytes(_ count: Int) -> [UInt8] {
        (0..<count).map { _ in defer { next &+= 1 }; return next }
    }
}

let uuidA = "6BA7B810-9DAD-11D1-80B4-00C04FD430C8"
let uuidB = "f47ac10b-58cc-4372-a567-0e02b2c3d479"

@Suite struct VaultTests {
    func temporaryPath() -> String {
        FileManager.default.temporaryDirectory.appendingPathComponent("mtmfs-vault-\(UUID().uuidString)").path
    }

    func makeVault(_ path: String) throws -> Vault {
        let vault = try Vault.create(at: path, passphrase: secret("correct horse"), parameters: .interactive)
        try vault.addAccount(uuid: AccountName.uuidBytes(uuidA)!, name: uuidA)
        try vault.setFields([.username: secret("alice"), .password: secret("s3cret-Pa55"), .server: secret("mail.example.com")],
                            of: AccountName.uuidBytes(uuidA)!)
        try vault.addAccount(uuid: AccountName.uuidBytes(uuidB)!, name: uuidB)
        try vault.setFields([.password: secret("hunter2-bis")], of: AccountName.uuidBytes(uuidB)!)
        return vault
    }

    @Test func roundTripLockedAndUnlocked() throws {
        let path = temporaryPath()
        defer { unlink(path) }
        _ = try makeVault(path)
        let vault = try Vault(path: path)
        #expect(!vault.isUnlocked)
        #expect(vault.accounts.map(\.name) == [uuidA, uuidB])
        #expect(throws: VaultError.locked) { try vault.field(.password, of: AccountName.uuidBytes(uuidA)!) }
        #expect(throws: VaultError.wrongPassphrase) { try vault.unlock(passphrase: secret("wrong horse")) }
        #expect(!vault.isUnlocked)
        try vault.unlock(passphrase: secret("correct horse"))
        #expect(text(try vault.field(.password, of: AccountName.uuidBytes(uuidA)!)) == "s3cret-Pa55")
        #expect(text(try vault.field(.username, of: AccountName.uuidBytes(uuidA)!)) == "alice")
        #expect(text(try vault.field(.label, of: AccountName.uuidBytes(uuidA)!)) == "")
        let held = try vault.field(.password, of: AccountName.uuidBytes(uuidB)!)
        vault.lock()
        #expect(held.isWiped, "lock must zero and free every decrypted field")
        #expect(throws: VaultError.locked) { try vault.field(.password, of: AccountName.uuidBytes(uuidB)!) }
        var st = stat()
        #expect(stat(path, &st) == 0 && st.st_mode & 0o777 == 0o600)
    }

    /// 10,000 accounts unlock: found by the benchmark's W3, unlocking them made 80,000
    /// secure allocations (one per field, set or not), ran into vm.max_map_count and
    /// crashed the daemon on a precondition. Unset fields now take no allocation, and a
    /// failed allocation is an error (ENOMEM), not a crash.
    @Test func manyAccountsAtOnceAreAllOrNothing() throws {
        let path = temporaryPath()
        defer { unlink(path) }
        let vault = try makeVault(path)
        let names = (0..<10_000).map { String(format: "00000000-0000-4000-8000-%012d", $0) }
        try vault.addAccounts(names.map { (AccountName.uuidBytes($0)!, $0) })
        let reopened = try Vault(path: path)
        try reopened.unlock(passphrase: secret("correct horse"))
        #expect(reopened.accounts.count == 10_002)
        #expect(text(try reopened.field(.password, of: AccountName.uuidBytes(uuidA)!)) == "s3cret-Pa55")
        // One name already present: nothing is added, in memory or on disk.
        let more = ["00000000-0000-4000-8000-999999999999", names[0]]
        #expect(throws: VaultError.accountExists) { try reopened.addAccounts(more.map { (AccountName.uuidBytes($0)!, $0) }) }
        #expect(reopened.accounts.count == 10_002)
        #expect(try Vault(path: path).accounts.count == 10_002)
    }

    @Test func noFieldValueOrPassphraseIsInTheFile() throws {
        let path = temporaryPath()
        defer { unlink(path) }
        _ = try makeVault(path)
        let bytes = try Data(contentsOf: URL(fileURLWithPath: path))
        for needle in ["alice", "s3cret-Pa55", "mail.example.com", "hunter2-bis", "correct horse"] {
            #expect(bytes.range(of: Data(needle.utf8)) == nil, "\(needle) in the vault file")
        }
    }

    @Test func passphraseChangeRewrapsOnly() throws {
        let path = temporaryPath()
        defer { unlink(path) }
        let vault = try makeVault(path)
        let before = try Vault(path: path).records.map(\.ciphertext)
        try vault.changePassphrase(to: secret("new passphrase"), parameters: .interactive)
        let reopened = try Vault(path: path)
        #expect(reopened.records.map(\.ciphertext) == before)
        #expect(throws: VaultError.wrongPassphrase) { try reopened.unlock(passphrase: secret("correct horse")) }
        try reopened.unlock(passphrase: secret("new passphrase"))
        #expect(text(try reopened.field(.password, of: AccountName.uuidBytes(uuidB)!)) == "hunter2-bis")
    }

    @Test func everyFlippedByteAndEveryTruncationIsDamage() throws {
        let path = temporaryPath()
        defer { unlink(path) }
        _ = try makeVault(path)
        let good = [UInt8](try Data(contentsOf: URL(fileURLWithPath: path)))
        for index in good.indices {
            var flipped = good
            flipped[index] ^= 0x01
            #expect(throws: VaultError.self) { _ = try Vault(path: path, bytes: flipped, random: SystemRandom()) }
        }
        for length in 0..<good.count {
            #expect(throws: VaultError.self) { _ = try Vault(path: path, bytes: Array(good[0..<length]), random: SystemRandom()) }
        }
    }

    /// An attacker who recomputes the (unkeyed) checksum is still caught by the AEAD tags.
    @Test func tamperingBehindTheChecksumIsCaughtAtUnlock() throws {
        let path = temporaryPath(), otherPath = temporaryPath()
        defer { unlink(path); unlink(otherPath) }
        _ = try makeVault(path)
        let vault = try Vault(path: path)
        func reopened(_ edit: (inout [Vault.SealedRecord]) -> Void) throws -> Vault {
            let copy = try Vault(path: path)
            edit(&copy.records)
            return try Vault(path: path, bytes: copy.encode(), random: SystemRandom())
        }
        // Two records' sealed bodies swapped.
        let swapped = try reopened { records in
            (records[0].ciphertext, records[1].ciphertext) = (records[1].ciphertext, records[0].ciphertext)
            (records[0].nonce, records[1].nonce) = (records[1].nonce, records[0].nonce)
        }
        #expect(throws: VaultError.self) { try swapped.unlock(passphrase: secret("correct horse")) }
        // A record dropped.
        let dropped = try reopened { $0.removeLast() }
        #expect(throws: VaultError.self) { try dropped.unlock(passphrase: secret("correct horse")) }
        // A byte of a record flipped.
        let altered = try reopened { $0[0].ciphertext[3] ^= 0x80 }
        #expect(throws: VaultError.self) { try altered.unlock(passphrase: secret("correct horse")) }
        // A record copied from another vault with the same passphrase and UUID.
        _ = try makeVault(otherPath)
        let foreign = try Vault(path: otherPath).records[0]
        let copied = try reopened { $0[0] = foreign }
        #expect(throws: VaultError.self) { try copied.unlock(passphrase: secret("correct horse")) }
        // An older version of a record replayed.
        let old = vault.records[0]
        let live = try Vault(path: path)
        try live.unlock(passphrase: secret("correct horse"))
        try live.setFields([.password: secret("changed")], of: AccountName.uuidBytes(uuidA)!)
        let replayedCopy = try Vault(path: path)
        replayedCopy.records[0] = old
        let replayed = try Vault(path: path, bytes: replayedCopy.encode(), random: SystemRandom())
        #expect(throws: VaultError.self) { try replayed.unlock(passphrase: secret("correct horse")) }
        // Untouched, it still opens.
        try Vault(path: path).unlock(passphrase: secret("correct horse"))
    }

    @Test func weakParametersAreRefused() throws {
        #expect(throws: VaultError.weakParameters) {
            _ = try Vault.create(at: temporaryPath(), passphrase: secret("x"), parameters: KDFParameters(operations: 1, memoryBytes: 8192))
        }
        let path = temporaryPath()
        defer { unlink(path) }
        _ = try makeVault(path)
        var bytes = [UInt8](try Data(contentsOf: URL(fileURLWithPath: path)))
        bytes[12 + 7] = 1  // opslimit = 1
        let body = Array(bytes.dropLast(32))
        #expect(throws: VaultError.weakParameters) {
            _ = try Vault(path: path, bytes: body + Vault.checksum(body), random: SystemRandom())
        }
    }

    @Test func accountNames() {
        #expect(AccountName.uuidBytes(uuidA)?.count == 16)
        #expect(AccountName.uuidBytes(uuidA.lowercased()) == AccountName.uuidBytes(uuidA))
        for bad in ["", "not-a-uuid", "6BA7B810-9DAD-11D1-80B4-00C04FD430C", "6BA7B810_9DAD-11D1-80B4-00C04FD430C8",
                    "6BA7B810-9DAD-11D1-80B4-00C04FD430CG"] {
            #expect(AccountName.uuidBytes(bad) == nil, "\(bad)")
        }
    }

    /// A block of hex from docs/vault-format.md: "hex" (version 2) or "hex-v1".
    func documentedVector(_ tag: String) throws -> [UInt8] {
        let document = try String(contentsOfFile: #filePath.replacingOccurrences(of: "Tests/CredentialVaultTests/VaultTests.swift",
                                                                                 with: "docs/vault-format.md"), encoding: .utf8)
        return Self.bytes(hex: document.components(separatedBy: "```\(tag)\n").dropFirst().first?
            .components(separatedBy: "```").first ?? "")
    }

    static func bytes(hex: String) -> [UInt8] {
        let digits = Array(hex.filter(\.isHexDigit).utf8)
        return stride(from: 0, to: digits.count - 1, by: 2).map { UInt8(String(decoding: digits[$0...$0 + 1], as: UTF8.self), radix: 16)! }
    }

    /// The trusted program of the test vector: git, by the SHA-256 of an empty file.
    static let vectorProgram = TrustedProgram(
        sha256: bytes(hex: "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"), path: "/usr/bin/git")

    /// docs/vault-format.md's test vector (version 2): built with counting "random"
    /// bytes, guarded, one account trusting one program; it must match the hex in the
    /// document byte for byte, and decrypt with only the passphrase.
    @Test func testVectorInTheFormatDocument() throws {
        let path = temporaryPath()
        defer { unlink(path) }
        let random = CountingRandom()
        let vault = try Vault.create(at: path, passphrase: secret("correct horse battery staple"), parameters: .interactive,
                                     guarded: true, random: random)
        let uuid = AccountName.uuidBytes(uuidA)!
        try vault.addAccount(uuid: uuid, name: uuidA, trusting: [Self.vectorProgram])
        try vault.setFields([.username: secret("alice"), .password: secret("hunter2")], of: uuid)
        let hex = vault.encode().map { String(format: "%02x", $0) }.joined()
        if ProcessInfo.processInfo.environment["MTMFS_PRINT_VECTOR"] != nil { print("VECTOR", hex) }
        #expect(vault.encode() == (try documentedVector("hex")))
        let reopened = try Vault(path: path)
        #expect(reopened.formatVersion == 2)
        try reopened.unlock(passphrase: secret("correct horse battery staple"))
        #expect(text(try reopened.field(.password, of: uuid)) == "hunter2")
        #expect(try reopened.isGuarded())
        #expect(try reopened.trustedPrograms(of: uuid) == [Self.vectorProgram])
    }

    /// A version-1 file (the document's earlier vector) opens and reads as it did; it is
    /// written as version 2 at its first change, with the same passphrase, values kept,
    /// guarding off and no trusted program.
    @Test func versionOneOpensAndIsUpgradedAtTheFirstChange() throws {
        let path = temporaryPath()
        defer { unlink(path) }
        let old = try documentedVector("hex-v1")
        #expect(old.count == 394)
        try Data(old).write(to: URL(fileURLWithPath: path))
        let vault = try Vault(path: path)
        #expect(vault.formatVersion == 1)
        try vault.unlock(passphrase: secret("correct horse battery staple"))
        let uuid = AccountName.uuidBytes(uuidA)!
        #expect(text(try vault.field(.password, of: uuid)) == "hunter2")
        #expect(try !vault.isGuarded())
        #expect(try vault.trustedPrograms(of: uuid).isEmpty)
        // Opening and unlocking change nothing on disk.
        #expect([UInt8](try Data(contentsOf: URL(fileURLWithPath: path))) == old)
        try vault.setFields([.label: secret("mail")], of: uuid)
        #expect(vault.formatVersion == 2)
        let upgraded = try Vault(path: path)
        #expect(upgraded.formatVersion == 2)
        #expect(throws: VaultError.wrongPassphrase) { try upgraded.unlock(passphrase: secret("wrong")) }
        try upgraded.unlock(passphrase: secret("correct horse battery staple"))
        #expect(text(try upgraded.field(.password, of: uuid)) == "hunter2")
        #expect(text(try upgraded.field(.label, of: uuid)) == "mail")
        // A passphrase change of a version-1 file upgrades it too.
        let second = temporaryPath()
        defer { unlink(second) }
        try Data(old).write(to: URL(fileURLWithPath: second))
        let other = try Vault(path: second)
        try other.unlock(passphrase: secret("correct horse battery staple"))
        try other.changePassphrase(to: secret("new one"), parameters: .interactive)
        let reread = try Vault(path: second)
        #expect(reread.formatVersion == 2)
        try reread.unlock(passphrase: secret("new one"))
        #expect(text(try reread.field(.username, of: uuid)) == "alice")
    }

    /// Guarding and trusted lists are sealed: they survive a reopen, are not in the file in
    /// clear, and a passphrase is checked against the unlocked vault without unlocking.
    @Test func guardingAndTrustedListsAreSealed() throws {
        let path = temporaryPath()
        defer { unlink(path) }
        let vault = try makeVault(path)
        let uuid = AccountName.uuidBytes(uuidA)!
        #expect(try !vault.isGuarded())
        try vault.setGuarded(true)
        let programs = [TrustedProgram(sha256: Array(repeating: 7, count: 32), path: "/usr/bin/very-recognizable-program"),
                        Self.vectorProgram]
        try vault.setTrustedPrograms(programs, of: uuid)
        let bytes = [UInt8](try Data(contentsOf: URL(fileURLWithPath: path)))
        #expect(bytes.firstRange(of: Array("very-recognizable".utf8)) == nil, "a trusted path in clear")
        #expect(bytes.firstRange(of: Self.vectorProgram.sha256) == nil, "a trusted hash in clear")
        let reopened = try Vault(path: path)
        try reopened.unlock(passphrase: secret("correct horse"))
        #expect(try reopened.isGuarded())
        #expect(try reopened.trustedPrograms(of: uuid) == programs)
        #expect(try reopened.trustedPrograms(of: AccountName.uuidBytes(uuidB)!).isEmpty)
        #expect(throws: VaultError.wrongPassphrase) { try reopened.checkPassphraseKey(try reopened.passphraseKey(secret("nope"))) }
        try reopened.checkPassphraseKey(try reopened.passphraseKey(secret("correct horse")))
        try reopened.setGuarded(false)
        try reopened.setTrustedPrograms([], of: uuid)
        reopened.lock()
        #expect(throws: VaultError.locked) { try reopened.isGuarded() }
        let third = try Vault(path: path)
        try third.unlock(passphrase: secret("correct horse"))
        #expect(try !third.isGuarded())
        #expect(try third.trustedPrograms(of: uuid).isEmpty)
        // Removing an account takes its list with it; a new account of the same UUID starts empty.
        try third.setTrustedPrograms(programs, of: uuid)
        try third.setFields([.username: SecureBytes(), .password: SecureBytes(), .server: SecureBytes()], of: uuid)
        try third.removeAccount(uuid: uuid)
        try third.addAccount(uuid: uuid, name: uuidA)
        #expect(try third.trustedPrograms(of: uuid).isEmpty)
    }
}

/// A vault of 20,000 fully filled accounts unlocks, serves and locks like a small one: its
/// plaintext lives in a few large secure regions (memory mappings stay few, far from
/// vm.max_map_count), and a lock gives them back.
@Suite struct VaultScaleTests {
    static func mappings() -> Int {
        ((try? String(contentsOfFile: "/proc/self/maps", encoding: .utf8)) ?? "").split(separator: "\n").count
    }

    @Test func twentyThousandFullAccountsTakeFewMappings() throws {
        let path = FileManager.default.temporaryDirectory.appendingPathComponent("mtmfs-vault-\(UUID().uuidString)").path
        defer { unlink(path) }
        let writer = try Vault.create(at: path, passphrase: secret("correct horse"), parameters: .interactive)
        let count = 20_000
        // The inputs too come from an arena: 160,000 regions of their own would exhaust the
        // process's memory mappings before the vault is even written.
        let inputs = SecureArena()
        var accounts: [(uuid: [UInt8], name: String, fields: [AccountField: SecureBytes])] = []
        for index in 0..<count {
            let name = String(format: "%08x-0000-4000-8000-%012x", index, index)
            var values: [AccountField: SecureBytes] = [:]
            for field in AccountField.allCases {
                values[field] = Array("\(field)-\(index)-a value long enough to be a real one".utf8)
                    .withUnsafeBytes { try! SecureBytes.allocate(copying: $0, in: inputs) }
            }
            accounts.append((AccountName.uuidBytes(name)!, name, values))
        }
        try writer.addAccounts(accounts)
        accounts.forEach { $0.fields.values.forEach { $0.wipe() } }
        inputs.releaseAll()
        writer.lock()

        let vault = try Vault(path: path)
        let before = Self.mappings()
        try vault.unlock(passphrase: secret("correct horse"))
        // The vault's own locked memory: the process's resident size would count the suites
        // that run beside this one (the daemon's is checked by the reliability suite).
        let unlocked = Self.mappings(), grown = vault.secureMemoryBytes >> 10
        #expect(unlocked - before < 100, "\(unlocked - before) new mappings for \(count * AccountField.allCases.count) fields")
        #expect(grown < 64 << 10, "unlocking took \(grown) kB of locked memory")
        print("vault scale: \(count) accounts of \(AccountField.allCases.count) fields: \(unlocked - before) mappings, \(grown) kB of locked memory when unlocked")
        let last = AccountName.uuidBytes(String(format: "%08x-0000-4000-8000-%012x", count - 1, count - 1))!
        #expect(text(try vault.field(.password, of: last)) == "password-\(count - 1)-a value long enough to be a real one")
        try vault.setFields([.username: secret("changed")], of: last)
        #expect(text(try vault.field(.username, of: last)) == "changed")
        vault.lock()
        // (Mappings are the whole process's: suites running beside this one start and end
        // threads, each a stack mapping — measured again, up to 10 s, while they settle.)
        var left = Self.mappings() - before
        for _ in 0..<200 where left >= 10 {
            usleep(50_000)
            left = Self.mappings() - before
        }
        #expect(left < 10, "a lock gives the regions back")
        #expect(vault.secureMemoryBytes == 0)
    }
}

/// `Vault.trustChanges`, what an open's decision is bound to: it moves when who is trusted
/// changes (a list, guarding, a lock), not at every save of an account.
@Suite struct TrustChangesTests {
    @Test func onlyChangesOfWhoIsTrustedCount() throws {
        let home = FileManager.default.temporaryDirectory.appendingPathComponent("mtmfs-trust-\(UUID().uuidString)").path
        try FileManager.default.createDirectory(atPath: home, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: home) }
        let vault = try Vault.createFolder(at: home + "/vault", passphrase: secret("correct horse"), parameters: .interactive)
        let a = try #require(AccountName.uuidBytes("6ba7b810-9dad-11d1-80b4-00c04fd430c8"))
        let b = try #require(AccountName.uuidBytes("f47ac10b-58cc-4372-a567-0e02b2c3d479"))
        try vault.addAccounts([(uuid: a, name: AccountName.string(a)), (uuid: b, name: AccountName.string(b))])
        let start = vault.trustChanges
        try vault.setFields([.label: secret("mail")], named: [:], of: b)
        try vault.setFields([.password: secret("hunter2")], named: [:], of: a)
        #expect(vault.trustChanges == start, "a save moved it")
        try vault.setTrustedPrograms([TrustedProgram(sha256: Array(repeating: 1, count: 32), path: "/usr/bin/true")], of: a)
        let trusted = vault.trustChanges
        #expect(trusted != start)
        try vault.setGuarded(true)
        #expect(vault.trustChanges != trusted)
        let guarded = vault.trustChanges
        vault.lock()
        #expect(vault.trustChanges != guarded)
    }
}
