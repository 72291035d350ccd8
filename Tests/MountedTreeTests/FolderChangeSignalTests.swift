import CredentialVault
import Foundation
import FuseLowLevel
@testable import MountedTree
import Posix
import SecretService
import SecureMemory
import Synchronization
import Testing

/// Another machine's files arriving, and a lock, on a large vault (issue 50): the mount
/// merges only the accounts a file changes and tells the bus of those alone; it reads and
/// opens the file without the tree's lock; a lock reads nothing from the disk.
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
        try accounts.service.unlock(passphrase: passphrase)
        let told = Mutex<[[UInt8]]>([])
        VaultSecretStore(service: accounts.service).observe { change in
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

        accounts.service.folderChanged()
        #expect(told.withLock { $0 } == [changed])
        // The changed account reads its new label; another reads its own.
        let vault = try #require(accounts.state.withLock { $0.fields.vault })
        let label = try vault.storedField(.label, of: changed)?.withUnsafeBytes { String(decoding: $0, as: UTF8.self) }
        #expect(label == "Renamed elsewhere")
        let unchanged = try vault.storedField(.label, of: Self.uuid(17))?.withUnsafeBytes { String(decoding: $0, as: UTF8.self) }
        #expect(unchanged == "Account 17")
    }

    /// A vault folder of `count` accounts at `scratch/a/vault`, locked, and a copy of it at
    /// `scratch/b/vault` (another machine's clone).
    static func twoMachines(_ scratch: String, count: Int, passphrase: SecureBytes) throws {
        for side in ["a", "b"] { try FileManager.default.createDirectory(atPath: scratch + "/" + side, withIntermediateDirectories: true) }
        let made = try Vault.createFolder(at: scratch + "/a/vault", passphrase: passphrase, parameters: .interactive)
        for batch in stride(from: 0, to: count, by: 1_000) {
            try made.addAccounts((batch..<min(count, batch + 1_000)).map { index in
                (uuid: uuid(index), name: AccountName.string(uuid(index)),
                 fields: [.label: try SecureBytes(copying: Array("Account \(index)".utf8))])
            })
        }
        made.lock()
        try FileManager.default.copyItem(atPath: scratch + "/a/vault", toPath: scratch + "/b/vault")
    }

    static func tree(_ scratch: String) -> AccountsTree {
        AccountsTree(vaultPath: scratch + "/a/vault", ownership: Ownership.currentProcess(), notifier: KernelCacheNotifier(),
                     active: ActiveAccountLink(get: { nil }, set: { _ in }), autoLockSeconds: 0,
                     prompts: PromptSettings(environment: [], mountPoint: scratch), nodes: NodeTable())
    }

    static func label(_ accounts: AccountsTree, _ index: Int) throws -> String? {
        let vault = try #require(accounts.state.withLock { $0.fields.vault })
        return try vault.storedField(.label, of: uuid(index))?.withUnsafeBytes { String(decoding: $0, as: UTF8.self) }
    }

    @Test func aSyncedFileIsReadAndOpenedWithoutTheTreesLock() throws {
        let scratch = FileManager.default.temporaryDirectory.appendingPathComponent("mtmfs-scan-\(UUID().uuidString)").path
        defer { try? FileManager.default.removeItem(atPath: scratch) }
        let passphrase = try SecureBytes(copying: Array("correct horse battery staple".utf8))
        defer { passphrase.wipe() }
        let count = 2_000
        try Self.twoMachines(scratch, count: count, passphrase: passphrase)
        let accounts = Self.tree(scratch)
        defer { accounts.shutDown() }
        try accounts.service.unlock(passphrase: passphrase)
        let scansAtUnlock = try #require(accounts.state.withLock { $0.fields.vault?.lockedFolderScans })

        // The other machine relabels every account in one file.
        let other = try VaultFolder(path: scratch + "/b/vault", deviceFile: scratch + "/b/device")
        let key = try other.masterKey(passphrase: passphrase)
        defer { key.wipe() }
        let arena = SecureArena()
        try other.open(with: key, arena: arena)
        let changes = try (0..<count).map { index in
            let uuid = Self.uuid(index)
            let seen = VaultMerge.account(uuid, other.changes(of: uuid))?.fields["label"]?.seen ?? [:]
            return AccountChange(kind: .set, id: ChangeID(device: 0, clock: 0, index: 0), uuid: uuid, name: AccountName.string(uuid),
                                 seen: [], fields: [.init(name: "label", seen: seen, value: try SecureBytes(copying: Array("Moved \(index)".utf8)))])
        }
        let (file, _) = try other.prepare(changes, key: key)
        file.write()
        other.finish(file)
        try #require(file.error == nil)
        other.close()
        // Between the read and the merge: the file is open (decrypted) and the tree's lock
        // is free — another thread takes it at once. (A scan that found nothing new is not
        // the one looked at.)
        let seen = Mutex<(read: Int, opened: Int, lockFree: Bool)?>(nil)
        accounts.service.afterFolderScanRead.withLock { hook in
            hook = { found in
                guard found.readCount > 0 else { return }
                let taken = ReplyOutsideLockTests.answersMeanwhile { accounts.state.withLock { _ in } }
                seen.withLock { $0 = (found.readCount, found.openedCount, taken) }
            }
        }
        for device in try FileManager.default.contentsOfDirectory(atPath: scratch + "/b/vault")
        where !FileManager.default.fileExists(atPath: scratch + "/a/vault/" + device) {
            try FileManager.default.copyItem(atPath: scratch + "/b/vault/" + device, toPath: scratch + "/a/vault/" + device)
        }
        // The tree's watcher scans (inotify): one thread, so nothing else holds the lock
        // while its scan reads. (Scanned here only if it has not come within 20 s.)
        let deadline = ContinuousClock.now.advanced(by: .seconds(20))
        while seen.withLock({ $0 }) == nil && ContinuousClock.now < deadline { usleep(20_000) }
        if seen.withLock({ $0 }) == nil { accounts.service.folderChanged() }
        let observed = try #require(seen.withLock { $0 })
        #expect(observed.read == 1 && observed.opened == 1)
        #expect(observed.lockFree, "the tree's lock was held while the file was read and opened")
        #expect(try Self.label(accounts, 1_234) == "Moved 1234")
        #expect(accounts.state.withLock { $0.fields.vault?.lockedFolderScans } == scansAtUnlock, "a scan ran under the tree's lock")
        // (Noted by the scanning thread once its merge is done.)
        let noted = ContinuousClock.now.advanced(by: .seconds(10))
        while accounts.service.lastFolderScan.withLock({ $0.unlocked }) == .zero && ContinuousClock.now < noted { usleep(10_000) }
        #expect(accounts.service.lastFolderScan.withLock { $0.unlocked } > .zero)
    }

    @Test func aLockReadsNothingFromTheDiskAndTheNextUnlockReadsItAll() throws {
        let scratch = FileManager.default.temporaryDirectory.appendingPathComponent("mtmfs-lock-\(UUID().uuidString)").path
        defer { try? FileManager.default.removeItem(atPath: scratch) }
        let passphrase = try SecureBytes(copying: Array("correct horse battery staple".utf8))
        defer { passphrase.wipe() }
        try Self.twoMachines(scratch, count: 1_000, passphrase: passphrase)
        let accounts = Self.tree(scratch)
        defer { accounts.shutDown() }
        try accounts.service.unlock(passphrase: passphrase)
        let scans = try #require(accounts.state.withLock { $0.fields.vault?.lockedFolderScans })
        accounts.service.lock(reason: "test")
        #expect(accounts.state.withLock { $0.fields.vault?.lockedFolderScans } == scans, "the lock read the folder")
        // Locked, the listing stays (names from the clear parts kept at the lock).
        #expect(accounts.state.withLock { $0.fields.vault?.accounts.count } == 1_000)
        #expect(VaultSecretStore(service: accounts.service).isLocked)
        try accounts.service.unlock(passphrase: passphrase)
        #expect(try Self.label(accounts, 999) == "Account 999")
        #expect(accounts.state.withLock { $0.fields.vault?.accounts.count } == 1_000)
    }

    /// A lock seals what was due (a field unlinked a moment ago leaves at the lock) under
    /// the service's lock, and writes and syncs it with the lock let go: another thread
    /// takes the lock while the change file is written. The next unlock reads it.
    @Test func aLockWritesAndSyncsItsChangesWithTheServicesLockLetGo() throws {
        let scratch = FileManager.default.temporaryDirectory.appendingPathComponent("mtmfs-lockwrite-\(UUID().uuidString)").path
        defer { try? FileManager.default.removeItem(atPath: scratch) }
        let passphrase = try SecureBytes(copying: Array("correct horse battery staple".utf8))
        defer { passphrase.wipe() }
        try Self.twoMachines(scratch, count: 10, passphrase: passphrase)
        let accounts = Self.tree(scratch)
        defer { accounts.shutDown() }
        try accounts.service.unlock(passphrase: passphrase)
        // The unlock held the service's lock only to open the vault: no key derivation.
        #expect(accounts.service.lastUnlockHeld.withLock { $0 } > .zero)
        #expect(accounts.service.lastUnlockHeld.withLock { $0 } < .seconds(2))
        let context = RequestContext(uid: getuid(), gid: getgid(), pid: getpid(), umask: 0o022)
        let directory = try accounts.lookup(parent: accounts.space.root, name: AccountName.string(Self.uuid(3)), context: context).inode
        _ = try accounts.lookup(parent: directory, name: "label", context: context)
        // Unlinked: it leaves a second later, or at the lock.
        try accounts.unlink(parent: directory, name: "label", context: context)
        let seen = Mutex<(writes: Int, lockFree: Bool)>((0, true))
        accounts.service.whileSavesWrite.withLock { hook in
            hook = {
                let free = ReplyOutsideLockTests.answersMeanwhile { accounts.state.withLock { _ in } }
                seen.withLock { $0 = ($0.writes + 1, $0.lockFree && free) }
            }
        }
        accounts.service.lock(reason: "test")
        accounts.service.whileSavesWrite.withLock { $0 = nil }
        #expect(seen.withLock { $0.writes } == 1, "the lock wrote no change")
        #expect(seen.withLock { $0.lockFree }, "the service's lock was held while the lock's change was written")
        try accounts.service.unlock(passphrase: passphrase)
        #expect(try Self.label(accounts, 3) == nil)
        #expect(try Self.label(accounts, 4) == "Account 4")
    }
}
