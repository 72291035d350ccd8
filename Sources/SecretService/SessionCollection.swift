import Posix
import SecureMemory

/// The `session` collection (alias `session`, libsecret's `SECRET_COLLECTION_SESSION`:
/// "remember until logout"): items kept in secure memory while the service runs, never
/// written to the vault nor shown in `accounts/`. It is locked and unlocked with the vault
/// (`vault`): while the vault is locked its items are locked too, their secrets kept but
/// given to no one; at the service's end they are wiped.
///
/// Its items are not guarded (they have no trusted list): any program of the user may read
/// them while the vault is unlocked, as gnome-keyring's session items.
///
/// Thread-safety: behind its own lock; never called under the vault store's lock.
final class SessionCollection: SecretStore, @unchecked Sendable {
    struct Item {
        var label: String
        var attributes: [String: String]
        var secret: SecureBytes
        var contentType: String
        var created: UInt64
        var modified: UInt64
    }

    let vault: any SecretStore
    private let state = Locked<(order: [[UInt8]], items: [[UInt8]: Item])>(([], [:]))

    init(vault: any SecretStore) { self.vault = vault }

    /// Wipes every secret (the service ends).
    func wipe() {
        state.withLock { s in
            for item in s.items.values { item.secret.wipe() }
            s = ([], [:])
        }
    }

    var isLocked: Bool { vault.isLocked }
    var guardsItems: Bool { false }
    var canSearch: Bool { !vault.isLocked }

    func allItems() -> [[UInt8]] { isLocked ? [] : state.withLock { $0.order } }

    func item(_ uuid: [UInt8]) -> SecretItem? {
        let locked = isLocked
        return state.withLock { s in
            guard let item = s.items[uuid] else { return nil }
            // (Locked: an item that is there, with nothing shown of it, as the vault's.)
            guard !locked else { return SecretItem(uuid: uuid, label: "", attributes: [:], created: 0, modified: 0) }
            return SecretItem(uuid: uuid, label: item.label, attributes: item.attributes, created: item.created, modified: item.modified)
        }
    }

    func search(_ attributes: [String: String]) -> [[UInt8]] {
        guard !isLocked else { return [] }
        return state.withLock { s in
            s.order.filter { uuid in attributes.allSatisfy { s.items[uuid]?.attributes[$0.key] == $0.value } }
        }
    }

    func mayRead(_ uuid: [UInt8], caller: BusCaller) -> Bool { !isLocked }

    func secret(_ uuid: [UInt8], caller: BusCaller) throws(SecretStoreError) -> (value: SecureBytes, contentType: String) {
        guard !isLocked else { throw .locked }
        return try state.withLock { (s) throws(SecretStoreError) -> (value: SecureBytes, contentType: String) in
            guard let item = s.items[uuid] else { throw .noSuchItem }
            do throws(Errno) { return (try item.secret.copy(), item.contentType) } catch { throw .noMemory }
        }
    }

    func createItem(label: String, attributes: [String: String], secret: SecureBytes, contentType: String,
                    replace: Bool, caller: BusCaller) throws(SecretStoreError) -> [UInt8] {
        guard !isLocked else { throw .locked }
        let copy: SecureBytes
        do throws(Errno) { copy = try secret.copy() } catch { throw .noMemory }
        let now = WallClock.milliseconds / 1000
        return state.withLock { (s: inout (order: [[UInt8]], items: [[UInt8]: Item])) -> [UInt8] in
            if replace, let uuid = s.order.first(where: { s.items[$0]?.attributes == attributes }), var item = s.items[uuid] {
                item.secret.wipe()
                (item.label, item.secret, item.contentType, item.modified) = (label, copy, contentType, now)
                s.items[uuid] = item
                return uuid
            }
            let uuid = Sodium.randomBytes(16)
            s.order.append(uuid)
            s.items[uuid] = Item(label: label, attributes: attributes, secret: copy, contentType: contentType, created: now, modified: now)
            return uuid
        }
    }

    func setSecret(_ uuid: [UInt8], _ secret: SecureBytes, contentType: String, caller: BusCaller) throws(SecretStoreError) {
        let copy: SecureBytes
        do throws(Errno) { copy = try secret.copy() } catch { throw .noMemory }
        try change(uuid) { item in
            item.secret.wipe()
            (item.secret, item.contentType) = (copy, contentType)
        }
    }

    func setLabel(_ uuid: [UInt8], _ label: String, caller: BusCaller) throws(SecretStoreError) {
        try change(uuid) { $0.label = label }
    }

    func setAttributes(_ uuid: [UInt8], _ attributes: [String: String], caller: BusCaller) throws(SecretStoreError) {
        try change(uuid) { $0.attributes = attributes }
    }

    func delete(_ uuid: [UInt8], caller: BusCaller) throws(SecretStoreError) {
        guard !isLocked else { throw .locked }
        try state.withLock { (s) throws(SecretStoreError) in
            guard let item = s.items.removeValue(forKey: uuid) else { throw .noSuchItem }
            item.secret.wipe()
            s.order.removeAll { $0 == uuid }
        }
    }

    private func change(_ uuid: [UInt8], _ body: (inout Item) -> Void) throws(SecretStoreError) {
        guard !isLocked else { throw .locked }
        let now = WallClock.milliseconds / 1000
        try state.withLock { (s) throws(SecretStoreError) in
            guard var item = s.items[uuid] else { throw .noSuchItem }
            body(&item)
            item.modified = now
            s.items[uuid] = item
        }
    }

    var collectionLabel: String { "Session" }
    func setCollectionLabel(_ label: String, caller: BusCaller) throws(SecretStoreError) {
        throw .denied("the session collection's label is fixed")
    }

    // Locked and unlocked with the vault, through its store.
    func lock() { vault.lock() }
    func unlock(items: [[UInt8]], caller: BusCaller, done: @escaping @Sendable (UnlockOutcome) -> Void) -> @Sendable () -> Void {
        vault.unlock(items: [], caller: caller, done: done)
    }
    func connectionClosed(_ connection: String) {}
    func observe(_ handler: @escaping @Sendable (SecretStoreChange) -> Void) {}
}
