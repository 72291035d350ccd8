import CredentialVault
import Posix
import SecureMemory

/// The bytes of a file being edited: a key's pending value or an editor's scratch file.
/// The editing engine is generic over it, so that settings keep plain arrays and account
/// fields never leave secure memory.
///
/// Ownership: the engine treats every buffer as uniquely owned (a class-backed buffer is
/// never shared between two files) and calls `wipe()` before it lets one go.
/// Thread-safety: none of its own; used under the owning tree's lock.
/// Growing a buffer can fail (secure memory has a budget): ENOMEM, and the buffer is as it was.
protocol EditBuffer {
    /// An empty buffer (it holds no memory yet).
    init()
    /// A buffer holding a copy of `bytes`.
    init(copying bytes: UnsafeRawBufferPointer) throws(Errno)
    var count: Int { get }
    /// Sets the length, keeping the prefix; new bytes are zero.
    mutating func resize(to newCount: Int) throws(Errno)
    /// Writes `bytes` at `offset`, growing as needed (a gap is zero-filled).
    mutating func write(_ bytes: UnsafeRawBufferPointer, at offset: Int) throws(Errno)
    func withUnsafeBytes<T, E: Error>(_ body: (UnsafeRawBufferPointer) throws(E) -> T) throws(E) -> T
    /// Zeroes and frees the bytes; the buffer is empty afterwards.
    mutating func wipe()
}

extension EditBuffer {
    /// A copy of the bytes (same kind of memory).
    func copied() throws(Errno) -> Self { try withUnsafeBytes { (bytes) throws(Errno) in try Self(copying: bytes) } }

    /// Whether the buffer holds exactly `byte` (an empty value reads as its newline).
    func isSingle(_ byte: UInt8) -> Bool { count == 1 && withUnsafeBytes { $0[0] == byte } }
}

/// Plain memory, for values that are not secret (settings keys).
///
/// Thread-safety: a value; `Sendable`.
struct PlainBuffer: EditBuffer, Sendable {
    var bytes: [UInt8] = []

    init() {}
    init(copying bytes: UnsafeRawBufferPointer) { self.bytes = Array(bytes) }
    init(_ bytes: [UInt8]) { self.bytes = bytes }

    var count: Int { bytes.count }

    mutating func resize(to newCount: Int) {
        if newCount < bytes.count {
            bytes.removeSubrange(newCount...)
        } else {
            bytes += [UInt8](repeating: 0, count: newCount - bytes.count)
        }
    }

    mutating func write(_ data: UnsafeRawBufferPointer, at offset: Int) {
        if offset + data.count > bytes.count { resize(to: offset + data.count) }
        bytes.replaceSubrange(offset..<offset + data.count, with: data)
    }

    func withUnsafeBytes<T, E: Error>(_ body: (UnsafeRawBufferPointer) throws(E) -> T) throws(E) -> T {
        try bytes.withUnsafeBytes { raw in Result { () throws(E) -> T in try body(raw) } }.get()
    }

    mutating func wipe() { bytes = [] }
}

/// Secure memory (`sodium_malloc`: locked, guarded, zeroed when freed), for account fields.
extension SecureBytes: EditBuffer {}
