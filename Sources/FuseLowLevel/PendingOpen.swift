#if canImport(Glibc)
import Glibc
#endif
import CFuse
import Posix
import Synchronization

/// An OPEN as it arrives: answered by the `open` that returns, or postponed — the
/// low-level API lets any thread reply later — when the answer needs a person (a prompt),
/// so that the worker thread goes back to serving other requests meanwhile.
///
/// Valid only during the `open` call it is handed to.
/// Thread-safety: used on the calling worker thread only.
public struct OpenRequest {
    let request: fuse_req_t?
    let info: UnsafeMutablePointer<fuse_file_info>?
    let model: ModelAnswer?

    init(request: fuse_req_t?, info: UnsafeMutablePointer<fuse_file_info>?) {
        self.request = request
        self.info = info
        model = nil
    }

    /// Where a model of the kernel takes a postponed open's answer (`answering`).
    struct ModelAnswer {
        let answer: @Sendable (Result<OpenedFile, Errno>) -> Bool
        let postponed: (PendingOpen) -> Void
    }

    /// No request behind it (calls that cannot be postponed).
    public static var immediate: OpenRequest { OpenRequest(request: nil, info: nil) }

    /// An open that a model of the kernel sends (tests without a mount): postponed as the
    /// kernel's is, but answered to `answer` (which says, as `fuse_reply_open` does, whether
    /// the requester still waited for it); `postponed` gets the pending open at once, so
    /// that the model can interrupt it as a Ctrl-C of the requester would.
    public static func answering(_ answer: @escaping @Sendable (Result<OpenedFile, Errno>) -> Bool,
                                 postponed: @escaping (PendingOpen) -> Void) -> OpenRequest {
        OpenRequest(model: ModelAnswer(answer: answer, postponed: postponed))
    }

    private init(model: ModelAnswer) {
        request = nil
        info = nil
        self.model = model
    }

    /// Whether `postpone()` may be called.
    public var canPostpone: Bool { request != nil || model != nil }

    /// Takes the request over: the caller's `open` then returns nil, and the returned
    /// object replies exactly once, from any thread.
    public func postpone() -> PendingOpen {
        if let model {
            let pending = PendingOpen(model: model.answer)
            model.postponed(pending)
            return pending
        }
        precondition(request != nil && info != nil, "an OPEN without a request cannot be postponed")
        return PendingOpen(request: request!, info: info!.pointee)
    }
}

/// An OPEN the file system answers later. The requester sleeps in open(2) meanwhile;
/// when it is interrupted (Ctrl-C) the kernel sends INTERRUPT, and `onInterrupt`'s handler
/// runs (the answer then should be `fail(.interrupted)`).
///
/// Thread-safety: `reply` / `fail` may come from any thread, exactly one of them, once;
/// interrupt handlers run on a FUSE worker thread and must not reply themselves.
public final class PendingOpen: @unchecked Sendable {
    /// Where the answer goes: the kernel's request, or a model's (`OpenRequest.answering`).
    private enum Requester {
        case kernel(fuse_req_t, fuse_file_info)
        case model(@Sendable (Result<OpenedFile, Errno>) -> Bool)
    }
    private let requester: Requester
    private let id: UInt64
    private let answered = Atomic<Bool>(false)
    private let interruption = Mutex<(happened: Bool, handler: (@Sendable () -> Void)?)>((false, nil))

    fileprivate init(model answer: @escaping @Sendable (Result<OpenedFile, Errno>) -> Bool) {
        requester = .model(answer)
        id = PendingOpens.newNumber()
        PendingOpens.attach(self, id: id)
    }

    fileprivate init(request: fuse_req_t, info: fuse_file_info) {
        requester = .kernel(request, info)
        id = PendingOpens.newNumber()
        PendingOpens.attach(self, id: id)
        // Runs at once (on this thread) when the requester was interrupted already.
        fuse_req_interrupt_func(request, { _, data in
            PendingOpens.interrupted(UInt64(UInt(bitPattern: data)))
        }, UnsafeMutableRawPointer(bitPattern: UInt(id)))
    }

    /// Whether the requester was interrupted.
    public var isInterrupted: Bool { interruption.withLock { $0.happened } }

    /// Calls `handler` once when the requester is interrupted (at once if it already was).
    public func onInterrupt(_ handler: @escaping @Sendable () -> Void) {
        let now = interruption.withLock { state -> Bool in
            if state.happened { return true }
            state.handler = handler
            return false
        }
        if now { handler() }
    }

    /// The requester was interrupted: what the kernel's INTERRUPT does (a model of the
    /// kernel calls it for a Ctrl-C of its requester).
    public func interrupt() {
        let handler = interruption.withLock { state -> (@Sendable () -> Void)? in
            state.happened = true
            defer { state.handler = nil }
            return state.handler
        }
        handler?()
    }

    /// False when the open was not handed to the kernel (answered already, or the
    /// requester is gone): the caller then releases what it opened.
    @discardableResult
    public func reply(_ opened: OpenedFile) -> Bool {
        guard take() else { return false }
        switch requester {
        case .kernel(let request, var info):
            FuseBridge.apply(opened, to: &info)
            return fuse_reply_open(request, &info) == 0
        case .model(let answer):
            return answer(.success(opened))
        }
    }

    public func fail(_ error: Errno) {
        guard take() else { return }
        switch requester {
        case .kernel(let request, _): fuse_reply_err(request, error.rawValue)
        case .model(let answer): _ = answer(.failure(error))
        }
    }

    /// The first answer wins; the registry forgets the request before libfuse frees it.
    private func take() -> Bool {
        guard !answered.exchange(true, ordering: .acquiringAndReleasing) else { return false }
        PendingOpens.forget(id)
        return true
    }
}

/// The postponed OPENs by number: libfuse's interrupt callback gets a number, not an
/// object, so that a callback racing a reply finds nothing rather than a freed object.
///
/// Thread-safety: one mutex.
enum PendingOpens {
    private static let table = Mutex<(next: UInt64, opens: [UInt64: PendingOpen])>((1, [:]))

    static func newNumber() -> UInt64 {
        table.withLock { state in
            let id = state.next
            state.next += 1
            return id
        }
    }

    static func attach(_ open: PendingOpen, id: UInt64) {
        table.withLock { $0.opens[id] = open }
    }

    static func forget(_ id: UInt64) {
        _ = table.withLock { $0.opens.removeValue(forKey: id) }
    }

    static func interrupted(_ id: UInt64) {
        table.withLock { $0.opens[id] }?.interrupt()
    }

    /// The session ends: every OPEN still waiting is answered EINTR now, while its request
    /// can still be answered (a later answer does nothing).
    static func failAll() {
        for open in table.withLock({ Array($0.opens.values) }) { open.fail(.interrupted) }
    }
}
