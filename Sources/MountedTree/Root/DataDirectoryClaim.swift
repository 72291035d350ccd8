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
    ///
    /// Thread-safety: a value; `Sendable`.
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

    /// Takes the lock. A holder on its way out is waited for (10 s at most): a daemon whose
    /// mount is already gone (plain `umount` and `fusermount3 -u` return before the daemon
    /// has flushed and exited: `umount M; mount -t fuse.mtmfs D M` must work), a holder
    /// whose process is gone, or one that has not yet said who it is. A live mount or
    /// command is refused at once.
    static func lock(_ fd: Int32, path: String) throws(Errno) {
        let deadline = ContinuousClock.now + .seconds(10)
        while true {
            do {
                return try Syscall.lockExclusively(fd)
            } catch where error == .tryAgain {
                guard ContinuousClock.now < deadline else { throw error }
                if let named = holder(reading: path), ProcessState.isRunning(named.pid) {
                    guard case .mount(let mountPoint) = named.holder, !isMountPoint(mountPoint) else { throw error }
                }
                usleep(20_000)
            }
        }
    }

    /// Whether something is mounted on `path`, from the mount table (not a `stat`, which a
    /// stopped daemon's mount would never answer).
    static func isMountPoint(_ path: String) -> Bool {
        guard let fd = try? Syscall.open("/proc/self/mountinfo", O_RDONLY),
              let bytes = try? Syscall.readAll(fd) else { return true }
        Syscall.close(fd)
        // ID PARENT MAJOR:MINOR ROOT MOUNT-POINT …, with space, tab, newline and backslash as \ooo.
        let wanted = Array(path.utf8)
        return bytes.split(separator: 0x0A).contains { line in
            let fields = line.split(separator: 0x20, maxSplits: 5)
            guard fields.count > 4 else { return false }
            var point: [UInt8] = []
            var index = fields[4].startIndex
            while index < fields[4].endIndex {
                let byte = fields[4][index]
                if byte == 0x5C, fields[4].distance(from: index, to: fields[4].endIndex) >= 4,
                   let value = UInt8(String(decoding: fields[4][(index + 1)...(index + 3)], as: UTF8.self), radix: 8) {
                    point.append(value)
                    index += 4
                } else {
                    point.append(byte)
                    index += 1
                }
            }
            return point == wanted
        }
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
