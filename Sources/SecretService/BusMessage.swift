#if canImport(Glibc)
import Glibc
#endif
import CSDBus
import Posix
import SecureMemory

/// A D-Bus error by the name a client matches (`org.freedesktop.Secret.Error.IsLocked`, …).
///
/// Thread-safety: a value.
struct BusError: Error, Sendable {
    let name: String
    let message: String

    static func isLocked(_ message: String = "the collection is locked") -> BusError {
        BusError(name: "org.freedesktop.Secret.Error.IsLocked", message: message)
    }
    static func noSession(_ message: String = "no such session") -> BusError {
        BusError(name: "org.freedesktop.Secret.Error.NoSession", message: message)
    }
    static func noSuchObject(_ message: String = "no such object") -> BusError {
        BusError(name: "org.freedesktop.Secret.Error.NoSuchObject", message: message)
    }
    static func notSupported(_ message: String) -> BusError {
        BusError(name: "org.freedesktop.DBus.Error.NotSupported", message: message)
    }
    static func invalidArgs(_ message: String) -> BusError {
        BusError(name: "org.freedesktop.DBus.Error.InvalidArgs", message: message)
    }
    static func accessDenied(_ message: String) -> BusError {
        BusError(name: "org.freedesktop.DBus.Error.AccessDenied", message: message)
    }
    static func unknownMethod(_ message: String) -> BusError {
        BusError(name: "org.freedesktop.DBus.Error.UnknownMethod", message: message)
    }
    static func unknownProperty(_ message: String) -> BusError {
        BusError(name: "org.freedesktop.DBus.Error.UnknownProperty", message: message)
    }
    /// Secure memory ran out (its budget is spent): the call fails, the service goes on.
    static func noMemory(_ message: String = "no secure memory left for the secret") -> BusError {
        BusError(name: "org.freedesktop.DBus.Error.NoMemory", message: message)
    }
    static func failed(_ message: String) -> BusError {
        BusError(name: "org.freedesktop.DBus.Error.Failed", message: message)
    }
}

/// Reading a message's arguments in order, with sd-bus's calls that take no format string.
/// A malformed or mistyped argument is InvalidArgs.
///
/// Thread-safety: used on the bus thread only, for the message it handles.
struct MessageReader {
    let message: OpaquePointer

    private static func code(_ type: Character) -> CChar { CChar(bitPattern: type.asciiValue!) }

    private func check(_ rc: Int32, _ what: String) throws(BusError) {
        if rc <= 0 { throw .invalidArgs("expected \(what)") }
    }

    func string() throws(BusError) -> String { try text("s") }
    func objectPath() throws(BusError) -> String { try text("o") }

    private func text(_ type: Character) throws(BusError) -> String {
        var pointer: UnsafePointer<CChar>?
        try check(sd_bus_message_read_basic(message, Self.code(type), &pointer), "a \(type)")
        guard let pointer else { throw .invalidArgs("expected a \(type)") }
        return String(cString: pointer)
    }

    func bool() throws(BusError) -> Bool {
        var value: Int32 = 0
        try check(sd_bus_message_read_basic(message, Self.code("b"), &value), "a boolean")
        return value != 0
    }

    /// An `ay` into secure memory (the message's own buffer is erased when it is freed:
    /// `sensitive`).
    func secureBytes() throws(BusError) -> SecureBytes {
        var pointer: UnsafeRawPointer?
        var size = 0
        try check(sd_bus_message_read_array(message, Self.code("y"), &pointer, &size) >= 0 ? 1 : 0, "a byte array")
        do throws(Errno) {
            guard size > 0, let pointer else { return try SecureBytes() }
            return try SecureBytes(copying: UnsafeRawBufferPointer(start: pointer, count: size))
        } catch {
            throw .noMemory()
        }
    }

    func bytes() throws(BusError) -> [UInt8] {
        var pointer: UnsafeRawPointer?
        var size = 0
        try check(sd_bus_message_read_array(message, Self.code("y"), &pointer, &size) >= 0 ? 1 : 0, "a byte array")
        guard size > 0, let pointer else { return [] }
        return Array(UnsafeRawBufferPointer(start: pointer, count: size))
    }

    /// Enters a container (`a`, `r`, `e`, `v`) of `contents`: false at the end of an array.
    func enter(_ type: Character, _ contents: String) throws(BusError) -> Bool {
        let rc = sd_bus_message_enter_container(message, Self.code(type), contents)
        if rc < 0 { throw .invalidArgs("expected \(type)(\(contents))") }
        return rc > 0
    }

    func exit() throws(BusError) {
        if sd_bus_message_exit_container(message) < 0 { throw .invalidArgs("a container did not end where it should") }
    }

    /// The next argument's type and, for a container, its contents.
    func peek() -> (type: Character, contents: String)? {
        var type: CChar = 0
        var contents: UnsafePointer<CChar>?
        guard sd_bus_message_peek_type(message, &type, &contents) > 0 else { return nil }
        return (Character(Unicode.Scalar(UInt8(bitPattern: type))), contents.map { String(cString: $0) } ?? "")
    }

    func skip() throws(BusError) {
        if sd_bus_message_skip(message, nil) < 0 { throw .invalidArgs("an argument could not be skipped") }
    }

    func objectPaths() throws(BusError) -> [String] {
        guard try enter("a", "o") else { return [] }
        var paths: [String] = []
        while let next = peek(), next.type == "o" { paths.append(try objectPath()) }
        try exit()
        return paths
    }

    /// `a{ss}`.
    func stringDictionary() throws(BusError) -> [String: String] {
        var result: [String: String] = [:]
        guard try enter("a", "{ss}") else { return result }
        while try enter("e", "ss") {
            let key = try string()
            result[key] = try string()
            try exit()
        }
        try exit()
        return result
    }

    /// A variant holding `contents`, read by `body`; a variant of another type is InvalidArgs.
    func variant<T>(_ contents: String, _ body: () throws(BusError) -> T) throws(BusError) -> T {
        guard let next = peek(), next.type == "v" else { throw .invalidArgs("expected a variant") }
        guard next.contents == contents else { throw .invalidArgs("expected a variant of \(contents), not \(next.contents)") }
        _ = try enter("v", contents)
        let value = try body()
        try exit()
        return value
    }
}

/// Building a reply or a signal with sd-bus's calls that take no format string.
///
/// Thread-safety: used on the bus thread only.
struct MessageWriter {
    let message: OpaquePointer
    private(set) var failed = false

    private static func code(_ type: Character) -> CChar { CChar(bitPattern: type.asciiValue!) }

    private mutating func note(_ rc: Int32) { if rc < 0 { failed = true } }

    mutating func string(_ value: String) { note(sd_bus_message_append_basic(message, Self.code("s"), value)) }
    mutating func objectPath(_ value: String) { note(sd_bus_message_append_basic(message, Self.code("o"), value)) }

    mutating func bool(_ value: Bool) {
        var int: Int32 = value ? 1 : 0
        note(sd_bus_message_append_basic(message, Self.code("b"), &int))
    }

    mutating func uint64(_ value: UInt64) {
        var value = value
        note(sd_bus_message_append_basic(message, Self.code("t"), &value))
    }

    mutating func bytes(_ raw: UnsafeRawBufferPointer) {
        note(sd_bus_message_append_array(message, Self.code("y"), raw.baseAddress ?? UnsafeRawPointer(bitPattern: 1)!, raw.count))
    }

    mutating func open(_ type: Character, _ contents: String) {
        note(sd_bus_message_open_container(message, Self.code(type), contents))
    }

    mutating func close() { note(sd_bus_message_close_container(message)) }

    mutating func objectPaths(_ paths: [String]) {
        open("a", "o")
        for path in paths { objectPath(path) }
        close()
    }

    mutating func stringDictionary(_ values: [String: String]) {
        open("a", "{ss}")
        for (key, value) in values.sorted(by: { $0.key < $1.key }) {
            open("e", "ss")
            string(key)
            string(value)
            close()
        }
        close()
    }

    /// A variant of `contents`, written by `body`.
    mutating func variant(_ contents: String, _ body: (inout MessageWriter) -> Void) {
        open("v", contents)
        body(&self)
        close()
    }
}
