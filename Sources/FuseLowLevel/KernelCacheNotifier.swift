#if canImport(Glibc)
import Glibc
#endif
import Posix
import Synchronization

/// Where invalidations go: the kernel in front of a mount (`FuseMount`), or a model of it.
///
/// Thread-safety: called from the notifier's thread and from requests at once.
public protocol KernelCache: AnyObject, Sendable {
    /// Drops an inode's attributes and the pages in [offset, offset + length) (0: all).
    @discardableResult
    func invalidateInode(_ inode: InodeNumber, offset: Int64, length: Int64) -> Bool
    /// Drops the name `name` in directory `parent`.
    @discardableResult
    func invalidateEntry(parent: InodeNumber, name: String) -> Bool
    /// How many worker threads answer its requests.
    var workerCount: UInt32 { get }
}

extension FuseMount: KernelCache {}

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
        var mount: (any KernelCache)?
        var notices: [Notice] = []
        /// Where the waiting notices start in `notices` (taken ones are dropped in batches).
        var head = 0
        /// The inode whose invalidation the thread is sending now, and whether it is sending
        /// anything (or running a `whenSent` body).
        var sending: InodeNumber?
        var busy = false
        var threadRunning = false
        /// Requests inside `invalidateInodeNow`, and how many may be at once: one fewer than
        /// the mount's workers, so that one worker is always left to answer the request
        /// whose page lock they may be waiting for.
        var sendingNow = 0
        var sendingNowLimit = 0
    }
    private let outbox = Mutex(Outbox())
    private let wake = Semaphore()

    public init() {}

    /// A mount to notify (its sending thread starts). nil at the end, before the session is
    /// unmounted: what waits is dropped (the kernel forgets everything with the mount), the
    /// `whenSent` bodies still run, and this returns once the thread is out of any send
    /// (at most `seconds`: a send can wait for a page lock that only a reply would free),
    /// so that no send writes to the session's descriptor once it is closed and reused.
    public func attach(_ fuse: (any KernelCache)?, waitingAtMost seconds: Double = 1) {
        let start = outbox.withLock { box -> Bool in
            box.mount = fuse
            if let fuse { box.sendingNowLimit = Int(fuse.workerCount) - 1 }
            guard fuse != nil, !box.threadRunning else { return false }
            box.threadRunning = true
            return true
        }
        if start {
            if !Threads.detach({ [self] in sendForever() }) {
                outbox.withLock { box in
                    box.threadRunning = false
                    box.mount = nil  // nothing would send what is posted: nothing is taken
                }
                Log.error("no thread for the kernel's invalidations: the kernel keeps what it cached until its timeouts")
            }
        } else if fuse == nil {
            wake.post()
            let deadline = ContinuousClock.now.advanced(by: .milliseconds(Int(seconds * 1000)))
            while outbox.withLock({ $0.busy || $0.head < $0.notices.count }), ContinuousClock.now < deadline {
                usleep(1_000)  // only at the end of the mount
            }
        }
    }

    /// Drops attributes and cached data of `inode`, soon (in order with the others).
    public func invalidateInode(_ inode: InodeNumber) { post(.inode(inode)) }

    /// Drops the name `name` in directory `parent` (and with it the dentry → inode link), soon.
    public func invalidateEntry(parent: InodeNumber, name: String) { post(.entry(parent: parent, name: name)) }

    /// Runs `body` on the sending thread once everything asked for before it was sent (at
    /// once, on this thread, when nothing would send: no mount).
    public func whenSent(_ body: @escaping @Sendable () -> Void) {
        if !post(.sent(body)) { body() }
    }

    /// For an OPEN about to send its own invalidation of `inode`: the ones waiting for it in
    /// the outbox are dropped (superseded) — not one queued before a `whenSent` body, whose
    /// waiter (a lock) must know it was sent. Then waits, a little (`seconds`), while one of
    /// them is being sent or stays queued: it may land after the open's answer, and the
    /// kernel would then throw away the attributes it asks for next (their version is
    /// older). True when one is still pending after the wait: such an open should not rely
    /// on the kernel's cache.
    public func supersede(_ inode: InodeNumber, waitingAtMost seconds: Double = 0.05) -> Bool {
        func isThis(_ notice: Notice) -> Bool { if case .inode(inode) = notice { return true } else { return false } }
        var deadline: ContinuousClock.Instant?
        while outbox.withLock({ box -> Bool in
            // The usual case, at no cost: nothing waits.
            guard box.head < box.notices.count else { return box.sending == inode }
            let after = (box.notices[box.head...].lastIndex { if case .sent = $0 { return true } else { return false } } ?? box.head - 1) + 1
            if box.notices[after...].contains(where: isThis) {
                box.notices.replaceSubrange(after..., with: box.notices[after...].filter { !isThis($0) })
            }
            return box.notices[box.head..<after].contains(where: isThis) || box.sending == inode
        }) {
            let now = ContinuousClock.now
            if deadline == nil { deadline = now.advanced(by: .milliseconds(Int(seconds * 1000))) }
            if let deadline, now >= deadline { return true }
            usleep(200)  // rare: an invalidation of this very inode is on its way
        }
        return false
    }

    /// Drops attributes and cached data of `inode` on the calling thread, before returning.
    /// Only from a request during which the kernel holds no lock of this inode's pages or
    /// of its directory (OPEN of the inode itself, say); never from LOOKUP, CREATE, READ,
    /// WRITE, RENAME or the like.
    ///
    /// Even an OPEN can wait here for another handle's pages: a read-ahead or a WRITE of the
    /// same inode keeps them locked until its request is answered. So at most one request
    /// fewer than the mount's workers sends here at once; when that many already are, this
    /// sends nothing and answers false: the open must then not rely on the kernel's cache
    /// (direct I/O), and its worker stays free to answer the request they wait for. True
    /// when sent, or when there is no mount (nothing is cached).
    public func invalidateInodeNow(_ inode: InodeNumber) -> Bool {
        let admitted = outbox.withLock { box -> (any KernelCache)?? in
            guard let mount = box.mount else { return .some(nil) }
            guard box.sendingNow < box.sendingNowLimit else { return nil }
            box.sendingNow += 1
            return mount
        }
        guard let admitted else { return false }
        guard let mount = admitted else { return true }
        mount.invalidateInode(inode, offset: 0, length: 0)
        outbox.withLock { $0.sendingNow -= 1 }
        return true
    }

    /// False when nothing would send it (no mount, or no thread).
    @discardableResult
    private func post(_ notice: Notice) -> Bool {
        let posted = outbox.withLock { box -> Bool in
            guard box.mount != nil else { return false }
            box.notices.append(notice)
            return true
        }
        if posted { wake.post() }
        return posted
    }

    /// The sending thread: sleeps until posted, sends everything waiting, in order; ends
    /// once no mount is attached and nothing waits (without a mount, invalidations are
    /// dropped and `whenSent` bodies run).
    private func sendForever() {
        while true {
            wake.wait()
            while true {
                let next = outbox.withLock { box -> (notice: Notice, mount: (any KernelCache)?)?? in
                    guard box.head < box.notices.count else {
                        (box.notices, box.head, box.busy) = ([], 0, false)
                        guard box.mount == nil else { return .some(nil) }  // idle: sleep
                        box.threadRunning = false
                        return nil  // detached and sent: end
                    }
                    let notice = box.notices[box.head]
                    box.head += 1
                    if box.head >= 1024 && box.head * 2 >= box.notices.count {
                        box.notices.removeFirst(box.head)
                        box.head = 0
                    }
                    if case .inode(let inode) = notice { box.sending = inode }
                    box.busy = true
                    return (notice, box.mount)
                }
                guard let next else { return }
                guard let (notice, mount) = next else { break }
                switch notice {
                case .inode(let inode): mount?.invalidateInode(inode, offset: 0, length: 0)
                case .entry(let parent, let name): mount?.invalidateEntry(parent: parent, name: name)
                case .sent(let body): body()
                }
                outbox.withLock { box in (box.sending, box.busy) = (nil, false) }
            }
        }
    }
}
