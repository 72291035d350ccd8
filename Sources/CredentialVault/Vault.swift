#if canImport(Glibc)
import Glibc
#endif
import CSodium
import Posix
import SecureMemory

/// The fields of one service account (Keychain attribute in parentheses).
public enum AccountField: String, CaseIterable, Sendable {
    case label        // kSecAttrLabel
    case `protocol`   // kSecAttrProtocol
    case server       // kSecAttrServer
    case port         // kSecAttrPort
    case path         // kSecAttrPath
    case comment      // kSecAttrComment
    case username     // kSecAttrAccount
    case password     // kSecValueData
    case otp          // a TOTP secret or otpauth:// URI (SPEC §2d; a vault folder only)

    /// The fields a single-file vault (format 1 or 2) holds, in its record order.
    static let singleFileFields: [AccountField] = [.label, .protocol, .server, .port, .path, .comment, .username, .password]
}

/// Why the vault cannot do what was asked, each with the message a user sees.
public enum VaultError: Error, Equatable, CustomStringConvertible, Sendable {
    case wrongPassphrase
    case locked
    case damaged(String)
    case weakParameters
    case noSuchAccount
    case accountExists
    case io(Errno)

    public var description: String {
        switch self {
        case .wrongPassphrase: "wrong passphrase"
        case .locked: "the vault is locked: unlock it first (mtmfs unlock)"
        case .damaged(let reason): "vault damaged: \(reason)"
        case .weakParameters: "vault damaged: key-derivation parameters below the INTERACTIVE limits"
        case .noSuchAccount: "no such account"
        case .accountExists: "the account exists already"
        case .io(let error): "vault unreadable: \(error)"
        }
    }

    /// What a file operation on accounts/ answers.
    public var errno: Errno {
        switch self {
        case .wrongPassphrase, .locked: .permissionDenied
        case .damaged, .weakParameters: .ioError
        case .noSuchAccount: .noSuchFileOrDirectory
        case .accountExists: .fileExists
        case .io(let error): error
        }
    }
}

/// Where random bytes come from: the system (libsodium) except in the format's test vector.
public protocol RandomSource {
    func bytes(_ count: Int) -> [UInt8]
}

public struct SystemRandom: RandomSource {
    public init() {}
    public func bytes(_ count: Int) -> [UInt8] { Sodium.randomBytes(count) }
}

/// The credential vault: one file of sealed account records under a master key, which is
/// itself wrapped by a key derived from the passphrase.
///
/// Locked, it knows the account UUIDs and names (stored in clear) and nothing else. Unlocked,
/// it holds the master key and every decrypted field in `SecureBytes`; `lock()` zeroes and
/// frees all of it. Every change reseals what changed with fresh nonces and replaces the
/// file atomically and durably.
///
/// Thread-safety: none of its own; the owner serializes access.
public final class Vault: @unchecked Sendable {
    public let path: String
    let random: RandomSource
    private(set) var parameters: KDFParameters
    private var salt: [UInt8]
    let storeID: [UInt8]
    private var wrapNonce: [UInt8]
    private var wrappedKey: [UInt8]
    /// The sealed records, in file order.
    var records: [SealedRecord] {  // internal: tests tamper with it
        didSet { recordIndex = nil }
    }
    /// Name and UUID → position in `records`, built when first needed after a change.
    private var recordIndex: (byName: [String: Int], byUUID: [[UInt8]: Int])?
    private var manifestNonce: [UInt8]
    private var manifestCiphertext: [UInt8]

    /// The format the file is in: 1 (read, upgraded at the first change) or 2.
    public private(set) var formatVersion: UInt16 = VaultFormat.version
    /// A version-1 vault's master key wrapped for version 2, made at unlock (the only time
    /// the passphrase's key is at hand) and written at the first change.
    private var upgradeWrap: (nonce: [UInt8], wrapped: [UInt8])?

    var masterKey: SecureBytes?
    var fields: [[UInt8]: [AccountField: SecureBytes]] = [:]
    /// Whether guarding is on (SPEC §3a), from the sealed manifest; known while unlocked.
    var guarded = false { didSet { trustChanges &+= 1 } }
    /// The programs each account trusts, from its sealed record; known while unlocked.
    var trusted: [[UInt8]: [TrustedProgram]] = [:] { didSet { trustChanges &+= 1 } }
    /// Counts changes of who is trusted — any trusted list, guarding on or off, a lock —
    /// so that a decision made against them can be checked again when it is used
    /// (`AccountsTree`'s open takes it under the tree's lock with the open itself).
    public private(set) var trustChanges: UInt64 = 0
    /// Accounts by label, server and username (digests only), while unlocked.
    var index: AccountIndex?
    /// Where the decrypted fields live while unlocked (a few large secure regions).
    let arena = SecureArena()
    /// The folder of format 3 this vault is kept in; nil for a single file (format 1 or 2).
    private(set) var folder: VaultFolder?
    /// Folder only: changes are sealed and counted at once, and their files written by
    /// whoever takes them (`takePrepared`), outside the owner's lock; else each change is
    /// written, synced, before its call returns.
    public var defersWrites = false
    var prepared: [VaultFolder.PreparedFile] = []
    /// Folder only, while unlocked: the accounts with a field of several current values or
    /// a removal that lost against a change made apart (`conflicts(of:)`).
    var conflicted: [[UInt8]: AccountConflicts] = [:]
    /// A folder's fields of each account beyond `AccountField`'s (a Secret Service item's
    /// attributes, its secret's content type), by name; the values are the folder's own.
    var named: [[UInt8]: [String: SecureBytes]] = [:]

    struct SealedRecord {
        var uuid: [UInt8]
        var name: String
        var nonce: [UInt8]
        var ciphertext: [UInt8]
    }

    public var isUnlocked: Bool { masterKey != nil }
    /// Whether this vault is a folder of format 3.
    public var isFolder: Bool { folder != nil }
    public var kdfParameters: KDFParameters { parameters }

    /// The accounts as (16-byte UUID, name as given), in file order. Works while locked.
    public var accounts: [(uuid: [UInt8], name: String)] { records.map { ($0.uuid, $0.name) } }

    /// Bytes of locked memory the unlocked plaintext takes (the arena's slabs; 0 locked).
    public var secureMemoryBytes: Int { arena.bytesHeld }

    /// How many accounts there are (no copy of the list).
    public var accountCount: Int { records.count }

    /// The account of that name (as given), found by index, not by a scan.
    public func account(named name: String) -> (uuid: [UInt8], name: String)? {
        lookupIndex().byName[name].map { (records[$0].uuid, records[$0].name) }
    }

    /// Whether an account has that UUID (by index).
    public func hasAccount(uuid: [UInt8]) -> Bool { lookupIndex().byUUID[uuid] != nil }

    /// The name (as given) of the account with that UUID (by index).
    public func name(of uuid: [UInt8]) -> String? { lookupIndex().byUUID[uuid].map { records[$0].name } }

    // MARK: Finding accounts (by index, while unlocked)

    /// The accounts whose `attribute` is exactly `value`, in file order.
    public func accounts(with attribute: IndexedAttribute, equalTo value: UnsafeRawBufferPointer) throws(VaultError) -> [[UInt8]] {
        let index = try requireIndex()
        return index.accounts(in: .attribute(attribute, index.digest(value)))
    }

    /// The accounts with exactly this server and username, in file order.
    public func accounts(server: UnsafeRawBufferPointer, username: UnsafeRawBufferPointer) throws(VaultError) -> [[UInt8]] {
        let index = try requireIndex()
        return index.accounts(in: .serverAndUsername(index.digest(server: server, username: username)))
    }

    /// The accounts whose UUID begins with these 32 bits, in file order.
    public func accounts(uuidPrefix: UInt32) throws(VaultError) -> [[UInt8]] {
        try requireIndex().accounts(withPrefix: uuidPrefix)
    }

    /// The digest of an account's value of `attribute`: the identity of what it shares
    /// with the accounts of the same value (a by-server directory) while unlocked.
    public func digest(of attribute: IndexedAttribute, of uuid: [UInt8]) throws(VaultError) -> IndexDigest {
        guard let digest = try requireIndex().digest(of: uuid, attribute) else { throw .noSuchAccount }
        return digest
    }

    /// The accounts whose value of `attribute` has that digest, in file order.
    public func accounts(with attribute: IndexedAttribute, digest: IndexDigest) throws(VaultError) -> [[UInt8]] {
        try requireIndex().accounts(in: .attribute(attribute, digest))
    }

    /// Every distinct server value: its digest and its accounts (file order), in no order.
    public func servers() throws(VaultError) -> [(digest: IndexDigest, accounts: [[UInt8]])] {
        try requireIndex().servers.map { ($0.0, $0.1) }
    }

    private func requireIndex() throws(VaultError) -> AccountIndex {
        guard let index else { throw .locked }
        return index
    }

    private func position(_ uuid: [UInt8]) -> Int { lookupIndex().byUUID[uuid] ?? Int.max }

    /// Files `uuid` under its current values (after removing its old entries).
    func reindexAccount(_ uuid: [UInt8]) { reindex(uuid) }

    private func reindex(_ uuid: [UInt8]) {
        index?.remove(uuid)
        guard let values = fields[uuid] else { return }
        index?.insert(uuid, values: values, named: named[uuid] ?? [:], position: position)
    }

    private func lookupIndex() -> (byName: [String: Int], byUUID: [[UInt8]: Int]) {
        if let recordIndex { return recordIndex }
        var byName: [String: Int] = [:], byUUID: [[UInt8]: Int] = [:]
        byName.reserveCapacity(records.count)
        byUUID.reserveCapacity(records.count)
        for (position, record) in records.enumerated() {
            byName[record.name] = position
            byUUID[record.uuid] = position
        }
        recordIndex = (byName, byUUID)
        return (byName, byUUID)
    }

    // MARK: Creating and opening

    /// Creates an empty vault file of format 2 at `path` (which must not exist) and returns it
    /// unlocked. Tests' fixtures only: the product makes folders (`createFolder`), and reads
    /// and converts a single file (`VaultConversion`) but never writes one.
    static func create(at path: String, passphrase: SecureBytes, parameters: KDFParameters, guarded: Bool = false,
                              random: RandomSource = SystemRandom()) throws(VaultError) -> Vault {
        guard parameters.isStrongEnough else { throw .weakParameters }
        Sodium.initialize()
        let masterKey: SecureBytes
        do throws(Errno) { masterKey = try SecureBytes(copying: random.bytes(VaultFormat.keySize)) } catch { throw .io(error) }
        let vault = Vault(path: path, random: random, parameters: parameters,
                          salt: random.bytes(VaultFormat.saltSize), storeID: random.bytes(VaultFormat.storeIDSize))
        vault.masterKey = masterKey
        vault.guarded = guarded
        do throws(Errno) { vault.index = try AccountIndex() } catch { throw .io(error) }
        try vault.wrap(with: passphrase)
        try vault.sealManifest()
        try vault.save(exclusive: true)
        return vault
    }

    private init(path: String, random: RandomSource, parameters: KDFParameters, salt: [UInt8], storeID: [UInt8]) {
        self.path = path
        self.random = random
        self.parameters = parameters
        self.salt = salt
        self.storeID = storeID
        self.wrapNonce = []
        self.wrappedKey = []
        self.records = []
        self.manifestNonce = []
        self.manifestCiphertext = []
    }

    /// A vault kept in `folder` (format 3), as read (locked).
    convenience init(folder: VaultFolder, random: RandomSource, parameters: KDFParameters) {
        self.init(path: folder.path, random: random, parameters: parameters, salt: [], storeID: folder.vaultID)
        self.folder = folder
        formatVersion = 3
        folderIdentity = Self.folderIdentity(folder.path)
        refreshFromFolder()
    }

    /// Unlocked with `key`, the folder's master key (just made); the index gets its key
    /// (ENOMEM when there is no secure memory for it: the vault stays locked).
    func adoptKey(_ key: SecureBytes) throws(VaultError) {
        do throws(Errno) { index = try AccountIndex() } catch {
            key.wipe()
            lock()
            throw .io(error)
        }
        masterKey = key
        refreshFromFolder()
    }

    /// Opens (locked) the vault at `path`: a folder of format 3, or a single file of format 1
    /// or 2 (checking its structure and checksum).
    public convenience init(path: String, random: RandomSource = SystemRandom()) throws(VaultError) {
        if Self.isFolder(path) {
            let folder = try VaultFolder(path: path, deviceFile: Self.deviceFile(for: path), random: random)
            self.init(folder: folder, random: random, parameters: folder.currentParameters ?? .moderate)
            return
        }
        let bytes: [UInt8]
        let identity: FileIdentity?
        do throws(Errno) {
            let fd = try Syscall.open(path, O_RDONLY)
            defer { Syscall.close(fd) }
            identity = FileIdentity(of: fd)
            bytes = try Syscall.readAll(fd)
        } catch {
            throw .io(error)
        }
        try self.init(path: path, bytes: bytes, random: random)
        fileIdentity = identity
    }

    /// The vault file as this vault last read or wrote it: when the file at `path` is no
    /// longer this one, another program replaced or changed it.
    public private(set) var fileIdentity: FileIdentity?
    /// A folder's device and inode numbers as read.
    private(set) var folderIdentity: [UInt64]?

    static func folderIdentity(_ path: String) -> [UInt64]? {
        (try? Syscall.stat(path)).map { [UInt64($0.st_dev), UInt64($0.st_ino)] }
    }

    /// Whether another program replaced the vault (a restore from a backup): the file is no
    /// longer the one read, or the folder is another folder (or holds another vault's id).
    /// New change files in a folder are not a replacement, and neither is its `id` file
    /// written again with the same id (a synchroniser that settles two copies' times).
    public var isReplaced: Bool {
        guard let folder else { return FileIdentity(of: path) != fileIdentity }
        return Self.folderIdentity(path) != folderIdentity || folder.idOnDisk != folder.vaultID
    }

    /// Opens (locked) a vault from its bytes, as if read from `path` (tests and fuzzing).
    public convenience init(path: String, bytes: [UInt8], random: RandomSource) throws(VaultError) {
        Sodium.initialize()
        let checksumSize = Int(crypto_generichash_BYTES)
        guard bytes.count >= VaultFormat.headerSize + 4 + VaultFormat.nonceSize + 4 + checksumSize else {
            throw .damaged("the file is too short (\(bytes.count) bytes)")
        }
        guard bytes.starts(with: VaultFormat.magic) else { throw .damaged("not an mtmfs vault (bad magic)") }
        let body = Array(bytes[0..<(bytes.count - checksumSize)])
        guard Self.checksum(body) == Array(bytes[(bytes.count - checksumSize)...]) else {
            throw .damaged("checksum mismatch (the file was altered or truncated)")
        }
        var reader = VaultFormat.Reader(bytes: body)
        _ = try reader.take(8)
        let version = try reader.integer(2)
        guard VaultFormat.versions.contains(version) else { throw .damaged("unsupported format version \(version)") }
        let algorithm = try reader.integer(1)
        guard algorithm == UInt64(VaultFormat.algorithmArgon2id13) else { throw .damaged("unknown key-derivation algorithm \(algorithm)") }
        _ = try reader.integer(1)
        let parameters = KDFParameters(operations: try reader.integer(8), memoryBytes: try reader.integer(8))
        guard parameters.isStrongEnough else { throw .weakParameters }
        self.init(path: path, random: random, parameters: parameters, salt: try reader.take(VaultFormat.saltSize),
                  storeID: try reader.take(VaultFormat.storeIDSize))
        formatVersion = UInt16(version)
        wrapNonce = try reader.take(VaultFormat.nonceSize)
        wrappedKey = try reader.take(VaultFormat.keySize + VaultFormat.tagSize)
        let count = try reader.integer(4)
        guard count <= UInt64(body.count) else { throw .damaged("impossible record count \(count)") }
        var seen = Set<[UInt8]>()
        for _ in 0..<count {
            let uuid = try reader.take(16)
            let nameLength = Int(try reader.integer(1))
            let nameBytes = try reader.take(nameLength)
            guard let name = String(validating: nameBytes, as: UTF8.self), AccountName.uuidBytes(name) == uuid else {
                throw .damaged("a record whose name does not match its UUID")
            }
            guard seen.insert(uuid).inserted else { throw .damaged("two records for one UUID") }
            let nonce = try reader.take(VaultFormat.nonceSize)
            let length = Int(try reader.integer(4))
            guard length <= VaultFormat.maximumRecordSize else { throw .damaged("a record of \(length) bytes") }
            records.append(SealedRecord(uuid: uuid, name: name, nonce: nonce, ciphertext: try reader.take(length)))
        }
        manifestNonce = try reader.take(VaultFormat.nonceSize)
        let manifestLength = Int(try reader.integer(4))
        manifestCiphertext = try reader.take(manifestLength)
        guard reader.position == body.count else { throw .damaged("\(body.count - reader.position) stray bytes after the manifest") }
    }

    static func checksum(_ bytes: [UInt8]) -> [UInt8] {
        var out = [UInt8](repeating: 0, count: Int(crypto_generichash_BYTES))
        crypto_generichash(&out, out.count, bytes, UInt64(bytes.count), nil, 0)
        return out
    }

    // MARK: Locking

    /// Derives the key from `passphrase`, unwraps the master key, and authenticates and
    /// decrypts every record. On any failure the vault stays locked.
    /// A wrong passphrase while unlocked changes nothing (it does not lock).
    /// `tidying`: slots a passphrase change retired are removed (not by `mtmfs check`,
    /// which only reads).
    public func unlock(passphrase: SecureBytes, kind: SlotKind = .passphrase, tidying: Bool = true) throws(VaultError) {
        try unlock(withPassphraseKey: try passphraseKey(passphrase, kind: kind), tidying: tidying)
    }

    /// The slow half of an unlock (Argon2id: 0.1 s interactive to seconds sensitive): reads
    /// only the salt and parameters, which nothing changes while the vault is served, so a
    /// caller runs it outside the lock its requests take, then `unlock(withPassphraseKey:)`.
    /// (A folder's: the master key itself, unwrapped from the key slot the passphrase opens.)
    /// `kind`: which slots `passphrase` is tried on (a single file has the passphrase's alone).
    public func passphraseKey(_ passphrase: SecureBytes, kind: SlotKind = .passphrase) throws(VaultError) -> SecureBytes {
        if let folder { return try folder.masterKey(passphrase: passphrase, kind: kind) }
        guard kind == .passphrase else { throw .wrongPassphrase }
        return try Self.deriveKey(passphrase, salt: salt, parameters: parameters)
    }

    /// The fast half of an unlock: unwraps the master key with `kek` (which it wipes) and
    /// opens every record.
    public func unlock(withPassphraseKey kek: SecureBytes, tidying: Bool = true) throws(VaultError) {
        if let folder {
            if isUnlocked { lock() }
            do {
                try folder.open(with: kek, arena: arena)
            } catch {
                kek.wipe()
                lock()
                throw error
            }
            if tidying { folder.removeRetiredSlots(key: kek) }
            try adoptKey(kek)
            return
        }
        guard let key = unwrapMasterKey(with: kek) else {
            kek.wipe()
            throw .wrongPassphrase
        }
        // Version 1: the key is wrapped for version 2 now, written at the first change.
        if formatVersion < VaultFormat.version {
            let nonce = random.bytes(VaultFormat.nonceSize)
            upgradeWrap = (nonce, seal(key, associatedData: headerPrefix(version: VaultFormat.version), nonce: nonce, key: kek))
        }
        kek.wipe()
        if isUnlocked { lock() }
        masterKey = key
        do throws(VaultError) {
            try verifyManifest()
            for record in records {
                let opened = try open(record)
                fields[record.uuid] = opened.fields
                if !opened.trusted.isEmpty { trusted[record.uuid] = opened.trusted }
            }
            do throws(Errno) { index = try AccountIndex() } catch { throw VaultError.io(error) }
            for record in records { reindex(record.uuid) }
        } catch {
            lock()
            throw error
        }
    }

    /// Checks a passphrase's key (from `passphraseKey`, wiped here) against the unlocked
    /// vault: `.wrongPassphrase` when it does not unwrap this vault's master key.
    public func checkPassphraseKey(_ kek: SecureBytes) throws(VaultError) {
        defer { kek.wipe() }
        let current = try requireKey()
        if folder != nil {
            guard kek.equals(current) else { throw .wrongPassphrase }
            return
        }
        guard let key = unwrapMasterKey(with: kek) else { throw .wrongPassphrase }
        defer { key.wipe() }
        guard key.equals(current) else { throw .wrongPassphrase }
    }

    /// The master key, unwrapped with a passphrase's key; nil when it does not open (a
    /// wrong passphrase: the checksum already ruled out damage).
    private func unwrapMasterKey(with kek: SecureBytes) -> SecureBytes? {
        guard let key = try? SecureBytes(count: VaultFormat.keySize) else { return nil }
        let unwrapped = wrappedKey.withUnsafeBytes { sealed in
            key.withUnsafeMutableBytes { out in
                kek.withUnsafeBytes { k in
                    crypto_aead_xchacha20poly1305_ietf_decrypt(
                        out.baseAddress!.assumingMemoryBound(to: UInt8.self), nil, nil,
                        sealed.baseAddress!.assumingMemoryBound(to: UInt8.self), UInt64(sealed.count),
                        headerPrefix(), UInt64(VaultFormat.headerPrefixSize),
                        wrapNonce, k.baseAddress!.assumingMemoryBound(to: UInt8.self))
                }
            }
        }
        guard unwrapped == 0 else {
            key.wipe()
            return nil
        }
        return key
    }

    /// The index, for searches while locked (see `LockedSearchIndex`); the vault forgets
    /// it (called just before `lock`).
    public func takeIndexForLockedSearch() -> LockedSearchIndex? {
        guard let index else { return nil }
        self.index = nil
        return LockedSearchIndex(index, accounts: accounts.map(\.uuid))
    }

    /// Zeroes and frees the master key and every decrypted field.
    public func lock() {
        writeUntaken()
        folder?.close()  // (wipes every value the changes held)
        guarded = false
        trusted.removeAll()
        masterKey?.wipe()
        masterKey = nil
        index?.wipe()
        index = nil
        for (_, values) in fields { for (_, value) in values { value.wipe() } }
        fields.removeAll()
        conflicted.removeAll()  // (their values were the folder's, wiped with it)
        named.removeAll()
        arena.releaseAll()
        refreshFromFolder()
    }

    static func deriveKey(_ passphrase: SecureBytes, salt: [UInt8], parameters: KDFParameters) throws(VaultError) -> SecureBytes {
        try KeyDerivation.derive(passphrase, salt: salt, parameters: parameters)
    }

    // MARK: Accounts

    func requireKey() throws(VaultError) -> SecureBytes {
        guard let masterKey else { throw .locked }
        return masterKey
    }

    /// The decrypted value of a field (empty if never set). Do not copy it into a String.
    /// A field's own secure bytes (nil when unset): no copy, no allocation. The caller
    /// must not keep or change them.
    public func storedField(_ field: AccountField, of uuid: [UInt8]) throws(VaultError) -> SecureBytes? {
        _ = try requireKey()
        guard let values = fields[uuid] else { throw .noSuchAccount }
        return values[field]
    }

    /// A field's bytes (an empty buffer when unset).
    public func field(_ field: AccountField, of uuid: [UInt8]) throws(VaultError) -> SecureBytes {
        try storedField(field, of: uuid) ?? SecureBytes()
    }

    /// Adds an empty account; `trusting` starts its trusted list (the program that made it).
    public func addAccount(uuid: [UInt8], name: String, trusting: [TrustedProgram] = []) throws(VaultError) {
        _ = try requireKey()
        guard fields[uuid] == nil else { throw .accountExists }  // (unlocked: every account has an entry)
        if folder != nil { return try folderAddAccounts([(uuid, name, [:], trusting)]) }
        try upgradeIfNeeded()
        fields[uuid] = [:]
        trusted[uuid] = trusting.isEmpty ? nil : trusting
        records.append(SealedRecord(uuid: uuid, name: name, nonce: [], ciphertext: []))
        do {
            try reseal(at: records.count - 1)
            try sealManifest()
            try save()
        } catch {
            records.removeAll { $0.uuid == uuid }
            fields[uuid] = nil
            trusted[uuid] = nil
            try? sealManifest()
            throw error
        }
        reindex(uuid)
    }

    /// Adds many empty accounts with one save (all or nothing): one rewrite of the file
    /// instead of one per account (importing thousands of accounts, the benchmark's W3).
    public func addAccounts(_ accounts: [(uuid: [UInt8], name: String)]) throws(VaultError) {
        try addAccounts(accounts.map { ($0.uuid, $0.name, [:]) })
    }

    /// Adds many accounts with their fields with one save (all or nothing): an import.
    public func addAccounts(_ accounts: [(uuid: [UInt8], name: String, fields: [AccountField: SecureBytes])]) throws(VaultError) {
        _ = try requireKey()
        try upgradeIfNeeded()
        var seen = Set(records.map(\.uuid))
        for account in accounts {
            guard seen.insert(account.uuid).inserted else { throw .accountExists }
        }
        if folder != nil { return try folderAddAccounts(accounts.map { ($0.uuid, $0.name, $0.fields, []) }) }
        let before = records.count
        do throws(VaultError) {
            for account in accounts {
                var values: [AccountField: SecureBytes] = [:]
                fields[account.uuid] = values  // (before a throw below, so that it is undone)
                for (field, value) in account.fields where value.count > 0 {
                    guard let copy = value.withUnsafeBytes({ try? SecureBytes.allocate(copying: $0, in: arena) }) else {
                        throw VaultError.io(.noMemory)
                    }
                    values[field] = copy
                    fields[account.uuid] = values
                }
                records.append(SealedRecord(uuid: account.uuid, name: account.name, nonce: [], ciphertext: []))
                try reseal(at: records.count - 1)
            }
            try sealManifest()
            try save()
        } catch {
            for account in accounts { fields.removeValue(forKey: account.uuid)?.values.forEach { $0.wipe() } }
            records.removeSubrange(before...)
            try? sealManifest()
            throw error
        }
        for account in accounts { reindex(account.uuid) }
    }

    public func removeAccount(uuid: [UInt8]) throws(VaultError) {
        _ = try requireKey()
        guard lookupIndex().byUUID[uuid] != nil else { throw .noSuchAccount }
        if folder != nil { return try folderRemoveAccount(uuid: uuid) }
        try upgradeIfNeeded()
        let index = lookupIndex().byUUID[uuid]!
        let removed = records.remove(at: index)
        let removedFields = fields.removeValue(forKey: uuid)
        let removedTrust = trusted.removeValue(forKey: uuid)
        do {
            try sealManifest()
            try save()
        } catch {
            records.insert(removed, at: index)
            fields[uuid] = removedFields
            trusted[uuid] = removedTrust
            try? sealManifest()
            throw error
        }
        self.index?.remove(uuid)
        removedFields?.values.forEach { $0.wipe() }
    }

    /// Sets several fields of one account at once (all or nothing), e.g. the parts of a URL.
    public func setFields(_ changes: [AccountField: SecureBytes], of uuid: [UInt8]) throws(VaultError) {
        _ = try requireKey()
        guard fields[uuid] != nil else { throw .noSuchAccount }
        if folder != nil {
            return try writeFields(changes.sorted { $0.key.rawValue < $1.key.rawValue }.map { ($0.key.rawValue, $0.value) },
                                   of: uuid, name: name(of: uuid) ?? AccountName.string(uuid))
        }
        // (A single file has no place for `otp`: a mount converts it to a folder at its first unlock.)
        if changes.keys.contains(.otp) { throw .io(.invalidArgument) }
        try upgradeIfNeeded()
        guard let old = fields[uuid], let index = lookupIndex().byUUID[uuid] else { throw .noSuchAccount }
        let oldRecord = records[index]
        var new = old
        for (field, value) in changes {
            guard value.count > 0 else { new[field] = nil; continue }
            guard let copy = value.withUnsafeBytes({ try? SecureBytes.allocate(copying: $0, in: arena) }) else {
                for (changed, _) in changes where new[changed] !== old[changed] { new[changed]?.wipe() }
                throw .io(.noMemory)
            }
            new[field] = copy
        }
        fields[uuid] = new
        do {
            try reseal(at: index)
            try sealManifest()
            try save()
        } catch {
            records[index] = oldRecord
            fields[uuid] = old
            try? sealManifest()
            throw error
        }
        if changes.keys.contains(where: { $0 != .password }) { reindex(uuid) }  // every other field is indexed
        for (field, _) in changes { old[field]?.wipe() }
    }

    // MARK: Guarding (SPEC §3a)

    /// Whether guarding is on: a password goes only to the programs an account trusts.
    public func isGuarded() throws(VaultError) -> Bool {
        _ = try requireKey()
        return guarded
    }

    /// Turns guarding on or off (sealed in the manifest: editing the file cannot switch it).
    public func setGuarded(_ on: Bool) throws(VaultError) {
        _ = try requireKey()
        guard on != guarded else { return }
        if folder != nil {
            let flag: SecureBytes
            do throws(Errno) { flag = try SecureBytes(copying: Array((on ? "1" : "0").utf8)) } catch { throw .io(error) }
            defer { flag.wipe() }
            return try writeFields([("guard", flag)], of: Self.vaultRecord, name: Self.vaultRecordName)
        }
        try upgradeIfNeeded()
        guarded = on
        do {
            try sealManifest()
            try save()
        } catch {
            guarded = !on
            try? sealManifest()
            throw error
        }
    }

    /// The programs an account trusts, in the order they were trusted.
    public func trustedPrograms(of uuid: [UInt8]) throws(VaultError) -> [TrustedProgram] {
        _ = try requireKey()
        guard fields[uuid] != nil else { throw .noSuchAccount }
        return trusted[uuid] ?? []
    }

    /// Replaces an account's trusted list (sealed in its record).
    public func setTrustedPrograms(_ programs: [TrustedProgram], of uuid: [UInt8]) throws(VaultError) {
        _ = try requireKey()
        guard fields[uuid] != nil else { throw .noSuchAccount }
        if folder != nil {
            let list: SecureBytes
            do throws(Errno) { list = programs.isEmpty ? SecureBytes() : try Self.encodeTrusted(programs) } catch { throw .io(error) }
            defer { list.wipe() }
            return try writeFields([("trusted", list)], of: uuid, name: name(of: uuid) ?? AccountName.string(uuid))
        }
        try upgradeIfNeeded()
        guard let index = lookupIndex().byUUID[uuid] else { throw .noSuchAccount }
        let old = (records[index], trusted[uuid])
        trusted[uuid] = programs.isEmpty ? nil : programs
        do {
            try reseal(at: index)
            try sealManifest()
            try save()
        } catch {
            (records[index], trusted[uuid]) = old
            try? sealManifest()
            throw error
        }
    }

    /// A version-1 vault becomes version 2 in memory before its first change (the change's
    /// save writes it): the key wrapped at unlock, every record and the manifest resealed.
    private func upgradeIfNeeded() throws(VaultError) {
        guard formatVersion < VaultFormat.version else { return }
        guard let upgradeWrap else { throw .locked }
        let old = (formatVersion, wrapNonce, wrappedKey, records)
        formatVersion = VaultFormat.version
        (wrapNonce, wrappedKey) = (upgradeWrap.nonce, upgradeWrap.wrapped)
        do {
            for index in records.indices { try reseal(at: index) }
            try sealManifest()
        } catch {
            (formatVersion, wrapNonce, wrappedKey, records) = old
            throw error
        }
        self.upgradeWrap = nil
    }

    // MARK: Passphrase

    /// Re-wraps the master key under a new passphrase (new salt, possibly new parameters);
    /// the records are untouched. The vault must be unlocked.
    public func changePassphrase(to passphrase: SecureBytes, parameters newParameters: KDFParameters) throws(VaultError) {
        let key = try requireKey()
        guard newParameters.isStrongEnough else { throw .weakParameters }
        if let folder {
            try folder.addSlot(passphrase: passphrase, parameters: newParameters, key: key)
            parameters = newParameters
            return
        }
        try upgradeIfNeeded()
        let old = (parameters, salt, wrapNonce, wrappedKey)
        parameters = newParameters
        salt = random.bytes(VaultFormat.saltSize)
        do {
            try wrap(with: passphrase)
            try save()
        } catch {
            (parameters, salt, wrapNonce, wrappedKey) = old
            throw error
        }
    }

    /// A slot of `kind` (a login password's, a recovery key's) that opens the vault with
    /// `secret`; it retires the slots of that kind only. The vault must be unlocked, and a
    /// folder (format 3).
    public func addSlot(_ kind: SlotKind, secret: SecureBytes, parameters: KDFParameters) throws(VaultError) {
        let key = try requireKey()
        guard let folder, kind != .passphrase else { throw .io(.notSupported) }
        try folder.addSlot(passphrase: secret, parameters: parameters, key: key, kind: kind)
    }

    /// Removes the slots of `kind` (not the passphrase's). The vault must be unlocked.
    public func removeSlots(_ kind: SlotKind) throws(VaultError) {
        _ = try requireKey()
        guard let folder, kind != .passphrase else { throw .io(.notSupported) }
        try folder.removeSlots(kind: kind)
    }

    /// The slow half of a login password's change, which needs no unlock: the master key
    /// that `old` opens from a login slot (wrong, or no login slot: `.wrongPassphrase`), and
    /// the new slot's key derived from `new`. Reads only the slots; a daemon runs it outside
    /// its lock, then `addSlot(_:key:)` under it.
    public func prepareLoginChange(old: SecureBytes, new: SecureBytes) throws(VaultError) -> (key: SecureBytes, slot: VaultFolder.PreparedSlot) {
        guard let folder, folder.hasSlot(.login) else { throw .wrongPassphrase }
        let key = try folder.masterKey(passphrase: old, kind: .login)
        do {
            return (key, try VaultFolder.prepareSlot(passphrase: new, parameters: folder.currentParameters ?? parameters, kind: .login,
                                                     random: random))
        } catch {
            key.wipe()
            throw error
        }
    }

    /// The fast half: the new login slot written (it retires the old one).
    public func addSlot(_ prepared: VaultFolder.PreparedSlot, key: SecureBytes) throws(VaultError) {
        guard let folder else { throw .io(.notSupported) }
        try folder.addSlot(prepared, key: key)
    }

    /// Whether a slot of `kind` opens the vault (the passphrase's: always).
    public func hasSlot(_ kind: SlotKind) -> Bool {
        kind == .passphrase || folder?.hasSlot(kind) == true
    }

    // MARK: Sealing

    func headerPrefix(version: UInt16? = nil) -> [UInt8] {
        VaultFormat.magic + VaultFormat.bigEndian(UInt64(version ?? formatVersion), 2) + [VaultFormat.algorithmArgon2id13, 0]
            + VaultFormat.bigEndian(parameters.operations, 8) + VaultFormat.bigEndian(parameters.memoryBytes, 8) + salt + storeID
    }

    private func wrap(with passphrase: SecureBytes) throws(VaultError) {
        let key = try requireKey()
        let kek = try Self.deriveKey(passphrase, salt: salt, parameters: parameters)
        defer { kek.wipe() }
        wrapNonce = random.bytes(VaultFormat.nonceSize)
        wrappedKey = seal(key, associatedData: headerPrefix(), nonce: wrapNonce, key: kek)
    }

    private func seal(_ plaintext: SecureBytes, associatedData: [UInt8], nonce: [UInt8], key: SecureBytes) -> [UInt8] {
        Sealing.seal(plaintext, associatedData: associatedData, nonce: nonce, key: key)
    }

    private func unseal(_ ciphertext: [UInt8], associatedData: [UInt8], nonce: [UInt8]) throws(VaultError) -> SecureBytes? {
        let key = try requireKey()
        do throws(Errno) {
            return try Sealing.unseal(ciphertext, associatedData: associatedData, nonce: nonce, key: key)
        } catch {
            throw .io(error)
        }
    }

    /// Record plaintext: the format version (u8), then for each field in `AccountField` order a u32
    /// length and the bytes.
    private func reseal(at index: Int) throws(VaultError) {
        let key = try requireKey()
        let uuid = records[index].uuid
        guard let values = fields[uuid] else { throw .noSuchAccount }
        let plaintext = SecureBytes()
        defer { plaintext.wipe() }
        do throws(Errno) {
            try plaintext.append([UInt8(formatVersion)])
            for field in AccountField.singleFileFields {
                let value = values[field]
                try plaintext.append(VaultFormat.bigEndian(UInt64(value?.count ?? 0), 4))
                if let value { try value.withUnsafeBytes { (raw) throws(Errno) in try plaintext.append(raw) } }
            }
            if formatVersion >= 2 {
                let list = try Self.encodeTrusted(trusted[uuid] ?? [])
                defer { list.wipe() }
                try list.withUnsafeBytes { (raw) throws(Errno) in try plaintext.append(raw) }
            }
        } catch {
            throw .io(error)
        }
        let nonce = random.bytes(VaultFormat.nonceSize)
        records[index].nonce = nonce
        records[index].ciphertext = seal(plaintext, associatedData: VaultFormat.recordAssociatedData(
                                             version: formatVersion, storeID: storeID, uuid: uuid),
                                         nonce: nonce, key: key)
    }

    private func open(_ record: SealedRecord) throws(VaultError) -> (fields: [AccountField: SecureBytes], trusted: [TrustedProgram]) {
        guard let plaintext = try unseal(record.ciphertext,
                                         associatedData: VaultFormat.recordAssociatedData(
                                             version: formatVersion, storeID: storeID, uuid: record.uuid),
                                         nonce: record.nonce) else {
            throw .damaged("record \(record.name) fails authentication (altered, swapped or copied from another vault)")
        }
        defer { plaintext.wipe() }
        // Only set fields take memory, all of it slots in the vault's arena.
        var values: [AccountField: SecureBytes] = [:]
        var programs: [TrustedProgram] = []
        var outOfMemory = false
        let version = formatVersion
        let ok: Bool = plaintext.withUnsafeBytes { bytes in
            guard bytes.count >= 1, bytes[0] == UInt8(version) else { return false }
            var position = 1
            for field in AccountField.singleFileFields {
                guard bytes.count - position >= 4 else { return false }
                let length = (0..<4).reduce(0) { $0 << 8 | Int(bytes[position + $1]) }
                position += 4
                guard bytes.count - position >= length else { return false }
                if length > 0 {
                    guard let value = try? SecureBytes.allocate(copying: UnsafeRawBufferPointer(rebasing: bytes[position..<position + length]),
                                                           in: arena) else {
                        outOfMemory = true
                        return true
                    }
                    values[field] = value
                }
                position += length
            }
            if version >= 2 {
                guard bytes.count - position >= 2 else { return false }
                let count = Int(bytes[position]) << 8 | Int(bytes[position + 1])
                position += 2
                for _ in 0..<count {
                    guard bytes.count - position >= 34 else { return false }
                    let digest = Array(bytes[position..<position + 32])
                    let length = Int(bytes[position + 32]) << 8 | Int(bytes[position + 33])
                    position += 34
                    guard bytes.count - position >= length,
                          let path = String(validating: bytes[position..<position + length], as: UTF8.self) else { return false }
                    programs.append(TrustedProgram(sha256: digest, path: path))
                    position += length
                }
            }
            return position == bytes.count
        }
        if outOfMemory {
            for (_, value) in values { value.wipe() }
            throw .io(.noMemory)
        }
        guard ok else {
            for (_, value) in values { value.wipe() }
            throw .damaged("record \(record.name) has a malformed body")
        }
        return (values, programs)
    }

    /// The manifest: (version 2) the flags byte — bit 0: guarding on — then the (uuid,
    /// nonce) pairs of every record, in order, sealed.
    private func manifestPlaintext(guarded: Bool) throws(VaultError) -> SecureBytes {
        let flags: [UInt8] = formatVersion >= 2 ? [guarded ? 1 : 0] : []
        let bytes = flags + records.flatMap { $0.uuid + $0.nonce }
        do throws(Errno) { return try SecureBytes(copying: bytes) } catch { throw .io(error) }
    }

    private func sealManifest() throws(VaultError) {
        let key = try requireKey()
        let plaintext = try manifestPlaintext(guarded: guarded)
        defer { plaintext.wipe() }
        manifestNonce = random.bytes(VaultFormat.nonceSize)
        manifestCiphertext = seal(plaintext, associatedData: VaultFormat.manifestAssociatedData(version: formatVersion, storeID: storeID),
                                  nonce: manifestNonce, key: key)
    }

    private func verifyManifest() throws(VaultError) {
        guard let plaintext = try unseal(manifestCiphertext,
                                         associatedData: VaultFormat.manifestAssociatedData(version: formatVersion, storeID: storeID),
                                         nonce: manifestNonce) else {
            throw .damaged("the manifest fails authentication")
        }
        defer { plaintext.wipe() }
        if formatVersion >= 2 {
            let flags = plaintext.withUnsafeBytes { $0.first }
            guard let flags, flags & ~1 == 0 else { throw .damaged("the manifest has unknown flags") }
            guarded = flags & 1 != 0
        }
        let expected = try manifestPlaintext(guarded: guarded)
        defer { expected.wipe() }
        guard plaintext.equals(expected) else {
            throw .damaged("the records do not match the manifest (a record was added, dropped, reordered or replayed)")
        }
    }

    // MARK: The file

    func encode() -> [UInt8] {
        var out = headerPrefix() + wrapNonce + wrappedKey
        out += VaultFormat.bigEndian(UInt64(records.count), 4)
        for record in records {
            out += record.uuid + [UInt8(record.name.utf8.count)] + Array(record.name.utf8) + record.nonce
            out += VaultFormat.bigEndian(UInt64(record.ciphertext.count), 4) + record.ciphertext
        }
        out += manifestNonce + VaultFormat.bigEndian(UInt64(manifestCiphertext.count), 4) + manifestCiphertext
        return out + Self.checksum(out)
    }

    private func save(exclusive: Bool = false) throws(VaultError) {
        do throws(Errno) {
            if exclusive, (try? Syscall.lstat(path)) != nil { throw Errno.fileExists }
            try AtomicFile.replace(path, with: encode(), mode: 0o600)
        } catch {
            throw .io(error)
        }
        fileIdentity = FileIdentity(of: path)
    }
}

/// Account directory names: a UUID in any case, kept as given.
public enum AccountName {
    /// The 8-4-4-4-12 lowercase form of 16 UUID bytes.
    public static func string(_ uuid: [UInt8]) -> String {
        let hex = ASCIIHex.string(uuid)
        var out = ""
        for (offset, character) in hex.enumerated() {
            if [8, 12, 16, 20].contains(offset) { out += "-" }
            out.append(character)
        }
        return out
    }

    /// The 16 bytes of a UUID in the 8-4-4-4-12 hex form, or nil.
    public static func uuidBytes(_ name: String) -> [UInt8]? { ASCIIHex.uuid(name) }

    static func hex(_ c: UInt8) -> UInt8? { ASCIIHex.value(c) }
}
