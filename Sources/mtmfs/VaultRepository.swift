#if canImport(Glibc)
import Glibc
#endif
import Posix

/// The vault folder as a git repository (SPEC §2b, `mtmfs sync`): the system's git, run
/// with a fixed identity, no hooks, no signing and no prompts. Files are write-once and
/// named by their device, so two machines' commits never touch one file: a merge never
/// conflicts unless someone changed the repository by hand.
///
/// Thread-safety: used by one command, on one thread.
struct VaultRepository {
    let folder: String

    /// What a sync did.
    struct Outcome {
        var remote: String?
        var sent = 0
        var received = 0
    }

    /// Names git keeps out of the repository: a synchroniser's and an editor's files.
    static let excluded = ["*.sync-conflict-*", ".syncthing.*", "*.tmp", "*~", ".stfolder", ".stignore", ".mtmfs-*"]

    static var gitIsInstalled: Bool { Spawn.exists("git") }

    var isRepository: Bool { ((try? Syscall.lstat(folder + "/.git")) != nil) }

    /// Runs git in the folder: its status and what it printed (stdout and stderr).
    func git(_ arguments: [String]) -> (status: Int32, output: String) {
        Spawn.output("env", ["GIT_TERMINAL_PROMPT=0", "GIT_ASKPASS=/bin/false", "SSH_ASKPASS=/bin/false", "LC_ALL=C",
                             "git", "-C", folder, "-c", "user.name=mtmfs", "-c", "user.email=mtmfs@localhost",
                             "-c", "core.hooksPath=/dev/null", "-c", "commit.gpgsign=false", "-c", "merge.ff=true",
                             "-c", "pull.rebase=false", "-c", "advice.detachedHead=false"] + arguments)
    }

    /// git's last line of output (what it said went wrong).
    static func lastLine(_ output: String) -> String {
        output.split(separator: "\n").last.map { trimmed(String($0)) } ?? "no output"
    }

    /// Makes the folder a repository (branch `main`, no sample hooks), with the names to
    /// keep out of it.
    func initialize() throws(CommandFailure) {
        let made = git(["init", "-q", "--template=", "-b", "main"])
        guard made.status == 0 else { throw CommandFailure("git init in \(folder) failed: \(Self.lastLine(made.output))") }
        try writeExclusions()
    }

    func writeExclusions() throws(CommandFailure) {
        let info = folder + "/.git/info"
        do throws(Errno) {
            do { try Syscall.mkdir(info, mode: 0o755) } catch where error == .fileExists {}
            try AtomicFile.replace(info + "/exclude", with: Array((Self.excluded.joined(separator: "\n") + "\n").utf8), mode: 0o644)
        } catch {
            throw CommandFailure("cannot write \(info)/exclude: \(error)")
        }
    }

    /// The branch checked out (`main` for a repository `init` made).
    var branch: String {
        let head = git(["symbolic-ref", "--short", "-q", "HEAD"])
        let name = Self.trimmed(head.output)
        return head.status == 0 && !name.isEmpty ? name : "main"
    }

    /// The remote to sync with: `origin`, else the only one; nil when there is none.
    func remote() throws(CommandFailure) -> String? {
        let listed = git(["remote"])
        guard listed.status == 0 else { throw CommandFailure("git remote failed: \(Self.lastLine(listed.output))") }
        let names = listed.output.split(separator: "\n").map(String.init)
        if names.contains("origin") { return "origin" }
        guard names.count <= 1 else {
            throw CommandFailure("the vault's repository has several remotes and none is called origin: rename the one to sync with")
        }
        return names.first
    }

    /// Left by a sync that was killed: git's index lock (no other git runs here while the
    /// sync lock is held) and a merge that did not finish (files are write-once: aborting it
    /// loses nothing, the next merge brings the same files).
    func recoverFromAKilledSync() {
        if ((try? Syscall.lstat(folder + "/.git/index.lock")) != nil) {
            try? Syscall.unlink(folder + "/.git/index.lock")
        }
        if ((try? Syscall.lstat(folder + "/.git/MERGE_HEAD")) != nil) { _ = git(["merge", "--abort"]) }
    }

    /// Commits every new or removed file (a fold removes this device's old ones); whether
    /// there was anything. The message names no account and no value.
    func commitNewFiles(device: String) throws(CommandFailure) -> Int {
        let added = git(["add", "-A", "--", "."])
        guard added.status == 0 else { throw CommandFailure("git add failed: \(Self.lastLine(added.output))") }
        let staged = git(["diff", "--cached", "--name-only", "-z"])
        let count = staged.output.split(separator: "\0").count
        guard count > 0 else { return 0 }
        let committed = git(["commit", "-q", "--no-verify", "-m", "mtmfs: \(count) file(s) from device \(device)"])
        guard committed.status == 0 else { throw CommandFailure("git commit failed: \(Self.lastLine(committed.output))") }
        return count
    }

    /// The remote's copy of the vault's `id` file, if the remote has the branch.
    func remoteID(_ remote: String, _ branch: String) -> String?? {
        let exists = git(["rev-parse", "-q", "--verify", "refs/remotes/\(remote)/\(branch)"])
        guard exists.status == 0 else { return .some(nil) }
        let shown = git(["show", "\(remote)/\(branch):id"])
        return shown.status == 0 ? .some(Self.normalizedID(shown.output)) : nil
    }

    /// An id file's text as compared: without white space, lowercase.
    static func normalizedID(_ text: String) -> String { trimmed(text).lowercased() }

    static func trimmed(_ text: String) -> String {
        String(text.drop { $0.isWhitespace }.reversed().drop { $0.isWhitespace }.reversed())
    }

    /// Files the merge of `remote/branch` brings (their count), merged; a conflict (a
    /// repository changed by hand) is aborted and refused.
    func merge(_ remote: String, _ branch: String) throws(CommandFailure) -> Int {
        let incoming = git(["diff", "--name-only", "-z", "HEAD...\(remote)/\(branch)"])
        let merged = git(["merge", "-q", "--no-edit", "--allow-unrelated-histories", "-m", "mtmfs: merge", "\(remote)/\(branch)"])
        guard merged.status == 0 else {
            _ = git(["merge", "--abort"])
            throw CommandFailure("the merge with \(remote)/\(branch) does not apply (was the vault's repository changed by hand?): "
                                 + "\(Self.lastLine(merged.output)); nothing merged")
        }
        return incoming.status == 0 ? incoming.output.split(separator: "\0").count : 0
    }

    /// fetch, commit, merge, push; a push that lost a race with another machine's fetches
    /// and merges again (at most `attempts` times). Nothing is committed before the fetch
    /// worked, so an unreachable remote changes nothing.
    func sync(device: String, localID: String, attempts: Int = 5) throws(CommandFailure) -> Outcome {
        recoverFromAKilledSync()
        var outcome = Outcome()
        guard let remote = try remote() else {
            outcome.sent = try commitNewFiles(device: device)
            return outcome
        }
        outcome.remote = remote
        let branch = self.branch
        for attempt in 1...attempts {
            let fetched = Progress.whileWorking("fetching from \(remote)") { git(["fetch", "-q", "--no-tags", remote]) }
            guard fetched.status == 0 else {
                throw CommandFailure("cannot fetch from \(remote): \(Self.lastLine(fetched.output)); nothing changed")
            }
            switch remoteID(remote, branch) {
            case .none:
                throw CommandFailure("\(remote)/\(branch) has no vault id file: not an mtmfs vault; nothing changed")
            case .some(.some(let id)) where id != Self.normalizedID(localID):
                throw CommandFailure("\(remote)/\(branch) holds another vault (its id differs); nothing changed")
            case .some(.some):
                if attempt == 1 { outcome.sent = try commitNewFiles(device: device) }
                outcome.received += try merge(remote, branch)
            case .some(.none):
                if attempt == 1 { outcome.sent = try commitNewFiles(device: device) }
            }
            let pushed = Progress.whileWorking("pushing to \(remote)") { git(["push", "-q", remote, "HEAD:refs/heads/\(branch)"]) }
            if pushed.status == 0 { return outcome }
            let raced = pushed.output.contains("fetch first") || pushed.output.contains("non-fast-forward")
                || pushed.output.contains("rejected")
            guard raced, attempt < attempts else {
                throw CommandFailure("push to \(remote) failed: \(Self.lastLine(pushed.output)) "
                                     + "(what was merged stays merged here; the next sync pushes it)")
            }
        }
        return outcome
    }
}
