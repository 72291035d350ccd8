#if canImport(Glibc)
import Glibc
#endif

extension XMLPropertyList {
    /// A cursor over the document.
    ///
    /// Thread-safety: a value local to one read.
    struct Reader {
        let bytes: [UInt8]
        var position = 0

        var atEnd: Bool { position >= bytes.count }

        mutating func skipSpace() {
            while position < bytes.count, [0x20, 0x09, 0x0A, 0x0D].contains(bytes[position]) { position += 1 }
        }

        func starts(with text: String) -> Bool {
            let pattern = Array(text.utf8)
            return bytes.count - position >= pattern.count && bytes[position..<position + pattern.count].elementsEqual(pattern)
        }

        mutating func skip(past text: String) throws(PlistError) {
            let pattern = Array(text.utf8)
            while position + pattern.count <= bytes.count {
                if bytes[position..<position + pattern.count].elementsEqual(pattern) {
                    position += pattern.count
                    return
                }
                position += 1
            }
            throw PlistError("unterminated markup: no \(text)")
        }

        /// Comments, processing instructions and white space.
        mutating func skipMisc() {
            while true {
                skipSpace()
                if starts(with: "<!--") { if (try? skip(past: "-->")) == nil { return } } else
                if starts(with: "<?") { if (try? skip(past: "?>")) == nil { return } } else { return }
            }
        }

        mutating func skipProlog() throws(PlistError) {
            if starts(with: "\u{FEFF}") { position += 3 }
            while true {
                skipMisc()
                if starts(with: "<!DOCTYPE") {
                    // No internal subset is accepted: entities could be defined there.
                    position += 9
                    guard try skipToTagEnd(refusing: UInt8(ascii: "[")) else {
                        throw PlistError("a DOCTYPE with an internal subset (entity definitions are not read)")
                    }
                    position += 1
                } else {
                    return
                }
            }
        }

        /// Moves to the `>` that ends the markup begun before `position`, past attribute
        /// values in quotes (which may hold `>`); false if `refused` comes first outside them.
        mutating func skipToTagEnd(refusing refused: UInt8? = nil) throws(PlistError) -> Bool {
            var quote: UInt8?
            while position < bytes.count {
                let byte = bytes[position]
                if let open = quote {
                    if byte == open { quote = nil }
                } else if byte == UInt8(ascii: "\"") || byte == UInt8(ascii: "'") {
                    quote = byte
                } else if byte == UInt8(ascii: ">") {
                    return true
                } else if byte == refused {
                    return false
                }
                position += 1
            }
            throw PlistError("unterminated markup: no >")
        }

        /// `<name attr…>` or `<name/>`; returns the name and whether it closed itself.
        mutating func openTag() throws(PlistError) -> (String, Bool) {
            skipMisc()
            guard position < bytes.count, bytes[position] == UInt8(ascii: "<") else {
                throw PlistError("expected an element at offset \(position)")
            }
            position += 1
            let start = position
            while position < bytes.count, !" \t\r\n/>".utf8.contains(bytes[position]) { position += 1 }
            let name = String(decoding: bytes[start..<position], as: UTF8.self)
            guard !name.isEmpty, !name.hasPrefix("/") else { throw PlistError("expected an element at offset \(start)") }
            try skipAttributes(of: name)
            let selfClosing = bytes[position] == UInt8(ascii: "/")
            position += selfClosing ? 2 : 1
            return (name, selfClosing)
        }

        /// Past `name="value"` pairs (either quote; a value may hold `>` and `/`, not `<`) to
        /// the `>` or `/>` that ends the tag. They are ignored, as plistlib ignores them; one
        /// that is not well-formed XML (no name, no `=`, no quotes) is refused, as expat does.
        mutating func skipAttributes(of name: String) throws(PlistError) {
            let space: [UInt8] = [0x20, 0x09, 0x0A, 0x0D]
            while true {
                let start = position
                skipSpace()
                guard position < bytes.count else { throw PlistError("unterminated <\(name)>") }
                if bytes[position] == UInt8(ascii: ">") { return }
                if bytes[position] == UInt8(ascii: "/") {
                    guard position + 1 < bytes.count, bytes[position + 1] == UInt8(ascii: ">") else { break }
                    return
                }
                guard position > start else { break }  // an attribute follows the name or a value after space
                let nameStart = position
                while position < bytes.count, !(space + Array("=<>/\"'".utf8)).contains(bytes[position]) { position += 1 }
                guard position > nameStart else { break }
                skipSpace()
                guard position < bytes.count, bytes[position] == UInt8(ascii: "=") else { break }
                position += 1
                skipSpace()
                guard position < bytes.count, bytes[position] == UInt8(ascii: "\"") || bytes[position] == UInt8(ascii: "'") else { break }
                let quote = bytes[position]
                position += 1
                while position < bytes.count, bytes[position] != quote {
                    guard bytes[position] != UInt8(ascii: "<") else { throw PlistError("a < inside an attribute of <\(name)>") }
                    position += 1
                }
                guard position < bytes.count else { throw PlistError("unterminated <\(name)>") }
                position += 1
            }
            throw PlistError("a malformed attribute in <\(name)> at offset \(position)")
        }

        mutating func closeTag(_ name: String) throws(PlistError) {
            skipMisc()
            guard starts(with: "</\(name)") else { throw PlistError("expected </\(name)> at offset \(position)") }
            position += name.utf8.count + 2
            skipSpace()
            guard position < bytes.count, bytes[position] == UInt8(ascii: ">") else { throw PlistError("malformed </\(name)>") }
            position += 1
        }

        /// The index of the next `<` or `&` at or after `start` (or the end), found with memchr.
        func nextMarkup(from start: Int) -> Int {
            bytes.withUnsafeBufferPointer { buffer in
                guard let base = buffer.baseAddress, start < buffer.count else { return buffer.count }
                let count = buffer.count - start
                let tag = memchr(base + start, Int32(UInt8(ascii: "<")), count)
                let end = tag.map { UnsafeRawPointer($0) - UnsafeRawPointer(base) } ?? buffer.count
                let entity = memchr(base + start, Int32(UInt8(ascii: "&")), end - start)
                return entity.map { UnsafeRawPointer($0) - UnsafeRawPointer(base) } ?? end
            }
        }

        /// Character data up to the next `<` (CDATA sections, comments and processing
        /// instructions included), unescaped, its line ends normalised to LF (XML 1.0 §2.11:
        /// CR LF and a lone CR read as LF, as plistlib reads them; `&#13;` stays a CR).
        mutating func text() throws(PlistError) -> String {
            var out: [UInt8] = []
            func appendNormalizingLineEnds(_ slice: ArraySlice<UInt8>) {
                // (memchr: a 64 MiB value is one scan, also in a debug build.)
                let hasCR = slice.withUnsafeBytes { raw in raw.baseAddress.map { memchr($0, 0x0D, raw.count) != nil } ?? false }
                guard hasCR else {
                    slice.withUnsafeBytes { raw in out.append(contentsOf: raw.bindMemory(to: UInt8.self)) }
                    return
                }
                var previous: UInt8 = 0
                for byte in slice {
                    if byte == 0x0A && previous == 0x0D { previous = byte; continue }
                    out.append(byte == 0x0D ? 0x0A : byte)
                    previous = byte
                }
            }
            while position < bytes.count {
                // Plain characters in one slice: a 64 MiB value takes one copy, not 64 Mi steps.
                let run = position
                position = nextMarkup(from: position)
                appendNormalizingLineEnds(bytes[run..<position])
                guard position < bytes.count else { break }
                if starts(with: "<![CDATA[") {
                    position += 9
                    let start = position
                    try skip(past: "]]>")
                    appendNormalizingLineEnds(bytes[start..<position - 3])
                } else if starts(with: "<!--") {
                    try skip(past: "-->")
                } else if starts(with: "<?") {
                    try skip(past: "?>")
                } else if bytes[position] == UInt8(ascii: "&") {
                    out += try entity()
                } else {
                    break  // the next tag
                }
            }
            guard let string = String(validating: out, as: UTF8.self) else { throw PlistError("text that is not UTF-8") }
            return string
        }

        mutating func entity() throws(PlistError) -> [UInt8] {
            let start = position
            while position < bytes.count, bytes[position] != UInt8(ascii: ";"), position - start < 12 { position += 1 }
            guard position < bytes.count, bytes[position] == UInt8(ascii: ";") else { throw PlistError("a bad entity at offset \(start)") }
            let name = String(decoding: bytes[(start + 1)..<position], as: UTF8.self)
            position += 1
            switch name {
            case "amp": return Array("&".utf8)
            case "lt": return Array("<".utf8)
            case "gt": return Array(">".utf8)
            case "quot": return Array("\"".utf8)
            case "apos": return Array("'".utf8)
            default:
                var code: UInt32?
                if name.hasPrefix("#x") { code = UInt32(name.dropFirst(2), radix: 16) }
                else if name.hasPrefix("#") { code = UInt32(name.dropFirst(), radix: 10) }
                guard let code, let scalar = Unicode.Scalar(code) else { throw PlistError("an unknown entity &\(name);") }
                return Array(String(Character(scalar)).utf8)
            }
        }

        /// Core Foundation's `<integer>`: space, an optional sign, space, then decimal digits
        /// (leading zeros allowed) or `0x` and hex digits; −2^63…2^64−1. (plistlib reads the
        /// same, but for a sign before `0x`, which Core Foundation takes.)
        static func integer(_ text: String) -> PlistInteger? {
            var rest = Substring(text)
            let negative = rest.first == "-"
            if negative || rest.first == "+" { rest = Substring(String(rest.dropFirst()).trimmingSpace()) }
            var radix = 10
            if rest.hasPrefix("0x") || rest.hasPrefix("0X") {
                radix = 16
                rest = rest.dropFirst(2)
            }
            guard !rest.isEmpty, rest.allSatisfy({ $0.isASCII && $0.isHexDigit && (radix == 16 || $0.isNumber) }),
                  let magnitude = UInt64(rest, radix: radix) else { return nil }
            return PlistInteger(isNegative: negative, magnitude: magnitude)
        }

        mutating func value(depth: Int) throws(PlistError) -> PlistValue {
            guard depth < PropertyList.maximumDepth else { throw PlistError("nesting deeper than \(PropertyList.maximumDepth)") }
            let (name, selfClosing) = try openTag()
            func content(_ reader: inout Reader) throws(PlistError) -> String {
                if selfClosing { return "" }
                let text = try reader.text()
                try reader.closeTag(name)
                return text
            }
            switch name {
            case "true", "false":
                if !selfClosing { _ = try content(&self) }
                return .bool(name == "true")
            case "integer":
                let text = try content(&self).trimmingSpace()
                guard let number = Self.integer(text) else {
                    throw PlistError("<integer>\(text.prefix(40))</integer> is not an integer from -2^63 to 2^64-1")
                }
                return .integer(number)
            case "real":
                let text = try content(&self).trimmingSpace()
                guard let number = PlistText.parseRealLenient(text) else { throw PlistError("<real>\(text)</real> is not a number") }
                return .real(number)
            case "string":
                return .string(try content(&self))
            case "date":
                let text = try content(&self).trimmingSpace()
                guard let seconds = PlistText.parseDate(text) else { throw PlistError("<date>\(text)</date> is not a date") }
                return .date(seconds)
            case "data":
                let text = try content(&self)
                guard let bytes = Base64.decode(text, ignoringWhitespace: true) else { throw PlistError("<data> that is not base64") }
                return .data(bytes)
            case "array":
                var items: [PlistValue] = []
                if selfClosing { return .array(items) }
                while true {
                    skipMisc()
                    if starts(with: "</") { break }
                    items.append(try value(depth: depth + 1))
                }
                try closeTag("array")
                return .array(items)
            case "dict":
                var dictionary = PlistDictionary()
                if selfClosing { return .dictionary(dictionary) }
                while true {
                    skipMisc()
                    if starts(with: "</") { break }
                    let (keyName, keyClosed) = try openTag()
                    guard keyName == "key" else { throw PlistError("<\(keyName)> where a <key> belongs in a <dict>") }
                    var key = ""
                    if !keyClosed {
                        key = try text()
                        try closeTag("key")
                    }
                    dictionary[key] = try value(depth: depth + 1)
                }
                try closeTag("dict")
                return .dictionary(dictionary)
            default:
                throw PlistError("an unknown element <\(name)>")
            }
        }
    }
}
