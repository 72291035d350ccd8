#if canImport(Glibc)
import Glibc
#endif
import CSQLite
import Foundation
import Posix

/// The workloads of cache/ as a storage engine (issue "cache/ as a storage engine"): the
/// write sizes and habits of real programs, the write-ahead log under a big write, a big
/// delete while other requests go on, and mounting with data stored. Run on every system.
extension Bench {
    var engineSmallWrites: Int { options.quick ? 2048 : 16384 }      // 4 KiB each: 8 or 64 MiB
    var engineRandomWrites: Int { options.quick ? 512 : 4096 }
    var engineBigBytes: Int { options.quick ? 64 << 20 : 1 << 30 }
    var engineBigLabel: String { options.quick ? "64 MiB" : "1 GiB" }

    func engineRound(_ round: Int, rotate: ([(String, String)]) -> [(String, String)]) throws {
        for (system, directory) in rotate(paths("cache", withFloor: true)) {
            record("W10 4 KiB sequential writes (µs per write)", system,
                   try sequentialSmallWrites(directory + "/seq\(round)") * 1e6)
        }
        for (system, directory) in rotate(paths("cache")) {
            record("W11 random 4 KiB writes into 64 MiB, then fsync (µs per write)", system,
                   try randomWritesThenFsync(directory + "/random\(round)") * 1e6)
        }
        if Spawn.exists("postmark") {
            for (system, directory) in rotate(paths("cache")) {
                try postmark(system, directory + "/postmark-big\(round)", sizes: (512, 65536), subdirectories: 10,
                             workload: "W12 postmark, 512 B–64 KiB in 10 subdirectories")
            }
        }
        // The rows of the issue "cache/: writes that store what they cover", as programs do them.
        for (system, directory) in rotate(paths("cache")) {
            record("W21 \(engineSparseWrites) random 4 KiB pwrites into a new 32 MiB sparse file, then fsync (µs per write)", system,
                   try sparseRandomWrites(directory + "/sparse\(round)") * 1e6)
        }
        for (system, directory) in rotate(paths("cache")) {
            record("W22 SQLite inside (WAL, synchronous=FULL), one 700-byte row a transaction (µs)", system,
                   try sqliteInside(directory + "/inner\(round).sqlite") * 1e6)
        }
        if Spawn.exists("postmark") {
            for (system, directory) in rotate(paths("cache")) {
                try postmark(system, directory + "/postmark-app\(round)", sizes: (512, 65536), subdirectories: 10,
                             workload: "W23 postmark, 512 B–64 KiB in 10 subdirectories",
                             counts: options.quick ? (200, 500) : (2_000, 8_000))
            }
        }
        // (With the floor: what FUSE itself allows a daemon that writes to memory.)
        for (system, directory) in rotate(paths("cache", withFloor: true)) {
            let path = directory + "/big\(round)"
            let (rate, log) = try bigWriteWithLog(path, watching: system == "mtmfs" ? dataDirectory + "/cache.sqlite-wal" : nil)
            record("W13 \(engineBigLabel) write + fsync (MB/s)", system, rate)
            if system == "mtmfs" { record("W13 largest write-ahead log during it (MiB)", system, log) }
            if let seconds = try remountTime(system) {
                record("W15 mount with \(engineBigLabel) stored, caches dropped (s)", system, seconds)
            }
            let (took, longest, back) = try deleteWhileProbing(path, directory: system == "mtmfs" ? mountPoint + "/cache" : directory,
                                                               dataDirectory: system == "mtmfs" ? dataDirectory : nil)
            record("W14 rm of the \(engineBigLabel) file (ms)", system, took * 1000)
            record("W14 longest wait of a stat/create loop during the rm (ms)", system, longest * 1000)
            if let back { record("W14 space back on the host file system after (s)", system, back) }
        }
    }

    var engineSparseWrites: Int { options.quick ? 256 : 1_000 }
    var engineInnerTransactions: Int { options.quick ? 50 : 500 }

    /// Seconds per random 4 KiB pwrite into a new sparse 32 MiB file (never written
    /// before: every write lands in a hole), the final fsync included.
    func sparseRandomWrites(_ path: String) throws -> Double {
        let fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0o644)
        guard fd >= 0 else { throw BenchError("create \(path): \(Errno.current)") }
        defer { close(fd); unlink(path) }
        guard ftruncate(fd, 32 << 20) == 0 else { throw BenchError("ftruncate \(path): \(Errno.current)") }
        var generator = SystemRandomNumberGenerator()
        let block = (0..<4096).map { _ in UInt8.random(in: 0...255, using: &generator) }
        let count = engineSparseWrites
        let offsets = (0..<count).map { _ in off_t(Int.random(in: 0..<8192, using: &generator) * 4096) }
        let total = seconds {
            for offset in offsets { _ = pwrite(fd, block, block.count, offset) }
            fsync(fd)
        }
        return total / Double(count)
    }

    /// Seconds per transaction of a SQLite database living in the directory, as an app's
    /// cache holds one: WAL, synchronous=FULL, one 700-byte row per transaction.
    func sqliteInside(_ path: String) throws -> Double {
        var db: OpaquePointer?
        guard sqlite3_open_v2(path, &db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE, nil) == SQLITE_OK, let db else {
            throw BenchError("W22: cannot open \(path)")
        }
        defer {
            sqlite3_close_v2(db)
            for suffix in ["", "-wal", "-shm"] { unlink(path + suffix) }
        }
        for sql in ["PRAGMA journal_mode=WAL", "PRAGMA synchronous=FULL", "CREATE TABLE t(id INTEGER PRIMARY KEY, v BLOB)"] {
            guard sqlite3_exec(db, sql, nil, nil, nil) == SQLITE_OK else {
                throw BenchError("W22: \(sql): \(String(cString: sqlite3_errmsg(db)))")
            }
        }
        var statement: OpaquePointer?
        guard sqlite3_prepare_v2(db, "INSERT INTO t(v) VALUES (?)", -1, &statement, nil) == SQLITE_OK, let statement else {
            throw BenchError("W22: prepare")
        }
        defer { sqlite3_finalize(statement) }
        let row = [UInt8](repeating: 0x61, count: 700)
        let count = engineInnerTransactions
        var failure: String?
        let total = seconds {
            for _ in 0..<count {
                // SQLITE_TRANSIENT (a macro): SQLite copies the row before the call returns.
                row.withUnsafeBytes {
                    _ = sqlite3_bind_blob(statement, 1, $0.baseAddress, Int32($0.count),
                                          unsafeBitCast(-1, to: sqlite3_destructor_type.self))
                }
                if sqlite3_step(statement) != SQLITE_DONE { failure = String(cString: sqlite3_errmsg(db)); break }
                sqlite3_reset(statement)
            }
        }
        if let failure { throw BenchError("W22: insert: \(failure)") }
        return total / Double(count)
    }

    /// Seconds per 4 KiB write of a new file written sequentially (as `dd bs=4k`), close included.
    func sequentialSmallWrites(_ path: String) throws -> Double {
        let block = [UInt8](repeating: 0x42, count: 4096)
        let count = engineSmallWrites
        let total = try seconds {
            let fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0o644)
            guard fd >= 0 else { throw BenchError("create \(path): \(Errno.current)") }
            for _ in 0..<count { _ = write(fd, block, block.count) }
            close(fd)
        }
        unlink(path)
        return total / Double(count)
    }

    /// Seconds per random 4 KiB pwrite into a 64 MiB file (written and synced first), the
    /// final fsync included.
    func randomWritesThenFsync(_ path: String) throws -> Double {
        let fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0o644)
        guard fd >= 0 else { throw BenchError("create \(path): \(Errno.current)") }
        defer { close(fd); unlink(path) }
        let megabyte = [UInt8](repeating: 0, count: 1 << 20)
        for _ in 0..<64 { _ = write(fd, megabyte, megabyte.count) }
        fsync(fd)
        var generator = SystemRandomNumberGenerator()
        let block = (0..<4096).map { _ in UInt8.random(in: 0...255, using: &generator) }
        let count = engineRandomWrites
        let offsets = (0..<count).map { _ in off_t(Int.random(in: 0..<16384, using: &generator) * 4096) }
        let total = seconds {
            for offset in offsets { _ = pwrite(fd, block, block.count, offset) }
            fsync(fd)
        }
        return total / Double(count)
    }

    /// MB/s of a big file written in 1 MiB writes and fsynced, and the largest size the
    /// write-ahead log at `log` reached meanwhile (MiB, sampled every 10 ms).
    func bigWriteWithLog(_ path: String, watching log: String?) throws -> (Double, Double) {
        let largest = Locked(0)
        let done = Locked(false)
        if let log {
            Threads.detach {
                while !done.withLock({ $0 }) {
                    var st = stat()
                    if stat(log, &st) == 0 { largest.withLock { $0 = max($0, Int(st.st_size)) } }
                    usleep(10_000)
                }
            }
        }
        let total = engineBigBytes
        let elapsed = try timedBigWrite(path, total: total)
        done.withLock { $0 = true }
        usleep(20_000)
        return (Double(total) / elapsed / 1e6, Double(largest.withLock { $0 }) / Double(1 << 20))
    }

    /// Unmounts the system, drops the kernel's caches and mounts it again: seconds to ready.
    func remountTime(_ system: String) throws -> Double? {
        switch system {
        case "mtmfs":
            guard Spawn.run(mtmfs, ["unmount", mountPoint]) == 0 else { throw BenchError("mtmfs unmount failed") }
            dropCaches()
            let elapsed = try seconds {
                guard Spawn.run(mtmfs, ["mount", "--auto-lock", "0", "--data-dir", dataDirectory, mountPoint]) == 0 else {
                    throw BenchError("mtmfs mount failed")
                }
            }
            daemonPID = pid_t(statusValue("pid") ?? "") ?? 0
            guard Spawn.run(mtmfs, ["unlock", mountPoint], input: Bench.passphrase + "\n") == 0 else { throw BenchError("unlock failed") }
            return elapsed
        case "gocryptfs":
            let plain = root + "/gocryptfs"
            guard Spawn.run("fusermount3", ["-u", plain]) == 0 else { return nil }
            dropCaches()
            return try seconds {
                guard Spawn.run("gocryptfs", ["-q", "-passfile", root + "/gocryptfs-pass", root + "/gocryptfs-cipher", plain]) == 0 else {
                    throw BenchError("gocryptfs mount failed")
                }
            }
        case "bindfs":
            let target = root + "/bindfs"
            guard Spawn.run("fusermount3", ["-u", target]) == 0 else { return nil }
            dropCaches()
            return try seconds {
                guard Spawn.run("bindfs", [root + "/bindsrc", target]) == 0 else { throw BenchError("bindfs mount failed") }
            }
        default:
            return nil
        }
    }

    /// Deletes `path` while another thread stats missing names (and every tenth time creates
    /// and removes a small file) in `directory`: seconds the rm took, the longest wait of
    /// that loop during the rm and 2 s after, and (for mtmfs) seconds until the data
    /// directory is back under its size before the file plus 64 MiB (nil if not in 60 s).
    func deleteWhileProbing(_ path: String, directory: String, dataDirectory: String?) throws -> (Double, Double, Double?) {
        let longest = Locked(0.0)
        let stop = Locked(false)
        let finished = Semaphore()
        Threads.detach {
            var index = 0
            var st = stat()
            while !stop.withLock({ $0 }) {
                let wait = seconds {
                    _ = stat("\(directory)/missing-\(index)", &st)
                    if index % 10 == 0 {
                        let fd = open("\(directory)/probe", O_WRONLY | O_CREAT | O_TRUNC, 0o644)
                        if fd >= 0 { _ = write(fd, "x", 1); close(fd) }
                        unlink("\(directory)/probe")
                    }
                }
                longest.withLock { $0 = max($0, wait) }
                index += 1
                usleep(1_000)
            }
            finished.post()
        }
        usleep(200_000)
        let before = dataDirectory.map(directorySize) ?? 0
        let took = seconds { unlink(path) }
        usleep(2_000_000)
        stop.withLock { $0 = true }
        _ = finished.wait(seconds: 10)
        var back: Double?
        if let dataDirectory {
            let goal = before - engineBigBytes + (64 << 20)
            var waited = 2.0
            while waited < 60 {
                if directorySize(dataDirectory) < goal { back = waited; break }
                usleep(200_000)
                waited += 0.2
            }
        }
        return (took, longest.withLock { $0 }, back)
    }

    /// Bytes the files below `path` take on the host (a data directory: the database and
    /// the data files of `cache.data/`).
    func directorySize(_ path: String) -> Int {
        ((try? FileManager.default.contentsOfDirectory(atPath: path)) ?? []).reduce(0) { total, name in
            var st = stat()
            guard lstat(path + "/" + name, &st) == 0 else { return total }
            return total + (st.st_mode & S_IFMT == S_IFDIR ? directorySize(path + "/" + name) : Int(st.st_blocks) * 512)
        }
    }
}
