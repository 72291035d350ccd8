#if canImport(Glibc)
import Glibc
#endif
import CSQLite
import Posix

/// The tree: lookups, listings, and the operations on names (create, link, unlink, rename)
/// with the errno rules of ext4.
extension CacheStore {
    // MARK: Reading the tree

    /// `reference`: the caller hands the inode out; the holders count it in the same lock,
    /// so that no unlink can delete it in between.
    /// One query: the kernel looks up names in directories only, and a removed directory
    /// has none (ENOENT either way).
    public func lookup(parent: Int64, name: String, reference: Bool = false) throws(Errno) -> CacheInode {
        try withLock { () throws(Errno) -> CacheInode in
            guard name.utf8.count <= Self.maximumNameLength else { throw .nameTooLong }
            guard let stored = try entryInode(parent, name) else { throw .noSuchFileOrDirectory }
            if reference { holders?.hold(stored.ino) }
            return overlay(stored)
        }
    }

    public func inode(_ ino: Int64) throws(Errno) -> CacheInode {
        try withLock { () throws(Errno) -> CacheInode in
            guard !doomed.contains(ino) else { throw .noSuchFileOrDirectory }  // (gone; its row goes with the group)
            return try fetchInode(ino)
        }
    }

    /// The names in a directory with their inodes, in name order (byte order of UTF-8): at
    /// most `limit` of them, those after `name` (from the first with nil). A listing is read
    /// page by page this way, so memory does not grow with the directory.
    /// `referencing`: each entry listed is held (as `lookup(reference:)`), in the same
    /// visit, so that an unlink before the listing reaches the kernel leaves the inode an
    /// orphan, not gone.
    public func list(_ ino: Int64, after name: String? = nil, limit: Int = Int.max,
                     referencing: Bool = false) throws(Errno) -> [(name: String, inode: CacheInode)] {
        try withLock { () throws(Errno) -> [(name: String, inode: CacheInode)] in
            _ = try directory(ino)
            let statement = try statement("""
                SELECT i.ino, i.mode, i.uid, i.gid, i.size, i.links, i.atime, i.mtime, i.ctime, i.rdev, i.target, i.stored, i.data, e.name
                FROM entries e JOIN inodes i ON i.ino = e.ino WHERE e.parent = ? AND e.name > ? ORDER BY e.name LIMIT ?
                """)
            statement.bind(ino, name ?? "", limit)
            defer { statement.done() }
            var result: [(name: String, inode: CacheInode)] = []
            while try row(statement) { result.append((statement.text(13), overlay(Self.inode(statement)))) }
            if referencing, let holders { for entry in result { holders.hold(entry.inode.ino) } }
            return result
        }
    }

    // MARK: Names

    /// Creates a file, directory, symlink, FIFO, socket or device node named `name` in
    /// `parent` (device nodes are stored with their `device`, never opened as devices).
    /// `reference`: the holders count it; `open`: counts an open handle (both in the
    /// creating transaction, so that eviction cannot take the new file first).
    public func create(parent: Int64, name: String, mode: UInt32, uid: UInt32, gid: UInt32, device: Int64 = 0,
                       target: String? = nil, reference: Bool = false, open: Bool = false) throws(Errno) -> CacheInode {
        try Self.check(name)
        let type = mode & S_IFMT
        guard [S_IFREG, S_IFDIR, S_IFLNK, S_IFIFO, S_IFSOCK, S_IFBLK, S_IFCHR].contains(type) else { throw .invalidArgument }
        return try transaction { () throws(Errno) -> CacheInode in
            try requireNewName(parent, name)
            try requireHeadroom()
            let now = Self.now()
            let size = Int64(target?.utf8.count ?? 0), links = Int64(type == S_IFDIR ? 2 : 1)
            try run("INSERT INTO inodes(mode, uid, gid, size, links, atime, mtime, ctime, rdev, target, used) VALUES(?,?,?,?,?,?,?,?,?,?,?)",
                    Int64(mode), Int64(uid), Int64(gid), size, links, now, now, now, device, target, now)
            let ino = database.lastInsertedRow
            try run("INSERT INTO entries(parent, name, ino) VALUES(?,?,?)", parent, name, ino)
            if type == S_IFDIR {
                try run("UPDATE inodes SET links = links + 1, mtime = ?, ctime = ? WHERE ino = ?", now, now, parent)
            } else {
                try touch(parent)
            }
            // (The row just written, as `storedInode` would read it back.)
            let inode = CacheInode(ino: ino, mode: mode, uid: uid, gid: gid, size: size, links: links, accessNanoseconds: now,
                                   modificationNanoseconds: now, changeNanoseconds: now, device: device, target: target)
            if open { opens[ino, default: 0] += 1 }
            if reference { holders?.hold(ino) }
            return inode
        }
    }

    /// A new name for an existing non-directory.
    public func link(_ ino: Int64, parent: Int64, name: String, reference: Bool = false) throws(Errno) -> CacheInode {
        try Self.check(name)
        return try transaction { () throws(Errno) -> CacheInode in
            let inode = try storedInode(ino)
            guard !inode.isDirectory else { throw .notPermitted }
            guard inode.links > 0 else { throw .noSuchFileOrDirectory }
            _ = try directory(parent)
            guard try entry(parent, name) == nil else { throw .fileExists }
            try run("INSERT INTO entries(parent, name, ino) VALUES(?,?,?)", parent, name, ino)
            try run("UPDATE inodes SET links = links + 1, ctime = ? WHERE ino = ?", Self.now(), ino)
            try touch(parent)
            let linked = try fetchInode(ino)
            if reference { holders?.hold(ino) }
            return linked
        }
    }

    public func unlink(parent: Int64, name: String) throws(Errno) {
        try transaction { () throws(Errno) in
            let inode = try named(parent, name)
            guard !inode.isDirectory else { throw .isDirectory }
            try removeName(parent: parent, name: name, inode: inode)
        }
    }

    public func removeDirectory(parent: Int64, name: String) throws(Errno) {
        try transaction { () throws(Errno) in
            let inode = try named(parent, name)
            guard inode.isDirectory else { throw .notDirectory }
            guard try isEmptyDirectory(inode.ino) else { throw .directoryNotEmpty }
            try removeName(parent: parent, name: name, inode: inode)
        }
    }

    /// The row of what `name` in `parent` names (lock held): one query, the parent looked
    /// at only when there is no such name (a name is only ever in a live directory).
    func named(_ parent: Int64, _ name: String) throws(Errno) -> CacheInode {
        if let inode = try entryInode(parent, name) { return inode }
        _ = try directory(parent)
        throw .noSuchFileOrDirectory
    }

    /// That `parent` is a live directory without `name` (lock held), in one query.
    func requireNewName(_ parent: Int64, _ name: String) throws(Errno) {
        let statement = try statement("SELECT mode, links, EXISTS(SELECT 1 FROM entries WHERE parent = ?1 AND name = ?2) FROM inodes WHERE ino = ?1")
        statement.bind(parent, name)
        defer { statement.done() }
        guard try row(statement) else { throw .noSuchFileOrDirectory }
        guard UInt32(truncatingIfNeeded: statement.int(0)) & S_IFMT == S_IFDIR else { throw .notDirectory }
        guard statement.int(1) > 0 else { throw .noSuchFileOrDirectory }
        guard statement.int(2) == 0 else { throw .fileExists }
    }

    /// Drops one name; a directory loses its links (and its parent one); an inode without
    /// names and references is deleted with its data.
    func removeName(parent: Int64, name: String, ino: Int64) throws(Errno) {
        try removeName(parent: parent, name: name, inode: try storedInode(ino))
    }

    /// The same with the inode's row as just read.
    func removeName(parent: Int64, name: String, inode: CacheInode) throws(Errno) {
        let ino = inode.ino
        let now = Self.now()
        try run("DELETE FROM entries WHERE parent = ? AND name = ?", parent, name)
        if inode.isDirectory {
            try run("UPDATE inodes SET links = 0, ctime = ? WHERE ino = ?", now, ino)
            try run("UPDATE inodes SET links = links - 1, mtime = ?, ctime = ? WHERE ino = ?", now, now, parent)
        } else {
            try run("UPDATE inodes SET links = links - 1, ctime = ? WHERE ino = ?", now, ino)
            try touch(parent)
        }
        if inode.isDirectory || inode.links <= 1 { try unlinked(ino) }
    }

    /// An inode that lost its last name: deleted now, or once the kernel and the open
    /// handles let it go (`orphans`).
    func unlinked(_ ino: Int64) throws(Errno) {
        guard ino != Self.rootInode else { return }
        if !isHeld(ino) {
            try deleteInode(ino)
        } else {
            orphans.insert(ino)
        }
    }

    /// Deletes an inode without names or references (lock held, inside a change): its row,
    /// attributes and bytes; a large file's data file goes once the deletion is durable.
    func deleteInode(_ ino: Int64) throws(Errno) {
        inline.discard(ino)
        let inode = try storedInode(ino)
        guard inode.links <= 0 else { return }
        try run("DELETE FROM xattrs WHERE ino = ?", ino)
        try run("DELETE FROM contents WHERE ino = ?", ino)
        try run("DELETE FROM inodes WHERE ino = ?", ino)
        forgetDataFile(inode)
    }

    /// Open, or held by the kernel.
    func isHeld(_ ino: Int64) -> Bool { (opens[ino] ?? 0) != 0 || holders?.isHeld(ino) == true }

    /// A reference went: an orphan without references left is deleted. Other inodes need no
    /// look at the database (forgetting costs no query).
    func referenceDropped(_ ino: Int64) throws(Errno) {
        guard !isHeld(ino), orphans.remove(ino) != nil else { return }
        try deleteInode(ino)
    }

    /// rename(2) and renameat2(2) with RENAME_NOREPLACE (1) and RENAME_EXCHANGE (2).
    public func rename(parent: Int64, name: String, newParent: Int64, newName: String, flags: UInt32) throws(Errno) {
        try Self.check(newName)
        let noReplace = flags & 1 != 0, exchange = flags & 2 != 0
        // RENAME_WHITEOUT (overlay file systems' flag) and unknown flags are not offered.
        if noReplace && exchange || flags & ~3 != 0 { throw .invalidArgument }
        // A large file renamed over another has its data file synced (and recorded) first,
        // outside the lock, as ext4's auto_da_alloc writes such a file's data before the
        // rename commits: the write-then-rename idiom never leaves the new name without its
        // data after a crash. (A small file's buffer is stored in the rename's own change.)
        let replaced = try withLock { () throws(Errno) -> (ino: Int64, file: DataFile)? in
            guard !exchange, !noReplace, let source = try entry(parent, name), try entry(newParent, newName) != nil,
                  let file = try dataFile(try storedInode(source)) else { return nil }
            return (source, file)
        }
        if let replaced {
            try Syscall.fdatasync(replaced.file.fd)
            recordConversions(olderThan: nil, only: replaced.ino)
        }
        try transaction { () throws(Errno) in
            _ = try directory(parent)
            _ = try directory(newParent)
            guard let source = try entry(parent, name) else { throw .noSuchFileOrDirectory }
            try storeBuffer(source)
            let target = try entry(newParent, newName)
            let sourceInode = try storedInode(source)
            if exchange {
                guard let target else { throw .noSuchFileOrDirectory }
                let targetInode = try storedInode(target)
                if sourceInode.isDirectory { try refuseIntoItself(source, newParent) }
                if targetInode.isDirectory { try refuseIntoItself(target, parent) }
                try run("UPDATE entries SET ino = ? WHERE parent = ? AND name = ?", target, parent, name)
                try run("UPDATE entries SET ino = ? WHERE parent = ? AND name = ?", source, newParent, newName)
                if parent != newParent && sourceInode.isDirectory != targetInode.isDirectory {
                    let delta: Int64 = sourceInode.isDirectory ? 1 : -1
                    try run("UPDATE inodes SET links = links + ? WHERE ino = ?", delta, newParent)
                    try run("UPDATE inodes SET links = links - ? WHERE ino = ?", delta, parent)
                }
                for ino in [source, target] { try touch(ino, modified: false) }
                try touch(parent)
                if newParent != parent { try touch(newParent) }
                return
            }
            if let target {
                if noReplace { throw .fileExists }
                if target == source { return }  // two names of one inode: nothing to do
                let targetInode = try storedInode(target)
                if sourceInode.isDirectory {
                    guard targetInode.isDirectory else { throw .notDirectory }
                    guard try isEmptyDirectory(target) else { throw .directoryNotEmpty }
                } else if targetInode.isDirectory {
                    throw .isDirectory
                }
            }
            if parent == newParent && name == newName { return }
            if sourceInode.isDirectory { try refuseIntoItself(source, newParent) }
            if let target { try removeName(parent: newParent, name: newName, ino: target) }
            try run("DELETE FROM entries WHERE parent = ? AND name = ?", parent, name)
            try run("INSERT INTO entries(parent, name, ino) VALUES(?,?,?)", newParent, newName, source)
            if sourceInode.isDirectory && parent != newParent {
                try run("UPDATE inodes SET links = links - 1 WHERE ino = ?", parent)
                try run("UPDATE inodes SET links = links + 1 WHERE ino = ?", newParent)
            }
            try touch(source, modified: false)
            try touch(parent)
            if newParent != parent { try touch(newParent) }
        }
    }

    /// EINVAL when `directory` is `destination` or one of its ancestors.
    func refuseIntoItself(_ directory: Int64, _ destination: Int64) throws(Errno) {
        var current = destination
        var steps = 0
        while true {
            if current == directory { throw .invalidArgument }
            if current == Self.rootInode { return }
            let statement = try statement("SELECT parent FROM entries WHERE ino = ? LIMIT 1")
            statement.bind(current)
            defer { statement.done() }
            guard try row(statement) else { return }
            current = statement.int(0)
            steps += 1
            if steps > 100_000 { throw .ioError }
        }
    }
}

/// Who holds the store's inodes besides its open handles: the kernel, whose references the
/// mounted tree counts. The store keeps no count of them: it says when it hands an inode
/// out (`hold`, with its lock held, in the visit that found the inode, so that no unlink can
/// come in between) and asks before deleting an inode that lost its last name (`isHeld`,
/// also under its lock). When the last reference goes, the holder calls
/// `CacheStore.unheld`. Both are called with the store's lock held: they must not call the
/// store.
///
/// Thread-safety: called from any thread, with the store's lock held.
public protocol InodeHolders: AnyObject, Sendable {
    func hold(_ ino: Int64)
    func isHeld(_ ino: Int64) -> Bool
}
