#if canImport(Glibc)
import Glibc
#endif
import Foundation
import Posix

/// This process's mount table (/proc/self/mountinfo), read afresh on every call.
///
/// Thread-safety: no state; callable from any thread.
public enum MountTable {
    /// One mounted file system: where, and its type ("fuse.mtmfs", "tmpfs", …).
    ///
    /// Thread-safety: a plain value; `Sendable`.
    public struct Entry: Sendable, Equatable {
        public var mountPoint: String
        public var type: String
    }

    /// Every mount, oldest first. Of the kernel's \ooo escapes only \040 (a space) is undone:
    /// scratch paths hold no tab, newline or backslash. (The command line's `MountTable`
    /// has the full reader, with owners and sources.)
    public static func entries() -> [Entry] {
        guard let text = try? String(contentsOfFile: "/proc/self/mountinfo", encoding: .utf8) else { return [] }
        return text.split(separator: "\n").compactMap { line in
            // ID PARENT MAJOR:MINOR ROOT MOUNT-POINT OPTIONS [OPTIONAL…] - TYPE SOURCE SUPER-OPTIONS
            let fields = line.split(separator: " ").map(String.init)
            guard fields.count > 4, let dash = fields.firstIndex(of: "-"), dash + 1 < fields.count else { return nil }
            return Entry(mountPoint: fields[4].replacingOccurrences(of: "\\040", with: " "), type: fields[dash + 1])
        }
    }

    /// Mount points of type fuse.mtmfs.
    public static func mtmfsMountPoints() -> [String] {
        entries().filter { $0.type == "fuse.mtmfs" }.map(\.mountPoint)
    }

    /// True while an mtmfs mount (type fuse.mtmfs) sits on `path`.
    public static func isMounted(_ path: String) -> Bool { mtmfsMountPoints().contains(path) }

    /// Everything mounted below `path` (not on it), of any type, newest first.
    public static func entries(below path: String) -> [Entry] {
        entries().filter { $0.mountPoint.hasPrefix(path + "/") }.reversed()
    }

    /// Teardown's safety net: detaches everything mounted below `path`, newest first: FUSE
    /// mounts with `fusermount3 -uz`, others (a test's tmpfs) with `umount -l`.
    public static func unmountAll(below path: String) {
        for entry in entries(below: path) {
            if entry.type == "fuse" || entry.type == "fuseblk" || entry.type.hasPrefix("fuse.") {
                Run.program("fusermount3", ["-uz", entry.mountPoint])
            } else {
                Run.program("umount", ["-l", entry.mountPoint])
            }
        }
    }
}

/// The key=value lines of a mount's .mtmfs/status (pid, state, …).
///
/// Thread-safety: no state; callable from any thread.
public enum MountStatus {
    /// The values in `mountPoint`/.mtmfs/status; throws when it cannot be read.
    public static func read(_ mountPoint: String) throws -> [String: String] {
        let text = try String(contentsOfFile: mountPoint + "/.mtmfs/status", encoding: .utf8)
        var values: [String: String] = [:]
        for line in text.split(separator: "\n") {
            let parts = line.split(separator: "=", maxSplits: 1, omittingEmptySubsequences: false)
            if parts.count == 2 { values[String(parts[0])] = String(parts[1]) }
        }
        return values
    }
}
