import Posix

/// Which collection: the vault's (`login`, aliases `default` and `login`), or the session's
/// (`session`, alias `session`: in memory until the mount ends).
///
/// Thread-safety: a value.
enum CollectionID: Hashable, CaseIterable {
    case login, session

    var name: String {
        switch self {
        case .login: "login"
        case .session: "session"
        }
    }
}

/// The object paths of the service: two collections (the vault; the session's), each
/// reached also through its aliases; an item per account (or session item), named by its
/// 16-byte id in hex under its collection; sessions and prompts by number.
///
/// Thread-safety: stateless.
enum SecretPaths {
    static let root = "/org/freedesktop/secrets"
    static let collection = path(of: .login)
    static let sessionCollection = path(of: .session)
    static let aliases = root + "/aliases"
    static let aliasNames = ["default", "login", "session"]
    static let noPrompt = "/"

    static func session(_ number: Int) -> String { root + "/session/s\(number)" }

    static func prompt(_ number: Int) -> String { root + "/prompt/p\(number)" }

    static func path(of collection: CollectionID) -> String { root + "/collection/" + collection.name }

    /// The collection an alias names (nil: no such alias).
    static func collection(ofAlias alias: String) -> CollectionID? {
        switch alias {
        case "default", "login": .login
        case "session": .session
        default: nil
        }
    }

    static func item(_ uuid: [UInt8], in collection: CollectionID = .login) -> String {
        path(of: collection) + "/" + ASCIIHex.string(uuid)
    }

    /// The collection at `path` (its own path, or an alias's).
    static func collection(at path: String) -> CollectionID? {
        for id in CollectionID.allCases where path == self.path(of: id) { return id }
        guard path.hasPrefix(aliases + "/") else { return nil }
        return collection(ofAlias: String(path.dropFirst(aliases.count + 1)))
    }

    /// The vault's collection's path, or one of its aliases'.
    static func isCollection(_ path: String) -> Bool { collection(at: path) == .login }

    /// Under a collection (or an alias of one): the collection, and the rest of the path.
    static func underCollection(_ path: String) -> (CollectionID, String)? {
        let slash = path.lastIndex(of: "/") ?? path.startIndex
        guard slash > path.startIndex, let collection = collection(at: String(path[..<slash])) else { return nil }
        return (collection, String(path[path.index(after: slash)...]))
    }

    /// The collection and id of an item's path (under a collection or an alias), if it is one.
    static func item(at path: String) -> (collection: CollectionID, uuid: [UInt8])? {
        guard let (collection, name) = underCollection(path) else { return nil }
        let hex = Array(name.utf8)
        guard hex.count == 32 else { return nil }
        var uuid: [UInt8] = []
        for index in stride(from: 0, to: 32, by: 2) {
            guard let high = nibble(hex[index]), let low = nibble(hex[index + 1]) else { return nil }
            uuid.append(high << 4 | low)
        }
        return (collection, uuid)
    }

    /// The UUID of a vault item's path (under the collection or an alias), if it is one.
    static func uuid(ofItem path: String) -> [UInt8]? {
        guard let (collection, uuid) = item(at: path), collection == .login else { return nil }
        return uuid
    }

    private static func nibble(_ c: UInt8) -> UInt8? {
        switch c {
        case UInt8(ascii: "0")...UInt8(ascii: "9"): c - UInt8(ascii: "0")
        case UInt8(ascii: "a")...UInt8(ascii: "f"): c - UInt8(ascii: "a") + 10
        default: nil
        }
    }
}
