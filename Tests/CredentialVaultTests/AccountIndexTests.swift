@testable import CredentialVault
import Foundation
import Testing
#if canImport(Glibc)
import Glibc
#endif

/// The vault's index of accounts by label, server and username (SPEC §2a): kept with every
/// change, in file order, gone at lock.
@Suite struct AccountIndexTests {
    static let names = (0..<6).map { String(format: "%08X-0000-4000-8000-%012X", $0 + 1, $0) }
    static func uuid(_ i: Int) -> [UInt8] { AccountName.uuidBytes(names[i])! }

    func find(_ vault: Vault, _ attribute: IndexedAttribute, _ value: String) throws -> [String] {
        try Array(value.utf8).withUnsafeBytes { try vault.accounts(with: attribute, equalTo: $0) }.map { vault.name(of: $0)! }
    }

    func pair(_ vault: Vault, _ server: String, _ username: String) throws -> [String] {
        try Array(server.utf8).withUnsafeBytes { s in
            try Array(username.utf8).withUnsafeBytes { u in try vault.accounts(server: s, username: u) }
        }.map { vault.name(of: $0)! }
    }

    @Test func keptWithEveryChangeInFileOrderAndGoneAtLock() throws {
        let path = FileManager.default.temporaryDirectory.appendingPathComponent("mtmfs-index-\(UUID().uuidString)").path
        defer { unlink(path) }
        let vault = try Vault.create(at: path, passphrase: secret("correct horse"), parameters: .interactive)
        for i in 0..<4 { try vault.addAccount(uuid: Self.uuid(i), name: Self.names[i]) }
        // New accounts: every value empty, in file order.
        #expect(try find(vault, .label, "") == Array(Self.names[0..<4]))
        try vault.setFields([.server: secret("a.example"), .username: secret("bob"), .label: secret("Mail")], of: Self.uuid(2))
        try vault.setFields([.server: secret("a.example"), .username: secret("bob")], of: Self.uuid(0))
        try vault.setFields([.server: secret("b.example"), .username: secret("bob"), .label: secret("Mail")], of: Self.uuid(1))
        #expect(try find(vault, .server, "a.example") == [Self.names[0], Self.names[2]], "file order, not order of change")
        #expect(try find(vault, .username, "bob") == Array(Self.names[0..<3]))
        #expect(try find(vault, .label, "Mail") == [Self.names[1], Self.names[2]])
        #expect(try pair(vault, "a.example", "bob") == [Self.names[0], Self.names[2]])
        #expect(try pair(vault, "a.exampleb", "ob").isEmpty, "server and username are not run together")
        #expect(try find(vault, .label, "") == [Self.names[0], Self.names[3]])
        // A change moves an account; a removal takes it out; a new one comes last.
        try vault.setFields([.server: secret("c.example")], of: Self.uuid(0))
        #expect(try find(vault, .server, "a.example") == [Self.names[2]])
        #expect(try pair(vault, "c.example", "bob") == [Self.names[0]])
        try vault.removeAccount(uuid: Self.uuid(2))
        #expect(try find(vault, .label, "Mail") == [Self.names[1]])
        try vault.addAccounts([(Self.uuid(4), Self.names[4], [.label: secret("Mail")])])
        #expect(try find(vault, .label, "Mail") == [Self.names[1], Self.names[4]])
        #expect(try vault.accounts(uuidPrefix: 0x0000_0005).map { vault.name(of: $0)! } == [Self.names[4]])
        #expect(try vault.servers().count == 3)  // b, c, and the empty server
        // Built again at unlock, the same answers; none while locked.
        vault.lock()
        #expect(throws: VaultError.locked) { try self.find(vault, .label, "Mail") }
        let reopened = try Vault(path: path)
        try reopened.unlock(passphrase: secret("correct horse"))
        #expect(try find(reopened, .label, "Mail") == [Self.names[1], Self.names[4]])
        #expect(try pair(reopened, "c.example", "bob") == [Self.names[0]])
        let digest = try reopened.digest(of: .server, of: Self.uuid(1))
        #expect(try reopened.accounts(with: .server, digest: digest).map { reopened.name(of: $0)! } == [Self.names[1]])
        reopened.lock()
    }
}
