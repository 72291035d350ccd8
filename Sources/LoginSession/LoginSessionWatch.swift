#if canImport(Glibc)
import Glibc
#endif
import CSDBus
import Posix
import Synchronization

/// What the login session does that locks the accounts (`mtmfs mount --lock-on-sleep
/// --lock-with-screen`, SPEC §3), as systemd-logind says it on the system bus
/// (`org.freedesktop.login1`): `PrepareForSleep(true)` before a suspend or hibernation,
/// and a session's `Lock` signal (`loginctl lock-session`, a screen locker, a lid closed
/// with HandleLidSwitch=lock) for a session of this user — asked of logind
/// (`Session.User`) when the signal comes, since sessions come and go.
///
/// Thread-safety: one thread of its own runs the bus connection; `stop` from any thread.
public final class LoginSessionWatch: @unchecked Sendable {
    public struct Events: OptionSet, Sendable {
        public let rawValue: Int
        public init(rawValue: Int) { self.rawValue = rawValue }
        public static let sleep = Events(rawValue: 1)
        public static let screenLock = Events(rawValue: 2)
    }

    static let logind = "org.freedesktop.login1"
    private let bus: OpaquePointer
    private let lock: @Sendable (String) -> Void
    private let user = getuid()
    private let running = Mutex(true)
    private let wakeup = Wakeup()
    private var thread: pthread_t?

    private init(bus: OpaquePointer, lock: @escaping @Sendable (String) -> Void) {
        self.bus = bus
        self.lock = lock
    }

    deinit { sd_bus_flush_close_unref(bus) }

    /// Connects to the system bus (`DBUS_SYSTEM_BUS_ADDRESS`, else the system's) and
    /// listens for `events`; `lock` gets the reason, on the watch's thread. Throws one line
    /// saying why not (no system bus).
    public static func start(_ events: Events, lock: @escaping @Sendable (String) -> Void) throws(LoginSessionError) -> LoginSessionWatch {
        var opened: OpaquePointer?
        let rc = sd_bus_open_system(&opened)
        guard rc >= 0, let bus = opened else {
            throw LoginSessionError("no system bus to hear logind on (\(Errno(-rc)))")
        }
        let watch = LoginSessionWatch(bus: bus, lock: lock)
        let context = Unmanaged.passUnretained(watch).toOpaque()
        if events.contains(.sleep) {
            let rule = "type='signal',sender='\(logind)',path='/org/freedesktop/login1',interface='org.freedesktop.login1.Manager',member='PrepareForSleep'"
            guard sd_bus_add_match(bus, nil, rule, { message, context, _ in
                guard let message, let context else { return 0 }
                Unmanaged<LoginSessionWatch>.fromOpaque(context).takeUnretainedValue().prepareForSleep(message)
                return 0
            }, context) >= 0 else { throw LoginSessionError("logind's PrepareForSleep cannot be listened to on the system bus") }
        }
        if events.contains(.screenLock) {
            let rule = "type='signal',sender='\(logind)',interface='org.freedesktop.login1.Session',member='Lock'"
            guard sd_bus_add_match(bus, nil, rule, { message, context, _ in
                guard let message, let context else { return 0 }
                Unmanaged<LoginSessionWatch>.fromOpaque(context).takeUnretainedValue().sessionLocked(message)
                return 0
            }, context) >= 0 else { throw LoginSessionError("logind's Lock cannot be listened to on the system bus") }
        }
        // Is logind there at all? Said once; the watch goes on (it may start later).
        if !hasOwner(bus, logind) {
            Log.warning("logind (\(logind)) is not on the system bus now: the accounts lock on its signals once it is")
        }
        guard let thread = Threads.start({ watch.serve() }) else { throw LoginSessionError("no thread for the login session's watch") }
        watch.thread = thread
        return watch
    }

    /// Ends the watch: its thread ends, the connection closes.
    public func stop() {
        running.withLock { $0 = false }
        wakeup.wake()
        if let thread { pthread_join(thread, nil) }
        thread = nil
    }

    private static func hasOwner(_ bus: OpaquePointer, _ name: String) -> Bool {
        var creds: OpaquePointer?
        guard sd_bus_get_name_creds(bus, name, 0, &creds) >= 0, let creds else { return false }
        sd_bus_creds_unref(creds)
        return true
    }

    private func prepareForSleep(_ message: OpaquePointer) {
        var going: Int32 = 0
        guard sd_bus_message_read_basic(message, CChar(UInt8(ascii: "b")), &going) > 0, going != 0 else { return }
        lock("the system is going to sleep")
    }

    /// A session's Lock: logind is asked whose session it is (its `User` property), and the
    /// answer locks when it is this user's.
    private func sessionLocked(_ message: OpaquePointer) {
        guard let pathPointer = sd_bus_message_get_path(message) else { return }
        let path = String(cString: pathPointer)
        var call: OpaquePointer?
        guard sd_bus_message_new_method_call(bus, &call, Self.logind, path, "org.freedesktop.DBus.Properties", "Get") >= 0, let call else { return }
        defer { sd_bus_message_unref(call) }
        let s = CChar(UInt8(ascii: "s"))
        guard sd_bus_message_append_basic(call, s, "org.freedesktop.login1.Session") >= 0,
              sd_bus_message_append_basic(call, s, "User") >= 0 else { return }
        let context = Unmanaged.passUnretained(self).toOpaque()
        _ = sd_bus_call_async(bus, nil, call, { reply, context, _ in
            guard let reply, let context else { return 0 }
            Unmanaged<LoginSessionWatch>.fromOpaque(context).takeUnretainedValue().sessionUser(reply)
            return 0
        }, context, 5_000_000)
    }

    /// The answer to `Get(Session, User)`: a variant holding (uo), the user's id and path.
    private func sessionUser(_ reply: OpaquePointer) {
        guard sd_bus_message_is_method_error(reply, nil) == 0,
              sd_bus_message_enter_container(reply, CChar(UInt8(ascii: "v")), "(uo)") > 0,
              sd_bus_message_enter_container(reply, CChar(UInt8(ascii: "r")), "uo") > 0 else { return }
        var uid: UInt32 = 0
        guard sd_bus_message_read_basic(reply, CChar(UInt8(ascii: "u")), &uid) > 0, uid == user else { return }
        lock("the session's screen is locked")
    }

    /// Milliseconds until the bus's next timeout (a call's), or -1: none.
    private func pendingDeadline() -> Int32 {
        var deadline: UInt64 = 0
        guard sd_bus_get_timeout(bus, &deadline) > 0, deadline != .max else { return -1 }
        var now = timespec()
        clock_gettime(CLOCK_MONOTONIC, &now)
        let elapsed = UInt64(now.tv_sec) * 1_000_000 + UInt64(now.tv_nsec) / 1_000
        return deadline <= elapsed ? 0 : Int32(clamping: (deadline - elapsed) / 1_000 + 1)
    }

    private func serve() {
        let fd = sd_bus_get_fd(bus)
        while running.withLock({ $0 }) {
            while true {
                let rc = sd_bus_process(bus, nil)
                if rc < 0 {
                    Log.error("the system bus connection failed (\(Errno(-rc))): the accounts no longer lock with the session")
                    return
                }
                if rc == 0 { break }
            }
            _ = sd_bus_flush(bus)
            var polled = [pollfd(fd: fd, events: Int16(sd_bus_get_events(bus)), revents: 0),
                          pollfd(fd: wakeup.fd, events: Int16(POLLIN), revents: 0)]
            // No wakeup while idle: a deadline only while a Get waits for its answer.
            if poll(&polled, 2, pendingDeadline()) > 0 && polled[1].revents != 0 { wakeup.wait(until: .now) }
        }
    }
}

/// Why the login session cannot be watched: one line for the mount's output and log.
public struct LoginSessionError: Error, CustomStringConvertible, Sendable {
    public let description: String
    init(_ description: String) { self.description = description }
}
