#if canImport(Glibc)
import Glibc
#endif
import CredentialVault
import SecureMemory
import FuseLowLevel
import Posix

/// A node of the views of `accounts/` (SPEC §2a): `by-server/<server>/<username>` and
/// `by-label/<label>`, read-only relative symlinks to account directories. Local inodes
/// 2^47 ..< 2^48 (layout in `Identities.swift`).
///
/// Thread-safety: a value.
enum ViewNode: Hashable {
    case byServer
    case byLabel
    /// A server's directory: a serial given to the server value while unlocked.
    case serverDirectory(UInt64)
    case labelLink(AccountID)
    case serverLink(AccountID)

    static let names: [String: ViewNode] = ["by-server": .byServer, "by-label": .byLabel]

    private static let serverBit: UInt64 = 1 << 40
    private static let labelBit: UInt64 = 1 << 44
    private static let linkBit: UInt64 = 1 << 45

    init?(_ local: LocalInode) {
        // 2^47 + 2^46 and up: the accounts' `trusted` files (`TrustedListNode`).
        guard local.raw >= LocalInode.viewBit, local.raw < LocalInode.viewBit + (1 << 46) else { return nil }
        let rest = local.raw - LocalInode.viewBit
        switch rest {
        case 0: self = .byServer
        case 1: self = .byLabel
        case Self.linkBit...: self = .serverLink(AccountID(serial: rest - Self.linkBit))
        case Self.labelBit...: self = .labelLink(AccountID(serial: rest - Self.labelBit))
        case Self.serverBit...: self = .serverDirectory(rest - Self.serverBit)
        default: return nil
        }
    }

    var local: LocalInode {
        switch self {
        case .byServer: LocalInode(LocalInode.viewBit)
        case .byLabel: LocalInode(LocalInode.viewBit + 1)
        case .serverDirectory(let serial): LocalInode(LocalInode.viewBit + Self.serverBit + serial)
        case .labelLink(let account): LocalInode(LocalInode.viewBit + Self.labelBit + account.serial)
        case .serverLink(let account): LocalInode(LocalInode.viewBit + Self.linkBit + account.serial)
        }
    }

    var isDirectory: Bool {
        switch self {
        case .byServer, .byLabel, .serverDirectory: true
        case .labelLink, .serverLink: false
        }
    }
}

/// The serials of the server directories handed to the kernel while unlocked, by the
/// digest of their server value (`IndexDigest`: no server name is kept here). A serial is
/// never given twice; all are forgotten at lock, when the digests stop naming anything.
///
/// Thread-safety: a value behind `VaultService`'s lock.
struct ServerDirectories {
    private var serials: [IndexDigest: UInt64] = [:]
    private var digests: [UInt64: IndexDigest] = [:]
    private var next: UInt64 = 0
    /// Whether any view name went to the kernel since the unlock (then a lock tells the
    /// kernel to forget them).
    var served = false

    mutating func serial(for digest: IndexDigest) -> UInt64 {
        if let serial = serials[digest] { return serial }
        let serial = next
        next += 1
        serials[digest] = serial
        digests[serial] = digest
        return serial
    }

    func digest(of serial: UInt64) -> IndexDigest? { digests[serial] }

    /// Keeps only the servers that still have accounts.
    mutating func keep(_ current: Set<IndexDigest>) {
        for (digest, serial) in serials where !current.contains(digest) {
            serials[digest] = nil
            digests[serial] = nil
        }
    }

    mutating func removeAll() {
        serials.removeAll()
        digests.removeAll()
        served = false
    }
}
