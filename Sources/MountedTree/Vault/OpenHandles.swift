/// The handles open on each file of accounts/, and those a narrowing revoked (SPEC §3a).
///
/// A narrowing of who may read (a lock, `guard on`, `untrust`, a trusted program replaced by
/// another version) revokes the handles open on the files it covers: they stay open but
/// read and write nothing (EACCES), and while one of them is open on a file the kernel must
/// not cache that file's pages — a trusted program's read would put back pages the revoked
/// handle could read without asking the daemon. Once the last of them is closed, the file
/// may be cached again.
///
/// Invariants: a handle is in `revoked` only while it is open; `revokedCount[file]` is the
/// number of revoked handles of `file`, never 0 (the entry goes).
/// Thread-safety: a value behind `VaultService`'s lock (inside `VaultSession`).
struct OpenHandles {
    private var open: [LocalInode: Set<UInt64>] = [:]
    private var revoked: [UInt64: LocalInode] = [:]
    private var revokedCount: [LocalInode: Int] = [:]

    mutating func opened(_ handle: FileHandle, of file: LocalInode) {
        open[file, default: []].insert(handle.raw)
    }

    /// Its RELEASE (or an open that the kernel did not take).
    mutating func released(_ handle: FileHandle, of file: LocalInode) {
        if open[file]?.remove(handle.raw) != nil, open[file]?.isEmpty == true { open[file] = nil }
        guard revoked.removeValue(forKey: handle.raw) != nil else { return }
        revokedCount[file, default: 1] -= 1
        if revokedCount[file] == 0 { revokedCount[file] = nil }
    }

    /// Revokes every handle open on a file `covers` takes in: the files that had one.
    mutating func revoke(where covers: (LocalInode) -> Bool) -> [LocalInode] {
        var files: [LocalInode] = []
        for (file, handles) in open where covers(file) {
            files.append(file)
            for handle in handles where revoked.updateValue(file, forKey: handle) == nil {
                revokedCount[file, default: 0] += 1
            }
        }
        return files
    }

    func isRevoked(_ handle: FileHandle) -> Bool { revoked[handle.raw] != nil }

    /// Some handle of `file` from before a narrowing is still open: no page cache for it.
    func hasRevoked(_ file: LocalInode) -> Bool { revokedCount[file] != nil }

    var revokedOpen: Int { revoked.count }
}
