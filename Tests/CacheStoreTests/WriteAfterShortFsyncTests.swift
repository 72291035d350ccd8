@testable import CacheStore
import Foundation
import Posix
import Testing

/// A write that commits (whole chunks, dropped set-ID bits) after fsyncs that went the short
/// way: its transaction drains the journal, storing every buffer — the write's own too.
@Suite struct WriteAfterShortFsyncTests {
    /// The reduction of an outside exerciser's run: small writes each followed by an fsync,
    /// one more small write, then a write of whole chunks (the daemon trapped here).
    @Test func wholeChunksAfterShortFsyncsKeepEveryByte() throws {
        let f = try StoreFixture()
        let ino = try f.file("db.bin")
        var expected = [UInt8](repeating: 0, count: 65536 + 131072)
        for i in 0..<4 {
            try f.write(ino, [UInt8](repeating: 0x61, count: 100), at: Int64(300 * i))
            expected.replaceSubrange((300 * i)..<(300 * i + 100), with: repeatElement(0x61, count: 100))
            try f.store.synchronize()
        }
        #expect(!f.journalIsEmpty, "the later fsyncs went the short way")
        try f.write(ino, [UInt8](repeating: 0x62, count: 100), at: 5000)
        expected.replaceSubrange(5000..<5100, with: repeatElement(0x62, count: 100))
        try f.write(ino, [UInt8](repeating: 0x63, count: 131072), at: 65536)
        expected.replaceSubrange(65536..<(65536 + 131072), with: repeatElement(0x63, count: 131072))
        #expect(f.journalIsEmpty, "drained by the write's transaction")
        #expect(try f.store.inode(ino).size == Int64(expected.count))
        #expect(try f.read(ino, 0, expected.count) == expected)
        // Writes after it buffer and go the short way again once an fsync went the long one.
        try f.write(ino, [UInt8](repeating: 0x64, count: 10), at: 70000)
        expected.replaceSubrange(70000..<70010, with: repeatElement(0x64, count: 10))
        try f.store.synchronize()
        let reopened = try CacheStore(path: try f.crashCopy(), owner: (0, 0))
        #expect(try read(reopened, ino, 0, expected.count) == expected)
    }

    /// The same with an append of whole chunks (the write's start is the buffered size) and
    /// with the file's set-ID bits dropped by the write (a change of its own before the data).
    @Test func anAppendDroppingSetIDBitsAfterShortFsyncsKeepsEveryByte() throws {
        let f = try StoreFixture()
        let ino = try f.file("log")
        _ = try f.store.setAttributes(ino, CacheAttributeChanges(mode: 0o6755))
        try f.store.synchronize()
        var expected: [UInt8] = []
        for i in 0..<3 {
            let bytes = [UInt8](repeating: UInt8(i + 1), count: 700)
            _ = try bytes.withUnsafeBytes { buffer in try f.store.write(ino, offset: 0, data: buffer, append: true) }
            expected += bytes
            try f.store.synchronize()
        }
        #expect(!f.journalIsEmpty)
        let small = [UInt8](repeating: 9, count: 50)
        _ = try small.withUnsafeBytes { buffer in try f.store.write(ino, offset: 0, data: buffer, append: true) }
        expected += small
        let large = (0..<(3 * 65536)).map { UInt8(truncatingIfNeeded: $0 * 7) }
        var written = 0, modeChanged = false
        try large.withUnsafeBytes { buffer in
            (written, modeChanged) = try f.store.write(ino, offset: 0, data: buffer, append: true, droppingSetID: true)
        }
        expected += large
        #expect(written == large.count && modeChanged)
        #expect(try f.store.inode(ino).mode & 0o7777 == 0o755)
        #expect(try f.store.inode(ino).size == Int64(expected.count))
        #expect(try f.read(ino, 0, expected.count) == expected)
    }
}
