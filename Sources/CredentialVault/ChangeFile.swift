#if canImport(Glibc)
import Glibc
#endif
import CSodium
import Posix
import SecureMemory

/// One change of one account, as a change file of vault format 3 holds it
/// (`docs/vault-format-3.md`).
///
/// The clear part (`kind`, `id`, `uuid`, `name`, `seen`) is what the folder shows anyone
/// and what a locked vault lists accounts from; `fields` come from the sealed part and are
/// known only while unlocked.
///
/// Thread-safety: none of its own (it holds `SecureBytes`); the owner serializes access.
public struct AccountChange: @unchecked Sendable {
    public enum Kind: UInt8, Sendable { case set = 1, remove = 2 }

    /// One field's new value, with the clocks its writer had seen of that field: per
    /// device, the newest clock of that device's values of this field it knew.
    ///
    /// Thread-safety: as `AccountChange`.
    public struct FieldValue: @unchecked Sendable {
        public var name: String
        public var seen: [UInt64: UInt64]
        public var value: SecureBytes

        public init(name: String, seen: [UInt64: UInt64], value: SecureBytes) {
            (self.name, self.seen, self.value) = (name, seen, value)
        }
    }

    public var kind: Kind
    public var id: ChangeID
    public var uuid: [UInt8]
    /// The account's directory name as its writer gave it (a UUID in any case).
    public var name: String
    /// A set: the removals of this account its writer had seen. A removal: the set changes
    /// of this account its writer had seen (what it removes).
    public var seen: [ChangeID]
    /// A set's fields (nil while locked; empty for a removal).
    public var fields: [FieldValue]?

    public init(kind: Kind, id: ChangeID, uuid: [UInt8], name: String, seen: [ChangeID], fields: [FieldValue]?) {
        (self.kind, self.id, self.uuid, self.name, self.seen, self.fields) = (kind, id, uuid, name, seen, fields)
    }

    /// Wipes the field values.
    public func wipe() { fields?.forEach { $0.value.wipe() } }
}

/// A change's identity: the device that wrote it, its hybrid-logical-clock time and its
/// place among the changes made at that time. Kept when a device folds its files, so that
/// other machines' references to it stay true.
///
/// Thread-safety: a value; `Sendable`.
public struct ChangeID: Hashable, Comparable, Sendable, CustomStringConvertible {
    public var device: UInt64
    public var clock: UInt64
    public var index: UInt16

    public init(device: UInt64, clock: UInt64, index: UInt16) { (self.device, self.clock, self.index) = (device, clock, index) }

    /// Later by clock, then by device, then by index: the order that picks a shown value.
    public static func < (a: ChangeID, b: ChangeID) -> Bool {
        (a.clock, a.device, a.index) < (b.clock, b.device, b.index)
    }

    public var description: String { "\(ChangeFile.hex(device, 16))@\(ChangeFile.hex(clock, 16)).\(index)" }
}

/// The byte layout of change files (format 3): a clear header, then one seal.
///
/// Thread-safety: constants and pure functions.
public enum ChangeFile {
    static let magic = Array("MTMVLT03".utf8)
    /// Sealed plaintexts are padded to a multiple of this (`sodium_pad`): a change of any
    /// one field to a value of up to 100 bytes makes a file of one size.
    static let paddingBlock = 512
    static let maximumFileSize = 64 << 20
    /// What a file's name must look like: `CLOCK-RANDOM.mtv` (16 and 8 lowercase hex digits).
    public static func parseName(_ name: String) -> UInt64? {
        let parts = name.utf8
        guard parts.count == 16 + 1 + 8 + 4, name.hasSuffix(".mtv") else { return nil }
        let bytes = Array(parts)
        guard bytes[16] == UInt8(ascii: "-"), bytes[0..<16].allSatisfy(isLowerHex), bytes[17..<25].allSatisfy(isLowerHex) else { return nil }
        return UInt64(String(decoding: bytes[0..<16], as: UTF8.self), radix: 16)
    }

    /// A device's folder name: 16 lowercase hex digits.
    public static func parseDevice(_ name: String) -> UInt64? {
        guard name.utf8.count == 16, name.utf8.allSatisfy(isLowerHex) else { return nil }
        return UInt64(name, radix: 16)
    }

    /// Whether a change fits the format's counts and lengths (names of up to 255 bytes, up
    /// to 255 devices in a field's seen clocks, 65,535 fields and seen ids).
    static func fits(_ change: AccountChange) -> Bool {
        change.name.utf8.count <= 255 && change.seen.count <= Int(UInt16.max) && (change.fields?.count ?? 0) <= Int(UInt16.max)
            && (change.fields ?? []).allSatisfy { $0.name.utf8.count <= 255 && $0.seen.count <= 255 && $0.value.count <= Int(UInt32.max) }
    }

    static func isLowerHex(_ c: UInt8) -> Bool { (c >= 48 && c <= 57) || (c >= 97 && c <= 102) }

    public static func hex(_ value: UInt64, _ digits: Int) -> String {
        let text = String(value, radix: 16)
        return String(repeating: "0", count: max(0, digits - text.count)) + text
    }

    /// The clear header: magic, device, file clock, then each change's clear part.
    static func header(device: UInt64, clock: UInt64, changes: [AccountChange]) -> [UInt8] {
        var out = magic + VaultFormat.bigEndian(device, 8) + VaultFormat.bigEndian(clock, 8)
        out += VaultFormat.bigEndian(UInt64(changes.count), 4)
        for change in changes {
            let name = Array(change.name.utf8)
            out += [change.kind.rawValue] + change.uuid + [UInt8(name.count)] + name
            out += VaultFormat.bigEndian(change.id.clock, 8) + VaultFormat.bigEndian(UInt64(change.id.index), 2)
            out += VaultFormat.bigEndian(UInt64(change.seen.count), 2)
            for seen in change.seen {
                out += VaultFormat.bigEndian(seen.device, 8) + VaultFormat.bigEndian(seen.clock, 8)
                    + VaultFormat.bigEndian(UInt64(seen.index), 2)
            }
        }
        return out
    }

    static func associatedData(vaultID: [UInt8], path: String, header: [UInt8]) -> [UInt8] {
        Array("MTMVAULT3-change".utf8) + vaultID + Array(path.utf8) + [0] + header
    }

    /// The file's bytes: header, nonce, and the sealed, padded fields of every change.
    static func encode(device: UInt64, clock: UInt64, changes: [AccountChange], vaultID: [UInt8], path: String,
                       key: SecureBytes, nonce: [UInt8]) throws(Errno) -> [UInt8] {
        let header = header(device: device, clock: clock, changes: changes)
        let plaintext = SecureBytes()
        defer { plaintext.wipe() }
        func append(_ bytes: [UInt8]) throws(Errno) { try plaintext.append(bytes) }
        for change in changes {
            let fields = change.fields ?? []
            try append(VaultFormat.bigEndian(UInt64(fields.count), 2))
            for field in fields {
                let name = Array(field.name.utf8)
                try append([UInt8(name.count)] + name + [UInt8(field.seen.count)])
                for (device, clock) in field.seen.sorted(by: { $0.key < $1.key }) {
                    try append(VaultFormat.bigEndian(device, 8) + VaultFormat.bigEndian(clock, 8))
                }
                try append(VaultFormat.bigEndian(UInt64(field.value.count), 4))
                try field.value.withUnsafeBytes { (raw) throws(Errno) in try plaintext.append(raw) }
            }
        }
        // sodium_pad needs room for one more block than the unpadded length.
        let unpadded = plaintext.count
        try plaintext.resize(to: unpadded + paddingBlock)
        var padded = 0
        let status = plaintext.withUnsafeMutableBytes { buffer in
            guard let base = buffer.baseAddress else { return Int32(-1) }
            return sodium_pad(&padded, base.assumingMemoryBound(to: UInt8.self), unpadded, paddingBlock, buffer.count)
        }
        guard status == 0 else { throw .invalidArgument }
        try plaintext.resize(to: padded)
        return header + nonce + Sealing.seal(plaintext, associatedData: associatedData(vaultID: vaultID, path: path, header: header),
                                             nonce: nonce, key: key)
    }

    /// A file's clear part, checked against the place it was found at (`device`, the
    /// clock in its name): everything a locked vault can check.
    struct Parsed {
        var device: UInt64
        var clock: UInt64
        var changes: [AccountChange]
        var header: [UInt8]
        var nonce: [UInt8]
        var sealed: [UInt8]
    }

    static func parse(_ bytes: [UInt8], device expectedDevice: UInt64, clock expectedClock: UInt64) throws(VaultError) -> Parsed {
        guard bytes.count <= maximumFileSize else { throw .damaged("larger than \(maximumFileSize >> 20) MiB") }
        var reader = VaultFormat.Reader(bytes: bytes)
        guard try reader.take(8) == magic else { throw .damaged("not a change file (bad magic)") }
        let device = try reader.integer(8), clock = try reader.integer(8)
        guard device == expectedDevice, clock == expectedClock else {
            throw .damaged("renamed or moved (its header names \(hex(device, 16))/\(hex(clock, 16)))")
        }
        let count = try reader.integer(4)
        guard count <= UInt64(bytes.count) else { throw .damaged("impossible change count \(count)") }
        var changes: [AccountChange] = []
        for _ in 0..<count {
            guard let kind = AccountChange.Kind(rawValue: UInt8(try reader.integer(1))) else { throw .damaged("unknown change kind") }
            let uuid = try reader.take(16)
            let nameBytes = try reader.take(Int(try reader.integer(1)))
            guard let name = String(validating: nameBytes, as: UTF8.self), AccountName.uuidBytes(name) == uuid else {
                throw .damaged("a change whose name does not match its UUID")
            }
            let id = ChangeID(device: device, clock: try reader.integer(8), index: UInt16(try reader.integer(2)))
            guard id.clock <= clock else { throw .damaged("a change later than its file") }
            var seen: [ChangeID] = []
            for _ in 0..<(try reader.integer(2)) {
                seen.append(ChangeID(device: try reader.integer(8), clock: try reader.integer(8), index: UInt16(try reader.integer(2))))
            }
            changes.append(AccountChange(kind: kind, id: id, uuid: uuid, name: name, seen: seen, fields: nil))
        }
        let header = Array(bytes[0..<reader.position])
        let nonce = try reader.take(VaultFormat.nonceSize)
        let sealed = Array(bytes[reader.position...])
        guard sealed.count >= VaultFormat.tagSize + paddingBlock, (sealed.count - VaultFormat.tagSize) % paddingBlock == 0 else {
            throw .damaged("truncated (\(bytes.count) bytes)")
        }
        return Parsed(device: device, clock: clock, changes: changes, header: header, nonce: nonce, sealed: sealed)
    }

    /// Authenticates and opens the sealed part: each set change gets its fields, each value
    /// a slot of `arena`. `.damaged` when it does not open (altered, truncated, renamed,
    /// from another vault).
    static func open(_ parsed: Parsed, vaultID: [UInt8], path: String, key: SecureBytes,
                     arena: SecureArena) throws(VaultError) -> [AccountChange] {
        let unsealed: SecureBytes?
        do throws(Errno) {
            unsealed = try Sealing.unseal(parsed.sealed, associatedData: associatedData(vaultID: vaultID, path: path, header: parsed.header),
                                          nonce: parsed.nonce, key: key)
        } catch {
            throw .io(error)
        }
        guard let plaintext = unsealed else {
            throw .damaged("fails authentication (altered, truncated, renamed or from another vault)")
        }
        defer { plaintext.wipe() }
        var unpadded = 0
        let unpadRC = plaintext.withUnsafeBytes { buffer in
            sodium_unpad(&unpadded, buffer.baseAddress!.assumingMemoryBound(to: UInt8.self), buffer.count, paddingBlock)
        }
        guard unpadRC == 0 else { throw .damaged("bad padding") }
        var changes = parsed.changes
        var outOfMemory = false
        let ok: Bool = plaintext.withUnsafeBytes { all in
            let bytes = UnsafeRawBufferPointer(rebasing: all[0..<unpadded])
            var position = 0
            func integer(_ size: Int) -> UInt64? {
                guard bytes.count - position >= size else { return nil }
                defer { position += size }
                return (0..<size).reduce(UInt64(0)) { $0 << 8 | UInt64(bytes[position + $1]) }
            }
            for index in changes.indices {
                guard let count = integer(2) else { return false }
                var fields: [AccountChange.FieldValue] = []
                for _ in 0..<count {
                    guard let nameLength = integer(1), bytes.count - position >= Int(nameLength),
                          let name = String(validating: bytes[position..<position + Int(nameLength)], as: UTF8.self) else { return false }
                    position += Int(nameLength)
                    guard let seenCount = integer(1) else { return false }
                    var seen: [UInt64: UInt64] = [:]
                    for _ in 0..<seenCount {
                        guard let device = integer(8), let clock = integer(8) else { return false }
                        seen[device] = clock
                    }
                    guard let length = integer(4), bytes.count - position >= Int(length) else { return false }
                    guard let value = try? SecureBytes.allocate(copying: UnsafeRawBufferPointer(rebasing: bytes[position..<position + Int(length)]),
                                                                in: arena) else {
                        outOfMemory = true
                        return true
                    }
                    position += Int(length)
                    fields.append(AccountChange.FieldValue(name: name, seen: seen, value: value))
                }
                guard changes[index].kind == .set || fields.isEmpty else { return false }
                changes[index].fields = fields
            }
            return position == bytes.count
        }
        if outOfMemory || !ok {
            changes.forEach { $0.wipe() }
            if outOfMemory { throw .io(.noMemory) }
            throw .damaged("a malformed sealed part")
        }
        return changes
    }
}

/// XChaCha20-Poly1305-IETF, as every part of the vault is sealed.
///
/// Thread-safety: stateless.
enum Sealing {
    static func seal(_ plaintext: SecureBytes, associatedData: [UInt8], nonce: [UInt8], key: SecureBytes) -> [UInt8] {
        var out = [UInt8](repeating: 0, count: plaintext.count + VaultFormat.tagSize)
        var written: UInt64 = 0
        plaintext.withUnsafeBytes { message in
            key.withUnsafeBytes { k in
                _ = crypto_aead_xchacha20poly1305_ietf_encrypt(
                    &out, &written, message.baseAddress?.assumingMemoryBound(to: UInt8.self), UInt64(message.count),
                    associatedData, UInt64(associatedData.count), nil, nonce, k.baseAddress!.assumingMemoryBound(to: UInt8.self))
            }
        }
        return out
    }

    /// The plaintext, or nil when the bytes are not what `key` sealed with `associatedData`
    /// (ENOMEM when there is no secure memory for it).
    static func unseal(_ ciphertext: [UInt8], associatedData: [UInt8], nonce: [UInt8], key: SecureBytes) throws(Errno) -> SecureBytes? {
        guard ciphertext.count >= VaultFormat.tagSize, nonce.count == VaultFormat.nonceSize else { return nil }
        // (An empty plaintext — a key slot's proof — takes no memory.)
        let plaintext = ciphertext.count == VaultFormat.tagSize ? SecureBytes() : try SecureBytes(count: ciphertext.count - VaultFormat.tagSize)
        let rc = plaintext.withUnsafeMutableBytes { out in
            key.withUnsafeBytes { k in
                crypto_aead_xchacha20poly1305_ietf_decrypt(
                    out.baseAddress?.assumingMemoryBound(to: UInt8.self), nil, nil, ciphertext, UInt64(ciphertext.count),
                    associatedData, UInt64(associatedData.count), nonce, k.baseAddress!.assumingMemoryBound(to: UInt8.self))
            }
        }
        guard rc == 0 else {
            plaintext.wipe()
            return nil
        }
        return plaintext
    }
}
