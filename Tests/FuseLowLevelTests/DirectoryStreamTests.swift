import CFuse
@testable import FuseLowLevel
import Posix
import Synchronization
import Testing
#if canImport(Glibc)
import Glibc
#endif

/// A directory of `count` files named n00000, n00001, … whose listings count a reference
/// per entry returned (as cache/'s store does) and record every count and forget: what the
/// bridge's paging does to a file system, without the kernel.
final class CountingDirectory: FileSystem, @unchecked Sendable {
    let names: [String]
    let references = Mutex<[InodeNumber: Int]>([:])
    let fetches = Mutex<[String?]>([])
    let counting: Bool

    init(count: Int, counting: Bool = true) {
        names = (0..<count).map { "n" + String(repeating: "0", count: 5 - String($0).count) + String($0) }
        self.counting = counting
    }

    static func inode(of index: Int) -> InodeNumber { InodeNumber(100 + index) }

    func entry(_ index: Int) -> DirectoryEntry {
        let attributes = Attributes(inode: Self.inode(of: index), mode: S_IFREG | 0o644, uid: 0, gid: 0,
                                    accessTime: Timestamp(seconds: 0), modificationTime: Timestamp(seconds: 0),
                                    changeTime: Timestamp(seconds: 0))
        return DirectoryEntry(name: names[index], entry: Entry(attributes: attributes, cache: .none))
    }

    func lookup(parent: InodeNumber, name: String, context: RequestContext) throws(Errno) -> Entry { throw .noSuchFileOrDirectory }
    func attributes(of inode: InodeNumber, context: RequestContext) throws(Errno) -> (Attributes, CachePolicy) {
        throw .noSuchFileOrDirectory
    }
    func open(_ inode: InodeNumber, flags: Int32, context: RequestContext) throws(Errno) -> OpenedFile { throw .isDirectory }
    func read(_ inode: InodeNumber, handle: UInt64, offset: UInt64, size: Int, context: RequestContext,
              reply: (UnsafeRawBufferPointer) -> Void) throws(Errno) {
        throw .isDirectory
    }
    func listDirectory(_ inode: InodeNumber, context: RequestContext) throws(Errno) -> [DirectoryEntry] {
        try listDirectory(inode, after: nil, limit: Int.max, context: context)
    }
    func pagesListing(of inode: InodeNumber) -> Bool { true }
    func countsListing(of inode: InodeNumber) -> Bool { counting }
    func listDirectory(_ inode: InodeNumber, after name: String?, limit: Int, context: RequestContext) throws(Errno) -> [DirectoryEntry] {
        fetches.withLock { $0.append(name) }
        let start = name.map { after in names.firstIndex { $0 > after } ?? names.count } ?? 0
        let page = (start..<min(names.count, start + limit)).map(entry)
        if counting { references.withLock { counts in for entry in page { counts[entry.entry.inode, default: 0] += 1 } } }
        return page
    }
    func countLookup(of inode: InodeNumber) { references.withLock { $0[inode, default: 0] += 1 } }
    func forget(inode: InodeNumber, lookups: UInt64) { references.withLock { $0[inode, default: 0] -= Int(lookups) } }

    var held: [InodeNumber: Int] { references.withLock { $0.filter { $0.value != 0 } } }
}

@Suite struct DirectoryStreamTests {
    let context = RequestContext(uid: 0, gid: 0, pid: 1, umask: 0o022)

    func stream(_ fs: CountingDirectory) throws -> FuseBridge.DirectoryStream {
        let first = try fs.listDirectory(1, after: nil, limit: FuseBridge.DirectoryStream.pageSize, context: context)
        return FuseBridge.DirectoryStream(inode: 1, entries: first, paged: true, counted: fs.countsListing(of: 1))
    }

    /// Pages are fetched by name as the reader reaches them, in order, one page held back
    /// for a reader that asks again from an entry a reply could not take.
    @Test func pagesAreFetchedByNameInOrder() throws {
        let fs = CountingDirectory(count: 600, counting: false)
        let stream = try stream(fs)
        var seen: [String] = []
        var index = 0
        while let entry = try stream.entry(index, from: fs, context: context) {
            seen.append(entry.name)
            index += 1
        }
        #expect(seen == fs.names)
        // The third page is short: the end is known without asking again.
        #expect(fs.fetches.withLock { $0 } == [nil, fs.names[255], fs.names[511]])
        // The page before is still held: no fetch to go back one entry.
        #expect(try stream.entry(300, from: fs, context: context)?.name == fs.names[300])
        #expect(fs.fetches.withLock { $0.count } == 3)
        // rewinddir: from the start again.
        #expect(try stream.entry(0, from: fs, context: context)?.name == fs.names[0])
        #expect(fs.fetches.withLock { $0.last } == .some(nil))
    }

    /// A counted listing: what was sent in READDIRPLUS keeps one reference each; what was
    /// fetched and never sent, or sent in a plain READDIR, is forgotten; a second send is
    /// one more reference.
    @Test func countedListingsHandOutExactlyWhatIsSent() throws {
        let fs = CountingDirectory(count: 600)
        let stream = try stream(fs)
        for index in 0..<300 {
            _ = try stream.entry(index, from: fs, context: context)
            stream.sent(index, plus: true, to: fs)
        }
        stream.sent(290, plus: true, to: fs)  // asked again from an earlier offset
        _ = try stream.entry(520, from: fs, context: context)  // fetched, never sent
        stream.sent(520, plus: false, to: fs)  // a plain READDIR: no reference
        stream.release(fs)
        var expected: [InodeNumber: Int] = [:]
        for index in 0..<300 { expected[CountingDirectory.inode(of: index)] = 1 }
        expected[CountingDirectory.inode(of: 290)] = 2
        #expect(fs.held == expected)
    }

    /// An uncounted listing: the bridge counts each READDIRPLUS entry as it sends it.
    @Test func uncountedListingsAreCountedWhenSent() throws {
        let fs = CountingDirectory(count: 10, counting: false)
        let stream = try stream(fs)
        for index in 0..<10 {
            _ = try stream.entry(index, from: fs, context: context)
            stream.sent(index, plus: index % 2 == 0, to: fs)
        }
        stream.release(fs)
        #expect(fs.held == Dictionary(uniqueKeysWithValues: stride(from: 0, to: 10, by: 2).map { (CountingDirectory.inode(of: $0), 1) }))
    }
}

/// setattr's flags become the attribute changes the file system sees.
@Suite struct AttributeChangeTests {
    @Test func flagsSelectWhatChanges() {
        var attr = stat()
        attr.st_mode = S_IFREG | 0o640
        attr.st_uid = 7
        attr.st_gid = 8
        attr.st_size = 4096
        attr.st_atim = timespec(tv_sec: 10, tv_nsec: 20)
        attr.st_mtim = timespec(tv_sec: 30, tv_nsec: 40)
        let all = FuseBridge.attributeChanges(attr, FUSE_SET_ATTR_MODE | FUSE_SET_ATTR_UID | FUSE_SET_ATTR_GID
                                                    | FUSE_SET_ATTR_SIZE | FUSE_SET_ATTR_ATIME | FUSE_SET_ATTR_MTIME)
        #expect(all == AttributeChanges(mode: S_IFREG | 0o640, uid: 7, gid: 8, size: 4096,
                                        accessTime: Timestamp(seconds: 10, nanoseconds: 20),
                                        modificationTime: Timestamp(seconds: 30, nanoseconds: 40)))
        #expect(FuseBridge.attributeChanges(attr, FUSE_SET_ATTR_SIZE) == AttributeChanges(size: 4096))
        let now = FuseBridge.attributeChanges(attr, FUSE_SET_ATTR_MTIME | FUSE_SET_ATTR_MTIME_NOW)
        #expect(now.modificationTime.map { $0.seconds > 1_000_000_000 } == true, "MTIME_NOW is now, not st_mtim")
        #expect(now.size == nil && now.mode == nil)
        attr.st_size = -1
        #expect(FuseBridge.attributeChanges(attr, FUSE_SET_ATTR_SIZE).size == 0, "a negative size is 0")
    }
}
