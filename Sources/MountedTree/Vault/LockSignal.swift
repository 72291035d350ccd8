#if canImport(Glibc)
import Glibc
#endif
import Posix
import Synchronization

/// SIGUSR1 to the daemon: "lock the vault now" (SPEC §3). The handler only sets a flag and
/// wakes the accounts tree's watcher through its eventfd (both async-signal-safe); the
/// watcher takes the request and locks.
///
/// Thread-safety: atomics only; one tree of a process receives the signal (the last that
/// caught it).
enum LockSignal {
    private static let requested = Atomic<Bool>(false)
    private static let wakeDescriptor = Atomic<Int32>(-1)

    /// Catches SIGUSR1 from now on (its default action kills), waking `wakeup`.
    static func catchRequests(waking wakeup: Wakeup) {
        _ = requested.load(ordering: .relaxed)  // initialized before the handler can run
        wakeDescriptor.store(wakeup.fd, ordering: .relaxed)
        Glibc.signal(SIGUSR1) { _ in
            LockSignal.requested.store(true, ordering: .relaxed)
            Wakeup.wake(LockSignal.wakeDescriptor.load(ordering: .relaxed))
        }
    }

    /// Whether SIGUSR1 arrived since the last call.
    static func take() -> Bool { requested.exchange(false, ordering: .relaxed) }
}
