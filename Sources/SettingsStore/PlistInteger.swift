/// A property-list integer: any value from −2^63 to 2^64−1, the range Core Foundation reads
/// and writes (values above `Int64.max` are the unsigned 64-bit ones Cocoa stores, such as
/// macOS's `9223372036854775808` in Notification Center's preferences).
///
/// It remembers the width a binary plist stored it in (`width`): 1, 2, 4 or 8 bytes, or
/// the 16-byte object Core Foundation writes for values of 2^63 and more. The writer uses
/// it again while the value still fits, so a changed file keeps each integer's width. The
/// width is a hint for the writer only: equality and hashing look at the value alone, and a
/// value parsed from text has none (it gets the smallest width when written).
///
/// ```swift
/// let big: PlistValue = .integer(18446744073709551615)   // any literal in range
/// let count: PlistValue = .integer(PlistInteger(someInt64))
/// ```
///
/// Thread-safety: a value; `Sendable`.
public struct PlistInteger: Hashable, Sendable, CustomStringConvertible, ExpressibleByIntegerLiteral {
    /// The sizes a binary plist stores an integer in. 1, 2 and 4 bytes are unsigned, 8
    /// bytes signed, 16 bytes signed (Core Foundation writes 16 for 2^63…2^64−1 only).
    ///
    /// Thread-safety: a value; `Sendable`.
    public enum Width: Int, Sendable, CaseIterable {
        case one = 1, two = 2, four = 4, eight = 8, sixteen = 16
    }

    /// True for values below zero; `magnitude` is then 1…2^63.
    public let isNegative: Bool
    /// The absolute value.
    public let magnitude: UInt64
    /// The width the binary file held it in, if it came from one (ignored by `==`).
    public var width: Width?

    public init(_ value: Int64) {
        isNegative = value < 0
        magnitude = value.magnitude
    }

    public init(_ value: UInt64) {
        isNegative = false
        magnitude = value
    }

    /// A value of `magnitude` with a sign; nil outside −2^63…2^64−1 (−0 is 0).
    public init?(isNegative: Bool, magnitude: UInt64) {
        if isNegative && magnitude > UInt64(Int64.max) + 1 { return nil }
        self.isNegative = isNegative && magnitude != 0
        self.magnitude = magnitude
    }

    /// Any integer literal from −2^63 to 2^64−1 (a literal outside it stops the program).
    public init(integerLiteral literal: StaticBigInt) {
        let negative = literal.signum() < 0
        precondition(literal.bitWidth <= (negative ? 64 : 65), "a plist integer is −2^63…2^64−1")
        let word = UInt64(literal[0])
        // (Within −2^63 by the bit width checked above: no magnitude here needs the failable init.)
        magnitude = negative ? word.twosComplementNegated : word
        isNegative = negative && magnitude != 0
    }

    /// The value as an `Int64`, or nil above `Int64.max`.
    public var int64: Int64? {
        if isNegative { return magnitude == UInt64(Int64.max) + 1 ? .min : -Int64(magnitude) }
        return magnitude <= UInt64(Int64.max) ? Int64(magnitude) : nil
    }

    /// The value as a `UInt64`, or nil below zero.
    public var uint64: UInt64? { isNegative ? nil : magnitude }

    /// The low 64 bits of the two's-complement value (what the 8-byte object holds).
    var bitPattern: UInt64 { isNegative ? magnitude.twosComplementNegated : magnitude }

    /// Decimal, as SPEC §4 shows it.
    public var description: String { isNegative ? "-" + String(magnitude) : String(magnitude) }

    /// Whether a binary plist can hold the value in `width` bytes.
    public func fits(_ width: Width) -> Bool {
        switch width {
        case .one: !isNegative && magnitude <= UInt64(UInt8.max)
        case .two: !isNegative && magnitude <= UInt64(UInt16.max)
        case .four: !isNegative && magnitude <= UInt64(UInt32.max)
        case .eight: int64 != nil
        case .sixteen: true
        }
    }

    /// What Core Foundation writes: the smallest unsigned width for small values, 8 bytes
    /// for negative ones and up to `Int64.max`, the 16-byte object above.
    public var smallestWidth: Width { Width.allCases.first(where: fits) ?? .sixteen }

    /// The width a writer uses: the remembered one while the value fits it, else the smallest.
    public var writtenWidth: Width {
        if let width, fits(width) { return width }
        return smallestWidth
    }

    /// This value with `width` remembered.
    public func with(width: Width?) -> PlistInteger {
        var copy = self
        copy.width = width
        return copy
    }

    public static func == (a: PlistInteger, b: PlistInteger) -> Bool {
        a.isNegative == b.isNegative && a.magnitude == b.magnitude
    }

    public func hash(into hasher: inout Hasher) {
        hasher.combine(isNegative)
        hasher.combine(magnitude)
    }
}

extension UInt64 {
    /// 0 − self modulo 2^64.
    var twosComplementNegated: UInt64 { (~self) &+ 1 }
}
