#if canImport(Glibc)
import Glibc
#endif
import MountedTree
import ScriptCommands

extension Paths {
    /// The data directory named on the command line, else the default; made absolute.
    static func dataDirectory(_ given: String?) -> String {
        var environment: [String: String] = [:]
        for name in ["XDG_DATA_HOME", "HOME"] {
            if let value = getenv(name) { environment[name] = String(cString: value) }
        }
        return absolute(given ?? DataDirectory.defaultPath(environment: environment))
    }
}
