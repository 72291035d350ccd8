#if canImport(Glibc)
import Glibc
#endif

/// A value behind a pthread mutex: `withLock` is the only way in.
///
/// Used instead of Synchronization's `Mutex`, whose Linux implementation locks with raw futex
/// calls that ThreadSanitizer cannot see: under `-sanitize=thread` every access it guards
/// is reported as a race, hiding any real one. pthread mutexes are intercepted by the
/// sanitizers and cost the same uncontended (one atomic exchange each way).
///
/// Thread-safety: every access takes the mutex; `body` must not call `withLock` of the same
/// instance (the mutex is not recursive).
public final class Locked<Value>: @unchecked Sendable {
    private let lock = Lock()
    private var value: Value

    public init(_ value: Value) { self.value = value }

    @inline(__always)
    public func withLock<Result, Failure: Error>(_ body: (inout Value) throws(Failure) -> Result) throws(Failure) -> Result {
        try lock.withLock { () throws(Failure) -> Result in try body(&value) }
    }
}

/// A pthread mutex guarding state kept elsewhere (the owner's stored properties), for types
/// whose state is too spread out to move into one `Locked` value.
///
/// Thread-safety: a mutex, not recursive; what it guards is safe only inside `withLock`.
public final class Lock: @unchecked Sendable {
    private let mutex: UnsafeMutablePointer<pthread_mutex_t>

    public init() {
        mutex = .allocate(capacity: 1)
        pthread_mutex_init(mutex, nil)
    }

    deinit {
        pthread_mutex_destroy(mutex)
        mutex.deallocate()
    }

    @inline(__always)
    public func withLock<Result, Failure: Error>(_ body: () throws(Failure) -> Result) throws(Failure) -> Result {
        pthread_mutex_lock(mutex)
        defer { pthread_mutex_unlock(mutex) }
        return try body()
    }
}

/// A counting POSIX semaphore: one thread posts, another waits (with a time limit).
///
/// Thread-safety: `post` and `wait` from any thread (`sem_post` is async-signal-safe).
public final class Semaphore: @unchecked Sendable {
    private let semaphore: UnsafeMutablePointer<sem_t>

    public init(_ value: UInt32 = 0) {
        semaphore = .allocate(capacity: 1)
        sem_init(semaphore, 0, value)
    }

    deinit {
        sem_destroy(semaphore)
        semaphore.deallocate()
    }

    public func post() { sem_post(semaphore) }

    /// Waits until posted.
    public func wait() {
        while sem_wait(semaphore) != 0 && errno == EINTR {}
    }

    /// Waits until posted or `seconds` passed; true when posted.
    @discardableResult
    public func wait(seconds: Double) -> Bool {
        var deadline = WallClock.now()  // (sem_timedwait takes a CLOCK_REALTIME deadline)
        let nanoseconds = Int(deadline.tv_nsec) + Int(seconds * 1e9)
        deadline.tv_sec += nanoseconds / 1_000_000_000
        deadline.tv_nsec = nanoseconds % 1_000_000_000
        while true {
            if sem_timedwait(semaphore, &deadline) == 0 { return true }
            if errno != EINTR { return false }
        }
    }
}
