import Foundation
@testable import SettingsStore
import Testing
#if canImport(Glibc)
import Glibc
#endif

/// Runs python3 with a script; returns stdout (the reference implementation is plistlib).
/// posix_spawn + waitpid: Foundation's Process can hang when tests spawn concurrently.
func python(_ script: String, input: [UInt8] = []) throws -> [UInt8] {
    let directory = FileManager.default.temporaryDirectory.appendingPathComponent("mtmfs-plist-\(UUID().uuidString)")
    try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
    defer { try? FileManager.default.removeItem(at: directory) }
    let inPath = directory.appendingPathComponent("in").path, outPath = directory.appendingPathComponent("out").path
    try Data(input).write(to: URL(fileURLWithPath: inPath))
    var actions = posix_spawn_file_actions_t()
    posix_spawn_file_actions_init(&actions)
    defer { posix_spawn_file_actions_destroy(&actions) }
    posix_spawn_file_actions_addopen(&actions, 0, inPath, O_RDONLY, 0)
    posix_spawn_file_actions_addopen(&actions, 1, outPath, O_WRONLY | O_CREAT | O_TRUNC, 0o600)
    let words: [String] = ["python3", "-c", script]
    var arguments: [UnsafeMutablePointer<CChar>?] = words.map { strdup($0) } + [nil]
    defer { arguments.forEach { free($0) } }
    var pid: pid_t = 0
    #expect(posix_spawnp(&pid, "python3", &actions, nil, &arguments, environ) == 0)
    var status: Int32 = 0
    while waitpid(pid, &status, 0) == -1 && errno == EINTR {}
    #expect(status == 0)
    return [UInt8](try Data(contentsOf: URL(fileURLWithPath: outPath)))
}

let sampleScript = """
import plistlib, sys, datetime
d = {'Flag': True, 'Off': False, 'Count': -42, 'Big': 2**62, 'Ratio': 0.1, 'Name': 'café ☕',
     'Empty': '', 'When': datetime.datetime(2024, 2, 29, 12, 30, 45),
     'Blob': bytes(range(20)), 'List': [1, 'two', [3.5]], 'Nested': {'Z': 1, 'A': {'deep': True}}}
fmt = plistlib.FMT_BINARY if sys.argv[-1] == 'binary' else plistlib.FMT_XML
sys.stdout.buffer.write(plistlib.dumps(d, fmt=fmt, sort_keys=False))
"""

@Suite struct PropertyListTests {
    static let expected: PlistValue = .dictionary(PlistDictionary([
        ("Flag", .bool(true)), ("Off", .bool(false)), ("Count", .integer(-42)), ("Big", .integer(4611686018427387904)),
        ("Ratio", .real(0.1)), ("Name", .string("café ☕")), ("Empty", .string("")),
        ("When", .date(PlistText.parseDate("2024-02-29T12:30:45Z")!)), ("Blob", .data(Array(0..<20))),
        ("List", .array([.integer(1), .string("two"), .array([.real(3.5)])])),
        ("Nested", .dictionary(PlistDictionary([("Z", .integer(1)), ("A", .dictionary(PlistDictionary([("deep", .bool(true))])))]))),
    ]))

    @Test(arguments: ["xml", "binary"])
    func decodesWhatPlistlibWritesInOrder(format: String) throws {
        let bytes = try python(sampleScript.replacingOccurrences(of: "sys.argv[-1]", with: "'\(format)'"))
        let (value, found) = try PropertyList.decode(bytes)
        #expect(found == (format == "xml" ? .xml : .binary))
        #expect(value == Self.expected)
    }

    @Test(arguments: [PlistFormat.xml, .binary])
    func plistlibReadsWhatWeWrite(format: PlistFormat) throws {
        let bytes = PropertyList.encode(Self.expected, as: format)
        let dumped = try python("""
            import plistlib, sys
            d = plistlib.loads(sys.stdin.buffer.read())
            print(list(d.keys())); print(d['Count'], d['Big'], d['Ratio'], d['Name'], d['When'].isoformat(), d['Blob'].hex(), d['List'], d['Nested'])
            """, input: bytes)
        let text = String(decoding: dumped, as: UTF8.self)
        #expect(text.hasPrefix("['Flag', 'Off', 'Count', 'Big', 'Ratio', 'Name', 'Empty', 'When', 'Blob', 'List', 'Nested']\n"), "\(text)")
        #expect(text.contains("-42 4611686018427387904 0.1 café ☕ 2024-02-29T12:30:45 000102030405060708090a0b0c0d0e0f10111213 [1, 'two', [3.5]] {'Z': 1, 'A': {'deep': True}}"), "\(text)")
        // And our own reader agrees.
        #expect(try PropertyList.decode(bytes).0 == Self.expected)
    }

    @Test func binaryKeepsSubSecondDatesAndLargeCollections() throws {
        var dictionary = PlistDictionary()
        for index in 0..<300 { dictionary["key\(index)"] = .string(String(repeating: "x", count: index)) }
        dictionary["When"] = .date(12345.678)
        let value = PlistValue.dictionary(dictionary)
        #expect(try PropertyList.decode(PropertyList.encode(value, as: .binary)).0 == value)
    }

    /// Found by mtmfs-reliability: a 64 MiB string was read one byte at a time (41 s).
    /// Text is now copied in runs between markup; runs, entities, CDATA and comments mix.
    @Test func longTextAndMarkupInsideTextDecode() throws {
        let long = String(repeating: "a", count: 8 << 20)
        let xml = "<?xml version=\"1.0\"?><plist version=\"1.0\"><dict><key>K</key><string>x&amp;y<![CDATA[<z>]]>w<!-- c -->\(long)&#65;</string></dict></plist>"
        let (value, _) = try PropertyList.decode(Array(xml.utf8))
        #expect(value == .dictionary(PlistDictionary([("K", .string("x&y<z>w" + long + "A"))])))
    }

    @Test func damagedInputIsAnErrorNotACrash() throws {
        var generator = SystemRandomNumberGenerator()
        for length in [0, 1, 7, 8, 39, 40, 100, 4096] {
            let random = (0..<length).map { _ in UInt8.random(in: 0...255, using: &generator) }
            #expect(throws: PlistError.self) { try PropertyList.decode(random) }
            #expect(throws: PlistError.self) { try PropertyList.decode(Array("bplist00".utf8) + random) }
        }
        let good = PropertyList.encode(Self.expected, as: .binary)
        for cut in stride(from: 0, to: good.count, by: 7) {
            _ = try? PropertyList.decode(Array(good[0..<cut]))  // must not crash
        }
        for index in good.indices {  // every single-byte flip: an error or a value, never a crash
            var flipped = good
            flipped[index] ^= 0xFF
            _ = try? PropertyList.decode(flipped)
        }
        let xml = PropertyList.encode(Self.expected, as: .xml)
        for cut in stride(from: 0, to: xml.count, by: 13) { _ = try? PropertyList.decode(Array(xml[0..<cut])) }
        let deep = "<plist>" + String(repeating: "<array>", count: 100_000) + String(repeating: "</array>", count: 100_000) + "</plist>"
        #expect(throws: PlistError.self) { try PropertyList.decode(Array(deep.utf8)) }
        let entity = "<!DOCTYPE plist [<!ENTITY a \"aaaa\">]><plist><string>&a;</string></plist>"
        #expect(throws: PlistError.self) { try PropertyList.decode(Array(entity.utf8)) }
    }

    @Test func binaryReferenceCycleIsRefused() throws {
        // An array (object 0) whose only element is itself.
        var bytes = Array("bplist00".utf8) + [0xA1, 0x00]
        let table = bytes.count
        bytes += [8]
        bytes += [0, 0, 0, 0, 0, 0, 1, 1] + [0, 0, 0, 0, 0, 0, 0, 1] + [0, 0, 0, 0, 0, 0, 0, 0]
            + [0, 0, 0, 0, 0, 0, 0, UInt8(table)]
        #expect(throws: PlistError.self) { try PropertyList.decode(bytes) }
    }
}

@Suite struct PlistTextTests {
    func parse(_ text: String, _ type: PlistType) -> PlistValue? { PlistText.parse(Array(text.utf8), as: type) }

    @Test func booleans() {
        for yes in ["true", "TRUE", "Yes", "1", "on", "On\n", "true\r\n"] { #expect(parse(yes, .bool) == .bool(true), "\(yes)") }
        for no in ["false", "No", "0", "OFF"] { #expect(parse(no, .bool) == .bool(false), "\(no)") }
        // Surrounding white space is not part of a bool: nano's extra blank line, an indent.
        for spaced in ["yes\n\n", " true", "\ttrue \r\n\r\n", "false\n\n\n"] { #expect(parse(spaced, .bool) != nil, "\(spaced)") }
        for bad in ["maybe", "", "\n\n", "tr ue", "2"] { #expect(parse(bad, .bool) == nil, "\(bad)") }
        #expect(PlistText.render(.bool(true)) == Array("true\n".utf8))
    }

    @Test func integersAreDecimalAndInRange() {
        #expect(parse("42\n", .integer) == .integer(42))
        #expect(parse("-7", .integer) == .integer(-7))
        #expect(parse("0", .integer) == .integer(0))
        #expect(parse("9223372036854775807", .integer) == .integer(9223372036854775807))
        #expect(parse(" 1\n\n", .integer) == .integer(1))
        #expect(parse("\t-3 ", .real) == .real(-3))
        #expect(parse(" AAEC/w==\n\n", .data) == .data([0, 1, 2, 255]))
        #expect(parse("\n2024-01-02T03:04:05Z \n", .date) != nil)
        // SPEC §4: −2^63…2^64−1, decimal, rendered in decimal over the whole range.
        #expect(parse("9223372036854775808", .integer) == .integer(9223372036854775808))
        #expect(parse("18446744073709551615\n", .integer) == .integer(18446744073709551615))
        #expect(parse("-9223372036854775808", .integer) == .integer(-9223372036854775808))
        #expect(PlistText.render(.integer(18446744073709551615)) == Array("18446744073709551615\n".utf8))
        #expect(PlistText.render(.integer(-9223372036854775808)) == Array("-9223372036854775808\n".utf8))
        #expect(PlistText.render(.integer(9223372036854775852)) == Array("9223372036854775852\n".utf8))
        #expect(PlistText.inferType(of: Array("18446744073709551615\n".utf8)) == .integer)
        for bad in ["12abc", "060", "18446744073709551616", "-9223372036854775809", "99999999999999999999999",
                    "0x10", "+5", "", "1.0", "1 2", "-", "--1"] {
            #expect(parse(bad, .integer) == nil, "\(bad)")
        }
    }

    @Test func realsRoundTripShortest() {
        #expect(PlistText.render(.real(0.1)) == Array("0.1\n".utf8))
        #expect(PlistText.render(.real(1)) == Array("1.0\n".utf8))
        #expect(PlistText.render(.real(1e300)) == Array("1e+300\n".utf8))
        for value in [0.1, 1.0 / 3.0, -2.5e-8, 123456789.125] {
            #expect(parse(String(decoding: PlistText.render(.real(value)), as: UTF8.self), .real) == .real(value))
        }
        #expect(parse("abc", .real) == nil)
        #expect(parse("0x1p3", .real) == nil)
    }

    @Test func datesAreUTCWithOffsetsAccepted() {
        let utc = parse("2024-01-02T03:04:05Z", .date)
        #expect(utc != nil)
        #expect(parse("2024-01-02T05:04:05+02:00", .date) == utc)
        #expect(parse("2024-01-01T22:04:05-0500", .date) == utc)
        #expect(PlistText.render(utc!) == Array("2024-01-02T03:04:05Z\n".utf8))
        #expect(PlistText.render(.date(0)) == Array("2001-01-01T00:00:00Z\n".utf8))
        #expect(PlistText.render(.date(-978_307_200)) == Array("1970-01-01T00:00:00Z\n".utf8))
        for bad in ["2024-02-30T00:00:00Z", "2024-01-02 03:04:05Z", "2024-01-02T03:04:05", "yesterday", "2024-13-01T00:00:00Z"] {
            #expect(parse(bad, .date) == nil, "\(bad)")
        }
    }

    @Test func dataIsStrictBase64() {
        #expect(parse("AAEC/w==\n", .data) == .data([0, 1, 2, 255]))
        #expect(parse("", .data) == .data([]))
        for bad in ["AAEC/w=", "A===", "AAEC*w==", "AA==AA=="] { #expect(parse(bad, .data) == nil, "\(bad)") }
        #expect(PlistText.render(.data([0, 1, 2, 255])) == Array("AAEC/w==\n".utf8))
    }

    @Test func stringsAreRawUTF8() {
        #expect(parse("a b\n\n", .string) == .string("a b\n"))
        #expect(PlistText.parse([0xFF, 0xFE], as: .string) == nil)
    }

    @Test func inference() {
        #expect(PlistText.inferType(of: Array("true\n".utf8)) == .bool)
        #expect(PlistText.inferType(of: Array("42\n".utf8)) == .integer)
        #expect(PlistText.inferType(of: Array("1.5".utf8)) == .real)
        #expect(PlistText.inferType(of: Array("2024-01-02T03:04:05Z".utf8)) == .date)
        #expect(PlistText.inferType(of: Array("yes".utf8)) == .string)
        #expect(PlistText.inferType(of: Array("hello".utf8)) == .string)
        #expect(PlistText.inferType(of: Array("060".utf8)) == .string)
        #expect(PlistText.inferType(of: Array("false\n\n".utf8)) == .bool)
        #expect(PlistText.inferType(of: Array(" 7 \n".utf8)) == .integer)
    }
}

@Suite struct PlistDictionaryTests {
    @Test func indexStaysInStepThroughEdits() {
        var d = PlistDictionary([("a", .integer(1)), ("b", .integer(2)), ("c", .integer(3))])
        d["b"] = nil
        #expect(d["b"] == nil && d["c"] == .integer(3) && d.index(of: "c") == 1)
        d.insert(.integer(9), forKey: "z", at: 0)
        #expect(d.keys == ["z", "a", "c"] && d.index(of: "a") == 1)
        d.insert(.integer(8), forKey: "a", at: 5)
        #expect(d.keys == ["z", "c", "a"] && d["a"] == .integer(8) && d.index(of: "c") == 1)
        d["b"] = .integer(4)
        #expect(d.keys == ["z", "c", "a", "b"] && d.index(of: "b") == 3)
    }
}

@Suite struct HostilePlistTests {
    /// 13 objects: arrays 0…11, each holding 14 references to the next, then an integer.
    /// plistlib reads it at once; expanded naively it is 14^12 objects.
    static func sharedReferenceBomb() -> [UInt8] {
        var out = Array("bplist00".utf8)
        var offsets: [Int] = []
        for level in 0..<12 {
            offsets.append(out.count)
            out.append(0xA0 | 14)
            out += [UInt8](repeating: UInt8(level + 1), count: 14)
        }
        offsets.append(out.count)
        out += [0x10, 0x07]
        let table = out.count
        out += offsets.map { UInt8($0) }
        out += [0, 0, 0, 0, 0, 0, 1, 1] + [0, 0, 0, 0, 0, 0, 0, 13] + [UInt8](repeating: 0, count: 8)
        out += [0, 0, 0, 0, 0, 0, 0, UInt8(table)]
        return out
    }

    @Test func sharedReferenceBombIsRefusedQuickly() {
        let start = ContinuousClock.now
        #expect(throws: PlistError.self) { try PropertyList.decode(Self.sharedReferenceBomb()) }
        #expect(ContinuousClock.now - start < .seconds(30))
    }

    @Test func nonFiniteOrFarDatesAreDamageNotACrash() {
        for value in [Double.nan, .infinity, -.infinity, 1e300] {
            var out = Array("bplist00".utf8) + [0xD1, 0x01, 0x02, 0x51, 0x57, 0x33]
            withUnsafeBytes(of: value.bitPattern.bigEndian) { out += $0 }
            let table = out.count
            out += [8, 9, 11] + [0, 0, 0, 0, 0, 0, 1, 1] + [0, 0, 0, 0, 0, 0, 0, 3] + [UInt8](repeating: 0, count: 8)
            out += [0, 0, 0, 0, 0, 0, 0, UInt8(table)]
            #expect(throws: PlistError.self) { try PropertyList.decode(out) }
        }
        #expect(PlistText.dateText(.nan).hasSuffix("Z"))  // never traps
    }

    @Test func datesOutsideYearsOneTo9999AndControlCharactersAreRefused() {
        #expect(PlistText.parse(Array("9999-12-31T23:59:59-01:00".utf8), as: .date) == nil)
        #expect(PlistText.parse(Array("0001-01-01T00:00:00+00:01".utf8), as: .date) == nil)
        #expect(PlistText.parse(Array("9999-12-31T23:59:59Z".utf8), as: .date) != nil)
        #expect(PlistText.parse(Array("x\u{1B}[0m".utf8), as: .string) == nil)
        #expect(PlistText.parse([0x61, 0x00, 0x62], as: .string) == nil)
        #expect(PlistText.parse(Array("tab\tand\nnewline".utf8), as: .string) == .string("tab\tand\nnewline"))
    }
}
