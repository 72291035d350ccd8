#if canImport(Glibc)
import Glibc
#endif
import CredentialVault
import Posix

extension AccountsTree {
    /// The fields a question to `.mtmfs/find` may name (the password is not one).
    static let searchableFields: [String: AccountField] = [
        "label": .label, "protocol": .protocol, "server": .server, "port": .port,
        "path": .path, "comment": .comment, "username": .username,
    ]

    /// Answers a question written to `.mtmfs/find` (what `mtmfs find` and the git credential
    /// helper ask): lines `FIELD=VALUE`, each value to match exactly (an empty one matches an
    /// empty field); the answer is the names of the matching accounts, one a line, in the
    /// vault's order. Accounts are found through the vault's index (no scan): candidates
    /// from the smallest group a criterion names, each then compared. An empty question
    /// lists every account. Locked: EACCES; a line that is not `FIELD=VALUE` of a
    /// searchable field: EINVAL.
    public func find(_ question: UnsafeRawBufferPointer) throws(Errno) -> String {
        var criteria: [AccountField: [UInt8]] = [:]
        for line in question.split(separator: 0x0A, omittingEmptySubsequences: true) {
            var line = Array(line)
            if line.last == 0x0D { line.removeLast() }
            guard let equals = line.firstIndex(of: UInt8(ascii: "=")),
                  let field = Self.searchableFields[String(decoding: line[..<equals], as: UTF8.self)],
                  criteria[field] == nil else { throw .invalidArgument }
            criteria[field] = Array(line[(equals + 1)...])
        }
        let names = try locked { (s) throws(Errno) -> [String] in
            try s.fields.session.requireOpen()
            guard let vault = s.fields.vault else { throw .ioError }
            return Self.matches(criteria, in: vault).compactMap { vault.name(of: $0) }
        }
        return names.map { $0 + "\n" }.joined()
    }

    /// The accounts that match every criterion: candidates from the smallest indexed group
    /// the criteria name (or every account, for no criterion), each then compared.
    static func matches(_ criteria: [AccountField: [UInt8]], in vault: Vault) -> [[UInt8]] {
        var groups: [[[UInt8]]] = []
        for attribute in IndexedAttribute.allCases {
            guard let value = criteria[attribute.field] else { continue }
            groups.append(value.withUnsafeBytes { (try? vault.accounts(with: attribute, equalTo: $0)) ?? [] })
        }
        if let server = criteria[.server], let username = criteria[.username] {
            groups.append(server.withUnsafeBytes { s in
                username.withUnsafeBytes { u in (try? vault.accounts(server: s, username: u)) ?? [] }
            })
        }
        let candidates = groups.min { $0.count < $1.count } ?? vault.accounts.map(\.uuid)
        return candidates.filter { uuid in
            criteria.allSatisfy { field, wanted in
                let stored = try? vault.storedField(field, of: uuid)
                return (stored?.withUnsafeBytes { $0.elementsEqual(wanted) }) ?? wanted.isEmpty
            }
        }
    }
}
