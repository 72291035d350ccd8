#if canImport(Glibc)
import Glibc
#endif
import SecureMemory
import Posix

/// One item as the bus shows it: an account (SPEC §2c).
///
/// Thread-safety: a value.
public struct SecretItem: Sendable, Equatable {
    /// The account's UUID (16 bytes).
    public var uuid: [UInt8]
    public var label: String
    /// The mapped fields under libsecret's names (`server`, `user`, `protocol`, `port`,
    /// `object`) and every other attribute a program gave.
    public var attributes: [String: String]
    /// Seconds since 1970.
    public var created: UInt64
    public var modified: UInt64

    public init(uuid: [UInt8], label: String, attributes: [String: String], created: UInt64, modified: UInt64) {
        (self.uuid, self.label, self.attributes, self.created, self.modified) = (uuid, label, attributes, created, modified)
    }
}

/// The process behind a bus connection, pinned by a pidfd from the connection's first
/// call, so that a decision about `pid` is about that process and no later one of the
/// same number.
///
/// Thread-safety: a value (the pin is shared and closed with its last reference).
public struct BusCaller: Sendable, Hashable {
    /// The connection's unique name (`:1.42`).
    public let connection: String
    /// 0 when the bus did not say, or the process behind the connection is gone.
    public let pid: pid_t
    let pin: ProcessPin?

    public init(connection: String, pid: pid_t) {
        self.init(connection: connection, pid: pid, pin: pid > 0 ? ProcessPin(pid) : nil)
    }

    init(connection: String, pid: pid_t, pin: ProcessPin?) {
        (self.connection, self.pin) = (connection, pin)
        self.pid = pin == nil ? 0 : pid
    }

    /// Whether the process the pid named when it was pinned has exited since (its pid
    /// may now name another): asked after a decision, before the answer goes out.
    public var isGone: Bool { pin.map { !$0.isRunning } ?? true }

    public static func == (a: BusCaller, b: BusCaller) -> Bool { a.connection == b.connection && a.pid == b.pid }
    public func hash(into hasher: inout Hasher) {
        hasher.combine(connection)
        hasher.combine(pid)
    }
}

/// A pidfd held while a connection lives.
///
/// Thread-safety: immutable; the descriptor is closed when the last reference goes.
final class ProcessPin: Sendable {
    private let fd: Int32

    init?(_ pid: pid_t) {
        guard let fd = try? ProcessInspection.pin(pid) else { return nil }
        self.fd = fd
    }

    deinit { Syscall.close(fd) }

    var isRunning: Bool { ProcessInspection.isRunning(pinned: fd) }
}

/// Why the store did not do what the bus asked.
///
/// Thread-safety: a value.
public enum SecretStoreError: Error, Sendable, Equatable {
    /// The vault is locked.
    case locked
    /// No such account (any more).
    case noSuchItem
    /// Guarding refused the caller (why, for the error message).
    case denied(String)
    case invalid(String)
    case failed(String)
    /// No secure memory for the secret (its budget is spent): the call fails, nothing else.
    case noMemory
}

/// What changed in the store, for the bus's signals.
///
/// Thread-safety: a value.
public enum SecretStoreChange: Sendable {
    /// These accounts were made, changed or removed (the service compares with what it knew).
    case items([[UInt8]])
    /// Locked or unlocked.
    case lockState
}

/// How an unlock prompt ended (the prompt's `Completed` signal).
///
/// Thread-safety: a value.
public enum UnlockOutcome: Sendable, Equatable {
    /// The vault is unlocked (`vault`: by this prompt), and these of the asked items the
    /// caller may read now.
    case unlocked(vault: Bool, items: [[UInt8]])
    /// Cancelled, denied, or the caller went away.
    case dismissed
}

/// The accounts as the Secret Service uses them. Every call may come from the bus's thread
/// while requests of the mount run: the store locks what it needs.
public protocol SecretStore: AnyObject, Sendable {
    var isLocked: Bool { get }
    /// Whether a search can find items now: unlocked, or locked with the index an earlier
    /// lock kept. (Not before the first unlock of a mount: the attributes are sealed.)
    var canSearch: Bool { get }
    /// Every item (the collection's `Items`), in the vault's order. Empty while locked.
    func allItems() -> [[UInt8]]
    func item(_ uuid: [UInt8]) -> SecretItem?
    /// The accounts whose attributes include every one of `attributes` (through the index,
    /// not a scan of the vault).
    func search(_ attributes: [String: String]) -> [[UInt8]]
    /// Whether `caller` may have the secret now (with guarding off, while unlocked: yes).
    func mayRead(_ uuid: [UInt8], caller: BusCaller) -> Bool
    /// The secret (`password`) and its content type, if `caller` may have it: decided (and
    /// recorded) once, and read with that decision still true.
    func secret(_ uuid: [UInt8], caller: BusCaller) throws(SecretStoreError) -> (value: SecureBytes, contentType: String)
    /// A new item, or (`replace`) the one whose attributes are exactly these, changed in place.
    func createItem(label: String, attributes: [String: String], secret: SecureBytes, contentType: String,
                    replace: Bool, caller: BusCaller) throws(SecretStoreError) -> [UInt8]
    func setSecret(_ uuid: [UInt8], _ secret: SecureBytes, contentType: String, caller: BusCaller) throws(SecretStoreError)
    func setLabel(_ uuid: [UInt8], _ label: String, caller: BusCaller) throws(SecretStoreError)
    func setAttributes(_ uuid: [UInt8], _ attributes: [String: String], caller: BusCaller) throws(SecretStoreError)
    func delete(_ uuid: [UInt8], caller: BusCaller) throws(SecretStoreError)
    /// Whether who may read an item depends on the caller (guarding is on): then its
    /// `Locked` is not told to every client at an unlock.
    var guardsItems: Bool { get }
    /// The collection's label (`Login` until one is set).
    var collectionLabel: String { get }
    /// Sets the collection's label (kept with the items: the vault's travels with it).
    func setCollectionLabel(_ label: String, caller: BusCaller) throws(SecretStoreError)
    /// Locks as `mtmfs lock` does.
    func lock()
    /// Asks a person, for `caller`: the vault's passphrase when it is locked, then (with
    /// guarding) whether `caller` may have those of `items` it may not read now. `done` is
    /// called once, on any thread; the closure returned dismisses the prompt (the client
    /// asked to, or left the bus).
    func unlock(items: [[UInt8]], caller: BusCaller, done: @escaping @Sendable (UnlockOutcome) -> Void) -> @Sendable () -> Void
    /// A client left the bus: what it was allowed once goes with it.
    func connectionClosed(_ connection: String)
    /// `handler` is called (on any thread, never under the store's lock) after each change.
    func observe(_ handler: @escaping @Sendable (SecretStoreChange) -> Void)
}
