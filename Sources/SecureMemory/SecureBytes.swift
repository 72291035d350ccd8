#if canImport(Glibc)
import Glibc
#endif
import CSodium
import Posix
import SecureMemory

/// Bytes that hold secrets: in `sodium_malloc` memory (guard pages, locked against swap
/// with mlock, zeroed when freed), never copied into Swift arrays or strings by this type.
///
/// Allocation can fail — the process's budget of secure memory (`SecureMemory`) is spent,
/// or the system has no mapping left — and then throws `Errno.noMemory` (ENOMEM), which
/// a request answers; it never stops the process.
///
/// `wipe()` zeroes and frees at once (used on lock); deinit does the same.
/// Thread-safety: none; owners serialize access.
public final class SecureBytes: @unchecked Sendable {
    private(set) var pointer: UnsafeMutableRawPointer?
    public private(set) var count: Int
    private var capacity: Int
    /// Set when `pointer` is a slot of an arena (of that generation), not a region of its own.
    private var arena: (owner: SecureArena, generation: Int)?

    /// An empty value holding no memory yet (its first write allocates). Like a wiped
    /// value it holds nothing: `isWiped` is true until then.
    public init() {
        pointer = nil
        count = 0
        capacity = 0
    }

    /// `count` zero bytes (ENOMEM when there is no secure memory to be had).
    public init(count: Int) throws(Errno) {
        let capacity = max(count, 1)
        guard let pointer = SecureMemory.allocate(capacity) else { throw .noMemory }
        self.pointer = pointer
        self.count = count
        self.capacity = capacity
    }

    /// A copy of `bytes` (which the caller must then clear if it was secret).
    public convenience init(copying bytes: UnsafeRawBufferPointer) throws(Errno) {
        try self.init(count: bytes.count)
        if let source = bytes.baseAddress, let pointer { pointer.copyMemory(from: source, byteCount: bytes.count) }
    }

    /// A copy of `bytes` (which the caller must then clear if it was secret).
    public convenience init(copying bytes: [UInt8]) throws(Errno) {
        try self.init(count: bytes.count)
        bytes.withUnsafeBytes { raw in
            if let source = raw.baseAddress, let pointer { pointer.copyMemory(from: source, byteCount: raw.count) }
        }
    }

    /// Copies `bytes` into a slot of `arena` (a region of its own when too large for one).
    public static func allocate(copying bytes: UnsafeRawBufferPointer, in arena: SecureArena) throws(Errno) -> SecureBytes {
        guard let (slot, size, generation) = arena.allocate(max(bytes.count, 1)) else {
            return try SecureBytes(copying: bytes)
        }
        if let source = bytes.baseAddress { slot.copyMemory(from: source, byteCount: bytes.count) }
        let value = SecureBytes(adopting: slot, count: bytes.count, capacity: size)
        value.arena = (arena, generation)
        return value
    }

    /// `count` zero bytes in a slot of `arena` (a region of their own when too many for one).
    public static func allocate(count: Int, in arena: SecureArena) throws(Errno) -> SecureBytes {
        guard let (slot, size, generation) = arena.allocate(max(count, 1)) else { return try SecureBytes(count: count) }
        let value = SecureBytes(adopting: slot, count: count, capacity: size)
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
            SecureMemory.free(pointer, capacity)
        }
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

    public func withUnsafeBytes<T, E: Error>(_ body: (UnsafeRawBufferPointer) throws(E) -> T) throws(E) -> T {
        try body(UnsafeRawBufferPointer(start: pointer, count: pointer == nil ? 0 : count))
    }

    public func withUnsafeMutableBytes<T, E: Error>(_ body: (UnsafeMutableRawBufferPointer) throws(E) -> T) throws(E) -> T {
        try body(UnsafeMutableRawBufferPointer(start: pointer, count: pointer == nil ? 0 : count))
    }

    /// Sets the length, keeping the prefix; new bytes are zero. Growth moves the bytes to a
    /// new secure allocation and frees (zeroes) the old one; when there is none to be had
    /// (ENOMEM) the value is as it was.
    public func resize(to newCount: Int) throws(Errno) {
        guard let current = pointer else {
            let capacity = max(newCount, 1)
            guard let fresh = SecureMemory.allocate(capacity) else { throw .noMemory }
            (pointer, self.capacity, count) = (fresh, capacity, newCount)
            return
        }
        if newCount > capacity {
            // The next power of two (a 16 MiB file ends in a 16 MiB region, not 32), or
            // exactly what is asked when the budget has no room for that.
            var newCapacity = newCount <= 1 ? 1 : 1 << (Int.bitWidth - (newCount - 1).leadingZeroBitCount)
            var grown = SecureMemory.allocate(newCapacity)
            if grown == nil, newCapacity > newCount {
                newCapacity = newCount
                grown = SecureMemory.allocate(newCapacity)
            }
            guard let grown else { throw .noMemory }
            grown.copyMemory(from: current, byteCount: count)
            release()
            pointer = grown
            capacity = newCapacity
        } else if newCount < count {
            sodium_memzero(current + newCount, count - newCount)
        }
        count = newCount
    }

    /// Writes `bytes` at `offset`, growing as needed (a gap is zero-filled); ENOMEM when
    /// growing finds no secure memory (nothing written then).
    public func write(_ bytes: UnsafeRawBufferPointer, at offset: Int) throws(Errno) {
        if offset + bytes.count > count { try resize(to: offset + bytes.count) }
        if let source = bytes.baseAddress, let pointer { (pointer + offset).copyMemory(from: source, byteCount: bytes.count) }
    }

    /// Appends `bytes` (ENOMEM when growing finds no secure memory; nothing written then).
    public func append(_ bytes: UnsafeRawBufferPointer) throws(Errno) {
        try write(bytes, at: count)
    }

    /// Appends `bytes` (ENOMEM when growing finds no secure memory; nothing written then).
    public func append(_ bytes: [UInt8]) throws(Errno) {
        let start = count
        try resize(to: start + bytes.count)
        bytes.withUnsafeBytes { raw in
            if let source = raw.baseAddress, let pointer { (pointer + start).copyMemory(from: source, byteCount: raw.count) }
        }
    }

    /// Zeroes memory that is not ours but held a secret (e.g. libfuse's request buffer).
    public static func zero(_ pointer: UnsafeMutableRawPointer, _ count: Int) {
        sodium_memzero(pointer, count)
    }

    /// Zeroes the stack below the caller's frame (call it on the way out of anything that
    /// handled a secret: copies left by callees are gone with it).
    public static func burnStack() { mtmfs_burn_stack() }

    /// A secure copy.
    public func copy() throws(Errno) -> SecureBytes {
        try withUnsafeBytes { (bytes) throws(Errno) in try SecureBytes(copying: bytes) }
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
public enum Sodium {
    public static let initialized: Bool = sodium_init() >= 0
    public static func initialize() { precondition(initialized, "sodium_init failed") }

    /// A uniformly random number in 0..<upper (libsodium's `randombytes_uniform`: no modulo bias).
    public static func uniform(_ upper: UInt32) -> UInt32 {
        initialize()
        return randombytes_uniform(upper)
    }

    public static func randomBytes(_ count: Int) -> [UInt8] {
        initialize()
        var bytes = [UInt8](repeating: 0, count: count)
        randombytes_buf(&bytes, count)
        return bytes
    }
}
