import CSodium
import Posix
import SecureMemory

/// A few large regions of secure memory (`sodium_malloc`: guard pages, mlock, zeroed on
/// free) that many small secrets share: the decrypted fields of an unlocked vault.
///
/// Each `sodium_malloc` is a page-aligned region between guard pages (about four memory
/// mappings and 8 KiB); one per field would make a large vault cost tens of thousands of
/// mappings, and `vm.max_map_count` would stop its unlock. Here a field takes a slot of the
/// next power of two (16 B to 16 KiB) in a 1 MiB slab; a freed slot is zeroed and reused;
/// `releaseAll` zeroes and frees every slab (a lock gives the memory back). Larger values
/// get their own `sodium_malloc`.
///
/// Thread-safety: its own lock (slots are freed from `SecureBytes.deinit` on any thread).
public final class SecureArena: @unchecked Sendable {
    public static let defaultSlabSize = 1 << 20
    /// Each slab's size (1 MiB unless told: a short-lived program with a few secrets takes
    /// a page or four, which mlock makes resident at once).
    let slabSize: Int
    static let smallestSlot = 16
    static let largestSlot = 16 << 10

    private let lock = Lock()
    private var slabs: [UnsafeMutableRawPointer] = []
    /// Bytes used at the end of the last slab.
    private var used = 0
    /// Freed slots by size, ready for reuse.
    private var free: [Int: [UnsafeMutableRawPointer]] = [:]
    /// Counts `releaseAll`s: a slot of an earlier generation is gone and never touched.
    private var generation = 0

    public init(slabSize: Int = defaultSlabSize) {
        self.slabSize = max(slabSize, Self.largestSlot)
        Sodium.initialize()
    }

    deinit { releaseAll() }

    /// The slot size for `count` bytes, or nil when it is too large for a slot.
    static func slotSize(for count: Int) -> Int? {
        guard count <= largestSlot else { return nil }
        var size = smallestSlot
        while size < count { size <<= 1 }
        return size
    }

    /// A zeroed slot of at least `count` bytes, its size and generation; nil when the value
    /// is too large for a slot or secure memory ran out.
    func allocate(_ count: Int) -> (slot: UnsafeMutableRawPointer, size: Int, generation: Int)? {
        guard let size = Self.slotSize(for: count) else { return nil }
        return lock.withLock { () -> (slot: UnsafeMutableRawPointer, size: Int, generation: Int)? in
            if let slot = free[size]?.popLast() { return (slot, size, generation) }
            if slabs.isEmpty || used + size > slabSize {
                guard let slab = SecureMemory.allocate(slabSize) else { return nil }
                slabs.append(slab)
                used = 0
            }
            let slot = slabs.last! + used
            used += size
            return (slot, size, generation)
        }
    }

    /// Zeroes a slot and keeps it for reuse (a slot from before a `releaseAll` is gone).
    func release(_ slot: UnsafeMutableRawPointer, size: Int, generation: Int) {
        lock.withLock {
            guard generation == self.generation else { return }
            sodium_memzero(slot, size)
            free[size, default: []].append(slot)
        }
    }

    /// Zeroes and frees every slab. Every value in them must have been wiped first.
    public func releaseAll() {
        lock.withLock {
            for slab in slabs { SecureMemory.free(slab, slabSize) }  // zeroed before freed
            slabs.removeAll()
            free.removeAll()
            used = 0
            generation += 1
        }
    }

    /// Bytes of secure memory held in slabs.
    public var bytesHeld: Int { lock.withLock { slabs.count * slabSize } }

    /// Slabs held (each one `sodium_malloc` region).
    public var slabCount: Int { lock.withLock { slabs.count } }
}
