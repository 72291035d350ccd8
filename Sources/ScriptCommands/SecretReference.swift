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
    package func read(from mountPoint: String, in arena: SecureArena? = nil) throws(CommandFailure) -> SecureBytes {
        let accounts = mountPoint + "/accounts/"
        let directory = account.hasPrefix("by-") ? try followView(accounts, mountPoint: mountPoint) : account
        guard let value = try Self.readFile(accounts + directory + "/" + field, mountPoint: mountPoint,
                                            naming: description, arena: arena) else {
            throw notFound(in: mountPoint)
        }
        return value
    }

    /// The UUID a view's name stands for, found by the requests `cat` makes of it (the
    /// lookups of the path, the link's target). A name without a `~` suffix is one
    /// account's only when the link's count, which the lookup gave the kernel, is 1: the
    /// accounts that share its value (§2a: the first has the name alone, every later one
    /// a `~` suffix).
    private func followView(_ accounts: String, mountPoint: String) throws(CommandFailure) -> String {
        let link: Int32
        do {
            link = try Syscall.openPath(accounts + account, noFollow: true)
        } catch {
            if error == .noSuchFileOrDirectory || error == .notDirectory { throw notFound(in: mountPoint) }
            throw Self.failure(error, naming: description, mountPoint: mountPoint)
        }
        defer { Syscall.close(link) }
        guard let (count, type) = try? Syscall.cachedLinkCount(link), type == S_IFLNK else { return account }
        if count > 1 && !account.contains("~") { throw ambiguous(accounts, count: count) }
        // `../UUID` (by-label) or `../../UUID` (by-server); anything else is walked as named.
        guard let target = try? Syscall.linkTarget(link), let uuid = target.split(separator: "/").last,
              target.split(separator: "/").dropLast().allSatisfy({ $0 == ".." }), ASCIIHex.uuid(String(uuid)) != nil
        else { return account }
        return String(uuid)
    }

    /// A view name several accounts share: the failure names another's (`ls` shows them all).
    private func ambiguous(_ accounts: String, count: UInt32) -> CommandFailure {
        // (A view name always has its directory before its last `/`.)
        let slash = account.lastIndex(of: "/") ?? account.startIndex
        let listed = String(account[..<slash]), name = String(account[slash...].dropFirst())
        let other = ((try? Syscall.listDirectory(accounts + listed)) ?? []).first { $0.hasPrefix(name + "~") }
        let names = other.map { Terminal.printable(listed + "/" + $0) } ?? "\(Terminal.printable(account))~… (ls \(listed))"
        return CommandFailure("\(count) accounts are \(Terminal.printable(account)): name one (\(names), or its UUID)",
                              exitCode: ExitCode.ambiguous)
    }

    /// No such account or field — or none while locked (the views are empty then).
    private func notFound(in mountPoint: String) -> CommandFailure {
        if StatusFile.read(mountPoint: mountPoint)["state"] == "locked" { return Self.locked(mountPoint) }
        return CommandFailure("no \(Terminal.printable(description)): no such account or field in \(mountPoint)",
                              exitCode: ExitCode.noMatch)
    }

    /// A field's text read into secure memory, without its one trailing newline; nil when
    /// there is no such file. `naming` says what it is in a message (never its value);
    /// `arena`, where it is kept.
    package static func readFile(_ path: String, mountPoint: String, naming: String,
                                 arena: SecureArena? = nil) throws(CommandFailure) -> SecureBytes? {
        let fd: Int32
        do {
            fd = try Syscall.open(path, O_RDONLY)
        } catch {
            if error == .noSuchFileOrDirectory || error == .notDirectory { return nil }
            throw failure(error, naming: naming, mountPoint: mountPoint)
        }
        defer { Syscall.close(fd) }
        do throws(Errno) {
            let value = try readAll(fd, in: arena)
            if value.count > 0, value.withUnsafeBytes({ $0[value.count - 1] }) == 0x0A { try value.resize(to: value.count - 1) }
            return value
        } catch {
            throw failure(error, naming: naming, mountPoint: mountPoint)
        }
    }

    /// Everything `fd` reads to its end, in secure memory (a slot of `arena` while it fits).
    package static func readAll(_ fd: Int32, in arena: SecureArena? = nil) throws(Errno) -> SecureBytes {
        var capacity = 256, count = 0
        let value: SecureBytes
        if let arena { value = try SecureBytes.allocate(count: capacity, in: arena) } else { value = SecureBytes() }
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

    private static func locked(_ mountPoint: String) -> CommandFailure {
        CommandFailure("the accounts of \(mountPoint) are locked: run `mtmfs unlock \(mountPoint)`", exitCode: ExitCode.locked)
    }

    private static func failure(_ error: Errno, naming: String, mountPoint: String) -> CommandFailure {
        switch error {
        case .permissionDenied:
            if StatusFile.read(mountPoint: mountPoint)["state"] == "locked" { return locked(mountPoint) }
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
    /// Where the secrets are kept: one secure region for a few of them, where each would
    /// take a region of its own (ten system calls, made and unmade, a secret). Made at the
    /// first secret (libsodium's start, its CPU probing, is not paid without one).
    package private(set) lazy var arena = SecureArena(slabSize: 16 << 10)
    private(set) var read: [SecretReference: SecureBytes] = [:]
    /// The distinct values, in the order first read.
    private(set) var values: [SecureBytes] = []

    package init(mount given: String?) { self.given = given }

    package mutating func secret(_ reference: SecretReference) throws(CommandFailure) -> SecureBytes {
        if let known = read[reference] { return known }
        if mountPoint == nil { mountPoint = try MountChoice.resolve(given) }
        let secret = try reference.read(from: mountPoint!, in: arena)
        read[reference] = secret
        values.append(secret)
        return secret
    }

    package func wipe() { values.forEach { $0.wipe() } }
}
