import Foundation
import TestSupport
import Testing
#if canImport(Glibc)
import Glibc
#endif

/// `cache/` as a storage engine (SPEC §5, §7), through a real mount: buffered writes that
/// every reader sees and fsync makes durable, a bounded write-ahead log, space given back
/// after a delete without stalling other requests, mounts that skip the full check after a
/// clean unmount, `mtmfs check`, and listings that do not grow the daemon.
@Suite(.enabled(if: FuseAvailability.isAvailable, "needs /dev/fuse")) struct CacheEngineTests {
    func size(_ path: String) -> Int {
        var st = stat()
        return stat(path, &st) == 0 ? Int(st.st_size) : 0
    }

    /// The bytes of the files in `path` and in its folders (a data directory: the stores,
    /// and the data files of large files in `cache.data/`).
    func directorySize(_ path: String) -> Int {
        ((try? FileManager.default.contentsOfDirectory(atPath: path)) ?? []).reduce(0) { total, name in
            var isDirectory: ObjCBool = false
            let full = path + "/" + name
            _ = FileManager.default.fileExists(atPath: full, isDirectory: &isDirectory)
            return total + (isDirectory.boolValue ? directorySize(full) : size(full))
        }
    }

    /// Small writes in random order, never closed or fsynced, read at once by another
    /// process past the kernel's page cache (O_DIRECT reaches the daemon), then fsynced and
    /// the daemon killed: every byte is there.
    @Test func bufferedWritesAreSeenAtOnceAndFsyncMakesThemDurable() throws {
        let store = try MountedStore()
        defer { store.close() }
        let file = store.path("cache/pieces")
        let result = Run.program("python3", ["-c", #"""
            import hashlib, os, random, subprocess, sys, time
            path = sys.argv[1]
            rnd = random.Random(7)
            content = bytearray(rnd.getrandbits(8) for _ in range(300000))
            pieces = [(o, min(4096, len(content) - o)) for o in range(0, len(content), 4096)]
            rnd.shuffle(pieces)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
            for offset, length in pieces[:40]: os.pwrite(fd, bytes(content[offset:offset + length]), offset)
            # Another process, past the page cache, while the writer holds the file open.
            seen = subprocess.run(['dd', 'if=' + path, 'iflag=direct', 'bs=1M', 'status=none'], capture_output=True).stdout
            expected = bytearray(max(o + l for o, l in pieces[:40]))
            for offset, length in pieces[:40]: expected[offset:offset + length] = content[offset:offset + length]
            print('direct read matches', seen == bytes(expected), flush=True)
            for offset, length in pieces[40:]: os.pwrite(fd, bytes(content[offset:offset + length]), offset)
            os.fsync(fd)
            print(hashlib.md5(content).hexdigest(), flush=True)
            time.sleep(3600)  # killed with the daemon's mount still open
            """#, file], timeout: 5)
        // The writer sleeps after fsync; the run ends at its timeout, killed.
        let lines = result.stdout.split(separator: "\n")
        try #require(lines.count == 2, "\(result)")
        #expect(lines[0] == "direct read matches True")
        try store.killDaemon(detach: true)
        #expect(Run.mtmfs("mount", "--data-dir", store.dataDirectory, store.mountPoint).status == 0)
        #expect(Run.shell("md5sum < \(file)").stdout.hasPrefix(String(lines[1])))
        #expect(try store.status()["cache_check"] == "full", "an unclean shutdown is checked in full")
    }

    /// A writer that never pauses keeps the write-ahead log under its bound (64 MiB), also
    /// while another program keeps the disk busy with synced writes, so that checkpoints
    /// are slow (the log reached 143 MiB so when writers did not wait for them).
    @Test func theLogStaysBoundedUnderASteadyWriter() throws {
        let store = try MountedStore()
        defer { store.close() }
        let log = store.dataDirectory + "/cache.sqlite-wal"
        let running = SharedValue(true)
        let largest = SharedValue(0)
        let sampler = Thread {
            while running.value { largest.value = max(largest.value, self.size(log)); usleep(10_000) }
        }
        sampler.start()
        // The other program: large writes synced once, started just before (its dirty
        // pages flood the disk while the store writes).
        let junk = store.scratch.sub("busy-disk")
        let write = Run.shell("""
            dd if=/dev/zero of=\(junk) bs=1M count=600 conv=fdatasync status=none & busy=$!
            dd if=/dev/zero of=\(store.path("cache/steady")) bs=1M count=320 2>&1; status=$?
            kill $busy; wait; rm -f \(junk); exit $status
            """, timeout: 300)
        running.value = false
        usleep(50_000)
        #expect(write.status == 0, "\(write)")
        #expect(largest.value > 0 && largest.value <= 64 << 20, "largest log: \(largest.value) bytes")
    }

    /// `rm` of a big file returns at once; other requests of cache/ never wait long behind
    /// the deletion; its space goes back to the host file system within a minute.
    @Test func deletingABigFileStallsNothingAndGivesTheSpaceBack() throws {
        let store = try MountedStore()
        defer { store.close() }
        let c = store.path("cache")
        #expect(Run.shell("dd if=/dev/zero of=\(c)/big bs=1M count=256 conv=fsync 2>/dev/null").status == 0)
        let before = directorySize(store.dataDirectory)
        #expect(before > 256 << 20)
        let result = Run.program("python3", ["-c", #"""
            import os, sys, threading, time
            c = sys.argv[1]; waits = []; stop = False
            def probe():
                i = 0
                while not stop:
                    s = time.monotonic()
                    try: os.stat(c + '/missing-%d' % i)
                    except OSError: pass
                    if i % 10 == 0:
                        with open(c + '/probe', 'w') as f: f.write('x')
                        os.unlink(c + '/probe')
                    waits.append(time.monotonic() - s); i += 1
                    time.sleep(0.001)
            t = threading.Thread(target=probe); t.start(); time.sleep(0.2)
            s = time.monotonic(); os.unlink(c + '/big'); took = time.monotonic() - s
            time.sleep(3); stop = True; t.join()
            print('%.3f %.3f %d' % (took, max(waits), len(waits)))
            """#, c], timeout: 60)
        let numbers = result.stdout.split(separator: " ").compactMap { Double($0.trimmingCharacters(in: .whitespacesAndNewlines)) }
        try #require(numbers.count == 3, "\(result)")
        #expect(numbers[0] < 0.1, "rm took \(numbers[0]) s")
        // The benchmark holds the release build to 100 ms (W14); here, a debug build shares
        // two cores with the other tests, so scheduling alone can cost tens of milliseconds.
        // A delete inside the request took seconds for this size.
        #expect(numbers[1] < 0.5, "a request waited \(numbers[1]) s (\(Int(numbers[2])) probes)")
        #expect(Poll.until(seconds: 60) { directorySize(store.dataDirectory) < 32 << 20 },
                "data directory: \(directorySize(store.dataDirectory)) bytes, was \(before)")
        #expect(Run.program("sqlite3", [store.dataDirectory + "/cache.sqlite", "PRAGMA integrity_check"]).stdout == "ok\n")
    }

    /// After a clean unmount the next mount skips the full check; after a kill it runs it
    /// and says so; `mtmfs check` checks every store, also while mounted, and names a
    /// damaged one.
    @Test func theFullCheckRunsAfterAnUncleanShutdownAndOnDemand() throws {
        let store = try MountedStore()
        defer { store.close() }
        #expect(try store.status()["cache_check"] == "quick")
        #expect(Run.shell("for i in $(seq 60); do head -c 50000 /dev/urandom > \(store.path("cache"))/f$i; done").status == 0)
        let mounted = Run.mtmfs("check", "--data-dir", store.dataDirectory)
        #expect(mounted.status == 0 && mounted.stdout == "vault: ok\nSettings.plist: ok\ncache.sqlite: ok\n", "\(mounted)")
        #expect(Run.mtmfs("unmount", store.mountPoint).status == 0)
        let clean = Run.mtmfs("mount", "--data-dir", store.dataDirectory, store.mountPoint)
        #expect(clean.status == 0 && !clean.stderr.contains("checking"), "\(clean)")
        #expect(try store.status()["cache_check"] == "quick")
        try store.killDaemon(detach: true)
        let unclean = Run.mtmfs("mount", "--data-dir", store.dataDirectory, store.mountPoint)
        #expect(unclean.status == 0 && unclean.stderr.contains("checking the cache database"), "\(unclean)")
        #expect(unclean.stderr.contains("after an unclean shutdown") && unclean.stderr.contains(": ok"), "\(unclean)")
        #expect(try store.status()["cache_check"] == "full")
        #expect(Run.mtmfs("unmount", store.mountPoint).status == 0)
        // A page in the middle of the database overwritten: check names the store.
        #expect(Run.shell("dd if=/dev/urandom of=\(store.dataDirectory)/cache.sqlite bs=4096 seek=100 count=20 conv=notrunc 2>/dev/null").status == 0)
        let damaged = Run.mtmfs("check", "--data-dir", store.dataDirectory)
        #expect(damaged.status == 1 && damaged.stdout.contains("cache.sqlite: cache damaged"), "\(damaged)")
        #expect(damaged.stdout.contains("vault: ok") && damaged.stderr.contains("damaged: cache.sqlite"), "\(damaged)")
        let empty = Run.mtmfs("check", "--data-dir", store.scratch.sub("nothing"))
        #expect(empty.status == 1 && empty.stderr.contains("mtmfs init"), "\(empty)")
    }

    /// Open listings of a big directory hold a page each, not the directory: eight open
    /// handles on 20,000 entries barely move the daemon's memory, and every name is listed
    /// once, in pages, also by readdir without attributes.
    @Test func openListingsOfABigDirectoryDoNotGrowTheDaemon() throws {
        let store = try MountedStore()
        defer { store.close() }
        let directory = store.path("cache/big")
        let made = Run.program("python3", ["-c", """
            import os, sys
            d = sys.argv[1]; os.mkdir(d)
            for i in range(20000): os.close(os.open('%s/entry-%05d-with-a-longer-name' % (d, i), os.O_WRONLY | os.O_CREAT, 0o644))
            """, directory], timeout: 300)
        #expect(made.status == 0, "\(made)")
        #expect(Run.shell("ls \(directory) | wc -l").stdout == "20000\n")
        let pid = try #require(try store.status()["pid"])
        let held = Run.program("python3", ["-c", """
            import os, sys
            def rss(): return int([l for l in open('/proc/%s/status' % sys.argv[2]) if l.startswith('VmRSS:')][0].split()[1])
            before = rss()
            handles = [os.scandir(sys.argv[1]) for _ in range(8)]
            names = [next(h).name for h in handles]
            rest = [e.name for e in handles[0]]
            held = rss()
            all_names = sorted([names[0]] + rest)
            print(len(set(names)), len(all_names), len(set(all_names)), held - before)
            """, directory, pid], timeout: 60)
        let numbers = held.stdout.split(separator: " ").compactMap { Int($0.trimmingCharacters(in: .whitespacesAndNewlines)) }
        try #require(numbers.count == 4, "\(held)")
        #expect(numbers[0] == 1 && numbers[1] == 20000 && numbers[2] == 20000, "\(held)")
        #expect(numbers[3] < 4096, "the daemon grew by \(numbers[3]) kB with 8 listings open")
    }
}

/// A value shared with a sampling thread.
final class SharedValue<T>: @unchecked Sendable {
    private let lock = NSLock()
    private var stored: T
    init(_ value: T) { stored = value }
    var value: T {
        get { lock.lock(); defer { lock.unlock() }; return stored }
        set { lock.lock(); stored = newValue; lock.unlock() }
    }
}
