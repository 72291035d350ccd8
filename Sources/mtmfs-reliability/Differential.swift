#if canImport(Glibc)
import Glibc
#endif
import CPosixShims
import Foundation
import Posix
import TestSupport

/// Seeded random sequences of file operations run on a file in `cache/` and on one in the
/// host file system side by side, as an outside exerciser (fsx) does: pwrite of 1 B to
/// 300 KB anywhere in the first MiB (also whole 64 KiB chunks), fsync, fdatasync,
/// ftruncate, writes through a shared mapping, close and reopen, fallocate (allocate, keep
/// size, punch hole, zero range), copy_file_range from another file, and reads at random
/// places. Every call must answer as the host's does (the same result, the same size after
/// it); after every fsync the whole file is compared byte for byte with the kernel's pages
/// dropped first (so the bytes come from the daemon), and once more after a remount.
/// A failure names the seed and the operation, so that `--seed` repeats the run.
final class Differential {
    let seeds: [UInt64]
    let operations: Int
    let scratch = Scratch("reliability-differential")
    let tally = Tally("differential (random file operations on cache/ and the host, compared byte for byte)")

    static let span = 1 << 20
    static let chunk = 65_536

    init(seeds: Int, operations: Int, seed: UInt64) {
        var random = SplitMix(seed: seed)
        self.seeds = (0..<seeds).map { _ in random.next() % 1_000_000_000 }
        self.operations = operations
    }

    func run() -> Tally {
        let store: Store
        do {
            store = try Store(in: scratch)
            try store.mount()
        } catch {
            tally.record("set-up", ["\(error)"])
            scratch.remove()
            return tally
        }
        defer { store.unmount(); scratch.remove() }
        let host = scratch.sub("host")
        mkdir(host, 0o755)
        mkdir(store.path("cache/differential"), 0o755)
        var finished: [(seed: UInt64, mounted: String, native: String)] = []
        for seed in seeds {
            let mounted = store.path("cache/differential/s\(seed)"), native = host + "/s\(seed)"
            var problems: [String] = []
            do {
                var trial = Trial(seed: seed, operations: operations, mounted: mounted, native: native)
                try trial.run()
                finished.append((seed, mounted, native))
            } catch {
                problems.append("seed \(seed): \(error)")
            }
            tally.record("seed \(seed)", problems)
            if access(store.path("cache"), F_OK) != 0 {
                tally.record("mount", ["the mount answers \(errnoName(errno)) after seed \(seed): the daemon is gone"])
                return tally
            }
        }
        // What the daemon stored, read by a new one.
        store.unmount()
        do {
            try store.mount()
            var problems: [String] = []
            for file in finished {
                let (ours, theirs) = (readFile(file.mounted), readFile(file.native))
                if ours.bytes != theirs.bytes {
                    problems.append("seed \(file.seed): after a remount \(Trial.difference(ours.bytes ?? [], theirs.bytes ?? []))")
                }
            }
            tally.record("remount", problems)
        } catch {
            tally.record("remount", ["\(error)"])
        }
        return tally
    }

    struct Mismatch: Error, CustomStringConvertible {
        let description: String
    }

    /// One seed's sequence on the two files.
    struct Trial {
        var random: SplitMix
        let operations: Int
        let mounted: String, native: String
        var fds: (ours: Int32, theirs: Int32) = (-1, -1)
        var history: [String] = []

        init(seed: UInt64, operations: Int, mounted: String, native: String) {
            random = SplitMix(seed: seed)
            self.operations = operations
            self.mounted = mounted
            self.native = native
        }

        mutating func number(_ bound: Int) -> Int { Int(random.next() % UInt64(max(1, bound))) }

        mutating func bytes(_ count: Int) -> [UInt8] {
            var bytes = [UInt8](repeating: 0, count: count)
            var i = 0
            while i < count {
                var word = random.next()
                for _ in 0..<8 where i < count {
                    bytes[i] = UInt8(truncatingIfNeeded: word)
                    word >>= 8
                    i += 1
                }
            }
            return bytes
        }

        /// A length as programs write: a byte or a few, a page, pages, whole chunks, large.
        mutating func length() -> Int {
            switch number(10) {
            case 0...2: return 1 + number(512)
            case 3: return 4096
            case 4: return 4096 * (1 + number(16))
            case 5: return Differential.chunk * (1 + number(4))
            default: return 1 + number(300_000)
            }
        }

        /// An offset in the first MiB: anywhere, on a page, or on a chunk.
        mutating func offset() -> Int {
            switch number(4) {
            case 0: return number(Differential.span / 4096) * 4096
            case 1: return number(Differential.span / Differential.chunk) * Differential.chunk
            default: return number(Differential.span)
            }
        }

        mutating func open() throws {
            fds.ours = Glibc.open(mounted, O_RDWR | O_CREAT | O_CLOEXEC, 0o644)
            fds.theirs = Glibc.open(native, O_RDWR | O_CREAT | O_CLOEXEC, 0o644)
            guard fds.ours >= 0, fds.theirs >= 0 else {
                throw Mismatch(description: "open: cache/ \(fds.ours < 0 ? errnoName(errno) : "ok"), host \(fds.theirs < 0 ? "failed" : "ok")")
            }
        }

        mutating func close() {
            Glibc.close(fds.ours)
            Glibc.close(fds.theirs)
            fds = (-1, -1)
        }

        /// A call on both files: its result (or -errno) must be the same.
        /// What was done, the last 12 kept for a failure's message.
        mutating func note(_ what: String) {
            history.append(what)
            if history.count > 12 { history.removeFirst() }
        }

        mutating func both(_ what: String, _ call: (Int32) -> Int) throws {
            note(what)
            let ours = call(fds.ours), ourErrno = errno
            let theirs = call(fds.theirs), theirErrno = errno
            let (a, b) = (ours < 0 ? -Int(ourErrno) : ours, theirs < 0 ? -Int(theirErrno) : theirs)
            guard a == b else { throw failure("\(what): cache/ gave \(Self.result(a)), the host \(Self.result(b))") }
            let (x, y) = (Self.size(fds.ours), Self.size(fds.theirs))
            guard x == y else { throw failure("after \(what): cache/ says size \(x), the host \(y)") }
        }

        static func result(_ value: Int) -> String { value < 0 ? errnoName(Int32(-value)) : "\(value)" }

        static func size(_ fd: Int32) -> Int {
            var st = stat()
            return fstat(fd, &st) == 0 ? Int(st.st_size) : -1
        }

        func failure(_ what: String) -> Mismatch {
            Mismatch(description: "\(what) (the last operations: \(history.joined(separator: ", ")))")
        }

        static func difference(_ ours: [UInt8], _ theirs: [UInt8]) -> String {
            guard ours.count == theirs.count else { return "cache/ holds \(ours.count) bytes, the host \(theirs.count)" }
            guard let at = ours.indices.first(where: { ours[$0] != theirs[$0] }) else { return "no difference" }
            return "byte \(at) is \(ours[at]) in cache/, \(theirs[at]) on the host"
        }

        /// The whole files compared, the kernel's pages of ours dropped first.
        func compareWhole(_ when: String) throws {
            _ = posix_fadvise(fds.ours, 0, 0, POSIX_FADV_DONTNEED)
            let size = Self.size(fds.theirs)
            let ours = Self.pread(fds.ours, 0, size + 1), theirs = Self.pread(fds.theirs, 0, size + 1)
            if ours != theirs { throw failure("\(when): \(Self.difference(ours, theirs))") }
        }

        static func pread(_ fd: Int32, _ offset: Int, _ count: Int) -> [UInt8] {
            var bytes = [UInt8](repeating: 0, count: count)
            var done = 0
            while done < count {
                let n = bytes.withUnsafeMutableBytes { Glibc.pread(fd, $0.baseAddress.map { $0 + done }, count - done, off_t(offset + done)) }
                if n < 0 && errno == EINTR { continue }
                if n <= 0 { break }
                done += n
            }
            return Array(bytes[0..<done])
        }

        mutating func run() throws {
            // The file copy_file_range copies from: the same bytes in both trees.
            let source = bytes(Differential.span)
            let sources = (mounted + ".source", native + ".source")
            guard writeFile(sources.0, source) == 0, writeFile(sources.1, source) == 0 else {
                throw Mismatch(description: "the source file could not be written")
            }
            let sourceFDs = (Glibc.open(sources.0, O_RDONLY | O_CLOEXEC), Glibc.open(sources.1, O_RDONLY | O_CLOEXEC))
            defer { Glibc.close(sourceFDs.0); Glibc.close(sourceFDs.1) }
            _ = Glibc.unlink(native)
            _ = Glibc.unlink(mounted)
            try open()
            defer { close() }
            for index in 0..<operations {
                let label = "#\(index)"
                switch number(100) {
                case 0..<34:
                    let (at, data) = (offset(), bytes(length()))
                    try both("\(label) pwrite \(data.count) at \(at)") { fd in
                        data.withUnsafeBytes { Glibc.pwrite(fd, $0.baseAddress, $0.count, off_t(at)) }
                    }
                case 34..<42:
                    try both("\(label) fsync") { Int(fsync($0)) }
                    try compareWhole("after \(label) fsync")
                case 42..<48:
                    try both("\(label) fdatasync") { Int(fdatasync($0)) }
                    try compareWhole("after \(label) fdatasync")
                case 48..<53:
                    let size = number(Differential.span + Differential.span / 4)
                    try both("\(label) ftruncate \(size)") { Int(ftruncate($0, off_t(size))) }
                case 53..<58:
                    try mappedWrite(label)
                case 58..<61:
                    note("\(label) close and reopen")
                    close()
                    try open()
                case 61..<68:
                    let modes: [Int32] = [0, 1, 3, 0x10, 0x11]
                    let mode = modes[number(modes.count)]
                    let (at, count) = (offset(), 1 + number(300_000))
                    try both("\(label) fallocate mode \(mode) \(count) at \(at)") { Int(mtmfs_fallocate($0, mode, Int64(at), Int64(count))) }
                case 68..<75:
                    let (from, to, count) = (number(Differential.span), offset(), 1 + number(300_000))
                    let ourFD = fds.ours
                    try both("\(label) copy_file_range \(count) from \(from) to \(to)") { fd in
                        let input = fd == ourFD ? sourceFDs.0 : sourceFDs.1
                        var (inOffset, outOffset) = (Int64(from), Int64(to))
                        var copied = 0
                        while copied < count {
                            let n = mtmfs_copy_file_range(input, &inOffset, fd, &outOffset, count - copied)
                            if n < 0 { return copied > 0 ? copied : -1 }
                            if n == 0 { break }
                            copied += n
                        }
                        return copied
                    }
                default:
                    let (at, count) = (number(Differential.span + Differential.span / 4), 1 + number(200_000))
                    note("\(label) read \(count) at \(at)")
                    let ours = Self.pread(fds.ours, at, count), theirs = Self.pread(fds.theirs, at, count)
                    if ours != theirs { throw failure("\(label) read \(count) at \(at): \(Self.difference(ours, theirs))") }
                }
            }
            try both("fsync at the end") { Int(fsync($0)) }
            try compareWhole("at the end")
        }

        /// Bytes written through a shared mapping of both files, inside their size, then
        /// unmapped (with msync half the time).
        mutating func mappedWrite(_ label: String) throws {
            let size = Self.size(fds.theirs)
            guard size > 0 else { return }
            let at = number(size), data = bytes(min(size - at, 1 + number(100_000)))
            let page = Int(sysconf(Int32(_SC_PAGESIZE)))
            let start = at / page * page, length = at + data.count - start
            let sync = number(2) == 0
            note("\(label) mapped write \(data.count) at \(at)\(sync ? " + msync" : "")")
            for fd in [fds.ours, fds.theirs] {
                guard let map = mmap(nil, length, PROT_READ | PROT_WRITE, MAP_SHARED, fd, off_t(start)), map != MAP_FAILED else {
                    throw failure("\(label) mmap: \(errnoName(errno))")
                }
                data.withUnsafeBytes { UnsafeMutableRawBufferPointer(start: map.advanced(by: at - start), count: $0.count).copyMemory(from: $0) }
                if sync && msync(map, length, MS_SYNC) != 0 { throw failure("\(label) msync: \(errnoName(errno))") }
                munmap(map, length)
            }
        }
    }
}
