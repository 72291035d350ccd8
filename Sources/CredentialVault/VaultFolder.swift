#if canImport(Glibc)
import Glibc
#endif
import CSodium
import Posix
import SecureMemory

/// A vault of format 3 on disk: a folder of write-once files (`DATA_DIR/vault/`), kept in
/// step between machines by git or a file synchroniser (`docs/vault-format-3.md`). Each change is a new sealed file under this machine's device id; key slots
/// wrap the master key under a passphrase; `id` names the vault.
///
/// Locked, it knows the clear parts of the files (which accounts exist, their names);
/// `open(with:)` authenticates and opens every file with the master key. A file that does
/// not parse or does not open is skipped and named in `skipped`, never loaded; the others
/// still load.
///
/// Thread-safety: none of its own; the owner serializes access.
public final class VaultFolder: @unchecked Sendable {
    public let path: String
    public let vaultID: [UInt8]
    /// This machine's device id (its files are the only ones it writes).
    public private(set) var device: UInt64
    let random: RandomSource
    /// Milliseconds since 1970 (the physical part of the clock; fixed in the test vectors).
    let now: @Sendable () -> UInt64
    /// The newest clock seen in a file or written: the next change is later than it.
    public private(set) var clock: UInt64 = 0
    /// The valid files' changes, by path relative to the folder (changed only through
    /// `put`, `drop` and `dropAll`, which keep `filesByAccount`).
    public private(set) var files: [String: [AccountChange]] = [:]
    /// For each account, the files that hold a change of it and where in each: one
    /// account's changes without a walk through every file (a save at 10,000 accounts) or
    /// through every change of a file that holds many accounts (a fold, an import).
    private var filesByAccount: [[UInt8]: [String: [Int]]] = [:]
    /// Files passed over, with why (relative path → reason).
    public private(set) var skipped: [String: String] = [:]
    private var parsed: [String: ChangeFile.Parsed] = [:]
    private var skippedStamps: [String: [Int]] = [:]
    /// Files prepared and not yet finished (in `files`, perhaps not yet on disk).
    private var pending = Set<String>()
    private var slots: [String: KeySlot] = [:]
    /// Whether `files` hold the sealed fields (after `open(with:)`).
    public private(set) var isOpen = false
    /// Scans made by `rescan` (with the owner's lock held, as a daemon does only at open).
    public private(set) var lockedScans = 0
    /// Counts opens and closes: a scan made before one is stale (`apply`).
    private var generation = 0
    /// Closed with its files' clear parts kept from when it was open: `open` reads the disk.
    private var needsReading = false
    /// Files being written that the last `open` did not read (see `needsScan`).
    private var unread = Set<String>()

    static let idFile = "id"
    static let keysFolder = "keys"

    private func put(_ relative: String, _ changes: [AccountChange]) {
        if let old = files[relative] { forget(relative, old) }
        files[relative] = changes
        for (position, change) in changes.enumerated() { filesByAccount[change.uuid, default: [:]][relative, default: []].append(position) }
    }

    @discardableResult
    private func drop(_ relative: String) -> [AccountChange]? {
        guard let old = files.removeValue(forKey: relative) else { return nil }
        forget(relative, old)
        return old
    }

    private func dropAll() {
        files.removeAll()
        filesByAccount.removeAll()
    }

    private func forget(_ relative: String, _ changes: [AccountChange]) {
        for uuid in Set(changes.map(\.uuid)) {
            filesByAccount[uuid]?[relative] = nil
            if filesByAccount[uuid]?.isEmpty == true { filesByAccount[uuid] = nil }
        }
    }

    /// One account's valid changes, in the order of their files' paths (as `changes`).
    public func changes(of uuid: [UInt8]) -> [AccountChange] {
        guard let byFile = filesByAccount[uuid] else { return [] }
        return byFile.keys.sorted().flatMap { relative -> [AccountChange] in
            guard let all = files[relative] else { return [] }
            return byFile[relative]!.map { all[$0] }
        }
    }

    /// Every valid change, in the order of their files' paths (one order on every machine).
    public var changes: [AccountChange] { files.sorted { $0.key < $1.key }.flatMap { $0.value } }

    // MARK: Creating and opening

    /// Makes a new, empty vault folder at `path` (which must not exist) with one key slot
    /// for `passphrase`; returns it open, with its master key.
    public static func create(at path: String, deviceFile: String, passphrase: SecureBytes, parameters: KDFParameters,
                              random: RandomSource = SystemRandom(),
                              now: @escaping @Sendable () -> UInt64 = VaultFolder.realTime) throws(VaultError) -> (VaultFolder, SecureBytes) {
        guard parameters.isStrongEnough else { throw .weakParameters }
        Sodium.initialize()
        let vaultID = random.bytes(16)
        do throws(Errno) {
            try Syscall.mkdir(path, mode: 0o700)
            try Syscall.mkdir(path + "/" + keysFolder, mode: 0o700)
            try AtomicFile.replace(path + "/" + idFile, with: Array((ASCIIHex.string(vaultID) + "\n").utf8))
            try AtomicFile.syncDirectory(AtomicFile.parentDirectory(of: path))
        } catch {
            throw .io(error)
        }
        let folder = try VaultFolder(path: path, deviceFile: deviceFile, random: random, now: now)
        let key: SecureBytes
        do throws(Errno) {
            key = try SecureBytes(copying: random.bytes(VaultFormat.keySize))
        } catch {
            throw .io(error)
        }
        folder.isOpen = true
        try folder.addSlot(passphrase: passphrase, parameters: parameters, key: key)
        return (folder, key)
    }

    /// Reads the folder at `path` (locked): its id, this machine's device id (made anew when
    /// `deviceFile` is missing or was made on another machine or for another folder), the key
    /// slots and the clear part of every change file.
    public init(path: String, deviceFile: String, random: RandomSource = SystemRandom(),
                now: @escaping @Sendable () -> UInt64 = VaultFolder.realTime) throws(VaultError) {
        Sodium.initialize()
        self.path = path
        self.random = random
        self.now = now
        let idText: [UInt8]
        do throws(Errno) {
            let fd = try Syscall.open(path + "/" + Self.idFile, O_RDONLY)
            defer { Syscall.close(fd) }
            idText = try Syscall.readAll(fd)
        } catch {
            throw error == .noSuchFileOrDirectory ? .damaged("\(path) has no id file: not a vault folder") : .io(error)
        }
        guard let id = ASCIIHex.bytes(String(decoding: idText, as: UTF8.self).trimmingSuffix("\n")), id.count == 16 else {
            throw .damaged("its id file is not 32 hex digits")
        }
        vaultID = id
        device = try DeviceIdentity.device(file: deviceFile, folder: path, random: random)
        try rescan()
    }

    /// The vault id the folder's `id` file holds now (nil: none, or not an id).
    public var idOnDisk: [UInt8]? {
        guard let text = try? Syscall.readFile(path + "/" + Self.idFile) else { return nil }
        return ASCIIHex.bytes(String(decoding: text, as: UTF8.self).trimmingSuffix("\n"))
    }

    /// Reads what appeared since the last scan (a synchroniser's or git's new files, a
    /// folded file) and forgets files that went. New files of an open folder are opened too.
    /// Returns the accounts whose changes came or went (nil: no file came or went).
    /// All at once, under the caller's lock; a daemon scans in three steps instead
    /// (`scanBasis`, `scan` without its lock, `apply`).
    @discardableResult
    public func rescan(key: SecureBytes? = nil, arena: SecureArena? = nil) throws(VaultError) -> Set<[UInt8]>? {
        lockedScans += 1
        let found = Self.scan(scanBasis(), key: key, arena: arena)
        switch try apply(found) {
        case .stale: return nil  // (cannot be: nothing ran between the steps)
        case .unchanged: return nil
        case .changed(let accounts): return accounts
        }
    }

    /// What a scan starts from, taken under the owner's lock (cheap: names and stamps).
    public struct ScanBasis: Sendable {
        let path: String
        let device: UInt64
        let vaultID: [UInt8]
        let isOpen: Bool
        let generation: Int
        /// Change files the folder holds or is writing: the scan reads only others.
        let known: Set<String>
        /// Those of them on disk already (not being written): only these can be found gone.
        /// A file being written may be listed by the scan before its write, and is no less
        /// there for it.
        let written: Set<String>
        /// Files skipped, with their size and time then: read again only once changed.
        let skippedStamps: [String: [Int]]
        let knownSlots: Set<String>
    }

    public func scanBasis() -> ScanBasis {
        let held = Set(files.keys).union(parsed.keys)
        // (A file being written that the last open did not read is not known: a scan reads it.)
        return ScanBasis(path: path, device: device, vaultID: vaultID, isOpen: isOpen, generation: generation,
                  known: held.union(pending.subtracting(unread)), written: held.subtracting(pending),
                  skippedStamps: skippedStamps.filter { skipped[$0.key] != nil },
                  knownSlots: Set(slots.keys).union(skipped.keys.filter { $0.hasPrefix(Self.keysFolder + "/") }
                      .map { String($0.dropFirst(Self.keysFolder.count + 1)) }))
    }

    /// What a scan found on disk: read, synced (another machine's files), parsed and — for
    /// an open folder — authenticated and opened, with no lock held. `apply` takes it in;
    /// a scan not applied must be wiped.
    ///
    /// Thread-safety: made by one thread, then handed to the owner (not shared).
    public final class Scan: @unchecked Sendable {
        let basis: ScanBasis
        var listed = Set<String>()
        var present = Set<String>()
        var loaded: [(relative: String, clock: UInt64, file: ChangeFile.Parsed, opened: [AccountChange]?)] = []
        var notes: [(relative: String, reason: String)] = []
        var stamps: [String: [Int]] = [:]
        var slotsPresent = Set<String>()
        var slotsRead: [(name: String, slot: KeySlot)] = []
        var failure: VaultError?

        init(basis: ScanBasis) { self.basis = basis }

        /// Change files it read, and how many of them it opened (decrypted).
        public var readCount: Int { loaded.count }
        public var openedCount: Int { loaded.filter { $0.opened != nil }.count }

        /// Moves the values it opened into `arena` (a copy each; the scan's own are wiped),
        /// so that the scan's arena can go at once. ENOMEM: every value is wiped.
        public func move(into arena: SecureArena) throws(Errno) {
            do throws(Errno) {
                for index in loaded.indices {
                    guard let opened = loaded[index].opened else { continue }
                    var moved: [AccountChange] = []
                    for change in opened {
                        var copy = change
                        if let fields = change.fields {
                            var values: [AccountChange.FieldValue] = []
                            for field in fields {
                                var kept = field
                                kept.value = try field.value.withUnsafeBytes { (bytes) throws(Errno) in
                                    try SecureBytes.allocate(copying: bytes, in: arena)
                                }
                                values.append(kept)
                            }
                            copy.fields = values
                        }
                        change.wipe()
                        moved.append(copy)
                    }
                    loaded[index].opened = moved
                }
            } catch {
                wipe()
                throw error
            }
        }

        /// Zeroes the values it opened.
        public func wipe() {
            for item in loaded { item.opened?.forEach { $0.wipe() } }
            loaded.removeAll()
        }
    }

    /// Reads the folder against `basis`, without the owner's lock: every file it does not
    /// know is read (another machine's synced first), parsed and, with `key` (a copy the
    /// caller wipes), opened into `arena`. The slow part of a scan: nothing here touches
    /// the folder's state.
    public static func scan(_ basis: ScanBasis, key: SecureBytes?, arena: SecureArena?) -> Scan {
        let found = Scan(basis: basis)
        let path = basis.path
        /// Other machines' folders that new files were read from (their names synced).
        var arrived = Set<String>()
        let names: [String]
        do throws(Errno) { names = try Syscall.listDirectory(path) } catch {
            found.failure = .io(error)
            return found
        }
        for name in names where name != idFile && name != keysFolder && !name.hasPrefix(".") {
            found.listed.insert(name)
            guard let device = ChangeFile.parseDevice(name) else {
                found.notes.append((name, "not a device folder"))
                continue
            }
            guard let entries = try? Syscall.listDirectory(path + "/" + name) else { continue }
            for entry in entries {
                let relative = name + "/" + entry
                found.listed.insert(relative)
                guard let fileClock = ChangeFile.parseName(entry) else {
                    if !entry.hasPrefix(".") || entry.hasPrefix(".syncthing.") {
                        found.notes.append((relative, "not a change file (\(kind(of: entry)))"))
                    }
                    continue
                }
                found.present.insert(relative)
                guard !basis.known.contains(relative) else { continue }
                // A skipped file is read again once it changed (one caught half-written).
                let stamp = stamp(path + "/" + relative)
                if let old = basis.skippedStamps[relative], old == stamp { continue }
                found.stamps[relative] = stamp
                do throws(VaultError) {
                    let foreign = device != basis.device
                    let bytes = try read(path + "/" + relative, syncing: foreign)
                    if foreign && !arrived.contains(name) {
                        // Its name too, and its folder's (once a scan).
                        do throws(Errno) {
                            try AtomicFile.syncDirectory(path + "/" + name)
                            if arrived.isEmpty { try AtomicFile.syncDirectory(path) }
                        } catch {
                            throw .io(error)
                        }
                        arrived.insert(name)
                    }
                    let file = try ChangeFile.parse(bytes, device: device, clock: fileClock)
                    if basis.isOpen {
                        // Only opened files join an open folder (a scan without the key
                        // leaves new ones for the next scan with it).
                        guard let key, let arena else { continue }
                        let opened = try ChangeFile.open(file, vaultID: basis.vaultID, path: relative, key: key, arena: arena)
                        found.loaded.append((relative, fileClock, file, opened))
                    } else {
                        found.loaded.append((relative, fileClock, file, nil))
                    }
                } catch {
                    if case .io(.noMemory) = error {
                        found.failure = error
                        return found
                    }
                    found.notes.append((relative, error.description))
                }
            }
        }
        scanSlots(found)
        return found
    }

    /// Whether a scan's basis is still the folder's (not opened or closed since).
    public func isCurrent(_ found: Scan) -> Bool { found.basis.generation == generation }

    /// How `apply` took a scan in.
    public enum Applied: Equatable {
        /// The folder was opened or closed since the scan's basis: its values are wiped,
        /// and the caller scans again.
        case stale
        /// No file came or went.
        case unchanged
        /// These accounts' changes came or went.
        case changed(Set<[UInt8]>)
    }

    /// Takes a scan in, under the owner's lock (no disk, no decryption): the files it read
    /// join, the files it found gone leave, skipped files are named. A scan's values are
    /// the folder's from here on, or wiped.
    public func apply(_ found: Scan) throws(VaultError) -> Applied {
        guard found.basis.generation == generation else {
            found.wipe()
            return .stale
        }
        unloaded.subtract(found.present)
        if let failure = found.failure {
            found.wipe()
            throw failure
        }
        var changed = false
        var affected = Set<[UInt8]>()
        for (relative, stamp) in found.stamps { skippedStamps[relative] = stamp }
        for item in found.loaded {
            // Written here meanwhile (a save, a fold): the folder's own copy stays.
            guard files[item.relative] == nil, !pending.contains(item.relative) else {
                item.opened?.forEach { $0.wipe() }
                continue
            }
            if let opened = item.opened {
                put(item.relative, opened)
                affected.formUnion(opened.map(\.uuid))
            } else {
                parsed[item.relative] = item.file
                put(item.relative, item.file.changes)
                affected.formUnion(item.file.changes.map(\.uuid))
            }
            seeClock(item.clock)
            skipped[item.relative] = nil
            changed = true
        }
        found.loaded.removeAll()
        for (relative, reason) in found.notes { note(relative, reason) }
        for relative in found.basis.written where !found.present.contains(relative) && !pending.contains(relative) {
            guard files[relative] != nil || parsed[relative] != nil else { continue }
            if let gone = drop(relative) {
                affected.formUnion(gone.map(\.uuid))
                gone.forEach { $0.wipe() }
            }
            parsed[relative] = nil
            changed = true
        }
        for (name, slot) in found.slotsRead where slots[name] == nil {
            slots[name] = slot
            if let slotClock = KeySlot.parseName(name)?.clock { seeClock(slotClock) }
        }
        for name in found.basis.knownSlots where !found.slotsPresent.contains(name) { slots[name] = nil }
        let listed = found.listed.union(found.slotsPresent.map { Self.keysFolder + "/" + $0 })
        skipped = skipped.filter { listed.contains($0.key) }  // gone from the folder: no longer named
        skippedStamps = skippedStamps.filter { skipped[$0.key] != nil }
        return changed ? .changed(affected) : .unchanged
    }

    /// Size and modification time: what tells a skipped file changed.
    static func stamp(_ path: String) -> [Int] {
        guard let info = try? Syscall.lstat(path) else { return [] }
        return [Int(info.st_size), info.st_mtim.tv_sec, info.st_mtim.tv_nsec]
    }

    /// A clock read from a file's or a slot's name (not yet authenticated): the next change
    /// is made later, but never more than a day ahead of the wall clock (a forged name
    /// cannot push every clock to its end).
    private func seeClock(_ seen: UInt64) {
        clock = max(clock, min(seen, (now() + 86_400_000) << 16))
    }

    private func note(_ relative: String, _ reason: String) {
        if skipped[relative] == nil { Log.error("vault file \(relative) skipped: \(reason)") }
        skipped[relative] = reason
    }

    static func kind(of name: String) -> String {
        if name.contains(".sync-conflict-") { return "a synchroniser's conflict copy" }
        if name.hasPrefix(".syncthing.") { return "a synchroniser's temporary file" }
        if name.hasSuffix("~") { return "a backup copy" }
        return "an unexpected name"
    }

    /// A file's bytes; `syncing`: made durable first (a file another program brought —
    /// git, a synchroniser — that nothing synced: a fold may drop what it supersedes).
    static func read(_ path: String, syncing: Bool = false) throws(VaultError) -> [UInt8] {
        do {
            let fd = try Syscall.open(path, O_RDONLY | O_NOFOLLOW)
            defer { Syscall.close(fd) }
            var info = stat()
            _ = try Syscall.valueOrErrno { fstat(fd, &info) }
            guard info.st_size <= ChangeFile.maximumFileSize else { throw VaultError.damaged("larger than \(ChangeFile.maximumFileSize >> 20) MiB") }
            if syncing { try Syscall.fsync(fd) }
            return try Syscall.readAll(fd)
        } catch let error as VaultError {
            throw error
        } catch let error as Errno {
            throw .io(error)
        } catch {
            throw .io(.ioError)
        }
    }

    // MARK: Keys

    /// The master key that `passphrase` unwraps, from the slots of `kind` no other slot
    /// retired (or, when none opens, from a retired one whose retirers are not genuine).
    public func masterKey(passphrase: SecureBytes, kind: SlotKind = .passphrase) throws(VaultError) -> SecureBytes {
        let retired = Set(slots.values.flatMap(\.retires))
        // Newest first, by clock (a name's device part must not decide).
        let ordered = slots.filter { $0.value.kind == kind }.sorted { (KeySlot.parseName($0.key)?.clock ?? 0, $0.key) > (KeySlot.parseName($1.key)?.clock ?? 0, $1.key) }
        var keks: [[UInt8]: SecureBytes] = [:]
        defer { keks.values.forEach { $0.wipe() } }
        func kek(for slot: KeySlot) -> SecureBytes? {
            let lookup = slot.salt + VaultFormat.bigEndian(slot.parameters.operations, 8) + VaultFormat.bigEndian(slot.parameters.memoryBytes, 8)
            if let kek = keks[lookup] { return kek }
            guard let kek = try? Vault.deriveKey(passphrase, salt: slot.salt, parameters: slot.parameters) else { return nil }
            keks[lookup] = kek
            return kek
        }
        func open(_ name: String, _ slot: KeySlot) throws(VaultError) -> SecureBytes? {
            let path = Self.keysFolder + "/" + name
            guard let kek = kek(for: slot) else { return nil }
            let unwrapped: SecureBytes?
            do throws(Errno) { unwrapped = try slot.unwrap(kek: kek, vaultID: vaultID, path: path) } catch { throw .io(error) }
            guard let key = unwrapped else { return nil }
            guard slot.proves(key: key, vaultID: vaultID, path: path) else {
                key.wipe()
                return nil
            }
            return key
        }
        for (name, slot) in ordered where !retired.contains(name) {
            if let key = try open(name, slot) { return key }
        }
        for (name, slot) in ordered where retired.contains(name) {
            guard let key = try open(name, slot) else { continue }
            let genuineRetirers = slots.filter { $0.value.retires.contains(name) && $0.value.proves(key: key, vaultID: vaultID, path: Self.keysFolder + "/" + $0.key) }
            if genuineRetirers.isEmpty { return key }
            key.wipe()
        }
        throw .wrongPassphrase
    }

    /// Removes the key slots that a genuine slot retired (any device's: nothing else
    /// writes them, and an old passphrase must stop opening them); needs the master key.
    public func removeRetiredSlots(key: SecureBytes) {
        var removed = false
        var durable = Set<String>()
        let keys = path + "/" + Self.keysFolder
        for (name, _) in slots {
            let retirers = slots.filter { $0.value.retires.contains(name) && $0.value.proves(key: key, vaultID: vaultID, path: Self.keysFolder + "/" + $0.key) }
            guard !retirers.isEmpty else { continue }
            // The slots that retire it are durable before it goes (another machine's came
            // by git or a synchroniser, unsynced): never a moment with no slot that opens.
            do throws(Errno) {
                for retirer in retirers.keys where !durable.contains(retirer) {
                    let fd = try Syscall.open(keys + "/" + retirer, O_RDONLY | O_NOFOLLOW | O_CLOEXEC)
                    defer { Syscall.close(fd) }
                    try Syscall.fsync(fd)
                    durable.insert(retirer)
                }
                try AtomicFile.syncDirectory(keys)
            } catch {
                continue
            }
            try? Syscall.unlink(keys + "/" + name)
            slots[name] = nil
            removed = true
        }
        // (An unlock calls this under its owner's lock: no disk sync unless a slot went.)
        if removed { try? AtomicFile.syncDirectory(path + "/" + Self.keysFolder) }
    }

    /// A new slot of `kind` for `passphrase` that retires every slot of that kind there is
    /// now (a passphrase change retires the passphrase slots, a new recovery key the
    /// recovery slot; `init` makes the first). Two made apart both unlock until the next.
    public func addSlot(passphrase: SecureBytes, parameters: KDFParameters, key: SecureBytes,
                        kind: SlotKind = .passphrase) throws(VaultError) {
        let prepared = try Self.prepareSlot(passphrase: passphrase, parameters: parameters, kind: kind, random: random)
        defer { prepared.kek.wipe() }
        try addSlot(prepared, key: key)
    }

    /// The slow half of a new slot, which reads nothing of the folder: its salt and the
    /// Argon2id key of `passphrase` (a daemon derives it outside its lock).
    public static func prepareSlot(passphrase: SecureBytes, parameters: KDFParameters, kind: SlotKind,
                                   random: RandomSource = SystemRandom()) throws(VaultError) -> PreparedSlot {
        guard parameters.isStrongEnough else { throw .weakParameters }
        let salt = random.bytes(VaultFormat.saltSize)
        return PreparedSlot(kind: kind, parameters: parameters, salt: salt,
                            kek: try Vault.deriveKey(passphrase, salt: salt, parameters: parameters))
    }

    /// The fast half: the slot written, wrapping `key` (the caller wipes `prepared.kek`).
    public func addSlot(_ prepared: PreparedSlot, key: SecureBytes) throws(VaultError) {
        let slotClock = nextClock()
        let name = ChangeFile.hex(device, 16) + "-" + ChangeFile.hex(slotClock, 16) + ".slot"
        let slot = KeySlot(kind: prepared.kind, parameters: prepared.parameters, salt: prepared.salt,
                           retires: slots.filter { $0.value.kind == prepared.kind }.keys.sorted())
        let bytes = slot.encode(key: key, kek: prepared.kek, vaultID: vaultID, path: Self.keysFolder + "/" + name, random: random)
        do throws(Errno) {
            try AtomicFile.replace(path + "/" + Self.keysFolder + "/" + name, with: bytes)
        } catch {
            throw .io(error)
        }
        clock = slotClock
        slots[name] = try KeySlot.parse(bytes)
    }

    /// A slot's key derived ahead of writing it (`prepareSlot`).
    public struct PreparedSlot: Sendable {
        let kind: SlotKind
        let parameters: KDFParameters
        let salt: [UInt8]
        public let kek: SecureBytes
    }

    /// Reads new key slots and forgets gone ones; returns every name listed (relative).
    /// The key slots on disk: each one the basis does not know is read and parsed.
    private static func scanSlots(_ found: Scan) {
        let names: [String]
        do throws(Errno) { names = try Syscall.listDirectory(found.basis.path + "/" + keysFolder) } catch {
            if error != .noSuchFileOrDirectory { found.failure = .io(error) }
            return
        }
        for name in names {
            guard KeySlot.parseName(name) != nil else {
                if !name.hasPrefix(".") || name.hasPrefix(".syncthing.") {
                    found.notes.append((keysFolder + "/" + name, "not a key slot (\(kind(of: name)))"))
                }
                continue
            }
            found.slotsPresent.insert(name)
            guard !found.basis.knownSlots.contains(name) else { continue }
            do throws(VaultError) {
                found.slotsRead.append((name, try KeySlot.parse(try read(found.basis.path + "/" + keysFolder + "/" + name))))
            } catch {
                found.notes.append((keysFolder + "/" + name, error.description))
            }
        }
    }

    /// Removes every slot of `kind` (`mtmfs passwd --remove-login`): a slot that a kind no
    /// longer has cannot be retired by a newer one, so it goes as a file. Never the
    /// passphrase's: the vault would no longer open.
    public func removeSlots(kind: SlotKind) throws(VaultError) {
        precondition(kind != .passphrase, "the passphrase's slots are only ever retired")
        let keys = path + "/" + Self.keysFolder
        for name in slots.filter({ $0.value.kind == kind }).keys {
            do throws(Errno) { try Syscall.unlink(keys + "/" + name) } catch {
                if error != .noSuchFileOrDirectory { throw .io(error) }
            }
            slots[name] = nil
        }
        do throws(Errno) { try AtomicFile.syncDirectory(keys) } catch { throw .io(error) }
    }

    /// Whether a slot of `kind` no other slot retired is there.
    public func hasSlot(_ kind: SlotKind) -> Bool {
        let retired = Set(slots.values.flatMap(\.retires))
        return slots.contains { $0.value.kind == kind && !retired.contains($0.key) }
    }

    /// The key-derivation limits of the newest passphrase slot no other slot retired.
    public var currentParameters: KDFParameters? {
        let retired = Set(slots.values.flatMap(\.retires))
        return slots.filter { !retired.contains($0.key) && $0.value.kind == .passphrase }
            .max { (KeySlot.parseName($0.key)?.clock ?? 0) < (KeySlot.parseName($1.key)?.clock ?? 0) }?.value.parameters
    }

    /// How many key slots there are, and how many no other slot retired.
    public var slotCounts: (all: Int, current: Int) {
        let retired = Set(slots.values.flatMap(\.retires))
        return (slots.count, slots.keys.filter { !retired.contains($0) }.count)
    }

    // MARK: Opening and writing

    /// Authenticates and opens every file with the master key: the changes get their
    /// fields (in `arena`). A file that fails is skipped, the rest load.
    public func open(with key: SecureBytes, arena: SecureArena) throws(VaultError) {
        generation += 1
        if needsReading {
            // Closed without reading the disk (`close`): the sealed parts are read here.
            needsReading = false
            for (_, changes) in files { changes.forEach { $0.wipe() } }
            dropAll()
            parsed.removeAll()
            try rescan()
            // Files a lock sealed and is writing now were not read: once written, a scan
            // takes them in (`needsScan`).
            unread = pending.subtracting(files.keys)
        }
        for (relative, file) in parsed {
            do throws(VaultError) {
                put(relative, try ChangeFile.open(file, vaultID: vaultID, path: relative, key: key, arena: arena))
            } catch {
                if case .io(.noMemory) = error {
                    close()
                    throw error
                }
                drop(relative)
                note(relative, error.description)
            }
        }
        parsed.removeAll()
        isOpen = true
    }

    /// Forgets every field (wiped) and keeps the clear parts — which accounts, their
    /// names, the changes' ids — without reading the disk: a lock does this under the
    /// owner's lock. The next `open` reads the sealed parts again.
    public func close() {
        generation += 1
        for (relative, changes) in files {
            changes.forEach { $0.wipe() }
            // As a file parsed while locked holds them (same changes, same places).
            files[relative] = changes.map { change in
                var clear = change
                clear.fields = nil
                return clear
            }
        }
        if isOpen { needsReading = true }
        isOpen = false
    }

    /// A clock later than every one seen or written (hybrid logical clock: milliseconds
    /// since 1970 in the high 48 bits, a counter in the low 16).
    public func nextClock() -> UInt64 { max(now() << 16, clock &+ 1) }

    /// The system's wall clock in milliseconds since 1970.
    public static let realTime: @Sendable () -> UInt64 = { WallClock.milliseconds }

    /// Writes `changes` (their ids are given here: this device, one new clock, in order) as
    /// one new file, durably; returns them as written. The folder keeps the values: the
    /// caller must not wipe them.
    @discardableResult
    public func write(_ changes: [AccountChange], key: SecureBytes) throws(VaultError) -> [AccountChange] {
        let (file, written) = try prepare(changes, key: key)
        file.write()
        finish(file)
        if let error = file.error { throw error }
        return written
    }

    /// A change file made under the owner's lock (its changes count from then on), written
    /// and synced outside it (`write`, from any thread), then `finish`ed under it again.
    ///
    /// Thread-safety: `write` once, from one thread; `error` read after it.
    public final class PreparedFile: @unchecked Sendable {
        public let relative: String
        let folder: String
        let bytes: [UInt8]
        public fileprivate(set) var error: VaultError?

        init(relative: String, folder: String, bytes: [UInt8]) {
            (self.relative, self.folder, self.bytes) = (relative, folder, bytes)
        }

        /// Creates the device's folder when missing, then the file (temporary, fsync,
        /// rename, fsync of the folder): no disk sync under the owner's lock.
        public func write() {
            let device = folder + "/" + String(relative.split(separator: "/")[0])
            do throws(Errno) {
                if (try? Syscall.lstat(device)) == nil {
                    do throws(Errno) { try Syscall.mkdir(device, mode: 0o700) } catch where error == .fileExists {}
                    try AtomicFile.syncDirectory(folder)
                }
                try AtomicFile.replace(folder + "/" + relative, with: bytes)
            } catch {
                self.error = .io(error)
            }
        }
    }

    /// Under the owner's lock: gives `changes` their ids (this device, one new clock, in
    /// order) and encodes their file; they count as the folder's from now on (a rescan keeps
    /// them while the file is being written).
    public func prepare(_ changes: [AccountChange], key: SecureBytes) throws(VaultError) -> (PreparedFile, [AccountChange]) {
        guard isOpen else { throw .locked }
        guard changes.count <= Int(UInt16.max), changes.allSatisfy(ChangeFile.fits) else { throw .io(.invalidArgument) }
        let fileClock = nextClock()
        var written = changes
        for index in written.indices { written[index].id = ChangeID(device: device, clock: fileClock, index: UInt16(index)) }
        return (try prepareFile(written, clock: fileClock, key: key), written)
    }

    /// Under the owner's lock, after `write`: a file that could not be written takes its
    /// changes with it (wiped), as if they had never been made.
    public func finish(_ file: PreparedFile) {
        pending.remove(file.relative)
        if file.error != nil { drop(file.relative)?.forEach { $0.wipe() } }
        if unread.remove(file.relative) != nil, file.error == nil { unloaded.insert(file.relative) }
    }

    /// A file written after the folder was read again without it (a lock's change written
    /// while an unlock read the folder): the owner scans (`scanBasis`…`apply`); a scan that
    /// listed it takes it in.
    public var needsScan: Bool { !unloaded.isEmpty }
    private var unloaded = Set<String>()

    private func prepareFile(_ changes: [AccountChange], clock fileClock: UInt64, key: SecureBytes) throws(VaultError) -> PreparedFile {
        let relative = ChangeFile.hex(device, 16) + "/" + ChangeFile.hex(fileClock, 16) + "-" + ASCIIHex.string(random.bytes(4)) + ".mtv"
        let bytes: [UInt8]
        do throws(Errno) {
            bytes = try ChangeFile.encode(device: device, clock: fileClock, changes: changes, vaultID: vaultID, path: relative,
                                          key: key, nonce: random.bytes(VaultFormat.nonceSize))
        } catch {
            throw .io(error)
        }
        clock = fileClock
        put(relative, changes)
        pending.insert(relative)
        return PreparedFile(relative: relative, folder: path, bytes: bytes)
    }

    private func store(_ changes: [AccountChange], clock fileClock: UInt64, key: SecureBytes) throws(VaultError) {
        let file = try prepareFile(changes, clock: fileClock, key: key)
        file.write()
        finish(file)
        if let error = file.error { throw error }
    }

    /// This device's own files, oldest first.
    public var ownFiles: [String] {
        let prefix = ChangeFile.hex(device, 16) + "/"
        return files.keys.filter { $0.hasPrefix(prefix) }.sorted()
    }

    /// Files prepared and not yet finished (a fold waits until there are none).
    public var pendingCount: Int { pending.count }

    /// How many files of this device's own there are.
    public var ownFileCount: Int {
        let prefix = ChangeFile.hex(device, 16) + "/"
        return files.keys.lazy.filter { $0.hasPrefix(prefix) }.count
    }

    /// How many changes the last fold of this process kept (0 before one).
    public private(set) var changesAtLastFold = 0
    private var foldFailedAt = 0

    /// How many own files make a fold due: more new files since the last fold than a
    /// quarter of what it kept (a fold's work is paid for by the files it folds), at least
    /// `minimum` and at most 512 (each save merges its account's changes again: one field
    /// changed 2,500 times between folds made a save at 10,000 accounts take 20 ms); after
    /// a fold that failed, as many again.
    public func foldThreshold(minimum: Int) -> Int {
        max(minimum, min(changesAtLastFold / 4, 512)) + foldFailedAt
    }

    /// Folds this device's files into one (never another device's): what is still current
    /// or still decides something is kept, with its ids; the old files are removed once the
    /// new one is durable. Only while open.
    public func fold(key: SecureBytes) throws(VaultError) {
        guard let fold = try prepareFold(key: key) else { return }
        fold.file.write()
        finishFold(fold)
        if let error = fold.file.error { throw error }
    }

    /// A fold made under the owner's lock, its file written outside it, then finished.
    public struct PreparedFold: @unchecked Sendable {
        public let file: PreparedFile
        let replaced: [String]
    }

    /// Under the owner's lock: the fold's file (nil when there is nothing to fold, or while
    /// another file is being written: a fold holds only what is on disk). The kept changes
    /// are the old files' own values, taken over by the new file (nothing is copied, and
    /// what shows a value goes on showing the same one).
    public func prepareFold(key: SecureBytes) throws(VaultError) -> PreparedFold? {
        guard isOpen else { throw .locked }
        guard pending.isEmpty else { return nil }
        let old = ownFiles
        guard old.count > 1 else { return nil }
        let kept = VaultMerge.fold(changes, device: device)
        changesAtLastFold = kept.count  // (also when too many for one file: not tried again soon)
        guard kept.count <= Int(UInt16.max) else { return nil }
        return PreparedFold(file: try prepareFile(kept, clock: nextClock(), key: key), replaced: old)
    }

    /// Under the owner's lock, after the fold's file was written: the old files go (their
    /// values that the fold did not keep are wiped). A fold that could not be written is
    /// dropped, the old files kept as they are.
    public func finishFold(_ fold: PreparedFold) {
        pending.remove(fold.file.relative)
        guard fold.file.error == nil else {
            drop(fold.file.relative)  // (its values are the old files')
            foldFailedAt = ownFileCount  // (tried again after as many new files as a fold needs)
            return
        }
        foldFailedAt = 0
        let carried = Set((files[fold.file.relative] ?? []).flatMap { $0.fields ?? [] }.map { ObjectIdentifier($0.value) })
        for relative in fold.replaced {
            try? Syscall.unlink(path + "/" + relative)
            for change in drop(relative) ?? [] {
                for field in change.fields ?? [] where !carried.contains(ObjectIdentifier(field.value)) { field.value.wipe() }
            }
        }
        // (Not synced: old files that come back after a crash only repeat what the fold holds.)
    }
}

/// What opens a key slot (byte 9 of its header, docs/vault-format-3.md §3): the vault's
/// passphrase, the user's login password (`mtmfs passwd --login`), or a recovery key
/// (`mtmfs recovery-key`). An unlock tries the slots of one kind; a new slot retires the
/// slots of its own kind only.
public enum SlotKind: UInt8, Sendable, CaseIterable {
    case passphrase = 0
    case login = 1
    case recovery = 2

    /// The kind a command line or control file names: `passphrase`, `login`, `recovery`.
    public init?(name: String) {
        guard let kind = Self.allCases.first(where: { $0.name == name }) else { return nil }
        self = kind
    }

    public var name: String {
        switch self {
        case .passphrase: "passphrase"
        case .login: "login"
        case .recovery: "recovery"
        }
    }
}

/// A key slot (`keys/DEVICE-CLOCK.slot`): the master key wrapped under a passphrase's
/// Argon2id key, the slots it retires, and a proof that its writer held the master key
/// (so that a forged slot cannot retire a real one).
///
/// Thread-safety: a value.
struct KeySlot {
    static let magic = Array("MTMSLOT3".utf8)
    var kind: SlotKind = .passphrase
    var parameters: KDFParameters
    var salt: [UInt8]
    var retires: [String]
    var header: [UInt8] = []
    var wrapNonce: [UInt8] = []
    var wrapped: [UInt8] = []
    var proofNonce: [UInt8] = []
    var proof: [UInt8] = []

    static func parseName(_ name: String) -> (device: UInt64, clock: UInt64)? {
        let parts = name.split(separator: "-")
        guard name.hasSuffix(".slot"), parts.count == 2, let device = ChangeFile.parseDevice(String(parts[0])),
              let clock = ChangeFile.parseDevice(String(parts[1].dropLast(5))) else { return nil }
        return (device, clock)
    }

    func headerBytes() -> [UInt8] {
        var out = Self.magic + [VaultFormat.algorithmArgon2id13, kind.rawValue]
        out += VaultFormat.bigEndian(parameters.operations, 8) + VaultFormat.bigEndian(parameters.memoryBytes, 8) + salt
        out += VaultFormat.bigEndian(UInt64(retires.count), 2)
        for name in retires { out += [UInt8(name.utf8.count)] + Array(name.utf8) }
        return out
    }

    static func associatedData(_ purpose: String, vaultID: [UInt8], path: String, header: [UInt8]) -> [UInt8] {
        Array("MTMVAULT3-\(purpose)".utf8) + vaultID + Array(path.utf8) + [0] + header
    }

    func encode(key: SecureBytes, kek: SecureBytes, vaultID: [UInt8], path: String, random: RandomSource) -> [UInt8] {
        let header = headerBytes()
        let wrapNonce = random.bytes(VaultFormat.nonceSize), proofNonce = random.bytes(VaultFormat.nonceSize)
        let wrapped = Sealing.seal(key, associatedData: Self.associatedData("slot", vaultID: vaultID, path: path, header: header),
                                   nonce: wrapNonce, key: kek)
        let proof = Sealing.seal(SecureBytes(), associatedData: Self.associatedData("proof", vaultID: vaultID, path: path, header: header),
                                 nonce: proofNonce, key: key)
        return header + wrapNonce + wrapped + proofNonce + proof
    }

    static func parse(_ bytes: [UInt8]) throws(VaultError) -> KeySlot {
        var reader = VaultFormat.Reader(bytes: bytes)
        guard try reader.take(8) == magic else { throw .damaged("not a key slot (bad magic)") }
        guard try reader.integer(1) == UInt64(VaultFormat.algorithmArgon2id13) else { throw .damaged("unknown key-derivation algorithm") }
        // (Written 0 before slots had kinds: a passphrase's slot.)
        guard let kind = SlotKind(rawValue: UInt8(try reader.integer(1))) else { throw .damaged("a key slot of an unknown kind") }
        let parameters = KDFParameters(operations: try reader.integer(8), memoryBytes: try reader.integer(8))
        guard parameters.isStrongEnough else { throw .weakParameters }
        // Above SENSITIVE, a slot would make an unlock take minutes or fail for memory.
        guard parameters.operations <= KDFParameters.sensitive.operations,
              parameters.memoryBytes <= KDFParameters.sensitive.memoryBytes else {
            throw .damaged("key-derivation limits above SENSITIVE")
        }
        let salt = try reader.take(VaultFormat.saltSize)
        var retires: [String] = []
        for _ in 0..<(try reader.integer(2)) {
            let name = String(decoding: try reader.take(Int(try reader.integer(1))), as: UTF8.self)
            guard parseName(name) != nil else { throw .damaged("retires a slot of an impossible name") }
            retires.append(name)
        }
        var slot = KeySlot(kind: kind, parameters: parameters, salt: salt, retires: retires)
        slot.header = Array(bytes[0..<reader.position])
        slot.wrapNonce = try reader.take(VaultFormat.nonceSize)
        slot.wrapped = try reader.take(VaultFormat.keySize + VaultFormat.tagSize)
        slot.proofNonce = try reader.take(VaultFormat.nonceSize)
        slot.proof = try reader.take(VaultFormat.tagSize)
        guard reader.position == bytes.count else { throw .damaged("stray bytes after the key slot") }
        return slot
    }

    func unwrap(kek: SecureBytes, vaultID: [UInt8], path: String) throws(Errno) -> SecureBytes? {
        try Sealing.unseal(wrapped, associatedData: Self.associatedData("slot", vaultID: vaultID, path: path, header: header),
                       nonce: wrapNonce, key: kek)
    }

    /// Whether `key` opens the slot's proof (an empty plaintext: no secure memory needed).
    func proves(key: SecureBytes, vaultID: [UInt8], path: String) -> Bool {
        guard let empty = try? Sealing.unseal(proof, associatedData: Self.associatedData("proof", vaultID: vaultID, path: path, header: header),
                                              nonce: proofNonce, key: key) ?? nil else { return false }
        empty.wipe()
        return true
    }
}

/// This machine's device id for one vault folder (`DATA_DIR/device`): random, and made
/// anew when the file is missing, was written on another machine (`/etc/machine-id`) or
/// for a folder that is not this one (another inode: a copied data directory) — so that
/// two machines never write under one id.
///
/// Thread-safety: stateless.
enum DeviceIdentity {
    static func machine() -> String {
        for candidate in ["/etc/machine-id", "/var/lib/dbus/machine-id"] {
            if let bytes = try? VaultFolder.read(candidate) {
                let text = String(decoding: bytes, as: UTF8.self).trimmingSuffix("\n")
                if !text.isEmpty { return text }
            }
        }
        return "unknown"
    }

    static func folderIdentity(_ folder: String) -> String {
        guard let info = try? Syscall.stat(folder) else { return "0:0" }
        return "\(info.st_dev):\(info.st_ino)"
    }

    static func device(file: String, folder: String, random: RandomSource) throws(VaultError) -> UInt64 {
        let expected = (machine: machine(), folder: folderIdentity(folder))
        if let bytes = try? VaultFolder.read(file) {
            var values: [String: String] = [:]
            for line in String(decoding: bytes, as: UTF8.self).split(separator: "\n") {
                let parts = line.split(separator: " ", maxSplits: 1)
                if parts.count == 2 { values[String(parts[0])] = String(parts[1]) }
            }
            if let id = values["device"].flatMap(ChangeFile.parseDevice), id != 0,
               values["machine"] == expected.machine, values["folder"] == expected.folder {
                return id
            }
        }
        var id: UInt64 = 0
        while id == 0 { id = random.bytes(8).reduce(0) { $0 << 8 | UInt64($1) } }
        let text = "device \(ChangeFile.hex(id, 16))\nmachine \(expected.machine)\nfolder \(expected.folder)\n"
        do throws(Errno) { try AtomicFile.replace(file, with: Array(text.utf8)) } catch { throw .io(error) }
        return id
    }
}

extension String {
    func trimmingSuffix(_ suffix: String) -> String { hasSuffix(suffix) ? String(dropLast(suffix.count)) : self }
}
