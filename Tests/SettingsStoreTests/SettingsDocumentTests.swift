import Foundation
@testable import SettingsStore
import Testing

/// A file holding `bytes` in a fresh directory (removed with the directory by the caller).
func temporaryPlist(_ bytes: [UInt8]) throws -> (directory: String, path: String) {
    let directory = FileManager.default.temporaryDirectory.appendingPathComponent("mtmfs-doc-\(UUID().uuidString)").path
    try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
    let path = directory + "/Settings.plist"
    try Data(bytes).write(to: URL(fileURLWithPath: path))
    return (directory, path)
}

func fileBytes(_ path: String) throws -> [UInt8] { [UInt8](try Data(contentsOf: URL(fileURLWithPath: path))) }

/// The width each top-level integer of a binary plist was read with.
func integerWidths(_ bytes: [UInt8]) throws -> [String: PlistInteger.Width?] {
    guard case .dictionary(let root) = try PropertyList.decode(bytes).0 else { return [:] }
    var widths: [String: PlistInteger.Width?] = [:]
    for (key, value) in root.entries { if case .integer(let number) = value { widths[key] = number.width } }
    return widths
}

@Suite struct IntegerWidthTests {
    @Test func equalityIgnoresTheWidth() {
        let two = PlistInteger(5).with(width: .two), sixteen = PlistInteger(5).with(width: .sixteen)
        #expect(two == sixteen && two.hashValue == sixteen.hashValue)
        #expect(PlistValue.integer(two) == .integer(5))
        #expect(PlistInteger(isNegative: true, magnitude: 0) == 0)
        #expect(PlistInteger(isNegative: true, magnitude: 1 << 63)?.int64 == .min)
        #expect(PlistInteger(isNegative: true, magnitude: (1 << 63) + 1) == nil)
        #expect(PlistInteger(18446744073709551615).int64 == nil && PlistInteger(-1).uint64 == nil)
    }

    @Test func smallestWidthIsCoreFoundations() {
        let cases: [(PlistInteger, PlistInteger.Width)] = [
            (0, .one), (255, .one), (256, .two), (65535, .two), (65536, .four), (4294967295, .four), (4294967296, .eight),
            (9223372036854775807, .eight), (9223372036854775808, .sixteen), (18446744073709551615, .sixteen),
            (-1, .eight), (-9223372036854775808, .eight),
        ]
        for (value, width) in cases { #expect(value.smallestWidth == width, "\(value)") }
        #expect(PlistInteger(300).with(width: .one).writtenWidth == .two)
        #expect(PlistInteger(300).with(width: .sixteen).writtenWidth == .sixteen)
        #expect(PlistInteger(-1).with(width: .four).writtenWidth == .eight)
        #expect(PlistInteger(9223372036854775808).with(width: .eight).writtenWidth == .sixteen)
    }

    /// Each integer is written back as wide as it was read.
    @Test func widthsSurviveDecodeAndEncode() throws {
        let bytes = try writtenByBplistWriter("""
            w.write({'one': w.Wide(5, 1), 'two': w.Wide(5, 2), 'four': w.Wide(5, 4), 'eight': w.Wide(5, 8),
                     'sixteen': w.Wide(5, 16), 'negative16': w.Wide(-3, 16), 'big': 2**63, 'negative': -7}, 3, 3)
            """)
        let expected: [String: PlistInteger.Width?] = ["one": .one, "two": .two, "four": .four, "eight": .eight,
                                                      "sixteen": .sixteen, "negative16": .sixteen, "big": .sixteen, "negative": .eight]
        #expect(try integerWidths(bytes) == expected)
        let again = PropertyList.encode(try PropertyList.decode(bytes).0, as: .binary)
        #expect(try integerWidths(again) == expected)
        #expect(try plistlibCanonical(again) == plistlibCanonical(bytes))
    }
}

@Suite struct SettingsDocumentTests {
    /// Files our encoder would not write byte for byte the same: odd sizes, comments, attributes.
    static func untouchedSamples() throws -> [(String, [UInt8])] {
        [
            ("binary 3-byte sizes", try writtenByBplistWriter("w.write({'Count': w.Wide(5, 16), 'Name': 'x', 'Big': 2**64 - 1}, 3, 3)")),
            ("xml with comments", Array("""
                <?xml version="1.0"?>
                <!-- hand written -->
                <plist version="1.0"><dict>
                  <key id="1">Count</key>   <integer>0x10</integer>
                  <key>Name</key><string>x</string>
                </dict></plist>
                """.utf8)),
            ("plistlib binary", try python("import plistlib, sys; sys.stdout.buffer.write(plistlib.dumps({'a': 1, 'b': [True, 2.5]}, fmt=plistlib.FMT_BINARY))")),
        ]
    }

    /// SPEC §4: an untouched plist stays byte-identical. A save of the same root (an editor
    /// writing back what it read, `touch`, a rename of a key onto itself) writes nothing.
    @Test func anUnchangedRootIsNotWritten() throws {
        for (name, bytes) in try Self.untouchedSamples() {
            let (directory, path) = try temporaryPlist(bytes)
            defer { try? FileManager.default.removeItem(atPath: directory) }
            let before = try FileManager.default.attributesOfItem(atPath: path)
            let document = try SettingsDocument(path: path)
            let save = document.prepare(document.root)
            #expect(save.bytes == nil, "\(name)")
            save.write()
            save.finish()
            // A root built afresh with the same values (no widths) is the same root.
            guard case .dictionary(let fresh) = try PropertyList.decode(PropertyList.encode(.dictionary(document.root), as: .xml)).0 else { return }
            try document.save(fresh)
            #expect(try fileBytes(path) == bytes, "\(name)")
            let after = try FileManager.default.attributesOfItem(atPath: path)
            #expect(before[.systemFileNumber] as? Int == after[.systemFileNumber] as? Int, "\(name): replaced")
            #expect(try document.reloadIfChanged() == false, "\(name)")
        }
    }

    /// A save that writes nothing leaves the document's idea of the file alone: after our
    /// own write and another program's, it must not take our older write for the file.
    @Test func aSaveThatWritesNothingKeepsTheStamp() throws {
        let (directory, path) = try temporaryPlist(Array(DefaultSettings.xml.utf8))
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let document = try SettingsDocument(path: path)
        var root = document.root
        root["Count"] = .integer(1)
        try document.save(root)
        let other = Array(DefaultSettings.xml.replacingOccurrences(of: "<true/>", with: "<false/>").utf8)
        try Data(other).write(to: URL(fileURLWithPath: path + ".new"))
        #expect(rename(path + ".new", path) == 0)
        #expect(try document.reloadIfChanged())
        try document.save(document.root)
        #expect(try document.reloadIfChanged() == false)
        #expect(try fileBytes(path) == other)
    }

    /// A changed key is written back in the file's format, keys in order, and only it differs;
    /// plistlib reads the result.
    @Test(arguments: ["FMT_XML", "FMT_BINARY"])
    func aChangeKeepsFormatOrderAndEveryOtherKey(format: String) throws {
        let original = try python("""
            import plistlib, sys, datetime
            d = {'Zeta': 'first', 'Count': 300, 'Big': 2**64 - 1, 'Name': 'café', 'When': datetime.datetime(2020, 1, 2, 3, 4, 5),
                 'Blob': b'\\x00\\x01', 'List': [1, 'two'], 'Nested': {'b': 1, 'a': 2}, 'Flag': True, 'Ratio': 0.1}
            sys.stdout.buffer.write(plistlib.dumps(d, fmt=plistlib.\(format), sort_keys=False))
            """)
        let (directory, path) = try temporaryPlist(original)
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let document = try SettingsDocument(path: path)
        var root = document.root
        root["Name"] = PlistText.parse(Array("thé\n".utf8), as: .string)
        try document.save(root)
        let written = try fileBytes(path)
        #expect(written.starts(with: Array((format == "FMT_BINARY" ? "bplist00" : "<?xml").utf8)))
        let report = String(decoding: try python("""
            import plistlib, sys
            a = plistlib.loads(sys.stdin.buffer.read()[:\(original.count)]); b = plistlib.load(open(\(path.debugDescription), 'rb'))
            print(list(a) == list(b), [k for k in a if a[k] != b[k]], b['Name'], b['Big'])
            """, input: original), as: UTF8.self)
        #expect(report == "True ['Name'] thé 18446744073709551615\n", "\(report)")
    }

    /// A changed integer keeps its width while it fits; a new one gets the smallest.
    @Test func aChangedIntegerKeepsItsWidthWhileItFits() throws {
        let original = try writtenByBplistWriter("""
            w.write({'two': w.Wide(5, 2), 'one': w.Wide(5, 1), 'sixteen': w.Wide(7, 16), 'eight': w.Wide(1, 8), 'same': w.Wide(9, 4)}, 3, 3)
            """)
        let (directory, path) = try temporaryPlist(original)
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let document = try SettingsDocument(path: path)
        var root = document.root
        func parsed(_ text: String) -> PlistValue? { PlistText.parse(Array(text.utf8), as: .integer) }
        root["two"] = parsed("300")           // fits 2 bytes: stays 2
        root["one"] = parsed("70000")         // not 1 byte: the smallest, 4
        root["sixteen"] = parsed("8")         // stays a 16-byte object
        root["eight"] = parsed("-2")          // 8 bytes hold it
        root["newBig"] = parsed("9223372036854775808")
        root["newNegative"] = parsed("-1")
        root["newSmall"] = parsed("5")
        try document.save(root)
        let written = try fileBytes(path)
        let expected: [String: PlistInteger.Width?] = ["two": .two, "one": .four, "sixteen": .sixteen, "eight": .eight, "same": .four,
                                                      "newBig": .sixteen, "newNegative": .eight, "newSmall": .one]
        #expect(try integerWidths(written) == expected)
        let report = String(decoding: try python("import plistlib, sys; print(plistlib.load(open(\(path.debugDescription), 'rb')))"), as: UTF8.self)
        #expect(report == "{'two': 300, 'one': 70000, 'sixteen': 8, 'eight': -2, 'same': 9, 'newBig': 9223372036854775808, 'newNegative': -1, 'newSmall': 5}\n", "\(report)")
        // And the document's own root remembers them for the next save.
        let again = try SettingsDocument(path: path)
        var next = again.root
        next["two"] = parsed("301")
        try again.save(next)
        #expect(try integerWidths(try fileBytes(path))["two"] == .two)
    }
}
