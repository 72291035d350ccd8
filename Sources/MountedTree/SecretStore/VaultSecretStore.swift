#if canImport(Glibc)
import Glibc
#endif
import CredentialVault
import SecureMemory
import Posix
import SecretService

/// The accounts as Secret Service items (SPEC §2c): one store, two views. Label is `label`,
/// the secret `password`; libsecret's network-password attributes are fields (`server`,
/// `user` → `username`, `protocol`, `port`, `object` → `path`) and every other attribute a
/// named field `attribute:NAME` of the vault (sealed like the rest), found through the
/// vault's index. A secret's content type other than `text/plain` is the named field
/// `secret-content-type`.
///
/// Guarding decides for bus callers as for opens: the process behind the connection is
/// looked at, and a program not trusted with an account sees its item locked.
public final class VaultSecretStore: SecretStore, @unchecked Sendable {
    /// What the store is a door of.
    let service: VaultService
    var state: Locked<VaultState> { service.state }
    var access: AccessGuard { service.access }

    public init(service: VaultService) { self.service = service }

    func locked<T: Sendable>(_ body: (inout VaultState) throws(Errno) -> T) throws(Errno) -> T { try service.locked(body) }

    static let mappedAttributes: [(attribute: String, field: AccountField, indexed: IndexedAttribute)] = [
        ("server", .server, .server), ("user", .username, .username), ("protocol", .protocol, .protocol),
        ("port", .port, .port), ("object", .path, .path),
    ]
    static let attributePrefix = AccountFields.attributePrefix
    static let contentTypeField = "secret-content-type"

    static func secure(_ text: String) throws(SecretStoreError) -> SecureBytes {
        do throws(Errno) { return try SecureBytes(copying: Array(text.utf8)) } catch { throw .noMemory }
    }

    public var isLocked: Bool { state.withLock { !$0.fields.session.isOpen } }

    public var guardsItems: Bool { service.guarded.load(ordering: .acquiring) }

    public var canSearch: Bool { state.withLock { $0.fields.session.isOpen || $0.lockedSearch != nil } }

    public func allItems() -> [[UInt8]] {
        state.withLock { s in s.fields.session.isOpen ? (s.fields.vault?.accounts.map(\.uuid) ?? []) : [] }
    }

    /// Unlocked, the item as the vault holds it; locked, as the lock found it (its label and
    /// attributes, kept for the bus as gnome-keyring shows a locked item's: libsecret reads
    /// them from the proxies it made while locked), else blank.
    public func item(_ uuid: [UInt8]) -> SecretItem? {
        state.withLock { s -> SecretItem? in
            guard let vault = s.fields.vault, vault.hasAccount(uuid: uuid) else { return nil }
            guard s.fields.session.isOpen else {
                return s.lockedItems[uuid] ?? SecretItem(uuid: uuid, label: "", attributes: [:], created: 0, modified: 0)
            }
            return Self.view(uuid, in: vault)
        }
    }

    /// An account as an item (unlocked; under the service's lock).
    static func view(_ uuid: [UInt8], in vault: Vault) -> SecretItem {
        func text(_ value: SecureBytes?) -> String { value.map { $0.withUnsafeBytes { String(decoding: $0, as: UTF8.self) } } ?? "" }
        var attributes: [String: String] = [:]
        for (name, value) in (try? vault.namedFields(of: uuid)) ?? [:] where name.hasPrefix(Self.attributePrefix) {
            attributes[String(name.dropFirst(Self.attributePrefix.count))] = text(value)
        }
        for mapped in Self.mappedAttributes {
            if let value = try? vault.storedField(mapped.field, of: uuid) { attributes[mapped.attribute] = text(value) }
        }
        let times = vault.times(of: uuid) ?? (0, 0)
        return SecretItem(uuid: uuid, label: text(try? vault.storedField(.label, of: uuid)), attributes: attributes,
                          created: times.created / 1000, modified: times.modified / 1000)
    }

    /// Every item as it is now, read a few hundred at a time (the service's lock is let go
    /// between them): what a lock keeps for the bus.
    static func views(of service: VaultService) -> [[UInt8]: SecretItem] {
        let uuids = service.state.withLock { s in s.fields.session.isOpen ? (s.fields.vault?.accounts.map(\.uuid) ?? []) : [] }
        var views: [[UInt8]: SecretItem] = [:]
        views.reserveCapacity(uuids.count)
        for start in stride(from: 0, to: uuids.count, by: 256) {
            service.state.withLock { s in
                guard s.fields.session.isOpen, let vault = s.fields.vault else { return }
                for uuid in uuids[start..<min(uuids.count, start + 256)] where vault.hasAccount(uuid: uuid) {
                    views[uuid] = view(uuid, in: vault)
                }
            }
        }
        return views
    }

    /// Unlocked, through the vault's index; locked, through the index the lock kept (the
    /// items then come back locked: SPEC §2c).
    public func search(_ attributes: [String: String]) -> [[UInt8]] {
        state.withLock { s -> [[UInt8]] in
            guard let vault = s.fields.vault else { return [] }
            if s.fields.session.isOpen {
                return Self.search(attributes, all: vault.accounts.map(\.uuid),
                                   named: { (try? vault.accounts(namedField: $0, equalTo: $1)) ?? [] },
                                   field: { (try? vault.accounts(with: $0, equalTo: $1)) ?? [] })
            }
            guard let index = s.lockedSearch else { return [] }
            return Self.search(attributes, all: index.accounts,
                               named: { index.accounts(namedField: $0, equalTo: $1) },
                               field: { index.accounts(with: $0, equalTo: $1) })
            .filter { vault.hasAccount(uuid: $0) }
        }
    }

    /// The accounts with every one of `attributes`: each looked up (a named field, and a
    /// field for the mapped ones), the results intersected.
    private static func search(_ attributes: [String: String], all: @autoclosure () -> [[UInt8]],
                               named: (String, UnsafeRawBufferPointer) -> [[UInt8]],
                               field: (IndexedAttribute, UnsafeRawBufferPointer) -> [[UInt8]]) -> [[UInt8]] {
        var result: [[UInt8]]?
        for (name, value) in attributes.sorted(by: { $0.key < $1.key }) {
            var found = Array(value.utf8).withUnsafeBytes { named(attributePrefix + name, $0) }
            if let mapped = mappedAttributes.first(where: { $0.attribute == name }), !value.isEmpty {
                found = Array(value.utf8).withUnsafeBytes { field(mapped.indexed, $0) } + found
            }
            let matching = Set(found)
            result = result.map { $0.filter { matching.contains($0) } } ?? found
            if result?.isEmpty == true { return [] }
        }
        return result ?? all()
    }

    // MARK: Guarding

    /// What guarding needs to decide for a bus caller on an account (nil: guarding does not
    /// cover it): the access, the trusted programs and their version, and who calls.
    private func busAccess(_ uuid: [UInt8], caller: BusCaller, what: String, writing: Bool)
        -> (access: AccessGuard.Access, trusted: [TrustedProgram], version: UInt64, requester: Requester?)? {
        guard let (described, trusted, version) = state.withLock({ s -> (AccessGuard.Access, [TrustedProgram], UInt64)? in
            guard s.fields.session.isOpen, let vault = s.fields.vault, (try? vault.isGuarded()) == true else { return nil }
            return (s.accessDescription(uuid, what: what, writing: writing), (try? vault.trustedPrograms(of: uuid)) ?? [],
                    vault.trustChanges)
        }) else { return nil }
        var access = described
        access.scope = .connection(caller.connection)
        // (Who calls is read outside the lock: /proc, and a program's hash the first time.)
        return (access, trusted, version, caller.pid > 0 ? self.access.inspector.inspect(thread: caller.pid) : nil)
    }

    /// Guarding's decision for a bus caller on an account (nil: guarding does not cover
    /// it), recorded in `.mtmfs/access` as an open's is. The bus asks nobody here: an item
    /// the caller is not trusted with reads as locked until `Unlock` asks a person.
    private func busDecision(_ uuid: [UInt8], caller: BusCaller, what: String, writing: Bool) -> AccessGuard.Decision? {
        guard let (access, trusted, version, requester) = busAccess(uuid, caller: caller, what: what, writing: writing) else { return nil }
        let who = requester ?? Requester.refused(0, "the bus did not say which process called")
        var decision = self.access.decide(who, access, trusted: trusted, trustVersion: version,
                                          asking: .nobody("not trusted (the item reads as locked until Unlock asks)"))
        // Checked again after the decision: still the process it was made about.
        if decision.isAllowed, caller.isGone {
            decision = AccessGuard.Decision(verdict: .denied("the calling process is gone"), undecided: false, requester: who,
                                            access: access, trustVersion: version)
        }
        self.access.record(decision)
        return decision
    }

    // MARK: Unlock prompts

    public func unlock(items: [[UInt8]], caller: BusCaller, done: @escaping @Sendable (UnlockOutcome) -> Void) -> @Sendable () -> Void {
        let prompt = BusPrompt()
        let once = Locked(false)
        let finish: @Sendable (UnlockOutcome) -> Void = { outcome in
            if once.withLock({ told in defer { told = true }; return !told }) { done(outcome) }
        }
        let started = Threads.detach { [weak self] in
            guard let self else { return finish(.dismissed) }
            finish(self.runUnlockPrompt(items: items, caller: caller, prompt: prompt))
        }
        if !started { finish(.dismissed) }
        return { prompt.cancel() }
    }

    public func connectionClosed(_ connection: String) { access.connectionClosed(connection) }

    /// On a prompt's own thread: the passphrase if the vault is locked (three tries), then
    /// each item the caller may not read, through the prompt broker (one at a time).
    private func runUnlockPrompt(items: [[UInt8]], caller: BusCaller, prompt: BusPrompt) -> UnlockOutcome {
        var unlockedVault = false
        if isLocked {
            guard askPassphraseAndUnlock(caller: caller, prompt: prompt) else { return .dismissed }
            unlockedVault = true
        }
        var readable: [[UInt8]] = []
        var refused = false
        for uuid in items {
            if prompt.isCancelled { return .dismissed }
            if mayRead(uuid, caller: caller) {
                readable.append(uuid)
                continue
            }
            guard let (access, _, _, requester) = busAccess(uuid, caller: caller, what: "password", writing: false),
                  let requester, requester.refusal == nil else {
                refused = true
                continue
            }
            if let why = self.access.cannotAsk(requester) {
                self.access.record(allowed: false, why, requester, access)
                refused = true
                continue
            }
            let answered = Semaphore()
            let allowed = Locked(false)
            service.ask(requester, access, waiter: PromptWaiter(
                isInterrupted: { prompt.isCancelled },
                onInterrupt: { prompt.onCancel($0) },
                allowed: { allowed.withLock { $0 = true }; answered.post() },
                refused: { _ in answered.post() }))
            answered.wait()
            if allowed.withLock({ $0 }) && !caller.isGone { readable.append(uuid) } else { refused = true }
        }
        if prompt.isCancelled || (refused && readable.isEmpty && !unlockedVault) { return .dismissed }
        return .unlocked(vault: unlockedVault, items: readable)
    }

    /// The vault's passphrase asked through the pinentry, and the vault unlocked with it.
    private func askPassphraseAndUnlock(caller: BusCaller, prompt: BusPrompt) -> Bool {
        let requester = caller.pid > 0 ? access.inspector.inspect(thread: caller.pid) : nil
        let program = requester.map { "\($0.path) (pid \($0.process))" } ?? "A program (pid unknown)"
        let description = "\(program) asks on the Secret Service to unlock the accounts of \(access.settings.mountPoint).\n\n"
            + "Enter the vault's passphrase to unlock them (for every program, as mtmfs unlock does)."
        var problem: String?
        for _ in 0..<3 {
            let dialog = PinentryDialog()
            access.dialogStarted(dialog)
            prompt.onCancel { dialog.cancel() }
            let answer = dialog.askPassphrase(program: access.settings.program, terminal: requester?.terminal,
                                              environment: access.settings.environment, title: "mtmfs: unlock the accounts",
                                              description: description, error: problem, timeout: access.settings.timeout,
                                              unavailable: access.settings.problem)
            access.dialogEnded(dialog)
            guard case .alwaysAllow(let passphrase) = answer else {
                if case .failed(let why) = answer { Log.warning("Secret Service: the unlock could not ask: \(why)") }
                return !isLocked
            }
            defer { passphrase.wipe() }
            do throws(Errno) {
                try service.unlock(passphrase: passphrase)
                Log.info("unlocked on the Secret Service (the passphrase given at the prompt)")
                return true
            } catch {
                if !isLocked { return true }  // (unlocked another way meanwhile)
                guard error == .permissionDenied else {
                    Log.warning("Secret Service: the unlock failed: \(error)")
                    return false
                }
                problem = "Wrong passphrase: try again."
            }
        }
        return false
    }

    public func mayRead(_ uuid: [UInt8], caller: BusCaller) -> Bool {
        guard !isLocked else { return false }
        return busDecision(uuid, caller: caller, what: "password", writing: false)?.isAllowed ?? true
    }

    private func requireTrust(_ uuid: [UInt8], caller: BusCaller, what: String) throws(SecretStoreError) {
        guard let decision = busDecision(uuid, caller: caller, what: what, writing: true), !decision.isAllowed else { return }
        if decision.undecided { throw .denied("the calling program is not trusted with this account (mtmfs trust)") }
        if case .denied(let why) = decision.verdict { throw .denied(why) }
        throw .denied("not trusted")
    }

    // MARK: Secrets

    /// The secret of an item, decided once: the read happens under the service's lock only
    /// while the trusted lists are the version the decision read (else it is decided again).
    public func secret(_ uuid: [UInt8], caller: BusCaller) throws(SecretStoreError) -> (value: SecureBytes, contentType: String) {
        for _ in 0..<4 {
            guard !isLocked else { throw .locked }
            let decision = busDecision(uuid, caller: caller, what: "password", writing: false)
            if let decision, !decision.isAllowed { throw .denied("not trusted") }
            let read = try secretIfStill(uuid, decidedAgainst: decision?.trustVersion)
            if let read { return read }
        }
        throw .denied("the trusted lists kept changing")
    }

    /// The read itself, under the service's lock; nil when guarding's view changed since the
    /// decision (`version`; nil: decided uncovered — guarding off).
    private func secretIfStill(_ uuid: [UInt8], decidedAgainst version: UInt64?) throws(SecretStoreError) -> (value: SecureBytes, contentType: String)? {
        try state.withLock { (s) throws(SecretStoreError) -> (SecureBytes, String)? in
            guard s.fields.session.isOpen, let vault = s.fields.vault else { throw .locked }
            let guardedNow = (try? vault.isGuarded()) == true
            if let version { guard vault.trustChanges == version else { return nil } } else if guardedNow { return nil }
            guard vault.hasAccount(uuid: uuid) else { throw .noSuchItem }
            s.fields.session.touched()
            let value: SecureBytes
            do throws(Errno) {
                value = try ((try? vault.storedField(.password, of: uuid)) ?? nil)?.copy() ?? SecureBytes()
            } catch {
                throw .noMemory
            }
            let type = ((try? vault.namedFields(of: uuid))?[Self.contentTypeField]).map { $0.withUnsafeBytes { String(decoding: $0, as: UTF8.self) } }
            return (value, type ?? "text/plain")
        }
    }

    public func createItem(label: String, attributes: [String: String], secret: SecureBytes, contentType: String,
                           replace: Bool, caller: BusCaller) throws(SecretStoreError) -> [UInt8] {
        if replace, let existing = search(attributes).first(where: { item($0)?.attributes == attributes }) {
            try requireTrust(existing, caller: caller, what: "account")
            try write(existing, label: label, attributes: attributes, secret: secret, contentType: contentType)
            return existing
        }
        // The creator is trusted with what it creates (as a `mkdir` by a program is).
        let creator: TrustedProgram? = caller.pid > 0 ? access.inspector.inspect(thread: caller.pid).program : nil
        let uuid = SystemRandom().bytes(16).enumerated().map { index, byte in
            index == 6 ? (byte & 0x0F) | 0x40 : index == 8 ? (byte & 0x3F) | 0x80 : byte  // version 4, RFC 4122 variant
        }
        try change(uuid, created: true) { (s, vault) throws(VaultError) in
            let guarded = (try? vault.isGuarded()) == true
            try vault.addAccount(uuid: uuid, name: AccountName.string(uuid), trusting: guarded ? creator.map { [$0] } ?? [] : [])
            _ = s.fields.id(of: uuid)
        }
        do {
            try write(uuid, label: label, attributes: attributes, secret: secret, contentType: contentType)
        } catch {
            try? change(uuid, removed: true) { (_, vault) throws(VaultError) in try vault.removeAccount(uuid: uuid) }
            throw error
        }
        return uuid
    }

    public func setSecret(_ uuid: [UInt8], _ secret: SecureBytes, contentType: String, caller: BusCaller) throws(SecretStoreError) {
        try requireTrust(uuid, caller: caller, what: "password")
        let type = contentType == "text/plain" ? SecureBytes() : try Self.secure(contentType)
        defer { type.wipe() }
        try change(uuid) { (_, vault) throws(VaultError) in
            try vault.setFields([.password: secret], named: [Self.contentTypeField: type], of: uuid)
        }
    }

    public func setLabel(_ uuid: [UInt8], _ label: String, caller: BusCaller) throws(SecretStoreError) {
        try requireTrust(uuid, caller: caller, what: "label")
        let value = try Self.secure(label)
        defer { value.wipe() }
        try change(uuid) { (_, vault) throws(VaultError) in try vault.setFields([.label: value], named: [:], of: uuid) }
    }

    public func setAttributes(_ uuid: [UInt8], _ attributes: [String: String], caller: BusCaller) throws(SecretStoreError) {
        try requireTrust(uuid, caller: caller, what: "attributes")
        try writeAttributes(uuid, attributes, extra: [:], named: [:])
    }

    public func delete(_ uuid: [UInt8], caller: BusCaller) throws(SecretStoreError) {
        try requireTrust(uuid, caller: caller, what: "account")
        try change(uuid, removed: true) { (_, vault) throws(VaultError) in try vault.removeAccount(uuid: uuid) }
    }

    public func lock() { service.lock(reason: "locked on the Secret Service") }

    /// The label last read while unlocked (it is sealed: locked, the last one seen shows).
    private let knownCollectionLabel = Locked<String?>(nil)

    public var collectionLabel: String {
        let read = state.withLock { s -> String?? in
            guard s.fields.session.isOpen, let vault = s.fields.vault else { return .none }
            return .some((try? vault.collectionLabel()) ?? nil)
        }
        switch read {
        case .none: return knownCollectionLabel.withLock { $0 } ?? "Login"
        case .some(let label):
            knownCollectionLabel.withLock { $0 = label }
            return label ?? "Login"
        }
    }

    public func setCollectionLabel(_ label: String, caller: BusCaller) throws(SecretStoreError) {
        do throws(Errno) {
            try locked { (s) throws(Errno) in
                try s.fields.session.requireOpen()
                guard let vault = s.fields.vault else { throw .ioError }
                do throws(VaultError) { try vault.setCollectionLabel(label) } catch { throw error.errno }
            }
        } catch {
            switch error {
            case .permissionDenied: throw .locked
            case .invalidArgument: throw .invalid("a single-file vault keeps no label")
            default: throw .failed("the vault could not be saved: \(error)")
            }
        }
        knownCollectionLabel.withLock { $0 = label.isEmpty ? nil : label }
    }

    public func observe(_ handler: @escaping @Sendable (SecretStoreChange) -> Void) {
        service.servesSecretService.store(true, ordering: .relaxed)
        service.secretObservers.add(handler)
    }

    // MARK: Writing

    /// Label, attributes and secret of an item, in one change.
    private func write(_ uuid: [UInt8], label: String, attributes: [String: String], secret: SecureBytes,
                       contentType: String) throws(SecretStoreError) {
        let labelValue = try Self.secure(label)
        let type = contentType == "text/plain" ? SecureBytes() : try Self.secure(contentType)
        defer { labelValue.wipe(); type.wipe() }
        try writeAttributes(uuid, attributes, extra: [.label: labelValue, .password: secret], named: [Self.contentTypeField: type])
    }

    /// Sets the attributes to exactly `attributes` (the mapped fields that are valid for
    /// their field, the others as named fields; those no longer there removed), with `extra`
    /// fields and `named` fields in the same change.
    private func writeAttributes(_ uuid: [UInt8], _ attributes: [String: String], extra: [AccountField: SecureBytes],
                                 named: [String: SecureBytes]) throws(SecretStoreError) {
        var fields = extra, namedFields = named
        var made: [SecureBytes] = []
        defer { made.forEach { $0.wipe() } }
        func value(_ text: String) throws(SecretStoreError) -> SecureBytes {
            let bytes = try Self.secure(text)
            made.append(bytes)
            return bytes
        }
        let old = state.withLock { s in (try? s.fields.vault?.namedFields(of: uuid)).map { Array($0.keys) } ?? [] }
        for name in old where name.hasPrefix(Self.attributePrefix) { namedFields[name] = try value("") }
        for mapped in Self.mappedAttributes { fields[mapped.field] = try value("") }
        for (name, text) in attributes {
            guard name.utf8.count + Self.attributePrefix.utf8.count <= 255 else { throw .invalid("an attribute name is too long: \(name)") }
            if let mapped = Self.mappedAttributes.first(where: { $0.attribute == name }),
               Array(text.utf8).withUnsafeBytes({ AccountFieldSyntax.isValid($0, for: mapped.field) }) {
                fields[mapped.field] = try value(text)
            } else {
                namedFields[Self.attributePrefix + name] = try value(text)
            }
        }
        try change(uuid) { (_, vault) throws(VaultError) in try vault.setFields(fields, named: namedFields, of: uuid) }
    }

    /// A change of one account on the bus, through the service's lock as a file's is (saved
    /// after the lock), then shown to the kernel and the bus.
    private func change(_ uuid: [UInt8], created: Bool = false, removed: Bool = false,
                        _ body: (inout VaultState, Vault) throws(VaultError) -> Void) throws(SecretStoreError) {
        var attributesDirectory: LocalInode?
        let outcome: Result<String?, Errno> = Result { () throws(Errno) -> String? in
            try locked { (s) throws(Errno) -> String? in
                try s.fields.session.requireOpen()
                guard let vault = s.fields.vault else { throw .ioError }
                guard created || vault.hasAccount(uuid: uuid) else { throw .noSuchFileOrDirectory }
                let name = vault.name(of: uuid)
                do throws(VaultError) { try body(&s, vault) } catch { throw error.errno }
                s.fields.session.touched()
                if let id = s.fields.existingID(of: uuid) {
                    if removed {
                        s.fields.forgetAccount(id)
                    } else {
                        // (Every field and attribute file: the kernel drops what it kept of them.)
                        let indices = Array(AccountFields.names.indices) + s.fields.attributeNames.indices
                        s.fields.changedKeys += indices.map { FieldKey(account: id, index: $0) }
                        attributesDirectory = AccountFields.attributesDirectory(of: id)
                    }
                }
                return name
            }
        }
        switch outcome {
        case .success(let name):
            var invalidations: [Invalidation] = [.inode(.top)]
            if removed, let name { invalidations.append(.entry(parent: .top, name: name)) }
            if let attributesDirectory { invalidations.append(.inode(attributesDirectory)) }
            service.send(invalidations)
            service.secretObservers.notify(.items([uuid]))
        case .failure(let errno):
            switch errno {
            case .permissionDenied: throw .locked
            case .noSuchFileOrDirectory: throw .noSuchItem
            case .invalidArgument: throw .invalid("the vault refused the value (a single-file vault keeps no attributes)")
            default: throw .failed("the vault could not be saved: \(errno)")
            }
        }
    }
}

