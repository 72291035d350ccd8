import CCrypto
import Posix
import CredentialVault
import SecureMemory
@testable import SecretService
import Testing

/// The encrypted session's pieces against their standards: HKDF-SHA256 against RFC 5869's
/// vectors, AES-128-CBC with PKCS#7 both ways and its refusals, and the exchange as a
/// client computes it (the client side here is libcrypto's big numbers, as secretstorage's
/// is Python's integers).
@Suite struct SessionCryptoTests {
    func hex(_ bytes: SecureBytes) -> String { bytes.withUnsafeBytes { ProgramDigest.hex(Array($0)) } }
    func secure(_ bytes: [UInt8]) -> SecureBytes { bytes.withUnsafeBytes { try! SecureBytes(copying: $0) } }
    static func hex(_ text: String) -> [UInt8] { ASCIIHex.bytes(text.filter { !$0.isWhitespace }) ?? [] }
    /// RFC 2409 §6.2, the second Oakley group, typed from the RFC: the server takes libcrypto's.
    static let prime: [UInt8] = hex("""
        FFFFFFFFFFFFFFFFC90FDAA22168C234C4C6628B80DC1CD129024E088A67CC74020BBEA63B139B22514A08798E3404DD
        EF9519B3CD3A431B302B0A6DF25F14374FE1356D6D51C245E485B576625E7EC6F44C42E9A637ED6B0BFF5CB6F406B7ED
        EE386BFB5A899FA5AE9F24117C4B1FE649286651ECE65381FFFFFFFFFFFFFFFF
        """)

    /// RFC 5869 A.1 (with salt and info) and A.3 (neither).
    @Test func hkdfMatchesRFC5869() throws {
        let ikm = [UInt8](repeating: 0x0b, count: 22)
        let one = try #require(ikm.withUnsafeBytes {
            SessionCrypto.hkdf(ikm: $0, salt: Self.hex("000102030405060708090a0b0c"),
                               info: Self.hex("f0f1f2f3f4f5f6f7f8f9"), length: 42)
        })
        #expect(hex(one) == "3cb25f25faacd57a90434f64d0362f2a2d2d0a90cf1a5a4c5db02d56ecc4c5bf34007208d5b887185865")
        let three = try #require(ikm.withUnsafeBytes { SessionCrypto.hkdf(ikm: $0, salt: [], info: [], length: 42) })
        #expect(hex(three) == "8da4e775a563c18f715f802a063c5a31b8a11f5c5ee1879ec3454e5f3c738d2d9d201395faa4b61a96c8")
    }

    @Test func aesCBCRoundTripsAndRefusesWhatIsWrong() throws {
        let key = secure((0..<16).map { UInt8($0) })
        for length in [0, 1, 15, 16, 17, 1000] {
            let plain = secure((0..<length).map { UInt8($0 & 0xff) })
            let (iv, ciphertext) = try #require(SessionCrypto.encrypt(plain, key: key))
            #expect(iv.count == 16 && ciphertext.count == (length / 16 + 1) * 16, "PKCS#7 always pads: \(length)")
            let back = try #require(ciphertext.withUnsafeBytes { SessionCrypto.decrypt($0, iv: iv, key: key) })
            #expect(hex(back) == hex(plain))
            // A wrong IV changes the first block only: with one block, the padding breaks.
            if length < 15 {
                var wrong = iv
                wrong[15] ^= 0x01
                #expect(ciphertext.withUnsafeBytes { SessionCrypto.decrypt($0, iv: wrong, key: key) } == nil, "wrong IV: \(length)")
            }
            #expect(ciphertext.withUnsafeBytes { SessionCrypto.decrypt($0, iv: Array(iv.prefix(8)), key: key) } == nil)
            #expect(ciphertext.dropLast().withUnsafeBytes { SessionCrypto.decrypt($0, iv: iv, key: key) } == nil)
        }
    }

    @Test func theClientComputesTheSameKey() throws {
        let context = try #require(BN_CTX_new())
        defer { BN_CTX_free(context) }
        let p = BN_bin2bn(Self.prime, 128, nil), g = BN_new(), x = BN_new(), y = BN_new(), shared = BN_new(), server = BN_new()
        defer { [p, g, x, y, shared, server].forEach { BN_free($0) } }
        BN_set_word(g, 2)
        BN_rand(x, 1024, -1, 0)
        BN_mod_exp(y, g, x, p, context)
        var clientPublic = [UInt8](repeating: 0, count: 128)
        BN_bn2binpad(y, &clientPublic, 128)
        let (serverPublic, key) = try #require(SessionCrypto.exchange(clientPublic: clientPublic))
        #expect(serverPublic.count == 128)
        BN_bin2bn(serverPublic, 128, server)
        BN_mod_exp(shared, server, x, p, context)
        var sharedBytes = [UInt8](repeating: 0, count: 128)
        BN_bn2binpad(shared, &sharedBytes, 128)
        let clientKey = try #require(sharedBytes.withUnsafeBytes { SessionCrypto.hkdf(ikm: $0, salt: [], info: [], length: 16) })
        #expect(hex(clientKey) == hex(key))
        // Public keys with trivial powers, or too long, are refused.
        #expect(SessionCrypto.exchange(clientPublic: [1]) == nil)
        #expect(SessionCrypto.exchange(clientPublic: [0]) == nil)
        var pMinus1 = Self.prime
        pMinus1[127] -= 1
        #expect(SessionCrypto.exchange(clientPublic: pMinus1) == nil)
        #expect(SessionCrypto.exchange(clientPublic: Self.prime) == nil)
        #expect(SessionCrypto.exchange(clientPublic: [UInt8](repeating: 1, count: 129)) == nil)
    }
}
