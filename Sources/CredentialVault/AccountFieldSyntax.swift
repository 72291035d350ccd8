import SecureMemory
import Posix
/// What each account field may hold, and the `url` field that is derived from four of them.
/// Everything works on bytes (values are secrets; no `String` copies are made).
///
/// Thread-safety: pure functions.
public enum AccountFieldSyntax {
    /// Largest value of one field (EFBIG beyond).
    public static let maximumSize = 64 << 10

    /// True when `value` (already without its trailing newline) fits `field`.
    public static func isValid(_ value: UnsafeRawBufferPointer, for field: AccountField) -> Bool {
        guard value.count <= maximumSize, isUTF8(value) else { return false }
        switch field {
        case .protocol: return value.isEmpty || isScheme(value)
        case .server: return value.isEmpty || isHost(value)
        case .port: return value.isEmpty || isPort(value)
        case .path: return value.isEmpty || isPath(value)
        case .label, .comment, .username, .password: return true
        case .otp: return value.isEmpty || OneTimeCode.isValid(value)
        }
    }

    static func isUTF8(_ value: UnsafeRawBufferPointer) -> Bool {
        var iterator = value.makeIterator()
        var decoder = UTF8()
        while true {
            switch decoder.decode(&iterator) {
            case .scalarValue: continue
            case .emptyInput: return true
            case .error: return false
            }
        }
    }

    static func isAlpha(_ c: UInt8) -> Bool { (c >= 0x41 && c <= 0x5A) || (c >= 0x61 && c <= 0x7A) }
    static func isDigit(_ c: UInt8) -> Bool { c >= 0x30 && c <= 0x39 }
    static func isHexDigit(_ c: UInt8) -> Bool { isDigit(c) || (c >= 0x41 && c <= 0x46) || (c >= 0x61 && c <= 0x66) }

    /// RFC 3986 scheme: a letter, then letters, digits, `+`, `-`, `.`.
    static func isScheme(_ value: UnsafeRawBufferPointer) -> Bool {
        guard let first = value.first, isAlpha(first), value.count <= 64 else { return false }
        return value.allSatisfy { isAlpha($0) || isDigit($0) || $0 == 0x2B || $0 == 0x2D || $0 == 0x2E }
    }

    /// A DNS name (labels of letters, digits and inner hyphens, 253 bytes at most), an IPv4
    /// address, or an IPv6 address in brackets.
    static func isHost(_ value: UnsafeRawBufferPointer) -> Bool {
        guard !value.isEmpty, value.count <= 253 else { return false }
        if value.first == 0x5B {
            guard value.last == 0x5D, value.count > 2 else { return false }
            let inner = UnsafeRawBufferPointer(rebasing: value[1..<(value.count - 1)])
            return inner.contains(0x3A) && inner.allSatisfy { isHexDigit($0) || $0 == 0x3A || $0 == 0x2E }
        }
        var labelLength = 0
        var previous: UInt8 = 0x2E
        for c in value {
            if c == 0x2E {
                guard labelLength > 0, previous != 0x2D else { return false }
                labelLength = 0
            } else {
                guard isAlpha(c) || isDigit(c) || c == 0x2D else { return false }
                if labelLength == 0 && c == 0x2D { return false }
                labelLength += 1
                guard labelLength <= 63 else { return false }
            }
            previous = c
        }
        return labelLength > 0 && previous != 0x2D
    }

    /// 1 to 65535, decimal, no leading zero.
    static func isPort(_ value: UnsafeRawBufferPointer) -> Bool {
        guard (1...5).contains(value.count), value.allSatisfy(isDigit), value.first != 0x30 else { return false }
        return value.reduce(0) { $0 * 10 + Int($1 - 0x30) } <= 65535
    }

    /// Starts with `/`; no spaces or control characters.
    static func isPath(_ value: UnsafeRawBufferPointer) -> Bool {
        value.first == 0x2F && value.allSatisfy { $0 > 0x20 && $0 != 0x7F }
    }

    /// The parts of a URL `scheme://host[:port][/path]`, as ranges of the input; nil when
    /// it is malformed or a part does not fit its field. An empty URL clears all four.
    public static func parseURL(_ value: UnsafeRawBufferPointer) -> [AccountField: Range<Int>]? {
        if value.isEmpty { return [.protocol: 0..<0, .server: 0..<0, .port: 0..<0, .path: 0..<0] }
        guard isUTF8(value), value.count <= maximumSize else { return nil }
        let bytes = value  // no copy: a URL is a secret field too
        guard let colon = bytes.firstIndex(of: 0x3A), colon + 2 < bytes.count,
              bytes[colon + 1] == 0x2F, bytes[colon + 2] == 0x2F else { return nil }
        let scheme = 0..<colon
        let authorityStart = colon + 3
        let authorityEnd = bytes[authorityStart...].firstIndex(of: 0x2F) ?? bytes.count
        var hostRange = authorityStart..<authorityEnd
        var portRange = authorityEnd..<authorityEnd
        if bytes[authorityStart..<authorityEnd].first == 0x5B {
            guard let close = bytes[authorityStart..<authorityEnd].firstIndex(of: 0x5D) else { return nil }
            hostRange = authorityStart..<(close + 1)
            if close + 1 < authorityEnd {
                guard bytes[close + 1] == 0x3A else { return nil }
                portRange = (close + 2)..<authorityEnd
            }
        } else if let portColon = bytes[authorityStart..<authorityEnd].lastIndex(of: 0x3A) {
            hostRange = authorityStart..<portColon
            portRange = (portColon + 1)..<authorityEnd
            guard !portRange.isEmpty else { return nil }
        }
        let pathRange = authorityEnd..<bytes.count
        let parts: [AccountField: Range<Int>] = [.protocol: scheme, .server: hostRange, .port: portRange, .path: pathRange]
        for (field, range) in parts {
            let valid = isValid(UnsafeRawBufferPointer(rebasing: value[range]), for: field)
            guard valid else { return nil }
        }
        guard !scheme.isEmpty, !hostRange.isEmpty else { return nil }
        return parts
    }

    /// Writes `protocol://server[:port]path` into `out` (nothing when there is no server;
    /// ENOMEM when `out` cannot grow).
    public static func composeURL(protocol scheme: UnsafeRawBufferPointer, server: UnsafeRawBufferPointer,
                                  port: UnsafeRawBufferPointer, path: UnsafeRawBufferPointer, into out: SecureBytes) throws(Errno) {
        try out.resize(to: 0)
        guard !server.isEmpty else { return }
        if !scheme.isEmpty {
            try out.append(scheme)
            try out.append(Array("://".utf8))
        }
        try out.append(server)
        if !port.isEmpty {
            try out.append(Array(":".utf8))
            try out.append(port)
        }
        try out.append(path)
    }
}
