#if canImport(Glibc)
import Glibc
#endif
import CFuse
import Synchronization

/// FUSE_HANDLE_KILLPRIV_V2, which libfuse 3.14 cannot ask for. Without it the kernel asks
/// the daemon for `security.capability` (a GETXATTR round trip) before nearly every write,
/// to learn whether the write must drop privileges; with it, the kernel marks the inodes
/// of the mount as having none to drop (SB_NOSEC) and instead tells the file system, in the
/// request, when set-user-ID and set-group-ID bits must go: a WRITE or a truncating OPEN by
/// a caller without CAP_FSETID, a truncating SETATTR likewise, a chown always. The file
/// system then drops S_ISUID, and S_ISGID where the group may execute (`SetIDBits`) — as
/// the kernel does for ext4.
///
/// How, with libfuse 3.14: the session writes to /dev/fuse through our own `writev`
/// (`fuse_session_custom_io`), which adds the flag to the INIT reply when the kernel offered
/// it; each worker looks at a request's raw bytes before libfuse parses them and notes
/// whether it asks for the bits to go (`requested`, per thread: a request is processed on the
/// thread that read it), which the bridge applies (`FuseBridge`) — a WRITE through the
/// tree's `writeDroppingSetID`, so that `cache/` decides with the mode it has at hand
/// instead of a lookup of the file's attributes before each write of a normal user.
///
/// The kernel then also leaves `security.capability` to the file system on writes, truncates
/// and chowns: no tree stores `security.*` attributes (`cache/` keeps `user.*` only), so
/// there is never one to drop.
///
/// Gated on the linked libfuse (`fuse_version()`, not the headers built against): the INIT
/// reply is rewritten only for a libfuse 3 (whose reply is the header, then `fuse_init_out`,
/// in two iovecs, as checked below), and left as it is when libfuse set the flag itself (a
/// libfuse that negotiates it, 3.17 and later). Without it the kernel drops the bits
/// itself, at the price of the GETXATTR round trips.
///
/// Thread-safety: the INIT state is behind a mutex; the per-request flag is thread-specific.
enum SetIDKill {
    /// Whether the linked libfuse's INIT reply is one this rewrites (libfuse 3.x).
    static let linkedLibraryFits: Bool = fuse_version() / 100 == 3
    /// The INIT request that offered the flag, by its session's descriptor and its unique id
    /// (unique ids count per connection: two sessions of one process may share one), while
    /// its reply is still to be written; `initPending` spares every other reply the lock.
    static let initRequest = Mutex<(fd: Int32, unique: UInt64)?>(nil)
    static let initPending = Atomic<Bool>(false)

    private static let key: pthread_key_t = {
        var key = pthread_key_t()
        pthread_key_create(&key, nil)
        return key
    }()

    // Offsets in the kernel's request layout (linux/fuse.h): the header is 40 bytes, the
    // operation's arguments follow.
    private static let headerSize = 40
    private static let opcodeInit: UInt32 = 26, opcodeWrite: UInt32 = 16, opcodeSetattr: UInt32 = 4, opcodeOpen: UInt32 = 14
    static let killprivV2: UInt32 = 1 << 28
    private static let writeKillSUIDGID: UInt32 = 1 << 2
    private static let setattrKillSUIDGID: UInt32 = 1 << 11
    private static let openKillSUIDGID: UInt32 = 1 << 0

    /// Called by a worker with a request as read from /dev/fuse (the session's descriptor
    /// `fd`), before libfuse processes it.
    static func note(_ request: UnsafeRawPointer, length: Int, fd: Int32) {
        guard length >= headerSize else { return set(false) }
        func word(_ offset: Int) -> UInt32? {
            offset + 4 <= length ? request.loadUnaligned(fromByteOffset: offset, as: UInt32.self) : nil
        }
        let opcode = request.loadUnaligned(fromByteOffset: 4, as: UInt32.self)
        switch opcode {
        case opcodeInit:
            // fuse_init_in: major, minor, max_readahead, flags.
            if linkedLibraryFits, let flags = word(headerSize + 12), flags & killprivV2 != 0 {
                let unique = request.loadUnaligned(fromByteOffset: 8, as: UInt64.self)
                initRequest.withLock { $0 = (fd, unique) }
                initPending.store(true, ordering: .sequentiallyConsistent)
            }
            set(false)
        case opcodeWrite:
            // fuse_write_in: fh, offset, size, write_flags.
            set((word(headerSize + 20) ?? 0) & writeKillSUIDGID != 0)
        case opcodeSetattr:
            set((word(headerSize) ?? 0) & setattrKillSUIDGID != 0)
        case opcodeOpen:
            // fuse_open_in: flags, open_flags.
            set((word(headerSize + 4) ?? 0) & openKillSUIDGID != 0)
        default:
            set(false)
        }
    }

    private static func set(_ on: Bool) {
        pthread_setspecific(key, on ? UnsafeRawPointer(bitPattern: 1) : nil)
    }

    /// Whether the request being processed on this thread asks for the set-ID bits to go.
    static var requested: Bool { pthread_getspecific(key) != nil }

    /// The session's I/O: plain read and writev, but the INIT reply gains the flag.
    static func io() -> fuse_custom_io {
        var io = fuse_custom_io()
        io.read = { fd, buffer, length, _ in read(fd, buffer, length) }
        io.writev = { fd, vector, count, _ in
            if let vector, count >= 2, SetIDKill.initPending.load(ordering: .sequentiallyConsistent),
               let header = vector[0].iov_base, vector[0].iov_len >= 16,
               let argument = vector[1].iov_base, vector[1].iov_len >= 16 {
                // fuse_out_header: len, error, unique; fuse_init_out: major, minor, max_readahead, flags.
                let unique = header.loadUnaligned(fromByteOffset: 8, as: UInt64.self)
                let error = header.loadUnaligned(fromByteOffset: 4, as: Int32.self)
                let isInitReply = SetIDKill.initRequest.withLock { request -> Bool in
                    guard error == 0, let request, request.fd == fd, request.unique == unique else { return false }
                    SetIDKill.initPending.store(false, ordering: .sequentiallyConsistent)
                    return true
                }
                let flags = argument.loadUnaligned(fromByteOffset: 12, as: UInt32.self)
                if isInitReply, flags & SetIDKill.killprivV2 == 0 {
                    argument.storeBytes(of: flags | SetIDKill.killprivV2, toByteOffset: 12, as: UInt32.self)
                }
            }
            return writev(fd, vector, count)
        }
        return io
    }
}
