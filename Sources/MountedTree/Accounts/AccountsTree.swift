#if canImport(Glibc)
import Glibc
#endif
import CredentialVault
import SecureMemory
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

/// `accounts/`: the FUSE door of the vault service — one directory per service account, one
/// file per field (SPEC §1–§3).
///
/// Locked, the account names (UUIDs) and field names are listed with size 0, and every
/// read, write, mkdir and rmdir gets EACCES. Unlocked, fields read as their value plus one
/// newline. Files — fields, editors' scratch files, the rules of every save strategy — are
/// the editing engine's (`EditingEngine`, shared with `settings/`), with buffers in secure
/// memory; `AccountFields` checks and seals values. The tree translates requests into the
/// service's state (`AccountNodes.swift`) under the service's one lock, and asks the
/// service's access policy about every open guarding covers (`AccountsTree+Files.swift`).
/// While unlocked the kernel may keep a field's pages for readers (see `PageCacheGate`;
/// writers use direct I/O); every lock drops the pages and attributes of every field the
/// kernel holds before it returns, so a descriptor or mapping made before a lock gets
/// EACCES (SIGBUS) or nothing on its next read.
///
/// Thread-safety: the service's lock, never held during a key derivation; kernel
/// notifications are sent after it is released.
public final class AccountsTree: EditingTree {
    public let name = "accounts"
    public let space = InodeSpace.accounts
    public let nodes: NodeTable
    /// What the tree is a door of.
    public let service: VaultService
    let active: ActiveAccountLink
    /// Secure copies of what a read replies, made under the service's lock and sent after
    /// it (an arena of their own: a lock's `releaseAll` of the vault's never frees one that
    /// is still being sent).
    let replies = SecureArena()
    /// Tests: runs between an open's decision (the service's lock let go) and the open.
    let afterOpenDecision = Locked<(@Sendable () -> Void)?>(nil)

    var state: Locked<VaultState> { service.state }
    var notifier: KernelCacheNotifier { service.notifier }
    var pageCache: PageCacheGate { service.pageCache }
    var wakeup: Wakeup { service.wakeup }
    var access: AccessGuard { service.access }

    static let directoryCache = CachePolicy(entryTimeout: 1, attributeTimeout: 1)
    /// Field attributes (sizes) may be cached while unlocked: every commit and every lock
    /// invalidates them, so a lock shows sizes 0 at once.
    static let fieldCache = CachePolicy(entryTimeout: 1, attributeTimeout: 1)
    /// Locked, a field's size (0) is not cached: a read through a descriptor from before the
    /// lock then asks for it again (with its handle), and is refused.
    static let lockedFieldCache = CachePolicy(entryTimeout: 1, attributeTimeout: 0)

    public init(service: VaultService, active: ActiveAccountLink, nodes: NodeTable) {
        self.service = service
        self.active = active
        self.nodes = nodes
    }

    /// A door with a service of its own (tests, tools).
    public convenience init(vaultPath: String, ownership: Ownership, notifier: KernelCacheNotifier, active: ActiveAccountLink,
                            autoLockSeconds: Int, prompts: PromptSettings, nodes: NodeTable) {
        self.init(service: VaultService(vaultPath: vaultPath, ownership: ownership, notifier: notifier,
                                        autoLockSeconds: autoLockSeconds, prompts: prompts, nodes: nodes),
                  active: active, nodes: nodes)
    }

    /// Files held, editor's files linked, hidden fields (for tests and status).
    var census: (files: Int, scratch: Int, hidden: Int) { service.census }

    /// The mount ends: so does the service (its vault locked).
    public func shutDown() { service.shutDown() }


    func symlinkAttributes(_ target: String) -> Attributes {
        let ownership = state.withLock { $0.ownership }
        var attributes = ownership.file(space.inode(.activeLink), mode: 0o777, size: UInt64(target.utf8.count))
        attributes.mode = S_IFLNK | 0o777
        return attributes
    }

    /// The entry of a node handed to the kernel (a lookup's, a listing's), counted as its
    /// reference here, under the lock that found the node.
    private func handOut(_ s: VaultState, _ local: LocalInode) throws(Errno) -> Entry {
        let entry = Entry(attributes: try s.attributes(local, space), cache: s.cache(for: local))
        nodes.reference(entry.inode)
        return entry
    }

    /// The entry of `active` (the link never goes: counted with no lock to hold).
    private func activeEntry(_ target: String) -> Entry {
        nodes.reference(space.inode(.activeLink))
        return Entry(attributes: symlinkAttributes(target), cache: .none)
    }

    // MARK: FileSystem

    public func lookup(parent: InodeNumber, name: String, context: RequestContext) throws(Errno) -> Entry {
        let parentLocal = space.local(of: parent)
        if parentLocal == .top && name == "active" {
            guard let target = active.get(), !target.isEmpty else { throw .noSuchFileOrDirectory }
            return activeEntry(target)
        }
        return try locked { (s) throws(Errno) in
            let made = try s.lookup(parentLocal, name)
            return try handOut(s, made)
        }
    }

    public func lastReferenceGone(_ inode: InodeNumber) {
        let local = space.local(of: inode)
        guard local.isFile else { return }
        pageCache.forget(inode)
        lockedAlways { $0.engine.referenceGone(local) }  // (a change it makes is written after the lock)
    }

    public func attributes(of inode: InodeNumber, context: RequestContext) throws(Errno) -> (Attributes, CachePolicy) {
        let local = space.local(of: inode)
        if local == .top { return (state.withLock { $0.ownership.directory(inode, mode: 0o700) }, Self.directoryCache) }
        if local == .activeLink {
            guard let target = active.get(), !target.isEmpty else { throw .noSuchFileOrDirectory }
            return (symlinkAttributes(target), .none)
        }
        return try locked { (s) throws(Errno) in
            if TrustedListNode(local) != nil || ConflictNode(local) != nil { return (try s.attributes(local, space), .none) }
            // Through a descriptor from before a lock: refused. The kernel asks this before
            // it reads cached pages past the size it knows, so such a descriptor's read fails
            // with EACCES rather than reading nothing (the size is 0 while locked).
            if let handle = context.fileHandle, !s.fields.session.isCurrent(FileHandle(raw: handle)) { throw .permissionDenied }
            return (try s.attributes(local, space), s.cache(for: local))
        }
    }

    public func setAttributes(of inode: InodeNumber, _ changes: AttributeChanges, handle: UInt64?,
                              context: RequestContext) throws(Errno) -> (Attributes, CachePolicy) {
        defer { SecureBytes.burnStack() }
        let requester = handle == nil && changes.size != nil ? service.requester(context) : nil
        return try locked { (s) throws(Errno) in
            let local = space.local(of: inode)
            if ViewNode(local) != nil || TrustedListNode(local) != nil || ConflictNode(local) != nil { throw .permissionDenied }  // the views are read-only
            if changes.size != nil, handle == nil, let file = s.engine.files[local] {
                // truncate(2) by name: a write without an open (one through a handle was decided at its open).
                let directory: LocalInode? = if case .scratch(let parent, _) = file.role { parent } else { file.key?.account.directory }
                if let directory { try service.requireTrust(&s, directory: directory, requester, context: context, what: "fields") }
            }
            _ = try s.attributes(local, space)
            // Through a descriptor from before a lock: refused, like its reads and writes.
            if let handle, !s.fields.session.isCurrent(FileHandle(raw: handle)) { throw .permissionDenied }
            if let uid = changes.uid, uid != s.ownership.uid { throw .notPermitted }
            if let gid = changes.gid, gid != s.ownership.gid { throw .notPermitted }
            if let size = changes.size {
                guard local.isFile else { throw .isDirectory }
                try s.fields.session.requireOpen()
                try s.engine.truncate(local, to: Int(clamping: size), owner: handle.map(FileHandle.init(raw:)),
                                      deferred: handle != nil, &s.fields)
            }
            if let modified = changes.modificationTime, local.isFile { s.engine.setModified(local, modified) }
            return (try s.attributes(local, space), s.cache(for: local))
        }
    }

    public func readLink(_ inode: InodeNumber, context: RequestContext) throws(Errno) -> String {
        let local = space.local(of: inode)
        if local == .activeLink {
            guard let target = active.get(), !target.isEmpty else { throw .noSuchFileOrDirectory }
            return target
        }
        return try locked { (s) throws(Errno) in
            if let view = ViewNode(local) { return try s.viewLinkTarget(view) }
            guard let target = s.engine.files[local]?.symlinkTarget else { throw .invalidArgument }
            return target
        }
    }

    public func makeDirectory(parent: InodeNumber, name: String, mode: mode_t,
                              context: RequestContext) throws(Errno) -> Entry {
        guard space.local(of: parent) == .top else { throw .permissionDenied }  // accounts hold no directory
        // Guarded, the program that makes an account is trusted with it from the start.
        let creator = service.requester(context)
        return try locked { (s) throws(Errno) in
            let made = try s.makeAccount(name, trusting: creator.flatMap { $0.refusal == nil ? $0.program : nil })
            return try handOut(s, made)
        }
    }

    public func removeDirectory(parent: InodeNumber, name: String, context: RequestContext) throws(Errno) {
        let parentLocal = space.local(of: parent)
        if ViewNode(parentLocal) != nil || ConflictNode(parentLocal) != nil { throw .permissionDenied }
        if parentLocal != .top && name == ConflictNode.name {
            // `rm -r` of an account: its conflicts go with it (nothing to remove here). By then
            // the fields it cleared may have resolved them, and the directory gone: still done.
            try locked { (s) throws(Errno) in
                try s.fields.session.requireOpen()
                guard s.fields.account(at: parentLocal) != nil else { throw .noSuchFileOrDirectory }
            }
            return
        }
        if parentLocal != .top && name == AccountFields.attributesName {
            // `rm -r` of an account, once it unlinked every attribute: nothing to remove (the
            // directory is always there); with attributes left, ENOTEMPTY.
            try locked { (s) throws(Errno) in
                try s.fields.session.requireOpen()
                guard let account = s.fields.account(at: parentLocal) else { throw .noSuchFileOrDirectory }
                if s.hasAttributesLeft(account) { throw .directoryNotEmpty }
            }
            return
        }
        guard parentLocal == .top else { throw .notDirectory }
        let requester = service.requester(context)
        try locked { (s) throws(Errno) in
            if let account = s.fields.account(named: name) {
                try service.requireTrust(&s, directory: s.fields.id(of: account.uuid).directory, requester, context: context, what: "account")
            }
            try s.removeAccount(name)
        }
    }

    public func unlink(parent: InodeNumber, name: String, context: RequestContext) throws(Errno) {
        defer { SecureBytes.burnStack() }
        let parentLocal = space.local(of: parent)
        if parentLocal == .top && name == "active" {
            guard active.get()?.isEmpty == false else { throw .noSuchFileOrDirectory }
            try active.set("")
            return
        }
        let requester = parentLocal == .top ? nil : service.requester(context)
        try locked { (s) throws(Errno) in
            if parentLocal != .top { try service.requireTrust(&s, directory: parentLocal, requester, context: context, what: name) }
            // `rm -r` of an account unlinks its `trusted` too: nothing changes (only the
            // passphrase changes the list; it goes with the account).
            if name == TrustedListNode.name && s.fields.account(at: parentLocal) != nil {
                try s.fields.session.requireOpen()
                return
            }
            // The same for the files of `conflicts/` (writing a field is what resolves one).
            if let node = ConflictNode(parentLocal) {
                try s.fields.session.requireOpen()
                _ = try s.conflictLookup(node, name)
                return
            }
            try s.unlink(parentLocal, name)
        }
    }

    public func makeSymbolicLink(target: String, parent: InodeNumber, name: String,
                                 context: RequestContext) throws(Errno) -> Entry {
        let parentLocal = space.local(of: parent)
        if parentLocal == .top && name == "active" {
            guard active.get()?.isEmpty != false else { throw .fileExists }
            try setActive(target)
            return activeEntry(target)
        }
        let requester = parentLocal == .top ? nil : service.requester(context)
        return try locked { (s) throws(Errno) in
            if parentLocal != .top && name == TrustedListNode.name && s.fields.account(at: parentLocal) != nil { throw .fileExists }
            if ConflictNode(parentLocal) != nil { throw .permissionDenied }
            if parentLocal != .top && name == ConflictNode.name && (try? s.lookup(parentLocal, name)) != nil { throw .fileExists }
            if parentLocal != .top { try service.requireTrust(&s, directory: parentLocal, requester, context: context, what: "files") }
            let made = try s.makeSymbolicLink(target, in: parentLocal, name, requester: context.pid)
            return try handOut(s, made)
        }
    }

    private func setActive(_ target: String) throws(Errno) {
        guard target.isEmpty || AccountName.uuidBytes(target) != nil else { throw .invalidArgument }
        try active.set(target)
    }

    public func rename(parent: InodeNumber, name: String, newParent: InodeNumber, newName: String,
                       flags: RenameFlags, context: RequestContext) throws(Errno) {
        defer { SecureBytes.burnStack() }
        let from = space.local(of: parent), to = space.local(of: newParent)
        if from == .top && to == .top && newName == "active" {
            // `ln -sfn UUID accounts/active` makes a temporary link and renames it over.
            let target = try locked { (s) throws(Errno) -> String in
                guard let local = s.engine.scratch(named: name, in: .top),
                      let target = s.engine.files[local]?.symlinkTarget else { throw .invalidArgument }
                return target
            }
            try setActive(target)
            try locked { (s) throws(Errno) in try s.engine.unlink(name, in: .top, &s.fields) }
            return
        }
        let requester = service.requester(context)
        try locked { (s) throws(Errno) in
            for (directory, fileName) in [(from, name), (to, newName)] where directory != .top {
                if fileName == TrustedListNode.name && s.fields.account(at: directory) != nil { throw .permissionDenied }
                if ConflictNode(directory) != nil || (fileName == ConflictNode.name && s.fields.account(at: directory) != nil) {
                    throw .permissionDenied
                }
            }
            if from != .top { try service.requireTrust(&s, directory: from, requester, context: context, what: newName) }
            if to != .top && to != from { try service.requireTrust(&s, directory: to, requester, context: context, what: newName) }
            try s.rename(from, name, to, newName, flags: flags, requester: context.pid)
        }
    }

    public func link(_ inode: InodeNumber, newParent: InodeNumber, newName: String,
                     context: RequestContext) throws(Errno) -> Entry {
        throw .notPermitted
    }

    public func open(_ inode: InodeNumber, flags: Int32, context: RequestContext, request: OpenRequest) throws(Errno) -> OpenedFile? {
        if let node = TrustedListNode(space.local(of: inode)) { return try openTrustedList(node, flags: flags) }
        if let node = ConflictNode(space.local(of: inode)) { return try openConflicts(node, flags: flags, context: context) }
        return try guardedOpen(inode, flags: flags, context: context, request: request)
    }

    public func open(_ inode: InodeNumber, flags: Int32, context: RequestContext) throws(Errno) -> OpenedFile {
        guard let opened = try open(inode, flags: flags, context: context, request: .immediate) else { throw .permissionDenied }
        return opened
    }

    /// What an open came to: opened, or covered by guarding and to be decided (against
    /// the trusted list read, of that version of the vault's lists).
    enum OpenAttempt {
        case opened(OpenedFile)
        case covered(AccessGuard.Access, [TrustedProgram], version: UInt64)
    }

    /// What let an open through guarding.
    enum Decided: Equatable {
        /// A person, at a prompt (for this run of the program).
        case person
        /// `AccessGuard.decide`, against this version of the trusted lists: the open
        /// checks it under the service's lock, and comes back to be decided again if a list
        /// changed since.
        case against(UInt64)
    }

    /// An open a person allowed at a prompt (each other program's open is decided for it).
    func openDecided(_ inode: InodeNumber, flags: Int32) throws(Errno) -> OpenedFile {
        guard case .opened(let opened) = try open(inode, flags: flags, decided: .person) else { throw .permissionDenied }
        return opened
    }

    /// The open itself, in one visit under the service's lock. Not yet `decided`, guarding is
    /// asked first under that same lock (an open racing an unlock or `guard on` is never
    /// let through unchecked): an open it covers comes back to be decided, opening nothing.
    /// Decided against a version of the trusted lists that is no longer the vault's (an
    /// `untrust` since), it comes back to be decided again.
    func open(_ inode: InodeNumber, flags: Int32, decided: Decided?) throws(Errno) -> OpenAttempt {
        defer { SecureBytes.burnStack() }
        let writer = flags & O_ACCMODE != O_RDONLY
        let attempt = try locked { (s) throws(Errno) -> OpenAttempt in
            let local = space.local(of: inode)
            try s.fields.session.requireOpen()
            guard local.isFile else { throw .isDirectory }
            switch decided {
            case .person?:
                break
            case .against(let version)?:
                if case .covered(let access, let trusted) = s.guardedAccess(local, writing: writer),
                   let current = s.fields.vault?.trustChanges, current != version {
                    return .covered(access, trusted, version: current)
                }
            case nil:
                switch s.guardedAccess(local, writing: writer) {
                case .uncovered: break
                case .refused: throw .permissionDenied
                case .covered(let access, let trusted):
                    return .covered(access, trusted, version: s.fields.vault?.trustChanges ?? 0)
                }
            }
            let key = s.engine.files[local]?.key
            let totp = key?.isTOTP == true
            if totp && writer { throw .permissionDenied }  // read only: written through `otp`
            let handle = s.fields.session.newHandle()
            try s.engine.open(local, handle: handle, truncate: flags & O_TRUNC != 0 && writer, s.fields)
            s.fields.session.opened(handle, of: local)
            s.fields.session.touched()
            // The code changes with the clock: every read asks (no page kept, none sent twice).
            if totp { return .opened(OpenedFile(handle: handle.raw, directIO: true, noFlush: true)) }
            guard !writer else { return .opened(OpenedFile(handle: handle.raw, directIO: true)) }
            // A reader reads the kernel's pages of the field while it has not changed (every
            // lock drops them all), and its close commits nothing: no READ, no FLUSH. So does
            // a decided reader of a secret: another program's open is decided for it. Not
            // while a handle from before a narrowing is open on the file (it could read the
            // pages this one puts back), nor an editor's file a decision let read.
            guard !s.fields.session.openHandles.hasRevoked(local), decided == nil || key != nil else {
                return .opened(OpenedFile(handle: handle.raw, directIO: true, noFlush: true))
            }
            return .opened(OpenedFile(handle: handle.raw, keepCache: true, noFlush: true))
        }
        if case .opened(var opened) = attempt, opened.keepCache, !pageCache.admit(inode, notifier: notifier) {
            (opened.keepCache, opened.directIO) = (false, true)
            return .opened(opened)
        }
        return attempt
    }

    public func create(parent: InodeNumber, name: String, mode: mode_t, flags: Int32,
                       context: RequestContext) throws(Errno) -> (Entry, OpenedFile) {
        let parentLocal = space.local(of: parent)
        let requester = parentLocal == .top ? nil : service.requester(context)
        return try locked { (s) throws(Errno) in
            if parentLocal != .top && name == TrustedListNode.name && s.fields.account(at: parentLocal) != nil { throw .fileExists }
            if ConflictNode(parentLocal) != nil { throw .permissionDenied }
            if parentLocal != .top && name == ConflictNode.name && (try? s.lookup(parentLocal, name)) != nil { throw .fileExists }
            if parentLocal != .top { try service.requireTrust(&s, directory: parentLocal, requester, context: context, what: name) }
            let handle = s.fields.session.newHandle()
            let local = try s.create(space.local(of: parent), name, mode: mode, flags: flags, handle: handle,
                                     requester: context.pid)
            s.fields.session.opened(handle, of: local)
            return (try handOut(s, local), OpenedFile(handle: handle.raw, directIO: true))
        }
    }

    public func read(_ inode: InodeNumber, handle: UInt64, offset: UInt64, size: Int, context: RequestContext,
                     reply: (UnsafeRawBufferPointer) -> Void) throws(Errno) {
        defer { SecureBytes.burnStack() }
        if TrustedListNode(space.local(of: inode)) != nil {
            return try readTrustedList(handle: handle, offset: offset, size: size, reply: reply)
        }
        if ConflictNode(space.local(of: inode)) != nil {
            return try readConflicts(handle: handle, offset: offset, size: size, reply: reply)
        }
        service.fieldReads.add(1, ordering: .relaxed)
        // Copied (into secure memory) under the lock, replied after it: no request of
        // accounts/ waits for a reply to reach the kernel.
        let copy = try state.withLock { (s) throws(Errno) -> SecureBytes? in
            guard s.fields.vault != nil else { throw .ioError }
            try s.fields.session.requireOpen()
            guard s.fields.session.isCurrent(FileHandle(raw: handle)) else { throw .permissionDenied }  // opened before a lock
            s.fields.session.touched()
            let copied = try s.engine.withContent(space.local(of: inode), s.fields) { bytes -> SecureBytes?? in
                guard offset < UInt64(bytes.count) else { return .some(nil) }
                let start = Int(offset)
                let piece = UnsafeRawBufferPointer(rebasing: bytes[start..<min(bytes.count, start + size)])
                guard let copy = try? SecureBytes.allocate(copying: piece, in: replies) else { return .none }
                return .some(copy)
            }
            guard let copied else { throw .noMemory }  // no secure memory to be had
            return copied
        }
        defer { copy?.wipe() }
        guard let copy else { return reply(UnsafeRawBufferPointer(start: nil, count: 0)) }
        copy.withUnsafeBytes { reply($0) }
    }

    public func write(_ inode: InodeNumber, handle: UInt64, offset: UInt64, data: UnsafeRawBufferPointer,
                      flags: Int32, context: RequestContext) throws(Errno) -> Int {
        defer { SecureBytes.burnStack() }
        return try locked { (s) throws(Errno) in
            // The bytes sit in libfuse's receive buffer: once copied into secure memory,
            // they are zeroed there so that no plaintext lingers in an idle worker's buffer.
            defer { if let base = data.baseAddress { SecureBytes.zero(UnsafeMutableRawPointer(mutating: base), data.count) } }
            try s.fields.session.requireOpen()
            let owner = FileHandle(raw: handle)
            guard s.fields.session.isCurrent(owner) else { throw .permissionDenied }  // opened before a lock
            s.fields.session.touched()
            try s.engine.write(space.local(of: inode), at: offset, data, append: flags & O_APPEND != 0, owner: owner, s.fields)
            return data.count
        }
    }

    public func flush(_ inode: InodeNumber, handle: UInt64, context: RequestContext) throws(Errno) {
        defer { SecureBytes.burnStack() }
        try locked { (s) throws(Errno) in
            // Written before a lock: the lock discarded it, and the writer hears so here.
            guard s.fields.session.isCurrent(FileHandle(raw: handle)) else { throw .permissionDenied }
            try s.engine.flush(space.local(of: inode), handle: FileHandle(raw: handle), &s.fields)
        }
    }

    public func release(_ inode: InodeNumber, handle: UInt64, flags: Int32) {
        defer { SecureBytes.burnStack() }
        if TrustedListNode(space.local(of: inode)) != nil {
            _ = service.handleTexts.withLock { $0.release(FileHandle(raw: handle)) }
            return
        }
        if let node = ConflictNode(space.local(of: inode)) { return releaseConflicts(node, handle: handle) }
        // The open is let go even when the vault cannot be used; a handle from before a
        // lock commits nothing.
        lockedAlways { s in
            let owner = FileHandle(raw: handle)
            defer { s.fields.session.released(owner, of: space.local(of: inode)) }
            try? s.engine.release(space.local(of: inode), handle: owner, commit: s.fields.session.isCurrent(owner), &s.fields)
        }
    }

    public func synchronize(_ inode: InodeNumber, handle: UInt64, dataOnly: Bool) throws(Errno) {
        defer { SecureBytes.burnStack() }
        try locked { (s) throws(Errno) in
            guard s.fields.session.isCurrent(FileHandle(raw: handle)) else { throw .permissionDenied }
            try s.engine.commit(space.local(of: inode), by: FileHandle(raw: handle), finalClose: false, &s.fields)
        }
    }

    public func listDirectory(_ inode: InodeNumber, context: RequestContext) throws(Errno) -> [DirectoryEntry] {
        let local = space.local(of: inode)
        let activeTarget = local == .top ? active.get() : nil
        var entries = try locked { (s) throws(Errno) in
            let names = try s.list(local)
            return try names.map { (name, local) throws(Errno) in DirectoryEntry(name: name, entry: try handOut(s, local)) }
        }
        if let activeTarget, !activeTarget.isEmpty {
            entries.insert(DirectoryEntry(name: "active", entry: activeEntry(activeTarget)), at: 0)
        }
        return entries
    }

    /// Each entry listed is counted as a kernel reference under the lock of the listing: a
    /// field that leaves before the reply reaches the kernel keeps its file for it.
    public func countsListing(of inode: InodeNumber) -> Bool { true }
}


