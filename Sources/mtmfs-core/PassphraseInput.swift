#if canImport(Glibc)
import Glibc
#endif
import CredentialVault
import ScriptCommands
import SecureMemory
import Posix

/// Reads a passphrase into secure memory: from a file's first line, else without echo
/// from the terminal, else one line from standard input. Never from the command line or
/// the environment, and never through a Swift String.
enum PassphraseInput {
    static func read(prompt: String, file: String?, echo: Bool = false) throws(CommandFailure) -> SecureBytes {
        let passphrase: SecureBytes
        if let file {
            let fd: Int32
            do {
                fd = try Syscall.open(file, O_RDONLY)
            } catch {
                throw CommandFailure("cannot read the passphrase file \(file): \(error)")
            }
            defer { Syscall.close(fd) }
            passphrase = try readLine(fd)
        } else if isatty(0) == 1 && echo {
            Terminal.error(prompt, newline: false)
            passphrase = try readLine(0)
        } else if isatty(0) == 1 {
            Terminal.error(prompt, newline: false)
            var saved = termios()
            tcgetattr(0, &saved)
            var silent = saved
            silent.c_lflag &= ~tcflag_t(ECHO)
            tcsetattr(0, TCSAFLUSH, &silent)
            passphrase = try readLine(0)
            tcsetattr(0, TCSAFLUSH, &saved)
            Terminal.error("")
        } else {
            passphrase = try readLine(0)
        }
        guard passphrase.count > 0 else {
            passphrase.wipe()
            throw CommandFailure("no passphrase given: type one, pipe one line, or use --passphrase-file")
        }
        return passphrase
    }

    /// A new passphrase: asked twice on a terminal.
    static func readNew(file: String?) throws(CommandFailure) -> SecureBytes {
        let first = try read(prompt: "New passphrase: ", file: file)
        guard file == nil, isatty(0) == 1 else { return first }
        let second = try read(prompt: "Repeat the passphrase: ", file: nil)
        defer { second.wipe() }
        guard first.equals(second) else {
            first.wipe()
            throw CommandFailure("the two passphrases differ; nothing was changed")
        }
        return first
    }

    /// Bytes up to a newline (not included) or end of file, one byte at a time so that
    /// nothing past the line is consumed.
    private static func readLine(_ fd: Int32) throws(CommandFailure) -> SecureBytes {
        let out = SecureBytes()
        var byte: UInt8 = 0
        defer { byte = 0 }
        do throws(Errno) {
            while true {
                let n = Glibc.read(fd, &byte, 1)
                if n < 0 && errno == EINTR { continue }
                if n <= 0 { break }
                try withUnsafeBytes(of: byte) { (raw) throws(Errno) in try out.append(raw) }
                if byte == 0x0A { break }
            }
            try out.resize(to: out.withUnsafeBytes { OneNewline.valueEnd($0) })  // the line's value
        } catch {
            out.wipe()
            throw CommandFailure("no secure memory for the passphrase: \(error)")
        }
        return out
    }

    /// Writes a passphrase to a mount's `.mtmfs/unlock` (a recovery key or login password:
    /// `.mtmfs/unlock-with`, after the slot kind's line); maps the answer to a message.
    static func unlock(mountPoint: String, with passphrase: SecureBytes, kind: SlotKind = .passphrase) throws(CommandFailure) {
        var request = passphrase
        if kind != .passphrase {
            do throws(Errno) {
                request = try SecureBytes(copying: Array((kind.name + "\n").utf8))
                try passphrase.withUnsafeBytes { (raw) throws(Errno) in try request.append(raw) }
            } catch {
                request.wipe()
                throw CommandFailure("no secure memory for the \(kind == .recovery ? "recovery key" : "password"): \(error)")
            }
        }
        defer { if kind != .passphrase { request.wipe() } }
        switch try ControlFile.write(mountPoint, kind == .passphrase ? "unlock" : "unlock-with", request) {
        case nil: return
        case .permissionDenied?:
            // Another unlock may have come first meanwhile: say what the accounts are now.
            let state = StatusFile.read(mountPoint: mountPoint)["state"] == "unlocked" ? "unlocked" : "locked"
            let what = switch kind {
            case .passphrase: "wrong passphrase"
            case .recovery: "that recovery key does not open this vault (a newer one replaced it?)"
            case .login: "the login password does not open this vault (no login slot, or another password)"
            }
            throw CommandFailure("\(what); the accounts stay \(state)")
        case .ioError?: throw CommandFailure("the vault is damaged: see `mtmfs status \(mountPoint)` and the log")
        case let error?: throw CommandFailure("unlock failed: \(error)")
        }
    }
}

/// A mount's control file written in one write from secure memory (a passphrase, or a
/// command with its passphrase): nil when taken, else the errno the daemon answered.
enum ControlFile {
    static func write(_ mountPoint: String, _ name: String, _ bytes: SecureBytes) throws(CommandFailure) -> Errno? {
        let path = mountPoint + "/.mtmfs/" + name
        let fd: Int32
        do {
            fd = try Syscall.open(path, O_WRONLY)
        } catch {
            throw CommandFailure("cannot open \(path): \(error)" + (error == .noSuchFileOrDirectory ? " (a daemon of an older mtmfs? remount it)" : ""))
        }
        defer { Syscall.close(fd) }
        return bytes.withUnsafeBytes { raw -> Errno? in
            do throws(Errno) { try Syscall.writeAll(fd, raw); return nil } catch { return error }
        }
    }
}
