#if canImport(Glibc)
import Glibc
#endif

extension ContinuousClock.Instant {
    /// Seconds from this instant until now (the clock counts time suspended too, so an
    /// auto-lock deadline passes while the machine sleeps).
    public var secondsElapsed: Double {
        let elapsed = duration(to: .now).components
        return Double(elapsed.seconds) + Double(elapsed.attoseconds) / 1e18
    }
}

/// The system's wall clock (`CLOCK_REALTIME`): the one place it is read. Files' times,
/// one-time codes, the vault's hybrid logical clock and the log's stamps come from it;
/// durations and deadlines come from `ContinuousClock` instead.
///
/// Thread-safety: stateless.
public enum WallClock {
    /// Now, as the kernel gives it.
    public static func now() -> timespec {
        var time = timespec()
        clock_gettime(CLOCK_REALTIME, &time)
        return time
    }

    /// Whole seconds since 1970 (0 before it).
    public static var seconds: UInt64 { UInt64(max(0, now().tv_sec)) }

    /// Milliseconds since 1970 (0 before it).
    public static var milliseconds: UInt64 {
        let time = now()
        return UInt64(max(0, time.tv_sec)) * 1000 + UInt64(max(0, time.tv_nsec)) / 1_000_000
    }

    /// Nanoseconds since 1970.
    public static var nanoseconds: Int64 {
        let time = now()
        return Int64(time.tv_sec) * 1_000_000_000 + Int64(time.tv_nsec)
    }
}
