#if canImport(Glibc)
import Glibc
#endif
import CFuse
import Posix
import Synchronization

/// Why a mount could not be made.
///
/// Thread-safety: a value; `Sendable`.
public struct MountError: Error, CustomStringConvertible, Sendable {
    public var description: String
    public init(_ description: String) { self.description = description }
}

/// Whether this user can mount with FUSE at all, said the way that tells what to do.
///
/// Thread-safety: stateless; `problem()` only reads the device, `PATH` and `errno`.
public enum FuseDevice {
    public static let path = "/dev/fuse"

    /// What stands in the way of a mount by the calling user (nil: nothing visible).
    /// Root opens /dev/fuse itself; others go through fusermount3, which opens it as them.
    public static func problem() -> String? {
        var st = stat()
        guard stat(path, &st) == 0 else {
            return "\(path) does not exist: load the FUSE module (`modprobe fuse` as root); in a container, pass the device in (`--device /dev/fuse`)"
        }
        if access(path, R_OK | W_OK) != 0 && errno == EACCES {
            let mode = String(st.st_mode & 0o777, radix: 8)
            return "permission denied on \(path) (mode \(mode), owner uid \(st.st_uid)): let users open it as most systems do (`chmod 0666 \(path)` as root, or a udev rule), or mount as root"
        }
        if getuid() != 0 && !onPath("fusermount3") {
            return "fusermount3 is not installed, and users mount FUSE through it: install Debian's fuse3 package (`apt-get install fuse3`)"
        }
        return nil
    }

    static func onPath(_ program: String) -> Bool {
        let directories = (getenv("PATH").map { String(cString: $0) } ?? "/usr/bin:/bin").split(separator: ":")
        return directories.contains { access("\($0)/\(program)", X_OK) == 0 }
    }
}

/// Kernel-side switches chosen at mount time (sent in FUSE's INIT reply).
///
/// Thread-safety: a value; `Sendable`.
public struct KernelOptions: Sendable {
    /// Always use READDIRPLUS (names and attributes in one round trip).
    public var readDirectoryPlus = true
    /// Keep file pages until the file system invalidates them (FUSE_CAP_EXPLICIT_INVAL_DATA)
    /// instead of dropping them whenever a file's mtime or size looks different. Safe when
    /// every subtree invalidates its own changes or does not use the page cache.
    public var explicitDataInvalidation = true
    /// Maximum worker threads of the loop.
    public var maximumThreads: UInt32 = 8
    /// Read-ahead of the mount (KiB). FUSE cannot ask for more than the kernel's default
    /// 128 KiB in INIT; the mount's backing device in sysfs can be raised after mounting,
    /// by root only (others keep 128 KiB). 1 MiB read-ahead makes the kernel send 1 MiB
    /// READs: a cold sequential read takes fewer, larger round trips.
    public var readAheadKiB = 1024

    public init() {}
}

/// One mounted FUSE file system: the libfuse session, its mount point and its loop.
///
/// Create it (which mounts), then call `run`, which serves requests on a pool of worker
/// threads until the file system is unmounted or a termination signal arrives, and then
/// unmounts.
///
/// Thread-safety: `run` is called once, from one thread; `exit` and `invalidate…` may be
/// called from any thread while the loop runs.
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
        // libfuse and fusermount3 say why a mount is refused on standard error, which is
        // /dev/null in a daemon: it is caught here and said in the error.
        let said = StandardErrorCapture()
        let mounted = fuse_session_mount(created, mountPoint) == 0
        let message = said.end()
        guard mounted else {
            fuse_session_destroy(created)
            reference.release()
            let reason = FuseDevice.problem() ?? (message.isEmpty ? "FUSE refused the mount" : message)
            throw MountError("cannot mount on \(mountPoint): " + reason)
        }
        bridge.session.store(UInt(bitPattern: created), ordering: .releasing)
        // Our own writev and read on the same descriptor (see `SetIDKill`).
        var io = SetIDKill.io()
        _ = fuse_session_custom_io(created, &io, fuse_session_fd(created))
        self.session = created
        self.bridge = bridge
        self.bridgeReference = reference
    }

    /// How many worker threads serve the mount's requests.
    public var workerCount: UInt32 { max(1, bridge.kernel.maximumThreads) }

    deinit {
        fuse_session_destroy(session)
        bridgeReference.release()
    }

    /// Serves requests until unmount or signal, then unmounts; `onReady` runs on another
    /// thread once the mount point answers a `stat`. Returns 0 on a clean end.
    ///
    /// The workers are our own threads, not libfuse's `fuse_session_loop_mt`: that loop ends
    /// by `pthread_cancel`ing its workers inside a blocked read, which ThreadSanitizer cannot
    /// follow (a daemon built with `-sanitize=thread` dies at exit) and which leaves no
    /// say over how a worker stops. Here a worker stops between requests: at the end it is
    /// woken from its read by SIGUSR2 (see `WorkerWakeUp`), and only then is the mount
    /// unmounted and the stores shut down.
    /// `beforeUnmount` runs once every worker has left, before the session's descriptor is
    /// closed (a thread that notifies the kernel must be done with it by then).
    public func run(onReady: @escaping @Sendable () -> Void = {}, beforeUnmount: () -> Void = {}) -> Int32 {
        let stop = UnsafeMutablePointer<sem_t>.allocate(capacity: 1)
        sem_init(stop, 0, 0)
        defer { sem_destroy(stop); stop.deallocate() }
        DaemonSignals.install(session: session, stop: stop)
        defer { DaemonSignals.uninstall() }
        WorkerWakeUp.install()
        let mountPoint = self.mountPoint
        let session = self.session
        let readAheadKiB = bridge.kernel.readAheadKiB
        let count = WorkerCount()
        var workers: [pthread_t] = []
        DaemonSignals.withBlocked {
            for _ in 0..<workerCount {
                let worker = Worker(session: session, stop: stop, count: count)
                guard let thread = Threads.start({ worker.serve() }) else { continue }
                count.running.add(1, ordering: .sequentiallyConsistent)
                workers.append(thread)
            }
            Threads.detach {
                // A stat through the kernel proves the workers answer requests.
                var st = Glibc.stat()
                while fstatat(AT_FDCWD, mountPoint, &st, 0) != 0 && errno == EINTR {}
                Self.setReadAhead(kibibytes: readAheadKiB, device: st.st_dev)
                onReady()
            }
        }
        guard !workers.isEmpty else { return 1 }
        // Until a signal or a worker (the kernel ended the session) says stop.
        while fuse_session_exited(session) == 0 {
            while sem_wait(stop) == -1 && errno == EINTR {}
        }
        // Wake every worker still blocked in its read until all have left their loops.
        while count.running.load(ordering: .sequentiallyConsistent) > 0 {
            for worker in workers { pthread_kill(worker, SIGUSR2) }
            usleep(2_000)
        }
        for worker in workers { pthread_join(worker, nil) }
        // OPENs that wait for a person, and WRITEs for another thread, are answered now,
        // while the session can take it.
        PendingOpens.failAll()
        PendingWrites.failAll()
        beforeUnmount()
        fuse_session_unmount(session)
        // Flush and lock every store here, on the way out, whatever else holds this mount.
        bridge.fileSystem.shutDown()
        return 0
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
        // must be (a bare UTF-8 array would be read one byte past its end).
        name.withCString { fuse_lowlevel_notify_inval_entry(session, parent, $0, name.utf8.count) == 0 }
    }
}

extension FuseMount {
    /// Writes the read-ahead of the mount's device (`/sys/class/bdi/MAJOR:MINOR`); where
    /// that is not allowed (not root), the kernel's default stays.
    static func setReadAhead(kibibytes: Int, device: dev_t) {
        // sys/sysmacros.h's major()/minor() are macros Swift cannot import.
        let major = ((device >> 8) & 0xfff) | ((device >> 32) & ~0xfff)
        let minor = (device & 0xff) | ((device >> 12) & ~0xff)
        let path = "/sys/class/bdi/\(major):\(minor)/read_ahead_kb"
        let fd = open(path, O_WRONLY | O_CLOEXEC)
        guard fd >= 0 else { return Log.debug("read-ahead stays at the default: \(path): \(Errno.current)") }
        defer { close(fd) }
        let text = Array("\(kibibytes)\n".utf8)
        if write(fd, text, text.count) != text.count { Log.debug("read-ahead stays at the default: \(Errno.current)") }
    }
}

/// The count of workers still in their loops.
///
/// Thread-safety: an atomic.
private final class WorkerCount: Sendable {
    let running = Atomic<Int>(0)
}

/// One worker thread: receives a request from the session and processes it, until the
/// session ends (the kernel unmounted it, or `run` was told to stop).
///
/// Thread-safety: only its own thread uses it once started; `count` is atomic and libfuse's
/// session calls are thread-safe.
private final class Worker: @unchecked Sendable {
    let session: OpaquePointer
    let stop: UnsafeMutablePointer<sem_t>
    let count: WorkerCount

    init(session: OpaquePointer, stop: UnsafeMutablePointer<sem_t>, count: WorkerCount) {
        self.session = session
        self.stop = stop
        self.count = count
    }

    func serve() {
        WorkerWakeUp.unblock()
        var buffer = fuse_buf()
        let device = fuse_session_fd(session)
        while fuse_session_exited(session) == 0 {
            let received = fuse_session_receive_buf(session, &buffer)
            if received == -EINTR || received == -EAGAIN { continue }
            if received <= 0 { break }  // 0 or -ENODEV: the kernel ended the session
            if buffer.flags.rawValue & FUSE_BUF_IS_FD.rawValue == 0, let request = buffer.mem {
                SetIDKill.note(request, length: Int(received), fd: device)
            }
            fuse_session_process_buf(session, &buffer)
        }
        free(buffer.mem)
        fuse_session_exit(session)
        count.running.subtract(1, ordering: .sequentiallyConsistent)
        sem_post(stop)
    }
}

/// SIGUSR2 with a handler that does nothing and no SA_RESTART: sent to a worker blocked in
/// its read of /dev/fuse, it makes the read fail with EINTR so the worker sees the end.
///
/// Thread-safety: `install` before the workers start; `unblock` on each worker's own thread.
enum WorkerWakeUp {
    static func install() {
        var action = sigaction()
        action.__sigaction_handler.sa_handler = { _ in }
        sigemptyset(&action.sa_mask)
        action.sa_flags = 0
        sigaction(SIGUSR2, &action, nil)
    }

    /// In a worker (started with every signal blocked): let SIGUSR2 in, and only it.
    static func unblock() {
        var set = sigset_t()
        sigemptyset(&set)
        sigaddset(&set, SIGUSR2)
        pthread_sigmask(SIG_UNBLOCK, &set, nil)
    }
}

/// Standard error caught for a while (libfuse's and fusermount3's words about a refused
/// mount): a pipe in place of descriptor 2, put back by `end`, which returns what was
/// written, on one line. Without a pipe, nothing is caught.
///
/// Thread-safety: for one thread, around one call (other threads' lines meanwhile are
/// caught too, and end up in the message).
final class StandardErrorCapture {
    private var saved: Int32 = -1
    private var pipe: (read: Int32, write: Int32)?

    init() {
        guard let made = try? Syscall.pipe() else { return }
        saved = dup(2)
        guard saved >= 0, dup2(made.write, 2) >= 0 else {
            Syscall.close(made.read)
            Syscall.close(made.write)
            if saved >= 0 { Syscall.close(saved) }
            saved = -1
            return
        }
        Syscall.close(made.write)
        pipe = (made.read, -1)
    }

    func end() -> String {
        guard let pipe, saved >= 0 else { return "" }
        dup2(saved, 2)
        Syscall.close(saved)
        _ = fcntl(pipe.read, F_SETFL, fcntl(pipe.read, F_GETFL) | O_NONBLOCK)
        var bytes: [UInt8] = []
        var buffer = [UInt8](repeating: 0, count: 4096)
        while bytes.count < 65536 {
            let n = buffer.withUnsafeMutableBytes { read(pipe.read, $0.baseAddress, $0.count) }
            if n <= 0 { break }
            bytes += buffer[0..<n]
        }
        Syscall.close(pipe.read)
        self.pipe = nil
        let text = String(decoding: bytes, as: UTF8.self)
        return text.split(separator: "\n").map { line in
            String(line.drop { $0 == " " || $0 == "\t" }.reversed().drop { $0 == " " || $0 == "\t" || $0 == "\r" }.reversed())
        }.filter { !$0.isEmpty }.joined(separator: "; ")
    }
}
