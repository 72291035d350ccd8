#if canImport(Glibc)
import Glibc
#endif
import CSodium
import Posix

/// Bytes that hold secrets: in `sodium_malloc` memory (guard pages, locked against swap
/// with mlock, zeroed when freed), never copied into Swift arrays or strings by this type.
///
/// `wipe()` zeroes and frees at once (used on lock); deinit does the same.
/// Thread-safety: none; owners serialize access.
public final class SecureBytes: @unchecked Sendable {
    private(set) var pointer: UnsafeMutableRawPointer?
    public private(set) var count: Int
    private var capacity: Int
    /// Set when `pointer` is a slot of an arena (of that generation), not a region of its own.
    private var arena: (owner: SecureArena, generation: Int)?

    public init(count: Int = 0) {
        Sodium.initialize()
        self.count = count
        self.capacity = max(count, 1)
        pointer = sodium_malloc(capacity)
        precondition(pointer != nil, "sodium_malloc failed")
        sodium_memzero(pointer, capacity)
    }

    /// Copies `bytes` into a new secure allocation, or nil when there is none to be had
    /// (each allocation is a few memory mappings; `vm.max_map_count` bounds how many live).
    public static func allocate(copying bytes: UnsafeRawBufferPointer) -> SecureBytes? {
        Sodium.initialize()
        let capacity = max(bytes.count, 1)
        guard let pointer = sodium_malloc(capacity) else { return nil }
        sodium_memzero(pointer, capacity)
        if bytes.count > 0 { pointer.copyMemory(from: bytes.baseAddress!, byteCount: bytes.count) }
        return SecureBytes(adopting: pointer, count: bytes.count, capacity: capacity)
    }

    /// Copies `bytes` into a slot of `arena` (a region of its own when too large for one);
    /// nil when there is no secure memory to be had.
    public static func allocate(copying bytes: UnsafeRawBufferPointer, in arena: SecureArena) -> SecureBytes? {
        guard let (slot, size, generation) = arena.allocate(max(bytes.count, 1)) else { return allocate(copying: bytes) }
        if bytes.count > 0 { slot.copyMemory(from: bytes.baseAddress!, byteCount: bytes.count) }
        let value = SecureBytes(adopting: slot, count: bytes.count, capacity: size)
        value.arena = (arena, generation)
        return value
    }

    private init(adopting pointer: UnsafeMutableRawPointer, count: Int, capacity: Int) {
        self.pointer = pointer
        self.count = count
        self.capacity = capacity
    }

    /// Gives the memory back: to the arena, or to libsodium (which zeroes it).
    private func release() {
        guard let pointer else { return }
        if let arena {
            arena.owner.release(pointer, size: capacity, generation: arena.generation)
            self.arena = nil
        } else {
            sodium_free(pointer)
        }
    }

    /// Copies `bytes` (which the caller must then clear if it was secret).
    public convenience init(copying bytes: UnsafeRawBufferPointer) {
        self.init(count: bytes.count)
        if bytes.count > 0 { pointer!.copyMemory(from: bytes.baseAddress!, byteCount: bytes.count) }
    }

    deinit { wipe() }

    /// Zeroes and frees the memory; the value is empty afterwards.
    public func wipe() {
        release()  // zeroed either way
        pointer = nil
        count = 0
        capacity = 0
    }

    public var isWiped: Bool { pointer == nil }

    public func withUnsafeBytes<T>(_ body: (UnsafeRawBufferPointer) throws -> T) rethrows -> T {
        try body(UnsafeRawBufferPointer(start: pointer, count: pointer == nil ? 0 : count))
    }

    public func withUnsafeMutableBytes<T>(_ body: (UnsafeMutableRawBufferPointer) throws -> T) rethrows -> T {
        try body(UnsafeMutableRawBufferPointer(start: pointer, count: pointer == nil ? 0 : count))
    }

    /// Sets the length, keeping the prefix; new bytes are zero. Growth moves the bytes to a
    /// new secure allocation and frees (zeroes) the old one.
    public func resize(to newCount: Int) {
        if pointer == nil {
            pointer = sodium_malloc(max(newCount, 1))
            capacity = max(newCount, 1)
            sodium_memzero(pointer, capacity)
        } else if newCount > capacity {
            let newCapacity = max(newCount, capacity * 2)
            let grown = sodium_malloc(newCapacity)!
            sodium_memzero(grown, newCapacity)
            grown.copyMemory(from: pointer!, byteCount: count)
            release()
            pointer = grown
            capacity = newCapacity
        } else if newCount < count {
            sodium_memzero(pointer! + newCount, count - newCount)
        }
        count = newCount
    }

    /// Writes `bytes` at `offset`, growing as needed (a gap is zero-filled).
    public func write(_ bytes: UnsafeRawBufferPointer, at offset: Int) {
        if offset + bytes.count > count { resize(to: offset + bytes.count) }
        if bytes.count > 0 { (pointer! + offset).copyMemory(from: bytes.baseAddress!, byteCount: bytes.count) }
    }

    /// Zeroes memory that is not ours but held a secret (e.g. libfuse's request buffer).
    public static func zero(_ pointer: UnsafeMutableRawPointer, _ count: Int) {
        sodium_memzero(pointer, count)
    }

    /// Zeroes the stack below the caller's frame (call it on the way out of anything that
    /// handled a secret: copies left by callees are gone with it).
    public static func burnStack() { mtmfs_burn_stack() }

    /// A secure copy.
    public func copy() -> SecureBytes {
        withUnsafeBytes { SecureBytes(copying: $0) }
    }

    /// Constant-time comparison.
    public func equals(_ other: SecureBytes) -> Bool {
        guard count == other.count else { return false }
        if count == 0 { return true }
        return sodium_memcmp(pointer, other.pointer, count) == 0
    }
}

/// libsodium set-up, once per process.
///
/// Thread-safety: `initialized` is a lazily set static (Swift runs its initializer once);
/// `sodium_init` and `randombytes_buf` are thread-safe.
enum Sodium {
    static let initialized: Bool = sodium_init() >= 0
    static func initialize() { precondition(initialized, "sodium_init failed") }

    static func randomBytes(_ count: Int) -> [UInt8] {
        initialize()
        var bytes = [UInt8](repeating: 0, count: count)
        randombytes_buf(&bytes, count)
        return bytes
    }
}

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

    public static func hex(_ bytes: [UInt8]) -> String {
        let digits = Array("0123456789abcdef".utf8)
        var out: [UInt8] = []
        out.reserveCapacity(bytes.count * 2)
        for byte in bytes { out += [digits[Int(byte >> 4)], digits[Int(byte & 15)]] }
        return String(decoding: out, as: UTF8.self)
    }
}
