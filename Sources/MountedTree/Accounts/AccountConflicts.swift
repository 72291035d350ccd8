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

/// What an open `trusted` or `conflicts/` file reads: a trusted list (program paths and
/// hashes, no secret) or conflicts (values: secure memory, wiped when let go).
enum HandleText: Sendable {
    case plain([UInt8])
    case secret(SecureBytes)

    func wipe() { if case .secret(let text) = self { text.wipe() } }
}
