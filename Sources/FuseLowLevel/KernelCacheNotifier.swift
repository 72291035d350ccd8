#if canImport(Glibc)
import Glibc
#endif
import Posix
import Synchronization

/// Tells the kernel to drop what it cached of an inode or a name.
///
/// An invalidation of an inode's pages waits for their page locks, which the kernel may
/// hold until a pending request is answered: sent from a request, it can wait for a reply
/// that no free worker is left to give. So invalidations go through an outbox sent by one
/// thread of its own, in order, and no request thread ever waits for that thread: an OPEN
/// that must see fresh attributes takes its own inode's waiting invalidations out of the
/// outbox and sends one itself (`supersede`, `invalidateInodeNow`); work that must finish
/// after the kernel forgot (a lock's answer) is handed to the thread as a notice of its own
/// (`whenSent`). Subtrees are built before the mount exists, so they hold this and the
/// mount is attached later; without a mount, invalidations are dropped.
///
/// Thread-safety: every method may be called from any thread; the outbox is behind one
/// mutex, never held while the kernel is notified. The sending thread sleeps on a semaphore
/// while the outbox is empty (no wakeups when idle).
public final class KernelCacheNotifier: Sendable {
    /// One thing to send, or to run once everything before it was sent.
    ///
    /// Thread-safety: a value; `Sendable`.
    enum Notice: Sendable {
        case inode(InodeNumber)
        case entry(parent: InodeNumber, name: String)
        case sent(@Sendable () -> Void)
    }

    /// Thread-safety: used only under `KernelCacheNotifier.outbox`'s lock.
    struct Outbox: @unchecked Sendable {
        var mount: FuseMount?
        var notices: [Notice] = []
        /// The inode whose invalidation the thread is sending now.
        var sending: InodeNumber?
        var threadRunning = false
    }
    private let outbox = Mutex(Outbox())
    private let wake = Semaphore()

    public init() {}

    /// A mount to notify (its sending thread starts), or nil at the end: what waits is
    /// sent first (into a session that may be gone: the kernel then refuses it at once).
    public func attach(_ fuse: FuseMount?) {
        let start = outbox.withLock { box -> Bool in
            box.mount = fuse
            defer { if fuse != nil { box.threadRunning = true } }
            return fuse != nil && !box.threadRunning
        }
        if start {
            Threads.detach { [self] in sendForever() }
        } else if fuse == nil {
            wake.post()
        }
    }

    /// Drops attributes and cached data of `inode`, soon (in order with the others).
    public func invalidateInode(_ inode: InodeNumber) { post(.inode(inode)) }

    /// Drops the name `name` in directory `parent` (and with it the dentry → inode link), soon.
    public func invalidateEntry(parent: InodeNumber, name: String) { post(.entry(parent: parent, name: name)) }

    /// Runs `body` on the sending thread once everything asked for before it was sent (at
    /// once, on this thread, without a mount).
    public func whenSent(_ body: @escaping @Sendable () -> Void) {
        guard outbox.withLock({ $0.mount != nil }) else { return body() }
        post(.sent(body))
    }

    /// For an OPEN about to send its own invalidation of `inode`: the ones waiting for it in
    /// the outbox are dropped (superseded). True when one is being sent right now: it may
    /// land after the open's answer, and the kernel would then throw away the attributes it
    /// asks for next (their version is older): such an open should not rely on them.
    public func supersede(_ inode: InodeNumber) -> Bool {
        outbox.withLock { box -> Bool in
            box.notices.removeAll { if case .inode(inode) = $0 { return true } else { return false } }
            return box.sending == inode
        }
    }

    /// Drops attributes and cached data of `inode` on the calling thread, before returning.
    /// Only from a request during which the kernel holds no lock of this inode's pages or
    /// of its directory (OPEN of the inode itself, say); never from LOOKUP, CREATE, READ,
    /// WRITE, RENAME or the like.
    public func invalidateInodeNow(_ inode: InodeNumber) {
        outbox.withLock { $0.mount }?.invalidateInode(inode)
    }

    private func post(_ notice: Notice) {
        let posted = outbox.withLock { box -> Bool in
            guard box.mount != nil else { return false }
            box.notices.append(notice)
            return true
        }
        if posted { wake.post() }
    }

    /// The sending thread: sleeps until posted, sends everything waiting, in order; ends
    /// once no mount is attached and nothing waits.
    private func sendForever() {
        while true {
            wake.wait()
            while true {
                let next = outbox.withLock { box -> (notice: Notice, mount: FuseMount?)?? in
                    guard !box.notices.isEmpty else {
                        guard box.mount == nil else { return .some(nil) }  // idle: sleep
                        box.threadRunning = false
                        return nil  // detached and sent: end
                    }
                    let notice = box.notices.removeFirst()
                    if case .inode(let inode) = notice { box.sending = inode }
                    return (notice, box.mount)
                }
                guard let next else { return }
                guard let (notice, mount) = next else { break }
                switch notice {
                case .inode(let inode): mount?.invalidateInode(inode)
                case .entry(let parent, let name): mount?.invalidateEntry(parent: parent, name: name)
                case .sent(let body): body()
                }
                outbox.withLock { $0.sending = nil }
            }
        }
    }
}
