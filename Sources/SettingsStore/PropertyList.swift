/// One property-list value, with dictionaries kept in file order.
///
/// Booleans and integers are distinct cases (Foundation's NSNumber blurs them); integers
/// cover −2^63…2^64−1 and remember their binary width (`PlistInteger`); dates keep their
/// sub-second part as seconds since 2001-01-01 UTC, as the binary format stores them.
///
/// Thread-safety: a value; `Sendable`.
public indirect enum PlistValue: Equatable, Sendable {
    case bool(Bool)
    case integer(PlistInteger)
    case real(Double)
    case string(String)
    /// Seconds since 2001-01-01T00:00:00Z (the Core Foundation reference date).
    case date(Double)
    case data([UInt8])
    case array([PlistValue])
    case dictionary(PlistDictionary)

    public var type: PlistType {
        switch self {
        case .bool: .bool
        case .integer: .integer
        case .real: .real
        case .string: .string
        case .date: .date
        case .data: .data
        case .array: .array
        case .dictionary: .dictionary
        }
    }

    /// True for dictionaries and arrays (shown as directories).
    public var isContainer: Bool { type == .array || type == .dictionary }

    /// This value, each integer without a remembered width taking the width of the integer
    /// at the same place (key or index) in `old` when it fits: a changed key is written
    /// back as wide as it was read (`PlistInteger.writtenWidth`).
    func keepingIntegerWidths(of old: PlistValue) -> PlistValue {
        switch (self, old) {
        case (.integer(let new), .integer(let previous)) where new.width == nil && previous.width != nil:
            return .integer(new.with(width: previous.width))
        case (.array(let items), .array(let previous)):
            return .array(items.enumerated().map { index, item in
                index < previous.count ? item.keepingIntegerWidths(of: previous[index]) : item
            })
        case (.dictionary(let dictionary), .dictionary(let previous)):
            var kept = dictionary
            for (key, value) in dictionary.entries {
                if let before = previous[key] { kept[key] = value.keepingIntegerWidths(of: before) }
            }
            return .dictionary(kept)
        default:
            return self
        }
    }
}

/// The type names shown in the `user.plist.type` extended attribute.
///
/// Thread-safety: a value; `Sendable`.
public enum PlistType: String, CaseIterable, Sendable {
    case bool, integer, real, string, date, data, array
    case dictionary = "dict"
}

/// A dictionary that keeps its keys in the order they were read or added.
///
/// Thread-safety: a value; `Sendable`.
public struct PlistDictionary: Equatable, Sendable {
    public private(set) var entries: [(key: String, value: PlistValue)] = []
    /// Position of each key in `entries` (kept in step with it).
    private var positions: [String: Int] = [:]

    public init() {}

    public init(_ entries: [(String, PlistValue)]) {
        for (key, value) in entries { self[key] = value }
    }

    public var keys: [String] { entries.map(\.key) }
    public var count: Int { entries.count }

    public func index(of key: String) -> Int? { positions[key] }

    /// Setting an existing key keeps its position; a new key goes at the end; nil removes.
    public subscript(key: String) -> PlistValue? {
        get { positions[key].map { entries[$0].value } }
        set {
            if let position = positions[key] {
                if let newValue {
                    entries[position].value = newValue
                } else {
                    entries.remove(at: position)
                    positions[key] = nil
                    reindex(from: position)
                }
            } else if let newValue {
                positions[key] = entries.count
                entries.append((key, newValue))
            }
        }
    }

    /// Inserts (or moves) `key` at `position` (clamped to the end).
    public mutating func insert(_ value: PlistValue, forKey key: String, at position: Int) {
        if let existing = positions[key] {
            entries.remove(at: existing)
            positions[key] = nil
            reindex(from: existing)
        }
        let at = min(max(0, position), entries.count)
        entries.insert((key, value), at: at)
        reindex(from: at)
    }

    private mutating func reindex(from start: Int) {
        for index in start..<entries.count { positions[entries[index].key] = index }
    }

    public static func == (a: PlistDictionary, b: PlistDictionary) -> Bool {
        a.entries.count == b.entries.count
            && zip(a.entries, b.entries).allSatisfy { $0.key == $1.key && $0.value == $1.value }
    }
}

/// The two on-disk encodings; a file is rewritten in the one it was found in.
///
/// Thread-safety: a value; `Sendable`.
public enum PlistFormat: Sendable, Equatable {
    case xml
    case binary
}

/// Why bytes are not a property list.
///
/// Thread-safety: a value; `Sendable`.
public struct PlistError: Error, CustomStringConvertible, Sendable {
    public var description: String
    public init(_ description: String) { self.description = description }
}

/// Reading and writing property lists in either encoding.
///
/// Thread-safety: pure functions.
public enum PropertyList {
    /// Deepest nesting accepted when reading (a deeper file is refused, not a stack overflow).
    public static let maximumDepth = 512

    /// Decodes XML or binary (`bplist00`) bytes.
    public static func decode(_ bytes: [UInt8]) throws(PlistError) -> (PlistValue, PlistFormat) {
        if bytes.starts(with: Array("bplist00".utf8)) {
            return (try BinaryPropertyList.decode(bytes), .binary)
        }
        if bytes.starts(with: Array("bplist".utf8)) {
            let version = String(decoding: bytes.prefix(8), as: UTF8.self).debugDescription
            throw PlistError("a binary plist of version \(version): only bplist00, the property-list format, is read")
        }
        // XML starts with `<` (after a byte-order mark and space); OpenStep text with `{`,
        // `(`, `"` or a word. Its form is not read (SPEC §4): say so rather than "bad XML".
        let start = bytes.starts(with: [0xEF, 0xBB, 0xBF]) ? 3 : 0
        if let first = bytes[start...].first(where: { ![0x20, 0x09, 0x0A, 0x0D].contains($0) }),
           first != UInt8(ascii: "<"), first != 0xFE, first != 0xFF {
            throw PlistError("an OpenStep (old-style text) property list, which is not read: save it as XML or binary (plutil -convert xml1)")
        }
        return (try XMLPropertyList.decode(bytes), .xml)
    }

    public static func encode(_ value: PlistValue, as format: PlistFormat) -> [UInt8] {
        switch format {
        case .xml: XMLPropertyList.encode(value)
        case .binary: BinaryPropertyList.encode(value)
        }
    }
}
