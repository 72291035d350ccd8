@testable import CredentialVault
import Testing

/// TOTP (RFC 6238) from `otp` values: the RFC's test vectors with an injected clock, and
/// what `otp` takes and refuses (SPEC §2d).
@Suite struct OneTimeCodeTests {
    static let sha1 = "GEZDGNBVGY3TQOJQGEZDGNBVGY3TQOJQ"
    static let sha256 = "GEZDGNBVGY3TQOJQGEZDGNBVGY3TQOJQGEZDGNBVGY3TQOJQGEZA===="
    static let sha512 = "GEZDGNBVGY3TQOJQGEZDGNBVGY3TQOJQGEZDGNBVGY3TQOJQGEZDGNBVGY3TQOJQGEZDGNBVGY3TQOJQGEZDGNBVGY3TQOJQGEZDGNA="

    func code(_ value: String, at time: UInt64) -> String? {
        Array(value.utf8).withUnsafeBytes { bytes in
            guard let (secret, parameters) = OneTimeCode.parse(bytes) else { return nil }
            defer { secret.wipe() }
            return String(decoding: try! OneTimeCode.code(secret: secret, parameters: parameters, at: time), as: UTF8.self)
        }
    }

    func valid(_ value: String) -> Bool { Array(value.utf8).withUnsafeBytes { OneTimeCode.isValid($0) } }

    /// RFC 6238, Appendix B: 8 digits, 30 s, each algorithm with its own seed.
    @Test(arguments: [
        (59, "94287082", "46119246", "90693936"),
        (1_111_111_109, "07081804", "68084774", "25091201"),
        (1_111_111_111, "14050471", "67062674", "99943326"),
        (1_234_567_890, "89005924", "91819424", "93441116"),
        (2_000_000_000, "69279037", "90698825", "38618901"),
        (20_000_000_000, "65353130", "77737706", "47863826"),
    ] as [(UInt64, String, String, String)])
    func rfc6238Vectors(time: UInt64, sha1: String, sha256: String, sha512: String) {
        #expect(code("otpauth://totp/RFC:6238?secret=\(Self.sha1)&digits=8&algorithm=SHA1", at: time) == sha1)
        #expect(code("otpauth://totp/RFC?secret=\(Self.sha256)&digits=8&algorithm=SHA256&period=30", at: time) == sha256)
        #expect(code("otpauth://totp/RFC?algorithm=sha512&digits=8&secret=\(Self.sha512)", at: time) == sha512)
    }

    @Test func bareSecretsAndTheKeyURIFormat() {
        // A bare secret: 6 digits, 30 s, SHA1 (the last six of the 8-digit vector), any case,
        // with or without padding, spaces as apps group it.
        #expect(code(Self.sha1, at: 59) == "287082")
        #expect(code(Self.sha1.lowercased(), at: 59) == "287082")
        #expect(code("GEZD GNBV GY3T QOJQ GEZD GNBV GY3T QOJQ", at: 59) == "287082")
        #expect(code("otpauth://totp/Example:alice%40example.com?secret=\(Self.sha1)&issuer=Example", at: 59) == "287082")
        #expect(code("OTPAUTH://TOTP/x?SECRET=\(Self.sha1)&Period=60", at: 59) == code(Self.sha1, at: 0))
        #expect(code("otpauth://totp/x?secret=\(Self.sha256.replacingOccurrences(of: "=", with: "%3D"))&algorithm=SHA256", at: 59)
                == code("otpauth://totp/x?secret=\(Self.sha256)&algorithm=SHA256", at: 59))
        #expect(code("otpauth://totp/x?secret=\(Self.sha1)&digits=7", at: 59)?.count == 7)
    }

    @Test func everythingElseIsRefused() {
        for bad in [
            "", "not base32!", "GEZDGNBV1", "GEZ=DGNBV", "A",                       // bad secrets (1 is not base32)
            "otpauth://hotp/x?secret=\(Self.sha1)&counter=1",                    // HOTP
            "otpauth://totp/x?issuer=Example",                                   // no secret
            "otpauth://totp/x?secret=",                                          // empty secret
            "otpauth://totp/x?secret=\(Self.sha1)&algorithm=MD5",                // unknown algorithm
            "otpauth://totp/x?secret=\(Self.sha1)&digits=5", "otpauth://totp/x?secret=\(Self.sha1)&digits=9",
            "otpauth://totp/x?secret=\(Self.sha1)&digits=six",
            "otpauth://totp/x?secret=\(Self.sha1)&period=0", "otpauth://totp/x?secret=\(Self.sha1)&period=86401",
            "otpauth://totp/x?secret=%ZZ", "otpauth://totp?secret=\(Self.sha1)", "https://example.com/?secret=\(Self.sha1)",
        ] {
            #expect(!valid(bad), "\(bad)")
        }
        #expect(valid("otpauth://totp/x?secret=\(Self.sha1)&period=86400&digits=6&algorithm=SHA512&image=https%3A%2F%2Fx"))
        #expect(Array("".utf8).withUnsafeBytes { AccountFieldSyntax.isValid($0, for: .otp) }, "an empty otp clears it")
    }
}
