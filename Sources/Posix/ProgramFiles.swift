#if canImport(Glibc)
import Glibc
#endif

/// Where mtmfs's two programs lie beside each other: `mtmfs`, the command people and
/// scripts type (small, so that `mtmfs run`, `inject`, `read` and `find` start fast), and
/// `mtmfs-core`, everything else, which `mtmfs` becomes (exec) for any other command.
/// Built, both are in one directory; installed, `mtmfs` may be in `PREFIX/bin` and the core
/// in `PREFIX/lib/mtmfs`.
///
/// Thread-safety: no state.
public enum ProgramFiles {
    public static let front = "mtmfs"
    public static let core = "mtmfs-core"

    /// The core for the front at `front` (a resolved path): the first that exists.
    public static func core(besideFront front: String) -> String? {
        let directory = self.directory(of: front)
        return [directory + "/" + core, directory + "/../lib/mtmfs/" + core].first { access($0, X_OK) == 0 }
    }

    /// The fronts that may call the core at `core` (a resolved path): those that exist.
    public static func fronts(besideCore core: String) -> [String] {
        let directory = self.directory(of: core)
        return [directory + "/" + front, directory + "/../../bin/" + front].filter { access($0, X_OK) == 0 }
    }

    /// This process's executable (`/proc/self/exe` read), nil if it cannot be read.
    public static func running() -> String? {
        var buffer = [CChar](repeating: 0, count: Int(PATH_MAX) + 1)
        let length = readlink("/proc/self/exe", &buffer, buffer.count - 1)
        guard length > 0 else { return nil }
        return String(decoding: buffer[0..<length].map { UInt8(bitPattern: $0) }, as: UTF8.self)
    }

    private static func directory(of path: String) -> String {
        guard let slash = path.lastIndex(of: "/") else { return "." }
        return slash == path.startIndex ? "" : String(path[..<slash])
    }
}
