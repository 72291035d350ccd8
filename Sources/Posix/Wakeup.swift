#if canImport(Glibc)
import Glibc
#endif
import CPosixShims
import Synchronization

/// How a daemon thread sleeps: until its next deadline, until another thread (or a signal
/// handler) wakes it, or until one of its own descriptors is readable (an inotify watch).
/// No polling loop: idle, with no deadline, the thread does not wake at all.
///
/// `wake()` writes the eventfd, which is async-signal-safe: a signal handler may call it
/// (see `signalSafeWake`). Wakes before a `wait` are not lost: the count stays in the
/// eventfd until the wait reads it.
///
/// Without an eventfd (the descriptor table full at start), `wait` still returns at its
/// deadline and for its descriptors, but at most a second later than a wake: slower, never
/// stuck.
///
/// Thread-safety: `wake()` from any thread or handler; `wait` from the one sleeping thread.
public final class Wakeup: Sendable {
    /// The eventfd, or -1 when none could be made.
    public let fd: Int32

    public init() {
        let fd = mtmfs_eventfd()
        if fd < 0 { Log.error("eventfd: \(Errno.current); daemon threads check their work every second instead") }
        self.fd = fd
    }

    deinit { if fd >= 0 { Syscall.close(fd) } }

    /// A wake written and not yet read by `wait`: a wake then writes nothing (a committing
    /// store wakes its maintenance thread at every commit — an fsync each, for a database
    /// inside — and the thread reads the wakes at most twice a second).
    private let posted = Atomic<Bool>(false)

    public func wake() {
        guard !posted.exchange(true, ordering: .sequentiallyConsistent) else { return }
        Self.wake(fd)
    }

    /// The same for a signal handler that knows only the descriptor.
    public static func wake(_ fd: Int32) {
        guard fd >= 0 else { return }
        var one: UInt64 = 1
        _ = Glibc.write(fd, &one, 8)
    }

    /// Sleeps until `deadline` (nil: none), a `wake()`, or until one of `descriptors` can be
    /// read; returns the descriptors that can (the wake itself is consumed, not returned).
    @discardableResult
    public func wait(until deadline: ContinuousClock.Instant?, watching descriptors: [Int32] = []) -> [Int32] {
        var polled = ([fd] + descriptors).map { pollfd(fd: $0, events: Int16(POLLIN), revents: 0) }
        var timeout: Int32 = fd >= 0 ? -1 : 1000
        if let deadline {
            let left = ContinuousClock.now.duration(to: deadline)
            let (seconds, attoseconds) = left.components
            // Rounded up: woken a little after the deadline, never just before it.
            let milliseconds = seconds * 1000 + (attoseconds + 999_999_999_999_999) / 1_000_000_000_000_000
            timeout = Int32(clamping: max(0, milliseconds))
            if fd < 0 { timeout = min(timeout, 1000) }
        }
        let count = poll(&polled, nfds_t(polled.count), timeout)
        guard count > 0 else { return [] }
        if fd >= 0 && polled[0].revents != 0 {
            var value: UInt64 = 0
            _ = Glibc.read(fd, &value, 8)
            // After the read: a wake between the two finds it posted and writes nothing, and
            // the caller, about to look at its work, sees what that wake was for.
            posted.store(false, ordering: .sequentiallyConsistent)
        }
        return polled.dropFirst().filter { $0.revents != 0 }.map(\.fd)
    }
}

/// Changes to one file, through inotify on the directory that holds it (so a replacement
/// by rename, as editors and atomic saves do, is seen too).
///
/// Thread-safety: `changed()` from the one thread that watches.
public final class FileWatch: Sendable {
    public let fd: Int32
    let name: String

    /// Watches `path`'s directory for events about `path`'s name.
    public init(_ path: String) throws(Errno) {
        let slash = path.lastIndex(of: "/")
        let directory = slash.map { $0 == path.startIndex ? "/" : String(path[..<$0]) } ?? "."
        name = slash.map { String(path[path.index(after: $0)...]) } ?? path
        fd = try Syscall.valueOrErrno { mtmfs_inotify_init() }
        do {
            _ = try Syscall.valueOrErrno { mtmfs_inotify_watch_directory(fd, directory) }
        } catch {
            Syscall.close(fd)
            throw error
        }
    }

    deinit { Syscall.close(fd) }

    /// A watch of `path`, or nil with a line in the log saying what that costs (`otherwise`).
    public static func logging(_ path: String, otherwise consequence: String) -> FileWatch? {
        logged(path, consequence) { () throws(Errno) in try FileWatch(path) }
    }

    /// `make`'s watch, or nil with the error and its `consequence` in the log.
    static func logged<Watch>(_ path: String, _ consequence: String, _ make: () throws(Errno) -> Watch) -> Watch? {
        do {
            return try make()
        } catch {
            Log.error("inotify on \(path): \(error); \(consequence)")
            return nil
        }
    }

    /// Reads the events waiting; whether one was about the file (or the kernel dropped some).
    public func changed() -> Bool {
        var changed = false
        Self.drain(fd) { _, mask, eventName in
            if mask & UInt32(IN_Q_OVERFLOW) != 0 || mask & UInt32(IN_IGNORED) != 0 || eventName == name { changed = true }
        }
        return changed
    }

    /// Reads every event waiting on the inotify descriptor `fd` (until it would block),
    /// handing each to `each` (its watch, mask and name) one read at a time; `afterRead`
    /// runs after each read's events (to add watches before the next one).
    static func drain(_ fd: Int32, afterRead: () -> Void = {}, _ each: (Int32, UInt32, String) -> Void) {
        var buffer = [UInt8](repeating: 0, count: 16 << 10)
        while true {
            let n = buffer.withUnsafeMutableBytes { Glibc.read(fd, $0.baseAddress!, $0.count) }
            guard n > 0 else { return }
            buffer.withUnsafeBytes { bytes in
                var offset = 0
                while offset + 16 <= n {
                    // struct inotify_event: wd, mask, cookie (4 bytes each), len, then the name.
                    let watch = bytes.loadUnaligned(fromByteOffset: offset, as: Int32.self)
                    let mask = bytes.loadUnaligned(fromByteOffset: offset + 4, as: UInt32.self)
                    let length = Int(bytes.loadUnaligned(fromByteOffset: offset + 12, as: UInt32.self))
                    let name = String(decoding: bytes[(offset + 16)..<min(n, offset + 16 + length)].prefix { $0 != 0 }, as: UTF8.self)
                    each(watch, mask, name)
                    offset += 16 + length
                }
            }
            afterRead()
        }
    }
}

/// A watch of a folder and of the folders in it, one level down (a vault folder and its
/// device folders): `changed` says whether a file was written, moved in or out, or removed
/// in any of them since the last look. A folder made in it is watched from then on. A file
/// only created (still being written) is not a change: its close is.
///
/// Thread-safety: `changed` from one thread (the watcher's).
public final class FolderWatch: Sendable {
    public let fd: Int32
    let path: String
    let top: Int32

    public init(_ path: String) throws(Errno) {
        let fd = try Syscall.valueOrErrno { mtmfs_inotify_init() }
        do {
            top = try Syscall.valueOrErrno { mtmfs_inotify_watch_folder(fd, path) }
        } catch {
            Syscall.close(fd)
            throw error
        }
        self.fd = fd
        self.path = path
        for name in (try? Syscall.listDirectory(path)) ?? [] where !name.hasPrefix(".") {
            _ = mtmfs_inotify_watch_folder(fd, path + "/" + name)  // (a file: ENOTDIR, not watched)
        }
    }

    deinit { Syscall.close(fd) }

    /// A watch of `path`, or nil with a line in the log saying what that costs (`otherwise`).
    public static func logging(_ path: String, otherwise consequence: String) -> FolderWatch? {
        FileWatch.logged(path, consequence) { () throws(Errno) in try FolderWatch(path) }
    }

    /// Reads the events waiting; whether any was a change (or the kernel dropped some).
    public func changed() -> Bool {
        var changed = false
        var made: [String] = []
        // A folder made or moved in: watched at once, and what it already holds counts.
        FileWatch.drain(fd, afterRead: {
            for name in made where !name.hasPrefix(".") { _ = mtmfs_inotify_watch_folder(fd, path + "/" + name) }
            made.removeAll()
        }) { watch, mask, name in
            let isDirectory = mask & mtmfs_inotify_is_directory_mask() != 0
            if watch == top, isDirectory, mask & (mtmfs_inotify_create_mask() | mtmfs_inotify_moved_to_mask()) != 0 {
                made.append(name)
            }
            if mask & mtmfs_inotify_create_mask() == 0 || isDirectory { changed = true }
        }
        return changed
    }
}
