#if canImport(Glibc)
import Glibc
#endif
import ScriptCommands

/// `mtmfs status`: a short human summary of one mount, or of every mtmfs mount of the
/// calling user.
struct StatusCommand: Command {
    static let name = "status"
    static let abstract = "show mounts: locked or not, auto-lock countdown, store sizes"
    static let usage = """
    Usage: mtmfs status [--json] [MOUNT]

    Prints one summary per mtmfs mount of yours (or for MOUNT only); --json prints a JSON
    array of objects, one a mount: mount_point, mounted (yes or stale) and every key of
    MOUNT/.mtmfs/status (the raw key=value form), as strings.

    Exit status: 0 every mount up; 6 no mount of yours, MOUNT not one, or a mount stale
    (its daemon is gone); 1 MOUNT is another user's.
    """
    static let flags: Set<String> = ["--json"]
    static let options: Set<String> = []

    let mountPoint: String?

    let json: Bool

    init(_ arguments: Arguments) throws(CommandFailure) {
        mountPoint = try arguments.positionals(0...1, named: "").first
        json = arguments.has("--json")
    }

    func run() throws(CommandFailure) {
        let mounts: [String]
        if let mountPoint {
            let path = Paths.resolved(Paths.absolute(mountPoint)) ?? Paths.absolute(mountPoint)
            guard let mount = MountTable.mtmfsMount(at: path) else {
                throw CommandFailure("\(mountPoint) is not an mtmfs mount: mount one with `mtmfs mount MOUNT`", exitCode: ExitCode.noMount)
            }
            guard mount.owner == nil || mount.owner == getuid() else {
                throw CommandFailure("\(mountPoint) is another user's mtmfs mount (uid \(mount.owner!)): only they can see its status")
            }
            mounts = [path]
        } else {
            mounts = MountTable.ownMtmfsMounts().map(\.mountPoint)
            guard !mounts.isEmpty else {
                if json { print("[]") }
                throw CommandFailure("you have no mtmfs mount up: start one with `mtmfs mount MOUNT`", exitCode: ExitCode.noMount)
            }
        }
        var stale: [String] = []
        var objects: [String] = []
        for path in mounts {
            let isStale = MountTable.isStale(path)
            if isStale { stale.append(path) }
            let values = StatusFile.read(mountPoint: path)
            if json {
                objects.append(JSONText.object([("mount_point", path), ("mounted", isStale ? "stale" : "yes")]
                                               + values.sorted { $0.key < $1.key }.map { ($0.key, $0.value) }))
            } else {
                print(Self.summary(path: path, values: values, stale: isStale))
            }
        }
        if json { print("[" + objects.joined(separator: ",\n ") + "]") }
        // A stale mount is a mount no more: said in the exit status too (a script's `status && …`).
        if !stale.isEmpty {
            throw CommandFailure("\(stale.joined(separator: ", ")): stale; run `mtmfs unmount` on it", exitCode: ExitCode.noMount)
        }
    }

    /// `stale`: the daemon is gone (ENOTCONN); only then is the mount called stale.
    static func summary(path: String, values: [String: String], stale: Bool) -> String {
        if stale {
            return "\(path): stale (its daemon is gone: Transport endpoint is not connected): run `mtmfs unmount \(path)`"
        }
        guard !values.isEmpty else {
            return "\(path): mounted, but \(path)/.mtmfs/status cannot be read: try `cat \(path)/.mtmfs/status`"
        }
        var lines = ["\(path): mounted from \(values["data_dir"] ?? "?") (daemon pid \(values["pid"] ?? "?"), mtmfs \(values["version"] ?? "?"))"]
        let state = values["state"] ?? "?"
        var accounts = "  accounts: \(state), \(values["accounts"] ?? "0") account(s)"
        if state == "unlocked", let seconds = values["auto_lock_in"], seconds != "0" {
            accounts += ", auto-lock in \(seconds) s"
        }
        if let events = values["lock_with"] {
            let words = events.split(separator: ",").map { $0 == "sleep" ? "a suspend" : $0 == "screen" ? "the screen lock" : String($0) }
            accounts += "; locks at " + words.joined(separator: " and ")
        }
        // A damaged vault cannot be unlocked: say so where the state is, not "locked" alone.
        if values["vault_error"] != nil { accounts = "  accounts: unavailable (the vault is damaged, below: no unlock helps)" }
        lines.append(accounts)
        if let guarding = values["guard"], guarding != "unknown" {
            lines.append(guarding == "on" ? "  guard: on — a password goes only to the programs trusted with its account"
                                          : "  guard: off — every program of yours reads every password while unlocked")
        }
        if values["guard"] == "on", let scope = values["ptrace_scope"], scope == "0" || scope == "none" {
            lines.append("  warning: kernel.yama.ptrace_scope is \(scope == "none" ? "absent (no Yama)" : "0"): any program of yours "
                         + "can trace another and read a trusted program's memory")
        }
        if let error = values["vault_error"] { lines.append("  vault: \(error)") }
        if let conflicts = Int(values["conflicts"] ?? ""), conflicts > 0 {
            lines.append("  conflicts: \(conflicts) field(s) changed on two machines apart: see accounts/*/conflicts/ "
                         + "(writing a field resolves its conflict)")
        }
        if let skipped = Int(values["vault_skipped"] ?? ""), skipped > 0 {
            lines.append("  vault: \(skipped) file(s) of the vault folder skipped (damaged, half-synced, foreign or a "
                         + "synchroniser's own): `mtmfs check` names them")
        }
        if let log = values["log"] { lines.append("  log: \(log)") }
        if let error = values["settings_error"] {
            lines.append("  settings: \(error) — settings/ answers EIO; the file is left as it is")
        }
        if let error = values["cache_error"] {
            lines.append("  cache: \(error)")
        } else if let files = values["cache_files"], let bytes = values["cache_bytes"] {
            var cache = "  cache: \(files) file(s), \(bytes) bytes"
            if let limit = values["cache_limit"] { cache += " (limit \(limit))" }
            if let evicted = values["cache_evictions"], evicted != "0" { cache += ", \(evicted) evicted" }
            if let expired = values["cache_expired"], expired != "0" { cache += ", \(expired) expired" }
            lines.append(cache)
        }
        return lines.joined(separator: "\n")
    }
}
