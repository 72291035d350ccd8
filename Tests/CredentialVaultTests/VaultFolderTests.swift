@testable import CredentialVault
import SecureMemory
import Foundation
import Testing

/// One machine's data directory holding a vault folder (format 3), and what it does.
final class Machine {
    let home: String
    var folder: VaultFolder
    var key: SecureBytes?
    let arena = SecureArena()

    var vaultPath: String { home + "/vault" }
    var devicePath: String { home + "/device" }

    /// A new vault in a new data directory.
    init(creating home: String, passphrase: String = "correct horse") throws {
        self.home = home
        try FileManager.default.createDirectory(atPath: home, withIntermediateDirectories: true)
        let (folder, key) = try VaultFolder.create(at: home + "/vault", deviceFile: home + "/device",
                                                   passphrase: secret(passphrase), parameters: .interactive)
        (self.folder, self.key) = (folder, key)
    }

    /// Another data directory with a copy of `other`'s folder (a clone): its own device id.
    init(cloning other: Machine, into home: String, passphrase: String = "correct horse") throws {
        self.home = home
        try FileManager.default.createDirectory(atPath: home, withIntermediateDirectories: true)
        try FileManager.default.copyItem(atPath: other.vaultPath, toPath: home + "/vault")
        folder = try VaultFolder(path: home + "/vault", deviceFile: home + "/device")
        try unlock(passphrase)
    }

    func unlock(_ passphrase: String = "correct horse") throws {
        let key = try folder.masterKey(passphrase: secret(passphrase))
        try folder.open(with: key, arena: arena)
        self.key = key
    }

    /// Reopens from disk (locked), as a new mount would.
    func reopen() throws {
        folder.close()
        folder = try VaultFolder(path: vaultPath, deviceFile: devicePath)
        key = nil
    }

    var accounts: [[UInt8]: VaultMerge.Account] { VaultMerge.accounts(folder.changes) }

    func account(_ name: String) -> VaultMerge.Account? { accounts[AccountName.uuidBytes(name)!] }

    func value(_ name: String, _ field: String) -> String? {
        account(name)?.fields[field].map { text($0.shown.value) }
    }

    func others(_ name: String, _ field: String) -> [String] {
        account(name)?.fields[field]?.others.map { text($0.value) } ?? []
    }

    /// Sets fields as a user's write does: each new value has seen every value of its field,
    /// and the change every removal of the account.
    @discardableResult
    func set(_ name: String, _ values: [String: String]) throws -> AccountChange {
        let uuid = AccountName.uuidBytes(name)!
        let current = account(name)
        let fields = values.map { field, value in
            AccountChange.FieldValue(name: field, seen: current?.fields[field]?.seen ?? [:], value: secret(value))
        }
        let removals = folder.changes.filter { $0.uuid == uuid && $0.kind == .remove }.map(\.id)
        let change = AccountChange(kind: .set, id: ChangeID(device: 0, clock: 0, index: 0), uuid: uuid,
                                   name: name, seen: Array(Set(removals)).sorted(), fields: fields)
        return try folder.write([change], key: key!)[0]
    }

    @discardableResult
    func remove(_ name: String) throws -> AccountChange {
        let current = try #require(account(name))
        let change = AccountChange(kind: .remove, id: ChangeID(device: 0, clock: 0, index: 0), uuid: current.uuid,
                                   name: name, seen: current.sets, fields: [])
        return try folder.write([change], key: key!)[0]
    }

    /// Files folded away (by their owner), as a synchroniser learns of deletions.
    var deleted = Set<String>()

    func fold() throws {
        let before = Set(folder.ownFiles)
        try folder.fold(key: key!)
        deleted.formUnion(before.subtracting(folder.ownFiles))
    }

    /// Copies every file this machine lacks from `other`, and removes the ones `other` knows
    /// were folded away (what a synchroniser does).
    func receive(from other: Machine) throws {
        let manager = FileManager.default
        deleted.formUnion(other.deleted)
        for relative in deleted { try? manager.removeItem(atPath: vaultPath + "/" + relative) }
        for relative in try manager.subpathsOfDirectory(atPath: other.vaultPath) where !deleted.contains(relative) {
            let source = other.vaultPath + "/" + relative, target = vaultPath + "/" + relative
            var directory: ObjCBool = false
            guard manager.fileExists(atPath: source, isDirectory: &directory) else { continue }
            if directory.boolValue {
                try? manager.createDirectory(atPath: target, withIntermediateDirectories: true)
            } else if !manager.fileExists(atPath: target) {
                try manager.copyItem(atPath: source, toPath: target)
            }
        }
        try folder.rescan(key: key, arena: arena)
    }

    func files() -> [String] {
        (try? FileManager.default.subpathsOfDirectory(atPath: vaultPath))?.filter { $0.hasSuffix(".mtv") } ?? []
    }
}

@Suite struct VaultFolderTests {
    let scratch = FileManager.default.temporaryDirectory.appendingPathComponent("mtmfs-folder-\(UUID().uuidString)").path

    func pair() throws -> (Machine, Machine) {
        let a = try Machine(creating: scratch + "/a")
        try a.set(uuidA, ["username": "alice", "password": "first"])
        let b = try Machine(cloning: a, into: scratch + "/b")
        return (a, b)
    }

    @Test func changesLoadLockedAndUnlocked() throws {
        defer { try? FileManager.default.removeItem(atPath: scratch) }
        let a = try Machine(creating: scratch + "/a")
        try a.set(uuidA, ["username": "alice", "password": "s3cret"])
        try a.set(uuidB, ["label": "bank"])
        try a.set(uuidA, ["password": "s3cret-2"])
        try a.reopen()
        // Locked: the accounts and their names come from the clear parts.
        #expect(Set(a.accounts.values.map(\.name)) == [uuidA, uuidB])
        #expect(a.account(uuidA)?.fields.isEmpty == true)
        #expect(throws: VaultError.wrongPassphrase) { try a.unlock("wrong") }
        try a.unlock()
        #expect(a.value(uuidA, "password") == "s3cret-2")
        #expect(a.others(uuidA, "password") == [])
        #expect(a.value(uuidA, "username") == "alice")
        #expect(a.value(uuidB, "label") == "bank")
        #expect(a.folder.skipped.isEmpty)
    }

    @Test func aCloneGetsItsOwnDeviceAndKeepsIt() throws {
        defer { try? FileManager.default.removeItem(atPath: scratch) }
        let (a, b) = try pair()
        #expect(a.folder.device != b.folder.device)
        let before = b.folder.device
        try b.reopen()
        #expect(b.folder.device == before)
        #expect(a.folder.vaultID == b.folder.vaultID)
    }

    /// SPEC §2b: one field changed on both machines apart shows, once synced, the later
    /// value on both, and the other in its conflicts; writing the field resolves it.
    @Test func oneFieldChangedOnBothConvergesWithAConflict() throws {
        defer { try? FileManager.default.removeItem(atPath: scratch) }
        let (a, b) = try pair()
        try a.set(uuidA, ["password": "from-a"])
        try b.set(uuidA, ["password": "from-b"])  // later by the clock
        try a.receive(from: b)
        try b.receive(from: a)
        for machine in [a, b] {
            #expect(machine.value(uuidA, "password") == "from-b")
            #expect(machine.others(uuidA, "password") == ["from-a"])
            #expect(machine.value(uuidA, "username") == "alice")
        }
        try a.set(uuidA, ["password": "resolved"])
        try b.receive(from: a)
        for machine in [a, b] {
            #expect(machine.value(uuidA, "password") == "resolved")
            #expect(machine.others(uuidA, "password") == [])
        }
    }

    /// Different fields changed apart: both changes stand, no conflict.
    @Test func differentFieldsChangedApartBothStand() throws {
        defer { try? FileManager.default.removeItem(atPath: scratch) }
        let (a, b) = try pair()
        try a.set(uuidA, ["password": "new"])
        try b.set(uuidA, ["username": "bob"])
        try a.receive(from: b)
        try b.receive(from: a)
        for machine in [a, b] {
            #expect(machine.value(uuidA, "password") == "new")
            #expect(machine.value(uuidA, "username") == "bob")
            #expect(machine.others(uuidA, "password") == [] && machine.others(uuidA, "username") == [])
        }
    }

    /// A removal removes what its machine had seen: an edit made apart keeps the account
    /// (the removal is a conflict until answered); a plain removal removes it everywhere,
    /// and an old file never brings it back.
    @Test func removalAgainstAnEditAndAPlainRemoval() throws {
        defer { try? FileManager.default.removeItem(atPath: scratch) }
        let (a, b) = try pair()
        let old = a.files()
        try a.remove(uuidA)
        try b.set(uuidA, ["password": "edited apart"])
        try a.receive(from: b)
        try b.receive(from: a)
        for machine in [a, b] {
            #expect(machine.value(uuidA, "password") == "edited apart")
            #expect(machine.account(uuidA)?.removalConflicts.count == 1)
        }
        try b.set(uuidA, ["label": "kept"])  // had seen the removal: answers it
        try a.receive(from: b)
        #expect(a.account(uuidA)?.removalConflicts == [])
        try a.remove(uuidA)  // has seen everything now
        try b.receive(from: a)
        #expect(a.account(uuidA) == nil && b.account(uuidA) == nil)
        // An old copy of the first file, restored, does not bring it back.
        for relative in old {
            try? FileManager.default.removeItem(atPath: b.vaultPath + "/" + relative)
        }
        try b.folder.rescan(key: b.key, arena: b.arena)
        try b.receive(from: a)
        #expect(b.account(uuidA) == nil)
    }

    /// An account removed, made again (the same UUID) and removed again is gone: a removal
    /// never loses its effect to a change another removal in effect had seen.
    @Test func removedMadeAgainAndRemovedAgain() throws {
        defer { try? FileManager.default.removeItem(atPath: scratch) }
        let (a, b) = try pair()
        try a.remove(uuidA)
        try b.receive(from: a)
        try b.set(uuidA, ["password": "again"])
        #expect(b.value(uuidA, "password") == "again" && b.value(uuidA, "username") == nil)
        try a.receive(from: b)
        try a.remove(uuidA)
        try b.receive(from: a)
        for machine in [a, b] { #expect(machine.account(uuidA) == nil) }
    }

    /// A change file caught half-written (a copy in progress) is read again once complete.
    @Test func aHalfWrittenFileIsReadOnceComplete() throws {
        defer { try? FileManager.default.removeItem(atPath: scratch) }
        let (a, b) = try pair()
        try b.set(uuidB, ["label": "from b"])
        let relative = try #require(b.folder.ownFiles.last)
        let bytes = try Data(contentsOf: URL(fileURLWithPath: b.vaultPath + "/" + relative))
        try FileManager.default.createDirectory(atPath: a.vaultPath + "/" + String(relative.split(separator: "/")[0]),
                                                withIntermediateDirectories: true)
        try bytes.prefix(300).write(to: URL(fileURLWithPath: a.vaultPath + "/" + relative))
        try a.folder.rescan(key: a.key, arena: a.arena)
        #expect(a.folder.skipped[relative] != nil && a.account(uuidB) == nil)
        try bytes.write(to: URL(fileURLWithPath: a.vaultPath + "/" + relative))
        try a.folder.rescan(key: a.key, arena: a.arena)
        #expect(a.folder.skipped[relative] == nil && a.value(uuidB, "label") == "from b")
    }

    /// A change is prepared under the owner's lock and written outside it: a rescan meanwhile
    /// keeps it, writes may land in any order, and one that fails takes its change back.
    @Test func preparedFilesAreWrittenOutsideAndFinished() throws {
        defer { try? FileManager.default.removeItem(atPath: scratch) }
        let a = try Machine(creating: scratch + "/a")
        func change(_ name: String, _ field: String, _ value: String) -> AccountChange {
            AccountChange(kind: .set, id: ChangeID(device: 0, clock: 0, index: 0), uuid: AccountName.uuidBytes(name)!, name: name,
                          seen: [], fields: [AccountChange.FieldValue(name: field, seen: [:], value: secret(value))])
        }
        let (first, _) = try a.folder.prepare([change(uuidA, "label", "one")], key: a.key!)
        let (second, _) = try a.folder.prepare([change(uuidB, "label", "two")], key: a.key!)
        try a.folder.rescan(key: a.key, arena: a.arena)
        #expect(a.value(uuidA, "label") == "one" && a.value(uuidB, "label") == "two")
        second.write()
        first.write()
        a.folder.finish(first)
        a.folder.finish(second)
        try a.reopen()
        try a.unlock()
        #expect(a.value(uuidA, "label") == "one" && a.value(uuidB, "label") == "two")
        // A file that cannot be written (its device folder is a plain file here).
        let device = a.vaultPath + "/" + ChangeFile.hex(a.folder.device, 16)
        try FileManager.default.removeItem(atPath: device)
        try Data().write(to: URL(fileURLWithPath: device))
        let (failing, _) = try a.folder.prepare([change(uuidA, "label", "lost")], key: a.key!)
        failing.write()
        a.folder.finish(failing)
        #expect(failing.error != nil)
        #expect(a.value(uuidA, "label") == "one", "the failed change still counts")
    }

    /// The accounts are a function of the set of files: any order of arrival gives the same.
    @Test func orderOfArrivalDoesNotMatter() throws {
        defer { try? FileManager.default.removeItem(atPath: scratch) }
        let (a, b) = try pair()
        let c = try Machine(cloning: a, into: scratch + "/c")
        try a.set(uuidA, ["password": "a1"])
        try b.set(uuidA, ["password": "b1", "label": "b"])
        try c.remove(uuidA)
        try c.set(uuidB, ["server": "c.example"])
        try a.receive(from: b); try a.receive(from: c)
        try c.receive(from: b); try c.receive(from: a)
        try b.receive(from: c); try b.receive(from: a)
        func summary(_ m: Machine) -> String {
            m.accounts.values.sorted { $0.name < $1.name }.map { account in
                account.name + ":" + account.fields.keys.sorted().map { "\($0)=\(text(account.fields[$0]!.shown.value))+\(account.fields[$0]!.others.count)" }
                    .joined(separator: ",") + " r\(account.removalConflicts.count)"
            }.joined(separator: " ")
        }
        #expect(summary(a) == summary(b))
        #expect(summary(b) == summary(c))
        #expect(a.value(uuidA, "password") == "b1" && a.others(uuidA, "password") == ["a1"])
    }

    /// Damaged, truncated, renamed, foreign files and a synchroniser's own are skipped and
    /// named; every other file still loads.
    @Test func badFilesAreSkippedAndNamed() throws {
        defer { try? FileManager.default.removeItem(atPath: scratch) }
        let a = try Machine(creating: scratch + "/a")
        try a.set(uuidA, ["password": "good"])
        let other = try Machine(creating: scratch + "/other")
        try other.set(uuidB, ["password": "foreign"])
        let device = a.vaultPath + "/" + ChangeFile.hex(a.folder.device, 16)
        let good = try #require(a.files().first)
        let bytes = try Data(contentsOf: URL(fileURLWithPath: a.vaultPath + "/" + good))
        func put(_ name: String, _ data: Data) throws { try data.write(to: URL(fileURLWithPath: device + "/" + name)) }
        try put("0fffffffffffffff-00000001.mtv", bytes.prefix(bytes.count - 100))     // truncated
        try put("0ffffffffffffffe-00000002.mtv", bytes)                               // renamed
        var flipped = bytes; flipped[flipped.count - 5] ^= 1
        try put("0ffffffffffffffd-00000003.mtv", flipped)                             // damaged
        try put(String(good.split(separator: "/")[1]).replacingOccurrences(of: ".mtv", with: ".sync-conflict-20261202-123456-ABCDEFG.mtv"), bytes)
        try put(".syncthing.x.mtv.tmp", bytes)
        try put("x.mtv~", bytes)
        let foreignFile = try #require(other.files().first)
        let foreignTarget = other.vaultPath + "/" + foreignFile
        let movedDevice = a.vaultPath + "/" + String(foreignFile.split(separator: "/")[0])
        try FileManager.default.createDirectory(atPath: movedDevice, withIntermediateDirectories: true)
        try FileManager.default.copyItem(atPath: foreignTarget, toPath: a.vaultPath + "/" + foreignFile)  // from another vault
        try a.reopen()
        try a.unlock()
        #expect(a.value(uuidA, "password") == "good")
        #expect(a.account(uuidB) == nil)
        #expect(a.folder.skipped.count == 7, "\(a.folder.skipped)")
        #expect(a.folder.skipped.keys.contains { $0.contains("sync-conflict") })
    }

    /// Nothing in clear, and no length: a change of any one field to a value of up to 100
    /// bytes makes files of one size.
    @Test func filesShowNoValueAndNoLength() throws {
        defer { try? FileManager.default.removeItem(atPath: scratch) }
        let a = try Machine(creating: scratch + "/a")
        try a.set(uuidA, ["password": "x"])
        try a.set(uuidA, ["password": String(repeating: "p", count: 100)])
        try a.set(uuidA, ["comment": "a somewhat longer comment, with words in it"])
        try a.set(uuidA, ["username": "alice@example.org"])
        var sizes = Set<Int>()
        for relative in a.files() {
            let data = try Data(contentsOf: URL(fileURLWithPath: a.vaultPath + "/" + relative))
            sizes.insert(data.count)
            for needle in ["alice", "ppppp", "comment", "password", "username"] {
                #expect(data.range(of: Data(needle.utf8)) == nil, "\(needle) in \(relative)")
            }
        }
        #expect(sizes.count == 1, "\(sizes)")
    }

    /// A passphrase change writes a slot that retires the old one; two made apart both
    /// unlock until the next; a forged slot cannot retire a real one.
    @Test func keySlots() throws {
        defer { try? FileManager.default.removeItem(atPath: scratch) }
        let (a, b) = try pair()
        try a.folder.addSlot(passphrase: secret("from a"), parameters: .interactive, key: a.key!)
        try b.folder.addSlot(passphrase: secret("from b"), parameters: .interactive, key: b.key!)
        try b.reopen()
        #expect(throws: VaultError.wrongPassphrase) { try b.unlock() }
        try b.unlock("from b")
        try b.receive(from: a)
        try a.receive(from: b)
        for machine in [a, b] {
            try machine.reopen()
            try machine.unlock("from a")
            try machine.reopen()
            try machine.unlock("from b")
            #expect(machine.folder.slotCounts == (3, 2))
        }
        try a.folder.addSlot(passphrase: secret("third"), parameters: .interactive, key: a.key!)
        try a.reopen()
        #expect(throws: VaultError.wrongPassphrase) { try a.unlock("from b") }
        // Retired slots go once a genuine slot retired them: not even a forged retirement
        // could then bring an old passphrase back.
        try a.unlock("third")
        a.folder.removeRetiredSlots(key: a.key!)
        #expect(a.folder.slotCounts == (1, 1))
        try a.reopen()
        // A slot made without the master key that retires every other: ignored.
        let forger = try Machine(creating: scratch + "/forger", passphrase: "forger")
        try forger.folder.addSlot(passphrase: secret("forger"), parameters: .interactive, key: forger.key!)
        let keys = a.vaultPath + "/keys/"
        let forged = try #require(try FileManager.default.contentsOfDirectory(atPath: forger.vaultPath + "/keys").sorted().last)
        var bytes = [UInt8](try Data(contentsOf: URL(fileURLWithPath: forger.vaultPath + "/keys/" + forged)))
        // Rewrite its retired list to name a's slots (its proof then fails under a's key).
        let aSlots = try FileManager.default.contentsOfDirectory(atPath: keys).sorted()
        var slot = try KeySlot.parse(bytes)
        slot.retires = aSlots
        let header = slot.headerBytes()
        bytes = header + Array(bytes[slot.header.count...])
        try Data(bytes).write(to: URL(fileURLWithPath: keys + "ffffffffffffffff-7fffffffffffffff.slot"))
        try a.reopen()
        try a.unlock("third")
        #expect(a.value(uuidA, "username") == "alice")
        // A slot asking for more than SENSITIVE limits (an unlock of hours) is skipped.
        var huge = try KeySlot.parse([UInt8](try Data(contentsOf: URL(fileURLWithPath: keys + "ffffffffffffffff-7fffffffffffffff.slot"))))
        huge.parameters = KDFParameters(operations: 1 << 30, memoryBytes: 1 << 40)
        try Data(huge.headerBytes() + Array(bytes[huge.header.count...])).write(to: URL(fileURLWithPath: keys + "ffffffffffffffff-7ffffffffffffffe.slot"))
        try a.reopen()
        try a.unlock("third")
        #expect(a.folder.skipped["keys/ffffffffffffffff-7ffffffffffffffe.slot"] != nil)
    }

    /// Slots of other kinds (a recovery key's, a login password's) open only as their kind,
    /// and a new slot retires only the slots of its own kind: a passphrase change keeps the
    /// recovery key, a new recovery key retires the old one and keeps the passphrase.
    @Test func slotKindsOpenAndRetireApart() throws {
        defer { try? FileManager.default.removeItem(atPath: scratch) }
        let a = try Machine(creating: scratch + "/a")
        let key = try #require(a.key)
        try a.folder.addSlot(passphrase: secret("first recovery"), parameters: .interactive, key: key, kind: .recovery)
        try a.folder.addSlot(passphrase: secret("login password"), parameters: .interactive, key: key, kind: .login)
        #expect(a.folder.hasSlot(.recovery) && a.folder.hasSlot(.login))
        try a.reopen()
        // Each secret opens its own kind only.
        #expect(throws: VaultError.wrongPassphrase) { try a.folder.masterKey(passphrase: secret("first recovery")) }
        #expect(throws: VaultError.wrongPassphrase) { try a.folder.masterKey(passphrase: secret("correct horse"), kind: .recovery) }
        #expect(throws: VaultError.wrongPassphrase) { try a.folder.masterKey(passphrase: secret("login password"), kind: .recovery) }
        let opened = try a.folder.masterKey(passphrase: secret("first recovery"), kind: .recovery)
        #expect(opened.equals(key))
        #expect(try a.folder.masterKey(passphrase: secret("login password"), kind: .login).equals(key))
        // A passphrase change keeps the recovery and login slots.
        try a.unlock()
        try a.folder.addSlot(passphrase: secret("new passphrase"), parameters: .interactive, key: key)
        a.folder.removeRetiredSlots(key: key)
        try a.reopen()
        #expect(throws: VaultError.wrongPassphrase) { try a.unlock("correct horse") }
        try a.unlock("new passphrase")
        #expect(try a.folder.masterKey(passphrase: secret("first recovery"), kind: .recovery).equals(key))
        #expect(a.folder.currentParameters == .interactive)
        // A second recovery key retires the first; the passphrase still opens.
        try a.folder.addSlot(passphrase: secret("second recovery"), parameters: .interactive, key: key, kind: .recovery)
        a.folder.removeRetiredSlots(key: key)
        try a.reopen()
        #expect(throws: VaultError.wrongPassphrase) { try a.folder.masterKey(passphrase: secret("first recovery"), kind: .recovery) }
        #expect(try a.folder.masterKey(passphrase: secret("second recovery"), kind: .recovery).equals(key))
        try a.unlock("new passphrase")
        #expect(a.folder.slotCounts == (3, 3))
        // Removing the login slots leaves the others; its password opens nothing then.
        try a.folder.removeSlots(kind: .login)
        try a.reopen()
        #expect(!a.folder.hasSlot(.login) && a.folder.hasSlot(.recovery))
        #expect(throws: VaultError.wrongPassphrase) { try a.folder.masterKey(passphrase: secret("login password"), kind: .login) }
        try a.unlock("new passphrase")
        // The kind is in the authenticated header: a recovery slot relabelled a passphrase
        // slot on disk opens nothing.
        let keys = a.vaultPath + "/keys/"
        for name in try FileManager.default.contentsOfDirectory(atPath: keys) {
            var bytes = [UInt8](try Data(contentsOf: URL(fileURLWithPath: keys + name)))
            guard bytes[9] == SlotKind.recovery.rawValue else { continue }
            bytes[9] = SlotKind.passphrase.rawValue
            try Data(bytes).write(to: URL(fileURLWithPath: keys + name))
        }
        try a.reopen()
        #expect(throws: VaultError.wrongPassphrase) { try a.folder.masterKey(passphrase: secret("second recovery")) }
        // A kind this version does not know is skipped and named.
        let unknown = try #require(try FileManager.default.contentsOfDirectory(atPath: keys).sorted().first)
        var bytes = [UInt8](try Data(contentsOf: URL(fileURLWithPath: keys + unknown)))
        bytes[9] = 9
        try Data(bytes).write(to: URL(fileURLWithPath: keys + "ffffffffffffffff-7fffffffffffffff.slot"))
        try a.reopen()
        try a.unlock("new passphrase")
        #expect(a.folder.skipped["keys/ffffffffffffffff-7fffffffffffffff.slot"]?.contains("unknown kind") == true)
    }

    /// A machine folds its own files into one; the accounts stay the same, and other
    /// machines' references to its changes stay true.
    @Test func foldingKeepsTheAccounts() throws {
        defer { try? FileManager.default.removeItem(atPath: scratch) }
        let (a, b) = try pair()
        for round in 0..<60 {
            try a.set(uuidA, ["password": "p\(round)"])
            if round % 3 == 0 { try a.set(uuidB, ["label": "l\(round)", "comment": "c\(round)"]) }
        }
        try b.set(uuidA, ["password": "b apart"])
        try b.receive(from: a)
        let before = a.files().count
        try a.folder.fold(key: a.key!)
        #expect(a.folder.ownFiles.count == 1 && before > 60)
        try a.receive(from: b)
        try a.reopen()
        try a.unlock()
        #expect(a.value(uuidA, "password") == "b apart")
        #expect(a.others(uuidA, "password") == ["p59"])
        #expect(a.value(uuidB, "comment") == "c57")
        // b's change had seen a's first password: folding a must not bring that back.
        let folded = try Data(contentsOf: URL(fileURLWithPath: a.vaultPath + "/" + a.folder.ownFiles[0]))
        #expect(folded.count < 4096, "\(folded.count) bytes")
    }

    /// Three machines make random changes apart and sync in random orders and pairs; after
    /// a full round all show the same accounts, and every value written is shown, listed
    /// among its field's conflicts, replaced by a change that had seen it, or removed by a
    /// removal that had seen it and took effect.
    @Test(arguments: 0..<12) func randomChangesConverge(seed: Int) throws {
        let base = scratch + "/seed\(seed)"
        defer { try? FileManager.default.removeItem(atPath: scratch) }
        var random = UInt64(seed) &* 0x9E37_79B9_7F4A_7C15 &+ 1
        func next(_ bound: Int) -> Int {
            random ^= random << 13; random ^= random >> 7; random ^= random << 17
            return Int(random % UInt64(bound))
        }
        let first = try Machine(creating: base + "/m0")
        let machines = [first, try Machine(cloning: first, into: base + "/m1"), try Machine(cloning: first, into: base + "/m2")]
        let names = [uuidA, uuidB, "0f8fad5b-d9cb-469f-a165-70867728950e", "7c9e6679-7425-40de-944b-e07fc1f90ae7"]
        let fieldNames = ["label", "username", "password", "comment"]
        var written: [(uuid: [UInt8], field: String, id: ChangeID, seen: [UInt64: UInt64])] = []
        var removals: [(uuid: [UInt8], id: ChangeID, seen: Set<ChangeID>)] = []
        var log: [String] = []
        func record(_ change: AccountChange) {
            for field in change.fields ?? [] { written.append((change.uuid, field.name, change.id, field.seen)) }
        }
        for step in 0..<80 {
            let machine = machines[next(3)], name = names[next(names.count)]
            switch next(100) {
            case 0..<40:
                var values: [String: String] = [:]
                for _ in 0...next(2) { values[fieldNames[next(fieldNames.count)]] = "v\(step)-\(next(1000))" }
                record(try machine.set(name, values))
                log.append("\(step) m\(machines.firstIndex { $0 === machine }!) set \(name.prefix(4)) \(values)")
            case 40..<55:
                guard machine.account(name) != nil else { continue }
                let change = try machine.remove(name)
                removals.append((change.uuid, change.id, Set(change.seen)))
                log.append("\(step) m\(machines.firstIndex { $0 === machine }!) remove \(name.prefix(4))")
            case 55..<65:
                guard let account = machine.account(name),
                      let field = account.fields.first(where: { !$0.value.others.isEmpty }) else { continue }
                record(try machine.set(name, [field.key: text(field.value.shown.value)]))
                log.append("\(step) resolve \(name.prefix(4)) \(field.key)")
            case 65..<95:
                let other = machines[next(3)]
                guard other !== machine else { continue }
                try machine.receive(from: other)
                if next(2) == 0 { try other.receive(from: machine) }
                log.append("\(step) sync")
            default:
                try machine.fold()
                log.append("\(step) fold")
            }
        }
        for _ in 0..<2 { for a in machines { for b in machines where a !== b { try a.receive(from: b) } } }
        func summary(_ m: Machine) -> String {
            m.accounts.values.sorted { $0.name < $1.name }.map { account in
                account.name + ":" + account.fields.keys.sorted().map { field in
                    let f = account.fields[field]!
                    return "\(field)=\(text(f.shown.value))+" + f.others.map { text($0.value) }.sorted().joined(separator: "/")
                }.joined(separator: ",") + " r\(account.removalConflicts.count)"
            }.joined(separator: " ")
        }
        let shown = summary(machines[0])
        #expect(summary(machines[1]) == shown, "seed \(seed)\n\(log.joined(separator: "\n"))")
        #expect(summary(machines[2]) == shown, "seed \(seed)")
        let accounts = machines[0].accounts
        for value in written {
            let account = accounts[value.uuid]
            if let field = account?.fields[value.field], field.shown.id == value.id || field.others.contains(where: { $0.id == value.id }) { continue }
            if written.contains(where: { $0.uuid == value.uuid && $0.field == value.field && $0.id != value.id && ($0.seen[value.id.device] ?? 0) >= value.id.clock }) { continue }
            if removals.contains(where: { $0.uuid == value.uuid && $0.seen.contains(value.id) && (account == nil || account!.effectiveRemovals.contains($0.id)) }) { continue }
            Issue.record("seed \(seed): value \(value.field) of \(value.id) is lost\n\(log.joined(separator: "\n"))\n\(shown)")
        }
    }

    /// docs/vault-format-3.md's test vectors: two devices, a conflict and a removal, made
    /// with counting "random" bytes and a fixed wall clock; every file must match the hex
    /// there, and the folder must open to the accounts the document says.
    @Test func testVectorsInTheFormatDocument() throws {
        defer { try? FileManager.default.removeItem(atPath: scratch) }
        let fixed: @Sendable () -> UInt64 = { 1_800_000_000_000 }
        let passphrase = "correct horse battery staple"
        try FileManager.default.createDirectory(atPath: scratch + "/a", withIntermediateDirectories: true)
        try FileManager.default.createDirectory(atPath: scratch + "/b", withIntermediateDirectories: true)
        let (folderA, key) = try VaultFolder.create(at: scratch + "/a/vault", deviceFile: scratch + "/a/device",
                                                    passphrase: secret(passphrase), parameters: .interactive,
                                                    random: CountingRandom(), now: fixed)
        func set(_ folder: VaultFolder, _ name: String, _ values: [(String, String)]) throws {
            let current = VaultMerge.accounts(folder.changes)[AccountName.uuidBytes(name)!]
            let fields = values.map { AccountChange.FieldValue(name: $0.0, seen: current?.fields[$0.0]?.seen ?? [:], value: secret($0.1)) }
            try folder.write([AccountChange(kind: .set, id: ChangeID(device: 0, clock: 0, index: 0), uuid: AccountName.uuidBytes(name)!,
                                            name: name, seen: [], fields: fields)], key: key)
        }
        try set(folderA, uuidA, [("username", "alice"), ("password", "hunter2")])
        try set(folderA, uuidB, [("label", "old")])
        try FileManager.default.copyItem(atPath: scratch + "/a/vault", toPath: scratch + "/b/vault")
        let startB = CountingRandom()
        startB.next = 0x80
        let folderB = try VaultFolder(path: scratch + "/b/vault", deviceFile: scratch + "/b/device", random: startB, now: fixed)
        try folderB.open(with: try folderB.masterKey(passphrase: secret(passphrase)), arena: SecureArena())
        try set(folderA, uuidA, [("password", "from-a")])
        try set(folderB, uuidA, [("password", "from-b")])
        let removed = try #require(VaultMerge.accounts(folderB.changes)[AccountName.uuidBytes(uuidB)!])
        try folderB.write([AccountChange(kind: .remove, id: ChangeID(device: 0, clock: 0, index: 0), uuid: removed.uuid,
                                         name: uuidB, seen: removed.sets, fields: [])], key: key)
        // Both folders' files, by path: what the document lists.
        var files: [String: [UInt8]] = [:]
        for base in [scratch + "/a/vault", scratch + "/b/vault"] {
            for relative in try FileManager.default.subpathsOfDirectory(atPath: base) where relative.contains(".") {
                files[relative] = [UInt8](try Data(contentsOf: URL(fileURLWithPath: base + "/" + relative)))
            }
        }
        files["id"] = [UInt8](try Data(contentsOf: URL(fileURLWithPath: scratch + "/a/vault/id")))
        let document = (try? String(contentsOf: URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
            .deletingLastPathComponent().appendingPathComponent("docs/vault-format-3.md"), encoding: .utf8)) ?? ""
        var printed = ""
        for (relative, bytes) in files.sorted(by: { $0.key < $1.key }) {
            let hex = bytes.map { String(format: "%02x", $0) }.joined()
            let lines = stride(from: 0, to: hex.count, by: 64).map { i -> String in
                let start = hex.index(hex.startIndex, offsetBy: i)
                return String(hex[start..<hex.index(start, offsetBy: min(64, hex.count - i))])
            }
            printed += "`\(relative)` (\(bytes.count) bytes):\n\n```hex-v3 \(relative)\n" + lines.joined(separator: "\n") + "\n```\n\n"
            let block = document.components(separatedBy: "```hex-v3 \(relative)\n").dropFirst().first?.components(separatedBy: "```").first
            #expect(block.map { VaultTests.bytes(hex: $0) } == bytes, "\(relative) differs from the document")
        }
        if !document.contains("```hex-v3") { print(printed) }
        // And the folder opens, from a copy of every file, to what the document says.
        try FileManager.default.createDirectory(atPath: scratch + "/c/vault", withIntermediateDirectories: true)
        for (relative, bytes) in files {
            let target = scratch + "/c/vault/" + relative
            try FileManager.default.createDirectory(atPath: (target as NSString).deletingLastPathComponent, withIntermediateDirectories: true)
            try Data(bytes).write(to: URL(fileURLWithPath: target))
        }
        let reader = try VaultFolder(path: scratch + "/c/vault", deviceFile: scratch + "/c/device")
        try reader.open(with: try reader.masterKey(passphrase: secret(passphrase)), arena: SecureArena())
        let accounts = VaultMerge.accounts(reader.changes)
        let account = try #require(accounts[AccountName.uuidBytes(uuidA)!])
        #expect(accounts.count == 1)
        #expect(text(account.fields["password"]!.shown.value) == "from-b")
        #expect(account.fields["password"]!.others.map { text($0.value) } == ["from-a"])
        #expect(text(account.fields["username"]!.shown.value) == "alice")
    }
}

/// A scan made without the owner's lock (`scanBasis`, `scan`, `apply`) against the folder's
/// own writes: a file being written when the scan began, and listed before its write, is
/// not taken for one that went (the model-based test found the value reverting).
@Suite struct VaultFolderScanTests {
    static let name = "6ba7b810-9dad-11d1-80b4-00c04fd430c8"

    /// An account labelled "old", and a change to "new" prepared (counted by the folder,
    /// not yet written): its file and the account.
    static func relabelPrepared(_ machine: Machine) throws -> (VaultFolder.PreparedFile, [UInt8]) {
        try machine.set(name, ["label": "old"])
        let uuid = try #require(AccountName.uuidBytes(name))
        let seen = machine.account(name)?.fields["label"]?.seen ?? [:]
        let change = AccountChange(kind: .set, id: ChangeID(device: 0, clock: 0, index: 0), uuid: uuid, name: name, seen: [],
                                   fields: [.init(name: "label", seen: seen, value: secret("new"))])
        return (try machine.folder.prepare([change], key: try #require(machine.key)).0, uuid)
    }

    @Test func aFileBeingWrittenWhenTheScanBeganStays() throws {
        let home = FileManager.default.temporaryDirectory.appendingPathComponent("mtmfs-scan-\(UUID().uuidString)").path
        defer { try? FileManager.default.removeItem(atPath: home) }
        let machine = try Machine(creating: home)
        // A save prepared (under the owner's lock) and not yet written.
        let (file, uuid) = try Self.relabelPrepared(machine)
        let basis = machine.folder.scanBasis()
        let arena = SecureArena()
        let found = VaultFolder.scan(basis, key: machine.key, arena: arena)  // lists the folder before the write
        file.write()
        machine.folder.finish(file)
        #expect(file.error == nil)
        #expect(try machine.folder.apply(found) == .unchanged)
        #expect(machine.value(Self.name, "label") == "new")
        // A file that was on disk when the scan began and is gone now does go.
        try FileManager.default.removeItem(atPath: machine.vaultPath + "/" + file.relative)
        let again = VaultFolder.scan(machine.folder.scanBasis(), key: machine.key, arena: arena)
        #expect(try machine.folder.apply(again) == .changed([uuid]))
        #expect(machine.value(Self.name, "label") == "old")
        arena.releaseAll()
    }

    /// A lock seals a change and writes it after the owner's lock; an unlock that reads the
    /// folder meanwhile does not find it yet: once written, the folder says a scan is due,
    /// and the scan takes it in.
    @Test func aFileALockWroteWhileAnUnlockReadTheFolderIsTakenInByTheNextScan() throws {
        let home = FileManager.default.temporaryDirectory.appendingPathComponent("mtmfs-scan-\(UUID().uuidString)").path
        defer { try? FileManager.default.removeItem(atPath: home) }
        let machine = try Machine(creating: home)
        let key = try #require(machine.key)
        let (file, uuid) = try Self.relabelPrepared(machine)
        machine.folder.close()                                // the lock
        try machine.folder.open(with: key, arena: machine.arena)  // an unlock, before the write
        file.write()
        machine.folder.finish(file)
        #expect(machine.folder.needsScan)
        #expect(machine.value(Self.name, "label") == "old")
        let arena = SecureArena()
        let found = VaultFolder.scan(machine.folder.scanBasis(), key: key, arena: arena)
        #expect(try machine.folder.apply(found) == .changed([uuid]))
        #expect(!machine.folder.needsScan)
        #expect(machine.value(Self.name, "label") == "new")
    }
}

