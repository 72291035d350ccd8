#if canImport(Glibc)
import Glibc
#endif
import Foundation
import Posix

/// A fresh temporary directory, /tmp/mtmfs-LABEL.XXXXXX (or below another base), mode 0755 (so other users in the
/// tests can reach what is mounted in it); `remove()` unmounts everything below it first.
///
/// Thread-safety: `path` never changes; `remove()` is for its one owner, once. `keep` is
/// set at start-up, before any scratch is removed.
public final class Scratch {
    public let path: String

    /// `--keep` of the reliability suite: `remove()` leaves the directory (logs, data) for a
    /// look after a failure.
    nonisolated(unsafe) public static var keep = false

    /// `base`: the directory to make it in (default /tmp).
    public init(_ label: String = "test", in base: String? = nil) {
        path = temporaryDirectory("\(base ?? "/tmp")/mtmfs-\(label).XXXXXX")
        try? Syscall.chmod(path, mode: 0o755)
        Leftovers.remember(scratch: path)
    }

    /// The path of `name` in here.
    public func sub(_ name: String) -> String { path + "/" + name }

    public func remove() {
        if Scratch.keep {
            let line = Array("  (kept \(path))\n".utf8)
            try? Syscall.writeAll(1, line)
            return
        }
        MountTable.unmountAll(below: path)
        try? FileManager.default.removeItem(atPath: path)
    }
}
