#if canImport(Glibc)
import Glibc
#endif
import Posix
import ScriptCommands

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
    /// `.*.tmp-*`: `AtomicFile`'s temporary files, which a power cut can leave behind.
    static let excluded = ["*.sync-conflict-*", ".syncthing.*", "*.tmp", ".*.tmp-*", "*~", ".stfolder", ".stignore", ".mtmfs-*"]

    static var gitIsInstalled: Bool { Spawn.exists("git") }

    var isRepository: Bool { ((try? Syscall.lstat(folder + "/.git")) != nil) }

    /// Runs git in the folder: its status and what it printed (stdout and stderr).
    func git(_ arguments: [String]) -> (status: Int32, output: String) {
        Spawn.output("git", gitArguments(arguments), environment: Self.environment)
    }

    /// git's arguments: the folder, a fixed identity, no hooks, no signing.
    func gitArguments(_ arguments: [String]) -> [String] {
        ["-C", folder, "-c", "user.name=mtmfs", "-c", "user.email=mtmfs@localhost", "-c", "core.hooksPath=/dev/null",
         "-c", "commit.gpgsign=false", "-c", "merge.ff=true", "-c", "pull.rebase=false"] + arguments
    }

    /// No prompt for a password or a passphrase (a sync from a timer has no one to ask), and
    /// git's messages in English (they are matched).
    static let environment = Spawn.environment(with: ["GIT_TERMINAL_PROMPT=0", "GIT_ASKPASS=/bin/false",
                                                      "SSH_ASKPASS=/bin/false", "LC_ALL=C"])

    /// git's own estimate of loose objects (one of its 256 object folders, `17/`, counted):
    /// past its `gc.auto` mark, `git gc --auto` packs them. A sync that only pushes never
    /// fetches, and so never runs the maintenance a fetch runs.
    func packIfDue() {
        let sample = ((try? Syscall.listDirectory(folder + "/.git/objects/17")) ?? []).count
        if sample * 256 > 6_700 { _ = git(["gc", "--auto", "--quiet"]) }
    }

    /// Takes back the commit `commitNewFiles` made (the files stay, untracked again).
    func undoCommit() {
        if git(["rev-parse", "-q", "--verify", "HEAD~1"]).status == 0 {
            _ = git(["reset", "-q", "--mixed", "HEAD~1"])
        } else {
            _ = git(["update-ref", "-d", "HEAD"])
            _ = git(["rm", "-r", "-q", "--cached", "--", "."])
        }
    }

    /// git's last line of output (what it said went wrong).
    /// What git said went wrong: its first `fatal:` or `error:` line (git's advice follows
    /// on lines of its own: "Please make sure … and the repository exists."), else its last.
    static func lastLine(_ output: String) -> String {
        let lines = output.split(separator: "\n").map { trimmed(String($0)) }.filter { !$0.isEmpty }
        for prefix in ["fatal: ", "error: "] {
            if let line = lines.first(where: { $0.hasPrefix(prefix) }) { return String(line.dropFirst(prefix.count)) }
        }
        return lines.last ?? "no output"
    }

    /// Makes the folder a repository (branch `main`, no sample hooks), with the names to
    /// keep out of it.
    func initialize() throws(CommandFailure) {
        let made = git(["init", "-q", "--template=", "-b", "main"])
        guard made.status == 0 else { throw CommandFailure("git init in \(folder) failed: \(Self.lastLine(made.output))") }
        try writeExclusions()
    }

    static var exclusions: String { excluded.joined(separator: "\n") + "\n" }

    /// Where git keeps `relative` of this repository (`git rev-parse --git-path`): `.git/…`
    /// as `init` makes it, wherever a repository keeps it otherwise.
    func gitPath(_ relative: String) -> String {
        let asked = git(["rev-parse", "--git-path", relative])
        let path = asked.status == 0 ? Self.trimmed(asked.output) : ".git/" + relative
        return path.hasPrefix("/") ? path : folder + "/" + path
    }

    func writeExclusions() throws(CommandFailure) {
        let info = gitPath("info")
        do throws(Errno) {
            do { try Syscall.mkdir(info, mode: 0o755) } catch where error == .fileExists {}
            try AtomicFile.replace(info + "/exclude", with: Array(Self.exclusions.utf8), mode: 0o644)
        } catch {
            throw CommandFailure("cannot write \(info)/exclude: \(error)")
        }
    }

    /// The branch checked out (`main` for a repository `init` made), from `git symbolic-ref`;
    /// nil when none is (a detached HEAD, left by someone's checkout of a commit).
    var branch: String? {
        let head = git(["symbolic-ref", "-q", "HEAD"])
        let name = Self.trimmed(head.output)
        guard head.status == 0, name.hasPrefix("refs/heads/") else { return nil }
        return String(name.dropFirst("refs/heads/".count))
    }

    func read(_ relative: String) -> String? {
        (try? Syscall.readFile(folder + "/" + relative)).map { String(decoding: $0, as: UTF8.self) }
    }

    /// A ref's commit (`git rev-parse --verify`: loose, packed or reftable alike); nil when
    /// there is none.
    func ref(_ name: String) -> String? {
        let parsed = git(["rev-parse", "-q", "--verify", name + "^{commit}"])
        return parsed.status == 0 ? Self.trimmed(parsed.output) : nil
    }

    /// Whether the branch `head` has commits its remote-tracking ref `tracking` lacks (or
    /// the remote has no such branch yet): both refs from one `git for-each-ref`.
    func isAhead(_ head: String, of tracking: String) -> Bool {
        let listed = git(["for-each-ref", "--format=%(refname) %(objectname)", head, tracking])
        var commits: [String: String] = [:]
        for line in listed.output.split(separator: "\n") {
            let parts = line.split(separator: " ", maxSplits: 1).map(String.init)
            if parts.count == 2 { commits[parts[0]] = parts[1] }
        }
        guard listed.status == 0, let ours = commits[head] else { return false }
        return ours != commits[tracking]
    }

    /// The remote to sync with (`git remote`): `origin`, else the only one; nil when there
    /// is none.
    func remote() throws(CommandFailure) -> String? {
        let listed = git(["remote"])
        guard listed.status == 0 else { throw CommandFailure("git remote in \(folder) failed: \(Self.lastLine(listed.output))") }
        let names = listed.output.split(separator: "\n").map { Self.trimmed(String($0)) }.filter { !$0.isEmpty }
        if names.contains("origin") { return "origin" }
        guard names.count <= 1 else {
            throw CommandFailure("the vault's repository has several remotes and none is called origin: rename the one to sync with")
        }
        return names.first
    }

    /// Left by a sync that was killed: git's lock files — the index's, HEAD's, ORIG_HEAD's,
    /// AUTO_MERGE's, packed-refs', any in `.git/` itself and a ref's below it (no other git
    /// runs here while the sync lock is held) — and a merge that did not finish (files are
    /// write-once: aborting it loses nothing, the next merge brings the same files). Files a
    /// killed commit left staged are committed by the next `commitNewFiles`.
    func recoverFromAKilledSync() {
        for name in (try? Syscall.listDirectory(folder + "/.git")) ?? [] where name.hasSuffix(".lock") {
            try? Syscall.unlink(folder + "/.git/" + name)
        }
        removeLocks(under: ".git/refs")
        if ((try? Syscall.lstat(folder + "/.git/MERGE_HEAD")) != nil) { _ = git(["merge", "--abort"]) }
        // A merge killed before it had written what --abort needs: its state goes by hand,
        // and the index back to HEAD (the files stay; the next commit adds what is new).
        if ((try? Syscall.lstat(folder + "/.git/MERGE_HEAD")) != nil) {
            for name in ["MERGE_HEAD", "MERGE_MSG", "MERGE_MODE", "AUTO_MERGE"] { try? Syscall.unlink(folder + "/.git/" + name) }
            _ = git(["reset", "-q"])
        }
    }

    /// Removes every `*.lock` file below `relative` (refs a killed git was updating).
    func removeLocks(under relative: String) {
        for name in (try? Syscall.listDirectory(folder + "/" + relative)) ?? [] {
            let path = relative + "/" + name
            if name.hasSuffix(".lock") {
                try? Syscall.unlink(folder + "/" + path)
            } else if let st = try? Syscall.lstat(folder + "/" + path), st.st_mode & S_IFMT == S_IFDIR {
                removeLocks(under: path)
            }
        }
    }

    /// Commits this machine's new or removed files — its device folder (a fold removes its
    /// old files), the key slots and the id — and any a killed sync left staged: how many.
    /// Another machine's files enter only by merges: a file a killed merge left half
    /// written is never committed as this machine's. The message names no account and no value.
    func commitNewFiles(device: String) throws(CommandFailure) -> Int {
        // (A repository made by an older mtmfs keeps an older list.)
        if (try? Syscall.readFile(gitPath("info/exclude"))).map({ String(decoding: $0, as: UTF8.self) }) != Self.exclusions {
            try writeExclusions()
        }
        let own = device.count == 16 ? [device, "keys", "id"].filter { (try? Syscall.lstat(folder + "/" + $0)) != nil } : []
        let added = git(["add", "-A", "--verbose", "--"] + (own.isEmpty ? ["."] : own))
        guard added.status == 0 else { throw CommandFailure("git add failed: \(Self.lastLine(added.output))") }
        var count = added.output.split(separator: "\n").filter { $0.hasPrefix("add '") || $0.hasPrefix("remove '") }.count
        if count == 0 {
            // Nothing new to add; but a commit killed midway leaves its files staged.
            let staged = git(["diff", "--cached", "--name-only", "--no-renames"])
            count = staged.status == 0 ? staged.output.split(separator: "\n").count : 0
        }
        guard count > 0 else { return 0 }
        // (No maintenance after each commit: a fetch runs git's, which packs what piled up.)
        let committed = git(["-c", "maintenance.auto=false", "commit", "-q", "--no-verify", "-m", "mtmfs: \(count) file(s) from device \(device)"])
        guard committed.status == 0 else { throw CommandFailure("git commit failed: \(Self.lastLine(committed.output))") }
        return count
    }

    /// The remote's copy of the vault's `id` file, if the remote has the branch.
    func remoteID(_ remote: String, _ branch: String) -> String?? {
        guard ref("refs/remotes/\(remote)/\(branch)") != nil else { return .some(nil) }
        let shown = git(["show", "\(remote)/\(branch):id"])
        return shown.status == 0 ? .some(Self.normalizedID(shown.output)) : nil
    }

    /// An id file's text as compared: without white space, lowercase.
    static func normalizedID(_ text: String) -> String { trimmed(text).lowercased() }

    static func trimmed(_ text: String) -> String {
        String(text.drop { $0.isWhitespace }.reversed().drop { $0.isWhitespace }.reversed())
    }

    /// Merges `remote/branch`; a conflict (a repository changed by hand) is aborted: what
    /// went wrong, or nil.
    func merge(_ remote: String, _ branch: String) -> String? {
        var merged = git(["merge", "-q", "--no-edit", "--allow-unrelated-histories", "-m", "mtmfs: merge", "\(remote)/\(branch)"])
        if merged.status != 0 && merged.output.contains("untracked working tree files would be overwritten") {
            // Another machine's files that a killed merge (or a synchroniser) put here: the
            // merge brings the same write-once files whole, so they go and the merge runs again.
            for line in merged.output.split(separator: "\n") where line.hasPrefix("\t") {
                let relative = Self.trimmed(String(line))
                guard !relative.hasPrefix("/"), !relative.contains("..") else { continue }
                try? Syscall.unlink(folder + "/" + relative)
            }
            merged = git(["merge", "-q", "--no-edit", "--allow-unrelated-histories", "-m", "mtmfs: merge", "\(remote)/\(branch)"])
        }
        guard merged.status == 0 else {
            _ = git(["merge", "--abort"])
            return "the merge with \(remote)/\(branch) does not apply (was the vault's repository changed by hand?): "
                + Self.lastLine(merged.output)
        }
        // git syncs neither the files a merge checks out nor (by default) its objects and
        // refs: made durable before anything relies on them (the mark below, the mount
        // reading the files, a fold dropping what another machine's file superseded).
        if let problem = makeDurable() { return problem }
        // What was merged, so that the next sync that fetches nothing new merges nothing.
        if let commit = ref("refs/remotes/\(remote)/\(branch)") {
            noteMerged(commit)
        }
        return nil
    }

    /// The repository and its checked-out files made durable (`syncfs`: git syncs neither
    /// by default); what went wrong, or nil.
    func makeDurable() -> String? {
        do throws(Errno) {
            try Syscall.syncFileSystem(holding: folder)
            return nil
        } catch {
            return "\(folder) could not be synced (\(error))"
        }
    }

    /// Notes the commit merged (or pushed) last, in `.git/mtmfs-merged`, once what it names
    /// is durable (`makeDurable`): whole (a new file renamed over the old) but not synced
    /// itself: it only spares the next sync a merge that would change nothing, and lost,
    /// that merge runs.
    func noteMerged(_ commit: String) {
        let path = folder + "/.git/mtmfs-merged", temporary = path + ".new"
        do throws(Errno) {
            let fd = try Syscall.open(temporary, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, mode: 0o644)
            defer { Syscall.close(fd) }
            try Syscall.writeAll(fd, Array((commit + "\n").utf8), at: 0)
            try Syscall.rename(temporary, path)
        } catch {
            try? Syscall.unlink(temporary)
        }
    }

    /// Commits the new files, then pushes first: a fast-forward push that lands means the
    /// remote had nothing this machine lacks, so nothing is fetched. Otherwise (rejected:
    /// another machine pushed), or with nothing to push, it fetches, merges, and pushes
    /// again (at most `attempts` times). A remote that cannot be reached, or that holds
    /// another vault, takes the commit back: nothing changes.
    func sync(device: String, localID: String, attempts: Int = 5) throws(CommandFailure) -> Outcome {
        recoverFromAKilledSync()
        var outcome = Outcome()
        guard let remote = try remote() else {
            outcome.sent = try commitNewFiles(device: device)
            if let problem = makeDurable() { throw CommandFailure(problem) }
            return outcome
        }
        outcome.remote = remote
        guard let branch = self.branch else {
            throw CommandFailure("the vault's repository has no branch checked out (a detached HEAD): `git -C \(folder) checkout main`, then sync; nothing changed")
        }
        let head = "refs/heads/\(branch)", tracking = "refs/remotes/\(remote)/\(branch)"
        let before = ref(head)
        outcome.sent = try commitNewFiles(device: device)
        /// Gives up: the commit taken back unless something was merged (that stays).
        func fail(_ message: String) -> CommandFailure {
            if outcome.received == 0 {
                if outcome.sent > 0 { undoCommit() }
                return CommandFailure(message + "; nothing changed")
            }
            return CommandFailure(message + " (what was merged stays merged here; the next sync pushes it)")
        }
        var ahead = isAhead(head, of: tracking)
        for _ in 1...attempts {
            if ahead {
                let pushed = Progress.whileWorking("pushing to \(remote)") { git(["push", "-q", remote, "HEAD:\(head)"]) }
                if pushed.status == 0 {
                    packIfDue()
                    if let problem = makeDurable() { throw CommandFailure(problem + " (the push landed; the next sync checks it)") }
                    if let pushedHead = ref(head) { noteMerged(pushedHead) }
                    return outcome
                }
                // Another machine pushed first (rejected as not a fast-forward, or its ref
                // moved under this push), or the remote refused the push (a hook, a protected
                // branch), which no retry changes.
                let rejection = pushed.output.split(separator: "\n").first { $0.contains("[remote rejected]") }.map(String.init)
                let raced = pushed.output.contains("fetch first") || pushed.output.contains("non-fast-forward")
                    || pushed.output.contains("[rejected]")
                    || (rejection.map { $0.contains("cannot lock ref") || $0.contains("failed to update ref") } ?? false)
                if !raced, let rejection { throw fail("\(remote) rejected the push: \(Self.trimmed(rejection))") }
                guard raced else { throw fail("cannot reach \(remote): \(Self.lastLine(pushed.output))") }
            }
            let fetched = Progress.whileWorking("fetching from \(remote)") { git(["fetch", "-q", "--no-tags", remote]) }
            guard fetched.status == 0 else { throw fail("cannot reach \(remote): \(Self.lastLine(fetched.output))") }
            // Merged already (at the last sync, or where this branch stood): nothing to check or merge.
            let theirs = ref(tracking)
            let merged = theirs == nil || theirs == before || theirs == ref(head) || theirs == read(".git/mtmfs-merged").map(Self.trimmed)
            if !merged {
                switch remoteID(remote, branch) {
                case .none, .some(.none): throw fail("\(remote)/\(branch) has no vault id file: not an mtmfs vault")
                case .some(.some(let id)) where id != Self.normalizedID(localID):
                    throw fail("\(remote)/\(branch) holds another vault (its id differs)")
                case .some(.some): break
                }
                if let problem = merge(remote, branch) { throw fail(problem) }
                outcome.received += 1
            }
            ahead = isAhead(head, of: tracking)
            if !ahead {
                if let problem = makeDurable() { throw CommandFailure(problem) }
                return outcome
            }
        }
        throw fail("push to \(remote) lost the race with other machines \(attempts) times: run mtmfs sync again")
    }
}
