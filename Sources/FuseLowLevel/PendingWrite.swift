#if canImport(Glibc)
import Glibc
#endif
import CFuse
import Posix
import Synchronization

/// A WRITE as it arrives: answered by the `write` that returns, or postponed when its answer
/// must wait for work of another thread (a lock waits until the kernel was told to forget
/// every field), so that no worker thread waits meanwhile.
///
/// Valid only during the `write` call it is handed to.
/// Thread-safety: used on the calling worker thread only.
public struct WriteRequest {
    let request: fuse_req_t?

    /// No request behind it (unit tests, and calls that cannot be postponed).
    public static var immediate: WriteRequest { WriteRequest(request: nil) }

    /// Takes the request over (nil when it cannot be: the caller answers by returning): the
    /// caller's `write` then returns nil, and the returned object replies once, from any thread.
    public func postpone() -> PendingWrite? { request.map { PendingWrite(request: $0) } }
}

/// A WRITE the file system answers later; the writer sleeps in write(2) meanwhile.
///
/// Thread-safety: `reply` / `fail` may come from any thread; the first answer wins.
public final class PendingWrite: @unchecked Sendable {
    private let request: fuse_req_t
    private let answered = Atomic<Bool>(false)

    fileprivate init(request: fuse_req_t) {
        self.request = request
        PendingWrites.table.withLock { $0[ObjectIdentifier(self)] = self }
    }

    public func reply(_ written: Int) {
        guard take() else { return }
        _ = fuse_reply_write(request, written)
    }

    public func fail(_ error: Errno) {
        guard take() else { return }
        fuse_reply_err(request, error.rawValue)
    }

    private func take() -> Bool {
        guard !answered.exchange(true, ordering: .acquiringAndReleasing) else { return false }
        _ = PendingWrites.table.withLock { $0.removeValue(forKey: ObjectIdentifier(self)) }
        return true
    }
}

/// The postponed WRITEs, so that the session's end answers those still waiting.
///
/// Thread-safety: one mutex.
enum PendingWrites {
    static let table = Mutex<[ObjectIdentifier: PendingWrite]>([:])

    /// The session ends: every WRITE still waiting is answered EINTR now, while its request
    /// can still be answered (a later answer does nothing).
    static func failAll() {
        for write in table.withLock({ Array($0.values) }) { write.fail(.interrupted) }
    }
}
