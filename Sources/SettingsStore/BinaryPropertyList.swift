/// Apple's binary property-list format (`bplist00`): objects, an offset table and a
/// 32-byte trailer. The reader checks every offset, reference and length against the file
/// and refuses reference cycles and excessive nesting.
///
/// Read as Core Foundation reads it: offsets and object references of any size from 1 to 8
/// bytes (the trailer says which; encoders in the wild use 3, 5, 6 and 7); integers of 1, 2
/// and 4 bytes unsigned, 8 bytes signed, 16 bytes (marker 0x14) signed and within
/// −2^63…2^64−1; strings in ASCII (0x5_) or UTF-16 (0x6_). Objects a settings file cannot
/// show are refused with their name: keyed-archiver UIDs (0x8_), sets (0xC_), null (0x00).
///
/// Thread-safety: pure functions; each read has its own `Reader`.
enum BinaryPropertyList {
    // MARK: Reading

    static func decode(_ bytes: [UInt8]) throws(PlistError) -> PlistValue {
        guard bytes.count >= 8 + 32 else { throw PlistError("a binary plist shorter than its header and trailer") }
        let trailer = bytes.count - 32
        let offsetSize = Int(bytes[trailer + 6])
        let referenceSize = Int(bytes[trailer + 7])
        let objectCount = readUnsigned(bytes, trailer + 8, 8)
        let topObject = readUnsigned(bytes, trailer + 16, 8)
        let tableOffset = readUnsigned(bytes, trailer + 24, 8)
        guard (1...8).contains(offsetSize), (1...8).contains(referenceSize) else {
            throw PlistError("a binary plist trailer with offset size \(offsetSize) and reference size \(referenceSize) (each must be 1 to 8)")
        }
        guard objectCount > 0, objectCount < UInt64(bytes.count), topObject < objectCount,
              tableOffset >= 8, tableOffset <= UInt64(trailer),
              (UInt64(trailer) - tableOffset) / UInt64(offsetSize) >= objectCount else {
            throw PlistError("a binary plist trailer that does not fit the file")
        }
        var offsets: [Int] = []
        offsets.reserveCapacity(Int(objectCount))
        for index in 0..<Int(objectCount) {
            let offset = readUnsigned(bytes, Int(tableOffset) + index * offsetSize, offsetSize)
            guard offset >= 8, offset < tableOffset else { throw PlistError("object \(index) lies outside the object area") }
            offsets.append(Int(offset))
        }
        var reader = Reader(bytes: bytes, offsets: offsets, referenceSize: referenceSize, end: Int(tableOffset))
        return try reader.object(Int(topObject), depth: 0)
    }

    static func readUnsigned(_ bytes: [UInt8], _ at: Int, _ size: Int) -> UInt64 {
        var value: UInt64 = 0
        for index in 0..<size { value = value << 8 | UInt64(bytes[at + index]) }
        return value
    }

    /// One read of a binary property list: the file, its offset table, and what decoding it
    /// has produced so far.
    ///
    /// Thread-safety: a value local to one `decode` call.
    struct Reader {
        let bytes: [UInt8]
        let offsets: [Int]
        let referenceSize: Int
        let end: Int
        var inProgress = Set<Int>()
        /// Objects produced so far: a shared reference is decoded again each time it is
        /// met, so a small file could otherwise expand without bound.
        var produced = 0
        var producedBytes = 0
        static let maximumObjects = 2_000_000
        static let maximumBytes = 256 << 20

        func need(_ at: Int, _ count: Int) throws(PlistError) {
            guard count >= 0, at >= 0, at <= end, count <= end - at else {
                throw PlistError("an object runs past the object area")
            }
        }

        /// The count in a marker's low nibble, or the integer object after it when 0xF.
        func length(_ marker: UInt8, after position: inout Int) throws(PlistError) -> Int {
            let nibble = Int(marker & 0x0F)
            if nibble != 0x0F { return nibble }
            try need(position, 1)
            let intMarker = bytes[position]
            guard intMarker & 0xF0 == 0x10 else { throw PlistError("a length that is not an integer object") }
            let size = 1 << Int(intMarker & 0x0F)
            guard size <= 8 else { throw PlistError("a length wider than 64 bits") }
            try need(position + 1, size)
            let value = readUnsigned(bytes, position + 1, size)
            position += 1 + size
            guard value < UInt64(end) else { throw PlistError("a length larger than the file") }
            return Int(value)
        }

        func reference(_ at: Int) throws(PlistError) -> Int {
            try need(at, referenceSize)
            let value = readUnsigned(bytes, at, referenceSize)
            guard value < UInt64(offsets.count) else { throw PlistError("a reference to a missing object") }
            return Int(value)
        }

        /// The integer object of `width` bytes at `at`: 1, 2 and 4 bytes unsigned, 8 and 16
        /// signed; a 16-byte value outside −2^63…2^64−1 is damage.
        func integer(width: PlistInteger.Width, at: Int) throws(PlistError) -> PlistInteger {
            try need(at, width.rawValue)
            let value: PlistInteger
            switch width {
            case .one, .two, .four:
                value = PlistInteger(readUnsigned(bytes, at, width.rawValue))
            case .eight:
                value = PlistInteger(Int64(bitPattern: readUnsigned(bytes, at, 8)))
            case .sixteen:
                let high = readUnsigned(bytes, at, 8), low = readUnsigned(bytes, at + 8, 8)
                if high == 0 {
                    value = PlistInteger(low)
                } else if high == UInt64.max && low > UInt64(Int64.max) {
                    value = PlistInteger(Int64(bitPattern: low))
                } else {
                    throw PlistError("a 16-byte integer outside −2^63…2^64−1")
                }
            }
            return value.with(width: width)
        }

        mutating func object(_ index: Int, depth: Int) throws(PlistError) -> PlistValue {
            guard depth < PropertyList.maximumDepth else { throw PlistError("nesting deeper than \(PropertyList.maximumDepth)") }
            produced += 1
            guard produced <= Self.maximumObjects else { throw PlistError("more than \(Self.maximumObjects) objects once shared references are expanded") }
            var position = offsets[index]
            try need(position, 1)
            let marker = bytes[position]
            position += 1
            switch marker >> 4 {
            case 0x0:
                switch marker {
                case 0x08: return .bool(false)
                case 0x09: return .bool(true)
                case 0x00: throw PlistError("a null object (0x00), which a settings file cannot show")
                default: throw PlistError("an unsupported object 0x\(String(marker, radix: 16))")
                }
            case 0x1:
                guard marker & 0x0F <= 4, let width = PlistInteger.Width(rawValue: 1 << Int(marker & 0x0F)) else {
                    throw PlistError("an integer of \(1 << Int(marker & 0x0F)) bytes")
                }
                return .integer(try integer(width: width, at: position))
            case 0x2:
                let size = 1 << Int(marker & 0x0F)
                try need(position, size)
                switch size {
                case 4: return .real(Double(Float(bitPattern: UInt32(readUnsigned(bytes, position, 4)))))
                case 8: return .real(Double(bitPattern: readUnsigned(bytes, position, 8)))
                default: throw PlistError("a real of \(size) bytes")
                }
            case 0x3:
                guard marker == 0x33 else { throw PlistError("a bad date marker") }
                try need(position, 8)
                let seconds = Double(bitPattern: readUnsigned(bytes, position, 8))
                guard PlistText.isRepresentableDate(seconds) else { throw PlistError("a date outside the years 1 to 9999") }
                return .date(seconds)
            case 0x4:
                let count = try length(marker, after: &position)
                try need(position, count)
                producedBytes += count
                guard producedBytes <= Self.maximumBytes else { throw PlistError("more than 256 MiB of data once shared references are expanded") }
                return .data(Array(bytes[position..<position + count]))
            case 0x5:
                let count = try length(marker, after: &position)
                try need(position, count)
                let slice = bytes[position..<position + count]
                guard slice.allSatisfy({ $0 < 0x80 }) else { throw PlistError("an ASCII string with non-ASCII bytes") }
                return .string(String(decoding: slice, as: UTF8.self))
            case 0x6:
                let count = try length(marker, after: &position)
                try need(position, count * 2)
                var units: [UInt16] = []
                units.reserveCapacity(count)
                for unit in 0..<count { units.append(UInt16(readUnsigned(bytes, position + unit * 2, 2))) }
                guard let string = String(validating: units, as: UTF16.self) else {
                    throw PlistError("a UTF-16 string with unpaired surrogates")
                }
                return .string(string)
            case 0xA, 0xD:
                guard !inProgress.contains(index) else { throw PlistError("a container that contains itself") }
                inProgress.insert(index)
                defer { inProgress.remove(index) }
                let count = try length(marker, after: &position)
                if marker >> 4 == 0xA {
                    try need(position, count * referenceSize)
                    var items: [PlistValue] = []
                    for item in 0..<count {
                        items.append(try object(try reference(position + item * referenceSize), depth: depth + 1))
                    }
                    return .array(items)
                }
                try need(position, 2 * count * referenceSize)
                var dictionary = PlistDictionary()
                for item in 0..<count {
                    let key = try object(try reference(position + item * referenceSize), depth: depth + 1)
                    guard case .string(let name) = key else { throw PlistError("a dictionary key that is not a string") }
                    let value = try object(try reference(position + (count + item) * referenceSize), depth: depth + 1)
                    dictionary[name] = value
                }
                return .dictionary(dictionary)
            case 0x8:
                throw PlistError("a keyed-archiver UID (marker 0x\(String(marker, radix: 16))): NSKeyedArchiver data, not settings")
            case 0xC:
                throw PlistError("a set (marker 0x\(String(marker, radix: 16))), which a settings file cannot show")
            default:
                throw PlistError("an unsupported object 0x\(String(marker, radix: 16))")
            }
        }
    }

    // MARK: Writing

    static func encode(_ value: PlistValue) -> [UInt8] {
        // Flatten: every value becomes one object; containers refer to their children.
        var objects: [PlistValue] = []
        var children: [[Int]] = []
        func add(_ value: PlistValue) -> Int {
            let index = objects.count
            objects.append(value)
            children.append([])
            var refs: [Int] = []
            switch value {
            case .array(let items): for item in items { refs.append(add(item)) }
            case .dictionary(let dictionary):
                let keys = dictionary.entries.map { add(.string($0.key)) }
                let values = dictionary.entries.map { add($0.value) }
                refs = keys + values
            default: break
            }
            children[index] = refs
            return index
        }
        _ = add(value)
        let referenceSize = objects.count < 256 ? 1 : objects.count < 65536 ? 2 : 4

        var out = Array("bplist00".utf8)
        var offsets: [Int] = []
        func appendLength(_ marker: UInt8, _ count: Int) {
            if count < 15 {
                out.append(marker | UInt8(count))
            } else {
                out.append(marker | 0x0F)
                appendInteger(PlistInteger(UInt64(count)))
            }
        }
        func appendInteger(_ number: PlistInteger) {
            let width = number.writtenWidth
            out.append(0x10 | UInt8(width.rawValue.trailingZeroBitCount))
            if width == .sixteen { appendBigEndian(number.isNegative ? UInt64.max : 0, 8) }
            appendBigEndian(number.bitPattern, min(width.rawValue, 8))
        }
        func appendBigEndian(_ value: UInt64, _ size: Int) {
            for shift in stride(from: (size - 1) * 8, through: 0, by: -8) { out.append(UInt8(truncatingIfNeeded: value >> UInt64(shift))) }
        }
        for (index, object) in objects.enumerated() {
            offsets.append(out.count)
            switch object {
            case .bool(let flag): out.append(flag ? 0x09 : 0x08)
            case .integer(let number): appendInteger(number)
            case .real(let number):
                out.append(0x23)
                appendBigEndian(number.bitPattern, 8)
            case .date(let seconds):
                out.append(0x33)
                appendBigEndian(seconds.bitPattern, 8)
            case .data(let bytes):
                appendLength(0x40, bytes.count)
                out += bytes
            case .string(let text):
                if text.utf8.allSatisfy({ $0 < 0x80 }) {
                    appendLength(0x50, text.utf8.count)
                    out += Array(text.utf8)
                } else {
                    let units = Array(text.utf16)
                    appendLength(0x60, units.count)
                    for unit in units { appendBigEndian(UInt64(unit), 2) }
                }
            case .array(let items):
                appendLength(0xA0, items.count)
                for ref in children[index] { appendBigEndian(UInt64(ref), referenceSize) }
            case .dictionary(let dictionary):
                appendLength(0xD0, dictionary.count)
                for ref in children[index] { appendBigEndian(UInt64(ref), referenceSize) }
            }
        }
        let tableOffset = out.count
        let offsetSize = tableOffset < 256 ? 1 : tableOffset < 65536 ? 2 : tableOffset < (1 << 32) ? 4 : 8
        for offset in offsets { appendBigEndian(UInt64(offset), offsetSize) }
        out += [0, 0, 0, 0, 0, 0, UInt8(offsetSize), UInt8(referenceSize)]
        appendBigEndian(UInt64(objects.count), 8)
        appendBigEndian(0, 8)
        appendBigEndian(UInt64(tableOffset), 8)
        return out
    }
}
