#if canImport(Glibc)
import Glibc
#endif
import Foundation
import Posix
import Testing
import TestSupport

/// `mtmfs sync` and `mtmfs init --from` (SPEC §2b) with the system's git and a bare
/// repository as the remote, two machines as two data directories mounted side by side.
@Suite struct SyncTests {
    static let uuid = "6ba7b810-9dad-41d1-80b4-00c04fd430c8"
    static let other = "0f8fad5b-d9cb-469f-a165-70867728950e"

    /// A bare remote, machine A (made by `init`, mounted, unlocked, one account, synced)
    /// and machine B (made by `init --from` the remote, mounted, unlocked).
    struct Machines {
        let remoteScratch = Scratch("sync-remote")
        let a: MountedStore
        let b: MountedStore
        var remote: String { remoteScratch.sub("vault.git") }

        init() throws {
            let remoteScratch = self.remoteScratch
            let remote = remoteScratch.sub("vault.git")
            try #require(Run.program("git", ["init", "-q", "--bare", remote]).status == 0)
            a = try MountedStore()
            try #require(Run.mtmfs("unlock", a.mountPoint, input: Run.passphrase + "\n").status == 0)
            try #require(mkdir(a.path("accounts/\(Self.uuidA)"), 0o700) == 0)
            try #require(Run.shell("printf 'ann\\n' > \(a.path("accounts/\(Self.uuidA)/username"))").status == 0)
            try #require(FileManager.default.fileExists(atPath: a.dataDirectory + "/vault/.git"), "init made no repository")
            try #require(Run.program("git", ["-C", a.dataDirectory + "/vault", "remote", "add", "origin", remote]).status == 0)
            let synced = Run.mtmfs("sync", a.mountPoint)
            try #require(synced.status == 0, "\(synced)")
            b = try MountedStore(initialize: { data in
                Run.program(Run.mtmfs, ["init", "--from", remote, "--data-dir", data], input: Run.passphrase + "\n")
            })
            try #require(Run.mtmfs("unlock", b.mountPoint, input: Run.passphrase + "\n").status == 0)
        }

        static var uuidA: String { SyncTests.uuid }

        func close() {
            a.close()
            b.close()
            remoteScratch.remove()
        }
    }

    func cat(_ store: MountedStore, _ relative: String) -> String {
        Run.program("cat", [store.path(relative)]).stdout
    }

    func write(_ store: MountedStore, _ relative: String, _ text: String) -> Bool {
        Run.shell("printf '%s\\n' '\(text)' > \(store.path(relative))").status == 0
    }

    @Test func changesTravelBothWaysAndConflictsShowOnBoth() throws {
        let m = try Machines()
        defer { m.close() }
        let field = "accounts/\(Self.uuid)/username"
        #expect(cat(m.b, field) == "ann\n", "init --from brings the accounts")
        #expect(try m.b.status()["state"] == "unlocked")
        let deviceA = try String(contentsOfFile: m.a.dataDirectory + "/device", encoding: .utf8)
        let deviceB = try String(contentsOfFile: m.b.dataDirectory + "/device", encoding: .utf8)
        #expect(deviceA.split(separator: "\n").first != deviceB.split(separator: "\n").first, "each machine its own device id")
        // Apart: one field on both, a new account on each.
        #expect(write(m.a, field, "from a"))
        usleep(5_000)
        #expect(write(m.b, field, "from b"))
        #expect(mkdir(m.b.path("accounts/\(Self.other)"), 0o700) == 0)
        #expect(write(m.b, "accounts/\(Self.other)/label", "made on b"))
        for store in [m.a, m.b, m.a] {
            let synced = Run.mtmfs("sync", store.mountPoint)
            #expect(synced.status == 0, "\(synced)")
        }
        for store in [m.a, m.b] {
            #expect(cat(store, field) == "from b\n", "the later value")
            #expect(cat(store, "accounts/\(Self.uuid)/conflicts/username").hasPrefix("from a\t"))
            #expect(cat(store, "accounts/\(Self.other)/label") == "made on b\n")
            #expect(try store.status()["conflicts"] == "1")
        }
        // Resolved on A, removed on B: both travel.
        #expect(write(m.a, field, "agreed"))
        #expect(Run.shell("rm -r \(m.b.path("accounts/\(Self.other)"))").status == 0)
        for store in [m.a, m.b, m.a] { #expect(Run.mtmfs("sync", store.mountPoint).status == 0) }
        for store in [m.a, m.b] {
            #expect(cat(store, field) == "agreed\n")
            #expect(try store.status()["conflicts"] == "0")
            #expect(!FileManager.default.fileExists(atPath: store.path("accounts/\(Self.other)")))
        }
        // The history holds no value and no name of a field's content.
        let log = Run.program("git", ["-C", m.remote, "log", "--all", "-p", "--format=%an %s"]).stdout
        #expect(!log.contains("agreed") && !log.contains("from a") && !log.contains("made on b") && log.contains("mtmfs"))
        let grep = Run.program("grep", ["-r", "-l", "-F", "-e", "agreed", "-e", "made on b", m.remote, m.a.dataDirectory + "/vault"])
        #expect(grep.stdout.isEmpty, "plaintext in \(grep.stdout)")
    }

    @Test func twoMachinesSyncingAtOnceBothLand() throws {
        let m = try Machines()
        defer { m.close() }
        #expect(write(m.a, "accounts/\(Self.uuid)/comment", "a at once"))
        #expect(write(m.b, "accounts/\(Self.uuid)/label", "b at once"))
        let first = Run.start(Run.mtmfs, ["sync", m.a.mountPoint])
        let second = Run.start(Run.mtmfs, ["sync", m.b.mountPoint])
        #expect(Run.wait(first, timeout: 60) == 0 && Run.wait(second, timeout: 60) == 0)
        for store in [m.a, m.b] { #expect(Run.mtmfs("sync", store.mountPoint).status == 0) }
        for store in [m.a, m.b] {
            #expect(cat(store, "accounts/\(Self.uuid)/comment") == "a at once\n")
            #expect(cat(store, "accounts/\(Self.uuid)/label") == "b at once\n")
        }
    }

    @Test func aFailedSyncChangesNothingAndAKilledOneIsCompletedByTheNext() throws {
        let m = try Machines()
        defer { m.close() }
        let vault = m.b.dataDirectory + "/vault"
        #expect(write(m.b, "accounts/\(Self.uuid)/comment", "kept"))
        let head = Run.program("git", ["-C", vault, "rev-parse", "HEAD"]).stdout
        #expect(Run.program("git", ["-C", vault, "remote", "set-url", "origin", m.remoteScratch.sub("gone.git")]).status == 0)
        let failed = Run.mtmfs("sync", m.b.mountPoint)
        #expect(failed.status == 1 && failed.stderr.contains("cannot reach origin"), "\(failed)")
        #expect(failed.stderr.split(separator: "\n").count == 1, "one line: \(failed.stderr)")
        // git's own words, not its advice's last line ("and the repository exists.").
        #expect(failed.stderr.contains("does not appear to be a git repository") && !failed.stderr.contains("exists."), "\(failed)")
        #expect(Run.program("git", ["-C", vault, "rev-parse", "HEAD"]).stdout == head, "nothing committed")
        #expect(cat(m.b, "accounts/\(Self.uuid)/comment") == "kept\n")
        // A remote that holds another vault is refused.
        let stranger = try MountedStore()
        defer { stranger.close() }
        let strangerRemote = m.remoteScratch.sub("stranger.git")
        #expect(Run.program("git", ["init", "-q", "--bare", strangerRemote]).status == 0)
        #expect(Run.program("git", ["-C", stranger.dataDirectory + "/vault", "remote", "add", "origin", strangerRemote]).status == 0)
        #expect(Run.mtmfs("sync", stranger.mountPoint).status == 0)
        #expect(Run.program("git", ["-C", vault, "remote", "set-url", "origin", strangerRemote]).status == 0)
        let foreign = Run.mtmfs("sync", m.b.mountPoint)
        #expect(foreign.status == 1 && foreign.stderr.contains("another vault"), "\(foreign)")
        // Back to the real remote, with what a sync killed with -9 leaves: git's index lock
        // and a merge that did not finish.
        #expect(Run.program("git", ["-C", vault, "remote", "set-url", "origin", m.remote]).status == 0)
        #expect(FileManager.default.createFile(atPath: vault + "/.git/index.lock", contents: Data()))
        let next = Run.mtmfs("sync", m.b.mountPoint)
        #expect(next.status == 0, "\(next)")
        #expect(Run.mtmfs("sync", m.a.mountPoint).status == 0)
        #expect(cat(m.a, "accounts/\(Self.uuid)/comment") == "kept\n")
        // Without git's help: a usage error names the problem.
        #expect(Run.mtmfs("sync", "--data-dir", m.remoteScratch.sub("nowhere")).status == 1)
    }

    @Test func initFromRefusesAWrongPassphraseAndLeavesNoVault() throws {
        let m = try Machines()
        defer { m.close() }
        let scratch = Scratch("sync-from")
        defer { scratch.remove() }
        let wrong = Run.program(Run.mtmfs, ["init", "--from", m.remote, "--data-dir", scratch.sub("c")], input: "not it\n")
        #expect(wrong.status == 1 && wrong.stderr.contains("wrong passphrase"), "\(wrong)")
        #expect(!FileManager.default.fileExists(atPath: scratch.sub("c/vault")) && !FileManager.default.fileExists(atPath: scratch.sub("c/Settings.plist")))
        let missing = Run.program(Run.mtmfs, ["init", "--from", scratch.sub("none.git"), "--data-dir", scratch.sub("d")], input: "x\n")
        #expect(missing.status == 1 && missing.stderr.contains("cannot clone"), "\(missing)")
        let usage = Run.program(Run.mtmfs, ["init", "--from", m.remote, "--kdf", "sensitive", "--data-dir", scratch.sub("e")], input: "x\n")
        #expect(usage.status == 2, "\(usage)")
    }

    // MARK: A sync killed with SIGKILL (issue 35)

    /// git in a vault folder, as a user runs it by hand (an identity of its own: the test
    /// machine may have none).
    func git(_ folder: String, _ arguments: String...) -> CommandResult {
        Run.program("git", ["-C", folder, "-c", "user.name=by hand", "-c", "user.email=hand@localhost"] + arguments)
    }

    /// Where a sync is killed: after a delay, or while the `nth` git child of it running
    /// `step` (`add`, `commit`, `push`, `fetch`, `merge`) runs.
    enum KillPoint: CustomStringConvertible {
        case after(Double)
        case during(String, nth: Int)

        var description: String {
            switch self {
            case .after(let delay): "after \(Int(delay * 1000)) ms"
            case .during(let step, let nth): "during git \(step)" + (nth > 1 ? " (#\(nth))" : "")
            }
        }
    }

    /// How a sync started for killing ended.
    enum Killed: Equatable { case whileGitRan, beforeOrBetweenGit, finishedFirst }

    /// The children of `pid` with their arguments: from /proc/PID/task/*/children (cheap
    /// enough to poll while a git step of a few milliseconds runs), else from every
    /// process's parent in /proc/*/stat.
    static func children(of pid: pid_t) -> [(pid: pid_t, arguments: [String])] {
        func arguments(_ child: pid_t) -> [String] {
            let line = (try? Syscall.readFile("/proc/\(child)/cmdline")) ?? []
            return line.split(separator: 0).map { String(decoding: $0, as: UTF8.self) }
        }
        var found: [(pid: pid_t, arguments: [String])] = []
        let tasks = (try? Syscall.listDirectory("/proc/\(pid)/task")) ?? []
        if let first = tasks.first, (try? Syscall.lstat("/proc/\(pid)/task/\(first)/children")) != nil {
            for task in tasks {
                let listed = String(decoding: (try? Syscall.readFile("/proc/\(pid)/task/\(task)/children")) ?? [], as: UTF8.self)
                for child in listed.split(separator: " ").compactMap({ pid_t($0) }) {
                    found.append((pid: child, arguments: arguments(child)))
                }
            }
            return found
        }
        for child in ((try? Syscall.listDirectory("/proc")) ?? []).compactMap({ pid_t($0) }) {
            let stat = String(decoding: (try? Syscall.readFile("/proc/\(child)/stat")) ?? [], as: UTF8.self)
            guard let end = stat.lastIndex(of: ")") else { continue }
            let fields = stat[stat.index(after: end)...].split(separator: " ")  // state, parent, …
            if fields.count > 1 && pid_t(fields[1]) == pid { found.append((pid: child, arguments: arguments(child))) }
        }
        return found
    }

    /// Starts `mtmfs sync` of `store` and kills it and the git it runs with SIGKILL at
    /// `point` (the remote's side of a push, a server elsewhere, is left to end). A sync
    /// that runs a minute is killed too (and fails the checks after it).
    func killSync(_ store: MountedStore, at point: KillPoint) -> Killed {
        let pid = Run.start(Run.mtmfs, ["sync", store.mountPoint])
        guard pid > 0 else { return .finishedFirst }
        let started = ContinuousClock.now
        var seen = Set<pid_t>()
        while true {
            var status: Int32 = 0
            let reaped = waitpid(pid, &status, WNOHANG)
            if reaped == pid || (reaped == -1 && errno != EINTR) { return .finishedFirst }
            let gits = Self.children(of: pid).filter { $0.arguments.first == "git" }
            var due = started.secondsElapsed > 60
            switch point {
            case .after(let delay): due = due || started.secondsElapsed >= delay
            case .during(let step, let nth):
                for child in gits where child.arguments.contains(step) { seen.insert(child.pid) }
                due = due || seen.count >= nth
            }
            if due {
                // The sync and its git processes die, stopped first so that no new one starts
                // meanwhile. The remote's side of a push or fetch (git-receive-pack,
                // git-upload-pack: on this machine only because the remote is a local path,
                // another machine's server otherwise) runs to its end, as a server whose
                // client went away does; so do the helpers git started.
                kill(pid, SIGSTOP)
                let running = Self.children(of: pid).filter { $0.arguments.first == "git" }
                for child in running { kill(child.pid, SIGKILL) }
                kill(pid, SIGKILL)
                Run.wait(pid, timeout: 10)
                for child in running { _ = Poll.until(seconds: 10) { !ProcessState.isRunning(child.pid) } }
                _ = Poll.until(seconds: 10) {
                    !Run.program("pgrep", ["-f", "(receive|upload)-pack"]).stdout.contains(where: \.isNumber)
                }
                return running.isEmpty ? .beforeOrBetweenGit : .whileGitRan
            }
            usleep(200)
        }
    }

    /// A sync killed with SIGKILL (its whole process group, git included) loses nothing,
    /// and the next sync completes (SPEC §2b): it exits 0, this machine's commit is the
    /// remote's, nothing is left staged, untracked or half merged, and both mounts show
    /// every value. The kills land at fixed delays and while git runs each of a sync's
    /// steps; with `merging` the other machine pushed first, so the sync's first push is
    /// refused and it fetches, merges and pushes again.
    @Test(arguments: [false, true])
    func aSyncKilledWithSIGKILLLosesNothingAndTheNextCompletes(merging: Bool) throws {
        let m = try Machines()
        defer { m.close() }
        let vault = m.b.dataDirectory + "/vault"
        let steps = merging ? [("add", 1), ("commit", 1), ("push", 1), ("fetch", 1), ("merge", 1), ("push", 2)]
                            : [("add", 1), ("commit", 1), ("push", 1)]
        let points = [0, 0.005, 0.02, 0.05].map { KillPoint.after($0) } + steps.map { KillPoint.during($0.0, nth: $0.1) }
        var turn = 0
        for point in points {
            var landed = false
            // A step that ended before it was seen is tried again with a new change.
            for _ in 0..<3 where !landed {
                turn += 1
                if merging {
                    #expect(write(m.a, "accounts/\(Self.uuid)/label", "a \(turn)"))
                    #expect(Run.mtmfs("sync", m.a.mountPoint).status == 0)
                }
                #expect(write(m.b, "accounts/\(Self.uuid)/comment", "b \(turn)"))
                let killed = killSync(m.b, at: point)
                if case .after = point { landed = true } else { landed = killed == .whileGitRan }
                let next = Run.mtmfs("sync", m.b.mountPoint)
                #expect(next.status == 0, "the sync after a kill \(point): \(next)")
                let head = git(vault, "rev-parse", "HEAD").stdout
                #expect(head == git(m.remote, "rev-parse", "main").stdout, "after a kill \(point) the next sync did not push \(head)")
                let left = git(vault, "status", "--porcelain").stdout
                #expect(left.isEmpty, "after a kill \(point) the next sync left behind: \(left)")
                for leftover in ["MERGE_HEAD", "index.lock", "refs/heads/main.lock"] {
                    #expect(!FileManager.default.fileExists(atPath: vault + "/.git/" + leftover), "\(leftover) after a kill \(point)")
                }
                #expect(Run.mtmfs("sync", m.a.mountPoint).status == 0)
                let comment = "accounts/\(Self.uuid)/comment", label = "accounts/\(Self.uuid)/label"
                for store in [m.a, m.b] {
                    #expect(Poll.until { cat(store, comment) == "b \(turn)\n" }, "after a kill \(point): \(cat(store, comment))")
                    if merging { #expect(Poll.until { cat(store, label) == "a \(turn)\n" }, "after a kill \(point): \(cat(store, label))") }
                }
                #expect(Run.program("ls", [m.a.path("accounts")]).stdout == Run.program("ls", [m.b.path("accounts")]).stdout)
            }
            #expect(landed, "no kill landed while git ran \(point)")
        }
    }

    /// What a sync killed midway can leave besides a stale index lock: a merge that did not
    /// finish (MERGE_HEAD, the other machine's files half merged) and a lock on the branch
    /// (a kill inside a commit's ref update). The next sync recovers — an unfinished merge
    /// is aborted (VaultRepository.recoverFromAKilledSync: files are write-once, merging
    /// again brings the same ones) — and completes: both machines' values, and one written
    /// after the kill, reach both mounts.
    @Test func aMergeLeftUnfinishedAndStaleLocksAreRecoveredByTheNextSync() throws {
        let m = try Machines()
        defer { m.close() }
        let vault = m.b.dataDirectory + "/vault"
        let comment = "accounts/\(Self.uuid)/comment", label = "accounts/\(Self.uuid)/label", username = "accounts/\(Self.uuid)/username"
        #expect(write(m.a, label, "from a"))
        #expect(Run.mtmfs("sync", m.a.mountPoint).status == 0)
        #expect(write(m.b, comment, "from b"))
        // B's sync as far as its merge: committed, fetched, merged but not committed, with
        // git's index lock; then a value written after the kill.
        #expect(git(vault, "add", "-A").status == 0)
        #expect(git(vault, "commit", "-q", "-m", "mtmfs: 1 file(s)").status == 0)
        #expect(git(vault, "fetch", "-q", "origin").status == 0)
        let merge = git(vault, "merge", "--no-commit", "--no-ff", "origin/main")
        #expect(merge.status == 0 && FileManager.default.fileExists(atPath: vault + "/.git/MERGE_HEAD"), "\(merge)")
        #expect(FileManager.default.createFile(atPath: vault + "/.git/index.lock", contents: Data()))
        #expect(write(m.b, username, "after the kill"))
        let next = Run.mtmfs("sync", m.b.mountPoint)
        #expect(next.status == 0, "\(next)")
        #expect(!FileManager.default.fileExists(atPath: vault + "/.git/MERGE_HEAD"))
        #expect(git(vault, "status", "--porcelain").stdout.isEmpty, "\(git(vault, "status", "--porcelain").stdout)")
        #expect(git(vault, "rev-parse", "HEAD").stdout == git(m.remote, "rev-parse", "main").stdout)
        #expect(Run.mtmfs("sync", m.a.mountPoint).status == 0)
        for store in [m.a, m.b] {
            #expect(Poll.until { cat(store, label) == "from a\n" && cat(store, comment) == "from b\n" && cat(store, username) == "after the kill\n" },
                    "\(cat(store, label))\(cat(store, comment))\(cat(store, username))")
        }
        // Killed between git's making the branch's lock and renaming it into place.
        #expect(write(m.b, comment, "past a ref lock"))
        #expect(FileManager.default.createFile(atPath: vault + "/.git/refs/heads/main.lock", contents: Data()))
        let past = Run.mtmfs("sync", m.b.mountPoint)
        #expect(past.status == 0, "\(past)")
        #expect(git(vault, "status", "--porcelain").stdout.isEmpty, "\(git(vault, "status", "--porcelain").stdout)")
        #expect(Run.mtmfs("sync", m.a.mountPoint).status == 0)
        #expect(Poll.until { cat(m.a, comment) == "past a ref lock\n" }, "\(cat(m.a, comment))")
        // Killed inside a merge, between git's making ORIG_HEAD's lock and renaming it (the
        // next merge said "cannot lock ref 'ORIG_HEAD'"): the other machine is ahead.
        #expect(write(m.a, label, "ahead again"))
        #expect(Run.mtmfs("sync", m.a.mountPoint).status == 0)
        #expect(write(m.b, comment, "past the ORIG_HEAD lock"))
        #expect(FileManager.default.createFile(atPath: vault + "/.git/ORIG_HEAD.lock", contents: Data()))
        let merged = Run.mtmfs("sync", m.b.mountPoint)
        #expect(merged.status == 0, "\(merged)")
        #expect(git(vault, "rev-parse", "HEAD").stdout == git(m.remote, "rev-parse", "main").stdout)
        #expect(Run.mtmfs("sync", m.a.mountPoint).status == 0)
        for store in [m.a, m.b] {
            #expect(Poll.until { cat(store, label) == "ahead again\n" && cat(store, comment) == "past the ORIG_HEAD lock\n" },
                    "\(cat(store, label))\(cat(store, comment))")
        }
    }

    // MARK: A passphrase change travelling (issue 35)

    /// Whether `phrase` (a file) unlocks `store`'s mount; the mount is locked before and after.
    func unlocks(_ store: MountedStore, _ phrase: String) -> Bool {
        Run.mtmfs("lock", store.mountPoint)
        let unlocked = Run.mtmfs("unlock", "--passphrase-file", phrase, store.mountPoint)
        Run.mtmfs("lock", store.mountPoint)
        return unlocked.status == 0
    }

    /// `mtmfs passwd` of an unmounted data directory, passphrases from files.
    func passwd(_ store: MountedStore, from old: String, to new: String) -> CommandResult {
        Run.mtmfs("passwd", "--data-dir", store.dataDirectory, "--kdf", "interactive", "--passphrase-file", old, "--new-passphrase-file", new)
    }

    /// Passphrase files in a scratch directory: the test passphrase and `names`.
    func phrases(_ scratch: Scratch, _ names: String...) throws -> [String: String] {
        var files: [String: String] = [:]
        for name in ["old"] + names {
            files[name] = scratch.sub(name)
            try ((name == "old" ? Run.passphrase : "phrase \(name)") + "\n").write(toFile: scratch.sub(name), atomically: true, encoding: .utf8)
        }
        return files
    }

    /// `mtmfs passwd` on machine A (unmounted: a mounted one is refused) reaches B through
    /// sync (SPEC §2b, docs/vault-format-3.md "Keys and slots"): until B syncs, the old
    /// passphrase still unlocks B and the new one does not; once synced, the new one
    /// unlocks B and the old one no longer (A's slot retired it); A likewise.
    @Test func aPassphraseChangeTravelsBySync() throws {
        let m = try Machines()
        defer { m.close() }
        let scratch = Scratch("passwd")
        defer { scratch.remove() }
        let phrase = try phrases(scratch, "new")
        let refused = passwd(m.a, from: phrase["old"]!, to: phrase["new"]!)
        #expect(refused.status == 1 && refused.stderr.contains("unmount"), "\(refused)")
        #expect(Run.mtmfs("unmount", m.a.mountPoint).status == 0)
        let changed = passwd(m.a, from: phrase["old"]!, to: phrase["new"]!)
        #expect(changed.status == 0, "\(changed)")
        let sent = Run.mtmfs("sync", "--data-dir", m.a.dataDirectory)
        #expect(sent.status == 0, "\(sent)")
        // Not yet on B.
        #expect(unlocks(m.b, phrase["old"]!), "before B syncs the old passphrase still unlocks it")
        #expect(!unlocks(m.b, phrase["new"]!))
        // Synced while B is mounted and locked.
        let received = Run.mtmfs("sync", m.b.mountPoint)
        #expect(received.status == 0, "\(received)")
        #expect(unlocks(m.b, phrase["new"]!), "after B syncs the new passphrase unlocks it")
        #expect(!unlocks(m.b, phrase["old"]!), "the old passphrase still unlocks B after the change arrived")
        #expect(Run.mtmfs("unlock", "--passphrase-file", phrase["new"]!, m.b.mountPoint).status == 0)
        #expect(cat(m.b, "accounts/\(Self.uuid)/username") == "ann\n")
        #expect(Run.mtmfs("mount", "--data-dir", m.a.dataDirectory, m.a.mountPoint).status == 0)
        #expect(!unlocks(m.a, phrase["old"]!))
        #expect(unlocks(m.a, phrase["new"]!))
    }

    /// Two passphrase changes made apart (A and B each from the old one, then synced) both
    /// unlock both machines, and the old one neither, until the next `mtmfs passwd`: made
    /// on A from B's passphrase and synced, only that one unlocks, on both.
    @Test func twoPassphraseChangesMadeApartBothUnlockUntilTheNext() throws {
        let m = try Machines()
        defer { m.close() }
        let scratch = Scratch("passwd")
        defer { scratch.remove() }
        let phrase = try phrases(scratch, "a", "b", "next")
        for store in [m.a, m.b] { #expect(Run.mtmfs("unmount", store.mountPoint).status == 0) }
        #expect(passwd(m.a, from: phrase["old"]!, to: phrase["a"]!).status == 0)
        #expect(passwd(m.b, from: phrase["old"]!, to: phrase["b"]!).status == 0)
        for store in [m.a, m.b, m.a] {
            let synced = Run.mtmfs("sync", "--data-dir", store.dataDirectory)
            #expect(synced.status == 0, "\(synced)")
        }
        for store in [m.a, m.b] {
            #expect(Run.mtmfs("mount", "--data-dir", store.dataDirectory, store.mountPoint).status == 0)
            #expect(unlocks(store, phrase["a"]!) && unlocks(store, phrase["b"]!), "both changes made apart unlock \(store.mountPoint)")
            #expect(!unlocks(store, phrase["old"]!))
        }
        // The next change, on A, retires both.
        #expect(Run.mtmfs("unmount", m.a.mountPoint).status == 0)
        let next = passwd(m.a, from: phrase["b"]!, to: phrase["next"]!)
        #expect(next.status == 0, "\(next)")
        #expect(Run.mtmfs("sync", "--data-dir", m.a.dataDirectory).status == 0)
        #expect(Run.mtmfs("sync", m.b.mountPoint).status == 0)
        #expect(Run.mtmfs("mount", "--data-dir", m.a.dataDirectory, m.a.mountPoint).status == 0)
        for store in [m.a, m.b] {
            #expect(unlocks(store, phrase["next"]!))
            for old in ["old", "a", "b"] { #expect(!unlocks(store, phrase[old]!), "\(old) still unlocks \(store.mountPoint)") }
        }
        #expect(Run.mtmfs("unlock", "--passphrase-file", phrase["next"]!, m.b.mountPoint).status == 0)
        #expect(cat(m.b, "accounts/\(Self.uuid)/username") == "ann\n")
    }

    // MARK: Errors of sync (issue 35)

    /// What a failed sync must leave as it was: the commit checked out, the remote's
    /// branch, and what git status shows (the new change file untracked).
    func snapshot(_ m: Machines) -> [String] {
        let vault = m.b.dataDirectory + "/vault"
        return [git(vault, "rev-parse", "HEAD").stdout, git(m.remote, "rev-parse", "main").stdout, git(vault, "status", "--porcelain").stdout]
    }

    /// A push the remote refuses (its pre-receive hook exits 1) is not a race lost to
    /// another machine: exit 1, one line that says the push was rejected, nothing changed
    /// (no commit left, the new file untracked again). Once the remote takes pushes, the
    /// same change goes through.
    @Test func aRejectedPushSaysSoAndChangesNothing() throws {
        let m = try Machines()
        defer { m.close() }
        let hook = m.remote + "/hooks/pre-receive"
        try "#!/bin/sh\necho 'pushes are closed here' >&2\nexit 1\n".write(toFile: hook, atomically: true, encoding: .utf8)
        #expect(chmod(hook, 0o755) == 0)
        #expect(write(m.b, "accounts/\(Self.uuid)/comment", "refused"))
        let before = snapshot(m)
        #expect(before[2].hasPrefix("?? "), "\(before[2])")
        let refused = Run.mtmfs("sync", m.b.mountPoint)
        #expect(refused.status == 1, "\(refused)")
        #expect(refused.stderr.split(separator: "\n").count == 1, "one line: \(refused.stderr)")
        let said = refused.stderr.lowercased()
        #expect(said.contains("reject") || said.contains("declined"), "does not say the push was rejected: \(refused.stderr)")
        #expect(snapshot(m) == before, "changed locally: \(snapshot(m)) (was \(before))")
        #expect(cat(m.b, "accounts/\(Self.uuid)/comment") == "refused\n")
        #expect(unlink(hook) == 0)
        #expect(Run.mtmfs("sync", m.b.mountPoint).status == 0)
        #expect(Run.mtmfs("sync", m.a.mountPoint).status == 0)
        #expect(cat(m.a, "accounts/\(Self.uuid)/comment") == "refused\n")
    }

    /// A repository changed by hand: the same file committed by hand on both machines
    /// makes a merge that does not apply — exit 1, one line naming it, nothing changed
    /// (the merge aborted, the sync's own commit taken back); a detached HEAD either
    /// syncs for real (the change reaches A) or is refused the same way, never a sync that
    /// says it sent what no remote got.
    @Test func aRepositoryChangedByHandIsRefusedAndChangesNothing() throws {
        let m = try Machines()
        defer { m.close() }
        let vaultA = m.a.dataDirectory + "/vault", vault = m.b.dataDirectory + "/vault"
        let comment = "accounts/\(Self.uuid)/comment"
        let beforeHand = git(vault, "rev-parse", "HEAD").stdout.trimmingCharacters(in: .whitespacesAndNewlines)
        try "from a\n".write(toFile: vaultA + "/notes", atomically: true, encoding: .utf8)
        #expect(git(vaultA, "add", "notes").status == 0 && git(vaultA, "commit", "-q", "-m", "notes").status == 0)
        #expect(Run.mtmfs("sync", m.a.mountPoint).status == 0)
        try "from b\n".write(toFile: vault + "/notes", atomically: true, encoding: .utf8)
        #expect(git(vault, "add", "notes").status == 0 && git(vault, "commit", "-q", "-m", "notes").status == 0)
        #expect(write(m.b, comment, "by hand"))
        let before = snapshot(m)
        let conflicted = Run.mtmfs("sync", m.b.mountPoint)
        #expect(conflicted.status == 1 && conflicted.stderr.contains("changed by hand"), "\(conflicted)")
        #expect(conflicted.stderr.split(separator: "\n").count == 1, "one line: \(conflicted.stderr)")
        #expect(!FileManager.default.fileExists(atPath: vault + "/.git/MERGE_HEAD"))
        #expect(snapshot(m) == before, "changed locally: \(snapshot(m)) (was \(before))")
        #expect(cat(m.b, comment) == "by hand\n")
        // Put right by hand (B's notes taken back; its change files stay in the folder), then
        // a detached HEAD.
        #expect(git(vault, "reset", "-q", "--mixed", beforeHand).status == 0)
        #expect(unlink(vault + "/notes") == 0)
        #expect(Run.mtmfs("sync", m.b.mountPoint).status == 0)
        #expect(git(vault, "checkout", "-q", "--detach").status == 0)
        #expect(write(m.b, comment, "detached"))
        let headBefore = git(vault, "rev-parse", "HEAD").stdout
        let detached = Run.mtmfs("sync", m.b.mountPoint)
        #expect(Run.mtmfs("sync", m.a.mountPoint).status == 0)
        if detached.status == 0 {
            #expect(cat(m.a, comment) == "detached\n", "a sync of a detached HEAD said \(detached.stdout) but A did not get it")
        } else {
            #expect(detached.status == 1 && detached.stderr.split(separator: "\n").count == 1, "\(detached)")
            #expect(git(vault, "rev-parse", "HEAD").stdout == headBefore, "committed on a detached HEAD")
        }
        #expect(cat(m.b, comment) == "detached\n")
    }

    /// Without git on PATH, sync says so in one line, exits 1 and changes nothing.
    @Test func syncWithoutGitSaysSoAndChangesNothing() throws {
        let store = try MountedStore()
        defer { store.close() }
        #expect(Run.mtmfs("unlock", store.mountPoint, input: Run.passphrase + "\n").status == 0)
        #expect(mkdir(store.path("accounts/\(Self.uuid)"), 0o700) == 0)
        #expect(write(store, "accounts/\(Self.uuid)/username", "ann"))
        let vault = store.dataDirectory + "/vault"
        func state() -> [String] { [git(vault, "rev-parse", "-q", "--verify", "HEAD").stdout, git(vault, "status", "--porcelain").stdout] }
        let before = state()
        let empty = store.scratch.sub("no-git")
        #expect(mkdir(empty, 0o755) == 0)
        let environment = ["PATH": empty, "HOME": store.scratch.path]
        let missing = Run.program(Run.mtmfs, ["sync", store.mountPoint], environment: environment)
        #expect(missing.status == 1 && missing.stderr.contains("needs git"), "\(missing)")
        #expect(missing.stderr.split(separator: "\n").count == 1, "one line: \(missing.stderr)")
        let direct = Run.program(Run.mtmfs, ["sync", "--data-dir", store.dataDirectory], environment: environment)
        #expect(direct.status == 1 && direct.stderr.contains("needs git"), "\(direct)")
        #expect(state() == before)
        #expect(cat(store, "accounts/\(Self.uuid)/username") == "ann\n")
    }
}
