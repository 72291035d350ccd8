#if canImport(Glibc)
import Glibc
#endif
import CacheStore
import CredentialVault
import SecureMemory
import Posix
import SettingsStore

/// What can be wrong with a data directory, each with a message that says what to do.
///
/// Thread-safety: a value; `Sendable`.
public enum DataDirectoryError: Error, CustomStringConvertible, Sendable {
    case missing(String)
    case notADirectory(String)
    case unreadable(String, Errno)
    case notInitialized(String)
    case alreadyInitialized(String)
    case cannotCreate(String, String)
    /// Another process holds the directory's claim (`DataDirectoryClaim`): its pid and what
    /// it does, when its lock file says.
    case inUse(String, (pid: pid_t, holder: DataDirectoryClaim.Holder)?)

    public var description: String {
        switch self {
        case .missing(let path):
            return "no store at \(path): run `mtmfs init --data-dir \(path)` first"
        case .notADirectory(let path):
            return "data directory \(path) is not a directory: choose another with --data-dir"
        case .unreadable(let path, let error):
            return "data directory \(path) is unreadable (\(error)): fix its permissions (chmod 700)"
        case .notInitialized(let path):
            return "\(path) holds no mtmfs store: run `mtmfs init --data-dir \(path)` first"
        case .alreadyInitialized(let path):
            return "\(path) already holds an mtmfs store: mount it, or choose another --data-dir"
        case .cannotCreate(let path, let reason):
            return "cannot create the store in \(path): \(reason)"
        case .inUse(let path, let named):
            switch named?.holder {
            case .mount(let mountPoint) where !DataDirectoryClaim.isMountPoint(mountPoint):
                return "\(path) is still held by the mtmfs daemon (pid \(named!.pid)) of a mount on \(mountPoint) that is gone: wait for it to finish, or end it (kill \(named!.pid))"
            case .mount(let mountPoint):
                return "\(path) is in use by the mtmfs mount on \(mountPoint) (pid \(named!.pid)): unmount it first (mtmfs unmount \(mountPoint))"
            case .command(let name):
                return "\(path) is in use by `\(name)` (pid \(named!.pid)): wait for it to finish"
            case nil:
                return "\(path) is in use by another mtmfs process: unmount it first"
            }
        }
    }
}

/// The directory that holds one mtmfs store: the vault, `Settings.plist` and `cache.sqlite`.
///
/// `initialize()` creates it (mode 0700) with the shipped default settings and an empty
/// cache database; `check()` says whether a mount can use it.
///
/// Thread-safety: a value (a path); the files it names are guarded by `DataDirectoryClaim`.
public struct DataDirectory: Hashable, Sendable {
    public let path: String

    public init(path: String) {
        var trimmed = path
        while trimmed.count > 1 && trimmed.hasSuffix("/") { trimmed.removeLast() }
        self.path = trimmed
    }

    /// `$XDG_DATA_HOME/mtmfs`, else `~/.local/share/mtmfs`.
    public static func defaultPath(environment: [String: String]) -> String {
        if let data = environment["XDG_DATA_HOME"], data.hasPrefix("/") { return data + "/mtmfs" }
        let home = environment["HOME"] ?? "/"
        return (home == "/" ? "" : home) + "/.local/share/mtmfs"
    }

    public var settingsPath: String { path + "/Settings.plist" }
    public var cachePath: String { path + "/cache.sqlite" }
    public var vaultPath: String { path + "/vault" }

    /// Creates the directory and the stores, holding the directory's claim meanwhile. An
    /// existing empty directory is used (and set to 0700); one that already holds a store,
    /// or that another process holds (a mount), is refused.
    public func initialize(passphrase: SecureBytes, kdf: KDFParameters, guarded: Bool = false) throws(DataDirectoryError) {
        try initialize { (vaultPath) throws(DataDirectoryError) in
            do throws(VaultError) {
                try Vault.createFolder(at: vaultPath, passphrase: passphrase, parameters: kdf, guarded: guarded).lock()
            } catch {
                throw .cannotCreate(path, error.description)
            }
        }
    }

    /// Whether `init` can make a store here, checked before it asks for a passphrase: EEXIST
    /// for a data directory that holds one (and the mount that holds it, if any).
    public func checkInitializable() throws(DataDirectoryError) {
        guard let st = try? Syscall.stat(path) else { return }
        guard st.st_mode & S_IFMT == S_IFDIR else { throw DataDirectoryError.notADirectory(path) }
        let claim = try DataDirectoryClaim(self, holder: .command("mtmfs init"))
        defer { withExtendedLifetime(claim) {} }
        if FileExistence.exists(settingsPath) || FileExistence.exists(cachePath) || FileExistence.exists(vaultPath) {
            throw DataDirectoryError.alreadyInitialized(path)
        }
    }

    /// As `initialize(passphrase:…)`, with the vault that `makeVault` puts at the path it is
    /// given (`mtmfs init --from`: a clone of another machine's, checked with its passphrase);
    /// when it throws, nothing of the new stores is left.
    public func initialize(makingVault makeVault: (String) throws(DataDirectoryError) -> Void) throws(DataDirectoryError) {
        do {
            let st = try Syscall.stat(path)
            guard st.st_mode & S_IFMT == S_IFDIR else { throw DataDirectoryError.notADirectory(path) }
        } catch let error as DataDirectoryError {
            throw error
        } catch {
            do {
                try Self.makeDirectories(path)
            } catch {
                throw .cannotCreate(path, error.description)
            }
        }
        let claim = try DataDirectoryClaim(self, holder: .command("mtmfs init"))
        defer { withExtendedLifetime(claim) {} }
        if FileExistence.exists(settingsPath) || FileExistence.exists(cachePath) || FileExistence.exists(vaultPath) {
            throw DataDirectoryError.alreadyInitialized(path)
        }
        do {
            try Syscall.chmod(path, mode: 0o700)
        } catch {
            throw .cannotCreate(path, "\(error)")
        }
        try makeVault(vaultPath)
        do {
            try AtomicFile.replace(settingsPath, with: DefaultSettings.propertyList(), mode: 0o600)
            try CacheDatabase.createEmpty(at: cachePath)
            try AtomicFile.syncDirectory(path)
        } catch {
            try? Syscall.unlink(settingsPath)
            throw .cannotCreate(path, "\(error)")
        }
    }

    /// Succeeds when a mount can use this directory.
    public func check() throws(DataDirectoryError) {
        let st: stat
        do {
            st = try Syscall.stat(path)
        } catch {
            if error == .noSuchFileOrDirectory { throw .missing(path) }
            throw .unreadable(path, error)
        }
        guard st.st_mode & S_IFMT == S_IFDIR else { throw .notADirectory(path) }
        do {
            try Syscall.access(path, R_OK | W_OK | X_OK)
            _ = try Syscall.listDirectory(path)
        } catch {
            throw .unreadable(path, error)
        }
        // (A conversion cut between its renames: the mount finishes it, `VaultConversion.finishInterruptedConversion`.)
        let vaultThere = FileExistence.exists(vaultPath)
            || (FileExistence.exists(VaultConversion.keptFilePath(for: vaultPath)) && FileExistence.exists(VaultConversion.conversionPath(for: vaultPath)))
        guard FileExistence.exists(settingsPath), FileExistence.exists(cachePath), vaultThere else {
            throw .notInitialized(path)
        }
    }

    /// `mkdir -p`, the last component 0700, the ones it adds 0700 too; each directory it
    /// adds is made durable in its parent (a power cut never takes a data directory whose
    /// `init` returned).
    static func makeDirectories(_ path: String) throws(Errno) {
        var current = path.hasPrefix("/") ? "" : "."
        for component in path.split(separator: "/") {
            let parent = current.isEmpty ? "/" : current
            current += "/" + component
            do {
                try Syscall.mkdir(current, mode: 0o700)
            } catch where error == .fileExists {
                continue
            }
            try AtomicFile.syncDirectory(parent)
        }
    }
}

/// Whether something exists at a path (an `lstat` that succeeds).
///
/// Thread-safety: stateless.
enum FileExistence {
    static func exists(_ path: String) -> Bool { (try? Syscall.lstat(path)) != nil }
}
