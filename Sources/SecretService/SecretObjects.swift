import CSDBus
import SecureMemory

/// The objects of the service and their methods and properties, as the Secret Service
/// specification (0.2) names them and its clients (libsecret, secretstorage) call them.
extension SecretServiceBus {
    enum Object {
        case service
        case collection(CollectionID)
        case item(CollectionID, [UInt8])
        case session(String)
        case prompt(String)
        /// A path that is a directory of others (for introspection only).
        case node
    }

    static let serviceInterface = "org.freedesktop.Secret.Service"
    static let collectionInterface = "org.freedesktop.Secret.Collection"
    static let itemInterface = "org.freedesktop.Secret.Item"
    static let sessionInterface = "org.freedesktop.Secret.Session"
    static let promptInterface = "org.freedesktop.Secret.Prompt"
    static let propertiesInterface = "org.freedesktop.DBus.Properties"
    static let labelProperty = "org.freedesktop.Secret.Item.Label"
    /// An item's Type when it names no schema (`xdg:schema`), as gnome-keyring gives it.
    static let genericType = "org.freedesktop.Secret.Generic"
    static let attributesProperty = "org.freedesktop.Secret.Item.Attributes"

    /// The store of a collection: the vault's, or the session's in memory.
    func source(_ collection: CollectionID) -> any SecretStore {
        switch collection {
        case .login: store
        case .session: sessionItems
        }
    }

    func object(at path: String) throws(BusError) -> Object {
        if path == SecretPaths.root { return .service }
        // The paths above the service (/, /org, /org/freedesktop): nodes leading to it.
        if path == "/" || SecretPaths.root.hasPrefix(path + "/") { return .node }
        guard path.hasPrefix(SecretPaths.root + "/") else {
            throw .unknownMethod("no such interface on object at path \(path)")
        }
        if let collection = SecretPaths.collection(at: path) { return .collection(collection) }
        if let (collection, uuid) = SecretPaths.item(at: path) {
            guard source(collection).item(uuid) != nil else { throw .noSuchObject("no such item: \(path)") }
            return .item(collection, uuid)
        }
        if sessions[path] != nil { return .session(path) }
        if prompts[path] != nil { return .prompt(path) }
        if [SecretPaths.root + "/collection", SecretPaths.aliases, SecretPaths.root + "/session",
            SecretPaths.root + "/prompt"].contains(path) { return .node }
        // A path where a collection or an item would be: what clients map to "no such item"
        // (secretstorage's ItemNotFoundException, libsecret's).
        if path.hasPrefix(SecretPaths.root + "/collection/") || path.hasPrefix(SecretPaths.aliases + "/") {
            throw .noSuchObject("no such object: \(path)")
        }
        throw BusError(name: "org.freedesktop.DBus.Error.UnknownObject", message: "no object at \(path)")
    }

    func dispatch(_ call: BusCall) throws(BusError) -> Reply {
        let object = try object(at: call.path)
        switch call.interface {
        case "org.freedesktop.DBus.Introspectable":
            guard call.member == "Introspect" else { break }
            let xml = Introspection.document(object, path: call.path, items: { collection in source(collection).allItems() },
                                             sessions: Array(sessions.keys), prompts: Array(prompts.keys))
            return Reply { $0.string(xml) }
        case "org.freedesktop.DBus.Peer":
            guard call.member == "Ping" else { break }
            return .empty
        case Self.propertiesInterface:
            return try properties(call, object)
        default:
            break
        }
        let interface = call.interface.isEmpty ? nil : call.interface
        switch object {
        case .service where interface == nil || interface == Self.serviceInterface:
            if let reply = try serviceMethod(call) { return reply }
        case .collection(let collection) where interface == nil || interface == Self.collectionInterface:
            if let reply = try collectionMethod(call, collection) { return reply }
        case .item(let collection, let uuid) where interface == nil || interface == Self.itemInterface:
            if let reply = try itemMethod(call, collection, uuid) { return reply }
        case .session(let path) where interface == nil || interface == Self.sessionInterface:
            if call.member == "Close" {
                // Only its own: a session is another connection's secret channel.
                closeSession(try requireSession(path, call.caller).path)
                return .empty
            }
        case .prompt(let path) where interface == nil || interface == Self.promptInterface:
            if let reply = try promptMethod(call, path) { return reply }
        default:
            break
        }
        throw .unknownMethod("no method \(call.interface).\(call.member) at \(call.path)")
    }

    // MARK: Service

    private func serviceMethod(_ call: BusCall) throws(BusError) -> Reply? {
        let arguments = call.arguments
        switch call.member {
        case "OpenSession":
            let algorithm = try arguments.string()
            switch algorithm {
            case "plain":
                try arguments.skip()  // (the input: an empty string)
                let path = openSession(for: call.caller.connection, key: nil)
                return Reply { writer in
                    writer.variant("s") { $0.string("") }
                    writer.objectPath(path)
                }
            case SessionCrypto.algorithm:
                let theirs = try arguments.variant("ay") { () throws(BusError) in try arguments.bytes() }
                guard let (ours, key) = SessionCrypto.exchange(clientPublic: theirs) else {
                    throw .invalidArgs("the public key is not in 2…p−2 of the 1024-bit group")
                }
                let path = openSession(for: call.caller.connection, key: key)
                return Reply { writer in
                    writer.variant("ay") { writer in ours.withUnsafeBytes { writer.bytes($0) } }
                    writer.objectPath(path)
                }
            default:
                throw .notSupported("the session algorithm \(algorithm) is not supported; use \(SessionCrypto.algorithm) or plain")
            }
        case "CreateCollection":
            _ = try arguments.skip()
            let alias = try arguments.string()
            guard let collection = SecretPaths.collection(ofAlias: alias) else {
                throw .notSupported("two collections only: the vault (alias default or login) and the session's (alias session)")
            }
            return Reply { writer in
                writer.objectPath(SecretPaths.path(of: collection))
                writer.objectPath(SecretPaths.noPrompt)
            }
        case "SearchItems":
            let attributes = try arguments.stringDictionary()
            guard store.canSearch else { return waitToSearch(call, attributes, fromService: true) }
            let (unlocked, locked) = search(attributes, for: call.caller)
            return Self.searchReply(unlocked, locked, fromService: true)
        case "Unlock":
            // What the caller may use now comes back at once; the rest (the vault while
            // locked, items guarding keeps from it) needs a prompt: a person answers.
            let paths = try arguments.objectPaths()
            var unlocked: [String] = [], asked: [[UInt8]] = [], withTheVault: [String] = []
            for path in paths {
                if isUnlocked(path, for: call.caller) {
                    unlocked.append(path)
                } else if SecretPaths.collection(at: path) != nil {
                    withTheVault.append(path)
                } else if let (collection, uuid) = SecretPaths.item(at: path), source(collection).item(uuid) != nil {
                    // (A session item is unlocked with the vault; a vault item may need guarding's yes too.)
                    if collection == .login { asked.append(uuid) } else { withTheVault.append(path) }
                }
            }
            let prompt = !withTheVault.isEmpty || !asked.isEmpty
                ? makePrompt(for: call.caller, .unlock(items: asked, collections: withTheVault))
                : SecretPaths.noPrompt
            return Reply { writer in
                writer.objectPaths(unlocked)
                writer.objectPath(prompt)
            }
        case "Lock":
            let paths = try arguments.objectPaths()
            store.lock()
            return Reply { writer in
                writer.objectPaths(paths)
                writer.objectPath(SecretPaths.noPrompt)
            }
        case "GetSecrets":
            let paths = try arguments.objectPaths()
            let session = try requireSession(try arguments.objectPath(), call.caller)
            var secrets: [(String, SecureBytes, String)] = []  // (session: the caller's, checked above)
            for path in paths {
                // (`secret` decides once per item; an item locked or the caller may not read is
                // left out, as gnome-keyring leaves it out.)
                guard let (collection, uuid) = SecretPaths.item(at: path),
                      let (value, type) = try? source(collection).secret(uuid, caller: call.caller) else { continue }
                secrets.append((path, value, type))
            }
            return Reply(sensitive: true) { writer in
                writer.open("a", "{o(oayays)}")
                for (path, value, type) in secrets {
                    writer.open("e", "o(oayays)")
                    writer.objectPath(path)
                    Self.writeSecret(&writer, session: session, value: value, contentType: type)
                    writer.close()
                    value.wipe()
                }
                writer.close()
            }
        case "ReadAlias":
            let name = try arguments.string()
            let path = SecretPaths.collection(ofAlias: name).map { SecretPaths.path(of: $0) } ?? SecretPaths.noPrompt
            return Reply { $0.objectPath(path) }
        case "SetAlias":
            let name = try arguments.string()
            let path = try arguments.objectPath()
            guard let named = SecretPaths.collection(ofAlias: name), SecretPaths.collection(at: path) == named else {
                throw .notSupported("the aliases default and login name the vault, session the session's collection; no other alias is kept")
            }
            return .empty
        default:
            return nil
        }
    }

    /// The matches of a search in `collections`: those the caller may read now, and the others.
    func search(_ attributes: [String: String], for caller: BusCaller,
                in collections: [CollectionID] = CollectionID.allCases) -> ([String], [String]) {
        var unlocked: [String] = [], locked: [String] = []
        for collection in collections {
            let items = source(collection)
            for uuid in items.search(attributes) {
                let path = SecretPaths.item(uuid, in: collection)
                if !items.isLocked && items.mayRead(uuid, caller: caller) { unlocked.append(path) } else { locked.append(path) }
            }
        }
        return (unlocked, locked)
    }

    /// Service.SearchItems answers `(ao ao)`, Collection.SearchItems `ao`.
    static func searchReply(_ unlocked: [String], _ locked: [String], fromService: Bool) -> Reply {
        Reply { writer in
            if fromService {
                writer.objectPaths(unlocked)
                writer.objectPaths(locked)
            } else {
                writer.objectPaths(unlocked + locked)
            }
        }
    }

    // MARK: Searches before the first unlock

    /// A search that came before the mount's first unlock, kept until it can be answered.
    ///
    /// Thread-safety: on the bus thread only.
    struct WaitingSearch {
        /// The call (referenced until answered).
        let message: OpaquePointer
        let attributes: [String: String]
        let caller: BusCaller
        let fromService: Bool
        let collections: [CollectionID]
    }

    /// Before the mount's first unlock the attributes are sealed and nothing can be found:
    /// an empty answer would have a browser write a new key over its old one. So the
    /// search waits, and the vault's passphrase is asked for (one prompt for every search
    /// waiting), as Unlock would; given, each search is answered; refused, each gets
    /// IsLocked. (A client whose call times out first finds the vault unlocked on its retry.)
    func waitToSearch(_ call: BusCall, _ attributes: [String: String], fromService: Bool,
                      in collections: [CollectionID] = CollectionID.allCases) -> Reply {
        sd_bus_message_ref(call.message)
        waitingSearches.append(WaitingSearch(message: call.message, attributes: attributes,
                                             caller: call.caller, fromService: fromService, collections: collections))
        if searchPrompt == nil {
            searchPrompt = store.unlock(items: [], caller: call.caller) { [weak self] _ in
                self?.post { $0.answerWaitingSearches() }
            }
        }
        return .later
    }

    /// Answers the searches waiting: found (unlocked now, or by another way meanwhile), or
    /// IsLocked (the passphrase was not given).
    func answerWaitingSearches() {
        let waiting = waitingSearches
        waitingSearches.removeAll()
        let prompt = searchPrompt
        searchPrompt = nil
        let found = store.canSearch
        if found { prompt?() }  // (unlocked another way: the dialog goes)
        for search in waiting {
            if found {
                let (unlocked, locked) = self.search(search.attributes, for: search.caller, in: search.collections)
                send(Self.searchReply(unlocked, locked, fromService: search.fromService), to: search.message)
            } else {
                sendError(.isLocked("the collection is locked: its passphrase was not given"), to: search.message)
            }
            sd_bus_message_unref(search.message)
        }
    }

    /// A client left the bus: its waiting searches go unanswered; the prompt goes with the last.
    func dropWaitingSearches(of connection: String) {
        guard waitingSearches.contains(where: { $0.caller.connection == connection }) else { return }
        for search in waitingSearches where search.caller.connection == connection { sd_bus_message_unref(search.message) }
        waitingSearches.removeAll { $0.caller.connection == connection }
        if waitingSearches.isEmpty, let prompt = searchPrompt {
            searchPrompt = nil
            prompt()
        }
    }

    func isUnlocked(_ path: String, for caller: BusCaller) -> Bool {
        if SecretPaths.collection(at: path) != nil { return !store.isLocked }
        guard let (collection, uuid) = SecretPaths.item(at: path) else { return false }
        return !store.isLocked && source(collection).mayRead(uuid, caller: caller)
    }

    /// The caller's own session at `path`.
    func requireSession(_ path: String, _ caller: BusCaller) throws(BusError) -> (path: String, session: Session) {
        guard let session = sessions[path], session.owner == caller.connection else {
            throw .noSession("no session \(path) of this connection")
        }
        return (path, session)
    }

    /// A secret `(oayays)` for `session`: in clear (plain), or encrypted under its key with
    /// a fresh IV as the parameters.
    static func writeSecret(_ writer: inout MessageWriter, session: (path: String, session: Session), value: SecureBytes,
                            contentType: String) {
        writer.open("r", "oayays")
        writer.objectPath(session.path)
        if let key = session.session.key {
            let (iv, ciphertext) = SessionCrypto.encrypt(value, key: key) ?? ([], [])
            iv.withUnsafeBytes { writer.bytes($0) }
            ciphertext.withUnsafeBytes { writer.bytes($0) }
        } else {
            [UInt8]().withUnsafeBytes { writer.bytes($0) }
            value.withUnsafeBytes { writer.bytes($0) }
        }
        writer.string(contentType)
        writer.close()
    }

    /// A secret argument `(oayays)` of a session of the caller's, decrypted when it is an
    /// encrypted one (a wrong IV, length or padding: InvalidArgs).
    func readSecret(_ arguments: MessageReader, _ caller: BusCaller) throws(BusError) -> (SecureBytes, String) {
        guard try arguments.enter("r", "oayays") else { throw .invalidArgs("expected a secret (oayays)") }
        let (_, session) = try requireSession(try arguments.objectPath(), caller)
        let parameters = try arguments.bytes()
        let value = try arguments.secureBytes()
        let type = try arguments.string()
        try arguments.exit()
        guard let key = session.key else {
            guard parameters.isEmpty else {
                value.wipe()
                throw .invalidArgs("a plain session's secret has no parameters")
            }
            return (value, type.isEmpty ? "text/plain" : type)
        }
        defer { value.wipe() }
        guard let plain = value.withUnsafeBytes({ SessionCrypto.decrypt($0, iv: parameters, key: key) }) else {
            throw .invalidArgs("the secret does not decrypt in this session (its IV, length or padding is wrong)")
        }
        return (plain, type.isEmpty ? "text/plain" : type)
    }

    // MARK: Prompts

    /// A prompt the caller asked for, to be shown when it calls Prompt.
    ///
    /// Thread-safety: on the bus thread only.
    struct PendingPrompt {
        /// `items`: the vault's items guarding may need a person's yes for; `collections`:
        /// the paths unlocked with the vault (collections, session items).
        enum Work { case unlock(items: [[UInt8]], collections: [String]) }
        let owner: BusCaller
        let work: Work
        /// Set once shown: dismisses it.
        var dismiss: (@Sendable () -> Void)?
    }

    func makePrompt(for caller: BusCaller, _ work: PendingPrompt.Work) -> String {
        nextPrompt += 1
        let path = SecretPaths.prompt(nextPrompt)
        prompts[path] = PendingPrompt(owner: caller, work: work)
        return path
    }

    private func promptMethod(_ call: BusCall, _ path: String) throws(BusError) -> Reply? {
        guard var prompt = prompts[path] else { return nil }
        guard prompt.owner.connection == call.caller.connection else {
            throw .accessDenied("the prompt \(path) belongs to another connection")
        }
        switch call.member {
        case "Prompt":
            _ = try call.arguments.string()  // (the window to put a dialog over: the pinentry has its own)
            guard prompt.dismiss == nil else { throw .failed("the prompt \(path) is already shown") }
            switch prompt.work {
            case .unlock(let items, let collections):
                prompt.dismiss = store.unlock(items: items, caller: call.caller) { [weak self] outcome in
                    self?.post { $0.completePrompt(path, outcome, collections: collections) }
                }
            }
            if prompts[path] != nil { prompts[path] = prompt }
            return .empty
        case "Dismiss":
            dismissPrompt(path)
            return .empty
        default:
            return nil
        }
    }

    /// A prompt's end: `Completed(dismissed, result)`, with the objects it unlocked (`ao`).
    func completePrompt(_ path: String, _ outcome: UnlockOutcome, collections: [String]) {
        guard prompts.removeValue(forKey: path) != nil else { return }
        var objects: [String] = []
        if case .unlocked(_, let items) = outcome {
            if !store.isLocked { objects += collections }
            objects += items.map { SecretPaths.item($0) }
        }
        emit(path, Self.promptInterface, "Completed") { writer in
            writer.bool(outcome == .dismissed)
            writer.variant("ao") { $0.objectPaths(objects) }
        }
    }

    /// Dismissed by its caller, or its caller left: `Completed(true, [])`; a dialog up goes.
    func dismissPrompt(_ path: String) {
        guard let prompt = prompts[path] else { return }
        if let dismiss = prompt.dismiss {
            dismiss()  // (the store then completes it: dismissed)
        } else {
            completePrompt(path, .dismissed, collections: [])
        }
    }

    // MARK: Collection

    private func collectionMethod(_ call: BusCall, _ collection: CollectionID) throws(BusError) -> Reply? {
        let arguments = call.arguments
        let items = source(collection)
        switch call.member {
        case "SearchItems":
            let attributes = try arguments.stringDictionary()
            guard store.canSearch else { return waitToSearch(call, attributes, fromService: false, in: [collection]) }
            let (unlocked, locked) = search(attributes, for: call.caller, in: [collection])
            return Self.searchReply(unlocked, locked, fromService: false)
        case "CreateItem":
            var label = "", attributes: [String: String] = [:]
            guard try arguments.enter("a", "{sv}") else { throw .invalidArgs("expected properties a{sv}") }
            while try arguments.enter("e", "sv") {
                switch try arguments.string() {
                case Self.labelProperty: label = try arguments.variant("s") { () throws(BusError) in try arguments.string() }
                case Self.attributesProperty:
                    attributes = try arguments.variant("a{ss}") { () throws(BusError) in try arguments.stringDictionary() }
                default: try arguments.skip()
                }
                try arguments.exit()
            }
            try arguments.exit()
            let (secret, type) = try readSecret(arguments, call.caller)
            defer { secret.wipe() }
            let replace = try arguments.bool()
            let uuid = try storeCall { () throws(SecretStoreError) in
                try items.createItem(label: label, attributes: attributes, secret: secret, contentType: type,
                                     replace: replace, caller: call.caller)
            }
            signal(.items([uuid]), in: collection)
            let path = SecretPaths.item(uuid, in: collection)
            return Reply { writer in
                writer.objectPath(path)
                writer.objectPath(SecretPaths.noPrompt)
            }
        case "Delete":
            throw .notSupported(collection == .login ? "the vault's collection cannot be deleted"
                                                     : "the session's collection lives until the mount ends")
        default:
            return nil
        }
    }

    // MARK: Item

    private func itemMethod(_ call: BusCall, _ collection: CollectionID, _ uuid: [UInt8]) throws(BusError) -> Reply? {
        let arguments = call.arguments
        let items = source(collection)
        switch call.member {
        case "GetSecret":
            let session = try requireSession(try arguments.objectPath(), call.caller)
            guard !items.isLocked, items.mayRead(uuid, caller: call.caller) else { throw .isLocked("the item is locked") }
            let (value, type) = try storeCall { () throws(SecretStoreError) in try items.secret(uuid, caller: call.caller) }
            return Reply(sensitive: true) { writer in
                Self.writeSecret(&writer, session: session, value: value, contentType: type)
                value.wipe()
            }
        case "SetSecret":
            let (secret, type) = try readSecret(arguments, call.caller)
            defer { secret.wipe() }
            try storeCall { () throws(SecretStoreError) in try items.setSecret(uuid, secret, contentType: type, caller: call.caller) }
            signal(.items([uuid]), in: collection)
            return .empty
        case "Delete":
            try storeCall { () throws(SecretStoreError) in try items.delete(uuid, caller: call.caller) }
            signal(.items([uuid]), in: collection)
            return Reply { $0.objectPath(SecretPaths.noPrompt) }
        default:
            return nil
        }
    }

    /// A store call, its refusal as the specification's error.
    func storeCall<T>(_ body: () throws(SecretStoreError) -> T) throws(BusError) -> T {
        do {
            return try body()
        } catch {
            switch error {
            case .locked: throw .isLocked()
            case .noSuchItem: throw .noSuchObject()
            case .denied(let why): throw .accessDenied(why)
            case .invalid(let why): throw .invalidArgs(why)
            case .failed(let why): throw .failed(why)
            case .noMemory: throw .noMemory()
            }
        }
    }

    // MARK: Properties

    /// A property: its D-Bus signature and how its value is written.
    struct Property {
        let name: String
        let signature: String
        let write: (inout MessageWriter) -> Void
    }

    func propertyList(_ object: Object, interface given: String, caller: BusCaller) throws(BusError) -> [Property] {
        // An empty name means the object's own interface (the D-Bus specification allows it).
        let interface = given.isEmpty ? Self.interface(of: object) : given
        switch object {
        case .service where interface == Self.serviceInterface:
            let collections = CollectionID.allCases.map { SecretPaths.path(of: $0) }
            return [Property(name: "Collections", signature: "ao") { $0.objectPaths(collections) }]
        case .collection(let collection) where interface == Self.collectionInterface:
            let items = source(collection).allItems().map { SecretPaths.item($0, in: collection) }
            let locked = store.isLocked
            let label = source(collection).collectionLabel
            return [
                Property(name: "Items", signature: "ao") { $0.objectPaths(items) },
                Property(name: "Label", signature: "s") { $0.string(label) },
                Property(name: "Locked", signature: "b") { $0.bool(locked) },
                Property(name: "Created", signature: "t") { $0.uint64(0) },
                Property(name: "Modified", signature: "t") { $0.uint64(0) },
            ]
        case .item(let collection, let uuid) where interface == Self.itemInterface:
            let items = source(collection)
            guard let item = items.item(uuid) else { throw .noSuchObject() }
            let locked = items.isLocked || !items.mayRead(uuid, caller: caller)
            return [
                Property(name: "Locked", signature: "b") { $0.bool(locked) },
                Property(name: "Attributes", signature: "a{ss}") { $0.stringDictionary(item.attributes) },
                Property(name: "Label", signature: "s") { $0.string(item.label) },
                Property(name: "Type", signature: "s") { $0.string(item.attributes["xdg:schema"] ?? Self.genericType) },
                Property(name: "Created", signature: "t") { $0.uint64(item.created) },
                Property(name: "Modified", signature: "t") { $0.uint64(item.modified) },
            ]
        case .session where interface == Self.sessionInterface, .prompt where interface == Self.promptInterface:
            return []  // (interfaces without properties)
        default:
            // An interface the object does not have (gnome-keyring answers InvalidArgs too).
            throw .invalidArgs("no interface \(interface) at this object")
        }
    }

    /// The interface an object's properties are of.
    static func interface(of object: Object) -> String {
        switch object {
        case .service: serviceInterface
        case .collection: collectionInterface
        case .item: itemInterface
        case .session: sessionInterface
        case .prompt: promptInterface
        case .node: ""
        }
    }

    private func properties(_ call: BusCall, _ object: Object) throws(BusError) -> Reply {
        let arguments = call.arguments
        switch call.member {
        case "Get":
            let interface = try arguments.string(), name = try arguments.string()
            guard let property = try propertyList(object, interface: interface, caller: call.caller).first(where: { $0.name == name }) else {
                throw .unknownProperty("no property \(interface).\(name)")
            }
            return Reply { writer in writer.variant(property.signature) { property.write(&$0) } }
        case "GetAll":
            let interface = try arguments.string()
            let list = try propertyList(object, interface: interface, caller: call.caller)
            return Reply { writer in
                writer.open("a", "{sv}")
                for property in list {
                    writer.open("e", "sv")
                    writer.string(property.name)
                    writer.variant(property.signature) { property.write(&$0) }
                    writer.close()
                }
                writer.close()
            }
        case "Set":
            let interface = try arguments.string(), name = try arguments.string()
            if case .collection(let collection) = object, interface == Self.collectionInterface || interface.isEmpty, name == "Label" {
                let label = try arguments.variant("s") { () throws(BusError) in try arguments.string() }
                try storeCall { () throws(SecretStoreError) in try source(collection).setCollectionLabel(label, caller: call.caller) }
                propertiesChanged(SecretPaths.path(of: collection), Self.collectionInterface,
                                  changed: [Property(name: "Label", signature: "s") { $0.string(label) }])
                return .empty
            }
            guard case .item(let collection, let uuid) = object, interface == Self.itemInterface || interface.isEmpty else {
                throw .accessDenied("\(interface).\(name) cannot be set here")
            }
            let items = source(collection)
            switch name {
            case "Label":
                let label = try arguments.variant("s") { () throws(BusError) in try arguments.string() }
                try storeCall { () throws(SecretStoreError) in try items.setLabel(uuid, label, caller: call.caller) }
            case "Attributes":
                let attributes = try arguments.variant("a{ss}") { () throws(BusError) in try arguments.stringDictionary() }
                try storeCall { () throws(SecretStoreError) in try items.setAttributes(uuid, attributes, caller: call.caller) }
            default:
                throw .accessDenied("\(interface).\(name) is read only")
            }
            signal(.items([uuid]), in: collection)
            return .empty
        default:
            throw .unknownMethod("no method \(call.member) of \(Self.propertiesInterface)")
        }
    }

    // MARK: Signals

    /// Tells the bus what changed: items made, changed or removed; the lock state. A client's
    /// proxies of items (libsecret keeps those it loaded while locked) learn the truth from
    /// `PropertiesChanged` on each item and `ItemChanged` on its collection, sent before a
    /// prompt's `Completed` (both are posted to this thread in that order).
    func signal(_ change: SecretStoreChange, in collection: CollectionID = .login) {
        let items = source(collection)
        let collectionPath = SecretPaths.path(of: collection)
        switch change {
        case .items(let uuids):
            var itemsChanged = false
            for uuid in uuids {
                let path = SecretPaths.item(uuid, in: collection)
                let item = items.item(uuid)
                let member: String
                switch (known[collection, default: []].contains(uuid), item != nil) {
                case (false, true): member = "ItemCreated"; known[collection, default: []].insert(uuid); itemsChanged = true
                case (true, false): member = "ItemDeleted"; known[collection]?.remove(uuid); itemsChanged = true
                case (true, true): member = "ItemChanged"
                case (false, false): continue
                }
                if let item, member == "ItemChanged", !items.isLocked { propertiesChanged(path, Self.itemInterface, changed: Self.shown(item)) }
                emit(collectionPath, Self.collectionInterface, member) { $0.objectPath(path) }
            }
            if itemsChanged { propertiesChanged(collectionPath, Self.collectionInterface, invalidated: ["Items"]) }
        case .lockState:
            let locked = store.isLocked
            for id in CollectionID.allCases {
                let source = self.source(id)
                let path = SecretPaths.path(of: id)
                // Locked: the items known while unlocked (the listing keeps them); unlocked: all.
                let uuids = locked ? Array(known[id] ?? []) : source.allItems()
                if !locked { known[id] = Set(uuids) }
                for uuid in uuids {
                    let itemPath = SecretPaths.item(uuid, in: id)
                    var changed = [Property(name: "Locked", signature: "b") { $0.bool(true) }]
                    if !locked, let item = source.item(uuid) {
                        // (Guarded, Locked depends on who asks: a client reads it again, through Unlock.)
                        changed = Self.shown(item) + (source.guardsItems ? [] : [Property(name: "Locked", signature: "b") { $0.bool(false) }])
                    }
                    propertiesChanged(itemPath, Self.itemInterface, changed: changed)
                    emit(path, Self.collectionInterface, "ItemChanged") { $0.objectPath(itemPath) }
                }
                propertiesChanged(path, Self.collectionInterface, changed: [Property(name: "Locked", signature: "b") { $0.bool(locked) }],
                                  invalidated: ["Items"])
                emit(SecretPaths.root, Self.serviceInterface, "CollectionChanged") { $0.objectPath(path) }
            }
            if !waitingSearches.isEmpty && store.canSearch { answerWaitingSearches() }
        }
    }

    /// An unlocked item's properties as a client caches them (all but Locked).
    static func shown(_ item: SecretItem) -> [Property] {
        [
            Property(name: "Label", signature: "s") { $0.string(item.label) },
            Property(name: "Attributes", signature: "a{ss}") { $0.stringDictionary(item.attributes) },
            Property(name: "Type", signature: "s") { $0.string(item.attributes["xdg:schema"] ?? Self.genericType) },
            Property(name: "Created", signature: "t") { $0.uint64(item.created) },
            Property(name: "Modified", signature: "t") { $0.uint64(item.modified) },
        ]
    }

    func propertiesChanged(_ path: String, _ interface: String, changed: [Property] = [], invalidated: [String] = []) {
        emit(path, Self.propertiesInterface, "PropertiesChanged") { writer in
            writer.string(interface)
            writer.open("a", "{sv}")
            for property in changed {
                writer.open("e", "sv")
                writer.string(property.name)
                writer.variant(property.signature) { property.write(&$0) }
                writer.close()
            }
            writer.close()
            writer.open("a", "s")
            for name in invalidated { writer.string(name) }
            writer.close()
        }
    }
}
