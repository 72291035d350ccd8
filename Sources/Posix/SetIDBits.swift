#if canImport(Glibc)
import Glibc
#endif

/// The set-ID bits a write, truncation or chown by a caller without CAP_FSETID drops, as the
/// kernel's `file_remove_privs` does on a local file system.
///
/// Thread-safety: stateless.
public enum SetIDBits {
    /// `mode` without the bits a kill drops: S_ISUID, and S_ISGID when the group may execute
    /// (without group execute, S_ISGID marks mandatory locking and stays).
    public static func killed(_ mode: mode_t) -> mode_t {
        var kept = mode & ~S_ISUID
        if mode & S_IXGRP != 0 { kept &= ~S_ISGID }
        return kept
    }

    /// Whether a kill would change `mode`.
    public static func wouldDrop(_ mode: mode_t) -> Bool { killed(mode) != mode }
}
