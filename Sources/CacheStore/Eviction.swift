#if canImport(Glibc)
import Glibc
#endif
import CSQLite
import Posix

/// Expiry (`user.cache.expires`) and the size limit (`--cache-limit`).
extension CacheStore {
    /// Unix seconds (an integer) or ISO 8601, as nanoseconds; EINVAL otherwise.
    static func expiryTime(_ value: [UInt8]) throws(Errno) -> Int64 {
        var text = String(decoding: value, as: UTF8.self)
        while text.last == "\n" || text.last == "\r" || text.last == "\0" { text.removeLast() }
        if let seconds = Int64(text), seconds >= 0, seconds < Int64.max / 1_000_000_000 { return seconds * 1_000_000_000 }
        guard let seconds = ISO8601.unixSeconds(text) else { throw .invalidArgument }
        // Nanoseconds run out in 2262: later times are "never" in practice.
        return seconds >= Double(Int64.max / 1_000_000_000) ? Int64.max : Int64(max(0, seconds) * 1_000_000_000)
    }

    /// Removes every name of files whose expiry time has passed, then of the least recently
    /// used closed files while the stored bytes exceed `limit` (nil: no limit). Returns the
    /// names removed, for the kernel to forget.
    public func maintain(limit: Int64?) -> [(parent: Int64, name: String)] {
        // Looked at first without a transaction: a pass with nothing to do writes nothing.
        let work = (try? withLock { () throws(Errno) -> Bool in
            let due = try statement("SELECT 1 FROM inodes WHERE expires IS NOT NULL AND expires <= ? AND links > 0 LIMIT 1")
            due.bind(Self.now())
            defer { due.done() }
            if try row(due) { return true }
            guard let limit else { return false }
            let total = try statement("SELECT linked_bytes FROM totals WHERE id = 1")
            defer { total.done() }
            return try row(total) && total.int(0) > limit
        }) ?? true
        guard work else { return [] }
        return (try? transaction { () throws(Errno) -> [(parent: Int64, name: String)] in
            var removed: [(parent: Int64, name: String)] = []
            let expired = try statement("SELECT ino FROM inodes WHERE expires IS NOT NULL AND expires <= ? AND links > 0")
            expired.bind(Self.now())
            var due: [Int64] = []
            while try row(expired) { due.append(expired.int(0)) }
            expired.done()
            for ino in due where (opens[ino] ?? 0) == 0 {
                removed += try removeAllNames(ino)
                expirations += 1
            }
            guard let limit else { return removed }
            let total = try statement("SELECT linked_bytes FROM totals WHERE id = 1")
            var used: Int64 = 0
            if try row(total) { used = total.int(0) }
            total.done()
            guard used > limit else { return removed }
            let oldest = try statement("SELECT ino, stored FROM inodes WHERE links > 0 AND mode & \(S_IFMT) = \(S_IFREG) ORDER BY used, ino")
            oldest.bind()
            var candidates: [(Int64, Int64)] = []
            while used > limit, try row(oldest) {
                let ino = oldest.int(0), size = oldest.int(1)
                guard (opens[ino] ?? 0) == 0 else { continue }
                candidates.append((ino, size))
                used -= size
            }
            oldest.done()
            for (ino, _) in candidates {
                removed += try removeAllNames(ino)
                evictions += 1
            }
            return removed
        }) ?? []
    }

    /// How long until the next file expires (its `user.cache.expires`, found through the
    /// expiry index; zero when one is due); nil when none will.
    public var nextExpiry: Duration? {
        (try? withLock { () throws(Errno) -> Duration? in
            let next = try statement("SELECT min(expires) FROM inodes WHERE expires IS NOT NULL AND links > 0")
            defer { next.done() }
            next.bind()
            guard try row(next), !next.isNull(0) else { return nil }
            return .nanoseconds(max(0, next.int(0) - Self.now()))
        }) ?? nil
    }

    /// Stored bytes of the regular files that have a name (what `--cache-limit` bounds): the
    /// kept total, one row.
    public var linkedBytes: Int64 {
        (try? withLock { () throws(Errno) -> Int64 in
            let total = try statement("SELECT linked_bytes FROM totals WHERE id = 1")
            defer { total.done() }
            total.bind()
            return try row(total) ? total.int(0) : 0
        }) ?? 0
    }

    func removeAllNames(_ ino: Int64) throws(Errno) -> [(parent: Int64, name: String)] {
        let names = try statement("SELECT parent, name FROM entries WHERE ino = ?")
        names.bind(ino)
        var found: [(parent: Int64, name: String)] = []
        while try row(names) { found.append((names.int(0), names.text(1))) }
        names.done()
        for (parent, name) in found { try removeName(parent: parent, name: name, ino: ino) }
        return found
    }
}
