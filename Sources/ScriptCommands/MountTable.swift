#if canImport(Glibc)
import Glibc
#endif
import Posix

/// The kernel's mount table (`/proc/self/mountinfo`), for finding mtmfs mounts.
package enum MountTable {
    package struct Mount: Equatable {
        package var mountPoint: String
        package var fileSystemType: String
        package var source: String
        /// The user who mounted it (FUSE's `user_id=` option), when the table says.
        package var owner: uid_t?
    }

    package static func read() -> [Mount] {
        guard let fd = try? Syscall.open("/proc/self/mountinfo", O_RDONLY) else { return [] }
        defer { Syscall.close(fd) }
        guard let bytes = try? Syscall.readAll(fd) else { return [] }
        // (As bytes: a script's every `mtmfs run` reads the table.)
        let text = { (field: ArraySlice<UInt8>) in String(decoding: field, as: UTF8.self) }
        return bytes.split(separator: UInt8(ascii: "\n")).compactMap { line in
            // ID PARENT MAJ:MIN ROOT MOUNTPOINT OPTIONS [OPTIONAL…] - FSTYPE SOURCE SUPEROPTIONS
            let fields = line.split(separator: UInt8(ascii: " "), omittingEmptySubsequences: false)
            guard fields.count > 6, let dash = fields.firstIndex(where: { $0.count == 1 && $0.first == UInt8(ascii: "-") }),
                  dash + 2 < fields.count else { return nil }
            let owner = dash + 3 < fields.count
                ? fields[dash + 3].split(separator: UInt8(ascii: ",")).first { $0.starts(with: "user_id=".utf8) }
                    .flatMap { uid_t(text($0.dropFirst("user_id=".utf8.count))) }
                : nil
            return Mount(mountPoint: unescape(text(fields[4])), fileSystemType: text(fields[dash + 1]),
                         source: unescape(text(fields[dash + 2])), owner: owner)
        }
    }

    /// Every mtmfs mount (type `fuse.mtmfs`).
    package static func mtmfsMounts() -> [Mount] {
        read().filter { $0.fileSystemType == "fuse.mtmfs" }
    }

    /// The mtmfs mounts of the calling user: another user's mount is not theirs to list
    /// (nor, without allow_other, theirs to look into).
    package static func ownMtmfsMounts() -> [Mount] {
        mtmfsMounts().filter { $0.owner == getuid() }
    }

    /// A refusal when `dataDirectory` is the source of an mtmfs mount: a daemon of an
    /// earlier mtmfs (before the data directory's claim, `mtmfs.lock`) holds no lock, but
    /// would still overwrite what another process wrote.
    package static func refuseMounted(_ dataDirectory: String) throws(CommandFailure) {
        guard let mount = mtmfsMounts().first(where: { $0.source == dataDirectory }) else { return }
        throw CommandFailure("\(dataDirectory) is in use by the mtmfs mount on \(mount.mountPoint): unmount it first (mtmfs unmount \(mount.mountPoint))")
    }

    /// The calling user's mount of `dataDirectory`, however either path was spelled (a
    /// symlinked home): the last one mounted.
    package static func ownMount(of dataDirectory: String) -> Mount? {
        let wanted = Paths.resolved(dataDirectory) ?? dataDirectory
        return ownMtmfsMounts().last { (Paths.resolved($0.source) ?? $0.source) == wanted }
    }

    package static func mtmfsMount(at path: String) -> Mount? {
        mtmfsMounts().last { $0.mountPoint == path }
    }

    /// True for a FUSE mount whose daemon is gone. statfs always reaches the daemon, where a
    /// stat may be answered from the kernel's attribute cache for a while. The kernel says
    /// ENOTCONN, or ECONNABORTED for a connection it has just aborted.
    package static func isStale(_ mountPoint: String) -> Bool {
        var fs = statvfs()
        return statvfs(mountPoint, &fs) != 0 && (errno == ENOTCONN || errno == ECONNABORTED)
    }

    /// mountinfo escapes space, tab, newline and backslash as `\ooo`.
    package static func unescape(_ field: String) -> String {
        guard field.contains("\\") else { return field }
        var bytes: [UInt8] = []
        let raw = Array(field.utf8)
        var index = 0
        while index < raw.count {
            if raw[index] == UInt8(ascii: "\\"), index + 3 < raw.count + 0,
               let value = UInt8(String(decoding: raw[(index + 1)...(index + 3)], as: UTF8.self), radix: 8) {
                bytes.append(value)
                index += 4
            } else {
                bytes.append(raw[index])
                index += 1
            }
        }
        return String(decoding: bytes, as: UTF8.self)
    }
}

/// Checks that a path can take a new mount, with the message that says what to do.
package enum MountPointCheck {
    /// Returns the absolute, resolved mount point.
    package static func validate(_ given: String) throws(CommandFailure) -> String {
        let path = Paths.absolute(given)
        let st: stat
        do {
            st = try Syscall.stat(path)
        } catch {
            switch error {
            case .noSuchFileOrDirectory:
                throw CommandFailure("mount point \(given) does not exist: create it with `mkdir -p \(given)`")
            case .notConnected, Errno(ECONNABORTED):
                throw CommandFailure("\(given) is a stale FUSE mount (Transport endpoint is not connected): run `fusermount3 -uz \(given)`")
            default:
                throw CommandFailure("cannot use mount point \(given): \(error)")
            }
        }
        let resolved = Paths.resolved(path) ?? path
        if MountTable.mtmfsMount(at: resolved) != nil {
            if MountTable.isStale(resolved) {
                throw CommandFailure("\(given) is a stale FUSE mount (Transport endpoint is not connected): run `fusermount3 -uz \(given)`")
            }
            throw CommandFailure("\(given) is already an mtmfs mount: unmount it first with `mtmfs unmount \(given)`")
        }
        guard st.st_mode & S_IFMT == S_IFDIR else {
            throw CommandFailure("mount point \(given) is not a directory: mount on an empty directory")
        }
        let names: [String]
        do {
            names = try Syscall.listDirectory(resolved)
        } catch {
            throw CommandFailure("cannot read mount point \(given): \(error)")
        }
        guard names.isEmpty else {
            throw CommandFailure("mount point \(given) is not empty: mount on an empty directory")
        }
        return resolved
    }
}

/// Which mount a command means: the one named, else the only mtmfs mount.
package enum MountChoice {
    package static func resolve(_ given: String?) throws(CommandFailure) -> String {
        if let given {
            let path = Paths.resolved(Paths.absolute(given)) ?? Paths.absolute(given)
            guard MountTable.mtmfsMount(at: path) != nil else {
                throw CommandFailure("\(given) is not an mtmfs mount (see `mtmfs status`)", exitCode: ExitCode.noMount)
            }
            return path
        }
        // The caller's own: another user's mount is not theirs to use (nor to count).
        let mounts = MountTable.ownMtmfsMounts()
        guard mounts.count == 1 else {
            throw CommandFailure(mounts.isEmpty ? "no mtmfs mount is up: mount one with `mtmfs mount MOUNT`"
                                                : "several mtmfs mounts are up: name one (see `mtmfs status`)",
                                 exitCode: mounts.isEmpty ? ExitCode.noMount : ExitCode.failure)
        }
        return mounts[0].mountPoint
    }
}

/// Reading `.mtmfs/status` of a mount.
package enum StatusFile {
    package static func read(mountPoint: String) -> [String: String] {
        guard let fd = try? Syscall.open(mountPoint + "/.mtmfs/status", O_RDONLY) else { return [:] }
        defer { Syscall.close(fd) }
        guard let bytes = try? Syscall.readAll(fd) else { return [:] }
        var values: [String: String] = [:]
        for line in String(decoding: bytes, as: UTF8.self).split(separator: "\n") {
            guard let equals = line.firstIndex(of: "=") else { continue }
            values[String(line[..<equals])] = String(line[line.index(after: equals)...])
        }
        return values
    }
}
