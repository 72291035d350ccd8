import FuseLowLevel
import Posix

/// The state of a tree served by the editing engine (`settings/`, `accounts/`), as seen by
/// what every change does around it (`EditingTree.locked`).
///
/// Thread-safety: a value behind its tree's lock.
protocol EditingTreeState {
    associatedtype Store: EditedStore
    var engine: EditingEngine<Store> { get }
    /// Throws when no request can be answered now (settings/: the plist unreadable;
    /// accounts/: no vault).
    mutating func admit() throws(Errno)
    /// The invalidations queued so far (emptied).
    mutating func takeInvalidations() -> [Invalidation]
    /// Saves prepared under the lock, to write and sync once it is let go (emptied).
    mutating func takeSaves() -> [any DeferredSave]
    /// After saves were written and finished (under the lock): when one failed, what is in
    /// memory is read again from the store, so that nothing shows a value not on disk.
    mutating func savesFinished(failed: Bool)
    /// Whether the tree's watcher has work to do now (woken after saves).
    var backgroundWorkDue: Bool { get }
}

extension EditingTreeState {
    mutating func takeSaves() -> [any DeferredSave] { [] }
    mutating func savesFinished(failed: Bool) {}
    var backgroundWorkDue: Bool { false }
}

/// A store's save prepared under its tree's lock: written and synced with the lock let go
/// (no request waits on another's disk sync), then finished under the lock again.
///
/// Thread-safety: `write` from any thread, once; `finish` under the tree's lock, after it.
protocol DeferredSave: AnyObject, Sendable {
    func write()
    /// Why the write failed (nil: it is on disk, or a later save holding it is).
    var failure: Errno? { get }
    func finish()
}

/// State served by the editing engine behind one lock, and what every change does around
/// it, written once for both trees — the kernel's copies of what changed are invalidated
/// after the lock is let go, and the watcher is woken when an unlinked name must now leave
/// sooner than it planned to look. `settings/` is its own (`SettingsTree`); `accounts/`'
/// is the vault service's (`VaultService`), which its doors share.
///
/// Thread-safety: `state` is the one lock; the notifier and the gate are thread-safe.
protocol EditingLock: AnyObject, Sendable {
    associatedtype State: EditingTreeState
    var state: Locked<State> { get }
    /// The inode numbers of the tree its changes invalidate.
    var space: InodeSpace { get }
    var notifier: KernelCacheNotifier { get }
    /// Readers keep the kernel's pages of a file until it changes.
    var pageCache: PageCacheGate { get }
    /// Wakes the tree's watcher (its next deadline may now be sooner).
    var wakeup: Wakeup { get }
    /// Called just before saves are written, with the lock let go (tests look at the lock).
    func savesWillWrite()
}

extension EditingLock {
    func savesWillWrite() {}
}

/// A tree of the mount served by the editing engine.
protocol EditingTree: Subtree, EditingLock {}

extension EditingLock {
    /// Runs `body` under the lock (refused with `admit`'s errno first), then sends the
    /// invalidations queued — whether or not the request succeeded: what changed before a
    /// failure changed.
    func locked<T: Sendable>(_ body: (inout State) throws(Errno) -> T) throws(Errno) -> T {
        let outcome = state.withLock { (s) -> (Result<T, Errno>, [Invalidation], Bool, [any DeferredSave]) in
            let due = s.engine.nextRemovalDue
            let result = Result { () throws(Errno) -> T in
                try s.admit()
                return try body(&s)
            }
            return (result, s.takeInvalidations(), s.engine.removalComesSooner(than: due) || s.engine.creatorsChanged, s.takeSaves())
        }
        send(outcome.1)
        if outcome.2 { wakeup.wake() }
        if let failure = writeOutside(outcome.3), case .success = outcome.0 { throw failure }
        return try outcome.0.get()
    }

    /// Writes and syncs the saves a change prepared, with the lock let go, then finishes
    /// them under it; the request is answered after this (what it changed is on disk).
    /// Returns the first failure.
    func writeOutside(_ saves: [any DeferredSave]) -> Errno? {
        guard !saves.isEmpty else { return nil }
        savesWillWrite()
        for save in saves { save.write() }
        let failure = saves.lazy.compactMap(\.failure).first
        let (invalidations, due) = state.withLock { s in
            for save in saves { save.finish() }
            s.savesFinished(failed: failure != nil)
            return (s.takeInvalidations(), s.backgroundWorkDue)
        }
        send(invalidations)
        if due { wakeup.wake() }
        return failure
    }

    /// As `locked`, for what must happen even when requests are refused (a release lets its
    /// open go).
    @discardableResult
    func lockedAlways<T>(_ body: (inout State) -> T) -> T {
        let (invalidations, sooner, saves, result) = state.withLock { (s) -> ([Invalidation], Bool, [any DeferredSave], T) in
            let due = s.engine.nextRemovalDue
            let result = body(&s)
            return (s.takeInvalidations(), s.engine.removalComesSooner(than: due) || s.engine.creatorsChanged, s.takeSaves(), result)
        }
        send(invalidations)
        if sooner { wakeup.wake() }
        _ = writeOutside(saves)  // a release cannot fail: the log says it (see SettingsDocument.Save)
        return result
    }


    /// Sends the invalidations of a change (after the lock); any change also closes the
    /// page cache gate, so the next open of any file checks its pages.
    func send(_ invalidations: [Invalidation]) {
        guard !invalidations.isEmpty else { return }
        pageCache.changed()
        for invalidation in invalidations {
            switch invalidation {
            case .inode(let local): notifier.invalidateInode(space.inode(local))
            case .entry(let parent, let name): notifier.invalidateEntry(parent: space.inode(parent), name: name)
            }
        }
    }
}
