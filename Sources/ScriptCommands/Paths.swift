#if canImport(Glibc)
import Glibc
#endif
import Posix

/// Path handling shared by the commands.
package enum Paths {
    /// An environment variable's value (nil: unset or empty).
    package static func environment(_ name: String) -> String? {
        guard let value = getenv(name) else { return nil }
        let text = String(cString: value)
        return text.isEmpty ? nil : text
    }

    /// `path` made absolute against the working directory, without touching the disk.
    package static func absolute(_ path: String) -> String {
        if path.hasPrefix("/") { return path }
        guard let pointer = getcwd(nil, 0) else { return path }
        defer { free(pointer) }
        let cwd = String(cString: pointer)
        return path == "." ? cwd : cwd + "/" + path
    }

    /// `realpath(3)`, or nil where a component is missing.
    package static func resolved(_ path: String) -> String? {
        guard let pointer = realpath(path, nil) else { return nil }
        defer { free(pointer) }
        return String(cString: pointer)
    }

    /// How a user types mtmfs: `mtmfs` when PATH finds the `mtmfs` beside this program that
    /// way, else its full path (a build that is not installed), so that printed commands run
    /// as printed.
    package static func commandName() -> String {
        let me = executable()
        let front = ProgramFiles.fronts(besideCore: me).first ?? me
        let path = getenv("PATH").map { String(cString: $0) } ?? ""
        for directory in path.split(separator: ":") where !directory.isEmpty {
            let candidate = String(directory) + "/" + ProgramFiles.front
            guard (try? Syscall.access(candidate, X_OK)) != nil else { continue }
            return resolved(candidate) == (resolved(front) ?? front) ? ProgramFiles.front : front
        }
        return front
    }

    /// This executable, to start the daemon with.
    package static func executable() -> String {
        ProgramFiles.running() ?? CommandLine.arguments[0]
    }
}
