#if canImport(Glibc)
import Glibc
#endif
import CredentialVault
import ScriptCommands
import Posix
import SecretService
import SecureMemory

/// One account read from another password manager's export, its values in secure memory.
///
/// Thread-safety: none of its own; one thread.
struct ImportedAccount {
    /// The source's id when it is a UUID (Bitwarden's id, Firefox's guid), as written: the
    /// account of that UUID is updated, or made with that name; nil: matched by label, url
    /// and username.
    var id: String? {
        didSet { if let id, AccountName.uuidBytes(id) == nil { self.id = nil } }
    }
    var uuid: [UInt8]? { id.flatMap(AccountName.uuidBytes) }
    var fields: [String: SecureBytes] = [:]
    var attributes: [(String, SecureBytes)] = []

    func wipe() {
        fields.values.forEach { $0.wipe() }
        attributes.forEach { $0.1.wipe() }
    }

    func text(_ field: String) -> String {
        if field == "url", fields["url"] == nil {
            // Composed from its parts as the mount composes `url` (what an account is matched by).
            let server = text("server"), port = text("port"), scheme = text("protocol")
            guard !server.isEmpty else { return "" }
            return (scheme.isEmpty ? "" : scheme + "://") + server + (port.isEmpty ? "" : ":" + port) + text("path")
        }
        return fields[field].map { $0.withUnsafeBytes { String(decoding: $0, as: UTF8.self) } } ?? ""
    }
}

/// A failure to read an export: where, and why (never a value).
struct ImportError: Error {
    let message: String
    init(_ message: String) { self.message = message }
}

/// CSV exports (RFC 4180) of the browsers, 1Password and KeePassXC, told apart by their header: the
/// columns each has are mapped onto fields; a column none of them has is an error.
///
/// Thread-safety: pure functions.
enum CSVImport {
    /// Column names (lower-cased) and the field each fills ("" : read and left out).
    static let columns: [String: String] = [
        "name": "label", "title": "label", "url": "url", "login_uri": "url", "username": "username",
        "login_username": "username", "password": "password", "login_password": "password", "note": "comment",
        "notes": "comment", "otpauth": "otp", "totp": "otp", "login_totp": "otp", "guid": "id",
        // Firefox's, 1Password's and KeePassXC's columns that have no field.
        "httprealm": "", "formactionorigin": "", "timecreated": "", "timelastused": "", "timepasswordchanged": "",
        "favorite": "", "archived": "", "tags": "", "group": "", "icon": "", "last modified": "", "created": "",
    ]

    /// Every record of `data` (held in secure memory by the caller).
    static func parse(_ data: SecureBytes) throws(ImportError) -> [ImportedAccount] {
        var records: [[SecureBytes]] = []
        defer { records.forEach { $0.forEach { $0.wipe() } } }
        try data.withUnsafeBytes { (bytes) throws(ImportError) in records = try rows(bytes) }
        guard let header = records.first else { throw ImportError("the file is empty") }
        let names = header.map { $0.withUnsafeBytes { String(decoding: $0, as: UTF8.self) }.lowercased() }
        var mapping: [String?] = []
        for name in names {
            guard let field = columns[name] else {
                throw ImportError("unknown column \"\(name)\" (known: Chrome's, Firefox's and 1Password's CSV columns)")
            }
            mapping.append(field.isEmpty ? nil : field)
        }
        guard mapping.contains("password") else { throw ImportError("no password column") }
        var accounts: [ImportedAccount] = []
        do throws(ImportError) {
            for (number, row) in records.dropFirst().enumerated() {
                guard row.count == mapping.count else {
                    throw ImportError("line \(number + 2): \(row.count) fields where the header has \(mapping.count)")
                }
                var account = ImportedAccount()
                for (index, field) in mapping.enumerated() {
                    guard let field, row[index].count > 0 else { continue }
                    let copy: SecureBytes
                    do throws(Errno) { copy = try row[index].copy() } catch { throw ImportError("no secure memory (\(error))") }
                    if field == "id" {
                        account.id = copy.withUnsafeBytes { String(decoding: $0, as: UTF8.self).trimmingBraces }
                        copy.wipe()
                    } else {
                        account.fields[field] = copy
                    }
                }
                accounts.append(account)
            }
        } catch {
            accounts.forEach { $0.wipe() }
            throw error
        }
        return accounts
    }

    /// The records of a CSV text: quoted fields may hold commas, quotes (doubled) and
    /// newlines; CRLF or LF ends a record; a trailing newline makes no empty record.
    static func rows(_ bytes: UnsafeRawBufferPointer) throws(ImportError) -> [[SecureBytes]] {
        var rows: [[SecureBytes]] = []
        var row: [SecureBytes] = []
        var field = SecureBytes()
        var quoted = false, atFieldStart = true
        var index = 0
        var line = 1
        func take(_ byte: UInt8) throws(ImportError) {
            do throws(Errno) { try field.append([byte]) } catch { throw ImportError("no secure memory (\(error))") }
        }
        func endField() {
            row.append(field)
            field = SecureBytes()
            atFieldStart = true
        }
        do throws(ImportError) {
            // (A UTF-8 byte order mark, as Excel writes, is not part of the first name.)
            if bytes.count >= 3, bytes[0] == 0xEF, bytes[1] == 0xBB, bytes[2] == 0xBF { index = 3 }
            while index < bytes.count {
                let byte = bytes[index]
                if quoted {
                    if byte == 0x22 {
                        if index + 1 < bytes.count, bytes[index + 1] == 0x22 {
                            try take(0x22)
                            index += 1
                        } else {
                            quoted = false
                        }
                    } else {
                        if byte == 0x0A { line += 1 }
                        try take(byte)
                    }
                } else if byte == 0x22 && atFieldStart {
                    quoted = true
                    atFieldStart = false
                } else if byte == 0x2C {
                    endField()
                } else if byte == 0x0A || byte == 0x0D {
                    if byte == 0x0D, index + 1 < bytes.count, bytes[index + 1] == 0x0A { index += 1 }
                    endField()
                    rows.append(row)
                    row = []
                    line += 1
                } else {
                    atFieldStart = false
                    try take(byte)
                }
                index += 1
            }
            if quoted { throw ImportError("line \(line): a quoted field is not closed") }
            if !row.isEmpty || field.count > 0 || !atFieldStart {
                endField()
                rows.append(row)
            }
        } catch {
            rows.forEach { $0.forEach { $0.wipe() } }
            row.forEach { $0.wipe() }
            field.wipe()
            throw error
        }
        field.wipe()
        return rows.filter { !($0.count == 1 && $0[0].count == 0) }
    }
}

extension String {
    /// Without the braces some exports put around a GUID (`{…}`).
    var trimmingBraces: String {
        hasPrefix("{") && hasSuffix("}") ? String(dropFirst().dropLast()) : self
    }
}

/// Bitwarden's unencrypted JSON export: `items` of type 1 (logins) and 2 (secure notes),
/// with `fields` as attributes. The text is read in secure memory and every string is
/// decoded into secure memory; nothing of a value goes through a Swift string but names.
///
/// Thread-safety: pure functions.
enum BitwardenImport {
    /// The items read as accounts, and how many were left out (cards and identities).
    static func parse(_ data: SecureBytes) throws(ImportError) -> [ImportedAccount] { try read(data).accounts }

    static func read(_ data: SecureBytes) throws(ImportError) -> (accounts: [ImportedAccount], skipped: Int) {
        var skipped = 0
        let accounts = try parseItems(data, skipped: &skipped)
        return (accounts, skipped)
    }

    private static func parseItems(_ data: SecureBytes, skipped: inout Int) throws(ImportError) -> [ImportedAccount] {
        try data.withUnsafeBytes { (bytes) throws(ImportError) -> [ImportedAccount] in
            var parser = JSONScanner(bytes)
            let root = try parser.document()
            guard case .object(let top) = root else { throw ImportError("not a Bitwarden export (no top-level object)") }
            if case .bool(true)? = top["encrypted"] {
                throw ImportError("an encrypted Bitwarden export: export it unencrypted (JSON) to import it")
            }
            guard case .array(let items)? = top["items"] else { throw ImportError("not a Bitwarden export (no items)") }
            var accounts: [ImportedAccount] = []
            do throws(ImportError) {
                for (number, item) in items.enumerated() {
                    guard case .object(let members) = item else { throw ImportError("item \(number + 1) is not an object") }
                    guard case .number(let type)? = members["type"], type == 1 || type == 2 else {  // (cards, identities: no account)
                        skipped += 1
                        continue
                    }
                    var account = ImportedAccount()
                    if case .string(let range)? = members["id"] {
                        account.id = String(decoding: try parser.bytes(range), as: UTF8.self)
                    }
                    func set(_ field: String, _ value: JSONScanner.Value?) throws(ImportError) {
                        guard case .string(let range)? = value else { return }
                        let secure = try parser.secure(range)
                        if secure.count > 0 { account.fields[field] = secure } else { secure.wipe() }
                    }
                    try set("label", members["name"])
                    try set("comment", members["notes"])
                    if case .object(let login)? = members["login"] {
                        try set("username", login["username"])
                        try set("password", login["password"])
                        try set("otp", login["totp"])
                        if case .array(let uris)? = login["uris"], case .object(let first)? = uris.first {
                            try set("url", first["uri"])
                        }
                    }
                    if case .array(let fields)? = members["fields"] {
                        for field in fields {
                            guard case .object(let pair) = field, case .string(let name)? = pair["name"] else { continue }
                            let value: SecureBytes
                            if case .string(let range)? = pair["value"] { value = try parser.secure(range) } else { value = SecureBytes() }
                            account.attributes.append((String(decoding: try parser.bytes(name), as: UTF8.self), value))
                        }
                    }
                    accounts.append(account)
                }
            } catch {
                accounts.forEach { $0.wipe() }
                throw error
            }
            return accounts
        }
    }
}

/// A JSON reader (RFC 8259) that keeps strings as ranges of the text, decoded on demand
/// (into secure memory for values).
///
/// Thread-safety: none of its own; one thread, over bytes the caller keeps.
struct JSONScanner {
    indirect enum Value {
        case object([String: Value])
        case array([Value])
        /// The range of a string's text between its quotes (escapes not yet decoded).
        case string(Range<Int>)
        case number(Double)
        case bool(Bool)
        case null
    }

    let text: UnsafeRawBufferPointer
    var index = 0
    var depth = 0

    init(_ text: UnsafeRawBufferPointer) { self.text = text }

    mutating func document() throws(ImportError) -> Value {
        let value = try self.value()
        skipSpace()
        guard index == text.count else { throw error("text after the document") }
        return value
    }

    private func error(_ why: String) -> ImportError { ImportError("JSON at byte \(index): \(why)") }

    private mutating func skipSpace() {
        while index < text.count, [0x20, 0x09, 0x0A, 0x0D].contains(text[index]) { index += 1 }
    }

    private mutating func value() throws(ImportError) -> Value {
        skipSpace()
        guard index < text.count else { throw error("the text ends early") }
        switch text[index] {
        case 0x7B:
            depth += 1
            defer { depth -= 1 }
            guard depth < 64 else { throw error("nested too deep") }
            index += 1
            var members: [String: Value] = [:]
            skipSpace()
            if index < text.count, text[index] == 0x7D { index += 1; return .object(members) }
            while true {
                skipSpace()
                guard index < text.count, text[index] == 0x22 else { throw error("a member name is expected") }
                let name = String(decoding: try bytes(try stringRange()), as: UTF8.self)
                skipSpace()
                guard index < text.count, text[index] == 0x3A else { throw error("':' is expected") }
                index += 1
                members[name] = try value()
                skipSpace()
                guard index < text.count else { throw error("the text ends early") }
                if text[index] == 0x2C { index += 1; continue }
                guard text[index] == 0x7D else { throw error("',' or '}' is expected") }
                index += 1
                return .object(members)
            }
        case 0x5B:
            depth += 1
            defer { depth -= 1 }
            guard depth < 64 else { throw error("nested too deep") }
            index += 1
            var elements: [Value] = []
            skipSpace()
            if index < text.count, text[index] == 0x5D { index += 1; return .array(elements) }
            while true {
                elements.append(try value())
                skipSpace()
                guard index < text.count else { throw error("the text ends early") }
                if text[index] == 0x2C { index += 1; continue }
                guard text[index] == 0x5D else { throw error("',' or ']' is expected") }
                index += 1
                return .array(elements)
            }
        case 0x22:
            return .string(try stringRange())
        case 0x74, 0x66, 0x6E:
            for (word, value) in [("true", Value.bool(true)), ("false", .bool(false)), ("null", .null)] {
                let bytes = Array(word.utf8)
                if index + bytes.count <= text.count, Array(text[index..<index + bytes.count]) == bytes {
                    index += bytes.count
                    return value
                }
            }
            throw error("an unknown word")
        default:
            let start = index
            while index < text.count, (0x30...0x39).contains(text[index]) || [0x2D, 0x2B, 0x2E, 0x65, 0x45].contains(text[index]) { index += 1 }
            guard index > start, let number = Double(String(decoding: text[start..<index], as: UTF8.self)) else {
                throw error("a value is expected")
            }
            return .number(number)
        }
    }

    /// The range inside a string's quotes; `index` goes past its end.
    private mutating func stringRange() throws(ImportError) -> Range<Int> {
        index += 1
        let start = index
        while index < text.count, text[index] != 0x22 {
            guard text[index] >= 0x20 else { throw error("a control character in a string") }
            index += text[index] == 0x5C ? 2 : 1
        }
        guard index < text.count else { throw error("a string is not closed") }
        index += 1
        return start..<(index - 1)
    }

    /// A string's bytes, escapes decoded (for names: not secret).
    func bytes(_ range: Range<Int>) throws(ImportError) -> [UInt8] {
        let secure = try self.secure(range)
        defer { secure.wipe() }
        return secure.withUnsafeBytes { Array($0) }
    }

    /// A string's bytes, escapes decoded, in secure memory.
    func secure(_ range: Range<Int>) throws(ImportError) -> SecureBytes {
        let out = SecureBytes()
        do throws(Errno) {
            var position = range.lowerBound
            var pendingHigh: UInt32?
            func scalar(_ value: UInt32) throws(Errno) {
                var utf8: [UInt8] = []
                if let unicode = Unicode.Scalar(value) { utf8 = Array(String(unicode).utf8) } else { utf8 = [0xEF, 0xBF, 0xBD] }
                try out.append(utf8)
            }
            while position < range.upperBound {
                let byte = text[position]
                guard byte == 0x5C else {
                    var end = position
                    while end < range.upperBound, text[end] != 0x5C { end += 1 }
                    try out.append(UnsafeRawBufferPointer(rebasing: text[position..<end]))
                    position = end
                    continue
                }
                let kind = text[position + 1]
                position += 2
                switch kind {
                case 0x6E: try out.append([0x0A])
                case 0x74: try out.append([0x09])
                case 0x72: try out.append([0x0D])
                case 0x62: try out.append([0x08])
                case 0x66: try out.append([0x0C])
                case 0x75:
                    guard position + 4 <= range.upperBound,
                          let code = UInt32(String(decoding: text[position..<position + 4], as: UTF8.self), radix: 16) else {
                        out.wipe()
                        throw Errno.invalidArgument
                    }
                    position += 4
                    if (0xD800...0xDBFF).contains(code) {
                        pendingHigh = code
                    } else if (0xDC00...0xDFFF).contains(code), let high = pendingHigh {
                        try scalar(0x10000 + ((high - 0xD800) << 10) + (code - 0xDC00))
                        pendingHigh = nil
                    } else {
                        try scalar(code)
                    }
                default: try out.append([kind])  // \" \\ \/
                }
            }
        } catch {
            out.wipe()
            throw ImportError(error == .invalidArgument ? "JSON: a bad \\u escape" : "no secure memory (\(error))")
        }
        return out
    }
}

/// Another program's Secret Service on the session bus: one collection's items (label,
/// attributes, secret), mapped as mtmfs's own bus maps an account (SPEC §2c): `server`,
/// `user`, `protocol`, `port`, `object` are fields, every other attribute an attribute; a
/// secret that is not UTF-8 text, or a content type other than text/plain, is refused.
///
/// Thread-safety: one thread.
enum SecretServiceImport {
    static let mapped = ["server": "server", "user": "username", "protocol": "protocol", "port": "port", "object": "path"]

    static func read(busName: String, alias: String) throws(ImportError) -> [ImportedAccount] {
        var items: [SecretServiceClient.Item] = []
        var locked = false
        do throws(SecretServiceError) {
            let client = try SecretServiceClient(name: busName)
            let collection = try client.collection(alias: alias)
            locked = try client.isLocked(collection)
            if !locked { items = try client.items(of: collection) }
        } catch {
            throw ImportError(error.description)
        }
        if locked { throw ImportError("the collection \(alias) of \(busName) is locked: unlock it there first") }
        defer { items.forEach { $0.wipe() } }
        var accounts: [ImportedAccount] = []
        do throws(ImportError) {
            for item in items {
                guard item.contentType.isEmpty || item.contentType == "text/plain",
                      item.secret.withUnsafeBytes({ AccountFieldSyntax.isValid($0, for: .password) }) else {
                    throw ImportError("the item \(Terminal.printable(item.label)) holds a secret that is not text (\(item.contentType))")
                }
                var account = ImportedAccount()
                do throws(Errno) {
                    account.fields["label"] = try SecureBytes(copying: Array(item.label.utf8))
                    account.fields["password"] = try item.secret.copy()
                    for (name, value) in item.attributes.sorted(by: { $0.key < $1.key }) {
                        let secure = try SecureBytes(copying: Array(value.utf8))
                        if let field = mapped[name] { account.fields[field] = secure } else { account.attributes.append((name, secure)) }
                    }
                } catch {
                    account.wipe()
                    throw ImportError("no secure memory (\(error))")
                }
                accounts.append(account)
            }
        } catch {
            accounts.forEach { $0.wipe() }
            throw error
        }
        return accounts
    }
}

/// A `pass` store (`pass`'s own layout): every `NAME.gpg` below the directory is an account
/// labelled NAME (its path), decrypted by `gpg` as `pass show` does; its first line is the
/// password, `otpauth://` lines the otp, `key: value` lines fields (`user`, `username`,
/// `login` → username; `url`, `website`, `site` → url) or attributes, any other line the
/// comment. gpg's output goes through a pipe straight into secure memory.
///
/// Thread-safety: one thread.
enum PassImport {
    static let usernames: Set<String> = ["user", "username", "login"]
    static let urls: Set<String> = ["url", "website", "site"]

    static func read(_ directory: String) throws(ImportError) -> [ImportedAccount] {
        guard (try? Syscall.lstat(directory + "/.gpg-id")) != nil else {
            throw ImportError("\(Terminal.printable(directory)) is not a pass store (no .gpg-id)")
        }
        var names: [String] = []
        func walk(_ relative: String) {
            let path = relative.isEmpty ? directory : directory + "/" + relative
            for name in ((try? Syscall.listDirectory(path)) ?? []).sorted() where !name.hasPrefix(".") {
                let inner = relative.isEmpty ? name : relative + "/" + name
                guard let info = try? Syscall.lstat(directory + "/" + inner) else { continue }
                if info.st_mode & S_IFMT == S_IFDIR { walk(inner) } else if name.hasSuffix(".gpg") { names.append(inner) }
            }
        }
        walk("")
        var accounts: [ImportedAccount] = []
        do throws(ImportError) {
            for name in names {
                let text = try decrypt(directory + "/" + name, naming: name)
                defer { text.wipe() }
                accounts.append(try account(String(name.dropLast(4)), text))
            }
        } catch {
            accounts.forEach { $0.wipe() }
            throw error
        }
        return accounts
    }

    /// `gpg --decrypt` of one entry, its output read from a pipe into secure memory.
    static func decrypt(_ path: String, naming name: String) throws(ImportError) -> SecureBytes {
        let pipe: (read: Int32, write: Int32)
        do { pipe = try Syscall.pipe() } catch { throw ImportError("cannot make a pipe for gpg: \(error)") }
        defer { Syscall.close(pipe.read) }
        let pid: pid_t
        do {
            pid = try Spawn.start("gpg", ["--quiet", "--batch", "--yes", "--decrypt", path], stdin: .null,
                                  stdout: .descriptor(pipe.write), stderr: .null)
        } catch {
            Syscall.close(pipe.write)
            throw ImportError("cannot run gpg (\(error)): install gnupg")
        }
        Syscall.close(pipe.write)
        let text: SecureBytes
        do { text = try SecretReference.readAll(pipe.read) } catch {
            _ = Spawn.wait(pid)
            throw ImportError("cannot read gpg's output for \(name): \(error)")
        }
        guard Spawn.wait(pid) == 0 else {
            text.wipe()
            throw ImportError("gpg could not decrypt \(Terminal.printable(name)) (is its secret key in this GNUPGHOME, its agent unlocked?)")
        }
        return text
    }

    /// One entry's text as an account.
    static func account(_ label: String, _ text: SecureBytes) throws(ImportError) -> ImportedAccount {
        var account = ImportedAccount()
        do throws(Errno) {
            account.fields["label"] = try SecureBytes(copying: Array(label.utf8))
            let comment = SecureBytes()
            try text.withUnsafeBytes { (all) throws(Errno) in
                var lines = all.split(separator: 0x0A, omittingEmptySubsequences: false)
                if lines.last?.isEmpty == true { lines.removeLast() }
                for (number, line) in lines.enumerated() {
                    let bytes = UnsafeRawBufferPointer(rebasing: line)
                    if number == 0 {
                        account.fields["password"] = try SecureBytes(copying: bytes)
                    } else if bytes.starts(with: Array("otpauth://".utf8)) {
                        account.fields["otp"] = try SecureBytes(copying: bytes)
                    } else if let colon = bytes.firstIndex(of: 0x3A), colon > 0, colon + 1 < bytes.count, bytes[colon + 1] == 0x20,
                              !bytes[..<colon].contains(0x20) {
                        let key = String(decoding: bytes[..<colon], as: UTF8.self).lowercased()
                        let value = try SecureBytes(copying: UnsafeRawBufferPointer(rebasing: bytes[(colon + 2)...]))
                        if usernames.contains(key) { account.fields["username"] = value }
                        else if urls.contains(key) { account.fields["url"] = value }
                        else { account.attributes.append((String(decoding: bytes[..<colon], as: UTF8.self), value)) }
                    } else if !bytes.isEmpty {
                        if comment.count > 0 { try comment.append([0x0A]) }
                        try comment.append(bytes)
                    }
                }
            }
            if comment.count > 0 { account.fields["comment"] = comment } else { comment.wipe() }
        } catch {
            account.wipe()
            throw ImportError("no secure memory (\(error))")
        }
        return account
    }
}

/// KeePass XML, as `keepassxc-cli export --format xml` and KeePassXC's "Export to XML"
/// write it (and `mtmfs export keepassxc`): every `Entry` of every `Group` (not the old
/// versions kept in its `History`), its `String`s mapped — Title, UserName, Password, URL,
/// Notes, otp — and any other key as an attribute; its UUID (base64) kept as the account's.
/// Values stay in secure memory; a value still protected (`Protected="True"`, the inner XML
/// of a database, not an export) is refused.
///
/// Thread-safety: pure functions.
enum KeePassXMLImport {
    static let fields = ["Title": "label", "UserName": "username", "Password": "password", "URL": "url", "Notes": "comment",
                         "otp": "otp"]

    static func parse(_ data: SecureBytes) throws(ImportError) -> [ImportedAccount] {
        try data.withUnsafeBytes { (text) throws(ImportError) -> [ImportedAccount] in
            var accounts: [ImportedAccount] = []
            var stack: [String] = []
            var current: ImportedAccount?
            var key: String?
            var value: SecureBytes?
            var uuidText: [UInt8]?
            var index = 0
            var sawRoot = false
            do throws(ImportError) {
                while index < text.count {
                    guard text[index] == 0x3C else {
                        // Character data: kept only where it is read (a String's Key or Value, an Entry's UUID).
                        let end = (index..<text.count).first { text[$0] == 0x3C } ?? text.count
                        let piece = UnsafeRawBufferPointer(rebasing: text[index..<end])
                        switch stack.last {
                        case "Value": if let value { try decode(piece, into: value) }
                        case "Key":
                            guard let known = key else { break }
                            let decoded = SecureBytes()
                            try decode(piece, into: decoded)
                            key = known + decoded.withUnsafeBytes { String(decoding: $0, as: UTF8.self) }
                            decoded.wipe()
                        case "UUID" where stack.dropLast().last == "Entry" && current != nil: uuidText = Array(piece)
                        default: break
                        }
                        index = end
                        continue
                    }
                    guard let close = (index..<text.count).first(where: { text[$0] == 0x3E }) else {
                        throw ImportError("XML at byte \(index): a tag is not closed")
                    }
                    let tag = String(decoding: text[(index + 1)..<close], as: UTF8.self)
                    index = close + 1
                    if tag.hasPrefix("?") || tag.hasPrefix("!") { continue }
                    if tag.hasPrefix("/") {
                        let name = String(tag.dropFirst()).trimmed(of: " \t\n")
                        guard stack.last == name else { throw ImportError("XML: </\(name)> closes <\(stack.last ?? "nothing")>") }
                        stack.removeLast()
                        if name == "String", current != nil, !stack.contains("History"), let key, let value {
                            if let field = fields[key] {
                                if value.count > 0 { current!.fields[field] = value } else { value.wipe() }
                            } else {
                                current!.attributes.append((key, value))
                            }
                        } else if name == "String" {
                            value?.wipe()
                        }
                        if name == "String" { (key, value) = (nil, nil) }
                        if name == "Entry", var entry = current, !stack.contains("History") {
                            if let uuidText, let bytes = Base64.decode(uuidText), bytes.count == 16 {
                                entry.id = AccountName.string(bytes)
                            }
                            accounts.append(entry)
                            current = nil
                            uuidText = nil
                        }
                        continue
                    }
                    let selfClosing = tag.hasSuffix("/")
                    let name = String((selfClosing ? String(tag.dropLast()) : tag).prefix { $0 != " " && $0 != "\t" && $0 != "\n" })
                    if stack.isEmpty {
                        guard name == "KeePassFile" else { throw ImportError("not KeePass XML (its root is <\(name)>)") }
                        sawRoot = true
                    }
                    if selfClosing { continue }
                    stack.append(name)
                    if name == "Entry" && !stack.dropLast().contains("History") && current == nil { current = ImportedAccount() }
                    if name == "String" && current != nil && !stack.contains("History") { (key, value) = ("", nil) }
                    if name == "Value" && key != nil {
                        if tag.contains("Protected=\"True\"") {
                            throw ImportError("a protected value (the XML of a database, not an export): export it from KeePassXC")
                        }
                        value = SecureBytes()
                    }
                }
                guard sawRoot else { throw ImportError("not KeePass XML (no <KeePassFile>)") }
                guard stack.isEmpty else { throw ImportError("XML: <\(stack.last!)> is not closed") }
            } catch {
                accounts.forEach { $0.wipe() }
                current?.wipe()
                value?.wipe()
                throw error
            }
            return accounts
        }
    }

    /// Character data with its entity references resolved, appended to `out`.
    static func decode(_ piece: UnsafeRawBufferPointer, into out: SecureBytes) throws(ImportError) {
        var index = 0
        func add(_ bytes: UnsafeRawBufferPointer) throws(ImportError) {
            do throws(Errno) { try out.append(bytes) } catch { throw ImportError("no secure memory (\(error))") }
        }
        func add(_ bytes: [UInt8]) throws(ImportError) {
            do throws(Errno) { try out.append(bytes) } catch { throw ImportError("no secure memory (\(error))") }
        }
        do {
            while index < piece.count {
                guard piece[index] == 0x26 else {
                    let end = (index..<piece.count).first { piece[$0] == 0x26 } ?? piece.count
                    try add(UnsafeRawBufferPointer(rebasing: piece[index..<end]))
                    index = end
                    continue
                }
                guard let semicolon = (index..<min(piece.count, index + 12)).first(where: { piece[$0] == 0x3B }) else {
                    throw ImportError("XML: an & that starts no entity")
                }
                let entity = String(decoding: piece[(index + 1)..<semicolon], as: UTF8.self)
                index = semicolon + 1
                switch entity {
                case "amp": try add([0x26])
                case "lt": try add([0x3C])
                case "gt": try add([0x3E])
                case "quot": try add([0x22])
                case "apos": try add([0x27])
                default:
                    let number = entity.hasPrefix("#x") ? UInt32(entity.dropFirst(2), radix: 16)
                        : entity.hasPrefix("#") ? UInt32(entity.dropFirst()) : nil
                    guard let number, let scalar = Unicode.Scalar(number) else { throw ImportError("XML: an unknown entity &\(entity);") }
                    try add(Array(String(scalar).utf8))
                }
            }
        }
    }
}
