#if canImport(Glibc)
import Glibc
#endif
import Posix

/// The fsync journal of schema version 4 (`cache.sqlite-fsync`), read once: a daemon of
/// that version that stopped without storing the writes of its last fsyncs left them there
/// only. They are written again when the upgraded store first opens, then the file goes.
/// (The format is in `docs/cache-schema.md`, "Upgrading from version 4".)
///
/// Thread-safety: stateless.
enum LegacyFsyncJournal {
    /// One fsynced write.
    struct Record: Equatable {
        var ino: Int64
        var offset: Int64
        var bytes: [UInt8]
        /// The file's size and modification time after the write.
        var size: Int64
        var modified: Int64
    }

    static let headerSize = 56
    static let magic: UInt32 = 0x4A53_4D4D  // "MMSJ" in the file

    /// Writes the records after the database's mark (`state.synced`) into their files, in
    /// order, then removes the journal and the state it was bound by.
    static func replay(into store: CacheStore, progress: (String) -> Void) throws {
        let path = store.path + "-fsync"
        guard let bytes = try? Syscall.readFile(path) else { return }
        let mark = try store.database.scalarText("SELECT value FROM state WHERE name = 'synced'").flatMap { Int64($0) } ?? 0
        let seed = try store.database.scalarText("SELECT value FROM state WHERE name = 'journal_id'")
            .flatMap { Int64($0) }.map { UInt64(bitPattern: $0) } ?? 0
        let records = bytes.withUnsafeBytes { decode($0, after: mark, seed: seed) }
        for record in records { try apply(record, to: store) }
        try store.synchronize(nil)
        try store.database.execute("DELETE FROM state WHERE name IN ('synced', 'journal_id')")
        try? Syscall.unlink(path)
        if !records.isEmpty {
            progress("stored \(records.count) fsynced writes that were only in \(path) when the daemon ended")
        }
    }

    /// One record written into its file, with the size and time it gave the file (a file
    /// gone since is said in the log).
    static func apply(_ record: Record, to store: CacheStore) throws(Errno) {
        do throws(Errno) {
            let written: Result<Int, Errno> = record.bytes.withUnsafeBytes { data in
                Result { () throws(Errno) in try store.write(record.ino, offset: record.offset, data: data, append: false) }
            }
            _ = try written.get()
            let now = try store.inode(record.ino)
            _ = try store.setAttributes(record.ino, CacheAttributeChanges(size: max(now.size, record.size),
                                                                          modificationNanoseconds: record.modified))
        } catch {
            guard error == .noSuchFileOrDirectory || error == .isDirectory else { throw error }
            Log.error("cache: an fsynced write to inode \(record.ino) found no file to go to")
        }
    }

    /// The records of the journal's last generation: from offset 0, numbered from one after
    /// `mark` on, in order, up to the first that is not whole (under `seed`) or not
    /// numbered one after the one before.
    static func decode(_ file: UnsafeRawBufferPointer, after mark: Int64, seed: UInt64) -> [Record] {
        var records: [Record] = []
        var offset = 0
        var previous = mark
        while offset + headerSize <= file.count {
            let header = UnsafeRawBufferPointer(rebasing: file[offset..<(offset + headerSize)])
            guard UInt32(littleEndian: header.loadUnaligned(fromByteOffset: 0, as: UInt32.self)) == magic else { break }
            let length = Int(UInt32(littleEndian: header.loadUnaligned(fromByteOffset: 4, as: UInt32.self)))
            guard length <= file.count - offset - headerSize else { break }
            let field = { (index: Int) in Int64(littleEndian: header.loadUnaligned(fromByteOffset: 8 + 8 * index, as: Int64.self)) }
            let data = UnsafeRawBufferPointer(rebasing: file[(offset + headerSize)..<(offset + headerSize + length)])
            let sum = UInt64(littleEndian: header.loadUnaligned(fromByteOffset: 48, as: UInt64.self))
            guard sum == checksum(UnsafeRawBufferPointer(rebasing: header[0..<48]), data, seed: seed) else { break }
            guard field(0) == previous &+ 1 else { break }
            let record = Record(ino: field(1), offset: field(2), bytes: Array(data), size: field(3), modified: field(4))
            guard record.offset >= 0, record.size >= record.offset + Int64(length) else { break }
            records.append(record)
            previous = field(0)
            offset += headerSize + length
        }
        return records
    }

    /// Four lanes of multiply–rotate over 64-bit words, started from the database's identity.
    static func checksum(_ first: UnsafeRawBufferPointer, _ second: UnsafeRawBufferPointer, seed: UInt64) -> UInt64 {
        var lanes: (UInt64, UInt64, UInt64, UInt64) = (0x9E37_79B9_7F4A_7C15, 0xC2B2_AE3D_27D4_EB4F, 0x1656_67B1_9E37_79F9, 0x27D4_EB2F_1656_67C5)
        @inline(__always) func mix(_ lane: UInt64, _ word: UInt64) -> UInt64 {
            let m = lane ^ (word &* 0x87C3_7B91_1142_53D5)
            return ((m << 31) | (m >> 33)) &* 0x4CF5_AD43_2745_937F
        }
        var total: UInt64 = seed
        for part in [first, second] {
            let count = part.count
            var i = 0
            while i + 32 <= count {
                lanes.0 = mix(lanes.0, part.loadUnaligned(fromByteOffset: i, as: UInt64.self))
                lanes.1 = mix(lanes.1, part.loadUnaligned(fromByteOffset: i + 8, as: UInt64.self))
                lanes.2 = mix(lanes.2, part.loadUnaligned(fromByteOffset: i + 16, as: UInt64.self))
                lanes.3 = mix(lanes.3, part.loadUnaligned(fromByteOffset: i + 24, as: UInt64.self))
                i += 32
            }
            while i + 8 <= count {
                lanes.0 = mix(lanes.0, part.loadUnaligned(fromByteOffset: i, as: UInt64.self))
                i += 8
            }
            var tail: UInt64 = UInt64(count - i) << 56
            for (shift, byte) in part[i..<count].enumerated() { tail |= UInt64(byte) << (8 * UInt64(shift)) }
            lanes.1 = mix(lanes.1, tail)
            total &+= UInt64(count)
        }
        var h = mix(mix(mix(mix(total, lanes.0), lanes.1), lanes.2), lanes.3)
        h ^= h >> 29
        h = h &* 0xBF58_476D_1CE4_E5B9
        return h ^ (h >> 32)
    }
}
