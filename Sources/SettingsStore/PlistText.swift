import Posix

/// The text form of each settings value (SPEC §4): what `cat` shows and what a write must be.
///
/// - bool: reads `true`/`false`; accepts true/false, yes/no, 1/0, on/off in any case
/// - integer: decimal only (`-12`, `0`; no `+`, no leading zeros), from −2^63 to 2^64−1
/// - real: the shortest text that reads back to the same double, with `.` or an exponent
/// - string: the UTF-8 bytes as they are
/// - date: `YYYY-MM-DDTHH:MM:SSZ` (accepts an offset such as `+02:00` and fractions; stored UTC)
/// - data: base64
///
/// Every read ends with one newline; one trailing `\n` or `\r\n` is stripped on write. For
/// every type but string, surrounding white space (blank lines an editor added, say) is
/// ignored; a string keeps every other byte.
///
/// Thread-safety: pure functions.
public enum PlistText {
    /// The bytes `cat` shows for a scalar value.
    public static func render(_ value: PlistValue) -> [UInt8] {
        let text: String
        switch value {
        case .bool(let flag): text = flag ? "true" : "false"
        case .integer(let number): text = number.description
        case .real(let number): text = realText(number)
        case .string(let string): text = string
        case .date(let seconds): text = dateText(seconds)
        case .data(let bytes): text = Base64.encode(bytes)
        case .array, .dictionary: return []
        }
        return Array(text.utf8) + [0x0A]
    }

    /// Parses written bytes as a value of `type`; nil when they do not fit it.
    public static func parse(_ bytes: [UInt8], as type: PlistType) -> PlistValue? {
        let body = stripOneNewline(bytes)
        guard let exact = String(validating: body, as: UTF8.self) else { return nil }
        let text = type == .string ? exact : trimmingWhitespace(exact)
        switch type {
        case .bool: return parseBool(text).map(PlistValue.bool)
        case .integer: return parseInteger(text).map(PlistValue.integer)
        case .real: return parseReal(text).map(PlistValue.real)
        case .string: return isXMLText(text) ? .string(text) : nil
        case .date: return parseDate(text).map(PlistValue.date)
        case .data: return Base64.decode(text, ignoringWhitespace: false).map(PlistValue.data)
        case .array, .dictionary: return nil
        }
    }

    /// The type a new key gets from its first value: bool for true/false, integer, real,
    /// date for the date form, else string. (Data is never guessed: set the xattr.)
    public static func inferType(of bytes: [UInt8]) -> PlistType {
        guard let exact = String(validating: stripOneNewline(bytes), as: UTF8.self) else { return .string }
        let text = trimmingWhitespace(exact)
        let lowered = text.lowercased()
        if lowered == "true" || lowered == "false" { return .bool }
        if parseInteger(text) != nil { return .integer }
        if text.contains(where: { $0 == "." || $0 == "e" || $0 == "E" }),
           text.first.map({ $0.isNumber || $0 == "-" || $0 == "." }) == true, parseReal(text) != nil { return .real }
        if text.count >= 20, parseDate(text) != nil { return .date }
        return .string
    }

    /// Characters an XML 1.0 document can hold (no C0 controls but tab, LF, CR; no U+FFFE/FFFF).
    public static func isXMLText(_ text: String) -> Bool {
        text.unicodeScalars.allSatisfy { scalar in
            let v = scalar.value
            return (v >= 0x20 || v == 0x09 || v == 0x0A || v == 0x0D) && v != 0xFFFE && v != 0xFFFF
        }
    }

    /// What readers see of a value just written as `bytes` (it parsed as `type`): the text
    /// as written (`no` stays `no`), without the white space around it for every type but
    /// string, with one newline.
    public static func shownText(_ bytes: [UInt8], as type: PlistType) -> [UInt8] {
        let body = stripOneNewline(bytes)
        guard type != .string, let text = String(validating: body, as: UTF8.self) else { return Array(body) + [0x0A] }
        return Array(trimmingWhitespace(text).utf8) + [0x0A]
    }

    /// Without leading and trailing spaces, tabs, CRs and LFs.
    static func trimmingWhitespace(_ text: String) -> String {
        let blank: (Unicode.Scalar) -> Bool = { $0 == " " || $0 == "\t" || $0 == "\n" || $0 == "\r" }
        let scalars = text.unicodeScalars
        guard let first = scalars.firstIndex(where: { !blank($0) }),
              let last = scalars.lastIndex(where: { !blank($0) }) else { return "" }
        return String(scalars[first...last])
    }

    /// The bytes without one trailing `\n` or `\r\n` (the rule of `OneNewline`).
    public static func stripOneNewline(_ bytes: [UInt8]) -> ArraySlice<UInt8> { OneNewline.value(bytes) }

    public static func parseBool(_ text: String) -> Bool? {
        switch text.lowercased() {
        case "true", "yes", "1", "on": true
        case "false", "no", "0", "off": false
        default: nil
        }
    }

    /// Decimal only: an optional `-`, then `0` or digits without a leading zero; from −2^63
    /// to 2^64−1 (nil outside: EINVAL for the writer).
    public static func parseInteger(_ text: String) -> PlistInteger? {
        let negative = text.hasPrefix("-")
        let digits = negative ? text.dropFirst() : Substring(text)
        guard !digits.isEmpty, digits.utf8.allSatisfy({ $0 >= 0x30 && $0 <= 0x39 }) else { return nil }
        if digits.count > 1 && digits.hasPrefix("0") { return nil }
        return UInt64(digits).flatMap { PlistInteger(isNegative: negative, magnitude: $0) }
    }

    /// A decimal or exponent number, `inf`, `-inf` or `nan`; no hex forms, no spaces.
    public static func parseReal(_ text: String) -> Double? {
        guard !text.isEmpty, !text.lowercased().contains("x"),
              text.utf8.allSatisfy({ !($0 == 0x20 || $0 == 0x09) }) else { return nil }
        return Double(text)
    }

    /// XML plists written by other tools also use `+infinity` and the like.
    static func parseRealLenient(_ text: String) -> Double? {
        switch text.lowercased() {
        case "inf", "+inf", "infinity", "+infinity": return .infinity
        case "-inf", "-infinity": return -.infinity
        case "nan": return .nan
        default: return Double(text)
        }
    }

    public static func realText(_ number: Double) -> String {
        if number.isNaN { return "nan" }
        if number.isInfinite { return number < 0 ? "-inf" : "inf" }
        return number.description  // shortest round-trip; always has "." or "e"
    }

    // MARK: Dates (seconds since 2001-01-01T00:00:00Z; the calendar is ISO8601's)

    static let referenceDateUnixSeconds = 978_307_200.0
    static let earliestDate = ISO8601.earliest - referenceDateUnixSeconds
    static let latestDate = ISO8601.latest - referenceDateUnixSeconds

    /// Finite and within the years 1 to 9999 (what the text form can say).
    public static func isRepresentableDate(_ seconds: Double) -> Bool {
        seconds.isFinite && seconds >= earliestDate && seconds < latestDate + 1
    }

    public static func dateText(_ seconds: Double) -> String {
        ISO8601.text(unixSeconds: seconds + referenceDateUnixSeconds)
    }

    /// `YYYY-MM-DDTHH:MM:SS[.fraction](Z|±HH:MM|±HHMM)`, as seconds since 2001.
    public static func parseDate(_ text: String) -> Double? {
        ISO8601.unixSeconds(text).map { $0 - referenceDateUnixSeconds }
    }
}

/// Standard base64 (RFC 4648, with padding).
///
/// Thread-safety: pure functions over constant tables.
public enum Base64 {
    static let alphabet = Array("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/".utf8)
    static let values: [UInt8] = {
        var table = [UInt8](repeating: 0xFF, count: 256)
        for (index, c) in alphabet.enumerated() { table[Int(c)] = UInt8(index) }
        return table
    }()

    public static func encode(_ bytes: [UInt8]) -> String {
        var out: [UInt8] = []
        out.reserveCapacity((bytes.count + 2) / 3 * 4)
        var index = 0
        while index + 3 <= bytes.count {
            let n = UInt32(bytes[index]) << 16 | UInt32(bytes[index + 1]) << 8 | UInt32(bytes[index + 2])
            out += [alphabet[Int(n >> 18)], alphabet[Int(n >> 12 & 63)], alphabet[Int(n >> 6 & 63)], alphabet[Int(n & 63)]]
            index += 3
        }
        let rest = bytes.count - index
        if rest == 1 {
            let n = UInt32(bytes[index]) << 16
            out += [alphabet[Int(n >> 18)], alphabet[Int(n >> 12 & 63)], UInt8(ascii: "="), UInt8(ascii: "=")]
        } else if rest == 2 {
            let n = UInt32(bytes[index]) << 16 | UInt32(bytes[index + 1]) << 8
            out += [alphabet[Int(n >> 18)], alphabet[Int(n >> 12 & 63)], alphabet[Int(n >> 6 & 63)], UInt8(ascii: "=")]
        }
        return String(decoding: out, as: UTF8.self)
    }

    /// Strict decoding (length a multiple of 4, padding only at the end); white space is
    /// skipped only when asked (the XML form wraps lines).
    public static func decode(_ text: String, ignoringWhitespace: Bool) -> [UInt8]? {
        var symbols = Array(text.utf8)
        if ignoringWhitespace { symbols.removeAll { $0 == 0x20 || $0 == 0x09 || $0 == 0x0A || $0 == 0x0D } }
        guard symbols.count % 4 == 0 else { return nil }
        var out: [UInt8] = []
        out.reserveCapacity(symbols.count / 4 * 3)
        var index = 0
        while index < symbols.count {
            let isLast = index + 4 == symbols.count
            let a = values[Int(symbols[index])], b = values[Int(symbols[index + 1])]
            let cSymbol = symbols[index + 2], dSymbol = symbols[index + 3]
            guard a != 0xFF, b != 0xFF else { return nil }
            if cSymbol == UInt8(ascii: "=") {
                guard isLast, dSymbol == UInt8(ascii: "="), b & 0x0F == 0 else { return nil }
                out.append(a << 2 | b >> 4)
            } else if dSymbol == UInt8(ascii: "=") {
                let c = values[Int(cSymbol)]
                guard isLast, c != 0xFF, c & 0x03 == 0 else { return nil }
                out += [a << 2 | b >> 4, b << 4 | c >> 2]
            } else {
                let c = values[Int(cSymbol)], d = values[Int(dSymbol)]
                guard c != 0xFF, d != 0xFF else { return nil }
                out += [a << 2 | b >> 4, b << 4 | c >> 2, c << 6 | d]
            }
            index += 4
        }
        return out
    }
}
