#if canImport(Glibc)
import Glibc
#endif
import CPosixShims

/// What /proc says about one process or thread: the facts an access decision is made of
/// (who runs it, what it runs, who traces it, what code it maps, who started it).
///
/// Thread-safety: stateless; each call reads /proc afresh.
public enum ProcessInspection {
    /// What an access decision needs of `/proc/ID/status` (ID may be a thread id).
    ///
    /// Thread-safety: a value.
    public struct Status: Sendable, Equatable {
        /// The process (thread group) the thread belongs to.
        public var process: pid_t
        /// Who traces it (0: nobody).
        public var tracer: pid_t
        public var credentials: Credentials
        /// How many threads its process has (a tracer of any of them reaches all).
        public var threads: Int
    }

    /// Read on every guarded open: parsed in place, only the lines it needs (no string is
    /// made of the others: Swift's strings cost more here than the kernel's read).
    public static func decisionStatus(of id: pid_t) -> Status? {
        guard let bytes = readBytes("/proc/\(id)/status") else { return nil }
        var process: pid_t?, tracer: pid_t?, uid: uid_t?, gid: gid_t?, groups: [gid_t] = [], threads = 0
        bytes.withUnsafeBufferPointer { all in
            var start = 0
            while start < all.count {
                var end = start
                while end < all.count && all[end] != 0x0A { end += 1 }
                let line = UnsafeBufferPointer(rebasing: all[start..<end])
                if line.starts(with: tgid) {
                    process = numbers(line, from: tgid.count).first.map { pid_t($0) }
                } else if line.starts(with: tracerPid) {
                    tracer = numbers(line, from: tracerPid.count).first.map { pid_t($0) }
                } else if line.starts(with: uidField) {
                    uid = numbers(line, from: uidField.count).dropFirst().first  // effective
                } else if line.starts(with: gidField) {
                    gid = numbers(line, from: gidField.count).dropFirst().first
                } else if line.starts(with: groupsField) {
                    groups = numbers(line, from: groupsField.count)
                } else if line.starts(with: threadsField) {
                    threads = numbers(line, from: threadsField.count).first.map { Int($0) } ?? 0
                }
                start = end + 1
            }
        }
        guard let process, let tracer, let uid, let gid else { return nil }
        return Status(process: process, tracer: tracer, credentials: Credentials(uid: uid, gid: gid, groups: groups),
                      threads: threads)
    }

    private static let tgid = Array("Tgid:".utf8), tracerPid = Array("TracerPid:".utf8)
    private static let uidField = Array("Uid:".utf8), gidField = Array("Gid:".utf8), groupsField = Array("Groups:".utf8)
    private static let threadsField = Array("Threads:".utf8)

    /// The decimal numbers of a line from `offset`, separated by spaces or tabs.
    static func numbers(_ line: UnsafeBufferPointer<UInt8>, from offset: Int) -> [UInt32] {
        var out: [UInt32] = []
        var current: UInt32 = 0, inNumber = false
        for byte in line[offset...] {
            if byte >= 0x30 && byte <= 0x39 {
                current = current &* 10 &+ UInt32(byte - 0x30)
                inNumber = true
            } else {
                if inNumber { out.append(current) }
                current = 0
                inNumber = false
            }
        }
        if inNumber { out.append(current) }
        return out
    }

    /// The fields of `/proc/ID/stat` that matter here.
    ///
    /// Thread-safety: a value.
    public struct Stat: Sendable, Equatable {
        public var command: String
        public var parent: pid_t
        public var session: pid_t
        /// The controlling terminal's device number (0: none).
        public var terminal: UInt32
        /// Clock ticks after boot: with the pid, names the process for good.
        public var startTime: UInt64
    }

    public static func stat(of id: pid_t) -> Stat? {
        guard let bytes = readBytes("/proc/\(id)/stat"),
              let open = bytes.firstIndex(of: UInt8(ascii: "(")), let close = bytes.lastIndex(of: UInt8(ascii: ")")),
              open < close else { return nil }
        let command = String(decoding: bytes[(open + 1)..<close], as: UTF8.self)
        // After "PID (COMM) ": state(3) ppid(4) pgrp(5) session(6) tty_nr(7) … starttime(22).
        var fields: [Int64] = []
        fields.reserveCapacity(20)
        var current: Int64 = 0, negative = false
        for byte in bytes[(close + 2)...] {
            if byte == 0x20 || byte == 0x0A {
                fields.append(negative ? -current : current)
                (current, negative) = (0, false)
                if fields.count == 20 { break }
            } else if byte == 0x2D {
                negative = true
            } else if byte >= 0x30 && byte <= 0x39 {
                current = current &* 10 &+ Int64(byte - 0x30)
            }
        }
        guard fields.count == 20, let parent = pid_t(exactly: fields[1]), let session = pid_t(exactly: fields[3]) else { return nil }
        let terminal = fields[4], start = UInt64(clamping: fields[19])
        return Stat(command: command, parent: parent, session: session, terminal: UInt32(truncatingIfNeeded: terminal),
                    startTime: start)
    }

    /// The terminal device of a `tty_nr` as a path (`/dev/pts/N`, `/dev/ttyN`), nil for none.
    public static func terminalPath(_ number: UInt32) -> String? {
        guard number != 0 else { return nil }
        let major = (number >> 8) & 0xfff
        let minor = (number & 0xff) | ((number >> 12) & 0xfff00)
        let candidate: String
        switch major {
        case 136...143: candidate = "/dev/pts/\((major - 136) * 256 + minor)"
        case 4 where minor < 64: candidate = "/dev/tty\(minor)"
        default: return nil
        }
        guard let st = try? Syscall.stat(candidate), UInt32(truncatingIfNeeded: st.st_rdev) == number
                || (UInt32(truncatingIfNeeded: st.st_rdev >> 8) & 0xfff) == major else { return nil }
        return candidate
    }

    /// One mapping of executable code (`/proc/ID/maps`, permission `x`).
    ///
    /// Thread-safety: a value.
    public enum CodeMapping: Hashable, Sendable {
        /// A file, by the path the kernel shows and the device and inode it mapped.
        case file(String, device: UInt64, inode: UInt64)
        /// A file that was removed (or replaced) since it was mapped.
        case deletedFile(String)
        /// Code from a memfd (`/memfd:…`): a file that never had a name.
        case memfd(String)
        /// Anonymous code (a JIT) or the kernel's own (`[vdso]`).
        case anonymous
    }

    /// The distinct executable mappings of a process; nil when its maps cannot be read.
    /// Asked mapping by mapping where the kernel can (PROCMAP_QUERY, Linux 6.11: only the
    /// executable ones, and no text of the others made); else parsed from the text.
    public static func codeMappings(of id: pid_t) -> [CodeMapping]? {
        guard let fd = try? Syscall.open("/proc/\(id)/maps", O_RDONLY) else { return nil }
        defer { Syscall.close(fd) }
        if let asked = queriedCodeMappings(fd) { return asked }
        return parsedCodeMappings(fd)
    }

    /// Through PROCMAP_QUERY; nil when the kernel does not know it.
    static func queriedCodeMappings(_ fd: Int32) -> [CodeMapping]? {
        var seen = Set<CodeMapping>()
        var mappings: [CodeMapping] = []
        var address: UInt64 = 0
        let capacity = Int(PATH_MAX) + 64
        return withUnsafeTemporaryAllocation(of: CChar.self, capacity: capacity) { name -> [CodeMapping]? in
            while true {
                var length: UInt32 = 0, inode: UInt64 = 0, major: UInt32 = 0, minor: UInt32 = 0
                let found = mtmfs_next_code_mapping(fd, &address, name.baseAddress, UInt32(capacity), &length, &inode, &major, &minor)
                if found < 0 { return nil }
                if found == 0 { return mappings }
                let bytes = UnsafeRawBufferPointer(start: name.baseAddress, count: max(0, Int(length) - 1))
                let mapping = codeMapping(path: String(decoding: bytes, as: UTF8.self),
                                          device: deviceNumber(major: UInt64(major), minor: UInt64(minor)), inode: inode)
                if seen.insert(mapping).inserted { mappings.append(mapping) }
            }
        }
    }

    /// What a mapping's path (as /proc shows it) says it is.
    static func codeMapping(path: String, device: UInt64, inode: UInt64) -> CodeMapping {
        if path.hasPrefix("/memfd:") { return .memfd(path) }
        guard path.hasPrefix("/") else { return .anonymous }
        if path.hasSuffix(" (deleted)") { return .deletedFile(String(path.dropLast(" (deleted)".count))) }
        return .file(path, device: device, inode: inode)
    }

    /// From the text of /proc/ID/maps.
    static func parsedCodeMappings(_ fd: Int32) -> [CodeMapping]? {
        guard let bytes = readBytes(fd) else { return nil }
        var seen = Set<CodeMapping>()
        var mappings: [CodeMapping] = []
        bytes.withUnsafeBufferPointer { all in
            var start = 0
            while start < all.count {
                var end = start
                while end < all.count && all[end] != 0x0A { end += 1 }
                defer { start = end + 1 }
                // address perms offset dev inode [path]: perms after the first space.
                var field = start
                while field < end && all[field] != 0x20 { field += 1 }
                guard field + 3 < end, all[field + 3] == UInt8(ascii: "x") else { continue }
                // Skip to the inode (fourth field after the address), then the path.
                var position = field + 1
                var inode: UInt64 = 0, major: UInt64 = 0, minor: UInt64 = 0, afterColon = false
                for index in 0..<4 {
                    while position < end && all[position] != 0x20 {
                        let byte = all[position]
                        if index == 2 {  // the device, "major:minor" in hexadecimal
                            if byte == UInt8(ascii: ":") {
                                afterColon = true
                            } else if let digit = hexDigit(byte) {
                                if afterColon { minor = minor << 4 | digit } else { major = major << 4 | digit }
                            }
                        } else if index == 3, byte >= 0x30 && byte <= 0x39 {
                            inode = inode &* 10 &+ UInt64(byte - 0x30)
                        }
                        position += 1
                    }
                    while position < end && all[position] == 0x20 { position += 1 }
                }
                let path = String(decoding: UnsafeBufferPointer(rebasing: all[position..<end]), as: UTF8.self)
                let mapping = codeMapping(path: path, device: deviceNumber(major: major, minor: minor), inode: inode)
                if seen.insert(mapping).inserted { mappings.append(mapping) }
            }
        }
        return mappings
    }

    static func hexDigit(_ byte: UInt8) -> UInt64? { ASCIIHex.value(byte).map { UInt64($0) } }

    /// `major(3)` of a device number as glibc encodes it: 0 for devices without a block
    /// device (tmpfs, overlay, FUSE).
    public static func majorNumber(_ device: UInt64) -> UInt64 { (device >> 8) & 0xfff | (device >> 32) & 0xfffff000 }

    /// `makedev(3)` as glibc encodes it (what `st_dev` holds).
    public static func deviceNumber(major: UInt64, minor: UInt64) -> UInt64 {
        (major & 0xfffff000) << 32 | (major & 0xfff) << 8 | (minor & 0xffffff00) << 12 | (minor & 0xff)
    }

    /// The threads of a process (`/proc/PID/task`).
    public static func threads(of process: pid_t) -> [pid_t] {
        ((try? Syscall.listDirectory("/proc/\(process)/task")) ?? []).compactMap { pid_t($0) }
    }

    /// `statfs(2)`'s file system type of the file at `path` (nil when it cannot be asked).
    public static func fileSystemType(_ path: String) -> Int64? {
        let type = mtmfs_statfs_type(path)
        return type < 0 ? nil : Int64(type)
    }

    /// FUSE's `statfs` magic: a file system whose owner chooses each byte a reader gets.
    public static let fuseMagic: Int64 = 0x6573_5546

    /// The user and groups a process acts as (effective ids, supplementary groups).
    ///
    /// Thread-safety: a value.
    public struct Credentials: Sendable, Equatable {
        public var uid: uid_t
        public var gid: gid_t
        public var groups: [gid_t]

        public init(uid: uid_t, gid: gid_t, groups: [gid_t]) {
            self.uid = uid
            self.gid = gid
            self.groups = groups
        }

        /// Whether an access control list could let a user other than the owner write the
        /// file `st` describes. With an ACL, the group bits of the mode are its mask, which
        /// bounds every named user and group entry: without the group write bit, none can.
        public static func aclMayGrantWrite(_ st: stat) -> Bool { st.st_mode & S_IWGRP != 0 }

        /// Whether these credentials may write the file `st` describes, now or after a
        /// `chmod`: root may write every file, an owner may give itself the right.
        public func mayWrite(_ st: stat) -> Bool {
            if uid == 0 { return true }
            if st.st_uid == uid { return true }
            if st.st_gid == gid || groups.contains(st.st_gid) { return st.st_mode & S_IWGRP != 0 }
            return st.st_mode & S_IWOTH != 0
        }
    }

    /// The target of `/proc/ID/exe` (the program's path; " (deleted)" when replaced).
    public static func executablePath(of id: pid_t) -> String? {
        var buffer = [CChar](repeating: 0, count: Int(PATH_MAX) + 1)
        let n = readlink("/proc/\(id)/exe", &buffer, buffer.count - 1)
        guard n > 0 else { return nil }
        return String(decoding: buffer[0..<n].map { UInt8(bitPattern: $0) }, as: UTF8.self)
    }

    /// A descriptor that pins process `pid` (a thread-group leader): it cannot be replaced
    /// by another process of the same number while the descriptor is open.
    public static func pin(_ pid: pid_t) throws(Errno) -> Int32 {
        let fd = mtmfs_pidfd_open(pid)
        guard fd >= 0 else { throw Errno(errno) }
        return fd
    }

    /// The parent of the process a pidfd names (PIDFD_GET_INFO, Linux 6.13); nil when the
    /// kernel cannot say.
    public static func parent(pinned fd: Int32) -> pid_t? {
        let parent = mtmfs_pidfd_parent(fd)
        return parent < 0 ? nil : pid_t(parent)
    }

    /// Whether the process a pidfd names still runs (its descriptor turns readable at exit).
    public static func isRunning(pinned fd: Int32) -> Bool {
        var poller = pollfd(fd: fd, events: Int16(POLLIN), revents: 0)
        return poll(&poller, 1, 0) == 0
    }

    /// A whole file of /proc; nil when it cannot be read. (Through a buffer on the stack:
    /// these are read on every guarded open.)
    ///
    /// `oneRecord`: the file is made whole at its first read (`status`, `stat`: one record
    /// of a seq_file), so a read shorter than the buffer had all of it and no read for the
    /// end follows. Not so for `maps`, whose next line may just not have fitted.
    static func readBytes(_ path: String) -> [UInt8]? {
        guard let fd = try? Syscall.open(path, O_RDONLY) else { return nil }
        defer { Syscall.close(fd) }
        return readBytes(fd, oneRecord: true)
    }

    static func readBytes(_ fd: Int32, oneRecord: Bool = false) -> [UInt8]? {
        var result: [UInt8] = []
        return withUnsafeTemporaryAllocation(of: UInt8.self, capacity: 16_384) { buffer -> [UInt8]? in
            while true {
                let n = Glibc.read(fd, buffer.baseAddress, buffer.count)
                if n < 0 {
                    if errno == EINTR { continue }
                    return nil
                }
                if n == 0 { return result }
                result.append(contentsOf: UnsafeBufferPointer(rebasing: buffer[0..<n]))
                if oneRecord && n < buffer.count { return result }
            }
        }
    }
}
