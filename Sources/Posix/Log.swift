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

    /// A file every line goes to as well (`DATA_DIR/mtmfs.log`): a user without journald or
    /// `/dev/log` can always read the log. Bounded: past `fileLimit` bytes it becomes
    /// `mtmfs.log.1` (replacing the one before) and a new file starts.
    ///
    /// Thread-safety: behind its own lock; one `write` a line.
    private struct LogFile {
        var path: String
        var fd: Int32
        var size: Int
    }
    private static let file = Locked<LogFile?>(nil)
    public static let fileLimit = 1 << 20

    /// Lines go to `path` too (created 0600, appended to), from now on.
    public static func alsoWrite(to path: String) {
        let fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0o600)
        guard fd >= 0 else { return }
        var st = stat()
        let size = fstat(fd, &st) == 0 ? Int(st.st_size) : 0
        file.withLock { current in
            if let current { Glibc.close(current.fd) }
            current = LogFile(path: path, fd: fd, size: size)
        }
    }

    /// The file lines also go to, if any.
    public static var filePath: String? { file.withLock { $0?.path } }

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
        writeToFile(label, message)
        switch destination.withLock({ $0 }) {
        case .none: return
        case .syslog: mtmfs_syslog(priority, message)
        case .standardError:
            let line = Array("mtmfs: \(label): \(message)\n".utf8)
            line.withUnsafeBytes { _ = Glibc.write(2, $0.baseAddress, $0.count) }
        }
    }

    private static func writeToFile(_ label: String, _ message: String) {
        file.withLock { current in
            guard var log = current else { return }
            let now = WallClock.now()
            var broken = tm()
            var seconds = now.tv_sec
            gmtime_r(&seconds, &broken)
            let stamp = padded(Int(broken.tm_year) + 1900, 4) + "-" + padded(Int(broken.tm_mon) + 1, 2) + "-"
                + padded(Int(broken.tm_mday), 2) + "T" + padded(Int(broken.tm_hour), 2) + ":"
                + padded(Int(broken.tm_min), 2) + ":" + padded(Int(broken.tm_sec), 2) + "Z"
            let line = Array("\(stamp) [\(getpid())] \(label): \(message)\n".utf8)
            if log.size + line.count > fileLimit {
                // Rotated: the old lines to `.1`, a new file (a second daemon of the data
                // directory never runs: the claim is held).
                _ = rename(log.path, log.path + ".1")
                let fd = open(log.path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0o600)
                if fd >= 0 {
                    Glibc.close(log.fd)
                    log.fd = fd
                    log.size = 0
                }
            }
            let written = line.withUnsafeBytes { Glibc.write(log.fd, $0.baseAddress, $0.count) }
            if written > 0 { log.size += written }
            current = log
        }
    }
}

/// Zero-padded decimals for the log file's time stamps.
private func padded(_ value: Int, _ width: Int) -> String {
    let digits = "\(value)"
    return String(repeating: "0", count: max(0, width - digits.count)) + digits
}
