#if canImport(Glibc)
import Glibc
#endif
import CFuse
import Synchronization

/// Every signal the daemon handles, in one place.
///
/// - SIGINT, SIGTERM and SIGHUP end the loop. libfuse's own handlers are not used: they skip
///   a signal inherited as ignored, which is what a daemon started with `&` from a script has.
/// - SIGUSR1 (a lock of the vault) is the accounts tree's own (`LockSignal` in MountedTree).
/// - SIGPIPE is ignored while serving.
///
/// Thread-safety: the handlers touch only atomics, `fuse_session_exit` and `sem_post`.
public enum DaemonSignals {
    nonisolated(unsafe) static var session: OpaquePointer?
    nonisolated(unsafe) static var stop: UnsafeMutablePointer<sem_t>?
    static let signals: [Int32] = [SIGINT, SIGTERM, SIGHUP]

    /// The handler ends the session and posts `stop` (both async-signal-safe), on whatever
    /// thread the signal lands.
    static func install(session: OpaquePointer, stop: UnsafeMutablePointer<sem_t>) {
        Self.session = session
        Self.stop = stop
        var action = sigaction()
        action.__sigaction_handler.sa_handler = { _ in
            if let session = DaemonSignals.session { fuse_session_exit(session) }
            if let stop = DaemonSignals.stop { sem_post(stop) }
        }
        sigemptyset(&action.sa_mask)
        action.sa_flags = 0
        for signal in signals { sigaction(signal, &action, nil) }
        var unblock = sigset_t()
        sigemptyset(&unblock)
        for signal in signals { sigaddset(&unblock, signal) }
        pthread_sigmask(SIG_UNBLOCK, &unblock, nil)
        Glibc.signal(SIGPIPE, SIG_IGN)
    }

    static func uninstall() {
        for signal in signals { Glibc.signal(signal, SIG_DFL) }
        session = nil
        stop = nil
    }

    /// Runs `body` (which starts threads) with every signal blocked, so that the threads it
    /// starts inherit a full mask and termination signals reach the waiting thread.
    static func withBlocked(_ body: () -> Void) {
        var all = sigset_t(), previous = sigset_t()
        sigfillset(&all)
        pthread_sigmask(SIG_BLOCK, &all, &previous)
        body()
        pthread_sigmask(SIG_SETMASK, &previous, nil)
    }
}
