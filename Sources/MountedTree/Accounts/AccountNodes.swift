#if canImport(Glibc)
import Glibc
#endif
import CredentialVault
import SecureMemory
import FuseLowLevel
import Posix

/// The tree of `accounts/` as the kernel sees it, read from the vault service's state:
/// attributes, names and listings of accounts, fields, views, `trusted` and `conflicts/`,
/// and the changes made by name (mkdir, rmdir, unlink, rename, links).
extension VaultState {
    func attributes(_ local: LocalInode, _ space: InodeSpace) throws(Errno) -> Attributes {
        if let view = ViewNode(local) { return try viewAttributes(view, space) }
        if let node = ConflictNode(local) { return try conflictAttributes(node, space) }
        if let list = TrustedListNode(local) {
            guard fields.uuid(of: list.account) != nil else { throw .noSuchFileOrDirectory }
            return ownership.file(space.inode(local), mode: 0o400, size: 0)
        }
        if local.isFile {
            var attributes = try engine.attributes(of: local, as: space.inode(local), ownership: ownership, fields)
            if engine.files[local]?.key?.isTOTP == true { attributes.mode = (attributes.mode & ~0o777) | 0o400 }
            return attributes
        }
        guard local == .top || fields.owner(of: local) != nil else { throw .noSuchFileOrDirectory }
        return ownership.directory(space.inode(local), mode: 0o700)
    }

    func cache(for local: LocalInode) -> CachePolicy {
        if TrustedListNode(local) != nil || ConflictNode(local) != nil { return .none }
        if let view = ViewNode(local) { return view == .byServer || view == .byLabel ? AccountsTree.directoryCache : AccountsTree.viewCache }
        guard local.isFile else { return AccountsTree.directoryCache }
        return fields.session.isOpen ? AccountsTree.fieldCache : AccountsTree.lockedFieldCache
    }

    /// The account of a directory inode (ENOTDIR for a file, ENOENT for a removed account).
    func account(at directory: LocalInode) throws(Errno) -> AccountID {
        if directory.isFile { throw .notDirectory }
        guard let account = fields.account(at: directory) else { throw .noSuchFileOrDirectory }
        return account
    }

    /// Whether an account's `attributes/` still holds something: an attribute not being
    /// unlinked, or an editor's file (rmdir of it, and of the account, wait for them).
    func hasAttributesLeft(_ account: AccountID) -> Bool {
        engine.hasScratchFiles(in: AccountFields.attributesDirectory(of: account))
            || fields.attributes(of: account).contains { !engine.isLeaving(fields.attributeKey(account, $0)) }
    }

    /// The same for a directory whose files are keys: an account's, or its `attributes/`.
    func owner(at directory: LocalInode) throws(Errno) -> AccountID {
        if directory.isFile { throw .notDirectory }
        guard let account = fields.owner(of: directory) else { throw .noSuchFileOrDirectory }
        return account
    }

    // MARK: Names

    mutating func lookup(_ parent: LocalInode, _ name: String) throws(Errno) -> LocalInode {
        if let view = ViewNode(parent) { return try viewLookup(view, name).local }
        if let node = ConflictNode(parent) { return try conflictLookup(node, name) }
        if parent == .top, let view = ViewNode.names[name] { return view.local }
        guard parent == .top else {
            let account = try owner(at: parent)
            if fields.attributesOwner(parent) != nil { return try engine.lookup(name, in: parent, fields) }
            if name == TrustedListNode.name { return TrustedListNode(account: account).local }
            if name == ConflictNode.name {
                guard !conflictFiles(of: account).isEmpty else { throw .noSuchFileOrDirectory }
                return ConflictNode.directory(account).local
            }
            if name == AccountFields.attributesName, fields.account(at: parent) != nil {
                try fields.session.requireOpen()
                return AccountFields.attributesDirectory(of: account)
            }
            return try engine.lookup(name, in: parent, fields)
        }
        if engine.scratch(named: name, in: .top) != nil { return try engine.lookup(name, in: .top, fields) }
        guard let account = fields.account(named: name) else { throw .noSuchFileOrDirectory }
        return fields.id(of: account.uuid).directory
    }

    mutating func list(_ local: LocalInode) throws(Errno) -> [(String, LocalInode)] {
        if let view = ViewNode(local) { return try viewList(view).map { ($0.0, $0.1.local) } }
        if let node = ConflictNode(local) {
            guard case .directory(let account) = node else { throw .notDirectory }
            return conflictFiles(of: account)
        }
        var entries: [(String, LocalInode)] = []
        if local == .top {
            entries = [("by-label", ViewNode.byLabel.local), ("by-server", ViewNode.byServer.local)]
            for account in fields.vault?.accounts ?? [] {
                entries.append((account.name, fields.id(of: account.uuid).directory))
            }
        } else if let account = fields.attributesOwner(local) {
            for attribute in fields.attributes(of: account) {
                guard let name = AttributeFileName.fileName(of: attribute) else { continue }
                let key = fields.attributeKey(account, attribute)
                guard !engine.isHidden(key), engine.scratch(named: name, in: local) == nil else { continue }
                entries.append((name, engine.file(for: key, fields)))
            }
        } else {
            let account = try account(at: local)
            for (index, name) in AccountFields.names.enumerated() {
                if index == AccountFields.totpIndex && !fields.hasOTP(account) { continue }
                let key = FieldKey(account: account, index: index)
                guard !engine.isHidden(key), engine.scratch(named: name, in: local) == nil else { continue }
                entries.append((name, engine.file(for: key, fields)))
            }
            // Listed while guarding is on (it means nothing otherwise; by name it always opens).
            if (try? fields.vault?.isGuarded()) == true {
                entries.append((TrustedListNode.name, TrustedListNode(account: account).local))
            }
            if !conflictFiles(of: account).isEmpty { entries.append((ConflictNode.name, ConflictNode.directory(account).local)) }
            if fields.session.isOpen { entries.append((AccountFields.attributesName, AccountFields.attributesDirectory(of: account))) }
        }
        entries += engine.scratchFiles(in: local).map { ($0.name, $0.inode) }
        return entries
    }

    mutating func makeAccount(_ name: String, trusting creator: TrustedProgram?) throws(Errno) -> LocalInode {
        if ViewNode.names[name] != nil { throw .fileExists }
        try fields.session.requireOpen()
        // (The nil UUID is the vault's own: its guarding flag lives there, docs/vault-format-3.md.)
        guard let uuid = AccountName.uuidBytes(name), uuid.contains(where: { $0 != 0 }) else { throw .invalidArgument }
        guard let vault = fields.vault else { throw .ioError }
        if vault.hasAccount(uuid: uuid) || engine.scratch(named: name, in: .top) != nil { throw .fileExists }
        do {
            let guarded = (try? vault.isGuarded()) == true
            try vault.addAccount(uuid: uuid, name: name, trusting: guarded ? creator.map { [$0] } ?? [] : [])
        } catch {
            throw error.errno
        }
        Log.debug("vault saved: account \(name) added (\(vault.accountCount) accounts)")
        fields.touched.insert(uuid)
        return fields.id(of: uuid).directory
    }

    mutating func removeAccount(_ name: String) throws(Errno) {
        if ViewNode.names[name] != nil { throw .permissionDenied }
        try fields.session.requireOpen()
        guard let account = fields.account(named: name), let vault = fields.vault else {
            if engine.scratch(named: name, in: .top) != nil { throw .notDirectory }
            throw .noSuchFileOrDirectory
        }
        let id = fields.id(of: account.uuid)
        if engine.hasScratchFiles(in: id.directory) { throw .directoryNotEmpty }
        // Fields always exist: an account with any value is not empty (`rm -r` unlinks
        // each field first — they wait to leave — then removes the directory).
        for (index, field) in AccountField.allCases.enumerated() {
            let key = FieldKey(account: id, index: index)
            if engine.isLeaving(key) { continue }
            let value: SecureBytes
            do { value = try vault.field(field, of: account.uuid) } catch { throw error.errno }
            if value.count > 0 { throw .directoryNotEmpty }
        }
        if hasAttributesLeft(id) { throw .directoryNotEmpty }
        do {
            try vault.removeAccount(uuid: account.uuid)
        } catch {
            throw error.errno
        }
        Log.debug("vault saved: account \(name) removed (\(vault.accountCount) accounts)")
        for index in AccountFields.names.indices + fields.attributeNames.indices {
            engine.keyGone(FieldKey(account: id, index: index), fields)
        }
        fields.forgetAccount(id)
        fields.touched.insert(account.uuid)
    }

    mutating func create(_ parent: LocalInode, _ name: String, mode: mode_t, flags: Int32,
                         handle: FileHandle, requester: pid_t) throws(Errno) -> LocalInode {
        if ViewNode(parent) != nil { throw .permissionDenied }
        if parent == .top && ViewNode.names[name] != nil { throw .fileExists }
        try fields.session.requireOpen()
        guard parent != .top else { throw .permissionDenied }
        _ = try owner(at: parent)
        guard name.utf8.count <= 255 else { throw .nameTooLong }
        return try engine.create(name, in: parent, mode: mode, exclusive: flags & O_EXCL != 0,
                                 truncate: flags & O_TRUNC != 0, handle: handle, requester: requester, fields)
    }

    mutating func makeSymbolicLink(_ target: String, in parent: LocalInode, _ name: String,
                                   requester: pid_t) throws(Errno) -> LocalInode {
        if ViewNode(parent) != nil { throw .permissionDenied }
        if parent == .top && ViewNode.names[name] != nil { throw .fileExists }
        if parent == .top {
            if fields.account(named: name) != nil { throw .fileExists }
        } else {
            try fields.session.requireOpen()
            _ = try owner(at: parent)
        }
        if parent != .top && !EditorNames.isEditorFile(name) { throw .notPermitted }  // a field is no link
        return try engine.makeSymbolicLink(target, named: name, in: parent, requester: requester, fields)
    }

    mutating func unlink(_ parent: LocalInode, _ name: String) throws(Errno) {
        if ViewNode(parent) != nil { throw .permissionDenied }
        if parent == .top && ViewNode.names[name] != nil { throw .isDirectory }
        if parent == .top {
            if engine.scratch(named: name, in: .top) != nil { return try engine.unlink(name, in: .top, &fields) }
            if fields.account(named: name) != nil { throw .isDirectory }
            throw .noSuchFileOrDirectory
        }
        try fields.session.requireOpen()
        _ = try owner(at: parent)
        if name == AccountFields.attributesName && fields.account(at: parent) != nil { throw .isDirectory }
        try engine.unlink(name, in: parent, &fields)
    }

    mutating func rename(_ from: LocalInode, _ name: String, _ to: LocalInode, _ newName: String,
                         flags: RenameFlags, requester: pid_t) throws(Errno) {
        if ViewNode(from) != nil || ViewNode(to) != nil { throw .permissionDenied }
        if (from == .top && ViewNode.names[name] != nil) || (to == .top && ViewNode.names[newName] != nil) {
            throw .permissionDenied
        }
        try fields.session.requireOpen()
        guard from != .top, to != .top else { throw .notPermitted }
        guard try owner(at: from) == owner(at: to) else { throw .crossDevice }
        // A field and an attribute are not one another's (the engine's keys of two
        // directories: a move between them is refused by the store).
        for (directory, fileName) in [(from, name), (to, newName)]
        where fileName == AccountFields.attributesName && fields.account(at: directory) != nil {
            throw .permissionDenied
        }
        try engine.rename(name, in: from, to: newName, in: to, flags: flags, requester: requester, &fields)
    }

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

    /// How many accounts have the value a view link's name stands for, its own included:
    /// its account's label (`by-label`), or server and username (`by-server`) — the link's
    /// link count. More than one: the name without a `~` suffix is the first account's, and
    /// a script's reference by it is ambiguous (SPEC §6), which `mtmfs run` learns from the
    /// lookup that found the link, with no request of its own.
    private func namesakes(of uuid: [UInt8], in vault: Vault, label: Bool) -> Int {
        if label {
            return withValue(.label, of: uuid, in: vault) { ((try? vault.accounts(with: .label, equalTo: $0)) ?? []).count }
        }
        return withValue(.server, of: uuid, in: vault) { server in
            withValue(.username, of: uuid, in: vault) { ((try? vault.accounts(server: server, username: $0)) ?? []).count }
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
        case .labelLink(let account), .serverLink(let account):
            let target = try viewLinkTarget(node)
            var attributes = ownership.file(inode, mode: 0o777, size: UInt64(target.utf8.count))
            attributes.mode = S_IFLNK | 0o777
            if let vault = openVault, let uuid = fields.uuid(of: account) {
                attributes.linkCount = UInt32(clamping: max(1, namesakes(of: uuid, in: vault, label: node == .labelLink(account))))
            }
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

