@testable import CredentialVault
import SecureMemory
import Foundation
import Testing

/// `Vault` kept in a folder of format 3: the same API as the single file, each change one
/// new change file, the accounts the merge of all of them.
@Suite struct VaultFolderModeTests {
    let scratch = FileManager.default.temporaryDirectory.appendingPathComponent("mtmfs-vaultdir-\(UUID().uuidString)").path
    var a: [UInt8] { AccountName.uuidBytes(uuidA)! }
    var b: [UInt8] { AccountName.uuidBytes(uuidB)! }
    let git = TrustedProgram(sha256: [UInt8](repeating: 7, count: 32), path: "/usr/bin/git")

    func make(_ home: String) throws -> Vault {
        try FileManager.default.createDirectory(atPath: home, withIntermediateDirectories: true)
        let vault = try Vault.createFolder(at: home + "/vault", passphrase: secret("correct horse"), parameters: .interactive)
        try vault.addAccount(uuid: a, name: uuidA, trusting: [git])
        try vault.setFields([.username: secret("alice"), .password: secret("s3cret"), .server: secret("mail.example.com")], of: a)
        try vault.addAccount(uuid: b, name: uuidB)
        try vault.setFields([.label: secret("bank")], of: b)
        try vault.setGuarded(true)
        return vault
    }

    @Test func everyChangeSurvivesAReopen() throws {
        defer { try? FileManager.default.removeItem(atPath: scratch) }
        _ = try make(scratch + "/m")
        let vault = try Vault(path: scratch + "/m/vault")
        #expect(vault.formatVersion == 3 && !vault.isUnlocked)
        #expect(vault.accounts.map(\.name) == [uuidA, uuidB], "listed locked, in the order they were made")
        #expect(throws: VaultError.wrongPassphrase) { try vault.unlock(passphrase: secret("wrong")) }
        try vault.unlock(passphrase: secret("correct horse"))
        #expect(text(try vault.field(.password, of: a)) == "s3cret")
        #expect(text(try vault.field(.label, of: b)) == "bank")
        #expect(try vault.trustedPrograms(of: a) == [git] && vault.trustedPrograms(of: b) == [])
        #expect(try vault.isGuarded())
        let found = "mail.example.com".utf8.withContiguousStorageIfAvailable { server in
            "alice".utf8.withContiguousStorageIfAvailable { user in
                try? vault.accounts(server: UnsafeRawBufferPointer(server), username: UnsafeRawBufferPointer(user))
            }
        }
        #expect(found == .some(.some(.some([a]))))
        // Clearing, removing, trust and guarding changes, a new passphrase.
        try vault.setFields([.password: SecureBytes()], of: a)
        try vault.setTrustedPrograms([], of: a)
        try vault.removeAccount(uuid: b)
        try vault.setGuarded(false)
        try vault.changePassphrase(to: secret("new horse"), parameters: .interactive)
        vault.lock()
        let again = try Vault(path: scratch + "/m/vault")
        #expect(again.accounts.map(\.name) == [uuidA])
        #expect(throws: VaultError.wrongPassphrase) { try again.unlock(passphrase: secret("correct horse")) }
        try again.unlock(passphrase: secret("new horse"))
        #expect(try again.storedField(.password, of: a) == nil)
        #expect(text(try again.field(.username, of: a)) == "alice")
        #expect(try again.trustedPrograms(of: a) == [] && !again.isGuarded())
        #expect(!again.hasAccount(uuid: b))
    }

    /// Two data directories with one vault folder, changed apart and synced by copying
    /// files: each shows both machines' changes, the later of two values of one field.
    @Test func twoMachinesMergeThroughTheFolder() throws {
        defer { try? FileManager.default.removeItem(atPath: scratch) }
        let first = try make(scratch + "/one")
        try FileManager.default.createDirectory(atPath: scratch + "/two", withIntermediateDirectories: true)
        try FileManager.default.copyItem(atPath: scratch + "/one/vault", toPath: scratch + "/two/vault")
        let second = try Vault(path: scratch + "/two/vault")
        try second.unlock(passphrase: secret("correct horse"))
        try first.setFields([.password: secret("from one"), .comment: secret("note")], of: a)
        try second.setFields([.password: secret("from two")], of: a)
        try second.addAccount(uuid: AccountName.uuidBytes("0f8fad5b-d9cb-469f-a165-70867728950e")!, name: "0f8fad5b-d9cb-469f-a165-70867728950e")
        for (from, to) in [("one", "two"), ("two", "one")] {
            let source = scratch + "/\(from)/vault", target = scratch + "/\(to)/vault"
            for relative in try FileManager.default.subpathsOfDirectory(atPath: source) where relative.hasSuffix(".mtv") {
                let destination = target + "/" + relative
                try? FileManager.default.createDirectory(atPath: (destination as NSString).deletingLastPathComponent, withIntermediateDirectories: true)
                if !FileManager.default.fileExists(atPath: destination) { try FileManager.default.copyItem(atPath: source + "/" + relative, toPath: destination) }
            }
        }
        for home in ["one", "two"] {
            let vault = try Vault(path: scratch + "/\(home)/vault")
            try vault.unlock(passphrase: secret("correct horse"))
            #expect(vault.accountCount == 3)
            #expect(text(try vault.field(.password, of: a)) == "from two")
            #expect(text(try vault.field(.comment, of: a)) == "note")
        }
    }

    func changeFiles(_ folder: String) -> [String] {
        ((try? FileManager.default.subpathsOfDirectory(atPath: folder)) ?? []).filter { $0.hasSuffix(".mtv") }
    }

    /// With `defersWrites` (the mount's way): a change counts at once and is on disk only
    /// once its prepared file is written; one that cannot be written goes back.
    @Test func deferredWritesCountAtOnceAndGoBackWhenTheyFail() throws {
        defer { try? FileManager.default.removeItem(atPath: scratch) }
        let vault = try make(scratch + "/m")
        vault.defersWrites = true
        let before = changeFiles(scratch + "/m/vault").count
        try vault.setFields([.password: secret("deferred")], of: a)
        #expect(try text(vault.field(.password, of: a)) == "deferred", "shown before it is written")
        #expect(changeFiles(scratch + "/m/vault").count == before, "nothing written under the caller's lock")
        let files = vault.takePrepared()
        #expect(files.count == 1 && vault.takePrepared().isEmpty)
        files[0].write()
        vault.finishPrepared(files[0])
        #expect(files[0].error == nil && changeFiles(scratch + "/m/vault").count == before + 1)

        // A write that fails: the device's folder replaced by a file (ENOTDIR).
        try vault.setFields([.password: secret("lost")], of: a)
        let failing = vault.takePrepared()[0]
        let device = scratch + "/m/vault/" + failing.relative.split(separator: "/")[0]
        try FileManager.default.moveItem(atPath: device, toPath: device + ".aside")
        #expect(FileManager.default.createFile(atPath: device, contents: Data()))
        failing.write()
        vault.finishPrepared(failing)
        #expect(failing.error != nil)
        vault.refreshFromFolder()
        #expect(try text(vault.field(.password, of: a)) == "deferred", "the value on disk shows again")
        try FileManager.default.removeItem(atPath: device)
        try FileManager.default.moveItem(atPath: device + ".aside", toPath: device)

        // Not taken before a lock: written by the lock, not dropped with the keys.
        try vault.setFields([.comment: secret("at lock")], of: a)
        vault.lock()
        let again = try Vault(path: scratch + "/m/vault")
        try again.unlock(passphrase: secret("correct horse"))
        #expect(try text(again.field(.password, of: a)) == "deferred" && text(again.field(.comment, of: a)) == "at lock")
    }

    /// Many saves: a fold is due past 64 own files, keeps every value shown (the same
    /// memory, nothing wiped under a reader) and leaves one own file; a reopen shows the same.
    @Test func aFoldDueAfterManySavesKeepsWhatShows() throws {
        defer { try? FileManager.default.removeItem(atPath: scratch) }
        let vault = try make(scratch + "/m")
        vault.defersWrites = true
        for round in 0..<70 {
            try vault.setFields([.password: secret("p\(round)"), .comment: secret("c\(round % 3)")], of: a)
            for file in vault.takePrepared() {
                file.write()
                vault.finishPrepared(file)
            }
        }
        #expect(vault.foldIsDue)
        let fold = try #require(try vault.prepareFold())
        #expect(try !vault.foldIsDue && vault.prepareFold() == nil, "one fold at a time")
        try vault.setFields([.path: secret("/during")], of: a)  // (prepared while the fold is written)
        let during = vault.takePrepared()
        fold.file.write()
        during.forEach { $0.write() }
        vault.finishFold(fold)
        during.forEach { vault.finishPrepared($0) }
        #expect(try text(vault.field(.password, of: a)) == "p69" && text(vault.field(.comment, of: a)) == "c0")
        #expect(try text(vault.field(.label, of: b)) == "bank" && vault.isGuarded())
        let own = changeFiles(scratch + "/m/vault").filter { $0.hasPrefix(fold.file.relative.prefix(16)) }
        #expect(own.count == 2, "the fold and the change written during it: \(own)")
        #expect(!vault.foldIsDue)
        let again = try Vault(path: scratch + "/m/vault")
        try again.unlock(passphrase: secret("correct horse"))
        #expect(try text(again.field(.password, of: a)) == "p69" && text(again.field(.path, of: a)) == "/during")
        #expect(try again.trustedPrograms(of: a) == [git] && again.accountCount == 2)
    }
}
