#if canImport(Glibc)
import Glibc
#endif

/// Plain POSIX threads for the daemon's long-lived work (FUSE workers, store watchers),
/// without Foundation's `Thread`: the daemon does not load Foundation at all.
///
/// Thread-safety: stateless; `start` and `detach` may be called from any thread.
public enum Threads {
    /// The body of a thread being started, retained across `pthread_create`.
    ///
    /// Thread-safety: immutable; handed from the starting thread to the new one.
    private final class Body {
        let run: @Sendable () -> Void
        init(_ run: @escaping @Sendable () -> Void) { self.run = run }
    }

    /// Runs `body` on a new joinable thread; nil when the system refuses one.
    public static func start(_ body: @escaping @Sendable () -> Void) -> pthread_t? {
        let context = Unmanaged.passRetained(Body(body)).toOpaque()
        var thread = pthread_t()
        guard pthread_create(&thread, nil, { context in
            Unmanaged<Body>.fromOpaque(context!).takeRetainedValue().run()
            return nil
        }, context) == 0 else {
            Unmanaged<Body>.fromOpaque(context).release()
            return nil
        }
        return thread
    }

    /// Runs `body` on a new detached thread; false when the system refuses one.
    @discardableResult
    public static func detach(_ body: @escaping @Sendable () -> Void) -> Bool {
        guard let thread = start(body) else { return false }
        pthread_detach(thread)
        return true
    }
}
