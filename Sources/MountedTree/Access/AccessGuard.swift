#if canImport(Glibc)
import Glibc
#endif
import CredentialVault
import FuseLowLevel
import Posix
import SecureMemory
import Synchronization

/// How a guarded mount asks people: which pinentry, on which display.
///
/// Thread-safety: a value.
public struct PromptSettings: Sendable {
    /// The pinentry program's path ("" when none could be used: `problem` says why).
    public var program: String
    public var problem: String?
    /// The environment the pinentry gets: the daemon's display and locale, never anything else.
    public var environment: [String]
    /// Seconds a prompt waits for an answer.
    public var timeout: Double
    /// The mount point, for the "how to trust it" hints.
    public var mountPoint: String

    public init(program: String = "/usr/bin/pinentry", problem: String? = nil, environment: [String], timeout: Double = 60,
                mountPoint: String) {
        self.program = program
        self.problem = problem
        self.environment = environment
        self.timeout = timeout
        self.mountPoint = mountPoint
    }

    /// Where system programs are: the pinentry is found there, never through the user's
    /// PATH (a `~/.local/bin/pinentry` that answers "always" would trust anything).
    static let systemPath = "/usr/local/bin:/usr/bin:/bin"

    /// The pinentry to run: `given` as a path, or found in `systemPath`; refused (nil, and
    /// why) when it or its directory is one the mount's user can write.
    public static func resolvePinentry(_ given: String, user: uid_t) -> (path: String?, problem: String?) {
        let candidates = given.contains("/") ? [given] : systemPath.split(separator: ":").map { "\($0)/\(given)" }
        guard let found = candidates.first(where: { (try? Syscall.access($0, X_OK)) != nil }) else {
            return (nil, "no pinentry program \(given)" + (given.contains("/") ? "" : " in \(systemPath)")
                    + " (mtmfs mount --pinentry PROGRAM; Debian: apt install pinentry-curses)")
        }
        let directory = String(found[..<(found.lastIndex(of: "/") ?? found.startIndex)])
        let credentials = ProcessInspection.Credentials(uid: user, gid: getgid(), groups: [])
        for path in [found, directory.isEmpty ? "/" : directory] {
            guard let st = try? Syscall.stat(path) else { continue }
            let sticky = st.st_mode & S_ISVTX != 0 && path != found
            if user != 0 && credentials.mayWrite(st) && !sticky {
                return (nil, "the pinentry \(found) is refused: \(path) can be changed by the mount's user "
                        + "(a program of theirs could answer for them); use one installed by root")
            }
        }
        return (found, nil)
    }

    /// The variables a pinentry needs, taken from `environment` (the daemon's own).
    public static func pinentryEnvironment(from environment: [String]) -> [String] {
        let kept: Set<String> = ["PATH", "HOME", "LANG", "LC_ALL", "LC_CTYPE", "LC_MESSAGES", "TERM", "DISPLAY",
                                 "WAYLAND_DISPLAY", "XAUTHORITY", "XDG_RUNTIME_DIR", "DBUS_SESSION_BUS_ADDRESS"]
        var out = environment.filter { entry in
            let name = String(entry.prefix { $0 != "=" })
            return kept.contains(name) && name != "PATH"
        }
        out.append("PATH=" + systemPath)
        return withUTF8Locale(out)
    }

    /// A pinentry refuses text it cannot show in its locale ("ERR 83886246 A locale function
    /// failed" for `…` and `←`): a daemon started from a login shell after `su -`, a systemd
    /// unit or cron has none. The locale's character type is made UTF-8 (`C.UTF-8`, which
    /// glibc always has; the language of messages is left as it was).
    static func withUTF8Locale(_ environment: [String]) -> [String] {
        func value(_ name: String) -> String? {
            environment.first { $0.hasPrefix(name + "=") }.map { String($0.dropFirst(name.count + 1)) }.flatMap { $0.isEmpty ? nil : $0 }
        }
        let effective = value("LC_ALL") ?? value("LC_CTYPE") ?? value("LANG") ?? "C"
        let lowered = effective.lowercased()
        guard !lowered.contains("utf-8") && !lowered.contains("utf8"), utf8LocaleExists else { return environment }
        var out = environment.filter { !$0.hasPrefix("LC_ALL=") && !$0.hasPrefix("LC_CTYPE=") }
        // LC_ALL would override LC_CTYPE: its other parts move to their own variables.
        if let all = value("LC_ALL"), value("LC_MESSAGES") == nil { out.append("LC_MESSAGES=" + all) }
        out.append("LC_CTYPE=C.UTF-8")
        return out
    }

    /// Whether this system has a UTF-8 locale to give a pinentry (else prompts are ASCII).
    static let utf8LocaleExists: Bool = {
        guard let locale = newlocale(LC_CTYPE_MASK, "C.UTF-8", nil) else { return false }
        freelocale(locale)
        return true
    }()

    /// The prompt's text as a pinentry in `environment` can show it: as it is in a UTF-8
    /// locale, else with `…`, `←`, `—` and other non-ASCII characters written in ASCII.
    static func displayable(_ text: String, in environment: [String]) -> String {
        let locale = (environment.first { $0.hasPrefix("LC_ALL=") } ?? environment.first { $0.hasPrefix("LC_CTYPE=") }
                      ?? environment.first { $0.hasPrefix("LANG=") } ?? "").lowercased()
        if locale.contains("utf-8") || locale.contains("utf8") { return text }
        var out = ""
        for scalar in text.unicodeScalars {
            switch scalar {
            case "…": out += "..."
            case "←": out += "<-"
            case "→": out += "->"
            case "—", "–": out += "-"
            case "“", "”": out += "\""
            case "‘", "’": out += "'"
            default: out += scalar.isASCII ? String(scalar) : "?"
            }
        }
        return out
    }

    /// Whether a desktop is there to show a prompt on.
    var hasDisplay: Bool {
        environment.contains { ($0.hasPrefix("DISPLAY=") && $0.count > 8) || ($0.hasPrefix("WAYLAND_DISPLAY=") && $0.count > 16) }
    }
}

/// A request waiting for a person's answer (`AccountsTree.ask`): an OPEN postponed, or a
/// Secret Service prompt. Told once: allowed (decided again after the answer), or refused
/// with an errno (EACCES, EINTR for an interrupt).
///
/// Thread-safety: its closures are called from prompt threads.
struct PromptWaiter: Sendable {
    let isInterrupted: @Sendable () -> Bool
    /// Runs the handler when the request is interrupted (at once if it was).
    let onInterrupt: @Sendable (@escaping @Sendable () -> Void) -> Void
    let allowed: @Sendable () -> Void
    let refused: @Sendable (Errno) -> Void
}

/// Who may read a password (SPEC §3a), apart from the vault: who asks (`inspector`), the
/// runs of programs allowed once, the prompts up, and the record of every decision.
///
/// Thread-safety: each table behind its own mutex; prompts run on threads of their own.
final class AccessGuard: Sendable {
    let settings: PromptSettings
    let inspector = RequesterInspector()
    private let decisions = Locked<[String]>([])
    /// (run of a program, account UUID): allowed once, for as long as that run lasts.
    private let grants = Locked<Set<Grant>>([])
    /// (bus connection, account UUID): allowed once on the Secret Service, until that
    /// connection closes (`connectionClosed`).
    private let connectionGrants = Locked<Set<ConnectionGrant>>([])
    /// The prompts up, by (program, account), each with the requests waiting for its end
    /// (each called with the prompt's answer).
    private let prompts = Locked<[PromptKey: [@Sendable (PromptEnd) -> Void]]>([:])
    /// The dialogs up, cancelled at unmount.
    private let dialogs = Locked<[ObjectIdentifier: PinentryDialog]>([:])
    static let kept = 200

    /// "Allow once" for one run of a program and one account (what was asked is kept for
    /// the record: an editor allowed to read saves in the same run).
    struct Grant: Hashable { let run: ProcessRun; let account: [UInt8]; let writing: Bool }
    struct ConnectionGrant: Hashable { let connection: String; let account: [UInt8] }
    struct PromptKey: Hashable { let sha256: [UInt8]; let account: [UInt8] }

    /// What an "Allow once" covers: the run of a program (an open), or a bus connection
    /// (a Secret Service client: SPEC §2c).
    ///
    /// Thread-safety: a value.
    enum Scope: Sendable, Hashable {
        case run
        case connection(String)
    }

    init(settings: PromptSettings) { self.settings = settings }

    // MARK: Decisions

    /// What an access needs, and what is known of the account.
    ///
    /// Thread-safety: a value.
    struct Access: Sendable {
        let account: [UInt8]
        let accountName: String
        /// "password", "server" … or "account" (a removal), "files" (an editor's file).
        let what: String
        let writing: Bool
        /// For the prompt only (it is what finds an account, readable to all).
        let label: String
        /// What asks: an open (a run of a program), or a call on the Secret Service.
        var scope: Scope = .run
    }

    enum Verdict: Equatable { case allowed(String), denied(String), ask }

    /// The decision that needs no person: refused outright, trusted, allowed once for
    /// this run, or a question to ask.
    func verdict(_ requester: Requester, _ access: Access, trusted: [TrustedProgram]) -> Verdict {
        if let refusal = requester.refusal { return .denied(refusal) }
        guard let program = requester.program else { return .denied("its program is unknown") }
        if trusted.contains(where: { $0.sha256 == program.sha256 }) { return .allowed("trusted") }
        if case .connection(let connection) = access.scope {
            let grant = ConnectionGrant(connection: connection, account: access.account)
            return connectionGrants.withLock { $0.contains(grant) } ? .allowed("allowed once for this connection") : .ask
        }
        // (Either grant: an editor allowed to read the password saves it in the same run,
        // through files it creates and renames, which do not ask.)
        let asked = [Grant(run: requester.run, account: access.account, writing: true),
                     Grant(run: requester.run, account: access.account, writing: false)]
        guard let grant = grants.withLock({ grants in asked.first { grants.contains($0) } }) else { return .ask }
        if grant.run.isRunning { return .allowed("allowed once for this run") }
        _ = grants.withLock { $0.remove(grant) }
        return .ask
    }

    /// "Allow once": this run of the program (or this connection) may use the account
    /// until it ends.
    func allowOnce(_ requester: Requester, _ access: Access) {
        if case .connection(let connection) = access.scope {
            connectionGrants.withLock { _ = $0.insert(ConnectionGrant(connection: connection, account: access.account)) }
            return
        }
        grants.withLock { grants in
            // Runs that ended go (a pid may come back as another run).
            if grants.count > 64 { grants = grants.filter { $0.run.isRunning } }
            grants.insert(Grant(run: requester.run, account: access.account, writing: access.writing))
        }
    }

    /// A bus connection closed: what it was allowed once goes with it.
    func connectionClosed(_ connection: String) {
        connectionGrants.withLock { $0 = $0.filter { $0.connection != connection } }
    }

    /// Whether a prompt could be shown to this requester at all.
    func cannotAsk(_ requester: Requester) -> String? {
        if requester.terminal == nil && !settings.hasDisplay {
            return "not trusted, and there is no terminal or display to ask on"
        }
        return nil
    }

    /// How a prompt ended, for the requests that waited for it: a person's no (or no
    /// answer) holds for them too; anything else and they are decided again.
    enum PromptEnd: Sendable { case denied(String), other }

    /// One prompt at a time per program and account: true when this one may ask now;
    /// otherwise `retry` runs when the prompt up ends.
    func startPrompt(_ key: PromptKey, orWait retry: @escaping @Sendable (PromptEnd) -> Void) -> Bool {
        prompts.withLock { prompts in
            if prompts[key] != nil {
                prompts[key]!.append(retry)
                return false
            }
            prompts[key] = []
            return true
        }
    }

    /// The prompt of `key` ended: the requests that waited for it hear how.
    func endPrompt(_ key: PromptKey, _ end: PromptEnd) {
        let waiting = prompts.withLock { $0.removeValue(forKey: key) ?? [] }
        for retry in waiting { retry(end) }
    }

    func dialogStarted(_ dialog: PinentryDialog) { dialogs.withLock { $0[ObjectIdentifier(dialog)] = dialog } }
    func dialogEnded(_ dialog: PinentryDialog) { _ = dialogs.withLock { $0.removeValue(forKey: ObjectIdentifier(dialog)) } }

    /// Unmount: every prompt up is taken down (its request is answered EINTR).
    func cancelAll() {
        for dialog in dialogs.withLock({ Array($0.values) }) { dialog.cancel() }
    }

    /// Programs that print what they read: trusting one lets any program that runs it
    /// read the password (the same holds for interpreters).
    static let printers: Set<String> = ["cat", "head", "tail", "dd", "cp", "less", "more", "tee", "base64", "xxd", "od",
                                        "hexdump", "sed", "grep", "cut", "tr", "sort", "uniq", "nl", "strings", "rev",
                                        "tac", "paste", "install", "rsync", "scp", "curl", "wget", "nc", "socat", "mtmfs"]

    /// The second question, after "Always allow": the passphrase, so that no program that
    /// controls the terminal or the display can trust itself.
    func alwaysAllowText(_ requester: Requester, _ access: AccessGuard.Access) -> String {
        let account = access.label.isEmpty ? access.accountName : "\(access.label) (\(access.accountName))"
        return "To always allow \(requester.path) to use the account \(account), enter the vault's passphrase."
    }

    /// The question put to the person.
    func promptText(_ requester: Requester, _ access: Access) -> (title: String, description: String) {
        let program = requester.program.map { "\(requester.path) (SHA-256 \(String($0.hexDigest.prefix(16)))…)" } ?? requester.path
        var lines = ["\(program), pid \(requester.viaCaller ?? requester.process),"]
        if let via = requester.via { lines.append("through \(via),") }
        if case .connection(let connection) = access.scope { lines.append("on the Secret Service (bus connection \(connection)),") }
        lines += [
                     "wants to \(access.writing ? "change" : "read") the \(access.what) of the account",
                     access.label.isEmpty ? access.accountName : "\(access.label) (\(access.accountName))."]
        if !requester.chain.isEmpty { lines.append("Run by: " + requester.chain.joined(separator: " ← ")) }
        if let path = requester.program?.path, RequesterInspector.isInterpreter(path) {
            lines.append("\(requester.path) is an interpreter: trusting it trusts every script it runs.")
        } else if let path = requester.program?.path, Self.printers.contains(String(path.split(separator: "/").last ?? "")) {
            lines.append("\(requester.path) prints what it reads: trusting it lets any program that runs it read the password.")
        }
        lines.append("")
        let once = access.scope == .run ? "this run only" : "until this program closes its bus connection"
        lines.append("Allow once: \(once). Always allow: add it to the account's trusted programs (asks for the passphrase).")
        // Assuan lines are at most 1,000 bytes: a long chain or path is cut, never the question.
        var description = lines.joined(separator: "\n")
        while description.utf8.count > 700, lines.count > 4 {
            lines.remove(at: lines.count - 4)
            description = lines.joined(separator: "\n")
        }
        if description.utf8.count > 700 { description = String(description.utf8.prefix(700)).map { $0 } ?? description }
        return ("mtmfs: a program asks for a secret", description)
    }

    // MARK: The record

    /// Records a decision (`.mtmfs/access` and the log): time, verdict and why, account,
    /// field, pid, program, and what ran it (up to a session leader). Never a value.
    func record(allowed: Bool, _ why: String, _ requester: Requester, _ access: Access) {
        let time = ISO8601.text(unixSeconds: Double(Timestamp.now().seconds))
        var line = "\(time) \(allowed ? "allowed" : "denied") (\(why)) account=\(access.accountName) field=\(access.what)"
        line += " pid=\(requester.process) program=\(requester.path)"
        if let program = requester.program { line += " sha256=\(program.hexDigest)" }
        if let via = requester.via { line += " via=\(via)" }
        if case .connection(let connection) = access.scope { line += " bus=\(connection)" }
        let chain = requester.chain
        if !chain.isEmpty { line += " by=" + chain.joined(separator: " ← ") }
        decisions.withLock { lines in
            lines.append(line)
            if lines.count > Self.kept { lines.removeFirst(lines.count - Self.kept) }
        }
        if allowed {
            Log.info("access: " + line)
        } else {
            var hint = ""
            if requester.refusal == nil, requester.program != nil {
                hint = "; to trust it: mtmfs trust \(settings.mountPoint)/accounts/\(access.accountName) \(requester.path)"
            }
            Log.warning("access: " + line + hint)
        }
    }

    /// The last decisions, oldest first, one a line.
    func recentDecisions() -> String {
        decisions.withLock { $0.isEmpty ? "" : $0.joined(separator: "\n") + "\n" }
    }
}

/// What the prompt broker needs of the store that keeps the trusted lists (the vault
/// service): a list read again after a prompt, the passphrase an "Always allow" is given
/// with, and the trust it then adds.
///
/// Thread-safety: called from prompt threads; the keeper locks what it reads.
protocol TrustKeeper: AnyObject, Sendable {
    func trustedPrograms(of account: [UInt8]) -> [TrustedProgram]
    func checkPassphrase(_ passphrase: SecureBytes) throws(Errno)
    func trust(_ program: TrustedProgram, account uuid: [UInt8]) throws(Errno)
}

extension AccessGuard {
    /// The one prompt broker (SPEC §3a, §2c), for an OPEN and a Secret Service call alike:
    /// asks a person on a thread of its own (one prompt per program and account at a time;
    /// a second request of the same pair waits for the first one's end: a no holds for it
    /// too, anything else and it is decided again), then tells `waiter`. An interrupt of
    /// the waiter (a Ctrl-C of the requester, a client gone from the bus) ends its wait at
    /// once, waiting or asked.
    func ask(_ requester: Requester, _ access: Access, waiter: PromptWaiter, keeper: any TrustKeeper) {
        let guardian = self
        let key = PromptKey(sha256: requester.program?.sha256 ?? [], account: access.account)
        let retry: @Sendable (PromptEnd) -> Void = { [weak keeper] end in
            guard let keeper, !waiter.isInterrupted() else { return waiter.refused(.interrupted) }
            if case .denied(let why) = end {
                guardian.record(allowed: false, why + " (the prompt it waited for)", requester, access)
                return waiter.refused(.permissionDenied)
            }
            // Decided again: the prompt that ended may have trusted this program.
            let trusted = keeper.trustedPrograms(of: access.account)
            let decision = guardian.decide(requester, access, trusted: trusted, trustVersion: 0, asking: .person)
            guardian.record(decision)
            switch decision.verdict {
            case .allowed: waiter.allowed()
            case .denied: waiter.refused(.permissionDenied)
            case .ask: guardian.ask(requester, access, waiter: waiter, keeper: keeper)
            }
        }
        let waits = !guardian.startPrompt(key, orWait: { end in
            // On a thread of its own (a new prompt may follow); without one, a no.
            if !Threads.detach({ retry(end) }) { waiter.refused(.permissionDenied) }
        })
        if waits {
            waiter.onInterrupt { waiter.refused(.interrupted) }
            return
        }
        let started = Threads.detach { [weak keeper] in
            let dialog = PinentryDialog()
            guardian.dialogStarted(dialog)
            var end = PromptEnd.other
            defer {
                guardian.dialogEnded(dialog)
                guardian.endPrompt(key, end)
            }
            waiter.onInterrupt { dialog.cancel() }
            let text = guardian.promptText(requester, access)
            let answer = dialog.ask(program: guardian.settings.program, terminal: requester.terminal,
                                    environment: guardian.settings.environment, title: text.title,
                                    description: text.description, timeout: guardian.settings.timeout,
                                    alwaysAllowText: guardian.alwaysAllowText(requester, access),
                                    unavailable: guardian.settings.problem)
            guard let keeper else { return waiter.refused(.ioError) }
            switch answer {
            case .allowOnce:
                guardian.allowOnce(requester, access)
                guardian.record(allowed: true, "allowed once at the prompt", requester, access)
                waiter.allowed()
            case .alwaysAllow(let passphrase):
                defer { passphrase.wipe() }
                do throws(Errno) {
                    guard let program = requester.program else { throw .permissionDenied }
                    try keeper.checkPassphrase(passphrase)
                    try keeper.trust(program, account: access.account)
                    guardian.record(allowed: true, "always allowed at the prompt, with the passphrase: now trusted", requester, access)
                    waiter.allowed()
                } catch {
                    let why = error == .permissionDenied ? "a wrong passphrase" : "\(error)"
                    guardian.record(allowed: false, "always allowed at the prompt, refused: \(why)", requester, access)
                    end = .denied("always allowed at the prompt, refused: \(why)")
                    waiter.refused(.permissionDenied)
                }
            case .deny:
                guardian.record(allowed: false, "denied at the prompt", requester, access)
                end = .denied("denied at the prompt")
                waiter.refused(.permissionDenied)
            case .timedOut:
                guardian.record(allowed: false, "no answer within \(Int(guardian.settings.timeout)) s", requester, access)
                end = .denied("no answer within \(Int(guardian.settings.timeout)) s")
                waiter.refused(.permissionDenied)
            case .interrupted:
                guardian.record(allowed: false, "the requester was interrupted while asked", requester, access)
                waiter.refused(.interrupted)
            case .failed(let why):
                guardian.record(allowed: false, "could not ask: \(why)", requester, access)
                waiter.refused(.permissionDenied)
            }
        }
        if !started {
            guardian.endPrompt(key, .other)
            guardian.record(allowed: false, "could not ask: no thread for the prompt", requester, access)
            waiter.refused(.permissionDenied)
        }
    }
}
