/// The value of one hexadecimal digit in ASCII (either case).
///
/// Thread-safety: a pure function.
public enum ASCIIHex {
    public static func value(_ c: UInt8) -> UInt8? {
        switch c {
        case 0x30...0x39: c - 0x30
        case 0x41...0x46: c - 0x41 + 10
        case 0x61...0x66: c - 0x61 + 10
        default: nil
        }
    }
}
