import Posix
import SecureMemory
import CCrypto
import CSodium

/// TOTP (RFC 6238) from an account's `otp` field (SPEC §2d): an `otpauth://totp/…` URI
/// (Google's Key Uri Format) or a bare base32 secret (6 digits, 30 s, SHA1). Works on the
/// field's bytes: the secret is decoded into secure memory only, never into a `String`.
/// HMAC-SHA1 is OpenSSL's (libsodium has no SHA-1), HMAC-SHA-256 and -512 libsodium's.
///
/// Thread-safety: pure functions.
public enum OneTimeCode {
    public enum Algorithm: Sendable { case sha1, sha256, sha512 }

    public struct Parameters: Equatable, Sendable {
        public var algorithm: Algorithm = .sha1
        public var digits = 6
        public var period: UInt64 = 30
    }

    /// The longest period taken (a day): a code that changes less often is no second factor.
    static let longestPeriod: UInt64 = 86_400

    /// Whether `value` (without its newline) is an `otp` a code can be made from.
    public static func isValid(_ value: UnsafeRawBufferPointer) -> Bool {
        guard let (secret, _) = parse(value) else { return false }
        secret.wipe()
        return true
    }

    /// The secret (decoded, in secure memory) and the parameters of `value`; nil when it is
    /// not a TOTP URI or a base32 secret (a `hotp` URI, a bad secret, an unknown algorithm,
    /// digits outside 6–8, a period of 0 or over a day).
    public static func parse(_ value: UnsafeRawBufferPointer) -> (secret: SecureBytes, parameters: Parameters)? {
        let scheme = Array("otpauth://".utf8)
        guard value.count >= scheme.count, lowercased(UnsafeRawBufferPointer(rebasing: value[..<scheme.count])) == scheme else {
            guard let secret = base32(value, allowingSpaces: true) else { return nil }
            return (secret, Parameters())
        }
        let rest = UnsafeRawBufferPointer(rebasing: value[scheme.count...])
        // The type, then `/LABEL`, then `?` and the parameters.
        guard let slash = rest.firstIndex(of: UInt8(ascii: "/")),
              lowercased(UnsafeRawBufferPointer(rebasing: rest[..<slash])) == Array("totp".utf8),
              let question = rest.firstIndex(of: UInt8(ascii: "?")), question > slash else { return nil }
        var parameters = Parameters()
        var secret: SecureBytes?
        var failed = false
        let query = UnsafeRawBufferPointer(rebasing: rest[(question + 1)...])
        for pair in query.split(separator: UInt8(ascii: "&"), omittingEmptySubsequences: true) where !failed {
            let pair = UnsafeRawBufferPointer(rebasing: pair)
            guard let equals = pair.firstIndex(of: UInt8(ascii: "=")) else { continue }
            let name = lowercased(UnsafeRawBufferPointer(rebasing: pair[..<equals]))
            let raw = UnsafeRawBufferPointer(rebasing: pair[(equals + 1)...])
            switch String(decoding: name, as: UTF8.self) {
            case "secret":
                guard secret == nil, let decoded = percentDecoded(raw) else { failed = true; continue }
                secret = decoded.withUnsafeBytes { base32($0, allowingSpaces: false) }
                decoded.wipe()
                if secret == nil { failed = true }
            case "algorithm":
                switch String(decoding: lowercased(raw), as: UTF8.self) {
                case "sha1": parameters.algorithm = .sha1
                case "sha256": parameters.algorithm = .sha256
                case "sha512": parameters.algorithm = .sha512
                default: failed = true
                }
            case "digits":
                guard let digits = number(raw), (6...8).contains(digits) else { failed = true; continue }
                parameters.digits = Int(digits)
            case "period":
                guard let period = number(raw), (1...longestPeriod).contains(period) else { failed = true; continue }
                parameters.period = period
            default:
                continue  // issuer, image, …: not needed for the code
            }
        }
        guard !failed, let secret else {
            secret?.wipe()
            return nil
        }
        return (secret, parameters)
    }

    /// The code at `unixTime` (seconds), as ASCII digits.
    public static func code(secret: SecureBytes, parameters: Parameters, at unixTime: UInt64) throws(Errno) -> [UInt8] {
        let counter = VaultFormat.bigEndian(unixTime / parameters.period, 8)
        let mac = try SecureBytes(count: 64)
        defer { mac.wipe() }
        var length = 0
        secret.withUnsafeBytes { key in
            mac.withUnsafeMutableBytes { out in
                let bytes = out.baseAddress!.assumingMemoryBound(to: UInt8.self)
                let keyBytes = key.baseAddress?.assumingMemoryBound(to: UInt8.self)
                switch parameters.algorithm {
                case .sha1:
                    var written: UInt32 = 0
                    _ = HMAC(EVP_sha1(), key.baseAddress, Int32(key.count), counter, counter.count, bytes, &written)
                    length = Int(written)
                case .sha256:
                    var state = crypto_auth_hmacsha256_state()
                    crypto_auth_hmacsha256_init(&state, keyBytes!, key.count)  // (a secret is never empty)
                    crypto_auth_hmacsha256_update(&state, counter, UInt64(counter.count))
                    crypto_auth_hmacsha256_final(&state, bytes)
                    sodium_memzero(&state, MemoryLayout<crypto_auth_hmacsha256_state>.size)
                    length = 32
                case .sha512:
                    var state = crypto_auth_hmacsha512_state()
                    crypto_auth_hmacsha512_init(&state, keyBytes!, key.count)
                    crypto_auth_hmacsha512_update(&state, counter, UInt64(counter.count))
                    crypto_auth_hmacsha512_final(&state, bytes)
                    sodium_memzero(&state, MemoryLayout<crypto_auth_hmacsha512_state>.size)
                    length = 64
                }
            }
        }
        // Dynamic truncation (RFC 4226 §5.3).
        let binary: UInt32 = mac.withUnsafeBytes { hash in
            let offset = Int(hash[length - 1] & 0x0f)
            return (UInt32(hash[offset] & 0x7f) << 24) | (UInt32(hash[offset + 1]) << 16)
                | (UInt32(hash[offset + 2]) << 8) | UInt32(hash[offset + 3])
        }
        var modulus: UInt32 = 1
        for _ in 0..<parameters.digits { modulus *= 10 }
        var value = binary % modulus
        var digits = [UInt8](repeating: UInt8(ascii: "0"), count: parameters.digits)
        for index in stride(from: parameters.digits - 1, through: 0, by: -1) {
            digits[index] = UInt8(ascii: "0") + UInt8(value % 10)
            value /= 10
        }
        return digits
    }

    // MARK: Bytes

    static func lowercased(_ bytes: UnsafeRawBufferPointer) -> [UInt8] {
        bytes.map { $0 >= 0x41 && $0 <= 0x5A ? $0 + 0x20 : $0 }
    }

    /// A decimal number of at most 9 digits.
    static func number(_ bytes: UnsafeRawBufferPointer) -> UInt64? {
        guard !bytes.isEmpty, bytes.count <= 9, bytes.allSatisfy({ $0 >= 0x30 && $0 <= 0x39 }) else { return nil }
        return bytes.reduce(0) { $0 * 10 + UInt64($1 - 0x30) }
    }

    /// `%XX` decoded into secure memory (nil: a malformed escape, or no secure memory).
    static func percentDecoded(_ bytes: UnsafeRawBufferPointer) -> SecureBytes? {
        // Room for all of it at once: the appends below never allocate.
        guard let out = try? SecureBytes(count: bytes.count) else { return nil }
        try? out.resize(to: 0)
        var index = bytes.startIndex
        while index < bytes.endIndex {
            var byte = bytes[index]
            if byte == UInt8(ascii: "%") {
                guard index + 2 < bytes.endIndex, let high = hexValue(bytes[index + 1]), let low = hexValue(bytes[index + 2]) else {
                    out.wipe()
                    return nil
                }
                byte = high << 4 | low
                index += 2
            }
            withUnsafeBytes(of: byte) { try? out.append($0) }
            index += 1
        }
        return out
    }

    static func hexValue(_ c: UInt8) -> UInt8? { ASCIIHex.value(c) }

    /// RFC 4648 base32 (any case; `=` padding optional, only at the end; spaces allowed in a
    /// bare secret, as apps show it in groups) into secure memory; nil when not base32 or
    /// shorter than one byte.
    static func base32(_ text: UnsafeRawBufferPointer, allowingSpaces: Bool) -> SecureBytes? {
        // Room for all of it at once (5 bits a symbol): the appends below never allocate.
        guard let out = try? SecureBytes(count: text.count) else { return nil }
        try? out.resize(to: 0)
        var buffer: UInt64 = 0, bits = 0, symbols = 0
        var padding = false
        for c in text {
            if allowingSpaces && c == UInt8(ascii: " ") { continue }
            if c == UInt8(ascii: "=") {
                padding = true
                continue
            }
            let value: UInt8
            switch c {
            case 0x41...0x5A: value = c - 0x41
            case 0x61...0x7A: value = c - 0x61
            case 0x32...0x37: value = c - 0x32 + 26
            default:
                out.wipe()
                return nil
            }
            guard !padding else {  // a symbol after padding
                out.wipe()
                return nil
            }
            buffer = buffer << 5 | UInt64(value)
            bits += 5
            symbols += 1
            if bits >= 8 {
                bits -= 8
                var byte = UInt8(truncatingIfNeeded: buffer >> UInt64(bits))
                withUnsafeBytes(of: byte) { try? out.append($0) }
                byte = 0
            }
        }
        buffer = 0
        // Leftover bits must be zero padding (a final symbol cannot carry a partial byte).
        guard out.count > 0, [0, 2, 4, 5, 7].contains(symbols % 8) else {
            out.wipe()
            return nil
        }
        return out
    }
}
