#if canImport(Glibc)
import Glibc
#endif
import CPosixShims
import Synchronization

/// The daemon's log: standard error in the foreground, syslog (ident `mtmfs`) when detached.
///
/// Never pass a passphrase or a field value to it.
///
/// Thread-safety: the destination is behind a lock and the debug switch is atomic; each line
/// is written with one `write` or `syslog` call.
public enum Log {
    /// Where lines go.
    ///
    /// Thread-safety: a value; `Sendable`.
    public enum Destination: Sendable { case standardError, syslog, none }

    private static let destination = Locked<Destination>(.standardError)

    /// Chooses where lines go; `.syslog` opens the syslog connection.
    public static func use(_ newDestination: Destination) {
        if newDestination == .syslog { openlog("mtmfs", LOG_PID | LOG_NDELAY, LOG_DAEMON) }
        destination.withLock { $0 = newDestination }
    }

    private static let debugging = Atomic<Bool>(false)

    /// Turns debug lines on (`mtmfs mount --debug`): one line per request and per store event.
    public static func enableDebug() { debugging.store(true, ordering: .relaxed) }
    public static var isDebugging: Bool { debugging.load(ordering: .relaxed) }

    public static func debug(_ message: @autoclosure () -> String) {
        if isDebugging { write(LOG_DEBUG, "debug", message()) }
    }
    public static func info(_ message: String) { write(LOG_INFO, "info", message) }
    public static func warning(_ message: String) { write(LOG_WARNING, "warning", message) }
    public static func error(_ message: String) { write(LOG_ERR, "error", message) }

    private static func write(_ priority: Int32, _ label: String, _ message: String) {
        switch destination.withLock({ $0 }) {
        case .none: return
        case .syslog: mtmfs_syslog(priority, message)
        case .standardError:
            let line = Array("mtmfs: \(label): \(message)\n".utf8)
            line.withUnsafeBytes { _ = Glibc.write(2, $0.baseAddress, $0.count) }
        }
    }
}
