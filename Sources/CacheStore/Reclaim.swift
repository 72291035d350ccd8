#if canImport(Glibc)
import Glibc
#endif
import CSQLite
import Posix

/// Space given back: a deleted file of up to `deleteAtOnce` chunks' bytes goes in the request
/// that deleted it; a larger one's chunks are removed in slices by a thread of the daemon
/// (`reclaimStep`), not in that request, and the pages they leave go back
/// to the file system by incremental vacuum, a few megabytes at a time. Each slice holds the
/// store's lock for a few milliseconds, so other requests never wait long behind a delete.
extension CacheStore {
    /// Files of up to this many chunks are deleted at once, in the request.
    static let deleteAtOnce: Int64 = 16
    /// Chunks removed by one slice.
    static let reclaimSlice = 64
    /// Free pages that start incremental vacuum, and pages given back by one step.
    static let vacuumThreshold: Int64 = 2048
    static let vacuumStep = 512
    /// Vacuum waits for the store to be quiet this long (a busy store reuses its free pages
    /// itself, and shrinking a file that grows again at once is wasted work) — but never
    /// longer than `vacuumPatience` once there is something to give back.
    static let vacuumQuiet = 1.0
    static let vacuumPatience = 30.0

    /// Deletes an inode without names or references (lock held): small files at once,
    /// larger ones queued for `reclaimStep` (their row stays, with no links, until then;
    /// a crash leaves them queued again at the next open).
    func deleteInode(_ ino: Int64) throws(Errno) {
        dirty.discard(ino)
        let inode = try fetchInode(ino)
        guard inode.links <= 0 else { return }
        try run("DELETE FROM xattrs WHERE ino = ?", ino)
        if inode.storedBytes <= Self.deleteAtOnce * Int64(Self.chunkSize) {
            try run("DELETE FROM chunks WHERE ino = ?", key(ino))
            try run("DELETE FROM inodes WHERE ino = ?", ino)
            dataKeys[ino] = nil
        } else if !reclaimQueue.contains(where: { $0.inode == ino }) {
            reclaimQueue.append((key(ino), ino))
            backgroundWork?()
        }
    }

    /// When `reclaimStep` has work next: now while deleted data waits; for free pages to
    /// give back, once the store is quiet (or its patience runs out); nil: nothing to do.
    public var reclaimDue: ContinuousClock.Instant? {
        lock.withLock { () -> ContinuousClock.Instant? in
            if closed { return nil }
            if !reclaimQueue.isEmpty { return .now }
            guard vacuums, (database.freePages ?? 0) >= Self.vacuumThreshold else { return nil }
            return min(lastChange.advanced(by: .seconds(Self.vacuumQuiet)),
                       (vacuumWanted ?? .now).advanced(by: .seconds(Self.vacuumPatience)))
        }
    }

    /// One slice of background work (a part of a deleted file's chunks, or one step of
    /// incremental vacuum); true while work remains.
    public func reclaimStep() -> Bool {
        let due = lock.withLock { () -> Bool in
            if closed { return false }
            if !reclaimQueue.isEmpty { return true }
            guard vacuums, (database.freePages ?? 0) >= Self.vacuumThreshold else {
                vacuumWanted = nil
                return false
            }
            let wanted = vacuumWanted ?? .now
            vacuumWanted = wanted
            return lastChange.secondsElapsed >= Self.vacuumQuiet || wanted.secondsElapsed >= Self.vacuumPatience
        }
        guard due else { return false }
        return (try? transaction(background: true) { () throws(Errno) -> Bool in
            if let (key, ino) = reclaimQueue.first {
                if let ino {
                    // A group lost at its commit may have brought the inode back: then it stays.
                    let links: Int64
                    do throws(Errno) {
                        links = try fetchInode(ino).links
                    } catch where error == .noSuchFileOrDirectory {
                        links = 1  // gone already
                    }
                    guard links <= 0 else {
                        reclaimQueue.removeFirst()
                        return true
                    }
                } else if dataKeys.values.contains(key) {
                    reclaimQueue.removeFirst()  // (the same: the key is in use again)
                    return true
                }
                try run("DELETE FROM chunks WHERE ino = ? AND idx IN (SELECT idx FROM chunks WHERE ino = ? ORDER BY idx LIMIT ?)",
                        key, key, Self.reclaimSlice)
                if database.changes == 0 {
                    if let ino {
                        try run("DELETE FROM xattrs WHERE ino = ?", ino)
                        try run("DELETE FROM inodes WHERE ino = ?", ino)
                        dataKeys[ino] = nil
                    }
                    reclaimQueue.removeFirst()
                }
                return true
            }
            guard (database.freePages ?? 0) >= Self.vacuumThreshold else { return false }
            try exec("PRAGMA incremental_vacuum(\(Self.vacuumStep))")
            batchMovedPages = true
            return true
        }) ?? false
    }

    /// Deleted files (and cut-off data) still being removed.
    public var reclaimPending: Int { lock.withLock { reclaimQueue.count } }
}
