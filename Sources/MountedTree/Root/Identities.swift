import FuseLowLevel

/// A subtree's own number for one of its inodes: the low 56 bits of a global inode number
/// (the top byte is the subtree's tag, see `InodeSpace`).
///
/// Layout of the local numbers of `accounts/` and `settings/`, written down once:
///
///     1                    the subtree's top directory
///     2                    accounts/active (the symbolic link)
///     3 ..< 2^47           a directory the tree made (an account, a dictionary, an array):
///                          `Directory(serial)` is 3 + serial
///     2^47 ..< 2^48        accounts/ only: the views (`ViewNode`): by-server and by-label
///                          (2^47, 2^47 + 1), a server's directory (2^47 + 2^40 + serial),
///                          an account's link in by-label (2^47 + 2^44 + account serial)
///                          and in by-server (2^47 + 2^45 + account serial); an
///                          account's `trusted` file (2^47 + 2^46 + account serial)
///     2^48 ..< 2^56        a file of the editing engine (key, field or editor's file):
///                          2^48 + serial
///
/// Serials are never reused while a mount runs, so an inode number the kernel still holds
/// never names a newer node. Thread-safety: a value.
struct LocalInode: Hashable, Sendable, CustomStringConvertible {
    let raw: UInt64

    init(_ raw: UInt64) { self.raw = raw }

    static let top = LocalInode(1)
    static let activeLink = LocalInode(2)

    private static let firstDirectory: UInt64 = 3
    static let viewBit: UInt64 = 1 << 47
    private static let fileBit: UInt64 = 1 << 48

    /// The inode of the tree's `serial`-th directory.
    static func directory(_ serial: UInt64) -> LocalInode {
        precondition(serial < viewBit - firstDirectory)
        return LocalInode(firstDirectory + serial)
    }

    /// The inode of the engine's `serial`-th file.
    static func file(_ serial: UInt64) -> LocalInode {
        precondition(serial < (1 << 56) - fileBit)
        return LocalInode(fileBit + serial)
    }

    /// The directory serial, or nil for any other inode.
    var directorySerial: UInt64? {
        raw >= Self.firstDirectory && raw < Self.viewBit ? raw - Self.firstDirectory : nil
    }

    /// Whether this is a file of the editing engine.
    var isFile: Bool { raw >= Self.fileBit }

    var description: String { "#\(raw)" }
}

extension InodeSpace {
    func inode(_ local: LocalInode) -> InodeNumber { inode(local.raw) }
    func local(of inode: InodeNumber) -> LocalInode { LocalInode(local(inode)) }
}

/// An account of `accounts/` while the mount runs: a small number given at first sight of
/// its UUID (the vault's identity), and the serial of its directory's inode.
/// Thread-safety: a value.
struct AccountID: Hashable, Sendable {
    let serial: UInt64
    var directory: LocalInode { .directory(serial) }

    init(serial: UInt64) { self.serial = serial }

    init?(directory: LocalInode) {
        guard let serial = directory.directorySerial else { return nil }
        self.serial = serial
    }
}

/// A file handle given at open: the vault's lock generation in the top 24 bits (a handle
/// opened before a lock is refused after it), a serial in the low 40.
/// Thread-safety: a value.
struct FileHandle: Hashable, Sendable {
    let raw: UInt64

    init(raw: UInt64) { self.raw = raw }

    /// Generations count modulo 2^24 (`nextGeneration`).
    init(generation: UInt64, serial: UInt64) {
        raw = (generation & Self.generationMask) << 40 | (serial & ((1 << 40) - 1))
    }

    static let generationMask: UInt64 = (1 << 24) - 1

    static func nextGeneration(after generation: UInt64) -> UInt64 { (generation + 1) & generationMask }

    var generation: UInt64 { raw >> 40 }
}

/// Where a tree's file handles come from: serials counted up, each under the current
/// generation; a new generation (a lock, guarding turned on) retires every handle made
/// before it. The one allocator of every tree that hands out handles: `accounts/` (whose
/// lock starts generations), `settings/` and `.mtmfs/` (one generation for the mount's
/// life, `OpenFiles`). `cache/` keeps no state per open: its handle is only the open's
/// O_APPEND bit.
///
/// Thread-safety: a value behind its tree's lock.
struct HandleAllocator {
    private(set) var generation: UInt64 = 1
    private var serial: UInt64 = 0

    mutating func next() -> FileHandle {
        serial += 1
        return FileHandle(generation: generation, serial: serial)
    }

    /// Made under the current generation.
    func isCurrent(_ handle: FileHandle) -> Bool { handle.generation == generation }

    /// Every handle made so far stops counting.
    mutating func retireAll() { generation = FileHandle.nextGeneration(after: generation) }
}

/// Handles with what each one holds, for files whose reads answer from what the open
/// made (a control file's text, an account's trusted list or conflicts): allocated by a
/// `HandleAllocator`, so a handle of a retired generation finds nothing.
///
/// Thread-safety: a value behind its owner's lock.
struct OpenFiles<Payload> {
    private var allocator = HandleAllocator()
    private var payloads: [FileHandle: Payload] = [:]

    /// A new handle holding `payload`.
    mutating func open(_ payload: Payload) -> FileHandle {
        let handle = allocator.next()
        payloads[handle] = payload
        return handle
    }

    /// A handle made elsewhere (by the tree's own allocator) now holds `payload`.
    mutating func attach(_ payload: Payload, to handle: FileHandle) { payloads[handle] = payload }

    /// What an open handle holds (nil: never opened here, released, or retired).
    subscript(handle: FileHandle) -> Payload? { payloads[handle] }

    /// An open handle holds `payload` from now on; false when the handle is not open.
    mutating func replace(_ handle: FileHandle, with payload: Payload) -> Bool {
        guard payloads[handle] != nil else { return false }
        payloads[handle] = payload
        return true
    }

    /// The handle is let go: what it held, for the caller to wipe.
    mutating func release(_ handle: FileHandle) -> Payload? { payloads.removeValue(forKey: handle) }

    /// Every handle is let go and its generation retired: what they held.
    mutating func releaseAll() -> [Payload] {
        allocator.retireAll()
        defer { payloads.removeAll() }
        return Array(payloads.values)
    }
}
