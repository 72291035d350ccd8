@testable import CredentialVault
import Foundation
import SecureMemory
import Testing

@Suite struct RecoveryKeyTests {
    func text(_ key: SecureBytes) throws -> String {
        try RecoveryKey.text(of: key).withUnsafeBytes { String(decoding: $0, as: UTF8.self) }
    }

    /// 32 letters in 8 groups of 4; every spelling of it parses back to the same 16 bytes.
    @Test func aKeyShownIsAKeyTypedBack() throws {
        for _ in 0..<200 {
            let key = try RecoveryKey.generate()
            #expect(key.count == 16)
            let shown = try text(key)
            #expect(shown.count == 39)
            #expect(shown.split(separator: "-").map(\.count) == [4, 4, 4, 4, 4, 4, 4, 4])
            #expect(shown.allSatisfy { $0 == "-" || ("A"..."Z").contains($0) })
            for typed in [shown, shown.lowercased(), shown.replacingOccurrences(of: "-", with: " "),
                          shown.replacingOccurrences(of: "-", with: "") + "\n"] {
                let parsed = try #require(try RecoveryKey.parse(secret(typed)))
                #expect(parsed.equals(key))
            }
        }
    }

    /// The extremes of 128 bits, and values past them.
    @Test func theWholeRangeAndNothingPast() throws {
        for bytes in [[UInt8](repeating: 0, count: 16), [UInt8](repeating: 0xFF, count: 16), [1] + [UInt8](repeating: 0, count: 15)] {
            let key = try SecureBytes(copying: bytes)
            #expect(try RecoveryKey.parse(secret(try text(key)))?.equals(key) == true)
        }
        // 28 Z's is 26^28 − 1 > 2^128 − 1: not a key, whatever the check letters.
        for check in ["AAAA", "ZZZZ", "MMMM"] {
            #expect(try RecoveryKey.parse(secret(String(repeating: "Z", count: 28) + check)) == nil)
        }
    }

    /// A mistyped letter, a letter too many or too few, a digit: not a key.
    @Test func mistypedKeysAreRefused() throws {
        var caught = 0
        for _ in 0..<100 {
            let shown = Array(try text(try RecoveryKey.generate()))
            var typo = shown
            let index = [0, 5, 17, 30, 38].randomElement()!
            typo[index] = typo[index] == "A" ? "B" : "A"
            if try RecoveryKey.parse(secret(String(typo))) == nil { caught += 1 }
            #expect(try RecoveryKey.parse(secret(String(shown.dropLast()))) == nil)
            #expect(try RecoveryKey.parse(secret(String(shown) + "A")) == nil)
            #expect(try RecoveryKey.parse(secret(String(shown.dropLast()) + "1")) == nil)
        }
        // The 4 check letters miss one typo in 26^4 at random; a changed check letter
        // itself is always caught.
        #expect(caught >= 99)
    }
}
