#if canImport(Glibc)
import Glibc
#endif
import Posix
import SecureMemory

/// A secret named for a script (SPEC §6): `mtmfs://ACCOUNT/FIELD`, ACCOUNT a UUID,
/// `by-label/LABEL` or `by-server/HOST/USER` (the names of §2a's views, as `ls` shows them),
/// FIELD a field (`password`, `username`, `totp`, …) or `attributes/NAME`.
///
/// It is read through the mount like any file, so guarding decides on the program that
/// asked: `mtmfs` is never the requester, its caller is (`Requester.via`).
///
/// Thread-safety: a value.
package struct SecretReference: Hashable, CustomStringConvertible {
    package static let scheme = "mtmfs://"

    /// The account's path under `accounts/`: `UUID`, `by-label/L` or `by-server/H/U`.
    package let account: String
    /// The field's path under the account: `password`, or `attributes/NAME`.
    package let field: String

    package var description: String { Self.scheme + account + "/" + field }

    package static func isReference(_ text: String) -> Bool { text.hasPrefix(scheme) }

    /// Parses `text`; a malformed reference is a usage error (exit 2) naming it.
    package init(_ text: String) throws(CommandFailure) {
        guard text.hasPrefix(Self.scheme) else { throw Self.malformed(text, "it does not start with mtmfs://") }
        let parts = text.dropFirst(Self.scheme.count).split(separator: "/", omittingEmptySubsequences: false).map(String.init)
        if parts.contains(where: { $0.isEmpty || $0 == "." || $0 == ".." }) {
            throw Self.malformed(text, "an empty, `.` or `..` part")
        }
        let accountParts = switch parts.first {
        case "by-label": 2
        case "by-server": 3
        default: 1
        }
        guard parts.count > accountParts else { throw Self.malformed(text, "no field after the account") }
        let field = parts[accountParts...]
        guard field.count == 1 || (field.count == 2 && field.first == "attributes") else {
            throw Self.malformed(text, "a field is one name, or attributes/NAME")
        }
        if accountParts == 1 && ASCIIHex.uuid(parts[0]) == nil {
            throw Self.malformed(text, "the account is a UUID, by-label/LABEL or by-server/HOST/USER")
        }
        account = parts[..<accountParts].joined(separator: "/")
        self.field = field.joined(separator: "/")
    }

    private static func malformed(_ text: String, _ why: String) -> CommandFailure {
        // (A reference names an account and a field, never a value: it may be shown.)
        CommandFailure("\(Terminal.printable(text)) is not a secret reference (\(why)); "
                       + "write mtmfs://ACCOUNT/FIELD, ACCOUNT a UUID, by-label/LABEL or by-server/HOST/USER",
                       exitCode: ExitCode.usage)
    }

    /// The secret, read from `mountPoint` into secure memory, without the one newline a
    /// field's file ends with. Failures carry the exit codes of `mtmfs(1)`: no such account
    /// or field (3), a view name several accounts share (4), locked (5), refused by
    /// guarding (7). Nothing of a value is ever in a message.
    package func read(from mountPoint: String) throws(CommandFailure) -> SecureBytes {
        let accounts = mountPoint + "/accounts/"
        try checkUnambiguous(accounts)
        guard let value = try Self.readFile(accounts + account + "/" + field, mountPoint: mountPoint, naming: description) else {
            throw CommandFailure("no \(Terminal.printable(description)): no such account or field in \(mountPoint)",
                                 exitCode: ExitCode.noMatch)
        }
        return value
    }

    /// A field's text read into secure memory, without its one trailing newline; nil when
    /// there is no such file. `naming` says what it is in a message (never its value).
    package static func readFile(_ path: String, mountPoint: String, naming: String) throws(CommandFailure) -> SecureBytes? {
        let fd: Int32
        do {
            fd = try Syscall.open(path, O_RDONLY)
        } catch {
            if error == .noSuchFileOrDirectory || error == .notDirectory { return nil }
            throw failure(error, naming: naming, mountPoint: mountPoint)
        }
        defer { Syscall.close(fd) }
        do throws(Errno) {
            let value = try readAll(fd)
            if value.count > 0, value.withUnsafeBytes({ $0[value.count - 1] }) == 0x0A { try value.resize(to: value.count - 1) }
            return value
        } catch {
            throw failure(error, naming: naming, mountPoint: mountPoint)
        }
    }

    /// A view name is one account's only when no other account's name in that directory is
    /// it with a `~` suffix (§2a: the first account of a value has the name alone).
    private func checkUnambiguous(_ accounts: String) throws(CommandFailure) {
        guard account.hasPrefix("by-"), !account.contains("~"), let slash = account.lastIndex(of: "/") else { return }
        let directory = String(account[..<slash]), name = String(account[account.index(after: slash)...])
        guard let names = try? Syscall.listDirectory(accounts + directory) else { return }
        let others = names.filter { $0.hasPrefix(name + "~") }
        guard others.isEmpty else {
            throw CommandFailure("\(others.count + 1) accounts are \(Terminal.printable(account)): name one "
                                 + "(\(Terminal.printable(directory + "/" + others[0])), or its UUID)",
                                 exitCode: ExitCode.ambiguous)
        }
    }

    /// Everything `fd` reads to its end, in secure memory.
    package static func readAll(_ fd: Int32) throws(Errno) -> SecureBytes {
        let value = SecureBytes()
        var capacity = 256, count = 0
        do throws(Errno) {
            while true {
                if value.count < capacity { try value.resize(to: capacity) }
                let read = try value.withUnsafeMutableBytes { (buffer) throws(Errno) -> Int in
                    try Syscall.read(fd, into: UnsafeMutableRawBufferPointer(rebasing: buffer[count...]))
                }
                if read == 0 { break }
                count += read
                if count == capacity { capacity *= 2 }
            }
            try value.resize(to: count)
        } catch {
            value.wipe()
            throw error
        }
        return value
    }

    private static func failure(_ error: Errno, naming: String, mountPoint: String) -> CommandFailure {
        switch error {
        case .permissionDenied:
            if StatusFile.read(mountPoint: mountPoint)["state"] == "locked" {
                return CommandFailure("the accounts of \(mountPoint) are locked: run `mtmfs unlock \(mountPoint)`",
                                      exitCode: ExitCode.locked)
            }
            return CommandFailure("guarding refused \(Terminal.printable(naming)) to this program "
                                  + "(see \(mountPoint)/.mtmfs/access; `mtmfs trust` trusts a program)", exitCode: ExitCode.refused)
        default:
            return CommandFailure("cannot read \(Terminal.printable(naming)) from \(mountPoint): \(error)")
        }
    }
}

/// The secrets of a command's references, each read once (a reference used twice is one
/// read, one prompt), from the mount found at the first one (no reference: no mount needed).
///
/// Thread-safety: none of its own; one thread.
package struct SecretReader {
    package let given: String?
    private var mountPoint: String?
    private(set) var read: [SecretReference: SecureBytes] = [:]
    /// The distinct values, in the order first read.
    private(set) var values: [SecureBytes] = []

    package init(mount given: String?) { self.given = given }

    package mutating func secret(_ reference: SecretReference) throws(CommandFailure) -> SecureBytes {
        if let known = read[reference] { return known }
        if mountPoint == nil { mountPoint = try MountChoice.resolve(given) }
        let secret = try reference.read(from: mountPoint!)
        read[reference] = secret
        values.append(secret)
        return secret
    }

    package func wipe() { values.forEach { $0.wipe() } }
}
