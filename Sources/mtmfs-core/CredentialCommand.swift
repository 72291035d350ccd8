#if canImport(Glibc)
import Glibc
#endif
import CredentialVault
import ScriptCommands
import Posix

/// `mtmfs credential get|store|erase`: git's credential helper (also run as
/// `git-credential-mtmfs`, so that `git config --global credential.helper mtmfs` works).
///
/// It speaks git's protocol (`key=value` lines on standard input, answered on standard
/// output) and uses the mount as any program does: the accounts are found through
/// `.mtmfs/find`, and their fields read and written as files. Matching follows
/// `git-credential-libsecret`: protocol and host (with its port) must match, the path when
/// git sends one (`credential.useHttpPath`), the username when given.
struct CredentialCommand: Command {
    static let name = "credential"
    static let abstract = "git's credential helper: get, store or erase (as git-credential-mtmfs)"
    static let usage = """
    Usage: mtmfs credential [--mount MOUNT] get|store|erase
           git config --global credential.helper mtmfs

    Reads git's credential description (protocol=, host=, path=, username=, password=
    lines) from standard input.
      get     prints username= and password= of the first matching account
      store   sets the password of the matching account, or makes a new account
              (label "HOST (git)") with the protocol, server, port, path, username
              and password
      erase   clears the password of each matching account (only where it is the one
              git sends); an account that `store` made is removed whole
    A locked mount, no mount, or a damaged vault: get prints nothing and exits 0 at once
    (git then asks you); store and erase change nothing and say why on standard error.
    MOUNT may be left out when one mtmfs mount is up (with git: credential.helper
    "mtmfs --mount MOUNT").
    """
    static let flags: Set<String> = []
    static let options: Set<String> = ["--mount"]

    enum Action: String { case get, store, erase }

    let mount: String?

    /// nil: an action git may add later, which a helper ignores (gitcredentials(7)).
    let action: Action?

    init(_ arguments: Arguments) throws(CommandFailure) {
        let positionals = try arguments.positionals(1...1, named: "the action (get, store or erase)")
        action = Action(rawValue: positionals[0])
        mount = arguments.value("--mount")
    }

    /// What git described: the values it sent, by key (the last of each).
    struct Description {
        var values: [String: String] = [:]

        /// Reads up to the blank line that ends git's description (or the end of input): a
        /// caller that keeps standard input open is not waited for.
        init(reading fd: Int32) {
            var line: [UInt8] = []
            var byte: UInt8 = 0
            while true {
                let n = Glibc.read(fd, &byte, 1)
                if n < 0 && errno == EINTR { continue }
                if n <= 0 || byte == 0x0A {
                    if line.last == 0x0D { line.removeLast() }
                    if line.isEmpty { return }
                    let text = String(decoding: line, as: UTF8.self)
                    if let equals = text.firstIndex(of: "=") {
                        values[String(text[..<equals])] = String(text[text.index(after: equals)...])
                    }
                    if n <= 0 { return }
                    line = []
                } else {
                    line.append(byte)
                }
            }
        }

        /// `host` split into server and port (`example.org:8443`).
        var server: String {
            let host = values["host"] ?? ""
            guard let colon = host.lastIndex(of: ":"), !host[host.index(after: colon)...].isEmpty,
                  host[host.index(after: colon)...].allSatisfy(\.isNumber) else { return host }
            return String(host[..<colon])
        }

        var port: String {
            let host = values["host"] ?? ""
            guard let colon = host.lastIndex(of: ":") else { return "" }
            let port = host[host.index(after: colon)...]
            return !port.isEmpty && port.allSatisfy(\.isNumber) ? String(port) : ""
        }

        /// The account's path for git's, which comes decoded and without its leading slash:
        /// a URL path again (space, control characters and `%` written `%XX`).
        var path: String? {
            guard let given = values["path"] else { return nil }
            var path = given.hasPrefix("/") ? "" : "/"
            for byte in given.utf8 {
                if byte <= 0x20 || byte == 0x7F || byte == 0x25 {
                    path += "%" + String(byte >> 4, radix: 16, uppercase: true) + String(byte & 0xF, radix: 16, uppercase: true)
                } else {
                    path += String(decoding: [byte], as: UTF8.self)
                }
            }
            return path
        }

        /// What an account must match: one set of criteria per port that counts as git's
        /// (no port: an empty one, or the protocol's own, `https://h:443` being `https://h`).
        func criteria() -> [[(String, String)]] {
            let protocolName = values["protocol"] ?? ""
            var ports = [port]
            if port.isEmpty, let standard = ["https": "443", "http": "80", "ftp": "21", "smtp": "25", "imap": "143", "imaps": "993"][protocolName] {
                ports.append(standard)
            }
            return ports.map { port in
                var criteria = [("protocol", protocolName), ("server", server), ("port", port)]
                if let path { criteria.append(("path", path)) }
                if let username = values["username"] { criteria.append(("username", username)) }
                return criteria
            }
        }
    }

    func run() throws(CommandFailure) {
        guard let action else { return }
        // git waits for its helper: a mount that does not answer (a stopped daemon) must not
        // hang it. After 10 s the helper ends (SIGALRM), and git asks the user.
        alarm(10)
        let description = Description(reading: 0)
        guard description.values["protocol"] != nil, description.values["host"] != nil else {
            if action == .get { return }
            throw CommandFailure("git sent no protocol and host: nothing to \(action.rawValue)")
        }
        // Never an error that stops git: with nothing here, git asks the user.
        let mountPoint: String
        do {
            mountPoint = try MountChoice.resolve(mount)
        } catch {
            try quietly("\(error.description)")
            return
        }
        var names: [String] = []
        do {
            for criteria in description.criteria() {
                names += try AccountSearch.names(in: mountPoint, matching: criteria).filter { !names.contains($0) }
            }
        } catch {
            switch error {
            case .locked: try quietly("the accounts of \(mountPoint) are locked (mtmfs unlock \(mountPoint))")
            case .unusable(let message): try quietly(message)
            }
            return
        }
        switch action {
        case .get: get(names, mountPoint: mountPoint, description: description)
        case .store: try store(names, mountPoint: mountPoint, description: description, action: action)
        case .erase: try erase(names, mountPoint: mountPoint, description: description)
        }
    }

    /// `get` says nothing on standard output and succeeds; `store` and `erase` fail.
    func quietly(_ why: String) throws(CommandFailure) {
        if action == .get {
            Terminal.error("mtmfs credential: \(why); git asks instead")
            return
        }
        throw CommandFailure("\(why): nothing changed")
    }

    func get(_ names: [String], mountPoint: String, description: Description) {
        for name in names {
            guard let password = try? AccountSearch.field("password", of: name, in: mountPoint), !password.isEmpty else { continue }
            let username = description.values["username"] ?? ((try? AccountSearch.field("username", of: name, in: mountPoint)) ?? "")
            // No username: none is said, and git asks for one (an empty one would be sent).
            if !username.isEmpty { print("username=\(username)") }
            print("password=\(password)")
            return
        }
    }

    func store(_ names: [String], mountPoint: String, description: Description, action: Action) throws(CommandFailure) {
        guard let username = description.values["username"], let password = description.values["password"] else {
            throw CommandFailure("git sent no username and password: nothing to store")
        }
        if let name = names.first {
            if (try? AccountSearch.field("password", of: name, in: mountPoint)) == password { return }
            try write(password, to: "password", of: name, in: mountPoint)
            return
        }
        var fields: [(AccountField, String)] = [
            (.label, (description.values["host"] ?? "") + " (git)"), (.protocol, description.values["protocol"] ?? ""),
            (.server, description.server), (.port, description.port), (.username, username), (.password, password),
        ]
        if let path = description.path { fields.append((.path, path)) }
        // Checked before anything is made: a value the vault refuses leaves no half account.
        for (field, value) in fields {
            let valid = Array(value.utf8).withUnsafeBytes { AccountFieldSyntax.isValid($0, for: field) }
            guard valid, !value.contains("\n") else {
                throw CommandFailure("git's \(field.rawValue) \(field == .password ? "" : "'\(value)' ")is not one an account can hold: nothing stored")
            }
        }
        let name = try newAccountName()
        let directory = mountPoint + "/accounts/" + name
        do {
            try Syscall.mkdir(directory, mode: 0o700)
        } catch {
            throw CommandFailure("cannot make an account in \(mountPoint)/accounts: \(error)")
        }
        do {
            for (field, value) in fields where !value.isEmpty {
                try write(value, to: field.rawValue, of: name, in: mountPoint)
            }
        } catch {
            try? remove(name, in: mountPoint)
            throw error
        }
    }

    func erase(_ names: [String], mountPoint: String, description: Description) throws(CommandFailure) {
        let host = description.values["host"] ?? ""
        for name in names {
            let stored = try? AccountSearch.field("password", of: name, in: mountPoint)
            // git names the password it found wrong: a newer one stored meanwhile stays.
            if let rejected = description.values["password"], stored != rejected { continue }
            let label = try? AccountSearch.field("label", of: name, in: mountPoint)
            let comment = try? AccountSearch.field("comment", of: name, in: mountPoint)
            if label == host + " (git)" && comment?.isEmpty != false {
                try remove(name, in: mountPoint)
            } else {
                try write("", to: "password", of: name, in: mountPoint)
            }
        }
    }

    func write(_ value: String, to field: String, of account: String, in mountPoint: String) throws(CommandFailure) {
        let path = mountPoint + "/accounts/" + account + "/" + field
        do {
            let fd = try Syscall.open(path, O_WRONLY | O_TRUNC)
            defer { Syscall.close(fd) }
            if !value.isEmpty { try Syscall.writeAll(fd, Array((value + "\n").utf8)) }
        } catch {
            throw CommandFailure("cannot write \(path): \(error)")
        }
    }

    /// `rm -r` of an account: each field, then the directory.
    func remove(_ account: String, in mountPoint: String) throws(CommandFailure) {
        let directory = mountPoint + "/accounts/" + account
        do {
            for field in (try? Syscall.listDirectory(directory)) ?? [] where field != "url" && field != "trusted" {
                try? Syscall.unlink(directory + "/" + field)
            }
            try Syscall.removeDirectory(directory)
        } catch {
            throw CommandFailure("cannot remove \(directory): \(error)")
        }
    }

    /// A new UUID from the kernel's source (present on every Linux).
    func newAccountName() throws(CommandFailure) -> String {
        guard let fd = try? Syscall.open("/proc/sys/kernel/random/uuid", O_RDONLY),
              let bytes = try? Syscall.readAll(fd) else {
            throw CommandFailure("cannot read /proc/sys/kernel/random/uuid for a new account's name")
        }
        Syscall.close(fd)
        return String(decoding: bytes, as: UTF8.self).trimmingSuffix("\n")
    }
}
