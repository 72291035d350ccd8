#if canImport(Glibc)
import Glibc
#endif
import CredentialVault
import ScriptCommands
import Posix
import SecureMemory

/// `mtmfs import FORMAT [FILE]`: accounts from another password manager's export, through
/// the mount (as `mkdir` and `echo` make them: the program that runs `mtmfs import` is their
/// creator, so guarding trusts it with them). All or nothing: the whole file is read and
/// checked first, and a failure while writing undoes what this import wrote.
struct ImportCommand: Command {
    static let name = "import"
    static let abstract = "read accounts from a csv or Bitwarden export (a second import updates)"
    static let usage = """
    Usage: mtmfs import csv|bitwarden|keepassxc [--mount MOUNT] [FILE]
           mtmfs import secret-service [--mount MOUNT] [--bus-name NAME] [--collection ALIAS]
           mtmfs import pass [--mount MOUNT] [STORE]

    Reads FILE (default: standard input) into the unlocked mount:
      csv        Chrome's, Firefox's, 1Password's or KeePassXC's CSV export (told apart by
                 the header: name/title, url, username, password, note(s), otpauth/totp, guid, …)
      bitwarden  Bitwarden's unencrypted JSON export (logins and notes; custom fields
                 become attributes/, totp becomes otp)
      keepassxc  KeePass XML, as KeePassXC exports it (keepassxc-cli export --format xml):
                 every entry of every group (not its history), Title, UserName, Password,
                 URL, Notes and otp as fields, any other string an attribute
      secret-service
                 every item of a running Secret Service's collection (gnome-keyring's,
                 KeePassXC's; default: the collection `default` of org.freedesktop.secrets on
                 the session bus — a mount serving its own must not hold that name), mapped as
                 mtmfs's bus maps an account: server, user, protocol, port, object are fields,
                 every other attribute an attribute; the collection must be unlocked
      pass       a pass store (STORE, default $PASSWORD_STORE_DIR or ~/.password-store),
                 decrypted by gpg as `pass show` does: the first line the password, otpauth://
                 the otp, `user:`/`login:` the username, `url:` the url, other `key: value`
                 lines attributes, the rest the comment; NAME.gpg is labelled NAME
    `mtmfs export` writes both. An account keeps the source's id where it is a UUID
    (Bitwarden's id, Firefox's guid), and a second import of the same file updates those
    accounts in place; without one, an account with the same label, url and username is
    updated. A URL the url field cannot hold is kept as the attribute url. Prints what was
    made and updated. Any error (a damaged file, an unknown column) changes nothing.

    Exit status: 0 imported; 5 locked; 6 no mount; 7 guarding refused; 1 a bad file or
    anything else; 2 wrong command line.
    """
    static let flags: Set<String> = []
    static let options: Set<String> = ["--mount", "--bus-name", "--collection"]

    let format: String
    let file: String?
    let mount: String?
    let busName: String
    let alias: String

    init(_ arguments: Arguments) throws(CommandFailure) {
        let positionals = try arguments.positionals(1...2, named: "FORMAT")
        format = positionals[0]
        guard ["csv", "bitwarden", "keepassxc", "secret-service", "pass"].contains(format) else {
            throw .usage("FORMAT is csv, bitwarden, keepassxc, secret-service or pass", command: Self.name)
        }
        file = positionals.count > 1 ? positionals[1] : nil
        if format == "secret-service" && file != nil { throw .usage("secret-service reads no file", command: Self.name) }
        if format == "pass", let file, (try? Syscall.lstat(file)).map({ $0.st_mode & S_IFMT == S_IFDIR }) != true {
            throw .usage("pass reads a store's directory", command: Self.name)
        }
        mount = arguments.value("--mount")
        busName = arguments.value("--bus-name") ?? "org.freedesktop.secrets"
        alias = arguments.value("--collection") ?? "default"
    }

    func run() throws(CommandFailure) {
        let mountPoint = try MountChoice.resolve(mount)
        let accounts: [ImportedAccount]
        var skipped = 0
        if format == "secret-service" {
            do throws(ImportError) { accounts = try SecretServiceImport.read(busName: busName, alias: alias) } catch {
                throw CommandFailure("\(error.message); nothing was imported")
            }
        } else if format == "pass" {
            let home = Paths.environment("HOME") ?? ""
            let store = file ?? Paths.environment("PASSWORD_STORE_DIR") ?? home + "/.password-store"
            do throws(ImportError) { accounts = try PassImport.read(store) } catch {
                throw CommandFailure("\(error.message); nothing was imported")
            }
        } else {
            let data = try Self.readInput(file)
            defer { data.wipe() }
            do throws(ImportError) {
                switch format {
                case "csv": accounts = try CSVImport.parse(data)
                case "keepassxc": accounts = try KeePassXMLImport.parse(data)
                default: (accounts, skipped) = try BitwardenImport.read(data)
                }
            } catch {
                throw CommandFailure("\(Terminal.printable(file ?? "standard input")): \(error.message); nothing was imported")
            }
        }
        defer { accounts.forEach { $0.wipe() } }
        var writer = AccountWriter(mountPoint: mountPoint)
        do throws(CommandFailure) {
            let existing = try writer.existingAccounts()
            // On a terminal, a large import says how far it is.
            let showing = isatty(2) == 1 && accounts.count >= 200
            for (done, account) in accounts.enumerated() {
                try writer.put(account, existing: existing)
                if showing && (done + 1) % 100 == 0 { Terminal.error("\rmtmfs import: \(done + 1) of \(accounts.count)…", newline: false) }
            }
            if showing { Terminal.error("") }
        } catch {
            writer.undo()
            throw CommandFailure(error.description + "; nothing was imported", exitCode: error.exitCode)
        }
        writer.finish()
        print("imported \(accounts.count) accounts: \(writer.made.count) made, \(writer.updated) updated"
              + (skipped > 0 ? ", \(skipped) items that are no account (cards, identities) left out" : "")
              + (writer.skippedAttributes > 0 ? ", \(writer.skippedAttributes) attributes with names too long for a file left out" : ""))
    }

    /// The whole input, in secure memory.
    static func readInput(_ path: String?) throws(CommandFailure) -> SecureBytes {
        do throws(Errno) {
            let fd = try path.map { (path) throws(Errno) in try Syscall.open(path, O_RDONLY) } ?? 0
            defer { if path != nil { Syscall.close(fd) } }
            return try SecretReference.readAll(fd)
        } catch {
            throw CommandFailure("cannot read \(Terminal.printable(path ?? "standard input")): \(error)")
        }
    }
}

/// Writes imported accounts through the mount and remembers how to undo it: the accounts it
/// made (removed), and the old text of each field it changed (written back).
///
/// Thread-safety: none of its own; one thread.
struct AccountWriter {
    let mountPoint: String
    var accounts: String { mountPoint + "/accounts/" }
    private(set) var made: [String] = []
    private(set) var updated = 0
    private(set) var skippedAttributes = 0
    /// Field files changed, with their text before (nil: there was none).
    private var changed: [(path: String, old: SecureBytes?)] = []

    init(mountPoint: String) { self.mountPoint = mountPoint }

    /// The accounts there are: UUID name → label, url, username (what a record without an
    /// id is matched by; no secret).
    func existingAccounts() throws(CommandFailure) -> [String: [String]] {
        var found: [String: [String]] = [:]
        let names: [String]
        do { names = try Syscall.listDirectory(accounts) } catch {
            throw CommandFailure("cannot list \(accounts): \(error)")
        }
        for name in names where AccountName.uuidBytes(name) != nil {
            var key: [String] = []
            for field in ["label", "url", "username"] {
                let value = try SecretReference.readFile(accounts + name + "/" + field, mountPoint: mountPoint, naming: "\(name)/\(field)")
                key.append(value.map { v in defer { v.wipe() }; return v.withUnsafeBytes { String(decoding: $0, as: UTF8.self) } } ?? "")
                value?.wipe()
            }
            found[name] = key
        }
        return found
    }

    mutating func put(_ account: ImportedAccount, existing: [String: [String]]) throws(CommandFailure) {
        // Its account: the source's UUID, else one with its label, url and username, else new.
        var name: String?
        if let uuid = account.uuid, let id = account.id {
            name = existing.keys.first { AccountName.uuidBytes($0) == uuid } ?? id
        } else {
            let key = [account.text("label"), account.text("url"), account.text("username")]
            name = existing.first { $0.value == key }?.key
        }
        let directory: String
        if let name, existing[name] != nil {
            directory = accounts + name
            updated += 1
        } else {
            let uuid = name ?? AccountName.string(NewCommand.randomUUID())
            directory = accounts + uuid
            do { try Syscall.mkdir(directory, mode: 0o700) } catch {
                throw NewCommand.failure(error, "make the account \(uuid)", mountPoint: mountPoint)
            }
            made.append(directory)
        }
        var attributes = account.attributes
        for field in ["label", "username", "password", "comment", "url", "protocol", "server", "port", "path", "otp"] {
            guard let value = account.fields[field] else { continue }
            let fits = value.withUnsafeBytes { bytes in
                switch field {
                case "url": AccountFieldSyntax.parseURL(bytes) != nil
                case "otp": AccountFieldSyntax.isValid(bytes, for: .otp)
                default: AccountFieldSyntax.isValid(bytes, for: AccountField(rawValue: field) ?? .comment)
                }
            }
            // (What the field cannot hold is kept, as an attribute of its name.)
            if !fits { attributes.append((field, value)); continue }
            try write(value, to: directory + "/" + field, isNew: made.last == directory)
        }
        for (attribute, value) in attributes {
            let file = Self.attributeFile(attribute)
            guard file.utf8.count <= 255 else { skippedAttributes += 1; continue }
            try write(value, to: directory + "/attributes/" + file, isNew: made.last == directory)
        }
    }

    /// An attribute's file name (the rule of `attributes/`: `%`, `/`, `.`, `..` and the
    /// empty name escaped).
    static func attributeFile(_ name: String) -> String {
        switch name {
        case "": return "%"
        case ".": return "%2E"
        case "..": return "%2E%2E"
        default:
            return String(name.flatMap { character -> [Character] in
                switch character {
                case "%": Array("%25")
                case "/": Array("%2F")
                default: [character]
                }
            })
        }
    }

    private mutating func write(_ value: SecureBytes, to path: String, isNew: Bool) throws(CommandFailure) {
        if !isNew {
            let old = try SecretReference.readFile(path, mountPoint: mountPoint, naming: String(path.dropFirst(accounts.count)))
            changed.append((path, old))
        }
        do throws(Errno) {
            try value.append([0x0A])
            defer { try? value.resize(to: value.count - 1) }
            try value.withUnsafeBytes { (bytes) throws(Errno) in
                let fd = try Syscall.open(path, O_WRONLY | O_CREAT | O_TRUNC, mode: 0o600)
                defer { Syscall.close(fd) }
                try Syscall.writeAll(fd, bytes)
                try Syscall.fsync(fd)
            }
        } catch {
            throw NewCommand.failure(error, "write \(String(path.dropFirst(accounts.count)))", mountPoint: mountPoint)
        }
    }

    /// Takes back what was written: made accounts removed, changed fields written back.
    mutating func undo() {
        for directory in made.reversed() { NewCommand.remove(directory) }
        for (path, old) in changed.reversed() {
            if let old {
                try? old.append([0x0A])
                old.withUnsafeBytes { bytes in
                    if let fd = try? Syscall.open(path, O_WRONLY | O_TRUNC) {
                        try? Syscall.writeAll(fd, bytes)
                        Syscall.close(fd)
                    }
                }
                old.wipe()
            } else {
                try? Syscall.unlink(path)
            }
        }
        changed.removeAll()
    }

    /// The old texts go (the import stands).
    mutating func finish() {
        changed.forEach { $0.old?.wipe() }
        changed.removeAll()
    }
}
