import Posix

/// The object paths of the service: one collection (the vault), reached also through its
/// aliases; an item per account, named by its UUID in hex; sessions and prompts by number.
///
/// Thread-safety: stateless.
enum SecretPaths {
    static let root = "/org/freedesktop/secrets"
    static let collection = root + "/collection/login"
    static let aliases = root + "/aliases"
    static let aliasNames = ["default", "login"]
    static let noPrompt = "/"

    static func session(_ number: Int) -> String { root + "/session/s\(number)" }

    static func prompt(_ number: Int) -> String { root + "/prompt/p\(number)" }

    static func item(_ uuid: [UInt8]) -> String {
        collection + "/" + ASCIIHex.string(uuid)
    }

    /// The collection's path, or one of its aliases'.
    static func isCollection(_ path: String) -> Bool {
        path == collection || aliasNames.contains { path == aliases + "/" + $0 }
    }

    /// The UUID of an item's path (under the collection or an alias), if it is one.
    static func uuid(ofItem path: String) -> [UInt8]? {
        let prefixes = [collection + "/"] + aliasNames.map { aliases + "/" + $0 + "/" }
        guard let prefix = prefixes.first(where: { path.hasPrefix($0) }) else { return nil }
        let hex = Array(path.utf8.dropFirst(prefix.utf8.count))
        guard hex.count == 32 else { return nil }
        var uuid: [UInt8] = []
        for index in stride(from: 0, to: 32, by: 2) {
            guard let high = nibble(hex[index]), let low = nibble(hex[index + 1]) else { return nil }
            uuid.append(high << 4 | low)
        }
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
