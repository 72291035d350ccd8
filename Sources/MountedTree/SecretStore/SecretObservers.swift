import Posix
import SecretService

/// Who is told of changes of the accounts for the bus (the Secret Service's signals).
///
/// Thread-safety: handlers are kept and called under a lock of their own, which is never
/// held while anything else is taken (a handler only posts to the bus thread).
final class SecretObservers: Sendable {
    private let handlers = Locked<[@Sendable (SecretStoreChange) -> Void]>([])

    func add(_ handler: @escaping @Sendable (SecretStoreChange) -> Void) { handlers.withLock { $0.append(handler) } }

    func notify(_ change: SecretStoreChange) {
        for handler in handlers.withLock({ $0 }) { handler(change) }
    }
}

/// A Secret Service prompt being answered: dismissed once, from any thread.
///
/// Thread-safety: behind its own lock; handlers run outside it.
final class BusPrompt: Sendable {
    private let state = Locked<(cancelled: Bool, handlers: [@Sendable () -> Void])>((false, []))

    var isCancelled: Bool { state.withLock { $0.cancelled } }

    /// `handler` runs at the dismissal (at once if it came).
    func onCancel(_ handler: @escaping @Sendable () -> Void) {
        let now = state.withLock { s -> Bool in
            if s.cancelled { return true }
            s.handlers.append(handler)
            return false
        }
        if now { handler() }
    }

    func cancel() {
        let handlers = state.withLock { s -> [@Sendable () -> Void] in
            guard !s.cancelled else { return [] }
            s.cancelled = true
            defer { s.handlers.removeAll() }
            return s.handlers
        }
        for handler in handlers { handler() }
    }
}
