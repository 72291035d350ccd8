#if canImport(Glibc)
import Glibc
#endif
import Posix
import Synchronization

/// What a person answered to "may this program read this account's password?".
enum PinentryAnswer: Equatable, Sendable {
    /// OK: this run of the program, this once.
    case allowOnce
    /// NOT OK (the third button): add the program to the account's trusted list.
    case alwaysAllow
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
/// OK answers `OK`; NOT OK answers `ERR …114` (not confirmed); Cancel `ERR …99`.
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
             timeout: Double) -> PinentryAnswer {
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
        let answer = conversation.run(title: title, description: description, timeout: timeout)
        if answer == .allowOnce || answer == .alwaysAllow || answer == .deny {
            conversation.send("BYE")
        }
        Syscall.close(input.write)
        Syscall.close(output.read)
        // Ended by us (cancel, timeout) or by itself: its whole group goes — asked first, so
        // that a curses pinentry puts the terminal back — then it is reaped.
        if answer != .allowOnce && answer != .alwaysAllow && answer != .deny {
            kill(-pid, SIGTERM)
            if Spawn.wait(pid, timeout: 0.5) >= 0 { kill(-pid, SIGKILL) }
            return answer
        }
        Spawn.wait(pid, timeout: 2)
        return answer
    }

    /// The exchange of lines with one pinentry.
    ///
    /// Thread-safety: local to `ask`.
    private struct Conversation {
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

        mutating func run(title: String, description: String, timeout: Double) -> PinentryAnswer {
            // The greeting, then the settings (each answered OK), then the question.
            guard case .line(let greeting) = readLine() else { return failure(readLine: nil) }
            guard greeting.hasPrefix("OK") else { return .failed("the pinentry greeted with: \(greeting)") }
            let settings = [
                "SETTIMEOUT \(Int(timeout))",
                "SETTITLE " + Self.escape(title),
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
            switch exchange("CONFIRM") {
            case .success: return .allowOnce
            case .failure(let failure): return failure.answer
            }
        }

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
                    case PinentryDialog.notConfirmed: return .failure(Failure(.alwaysAllow))
                    case PinentryDialog.canceled: return .failure(Failure(.deny))
                    case PinentryDialog.timeout: return .failure(Failure(.timedOut))
                    default:
                        // An old pinentry without a setting is still asked; a failed question is not an answer.
                        if command != "CONFIRM" && !command.hasPrefix("SETTITLE") && !command.hasPrefix("SETDESC") { return .success(()) }
                        return .failure(Failure(.failed("the pinentry answered \(line)")))
                    }
                }
                if line.hasPrefix("INQUIRE") { _ = send("CAN") }
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
