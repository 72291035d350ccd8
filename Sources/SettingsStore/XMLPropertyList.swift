/// Apple's XML property-list format, read and written by hand: one pass over the bytes,
/// nesting limited to `PropertyList.maximumDepth`, no external entities, no DTD loading.
///
/// Read as plistlib reads it where plistlib and Core Foundation agree: attributes on tags
/// ignored (quoted values may hold `>`), a UTF-8 or UTF-16 byte-order mark, line ends
/// normalised to LF as XML 1.0 says, comments and processing instructions anywhere, a
/// DOCTYPE without an internal subset, a root element without `<plist>` around it, empty
/// `<dict/>` `<array/>` `<string/>` `<key/>` `<data/>`, `<integer>` in decimal or `0x` hex
/// with a sign and surrounding space (Core Foundation's grammar), `<real>` as any decimal or
/// exponent form, `nan`, `inf`, `+infinity`…, duplicate keys keeping the last value at the
/// first key's place. Written back always as UTF-8 with tabs, as Apple's tools write it.
///
/// Thread-safety: pure functions; each read has its own `Reader` (XMLPropertyListReader.swift).
enum XMLPropertyList {
    static func decode(_ bytes: [UInt8]) throws(PlistError) -> PlistValue {
        var reader = Reader(bytes: try utf8(bytes))
        try reader.skipProlog()
        let value: PlistValue
        if reader.starts(with: "<plist") && (reader.position + 6 == reader.bytes.count
            || " \t\r\n/>".utf8.contains(reader.bytes[reader.position + 6])) {
            let (_, selfClosing) = try reader.openTag()
            guard !selfClosing else { throw PlistError("<plist/> holds no value") }
            value = try reader.value(depth: 0)
            try reader.closeTag("plist")
        } else {
            value = try reader.value(depth: 0)  // plistlib and Core Foundation take a bare root
        }
        reader.skipMisc()
        guard reader.atEnd else { throw PlistError("bytes after </plist> at offset \(reader.position)") }
        return value
    }

    /// The document as UTF-8: a UTF-16 one (with its byte-order mark) is transcoded.
    static func utf8(_ bytes: [UInt8]) throws(PlistError) -> [UInt8] {
        let bigEndian = bytes.starts(with: [0xFE, 0xFF]), littleEndian = bytes.starts(with: [0xFF, 0xFE])
        guard bigEndian || littleEndian else { return bytes }
        guard bytes.count % 2 == 0 else { throw PlistError("a UTF-16 document with an odd number of bytes") }
        var units: [UInt16] = []
        units.reserveCapacity(bytes.count / 2 - 1)
        for index in stride(from: 2, to: bytes.count, by: 2) {
            let (first, second) = (UInt16(bytes[index]), UInt16(bytes[index + 1]))
            units.append(bigEndian ? first << 8 | second : second << 8 | first)
        }
        guard let text = String(validating: units, as: UTF16.self) else { throw PlistError("a UTF-16 document with unpaired surrogates") }
        return Array(text.utf8)
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
        case .integer(let number): out += indent + "<integer>\(number.description)</integer>\n"
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
}

extension String {
    func trimmingSpace() -> String {
        var scalars = Substring(self)
        while let first = scalars.first, first.isWhitespace { scalars.removeFirst() }
        while let last = scalars.last, last.isWhitespace { scalars.removeLast() }
        return String(scalars)
    }
}
