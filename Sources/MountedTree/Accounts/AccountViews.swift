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
/// Thread-safety: a value behind `AccountsTree`'s lock.
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

extension AccountsTree {
    /// Views are never cached by the kernel: every change of a field moves a name at once,
    /// and a lock empties them, with nothing to invalidate but the names already handed out.
    static let viewCache = CachePolicy.none
}

extension AccountsTree.State {
    /// The open vault, or nil while locked (the views are empty then).
    private var openVault: Vault? { fields.session.isOpen ? fields.vault : nil }

    private func value(_ field: AccountField, of uuid: [UInt8], in vault: Vault) -> SecureBytes? {
        try? vault.storedField(field, of: uuid)
    }

    private func withValue<T>(_ field: AccountField, of uuid: [UInt8], in vault: Vault,
                              _ body: (UnsafeRawBufferPointer) -> T) -> T {
        if let value = value(field, of: uuid, in: vault) { return value.withUnsafeBytes(body) }
        return body(UnsafeRawBufferPointer(start: nil, count: 0))
    }

    /// The name of an account in by-label, or in its server's directory of by-server.
    private func viewName(of uuid: [UInt8], in node: ViewNode, vault: Vault) -> String? {
        switch node {
        case .byLabel:
            return withValue(.label, of: uuid, in: vault) { label in
                let group = (try? vault.accounts(with: .label, equalTo: label)) ?? []
                return AccountViewNames.name(of: uuid, value: label, group: group)
            }
        case .serverDirectory:
            return withValue(.server, of: uuid, in: vault) { server in
                withValue(.username, of: uuid, in: vault) { username in
                    let group = (try? vault.accounts(server: server, username: username)) ?? []
                    return AccountViewNames.name(of: uuid, value: username, group: group)
                }
            }
        default:
            return nil
        }
    }

    /// The accounts of a server directory, in vault order (empty when it is gone).
    private func accounts(ofServer serial: UInt64, vault: Vault) -> [[UInt8]] {
        guard let digest = views.digest(of: serial) else { return [] }
        return (try? vault.accounts(with: .server, digest: digest)) ?? []
    }

    /// What `name` in a view directory stands for, or ENOENT.
    mutating func viewLookup(_ parent: ViewNode, _ name: String) throws(Errno) -> ViewNode {
        guard let vault = openVault else { throw .noSuchFileOrDirectory }
        views.served = true
        switch parent {
        case .byServer:
            guard let server = AccountViewNames.decode(name),
                  let first = server.withUnsafeBytes({ try? vault.accounts(with: .server, equalTo: $0) })?.first,
                  let digest = try? vault.digest(of: .server, of: first) else { throw .noSuchFileOrDirectory }
            return .serverDirectory(views.serial(for: digest))
        case .byLabel:
            guard let uuid = resolve(name, in: .byLabel, vault: vault, sameValue: { label in
                (try? vault.accounts(with: .label, equalTo: label)) ?? []
            }) else { throw .noSuchFileOrDirectory }
            return .labelLink(fields.id(of: uuid))
        case .serverDirectory(let serial):
            let members = accounts(ofServer: serial, vault: vault)
            guard let first = members.first else { throw .noSuchFileOrDirectory }
            let digest = views.digest(of: serial)
            let found = withValue(.server, of: first, in: vault) { server in
                resolve(name, in: parent, vault: vault, sameValue: { username in
                    (try? vault.accounts(server: server, username: username)) ?? []
                }, within: { (try? vault.digest(of: .server, of: $0)) == digest })
            }
            guard let uuid = found else { throw .noSuchFileOrDirectory }
            return .serverLink(fields.id(of: uuid))
        case .labelLink, .serverLink:
            throw .notDirectory
        }
    }

    /// The account named `name` in a view directory: the first account of the value the
    /// name stands for, or one whose name carries its UUID suffix.
    private func resolve(_ name: String, in node: ViewNode, vault: Vault,
                         sameValue: (UnsafeRawBufferPointer) -> [[UInt8]],
                         within: ([UInt8]) -> Bool = { _ in true }) -> [UInt8]? {
        if let value = AccountViewNames.decode(name),
           !value.withUnsafeBytes({ AccountViewNames.encode($0).cut }),
           let first = value.withUnsafeBytes({ sameValue($0) }).first {
            return first
        }
        guard let (_, prefix) = AccountViewNames.splitSuffix(name) else { return nil }
        for uuid in (try? vault.accounts(uuidPrefix: prefix)) ?? [] where within(uuid) {
            if viewName(of: uuid, in: node, vault: vault) == name { return uuid }
        }
        return nil
    }

    func viewAttributes(_ node: ViewNode, _ space: InodeSpace) throws(Errno) -> Attributes {
        let inode = space.inode(node.local)
        switch node {
        case .byServer, .byLabel:
            return ownership.directory(inode, mode: 0o555)
        case .serverDirectory(let serial):
            guard let vault = openVault, !accounts(ofServer: serial, vault: vault).isEmpty else { throw .noSuchFileOrDirectory }
            return ownership.directory(inode, mode: 0o555)
        case .labelLink, .serverLink:
            let target = try viewLinkTarget(node)
            var attributes = ownership.file(inode, mode: 0o777, size: UInt64(target.utf8.count))
            attributes.mode = S_IFLNK | 0o777
            return attributes
        }
    }

    func viewLinkTarget(_ node: ViewNode) throws(Errno) -> String {
        guard let vault = openVault else { throw .noSuchFileOrDirectory }
        switch node {
        case .labelLink(let account), .serverLink(let account):
            guard let uuid = fields.uuid(of: account), let name = vault.name(of: uuid) else { throw .noSuchFileOrDirectory }
            if case .serverLink = node { return "../../" + name }
            return "../" + name
        default:
            throw .invalidArgument
        }
    }

    /// A view directory's entries; empty while locked.
    mutating func viewList(_ node: ViewNode) throws(Errno) -> [(String, ViewNode)] {
        guard let vault = openVault else {
            if case .serverDirectory = node { throw .noSuchFileOrDirectory }
            return []
        }
        views.served = true
        switch node {
        case .byServer:
            let servers = (try? vault.servers()) ?? []
            views.keep(Set(servers.map(\.digest)))
            return servers.compactMap { server in
                guard let first = server.accounts.first else { return nil }
                let name = withValue(.server, of: first, in: vault) { AccountViewNames.encode($0, limit: 255).name }
                return (name, .serverDirectory(views.serial(for: server.digest)))
            }.sorted { $0.0 < $1.0 }
        case .byLabel:
            return vault.accounts.compactMap { account in
                viewName(of: account.uuid, in: .byLabel, vault: vault).map { ($0, .labelLink(fields.id(of: account.uuid))) }
            }
        case .serverDirectory(let serial):
            let members = accounts(ofServer: serial, vault: vault)
            guard !members.isEmpty else { throw .noSuchFileOrDirectory }
            return members.compactMap { uuid in
                viewName(of: uuid, in: node, vault: vault).map { ($0, .serverLink(fields.id(of: uuid))) }
            }
        case .labelLink, .serverLink:
            throw .notDirectory
        }
    }

    /// At lock, while the vault is still open: the names the kernel may still hold in the
    /// views (their dentries would keep names made of fields), all to be forgotten.
    mutating func viewNamesToForget() -> [Invalidation] {
        defer { views.removeAll() }
        guard views.served, let vault = openVault else { return [] }
        var forget: [Invalidation] = []
        var servers: [IndexDigest: (serial: UInt64, name: String)] = [:]
        for account in vault.accounts {
            if let name = viewName(of: account.uuid, in: .byLabel, vault: vault) {
                forget.append(.entry(parent: ViewNode.byLabel.local, name: name))
            }
            guard let digest = try? vault.digest(of: .server, of: account.uuid) else { continue }
            if servers[digest] == nil {
                let name = withValue(.server, of: account.uuid, in: vault) { AccountViewNames.encode($0, limit: 255).name }
                servers[digest] = (views.serial(for: digest), name)
                forget.append(.entry(parent: ViewNode.byServer.local, name: name))
            }
            if let serial = servers[digest]?.serial,
               let name = viewName(of: account.uuid, in: .serverDirectory(serial), vault: vault) {
                forget.append(.entry(parent: ViewNode.serverDirectory(serial).local, name: name))
            }
        }
        return forget
    }
}
