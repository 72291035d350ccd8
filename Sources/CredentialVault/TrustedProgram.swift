#if canImport(Glibc)
import Glibc
#endif
import CSodium
import Posix
import SecureMemory

/// A program an account trusts (SPEC §3a): the SHA-256 of its executable's content, and
/// the path it was seen at (shown to people; the hash is what is compared).
///
/// Thread-safety: a value; `Sendable`.
public struct TrustedProgram: Hashable, Sendable {
    public var sha256: [UInt8]
    public var path: String

    public init(sha256: [UInt8], path: String) {
        self.sha256 = sha256
        self.path = path
    }

    public var hexDigest: String { ProgramDigest.hex(sha256) }
}

/// SHA-256 of a program's content (`crypto_hash_sha256`), read through a descriptor.
///
/// Thread-safety: stateless.
public enum ProgramDigest {
    /// The digest of everything `fd` reads from offset 0 (it need not be seekable from its
    /// current offset: pread is used).
    public static func sha256(of fd: Int32) throws(Errno) -> [UInt8] {
        Sodium.initialize()
        var state = crypto_hash_sha256_state()
        crypto_hash_sha256_init(&state)
        var buffer = [UInt8](repeating: 0, count: 1 << 16)
        var offset: off_t = 0
        while true {
            let n = buffer.withUnsafeMutableBytes { pread(fd, $0.baseAddress, $0.count, offset) }
            if n < 0 {
                if errno == EINTR { continue }
                throw Errno(errno)
            }
            if n == 0 { break }
            crypto_hash_sha256_update(&state, buffer, UInt64(n))
            offset += off_t(n)
        }
        var out = [UInt8](repeating: 0, count: Int(crypto_hash_sha256_BYTES))
        crypto_hash_sha256_final(&state, &out)
        return out
    }

    /// The digest of `bytes`.
    public static func sha256(_ bytes: [UInt8]) -> [UInt8] {
        Sodium.initialize()
        var out = [UInt8](repeating: 0, count: Int(crypto_hash_sha256_BYTES))
        crypto_hash_sha256(&out, bytes, UInt64(bytes.count))
        return out
    }

    public static func hex(_ bytes: [UInt8]) -> String { ASCIIHex.string(bytes) }
}
