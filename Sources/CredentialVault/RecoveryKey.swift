#if canImport(Glibc)
import Glibc
#endif
import CSodium
import Posix
import SecureMemory

/// A recovery key (`mtmfs recovery-key`, SPEC §3): 128 random bits that open a slot of
/// their own, shown once as 32 letters in eight groups of four — 28 letters carry the bits
/// (base 26, most significant first), the last 4 are a check (BLAKE2b of the bits) that
/// catches a mistyped letter before a key derivation is spent on it. Typed back in either
/// case, with or without the dashes and spaces.
///
/// The slot's secret is the 16 bytes themselves, so any spelling of the same key opens it.
/// Everything stays in secure memory; the arithmetic works in place there.
///
/// Thread-safety: stateless.
public enum RecoveryKey {
    static let byteCount = 16
    static let dataLetters = 28
    static let checkLetters = 4
    static let groupSize = 4

    /// A new key's 16 bytes (libsodium's `randombytes_buf`).
    public static func generate() throws(Errno) -> SecureBytes {
        Sodium.initialize()
        let key = try SecureBytes(count: byteCount)
        key.withUnsafeMutableBytes { raw in if let base = raw.baseAddress { randombytes_buf(base, raw.count) } }
        return key
    }

    /// The letters to show: `ABCD-EFGH-…`, 8 groups of 4 (39 characters).
    public static func text(of key: SecureBytes) throws(Errno) -> SecureBytes {
        precondition(key.count == byteCount, "a recovery key is 16 bytes")
        let digits = try SecureBytes(count: dataLetters + checkLetters)
        defer { digits.wipe() }
        let number = try key.copy()
        defer { number.wipe() }
        digits.withUnsafeMutableBytes { out in
            number.withUnsafeMutableBytes { value in
                // 28 divisions by 26, each remainder a digit, least significant first.
                for index in stride(from: dataLetters - 1, through: 0, by: -1) {
                    out[index] = divide(value, by: 26)
                }
            }
            let check = self.check(key)
            for index in 0..<checkLetters { out[dataLetters + index] = check[index] }
        }
        let groups = (dataLetters + checkLetters) / groupSize
        let text = try SecureBytes(count: dataLetters + checkLetters + groups - 1)
        text.withUnsafeMutableBytes { out in
            digits.withUnsafeBytes { digit in
                var position = 0
                for index in 0..<digit.count {
                    if index > 0 && index % groupSize == 0 { out[position] = UInt8(ascii: "-"); position += 1 }
                    out[position] = UInt8(ascii: "A") + digit[index]
                    position += 1
                }
            }
        }
        return text
    }

    /// The 16 bytes of a typed key; nil when it is not one (a character other than a letter,
    /// dash or space; not 32 letters; a value past 128 bits; check letters that differ).
    public static func parse(_ typed: SecureBytes) throws(Errno) -> SecureBytes? {
        let digits = try SecureBytes(count: dataLetters + checkLetters)
        defer { digits.wipe() }
        let letters = digits.withUnsafeMutableBytes { out in
            typed.withUnsafeBytes { input -> Int? in
                var count = 0
                for byte in input {
                    switch byte {
                    case UInt8(ascii: "-"), UInt8(ascii: " "), UInt8(ascii: "\t"), UInt8(ascii: "\n"), UInt8(ascii: "\r"): continue
                    case UInt8(ascii: "A")...UInt8(ascii: "Z"), UInt8(ascii: "a")...UInt8(ascii: "z"):
                        guard count < out.count else { return nil }
                        out[count] = (byte | 0x20) - UInt8(ascii: "a")
                        count += 1
                    default: return nil
                    }
                }
                return count
            }
        }
        guard letters == dataLetters + checkLetters else { return nil }
        let key = try SecureBytes(count: byteCount)
        let fits = key.withUnsafeMutableBytes { value in
            digits.withUnsafeBytes { digit in
                for index in 0..<dataLetters where !multiplyAdd(value, 26, UInt32(digit[index])) { return false }
                return true
            }
        }
        guard fits else {
            key.wipe()
            return nil
        }
        let check = self.check(key)
        let matches = digits.withUnsafeBytes { digit in (0..<checkLetters).allSatisfy { digit[dataLetters + $0] == check[$0] } }
        guard matches else {
            key.wipe()
            return nil
        }
        return key
    }

    /// The check letters' values (0–25) of a key: its BLAKE2b digest's first 4 bytes, base 26.
    /// (A digest of the key: not secret beyond what the letters shown already say.)
    private static func check(_ key: SecureBytes) -> [UInt8] {
        var digest = [UInt8](repeating: 0, count: Int(crypto_generichash_BYTES_MIN))
        key.withUnsafeBytes { raw in
            _ = crypto_generichash(&digest, digest.count, raw.bindMemory(to: UInt8.self).baseAddress, UInt64(raw.count), nil, 0)
        }
        var value = digest[0..<4].reduce(UInt32(0)) { $0 << 8 | UInt32($1) }
        var out = [UInt8](repeating: 0, count: checkLetters)
        for index in stride(from: checkLetters - 1, through: 0, by: -1) {
            out[index] = UInt8(value % 26)
            value /= 26
        }
        return out
    }

    /// Divides the big-endian number in `value` by `divisor` in place; the remainder.
    private static func divide(_ value: UnsafeMutableRawBufferPointer, by divisor: UInt32) -> UInt8 {
        var remainder: UInt32 = 0
        for index in 0..<value.count {
            let current = remainder << 8 | UInt32(value[index])
            value[index] = UInt8(current / divisor)
            remainder = current % divisor
        }
        return UInt8(remainder)
    }

    /// `value = value × factor + addend` for the big-endian number in `value`; false on
    /// overflow past its bytes.
    private static func multiplyAdd(_ value: UnsafeMutableRawBufferPointer, _ factor: UInt32, _ addend: UInt32) -> Bool {
        var carry = addend
        for index in stride(from: value.count - 1, through: 0, by: -1) {
            let current = UInt32(value[index]) * factor + carry
            value[index] = UInt8(current & 0xFF)
            carry = current >> 8
        }
        return carry == 0
    }
}
