#if canImport(Glibc)
import Glibc
#endif
import CredentialVault
import SecureMemory
import FuseLowLevel
import Posix

/// `accounts/<UUID>/conflicts/` (SPEC §2b): the other values of fields changed on two
/// machines apart, one file per field (`conflicts/password`: one line per other value,
/// the value escaped, then the device and the time), and `conflicts/removed` for removals
/// that lost against a change made apart. Read only; there while something is unresolved
/// (writing the field resolves it). With guarding on, `password`'s conflicts open only for
/// a program trusted with the account (no prompt: the password itself asks).
enum ConflictNode: Hashable {
    case directory(AccountID)
    case file(AccountID, index: Int)

    static let name = "conflicts"
    /// The file of lost removals (the other names are the fields').
    static let removedName = "removed"
    static let removedIndex = 15

    // 2^47 + 2^46 + 2^44 and up (the `trusted` files are below): the directories, then
    // from 2^45 the files, sixteen inode numbers per account.
    private static let directoryBit: UInt64 = LocalInode.viewBit + (1 << 46) + (1 << 44)
    private static let fileBit: UInt64 = LocalInode.viewBit + (1 << 46) + (1 << 45)

    init?(_ local: LocalInode) {
        switch local.raw {
        case Self.fileBit..<(LocalInode.viewBit << 1):
            let rest = local.raw - Self.fileBit
            self = .file(AccountID(serial: rest >> 4), index: Int(rest & 15))
        case Self.directoryBit..<Self.fileBit:
            self = .directory(AccountID(serial: local.raw - Self.directoryBit))
        default:
            return nil
        }
    }

    var local: LocalInode {
        switch self {
        case .directory(let account): LocalInode(Self.directoryBit + account.serial)
        case .file(let account, let index): LocalInode(Self.fileBit + account.serial << 4 + UInt64(index))
        }
    }

    var account: AccountID {
        switch self {
        case .directory(let account), .file(let account, _): account
        }
    }

    /// A file's name: the field's, or `removed`.
    static func fileName(_ index: Int) -> String {
        index == removedIndex ? removedName : AccountField.allCases[index].rawValue
    }

    /// One line: a value with `\`, tab and newline escaped (`\\`, `\t`, `\n`), then the
    /// device and the time of its change (UTC), tab-separated.
    static func text(_ others: [AccountConflicts.Other], values: Bool) throws(Errno) -> SecureBytes {
        let out = SecureBytes()
        do throws(Errno) {
            for other in others.sorted(by: { ($0.milliseconds, $0.device) > ($1.milliseconds, $1.device) }) {
                if values {
                    try other.value.withUnsafeBytes { (value) throws(Errno) in
                        // Runs of plain bytes go straight from the value to secure memory; only
                        // the escapes (constants) are made here.
                        var run = 0
                        for (at, byte) in value.enumerated() where byte == 0x5C || byte == 0x09 || byte == 0x0A {
                            try out.append(UnsafeRawBufferPointer(rebasing: value[run..<at]))
                            let escape: StaticString = byte == 0x5C ? "\\\\" : byte == 0x09 ? "\\t" : "\\n"
                            try out.append(UnsafeRawBufferPointer(start: escape.utf8Start, count: escape.utf8CodeUnitCount))
                            run = at + 1
                        }
                        try out.append(UnsafeRawBufferPointer(rebasing: value[run...]))
                    }
                    try out.append([0x09])
                }
                let time = ISO8601.text(unixSeconds: Double(other.milliseconds) / 1000)
                let device = String(other.device, radix: 16)
                try out.append(Array((String(repeating: "0", count: max(0, 16 - device.count)) + device + "\t" + time + "\n").utf8))
            }
        } catch {
            out.wipe()
            throw error
        }
        return out
    }
}

extension AccountsTree.State {
    /// The account's conflicts while unlocked (nil: none).
    func conflicts(of account: AccountID) -> AccountConflicts? {
        guard fields.session.isOpen, let uuid = fields.uuid(of: account) else { return nil }
        return fields.vault?.conflicts(of: uuid)
    }

    /// The names in `conflicts/`: the fields with other values, then `removed`.
    func conflictFiles(of account: AccountID) -> [(String, LocalInode)] {
        guard let conflicts = conflicts(of: account) else { return [] }
        var entries = AccountField.allCases.indices.filter { conflicts.fields[AccountField.allCases[$0]] != nil }
            .map { (ConflictNode.fileName($0), ConflictNode.file(account, index: $0).local) }
        if !conflicts.removals.isEmpty {
            entries.append((ConflictNode.removedName, ConflictNode.file(account, index: ConflictNode.removedIndex).local))
        }
        return entries
    }

    func conflictLookup(_ node: ConflictNode, _ name: String) throws(Errno) -> LocalInode {
        guard case .directory(let account) = node else { throw .notDirectory }
        guard let entry = conflictFiles(of: account).first(where: { $0.0 == name }) else { throw .noSuchFileOrDirectory }
        return entry.1
    }

    func conflictAttributes(_ node: ConflictNode, _ space: InodeSpace) throws(Errno) -> Attributes {
        let files = conflictFiles(of: node.account)
        guard !files.isEmpty else { throw .noSuchFileOrDirectory }
        switch node {
        // 0700 (its files are read only): `rm -r` of the account descends without asking.
        case .directory: return ownership.directory(space.inode(node.local), mode: 0o700)
        case .file:
            guard files.contains(where: { $0.1 == node.local }) else { throw .noSuchFileOrDirectory }
            return ownership.file(space.inode(node.local), mode: 0o400, size: 0)
        }
    }
}

extension AccountsTree {
    /// An open of a conflicts file: its text made now (into secure memory), served by
    /// direct I/O from the handle; password's only for a trusted program when guarded.
    func openConflicts(_ node: ConflictNode, flags: Int32, context: RequestContext) throws(Errno) -> OpenedFile {
        guard case .file(let account, let index) = node else { throw .isDirectory }
        guard flags & O_ACCMODE == O_RDONLY else { throw .permissionDenied }
        let field: AccountField? = index == ConflictNode.removedIndex ? nil : AccountField.allCases[index]
        let secret = field == .password || field == .otp
        let requester = secret ? self.requester(context) : nil
        let (handle, text) = try locked { (s) throws(Errno) -> (FileHandle, SecureBytes) in
            try s.fields.session.requireOpen()
            guard let conflicts = s.conflicts(of: account), let uuid = s.fields.uuid(of: account) else { throw .noSuchFileOrDirectory }
            let others = field.map { conflicts.fields[$0] ?? [] } ?? conflicts.removals
            guard !others.isEmpty else { throw .noSuchFileOrDirectory }
            if secret, let vault = s.fields.vault, (try? vault.isGuarded()) == true {
                let who = requester ?? self.access.inspector.inspect(thread: context.pid)
                let access = s.accessDescription(uuid, what: "conflicts/\(field?.rawValue ?? "")", writing: false)
                // (Under the tree's lock: the text is made with the list decided against.)
                let decision = self.access.decide(who, access, trusted: try s.trustedPrograms(uuid), trustVersion: vault.trustChanges,
                                                  asking: .nobody("not trusted (conflicts do not ask: open the password first)"))
                self.access.record(decision)
                guard decision.isAllowed else { throw .permissionDenied }
            }
            s.fields.session.touched()
            let handle = s.fields.session.newHandle()
            s.fields.session.opened(handle, of: node.local)
            return (handle, try ConflictNode.text(others, values: field != nil))
        }
        handleTexts.withLock { $0.attach(.secret(text), to: handle) }
        return OpenedFile(handle: handle.raw, directIO: true, noFlush: true)
    }

    func readConflicts(handle: UInt64, offset: UInt64, size: Int, reply: (UnsafeRawBufferPointer) -> Void) throws(Errno) {
        try state.withLock { (s) throws(Errno) in
            guard s.fields.session.isCurrent(FileHandle(raw: handle)), s.fields.session.isOpen else { throw .permissionDenied }
        }
        let piece = try handleTexts.withLock { (texts) throws(Errno) -> SecureBytes? in
            guard case .secret(let text) = texts[FileHandle(raw: handle)] else { throw .badFileDescriptor }
            guard offset < UInt64(text.count) else { return nil }
            return try text.withUnsafeBytes { (all) throws(Errno) in
                let start = Int(offset)
                return try SecureBytes.allocate(copying: UnsafeRawBufferPointer(rebasing: all[start..<min(all.count, start + size)]), in: replies)
            }
        }
        defer { piece?.wipe() }
        guard let piece else { return reply(UnsafeRawBufferPointer(start: nil, count: 0)) }
        piece.withUnsafeBytes { reply($0) }
    }

    func releaseConflicts(_ node: ConflictNode, handle: UInt64) {
        handleTexts.withLock { $0.release(FileHandle(raw: handle)) }?.wipe()
        state.withLock { $0.fields.session.released(FileHandle(raw: handle), of: node.local) }
    }
}

/// What an open `trusted` or `conflicts/` file reads: a trusted list (program paths and
/// hashes, no secret) or conflicts (values: secure memory, wiped when let go).
enum HandleText: Sendable {
    case plain([UInt8])
    case secret(SecureBytes)

    func wipe() { if case .secret(let text) = self { text.wipe() } }
}
