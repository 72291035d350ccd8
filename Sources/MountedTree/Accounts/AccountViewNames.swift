/// The names of accounts in `accounts/by-server/` and `accounts/by-label/` (SPEC §2a), the
/// rules written down once (README and mtmfs(1) say the same):
///
/// - A value's name is its bytes, with `%`, `/`, `~` and control characters (0x00–0x1F,
///   0x7F) written `%XX` (upper-case hex; `~` only ever starts a suffix, below). An empty value is named `_`; a value that is exactly
///   `_`, `.` or `..` is written `%5F`, `%2E`, `%2E%2E`. So every value has one name and no
///   two values share one.
/// - In one directory, the first account of a value (in the vault's order: the order the
///   accounts were made) has the name alone; every later one the name, `~` and the first 8
///   hex digits of its UUID (`alice~3e4666bf`): distinct, and stable while the first stays.
///   Where two accounts of one value share those 8 digits (UUIDs made in the same minute
///   by a time-ordered generator), both take all 32 hex digits instead.
/// - A name that would pass `maximumBase` bytes (label and username: 246) is cut there, at
///   a character boundary, and always takes the `~` suffix: at most 255 bytes. A server is
///   a host name (at most 253 bytes), never cut.
///
/// Thread-safety: pure functions.
enum AccountViewNames {
    static let maximumBase = 246
    static let suffixLength = 9  // "~" and 8 hex digits

    /// A value's name (without suffix) and whether it was cut to `limit` bytes.
    static func encode(_ value: UnsafeRawBufferPointer, limit: Int = maximumBase) -> (name: String, cut: Bool) {
        if value.isEmpty { return ("_", false) }
        let whole = Array(value)
        if whole == [0x5F] { return ("%5F", false) }
        if whole == [0x2E] { return ("%2E", false) }
        if whole == [0x2E, 0x2E] { return ("%2E%2E", false) }
        var bytes: [UInt8] = []
        bytes.reserveCapacity(value.count)
        let hex = Array("0123456789ABCDEF".utf8)
        var index = 0
        while index < whole.count {
            // One character at a time (a UTF-8 sequence, or one escaped byte), so a cut never
            // splits either.
            let byte = whole[index]
            var piece: [UInt8]
            if byte == 0x25 || byte == 0x2F || byte == 0x7E || byte < 0x20 || byte == 0x7F {
                piece = [0x25, hex[Int(byte >> 4)], hex[Int(byte & 0xF)]]
                index += 1
            } else {
                let length = byte < 0x80 ? 1 : byte >= 0xF0 ? 4 : byte >= 0xE0 ? 3 : byte >= 0xC0 ? 2 : 1
                piece = Array(whole[index..<min(whole.count, index + length)])
                index += length
            }
            if bytes.count + piece.count > limit { return (String(decoding: bytes, as: UTF8.self), true) }
            bytes += piece
        }
        return (String(decoding: bytes, as: UTF8.self), false)
    }

    /// The value a name (without suffix) stands for; nil when `name` is not the name of any
    /// value (not written as `encode` writes it).
    static func decode(_ name: String) -> [UInt8]? {
        if name == "_" { return [] }
        let raw = Array(name.utf8)
        var value: [UInt8] = []
        var index = 0
        while index < raw.count {
            if raw[index] == 0x25 {
                guard index + 2 < raw.count, let byte = UInt8(String(decoding: raw[(index + 1)...(index + 2)], as: UTF8.self), radix: 16)
                else { return nil }
                value.append(byte)
                index += 3
            } else {
                value.append(raw[index])
                index += 1
            }
        }
        let canonical = value.withUnsafeBytes { encode($0, limit: Int.max).name }
        return canonical == name ? value : nil
    }

    /// `~` and the first 8 hex digits (lower case) of a UUID, or all 32 with `whole`.
    static func suffix(_ uuid: [UInt8], whole: Bool = false) -> String {
        "~" + uuid.prefix(whole ? 16 : 4).map { String($0 >> 4, radix: 16) + String($0 & 0xF, radix: 16) }.joined()
    }

    /// A name split into what comes before a UUID suffix (8 or 32 hex digits) and the UUID's
    /// first 32 bits.
    static func splitSuffix(_ name: String) -> (base: String, prefix: UInt32)? {
        let raw = Array(name.utf8)
        for digits in [8, 32] {
            guard raw.count > digits + 1, raw[raw.count - digits - 1] == UInt8(ascii: "~") else { continue }
            let hex = raw[(raw.count - digits)...]
            guard hex.allSatisfy({ ($0 >= 0x30 && $0 <= 0x39) || ($0 >= 0x61 && $0 <= 0x66) }),
                  let prefix = UInt32(String(decoding: hex.prefix(8), as: UTF8.self), radix: 16) else { continue }
            return (String(decoding: raw[..<(raw.count - digits - 1)], as: UTF8.self), prefix)
        }
        return nil
    }

    /// The name of `uuid` among the accounts of its value, `group` (in vault order).
    static func name(of uuid: [UInt8], value: UnsafeRawBufferPointer, group: [[UInt8]]) -> String {
        let (base, cut) = encode(value)
        if !cut && group.first == uuid { return base }
        // Every account of one value shares `cut`: those with a suffix are all, or all but the first.
        let suffixed = cut ? group[...] : group.dropFirst()
        guard suffixed.contains(where: { $0 != uuid && $0.prefix(4) == uuid.prefix(4) }) else { return base + suffix(uuid) }
        return encode(value, limit: maximumBase - 24).name + suffix(uuid, whole: true)
    }
}
