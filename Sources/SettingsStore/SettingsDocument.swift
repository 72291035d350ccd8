#if canImport(Glibc)
import Glibc
#endif
import Posix

/// Why the settings store cannot be used.
///
/// Thread-safety: a value; `Sendable`.
public enum SettingsError: Error, CustomStringConvertible, Sendable {
    /// The file is not a property list whose root is a dictionary (it is never overwritten).
    case damaged(path: String, reason: String)
    case io(path: String, Errno)

    public var description: String {
        switch self {
        case .damaged(let path, let reason): "settings damaged: \(path): \(reason)"
        case .io(let path, let error): "settings unreadable: \(path): \(error)"
        }
    }

    public var errno: Errno {
        switch self {
        case .damaged: .ioError
        case .io(_, let error): error == .noSpace ? .noSpace : .ioError
        }
    }
}

/// `Settings.plist` on disk: its root dictionary in key order, the format it was found in,
/// and the identity of the version read (to notice another program's change).
///
/// Saves are atomic and durable (`AtomicFile`), in the format found.
///
/// Thread-safety: none of its own (hence `@unchecked`): the owner serializes every access
/// behind its lock.
public final class SettingsDocument: @unchecked Sendable {
    public let path: String
    public private(set) var root: PlistDictionary
    public private(set) var format: PlistFormat
    private var stamp: Stamp

    /// What identifies one version of the file: replaced or rewritten files differ in it.
    ///
    /// Thread-safety: a value, kept by the document under its owner's lock.
    struct Stamp: Equatable {
        var device: UInt64, inode: UInt64, size: Int64, modifiedSeconds: Int, modifiedNanoseconds: Int
        var changedSeconds: Int, changedNanoseconds: Int

        init(_ st: stat) {
            device = UInt64(st.st_dev)
            inode = UInt64(st.st_ino)
            size = Int64(st.st_size)
            modifiedSeconds = st.st_mtim.tv_sec
            modifiedNanoseconds = st.st_mtim.tv_nsec
            changedSeconds = st.st_ctim.tv_sec
            changedNanoseconds = st.st_ctim.tv_nsec
        }
    }

    public init(path: String) throws(SettingsError) {
        self.path = path
        let (root, format, stamp) = try Self.load(path)
        self.root = root
        self.format = format
        self.stamp = stamp
    }

    static func load(_ path: String) throws(SettingsError) -> (PlistDictionary, PlistFormat, Stamp) {
        let bytes: [UInt8]
        let st: stat
        do {
            let fd = try Syscall.open(path, O_RDONLY)
            defer { Syscall.close(fd) }
            var raw = stat()
            _ = try Syscall.valueOrErrno { fstat(fd, &raw) }
            st = raw
            guard st.st_size <= 64 << 20 else { throw SettingsError.damaged(path: path, reason: "larger than 64 MiB") }
            bytes = try Syscall.readAll(fd)
        } catch let error as SettingsError {
            throw error
        } catch let error as Errno {
            throw .io(path: path, error)
        } catch {
            throw .io(path: path, .ioError)
        }
        let decoded: (PlistValue, PlistFormat)
        do {
            decoded = try PropertyList.decode(bytes)
        } catch {
            throw .damaged(path: path, reason: error.description)
        }
        guard case .dictionary(let root) = decoded.0 else {
            throw .damaged(path: path, reason: "the root is a \(decoded.0.type.rawValue), not a dict")
        }
        return (root, decoded.1, Stamp(st))
    }

    /// Re-reads the file if another program replaced or rewrote it; true if it did.
    @discardableResult
    public func reloadIfChanged() throws(SettingsError) -> Bool {
        let current: stat
        do {
            current = try Syscall.stat(path)
        } catch {
            throw .io(path: path, error)
        }
        guard Stamp(current) != stamp else { return false }
        let (root, format, stamp) = try Self.load(path)
        self.root = root
        self.format = format
        self.stamp = stamp
        return true
    }

    /// Writes `newRoot` atomically and durably, in the file's format.
    public func save(_ newRoot: PlistDictionary) throws(SettingsError) {
        let bytes = PropertyList.encode(.dictionary(newRoot), as: format)
        do {
            try AtomicFile.replace(path, with: bytes, mode: Self.currentMode(path) ?? 0o600)
            stamp = Stamp(try Syscall.stat(path))
        } catch {
            throw .io(path: path, error)
        }
        root = newRoot
    }

    static func currentMode(_ path: String) -> mode_t? {
        (try? Syscall.stat(path)).map { $0.st_mode & 0o7777 }
    }
}
