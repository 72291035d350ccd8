#if canImport(Glibc)
import Glibc
#endif
import Posix
import SecureMemory

/// A vault kept as a folder of format 3 (`VaultFolder`, `docs/vault-format-3.md`) behind the
/// same `Vault` API: each change is one new change file, the accounts are the merge of all
/// of them. The guarding flag is the field `guard` of the all-zero UUID; an account's
/// trusted programs are its field `trusted` (the list as format 2 encodes it).
///
/// Thread-safety: as `Vault` (the owner serializes access).
extension Vault {
    /// The pseudo-account that holds vault-wide fields (the guarding flag).
    static let vaultRecord = [UInt8](repeating: 0, count: 16)
    static let vaultRecordName = "00000000-0000-0000-0000-000000000000"
    /// The record that holds the vault's own settings (guarding), not an account.
    public static var vaultRecordUUID: [UInt8] { vaultRecord }

    /// Creates a vault folder at `path` (which must not exist), its device file beside it,
    /// and returns it unlocked.
    public static func createFolder(at path: String, passphrase: SecureBytes, parameters: KDFParameters, guarded: Bool = false,
                                    random: RandomSource = SystemRandom()) throws(VaultError) -> Vault {
        let (folder, key) = try VaultFolder.create(at: path, deviceFile: deviceFile(for: path), passphrase: passphrase,
                                                   parameters: parameters, random: random)
        let vault = Vault(folder: folder, random: random, parameters: parameters)
        try vault.adoptKey(key)
        if guarded { try vault.setGuarded(true) }
        return vault
    }

    /// `DATA_DIR/device` for `DATA_DIR/vault`.
    static func deviceFile(for path: String) -> String { AtomicFile.parentDirectory(of: path) + "/device" }

    /// Whether `path` is a vault folder (else a single file of format 1 or 2, or nothing).
    public static func isFolder(_ path: String) -> Bool {
        guard let info = try? Syscall.stat(path) else { return false }
        return info.st_mode & S_IFMT == S_IFDIR
    }

    // MARK: What the changes make

    /// Rebuilds everything from the folder's changes: the accounts in the order they were
    /// made (locked: UUIDs and names only), and while unlocked the fields, trusted lists,
    /// the guarding flag and the index.
    public func refreshFromFolder() {
        guard let folder else { return }
        let merged = VaultMerge.accounts(folder.changes)
        var made: [(first: ChangeID, record: SealedRecord)] = []
        for (uuid, account) in merged where uuid != Self.vaultRecord {
            made.append((account.sets.min() ?? ChangeID(device: 0, clock: 0, index: 0),
                         SealedRecord(uuid: uuid, name: account.name, nonce: [], ciphertext: [])))
        }
        records = made.sorted { $0.first < $1.first }.map(\.record)
        guard isUnlocked else { return }
        fields.removeAll()
        trusted.removeAll()
        conflicted.removeAll()
        named.removeAll()
        for (uuid, account) in merged where uuid != Self.vaultRecord { adopt(account) }
        guarded = merged[Self.vaultRecord]?.fields["guard"].map { $0.shown.value.count == 1 && $0.shown.value.withUnsafeBytes { $0[0] } == UInt8(ascii: "1") } ?? false
        // The index's key stays for as long as the vault is unlocked (its digests name the
        // same values before and after); an unlock made it.
        index?.removeAll()
        for record in records { reindexAccount(record.uuid) }
    }

    /// One account's fields and trusted list from its merge (values are the folder's own).
    private func adopt(_ account: VaultMerge.Account) {
        var values: [AccountField: SecureBytes] = [:]
        for field in AccountField.allCases {
            if let value = account.fields[field.rawValue]?.shown.value, value.count > 0 { values[field] = value }
        }
        fields[account.uuid] = values
        var others: [String: SecureBytes] = [:]
        for (name, field) in account.fields where !Self.ownFieldNames.contains(name) && field.shown.value.count > 0 {
            others[name] = field.shown.value
        }
        named[account.uuid] = others.isEmpty ? nil : others
        var conflicts = AccountConflicts()
        for field in AccountField.allCases {
            guard let others = account.fields[field.rawValue]?.others, !others.isEmpty else { continue }
            conflicts.fields[field] = others.map { AccountConflicts.Other(device: $0.id.device, milliseconds: $0.id.clock >> 16, value: $0.value) }
        }
        conflicts.removals = account.removalConflicts.map { AccountConflicts.Other(device: $0.device, milliseconds: $0.clock >> 16, value: SecureBytes()) }
        conflicted[account.uuid] = conflicts.isEmpty ? nil : conflicts
        let programs = account.fields["trusted"].map { Self.decodeTrusted($0.shown.value) } ?? []
        let list = programs.isEmpty ? nil : programs
        // (Set only when it changed: `trustChanges` counts changes of who is trusted, and an
        // open decided meanwhile is decided again for each.)
        if trusted[account.uuid] != list { trusted[account.uuid] = list }
    }

    /// The names of fields the vault itself gives a meaning to; every other name is a named
    /// field (`namedFields`).
    static let ownFieldNames: Set<String> = Set(AccountField.allCases.map(\.rawValue) + ["trusted", "guard", collectionLabelField])

    /// The field of the all-zero UUID that holds the Secret Service collection's label.
    static let collectionLabelField = "collection-label"

    /// The Secret Service collection's label as set (nil: never set, or a single file):
    /// sealed in the vault, so that it travels with the folder. Unlocked only.
    public func collectionLabel() throws(VaultError) -> String? {
        _ = try requireKey()
        guard let folder, let field = VaultMerge.account(Self.vaultRecord, folder.changes(of: Self.vaultRecord))?
            .fields[Self.collectionLabelField], field.shown.value.count > 0 else { return nil }
        return field.shown.value.withUnsafeBytes { String(decoding: $0, as: UTF8.self) }
    }

    /// Sets the collection's label (empty: back to the default). A folder's only.
    public func setCollectionLabel(_ label: String) throws(VaultError) {
        _ = try requireKey()
        guard folder != nil else { throw .io(.invalidArgument) }
        let value: SecureBytes
        do throws(Errno) { value = label.isEmpty ? SecureBytes() : try SecureBytes(copying: Array(label.utf8)) } catch { throw .io(error) }
        defer { value.wipe() }
        try writeFields([(Self.collectionLabelField, value)], of: Self.vaultRecord, name: Self.vaultRecordName)
    }

    /// An account's named fields (not `AccountField`'s): a folder's only. The values are the
    /// vault's own secure bytes: do not keep or change them.
    public func namedFields(of uuid: [UInt8]) throws(VaultError) -> [String: SecureBytes] {
        _ = try requireKey()
        guard fields[uuid] != nil else { throw .noSuchAccount }
        return named[uuid] ?? [:]
    }

    /// Sets named fields of one account together (an empty value removes one), and any
    /// `AccountField` with them, in one change. A single-file vault has no place for them.
    public func setFields(_ changes: [AccountField: SecureBytes], named namedChanges: [String: SecureBytes],
                          of uuid: [UInt8]) throws(VaultError) {
        _ = try requireKey()
        guard fields[uuid] != nil else { throw .noSuchAccount }
        guard folder != nil else { throw .io(.invalidArgument) }
        guard namedChanges.keys.allSatisfy({ !Self.ownFieldNames.contains($0) && !$0.isEmpty && $0.utf8.count <= 255 }) else {
            throw .io(.invalidArgument)
        }
        let values = changes.map { ($0.key.rawValue, $0.value) } + namedChanges.map { ($0.key, $0.value) }
        try writeFields(values.sorted { $0.0 < $1.0 }.map { (name: $0.0, value: $0.1) }, of: uuid,
                        name: name(of: uuid) ?? AccountName.string(uuid))
    }

    /// The accounts whose named field `name` is exactly `value`, through the index.
    public func accounts(namedField name: String, equalTo value: UnsafeRawBufferPointer) throws(VaultError) -> [[UInt8]] {
        guard let index else { throw .locked }
        return index.accounts(in: .named(index.digest(name: name, value: value)))
    }

    /// The first and the last time an account was changed (milliseconds since 1970), from
    /// its change files.
    public func times(of uuid: [UInt8]) -> (created: UInt64, modified: UInt64)? {
        guard let folder else { return nil }
        let clocks = folder.changes(of: uuid).filter { $0.kind == .set }.map { $0.id.clock >> 16 }
        guard let first = clocks.min(), let last = clocks.max() else { return nil }
        return (first, last)
    }

    /// After a change of one account: it alone is merged again.
    private func refresh(_ uuid: [UInt8]) {
        guard let folder else { return }
        let account = VaultMerge.account(uuid, folder.changes(of: uuid))
        if uuid == Self.vaultRecord {
            guarded = account?.fields["guard"].map { $0.shown.value.count == 1 && $0.shown.value.withUnsafeBytes { $0[0] } == UInt8(ascii: "1") } ?? false
            return
        }
        if let account {
            if let position = records.firstIndex(where: { $0.uuid == uuid }) {
                records[position].name = account.name
            } else {
                records.append(SealedRecord(uuid: uuid, name: account.name, nonce: [], ciphertext: []))
            }
            adopt(account)
            reindexAccount(uuid)
        } else {
            records.removeAll { $0.uuid == uuid }
            fields[uuid] = nil
            conflicted[uuid] = nil
            trusted[uuid] = nil
            named[uuid] = nil
            index?.remove(uuid)
        }
    }

    // MARK: Conflicts

    /// An account's conflicts (nil: none, or locked): each field's other current values,
    /// and the removals that lost against a change made apart. The values are the vault's
    /// own (valid while unlocked and until the next change).
    public func conflicts(of uuid: [UInt8]) -> AccountConflicts? { conflicted[uuid] }

    /// Unresolved conflicts while unlocked: a field with other values counts one, an
    /// account's lost removals one.
    public var conflictCount: Int { conflicted.values.reduce(0) { $0 + $1.fields.count + ($1.removals.isEmpty ? 0 : 1) } }

    /// Change files of the folder loaded, and those passed over with why (nil: a single file).
    public var folderFiles: (loaded: Int, skipped: [String: String])? { folder.map { ($0.files.count, $0.skipped) } }

    // MARK: Changes

    /// Writes one set change of `uuid` with `values` (an empty value clears its field).
    func writeFields(_ values: [(name: String, value: SecureBytes)], of uuid: [UInt8], name: String) throws(VaultError) {
        guard let folder else { return }
        let key = try requireKey()
        let current = VaultMerge.account(uuid, folder.changes(of: uuid))
        var written: [AccountChange.FieldValue] = []
        for (field, value) in values {
            guard let copy = value.withUnsafeBytes({ try? SecureBytes.allocate(copying: $0, in: arena) }) else {
                written.forEach { $0.value.wipe() }
                throw .io(.noMemory)
            }
            written.append(AccountChange.FieldValue(name: field, seen: current?.fields[field]?.seen ?? [:], value: copy))
        }
        let removals = folder.changes(of: uuid).filter { $0.kind == .remove }.map(\.id)
        let change = AccountChange(kind: .set, id: ChangeID(device: 0, clock: 0, index: 0), uuid: uuid, name: name,
                                   seen: Array(Set(removals)).sorted(), fields: written)
        do {
            try commit([change], to: folder, key: key)
        } catch {
            written.forEach { $0.value.wipe() }
            throw error
        }
        refresh(uuid)
    }

    func folderAddAccounts(_ accounts: [(uuid: [UInt8], name: String, fields: [AccountField: SecureBytes], trusting: [TrustedProgram])]) throws(VaultError) {
        guard let folder else { return }
        let key = try requireKey()
        var changes: [AccountChange] = []
        var copies: [SecureBytes] = []
        for account in accounts {
            var values: [AccountChange.FieldValue] = []
            for (field, value) in account.fields.sorted(by: { $0.key.rawValue < $1.key.rawValue }) where value.count > 0 {
                guard let copy = value.withUnsafeBytes({ try? SecureBytes.allocate(copying: $0, in: arena) }) else {
                    copies.forEach { $0.wipe() }
                    throw .io(.noMemory)
                }
                copies.append(copy)
                values.append(AccountChange.FieldValue(name: field.rawValue, seen: [:], value: copy))
            }
            if !account.trusting.isEmpty {
                let list: SecureBytes
                do throws(Errno) { list = try Self.encodeTrusted(account.trusting) } catch { copies.forEach { $0.wipe() }; throw .io(error) }
                copies.append(list)
                values.append(AccountChange.FieldValue(name: "trusted", seen: [:], value: list))
            }
            let removals = folder.changes(of: account.uuid).filter { $0.kind == .remove }.map(\.id)
            changes.append(AccountChange(kind: .set, id: ChangeID(device: 0, clock: 0, index: 0), uuid: account.uuid,
                                         name: account.name, seen: Array(Set(removals)).sorted(), fields: values))
        }
        do {
            try commit(changes, to: folder, key: key)
        } catch {
            copies.forEach { $0.wipe() }
            throw error
        }
        for account in accounts { refresh(account.uuid) }
    }

    func folderRemoveAccount(uuid: [UInt8]) throws(VaultError) {
        guard let folder else { return }
        let key = try requireKey()
        guard let account = VaultMerge.account(uuid, folder.changes(of: uuid)) else { throw .noSuchAccount }
        try commit([AccountChange(kind: .remove, id: ChangeID(device: 0, clock: 0, index: 0), uuid: uuid,
                                        name: account.name, seen: account.sets, fields: [])], to: folder, key: key)
        refresh(uuid)
    }

    /// Writes `changes` as one file now, or (`defersWrites`) prepares it for whoever takes it.
    private func commit(_ changes: [AccountChange], to folder: VaultFolder, key: SecureBytes) throws(VaultError) {
        guard defersWrites else {
            try folder.write(changes, key: key)
            return
        }
        prepared.append(try folder.prepare(changes, key: key).0)
    }

    /// Reads the folder again (files a synchroniser or git brought or took away); while
    /// unlocked the new files are opened, and the accounts made again when anything changed.
    /// Returns whether anything did.
    /// A file this vault wrote is on disk and not read (see `VaultFolder.needsScan`).
    public var folderNeedsScan: Bool { folder?.needsScan == true }

    /// Scans the folder made with the owner's lock held (`VaultFolder.lockedScans`; nil for
    /// a single file): a daemon's come at unlock only.
    public var lockedFolderScans: Int? { folder?.lockedScans }

    /// A scan's start, under the owner's lock: the folder's basis and, while unlocked, a
    /// copy of the master key for the scan to open new files with (the caller wipes it).
    /// nil for a single-file vault.
    public func folderScanBasis() -> (basis: VaultFolder.ScanBasis, key: SecureBytes?)? {
        guard let folder else { return nil }
        return (folder.scanBasis(), try? masterKey?.copy())
    }

    /// Takes in a scan made without the owner's lock (`VaultFolder.scan`, its values in
    /// `arena`, which is released here: they are copied into the vault's own), and merges
    /// again the accounts whose changes came or went — all of them only when one is new
    /// (the order of `accounts`) or the vault is locked. Copies and merges: no disk, no
    /// decryption.
    public func applyFolderScan(_ found: VaultFolder.Scan, arena scanArena: SecureArena) -> VaultFolder.Applied {
        defer { scanArena.releaseAll() }
        guard let folder, folder.isCurrent(found) else {
            found.wipe()
            return folder == nil ? .unchanged : .stale
        }
        let applied: VaultFolder.Applied
        do throws(VaultError) {
            do throws(Errno) { try found.move(into: arena) } catch { throw .io(error) }
            applied = try folder.apply(found)
        } catch {
            found.wipe()
            Log.error("vault folder not read again: \(error.description)")
            return .unchanged
        }
        guard case .changed(let affected) = applied else { return applied }
        let known = Set(records.map(\.uuid))
        if !isUnlocked || affected.contains(where: { !known.contains($0) && $0 != Self.vaultRecord }) {
            refreshFromFolder()
        } else {
            for uuid in affected { refresh(uuid) }
        }
        return applied
    }

    // MARK: Writes outside the owner's lock

    /// The files prepared since the last take (emptied): the taker writes each (`write`,
    /// with the owner's lock let go) and then finishes it here, under the lock again.
    public func takePrepared() -> [VaultFolder.PreparedFile] {
        defer { prepared.removeAll() }
        return prepared
    }

    /// Under the owner's lock, after `file.write()`: a file that could not be written takes
    /// its changes back; `refreshFromFolder` then shows what is on disk.
    public func finishPrepared(_ file: VaultFolder.PreparedFile) {
        folder?.finish(file)
    }

    /// Writes what was prepared and not taken (under the lock: only a lock does this, so
    /// that no change is dropped with the keys).
    func writeUntaken() {
        guard let folder, !prepared.isEmpty else { return }
        for file in takePrepared() {
            file.write()
            folder.finish(file)
            if let error = file.error { Log.error("a vault change could not be written at lock: \(error.description)") }
        }
    }

    /// Whether this device's files are due a fold (`VaultFolder.foldThreshold`, at least 64).
    public var foldIsDue: Bool {
        guard let folder, folder.isOpen, folder.pendingCount == 0, prepared.isEmpty else { return false }
        return folder.ownFileCount > folder.foldThreshold(minimum: Self.foldMinimum)
    }

    static let foldMinimum = 64

    /// Under the owner's lock: a fold of this device's files, to write outside it (nil: none due).
    public func prepareFold() throws(VaultError) -> VaultFolder.PreparedFold? {
        guard let folder, foldIsDue else { return nil }
        return try folder.prepareFold(key: try requireKey())
    }

    /// Under the owner's lock, after the fold's file was written.
    public func finishFold(_ fold: VaultFolder.PreparedFold) {
        folder?.finishFold(fold)
    }

    // MARK: Trusted lists, as format 2 encodes them

    static func encodeTrusted(_ programs: [TrustedProgram]) throws(Errno) -> SecureBytes {
        var list = VaultFormat.bigEndian(UInt64(programs.count), 2)
        for program in programs {
            let path = Array(program.path.utf8.prefix(Int(UInt16.max)))
            list += program.sha256 + VaultFormat.bigEndian(UInt64(path.count), 2) + path
        }
        return try SecureBytes(copying: list)
    }

    static func decodeTrusted(_ value: SecureBytes) -> [TrustedProgram] {
        value.withUnsafeBytes { bytes -> [TrustedProgram] in
            guard bytes.count >= 2 else { return [] }
            var programs: [TrustedProgram] = []
            var position = 2
            for _ in 0..<(Int(bytes[0]) << 8 | Int(bytes[1])) {
                guard bytes.count - position >= 34 else { return programs }
                let digest = Array(bytes[position..<position + 32])
                let length = Int(bytes[position + 32]) << 8 | Int(bytes[position + 33])
                position += 34
                guard bytes.count - position >= length,
                      let path = String(validating: bytes[position..<position + length], as: UTF8.self) else { return programs }
                programs.append(TrustedProgram(sha256: digest, path: path))
                position += length
            }
            return programs
        }
    }
}

/// What of one account's changes made apart did not settle into one value (SPEC §2b):
/// shown in `accounts/<UUID>/conflicts/`.
///
/// Thread-safety: as `Vault` (its values are the vault's).
public struct AccountConflicts: @unchecked Sendable {
    /// One other value (or a removal: its value empty), with the device and the time (ms
    /// since 1970) of its change.
    public struct Other: @unchecked Sendable {
        public let device: UInt64
        public let milliseconds: UInt64
        public let value: SecureBytes
    }

    public var fields: [AccountField: [Other]] = [:]
    public var removals: [Other] = []

    var isEmpty: Bool { fields.isEmpty && removals.isEmpty }
}
