#if canImport(Glibc)
import Glibc
#endif
import CSDBus
import SecureMemory
import Posix

/// `org.freedesktop.secrets` on the session bus (SPEC §2c), served from a `SecretStore`.
///
/// One thread owns the bus (sd-bus is not thread-safe): it sleeps in poll(2) on the bus's
/// descriptor and a wakeup, so an idle service does not wake. Other threads hand it work
/// (a store change to signal, the end) through `post`. Every message under
/// `/org/freedesktop/secrets` reaches one fallback handler, which answers the Secret
/// Service's interfaces, `org.freedesktop.DBus.Properties` and introspection.
///
/// Invariants: `sessions`, `prompts` and `callers` are touched on the bus thread only; a
/// session and a prompt belong to the connection that opened it and end with it.
/// Thread-safety: `post` and `stop` from any thread; everything else on the bus thread.
public final class SecretServiceBus: @unchecked Sendable {
    public static let name = "org.freedesktop.secrets"

    let store: any SecretStore
    /// The `session` collection: in memory, locked and unlocked with the vault.
    let sessionItems: SessionCollection
    private let bus: OpaquePointer
    private let wakeup = Wakeup()
    private let work = Locked<[@Sendable (SecretServiceBus) -> Void]>([])
    private let running = Locked(true)
    private var thread: pthread_t?

    /// Open sessions by path.
    var sessions: [String: Session] = [:]
    private var nextSession = 0
    /// Prompts made (by Unlock) and not yet completed, by path.
    var prompts: [String: PendingPrompt] = [:]
    var nextPrompt = 0
    /// The process behind each connection seen (asked of the bus once, pinned).
    private var callers: [String: BusCaller] = [:]
    /// The items signalled so far, by collection (to tell a made one from a changed one).
    var known: [CollectionID: Set<[UInt8]>] = [:]
    /// Searches made before the mount's first unlock, answered once the passphrase is given
    /// (or refused); the prompt that asks for it, while it is up.
    var waitingSearches: [WaitingSearch] = []
    var searchPrompt: (@Sendable () -> Void)?

    private init(store: any SecretStore, bus: OpaquePointer) {
        self.store = store
        self.sessionItems = SessionCollection(vault: store)
        self.bus = bus
    }

    deinit { sd_bus_flush_close_unref(bus) }

    /// Connects to the session bus and asks for the name (`replace`: taking it from an owner
    /// that allows it). Throws one line saying why not: no session bus, or who has the name.
    public static func start(store: any SecretStore, replace: Bool) throws(SecretServiceError) -> SecretServiceBus {
        var opened: OpaquePointer?
        let rc = sd_bus_open_user(&opened)
        guard rc >= 0, let bus = opened else {
            throw SecretServiceError("no session bus to serve the Secret Service on (\(Errno(-rc))): is DBUS_SESSION_BUS_ADDRESS set?")
        }
        let flags = UInt64(replace ? SD_BUS_NAME_REPLACE_EXISTING : 0) | UInt64(SD_BUS_NAME_ALLOW_REPLACEMENT)
        let requested = sd_bus_request_name(bus, name, flags)
        if requested < 0 {
            let owner = ownerDescription(bus)
            sd_bus_flush_close_unref(bus)
            throw SecretServiceError("the Secret Service name \(name) is taken by \(owner)"
                                     + (replace ? " and it does not let it be replaced" : " (--secret-service=replace takes it where it allows)")
                                     + "; serving the files without it")
        }
        let service = SecretServiceBus(store: store, bus: bus)
        let context = Unmanaged.passUnretained(service).toOpaque()
        // Every path, not only the service's: a call to a path where nothing is answers what
        // clients map to "no such item" (GDBus's UnknownMethod, as gnome-keyring's), not
        // sd-bus's UnknownObject.
        guard sd_bus_add_fallback(bus, nil, "/", { message, context, _ in
            guard let message, let context else { return 0 }
            return Unmanaged<SecretServiceBus>.fromOpaque(context).takeUnretainedValue().handle(message)
        }, context) >= 0,
              sd_bus_add_match(bus, nil, "type='signal',sender='org.freedesktop.DBus',member='NameOwnerChanged'", { message, context, _ in
                  guard let message, let context else { return 0 }
                  Unmanaged<SecretServiceBus>.fromOpaque(context).takeUnretainedValue().nameOwnerChanged(message)
                  return 0
              }, context) >= 0 else {
            throw SecretServiceError("the Secret Service could not register its objects on the bus")
        }
        service.known[.login] = Set(store.allItems())
        store.observe { [weak service] change in service?.post { $0.signal(change) } }
        guard let thread = Threads.start({ service.serve() }) else {
            throw SecretServiceError("no thread for the Secret Service")
        }
        service.thread = thread
        Log.info("serving the Secret Service (\(name)) on the session bus")
        return service
    }

    /// Who owns the name now, for the line that says it is taken.
    private static func ownerDescription(_ bus: OpaquePointer) -> String {
        var creds: OpaquePointer?
        let mask = UInt64(SD_BUS_CREDS_PID) | UInt64(SD_BUS_CREDS_COMM) | UInt64(SD_BUS_CREDS_UNIQUE_NAME)
        guard sd_bus_get_name_creds(bus, name, mask, &creds) >= 0, let creds else { return "another program" }
        defer { sd_bus_creds_unref(creds) }
        var pid: pid_t = 0
        var comm: UnsafePointer<CChar>?
        _ = sd_bus_creds_get_pid(creds, &pid)
        _ = sd_bus_creds_get_comm(creds, &comm)
        // (The bus may not send the command: read from /proc then.)
        let proc = pid > 0 ? (try? Syscall.readFile("/proc/\(pid)/comm")).map { String(decoding: $0, as: UTF8.self).filter { $0 != "\n" } } : nil
        let program = comm.map { String(cString: $0) } ?? proc ?? "a program"
        return pid > 0 ? "\(program) (pid \(pid))" : program
    }

    /// Ends the service: the name is let go, the thread ends.
    public func stop() {
        running.withLock { $0 = false }
        wakeup.wake()
        if let thread { pthread_join(thread, nil) }
        thread = nil
    }

    /// Runs `body` on the bus thread soon.
    func post(_ body: @escaping @Sendable (SecretServiceBus) -> Void) {
        work.withLock { $0.append(body) }
        wakeup.wake()
    }

    private func serve() {
        let fd = sd_bus_get_fd(bus)
        while running.withLock({ $0 }) {
            while true {
                let rc = sd_bus_process(bus, nil)
                if rc < 0 {
                    Log.error("the session bus connection failed (\(Errno(-rc))): the Secret Service stops")
                    return
                }
                if rc == 0 { break }
            }
            let jobs = work.withLock { jobs -> [@Sendable (SecretServiceBus) -> Void] in defer { jobs.removeAll() }; return jobs }
            for job in jobs { job(self) }
            if !jobs.isEmpty { continue }  // (what they sent goes out before the wait)
            _ = sd_bus_flush(bus)
            var until: UInt64 = 0
            var timeout: Int32 = -1
            if sd_bus_get_timeout(bus, &until) > 0 && until != UInt64.max {
                var now = timespec()
                clock_gettime(CLOCK_MONOTONIC, &now)
                let microseconds = UInt64(now.tv_sec) * 1_000_000 + UInt64(now.tv_nsec) / 1000
                timeout = until <= microseconds ? 0 : Int32(clamping: (until - microseconds + 999) / 1000)
            }
            var polled = [pollfd(fd: fd, events: Int16(sd_bus_get_events(bus)), revents: 0),
                          pollfd(fd: wakeup.fd, events: Int16(POLLIN), revents: 0)]
            if poll(&polled, 2, timeout) > 0 && polled[1].revents != 0 { wakeup.wait(until: .now) }
        }
        searchPrompt?()
        sessionItems.wipe()
        for search in waitingSearches { sd_bus_message_unref(search.message) }
        waitingSearches.removeAll()
        _ = sd_bus_release_name(bus, Self.name)
        _ = sd_bus_flush(bus)
    }

    // MARK: Messages

    /// The unique name and process of a message's sender: the pid is asked of the bus at
    /// the connection's first call and pinned (pidfd) for as long as the connection lives.
    /// Once that process has exited, the connection has no known caller (pid 0), though
    /// a child may still hold it and the pid may name another process by then.
    func caller(of message: OpaquePointer) -> BusCaller {
        let sender = sd_bus_message_get_sender(message).map { String(cString: $0) } ?? ""
        if let known = callers[sender] {
            return known.isGone ? BusCaller(connection: sender, pid: 0, pin: nil) : known
        }
        var creds: OpaquePointer?
        var pid: pid_t = 0
        if sd_bus_query_sender_creds(message, UInt64(SD_BUS_CREDS_PID), &creds) >= 0, let creds {
            _ = sd_bus_creds_get_pid(creds, &pid)
            sd_bus_creds_unref(creds)
        }
        let caller = BusCaller(connection: sender, pid: pid)
        if caller.pid > 0 { callers[sender] = caller }
        return caller
    }

    private func handle(_ message: OpaquePointer) -> Int32 {
        var type: UInt8 = 0
        guard sd_bus_message_get_type(message, &type) >= 0, type == UInt8(SD_BUS_MESSAGE_METHOD_CALL) else { return 0 }
        let path = sd_bus_message_get_path(message).map { String(cString: $0) } ?? ""
        let interface = sd_bus_message_get_interface(message).map { String(cString: $0) } ?? ""
        let member = sd_bus_message_get_member(message).map { String(cString: $0) } ?? ""
        // Secrets may come in (CreateItem, SetSecret): the message's memory is erased when freed.
        _ = sd_bus_message_sensitive(message)
        let call = BusCall(message: message, path: path, interface: interface, member: member, caller: caller(of: message))
        let answer: Result<Reply, BusError>
        do throws(BusError) {
            answer = .success(try dispatch(call))
        } catch {
            answer = .failure(error)
        }
        switch answer {
        case .success(let reply) where reply.deferred: break
        case .success(let reply): send(reply, to: message)
        case .failure(let error): sendError(error, to: message)
        }
        return 1
    }

    func send(_ reply: Reply, to call: OpaquePointer) {
        var made: OpaquePointer?
        guard sd_bus_message_new_method_return(call, &made) >= 0, let made else { return }
        defer { sd_bus_message_unref(made) }
        if reply.sensitive { _ = sd_bus_message_sensitive(made) }
        var writer = MessageWriter(message: made)
        reply.write(&writer)
        if writer.failed {
            sendError(.failed("the reply could not be built"), to: call)
            return
        }
        _ = sd_bus_send(bus, made, nil)
    }

    func sendError(_ error: BusError, to call: OpaquePointer) {
        var made = sd_bus_error()
        _ = sd_bus_error_set(&made, error.name, error.message)
        defer { sd_bus_error_free(&made) }
        _ = sd_bus_reply_method_error(call, &made)
    }

    /// A signal from `path`, written by `body`.
    func emit(_ path: String, _ interface: String, _ member: String, _ body: (inout MessageWriter) -> Void) {
        var made: OpaquePointer?
        guard sd_bus_message_new_signal(bus, &made, path, interface, member) >= 0, let made else { return }
        defer { sd_bus_message_unref(made) }
        var writer = MessageWriter(message: made)
        body(&writer)
        if !writer.failed { _ = sd_bus_send(bus, made, nil) }
    }

    // MARK: Sessions

    /// A session of a connection: plain, or with the AES key of its DH exchange.
    ///
    /// Thread-safety: on the bus thread only.
    struct Session {
        let owner: String
        let key: SecureBytes?
    }

    func openSession(for connection: String, key: SecureBytes?) -> String {
        nextSession += 1
        let path = SecretPaths.session(nextSession)
        sessions[path] = Session(owner: connection, key: key)
        return path
    }

    func closeSession(_ path: String) {
        sessions.removeValue(forKey: path)?.key?.wipe()
    }

    /// A connection that left: its sessions go.
    private func nameOwnerChanged(_ message: OpaquePointer) {
        let reader = MessageReader(message: message)
        guard let name = try? reader.string(), let _ = try? reader.string(), let newOwner = try? reader.string(),
              newOwner.isEmpty, name.hasPrefix(":") else { return }
        callers[name] = nil
        for (path, session) in sessions where session.owner == name { closeSession(path) }
        // Its prompts are taken down (a dialog up goes away), and what it was allowed once.
        for (path, prompt) in prompts where prompt.owner.connection == name {
            prompt.dismiss?()
            prompts[path] = nil
        }
        dropWaitingSearches(of: name)
        store.connectionClosed(name)
    }
}

/// Why the Secret Service could not start: one line for the mount to say.
///
/// Thread-safety: a value.
public struct SecretServiceError: Error, Sendable, CustomStringConvertible {
    public let description: String
    init(_ description: String) { self.description = description }
}

/// A method call being answered.
///
/// Thread-safety: on the bus thread only.
struct BusCall {
    let message: OpaquePointer
    let path: String
    let interface: String
    let member: String
    let caller: BusCaller
    var arguments: MessageReader { MessageReader(message: message) }
}

/// What a method returns: its arguments, written into the reply.
///
/// Thread-safety: on the bus thread only.
struct Reply {
    /// Holds a secret: the message's memory is erased when it is freed.
    var sensitive = false
    let write: (inout MessageWriter) -> Void

    init(sensitive: Bool = false, _ write: @escaping (inout MessageWriter) -> Void) {
        self.sensitive = sensitive
        self.write = write
    }

    static var empty: Reply { Reply { _ in } }

    /// No reply now: the call was kept (referenced) and is answered later.
    static var later: Reply {
        var reply = Reply { _ in }
        reply.deferred = true
        return reply
    }
    private(set) var deferred = false
}
