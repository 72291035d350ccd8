import CCrypto
import CredentialVault

/// The Secret Service's encrypted session, `dh-ietf1024-sha256-aes128-cbc-pkcs7`: a
/// Diffie-Hellman exchange in the 1024-bit MODP group of RFC 2409 (generator 2), the shared
/// secret as 128 big-endian bytes (left-padded with zeros), HKDF-SHA256 (RFC 5869) with no
/// salt and no info to a 16-byte key, and each secret AES-128-CBC with PKCS#7 padding under
/// a fresh 16-byte IV (the secret's parameters).
///
/// From libcrypto: big numbers, AES-CBC and HMAC-SHA256 (libsodium has none of them). The
/// private exponent, the shared secret and the key live in secure memory; the big numbers
/// are cleared when freed.
///
/// Thread-safety: stateless functions; a `SessionKey` is a value used on the bus thread.
enum SessionCrypto {
    static let algorithm = "dh-ietf1024-sha256-aes128-cbc-pkcs7"

    /// RFC 2409 §6.2, the second Oakley group.
    static let prime: [UInt8] = hex("""
        FFFFFFFFFFFFFFFFC90FDAA22168C234C4C6628B80DC1CD129024E088A67CC74020BBEA63B139B22514A08798E3404DD\
        EF9519B3CD3A431B302B0A6DF25F14374FE1356D6D51C245E485B576625E7EC6F44C42E9A637ED6B0BFF5CB6F406B7ED\
        EE386BFB5A899FA5AE9F24117C4B1FE649286651ECE65381FFFFFFFFFFFFFFFF
        """)

    static func hex(_ text: String) -> [UInt8] {
        let digits = Array(text.utf8).filter { !($0 == 10 || $0 == 32) }
        return stride(from: 0, to: digits.count, by: 2).map { i in
            func value(_ c: UInt8) -> UInt8 { c <= 57 ? c - 48 : (c | 0x20) - 87 }
            return value(digits[i]) << 4 | value(digits[i + 1])
        }
    }

    /// The server's side of the exchange for a client's public key: our public key (128
    /// bytes) and the session's AES key; nil for a public key outside 2…p−2.
    static func exchange(clientPublic: [UInt8]) -> (serverPublic: [UInt8], key: SecureBytes)? {
        guard !clientPublic.isEmpty, clientPublic.count <= 128, let context = BN_CTX_new() else { return nil }
        defer { BN_CTX_free(context) }
        let p = BN_bin2bn(prime, Int32(prime.count), nil), y = BN_bin2bn(clientPublic, Int32(clientPublic.count), nil)
        let g = BN_new(), x = BN_secure_new(), ours = BN_new(), shared = BN_secure_new(), pMinus1 = BN_new()
        defer {
            BN_free(p); BN_free(y); BN_free(g); BN_clear_free(x); BN_free(ours); BN_clear_free(shared); BN_free(pMinus1)
        }
        guard let p, let y, let g, let x, let ours, let shared, let pMinus1 else { return nil }
        // 1 < y < p − 1: not 0, 1 or p − 1, whose powers are trivial.
        guard BN_copy(pMinus1, p) != nil, BN_sub_word(pMinus1, 1) == 1,
              BN_cmp(y, BN_value_one()) > 0, BN_cmp(y, pMinus1) < 0 else { return nil }
        // A private exponent of 1024 random bits (in secure memory), then g^x and y^x.
        let secret = SecureBytes(count: 128)
        defer { secret.wipe() }
        guard secret.withUnsafeMutableBytes({ RAND_bytes($0.baseAddress!.assumingMemoryBound(to: UInt8.self), 128) }) == 1,
              secret.withUnsafeBytes({ BN_bin2bn($0.baseAddress!.assumingMemoryBound(to: UInt8.self), 128, x) }) != nil,
              BN_set_word(g, 2) == 1,
              BN_mod_exp(ours, g, x, p, context) == 1, BN_mod_exp(shared, y, x, p, context) == 1 else { return nil }
        var serverPublic = [UInt8](repeating: 0, count: 128)
        let sharedBytes = SecureBytes(count: 128)
        defer { sharedBytes.wipe() }
        guard BN_bn2binpad(ours, &serverPublic, 128) == 128,
              sharedBytes.withUnsafeMutableBytes({ BN_bn2binpad(shared, $0.baseAddress!.assumingMemoryBound(to: UInt8.self), 128) }) == 128
        else { return nil }
        guard let key = sharedBytes.withUnsafeBytes({ hkdf(ikm: $0, salt: [], info: [], length: 16) }) else { return nil }
        return (serverPublic, key)
    }

    /// HKDF-SHA256 (RFC 5869): extract with `salt` (none: 32 zero bytes), expand with `info`.
    static func hkdf(ikm: UnsafeRawBufferPointer, salt: [UInt8], info: [UInt8], length: Int) -> SecureBytes? {
        guard length <= 255 * 32 else { return nil }
        let salt = salt.isEmpty ? [UInt8](repeating: 0, count: 32) : salt
        let prk = SecureBytes(count: 32)
        defer { prk.wipe() }
        var size: UInt32 = 0
        guard prk.withUnsafeMutableBytes({ out in
            HMAC(EVP_sha256(), salt, Int32(salt.count), ikm.baseAddress?.assumingMemoryBound(to: UInt8.self), ikm.count,
                 out.baseAddress!.assumingMemoryBound(to: UInt8.self), &size)
        }) != nil else { return nil }
        let okm = SecureBytes(count: length)
        let block = SecureBytes(count: 32 + info.count + 1)
        defer { block.wipe() }
        var previous = 0, written = 0, counter: UInt8 = 1
        while written < length {
            // T(n) = HMAC(PRK, T(n−1) | info | n)
            let input = block.withUnsafeMutableBytes { buffer -> Int in
                var at = previous
                for byte in info { buffer[at] = byte; at += 1 }
                buffer[at] = counter
                return at + 1
            }
            let ok = prk.withUnsafeBytes { key in
                block.withUnsafeMutableBytes { buffer in
                    HMAC(EVP_sha256(), key.baseAddress, Int32(key.count), buffer.baseAddress!.assumingMemoryBound(to: UInt8.self),
                         input, buffer.baseAddress!.assumingMemoryBound(to: UInt8.self), &size) != nil
                }
            }
            guard ok else { okm.wipe(); return nil }
            let take = min(32, length - written)
            block.withUnsafeBytes { okm.write(UnsafeRawBufferPointer(rebasing: $0[0..<take]), at: written) }
            written += take
            previous = 32
            counter += 1
        }
        return okm
    }

    /// AES-128-CBC with PKCS#7 padding under `key`: (IV, ciphertext).
    static func encrypt(_ plain: SecureBytes, key: SecureBytes) -> (iv: [UInt8], ciphertext: [UInt8])? {
        var iv = [UInt8](repeating: 0, count: 16)
        guard RAND_bytes(&iv, 16) == 1, let context = EVP_CIPHER_CTX_new() else { return nil }
        defer { EVP_CIPHER_CTX_free(context) }
        var out = [UInt8](repeating: 0, count: plain.count + 16)
        var first: Int32 = 0, last: Int32 = 0
        let ok = key.withUnsafeBytes { k in
            plain.withUnsafeBytes { p in
                EVP_EncryptInit_ex(context, EVP_aes_128_cbc(), nil, k.baseAddress!.assumingMemoryBound(to: UInt8.self), iv) == 1
                    && (p.count == 0 || EVP_EncryptUpdate(context, &out, &first, p.baseAddress!.assumingMemoryBound(to: UInt8.self),
                                                          Int32(p.count)) == 1)
                    && out.withUnsafeMutableBufferPointer { EVP_EncryptFinal_ex(context, $0.baseAddress! + Int(first), &last) } == 1
            }
        }
        guard ok else { return nil }
        return (iv, Array(out[0..<Int(first + last)]))
    }

    /// The plaintext of a secret sent in such a session, into secure memory; nil for an IV
    /// that is not 16 bytes, a length that is no multiple of the block, or bad padding.
    static func decrypt(_ ciphertext: UnsafeRawBufferPointer, iv: [UInt8], key: SecureBytes) -> SecureBytes? {
        guard iv.count == 16, ciphertext.count > 0, ciphertext.count % 16 == 0, let context = EVP_CIPHER_CTX_new() else { return nil }
        defer { EVP_CIPHER_CTX_free(context) }
        let out = SecureBytes(count: ciphertext.count + 16)
        var first: Int32 = 0, last: Int32 = 0
        let ok = key.withUnsafeBytes { k in
            out.withUnsafeMutableBytes { o in
                let base = o.baseAddress!.assumingMemoryBound(to: UInt8.self)
                return EVP_DecryptInit_ex(context, EVP_aes_128_cbc(), nil, k.baseAddress!.assumingMemoryBound(to: UInt8.self), iv) == 1
                    && EVP_DecryptUpdate(context, base, &first, ciphertext.baseAddress!.assumingMemoryBound(to: UInt8.self),
                                         Int32(ciphertext.count)) == 1
                    && EVP_DecryptFinal_ex(context, base + Int(first), &last) == 1
            }
        }
        guard ok else { out.wipe(); return nil }
        out.resize(to: Int(first + last))
        return out
    }
}
