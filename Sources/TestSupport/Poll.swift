#if canImport(Glibc)
import Glibc
#endif
import Posix

/// Waiting for something another process does (a mount appears, a daemon exits).
///
/// Thread-safety: no state; blocks only the calling thread.
public enum Poll {
    /// Checks `condition` every `interval` seconds for up to `seconds`; whether it held (it
    /// is checked once more at the deadline).
    @discardableResult
    public static func until(seconds: Double = 10, every interval: Double = 0.02, _ condition: () -> Bool) -> Bool {
        let started = ContinuousClock.now
        while started.secondsElapsed < seconds {
            if condition() { return true }
            usleep(useconds_t(interval * 1_000_000))
        }
        return condition()
    }
}
