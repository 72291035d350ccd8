#if canImport(Glibc)
import Glibc
#endif
import CredentialVault
import FuseLowLevel
import Posix

/// One mtmfs mount: the data directory's stores assembled into the tree and served.
///
/// `run` blocks until the mount ends (unmount, SIGTERM, SIGINT, SIGHUP), flushes every
/// store and returns the exit status.
///
/// Thread-safety: immutable after init; `run` is called once, `stop` from any thread.
public final class MtmfsMount: Sendable {
    public let dataDirectory: DataDirectory
    public let mountPoint: String
    let fuse: FuseMount
    let notifier: KernelCacheNotifier
    let startedAt: Timestamp
    /// Held for the daemon's whole life.
    let claim: DataDirectoryClaim

    /// Checks the data directory and mounts. `options` are extra FUSE `-o` options;
    /// `progress` hears about steps that take long (a full check of the cache).
    public init(dataDirectory: DataDirectory, mountPoint: String, options: [String],
                autoLockSeconds: Int = 900, cacheLimit: Int64? = nil,
                progress: @escaping (String) -> Void = { _ in }) throws(MountError) {
        do {
            try dataDirectory.check()
        } catch {
            throw MountError(error.description)
        }
        // Before any store opens: a second daemon would lose the first one's vault changes
        // and read its open cache as an unclean shutdown.
        do {
            self.claim = try DataDirectoryClaim(dataDirectory, holder: .mount(mountPoint))
        } catch {
            throw MountError(error.description)
        }
        self.dataDirectory = dataDirectory
        self.mountPoint = mountPoint
        let ownership = Ownership.currentProcess()
        self.startedAt = ownership.since
        let notifier = KernelCacheNotifier()
        self.notifier = notifier
        let settings = SettingsTree(plistPath: dataDirectory.settingsPath, ownership: ownership, notifier: notifier)
        let activeKey = "ActiveServiceAccountUUID"
        let accounts = AccountsTree(
            vaultPath: dataDirectory.vaultPath, ownership: ownership, notifier: notifier,
            active: ActiveAccountLink(get: { settings.stringValue(forKey: activeKey) },
                                      set: { (value) throws(Errno) in try settings.setString(value, forKey: activeKey) }),
            autoLockSeconds: autoLockSeconds)
        let cache = CacheTree(databasePath: dataDirectory.cachePath, ownership: ownership, notifier: notifier, limit: cacheLimit,
                              progress: progress)
        let statusLines = StatusReport(dataDirectory: dataDirectory, mountPoint: mountPoint, accounts: accounts, cache: cache)
        let control = ControlTree(files: [
            ControlTree.File(name: "status", mode: 0o444, contents: { statusLines.render() }),
            ControlTree.File(name: "unlock", mode: 0o200, command: { (bytes) throws(Errno) in
                // The passphrase goes straight from libfuse's buffer into secure memory.
                let length = OneNewline.valueEnd(bytes)
                guard length > 0 else { throw .invalidArgument }
                let passphrase = SecureBytes(copying: UnsafeRawBufferPointer(rebasing: bytes[0..<length]))
                SecureBytes.zero(UnsafeMutableRawPointer(mutating: bytes.baseAddress!), bytes.count)
                defer { passphrase.wipe() }
                try accounts.unlock(passphrase: passphrase)
            }),
            ControlTree.File(name: "lock", mode: 0o200, command: { _ in accounts.lock(reason: "lock requested") }),
            ControlTree.File(name: "find", mode: 0o600, query: { (bytes) throws(Errno) in try accounts.find(bytes) }),
        ], ownership: ownership)
        accounts.catchLockSignal()
        let root = RootTree(subtrees: [
            accounts,
            settings,
            cache,
            control,
        ], ownership: ownership, statistics: { Self.statistics(of: dataDirectory.path) })
        // Always nosuid and nodev, whatever -o says (the last option wins): cache/ stores
        // device nodes and set-id bits as data, never as devices or privileges.
        let fuseOptions = ["fsname=" + Self.escapeOption(dataDirectory.path), "subtype=mtmfs",
                           "default_permissions"] + options + ["nosuid", "nodev"]
        self.fuse = try FuseMount(fileSystem: root, mountPoint: mountPoint, options: fuseOptions)
        notifier.attach(fuse)
    }

    /// Serves until the mount ends; `onReady` is called once the mount answers.
    public func run(onReady: @escaping @Sendable () -> Void) -> Int32 {
        Log.info("mounted \(dataDirectory.path) on \(mountPoint)")
        let status = fuse.run(onReady: onReady)
        notifier.attach(nil)  // the notifier held the mount: let both go
        Log.info("unmounted \(mountPoint)")
        return status
    }

    /// Ends the mount as SIGTERM would.
    public func stop() { fuse.exit() }

    /// libfuse option values escape commas and backslashes with a backslash.
    static func escapeOption(_ value: String) -> String {
        var escaped = ""
        for character in value {
            if character == "\\" || character == "," { escaped.append("\\") }
            escaped.append(character)
        }
        return escaped
    }

    /// Space of the file system that holds the data directory: the stores live there.
    static func statistics(of path: String) -> FileSystemStatistics {
        var stats = FileSystemStatistics()
        var raw = statvfs()
        guard statvfs(path, &raw) == 0 else { return stats }
        stats.blockSize = UInt64(raw.f_frsize)
        stats.blocks = UInt64(raw.f_blocks)
        stats.freeBlocks = UInt64(raw.f_bfree)
        stats.availableBlocks = UInt64(raw.f_bavail)
        stats.files = UInt64(raw.f_files)
        stats.freeFiles = UInt64(raw.f_ffree)
        return stats
    }
}

/// The `key=value` lines of `.mtmfs/status`.
///
/// Thread-safety: immutable; `render` asks each tree, which takes its own lock.
struct StatusReport: Sendable {
    let dataDirectory: DataDirectory
    let mountPoint: String
    let accounts: AccountsTree
    let cache: CacheTree

    func render() -> String {
        let lines = accounts.statusLines() + cache.statusLines() + [
            "version=\(MtmfsVersion.string)",
            "data_dir=\(dataDirectory.path)",
            "mount_point=\(mountPoint)",
            "pid=\(getpid())",
        ]
        return lines.joined(separator: "\n") + "\n"
    }
}
