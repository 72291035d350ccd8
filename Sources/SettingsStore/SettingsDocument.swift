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
/// The file is written only for a change: a save whose root equals the one on disk writes
/// nothing, so an untouched plist stays byte-identical. A changed one keeps its format, its
/// key order and each integer's width where the value still fits it
/// (`PlistValue.keepingIntegerWidths`).
///
/// Saves are atomic and durable (`AtomicFile`), in the format found, and made in two
/// halves so that no disk sync happens under the owner's lock: `prepare` (under it) takes
/// the new root and encodes it; `write` (outside it, from any thread) writes and syncs;
/// `finish` (under it again) learns what is on disk now.
///
/// Thread-safety: none of its own for the root, the format and the stamp (hence
/// `@unchecked`): the owner serializes `prepare`, `finish`, `reloadIfChanged` and reads
/// behind its lock. `write` runs outside it: it touches only the save and `writer`, its
/// own lock, which orders concurrent writes (never taken before the owner's).
public final class SettingsDocument: @unchecked Sendable {
    public let path: String
    public private(set) var root: PlistDictionary
    public private(set) var format: PlistFormat
    private var stamp: Stamp
    /// Saves prepared and not finished, and whether one failed (what is in memory may then
    /// not be on disk: the file is read again once none is in flight).
    private var inFlight = 0
    private var failed = false
    private var sequence: UInt64 = 0

    /// The newest save written (by sequence) and the file it made.
    ///
    /// Thread-safety: used only under `SettingsDocument.writer`'s lock.
    private struct Written {
        var sequence: UInt64 = 0
        var stamp: Stamp?
    }
    private let writer = Locked(Written())

    /// One save: the bytes of a root, numbered in the order they were prepared.
    ///
    /// Thread-safety: made under the owner's lock; `error` is set by `write` and read by
    /// `finish`, which the caller orders (write, then finish).
    public final class Save: @unchecked Sendable {
        let sequence: UInt64
        /// nil: nothing changed, nothing to write.
        let bytes: [UInt8]?
        let mode: mode_t
        public fileprivate(set) var error: SettingsError?
        unowned let document: SettingsDocument

        init(sequence: UInt64, bytes: [UInt8]?, mode: mode_t, document: SettingsDocument) {
            (self.sequence, self.bytes, self.mode, self.document) = (sequence, bytes, mode, document)
        }

        /// Writes and syncs it, outside the owner's lock (see `SettingsDocument.write`).
        public func write() { document.write(self) }

        /// Under the owner's lock, after `write` (see `SettingsDocument.finish`).
        public func finish() { document.finish(self) }
    }

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
            throw .damaged(path: path, reason: "the root is of type \(decoded.0.type.rawValue), not dict")
        }
        return (root, decoded.1, Stamp(st))
    }

    /// Re-reads the file if another program replaced or rewrote it, or if a save of ours
    /// failed; true if it did. Not while a save of ours is in flight: its rename would look
    /// like another program's change, and what it writes is already in memory.
    @discardableResult
    public func reloadIfChanged() throws(SettingsError) -> Bool {
        guard inFlight == 0 else { return false }
        let current: stat
        do {
            current = try Syscall.stat(path)
        } catch {
            throw .io(path: path, error)
        }
        guard Stamp(current) != stamp || failed else { return false }
        failed = false
        let (root, format, stamp) = try Self.load(path)
        self.root = root
        self.format = format
        self.stamp = stamp
        return true
    }

    /// Writes `newRoot` atomically and durably, in the file's format, all at once (for a
    /// document no one else uses: the demo's).
    public func save(_ newRoot: PlistDictionary) throws(SettingsError) {
        let save = prepare(newRoot)
        save.write()
        finish(save)
        if let error = save.error { throw error }
    }

    /// Under the owner's lock: `newRoot` is the document's root from now on, and the
    /// returned save (to `write` outside the lock, then `finish`) puts it on disk. Its
    /// integers take the widths the file gave them where they still fit. When it equals
    /// what is on disk (no save in flight or failed since the file was read) the save
    /// writes nothing: the file stays byte for byte as it was.
    public func prepare(_ newRoot: PlistDictionary) -> Save {
        let unchanged = newRoot == root && inFlight == 0 && !failed
        if case .dictionary(let widened) = PlistValue.dictionary(newRoot).keepingIntegerWidths(of: .dictionary(root)) {
            root = widened
        } else {
            root = newRoot  // (a dictionary stays one: not reached)
        }
        sequence += 1
        inFlight += 1
        return Save(sequence: sequence, bytes: unchanged ? nil : PropertyList.encode(.dictionary(root), as: format),
                    mode: Self.currentMode(path) ?? 0o600, document: self)
    }

    /// Outside the owner's lock: writes and syncs `save`, unless a later one is on disk
    /// already (it holds this one's change too: roots are prepared in order, each from the
    /// one before). Concurrent writes go one at a time.
    func write(_ save: Save) {
        writer.withLock { written in
            guard let bytes = save.bytes, save.sequence > written.sequence else { return }
            do throws(Errno) {
                try AtomicFile.replace(path, with: bytes, mode: save.mode)
                written = Written(sequence: save.sequence, stamp: Stamp(try Syscall.stat(path)))
                Log.debug("Settings.plist saved (\(bytes.count) bytes)")
            } catch {
                save.error = .io(path: path, error)
                Log.error(SettingsError.io(path: path, error).description + "; the file is read again")
            }
        }
    }

    /// Under the owner's lock, after `write`: the file ours now is the newest written; a
    /// failed save makes the next `reloadIfChanged` read the file again.
    public func finish(_ save: Save) {
        inFlight -= 1
        if save.error != nil { failed = true }
        // A save that wrote nothing learns nothing: the stamp may be newer than any write of ours.
        if save.bytes != nil, let written = writer.withLock({ $0.stamp }) { stamp = written }
    }

    static func currentMode(_ path: String) -> mode_t? {
        (try? Syscall.stat(path)).map { $0.st_mode & 0o7777 }
    }
}
