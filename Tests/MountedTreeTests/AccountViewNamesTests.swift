@testable import MountedTree
import Testing

/// The naming rules of accounts/by-server and accounts/by-label (README, mtmfs(1)).
@Suite struct AccountViewNamesTests {
    func name(_ value: String, limit: Int = AccountViewNames.maximumBase) -> (String, Bool) {
        let encoded = Array(value.utf8).withUnsafeBytes { AccountViewNames.encode($0, limit: limit) }
        return (encoded.name, encoded.cut)
    }

    @Test func everyValueHasOneNameAndNoTwoShareOne() {
        let cases: [(String, String)] = [
            ("", "_"), ("_", "%5F"), (".", "%2E"), ("..", "%2E%2E"), ("...", "..."), ("a/b", "a%2Fb"),
            ("50%", "50%25"), ("tab\there", "tab%09here"), ("nul\u{0}", "nul%00"), ("del\u{7F}", "del%7F"),
            ("Work mail", "Work mail"), ("ünïcödé ✓", "ünïcödé ✓"), ("_x", "_x"), ("~", "%7E"), ("alice~abcdef01", "alice%7Eabcdef01"),
        ]
        for (value, expected) in cases {
            #expect(name(value).0 == expected, "\(value)")
            #expect(AccountViewNames.decode(expected) == Array(value.utf8), "\(expected)")
        }
        // Names that no value has: not written as encode writes them.
        for name in ["%2f", "%2", "a/b", "%5Fx", "%41"] where name != "%5Fx" {
            #expect(AccountViewNames.decode(name) == nil, "\(name)")
        }
        #expect(AccountViewNames.decode("%5Fx") == nil, "only the whole value _ is escaped")
    }

    @Test func longValuesAreCutAtACharacterAndAlwaysSuffixed() {
        let long = String(repeating: "é", count: 200)  // 400 bytes
        let (cut, wasCut) = name(long)
        #expect(wasCut)
        #expect(cut.utf8.count == 246, "2-byte characters: 123 of them")
        let escapes = String(repeating: "/", count: 100)  // 300 bytes written
        let (escaped, _) = name(escapes)
        #expect(escaped.utf8.count == 246 && escaped.hasSuffix("%2F"), "an escape is never split")
        let uuid: [UInt8] = [0x3E, 0x46, 0x66, 0xBF] + Array(repeating: 0, count: 12)
        let full = Array(long.utf8).withUnsafeBytes { AccountViewNames.name(of: uuid, value: $0, group: [uuid]) }
        #expect(full == cut + "~3e4666bf" && full.utf8.count <= 255, "cut names take the suffix even when first")
    }

    @Test func laterAccountsOfOneValueTakeTheirUUIDSuffix() {
        let first: [UInt8] = [1, 2, 3, 4] + Array(repeating: 0, count: 12)
        let second: [UInt8] = [0xAB, 0xCD, 0xEF, 0x01] + Array(repeating: 0, count: 12)
        let group = [first, second]
        let names = [first, second].map { uuid in Array("alice".utf8).withUnsafeBytes { AccountViewNames.name(of: uuid, value: $0, group: group) } }
        #expect(names == ["alice", "alice~abcdef01"])
        #expect(AccountViewNames.splitSuffix("alice~abcdef01")! == ("alice", 0xABCDEF01))
        #expect(AccountViewNames.splitSuffix("alice~ABCDEF01") == nil)
        // Two later accounts whose UUIDs begin alike (time-ordered UUIDs): all 32 digits.
        let third: [UInt8] = [0xAB, 0xCD, 0xEF, 0x01] + Array(repeating: 0, count: 11) + [9]
        let crowded = [first, second, third]
        let long = [second, third].map { uuid in Array("alice".utf8).withUnsafeBytes { AccountViewNames.name(of: uuid, value: $0, group: crowded) } }
        #expect(long == ["alice~abcdef01000000000000000000000000", "alice~abcdef01000000000000000000000009"])
        #expect(AccountViewNames.splitSuffix(long[1])! == ("alice", 0xABCDEF01))
        #expect(AccountViewNames.splitSuffix("~abcdef01") == nil)
    }
}
