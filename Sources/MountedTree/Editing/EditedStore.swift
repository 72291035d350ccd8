#if canImport(Glibc)
import Glibc
#endif
import Posix

/// What one tree tells the editing engine about its keys: which name is a key, what a key's
/// text is, what it accepts and how a value is saved. `settings/` answers with plist keys,
/// `accounts/` with account fields. The engine calls these under the tree's lock.
///
/// A *key* is what a file stands for (a key path of the plist, a field of an account). A
/// key may have a value (a file a lookup finds) or not (a new key, or one that left a
/// moment ago and whose name an editor is about to reuse).
///
/// Thread-safety: conformers need none of their own: the engine calls them only under the
/// owning tree's lock.
protocol EditedStore {
    associatedtype Key: Hashable & Sendable
    associatedtype Buffer: EditBuffer
    /// Something a file carries until it becomes its key (settings: a type set with
    /// `user.plist.type` before the first value).
    associatedtype Note: Sendable

    /// The key `name` in `directory` stands for, or nil when the name is only ever an
    /// editor's file there. `isHidden` tells which keys the engine holds hidden (renamed to
    /// an editor's name, or unlinked a moment ago): such a name is its key's even when it
    /// looks like an editor's file.
    func key(named name: String, in directory: LocalInode, isHidden: (Key) -> Bool) -> Key?
    /// The directory a key's file is in, where the tree has one.
    func directory(of key: Key) -> LocalInode?
    /// Whether the key has a value now.
    func hasValue(_ key: Key) -> Bool
    /// Runs `body` on the key's text as read: its value and one newline.
    func withText<T>(of key: Key, _ body: (UnsafeRawBufferPointer) -> T) throws(Errno) -> T
    /// The longest text a key's file takes (EFBIG beyond).
    func limit(for key: Key) -> Int
    /// The longest editor's file.
    var scratchLimit: Int { get }
    /// The mode a new file gets, asked for `requested`.
    func mode(forNewFile requested: mode_t) -> mode_t
    /// Whether `text`, the whole content of a file meant for `key`, is a value it takes
    /// (the early check of `echo v > key`; the commit checks again).
    func accepts(_ text: UnsafeRawBufferPointer, for key: Key, note: Note?) -> Bool
    /// Validates `text` and saves it as the key's value (EINVAL, EFBIG, EIO: nothing changed).
    mutating func commit(_ text: Buffer, to key: Key, note: Note?) throws(Errno) -> Committed<Key, Buffer>
    /// Takes the key's value away for good (a field: cleared).
    mutating func remove(_ key: Key) throws(Errno)
    /// `rename` of a key's file onto another key's name: the target takes the value (kept
    /// type, position), the source's value goes.
    mutating func move(_ key: Key, onto target: Key) throws(Errno)
    /// Whether an editor's file `name` may be made (`moved`: renamed) in `directory`, which
    /// holds `count` of them already; a name that is neither a key nor an editor's file
    /// there (an array index past the end, a name no field has) is refused here.
    func admitsScratch(named name: String, in directory: LocalInode, count: Int, moved: Bool) throws(Errno)
    /// Whether a key's file may be renamed to an editor's name in `directory` (`mv K K~`).
    func mayRenameAway(_ key: Key, to directory: LocalInode) throws(Errno)
    /// Whether an unlinked key leaves at once rather than after the engine's delay (an
    /// attribute: the bus shows it gone).
    func removesAtOnce(_ key: Key) -> Bool
    /// The key an editor's file named `name` in `directory` becomes when it is still there
    /// after its creator exited (nil: no key can have that name there — it goes).
    func settledKey(named name: String, in directory: LocalInode) -> Key?
    /// Whether removing `removed` changes `written` too (a URL and its parts): a removal
    /// waiting for its delay is carried out before such a write, so that it never undoes it.
    func removalOverlaps(_ removed: Key, _ written: Key) -> Bool
    /// Removals that renumber what follows them (plist array elements): every removal
    /// waiting in the tree is carried out with such a one, in `removesBefore` order.
    func renumbersOnRemoval(_ key: Key) -> Bool
    /// The order removals carried out together take (later array elements, and deeper keys, first).
    func removesBefore(_ a: Key, _ b: Key) -> Bool
}

extension EditedStore {
    func removalOverlaps(_ removed: Key, _ written: Key) -> Bool { false }
    func renumbersOnRemoval(_ key: Key) -> Bool { false }
    func removesBefore(_ a: Key, _ b: Key) -> Bool { false }
}

/// What a commit changed, for the engine to show.
///
/// Thread-safety: a value, handed back under the owning tree's lock.
struct Committed<Key, Buffer> {
    /// The text to show for the key until its value changes (nil: render the value).
    var shown: Buffer?
    /// Other keys whose values changed with it (a URL and its parts).
    var alsoChanged: [Key] = []
}
