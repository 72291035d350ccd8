@testable import CredentialVault
import Posix
import SecureMemory
import Testing
import TestSupport

/// The daemon's key derivation in a child process (`mtmfs internal-derive-key`): the same
/// key as in the process itself, and a child that fails is noticed rather than trusted.
@Suite struct KeyDerivationTests {
    static let salt = (0..<16).map { UInt8($0 * 7) }

    func passphrase(_ text: String) -> SecureBytes {
        try! SecureBytes(copying: Array(text.utf8))
    }

    func hex(_ key: SecureBytes) -> String { key.withUnsafeBytes { ProgramDigest.hex(Array($0)) } }

    @Test(arguments: ["correct horse battery staple", "", String(repeating: "ü", count: 5000)])
    func aChildDerivesTheSameKey(text: String) throws {
        let secret = passphrase(text)
        defer { secret.wipe() }
        let here = try KeyDerivation.here(secret, salt: Self.salt, parameters: .interactive)
        defer { here.wipe() }
        let child = try #require(KeyDerivation.inChild([Run.mtmfs, "internal-derive-key"], secret, salt: Self.salt,
                                                       parameters: .interactive))
        defer { child.wipe() }
        #expect(child.count == VaultFormat.keySize)
        #expect(hex(child) == hex(here))
        // Another salt, another key: the child reads what it is sent.
        let other = try #require(KeyDerivation.inChild([Run.mtmfs, "internal-derive-key"], secret, salt: Array(Self.salt.reversed()),
                                                       parameters: .interactive))
        defer { other.wipe() }
        #expect(hex(other) != hex(here))
    }

    @Test func aChildThatFailsGivesNoKey() {
        let secret = passphrase("pass")
        defer { secret.wipe() }
        // Exits at once (0, but no key), exits 1 without a key, does not exist, or is told
        // parameters libsodium refuses.
        for command in [["true"], ["false"], ["/nonexistent/mtmfs"], [Run.mtmfs, "internal-derive-key"]] {
            let parameters = command.count == 2 ? KDFParameters(operations: 0, memoryBytes: 0) : .interactive
            let key = KeyDerivation.inChild(command, secret, salt: Self.salt, parameters: parameters)
            #expect(key == nil, "\(command)")
            key?.wipe()
        }
    }
}
