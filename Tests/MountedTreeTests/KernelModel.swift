import FuseLowLevel
@testable import MountedTree
import Posix
#if canImport(Glibc)
import Glibc
#endif

/// A small model of the kernel in front of one subtree, for replaying the system calls of
/// editors and tools without a mount: it resolves paths with lookups, keeps descriptors
/// (offset, flags, handle), turns `open(O_CREAT)` into lookup + create or open as the VFS
/// does, and forgets every reference it holds once a call is over (the most forgetful
/// kernel a file system can meet: nodes are freed and made again all the time).
///
/// It honours what an open answers, as the kernel does: a descriptor opened with direct
/// I/O reads from the tree every time; any other reads the model's page cache, filled by a
/// read from the tree, kept across opens that say `keepCache`, dropped by an open that
/// does not and by the tree's invalidations (the model is the kernel its notifier sends
/// to); close sends FLUSH only without `noFlush`, RELEASE always. An OPEN may be
/// postponed, as the kernel's may (a guarded field's prompt): the caller then sleeps in
/// `open` until the tree answers, or until `interruptAfter` passes, when it is interrupted
/// as by a Ctrl-C (INTERRUPT, then the tree's answer, EINTR).
///
/// Every call is written to `trace` as "call → result" with names relative to the
/// directory given at init, so that two trees can be compared call by call.
final class KernelModel {
    let tree: Subtree
    let directory: String
    /// Who makes the calls (pid 1 unless a test says: the guard decides on it).
    var context = RequestContext(uid: getuid(), gid: getgid(), pid: 1, umask: 0o022)
    /// Seconds a postponed open waits before its caller is interrupted.
    var interruptAfter: Double = 30
    private var references: [InodeNumber: UInt64] = [:]
    private struct Descriptor {
        var inode: InodeNumber
        var handle: UInt64
        var flags: Int32
        var opened: OpenedFile
        var offset: UInt64 = 0
    }
    /// The kernel's pages and what reached the tree (for tests to count).
    let kernel = Pages()
    private let notifier: KernelCacheNotifier?
    private(set) var readsFromTree = 0
    private(set) var readsFromPages = 0
    private(set) var flushes = 0
    private(set) var postponedOpens = 0

    /// The page cache: whole files by inode, which the tree's notifier invalidates.
    ///
    /// Thread-safety: one lock (the notifier sends from its own thread).
    final class Pages: KernelCache, @unchecked Sendable {
        let cached = Locked<[InodeNumber: [UInt8]]>([:])
        var workerCount: UInt32 { 8 }
        func invalidateInode(_ inode: InodeNumber, offset: Int64, length: Int64) -> Bool {
            cached.withLock { _ = $0.removeValue(forKey: inode) }
            return true
        }
        func invalidateEntry(parent: InodeNumber, name: String) -> Bool { true }  // every call looks names up
    }
    private var descriptors: [Int32: Descriptor] = [:]
    private var nextDescriptor: Int32 = 3
    private(set) var trace: [String] = []

    /// Whether every reference is forgotten once a call is over.
    let forgets: Bool

    /// `directory`: where the replayed tool works, below the subtree's top ("" for the top).
    init(_ tree: Subtree, directory: String, forgets: Bool = true) {
        self.tree = tree
        self.directory = directory
        self.forgets = forgets
        notifier = (tree as? any EditingTree)?.notifier
        notifier?.attach(kernel)
    }

    deinit { notifier?.attach(nil) }

    private func path(_ name: String) -> [String] {
        (directory.isEmpty ? [] : directory.split(separator: "/").map(String.init)) + [name]
    }

    private func note(_ call: String, _ result: Int32) -> Int32 {
        trace.append("\(call) → \(result < 0 ? Self.name(of: -result) : "ok")")
        settle()
        return result
    }

    static func name(of errno: Int32) -> String {
        switch errno {
        case ENOENT: "ENOENT"
        case EEXIST: "EEXIST"
        case EINVAL: "EINVAL"
        case EACCES: "EACCES"
        case EISDIR: "EISDIR"
        case ENOTDIR: "ENOTDIR"
        case EPERM: "EPERM"
        case EFBIG: "EFBIG"
        case ENOSPC: "ENOSPC"
        case EINTR: "EINTR"
        default: "errno \(errno)"
        }
    }

    /// Drops every reference not held by an open descriptor (a forgotten inode's pages go
    /// with it) — unless the model keeps what it looked up, as a kernel with room does.
    private func settle() {
        guard forgets else { return }
        let open = Set(descriptors.values.map(\.inode))
        for (inode, count) in references where !open.contains(inode) {
            tree.forget(inode: inode, lookups: count)
            references[inode] = nil
            kernel.cached.withLock { _ = $0.removeValue(forKey: inode) }
        }
    }

    private func referenced(_ entry: Entry) -> InodeNumber {
        references[entry.inode, default: 0] += 1
        return entry.inode
    }

    private func lookup(_ components: [String]) throws(Errno) -> InodeNumber {
        var inode = tree.space.root
        for component in components {
            inode = referenced(try tree.lookup(parent: inode, name: component, context: context))
        }
        return inode
    }

    private func parentAndName(_ name: String) throws(Errno) -> (InodeNumber, String) {
        let components = path(name)
        return (try lookup(Array(components.dropLast())), components.last!)
    }

    private func attempt(_ call: String, _ body: () throws(Errno) -> Int32) -> Int32 {
        do {
            return note(call, try body())
        } catch {
            return note(call, -error.rawValue)
        }
    }

    // MARK: System calls (results: >= 0, or -errno)

    @discardableResult
    func open(_ name: String, _ flags: Int32, mode: mode_t = 0o644) -> Int32 {
        attempt("open \(name) \(Self.describe(flags))") { () throws(Errno) -> Int32 in
            let (parent, last) = try parentAndName(name)
            var existing: InodeNumber?
            do throws(Errno) {
                existing = referenced(try tree.lookup(parent: parent, name: last, context: context))
            } catch {
                guard error == .noSuchFileOrDirectory else { throw error }
                existing = nil
            }
            let opened: (InodeNumber, OpenedFile)
            if let existing {
                if flags & O_CREAT != 0 && flags & O_EXCL != 0 { throw .fileExists }
                opened = (existing, try sendOpen(existing, flags: flags & ~(O_CREAT | O_EXCL)))
            } else {
                guard flags & O_CREAT != 0 else { throw .noSuchFileOrDirectory }
                let (entry, file) = try tree.create(parent: parent, name: last, mode: mode, flags: flags, context: context)
                opened = (referenced(entry), file)
            }
            // An open that does not keep the cache drops the pages (as invalidate_inode_pages2).
            if !opened.1.keepCache { kernel.cached.withLock { _ = $0.removeValue(forKey: opened.0) } }
            let fd = nextDescriptor
            nextDescriptor += 1
            descriptors[fd] = Descriptor(inode: opened.0, handle: opened.1.handle, flags: flags, opened: opened.1)
            return fd
        }
    }

    /// OPEN as the kernel sends it: answered at once, or postponed, and then waited for.
    private func sendOpen(_ inode: InodeNumber, flags: Int32) throws(Errno) -> OpenedFile {
        let waiting = PostponedOpen()
        let request = OpenRequest.answering({ result in
            waiting.state.withLock { state in
                guard !state.abandoned else { return false }  // the caller is gone: the tree releases
                state.result = result
                return true
            }
        }, postponed: { waiting.pending = $0 })
        if let opened = try tree.open(inode, flags: flags, context: context, request: request) { return opened }
        postponedOpens += 1
        var deadline = ContinuousClock.now.advanced(by: .milliseconds(Int(interruptAfter * 1000)))
        var interrupted = false
        while true {
            if let result = waiting.state.withLock({ $0.result }) { return try result.get() }
            if ContinuousClock.now >= deadline {
                // The kernel answers an interrupted caller only with the file system's
                // answer; one that never comes is the model's EINTR after 10 s more.
                guard !interrupted else {
                    if let result = waiting.state.withLock({ state -> Result<OpenedFile, Errno>? in
                        state.abandoned = state.result == nil
                        return state.result
                    }) { return try result.get() }
                    throw .interrupted
                }
                interrupted = true
                waiting.pending?.interrupt()
                deadline = ContinuousClock.now.advanced(by: .seconds(10))
            }
            usleep(1_000)
        }
    }

    /// A postponed open's answer, from whichever thread the tree answers on.
    private final class PostponedOpen: @unchecked Sendable {
        let state = Locked<(result: Result<OpenedFile, Errno>?, abandoned: Bool)>((nil, false))
        var pending: PendingOpen?  // (set on the caller's thread, in the open call)
    }

    @discardableResult
    func write(_ fd: Int32, _ text: String) -> Int32 {
        attempt("write \(text.count) bytes") { () throws(Errno) -> Int32 in
            guard var descriptor = descriptors[fd] else { throw .badFileDescriptor }
            var bytes = Array(text.utf8)
            let written = try bytes.withUnsafeMutableBufferPointer { (buffer) throws(Errno) -> Int in
                try tree.write(descriptor.inode, handle: descriptor.handle, offset: descriptor.offset,
                               data: UnsafeRawBufferPointer(buffer), flags: descriptor.flags, context: context)
            }
            // Written through: the kernel's pages hold what was written (direct I/O drops them).
            kernel.cached.withLock { pages in
                guard var cached = pages[descriptor.inode] else { return }
                if descriptor.opened.directIO { pages[descriptor.inode] = nil; return }
                let start = Int(descriptor.offset)
                if cached.count < start + written { cached += [UInt8](repeating: 0, count: start + written - cached.count) }
                cached.replaceSubrange(start..<start + written, with: bytes[0..<written])
                pages[descriptor.inode] = cached
            }
            descriptor.offset += UInt64(written)
            descriptors[fd] = descriptor
            return Int32(written)
        }
    }

    @discardableResult
    func fsync(_ fd: Int32) -> Int32 {
        attempt("fsync") { () throws(Errno) -> Int32 in
            guard let descriptor = descriptors[fd] else { throw .badFileDescriptor }
            try tree.synchronize(descriptor.inode, handle: descriptor.handle, dataOnly: false)
            return 0
        }
    }

    @discardableResult
    func ftruncate(_ fd: Int32, _ size: UInt64) -> Int32 {
        attempt("ftruncate \(size)") { () throws(Errno) -> Int32 in
            guard let descriptor = descriptors[fd] else { throw .badFileDescriptor }
            _ = try tree.setAttributes(of: descriptor.inode, AttributeChanges(size: size), handle: descriptor.handle,
                                       context: context)
            kernel.cached.withLock { pages in
                guard var cached = pages[descriptor.inode] else { return }
                if cached.count > Int(size) { cached.removeSubrange(Int(size)...) } else { cached += [UInt8](repeating: 0, count: Int(size) - cached.count) }
                pages[descriptor.inode] = cached
            }
            return 0
        }
    }

    /// close(2): FLUSH unless the open said `noFlush` (its error is close's), then RELEASE.
    @discardableResult
    func close(_ fd: Int32) -> Int32 {
        attempt("close") { () throws(Errno) -> Int32 in
            guard let descriptor = descriptors.removeValue(forKey: fd) else { throw .badFileDescriptor }
            defer { tree.release(descriptor.inode, handle: descriptor.handle, flags: descriptor.flags) }
            if !descriptor.opened.noFlush {
                flushes += 1
                try tree.flush(descriptor.inode, handle: descriptor.handle, context: context)
            }
            return 0
        }
    }

    /// Reads what the descriptor sees from its start: from the pages when the kernel has
    /// them and the open allows, else from the tree (filling the pages).
    func read(_ fd: Int32) -> String? {
        guard let descriptor = descriptors[fd] else { return nil }
        if !descriptor.opened.directIO, let cached = kernel.cached.withLock({ $0[descriptor.inode] }) {
            readsFromPages += 1
            return String(decoding: cached, as: UTF8.self)
        }
        var bytes: [UInt8] = []
        do {
            readsFromTree += 1
            try tree.read(descriptor.inode, handle: descriptor.handle, offset: 0, size: 1 << 20, context: context) {
                bytes = Array($0)
            }
        } catch {
            trace.append("read → \(Self.name(of: error.rawValue))")
            return nil
        }
        if !descriptor.opened.directIO { kernel.cached.withLock { $0[descriptor.inode] = bytes } }
        return String(decoding: bytes, as: UTF8.self)
    }

    @discardableResult
    func rename(_ from: String, _ to: String) -> Int32 {
        attempt("rename \(from) \(to)") { () throws(Errno) -> Int32 in
            let (parent, name) = try parentAndName(from)
            let (newParent, newName) = try parentAndName(to)
            try tree.rename(parent: parent, name: name, newParent: newParent, newName: newName, flags: [], context: context)
            return 0
        }
    }

    @discardableResult
    func unlink(_ name: String) -> Int32 {
        attempt("unlink \(name)") { () throws(Errno) -> Int32 in
            let (parent, last) = try parentAndName(name)
            try tree.unlink(parent: parent, name: last, context: context)
            return 0
        }
    }

    @discardableResult
    func symlink(_ target: String, _ name: String) -> Int32 {
        attempt("symlink \(name)") { () throws(Errno) -> Int32 in
            let (parent, last) = try parentAndName(name)
            _ = referenced(try tree.makeSymbolicLink(target: target, parent: parent, name: last, context: context))
            return 0
        }
    }

    @discardableResult
    func makeDirectory(_ name: String, mode: mode_t = 0o700) -> Int32 {
        attempt("mkdir \(name)") { () throws(Errno) -> Int32 in
            let (parent, last) = try parentAndName(name)
            _ = referenced(try tree.makeDirectory(parent: parent, name: last, mode: mode, context: context))
            return 0
        }
    }

    @discardableResult
    func stat(_ name: String) -> Int32 {
        attempt("stat \(name)") { () throws(Errno) -> Int32 in
            _ = try lookup(path(name))
            return 0
        }
    }

    /// The whole content of a file, read through a fresh descriptor (nil: it cannot be read).
    func contents(_ name: String) -> String? {
        let fd = open(name, O_RDONLY)
        guard fd >= 0 else { return nil }
        defer { close(fd) }
        return read(fd)
    }

    /// Names in the working directory (the listing a `readdirplus` hands out, each entry one
    /// reference, forgotten at once).
    func list() -> [String] {
        do {
            let inode = try lookup(path("").dropLast())
            let entries = try tree.listDirectory(inode, context: context)
            // Counted by the listing itself, or by the bridge as it sends them.
            let counted = tree.countsListing(of: inode)
            for entry in entries {
                if !counted { tree.countLookup(of: entry.entry.inode) }
                references[entry.entry.inode, default: 0] += 1
            }
            settle()
            return entries.map(\.name).sorted()
        } catch {
            settle()
            return ["error \(error)"]
        }
    }

    static func describe(_ flags: Int32) -> String {
        var parts = [flags & O_ACCMODE == O_RDONLY ? "r" : flags & O_ACCMODE == O_WRONLY ? "w" : "rw"]
        if flags & O_CREAT != 0 { parts.append("creat") }
        if flags & O_EXCL != 0 { parts.append("excl") }
        if flags & O_TRUNC != 0 { parts.append("trunc") }
        if flags & O_APPEND != 0 { parts.append("append") }
        return parts.joined(separator: "|")
    }
}
