#if canImport(Glibc)
import Glibc
#endif
import CredentialVault
import SecureMemory
import FuseLowLevel
import Posix

/// One field of one account: what a file in an account's directory stands for.
struct FieldKey: Hashable, Sendable {
    let account: AccountID
    /// An index into `AccountFields.names` (`url`, then `totp`, after the fields).
    let index: Int

    var isURL: Bool { index == AccountFields.urlIndex }
    /// `totp`: the current one-time code of `otp` (read only; there while `otp` is set).
    var isTOTP: Bool { index == AccountFields.totpIndex }
    /// A file of `attributes/`: an attribute the Secret Service keeps (`AccountFields.attributes`).
    var isAttribute: Bool { index >= AccountFields.names.count }
    var field: AccountField? { isURL || isTOTP || isAttribute ? nil : AccountField.allCases[index] }
}

/// The attribute names seen while the mount runs, each given a key index once
/// (`AccountFields.names.count` + its position): an attribute's file is a key like a field's.
///
/// Thread-safety: none of its own; it lives in `AccountFields`, behind the service's lock.
final class AttributeNames: @unchecked Sendable {
    private var names: [String] = []
    private var positions: [String: Int] = [:]

    func index(of name: String) -> Int {
        if let position = positions[name] { return AccountFields.names.count + position }
        positions[name] = names.count
        names.append(name)
        return AccountFields.names.count + names.count - 1
    }

    func name(at index: Int) -> String? {
        let position = index - AccountFields.names.count
        return names.indices.contains(position) ? names[position] : nil
    }

    /// Every index given so far.
    var indices: [Int] { names.indices.map { AccountFields.names.count + $0 } }
}

/// How an attribute's name is shown as a file name in `attributes/` (SPEC §2c): as it is,
/// but `%` is `%25` and `/` is `%2F`; a name `.` or `..` is `%2E` or `%2E%2E`, and the empty
/// name is `%`. A name longer than 255 bytes once shown has no file (it stays on the bus).
///
/// Thread-safety: pure functions.
enum AttributeFileName {
    static func fileName(of attribute: String) -> String? {
        let shown = escaped(attribute)
        return shown.utf8.count <= 255 ? shown : nil
    }

    /// The attribute a file name shows (nil: not one this rule makes).
    static func attribute(of fileName: String) -> String? {
        guard let name = unescaped(fileName), Self.fileName(of: name) == fileName else { return nil }
        return name
    }

    /// A name with the rule's escapes (of any length).
    static func escaped(_ name: String) -> String {
        switch name {
        case "": "%"
        case ".": "%2E"
        case "..": "%2E%2E"
        default: name.replacingAll("%", with: "%25").replacingAll("/", with: "%2F")
        }
    }

    /// The name behind escapes (nil: an escape the rule never writes); the caller checks
    /// that the rule writes the name back the same way.
    static func unescaped(_ fileName: String) -> String? {
        switch fileName {
        case "%": return ""
        case "%2E": return "."
        case "%2E%2E": return ".."
        default:
            var out: [UInt8] = []
            let bytes = Array(fileName.utf8)
            var index = 0
            while index < bytes.count {
                if bytes[index] == UInt8(ascii: "%") {
                    guard index + 2 < bytes.count else { return nil }
                    switch (bytes[index + 1], bytes[index + 2]) {
                    case (UInt8(ascii: "2"), UInt8(ascii: "5")): out.append(UInt8(ascii: "%"))
                    case (UInt8(ascii: "2"), UInt8(ascii: "F")): out.append(UInt8(ascii: "/"))
                    default: return nil
                    }
                    index += 3
                } else {
                    out.append(bytes[index])
                    index += 1
                }
            }
            return String(decoding: out, as: UTF8.self)
        }
    }
}

extension String {
    fileprivate func replacingAll(_ target: String, with replacement: String) -> String {
        split(separator: target, omittingEmptySubsequences: false).joined(separator: replacement)
    }
}

/// The fields of the vault's accounts as the editing engine sees them (its `EditedStore`):
/// every account has every field (an unset one reads as an empty line); a field's text is
/// its value and one newline, `url` composes protocol, server, port and path and a write
/// sets those four at once. Values are checked by `AccountFieldSyntax` and sealed into the
/// vault (one atomic save a change). Plaintext stays in secure memory: a field's text is
/// composed in `readBuffer`, made once and zeroed after every use.
///
/// Also the accounts of the mount: a small `AccountID` for each UUID seen, whose directory
/// inode follows from it.
///
/// Thread-safety: a value behind `VaultService`'s lock.
struct AccountFields: EditedStore, @unchecked Sendable {
    typealias Key = FieldKey
    typealias Buffer = SecureBytes
    typealias Note = Never

    static let names = AccountField.allCases.map(\.rawValue) + ["url", "totp"]
    static let urlIndex = AccountField.allCases.count
    static let totpIndex = AccountField.allCases.count + 1
    /// Editor's files an account directory may hold at once (they take secure memory).
    static let maximumScratchFiles = 64

    var session: VaultSession
    private var ids: [[UInt8]: AccountID] = [:]
    private var uuids: [AccountID: [UInt8]] = [:]
    private var nextAccount: UInt64 = 0
    /// Fields whose values changed outside a commit of their own file (a removal, a URL's
    /// parts): the tree tells the engine.
    var changedKeys: [FieldKey] = []
    /// Accounts made, changed or removed through the files since the bus was last told
    /// (their UUIDs: a removed account has no id any more).
    var touched: Set<[UInt8]> = []
    /// Where a field's text is composed for getattr and read (see `withText`).
    let readBuffer = SecureBytes()
    /// The attributes' key indices (see `AttributeNames`).
    let attributeNames = AttributeNames()
    /// `accounts/<UUID>/attributes/`, the Secret Service's other attributes of the account
    /// (SPEC §2c), a file each, edited like a field. Kept as named fields `attribute:NAME`.
    static let attributesName = "attributes"
    static let attributePrefix = "attribute:"
    /// Its directory's serial: `attributesSerialBase` + the account's serial (none of an account's).
    static let attributesSerialBase: UInt64 = 1 << 46

    init(session: VaultSession) { self.session = session }

    var vault: Vault? { session.vault }

    // MARK: Accounts

    /// The id of an account's UUID, given at first sight.
    mutating func id(of uuid: [UInt8]) -> AccountID {
        if let id = ids[uuid] { return id }
        let id = AccountID(serial: nextAccount)
        nextAccount += 1
        ids[uuid] = id
        uuids[id] = uuid
        return id
    }

    func uuid(of account: AccountID) -> [UInt8]? { uuids[account] }
    /// The account of a UUID already seen (nil: none yet; `id(of:)` makes one).
    func existingID(of uuid: [UInt8]) -> AccountID? { ids[uuid] }

    /// The account whose directory is `directory`, if it is one.
    func account(at directory: LocalInode) -> AccountID? {
        guard let id = AccountID(directory: directory), uuids[id] != nil else { return nil }
        return id
    }

    func account(named name: String) -> (uuid: [UInt8], name: String)? { vault?.account(named: name) }

    /// The `attributes/` directory of an account.
    static func attributesDirectory(of account: AccountID) -> LocalInode {
        .directory(attributesSerialBase + account.serial)
    }

    /// The account whose `attributes/` is `directory`, if it is one.
    func attributesOwner(_ directory: LocalInode) -> AccountID? {
        guard let serial = directory.directorySerial, serial >= Self.attributesSerialBase else { return nil }
        let id = AccountID(serial: serial - Self.attributesSerialBase)
        return uuids[id] != nil ? id : nil
    }

    /// The account a directory belongs to: its own, or the one whose `attributes/` it is.
    func owner(of directory: LocalInode) -> AccountID? { account(at: directory) ?? attributesOwner(directory) }

    /// The key of an account's attribute.
    func attributeKey(_ account: AccountID, _ name: String) -> FieldKey {
        FieldKey(account: account, index: attributeNames.index(of: name))
    }

    /// The attributes an account has now (their names, not their values), while unlocked.
    func attributes(of account: AccountID) -> [String] {
        guard session.isOpen, let vault, let uuid = uuids[account], let named = try? vault.namedFields(of: uuid) else { return [] }
        return named.compactMap { name, value in
            name.hasPrefix(Self.attributePrefix) && value.count > 0 ? String(name.dropFirst(Self.attributePrefix.count)) : nil
        }.sorted()
    }

    /// An attribute's value, while unlocked.
    func attributeValue(_ key: FieldKey) -> SecureBytes? {
        guard session.isOpen, let vault, let uuid = uuids[key.account], let name = attributeNames.name(at: key.index),
              let value = (try? vault.namedFields(of: uuid))?[Self.attributePrefix + name], value.count > 0 else { return nil }
        return value
    }

    /// What a key's file is called (a field's name, an attribute's file name).
    func name(of key: FieldKey) -> String {
        guard key.isAttribute else { return Self.names[key.index] }
        return attributeNames.name(at: key.index).flatMap(AttributeFileName.fileName) ?? "?"
    }

    /// An account left the vault: its id goes.
    mutating func forgetAccount(_ id: AccountID) {
        if let uuid = uuids.removeValue(forKey: id) { ids[uuid] = nil }
    }

    /// After the vault was made again from its files: accounts no longer in it go, and
    /// every field of the others counts as changed — of the `affected` accounts only, when
    /// the caller knows which changed (nil: any may have).
    /// Returns the names of the accounts that went.
    @discardableResult
    mutating func reconcileWithVault(affected: Set<[UInt8]>? = nil) -> [String] {
        var gone: [String] = []
        for (id, uuid) in uuids where affected?.contains(uuid) ?? true {
            if vault?.hasAccount(uuid: uuid) == true {
                changedKeys += (Array(Self.names.indices) + attributeNames.indices).map { FieldKey(account: id, index: $0) }
            } else {
                forgetAccount(id)
                touched.insert(uuid)
                gone.append(AccountName.string(uuid))
            }
        }
        return gone
    }

    // MARK: EditedStore

    func key(named name: String, in directory: LocalInode, isHidden: (FieldKey) -> Bool) -> FieldKey? {
        if let account = attributesOwner(directory) {
            // Any name the rule makes is an attribute, but an editor's file while it has no
            // value (as a plist's keys: `.x.swp` is an editor's until it is an attribute).
            guard let attribute = AttributeFileName.attribute(of: name) else { return nil }
            let key = attributeKey(account, attribute)
            return attributeValue(key) != nil || isHidden(key) || !EditorNames.isEditorFile(name) ? key : nil
        }
        guard let account = account(at: directory), let index = Self.names.firstIndex(of: name) else { return nil }
        if index == Self.totpIndex && !hasOTP(account) { return nil }
        return FieldKey(account: account, index: index)
    }

    /// Whether the account's `otp` is set (known while unlocked only).
    func hasOTP(_ account: AccountID) -> Bool {
        guard session.isOpen, let vault, let uuid = uuids[account],
              let value = try? vault.storedField(.otp, of: uuid) else { return false }
        return value.count > 0
    }

    /// The clock `totp` is read at (seconds since 1970).
    static func now() -> UInt64 { WallClock.seconds }

    func directory(of key: FieldKey) -> LocalInode? {
        key.isAttribute ? Self.attributesDirectory(of: key.account) : key.account.directory
    }

    /// Every field has a value while its account is there; an attribute while it is set.
    func hasValue(_ key: FieldKey) -> Bool {
        guard uuids[key.account] != nil else { return false }
        return !key.isAttribute || attributeValue(key) != nil
    }

    func withText<T>(of key: FieldKey, _ body: (UnsafeRawBufferPointer) -> T) throws(Errno) -> T {
        guard session.isOpen, let vault, let uuid = uuids[key.account] else {
            return body(UnsafeRawBufferPointer(start: nil, count: 0))
        }
        let out = readBuffer
        try? out.resize(to: 0)  // (a shrink never allocates)
        defer { try? out.resize(to: 0) }  // zeroes what was written, keeps the allocation
        func bytes(_ value: SecureBytes?, _ use: (UnsafeRawBufferPointer) throws(Errno) -> Void) throws(Errno) {
            if let value { try value.withUnsafeBytes(use) } else { try use(UnsafeRawBufferPointer(start: nil, count: 0)) }
        }
        func stored(_ field: AccountField) throws(Errno) -> SecureBytes? {
            do throws(VaultError) { return try vault.storedField(field, of: uuid) } catch { throw error.errno }
        }
        if key.isAttribute {
            try bytes(attributeValue(key)) { (value) throws(Errno) in try out.write(value, at: 0) }
        } else if key.isTOTP {
            // The code of this moment: `totp` is read by direct I/O, never from a cache.
            if let otp = try stored(.otp), let (secret, parameters) = otp.withUnsafeBytes({ OneTimeCode.parse($0) }) {
                defer { secret.wipe() }
                try out.append(try OneTimeCode.code(secret: secret, parameters: parameters, at: Self.now()))
            }
        } else if let field = key.field {
            try bytes(try stored(field)) { (value) throws(Errno) in try out.write(value, at: 0) }
        } else {
            let parts = try [AccountField.protocol, .server, .port, .path].map { (f) throws(Errno) in try stored(f) }
            try bytes(parts[0]) { (scheme) throws(Errno) in try bytes(parts[1]) { (server) throws(Errno) in
                try bytes(parts[2]) { (port) throws(Errno) in try bytes(parts[3]) { (path) throws(Errno) in
                    try AccountFieldSyntax.composeURL(protocol: scheme, server: server, port: port, path: path, into: out)
                } } } }
        }
        try out.append([0x0A])
        return out.withUnsafeBytes(body)
    }

    func limit(for key: FieldKey) -> Int { AccountFieldSyntax.maximumSize + 2 }
    var scratchLimit: Int { 16 << 20 }
    func mode(forNewFile requested: mode_t) -> mode_t { 0o600 }

    func accepts(_ text: UnsafeRawBufferPointer, for key: FieldKey, note: Never?) -> Bool {
        if key.isTOTP { return false }
        let value = Self.withoutNewline(text)
        if key.isAttribute { return Self.isAttributeValue(value) }
        guard let field = key.field else { return AccountFieldSyntax.parseURL(value) != nil }
        return AccountFieldSyntax.isValid(value, for: field)
    }

    static func withoutNewline(_ raw: UnsafeRawBufferPointer) -> UnsafeRawBufferPointer { OneNewline.value(raw) }

    /// An attribute's value is a D-Bus string: UTF-8, no NUL, one line.
    static func isAttributeValue(_ value: UnsafeRawBufferPointer) -> Bool {
        guard value.count <= AccountFieldSyntax.maximumSize, !value.contains(0), !value.contains(0x0A) else { return false }
        return String(validating: value, as: UTF8.self) != nil
    }

    /// Validates and seals one field's text (`url`: its four parts at once).
    mutating func commit(_ text: SecureBytes, to key: FieldKey, note: Never?) throws(Errno) -> Committed<FieldKey, SecureBytes> {
        try save(text, to: key, unlessReadBack: true)
    }

    /// Saves `text` as the key's value; `unlessReadBack`: a URL written back as it reads
    /// changes nothing (a removal clears it whatever it reads).
    private mutating func save(_ text: SecureBytes, to key: FieldKey, unlessReadBack: Bool) throws(Errno) -> Committed<FieldKey, SecureBytes> {
        try session.requireOpen()
        guard let vault, let uuid = uuids[key.account] else { throw .noSuchFileOrDirectory }
        if key.isTOTP { throw .permissionDenied }  // (made from `otp`: written there)
        guard text.count <= AccountFieldSyntax.maximumSize + 2 else { throw .fileTooLarge }
        if key.isAttribute {
            guard let name = attributeNames.name(at: key.index) else { throw .noSuchFileOrDirectory }
            let value = text.withUnsafeBytes { raw -> SecureBytes? in
                let value = Self.withoutNewline(raw)
                return Self.isAttributeValue(value) ? SecureBytes() : nil
            }
            guard let value else { throw text.count > AccountFieldSyntax.maximumSize ? .fileTooLarge : .invalidArgument }
            try text.withUnsafeBytes { (raw) throws(Errno) in try value.append(Self.withoutNewline(raw)) }
            defer { value.wipe() }
            do { try vault.setFields([:], named: [Self.attributePrefix + name: value], of: uuid) } catch { throw error.errno }
            session.touched()
            touched.insert(uuid)
            Log.debug("vault saved: an attribute of one account changed (values not logged)")
            return Committed(shown: nil, alsoChanged: [])
        }
        // A URL written back as it reads (`cat url > u; cp u url`) changes nothing: with no
        // server it reads empty, and an empty URL would clear the protocol and path.
        if unlessReadBack, key.isURL, (try? withText(of: key, { current in
            text.withUnsafeBytes { raw in Self.withoutNewline(raw).elementsEqual(Self.withoutNewline(current)) }
        })) == true {
            return Committed(shown: nil, alsoChanged: [])
        }
        var changes: [AccountField: SecureBytes] = [:]
        defer { for (_, value) in changes { value.wipe() } }
        let ok: Bool = try text.withUnsafeBytes { (raw) throws(Errno) -> Bool in
            let value = Self.withoutNewline(raw)
            guard let field = key.field else {
                guard let parts = AccountFieldSyntax.parseURL(value) else { return false }
                for (field, range) in parts { changes[field] = try SecureBytes(copying: UnsafeRawBufferPointer(rebasing: value[range])) }
                return true
            }
            guard AccountFieldSyntax.isValid(value, for: field) else { return false }
            changes[field] = try SecureBytes(copying: value)
            return true
        }
        guard ok else { throw text.count > AccountFieldSyntax.maximumSize ? .fileTooLarge : .invalidArgument }
        do {
            try vault.setFields(changes, of: uuid)
        } catch {
            throw error.errno
        }
        session.touched()
        touched.insert(uuid)
        Log.debug("vault saved: \(changes.count) field(s) of one account changed (values not logged)")
        return Committed(shown: nil, alsoChanged: Self.related(to: key))
    }

    /// The fields whose text changes with `key`'s: a URL and its parts.
    static func related(to key: FieldKey) -> [FieldKey] {
        if key.isAttribute { return [] }
        if key.field == .otp { return [FieldKey(account: key.account, index: totpIndex)] }
        let parts = [AccountField.protocol, .server, .port, .path].map { AccountField.allCases.firstIndex(of: $0)! }
        guard key.isURL || parts.contains(key.index) else { return [] }
        return (parts + [urlIndex]).filter { $0 != key.index }.map { FieldKey(account: key.account, index: $0) }
    }

    /// An unlinked field: cleared.
    mutating func remove(_ key: FieldKey) throws(Errno) {
        if key.isTOTP { return }  // (goes with `otp`: `rm -r` of an account unlinks it too)
        let empty = SecureBytes()
        let saved = try save(empty, to: key, unlessReadBack: false)
        changedKeys += [key] + saved.alsoChanged
    }

    /// Fields have fixed names: one is never renamed onto another. An attribute may be,
    /// onto another of the same account: the target takes the value, the source goes.
    mutating func move(_ key: FieldKey, onto target: FieldKey) throws(Errno) {
        guard key.isAttribute, target.isAttribute, key.account == target.account else { throw .notPermitted }
        try session.requireOpen()
        guard let vault, let uuid = uuids[key.account], let from = attributeNames.name(at: key.index),
              let to = attributeNames.name(at: target.index) else { throw .noSuchFileOrDirectory }
        guard let value = try attributeValue(key)?.copy() else { throw .noSuchFileOrDirectory }
        defer { value.wipe() }
        let empty = SecureBytes()
        do {
            try vault.setFields([:], named: [Self.attributePrefix + to: value, Self.attributePrefix + from: empty], of: uuid)
        } catch {
            throw error.errno
        }
        session.touched()
        touched.insert(uuid)
        changedKeys += [key, target]
    }

    /// An account's directory takes only its fields and editor's files (a name that is
    /// neither would be shown and never sealed): EINVAL for others; `attributes/` takes
    /// every name its escape rule makes.
    func admitsScratch(named name: String, in directory: LocalInode, count: Int, moved: Bool) throws(Errno) {
        if directory != .top && !EditorNames.isEditorFile(name) { throw .invalidArgument }
        guard count < Self.maximumScratchFiles else { throw .noSpace }  // secure memory is precious
    }

    /// An editor's copy left in `attributes/` is an attribute; a field's never: plaintext
    /// an editor left stays out of the vault (SPEC §2).
    func settledKey(named name: String, in directory: LocalInode) -> FieldKey? {
        guard let account = attributesOwner(directory), let attribute = AttributeFileName.attribute(of: name) else { return nil }
        return attributeKey(account, attribute)
    }

    /// `url` is protocol, server, port and path: removing one changes the other.
    func removalOverlaps(_ removed: FieldKey, _ written: FieldKey) -> Bool {
        guard removed.account == written.account else { return false }
        let parts: Set<AccountField> = [.protocol, .server, .port, .path]
        return (removed.isURL && written.field.map(parts.contains) == true)
            || (written.isURL && removed.field.map(parts.contains) == true)
    }

    func mayRenameAway(_ key: FieldKey, to directory: LocalInode) throws(Errno) {}

    /// An attribute unlinked goes at once (the bus shows it gone); a field is cleared after
    /// the engine's delay (an editor that unlinks and writes again keeps its file).
    func removesAtOnce(_ key: FieldKey) -> Bool { key.isAttribute }
}
