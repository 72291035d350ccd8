#if canImport(Glibc)
import Glibc
#endif
import CredentialVault
import SecureMemory
import FuseLowLevel
import Posix
import MountedTree
import SecretService
import LoginSession

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
    /// The Secret Service on the session bus (`-o secret_service`), while the mount lives.
    let secretService: SecretServiceBus?
    /// logind's sleep and screen-lock signals (`-o lock_on_sleep,lock_with_screen`).
    let sessionWatch: LoginSessionWatch?

    /// Checks the data directory and mounts. `options` are extra FUSE `-o` options;
    /// `progress` hears about steps that take long (a full check of the cache).
    public init(dataDirectory: DataDirectory, mountPoint: String, options: [String],
                autoLockSeconds: Int = 900, cacheLimit: Int64? = nil, pinentry: String = "pinentry",
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
        // The kernel's references to every inode of the mount, in one table.
        let nodes = NodeTable()
        let settings = SettingsTree(plistPath: dataDirectory.settingsPath, ownership: ownership, notifier: notifier,
                                    nodes: nodes)
        if let problem = settings.problem {
            progress("\(problem): settings/ answers EIO until it can be read; the file is left as it is")
        }
        let activeKey = "ActiveServiceAccountUUID"
        // The vault service, and its doors: the FUSE tree, the control files, the bus.
        let vault = VaultService(vaultPath: dataDirectory.vaultPath, ownership: ownership, notifier: notifier,
                                 autoLockSeconds: autoLockSeconds, prompts: Self.prompts(pinentry, mountPoint: mountPoint),
                                 nodes: nodes)
        let accounts = AccountsTree(
            service: vault,
            active: ActiveAccountLink(get: { settings.stringValue(forKey: activeKey) },
                                      set: { (value) throws(Errno) in try settings.setString(value, forKey: activeKey) }),
            nodes: nodes)
        if let problem = vault.statusLines().first(where: { $0.hasPrefix("vault_error=") }) {
            progress(String(problem.dropFirst("vault_error=".count)) + ": accounts/ cannot be unlocked; the vault is left as it is "
                     + "(`mtmfs check` names what is wrong)")
        }
        let cache = CacheTree(databasePath: dataDirectory.cachePath, ownership: ownership, notifier: notifier, limit: cacheLimit,
                              nodes: nodes, progress: progress)
        let statusLines = StatusReport(dataDirectory: dataDirectory, mountPoint: mountPoint, vault: vault,
                                       settings: settings, cache: cache)
        let control = ControlTree(files: [
            ControlTree.File(name: "status", mode: 0o444, contents: { statusLines.render() }),
            ControlTree.File(name: "unlock", mode: 0o200, command: { (bytes) throws(Errno) in
                try Self.withPassphrase(bytes) { (passphrase) throws(Errno) in try vault.unlock(passphrase: passphrase) }
            }),
            // "recovery" or "login", a newline, the recovery key or login password: an unlock
            // that tries the slots of that kind alone (`mtmfs unlock --recovery-key`).
            ControlTree.File(name: "unlock-with", mode: 0o200, command: { (bytes) throws(Errno) in
                try Self.withCommand(bytes) { (words, secret) throws(Errno) in
                    guard words.count == 1, let kind = SlotKind(name: words[0]), kind != .passphrase else { throw .invalidArgument }
                    guard kind == .recovery else { return try vault.unlock(passphrase: secret, kind: kind) }
                    // A recovery key's slot opens with its 16 bytes, however the letters were typed.
                    guard let key = try RecoveryKey.parse(secret) else { throw .permissionDenied }
                    defer { key.wipe() }
                    try vault.unlock(passphrase: key, kind: .recovery)
                }
            }),
            // The old login password, a newline, the new one (`mtmfs passwd --login-changed`, run
            // by the PAM module at a password change): the login slot follows, locked or not.
            ControlTree.File(name: "login-changed", mode: 0o200, command: { (bytes) throws(Errno) in
                try Self.withTwoSecrets(bytes) { (old, new) throws(Errno) in try vault.loginPasswordChanged(old: old, new: new) }
            }),
            // Answered once the kernel was told to forget every field (`mtmfs lock` returns then).
            ControlTree.File(name: "lock", mode: 0o200, command: { _ in vault.lock(reason: "lock requested") },
                             answerWhenDone: { answer in notifier.whenSent(answer) }),
            // "on" or "off", a newline, the passphrase.
            // Answered once the kernel was told to forget the pages guarding now covers.
            ControlTree.File(name: "guard", mode: 0o200, command: { (bytes) throws(Errno) in
                try Self.withCommand(bytes) { (words, passphrase) throws(Errno) in
                    guard words.count == 1, words[0] == "on" || words[0] == "off" else { throw .invalidArgument }
                    try vault.setGuarding(words[0] == "on", passphrase: passphrase)
                }
            }, answerWhenDone: { answer in notifier.whenSent(answer) }),
            // "trust ACCOUNT PATH…" or "untrust ACCOUNT PATH…" (tab-separated), a newline, the passphrase.
            ControlTree.File(name: "trust", mode: 0o200, command: { (bytes) throws(Errno) in
                try Self.withCommand(bytes) { (words, passphrase) throws(Errno) in
                    guard words.count >= 3, words[0] == "trust" || words[0] == "untrust" else { throw .invalidArgument }
                    try vault.changeTrust(adding: words[0] == "trust", accountName: words[1], programs: Array(words[2...]),
                                             passphrase: passphrase)
                }
            }, answerWhenDone: { answer in notifier.whenSent(answer) }),
            // The passphrase alone: EACCES unless it is the vault's (`mtmfs export` asks it again).
            ControlTree.File(name: "verify", mode: 0o200, command: { (bytes) throws(Errno) in
                try Self.withPassphrase(bytes) { (passphrase) throws(Errno) in try vault.checkPassphrase(passphrase) }
            }),
            ControlTree.File(name: "access", mode: 0o400, contents: { vault.recentDecisions() }),
            ControlTree.File(name: "find", mode: 0o600, query: { (bytes) throws(Errno) in try vault.find(bytes) }),
        ], ownership: ownership, nodes: nodes)
        vault.catchLockSignal()
        let root = RootTree(subtrees: [
            accounts,
            settings,
            cache,
            control,
        ], ownership: ownership, statistics: { Self.statistics(of: dataDirectory.path) })
        // Always nosuid and nodev, whatever -o says (the last option wins): cache/ stores
        // device nodes and set-id bits as data, never as devices or privileges.
        // `secret_service[=replace]` is mtmfs's own, not FUSE's.
        let serviceOption = options.last { $0 == "secret_service" || $0.hasPrefix("secret_service=") }
        var lockEvents: LoginSessionWatch.Events = []
        if options.contains("lock_on_sleep") { lockEvents.insert(.sleep) }
        if options.contains("lock_with_screen") { lockEvents.insert(.screenLock) }
        let ownOptions: Set<String> = ["lock_on_sleep", "lock_with_screen"]
        let fuseOptions = ["fsname=" + Self.escapeOption(dataDirectory.path), "subtype=mtmfs", "default_permissions"]
            + options.filter { !$0.hasPrefix("secret_service") && !ownOptions.contains($0) } + ["nosuid", "nodev"]
        do throws(MountError) {
            self.fuse = try FuseMount(fileSystem: root, mountPoint: mountPoint, options: fuseOptions)
        } catch {
            // Never served: the stores close cleanly (the cache's mark says so, and the next
            // mount runs no check for an unclean shutdown that never was).
            root.shutDown()
            throw error
        }
        notifier.attach(fuse)
        // On the session bus once mounted (this is the daemon's own process); a name that
        // another program holds is said in one line, and the files are served without it.
        if let serviceOption {
            do {
                secretService = try SecretServiceBus.start(store: VaultSecretStore(service: vault), replace: serviceOption == "secret_service=replace")
            } catch {
                Log.warning(error.description)
                progress(error.description)
                secretService = nil
            }
        } else {
            secretService = nil
        }
        // Locked as `mtmfs lock` locks, on the watch's thread; no system bus or no logind is
        // said in one line, and the mount goes on.
        if !lockEvents.isEmpty {
            do {
                sessionWatch = try LoginSessionWatch.start(lockEvents) { reason in vault.lock(reason: reason) }
                statusLines.sessionLocks.withLock { events in
                    events = (lockEvents.contains(.sleep) ? ["sleep"] : []) + (lockEvents.contains(.screenLock) ? ["screen"] : [])
                }
            } catch {
                Log.warning(error.description + ": the accounts do not lock with the session")
                progress(error.description + ": the accounts do not lock with the session")
                sessionWatch = nil
            }
        } else {
            sessionWatch = nil
        }
    }

    /// Serves until the mount ends; `onReady` is called once the mount answers.
    public func run(onReady: @escaping @Sendable () -> Void) -> Int32 {
        Log.info("mounted \(dataDirectory.path) on \(mountPoint)")
        // The notifier held the mount: both let go, and its sends done before the session's
        // descriptor closes.
        let status = fuse.run(onReady: onReady, beforeUnmount: { notifier.attach(nil) })
        secretService?.stop()
        sessionWatch?.stop()
        Log.info("unmounted \(mountPoint)")
        return status
    }

    /// Ends the mount as SIGTERM would.
    public func stop() { fuse.exit() }

    /// A passphrase written alone (one newline may end it): straight from libfuse's buffer
    /// into secure memory, the buffer zeroed.
    static func withPassphrase(_ bytes: UnsafeRawBufferPointer, _ body: (SecureBytes) throws(Errno) -> Void) throws(Errno) {
        defer { if let base = bytes.baseAddress { SecureBytes.zero(UnsafeMutableRawPointer(mutating: base), bytes.count) } }
        let length = OneNewline.valueEnd(bytes)
        guard length > 0 else { throw .invalidArgument }
        let passphrase = try SecureBytes(copying: UnsafeRawBufferPointer(rebasing: bytes[0..<length]))
        defer { passphrase.wipe() }
        try body(passphrase)
    }

    /// A command written with its passphrase: "WORD\tWORD…\nPASSPHRASE[\n]". The passphrase
    /// goes straight from libfuse's buffer into secure memory, and the buffer is zeroed.
    static func withCommand(_ bytes: UnsafeRawBufferPointer,
                            _ body: ([String], SecureBytes) throws(Errno) -> Void) throws(Errno) {
        defer { if let base = bytes.baseAddress { SecureBytes.zero(UnsafeMutableRawPointer(mutating: base), bytes.count) } }
        guard let newline = bytes.firstIndex(of: 0x0A) else { throw .invalidArgument }
        let words = String(decoding: UnsafeRawBufferPointer(rebasing: bytes[0..<newline]), as: UTF8.self)
            .split(separator: "\t").map(String.init)
        let rest = UnsafeRawBufferPointer(rebasing: bytes[(newline + 1)...])
        let length = OneNewline.valueEnd(rest)
        guard length > 0 else { throw .invalidArgument }
        let passphrase = try SecureBytes(copying: UnsafeRawBufferPointer(rebasing: rest[0..<length]))
        defer { passphrase.wipe() }
        try body(words, passphrase)
    }

    /// Two secrets written as two lines (one newline may end the second), copied into secure
    /// memory; libfuse's buffer is zeroed whatever happens.
    static func withTwoSecrets(_ bytes: UnsafeRawBufferPointer,
                               _ body: (SecureBytes, SecureBytes) throws(Errno) -> Void) throws(Errno) {
        defer { if let base = bytes.baseAddress { SecureBytes.zero(UnsafeMutableRawPointer(mutating: base), bytes.count) } }
        guard let newline = bytes.firstIndex(of: 0x0A), newline > 0 else { throw .invalidArgument }
        let rest = UnsafeRawBufferPointer(rebasing: bytes[(newline + 1)...])
        let length = OneNewline.valueEnd(rest)
        guard length > 0 else { throw .invalidArgument }
        let first = try SecureBytes(copying: UnsafeRawBufferPointer(rebasing: bytes[0..<newline]))
        defer { first.wipe() }
        let second = try SecureBytes(copying: UnsafeRawBufferPointer(rebasing: rest[0..<length]))
        defer { second.wipe() }
        try body(first, second)
    }

    /// How guarded opens ask: the pinentry found in the system's directories (a problem is
    /// logged, and then every prompt is refused, saying why).
    static func prompts(_ pinentry: String, mountPoint: String) -> PromptSettings {
        let (path, problem) = PromptSettings.resolvePinentry(pinentry, user: getuid())
        if let problem { Log.warning(problem + ": guarded accounts cannot ask, only trusted programs read passwords") }
        return PromptSettings(program: path ?? "", problem: problem,
                              environment: PromptSettings.pinentryEnvironment(from: environment()), mountPoint: mountPoint)
    }

    /// The daemon's environment, as "NAME=value" strings.
    static func environment() -> [String] {
        var out: [String] = []
        var pointer = environ
        while let entry = pointer.pointee {
            out.append(String(cString: entry))
            pointer += 1
        }
        return out
    }

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
        guard (try? Syscall.valueOrErrno { statvfs(path, &raw) }) != nil else { return stats }  // (EINTR: again)
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
    let vault: VaultService
    let settings: SettingsTree
    let cache: CacheTree
    /// What of the login session locks the accounts (`sleep`, `screen`), as listened for.
    let sessionLocks = Locked<[String]>([])

    func render() -> String {
        let events = sessionLocks.withLock { $0 }
        let lines = vault.statusLines() + settings.statusLines() + cache.statusLines() + (events.isEmpty ? [] : [
            "lock_with=\(events.joined(separator: ","))",
        ]) + [
            "version=\(MtmfsVersion.string)",
            "data_dir=\(dataDirectory.path)",
            "log=\(Log.filePath ?? "syslog")",
            // Locked memory for secrets, of its budget (ENOMEM to writes past it).
            "secure_memory=\(SecureMemory.held.bytes)/\(SecureMemory.byteBudget)",
            "mount_point=\(mountPoint)",
            "pid=\(getpid())",
        ]
        return lines.joined(separator: "\n") + "\n"
    }
}
