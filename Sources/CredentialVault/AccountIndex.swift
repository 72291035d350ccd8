import SecureMemory
import Posix
#if canImport(Glibc)
import Glibc
#endif
import CSodium

/// What an account is found by (SPEC §2a): the attributes the vault indexes (every field
/// but the password).
public enum IndexedAttribute: Sendable, CaseIterable {
    case label, `protocol`, server, port, path, comment, username

    public var field: AccountField {
        switch self {
        case .label: .label
        case .protocol: .protocol
        case .server: .server
        case .port: .port
        case .path: .path
        case .comment: .comment
        case .username: .username
        }
    }
}

/// A keyed digest of one indexed value (or of a server and username together): equal
/// values have equal digests for as long as the vault stays unlocked. It names a value
/// without holding it, so a caller may keep it (a directory's identity) where no plaintext
/// may stay; after a lock it matches nothing.
///
/// Thread-safety: a value.
public struct IndexDigest: Hashable, Sendable {
    let high: UInt64
    let low: UInt64
}

/// The vault's index of its accounts by each field but the password, by server and
/// username together, and by the first 32 bits of the UUID: views and searches find
/// accounts without a scan. Each group lists its accounts in file order.
///
/// The keys are BLAKE2b digests keyed with a random key made at unlock (`crypto_generichash`,
/// 128 bits) and zeroed at lock, so no field value is kept here in clear: plaintext stays in
/// the vault's secure memory. Built when the vault unlocks (every record is open then),
/// changed with every change of the vault, dropped at lock.
///
/// Thread-safety: none of its own; it lives inside `Vault`, whose owner serializes access.
struct AccountIndex {
    private let key: SecureBytes
    private var groups: [Slot: [[UInt8]]] = [:]
    private var slotsOfAccount: [[UInt8]: [Slot]] = [:]
    private var byPrefix: [UInt32: [[UInt8]]] = [:]

    enum Slot: Hashable {
        case attribute(IndexedAttribute, IndexDigest)
        case serverAndUsername(IndexDigest)
        /// A named field's name and value together.
        case named(IndexDigest)
    }

    init() throws(Errno) {
        key = try SecureBytes(count: Int(crypto_generichash_KEYBYTES))
        key.withUnsafeMutableBytes { if let base = $0.baseAddress { randombytes_buf(base, $0.count) } }
    }

    /// Forgets every account, keeping the key (digests made before still name the same values).
    mutating func removeAll() {
        groups.removeAll()
        slotsOfAccount.removeAll()
        byPrefix.removeAll()
    }

    /// Zeroes the key: every digest made with it now names nothing.
    func wipe() { key.wipe() }

    func digest(_ value: UnsafeRawBufferPointer) -> IndexDigest { digest([value]) }

    /// The digest of a server and a username together (the server's length first, so
    /// that ("ab", "c") and ("a", "bc") differ).
    func digest(server: UnsafeRawBufferPointer, username: UnsafeRawBufferPointer) -> IndexDigest {
        withUnsafeBytes(of: UInt64(server.count).littleEndian) { length in digest([length, server, username]) }
    }

    /// The digest of a named field's name and value (the name's length first).
    func digest(name: String, value: UnsafeRawBufferPointer) -> IndexDigest {
        var name = name
        return name.withUTF8 { bytes in
            withUnsafeBytes(of: UInt64(bytes.count).littleEndian) { length in digest([length, UnsafeRawBufferPointer(bytes), value]) }
        }
    }

    private func digest(_ parts: [UnsafeRawBufferPointer]) -> IndexDigest {
        var out = [UInt8](repeating: 0, count: 16)
        // The state is 64-byte aligned in C (Swift imports it as an opaque type).
        let memory = UnsafeMutableRawPointer.allocate(byteCount: crypto_generichash_statebytes(), alignment: 64)
        defer { memory.deallocate() }
        let state = OpaquePointer(memory)
        key.withUnsafeBytes { k in
            _ = crypto_generichash_init(state, k.baseAddress!.assumingMemoryBound(to: UInt8.self), k.count, out.count)
        }
        for part in parts where part.count > 0 {
            _ = crypto_generichash_update(state, part.baseAddress!.assumingMemoryBound(to: UInt8.self), UInt64(part.count))
        }
        _ = crypto_generichash_final(state, &out, out.count)
        var high: UInt64 = 0, low: UInt64 = 0
        for i in 0..<8 {
            high = high << 8 | UInt64(out[i])
            low = low << 8 | UInt64(out[8 + i])
        }
        return IndexDigest(high: high, low: low)
    }

    static func prefix(of uuid: [UInt8]) -> UInt32 {
        uuid.prefix(4).reduce(UInt32(0)) { $0 << 8 | UInt32($1) }
    }

    /// Files an account under its current values. `position` gives an account's place in
    /// the file, to keep every group in file order.
    mutating func insert(_ uuid: [UInt8], values: [AccountField: SecureBytes], named: [String: SecureBytes] = [:],
                         position: ([UInt8]) -> Int) {
        func bytes<T>(_ field: AccountField, _ body: (UnsafeRawBufferPointer) -> T) -> T {
            if let value = values[field] { return value.withUnsafeBytes(body) }
            return body(UnsafeRawBufferPointer(start: nil, count: 0))
        }
        var slots = IndexedAttribute.allCases.map { attribute in Slot.attribute(attribute, bytes(attribute.field, digest)) }
        slots.append(.serverAndUsername(bytes(.server) { server in bytes(.username) { digest(server: server, username: $0) } }))
        for (name, value) in named { slots.append(.named(value.withUnsafeBytes { digest(name: name, value: $0) })) }
        let place = position(uuid)
        func add(_ uuid: [UInt8], to list: inout [[UInt8]]) {
            // Mostly appended (an unlock, a new account); else a binary search by position.
            if let last = list.last, position(last) > place {
                var low = 0, high = list.count
                while low < high {
                    let middle = (low + high) / 2
                    if position(list[middle]) < place { low = middle + 1 } else { high = middle }
                }
                list.insert(uuid, at: low)
            } else {
                list.append(uuid)
            }
        }
        for slot in slots { add(uuid, to: &groups[slot, default: []]) }
        add(uuid, to: &byPrefix[Self.prefix(of: uuid), default: []])
        slotsOfAccount[uuid] = slots
    }

    mutating func remove(_ uuid: [UInt8]) {
        guard let slots = slotsOfAccount.removeValue(forKey: uuid) else { return }
        for slot in slots {
            groups[slot]?.removeAll { $0 == uuid }
            if groups[slot]?.isEmpty == true { groups[slot] = nil }
        }
        let prefix = Self.prefix(of: uuid)
        byPrefix[prefix]?.removeAll { $0 == uuid }
        if byPrefix[prefix]?.isEmpty == true { byPrefix[prefix] = nil }
    }

    func accounts(in slot: Slot) -> [[UInt8]] { groups[slot] ?? [] }

    func accounts(withPrefix prefix: UInt32) -> [[UInt8]] { byPrefix[prefix] ?? [] }

    /// The digest an account is filed under for `attribute`.
    func digest(of uuid: [UInt8], _ attribute: IndexedAttribute) -> IndexDigest? {
        for case .attribute(attribute, let digest) in slotsOfAccount[uuid] ?? [] { return digest }
        return nil
    }

    /// Every distinct server: its digest and its accounts, in no particular order.
    var servers: [(IndexDigest, [[UInt8]])] {
        groups.compactMap { slot, accounts in
            if case .attribute(.server, let digest) = slot { return (digest, accounts) }
            return nil
        }
    }
}

/// The index of the accounts kept past a lock, for the Secret Service (SPEC §2c: a locked
/// collection's items come back in the locked list of a search): the index's digests, keyed
/// with its own random key, which stays in secure memory with it. No value is kept: a
/// search's values are digested and looked up. Taken from the vault just before it locks
/// (`Vault.takeIndexForLockedSearch`); wiped at the next unlock. Accounts another machine
/// adds while locked are not in it.
///
/// Thread-safety: none of its own; its owner serializes access.
public final class LockedSearchIndex: @unchecked Sendable {
    private var index: AccountIndex
    /// Every account indexed, in file order.
    public let accounts: [[UInt8]]

    init(_ index: AccountIndex, accounts: [[UInt8]]) {
        self.index = index
        self.accounts = accounts
    }

    deinit { index.wipe() }

    public func accounts(with attribute: IndexedAttribute, equalTo value: UnsafeRawBufferPointer) -> [[UInt8]] {
        index.accounts(in: .attribute(attribute, index.digest(value)))
    }

    public func accounts(namedField name: String, equalTo value: UnsafeRawBufferPointer) -> [[UInt8]] {
        index.accounts(in: .named(index.digest(name: name, value: value)))
    }
}
