import CredentialVault
import Foundation
import FuseLowLevel
@testable import MountedTree
import Posix
import SecretService
import SecureMemory
import Synchronization
import Testing

/// A file another machine wrote that changes one account of 10,000 (issue 50): the mount
/// merges that account again and tells the bus of it alone — not every item of the vault.
@Suite struct FolderChangeSignalTests {
    static let count = 10_000

    static func uuid(_ index: Int) -> [UInt8] {
        AccountName.uuidBytes(String(format: "%08x-0000-4000-8000-%012x", index, index))!
    }

    @Test func aSyncedChangeOfOneAccountSignalsOneItem() throws {
        let scratch = FileManager.default.temporaryDirectory.appendingPathComponent("mtmfs-signal-\(UUID().uuidString)").path
        defer { try? FileManager.default.removeItem(atPath: scratch) }
        for side in ["a", "b"] { try FileManager.default.createDirectory(atPath: scratch + "/" + side, withIntermediateDirectories: true) }
        let passphrase = try SecureBytes(copying: Array("correct horse battery staple".utf8))
        defer { passphrase.wipe() }
        let made = try Vault.createFolder(at: scratch + "/a/vault", passphrase: passphrase, parameters: .interactive)
        for batch in stride(from: 0, to: Self.count, by: 1_000) {
            try made.addAccounts((batch..<batch + 1_000).map { index in
                (uuid: Self.uuid(index), name: AccountName.string(Self.uuid(index)),
                 fields: [.label: try SecureBytes(copying: Array("Account \(index)".utf8)),
                          .server: try SecureBytes(copying: Array("host\(index).example.com".utf8))])
            })
        }
        made.lock()
        // The other machine: a copy of the folder, with a device of its own.
        try FileManager.default.copyItem(atPath: scratch + "/a/vault", toPath: scratch + "/b/vault")

        let accounts = AccountsTree(vaultPath: scratch + "/a/vault", ownership: Ownership.currentProcess(), notifier: KernelCacheNotifier(),
                                    active: ActiveAccountLink(get: { nil }, set: { _ in }), autoLockSeconds: 0,
                                    prompts: PromptSettings(environment: [], mountPoint: scratch), nodes: NodeTable())
        defer { accounts.shutDown() }
        try accounts.unlock(passphrase: passphrase)
        let told = Mutex<[[UInt8]]>([])
        accounts.observe { change in
            if case .items(let uuids) = change { told.withLock { $0 += uuids } }
        }

        let other = try Vault(path: scratch + "/b/vault")
        try other.unlock(passphrase: passphrase)
        let changed = Self.uuid(4_321)
        try other.setFields([.label: try SecureBytes(copying: Array("Renamed elsewhere".utf8))], named: [:], of: changed)
        other.lock()
        let ownDevice = Set(try FileManager.default.contentsOfDirectory(atPath: scratch + "/a/vault"))
        for device in try FileManager.default.contentsOfDirectory(atPath: scratch + "/b/vault")
        where !ownDevice.contains(device) {
            try FileManager.default.copyItem(atPath: scratch + "/b/vault/" + device, toPath: scratch + "/a/vault/" + device)
        }

        accounts.folderChanged()
        #expect(told.withLock { $0 } == [changed])
        // The changed account reads its new label; another reads its own.
        let vault = try #require(accounts.state.withLock { $0.fields.vault })
        let label = try vault.storedField(.label, of: changed)?.withUnsafeBytes { String(decoding: $0, as: UTF8.self) }
        #expect(label == "Renamed elsewhere")
        let unchanged = try vault.storedField(.label, of: Self.uuid(17))?.withUnsafeBytes { String(decoding: $0, as: UTF8.self) }
        #expect(unchanged == "Account 17")
    }
}
