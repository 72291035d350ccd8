#if canImport(Glibc)
import Glibc
#endif
import CFuse
import Foundation
import Posix
import Synchronization

/// Why a mount could not be made.
public struct MountError: Error, CustomStringConvertible, Sendable {
    public var description: String
    public init(_ description: String) { self.description = description }
}

/// Kernel-side switches chosen at mount time (sent in FUSE's INIT reply).
public struct KernelOptions: Sendable {
    /// Let the kernel buffer writes and send them in large batches.
    public var writebackCache = false
    /// Always use READDIRPLUS (names and attributes in one round trip).
    public var readDirectoryPlus = true
    /// Keep file pages until the file system invalidates them (FUSE_CAP_EXPLICIT_INVAL_DATA)
    /// instead of dropping them whenever a file's mtime or size looks different. Safe when
    /// every subtree invalidates its own changes or does not use the page cache.
    public var explicitDataInvalidation = true
    /// Maximum worker threads of the loop.
    public var maximumThreads: UInt32 = 8

    public init() {}
}

/// One mounted FUSE file system: the libfuse session, its mount point and its loop.
///
/// Create it (which mounts), then call `run`, which blocks in libfuse's multithreaded loop
/// until the file system is unmounted or a termination signal arrives, and then unmounts.
/// `invalidate…` may be called from any thread while the loop runs.
public final class FuseMount: @unchecked Sendable {
    // @unchecked: `session` is set once in init and only read afterwards; libfuse's
    // notify and exit calls are thread-safe.
    private let session: OpaquePointer
    private let bridge: FuseBridge
    private let bridgeReference: Unmanaged<FuseBridge>
    public let mountPoint: String

    /// Mounts `fileSystem` on `mountPoint`. `options` are FUSE `-o` options
    /// (e.g. `["fsname=...", "subtype=mtmfs", "default_permissions"]`).
    public init(fileSystem: any FileSystem, mountPoint: String, options: [String],
                kernel: KernelOptions = KernelOptions()) throws(MountError) {
        self.mountPoint = mountPoint
        let bridge = FuseBridge(fileSystem: fileSystem, kernel: kernel)
        let reference = Unmanaged.passRetained(bridge)

        var arguments = ["mtmfs"]
        for option in options where !option.isEmpty { arguments += ["-o", option] }
        var cArguments: [UnsafeMutablePointer<CChar>?] = arguments.map { strdup($0) }
        defer { cArguments.forEach { free($0) } }
        var operations = FuseBridge.operations()
        let created: OpaquePointer? = cArguments.withUnsafeMutableBufferPointer { argv in
            var args = fuse_args(argc: Int32(arguments.count), argv: argv.baseAddress, allocated: 0)
            defer { fuse_opt_free_args(&args) }
            return fuse_session_new(&args, &operations, MemoryLayout<fuse_lowlevel_ops>.size,
                                    reference.toOpaque())
        }
        guard let created else {
            reference.release()
            throw MountError("FUSE rejected the options \(options.joined(separator: ","))")
        }
        guard fuse_session_mount(created, mountPoint) == 0 else {
            fuse_session_destroy(created)
            reference.release()
            throw MountError("cannot mount on \(mountPoint): is /dev/fuse usable and fusermount3 installed?")
        }
        self.session = created
        self.bridge = bridge
        self.bridgeReference = reference
    }

    deinit {
        fuse_session_destroy(session)
        bridgeReference.release()
    }

    /// Serves requests until unmount or signal, then unmounts; `onReady` runs on another
    /// thread once the mount point answers a `stat`. Returns 0 on a clean end.
    public func run(onReady: @escaping @Sendable () -> Void = {}) -> Int32 {
        TerminationSignals.install(session: session)
        defer { TerminationSignals.uninstall() }
        let mountPoint = self.mountPoint
        TerminationSignals.withBlocked {
            Thread.detachNewThread {
                // A stat through the kernel proves the loop answers requests.
                var st = Glibc.stat()
                while fstatat(AT_FDCWD, mountPoint, &st, 0) != 0 && errno == EINTR {}
                onReady()
            }
        }
        guard let config = fuse_loop_cfg_create() else { return 1 }
        defer { fuse_loop_cfg_destroy(config) }
        fuse_loop_cfg_set_max_threads(config, bridge.kernel.maximumThreads)
        fuse_loop_cfg_set_clone_fd(config, 0)
        let result = fuse_session_loop_mt(session, config)
        fuse_session_unmount(session)
        // Flush and lock every store here, on the way out, whatever else holds this mount.
        bridge.fileSystem.shutDown()
        return result
    }

    /// Ends the loop as a termination signal would.
    public func exit() { fuse_session_exit(session) }

    /// Drops the kernel's cached attributes and data of `inode` (from `offset`, `length`
    /// bytes; 0 means to the end). Returns false where the kernel does not know the inode.
    @discardableResult
    public func invalidateInode(_ inode: InodeNumber, offset: Int64 = 0, length: Int64 = 0) -> Bool {
        fuse_lowlevel_notify_inval_inode(session, inode, off_t(offset), off_t(length)) == 0
    }

    /// Drops the kernel's cached name `name` in directory `parent`.
    @discardableResult
    public func invalidateEntry(parent: InodeNumber, name: String) -> Bool {
        // libfuse sends the name with its terminating NUL (namelen + 1 bytes): a C string it
        // must be (found by AddressSanitizer: a bare UTF-8 array was read one byte past its end).
        name.withCString { fuse_lowlevel_notify_inval_entry(session, parent, $0, name.utf8.count) == 0 }
    }
}

/// SIGINT, SIGTERM and SIGHUP end the loop. libfuse's own handlers are not used: they skip
/// a signal inherited as ignored, which is what a daemon started with `&` from a script has.
enum TerminationSignals {
    nonisolated(unsafe) static var session: OpaquePointer?
    nonisolated(unsafe) static var loopThread = pthread_self()
    static let signals: [Int32] = [SIGINT, SIGTERM, SIGHUP]

    static func install(session: OpaquePointer) {
        Self.session = session
        Self.loopThread = pthread_self()
        var action = sigaction()
        action.__sigaction_handler.sa_handler = { signal in
            if let session = TerminationSignals.session { fuse_session_exit(session) }
            // libfuse's loop waits in sem_wait on the loop thread; a signal caught on another
            // thread is passed on so that the wait is interrupted.
            if pthread_equal(pthread_self(), TerminationSignals.loopThread) == 0 {
                pthread_kill(TerminationSignals.loopThread, signal)
            }
        }
        sigemptyset(&action.sa_mask)
        action.sa_flags = 0
        for signal in signals { sigaction(signal, &action, nil) }
        var unblock = sigset_t()
        sigemptyset(&unblock)
        for signal in signals { sigaddset(&unblock, signal) }
        pthread_sigmask(SIG_UNBLOCK, &unblock, nil)
        Glibc.signal(SIGPIPE, SIG_IGN)
    }

    static func uninstall() {
        for signal in signals { Glibc.signal(signal, SIG_DFL) }
        session = nil
    }

    /// Runs `body` (which starts threads) with every signal blocked, so that the threads it
    /// starts inherit a full mask and signals reach the loop thread.
    static func withBlocked(_ body: () -> Void) {
        var all = sigset_t(), previous = sigset_t()
        sigfillset(&all)
        pthread_sigmask(SIG_BLOCK, &all, &previous)
        body()
        pthread_sigmask(SIG_SETMASK, &previous, nil)
    }
}
