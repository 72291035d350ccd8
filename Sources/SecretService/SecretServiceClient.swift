#if canImport(Glibc)
import Glibc
#endif
import CSDBus
import Posix
import SecureMemory

/// A client of another program's Secret Service on the session bus (gnome-keyring,
/// KeePassXC's), for `mtmfs import secret-service`: one collection's items, their labels,
/// attributes and secrets, through a `plain` session (the bus is the user's own; the
/// secrets go straight into secure memory, and the reply's memory is erased when freed).
///
/// Thread-safety: none of its own; one thread, blocking calls.
public final class SecretServiceClient {
    /// An item as read: its label, attributes and secret (wiped by `wipe`).
    public struct Item {
        public let path: String
        public let label: String
        public let attributes: [String: String]
        public let secret: SecureBytes
        public let contentType: String

        public func wipe() { secret.wipe() }
    }

    private let bus: OpaquePointer
    private let name: String
    private var session = ""

    /// Connects to the session bus; `name` is the service's bus name.
    public init(name: String = "org.freedesktop.secrets") throws(SecretServiceError) {
        var opened: OpaquePointer?
        let rc = sd_bus_open_user(&opened)
        guard rc >= 0, let opened else {
            throw SecretServiceError("no session bus (\(Errno(-rc))): is DBUS_SESSION_BUS_ADDRESS set?")
        }
        bus = opened
        self.name = name
    }

    deinit { sd_bus_flush_close_unref(bus) }

    /// One method call and its reply (read by `read`; nil: the call failed, with why).
    private func call<T>(_ path: String, _ interface: String, _ member: String, sensitive: Bool = false,
                         _ write: (inout MessageWriter) -> Void = { _ in },
                         read: (MessageReader) throws(BusError) -> T) throws(SecretServiceError) -> T {
        var message: OpaquePointer?
        guard sd_bus_message_new_method_call(bus, &message, name, path, interface, member) >= 0, let message else {
            throw SecretServiceError("cannot make the call \(interface).\(member)")
        }
        defer { sd_bus_message_unref(message) }
        var writer = MessageWriter(message: message)
        write(&writer)
        var error = sd_bus_error()
        var reply: OpaquePointer?
        let rc = sd_bus_call(bus, message, 25_000_000, &error, &reply)
        defer { sd_bus_error_free(&error) }
        guard rc >= 0, let reply else {
            let why = error.name.map { String(cString: $0) } ?? "\(Errno(-rc))"
            let text = error.message.map { ": " + String(cString: $0) } ?? ""
            throw SecretServiceError("\(name) refused \(interface).\(member) (\(why)\(text))")
        }
        defer { sd_bus_message_unref(reply) }
        if sensitive { _ = sd_bus_message_sensitive(reply) }
        do throws(BusError) {
            return try read(MessageReader(message: reply))
        } catch {
            throw SecretServiceError("\(name) answered \(interface).\(member) in a form it should not (\(error.message))")
        }
    }

    private func property<T>(_ path: String, _ interface: String, _ property: String, _ contents: String,
                             _ read: @escaping (MessageReader) throws(BusError) -> T) throws(SecretServiceError) -> T {
        try call(path, "org.freedesktop.DBus.Properties", "Get", { writer in
            writer.string(interface)
            writer.string(property)
        }, read: { (reader) throws(BusError) in try reader.variant(contents) { () throws(BusError) in try read(reader) } })
    }

    /// The collection an alias names (`default`, `login`, `session`).
    public func collection(alias: String) throws(SecretServiceError) -> String {
        let path = try call(SecretPaths.root, "org.freedesktop.Secret.Service", "ReadAlias", { $0.string(alias) },
                            read: { (reader) throws(BusError) in try reader.objectPath() })
        guard path != "/" else { throw SecretServiceError("\(name) has no collection \(alias)") }
        return path
    }

    public func isLocked(_ collection: String) throws(SecretServiceError) -> Bool {
        try property(collection, "org.freedesktop.Secret.Collection", "Locked", "b") { (reader) throws(BusError) in try reader.bool() }
    }

    /// Every item of `collection`, its secret read (the collection must be unlocked).
    public func items(of collection: String) throws(SecretServiceError) -> [Item] {
        if session.isEmpty {
            session = try call(SecretPaths.root, "org.freedesktop.Secret.Service", "OpenSession", { writer in
                writer.string("plain")
                writer.variant("s") { $0.string("") }
            }, read: { (reader) throws(BusError) in
                try reader.skip()
                return try reader.objectPath()
            })
        }
        let paths = try property(collection, "org.freedesktop.Secret.Collection", "Items", "ao") { (reader) throws(BusError) in
            try reader.objectPaths()
        }
        var items: [Item] = []
        do throws(SecretServiceError) {
            for path in paths {
                let label = try property(path, "org.freedesktop.Secret.Item", "Label", "s") { (reader) throws(BusError) in try reader.string() }
                let attributes = try property(path, "org.freedesktop.Secret.Item", "Attributes", "a{ss}") { (reader) throws(BusError) in
                    try reader.stringDictionary()
                }
                let session = self.session
                let (secret, type) = try call(path, "org.freedesktop.Secret.Item", "GetSecret", sensitive: true, { $0.objectPath(session) },
                                              read: { (reader) throws(BusError) -> (SecureBytes, String) in
                    guard try reader.enter("r", "oayays") else { throw .invalidArgs("no secret") }
                    _ = try reader.objectPath()
                    _ = try reader.bytes()
                    let value = try reader.secureBytes()
                    let type = try reader.string()
                    try reader.exit()
                    return (value, type)
                })
                items.append(Item(path: path, label: label, attributes: attributes, secret: secret, contentType: type))
            }
        } catch {
            items.forEach { $0.wipe() }
            throw error
        }
        return items
    }
}
