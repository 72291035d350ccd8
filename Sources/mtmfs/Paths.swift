#if canImport(Glibc)
import Glibc
#endif
import MountedTree
import Posix

/// Path handling shared by the commands.
enum Paths {
    /// The data directory named on the command line, else the default; made absolute.
    static func dataDirectory(_ given: String?) -> String {
        var environment: [String: String] = [:]
        for name in ["XDG_DATA_HOME", "HOME"] {
            if let value = getenv(name) { environment[name] = String(cString: value) }
        }
        return absolute(given ?? DataDirectory.defaultPath(environment: environment))
    }

    /// An environment variable's value (nil: unset or empty).
    static func environment(_ name: String) -> String? {
        guard let value = getenv(name) else { return nil }
        let text = String(cString: value)
        return text.isEmpty ? nil : text
    }

    /// `path` made absolute against the working directory, without touching the disk.
    static func absolute(_ path: String) -> String {
        if path.hasPrefix("/") { return path }
        guard let pointer = getcwd(nil, 0) else { return path }
        defer { free(pointer) }
        let cwd = String(cString: pointer)
        return path == "." ? cwd : cwd + "/" + path
    }

    /// `realpath(3)`, or nil where a component is missing.
    static func resolved(_ path: String) -> String? {
        guard let pointer = realpath(path, nil) else { return nil }
        defer { free(pointer) }
        return String(cString: pointer)
    }

    /// How a user types this program: `mtmfs` when PATH finds this very executable that
    /// way, else its full path (a build that is not installed), so that printed commands run
    /// as printed.
    static func commandName() -> String {
        let me = executable()
        let path = getenv("PATH").map { String(cString: $0) } ?? ""
        for directory in path.split(separator: ":") where !directory.isEmpty {
            let candidate = String(directory) + "/mtmfs"
            guard (try? Syscall.access(candidate, X_OK)) != nil else { continue }
            return resolved(candidate) == (resolved(me) ?? me) ? "mtmfs" : me
        }
        return me
    }

    /// This executable, to start the daemon with.
    static func executable() -> String {
        var buffer = [CChar](repeating: 0, count: Int(PATH_MAX) + 1)
        let length = readlink("/proc/self/exe", &buffer, buffer.count - 1)
        guard length > 0 else { return CommandLine.arguments[0] }
        return String(decoding: buffer[0..<length].map { UInt8(bitPattern: $0) }, as: UTF8.self)
    }
}
