#if canImport(Glibc)
import Glibc
#endif
import CacheStore
import FuseLowLevel
import Posix
import Synchronization

/// `cache/`: a general POSIX file tree stored in SQLite (SPEC §5). Inode numbers are the
/// store's row ids in the cache's inode space, so a request maps onto its rows with no
/// path resolution. Every inode handed to the kernel (lookup, readdirplus, create) is
/// counted in the mount's `NodeTable` within the store's visit that found it, and every open
/// by the store, so that a file unlinked while open or held keeps its data until the last
/// reference goes.
///
/// Thread-safety: the store serializes its own access.
public final class CacheTree: Subtree {
    public let name = "cache"
    public let space = InodeSpace.cache
    public let nodes: NodeTable
    let store: CacheStore?
    let problem: String?
    let notifier: KernelCacheNotifier
    /// Bytes of file data to stay under (`--cache-limit`), or nil.
    let limit: Int64?
    private let running = Atomic<Bool>(true)
    /// The committing and maintenance threads, joined at shutdown before the store closes:
    /// a daemon that exits with one of them inside a checkpoint's sync would keep the
    /// database locked after its main thread is gone.
    private let threads = Mutex<[pthread_t]>([])
    /// Wakes the maintenance thread: work from the store, shutdown.
    let maintenanceWakeup = Wakeup()
    /// Every change goes through this mount, so the kernel keeps its own copy right (and
    /// eviction and expiry invalidate the names they remove): names, attributes and pages
    /// may be trusted for a minute and kept across opens.
    static let cache = CachePolicy(entryTimeout: 60, attributeTimeout: 60)

    /// `progress` hears what takes long at open (the full check after an unclean shutdown).
    public init(databasePath: String, ownership: Ownership, notifier: KernelCacheNotifier, limit: Int64? = nil,
                nodes: NodeTable, progress: @escaping (String) -> Void = { _ in }) {
        self.notifier = notifier
        self.limit = limit
        self.nodes = nodes
        do {
            store = try CacheStore(path: databasePath, owner: (ownership.uid, ownership.gid),
                                   holders: KernelHolders(SubtreeNodes(table: nodes, space: .cache)), progress: progress)
            problem = nil
        } catch {
            store = nil
            problem = error.description
            Log.error("\(error.description); cache/ answers EIO, the file is left as it is")
        }
        guard store != nil else { return }
        // Groups of changes are committed, buffered writes stored, and the write-ahead log
        // checkpointed, by a thread of their own (the store commits at fsync by itself).
        // It holds the store only while it waits; idle (nothing to commit or copy), it
        // sleeps until a group opens, or an hour.
        let committer = Threads.start { [weak self] in
            while true {
                guard let self, self.running.load(ordering: .relaxed), let store = self.store else { return }
                _ = consume self
                store.committingPass(idleSleep: Self.idleSleep)
            }
        }
        // Expiry, the size limit, and the deletion of big files' data in slices (with the
        // space given back) are kept by a thread of their own, asleep until the next file
        // expires or the store says there is work (a group committed, data to delete, an
        // expiry set), and then at most twice a second; slices run back to back with a pause
        // between them, in which requests take the store first.
        let wakeup = self.maintenanceWakeup
        store?.onBackgroundWork = { wakeup.wake() }
        let maintainer = Threads.start { [weak self] in
            var lastPass = ContinuousClock.now - .seconds(1)
            while true {
                guard let deadline = self?.maintenanceDeadline() else { return }
                wakeup.wait(until: deadline)
                guard self?.running.load(ordering: .relaxed) == true else { return }
                let pause = Duration.milliseconds(500) - lastPass.duration(to: .now)
                if pause > .zero { usleep(UInt32(pause.components.attoseconds / 1_000_000_000_000)) }
                guard let self, self.running.load(ordering: .relaxed), let store = self.store else { return }
                lastPass = .now
                let removed = store.maintain(limit: self.limit)
                for (parent, name) in removed {
                    self.notifier.invalidateEntry(parent: self.space.inode(UInt64(parent)), name: name)
                }
                while self.running.load(ordering: .relaxed) && store.reclaimStep() { usleep(2_000) }
            }
        }
        threads.withLock { $0 = [committer, maintainer].compactMap { $0 } }
    }

    /// Idle, the committing thread sleeps this long at most (it is woken when a group opens).
    static let idleSleep = 3600.0
    /// A wait for an expiry is cut to this: the wall clock may be set meanwhile.
    static let longestExpiryWait = Duration.seconds(600)

    /// When the maintenance thread must next look (nil inside: only when woken); nil when
    /// the tree is shut down.
    func maintenanceDeadline() -> ContinuousClock.Instant?? {
        guard running.load(ordering: .relaxed), let store else { return nil }
        var deadlines: [ContinuousClock.Instant] = []
        if let left = store.nextExpiry { deadlines.append(.now + min(left, Self.longestExpiryWait)) }
        if let reclaim = store.reclaimDue { deadlines.append(reclaim) }
        // Over the limit with only open files to evict: look again in a while.
        if let limit, store.linkedBytes > limit { deadlines.append(.now + .seconds(1)) }
        return .some(deadlines.min())
    }

    /// For `.mtmfs/status`.
    public func statusLines() -> [String] {
        guard let store else { return ["cache_error=\(problem ?? "unavailable")"] }
        let usage = store.usage()
        var lines = ["cache_files=\(usage.files)", "cache_bytes=\(usage.bytes)",
                     "cache_check=\(store.checkedAtOpen ? "full" : "quick")", "cache_reclaiming=\(store.reclaimPending)"]
        if let limit { lines.append("cache_limit=\(limit)") }
        let removals = store.removals()
        lines += ["cache_evictions=\(removals.evictions)", "cache_expired=\(removals.expirations)"]
        let activity = store.activity()
        lines += ["cache_data_files_open=\(activity.dataFiles)", "cache_committer_wakes=\(activity.committerWakes)"]
        return lines
    }

    func storeOrEIO() throws(Errno) -> CacheStore {
        guard let store else { throw .ioError }
        return store
    }

    func ino(_ inode: InodeNumber) -> Int64 { Int64(space.local(inode)) }

    func attributes(_ inode: CacheInode) -> Attributes {
        func time(_ ns: Int64) -> Timestamp {
            // Floor division: times before 1970 keep nanoseconds in 0 ..< 1e9.
            var seconds = ns / 1_000_000_000, rest = ns % 1_000_000_000
            if rest < 0 { seconds -= 1; rest += 1_000_000_000 }
            return Timestamp(seconds: seconds, nanoseconds: rest)
        }
        var attributes = Attributes(inode: space.inode(UInt64(inode.ino)), mode: inode.mode, linkCount: UInt32(max(0, inode.links)),
                                    uid: inode.uid, gid: inode.gid, size: UInt64(max(0, inode.size)),
                                    accessTime: time(inode.accessNanoseconds), modificationTime: time(inode.modificationNanoseconds),
                                    changeTime: time(inode.changeNanoseconds))
        // What is stored or preallocated, not the length: `du` of a sparse file shows its data.
        attributes.blocks = (UInt64(max(0, inode.storedBytes)) + 511) / 512
        attributes.device = UInt64(bitPattern: inode.device)
        return attributes
    }

    /// An entry handed to the kernel (its lookup reference was taken in the store's lock).
    func entry(_ inode: CacheInode) -> Entry {
        Entry(attributes: attributes(inode), cache: Self.cache)
    }

    public func lookup(parent: InodeNumber, name: String, context: RequestContext) throws(Errno) -> Entry {
        entry(try storeOrEIO().lookup(parent: ino(parent), name: name, reference: true))
    }

    /// An unlinked file the kernel held goes now, unless a handle keeps it.
    public func lastReferenceGone(_ inode: InodeNumber) {
        store?.unheld(ino(inode))
    }

    public func attributes(of inode: InodeNumber, context: RequestContext) throws(Errno) -> (Attributes, CachePolicy) {
        if inode == space.root, store == nil {
            return (Ownership(uid: getuid(), gid: getgid(), since: .now()).directory(inode), .short)
        }
        return (attributes(try storeOrEIO().inode(ino(inode))), Self.cache)
    }

    public func setAttributes(of inode: InodeNumber, _ changes: AttributeChanges, handle: UInt64?,
                              context: RequestContext) throws(Errno) -> (Attributes, CachePolicy) {
        func ns(_ t: Timestamp?) -> Int64? {
            // Nanoseconds since 1970 reach from 1677 to 2262: times beyond are clamped.
            t.map { t in
                let (product, overflow) = t.seconds.multipliedReportingOverflow(by: 1_000_000_000)
                if overflow { return t.seconds < 0 ? Int64.min : Int64.max }
                let (sum, overflow2) = product.addingReportingOverflow(t.nanoseconds)
                return overflow2 ? Int64.max : sum
            }
        }
        let updated = try storeOrEIO().setAttributes(ino(inode), CacheAttributeChanges(
            mode: changes.mode, uid: changes.uid, gid: changes.gid, size: changes.size.map { Int64(clamping: $0) },
            accessNanoseconds: ns(changes.accessTime), modificationNanoseconds: ns(changes.modificationTime)))
        return (attributes(updated), Self.cache)
    }

    public func readLink(_ inode: InodeNumber, context: RequestContext) throws(Errno) -> String {
        guard let target = try storeOrEIO().inode(ino(inode)).target else { throw .invalidArgument }
        return target
    }

    /// Regular files, FIFOs and sockets; block and character device nodes for root only
    /// (CAP_MKNOD on ext4). Nodes are stored with their device number; the mount is
    /// `nodev`, so the kernel never opens one as a device.
    public func makeNode(parent: InodeNumber, name: String, mode: mode_t, device: dev_t,
                         context: RequestContext) throws(Errno) -> Entry {
        let type = mode & S_IFMT
        if (type == S_IFBLK || type == S_IFCHR) && context.uid != 0 { throw .notPermitted }
        return entry(try storeOrEIO().create(parent: ino(parent), name: name, mode: mode, uid: context.uid, gid: context.gid,
                                      device: Int64(device), reference: true))
    }

    public func makeDirectory(parent: InodeNumber, name: String, mode: mode_t,
                              context: RequestContext) throws(Errno) -> Entry {
        entry(try storeOrEIO().create(parent: ino(parent), name: name, mode: S_IFDIR | (mode & 0o7777),
                                      uid: context.uid, gid: context.gid, reference: true))
    }

    public func unlink(parent: InodeNumber, name: String, context: RequestContext) throws(Errno) {
        try storeOrEIO().unlink(parent: ino(parent), name: name)
    }

    public func removeDirectory(parent: InodeNumber, name: String, context: RequestContext) throws(Errno) {
        try storeOrEIO().removeDirectory(parent: ino(parent), name: name)
    }

    public func makeSymbolicLink(target: String, parent: InodeNumber, name: String,
                                 context: RequestContext) throws(Errno) -> Entry {
        guard target.utf8.count <= 4095 else { throw .nameTooLong }
        return entry(try storeOrEIO().create(parent: ino(parent), name: name, mode: S_IFLNK | 0o777, uid: context.uid,
                                             gid: context.gid, target: target, reference: true))
    }

    public func rename(parent: InodeNumber, name: String, newParent: InodeNumber, newName: String,
                       flags: RenameFlags, context: RequestContext) throws(Errno) {
        try storeOrEIO().rename(parent: ino(parent), name: name, newParent: ino(newParent), newName: newName,
                                flags: flags.rawValue)
    }

    public func link(_ inode: InodeNumber, newParent: InodeNumber, newName: String,
                     context: RequestContext) throws(Errno) -> Entry {
        entry(try storeOrEIO().link(ino(inode), parent: ino(newParent), name: newName, reference: true))
    }

    public func open(_ inode: InodeNumber, flags: Int32, context: RequestContext) throws(Errno) -> OpenedFile {
        let store = try storeOrEIO()
        // libfuse negotiates atomic O_TRUNC: the truncation is ours to do, in the same visit
        // to the store as the open. Buffered writes reach SQLite at the last close (RELEASE)
        // or an fsync (which reports an error, as on ext4): a close sends no FLUSH.
        let file = try store.open(ino(inode), truncate: flags & O_TRUNC != 0 && flags & O_ACCMODE != O_RDONLY)
        // Device nodes are data here, never devices (the kernel refuses them first on nodev).
        if file.mode & S_IFMT == S_IFBLK || file.mode & S_IFMT == S_IFCHR {
            store.released(file.ino)
            throw .permissionDenied
        }
        return OpenedFile(handle: UInt64(flags & O_APPEND != 0 ? 1 : 0), keepCache: true, noFlush: true)
    }

    public func create(parent: InodeNumber, name: String, mode: mode_t, flags: Int32,
                       context: RequestContext) throws(Errno) -> (Entry, OpenedFile) {
        let store = try storeOrEIO()
        let file = try store.create(parent: ino(parent), name: name, mode: S_IFREG | (mode & 0o7777),
                                    uid: context.uid, gid: context.gid, reference: true, open: true)
        return (Entry(attributes: attributes(file), cache: Self.cache),
                OpenedFile(handle: UInt64(flags & O_APPEND != 0 ? 1 : 0), keepCache: true, noFlush: true))
    }

    public func read(_ inode: InodeNumber, handle: UInt64, offset: UInt64, size: Int, context: RequestContext,
                     reply: (UnsafeRawBufferPointer) -> Void) throws(Errno) {
        try storeOrEIO().read(ino(inode), offset: Int64(clamping: offset), size: size, into: reply)
    }

    public func write(_ inode: InodeNumber, handle: UInt64, offset: UInt64, data: UnsafeRawBufferPointer,
                      flags: Int32, context: RequestContext) throws(Errno) -> Int {
        try write(inode, handle: handle, offset: offset, data: data, flags: flags, droppingSetID: false).written
    }

    /// The store drops the set-ID bits with the write, knowing the mode from the file's
    /// buffers (no inode row read before every write of a normal user).
    public func writeDroppingSetID(_ inode: InodeNumber, handle: UInt64, offset: UInt64, data: UnsafeRawBufferPointer,
                                   flags: Int32, context: RequestContext) throws(Errno) -> (written: Int, modeChanged: Bool) {
        try write(inode, handle: handle, offset: offset, data: data, flags: flags, droppingSetID: true)
    }

    private func write(_ inode: InodeNumber, handle: UInt64, offset: UInt64, data: UnsafeRawBufferPointer, flags: Int32,
                       droppingSetID: Bool) throws(Errno) -> (written: Int, modeChanged: Bool) {
        try storeOrEIO().write(ino(inode), offset: Int64(clamping: offset), data: data,
                               append: handle == 1 || flags & O_APPEND != 0, droppingSetID: droppingSetID)
    }

    public func release(_ inode: InodeNumber, handle: UInt64, flags: Int32) {
        store?.released(ino(inode))
    }

    public func synchronize(_ inode: InodeNumber, handle: UInt64, dataOnly: Bool) throws(Errno) {
        try storeOrEIO().synchronize(ino(inode))
    }

    public func allocate(_ inode: InodeNumber, handle: UInt64, mode: Int32, offset: UInt64, length: UInt64,
                         context: RequestContext) throws(Errno) {
        try storeOrEIO().allocate(ino(inode), mode: mode, offset: Int64(clamping: offset), length: Int64(clamping: length))
    }

    public func seek(_ inode: InodeNumber, handle: UInt64, offset: UInt64, whence: Int32,
                     context: RequestContext) throws(Errno) -> UInt64 {
        UInt64(try storeOrEIO().seek(ino(inode), offset: Int64(clamping: offset), data: whence == SeekWhence.data))
    }

    public func copyRange(from source: InodeNumber, handle sourceHandle: UInt64, offset sourceOffset: UInt64,
                          to destination: InodeNumber, handle destinationHandle: UInt64, offset destinationOffset: UInt64,
                          length: Int, context: RequestContext) throws(Errno) -> Int {
        try storeOrEIO().copyRange(from: ino(source), offset: Int64(clamping: sourceOffset), to: ino(destination),
                                   offset: Int64(clamping: destinationOffset), length: length)
    }

    public func synchronizeDirectory(_ inode: InodeNumber) throws(Errno) {
        try storeOrEIO().synchronize()
    }

    public func listDirectory(_ inode: InodeNumber, context: RequestContext) throws(Errno) -> [DirectoryEntry] {
        try listDirectory(inode, after: nil, limit: Int.max, context: context)
    }

    /// Every directory of cache/ is read page by page from the database, by name.
    public func pagesListing(of inode: InodeNumber) -> Bool { store != nil }

    /// Each entry listed is counted as the kernel's reference in the same visit to the store
    /// as the listing: a name unlinked before the reply reaches the kernel keeps its inode
    /// (an orphan) until the kernel forgets it.
    public func countsListing(of inode: InodeNumber) -> Bool { store != nil }

    public func listDirectory(_ inode: InodeNumber, after name: String?, limit: Int,
                              context: RequestContext) throws(Errno) -> [DirectoryEntry] {
        try storeOrEIO().list(ino(inode), after: name, limit: limit, referencing: true).map {
            DirectoryEntry(name: $0.name, entry: Entry(attributes: attributes($0.inode), cache: Self.cache))
        }
    }

    public func setExtendedAttribute(_ inode: InodeNumber, name: String, value: [UInt8], flags: Int32,
                                     context: RequestContext) throws(Errno) {
        try storeOrEIO().setExtendedAttribute(ino(inode), name: name, value: value, flags: flags)
    }

    public func extendedAttribute(_ inode: InodeNumber, name: String, context: RequestContext) throws(Errno) -> [UInt8] {
        // `ls -l` and `cp` ask every file for security.* and ACLs: only user.* is ever
        // stored, so those are answered without touching the database.
        guard name.hasPrefix("user.") else { throw .noData }
        return try storeOrEIO().extendedAttribute(ino(inode), name: name)
    }

    /// Every name of cache/ comes through the kernel (no other program writes the tree,
    /// and the daemon's own removals only take names away): an absent name is remembered
    /// as long as a present one.
    public func absentNameTimeout(parent: InodeNumber) -> Double { Self.cache.entryTimeout }

    public func extendedAttributeNames(_ inode: InodeNumber, context: RequestContext) throws(Errno) -> [String] {
        try storeOrEIO().extendedAttributeNames(ino(inode))
    }

    public func removeExtendedAttribute(_ inode: InodeNumber, name: String, context: RequestContext) throws(Errno) {
        try storeOrEIO().removeExtendedAttribute(ino(inode), name: name)
    }

    /// Stops the committing and maintenance threads (a pass under way ends first), then
    /// closes the store: when the daemon exits, no thread of it holds the database.
    public func shutDown() {
        running.store(false, ordering: .relaxed)
        store?.wakeCommitter()
        maintenanceWakeup.wake()
        for thread in threads.withLock({ t in defer { t = [] }; return t }) { pthread_join(thread, nil) }
        try? store?.close()
    }
}

/// The kernel's references to `cache/`'s inodes, as the store asks for them: by row id.
///
/// Thread-safety: the table is thread-safe.
final class KernelHolders: InodeHolders {
    let nodes: SubtreeNodes

    init(_ nodes: SubtreeNodes) { self.nodes = nodes }

    func hold(_ ino: Int64) { nodes.reference(LocalInode(UInt64(ino))) }
    func isHeld(_ ino: Int64) -> Bool { nodes.isReferenced(LocalInode(UInt64(ino))) }
}
