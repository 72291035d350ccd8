import CCrypto
import SecureMemory

/// The Secret Service's encrypted session, `dh-ietf1024-sha256-aes128-cbc-pkcs7`: a
/// Diffie-Hellman exchange in the 1024-bit MODP group of RFC 2409 (generator 2), the shared
/// secret as 128 big-endian bytes (left-padded with zeros), HKDF-SHA256 (RFC 5869) with no
/// salt and no info to a 16-byte key, and each secret AES-128-CBC with PKCS#7 padding under
/// a fresh 16-byte IV (the secret's parameters).
///
/// From libcrypto: the group's prime, big numbers, HKDF and AES-CBC (libsodium has none of them). The
/// private exponent, the shared secret and the key live in secure memory; the big numbers
/// are cleared when freed.
///
/// Thread-safety: stateless functions; a `SessionKey` is a value used on the bus thread.
enum SessionCrypto {
    static let algorithm = "dh-ietf1024-sha256-aes128-cbc-pkcs7"

    /// The server's side of the exchange for a client's public key: our public key (128
    /// bytes) and the session's AES key; nil for a public key outside 2…p−2, or when there
    /// is no secure memory for the secrets.
    static func exchange(clientPublic: [UInt8]) -> (serverPublic: [UInt8], key: SecureBytes)? {
        guard !clientPublic.isEmpty, clientPublic.count <= 128, let context = BN_CTX_new() else { return nil }
        defer { BN_CTX_free(context) }
        // RFC 2409 §6.2, the second Oakley group, as libcrypto has it.
        let p = BN_get_rfc2409_prime_1024(nil), y = BN_bin2bn(clientPublic, Int32(clientPublic.count), nil)
        let g = BN_new(), x = BN_secure_new(), ours = BN_new(), shared = BN_secure_new(), pMinus1 = BN_new()
        defer {
            BN_free(p); BN_free(y); BN_free(g); BN_clear_free(x); BN_free(ours); BN_clear_free(shared); BN_free(pMinus1)
        }
        guard let p, let y, let g, let x, let ours, let shared, let pMinus1 else { return nil }
        // 1 < y < p − 1: not 0, 1 or p − 1, whose powers are trivial.
        guard BN_copy(pMinus1, p) != nil, BN_sub_word(pMinus1, 1) == 1,
              BN_cmp(y, BN_value_one()) > 0, BN_cmp(y, pMinus1) < 0 else { return nil }
        // A private exponent of 1024 random bits (in secure memory), then g^x and y^x.
        guard let secret = try? SecureBytes(count: 128), let sharedBytes = try? SecureBytes(count: 128) else { return nil }
        defer { secret.wipe(); sharedBytes.wipe() }
        guard secret.withUnsafeMutableBytes({ RAND_bytes($0.baseAddress?.assumingMemoryBound(to: UInt8.self), 128) }) == 1,
              secret.withUnsafeBytes({ BN_bin2bn($0.baseAddress?.assumingMemoryBound(to: UInt8.self), 128, x) }) != nil,
              BN_set_word(g, 2) == 1,
              BN_mod_exp(ours, g, x, p, context) == 1, BN_mod_exp(shared, y, x, p, context) == 1 else { return nil }
        var serverPublic = [UInt8](repeating: 0, count: 128)
        guard BN_bn2binpad(ours, &serverPublic, 128) == 128,
              sharedBytes.withUnsafeMutableBytes({ BN_bn2binpad(shared, $0.baseAddress?.assumingMemoryBound(to: UInt8.self), 128) }) == 128
        else { return nil }
        guard let key = sharedBytes.withUnsafeBytes({ hkdf(ikm: $0, salt: [], info: [], length: 16) }) else { return nil }
        return (serverPublic, key)
    }

    /// HKDF-SHA256 (RFC 5869), libcrypto's: extract with `salt` (none: zeros), expand with
    /// `info`, into secure memory; nil when libcrypto refuses or secure memory ran out.
    static func hkdf(ikm: UnsafeRawBufferPointer, salt: [UInt8], info: [UInt8], length: Int) -> SecureBytes? {
        guard length > 0, length <= 255 * 32, let context = EVP_PKEY_CTX_new_id(EVP_PKEY_HKDF, nil) else { return nil }
        defer { EVP_PKEY_CTX_free(context) }
        guard let okm = try? SecureBytes(count: length) else { return nil }
        var size = length
        let ok = EVP_PKEY_derive_init(context) == 1
            && EVP_PKEY_CTX_set_hkdf_md(context, EVP_sha256()) == 1
            && (salt.isEmpty || EVP_PKEY_CTX_set1_hkdf_salt(context, salt, Int32(salt.count)) == 1)
            && EVP_PKEY_CTX_set1_hkdf_key(context, ikm.baseAddress?.assumingMemoryBound(to: UInt8.self), Int32(ikm.count)) == 1
            && (info.isEmpty || EVP_PKEY_CTX_add1_hkdf_info(context, info, Int32(info.count)) == 1)
            && okm.withUnsafeMutableBytes({ EVP_PKEY_derive(context, $0.baseAddress?.assumingMemoryBound(to: UInt8.self), &size) }) == 1
            && size == length
        guard ok else { okm.wipe(); return nil }
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
        guard let out = try? SecureBytes(count: ciphertext.count + 16) else { return nil }
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
        try? out.resize(to: Int(first + last))  // a shrink: never allocates
        return out
    }
}
