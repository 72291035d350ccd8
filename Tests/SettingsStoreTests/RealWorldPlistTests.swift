import Foundation
@testable import SettingsStore
import Testing

// Property lists as the world writes them: Apple's own (CPython's test data was written by
// Apple's tools), odd but legal binary layouts, XML as editors and other encoders leave it.
// The reference is plistlib where it and Core Foundation agree (SPEC §4).

/// `Tests/RealPlists`, where the binary writer with chosen offset and reference sizes lives.
let realPlistsDirectory = URL(fileURLWithPath: #filePath).deletingLastPathComponent()
    .deletingLastPathComponent().appendingPathComponent("RealPlists").path

/// A value as one comparable line: the same text `canonicalScript` prints for plistlib's.
func canonical(_ value: PlistValue) -> String {
    func hex(_ bytes: [UInt8]) -> String { bytes.map { String(format: "%02x", $0) }.joined() }
    switch value {
    case .bool(let flag): return flag ? "true" : "false"
    case .integer(let number): return "i" + number.description
    case .real(let number):
        return number.isNaN ? "rnan" : "r" + String(format: "%016llx", number.bitPattern)
    case .string(let text): return "s" + hex(Array(text.utf8))
    case .data(let bytes): return "d" + hex(bytes)
    case .date(let seconds): return "t" + PlistText.dateText(seconds).dropLast()
    case .array(let items): return "[" + items.map(canonical).joined(separator: ",") + "]"
    case .dictionary(let dictionary):
        return "{" + dictionary.entries.map { hex(Array($0.key.utf8)) + ":" + canonical($0.value) }.joined(separator: ",") + "}"
    }
}

let canonicalScript = """
import plistlib, sys, struct, datetime
def c(v):
    if isinstance(v, bool): return 'true' if v else 'false'
    if isinstance(v, int): return 'i%d' % v
    if isinstance(v, float): return 'rnan' if v != v else 'r' + struct.pack('>d', v).hex()
    if isinstance(v, str): return 's' + v.encode('utf-8').hex()
    if isinstance(v, bytes): return 'd' + v.hex()
    if isinstance(v, datetime.datetime): return 't' + v.replace(microsecond=0).isoformat()
    if isinstance(v, list): return '[' + ','.join(map(c, v)) + ']'
    if isinstance(v, dict): return '{' + ','.join(k.encode().hex() + ':' + c(x) for k, x in v.items()) + '}'
    return '?' + type(v).__name__

"""

/// plistlib's reading of `bytes` as a canonical line, or "ERROR …" when it refuses them.
/// (plistlib guesses XML only from a leading `<?xml` or `<plist`; told it is XML, it reads
/// a leading DOCTYPE, space or bare root as Core Foundation does.)
func plistlibCanonical(_ bytes: [UInt8]) throws -> String {
    let out = try python(canonicalScript + """
        data = sys.stdin.buffer.read()
        try:
            try:
                value = plistlib.loads(data)
            except plistlib.InvalidFileException:
                if data.startswith(b'bplist'): raise
                value = plistlib.loads(data, fmt=plistlib.FMT_XML)
            print(c(value), end='')
        except Exception as e:
            print('ERROR', type(e).__name__, e, end='')
        """, input: bytes)
    return String(decoding: out, as: UTF8.self)
}

/// Bytes made by `Tests/RealPlists/bplist_writer.py`: `expression` is Python over module `w`.
func writtenByBplistWriter(_ expression: String) throws -> [UInt8] {
    try python("""
        import sys; sys.dont_write_bytecode = True; sys.path.insert(0, \(realPlistsDirectory.debugDescription))
        import bplist_writer as w
        sys.stdout.buffer.write(\(expression))
        """)
}

/// A binary plist `{"k": <object>}` with the given raw bytes as the value's object.
func bplistWithValueObject(_ object: [UInt8]) -> [UInt8] {
    var out = Array("bplist00".utf8)
    let dictionary = out.count
    out += [0xD1, 0x01, 0x02]
    let key = out.count
    out += [0x51, UInt8(ascii: "k")]
    let value = out.count
    out += object
    let table = out.count
    out += [UInt8(dictionary), UInt8(key), UInt8(value)]
    out += [0, 0, 0, 0, 0, 0, 1, 1] + [0, 0, 0, 0, 0, 0, 0, 3] + [UInt8](repeating: 0, count: 8)
    out += [0, 0, 0, 0, 0, 0, 0, UInt8(table)]
    return out
}

@Suite struct RealWorldPlistTests {
    /// Expects our reading and plistlib's to agree, and both to read it.
    func expectSameAsPlistlib(_ bytes: [UInt8], _ comment: String = "", sourceLocation: SourceLocation = #_sourceLocation) throws {
        let theirs = try plistlibCanonical(bytes)
        #expect(!theirs.hasPrefix("ERROR"), "plistlib refuses \(comment): \(theirs)", sourceLocation: sourceLocation)
        do {
            let ours = canonical(try PropertyList.decode(bytes).0)
            #expect(ours == theirs, "\(comment)", sourceLocation: sourceLocation)
        } catch {
            Issue.record("we refuse \(comment): \(error)", sourceLocation: sourceLocation)
        }
    }

    /// CPython's TESTDATA: an XML and a binary plist written by Apple's tools (with
    /// 9223372036854775852, above Int64.max, and UTF-16 keys), and a keyed archive.
    @Test(arguments: ["FMT_XML", "FMT_BINARY"])
    func plistsWrittenByApplesToolsRead(format: String) throws {
        let bytes = try python("import sys, plistlib, test.test_plistlib as t; sys.stdout.buffer.write(t.TESTDATA[plistlib.\(format)])")
        try expectSameAsPlistlib(bytes, format)
        guard case .dictionary(let root) = try PropertyList.decode(bytes).0 else { Issue.record("root"); return }
        #expect(root["aBigInt2"] == .integer(9223372036854775852))
        #expect(root["aNegativeBigInt"] == .integer(-80000000000))
    }

    @Test func keyedArchivesAndOpenStepAreRefusedWithTheirReason() throws {
        let archive = try python("import sys, test.test_plistlib as t; sys.stdout.buffer.write(t.TESTDATA['KEYED_ARCHIVE'])")
        #expect(throws: PlistError.self) { try PropertyList.decode(archive) }
        #expect(reason(archive).contains("keyed-archiver UID"), "\(reason(archive))")
        for text in ["{ Name = \"x\"; }", "\u{FEFF}(a, b)", "  \"key\" = \"value\";"] {
            #expect(reason(Array(text.utf8)).contains("OpenStep"), "\(text)")
        }
        #expect(reason(Array("bplist15xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx".utf8)).contains("bplist15"))
        #expect(reason(bplistWithValueObject([0x00])).contains("null"))
        #expect(reason(bplistWithValueObject([0xC0])).contains("set"))
    }

    func reason(_ bytes: [UInt8]) -> String {
        do { _ = try PropertyList.decode(bytes); return "read" } catch { return error.description }
    }

    @Test func xmlIntegersOverTheWholeRange() throws {
        for (text, value) in [("9223372036854775808", PlistInteger(9223372036854775808)),
                              ("18446744073709551615", 18446744073709551615), ("-9223372036854775808", -9223372036854775808),
                              ("0x1F", 31), ("0XfF", 255), ("  +12\n", 12), ("007", 7), ("0", 0), ("-0", 0), ("000", 0),
                              ("0xFFFFFFFFFFFFFFFF", 18446744073709551615), ("- 3", -3), ("-0x10", -16)] {
            let xml = "<plist><dict><key>k</key><integer>\(text)</integer></dict></plist>"
            #expect(try PropertyList.decode(Array(xml.utf8)).0 == .dictionary(PlistDictionary([("k", .integer(value))])), "\(text)")
            if !text.contains("- ") && !text.contains("-0x") { try expectSameAsPlistlib(Array(xml.utf8), text) }
        }
        for bad in ["18446744073709551616", "-9223372036854775809", "0x10000000000000000", "12abc", "", "0x", "1.5", "0b101"] {
            let xml = "<plist><dict><key>k</key><integer>\(bad)</integer></dict></plist>"
            #expect(throws: PlistError.self, "\(bad)") { try PropertyList.decode(Array(xml.utf8)) }
        }
    }

    @Test func sixteenByteIntegersAsCoreFoundationWritesThem() throws {
        // CF: 0x14 + 16 bytes big-endian, high half zero for 2^63…2^64−1.
        let bytes = try writtenByBplistWriter("""
            w.write({'a': 2**63, 'b': 2**64 - 1, 'c': 9223372036854775852, 'd': w.Wide(7, 16), 'e': w.Wide(-1, 16),
                     'f': -2**63, 'g': w.Wide(-2**63, 16)})
            """)
        try expectSameAsPlistlib(bytes)
        let expected = PlistValue.dictionary(PlistDictionary([
            ("a", .integer(9223372036854775808)), ("b", .integer(18446744073709551615)), ("c", .integer(9223372036854775852)),
            ("d", .integer(7)), ("e", .integer(-1)), ("f", .integer(-9223372036854775808)), ("g", .integer(-9223372036854775808)),
        ]))
        #expect(try PropertyList.decode(bytes).0 == expected)
        // Outside −2^63…2^64−1: damage, whatever plistlib's 128-bit integers make of it.
        for high: [UInt8] in [[0, 0, 0, 0, 0, 0, 0, 1], [0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF], [0x80] + [UInt8](repeating: 0, count: 7)] {
            let low: [UInt8] = high == [0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF] ? [0x7F] + [UInt8](repeating: 0xFF, count: 7) : [UInt8](repeating: 0, count: 8)
            #expect(throws: PlistError.self, "\(high) \(low)") { try PropertyList.decode(bplistWithValueObject([0x14] + high + low)) }
        }
        #expect(throws: PlistError.self) { try PropertyList.decode(bplistWithValueObject([0x15] + [UInt8](repeating: 0, count: 32))) }
    }

    /// Offsets and references of every width 1…8, as the trailer says (CPython issue #21538:
    /// an encoder in the wild writes 3-byte ones).
    @Test(arguments: [(3, 3), (5, 5), (6, 6), (7, 7), (3, 1), (1, 3), (2, 7), (8, 8), (4, 6), (5, 2)])
    func anyOffsetAndReferenceSize(sizes: (Int, Int)) throws {
        let bytes = try writtenByBplistWriter("""
            w.write({'Name': 'Mässig 😀', 'Big': 2**64 - 1, 'List': [1, 2.5, b'xy', {'deep': True}], 'Neg': -5,
                     'When': __import__('datetime').datetime(2024, 2, 29, 12, 30, 45)}, \(sizes.0), \(sizes.1))
            """)
        #expect(bytes[bytes.count - 26] == UInt8(sizes.0) && bytes[bytes.count - 25] == UInt8(sizes.1))
        try expectSameAsPlistlib(bytes, "\(sizes)")
    }

    @Test func cpythonIssue21538ThreeByteSample() throws {
        // CPython's test_nonstandard_refs_size: refs and offsets are 24-bit integers.
        let bytes: [UInt8] = Array("bplist00".utf8) + [0xD1, 0x00, 0x00, 0x01, 0x00, 0x00, 0x02, 0x51, 0x61, 0x51, 0x62]
            + [0x00, 0x00, 0x08, 0x00, 0x00, 0x0F, 0x00, 0x00, 0x11] + [0, 0, 0, 0, 0, 0, 3, 3]
            + [0, 0, 0, 0, 0, 0, 0, 3] + [0, 0, 0, 0, 0, 0, 0, 0] + [0, 0, 0, 0, 0, 0, 0, 0x13]
        #expect(try PropertyList.decode(bytes).0 == .dictionary(PlistDictionary([("a", .string("b"))])))
        for bad: UInt8 in [0, 9, 16] {
            var sized = bytes
            sized[sized.count - 26] = bad
            #expect(throws: PlistError.self) { try PropertyList.decode(sized) }
        }
    }

    /// `<key Q=">">test</key>` is the key `test`: attributes are skipped, quotes and all.
    @Test func xmlAttributesAreIgnored() throws {
        let xml = """
            <?xml version="1.0" encoding="UTF-8"?>
            <plist version="1.0" xmlns:x='a>b'>
            <dict id="root">
            \t<key Q=">">test</key>
            \t<string lang='en' note="a/b>c">value</string>
            \t<key a="/" b='"'>n</key>
            \t<integer base="10">5</integer>
            \t<key>e</key>
            \t<array class=">"/>
            \t<key x = ">" >t</key>
            \t<true z="1"/>
            </dict>
            </plist>
            """
        let expected = PlistValue.dictionary(PlistDictionary([
            ("test", .string("value")), ("n", .integer(5)), ("e", .array([])), ("t", .bool(true)),
        ]))
        #expect(try PropertyList.decode(Array(xml.utf8)).0 == expected)
        try expectSameAsPlistlib(Array(xml.utf8))
    }

    /// Forms plistlib and Core Foundation both read (or both would, in CF's tolerance).
    static let xmlVariants: [(String, String)] = [
        ("doctype system", "<?xml version=\"1.0\"?>\n<!DOCTYPE plist SYSTEM \"file://localhost/System/Library/DTDs/PropertyList.dtd\">\n<plist version=\"0.9\"><dict><key>a</key><string>b</string></dict></plist>"),
        ("doctype lowercase public", "<!DOCTYPE plist PUBLIC '-//Apple Computer//DTD PLIST 1.0//EN' 'http://www.apple.com/DTDs/PropertyList-1.0.dtd'><plist><dict/></plist>"),
        ("no prolog, bare root", "<dict><key>a</key><integer>1</integer></dict>"),
        ("crlf", "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\r\n<plist version=\"1.0\">\r\n<dict>\r\n\t<key>a</key>\r\n\t<string>line1\r\nline2\rline3</string>\r\n</dict>\r\n</plist>\r\n"),
        ("comments and processing instructions", "<?xml version=\"1.0\"?><!-- c --><?pi x?><plist><!-- c --><dict><!-- c --><key>a<!-- c --></key><?pi?><string>x<!-- c -->y<?pi z?></string><!----></dict><!-- end --></plist><!-- after --><?after?>\n"),
        ("empty elements", "<plist><dict><key>d</key><dict/><key>a</key><array/><key>s</key><string/><key/><string></string><key>x</key><data></data><key>t</key><true></true></dict></plist>"),
        ("data with whitespace", "<plist><dict><key>d</key><data>\n\tAAEC\n\t/w==\n</data><key>e</key><data>  SGVs bG8=  </data></dict></plist>"),
        ("reals", "<plist><array><real>nan</real><real>NaN</real><real>+inf</real><real>-inf</real><real>inf</real><real>-infinity</real><real>+Infinity</real><real>-0</real><real>1e3</real><real>.5</real><real>5.</real><real> 2.5 </real><real>-1.5E-7</real><real>1</real></array></plist>"),
        ("duplicate keys keep the last value at the first place", "<plist><dict><key>a</key><integer>1</integer><key>b</key><integer>2</integer><key>a</key><string>last</string></dict></plist>"),
        ("entities and cdata", "<plist><dict><key>a&amp;b</key><string>&lt;&#x263A;&#65;&quot;&apos;<![CDATA[<raw>]]></string></dict></plist>"),
        ("utf-8 bom", "\u{FEFF}<?xml version=\"1.0\" encoding=\"UTF-8\"?><plist><dict><key>é</key><string>ü</string></dict></plist>"),
        ("space everywhere", "  \n<plist   version = \"1.0\"  >\n\n<dict >\n<key >a</key >\n<false />\n</dict >\n</plist >\n\n"),
        ("dates", "<plist><array><date>2004-10-26T10:33:33Z</date><date>0001-01-01T00:00:00Z</date><date>9999-12-31T23:59:59Z</date></array></plist>"),
    ]

    @Test(arguments: xmlVariants.map(\.0))
    func xmlVariantsReadAsPlistlibReadsThem(name: String) throws {
        let xml = Self.xmlVariants.first { $0.0 == name }!.1
        try expectSameAsPlistlib(Array(xml.utf8), name)
    }

    @Test func duplicateKeysKeepTheLastValue() throws {
        let xml = Self.xmlVariants.first { $0.0.hasPrefix("duplicate") }!.1
        let value = try PropertyList.decode(Array(xml.utf8)).0
        #expect(value == .dictionary(PlistDictionary([("a", .string("last")), ("b", .integer(2))])))
    }

    @Test func utf16Documents() throws {
        let xml = "<?xml version=\"1.0\" encoding=\"UTF-16\"?><plist><dict><key>Mässig</key><string>Maß 😀</string></dict></plist>"
        let expected = PlistValue.dictionary(PlistDictionary([("Mässig", .string("Maß 😀"))]))
        for bigEndian in [true, false] {
            var bytes: [UInt8] = bigEndian ? [0xFE, 0xFF] : [0xFF, 0xFE]
            for unit in xml.utf16 { bytes += bigEndian ? [UInt8(unit >> 8), UInt8(unit & 0xFF)] : [UInt8(unit & 0xFF), UInt8(unit >> 8)] }
            let (value, format) = try PropertyList.decode(bytes)
            #expect(value == expected && format == .xml)
            try expectSameAsPlistlib(bytes, "utf-16 \(bigEndian ? "BE" : "LE")")
        }
    }

    @Test func binaryUTF16StringsAndKeys() throws {
        let bytes = try python("""
            import plistlib, sys
            sys.stdout.buffer.write(plistlib.dumps({'Åbenraa': 'That was a unicode key.', 'e': 'Maß 😀', '日本': ['中文', 'ascii']},
                                                   fmt=plistlib.FMT_BINARY, sort_keys=False))
            """)
        try expectSameAsPlistlib(bytes)
        #expect(bytes.contains { $0 & 0xF0 == 0x60 })  // plistlib wrote UTF-16 string objects
    }

    /// Both refuse these; so do we (with a reason, never a crash).
    @Test func formsBothRefuse() throws {
        for xml in ["<plist><date>2024-01-02T03:04:05</date></plist>", "<plist><integer/></plist>", "<plist><real/></plist>",
                    "<plist><date/></plist>", "<plist><dict><key>a</key></dict></plist>", "<plist><dict><string>a</string></dict></plist>",
                    "<!DOCTYPE plist [<!ENTITY e \"x\">]><plist><string>&e;</string></plist>", "<plist><string>a</string></plist>junk",
                    "<plist><string>a</plist>", "<plist><string a=b>x</string></plist>", "<plist><string a=\"1\"b=\"2\">x</string></plist>",
                    // go-plist's s10: a quote with no attribute name must not swallow markup.
                    "<plist><dict><key>test</key><string =\">apple</string><!--<string \">libplist</string><!----></dict></plist>",
                    "<plist><string a=\"<\">x</string></plist>", "<plist Q=\"><dict/></plist>"] {
            #expect(throws: PlistError.self, "\(xml)") { try PropertyList.decode(Array(xml.utf8)) }
            #expect(try plistlibCanonical(Array(xml.utf8)).hasPrefix("ERROR"), "\(xml)")
        }
    }
}

/// Every plist in `$MTMFS_REAL_PLISTS` (a directory; the test does nothing without it), read
/// by us and by plistlib: where plistlib reads one we read the same values, or refuse it
/// for a reason SPEC §4 gives (a UID, a null, a value out of range). Run by hand on
/// downloaded files: `MTMFS_REAL_PLISTS=/tmp/realplists swift test --filter RealPlistDirectory`.
@Suite struct RealPlistDirectoryTests {
    @Test func everyFileReadsAsPlistlibReadsIt() throws {
        guard let directory = ProcessInfo.processInfo.environment["MTMFS_REAL_PLISTS"] else { return }
        let names = try FileManager.default.contentsOfDirectory(atPath: directory).filter { $0.hasSuffix("plist") }.sorted()
        let listing = String(decoding: try python(canonicalScript + """
            import os
            directory = \(directory.debugDescription)
            for name in \(names.debugDescription):
                data = open(os.path.join(directory, name), 'rb').read()
                try:
                    try:
                        value = plistlib.loads(data)
                    except plistlib.InvalidFileException:
                        if data.startswith(b'bplist'): raise
                        value = plistlib.loads(data, fmt=plistlib.FMT_XML)
                    line = c(value)
                except Exception as e:
                    line = 'ERROR ' + type(e).__name__
                print(name + '\\t' + line)
            """), as: UTF8.self)
        var agreed = 0, refusedAlike = 0
        for line in listing.split(separator: "\n") {
            let parts = line.split(separator: "\t", maxSplits: 1).map(String.init)
            let (name, theirs) = (parts[0], parts.count > 1 ? parts[1] : "")
            let bytes = try fileBytes(directory + "/" + name)
            let ours: String
            do { ours = canonical(try PropertyList.decode(bytes).0) } catch { ours = "ERROR " + error.description }
            if ours == theirs { agreed += 1; continue }
            let acceptableRefusal = ours.hasPrefix("ERROR") && (theirs.hasPrefix("ERROR") || theirs.contains("?UID")
                || theirs.contains("?NoneType") || ours.contains("UID") || ours.contains("null"))
            if acceptableRefusal {
                refusedAlike += 1
                print("refused \(name): \(ours.dropFirst(6).prefix(160)) (plistlib: \(theirs.prefix(60)))")
                continue
            }
            Issue.record("\(name): ours \(ours.prefix(300)) / plistlib \(theirs.prefix(300))")
        }
        print("\(names.count) files: \(agreed) read alike, \(refusedAlike) refused for a reason SPEC §4 gives")
    }
}
