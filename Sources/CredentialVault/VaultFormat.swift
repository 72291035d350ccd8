import CSodium

/// Key-derivation parameters, stored in the vault header. The algorithm is always named
/// explicitly (Argon2id v1.3), never libsodium's `ALG_DEFAULT`.
///
/// Thread-safety: a value; `Sendable`.
public struct KDFParameters: Hashable, Sendable {
    public var operations: UInt64
    public var memoryBytes: UInt64

    public init(operations: UInt64, memoryBytes: UInt64) {
        self.operations = operations
        self.memoryBytes = memoryBytes
    }

    public static let interactive = KDFParameters(operations: UInt64(crypto_pwhash_argon2id_OPSLIMIT_INTERACTIVE),
                                                  memoryBytes: UInt64(crypto_pwhash_argon2id_MEMLIMIT_INTERACTIVE))
    public static let moderate = KDFParameters(operations: UInt64(crypto_pwhash_argon2id_OPSLIMIT_MODERATE),
                                               memoryBytes: UInt64(crypto_pwhash_argon2id_MEMLIMIT_MODERATE))
    public static let sensitive = KDFParameters(operations: UInt64(crypto_pwhash_argon2id_OPSLIMIT_SENSITIVE),
                                                memoryBytes: UInt64(crypto_pwhash_argon2id_MEMLIMIT_SENSITIVE))

    /// `interactive`, `moderate` or `sensitive`.
    public static func named(_ name: String) -> KDFParameters? {
        switch name {
        case "interactive": .interactive
        case "moderate": .moderate
        case "sensitive": .sensitive
        default: nil
        }
    }

    /// Parameters below libsodium's INTERACTIVE limits are refused (a tampered header
    /// could otherwise make guessing cheap).
    public var isStrongEnough: Bool {
        operations >= KDFParameters.interactive.operations && memoryBytes >= KDFParameters.interactive.memoryBytes
            && operations <= UInt64(crypto_pwhash_argon2id_OPSLIMIT_MAX) && memoryBytes <= (1 << 42)
    }
}

/// The byte layout of a vault file (`docs/vault-format.md` is the normative text):
///
///     header   magic "MTMVAULT" | version u16 | kdf alg u8 (2 = Argon2id13) | reserved u8
///              | opslimit u64 | memlimit u64 | salt [16] | store id [16]
///              | wrap nonce [24] | wrapped master key [32 + 16]
///     records  count u32, then per record: uuid [16] | name length u8 | name (ASCII, as given)
///              | nonce [24] | length u32 | ciphertext [length]
///     manifest nonce [24] | length u32 | ciphertext
///
/// Integers are big-endian. Everything after the salt is bound by AEAD tags: the wrapped key
/// to the header, each record to (store id, version, uuid), the manifest to the store id and
/// the list of (uuid, nonce) pairs, so that a dropped, swapped, moved or replayed record is
/// detected.
///
/// Thread-safety: constants and pure functions.
enum VaultFormat {
    static let magic = Array("MTMVAULT".utf8)
    /// The version written; every version in `versions` is read.
    static let version: UInt16 = 2
    static let versions: ClosedRange<UInt64> = 1...2
    static let algorithmArgon2id13: UInt8 = UInt8(crypto_pwhash_ALG_ARGON2ID13)
    static let saltSize = Int(crypto_pwhash_argon2id_SALTBYTES)
    static let storeIDSize = 16
    static let keySize = Int(crypto_aead_xchacha20poly1305_ietf_KEYBYTES)
    static let nonceSize = Int(crypto_aead_xchacha20poly1305_ietf_NPUBBYTES)
    static let tagSize = Int(crypto_aead_xchacha20poly1305_ietf_ABYTES)
    /// Bytes of the header that the wrapped key's tag covers (everything before the nonce).
    static let headerPrefixSize = 8 + 2 + 1 + 1 + 8 + 8 + saltSize + storeIDSize
    static let headerSize = headerPrefixSize + nonceSize + keySize + tagSize
    static let maximumRecordSize = 1 << 20

    /// Associated data of a record: "MTMVAULT-record" | version | store id | uuid.
    static func recordAssociatedData(version: UInt16, storeID: [UInt8], uuid: [UInt8]) -> [UInt8] {
        Array("MTMVAULT-record".utf8) + bigEndian(UInt64(version), 2) + storeID + uuid
    }

    /// Associated data of the manifest: "MTMVAULT-manifest" | version | store id.
    static func manifestAssociatedData(version: UInt16, storeID: [UInt8]) -> [UInt8] {
        Array("MTMVAULT-manifest".utf8) + bigEndian(UInt64(version), 2) + storeID
    }

    static func bigEndian(_ value: UInt64, _ size: Int) -> [UInt8] {
        (0..<size).map { UInt8(truncatingIfNeeded: value >> UInt64(8 * (size - 1 - $0))) }
    }

    /// Reads big-endian integers and byte runs, failing on a short input.
    ///
    /// Thread-safety: a value local to one read.
    struct Reader {
        let bytes: [UInt8]
        var position = 0

        mutating func take(_ count: Int) throws(VaultError) -> [UInt8] {
            guard count >= 0, count <= bytes.count - position else { throw .damaged("truncated at byte \(position)") }
            defer { position += count }
            return Array(bytes[position..<position + count])
        }

        mutating func integer(_ size: Int) throws(VaultError) -> UInt64 {
            try take(size).reduce(0) { $0 << 8 | UInt64($1) }
        }
    }
}
