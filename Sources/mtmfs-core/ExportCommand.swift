#if canImport(Glibc)
import Glibc
#endif
import CredentialVault
import ScriptCommands
import Posix
import SecureMemory

/// An account as read through the mount for an export: its fields and attributes, the
/// values in secure memory (wiped with it).
///
/// Thread-safety: none of its own; one thread.
struct ExportedAccount {
    let uuid: String
    var fields: [String: SecureBytes] = [:]
    /// Attribute names (decoded from their file names) and values, sorted by name.
    var attributes: [(String, SecureBytes)] = []

    func wipe() {
        fields.values.forEach { $0.wipe() }
        attributes.forEach { $0.1.wipe() }
    }

    static let fieldNames = ["label", "url", "username", "password", "otp", "comment"]

    /// Every account of the mount (in the vault's order, as `ls` lists them), read as the
    /// program that runs `mtmfs` (guarding asks about it for each password).
    static func readAll(from mountPoint: String) throws(CommandFailure) -> [ExportedAccount] {
        let accounts = mountPoint + "/accounts"
        let names: [String]
        do { names = try Syscall.listDirectory(accounts) } catch {
            throw CommandFailure("cannot list \(accounts): \(error)")
        }
        var read: [ExportedAccount] = []
        do throws(CommandFailure) {
            for name in names where AccountName.uuidBytes(name) != nil {
                var account = ExportedAccount(uuid: name)
                read.append(account)
                for field in fieldNames {
                    if let value = try SecretReference.readFile(accounts + "/" + name + "/" + field, mountPoint: mountPoint,
                                                                 naming: "\(name)/\(field)"), value.count > 0 {
                        account.fields[field] = value
                    }
                }
                let attributes = accounts + "/" + name + "/attributes"
                for file in ((try? Syscall.listDirectory(attributes)) ?? []).sorted() {
                    if let value = try SecretReference.readFile(attributes + "/" + file, mountPoint: mountPoint,
                                                                 naming: "\(name)/attributes/\(file)") {
                        account.attributes.append((AttributeFileName.decode(file), value))
                    }
                }
                read[read.count - 1] = account
            }
        } catch {
            read.forEach { $0.wipe() }
            throw error
        }
        return read
    }
}

/// The names of `attributes/`' files back to attribute names (`%25` is `%`, `%2F` is `/`,
/// `%2E` a dot, `%` alone the empty name).
enum AttributeFileName {
    static func decode(_ file: String) -> String {
        if file == "%" { return "" }
        var out: [UInt8] = []
        let bytes = Array(file.utf8)
        var index = 0
        while index < bytes.count {
            if bytes[index] == 0x25, index + 2 < bytes.count, let high = ASCIIHex.value(bytes[index + 1]),
               let low = ASCIIHex.value(bytes[index + 2]) {
                out.append(high << 4 | low)
                index += 3
            } else {
                out.append(bytes[index])
                index += 1
            }
        }
        return String(decoding: out, as: UTF8.self)
    }
}

/// A document built in secure memory: text, and values escaped for CSV, JSON or XML.
///
/// Thread-safety: none of its own; one thread.
final class SecretDocument {
    let bytes = SecureBytes()
    private(set) var failed: Errno?

    private func add(_ piece: UnsafeRawBufferPointer) {
        guard failed == nil else { return }
        do throws(Errno) { try bytes.append(piece) } catch { failed = error }
    }

    func text(_ text: String) { Array(text.utf8).withUnsafeBytes { add($0) } }

    /// `value` with each byte that `escape` names replaced (the rest copied a run at a time).
    private func escaped(_ value: SecureBytes?, _ escape: (UInt8) -> String?) {
        guard let value else { return }
        value.withUnsafeBytes { all in
            var from = 0
            for index in 0..<all.count {
                guard let replacement = escape(all[index]) else { continue }
                if index > from { add(UnsafeRawBufferPointer(rebasing: all[from..<index])) }
                text(replacement)
                from = index + 1
            }
            if all.count > from { add(UnsafeRawBufferPointer(rebasing: all[from...])) }
        }
    }

    /// A CSV field (RFC 4180): quoted, its quotes doubled.
    func csv(_ value: SecureBytes?) {
        text("\"")
        escaped(value) { $0 == 0x22 ? "\"\"" : nil }
        text("\"")
    }

    /// A JSON string (RFC 8259), or null.
    func json(_ value: SecureBytes?) {
        guard value != nil else { return text("null") }
        text("\"")
        escaped(value) { byte in
            switch byte {
            case 0x22: "\\\""
            case 0x5C: "\\\\"
            case 0x0A: "\\n"
            case 0x0D: "\\r"
            case 0x09: "\\t"
            case ..<0x20: "\\u00" + String(byte >> 4, radix: 16) + String(byte & 0xF, radix: 16)
            default: nil
            }
        }
        text("\"")
    }

    func json(_ value: String) { JSONText.string(value).utf8.withContiguousStorageIfAvailable { add(UnsafeRawBufferPointer($0)) } ?? text(JSONText.string(value)) }

    /// XML character data or attribute value: `&`, `<`, `>`, quotes escaped; control
    /// characters XML 1.0 cannot hold are written as U+FFFD.
    func xml(_ value: SecureBytes?) {
        escaped(value) { byte in
            switch byte {
            case 0x26: "&amp;"
            case 0x3C: "&lt;"
            case 0x3E: "&gt;"
            case 0x22: "&quot;"
            case 0x27: "&apos;"
            case 0x09, 0x0A, 0x0D: nil
            case ..<0x20: "\u{FFFD}"
            default: nil
            }
        }
    }

    func xml(_ value: String) {
        let secure = try? SecureBytes(copying: Array(value.utf8))
        defer { secure?.wipe() }
        xml(secure)
    }
}

/// `mtmfs export FORMAT`: every account in clear text, for another password manager.
struct ExportCommand: Command {
    static let name = "export"
    static let abstract = "write every account to a 0600 file (csv, bitwarden, keepassxc) after the passphrase"
    static let usage = """
    Usage: mtmfs export csv|bitwarden|keepassxc [--mount MOUNT] [-o FILE] [--passphrase-file F]

    Writes every account of the unlocked mount, passwords included, in CLEAR TEXT:
      csv        the browsers' columns: name,url,username,password,note
      bitwarden  Bitwarden's unencrypted JSON export (attributes as custom fields, otp as totp)
      keepassxc  KeePass XML, as KeePassXC imports it (attributes and otp as entry strings)
    FILE (default: standard output) is written whole or not at all, mode 0600. The vault's
    passphrase is asked first (a terminal, one line of standard input, or F), and each
    password is read as the program that runs `mtmfs export`: guarding asks about it.

    Exit status: 0 written; 5 locked; 6 no mount; 7 guarding refused; 1 a wrong passphrase
    or anything else; 2 wrong command line.
    """
    static let flags: Set<String> = []
    static let options: Set<String> = ["--mount", "-o", "--passphrase-file"]
    static let formats = ["csv", "bitwarden", "keepassxc"]

    let format: String
    let mount: String?
    let output: String?
    let passphraseFile: String?

    init(_ arguments: Arguments) throws(CommandFailure) {
        format = try arguments.positionals(1...1, named: "FORMAT")[0]
        guard Self.formats.contains(format) else {
            throw .usage("FORMAT is one of \(Self.formats.joined(separator: ", "))", command: Self.name)
        }
        mount = arguments.value("--mount")
        output = arguments.value("-o")
        passphraseFile = arguments.value("--passphrase-file")
    }

    func run() throws(CommandFailure) {
        let mountPoint = try MountChoice.resolve(mount)
        try Self.verifyPassphrase(mountPoint, file: passphraseFile)
        let accounts = try ExportedAccount.readAll(from: mountPoint)
        defer { accounts.forEach { $0.wipe() } }
        let document = SecretDocument()
        defer { document.bytes.wipe() }
        switch format {
        case "csv": Self.csv(accounts, into: document)
        case "bitwarden": Self.bitwarden(accounts, into: document)
        default: Self.keepass(accounts, into: document)
        }
        if let failed = document.failed { throw CommandFailure("no secure memory for the export (\(failed))") }
        Terminal.error("mtmfs export: \(accounts.count) accounts, passwords in clear text: keep the file safe, remove it when done")
        try SecretOutput.write(document.bytes, to: output, mode: 0o600)
    }

    /// The passphrase, asked again and checked by the mount (`.mtmfs/verify`).
    static func verifyPassphrase(_ mountPoint: String, file: String?) throws(CommandFailure) {
        let passphrase = try PassphraseInput.read(prompt: "Passphrase of the vault (to export in clear text): ", file: file)
        defer { passphrase.wipe() }
        do throws(Errno) {
            let fd = try Syscall.open(mountPoint + "/.mtmfs/verify", O_WRONLY)
            defer { Syscall.close(fd) }
            try passphrase.withUnsafeBytes { (bytes) throws(Errno) in try Syscall.writeAll(fd, bytes) }
        } catch {
            if error == .permissionDenied, StatusFile.read(mountPoint: mountPoint)["state"] == "locked" {
                throw CommandFailure("the accounts of \(mountPoint) are locked: run `mtmfs unlock \(mountPoint)`", exitCode: ExitCode.locked)
            }
            throw CommandFailure(error == .permissionDenied ? "wrong passphrase; nothing was exported" : "cannot check the passphrase: \(error)")
        }
    }

    static func csv(_ accounts: [ExportedAccount], into document: SecretDocument) {
        document.text("name,url,username,password,note\n")
        for account in accounts {
            for (index, field) in ["label", "url", "username", "password", "comment"].enumerated() {
                if index > 0 { document.text(",") }
                document.csv(account.fields[field])
            }
            document.text("\n")
        }
    }

    static func bitwarden(_ accounts: [ExportedAccount], into document: SecretDocument) {
        document.text("{\n  \"encrypted\": false,\n  \"folders\": [],\n  \"items\": [")
        for (index, account) in accounts.enumerated() {
            document.text(index == 0 ? "\n    {" : ",\n    {")
            document.text("\"id\": ")
            document.json(account.uuid)
            document.text(", \"organizationId\": null, \"folderId\": null, \"type\": 1, \"reprompt\": 0, \"name\": ")
            document.json(account.fields["label"] ?? SecureBytes())
            document.text(", \"notes\": ")
            document.json(account.fields["comment"])
            document.text(", \"favorite\": false, \"fields\": [")
            for (position, (name, value)) in account.attributes.enumerated() {
                document.text(position == 0 ? "{\"name\": " : ", {\"name\": ")
                document.json(name)
                document.text(", \"value\": ")
                document.json(value)
                document.text(", \"type\": 0, \"linkedId\": null}")
            }
            document.text("], \"login\": {\"uris\": [")
            if let url = account.fields["url"] {
                document.text("{\"match\": null, \"uri\": ")
                document.json(url)
                document.text("}")
            }
            document.text("], \"username\": ")
            document.json(account.fields["username"])
            document.text(", \"password\": ")
            document.json(account.fields["password"])
            document.text(", \"totp\": ")
            document.json(account.fields["otp"])
            document.text("}, \"collectionIds\": null}")
        }
        document.text("\n  ]\n}\n")
    }

    static func keepass(_ accounts: [ExportedAccount], into document: SecretDocument) {
        document.text("<?xml version=\"1.0\" encoding=\"utf-8\" standalone=\"yes\"?>\n<KeePassFile>\n")
        document.text("\t<Meta>\n\t\t<Generator>mtmfs</Generator>\n\t</Meta>\n\t<Root>\n\t\t<Group>\n")
        document.text("\t\t\t<UUID>\(Base64.encode(Sodium.randomBytes(16)))</UUID>\n\t\t\t<Name>mtmfs</Name>\n")
        for account in accounts {
            document.text("\t\t\t<Entry>\n\t\t\t\t<UUID>\(Base64.encode(AccountName.uuidBytes(account.uuid) ?? []))</UUID>\n")
            func string(_ key: String, _ value: SecureBytes?, protected: Bool = false) {
                guard let value else { return }
                document.text("\t\t\t\t<String>\n\t\t\t\t\t<Key>")
                document.xml(key)
                document.text(protected ? "</Key>\n\t\t\t\t\t<Value ProtectInMemory=\"True\">" : "</Key>\n\t\t\t\t\t<Value>")
                document.xml(value)
                document.text("</Value>\n\t\t\t\t</String>\n")
            }
            string("Title", account.fields["label"] ?? SecureBytes())
            string("UserName", account.fields["username"])
            string("Password", account.fields["password"], protected: true)
            string("URL", account.fields["url"])
            string("Notes", account.fields["comment"])
            string("otp", account.fields["otp"], protected: true)
            for (name, value) in account.attributes where !["Title", "UserName", "Password", "URL", "Notes", "otp"].contains(name) {
                string(name, value)
            }
            document.text("\t\t\t</Entry>\n")
        }
        document.text("\t\t</Group>\n\t</Root>\n</KeePassFile>\n")
    }
}

/// Base64 (RFC 4648), for KeePass's UUIDs.
///
/// Thread-safety: pure functions.
enum Base64 {
    static let alphabet = Array("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/".utf8)

    static func encode(_ bytes: [UInt8]) -> String {
        var out: [UInt8] = []
        for start in stride(from: 0, to: bytes.count, by: 3) {
            let chunk = Array(bytes[start..<min(start + 3, bytes.count)]) + [0, 0]
            let value = UInt32(chunk[0]) << 16 | UInt32(chunk[1]) << 8 | UInt32(chunk[2])
            let count = min(3, bytes.count - start)
            for index in 0..<4 {
                out.append(index <= count ? alphabet[Int(value >> UInt32(18 - 6 * index) & 0x3F)] : UInt8(ascii: "="))
            }
        }
        return String(decoding: out, as: UTF8.self)
    }

    /// The bytes of base64 text (white space skipped); nil when it is not base64.
    static func decode(_ text: [UInt8]) -> [UInt8]? {
        var bits: UInt32 = 0, count = 0
        var out: [UInt8] = []
        for byte in text where ![0x20, 0x09, 0x0A, 0x0D].contains(byte) {
            if byte == UInt8(ascii: "=") { break }
            guard let value = alphabet.firstIndex(of: byte) else { return nil }
            bits = bits << 6 | UInt32(value)
            count += 6
            if count >= 8 {
                count -= 8
                out.append(UInt8(truncatingIfNeeded: bits >> UInt32(count)))
            }
        }
        return out
    }
}
