#if canImport(Glibc)
import Glibc
#endif
/// Apple's XML property-list format, read and written by hand: one pass over the bytes,
/// nesting limited to `PropertyList.maximumDepth`, no external entities, no DTD loading.
///
/// Thread-safety: pure functions; each read has its own `Reader`.
enum XMLPropertyList {
    static func decode(_ bytes: [UInt8]) throws(PlistError) -> PlistValue {
        var reader = Reader(bytes: bytes)
        try reader.skipProlog()
        let (name, selfClosing) = try reader.openTag()
        guard name == "plist" else { throw PlistError("the root element is <\(name)>, not <plist>") }
        guard !selfClosing else { throw PlistError("<plist/> holds no value") }
        let value = try reader.value(depth: 0)
        try reader.closeTag("plist")
        reader.skipMisc()
        guard reader.atEnd else { throw PlistError("bytes after </plist> at offset \(reader.position)") }
        return value
    }

    static func encode(_ value: PlistValue) -> [UInt8] {
        var out = """
        <?xml version="1.0" encoding="UTF-8"?>
        <!DOCTYPE plist PUBLIC "-//Apple//DTD PLIST 1.0//EN" "http://www.apple.com/DTDs/PropertyList-1.0.dtd">
        <plist version="1.0">

        """
        write(value, indent: "", into: &out)
        out += "</plist>\n"
        return Array(out.utf8)
    }

    private static func write(_ value: PlistValue, indent: String, into out: inout String) {
        switch value {
        case .bool(let flag): out += indent + (flag ? "<true/>\n" : "<false/>\n")
        case .integer(let number): out += indent + "<integer>\(number)</integer>\n"
        case .real(let number): out += indent + "<real>\(PlistText.realText(number))</real>\n"
        case .string(let text): out += indent + "<string>\(escape(text))</string>\n"
        case .date(let seconds): out += indent + "<date>\(PlistText.dateText(seconds))</date>\n"
        case .data(let bytes): out += indent + "<data>\(Base64.encode(bytes))</data>\n"
        case .array(let items):
            if items.isEmpty { out += indent + "<array/>\n"; return }
            out += indent + "<array>\n"
            for item in items { write(item, indent: indent + "\t", into: &out) }
            out += indent + "</array>\n"
        case .dictionary(let dictionary):
            if dictionary.count == 0 { out += indent + "<dict/>\n"; return }
            out += indent + "<dict>\n"
            for (key, item) in dictionary.entries {
                out += indent + "\t<key>\(escape(key))</key>\n"
                write(item, indent: indent + "\t", into: &out)
            }
            out += indent + "</dict>\n"
        }
    }

    static func escape(_ text: String) -> String {
        var out = ""
        out.reserveCapacity(text.utf8.count)
        for scalar in text.unicodeScalars {
            switch scalar {
            case "&": out += "&amp;"
            case "<": out += "&lt;"
            case ">": out += "&gt;"
            case "\r": out += "&#13;"
            default: out.unicodeScalars.append(scalar)
            }
        }
        return out
    }

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
                    while position < bytes.count && bytes[position] != UInt8(ascii: ">") {
                        if bytes[position] == UInt8(ascii: "[") { throw PlistError("a DOCTYPE with an internal subset") }
                        position += 1
                    }
                    position += 1
                } else {
                    return
                }
            }
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
            while position < bytes.count, bytes[position] != UInt8(ascii: ">") { position += 1 }
            guard position < bytes.count else { throw PlistError("unterminated <\(name)>") }
            let selfClosing = bytes[position - 1] == UInt8(ascii: "/")
            position += 1
            return (name, selfClosing)
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

        /// Character data up to the next `<` (CDATA sections and comments included), unescaped.
        mutating func text() throws(PlistError) -> String {
            var out: [UInt8] = []
            while position < bytes.count {
                // Plain characters in one slice: a 64 MiB value takes one copy, not 64 Mi steps.
                let run = position
                position = nextMarkup(from: position)
                out += bytes[run..<position]
                guard position < bytes.count else { break }
                if starts(with: "<![CDATA[") {
                    position += 9
                    let start = position
                    try skip(past: "]]>")
                    out += bytes[start..<position - 3]
                } else if starts(with: "<!--") {
                    try skip(past: "-->")
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
                guard let number = Int64(text) else { throw PlistError("<integer>\(text)</integer> is not a 64-bit integer") }
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

extension String {
    func trimmingSpace() -> String {
        var scalars = Substring(self)
        while let first = scalars.first, first.isWhitespace { scalars.removeFirst() }
        while let last = scalars.last, last.isWhitespace { scalars.removeLast() }
        return String(scalars)
    }
}
