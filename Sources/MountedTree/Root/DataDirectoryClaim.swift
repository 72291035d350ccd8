#if canImport(Glibc)
import Glibc
#endif
import Posix

/// One process's exclusive claim on a data directory: an `flock` on `mtmfs.lock` in it.
///
/// Every process that writes the stores holds one for as long as it writes: the mount
/// daemon for its whole life, `mtmfs init` and `mtmfs passwd` while they run. Two daemons
/// on one directory would each rewrite the vault from their own memory and lose the
/// other's changes, and each would read the other's open cache as an unclean shutdown.
/// The lock belongs to the open file description, so it goes with the process however it
/// ends: a killed daemon never blocks the next mount. `mtmfs check` reads without one.
///
/// The file holds the holder's pid and what it is doing, written after the lock is taken,
/// so that the process refused can name the mount that holds the directory.
///
/// Thread-safety: immutable; the descriptor is closed once, at deinit.
public final class DataDirectoryClaim: Sendable {
    public static let fileName = "mtmfs.lock"

    /// Who holds a claim, as the file says it.
    public enum Holder: Equatable, Sendable {
        case mount(String)
        case command(String)

        var line: String {
            switch self {
            case .mount(let mountPoint): return "mount " + mountPoint
            case .command(let name): return "command " + name
            }
        }

        init?(line: Substring) {
            if line.hasPrefix("mount ") {
                self = .mount(String(line.dropFirst("mount ".count)))
            } else if line.hasPrefix("command ") {
                self = .command(String(line.dropFirst("command ".count)))
            } else {
                return nil
            }
        }
    }

    let fd: Int32

    /// Takes the claim, or throws `.inUse` naming the holder (`.unreadable` when the lock
    /// file cannot be made).
    public init(_ directory: DataDirectory, holder: Holder) throws(DataDirectoryError) {
        let path = directory.path + "/" + Self.fileName
        let fd: Int32
        do {
            fd = try Syscall.open(path, O_RDWR | O_CREAT | O_NOFOLLOW, mode: 0o600)
        } catch {
            throw .unreadable(directory.path, error)
        }
        do {
            try Self.lock(fd, path: path)
        } catch {
            Syscall.close(fd)
            if error == .tryAgain { throw .inUse(directory.path, Self.holder(reading: path)) }
            throw .unreadable(directory.path, error)
        }
        // Ours now: say who we are. A failed write only makes another process's message vaguer.
        try? Syscall.truncate(fd, to: 0)
        try? Syscall.writeAll(fd, Array("pid \(getpid())\n\(holder.line)\n".utf8))
        self.fd = fd
    }

    deinit { Syscall.close(fd) }

    /// Takes the lock; waits up to 10 s for a daemon whose mount is already gone (plain
    /// `umount`, or `fusermount3 -u`, returns before the daemon has flushed and exited:
    /// `umount M; mount -t fuse.mtmfs D M` must work). A live mount is refused at once.
    static func lock(_ fd: Int32, path: String) throws(Errno) {
        let deadline = ContinuousClock.now + .seconds(10)
        while true {
            do {
                return try Syscall.lockExclusively(fd)
            } catch where error == .tryAgain {
                guard case .mount(let mountPoint)? = holder(reading: path)?.holder, !isMountPoint(mountPoint),
                      ContinuousClock.now < deadline else { throw error }
                usleep(20_000)
            }
        }
    }

    /// Whether something is mounted on `path`: it lies on another device than its parent.
    /// (A path that cannot be read counts as mounted: a stale mount answers ENOTCONN.)
    static func isMountPoint(_ path: String) -> Bool {
        let here: stat
        do {
            here = try Syscall.stat(path)
        } catch {
            return error != .noSuchFileOrDirectory
        }
        guard let parent = try? Syscall.stat(path + "/.."), path != "/" else { return true }
        return here.st_dev != parent.st_dev
    }

    /// Throws `.inUse` when another process holds `directory`; takes nothing.
    public static func checkFree(_ directory: DataDirectory) throws(DataDirectoryError) {
        let path = directory.path + "/" + fileName
        guard let fd = try? Syscall.open(path, O_RDONLY | O_NOFOLLOW) else { return }  // never claimed
        defer { Syscall.close(fd) }
        do {
            try lock(fd, path: path)  // released by the close
        } catch where error == .tryAgain {
            throw .inUse(directory.path, holder(reading: path))
        } catch {
            return
        }
    }

    /// The holder the file names. A holder that has just taken the lock may not have
    /// written it yet (the file still names the one before, now gone): read again a few
    /// times while the named process is not running.
    static func holder(reading path: String) -> (pid: pid_t, holder: Holder)? {
        var named: (pid: pid_t, holder: Holder)?
        for _ in 0..<20 {
            named = nil
            if let fd = try? Syscall.open(path, O_RDONLY | O_NOFOLLOW) {
                let lines = ((try? Syscall.readAll(fd)) ?? []).split(separator: UInt8(ascii: "\n"))
                    .map { String(decoding: $0, as: UTF8.self)[...] }
                Syscall.close(fd)
                if lines.count >= 2, lines[0].hasPrefix("pid "), let pid = pid_t(lines[0].dropFirst(4)),
                   let holder = Holder(line: lines[1]) {
                    named = (pid, holder)
                    if ProcessState.isRunning(pid) { return named }
                }
            }
            usleep(25_000)
        }
        return named
    }
}
