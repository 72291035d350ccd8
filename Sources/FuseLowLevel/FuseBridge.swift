#if canImport(Glibc)
import Glibc
#endif
import CFuse
import Posix
import Synchronization

/// Turns libfuse low-level callbacks into calls on a `FileSystem` and its answers (or
/// thrown `Errno`) into replies. The only file that speaks libfuse's request API.
///
/// Callbacks are C function pointers: they find the bridge through the session's user
/// data and never capture anything. Every request gets exactly one reply.
///
/// Thread-safety: immutable after init; callbacks run on every worker thread at once, and
/// `fileSystem` guards its own state.
final class FuseBridge: Sendable {
    let fileSystem: any FileSystem
    let kernel: KernelOptions
    /// The session (its address; set once it exists), for what a request must tell the
    /// kernel before its reply (`attributesChanged`).
    let session = Atomic<UInt>(0)

    init(fileSystem: any FileSystem, kernel: KernelOptions) {
        self.fileSystem = fileSystem
        self.kernel = kernel
    }

    /// A directory being read. Either the snapshot taken at `opendir`, or (for file systems
    /// that page their listings) one page of it at a time, fetched by name when the kernel
    /// reaches its end. Offsets: 0 is ".", 1 is "..", 2 + i is entry i.
    ///
    /// Counted listings (`countsListing`): every entry fetched carries one kernel reference
    /// (a credit) until it is sent in a READDIRPLUS reply; a page let go, a rewind or the
    /// release forgets the credits left, and an entry sent again is counted again.
    ///
    /// Thread-safety: the kernel sends one READDIR of an open directory at a time.
    final class DirectoryStream {
        static let pageSize = 256
        let inode: InodeNumber
        let paged: Bool
        let counted: Bool
        /// The entries held: all of them, or the page starting at entry `pageStart`.
        var entries: [DirectoryEntry]
        /// Per entry of `entries` and `previous`: still holds its fetched reference.
        var credits: [Bool]
        var pageStart = 0
        /// Paged: the last page was shorter than a page (nothing after it).
        var exhausted: Bool

        init(inode: InodeNumber, entries: [DirectoryEntry], paged: Bool, counted: Bool) {
            self.inode = inode
            self.entries = entries
            self.paged = paged
            self.counted = counted
            credits = Array(repeating: counted, count: entries.count)
            exhausted = !paged || entries.count < Self.pageSize
        }

        /// The page before `entries` (the kernel asks again from the first entry a reply
        /// could not take, which may lie there).
        var previous: [DirectoryEntry] = []
        var previousCredits: [Bool] = []

        /// Entry `index`, fetching pages as needed; nil past the end. A failed fetch leaves
        /// the pages as they were.
        func entry(_ index: Int, from fs: any FileSystem, context: RequestContext) throws(Errno) -> DirectoryEntry? {
            if index >= pageStart && index < pageStart + entries.count { return entries[index - pageStart] }
            let previousStart = pageStart - previous.count
            if index >= previousStart && index < pageStart { return previous[index - previousStart] }
            guard paged else { return nil }
            if index < previousStart {  // a seek backwards (rewinddir): start over
                let first = try fs.listDirectory(inode, after: nil, limit: Self.pageSize, context: context)
                forgetCredits(previous, previousCredits, fs)
                forgetCredits(entries, credits, fs)
                (previous, previousCredits, entries, pageStart) = ([], [], first, 0)
                credits = Array(repeating: counted, count: first.count)
                exhausted = first.count < Self.pageSize
            }
            while index >= pageStart + entries.count {
                if exhausted { return nil }
                let next = try fs.listDirectory(inode, after: entries.last?.name, limit: Self.pageSize, context: context)
                forgetCredits(previous, previousCredits, fs)
                (previous, previousCredits, entries, pageStart) = (entries, credits, next, pageStart + entries.count)
                credits = Array(repeating: counted, count: next.count)
                exhausted = next.count < Self.pageSize
                if next.isEmpty { return nil }
            }
            return entries[index - pageStart]
        }

        /// Entry `index` went to the kernel: in a READDIRPLUS reply (`plus`, one reference
        /// handed out) or a plain READDIR (none). Counts or forgets as the listing needs.
        func sent(_ index: Int, plus: Bool, to fs: any FileSystem) {
            guard let entry = entryIfHeld(index) else { return }
            if !counted {
                if plus { fs.countLookup(of: entry.entry.inode) }
                return
            }
            let hadCredit = takeCredit(index)
            if plus && !hadCredit {
                fs.countLookup(of: entry.entry.inode)  // sent again (a seek back): one more reference
            } else if !plus && hadCredit {
                fs.forget(inode: entry.entry.inode, lookups: 1)
            }
        }

        /// The directory is closed: references fetched and never sent go.
        func release(_ fs: any FileSystem) {
            forgetCredits(previous, previousCredits, fs)
            forgetCredits(entries, credits, fs)
            (previousCredits, credits) = (previousCredits.map { _ in false }, credits.map { _ in false })
        }

        private func entryIfHeld(_ index: Int) -> DirectoryEntry? {
            if index >= pageStart && index < pageStart + entries.count { return entries[index - pageStart] }
            let previousStart = pageStart - previous.count
            if index >= previousStart && index < pageStart { return previous[index - previousStart] }
            return nil
        }

        private func takeCredit(_ index: Int) -> Bool {
            if index >= pageStart && index < pageStart + entries.count {
                defer { credits[index - pageStart] = false }
                return credits[index - pageStart]
            }
            let previousStart = pageStart - previous.count
            guard index >= previousStart && index < pageStart else { return false }
            defer { previousCredits[index - previousStart] = false }
            return previousCredits[index - previousStart]
        }

        private func forgetCredits(_ list: [DirectoryEntry], _ credits: [Bool], _ fs: any FileSystem) {
            for (entry, credit) in zip(list, credits) where credit { fs.forget(inode: entry.entry.inode, lookups: 1) }
        }
    }

    static func operations() -> fuse_lowlevel_ops {
        var ops = fuse_lowlevel_ops()
        ops.`init` = { userdata, conn in
            guard let userdata, let conn else { return }
            let bridge = Unmanaged<FuseBridge>.fromOpaque(userdata).takeUnretainedValue()
            bridge.configure(conn)
        }
        ops.lookup = { req, parent, name in
            FuseBridge.respond(req, "lookup", parent) { fs, context throws(Errno) in
                do throws(Errno) {
                    FuseBridge.replyEntry(req, fs, try fs.lookup(parent: parent, name: try FuseBridge.decode(name), context: context))
                } catch where error == .noSuchFileOrDirectory {
                    // A negative entry the kernel keeps (as libfuse's passthrough_hp does), where
                    // the tree allows it: the next stat of the name sends no LOOKUP.
                    let timeout = fs.absentNameTimeout(parent: parent)
                    guard timeout > 0 else { throw error }
                    var parameters = fuse_entry_param()
                    parameters.ino = 0
                    parameters.entry_timeout = timeout
                    _ = fuse_reply_entry(req, &parameters)
                }
            }
        }
        ops.forget = { req, inode, lookups in
            FuseBridge.bridge(req)?.fileSystem.forget(inode: inode, lookups: lookups)
            fuse_reply_none(req)
        }
        ops.forget_multi = { req, count, forgets in
            if let fs = FuseBridge.bridge(req)?.fileSystem, let forgets {
                for index in 0..<count { fs.forget(inode: forgets[index].ino, lookups: forgets[index].nlookup) }
            }
            fuse_reply_none(req)
        }
        ops.getattr = { req, inode, fi in
            FuseBridge.respond(req, "getattr", inode) { fs, context throws(Errno) in
                var context = context
                context.fileHandle = fi?.pointee.fh
                let (attributes, cache) = try fs.attributes(of: inode, context: context)
                FuseBridge.replyAttributes(req, attributes, cache)
            }
        }
        ops.setattr = { req, inode, attr, toSet, fi in
            FuseBridge.respond(req, "setattr", inode) { fs, context throws(Errno) in
                guard let attr else { throw FuseBridge.missing("setattr's attributes") }
                var changes = FuseBridge.attributeChanges(attr.pointee, toSet)
                if SetIDKill.requested {  // a chown, or a truncate by a caller without CAP_FSETID
                    if let mode = changes.mode {
                        changes.mode = SetIDBits.killed(mode)
                    } else if let (current, _) = try? fs.attributes(of: inode, context: context),
                              SetIDBits.wouldDrop(current.mode) {
                        changes.mode = SetIDBits.killed(current.mode)
                    }
                }
                let handle = fi.map { $0.pointee.fh }
                let (attributes, cache) = try fs.setAttributes(of: inode, changes, handle: handle,
                                                               context: context)
                FuseBridge.replyAttributes(req, attributes, cache)
            }
        }
        ops.readlink = { req, inode in
            FuseBridge.respond(req, "readlink", inode) { fs, context throws(Errno) in
                _ = fuse_reply_readlink(req, try fs.readLink(inode, context: context))
            }
        }
        ops.mknod = { req, parent, name, mode, device in
            FuseBridge.respond(req, "mknod", parent) { fs, context throws(Errno) in
                FuseBridge.replyEntry(req, fs, try fs.makeNode(parent: parent, name: try FuseBridge.decode(name), mode: mode,
                                                device: device, context: context))
            }
        }
        ops.mkdir = { req, parent, name, mode in
            FuseBridge.respond(req, "mkdir", parent) { fs, context throws(Errno) in
                FuseBridge.replyEntry(req, fs, try fs.makeDirectory(parent: parent, name: try FuseBridge.decode(name),
                                                     mode: mode, context: context))
            }
        }
        ops.unlink = { req, parent, name in
            FuseBridge.respond(req, "unlink", parent) { fs, context throws(Errno) in
                try fs.unlink(parent: parent, name: try FuseBridge.decode(name), context: context)
                fuse_reply_err(req, 0)
            }
        }
        ops.rmdir = { req, parent, name in
            FuseBridge.respond(req, "rmdir", parent) { fs, context throws(Errno) in
                try fs.removeDirectory(parent: parent, name: try FuseBridge.decode(name), context: context)
                fuse_reply_err(req, 0)
            }
        }
        ops.symlink = { req, target, parent, name in
            FuseBridge.respond(req, "symlink", parent) { fs, context throws(Errno) in
                FuseBridge.replyEntry(req, fs, try fs.makeSymbolicLink(target: try FuseBridge.decode(target), parent: parent,
                                                        name: try FuseBridge.decode(name), context: context))
            }
        }
        ops.rename = { req, parent, name, newParent, newName, flags in
            FuseBridge.respond(req, "rename", parent) { fs, context throws(Errno) in
                try fs.rename(parent: parent, name: try FuseBridge.decode(name), newParent: newParent,
                              newName: try FuseBridge.decode(newName), flags: RenameFlags(rawValue: flags),
                              context: context)
                fuse_reply_err(req, 0)
            }
        }
        ops.link = { req, inode, newParent, newName in
            FuseBridge.respond(req, "link", inode) { fs, context throws(Errno) in
                FuseBridge.replyEntry(req, fs, try fs.link(inode, newParent: newParent, newName: try FuseBridge.decode(newName),
                                            context: context))
            }
        }
        ops.open = { req, inode, fi in
            FuseBridge.respond(req, "open", inode) { fs, context throws(Errno) in
                let fi = try FuseBridge.fileInfo(fi, "open")
                // nil: postponed (a prompt); the PendingOpen replies later.
                guard let opened = try fs.open(inode, flags: fi.pointee.flags, context: context,
                                               request: OpenRequest(request: req, info: fi)) else { return }
                FuseBridge.apply(opened, to: fi)
                // O_TRUNC without CAP_FSETID: the set-ID bits go.
                if SetIDKill.requested && fs.dropSetID(of: inode, context: context) { FuseBridge.attributesChanged(req, inode) }
                // Not taken by the kernel (interrupted): no RELEASE will come for it.
                if fuse_reply_open(req, fi) != 0 { fs.release(inode, handle: fi.pointee.fh, flags: fi.pointee.flags) }
            }
        }
        ops.create = { req, parent, name, mode, fi in
            FuseBridge.respond(req, "create", parent) { fs, context throws(Errno) in
                let fi = try FuseBridge.fileInfo(fi, "create")
                let (entry, opened) = try fs.create(parent: parent, name: try FuseBridge.decode(name), mode: mode,
                                                    flags: fi.pointee.flags, context: context)
                FuseBridge.apply(opened, to: fi)
                var parameters = FuseBridge.entryParameters(entry)
                // Not taken by the kernel (interrupted): neither a RELEASE nor a FORGET will come.
                if fuse_reply_create(req, &parameters, fi) != 0 {
                    fs.release(entry.inode, handle: fi.pointee.fh, flags: fi.pointee.flags)
                    fs.forget(inode: entry.inode, lookups: 1)
                }
            }
        }
        ops.read = { req, inode, size, offset, fi in
            FuseBridge.respond(req, "read", inode) { fs, context throws(Errno) in
                try fs.read(inode, handle: try FuseBridge.fileInfo(fi, "read").pointee.fh, offset: UInt64(offset), size: size,
                            context: context) { bytes in _ = fuse_reply_buf(req, bytes.baseAddress, bytes.count) }
            }
        }
        ops.write = { req, inode, buffer, size, offset, fi in
            FuseBridge.respond(req, "write", inode) { fs, context throws(Errno) in
                let fi = try FuseBridge.fileInfo(fi, "write")
                let data = UnsafeRawBufferPointer(start: buffer, count: size)
                // A writer without CAP_FSETID: the tree drops the set-ID bits with the write.
                // nil: postponed; the PendingWrite replies later.
                guard let (written, modeChanged) = try fs.write(inode, handle: fi.pointee.fh, offset: UInt64(offset), data: data,
                                                                flags: fi.pointee.flags, droppingSetID: SetIDKill.requested,
                                                                context: context, request: WriteRequest(request: req)) else { return }
                if modeChanged { FuseBridge.attributesChanged(req, inode) }
                _ = fuse_reply_write(req, written)
            }
        }
        ops.flush = { req, inode, fi in
            FuseBridge.respond(req, "flush", inode) { fs, context throws(Errno) in
                try fs.flush(inode, handle: try FuseBridge.fileInfo(fi, "flush").pointee.fh, context: context)
                fuse_reply_err(req, 0)
            }
        }
        ops.release = { req, inode, fi in
            if let fs = FuseBridge.bridge(req)?.fileSystem, let fi {
                fs.release(inode, handle: fi.pointee.fh, flags: fi.pointee.flags)
            } else {
                Log.error("FUSE: release of inode \(inode) came without its file information (its handle stays)")
            }
            fuse_reply_err(req, 0)
        }
        ops.fsync = { req, inode, dataOnly, fi in
            FuseBridge.respond(req, "fsync", inode) { fs, _ throws(Errno) in
                try fs.synchronize(inode, handle: try FuseBridge.fileInfo(fi, "fsync").pointee.fh, dataOnly: dataOnly != 0)
                fuse_reply_err(req, 0)
            }
        }
        ops.opendir = { req, inode, fi in
            FuseBridge.respond(req, "opendir", inode) { fs, context throws(Errno) in
                try fs.openDirectory(inode, context: context)
                let paged = fs.pagesListing(of: inode)
                let first = paged ? try fs.listDirectory(inode, after: nil, limit: DirectoryStream.pageSize, context: context)
                                  : try fs.listDirectory(inode, context: context)
                let stream = DirectoryStream(inode: inode, entries: first, paged: paged, counted: fs.countsListing(of: inode))
                let fi = try FuseBridge.fileInfo(fi, "opendir")
                fi.pointee.fh = UInt64(UInt(bitPattern: Unmanaged.passRetained(stream).toOpaque()))
                _ = fuse_reply_open(req, fi)
            }
        }
        ops.readdir = { req, _, size, offset, fi in
            FuseBridge.replyDirectory(req, fi?.pointee.fh ?? 0, size: size, offset: offset, plus: false)
        }
        ops.readdirplus = { req, _, size, offset, fi in
            FuseBridge.replyDirectory(req, fi?.pointee.fh ?? 0, size: size, offset: offset, plus: true)
        }
        ops.releasedir = { req, _, fi in
            if let fi, let pointer = UnsafeRawPointer(bitPattern: UInt(fi.pointee.fh)) {
                let stream = Unmanaged<DirectoryStream>.fromOpaque(pointer)
                if let fs = FuseBridge.bridge(req)?.fileSystem { stream.takeUnretainedValue().release(fs) }
                stream.release()
            }
            fuse_reply_err(req, 0)
        }
        ops.fsyncdir = { req, inode, _, _ in
            FuseBridge.respond(req, "fsyncdir", inode) { fs, _ throws(Errno) in
                try fs.synchronizeDirectory(inode)
                fuse_reply_err(req, 0)
            }
        }
        ops.fallocate = { req, inode, mode, offset, length, fi in
            FuseBridge.respond(req, "fallocate", inode) { fs, context throws(Errno) in
                guard offset >= 0, length > 0 else { throw .invalidArgument }
                try fs.allocate(inode, handle: try FuseBridge.fileInfo(fi, "fallocate").pointee.fh, mode: mode, offset: UInt64(offset),
                                length: UInt64(length), context: context)
                fuse_reply_err(req, 0)
            }
        }
        ops.lseek = { req, inode, offset, whence, fi in
            FuseBridge.respond(req, "lseek", inode) { fs, context throws(Errno) in
                guard offset >= 0, whence == SeekWhence.data || whence == SeekWhence.hole else { throw .invalidArgument }
                let found = try fs.seek(inode, handle: try FuseBridge.fileInfo(fi, "lseek").pointee.fh, offset: UInt64(offset), whence: whence,
                                        context: context)
                _ = fuse_reply_lseek(req, off_t(clamping: found))
            }
        }
        ops.copy_file_range = { req, source, sourceOffset, sourceFile, destination, destinationOffset, destinationFile,
                                length, flags in
            FuseBridge.respond(req, "copy_file_range", source) { fs, context throws(Errno) in
                guard flags == 0, sourceOffset >= 0, destinationOffset >= 0 else { throw .invalidArgument }
                let copied = try fs.copyRange(from: source, handle: try FuseBridge.fileInfo(sourceFile, "copy_file_range").pointee.fh,
                                              offset: UInt64(sourceOffset), to: destination,
                                              handle: try FuseBridge.fileInfo(destinationFile, "copy_file_range").pointee.fh,
                                              offset: UInt64(destinationOffset), length: min(length, Int.max),
                                              context: context)
                _ = fuse_reply_write(req, copied)
            }
        }
        ops.statfs = { req, inode in
            FuseBridge.respond(req, "statfs", inode) { fs, _ throws(Errno) in
                let stats = try fs.statistics(inode)
                var out = statvfs()
                out.f_bsize = UInt(stats.blockSize)
                out.f_frsize = UInt(stats.blockSize)
                out.f_blocks = fsblkcnt_t(stats.blocks)
                out.f_bfree = fsblkcnt_t(stats.freeBlocks)
                out.f_bavail = fsblkcnt_t(stats.availableBlocks)
                out.f_files = fsfilcnt_t(stats.files)
                out.f_ffree = fsfilcnt_t(stats.freeFiles)
                out.f_favail = fsfilcnt_t(stats.freeFiles)
                out.f_namemax = UInt(stats.maximumNameLength)
                _ = fuse_reply_statfs(req, &out)
            }
        }
        ops.setxattr = { req, inode, name, value, size, flags in
            FuseBridge.respond(req, "setxattr", inode) { fs, context throws(Errno) in
                let decoded = try FuseBridge.decode(name)
                try FuseBridge.requireKeptNamespace(decoded)
                let bytes = value.map { Array(UnsafeRawBufferPointer(start: $0, count: size)) } ?? []
                try fs.setExtendedAttribute(inode, name: decoded, value: bytes, flags: flags,
                                            context: context)
                fuse_reply_err(req, 0)
            }
        }
        ops.getxattr = { req, inode, name, size in
            FuseBridge.respond(req, "getxattr", inode) { fs, context throws(Errno) in
                let decoded = try FuseBridge.decode(name)
                try FuseBridge.requireKeptNamespace(decoded)
                let value = try fs.extendedAttribute(inode, name: decoded, context: context)
                try FuseBridge.replySized(req, value, limit: size)
            }
        }
        ops.listxattr = { req, inode, size in
            FuseBridge.respond(req, "listxattr", inode) { fs, context throws(Errno) in
                var list: [UInt8] = []
                for name in try fs.extendedAttributeNames(inode, context: context) {
                    list += Array(name.utf8) + [0]
                }
                try FuseBridge.replySized(req, list, limit: size)
            }
        }
        ops.removexattr = { req, inode, name in
            FuseBridge.respond(req, "removexattr", inode) { fs, context throws(Errno) in
                let decoded = try FuseBridge.decode(name)
                try FuseBridge.requireKeptNamespace(decoded)
                try fs.removeExtendedAttribute(inode, name: decoded, context: context)
                fuse_reply_err(req, 0)
            }
        }
        return ops
    }

    private func configure(_ conn: UnsafeMutablePointer<fuse_conn_info>) {
        let capable = conn.pointee.capable
        var want = conn.pointee.want
        if kernel.readDirectoryPlus && capable & UInt32(FUSE_CAP_READDIRPLUS) != 0 {
            want |= UInt32(FUSE_CAP_READDIRPLUS)
            want &= ~UInt32(FUSE_CAP_READDIRPLUS_AUTO)
        }
        if kernel.explicitDataInvalidation && capable & UInt32(FUSE_CAP_EXPLICIT_INVAL_DATA) != 0 {
            want |= UInt32(FUSE_CAP_EXPLICIT_INVAL_DATA)
            want &= ~UInt32(FUSE_CAP_AUTO_INVAL_DATA)
        }
        conn.pointee.want = want
        conn.pointee.time_gran = 1
    }

    // MARK: - Helpers shared by the callbacks

    /// The bridge the session was made with (nil only if libfuse broke its word: said in the
    /// log by the caller's reply, never a trap).
    @inline(__always)
    private static func bridge(_ req: fuse_req_t?) -> FuseBridge? {
        fuse_req_userdata(req).map { Unmanaged<FuseBridge>.fromOpaque($0).takeUnretainedValue() }
    }

    /// The request's caller (nil as for `bridge`).
    @inline(__always)
    private static func caller(_ req: fuse_req_t?) -> RequestContext? {
        guard let raw = fuse_req_ctx(req)?.pointee else { return nil }
        return RequestContext(uid: raw.uid, gid: raw.gid, pid: raw.pid, umask: raw.umask)
    }

    /// A broken promise of libfuse's (a request without what it always carries): the request
    /// is answered EIO, the log names what was missing, and the mount goes on.
    static func missing(_ what: String) -> Errno {
        Log.error("FUSE: a request came without \(what) (answered EIO)")
        return .ioError
    }

    /// The file information libfuse passes with every request on an open file.
    @inline(__always)
    private static func fileInfo(_ fi: UnsafeMutablePointer<fuse_file_info>?, _ operation: StaticString) throws(Errno)
        -> UnsafeMutablePointer<fuse_file_info> {
        guard let fi else { throw missing("the file information of its \(operation)") }
        return fi
    }

    /// Runs one request: the body replies on success; a thrown `Errno` becomes the reply.
    /// At debug level each request is logged with its inode, caller and result — never a
    /// name's or a value's bytes.
    @inline(__always)
    private static func respond(_ req: fuse_req_t?, _ operation: StaticString, _ inode: fuse_ino_t,
                                _ body: (any FileSystem, RequestContext) throws(Errno) -> Void) {
        guard let fs = bridge(req)?.fileSystem, let context = caller(req) else {
            fuse_reply_err(req, missing("its session or caller (\(operation))").rawValue)
            return
        }
        do {
            try body(fs, context)
            if Log.isDebugging { Log.debug("\(operation) inode \(inode) from pid \(context.pid): ok") }
        } catch {
            if Log.isDebugging { Log.debug("\(operation) inode \(inode) from pid \(context.pid): \(error)") }
            fuse_reply_err(req, error.rawValue)
        }
    }

    /// mtmfs keeps `user.*` attributes only: the namespaces of features it does not have —
    /// SELinux labels (`security.*`), POSIX ACLs (`system.posix_acl_*`), `trusted.*` — get
    /// what a local file system without them answers, EOPNOTSUPP, so that callers that
    /// remember it (coreutils' `ls -l` asks every entry for `security.selinux` and its
    /// ACL, and stops asking a device that said "not supported") send no more.
    static func requireKeptNamespace(_ name: String) throws(Errno) {
        if name.hasPrefix("security.") || name.hasPrefix("system.") || name.hasPrefix("trusted.") { throw .notSupported }
    }

    /// A name from the kernel; names that are not UTF-8 are refused with EILSEQ.
    private static func decode(_ name: UnsafePointer<CChar>?) throws(Errno) -> String {
        guard let name, let string = String(validatingCString: name) else { throw .illegalByteSequence }
        return string
    }

    private static func makeStat(_ a: Attributes) -> stat {
        var st = stat()
        st.st_ino = __ino_t(a.inode)
        st.st_mode = a.mode
        st.st_nlink = UInt(a.linkCount)
        st.st_uid = a.uid
        st.st_gid = a.gid
        st.st_size = off_t(clamping: a.size)
        st.st_blocks = blkcnt_t(clamping: a.blocks)
        st.st_blksize = 4096
        st.st_atim = a.accessTime.cValue
        st.st_mtim = a.modificationTime.cValue
        st.st_ctim = a.changeTime.cValue
        st.st_rdev = __dev_t(a.device)
        return st
    }

    private static func entryParameters(_ entry: Entry) -> fuse_entry_param {
        var parameters = fuse_entry_param()
        parameters.ino = entry.inode
        parameters.generation = entry.generation
        parameters.attr = makeStat(entry.attributes)
        parameters.attr_timeout = entry.cache.attributeTimeout
        parameters.entry_timeout = entry.cache.entryTimeout
        return parameters
    }

    /// The kernel's cached attributes of `inode` are stale (its mode changed behind a request
    /// that does not answer with attributes).
    static func attributesChanged(_ req: fuse_req_t?, _ inode: InodeNumber) {
        if let bridge = bridge(req), let session = OpaquePointer(bitPattern: bridge.session.load(ordering: .acquiring)) {
            _ = fuse_lowlevel_notify_inval_inode(session, inode, -1, 0)  // attributes only
        }
    }

    /// An entry the kernel did not take (its request was interrupted and is gone, or the
    /// session ended) was never a reference: it is forgotten at once.
    private static func replyEntry(_ req: fuse_req_t?, _ fs: any FileSystem, _ entry: Entry) {
        var parameters = entryParameters(entry)
        if fuse_reply_entry(req, &parameters) != 0 { fs.forget(inode: entry.inode, lookups: 1) }
    }

    private static func replyAttributes(_ req: fuse_req_t?, _ attributes: Attributes, _ cache: CachePolicy) {
        var st = makeStat(attributes)
        _ = fuse_reply_attr(req, &st, cache.attributeTimeout)
    }

    /// getxattr/listxattr: size 0 asks for the length; a smaller buffer gets ERANGE.
    private static func replySized(_ req: fuse_req_t?, _ bytes: [UInt8], limit: Int) throws(Errno) {
        if limit == 0 {
            _ = fuse_reply_xattr(req, bytes.count)
        } else if bytes.count > limit {
            throw .outOfRange
        } else {
            _ = bytes.withUnsafeBytes { fuse_reply_buf(req, $0.baseAddress, $0.count) }
        }
    }

    static func apply(_ opened: OpenedFile, to fi: UnsafeMutablePointer<fuse_file_info>) {
        fi.pointee.fh = opened.handle
        fi.pointee.direct_io = opened.directIO ? 1 : 0
        fi.pointee.keep_cache = opened.keepCache ? 1 : 0
        fi.pointee.noflush = opened.noFlush ? 1 : 0
    }

    static func attributeChanges(_ attr: stat, _ toSet: Int32) -> AttributeChanges {
        var changes = AttributeChanges()
        if toSet & FUSE_SET_ATTR_MODE != 0 { changes.mode = attr.st_mode }
        if toSet & FUSE_SET_ATTR_UID != 0 { changes.uid = attr.st_uid }
        if toSet & FUSE_SET_ATTR_GID != 0 { changes.gid = attr.st_gid }
        if toSet & FUSE_SET_ATTR_SIZE != 0 { changes.size = UInt64(max(0, attr.st_size)) }
        if toSet & FUSE_SET_ATTR_ATIME_NOW != 0 {
            changes.accessTime = .now()
        } else if toSet & FUSE_SET_ATTR_ATIME != 0 {
            changes.accessTime = Timestamp(seconds: Int64(attr.st_atim.tv_sec),
                                           nanoseconds: Int64(attr.st_atim.tv_nsec))
        }
        if toSet & FUSE_SET_ATTR_MTIME_NOW != 0 {
            changes.modificationTime = .now()
        } else if toSet & FUSE_SET_ATTR_MTIME != 0 {
            changes.modificationTime = Timestamp(seconds: Int64(attr.st_mtim.tv_sec),
                                                 nanoseconds: Int64(attr.st_mtim.tv_nsec))
        }
        return changes
    }

    /// Packs the snapshot from `offset` into one reply of at most `size` bytes. Offsets:
    /// 0 is ".", 1 is "..", 2 + i is entry i; each entry carries the offset of the next.
    private static func replyDirectory(_ req: fuse_req_t?, _ handle: UInt64, size: Int, offset: off_t,
                                       plus: Bool) {
        guard let pointer = UnsafeRawPointer(bitPattern: UInt(handle)) else {
            fuse_reply_err(req, EBADF)
            return
        }
        let stream = Unmanaged<DirectoryStream>.fromOpaque(pointer).takeUnretainedValue()
        guard let fs = bridge(req)?.fileSystem, let context = caller(req) else {
            fuse_reply_err(req, missing("its session or caller (readdir)").rawValue)
            return
        }
        let buffer = UnsafeMutablePointer<CChar>.allocate(capacity: size)
        defer { buffer.deallocate() }
        var used = 0
        var index = Int(max(0, offset))
        var handedOut: [InodeNumber] = []
        while true {
            let name: String
            var st = stat()
            var parameters = fuse_entry_param()
            if index < 2 {
                name = index == 0 ? "." : ".."
                st.st_ino = __ino_t(index == 0 ? stream.inode : 1)
                st.st_mode = S_IFDIR
                parameters.attr = st  // ino 0: the kernel makes no dentry for dots
            } else {
                let found: DirectoryEntry?
                do {
                    found = try stream.entry(index - 2, from: fs, context: context)
                } catch {
                    if used == 0 { fuse_reply_err(req, error.rawValue); return }
                    break  // what fits is sent; the error comes with the next call
                }
                guard let entry = found else { break }
                name = entry.name
                if plus {
                    parameters = entryParameters(entry.entry)
                } else {
                    st.st_ino = __ino_t(entry.entry.inode)
                    st.st_mode = entry.entry.attributes.mode & S_IFMT
                }
            }
            let next = off_t(index + 1)
            let needed = name.withCString { cName in
                plus ? fuse_add_direntry_plus(req, buffer + used, size - used, cName, &parameters, next)
                     : fuse_add_direntry(req, buffer + used, size - used, cName, &st, next)
            }
            if needed > size - used { break }
            used += needed
            if index >= 2 {
                stream.sent(index - 2, plus: plus, to: fs)
                if plus { handedOut.append(parameters.ino) }
            }
            index += 1
        }
        // A reply the kernel did not take (interrupted) handed out no reference.
        if fuse_reply_buf(req, buffer, used) != 0 {
            for inode in handedOut { fs.forget(inode: inode, lookups: 1) }
        }
    }
}
