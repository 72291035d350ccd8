#if canImport(Glibc)
import Glibc
#endif
import CSQLite
import Posix

/// Extended attributes: `user.*` only, at most 64 KiB a value.
extension CacheStore {
    // MARK: Extended attributes (user.* only)

    static func checkAttributeName(_ name: String) throws(Errno) {
        guard name.hasPrefix("user."), name.utf8.count > 5 else { throw .notSupported }
        guard name.utf8.count <= 255 else { throw .outOfRange }
    }

    /// `flags`: XATTR_CREATE (1) fails if present, XATTR_REPLACE (2) if absent.
    public func setExtendedAttribute(_ ino: Int64, name: String, value: [UInt8], flags: Int32) throws(Errno) {
        try Self.checkAttributeName(name)
        guard value.count <= 65536 else { throw .fileTooLarge }
        let expiry = name == Self.expiryAttribute ? try Self.expiryTime(value) : nil
        try transaction { () throws(Errno) in
            let inode = try fetchInode(ino)
            // Expiry removes names: a directory's would orphan its subtree.
            if expiry != nil && inode.isDirectory { throw .notPermitted }
            let exists = try attribute(ino, name) != nil
            if flags & 1 != 0 && exists { throw .fileExists }
            if flags & 2 != 0 && !exists { throw .noData }
            try run("INSERT OR REPLACE INTO xattrs(ino, name, value) VALUES(?,?,?)", ino, name, value)
            if let expiry {
                try run("UPDATE inodes SET expires = ? WHERE ino = ?", expiry, ino)
                backgroundWork?()  // perhaps sooner than the next expiry the maintenance thread waits for
            }
            try touch(ino, modified: false)
        }
    }

    func attribute(_ ino: Int64, _ name: String) throws(Errno) -> [UInt8]? {
        let statement = try statement("SELECT value FROM xattrs WHERE ino = ? AND name = ?")
        statement.bind(ino, name)
        defer { statement.done() }
        return try row(statement) ? statement.bytes(0) : nil
    }

    public func extendedAttribute(_ ino: Int64, name: String) throws(Errno) -> [UInt8] {
        try withLock { () throws(Errno) -> [UInt8] in
            guard let value = try attribute(ino, name) else { throw .noData }
            return value
        }
    }

    public func extendedAttributeNames(_ ino: Int64) throws(Errno) -> [String] {
        try withLock { () throws(Errno) -> [String] in
            let statement = try statement("SELECT name FROM xattrs WHERE ino = ? ORDER BY name")
            statement.bind(ino)
            defer { statement.done() }
            var names: [String] = []
            while try row(statement) { names.append(statement.text(0)) }
            return names
        }
    }

    public func removeExtendedAttribute(_ ino: Int64, name: String) throws(Errno) {
        try Self.checkAttributeName(name)
        try transaction { () throws(Errno) in
            guard try attribute(ino, name) != nil else { throw .noData }
            try run("DELETE FROM xattrs WHERE ino = ? AND name = ?", ino, name)
            if name == Self.expiryAttribute { try run("UPDATE inodes SET expires = NULL WHERE ino = ?", ino) }
            try touch(ino, modified: false)
        }
    }
}
