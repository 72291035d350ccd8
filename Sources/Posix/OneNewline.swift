/// The one rule for text in mtmfs, written once: a value is its bytes without one trailing
/// `\n` or `\r\n` (what `echo`, editors and `read` leave), and reads back with one `\n`.
/// Settings keys, account fields, a passphrase written to `.mtmfs/unlock` or typed at a
/// prompt all follow it.
///
/// Thread-safety: pure functions.
public enum OneNewline {
    /// Where the value of `bytes` ends: before one trailing `\n` or `\r\n`, if any.
    public static func valueEnd<C: BidirectionalCollection>(_ bytes: C) -> C.Index where C.Element == UInt8 {
        var end = bytes.endIndex
        guard end > bytes.startIndex, bytes[bytes.index(before: end)] == 0x0A else { return end }
        end = bytes.index(before: end)
        if end > bytes.startIndex, bytes[bytes.index(before: end)] == 0x0D { end = bytes.index(before: end) }
        return end
    }

    /// The value of `bytes` (without one trailing `\n` or `\r\n`).
    public static func value(_ bytes: UnsafeRawBufferPointer) -> UnsafeRawBufferPointer {
        UnsafeRawBufferPointer(rebasing: bytes[..<valueEnd(bytes)])
    }

    /// The value of `bytes` (without one trailing `\n` or `\r\n`).
    public static func value(_ bytes: [UInt8]) -> ArraySlice<UInt8> { bytes[..<valueEnd(bytes)] }
}
