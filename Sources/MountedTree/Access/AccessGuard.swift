#if canImport(Glibc)
import Glibc
#endif
import CredentialVault
import FuseLowLevel
import Posix
import Synchronization

/// How a guarded mount asks people: which pinentry, on which display.
///
/// Thread-safety: a value.
public struct PromptSettings: Sendable {
    /// The pinentry program (a name looked up in PATH, or a path).
    public var program: String
    /// The environment the pinentry gets: the daemon's display and locale, never anything else.
    public var environment: [String]
    /// Seconds a prompt waits for an answer.
    public var timeout: Double
    /// The mount point, for the "how to trust it" hints.
    public var mountPoint: String

    public init(program: String = "pinentry", environment: [String], timeout: Double = 60, mountPoint: String) {
        self.program = program
        self.environment = environment
        self.timeout = timeout
        self.mountPoint = mountPoint
    }

    /// The variables a pinentry needs, taken from `environment` (the daemon's own).
    public static func pinentryEnvironment(from environment: [String]) -> [String] {
        let kept: Set<String> = ["PATH", "HOME", "LANG", "LC_ALL", "LC_CTYPE", "LC_MESSAGES", "TERM", "DISPLAY",
                                 "WAYLAND_DISPLAY", "XAUTHORITY", "XDG_RUNTIME_DIR", "DBUS_SESSION_BUS_ADDRESS"]
        var out = environment.filter { entry in kept.contains(String(entry.prefix { $0 != "=" })) }
        if !out.contains(where: { $0.hasPrefix("PATH=") }) { out.append("PATH=/usr/local/bin:/usr/bin:/bin") }
        return out
    }

    /// Whether a desktop is there to show a prompt on.
    var hasDisplay: Bool {
        environment.contains { ($0.hasPrefix("DISPLAY=") && $0.count > 8) || ($0.hasPrefix("WAYLAND_DISPLAY=") && $0.count > 16) }
    }
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
    /// The prompts up, by (program, account), each with the requests waiting for its end.
    private let prompts = Locked<[PromptKey: [@Sendable () -> Void]]>([:])
    static let kept = 200

    struct Grant: Hashable { let run: ProcessRun; let account: [UInt8] }
    struct PromptKey: Hashable { let sha256: [UInt8]; let account: [UInt8] }

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
    }

    enum Verdict: Equatable { case allowed(String), denied(String), ask }

    /// The decision that needs no person: refused outright, trusted, allowed once for
    /// this run, or a question to ask.
    func verdict(_ requester: Requester, _ access: Access, trusted: [TrustedProgram]) -> Verdict {
        if let refusal = requester.refusal { return .denied(refusal) }
        guard let program = requester.program else { return .denied("its program is unknown") }
        if trusted.contains(where: { $0.sha256 == program.sha256 }) { return .allowed("trusted") }
        let grant = Grant(run: requester.run, account: access.account)
        let granted = grants.withLock { grants -> Bool in
            guard grants.contains(grant) else { return false }
            return true
        }
        if granted {
            if grant.run.isRunning { return .allowed("allowed once for this run") }
            _ = grants.withLock { $0.remove(grant) }
        }
        return .ask
    }

    /// "Allow once": this run of the program may use the account until it ends.
    func allowOnce(_ requester: Requester, account: [UInt8]) {
        grants.withLock { grants in
            // Runs that ended go (a pid may come back as another run).
            if grants.count > 64 { grants = grants.filter { $0.run.isRunning } }
            grants.insert(Grant(run: requester.run, account: account))
        }
    }

    /// Whether a prompt could be shown to this requester at all.
    func cannotAsk(_ requester: Requester) -> String? {
        if requester.terminal == nil && !settings.hasDisplay {
            return "not trusted, and there is no terminal or display to ask on"
        }
        return nil
    }

    /// One prompt at a time per program and account: true when this one may ask now;
    /// otherwise `retry` runs when the prompt up ends.
    func startPrompt(_ key: PromptKey, orWait retry: @escaping @Sendable () -> Void) -> Bool {
        prompts.withLock { prompts in
            if prompts[key] != nil {
                prompts[key]!.append(retry)
                return false
            }
            prompts[key] = []
            return true
        }
    }

    /// The prompt of `key` ended: the requests that waited for it are decided again.
    func endPrompt(_ key: PromptKey) {
        let waiting = prompts.withLock { $0.removeValue(forKey: key) ?? [] }
        for retry in waiting { retry() }
    }

    /// The question put to the person.
    func promptText(_ requester: Requester, _ access: Access) -> (title: String, description: String) {
        let program = requester.program.map { "\($0.path) (SHA-256 \(String($0.hexDigest.prefix(16)))…)" } ?? requester.path
        var lines = ["\(program), pid \(requester.process),",
                     "wants to \(access.writing ? "change" : "read") the \(access.what) of the account",
                     access.label.isEmpty ? access.accountName : "\(access.label) (\(access.accountName))."]
        if !requester.chain.isEmpty { lines.append("Run by: " + requester.chain.joined(separator: " ← ")) }
        if let path = requester.program?.path, RequesterInspector.isInterpreter(path) {
            lines.append("\(path) is an interpreter: trusting it trusts every script it runs.")
        }
        lines.append("")
        lines.append("Allow once: this run only. Always allow: add it to the account's trusted programs.")
        return ("mtmfs: a program asks for a secret", lines.joined(separator: "\n"))
    }

    // MARK: The record

    /// Records a decision (`.mtmfs/access` and the log): time, verdict and why, account,
    /// field, pid, program, and what ran it (up to a session leader). Never a value.
    func record(allowed: Bool, _ why: String, _ requester: Requester, _ access: Access) {
        let time = ISO8601.text(unixSeconds: Double(Timestamp.now().seconds))
        var line = "\(time) \(allowed ? "allowed" : "denied") (\(why)) account=\(access.accountName) field=\(access.what)"
        line += " pid=\(requester.process) program=\(requester.path)"
        if let program = requester.program { line += " sha256=\(program.hexDigest)" }
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
