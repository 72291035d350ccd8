#if canImport(Glibc)
import Glibc
#endif
import CredentialVault
import SecureMemory
import Posix
import Synchronization

/// What a person answered to "may this program read this account's password?".
enum PinentryAnswer: Sendable {
    /// OK: this run of the program, this once.
    case allowOnce
    /// NOT OK (the third button), confirmed with the passphrase typed into the pinentry
    /// (in secure memory; the caller checks and wipes it): add the program to the
    /// account's trusted list.
    case alwaysAllow(SecureBytes)
    /// Cancel.
    case deny
    /// No answer within the time allowed.
    case timedOut
    /// The requester was interrupted (Ctrl-C) while the prompt was up.
    case interrupted
    /// The prompt could not be shown; why.
    case failed(String)
}

/// One confirmation dialog through a pinentry program, in the protocol of GnuPG's
/// pinentry (Assuan): `SETTITLE`, `SETDESC`, `SETOK`, `SETNOTOK`, `SETCANCEL`, `CONFIRM`.
/// OK answers `OK`; NOT OK answers `ERR …114` (not confirmed); Cancel `ERR …99`; a window
/// closed says `S BUTTON_INFO close` first (a no). NOT OK is then confirmed by the vault's
/// passphrase (`GETPIN`, answered in `D` lines, read into secure memory only).
///
/// `cancel()` (from any thread: the requester's interrupt) ends the dialog at once: the
/// pinentry's process group is killed.
///
/// Thread-safety: `ask` runs on one thread; `cancel` may come from any other.
final class PinentryDialog: Sendable {
    private let cancelled = Atomic<Bool>(false)
    private let wakeup = Wakeup()

    func cancel() {
        cancelled.store(true, ordering: .releasing)
        wakeup.wake()
    }

    /// Error codes of libgpg-error (the low 16 bits of an `ERR` line).
    private static let notConfirmed = 114
    private static let canceled = 99
    private static let timeout = 62

    /// Shows the dialog and waits for the answer, at most `timeout` seconds.
    func ask(program: String, terminal: String?, environment: [String], title: String, description: String,
             timeout: Double, alwaysAllowText: String, unavailable: String? = nil) -> PinentryAnswer {
        let shown = { (text: String) in PromptSettings.displayable(text, in: environment) }
        return converse(program: program, terminal: terminal, environment: environment, timeout: timeout, unavailable: unavailable) { c in
            let answer = c.run(title: shown(title), description: shown(description), timeout: timeout)
            if case .alwaysAllow = answer { return c.passphrase(shown(alwaysAllowText)) }
            return answer
        }
    }

    /// Asks for the vault's passphrase only (an unlock on the Secret Service): `.alwaysAllow`
    /// with what was typed (in secure memory), `.deny` for a cancel. `error` is shown above
    /// the question (a wrong passphrase before).
    func askPassphrase(program: String, terminal: String?, environment: [String], title: String, description: String,
                       error: String?, timeout: Double, unavailable: String? = nil) -> PinentryAnswer {
        let shown = { (text: String) in PromptSettings.displayable(text, in: environment) }
        return converse(program: program, terminal: terminal, environment: environment, timeout: timeout, unavailable: unavailable) { c in
            if case .failure(let failure) = c.greet(title: shown(title), timeout: timeout) { return failure.answer }
            if let error, case .failure(let failure) = c.exchange("SETERROR " + Conversation.escape(shown(error))) { return failure.answer }
            return c.passphrase(shown(description), ok: "_Unlock", cancel: "_Cancel")
        }
    }

    /// Runs the pinentry, talks to it (`talk`), and ends it: asked to go when answered,
    /// its process group killed otherwise.
    private func converse(program: String, terminal: String?, environment: [String], timeout: Double, unavailable: String?,
                          _ talk: (inout Conversation) -> PinentryAnswer) -> PinentryAnswer {
        guard !program.isEmpty else { return .failed(unavailable ?? "no pinentry program") }
        let deadline = ContinuousClock.now.advanced(by: .milliseconds(Int64(timeout * 1000)))
        let input: (read: Int32, write: Int32), output: (read: Int32, write: Int32)
        do {
            input = try Syscall.pipe()
            do { output = try Syscall.pipe() } catch {
                Syscall.close(input.read)
                Syscall.close(input.write)
                throw error
            }
        } catch {
            return .failed("no pipe for the pinentry: \(error)")
        }
        var arguments: [String] = []
        if let terminal {
            arguments += ["--ttyname", terminal,
                          "--ttytype", environment.first { $0.hasPrefix("TERM=") }.map { String($0.dropFirst(5)) } ?? "xterm-256color"]
        }
        let pid: pid_t
        do {
            pid = try Spawn.start(program, arguments, stdin: .descriptor(input.read), stdout: .descriptor(output.write),
                                  stderr: .null, environment: environment, ownProcessGroup: true)
        } catch {
            for fd in [input.read, input.write, output.read, output.write] { Syscall.close(fd) }
            return .failed(error == .noSuchFileOrDirectory ? "no pinentry program \(program) (mtmfs mount --pinentry PROGRAM)"
                                                           : "cannot run \(program): \(error)")
        }
        Syscall.close(input.read)
        Syscall.close(output.write)
        // A pinentry that stops reading must not block a write: the pipe is non-blocking.
        _ = fcntl(input.write, F_SETFL, fcntl(input.write, F_GETFL) | O_NONBLOCK)
        var conversation = Conversation(input: input.write, output: output.read, deadline: deadline, dialog: self)
        let answer = talk(&conversation)
        let answered: Bool
        switch answer {
        case .allowOnce, .alwaysAllow, .deny: answered = true
        default: answered = false
        }
        if answered { conversation.send("BYE") }
        Syscall.close(input.write)
        Syscall.close(output.read)
        // Ended by us (cancel, timeout) or by itself: its whole group goes — asked first, so
        // that a curses pinentry puts the terminal back — before it is reaped.
        if !answered {
            kill(-pid, SIGTERM)
            usleep(100_000)
            kill(-pid, SIGKILL)
        }
        Spawn.wait(pid, timeout: 2)
        return answer
    }

    /// The exchange of lines with one pinentry.
    ///
    /// Thread-safety: local to `ask`.
    fileprivate struct Conversation {
        let input: Int32
        let output: Int32
        let deadline: ContinuousClock.Instant
        let dialog: PinentryDialog
        var pending: [UInt8] = []

        init(input: Int32, output: Int32, deadline: ContinuousClock.Instant, dialog: PinentryDialog) {
            self.input = input
            self.output = output
            self.deadline = deadline
            self.dialog = dialog
        }

        /// The greeting, then the time allowed and the title (each answered OK).
        mutating func greet(title: String, timeout: Double) -> Result<Void, Failure> {
            guard case .line(let greeting) = readLine() else { return .failure(Failure(failure(readLine: nil))) }
            guard greeting.hasPrefix("OK") else { return .failure(Failure(.failed("the pinentry greeted with: \(greeting)"))) }
            for command in ["SETTIMEOUT \(Int(timeout))", "SETTITLE " + Self.escape(title)] {
                if case .failure(let failure) = exchange(command) { return .failure(failure) }
            }
            return .success(())
        }

        mutating func run(title: String, description: String, timeout: Double) -> PinentryAnswer {
            // The greeting, then the settings (each answered OK), then the question.
            if case .failure(let failure) = greet(title: title, timeout: timeout) { return failure.answer }
            let settings = [
                "SETDESC " + Self.escape(description),
                "SETOK " + Self.escape("Allow _once"),
                "SETNOTOK " + Self.escape("_Always allow"),
                "SETCANCEL " + Self.escape("_Deny"),
            ]
            for command in settings {
                switch exchange(command) {
                case .success: continue
                case .failure(let failure): return failure.answer
                }
            }
            closed = false
            switch exchange("CONFIRM") {
            case .success: return .allowOnce
            case .failure(let failure):
                // A window closed is a no, whatever code follows it.
                if closed { return .deny }
                return failure.answer
            }
        }

        /// A window closed by the person (`S BUTTON_INFO close`) during CONFIRM.
        var closed = false

        /// After NOT OK: the vault's passphrase, typed into the pinentry. Its `D` lines are
        /// read into secure memory and decoded there; a cancel is a no.
        mutating func passphrase(_ description: String, ok: String = "_Always allow", cancel: String = "_Deny") -> PinentryAnswer {
            for command in ["SETDESC " + Self.escape(description), "SETPROMPT " + Self.escape("Passphrase:"),
                            "SETOK " + Self.escape(ok), "SETCANCEL " + Self.escape(cancel)] {
                if case .failure(let failure) = exchange(command) { return failure.answer }
            }
            guard pending.isEmpty, send("GETPIN") else { return .failed("the pinentry stopped reading") }
            let secret = SecureBytes()
            // Room for the longest line at once: the appends below never allocate.
            guard let raw = try? SecureBytes(count: 4097) else { return .failed("no secure memory for the answer") }
            defer { raw.wipe() }
            while true {
                // Lines are read byte by byte into secure memory: a passphrase is never in
                // an ordinary buffer.
                try? raw.resize(to: 0)  // (a shrink never allocates)
                var byte: UInt8 = 0
                while true {
                    if dialog.cancelled.load(ordering: .acquiring) { secret.wipe(); return .interrupted }
                    if ContinuousClock.now >= deadline { secret.wipe(); return .timedOut }
                    let ready = dialog.wakeup.wait(until: deadline, watching: [output])
                    guard ready.contains(output) else { continue }
                    let n = Glibc.read(output, &byte, 1)
                    if n < 0 && (errno == EINTR || errno == EAGAIN) { continue }
                    if n <= 0 { secret.wipe(); return .failed("the pinentry ended without an answer") }
                    if byte == 0x0A { break }
                    guard (withUnsafeBytes(of: byte) { try? raw.append($0) }) != nil else {
                        secret.wipe()
                        return .failed("no secure memory for the answer")
                    }
                    if raw.count > 4096 { secret.wipe(); return .failed("the pinentry sent a line too long") }
                }
                byte = 0
                let kind: UInt8 = raw.withUnsafeBytes { $0.first ?? 0 }
                let second: UInt8 = raw.withUnsafeBytes { $0.count > 1 ? $0[1] : 0 }
                if kind == UInt8(ascii: "D") && second == UInt8(ascii: " ") {
                    guard (raw.withUnsafeBytes { try? Self.percentDecode(UnsafeRawBufferPointer(rebasing: $0[2...]), into: secret) }) != nil else {
                        secret.wipe()
                        return .failed("no secure memory for the answer")
                    }
                    continue
                }
                let line = raw.withUnsafeBytes { String(decoding: $0.prefix(3), as: UTF8.self) }
                if line.hasPrefix("OK") {
                    guard secret.count > 0 else { secret.wipe(); return .deny }
                    return .alwaysAllow(secret)
                }
                if line.hasPrefix("ERR") { secret.wipe(); return .deny }
                // "S …", "# …": read on.
            }
        }

        /// Assuan's %XX decoding, straight into secure memory.
        static func percentDecode(_ bytes: UnsafeRawBufferPointer, into out: SecureBytes) throws(Errno) {
            var index = 0
            var one: UInt8 = 0
            while index < bytes.count {
                one = bytes[index]
                if one == UInt8(ascii: "%"), index + 2 < bytes.count,
                   let high = hex(bytes[index + 1]), let low = hex(bytes[index + 2]) {
                    one = high << 4 | low
                    index += 3
                } else {
                    index += 1
                }
                try withUnsafeBytes(of: one) { (raw) throws(Errno) in try out.append(raw) }
            }
            one = 0
        }

        static func hex(_ c: UInt8) -> UInt8? { ASCIIHex.value(c) }

        enum Outcome { case line(String), timedOut, interrupted, ended }

        /// Sends one command; its OK, or what its ERR (or the pinentry's end) means.
        mutating func exchange(_ command: String) -> Result<Void, Failure> {
            guard send(command) else { return .failure(Failure(.failed("the pinentry stopped reading"))) }
            while true {
                let outcome = readLine()
                guard case .line(let line) = outcome else { return .failure(Failure(failure(readLine: outcome))) }
                if line.hasPrefix("OK") { return .success(()) }
                if line.hasPrefix("ERR") {
                    let code = line.split(separator: " ").dropFirst().first.flatMap { Int($0) } ?? 0
                    switch code & 0xFFFF {
                    case PinentryDialog.notConfirmed: return .failure(Failure(.alwaysAllow(SecureBytes())))
                    case PinentryDialog.canceled: return .failure(Failure(.deny))
                    case PinentryDialog.timeout: return .failure(Failure(.timedOut))
                    default:
                        // An old pinentry without a setting is still asked; a failed question is not an answer.
                        if command != "CONFIRM" && !command.hasPrefix("SETTITLE") && !command.hasPrefix("SETDESC") { return .success(()) }
                        return .failure(Failure(.failed("the pinentry answered \(line)")))
                    }
                }
                if line.hasPrefix("INQUIRE") { _ = send("CAN") }
                if line.hasPrefix("S BUTTON_INFO close") { closed = true }
                // "S …" status lines and "# …" comments: read on.
            }
        }

        /// Wraps an answer that ends the conversation (Result needs an Error).
        struct Failure: Error {
            let answer: PinentryAnswer
            init(_ answer: PinentryAnswer) { self.answer = answer }
        }

        func failure(readLine outcome: Outcome?) -> PinentryAnswer {
            switch outcome {
            case .timedOut?: .timedOut
            case .interrupted?: .interrupted
            default: .failed("the pinentry ended without an answer")
            }
        }

        @discardableResult
        func send(_ line: String) -> Bool {
            (try? Syscall.writeAll(input, Array((line + "\n").utf8))) != nil
        }

        /// The next line, waiting until the deadline or a cancel.
        mutating func readLine() -> Outcome {
            while true {
                if let newline = pending.firstIndex(of: 0x0A) {
                    let line = String(decoding: pending[..<newline], as: UTF8.self)
                    pending.removeSubrange(...newline)
                    return .line(line)
                }
                if dialog.cancelled.load(ordering: .acquiring) { return .interrupted }
                if ContinuousClock.now >= deadline { return .timedOut }
                let ready = dialog.wakeup.wait(until: deadline, watching: [output])
                if dialog.cancelled.load(ordering: .acquiring) { return .interrupted }
                guard ready.contains(output) else { continue }
                var buffer = [UInt8](repeating: 0, count: 1024)
                let n = Glibc.read(output, &buffer, buffer.count)
                if n < 0 && (errno == EINTR || errno == EAGAIN) { continue }
                if n <= 0 { return .ended }
                pending += buffer[0..<n]
                if pending.count > 65_536 { return .ended }
            }
        }

        /// Assuan's escaping of an argument: %, CR and LF as %XX.
        static func escape(_ text: String) -> String {
            var out = ""
            for scalar in text.unicodeScalars {
                switch scalar {
                case "%": out += "%25"
                case "\n": out += "%0A"
                case "\r": out += "%0D"
                default: out.unicodeScalars.append(scalar)
                }
            }
            return out
        }
    }
}
