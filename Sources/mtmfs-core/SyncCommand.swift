#if canImport(Glibc)
import Glibc
#endif
import CredentialVault
import ScriptCommands
import MountedTree
import Posix

/// `mtmfs sync`: keeps the vault folder in step with its git remote (SPEC §2b).
struct SyncCommand: Command {
    static let name = "sync"
    static let abstract = "keep the vault in step with its git remote (commit, fetch, merge, push)"
    static let usage = """
    Usage: mtmfs sync [--data-dir DIR] [MOUNT]

    The vault folder (DATA_DIR/vault) is a git repository: sync commits its new files,
    fetches from the remote (`origin`, added with `git -C DATA_DIR/vault remote add origin
    URL`: any URL git knows), merges, and pushes; a push that lost a race with another
    machine's fetches and merges again. A mount of the data directory shows the merged
    accounts when sync returns. Without a remote the files are only committed. The files
    are write-once and named by their machine: a merge never conflicts. Needs git.

    MOUNT (or the one mtmfs mount that is up) names the data directory; --data-dir names
    one directly (mounted or not). A failed fetch (an unreachable remote) changes nothing;
    exit 1 with what failed. A sync killed midway loses nothing: the next one completes.
    """
    static let flags: Set<String> = []
    static let options: Set<String> = ["--data-dir"]

    let dataDirectory: DataDirectory
    let mountPoint: String?

    init(_ arguments: Arguments) throws(CommandFailure) {
        let given = try arguments.positionals(0...1, named: "").first
        if let directory = arguments.value("--data-dir") {
            guard given == nil else { throw .usage("give a MOUNT or --data-dir, not both", command: Self.name) }
            let chosen = DataDirectory(path: Paths.dataDirectory(directory))
            dataDirectory = chosen
            mountPoint = MountTable.ownMtmfsMounts().map(\.mountPoint).first {
                StatusFile.read(mountPoint: $0)["data_dir"] == chosen.path
            }
        } else if given != nil || MountTable.ownMtmfsMounts().count == 1 {
            let mount = try MountChoice.resolve(given)
            guard let directory = StatusFile.read(mountPoint: mount)["data_dir"] else {
                throw CommandFailure("cannot read \(mount)/.mtmfs/status: which data directory it serves is unknown")
            }
            dataDirectory = DataDirectory(path: directory)
            mountPoint = mount
        } else {
            dataDirectory = DataDirectory(path: Paths.dataDirectory(nil))
            mountPoint = nil
        }
    }

    func run() throws(CommandFailure) {
        guard VaultRepository.gitIsInstalled else {
            throw CommandFailure("mtmfs sync needs git, which is not installed (apt install git)")
        }
        let folder = dataDirectory.vaultPath
        guard Vault.isFolder(folder) else {
            throw CommandFailure(((try? Syscall.lstat(folder)) != nil)
                ? "\(folder) is a vault of the single-file format: unlock it once (it is then converted to a folder), then sync"
                : "\(dataDirectory.path) holds no vault: see `mtmfs init`")
        }
        let lock = try SyncLock(dataDirectory.path + "/sync.lock")
        defer { withExtendedLifetime(lock) {} }
        let repository = VaultRepository(folder: folder)
        if !repository.isRepository { try repository.initialize() }
        let before = Self.changeFileCount(folder)
        let outcome = try repository.sync(device: Self.device(of: dataDirectory) ?? "unknown",
                                          localID: Self.read(folder + "/id") ?? "")
        if let mountPoint, outcome.received > 0 { Self.waitUntilShown(mountPoint, folder: folder) }
        let received = max(0, Self.changeFileCount(folder) - before)
        guard let remote = outcome.remote else {
            print("Committed \(outcome.sent) file(s) in \(folder); no remote to sync with "
                  + "(add one: git -C \(folder) remote add origin URL)")
            return
        }
        print("Synced with \(remote): \(outcome.sent) file(s) sent, \(received) change file(s) received.")
    }

    /// The change files in the folder (`*.mtv` in the device folders).
    static func changeFileCount(_ folder: String) -> Int {
        var count = 0
        for name in (try? Syscall.listDirectory(folder)) ?? [] where name.utf8.count == 16 {
            count += ((try? Syscall.listDirectory(folder + "/" + name)) ?? []).filter { !$0.hasPrefix(".") && $0.hasSuffix(".mtv") }.count
        }
        return count
    }

    /// Waits (at most 5 s) until the mount has read every change file the merge brought:
    /// its loaded and skipped files add up to the folder's.
    static func waitUntilShown(_ mountPoint: String, folder: String) {
        for _ in 0..<250 {
            let status = StatusFile.read(mountPoint: mountPoint)
            let loaded = Int(status["vault_files"] ?? "") ?? 0
            let skipped = status.keys.isEmpty ? 0 : Int(status["vault_skipped"] ?? "") ?? 0
            if loaded + skipped >= changeFileCount(folder) { return }
            usleep(20_000)
        }
    }

    static func read(_ path: String) -> String? {
        (try? Syscall.readFile(path)).map { String(decoding: $0, as: UTF8.self) }
    }

    /// This machine's device id for the vault (the first line of `DATA_DIR/device`).
    static func device(of dataDirectory: DataDirectory) -> String? {
        read(dataDirectory.path + "/device")?.split(separator: "\n").first { $0.hasPrefix("device ") }.map { String($0.dropFirst(7)) }
    }
}

/// One `mtmfs sync` of a data directory at a time (flock on `DATA_DIR/sync.lock`): while
/// it is held, nothing else runs git in the vault folder, so a lock file git left is stale.
/// The git processes a sync starts inherit the lock's descriptor: a sync killed while git
/// runs leaves the lock held until that git ends, and the next sync waits for it (at most
/// `patience` seconds) rather than clearing a lock file a live git still owns.
///
/// Thread-safety: owned by one command.
final class SyncLock {
    let fd: Int32
    static let patience = 30.0

    init(_ path: String) throws(CommandFailure) {
        do {
            fd = try Syscall.open(path, O_RDWR | O_CREAT, mode: 0o600)
            _ = fcntl(fd, F_SETFD, 0)  // (inherited by git: see above)
        } catch {
            throw CommandFailure("cannot open \(path): \(error)")
        }
        let started = ContinuousClock.now
        while true {
            do throws(Errno) {
                try Syscall.lockExclusively(fd)
                return
            } catch where error == .tryAgain && started.secondsElapsed < Self.patience {
                usleep(50_000)
            } catch {
                Syscall.close(fd)
                throw CommandFailure(error == .tryAgain ? "another mtmfs sync of this data directory is running"
                                                        : "cannot lock \(path): \(error)")
            }
        }
    }

    deinit { Syscall.close(fd) }
}
