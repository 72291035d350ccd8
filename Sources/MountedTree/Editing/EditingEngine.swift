#if canImport(Glibc)
import Glibc
#endif
import FuseLowLevel
import Posix

/// The files of a tree whose files stand for values (`settings/` keys, `accounts/` fields),
/// and every save strategy of editors and tools on them, in one place for both trees.
///
/// It owns the file nodes (inode numbers `LocalInode.file(_:)`): a key's file, made at its
/// first lookup; an editor's temporary, swap, lock or backup file, held in memory only
/// (never on disk, never a key by itself); and files unlinked or replaced but still open
/// or known to the kernel. Directories belong to the tree. What a key is, its text and how
/// a value is saved come from the tree's `EditedStore`.
///
/// The save strategies, each the same in both trees:
/// - write in place (`>`, `>>`, cp, tee, nano, ed, vim `backupcopy=yes`, Python
///   `open(…, 'w')`): the key's pending content (`PendingEdit`) is committed at flush,
///   fsync or last close, never the empty state of a truncate;
/// - write a new file and rename it onto the key (sed -i, perl -pi, Python tempfile +
///   `os.replace`, vim restoring its backup): the key takes the file's text, validated
///   first (on EINVAL nothing has moved), and the file's inode is the key's from then on;
/// - rename the key away and write a new one (vim, neovim, emacs: `K` → `K~`, create `K`):
///   the key is hidden and keeps its value while its old text lives in `K~`; the new file
///   becomes the key when written and closed; `K~` deleted with no new file removes it;
/// - unlink, then create (mv from another file system, install, git checkout with
///   `O_EXCL`): the unlinked key is hidden and leaves only `removalDelay` later, unless the
///   new file takes its name first — one rewrite, no moment without the key on disk.
///
/// Thread-safety: a value type; the owning tree keeps it behind its lock. `invalidations`
/// collects the inodes whose kernel copies must go, to be sent after the lock is released.
struct EditingEngine<Store: EditedStore> {
    typealias Key = Store.Key
    typealias Buffer = Store.Buffer
    typealias File = EditedFile<Key, Buffer, Store.Note>

    private(set) var files = EditedFiles<File>()
    private(set) var byKey: [Key: LocalInode] = [:]
    private var scratchIn: [LocalInode: [String: LocalInode]] = [:]
    private(set) var hidden: [Key: HiddenKey] = [:]
    private var nextSerial: UInt64 = 0
    /// The time every key file shows until it is written.
    let since: Timestamp
    let removalDelay: Duration
    /// Files whose kernel copies (attributes, pages) must be dropped.
    var invalidations: [LocalInode] = []
    /// Names the kernel must forget: editor's files the engine unlinked itself (the kernel
    /// would otherwise keep finding the old file under the name).
    var entryInvalidations: [(directory: LocalInode, name: String)] = []
    /// The kernel's references (counted by the tree, under its lock, for every file it
    /// hands out): a file the kernel holds is never freed.
    let nodes: SubtreeNodes
    /// An editor's file was given a creator to watch since the tree's watcher last looked
    /// (`creatorDescriptors`): the watcher must look again.
    var creatorsChanged = false

    init(since: Timestamp, nodes: SubtreeNodes, removalDelay: Duration = .seconds(1)) {
        self.since = since
        self.nodes = nodes
        self.removalDelay = removalDelay
    }

    // MARK: Names

    func isHidden(_ key: Key) -> Bool { hidden[key] != nil }

    /// Whether the first removal now comes before `earlier` (the first one before a change):
    /// a watcher asleep until `earlier` must look again.
    func removalComesSooner(than earlier: ContinuousClock.Instant?) -> Bool {
        guard let first = nextRemovalDue else { return false }
        return earlier.map { first < $0 } ?? true
    }

    /// When the first unlinked key is due to leave (`commitDueRemovals`), if any.
    var nextRemovalDue: ContinuousClock.Instant? {
        hidden.values.compactMap { state -> ContinuousClock.Instant? in
            if case .unlinked(let due) = state { return due }
            return nil
        }.min()
    }

    /// The key `name` stands for in `directory` (with or without a value), or nil.
    func addressedKey(_ name: String, in directory: LocalInode, _ store: Store) -> Key? {
        store.key(named: name, in: directory, isHidden: { hidden[$0] != nil })
    }

    /// Whether a lookup of the key finds its file.
    func isVisible(_ key: Key, _ store: Store) -> Bool { hidden[key] == nil && store.hasValue(key) }

    func scratch(named name: String, in directory: LocalInode) -> LocalInode? { scratchIn[directory]?[name] }

    /// Whether editor's files live in the directory.
    func hasScratchFiles(in directory: LocalInode) -> Bool { scratchIn[directory]?.isEmpty == false }

    /// The editor's files of a directory, by name.
    func scratchFiles(in directory: LocalInode) -> [(name: String, inode: LocalInode)] {
        (scratchIn[directory] ?? [:]).sorted { $0.key < $1.key }.map { ($0.key, $0.value) }
    }

    /// Finds `name` in `directory` (the tree counts the reference it hands out).
    mutating func lookup(_ name: String, in directory: LocalInode, _ store: Store) throws(Errno) -> LocalInode {
        if let inode = scratch(named: name, in: directory) { return inode }
        guard let key = addressedKey(name, in: directory, store), isVisible(key, store) else { throw .noSuchFileOrDirectory }
        return file(for: key, store)
    }

    /// The file of a key, made on first sight.
    mutating func file(for key: Key, _ store: Store) -> LocalInode {
        if let inode = byKey[key] { return inode }
        let inode = newFile(File(role: .key(key), mode: store.mode(forNewFile: 0o644), modified: since, changed: since))
        byKey[key] = inode
        return inode
    }

    private mutating func newFile(_ file: File) -> LocalInode {
        nextSerial += 1
        let inode = LocalInode.file(nextSerial)
        files.insert(file, at: inode)
        return inode
    }

    /// The kernel's last reference went (if none came back since, the file may go).
    mutating func referenceGone(_ inode: LocalInode) { collect(inode) }

    /// Frees a file nothing refers to any more.
    private mutating func collect(_ inode: LocalInode) {
        guard var file = files[inode], file.opens == 0, !file.isLinkedScratch, !nodes.isReferenced(inode) else { return }
        if let key = file.key, byKey[key] == inode { byKey[key] = nil }
        file.wipe()
        files.remove(inode)
    }

    // MARK: Making and removing names

    /// `create(2)`: an existing file (EEXIST with `exclusive`), the key's file when the
    /// name is a key with a value, else a new editor's file (meant for the key its name
    /// stands for, if any). Counts one open.
    mutating func create(_ name: String, in directory: LocalInode, mode: mode_t, exclusive: Bool, truncate: Bool,
                         handle: FileHandle, requester: pid_t, _ store: Store) throws(Errno) -> LocalInode {
        let inode: LocalInode
        if let existing = scratch(named: name, in: directory) {
            if exclusive { throw .fileExists }
            inode = existing
        } else if let key = addressedKey(name, in: directory, store), isVisible(key, store) {
            if exclusive { throw .fileExists }
            inode = file(for: key, store)
        } else {
            let key = addressedKey(name, in: directory, store)
            if key == nil {
                try store.admitsScratch(named: name, in: directory, count: scratchIn[directory]?.count ?? 0, moved: false)
            }
            let now = Timestamp.now()
            var file = File(role: .scratch(directory: directory, name: name), mode: store.mode(forNewFile: mode & 0o7777),
                            modified: now, changed: now)
            file.content = Buffer()
            file.intendedKey = key
            if key == nil { file.creator = watchCreator(requester) }
            inode = newFile(file)
            scratchIn[directory, default: [:]][name] = inode
        }
        try open(inode, handle: handle, truncate: truncate, store)
        return inode
    }

    /// A symbolic link: always an editor's file (emacs's `.#K` lock, `ln -s`).
    mutating func makeSymbolicLink(_ target: String, named name: String, in directory: LocalInode,
                                   requester: pid_t, _ store: Store) throws(Errno) -> LocalInode {
        if scratch(named: name, in: directory) != nil { throw .fileExists }
        if let key = addressedKey(name, in: directory, store), isVisible(key, store) { throw .fileExists }
        try store.admitsScratch(named: name, in: directory, count: scratchIn[directory]?.count ?? 0, moved: false)
        let now = Timestamp.now()
        var file = File(role: .scratch(directory: directory, name: name), mode: 0o777, modified: now, changed: now)
        file.symlinkTarget = target
        file.creator = watchCreator(requester)
        let inode = newFile(file)
        scratchIn[directory, default: [:]][name] = inode
        return inode
    }

    /// `unlink(2)`. An editor's file goes (its bytes stay while it is open); the old text
    /// of a hidden key deleted while no new file is on its way takes the key with it. A
    /// key is hidden and leaves later (see `HiddenKey.unlinked`).
    mutating func unlink(_ name: String, in directory: LocalInode, _ store: inout Store) throws(Errno) {
        if let inode = scratch(named: name, in: directory) {
            let detachedFrom = files[inode]?.detachedFrom, intendedKey = files[inode]?.intendedKey
            unlinkScratch(inode)
            // The old text of a hidden key deleted with no new file on its way, or the new
            // file deleted with no old text left: the key is gone.
            if let key = detachedFrom ?? intendedKey, hidden[key] == .renamedAway, !isBeingRecreated(key, store),
               !holdsOldText(key, store) {
                hidden[key] = nil
                try store.remove(key)
            }
            return
        }
        guard let key = addressedKey(name, in: directory, store), isVisible(key, store) else { throw .noSuchFileOrDirectory }
        if let inode = byKey[key] { detach(inode, store) }
        if store.removesAtOnce(key) {
            try store.remove(key)
        } else {
            hidden[key] = .unlinked(due: .now.advanced(by: removalDelay))
        }
    }

    private mutating func unlinkScratch(_ inode: LocalInode, tellKernel: Bool = false) {
        guard case .scratch(let directory, let name) = files[inode]?.role else { return }
        if tellKernel { entryInvalidations.append((directory, name)) }
        scratchIn[directory]?[name] = nil
        if scratchIn[directory]?.isEmpty == true { scratchIn[directory] = nil }
        files.update(inode) { file in
            file.role = .unlinked
            file.changed = .now()
        }
        collect(inode)
    }

    /// An editor's file still holds the key's old text (vim's `K~`).
    func holdsOldText(_ key: Key, _ store: Store) -> Bool {
        guard let directory = store.directory(of: key) else { return false }
        return (scratchIn[directory] ?? [:]).values.contains { files[$0]?.detachedFrom == key }
    }

    /// A new file at the key's name will become the key (an editor's new copy).
    func isBeingRecreated(_ key: Key, _ store: Store) -> Bool {
        guard let directory = store.directory(of: key) else { return false }
        return (scratchIn[directory] ?? [:]).values.contains { files[$0]?.intendedKey == key }
    }

    /// A key's file stops being the key (unlinked, replaced, or the value went): open
    /// descriptors keep reading its last text.
    private mutating func detach(_ inode: LocalInode, _ store: Store) {
        guard var file = files[inode], let key = file.key else { return }
        if byKey[key] == inode { byKey[key] = nil }
        var text = Buffer()
        if file.opens > 0, let current = try? currentText(file, key, store) { text = current }
        file.wipe()
        file.content = text
        file.role = .unlinked
        file.changed = .now()
        files.insert(file, at: inode)
        invalidations.append(inode)
        collect(inode)
    }

    /// `rename(2)` of a file (the tree handles directories and moves between them).
    mutating func rename(_ name: String, in directory: LocalInode, to newName: String, in newDirectory: LocalInode,
                         flags: RenameFlags, requester: pid_t, _ store: inout Store) throws(Errno) {
        if flags.contains(.exchange) { throw .invalidArgument }
        let targetScratch = scratch(named: newName, in: newDirectory)
        let targetKey = addressedKey(newName, in: newDirectory, store)
        let targetTaken = targetScratch != nil || targetKey.map { isVisible($0, store) } == true
        if flags.contains(.noReplace) && targetTaken { throw .fileExists }
        if directory == newDirectory && name == newName { return }

        if let source = scratch(named: name, in: directory) {
            if let targetKey {
                // sed -i, os.replace, `mv tmp K`, vim restoring its backup.
                if files[source]?.symlinkTarget != nil { throw .invalidArgument }
                let movedFrom = files[source]?.detachedFrom
                try adopt(source, as: targetKey, &store)
                if let targetScratch, targetScratch != source { unlinkScratch(targetScratch) }
                // `mv K K~; mv K~ L`: the old text of K went on to L, and K with it.
                if let movedFrom, movedFrom != targetKey, hidden[movedFrom] == .renamedAway,
                   !isBeingRecreated(movedFrom, store), !holdsOldText(movedFrom, store) {
                    hidden[movedFrom] = nil
                    if store.hasValue(movedFrom) { try store.remove(movedFrom) }
                }
                return
            }
            let count = (scratchIn[newDirectory]?.count ?? 0) - (directory == newDirectory ? 1 : 0)
            try store.admitsScratch(named: newName, in: newDirectory, count: count, moved: true)
            if let targetScratch { unlinkScratch(targetScratch) }
            scratchIn[directory]?[name] = nil
            if scratchIn[directory]?.isEmpty == true { scratchIn[directory] = nil }
            scratchIn[newDirectory, default: [:]][newName] = source
            let creator = watchCreator(requester)
            files.update(source) { file in
                file.role = .scratch(directory: newDirectory, name: newName)
                file.intendedKey = nil
                file.creator = creator
                file.changed = .now()
            }
            return
        }

        guard let key = addressedKey(name, in: directory, store), isVisible(key, store) else { throw .noSuchFileOrDirectory }
        guard let targetKey else {
            // `mv K K~` (vim, emacs): K is hidden; its text lives on in K~, same inode.
            try store.mayRenameAway(key, to: newDirectory)
            if let targetScratch { unlinkScratch(targetScratch) }
            let inode = file(for: key, store)
            guard let current = files[inode] else { throw .noSuchFileOrDirectory }
            let text = try currentText(current, key, store)
            let creator = watchCreator(requester)
            files.update(inode) { file in
                file.wipe()
                file.content = text
                file.role = .scratch(directory: newDirectory, name: newName)
                file.detachedFrom = key
                file.written = false
                file.creator = creator
                file.changed = .now()
            }
            byKey[key] = nil
            hidden[key] = .renamedAway
            scratchIn[newDirectory, default: [:]][newName] = inode
            return
        }
        if case .unlinked? = hidden[targetKey], store.hasValue(targetKey) {
            // Unlinked a moment ago: gone for this rename (it takes the source's type).
            try store.remove(targetKey)
            hidden[targetKey] = nil
        }
        carryOutRemovals(overlapping: targetKey, &store)
        try store.move(key, onto: targetKey)
        if let replaced = byKey[targetKey] { detach(replaced, store) }
        hidden[targetKey] = nil
        if let targetScratch { unlinkScratch(targetScratch) }
        if let inode = byKey.removeValue(forKey: key) {
            files.update(inode) { file in
                file.role = .key(targetKey)
                file.shown?.wipe()
                file.shown = nil  // the target may render the value another way
                file.changed = .now()
            }
            byKey[targetKey] = inode
            invalidations.append(inode)
        }
    }

    /// An editor's file becomes `key`: its text is validated and saved, and its inode
    /// stands for the key from now on (the kernel moved the name to it).
    private mutating func adopt(_ inode: LocalInode, as key: Key, _ store: inout Store) throws(Errno) {
        guard let file = files[inode] else { throw .noSuchFileOrDirectory }
        carryOutRemovals(overlapping: key, &store)
        let saved = try store.commit(file.content ?? Buffer(), to: key, note: file.note)
        if let previous = byKey[key], previous != inode { detach(previous, store) }
        bind(inode, as: key, shown: saved.shown)
        changedWith(saved, inode)
    }

    /// The editor's file `inode` stands for `key` from now on (its value saved already).
    private mutating func bind(_ inode: LocalInode, as key: Key, shown: Buffer?) {
        guard let role = files[inode]?.role else { return }
        hidden[key] = nil
        if case .scratch(let directory, let name) = role {
            scratchIn[directory]?[name] = nil
            if scratchIn[directory]?.isEmpty == true { scratchIn[directory] = nil }
        }
        files.update(inode) { file in
            file.wipe()
            file.role = .key(key)
            file.intendedKey = nil
            file.detachedFrom = nil
            file.creator = nil
            file.note = nil
            file.written = false
            file.shown = shown
            file.modified = .now()
            file.changed = file.modified
        }
        byKey[key] = inode
    }

    /// Marks the file and the keys that changed with it as modified.
    private mutating func changedWith(_ saved: Committed<Key, Buffer>, _ inode: LocalInode) {
        invalidations.append(inode)
        let now = Timestamp.now()
        for key in saved.alsoChanged {
            guard let other = byKey[key], other != inode else { continue }
            files.update(other) { file in
                file.shown?.wipe()
                file.shown = nil
                file.modified = now
            }
            invalidations.append(other)
        }
    }

    /// Removes every unlinked key whose delay has passed (nil: all of them now). A removal
    /// that renumbers what follows it (an array element) takes every waiting removal with
    /// it, later elements and deeper keys first: each was asked for by the name it had
    /// when `ls` showed it, and that name still means the same value until they are done.
    mutating func commitDueRemovals(before deadline: ContinuousClock.Instant?, _ store: inout Store) {
        var due = hidden.compactMap { key, state -> Key? in
            guard case .unlinked(let at) = state, deadline.map({ at <= $0 }) ?? true else { return nil }
            return key
        }
        guard !due.isEmpty else { return }
        if due.contains(where: { store.renumbersOnRemoval($0) }) {
            due = hidden.compactMap { key, state in if case .unlinked = state { key } else { nil } }
        }
        removeNow(due, &store)
    }

    /// Carries out waiting removals of other keys whose removal would change `key` (before
    /// `key` is written: a removal never undoes a later write).
    private mutating func carryOutRemovals(overlapping key: Key, _ store: inout Store) {
        let overlapping = hidden.compactMap { other, state -> Key? in
            guard case .unlinked = state, other != key, store.removalOverlaps(other, key) else { return nil }
            return other
        }
        if !overlapping.isEmpty { removeNow(overlapping, &store) }
    }

    private mutating func removeNow(_ keys: [Key], _ store: inout Store) {
        for key in keys.sorted(by: { store.removesBefore($0, $1) }) {
            hidden[key] = nil
            guard store.hasValue(key) else { continue }
            do {
                try store.remove(key)
            } catch {
                Log.error("cannot remove an unlinked key: \(error)")
            }
        }
    }

    // MARK: Editor's files whose editor has gone

    /// The pinned creator of a new editor's file (the tree's watcher learns of it).
    private mutating func watchCreator(_ requester: pid_t) -> PinnedProcess? {
        guard let creator = PinnedProcess(thread: requester) else { return nil }
        creatorsChanged = true
        return creator
    }

    /// The descriptors of the creators of linked editor's files (readable once they exit).
    var creatorDescriptors: [Int32] {
        var seen = Set<Int32>()
        for inodes in scratchIn.values {
            for inode in inodes.values {
                if let fd = files[inode]?.creator?.fd { seen.insert(fd) }
            }
        }
        return Array(seen)
    }

    /// Editor's files whose creator has exited, settled (SPEC §0: what `ls` shows is stored,
    /// or an editor's while its save is under way): the editor's own state (a swap file, a
    /// probe, a lock) goes; a copy becomes the key its name is — the key renamed to it
    /// moves there (`mv K K~` with no editor behind it) — or, where no key can have its
    /// name, goes (said in the log) and a key renamed to it shows again.
    mutating func settleScratch(_ store: inout Store) {
        for (directory, names) in scratchIn {
            for (name, inode) in names {
                guard let file = files[inode], let creator = file.creator, creator.hasExited else { continue }
                files.update(inode) { $0.creator = nil }
                let from = file.detachedFrom.flatMap { hidden[$0] == .renamedAway ? $0 : nil }
                let kind = EditorNames.kind(of: name)
                guard kind != .state || from != nil, file.symlinkTarget == nil,
                      let key = store.settledKey(named: name, in: directory) else {
                    if let from { hidden[from] = nil; invalidations.append(inode) }
                    if kind != .state && file.symlinkTarget == nil {
                        Log.info("an editor's file that its program left behind is not kept: no key can have its name")
                    }
                    unlinkScratch(inode, tellKernel: true)
                    continue
                }
                do {
                    if let from, from != key, !file.written, !isBeingRecreated(from, store) {
                        // A rename with no editor behind it: the value moves, its type kept.
                        hidden[from] = nil
                        carryOutRemovals(overlapping: key, &store)
                        try store.move(from, onto: key)
                        if let previous = byKey[key], previous != inode { detach(previous, store) }
                        bind(inode, as: key, shown: nil)
                        changedWith(Committed(shown: nil), inode)
                        continue
                    }
                    try adopt(inode, as: key, &store)
                    if let from, from != key, hidden[from] == .renamedAway, !isBeingRecreated(from, store) {
                        hidden[from] = nil
                        if store.hasValue(from) { try store.remove(from) }
                    }
                } catch {
                    Log.error("an editor's file that its program left behind could not be kept as a key: \(error)")
                    if let from { hidden[from] = nil }
                    unlinkScratch(inode, tellKernel: true)
                }
            }
        }
    }

    /// Unlinked keys that a new file is about to replace stay (a lock ends that save: the
    /// old value is kept rather than neither).
    mutating func keepKeysBeingRecreated(_ store: Store) {
        for (key, state) in hidden where state != .renamedAway && isBeingRecreated(key, store) { hidden[key] = nil }
    }

    /// The directory went: its editor's files go with it (open ones keep their bytes).
    mutating func dropScratchFiles(in directory: LocalInode) {
        for (_, inode) in scratchIn[directory] ?? [:] { unlinkScratch(inode) }
    }

    /// Whether the key was unlinked and waits to leave (it counts as gone for rmdir).
    func isLeaving(_ key: Key) -> Bool {
        if case .unlinked? = hidden[key] { true } else { false }
    }

    // MARK: Content

    /// The text a read of the key's file shows now.
    private func currentText(_ file: File, _ key: Key, _ store: Store) throws(Errno) -> Buffer {
        if let pending = file.pending { return try pending.text.copied() }
        if let shown = file.shown { return try shown.copied() }
        let copy = try store.withText(of: key) { (text) -> Result<Buffer, Errno> in Result { () throws(Errno) in try Buffer(copying: text) } }
        return try copy.get()
    }

    /// Runs `body` on what a read of the file shows.
    func withContent<T>(_ inode: LocalInode, _ store: Store, _ body: (UnsafeRawBufferPointer) -> T) throws(Errno) -> T {
        guard let file = files[inode] else { throw .noSuchFileOrDirectory }
        if let target = file.symlinkTarget { return Array(target.utf8).withUnsafeBytes(body) }
        if let key = file.key {
            if let pending = file.pending { return pending.text.withUnsafeBytes(body) }
            if let shown = file.shown { return shown.withUnsafeBytes(body) }
            return try store.withText(of: key, body)
        }
        guard let content = file.content else { return body(UnsafeRawBufferPointer(start: nil, count: 0)) }
        return content.withUnsafeBytes(body)
    }

    func attributes(of inode: LocalInode, as number: InodeNumber, ownership: Ownership,
                    _ store: Store) throws(Errno) -> Attributes {
        guard let file = files[inode] else { throw .noSuchFileOrDirectory }
        let size = try withContent(inode, store) { $0.count }
        var attributes = ownership.file(number, mode: file.mode, size: UInt64(size), modified: file.modified)
        if file.symlinkTarget != nil { attributes.mode = S_IFLNK | 0o777 }
        attributes.changeTime = file.changed
        if case .unlinked = file.role { attributes.linkCount = 0 }
        return attributes
    }

    private func limit(of file: File, _ store: Store) -> Int {
        if let key = file.key ?? file.intendedKey { return store.limit(for: key) }
        return store.scratchLimit
    }

    // MARK: Descriptors

    /// An open of the file (`truncate`: with O_TRUNC, for writing).
    mutating func open(_ inode: LocalInode, handle: FileHandle, truncate: Bool, _ store: Store) throws(Errno) {
        guard files[inode] != nil else { throw .noSuchFileOrDirectory }
        // Counted only once it succeeded: the kernel sends no RELEASE for a failed open.
        if truncate { try resize(inode, to: 0, owner: handle, store) }
        files.update(inode) { $0.opens += 1 }
    }

    /// The last close of a descriptor: commits what it wrote (`commit` false: a handle
    /// from before a lock, whose writes count no more). The open is let go whatever happens.
    mutating func release(_ inode: LocalInode, handle: FileHandle, commit: Bool = true,
                          _ store: inout Store) throws(Errno) {
        guard files[inode] != nil else { return }
        defer {
            files.update(inode) { $0.opens -= 1 }
            dropIfRefused(inode, openElsewhere: 0)
            collect(inode)
        }
        if commit {
            try self.commit(inode, by: handle, finalClose: true, &store)
        } else if let pending = files[inode]?.pending, pending.owner == handle {
            files.update(inode) { $0.pending = nil }
            var text = pending.text
            text.wipe()
        }
    }

    /// `close(2)` (FLUSH): commits what the descriptor wrote.
    mutating func flush(_ inode: LocalInode, handle: FileHandle, _ store: inout Store) throws(Errno) {
        // At the close of the only descriptor, not at its RELEASE (which the kernel sends
        // after close has returned): the tool's next call already finds the old key.
        dropIfRefused(inode, openElsewhere: 1)
        try commit(inode, by: handle, finalClose: false, &store)
        // A truncation is committed at the last close only (a shell closes the descriptor
        // it truncated with before it writes through a copy); one its key cannot take is
        // said here, where `truncate -s 0` hears it, and never committed.
        if let file = files[inode], let key = file.key, let pending = file.pending, pending.owner == handle,
           !pending.written, !pending.text.withUnsafeBytes({ store.accepts($0, for: key, note: nil) }) {
            throw .invalidArgument
        }
        // Likewise a new file meant for a key, closed with nothing written (its last close
        // makes it the key: an empty value the key's remembered type refuses is refused now).
        if let file = files[inode], let key = file.intendedKey, file.isLinkedScratch, !file.written, !file.refused,
           !(file.content ?? Buffer()).withUnsafeBytes({ store.accepts($0, for: key, note: file.note) }) {
            files.update(inode) { $0.refused = true }
            throw .invalidArgument
        }
    }

    /// A file meant for a key whose only writes were refused goes, and the key it was to
    /// replace stays (the tool was told EINVAL; the last good value is kept).
    private mutating func dropIfRefused(_ inode: LocalInode, openElsewhere: Int) {
        guard let file = files[inode], file.opens <= openElsewhere, file.refused, !file.written,
              let key = file.intendedKey, file.isLinkedScratch else { return }
        hidden[key] = nil
        unlinkScratch(inode, tellKernel: true)
    }

    /// `truncate(2)`/`ftruncate(2)` (`deferred`: through a descriptor, committed later).
    mutating func truncate(_ inode: LocalInode, to size: Int, owner: FileHandle?, deferred: Bool,
                           _ store: inout Store) throws(Errno) {
        try resize(inode, to: size, owner: owner, store)
        if !deferred { try commit(inode, by: owner, finalClose: true, &store) }
    }

    private mutating func resize(_ inode: LocalInode, to size: Int, owner: FileHandle?, _ store: Store) throws(Errno) {
        guard let file = files[inode] else { throw .noSuchFileOrDirectory }
        guard size <= limit(of: file, store) else { throw .fileTooLarge }
        // In place: a copy of the file would copy its buffer (arrays are copied on write).
        if let key = file.key {
            try beginPending(inode, key, store)
            try files.modify(inode) { (file) throws(Errno) in
                guard file.pending != nil else { throw .noSuchFileOrDirectory }
                try file.pending?.text.resize(to: size)
                file.pending?.written = false
                file.pending?.rejected = false
                file.pending?.owner = owner
            }
        } else {
            try files.modify(inode) { (file) throws(Errno) in
                if file.content == nil { file.content = Buffer() }
                try file.content?.resize(to: size)
            }
        }
        touch(inode)
    }

    private mutating func touch(_ inode: LocalInode) {
        let now = Timestamp.now()
        files.update(inode) { file in
            file.modified = now
            file.changed = now
        }
    }

    /// Gives the key's file pending content (its current text) if it has none.
    private mutating func beginPending(_ inode: LocalInode, _ key: Key, _ store: Store) throws(Errno) {
        guard let file = files[inode] else { throw .noSuchFileOrDirectory }
        guard file.pending == nil else { return }
        let text = try currentText(file, key, store)
        files.update(inode) { $0.pending = PendingEdit(text: text) }
    }

    /// `write(2)`: into the key's pending content, or the editor's file. A write that is
    /// the whole value (`echo v > key`) is checked at once: EINVAL, and the pending content
    /// is never committed.
    mutating func write(_ inode: LocalInode, at offset: UInt64, _ data: UnsafeRawBufferPointer, append: Bool,
                        owner: FileHandle, _ store: Store) throws(Errno) {
        guard let file = files[inode] else { throw .noSuchFileOrDirectory }
        if file.symlinkTarget != nil { throw .invalidArgument }
        let limit = limit(of: file, store)
        // In place throughout: a copy of the file would copy its buffer at every write.
        defer { touch(inode) }
        if let key = file.key {
            try beginPending(inode, key, store)
            try files.modify(inode) { (file) throws(Errno) in
                guard let text = file.pending?.text else { throw .noSuchFileOrDirectory }
                file.pending?.owner = owner
                var start = append ? text.count : Int(clamping: offset)
                // An empty value reads as "\n": appending to it starts from nothing.
                if text.isSingle(0x0A) && (append || start == 1) {
                    try file.pending?.text.resize(to: 0)
                    start = 0
                }
                guard start <= limit, data.count <= limit - start else {
                    file.pending?.rejected = true
                    throw .fileTooLarge
                }
                if start == 0 && data.count >= (file.pending?.text.count ?? 0) && !store.accepts(data, for: key, note: nil) {
                    file.pending?.rejected = true
                    throw .invalidArgument
                }
                try file.pending?.text.write(data, at: start)
                file.pending?.written = true
            }
            return
        }
        try files.modify(inode) { (file) throws(Errno) in
            if file.content == nil { file.content = Buffer() }
            let count = file.content?.count ?? 0
            let start = append ? count : Int(clamping: offset)
            guard start <= limit, data.count <= limit - start else { throw .fileTooLarge }
            if start == 0 && data.count >= count, let key = file.intendedKey, !store.accepts(data, for: key, note: file.note) {
                file.refused = true
                throw .invalidArgument
            }
            try file.content?.write(data, at: start)
            file.written = true
        }
    }

    /// Makes written content the key's value, or does nothing (see `PendingEdit`); an
    /// editor's file meant for a key becomes it once written.
    mutating func commit(_ inode: LocalInode, by handle: FileHandle?, finalClose: Bool,
                         _ store: inout Store) throws(Errno) {
        guard let file = files[inode] else { return }
        switch file.role {
        case .key(let key):
            guard let pending = file.pending, pending.isCommitted(by: handle, finalClose: finalClose) else { return }
            files.update(inode) { $0.pending = nil }
            var text = pending.text
            defer { text.wipe() }
            if pending.rejected { throw .invalidArgument }
            carryOutRemovals(overlapping: key, &store)
            let saved = try store.commit(text, to: key, note: nil)
            // (The store may have re-read its file: only a file still bound shows the text.)
            if files[inode]?.key == key {
                files.update(inode) { file in
                    file.shown?.wipe()
                    file.shown = saved.shown
                    file.modified = .now()
                }
            }
            changedWith(saved, inode)
        case .scratch:
            // Written, or closed for the last time (`touch K`, an editor saving an empty
            // buffer): a new name closed is a key, never a file that vanishes later.
            guard let key = file.intendedKey, file.written || (finalClose && !file.refused && file.opens <= 1) else { return }
            do {
                try adopt(inode, as: key, &store)
            } catch {
                // Refused at close: like a refused write, the file goes at its last close
                // and the key keeps its last good value.
                if error == .invalidArgument || error == .fileTooLarge {
                    files.update(inode) { file in
                        file.refused = true
                        file.written = false
                    }
                }
                throw error
            }
        case .unlinked:
            return
        }
    }

    // MARK: Attributes of files

    mutating func setMode(_ inode: LocalInode, _ mode: mode_t) {
        files.update(inode) { file in
            file.mode = mode & 0o7777
            file.changed = .now()
        }
    }

    mutating func setModified(_ inode: LocalInode, _ time: Timestamp) {
        files.update(inode) { file in
            file.modified = time
            file.changed = .now()
        }
    }

    mutating func setNote(_ inode: LocalInode, _ note: Store.Note) { files.update(inode) { $0.note = note } }

    // MARK: Changes made by the store

    /// The key's value changed outside the engine: its shown text goes, the kernel forgets
    /// its pages.
    mutating func keyChanged(_ key: Key) {
        guard let inode = byKey[key] else { return }
        files.update(inode) { file in
            file.shown?.wipe()
            file.shown = nil
            file.modified = .now()
            file.changed = file.modified
        }
        invalidations.append(inode)
    }

    /// The key's value is gone (removed outside, or its place changed type): its file is
    /// unlinked, and the key is no longer hidden.
    mutating func keyGone(_ key: Key, _ store: Store) {
        hidden[key] = nil
        if let inode = byKey[key] { detach(inode, store) }
    }

    /// Keys whose files the kernel may hold.
    var boundKeys: Dictionary<Key, LocalInode>.Keys { byKey.keys }

    /// Moves key bindings (a directory renamed: every key below it has a new path).
    mutating func rebind(_ transform: (Key) -> Key?) {
        for (key, inode) in byKey {
            guard let moved = transform(key), moved != key else { continue }
            byKey[key] = nil
            byKey[moved] = inode
            files.update(inode) { $0.role = .key(moved) }
        }
        for (key, state) in hidden {
            guard let moved = transform(key), moved != key else { continue }
            hidden[key] = nil
            hidden[moved] = state
        }
        for inode in Array(files.keys) {
            files.update(inode) { file in
                if let key = file.intendedKey, let moved = transform(key) { file.intendedKey = moved }
                if let key = file.detachedFrom, let moved = transform(key) { file.detachedFrom = moved }
            }
        }
    }

    /// The key was given a value again (not through a file): it no longer waits to leave.
    mutating func unhide(_ key: Key) {
        if case .unlinked? = hidden[key] { hidden[key] = nil }
    }

    /// Forgets hidden keys that are gone from the store.
    mutating func dropHidden(where gone: (Key) -> Bool) {
        for key in hidden.keys where gone(key) { hidden[key] = nil }
    }

    /// Zeroes every buffer and unlinks every editor's file (a vault lock): returns every
    /// file the kernel may still hold, whose copies must go. Files stay while the kernel or
    /// a descriptor refers to them; hidden keys show again.
    mutating func wipeAll() -> [LocalInode] {
        let inodes = Array(files.keys)
        for inode in inodes {
            var unlinked: (directory: LocalInode, name: String)?
            files.update(inode) { file in
                file.wipe()
                if case .scratch(let directory, let name) = file.role {
                    unlinked = (directory, name)
                    file.role = .unlinked
                }
            }
            if let unlinked { entryInvalidations.append(unlinked) }
            // Key files stay until the kernel forgets them: a listing taken before the lock
            // may still hand them out.
            if files[inode]?.key == nil { collect(inode) }
        }
        scratchIn.removeAll()
        hidden.removeAll()
        return inodes
    }

    /// Counts for status and tests: files held, editor's files linked, hidden keys.
    var census: (files: Int, scratch: Int, hidden: Int) {
        (files.count, scratchIn.values.reduce(0) { $0 + $1.count }, hidden.count)
    }
}
