#if canImport(Glibc)
import Glibc
#endif
import FuseLowLevel
import Posix

/// One file of the editing engine: a key's file, an editor's (scratch) file, or a file that
/// is neither any more (unlinked or replaced) but still open or known to the kernel.
///
/// Lifetime: it lives while the kernel holds a reference (counted in the mount's
/// `NodeTable` at every entry handed out and dropped by FORGET), a descriptor is open
/// (`opens`), or it is an editor's file linked in a directory (its content lives nowhere
/// else). Otherwise it is freed, its buffers wiped.
///
/// Thread-safety: a value inside `EditingEngine`, behind the owning tree's lock.
struct EditedFile<Key: Hashable & Sendable, Buffer: EditBuffer, Note: Sendable> {
    /// What the file stands for: a key, an editor's file, or neither any more.
    ///
    /// Thread-safety: a value, behind the owning tree's lock with its file.
    enum Role {
        /// The file of a key: reads show its value; writes go to `pending`.
        case key(Key)
        /// An editor's file, linked as `name` in `directory`: its bytes are `content`.
        case scratch(directory: LocalInode, name: String)
        /// Unlinked, or a key's file replaced by another: `content` keeps what open
        /// descriptors read.
        case unlinked
    }

    var role: Role
    /// The bytes of an editor's or unlinked file.
    var content: Buffer?
    /// A key's text being written and not yet committed.
    var pending: PendingEdit<Buffer>?
    /// A key's text as last written, shown while it still means the stored value.
    var shown: Buffer?
    /// An editor's file at a key's name: the key it becomes when written and closed.
    var intendedKey: Key?
    /// An editor's file holding the old text of a key renamed to its name (`mv K K~`).
    var detachedFrom: Key?
    var symlinkTarget: String?
    /// The program that made an editor's file (or renamed a key to one), pinned: once it
    /// has exited, a file still linked is settled (`EditingEngine.settleScratch`).
    var creator: PinnedProcess?
    /// Data was written since it was made (a file meant for a key commits only then).
    var written = false
    /// A file meant for a key had a write refused (EINVAL): closed with nothing written, it
    /// goes, and the key it was to replace stays as it was.
    var refused = false
    var note: Note?
    var mode: mode_t
    var modified: Timestamp
    var changed: Timestamp
    var opens = 0

    var key: Key? { if case .key(let key) = role { key } else { nil } }
    var isLinkedScratch: Bool { if case .scratch = role { true } else { false } }

    /// Zeroes every buffer it holds.
    mutating func wipe() {
        content?.wipe()
        content = nil
        pending?.text.wipe()
        pending = nil
        shown?.wipe()
        shown = nil
    }
}

/// A key's content between a truncate or write and its commit.
///
/// The rules (SPEC §4, the same for keys and fields): a flush (any close, fsync) commits
/// what was written; a truncation alone is committed only at the last close (shells open,
/// dup2 and close the descriptor before they write, and that close must not commit an
/// empty value); only the descriptor that truncated or wrote commits it (another one's late
/// release must not commit a half-written value); content that had a write refused is
/// never committed (its close answers EINVAL).
///
/// Thread-safety: a value inside its `EditedFile`, behind the owning tree's lock.
struct PendingEdit<Buffer: EditBuffer> {
    var text: Buffer
    var written = false
    var rejected = false
    /// The handle that truncated or wrote it (nil: a truncate without a descriptor).
    var owner: FileHandle?

    /// Whether a commit by `handle` (`finalClose`: its last close) takes this content.
    func isCommitted(by handle: FileHandle?, finalClose: Bool) -> Bool {
        owner == handle && (written || rejected || finalClose)
    }
}

/// Why a key has no file for now.
///
/// Thread-safety: a value inside `EditingEngine`, behind the owning tree's lock.
enum HiddenKey: Equatable {
    /// Renamed to an editor's name (`mv K K~`): the old text lives on in that file, the value
    /// stays until the editor writes the new one, renames the old one back, or deletes it
    /// without a new one.
    case renamedAway
    /// Unlinked: the value leaves at `due` unless a new file takes the name first (`mv`
    /// across file systems, `install`, git: unlink, then create), so a crash between their
    /// two steps cannot lose the key.
    case unlinked(due: ContinuousClock.Instant)
}
