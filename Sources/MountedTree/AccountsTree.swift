#if canImport(Glibc)
import Glibc
#endif
import CredentialVault
import FuseLowLevel
import Posix
import Synchronization

/// The two views of the active account: `accounts/active` and
/// `settings/ActiveServiceAccountUUID` are one value, kept in the settings store.
public struct ActiveAccountLink: Sendable {
    public var get: @Sendable () -> String?
    public var set: @Sendable (String) throws(Errno) -> Void

    public init(get: @escaping @Sendable () -> String?, set: @escaping @Sendable (String) throws(Errno) -> Void) {
        self.get = get
        self.set = set
    }
}

/// `accounts/`: one directory per service account of the credential vault, one file per
/// field (SPEC §1–§3).
///
/// Locked, the account names (UUIDs) and field names are listed with size 0, and every
/// read, write, mkdir and rmdir gets EACCES. Unlocked, fields read as their value plus one
/// newline; writes go to a pending buffer in secure memory, are checked against the field's
/// syntax (EINVAL) and size (EFBIG), and are sealed into the vault at flush, fsync or last
/// close. `url` reads as protocol://server[:port]path and a write sets those four at once.
/// Editors' scratch files live in secure memory only. While unlocked the kernel may keep a
/// field's pages for readers (see `PageCacheGate`; writers use direct I/O); every lock drops
/// the pages and attributes of every field before it returns, so a descriptor or mapping
/// made before a lock gets EACCES (SIGBUS) or nothing on its next read.
///
/// Thread-safety: one mutex; kernel notifications are sent after it is released.
public final class AccountsTree: Subtree {
    public let name = "accounts"
    public let space = InodeSpace.accounts
    let notifier: KernelCacheNotifier
    let active: ActiveAccountLink
    /// Readers keep the kernel's pages of a field until it changes or the vault locks.
    let pageCache = PageCacheGate()
    let state: Locked<State>
    private let running = Atomic<Bool>(true)

    static let fieldNames = AccountField.allCases.map(\.rawValue) + ["url"]
    static let urlIndex = AccountField.allCases.count
    static let directoryCache = CachePolicy(entryTimeout: 1, attributeTimeout: 1)
    /// Field attributes (sizes) may be cached while unlocked: every commit and every lock
    /// invalidates them, so a lock shows sizes 0 at once.
    static let fieldCache = CachePolicy(entryTimeout: 1, attributeTimeout: 1)
    /// Locked, a field's size (0) is not cached: a read through a descriptor from before the
    /// lock then asks for it again (with its handle), and is refused.
    static let lockedFieldCache = CachePolicy(entryTimeout: 1, attributeTimeout: 0)
    static let activeInode: UInt64 = 2
    static let scratchBit: UInt64 = 1 << 54

    /// Set by SIGUSR1's handler; the watcher locks on seeing it.
    public static let lockRequested = Atomic<Bool>(false)

    public init(vaultPath: String, ownership: Ownership, notifier: KernelCacheNotifier, active: ActiveAccountLink,
                autoLockSeconds: Int) {
        self.notifier = notifier
        self.active = active
        self.state = Locked(State(vaultPath: vaultPath, ownership: ownership, space: .accounts, autoLockSeconds: autoLockSeconds))
        Threads.detach { [weak self] in
            while true {
                usleep(100_000)
                guard let self, self.running.load(ordering: .relaxed) else { return }
                if Self.lockRequested.exchange(false, ordering: .relaxed) {
                    self.lock(reason: "SIGUSR1")
                } else if self.state.withLock({ $0.autoLockDue }) {
                    self.lock(reason: "auto-lock after \(self.state.withLock { $0.autoLockSeconds }) s without a secret access")
                }
            }
        }
    }

    public func shutDown() {
        running.store(false, ordering: .relaxed)
        lock(reason: "unmount")
    }

    // MARK: Lock and unlock

    /// Unlocks with a passphrase (already in secure memory). Wrong: EACCES; damaged: EIO.
    /// The key derivation runs outside the state lock: requests of accounts/ go on meanwhile.
    public func unlock(passphrase: SecureBytes) throws(Errno) {
        defer { SecureBytes.burnStack() }
        guard let vault = state.withLock({ $0.vault }) else { throw .ioError }
        let kek: SecureBytes
        do throws(VaultError) {
            kek = try vault.passphraseKey(passphrase)
        } catch {
            throw error.errno
        }
        // Sizes cached as 0 while locked are dropped, so `ls -l` right after shows the real ones.
        let fields = try state.withLock { (s) throws(Errno) -> [InodeNumber] in
            guard s.vault === vault else {
                kek.wipe()
                throw .tryAgain
            }
            do throws(VaultError) {
                try vault.unlock(withPassphraseKey: kek)
            } catch {
                if case .damaged = error { s.damage(error.description) }
                Log.warning(error == .wrongPassphrase ? "unlock refused: wrong passphrase" : error.description)
                throw error.errno
            }
            s.lastSecretAccess = .now
            s.revealing = true
            return s.uuidOf.keys.flatMap { id in
                (0...AccountsTree.urlIndex).map { index in s.space.inode(id << 8 | UInt64(index + 1)) }
            }
        }
        // The kernel forgets the locked sizes (0) before any request sees the vault open: an
        // invalidation landing while a reader's GETATTR is on its way makes the kernel drop
        // that answer and keep size 0, and the read after an unlock read nothing (found by
        // the concurrency suite). Meanwhile fields still answer as locked.
        pageCache.changed()
        for inode in fields { notifier.invalidateInode(inode) }
        notifier.drain()
        state.withLock { s in
            s.revealing = false
            Log.info("accounts unlocked")
        }
    }

    /// Zeroes every key and plaintext, and tells the kernel to forget every field.
    public func lock(reason: String) {
        defer { SecureBytes.burnStack() }
        let inodes = state.withLock { s -> [InodeNumber] in
            let wasUnlocked = s.vault?.isUnlocked == true
            let inodes = s.lockAll()
            if wasUnlocked { Log.info("accounts locked (\(reason))") }
            return inodes
        }
        pageCache.changed()
        for inode in inodes { notifier.invalidateInode(inode) }
        notifier.drain()
    }

    /// For `.mtmfs/status`.
    public func statusLines() -> [String] {
        state.withLock { s in
            let unlocked = s.vault?.isUnlocked == true
            var lines = ["state=\(unlocked ? "unlocked" : "locked")"]
            var autoLockIn = 0
            if unlocked && s.autoLockSeconds > 0 {
                autoLockIn = max(0, Int((Double(s.autoLockSeconds) - s.lastSecretAccess.secondsElapsed).rounded(.up)))
            }
            lines.append("auto_lock_in=\(autoLockIn)")
            lines.append("accounts=\(s.vault?.accountCount ?? 0)")
            if let problem = s.problem { lines.append("vault_error=\(problem)") }
            return lines
        }
    }

    private func locked<T: Sendable>(_ body: (inout State) throws(Errno) -> T) throws(Errno) -> T {
        let (result, invalidations) = try state.withLock { (s) throws(Errno) -> (T, [InodeNumber]) in
            guard s.vault != nil else { throw .ioError }
            let result = try body(&s)
            defer { s.invalidations.removeAll() }
            return (result, s.invalidations)
        }
        if !invalidations.isEmpty { pageCache.changed() }
        for inode in invalidations { notifier.invalidateInode(inode) }
        return result
    }

    // MARK: FileSystem

    public func lookup(parent: InodeNumber, name: String, context: RequestContext) throws(Errno) -> Entry {
        let parentLocal = space.local(parent)
        if parentLocal == 1 && name == "active" {
            guard let target = active.get(), !target.isEmpty else { throw .noSuchFileOrDirectory }
            return Entry(attributes: state.withLock { $0.symlinkAttributes(target) }, cache: .none)
        }
        return try locked { (s) throws(Errno) in try s.lookup(parentLocal, name) }
    }

    public func attributes(of inode: InodeNumber, context: RequestContext) throws(Errno) -> (Attributes, CachePolicy) {
        let local = state.withLock { $0.resolve(space.local(inode)) }
        if local == 1 { return (state.withLock { $0.ownership.directory(inode, mode: 0o700) }, Self.directoryCache) }
        if local == Self.activeInode {
            guard let target = active.get(), !target.isEmpty else { throw .noSuchFileOrDirectory }
            return (state.withLock { $0.symlinkAttributes(target) }, .none)
        }
        return try locked { (s) throws(Errno) in
            // Through a descriptor from before a lock: refused. The kernel asks this before
            // it reads cached pages past the size it knows, so such a descriptor's read fails
            // with EACCES rather than reading nothing (the size is 0 while locked).
            if let handle = context.fileHandle, !s.isCurrent(handle) { throw .permissionDenied }
            let entry = try s.entry(s.resolve(local))
            return (entry.attributes, entry.cache)
        }
    }

    public func setAttributes(of inode: InodeNumber, _ changes: AttributeChanges, handle: UInt64?,
                              context: RequestContext) throws(Errno) -> (Attributes, CachePolicy) {
        defer { SecureBytes.burnStack() }
        return try locked { (s) throws(Errno) in
            let local = s.resolve(space.local(inode))
            if let uid = changes.uid, uid != s.ownership.uid { throw .notPermitted }
            if let gid = changes.gid, gid != s.ownership.gid { throw .notPermitted }
            if let size = changes.size { try s.truncate(local, to: Int(clamping: size), deferred: handle != nil, owner: handle ?? 0) }
            let entry = try s.entry(local)
            return (entry.attributes, entry.cache)
        }
    }

    public func readLink(_ inode: InodeNumber, context: RequestContext) throws(Errno) -> String {
        let local = state.withLock { $0.resolve(space.local(inode)) }
        if local == Self.activeInode {
            guard let target = active.get(), !target.isEmpty else { throw .noSuchFileOrDirectory }
            return target
        }
        return try locked { (s) throws(Errno) in
            guard let target = s.scratch[local]?.symlink else { throw .invalidArgument }
            return target
        }
    }

    public func makeDirectory(parent: InodeNumber, name: String, mode: mode_t,
                              context: RequestContext) throws(Errno) -> Entry {
        guard space.local(parent) == 1 else { throw .permissionDenied }
        return try locked { (s) throws(Errno) in try s.makeAccount(name) }
    }

    public func removeDirectory(parent: InodeNumber, name: String, context: RequestContext) throws(Errno) {
        guard space.local(parent) == 1 else { throw .notDirectory }
        try locked { (s) throws(Errno) in try s.removeAccount(name) }
    }

    public func unlink(parent: InodeNumber, name: String, context: RequestContext) throws(Errno) {
        defer { SecureBytes.burnStack() }
        let parentLocal = space.local(parent)
        if parentLocal == 1 && name == "active" {
            guard active.get()?.isEmpty == false else { throw .noSuchFileOrDirectory }
            try active.set("")
            return
        }
        try locked { (s) throws(Errno) in try s.unlink(parentLocal, name) }
    }

    public func makeSymbolicLink(target: String, parent: InodeNumber, name: String,
                                 context: RequestContext) throws(Errno) -> Entry {
        let parentLocal = space.local(parent)
        if parentLocal == 1 && name == "active" {
            guard active.get()?.isEmpty != false else { throw .fileExists }
            try setActive(target)
            return Entry(attributes: state.withLock { $0.symlinkAttributes(target) }, cache: .none)
        }
        return try locked { (s) throws(Errno) in try s.makeScratchSymlink(target, in: parentLocal, name) }
    }

    private func setActive(_ target: String) throws(Errno) {
        guard target.isEmpty || AccountName.uuidBytes(target) != nil else { throw .invalidArgument }
        try active.set(target)
    }

    public func rename(parent: InodeNumber, name: String, newParent: InodeNumber, newName: String,
                       flags: RenameFlags, context: RequestContext) throws(Errno) {
        defer { SecureBytes.burnStack() }
        let from = space.local(parent), to = space.local(newParent)
        if from == 1 && to == 1 && newName == "active" {
            // `ln -sfn UUID accounts/active` makes a temporary link and renames it over.
            let target = try locked { (s) throws(Errno) -> String in
                guard let local = s.scratchIn[0]?[name], let target = s.scratch[local]?.symlink else { throw .invalidArgument }
                return target
            }
            try setActive(target)
            try locked { (s) throws(Errno) in
                // The kernel now knows the temporary link's inode as `active`.
                if let local = s.scratchIn[0]?[name] { s.alias[local] = Self.activeInode }
                s.dropScratch(in: 0, name)
            }
            return
        }
        try locked { (s) throws(Errno) in try s.rename(from, name, to, newName, flags: flags) }
    }

    public func link(_ inode: InodeNumber, newParent: InodeNumber, newName: String,
                     context: RequestContext) throws(Errno) -> Entry {
        throw .notPermitted
    }

    public func open(_ inode: InodeNumber, flags: Int32, context: RequestContext) throws(Errno) -> OpenedFile {
        defer { SecureBytes.burnStack() }
        let opened = try locked { (s) throws(Errno) -> OpenedFile in
            let local = s.resolve(space.local(inode))
            try s.requireUnlocked()
            guard !s.isDirectory(local) else { throw .isDirectory }
            let handle = s.newHandle()
            if flags & O_TRUNC != 0 && flags & O_ACCMODE != O_RDONLY { try s.truncate(local, to: 0, deferred: true, owner: handle) }
            s.lastSecretAccess = .now
            guard flags & O_ACCMODE == O_RDONLY else { return OpenedFile(handle: handle, directIO: true) }
            // A reader reads the kernel's pages of the field while it has not changed (every
            // lock drops them all), and its close commits nothing: no READ, no FLUSH.
            return OpenedFile(handle: handle, keepCache: true, noFlush: true)
        }
        if opened.keepCache { pageCache.admit(inode, notifier: notifier) }
        return opened
    }

    public func create(parent: InodeNumber, name: String, mode: mode_t, flags: Int32,
                       context: RequestContext) throws(Errno) -> (Entry, OpenedFile) {
        try locked { (s) throws(Errno) in
            let entry = try s.create(space.local(parent), name, exclusive: flags & O_EXCL != 0)
            let handle = s.newHandle()
            if flags & O_TRUNC != 0 { try s.truncate(space.local(entry.inode), to: 0, deferred: true, owner: handle) }
            return (entry, OpenedFile(handle: handle, directIO: true))
        }
    }

    public func read(_ inode: InodeNumber, handle: UInt64, offset: UInt64, size: Int,
                     context: RequestContext) throws(Errno) -> [UInt8] {
        // Never used: the reply-by-pointer form below keeps secrets out of Swift arrays.
        throw .ioError
    }

    public func read(_ inode: InodeNumber, handle: UInt64, offset: UInt64, size: Int, context: RequestContext,
                     reply: (UnsafeRawBufferPointer) -> Void) throws(Errno) {
        defer { SecureBytes.burnStack() }
        try state.withLock { (s) throws(Errno) in
            guard s.vault != nil else { throw .ioError }
            let local = s.resolve(space.local(inode))
            try s.requireUnlocked()
            guard s.isCurrent(handle) else { throw .permissionDenied }  // opened before a lock
            s.lastSecretAccess = .now
            try s.withReadableContent(local) { bytes in
                guard offset < UInt64(bytes.count) else { return reply(UnsafeRawBufferPointer(start: nil, count: 0)) }
                let start = Int(offset)
                reply(UnsafeRawBufferPointer(rebasing: bytes[start..<min(bytes.count, start + size)]))
            }
        }
    }

    public func write(_ inode: InodeNumber, handle: UInt64, offset: UInt64, data: UnsafeRawBufferPointer,
                      flags: Int32, context: RequestContext) throws(Errno) -> Int {
        defer { SecureBytes.burnStack() }
        return try locked { (s) throws(Errno) in
            let local = s.resolve(space.local(inode))
            try s.requireUnlocked()
            guard s.isCurrent(handle) else { throw .permissionDenied }  // opened before a lock
            s.lastSecretAccess = .now
            // The bytes sit in libfuse's receive buffer: once copied into secure memory,
            // they are zeroed there so that no plaintext lingers in an idle worker's buffer.
            defer { if let base = data.baseAddress { SecureBytes.zero(UnsafeMutableRawPointer(mutating: base), data.count) } }
            try s.write(local, at: offset, data, append: flags & O_APPEND != 0, owner: handle)
            return data.count
        }
    }

    public func flush(_ inode: InodeNumber, handle: UInt64, context: RequestContext) throws(Errno) {
        defer { SecureBytes.burnStack() }
        try locked { (s) throws(Errno) in
            // Written before a lock: the lock discarded it, and the writer hears so here.
            if !s.isCurrent(handle) { throw .permissionDenied }
            try s.commit(s.resolve(space.local(inode)), finalClose: false, by: handle)
        }
    }

    public func release(_ inode: InodeNumber, handle: UInt64, flags: Int32) {
        defer { SecureBytes.burnStack() }
        _ = try? locked { (s) throws(Errno) in try s.commit(s.resolve(space.local(inode)), finalClose: true, by: handle) }
    }

    public func synchronize(_ inode: InodeNumber, handle: UInt64, dataOnly: Bool) throws(Errno) {
        defer { SecureBytes.burnStack() }
        try locked { (s) throws(Errno) in try s.commit(s.resolve(space.local(inode)), finalClose: false, by: handle) }
    }

    public func listDirectory(_ inode: InodeNumber, context: RequestContext) throws(Errno) -> [DirectoryEntry] {
        let local = space.local(inode)
        let activeTarget = local == 1 ? active.get() : nil
        var entries = try locked { (s) throws(Errno) in try s.list(local) }
        if let activeTarget, !activeTarget.isEmpty {
            let attributes = state.withLock { $0.symlinkAttributes(activeTarget) }
            entries.insert(DirectoryEntry(name: "active", entry: Entry(attributes: attributes, cache: .none)), at: 0)
        }
        return entries
    }
}

extension AccountsTree {
    /// Content written to a field and not yet sealed.
    struct Pending: @unchecked Sendable {
        var bytes: SecureBytes
        var written = false
        var rejected = false
        /// The handle that truncated or wrote it (0: a truncate without one): only its
        /// close commits it, never another descriptor's late release.
        var owner: UInt64 = 0
    }

    /// An editor's file in an account directory (or a temporary symlink at the top).
    struct Scratch: @unchecked Sendable {
        var account: UInt64
        var name: String
        var bytes = SecureBytes()
        var symlink: String?
        /// The field this is the renamed-away original of (vim's and emacs's `field~`).
        var detachedFrom: UInt64?
        var written = false
    }

    struct State: @unchecked Sendable {
        let vaultPath: String
        let ownership: Ownership
        let space: InodeSpace
        var autoLockSeconds: Int
        var vault: Vault?
        var problem: String?
        /// Unlocked, but the kernel's caches of the locked state are still being dropped:
        /// fields answer as locked until then (see `unlock`).
        var revealing = false
        /// Fields can be read and written.
        var isOpen: Bool { vault?.isUnlocked == true && !revealing }
        var accountID: [[UInt8]: UInt64] = [:]
        var uuidOf: [UInt64: [UInt8]] = [:]
        var nextAccountID: UInt64 = 1
        var pending: [UInt64: Pending] = [:]
        /// Where a field's text is composed for getattr and read (see `withReadableContent`).
        let readBuffer = SecureBytes(count: 0)
        var hidden: Set<UInt64> = []
        var scratch: [UInt64: Scratch] = [:]
        var scratchIn: [UInt64: [String: UInt64]] = [:]
        var alias: [UInt64: UInt64] = [:]
        var modified: [UInt64: Timestamp] = [:]
        var nextScratch: UInt64 = 1
        var lastSecretAccess = ContinuousClock.now
        /// Counts locks: a handle opened under another generation is refused (EACCES).
        var generation: UInt64 = 1
        var nextHandle: UInt64 = 1

        /// A new handle: the lock generation in the high bits, a counter in the low ones.
        mutating func newHandle() -> UInt64 {
            nextHandle += 1
            return generation << 40 | (nextHandle & ((1 << 40) - 1))
        }

        func isCurrent(_ handle: UInt64) -> Bool { handle >> 40 == generation }
        var invalidations: [InodeNumber] = []

        init(vaultPath: String, ownership: Ownership, space: InodeSpace, autoLockSeconds: Int) {
            self.vaultPath = vaultPath
            self.ownership = ownership
            self.space = space
            self.autoLockSeconds = autoLockSeconds
            // A save cut short by a kill leaves its (sealed) temporary file behind.
            AtomicFile.removeStaleTemporaries(of: vaultPath)
            do {
                vault = try Vault(path: vaultPath)
            } catch {
                damage(error.description)
            }
        }

        mutating func damage(_ message: String) {
            problem = message
            vault?.lock()
            vault = nil
            Log.error("\(message); accounts/ answers EIO, the vault file is left as it is")
        }

        var autoLockDue: Bool {
            guard autoLockSeconds > 0, vault?.isUnlocked == true else { return false }
            return lastSecretAccess.secondsElapsed >= Double(autoLockSeconds)
        }

        /// Locks and returns every inode whose kernel copy must go.
        mutating func lockAll() -> [InodeNumber] {
            vault?.lock()
            revealing = false
            var inodes: [InodeNumber] = []
            for (_, value) in pending { value.bytes.wipe() }
            pending.removeAll()
            for (local, value) in scratch {
                value.bytes.wipe()
                inodes.append(space.inode(local))
            }
            scratch.removeAll()
            scratchIn.removeAll()
            hidden.removeAll()
            for local in alias.keys { inodes.append(space.inode(local)) }
            alias.removeAll()
            generation += 1
            for id in uuidOf.keys {
                for index in 0...AccountsTree.urlIndex { inodes.append(space.inode(id << 8 | UInt64(index + 1))) }
            }
            return inodes
        }

        func requireUnlocked() throws(Errno) {
            guard isOpen else { throw .permissionDenied }
        }

        // MARK: Inodes

        mutating func id(of uuid: [UInt8]) -> UInt64 {
            if let id = accountID[uuid] { return id }
            let id = nextAccountID
            nextAccountID += 1
            accountID[uuid] = id
            uuidOf[id] = uuid
            return id
        }

        func resolve(_ local: UInt64) -> UInt64 { alias[local] ?? local }

        func isDirectory(_ local: UInt64) -> Bool { local & AccountsTree.scratchBit == 0 && local & 0xFF == 0 && local != 0 }

        /// (account id, field index) of a field inode.
        func field(_ local: UInt64) -> (UInt64, Int)? {
            guard local & AccountsTree.scratchBit == 0, local > 0xFF else { return nil }
            let index = Int(local & 0xFF) - 1
            guard index >= 0, index <= AccountsTree.urlIndex, uuidOf[local >> 8] != nil else { return nil }
            return (local >> 8, index)
        }

        func fieldInode(_ account: UInt64, _ index: Int) -> UInt64 { account << 8 | UInt64(index + 1) }

        func account(named name: String) -> (uuid: [UInt8], name: String)? {
            vault?.account(named: name)
        }

        func symlinkAttributes(_ target: String) -> Attributes {
            var attributes = ownership.file(space.inode(AccountsTree.activeInode), mode: 0o777, size: UInt64(target.utf8.count))
            attributes.mode = S_IFLNK | 0o777
            return attributes
        }

        // MARK: Content

        /// The bytes a read sees: pending content, else the value plus a newline (locked: none).
        /// The caller wipes it when `isTemporaryContent`.
        func content(_ local: UInt64) throws(Errno) -> SecureBytes {
            if let scratch = scratch[local] {
                if let target = scratch.symlink { return Array(target.utf8).withUnsafeBytes { SecureBytes(copying: $0) } }
                return scratch.bytes
            }
            if let pending = pending[local] { return pending.bytes }
            return try withReadableContent(local) { SecureBytes(copying: $0) }
        }

        /// Content made for one read (not pending or scratch): wipe after use.
        func isTemporaryContent(_ local: UInt64) -> Bool { scratch[local] == nil && pending[local] == nil }

        func size(_ local: UInt64) -> UInt64 {
            guard isOpen else { return 0 }
            return UInt64((try? withReadableContent(local) { $0.count }) ?? 0)
        }

        /// Runs `body` on a field's text (value and newline) without a new allocation: a
        /// field's text is composed in `readBuffer`, secure memory made once and zeroed after
        /// every use. (A fresh sodium_malloc per getattr and read — mmap, mprotect, mlock,
        /// munmap with TLB shootdowns — was most of the daemon's time in `cat` of a field.)
        func withReadableContent<T>(_ local: UInt64, _ body: (UnsafeRawBufferPointer) -> T) throws(Errno) -> T {
            if let scratch = scratch[local] {
                guard let target = scratch.symlink else { return scratch.bytes.withUnsafeBytes(body) }
                return Array(target.utf8).withUnsafeBytes(body)  // a link target, not a secret
            }
            if let pending = pending[local] { return pending.bytes.withUnsafeBytes(body) }
            guard let (account, index) = field(local) else { throw .noSuchFileOrDirectory }
            guard let vault, vault.isUnlocked, let uuid = uuidOf[account] else {
                return body(UnsafeRawBufferPointer(start: nil, count: 0))
            }
            let out = readBuffer
            out.resize(to: 0)
            defer { out.resize(to: 0) }  // zeroes what was written, keeps the allocation
            do {
                func bytes(_ value: SecureBytes?, _ use: (UnsafeRawBufferPointer) -> Void) {
                    if let value { value.withUnsafeBytes(use) } else { use(UnsafeRawBufferPointer(start: nil, count: 0)) }
                }
                if index == AccountsTree.urlIndex {
                    let parts = try [AccountField.protocol, .server, .port, .path].map { (f) throws(VaultError) in
                        try vault.storedField(f, of: uuid)
                    }
                    bytes(parts[0]) { scheme in bytes(parts[1]) { server in bytes(parts[2]) { port in bytes(parts[3]) { path in
                        AccountFieldSyntax.composeURL(protocol: scheme, server: server, port: port, path: path, into: out)
                    } } } }
                } else {
                    bytes(try vault.storedField(AccountField.allCases[index], of: uuid)) { out.write($0, at: 0) }
                }
            } catch {
                throw error.errno
            }
            [UInt8(0x0A)].withUnsafeBytes { out.write($0, at: out.count) }
            return out.withUnsafeBytes(body)
        }

        func attributes(_ local: UInt64) throws(Errno) -> Attributes {
            let inode = space.inode(local)
            if isDirectory(local) {
                guard uuidOf[local >> 8] != nil else { throw .noSuchFileOrDirectory }
                return ownership.directory(inode, mode: 0o700)
            }
            if let scratch = scratch[local] {
                var attributes = ownership.file(inode, mode: 0o600, size: UInt64(scratch.bytes.count))
                if let target = scratch.symlink {
                    attributes.mode = S_IFLNK | 0o777
                    attributes.size = UInt64(target.utf8.count)
                }
                return attributes
            }
            guard field(local) != nil else { throw .noSuchFileOrDirectory }
            return ownership.file(inode, mode: 0o600, size: size(local), modified: modified[local])
        }

        func entry(_ local: UInt64) throws(Errno) -> Entry {
            let attributes = try attributes(local)
            if isDirectory(local) { return Entry(attributes: attributes, cache: AccountsTree.directoryCache) }
            return Entry(attributes: attributes, cache: isOpen ? AccountsTree.fieldCache : AccountsTree.lockedFieldCache)
        }

        // MARK: Names

        mutating func lookup(_ parent: UInt64, _ name: String) throws(Errno) -> Entry {
            if let local = scratchIn[parent == 1 ? 0 : parent >> 8]?[name], parent == 1 || isDirectory(parent) {
                return try entry(local)
            }
            if parent == 1 {
                guard let account = account(named: name) else { throw .noSuchFileOrDirectory }
                // Two statements: `entry(id(of:))` would read self before id(of:) mutates it.
                let local = id(of: account.uuid) << 8
                return try entry(local)
            }
            guard isDirectory(parent), uuidOf[parent >> 8] != nil else { throw .notDirectory }
            guard let index = AccountsTree.fieldNames.firstIndex(of: name) else { throw .noSuchFileOrDirectory }
            let local = fieldInode(parent >> 8, index)
            if hidden.contains(local) { throw .noSuchFileOrDirectory }
            return try entry(local)
        }

        mutating func list(_ local: UInt64) throws(Errno) -> [DirectoryEntry] {
            var entries: [DirectoryEntry] = []
            if local == 1 {
                for account in vault?.accounts ?? [] {
                    let local = id(of: account.uuid) << 8
                    entries.append(DirectoryEntry(name: account.name, entry: try entry(local)))
                }
                for (name, inode) in (scratchIn[0] ?? [:]).sorted(by: { $0.key < $1.key }) {
                    entries.append(DirectoryEntry(name: name, entry: try entry(inode)))
                }
                return entries
            }
            guard isDirectory(local), uuidOf[local >> 8] != nil else { throw .notDirectory }
            for (index, name) in AccountsTree.fieldNames.enumerated() where !hidden.contains(fieldInode(local >> 8, index)) {
                entries.append(DirectoryEntry(name: name, entry: try entry(fieldInode(local >> 8, index))))
            }
            for (name, inode) in (scratchIn[local >> 8] ?? [:]).sorted(by: { $0.key < $1.key }) {
                entries.append(DirectoryEntry(name: name, entry: try entry(inode)))
            }
            return entries
        }

        mutating func makeAccount(_ name: String) throws(Errno) -> Entry {
            try requireUnlocked()
            guard let uuid = AccountName.uuidBytes(name) else { throw .invalidArgument }
            guard let vault else { throw .ioError }
            if vault.hasAccount(uuid: uuid) { throw .fileExists }
            do {
                try vault.addAccount(uuid: uuid, name: name)
            } catch {
                throw error.errno
            }
            Log.debug("vault saved: account \(name) added (\(vault.accountCount) accounts)")
            let local = id(of: uuid) << 8
            return try entry(local)
        }

        mutating func removeAccount(_ name: String) throws(Errno) {
            try requireUnlocked()
            guard let account = account(named: name), let vault else {
                if scratchIn[0]?[name] != nil { throw .notDirectory }
                throw .noSuchFileOrDirectory
            }
            let id = id(of: account.uuid)
            if let names = scratchIn[id], !names.isEmpty { throw .directoryNotEmpty }
            // Fields always exist: an account with any value is not empty (`rm -r` clears
            // each field first, then removes the directory).
            for field in AccountField.allCases {
                let value: SecureBytes
                do { value = try vault.field(field, of: account.uuid) } catch { throw error.errno }
                if value.count > 0 { throw .directoryNotEmpty }
            }
            do {
                try vault.removeAccount(uuid: account.uuid)
            } catch {
                throw error.errno
            }
            Log.debug("vault saved: account \(name) removed (\(vault.accountCount) accounts)")
            for index in 0...AccountsTree.urlIndex {
                let local = fieldInode(id, index)
                pending.removeValue(forKey: local)?.bytes.wipe()
                hidden.remove(local)
                invalidations.append(space.inode(local))
            }
        }

        mutating func create(_ parent: UInt64, _ name: String, exclusive: Bool) throws(Errno) -> Entry {
            try requireUnlocked()
            guard parent != 1, isDirectory(parent), uuidOf[parent >> 8] != nil else { throw .permissionDenied }
            guard name.utf8.count <= 255 else { throw .nameTooLong }
            let account = parent >> 8
            if let existing = scratchIn[account]?[name] {
                if exclusive { throw .fileExists }
                return try entry(existing)
            }
            if let index = AccountsTree.fieldNames.firstIndex(of: name) {
                let local = fieldInode(account, index)
                if hidden.contains(local) {
                    // The editor recreates the field it renamed away: it shows again, empty
                    // until written; the sealed value stays until the new one is committed.
                    hidden.remove(local)
                    pending[local] = Pending(bytes: SecureBytes())
                } else if exclusive {
                    throw .fileExists
                }
                return try entry(local)
            }
            guard (scratchIn[account]?.count ?? 0) < 64 else { throw .noSpace }  // secure memory is precious
            let local = AccountsTree.scratchBit | nextScratch
            nextScratch += 1
            scratch[local] = Scratch(account: account, name: name)
            scratchIn[account, default: [:]][name] = local
            return try entry(local)
        }

        mutating func makeScratchSymlink(_ target: String, in parent: UInt64, _ name: String) throws(Errno) -> Entry {
            let account: UInt64
            if parent == 1 {
                account = 0
                if self.account(named: name) != nil { throw .fileExists }
            } else {
                try requireUnlocked()
                guard isDirectory(parent), uuidOf[parent >> 8] != nil else { throw .notDirectory }
                account = parent >> 8
                if AccountsTree.fieldNames.contains(name) { throw .fileExists }
            }
            if scratchIn[account]?[name] != nil { throw .fileExists }
            let local = AccountsTree.scratchBit | nextScratch
            nextScratch += 1
            scratch[local] = Scratch(account: account, name: name, symlink: target)
            scratchIn[account, default: [:]][name] = local
            return try entry(local)
        }

        mutating func dropScratch(in account: UInt64, _ name: String) {
            guard let local = scratchIn[account]?.removeValue(forKey: name) else { return }
            scratch.removeValue(forKey: local)?.bytes.wipe()
            invalidations.append(space.inode(local))
        }

        mutating func unlink(_ parent: UInt64, _ name: String) throws(Errno) {
            let owner: UInt64 = parent == 1 ? 0 : parent >> 8
            if let local = scratchIn[owner]?[name] {
                let detachedFrom = scratch[local]?.detachedFrom
                dropScratch(in: owner, name)
                // The renamed-away original deleted without the field being recreated: the
                // field is cleared (as the file would be gone).
                if let field = detachedFrom, hidden.contains(field) {
                    hidden.remove(field)
                    try setField(field, to: SecureBytes())
                }
                return
            }
            if parent == 1 {
                if account(named: name) != nil { throw .isDirectory }
                throw .noSuchFileOrDirectory
            }
            try requireUnlocked()
            guard let index = AccountsTree.fieldNames.firstIndex(of: name) else { throw .noSuchFileOrDirectory }
            let local = fieldInode(owner, index)
            guard !hidden.contains(local) else { throw .noSuchFileOrDirectory }
            // Fields always exist: removing one clears it (so `rm -r accounts/UUID` works).
            try setField(local, to: SecureBytes())
        }

        mutating func rename(_ from: UInt64, _ name: String, _ to: UInt64, _ newName: String, flags: RenameFlags) throws(Errno) {
            try requireUnlocked()
            guard from != 1, to != 1 else { throw .notPermitted }
            guard from >> 8 == to >> 8 else { throw .crossDevice }
            if flags.contains(.exchange) { throw .invalidArgument }
            let account = from >> 8
            let targetField = AccountsTree.fieldNames.firstIndex(of: newName).map { fieldInode(account, $0) }
            let targetScratch = scratchIn[account]?[newName]
            if flags.contains(.noReplace) && (targetScratch != nil || (targetField.map { !hidden.contains($0) } ?? false)) {
                throw .fileExists
            }
            if let source = scratchIn[account]?[name] {
                if let targetField {
                    guard scratch[source]?.symlink == nil else { throw .invalidArgument }
                    // `sed -i`, `mv tmp field`, vim restoring its backup: the field takes the
                    // content, validated; the scratch inode now stands for the field.
                    let bytes = scratch[source]!.bytes
                    try setField(targetField, to: bytes)
                    hidden.remove(targetField)
                    pending.removeValue(forKey: targetField)?.bytes.wipe()
                    dropScratch(in: account, name)
                    alias[source] = targetField
                    return
                }
                if targetScratch != nil { dropScratch(in: account, newName) }
                scratchIn[account]?[name] = nil
                scratchIn[account, default: [:]][newName] = source
                scratch[source]?.name = newName
                return
            }
            guard let index = AccountsTree.fieldNames.firstIndex(of: name) else { throw .noSuchFileOrDirectory }
            let field = fieldInode(account, index)
            guard !hidden.contains(field) else { throw .noSuchFileOrDirectory }
            guard targetField == nil else { throw .notPermitted }
            // `mv field field~` (vim, emacs): the field is hidden, its text lives on in the
            // scratch file until the editor has written the new one.
            if targetScratch != nil { dropScratch(in: account, newName) }
            let copy = try content(field)
            let bytes = isTemporaryContent(field) ? copy : copy.copy()
            let local = AccountsTree.scratchBit | nextScratch
            nextScratch += 1
            scratch[local] = Scratch(account: account, name: newName, bytes: bytes, detachedFrom: field)
            scratchIn[account, default: [:]][newName] = local
            hidden.insert(field)
            pending.removeValue(forKey: field)?.bytes.wipe()
        }

        // MARK: Writing

        mutating func truncate(_ local: UInt64, to size: Int, deferred: Bool, owner: UInt64 = 0) throws(Errno) {
            try requireUnlocked()
            guard size <= AccountFieldSyntax.maximumSize + 2 else { throw .fileTooLarge }
            if let value = scratch[local] {
                value.bytes.resize(to: size)
                return
            }
            guard field(local) != nil else { throw .noSuchFileOrDirectory }
            var value: Pending
            if let existing = pending[local] { value = existing } else { value = Pending(bytes: try content(local)) }
            value.bytes.resize(to: size)
            value.written = false
            value.rejected = false
            value.owner = owner
            pending[local] = value
            modified[local] = .now()
            if !deferred { try commit(local, finalClose: true, by: owner) }
        }

        mutating func write(_ local: UInt64, at offset: UInt64, _ data: UnsafeRawBufferPointer, append: Bool,
                            owner: UInt64) throws(Errno) {
            if let value = scratch[local] {
                let start = append ? value.bytes.count : Int(clamping: offset)
                guard start <= 16 << 20, data.count <= (16 << 20) - start else { throw .fileTooLarge }
                value.bytes.write(data, at: start)
                scratch[local]?.written = true
                return
            }
            guard let (_, index) = field(local) else { throw .noSuchFileOrDirectory }
            var value: Pending
            if let existing = pending[local] { value = existing } else { value = Pending(bytes: try content(local)) }
            value.owner = owner
            var start = append ? value.bytes.count : Int(clamping: offset)
            // An empty field reads as "\n": appending to it starts from nothing.
            if value.bytes.count == 1 && value.bytes.withUnsafeBytes({ $0[0] == 0x0A }) && (append || start == 1) {
                value.bytes.resize(to: 0)
                start = 0
            }
            guard start <= AccountFieldSyntax.maximumSize + 2, data.count <= AccountFieldSyntax.maximumSize + 2 - start else {
                value.rejected = true
                pending[local] = value
                throw .fileTooLarge
            }
            value.bytes.write(data, at: start)
            // A write that is the whole value (`echo v > field`) is checked at once.
            if start == 0 && data.count == value.bytes.count && !isValid(value.bytes, index) {
                value.bytes.resize(to: 0)
                value.rejected = true
                pending[local] = value
                throw .invalidArgument
            }
            value.written = true
            pending[local] = value
            modified[local] = .now()
        }

        func isValid(_ bytes: SecureBytes, _ index: Int) -> Bool {
            bytes.withUnsafeBytes { raw in
                let value = Self.withoutNewline(raw)
                if index == AccountsTree.urlIndex { return AccountFieldSyntax.parseURL(value) != nil }
                return AccountFieldSyntax.isValid(value, for: AccountField.allCases[index])
            }
        }

        static func withoutNewline(_ raw: UnsafeRawBufferPointer) -> UnsafeRawBufferPointer {
            var end = raw.count
            if end > 0 && raw[end - 1] == 0x0A {
                end -= 1
                if end > 0 && raw[end - 1] == 0x0D { end -= 1 }
            }
            return UnsafeRawBufferPointer(rebasing: raw[0..<end])
        }

        /// Seals pending content: what was written at any flush, a bare truncation only at
        /// the last close (shells open, dup2 and close before writing).
        mutating func commit(_ local: UInt64, finalClose: Bool, by handle: UInt64) throws(Errno) {
            guard let value = pending[local], value.owner == handle, value.written || value.rejected || finalClose else { return }
            pending[local] = nil
            defer { value.bytes.wipe() }
            if value.rejected { throw .invalidArgument }
            try setField(local, to: value.bytes)
        }

        /// Validates and seals one field's text (`url`: its four parts at once).
        mutating func setField(_ local: UInt64, to text: SecureBytes) throws(Errno) {
            guard let (account, index) = field(local), let uuid = uuidOf[account], let vault else { throw .noSuchFileOrDirectory }
            guard text.count <= AccountFieldSyntax.maximumSize + 2 else { throw .fileTooLarge }
            var changes: [AccountField: SecureBytes] = [:]
            defer { for (_, value) in changes { value.wipe() } }
            let ok: Bool = text.withUnsafeBytes { raw in
                let value = Self.withoutNewline(raw)
                if index == AccountsTree.urlIndex {
                    guard let parts = AccountFieldSyntax.parseURL(value) else { return false }
                    for (field, range) in parts { changes[field] = SecureBytes(copying: UnsafeRawBufferPointer(rebasing: value[range])) }
                    return true
                }
                let field = AccountField.allCases[index]
                guard AccountFieldSyntax.isValid(value, for: field) else { return false }
                changes[field] = SecureBytes(copying: value)
                return true
            }
            guard ok else { throw text.count > AccountFieldSyntax.maximumSize ? .fileTooLarge : .invalidArgument }
            do {
                try vault.setFields(changes, of: uuid)
            } catch {
                throw error.errno
            }
            Log.debug("vault saved: \(changes.count) field(s) of one account changed (values not logged)")
            let now = Timestamp.now()
            modified[local] = now
            invalidations.append(space.inode(local))
            if index == AccountsTree.urlIndex || [.protocol, .server, .port, .path].contains(AccountField.allCases[index]) {
                for related in [1, 2, 3, 4, AccountsTree.urlIndex] {
                    modified[fieldInode(account, related)] = now
                    invalidations.append(space.inode(fieldInode(account, related)))
                }
            }
        }
    }
}
