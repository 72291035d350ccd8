#if canImport(Glibc)
import Glibc
#endif
import CPosixShims

/// Whether a process runs. An exited process that its parent (or init) has not reaped yet
/// is a zombie, and `kill(pid, 0)` still succeeds on it: /proc/PID/stat tells.
///
/// Thread-safety: stateless; each call reads /proc afresh.
public enum ProcessState {
    public static func isRunning(_ pid: pid_t) -> Bool {
        // A pidfd turns readable only once every thread has exited: a leader already a
        // zombie while another thread still finishes a sync, holding the process's files
        // and their locks, still runs. /proc/PID/stat says Z for it.
        let pinned = mtmfs_pidfd_open(pid)
        if pinned >= 0 {
            defer { Syscall.close(pinned) }
            return ProcessInspection.isRunning(pinned: pinned)
        }
        guard kill(pid, 0) == 0 || errno != ESRCH else { return false }
        guard let fd = try? Syscall.open("/proc/\(pid)/stat", O_RDONLY) else { return false }
        defer { Syscall.close(fd) }
        let text = (try? Syscall.readAll(fd)) ?? []
        // "PID (COMM) STATE …": COMM may hold spaces and parentheses; STATE follows the last ')'.
        guard let close = text.lastIndex(of: UInt8(ascii: ")")), close + 2 < text.count else { return false }
        let state = text[close + 2]
        return state != UInt8(ascii: "Z") && state != UInt8(ascii: "X")
    }

    /// The command name of a process (/proc/PID/comm), nil when it is gone.
    public static func name(of pid: pid_t) -> String? {
        guard let fd = try? Syscall.open("/proc/\(pid)/comm", O_RDONLY) else { return nil }
        defer { Syscall.close(fd) }
        return (try? Syscall.readAll(fd)).map { String(decoding: $0.prefix { $0 != UInt8(ascii: "\n") }, as: UTF8.self) }
    }
}

/// A process pinned by a pidfd, to learn when it has exited: its descriptor turns readable
/// then (a `Wakeup` can watch it), and the number is never another process's meanwhile.
///
/// Thread-safety: immutable; the descriptor closes when the last reference goes.
public final class PinnedProcess: Sendable {
    public let fd: Int32

    /// The process of thread `thread` (a request's pid is its thread's); nil when it is
    /// gone already or cannot be pinned.
    public init?(thread: pid_t) {
        guard thread > 0 else { return nil }
        let process = ProcessInspection.decisionStatus(of: thread)?.process ?? thread
        let fd = mtmfs_pidfd_open(process)
        guard fd >= 0 else { return nil }
        self.fd = fd
    }

    deinit { Syscall.close(fd) }

    /// Whether every thread of it has exited.
    public var hasExited: Bool { !ProcessInspection.isRunning(pinned: fd) }
}
