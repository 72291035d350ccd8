#if canImport(Glibc)
import Glibc
#endif
import Posix

/// Asking a mount which accounts match: one question written to `MOUNT/.mtmfs/find`, the
/// answer read back on the same descriptor (account names, one a line). The daemon finds
/// them through the vault's index (SPEC §2a), so no command reads every account.
package enum AccountSearch {
    package enum Failure: Error {
        case locked
        case unusable(String)
    }

    /// The names of the accounts whose fields equal `criteria` (field name → value).
    package static func names(in mountPoint: String, matching criteria: [(String, String)]) throws(Failure) -> [String] {
        let fd: Int32
        do {
            fd = try Syscall.open(mountPoint + "/.mtmfs/find", O_RDWR)
        } catch {
            throw .unusable("cannot open \(mountPoint)/.mtmfs/find: \(error)")
        }
        defer { Syscall.close(fd) }
        let question = criteria.map { "\($0.0)=\($0.1)\n" }.joined()
        do {
            try Syscall.writeAll(fd, Array(question.isEmpty ? "\n".utf8 : question.utf8))
        } catch {
            if error == .permissionDenied { throw .locked }
            throw .unusable("the mount refused the question: \(error)")
        }
        var answer: [UInt8] = []
        var buffer = [UInt8](repeating: 0, count: 65536)
        while true {
            let n = pread(fd, &buffer, buffer.count, off_t(answer.count))
            if n < 0 && errno == EINTR { continue }
            guard n > 0 else { break }
            answer += buffer[0..<n]
        }
        return String(decoding: answer, as: UTF8.self).split(separator: "\n").map(String.init)
    }

    /// A field's text as a file of the account holds it, without its one trailing newline.
    package static func field(_ name: String, of account: String, in mountPoint: String) throws(Errno) -> String {
        let fd = try Syscall.open(mountPoint + "/accounts/" + account + "/" + name, O_RDONLY)
        defer { Syscall.close(fd) }
        var text = try Syscall.readAll(fd)
        if text.last == 0x0A { text.removeLast() }
        return String(decoding: text, as: UTF8.self)
    }
}

/// `mtmfs find`: the accounts whose fields match, like `security find-internet-password`.
package struct FindCommand: Command {
    package static let name = "find"
    package static let abstract = "print the accounts that match (by server, username, label, …)"
    package static let usage = """
    Usage: mtmfs find [MOUNT] [--server H] [--protocol P] [--port N] [--path P]
                      [--username U] [--label L] [--comment C] [--print FIELD]

    Prints the directory of every account whose fields equal all the values given (an
    empty value matches an empty field), one a line, in the vault's order. With --print,
    prints FIELD of the single match instead (e.g. --print password). MOUNT may be left
    out when one mtmfs mount is up. The accounts must be unlocked.
    Lookups go through the vault's index of server, username and label: as fast with
    10,000 accounts as with 10.

    --json prints a JSON array of the matches (path, uuid and the fields that are no
    secret), or with --print one object (path and the field).

    Exit status: 0 found; 3 no account matches; 4 several match --print; 5 locked; 6 no
    mount; 7 guarding refused this program; 1 anything else; 2 wrong command line.
    """
    package static let flags: Set<String> = ["--json"]
    package static let filters = ["server", "protocol", "port", "path", "username", "label", "comment"]
    package static let options: Set<String> = Set(filters.map { "--" + $0 } + ["--print"])
    package static let printable = ["label", "protocol", "server", "port", "path", "comment", "username", "password", "otp", "url", "totp"]

    package let mountPoint: String
    package let criteria: [(String, String)]
    package let print: String?
    package let json: Bool

    package init(_ arguments: Arguments) throws(CommandFailure) {
        criteria = Self.filters.compactMap { name in arguments.value("--" + name).map { (name, $0) } }
        if let port = criteria.first(where: { $0.0 == "port" })?.1, !port.isEmpty,
           UInt16(port) == nil || port.hasPrefix("0") {
            throw .usage("--port takes a port number (1-65535)", command: Self.name)
        }
        if criteria.contains(where: { $0.1.contains("\n") }) {
            throw .usage("a value cannot hold a newline", command: Self.name)
        }
        print = arguments.value("--print")
        json = arguments.has("--json")
        if let print, !Self.printable.contains(print) {
            throw .usage("--print takes one of \(Self.printable.joined(separator: ", "))", command: Self.name)
        }
        mountPoint = try MountChoice.resolve(try arguments.positionals(0...1, named: "").first)
    }

    /// The matches as JSON: their path and UUID, and the fields that are no secret.
    package static func json(_ names: [String], in mountPoint: String) -> String {
        let objects = names.map { name -> String in
            let fields = ["label", "protocol", "server", "port", "path", "username", "comment"].compactMap { field in
                (try? AccountSearch.field(field, of: name, in: mountPoint)).map { (field, $0) }
            }
            return "{\"path\": \(JSONText.string(mountPoint + "/accounts/" + name)), \"uuid\": \(JSONText.string(name)), "
                + "\"fields\": \(JSONText.object(fields))}"
        }
        return "[" + objects.joined(separator: ",\n ") + "]"
    }

    package func run() throws(CommandFailure) {
        let names: [String]
        do {
            names = try AccountSearch.names(in: mountPoint, matching: criteria)
        } catch {
            switch error {
            case .locked: throw CommandFailure("the accounts of \(mountPoint) are locked: run `mtmfs unlock \(mountPoint)`",
                                               exitCode: ExitCode.locked)
            case .unusable(let message): throw CommandFailure(message)
            }
        }
        guard !names.isEmpty else {
            if json { Swift.print("[]") }
            throw CommandFailure("no account matches", exitCode: ExitCode.noMatch)
        }
        guard let field = print else {
            if json { return Swift.print(Self.json(names, in: mountPoint)) }
            for name in names { Swift.print(mountPoint + "/accounts/" + name) }
            return
        }
        guard names.count == 1 else {
            throw CommandFailure("\(names.count) accounts match; --print needs one: narrow it (--username, --label, …)",
                                 exitCode: ExitCode.ambiguous)
        }
        do {
            let value = try AccountSearch.field(field, of: names[0], in: mountPoint)
            Swift.print(json ? "{\"path\": \(JSONText.string(mountPoint + "/accounts/" + names[0])), \(JSONText.string(field)): \(JSONText.string(value))}" : value)
        } catch {
            throw CommandFailure("cannot read \(field) of \(mountPoint)/accounts/\(names[0]): \(error)",
                                 exitCode: error == .permissionDenied ? ExitCode.refused : ExitCode.failure)
        }
    }
}
