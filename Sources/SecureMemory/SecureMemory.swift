import CSodium
import Posix
import SecureMemory

/// The process's secure memory: every `sodium_malloc` region of `SecureBytes` and
/// `SecureArena` goes through here and counts against one budget.
///
/// A region is guard pages around locked pages — about four memory mappings. Without a
/// bound, input could spend them all (scratch files of up to 16 MiB in every account
/// directory, secrets sent over the bus): `sodium_malloc` would fail, and so would the
/// mappings the rest of the daemon needs (`vm.max_map_count`, 65,530 by default). The
/// budget keeps secure memory well inside that: at most `byteBudget` bytes in at most
/// `regionBudget` regions; past it an allocation fails (ENOMEM to a request, a D-Bus error
/// to a bus client) and everything else goes on.
///
/// Thread-safety: its own lock.
public enum SecureMemory {
    /// Bytes of secure memory the process may hold: a large vault's fields (10,000 full
    /// accounts take about 20 MiB of arena) and several 16 MiB scratch files beside them.
    public static let byteBudget = 256 << 20
    /// Regions the process may hold (each about four of the system's memory mappings).
    public static let regionBudget = 8192

    private static let ledger = Locked(SecureMemoryLedger(byteBudget: byteBudget, regionBudget: regionBudget))

    /// A zeroed region of `count` bytes, or nil when the budget or the system has none.
    static func allocate(_ count: Int) -> UnsafeMutableRawPointer? {
        Sodium.initialize()
        let size = max(count, 1)
        guard ledger.withLock({ $0.admit(size) }) else { return nil }
        guard let pointer = sodium_malloc(size) else {
            ledger.withLock { $0.release(size) }
            return nil
        }
        sodium_memzero(pointer, size)
        return pointer
    }

    /// Zeroes and frees a region from `allocate(count)`.
    static func free(_ pointer: UnsafeMutableRawPointer, _ count: Int) {
        sodium_free(pointer)  // zeroes first
        ledger.withLock { $0.release(max(count, 1)) }
    }

    /// What is held now: bytes and regions.
    public static var held: (bytes: Int, regions: Int) {
        ledger.withLock { ($0.bytes, $0.regions) }
    }
}

/// The budget's arithmetic: what is held, and whether one more region fits.
///
/// Thread-safety: a value; `SecureMemory` keeps the process's under a lock.
struct SecureMemoryLedger: Sendable {
    let byteBudget: Int
    let regionBudget: Int
    private(set) var bytes = 0
    private(set) var regions = 0

    init(byteBudget: Int, regionBudget: Int) {
        self.byteBudget = byteBudget
        self.regionBudget = regionBudget
    }

    /// Counts a region of `size` bytes if it fits; false (nothing counted) if not.
    mutating func admit(_ size: Int) -> Bool {
        guard size > 0, regions < regionBudget, size <= byteBudget - bytes else { return false }
        bytes += size
        regions += 1
        return true
    }

    /// Gives back a region `admit` counted.
    mutating func release(_ size: Int) {
        bytes -= size
        regions -= 1
    }
}
