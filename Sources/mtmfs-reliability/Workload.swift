#if canImport(Glibc)
import Glibc
#endif
import CPosixShims
import Foundation
import Posix
import TestSupport

/// The mixed workload of the crash driver: one worker process per store, each writing
/// numbered values and logging `A` (attempt) before and `K` (acknowledged) after every
/// change, so that after a crash the suite knows which value each file may hold.
///
/// Log lines (one `write` each, O_APPEND):
///   `A value PATH N` / `K value PATH N`  — PATH (relative to the mount) set to "vN"
///   `A mkdir PATH` / `K mkdir PATH`      — an account directory made
///   `A file PATH N SIZE [FROM TO]` / `K …` — a cache file written (by write, after a
///                                        fallocate, or by copy_file_range) and fsynced;
///                                        with FROM TO, a hole punched there before the fsync
///   `A node PATH` / `K node PATH`        — a FIFO made and its directory fsynced
enum Workload {
    static let settingsKeys = ["CrashString1", "CrashString2", "CrashString3"]
    static let accountFields = ["username", "password", "comment", "label"]
    static let account = "0d5c7a1e-3b2f-4c6d-8e9f-a0b1c2d3e4f5"

    /// The bytes of cache file N of SIZE bytes (so the check needs only the log line).
    static func cacheContent(_ n: Int, size: Int) -> [UInt8] {
        var state = UInt64(truncatingIfNeeded: n) &* 0x9E37_79B9_7F4A_7C15 | 1
        return (0..<size).map { _ in
            state ^= state << 13; state ^= state >> 7; state ^= state << 17
            return UInt8(truncatingIfNeeded: state)
        }
    }

    /// A save strategy of SPEC §4 (and the ones an account field sees): a program that sets
    /// FILE to VALUE plus a newline.
    struct Strategy: Sendable {
        let name: String
        let run: @Sendable (_ file: String, _ value: String, _ scratch: String) -> Bool
    }

    static func sh(_ line: String) -> Bool { Run.shell(line, timeout: 30).status == 0 }
    static func quoted(_ text: String) -> String { "'" + text.replacingOccurrences(of: "'", with: "'\\''") + "'" }

    /// vim in Ex mode, without a vimrc: its default save renames the file to a backup.
    static func vim(_ options: String = "", named name: String = "vim") -> Strategy {
        Strategy(name: name) { file, value, _ in
            sh("vim -N -u NONE -i NONE -es \(options) -c '%s/.*/\(value)/' -c 'wq' \(quoted(file)) </dev/null")
        }
    }

    /// A tool that brings in a file made on another file system (`mv` and `install` unlink
    /// the key and create it again, `cp` truncates it).
    static func fromAnotherFileSystem(_ tool: String, named name: String? = nil) -> Strategy {
        Strategy(name: name ?? tool) { file, value, scratch in
            sh("echo \(value) > \(scratch)/outside.tmp && \(tool) \(scratch)/outside.tmp \(quoted(file))")
        }
    }

    static let strategies: [Strategy] = [
        Strategy(name: "write") { file, value, _ in writeFile(file, Array((value + "\n").utf8)) == 0 },
        Strategy(name: ">") { file, value, _ in sh("echo \(value) > \(quoted(file))") },
        Strategy(name: "sed -i") { file, value, _ in sh("sed -i 's/.*/\(value)/' \(quoted(file))") },
        Strategy(name: "perl -pi") { file, value, _ in sh("perl -pi -e 's/.*/\(value)/' \(quoted(file))") },
        vim(),
        vim("-c 'set backupcopy=yes'", named: "vim backupcopy=yes"),
        Strategy(name: "ed") { file, value, _ in sh("printf '1c\\n\(value)\\n.\\nw\\nq\\n' | ed -s \(quoted(file))") },
        Strategy(name: "tee") { file, value, _ in sh("echo \(value) | tee \(quoted(file)) >/dev/null") },
        fromAnotherFileSystem("cp"),
        fromAnotherFileSystem("mv"),
        fromAnotherFileSystem("install -m 600", named: "install"),
        Strategy(name: "python") { file, value, _ in
            Run.program("python3", ["-c", "import sys; open(sys.argv[1], 'w').write(sys.argv[2] + '\\n')", file, value],
                        timeout: 30).status == 0
        },
        Strategy(name: "emacs") { file, value, _ in
            sh("emacs --batch \(quoted(file)) --eval '(progn (erase-buffer) (insert \"\(value)\\n\") (save-buffer))' 2>/dev/null")
        },
    ]

    /// Runs one worker until the mount goes away (or it is killed).
    static func work(store: String, mountPoint: String, log: String, seed: UInt64, scratch: String) -> Int32 {
        var random = SplitMix(seed: seed)
        let logFD = open(log, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0o600)
        guard logFD >= 0 else { return 2 }
        func note(_ line: String) {
            let bytes = Array((line + "\n").utf8)
            _ = bytes.withUnsafeBytes { write(logFD, $0.baseAddress, $0.count) }
        }
        // A tool's exit status alone is no acknowledgement (`perl -pi` exits 0 when it cannot
        // open the file): the value must also read back through the mount.
        func acknowledged(_ succeeded: Bool, _ path: String, _ n: Int) -> Bool {
            succeeded && readText(mountPoint + "/" + path) == "v\(n)\n"
        }
        var failures = 0
        var counter = Int(seed % 1_000_000) * 1_000
        var lastFile: (path: String, n: Int, size: Int)?
        while failures < 20 {
            counter += 1
            var ok = false
            switch store {
            case "settings":
                let key = "settings/" + settingsKeys[Int(random.next() % UInt64(settingsKeys.count))]
                let strategy = strategies[Int(random.next() % UInt64(strategies.count))]
                note("A value \(key) \(counter)")
                ok = acknowledged(strategy.run(mountPoint + "/" + key, "v\(counter)", scratch), key, counter)
                if ok { note("K value \(key) \(counter)") }
            case "accounts":
                if random.next() % 25 == 0 {
                    let uuid = UUID().uuidString.lowercased()
                    note("A mkdir accounts/\(uuid)")
                    ok = mkdir(mountPoint + "/accounts/" + uuid, 0o700) == 0
                    if ok { note("K mkdir accounts/\(uuid)") }
                } else {
                    let field = "accounts/\(account)/" + accountFields[Int(random.next() % UInt64(accountFields.count))]
                    // Editors that fields support: the plain ones and vim/sed (SPEC §2).
                    let strategy = strategies[Int(random.next() % 5)]
                    note("A value \(field) \(counter)")
                    ok = acknowledged(strategy.run(mountPoint + "/" + field, "v\(counter)", scratch), field, counter)
                    if ok { note("K value \(field) \(counter)") }
                }
            default:
                let size = [0, 1, 4_095, 65_536, 65_537, 200_000][Int(random.next() % 6)]
                let path = "cache/crash/f\(counter)", file = mountPoint + "/" + path
                switch random.next() % 5 {
                case 0:
                    note("A node \(path)")
                    ok = mkfifo(file, 0o600) == 0 && syncDirectory(mountPoint + "/cache/crash") == 0
                    if ok { note("K node \(path)") }
                case 1 where lastFile != nil:
                    let (source, n, size) = lastFile!
                    note("A file \(path) \(n) \(size)")
                    ok = copyFile(mountPoint + "/" + source, to: file) == 0
                    if ok { note("K file \(path) \(n) \(size)") }
                case 2 where size > 3:
                    let (from, to) = (size / 3, 2 * size / 3)
                    note("A file \(path) \(counter) \(size) \(from) \(to)")
                    ok = writeFile(file, cacheContent(counter, size: size), sync: false) == 0
                        && punchHole(file, from: from, to: to) == 0
                    if ok { note("K file \(path) \(counter) \(size) \(from) \(to)") }
                default:
                    // Whole in one write, after a fallocate, in 4 KiB pieces in random order
                    // (buffered by the daemon until the fsync), appended a WAL frame at a
                    // time with an fsync after each (into the room of the last chunk), or as
                    // a database inside writes before a checkpoint (small writes each
                    // fsynced, then whole chunks).
                    let how = random.next() % 5
                    let size = how == 4 ? 200_000 : size
                    note("A file \(path) \(counter) \(size)")
                    let content = cacheContent(counter, size: size)
                    ok = (how != 1 || size == 0 || preallocateFile(file, size: size) == 0)
                        && (how == 2 ? writeInPieces(file, content, seed: random.next())
                            : how == 3 ? appendWithSyncs(file, content)
                            : how == 4 ? writeLikeADatabase(file, content)
                                       : writeFile(file, content, sync: true)) == 0
                    if ok {
                        note("K file \(path) \(counter) \(size)")
                        lastFile = (path, counter, size)
                    }
                }
            }
            failures = ok ? 0 : failures + 1
        }
        close(logFD)
        return 0
    }
}

/// The bytes of cache file N of SIZE bytes with a hole punched from FROM to TO.
func punchedContent(_ n: Int, size: Int, from: Int, to: Int) -> [UInt8] {
    var bytes = Workload.cacheContent(n, size: size)
    for i in from..<to { bytes[i] = 0 }
    return bytes
}

/// Writes `bytes` in 4 KiB pieces in a shuffled order with pwrite, then fsyncs.
func writeInPieces(_ path: String, _ bytes: [UInt8], seed: UInt64) -> Int32 {
    let fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0o600)
    guard fd >= 0 else { return errno }
    defer { close(fd) }
    var generator = SplitMix(seed: seed)
    for offset in stride(from: 0, to: bytes.count, by: 4096).shuffled(using: &generator) {
        let count = min(4096, bytes.count - offset)
        let written = bytes.withUnsafeBytes { pwrite(fd, $0.baseAddress! + offset, count, off_t(offset)) }
        if written != count { return written < 0 ? errno : EIO }
    }
    return fsync(fd) == 0 ? 0 : errno
}

/// A file written as a database's write-ahead log grows: appends of 4,120 bytes (a frame
/// header and a page), each followed by an fsync.
func appendWithSyncs(_ path: String, _ bytes: [UInt8]) -> Int32 {
    let fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_APPEND | O_CLOEXEC, 0o600)
    guard fd >= 0 else { return errno }
    defer { close(fd) }
    for offset in stride(from: 0, to: bytes.count, by: 4120) {
        let count = min(4120, bytes.count - offset)
        let written = bytes.withUnsafeBytes { write(fd, $0.baseAddress! + offset, count) }
        if written != count { return written < 0 ? errno : EIO }
        if fsync(fd) != 0 { return errno }
    }
    return fsync(fd) == 0 ? 0 : errno
}

/// The pattern that once killed the daemon (an outside exerciser's, and a database inside
/// before a checkpoint): 100-byte writes each followed by an fsync (fsync's short way), one
/// more small write, the whole 64 KiB chunks of the file in one write, then the rest in
/// 4 KiB pieces and an fsync. Files shorter than two chunks are written whole.
func writeLikeADatabase(_ path: String, _ bytes: [UInt8]) -> Int32 {
    let chunk = 65_536
    guard bytes.count >= 3 * chunk else { return writeFile(path, bytes, sync: true) }
    let fd = open(path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0o600)
    guard fd >= 0 else { return errno }
    defer { close(fd) }
    func put(_ range: Range<Int>) -> Int32 {
        let written = bytes.withUnsafeBytes { pwrite(fd, $0.baseAddress.map { $0 + range.lowerBound }, range.count, off_t(range.lowerBound)) }
        return written == range.count ? 0 : written < 0 ? errno : EIO
    }
    var done: [Range<Int>] = []
    for i in 0..<4 {
        let range = (300 * i)..<(300 * i + 100)
        if put(range) != 0 { return errno }
        if fsync(fd) != 0 { return errno }
        done.append(range)
    }
    let wholeChunks = chunk..<(bytes.count / chunk * chunk)
    for range in [5000..<5100, wholeChunks] {
        if put(range) != 0 { return errno }
        done.append(range)
    }
    for offset in stride(from: 0, to: bytes.count, by: 4096) {
        let page = offset..<min(offset + 4096, bytes.count)
        if done.contains(where: { $0.lowerBound <= page.lowerBound && $0.upperBound >= page.upperBound }) { continue }
        if put(page) != 0 { return errno }
    }
    return fsync(fd) == 0 ? 0 : errno
}

/// fsync of a directory: makes the names in it durable.
func syncDirectory(_ path: String) -> Int32 {
    let fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC)
    guard fd >= 0 else { return errno }
    defer { close(fd) }
    return fsync(fd) == 0 ? 0 : errno
}

/// fallocate(2) mode 0 of a new file's whole size.
func preallocateFile(_ path: String, size: Int) -> Int32 {
    let fd = open(path, O_WRONLY | O_CREAT | O_CLOEXEC, 0o600)
    guard fd >= 0 else { return errno }
    defer { close(fd) }
    return mtmfs_fallocate(fd, 0, 0, Int64(size)) == 0 ? 0 : errno
}

/// Punches a hole (FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE) and fsyncs.
func punchHole(_ path: String, from: Int, to: Int) -> Int32 {
    let fd = open(path, O_WRONLY | O_CLOEXEC)
    guard fd >= 0 else { return errno }
    defer { close(fd) }
    guard mtmfs_fallocate(fd, 3, Int64(from), Int64(to - from)) == 0 else { return errno }
    return fsync(fd) == 0 ? 0 : errno
}

/// Copies a whole file with copy_file_range(2) and fsyncs the copy.
func copyFile(_ source: String, to destination: String) -> Int32 {
    let input = open(source, O_RDONLY | O_CLOEXEC)
    guard input >= 0 else { return errno }
    defer { close(input) }
    let output = open(destination, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0o600)
    guard output >= 0 else { return errno }
    defer { close(output) }
    while true {
        let copied = mtmfs_copy_file_range(input, nil, output, nil, 1 << 20)
        if copied < 0 { return errno }
        if copied == 0 { break }
    }
    return fsync(output) == 0 ? 0 : errno
}
