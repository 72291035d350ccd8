import Foundation
import Posix
import TestSupport
import Testing
#if canImport(Glibc)
import Glibc
#endif

/// `cache/` through a real mount (SPEC §5), checked against a model: the same operations
/// on a directory of the machine's own file system must give the same errno and tree.
@Suite(.enabled(if: FuseAvailability.isAvailable, "needs /dev/fuse")) struct CacheTests {
    /// Runs operations on a root and prints one line per operation: its errno name (or OK
    /// and a result), then a digest of the whole tree. Python has setxattr and, through
    /// ctypes, renameat2, which Swift's Glibc module lacks.
    static let operations = #"""
    import ctypes, errno, hashlib, os, random, stat, sys
    libc = ctypes.CDLL(None, use_errno=True)
    def renameat2(a, b, flags):
        if libc.renameat2(-100, a.encode(), -100, b.encode(), flags) != 0:
            e = ctypes.get_errno(); raise OSError(e, os.strerror(e))
    def tree(root):
        out = []
        for d, dirs, files in os.walk(root):
            dirs.sort()
            for n in sorted(dirs + files):
                p = os.path.join(d, n); st = os.lstat(p); rel = os.path.relpath(p, root)
                if stat.S_ISLNK(st.st_mode): out.append(f'{rel} link {os.readlink(p)}')
                elif stat.S_ISDIR(st.st_mode): out.append(f'{rel} dir {oct(st.st_mode & 0o7777)} links={st.st_nlink}')
                else:
                    h = hashlib.md5(open(p, 'rb').read()).hexdigest()
                    xs = sorted((x, os.getxattr(p, x)) for x in os.listxattr(p) if x.startswith('user.'))
                    out.append(f'{rel} file {oct(st.st_mode & 0o7777)} size={st.st_size} links={st.st_nlink} {h} {xs}')
        return out
    def attempt(fn):
        try:
            r = fn()
            return 'OK' if r is None else f'OK {r}'
        except OSError as e:
            return errno.errorcode.get(e.errno, str(e.errno))
    """#

    static let matrix = #"""
    root = sys.argv[1]; os.chdir(root)
    def w(p, data, flags=os.O_WRONLY | os.O_CREAT | os.O_TRUNC):
        fd = os.open(p, flags, 0o644); os.write(fd, data); os.close(fd)
    steps = [
        ('mkdir d', lambda: os.mkdir('d')), ('mkdir d again', lambda: os.mkdir('d')),
        ('write f', lambda: w('f', b'hello')), ('create excl f', lambda: w('f', b'x', os.O_WRONLY | os.O_CREAT | os.O_EXCL)),
        ('mkdir in file', lambda: os.mkdir('f/x')), ('rmdir file', lambda: os.rmdir('f')), ('unlink dir', lambda: os.unlink('d')),
        ('write d/g', lambda: w('d/g', b'g')), ('rmdir nonempty', lambda: os.rmdir('d')),
        ('rename dir into itself', lambda: os.rename('d', 'd/sub')), ('mkdir e', lambda: os.mkdir('e')),
        ('rename file over dir', lambda: os.rename('f', 'e')), ('rename dir over file', lambda: os.rename('e', 'f')),
        ('rename dir over nonempty', lambda: os.rename('e', 'd')), ('rename dir over empty', lambda: os.rename('d', 'e')),
        ('name too long', lambda: w('n' * 256, b'')), ('name 255', lambda: w('n' * 255, b'')),
        ('link dir', lambda: os.link('e', 'e2')), ('link f', lambda: os.link('f', 'f2')), ('nlink', lambda: os.stat('f').st_nlink),
        ('missing', lambda: os.stat('nope')), ('open dir for writing', lambda: os.open('e', os.O_WRONLY)),
        ('readlink file', lambda: os.readlink('f')), ('symlink', lambda: os.symlink('f', 's')), ('readlink', lambda: os.readlink('s')),
        ('symlink exists', lambda: os.symlink('x', 's')), ('getxattr missing', lambda: os.getxattr('f', 'user.nope')),
        ('setxattr', lambda: os.setxattr('f', 'user.a', b'1')), ('setxattr create existing', lambda: os.setxattr('f', 'user.a', b'2', os.XATTR_CREATE)),
        ('setxattr replace missing', lambda: os.setxattr('f', 'user.b', b'2', os.XATTR_REPLACE)),
        ('removexattr missing', lambda: os.removexattr('f', 'user.b')), ('getxattr', lambda: os.getxattr('f', 'user.a')),
        ('noreplace existing', lambda: renameat2('f', 'f2', 1)), ('exchange missing', lambda: renameat2('f', 'zz', 2)),
        ('exchange', lambda: renameat2('f', 'e', 2)), ('exchange back', lambda: renameat2('e', 'f', 2)),
        ('truncate dir', lambda: os.truncate('e', 0)), ('truncate grow', lambda: os.truncate('f', 100)), ('size', lambda: os.stat('f').st_size),
        ('truncate shrink', lambda: os.truncate('f', 3)), ('rename over hard link of itself', lambda: os.rename('f', 'f2')),
        ('unlink f2', lambda: os.unlink('f2')), ('rmdir missing', lambda: os.rmdir('nope')), ('unlink missing', lambda: os.unlink('nope')),
        ('chmod', lambda: os.chmod('f', 0o600)), ('mode', lambda: oct(os.stat('f').st_mode & 0o777)),
        ('utime', lambda: os.utime('f', ns=(1_000_000_123, 2_000_000_456))), ('mtime', lambda: os.stat('f').st_mtime_ns),
        ('append', lambda: w('f', b'++', os.O_WRONLY | os.O_APPEND)), ('read', lambda: open('f', 'rb').read()),
        ('sparse', lambda: w('sp', b'z', os.O_WRONLY | os.O_CREAT)), ('seek write', lambda: (lambda fd: (os.lseek(fd, 5 * 2**30, 0), os.write(fd, b'end'), os.close(fd)))(os.open('sp', os.O_WRONLY))),
        ('sparse size', lambda: os.stat('sp').st_size), ('sparse read', lambda: (lambda f: (f.seek(5 * 2**30 - 2), f.read(10)))(open('sp', 'rb'))[1]),
        ('open unlinked', lambda: (lambda fd: (os.unlink('f'), os.lseek(fd, 0, 0), os.read(fd, 10), os.close(fd))[2])(os.open('f', os.O_RDONLY))),
        ('mknod fifo', lambda: os.mkfifo('fifo')), ('unlink fifo', lambda: os.unlink('fifo')),
    ]
    for name, fn in steps: print(name, '=>', attempt(fn))
    os.unlink('sp')
    print('\n'.join(tree(root)))
    """#

    static let randomOperations = #"""
    root, seed, count = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]); os.chdir(root)
    rnd = random.Random(seed)
    names = ['a', 'b', 'c', 'd/x', 'd/y', 'e', 'd', 'd/z/w', 'f/g']
    def pick(): return rnd.choice(names)
    def data(): return bytes(rnd.getrandbits(8) for _ in range(rnd.choice([0, 1, 100, 5000, 70000, 140000])))
    def write_at(p, off, d):
        fd = os.open(p, os.O_WRONLY | os.O_CREAT, 0o644)
        try: os.pwrite(fd, d, off)
        finally: os.close(fd)
    ops = [
        lambda p: write_at(p, rnd.choice([0, 7, 65530, 65536, 200000]), data()),
        lambda p: os.truncate(p, rnd.choice([0, 3, 65536, 70000, 300000])),
        lambda p: os.mkdir(p), lambda p: os.rmdir(p), lambda p: os.unlink(p),
        lambda p: os.rename(p, pick()), lambda p: os.link(p, pick()), lambda p: os.symlink('t' + p, p),
        lambda p: os.setxattr(p, 'user.k', data()[:100]), lambda p: os.chmod(p, rnd.choice([0o600, 0o644, 0o755])),
        lambda p: hashlib.md5(open(p, 'rb').read()).hexdigest(),
        lambda p: sorted(os.listdir(p)), lambda p: renameat2(p, pick(), rnd.choice([1, 2])),
    ]
    for i in range(count):
        op = rnd.randrange(len(ops)); p = pick()
        print(i, op, p, attempt(lambda: ops[op](p)))
    print('\n'.join(tree(root)))
    """#

    func runBoth(_ script: String, arguments: [String] = []) throws -> (model: String, mount: String) {
        let store = try MountedStore()
        defer { store.close() }
        let model = store.scratch.sub("model")
        mkdir(model, 0o755)
        let program = store.scratch.sub("ops.py")
        try (Self.operations + "\n" + script + "\n").write(toFile: program, atomically: true, encoding: .utf8)
        let onModel = Run.program("python3", [program, model] + arguments, timeout: 300)
        let onMount = Run.program("python3", [program, store.path("cache")] + arguments, timeout: 300)
        #expect(onModel.status == 0, "model: \(onModel.stderr)")
        #expect(onMount.status == 0, "mount: \(onMount.stderr)")
        let integrity = Run.program("sqlite3", [store.dataDirectory + "/cache.sqlite", "PRAGMA integrity_check"])
        #expect(integrity.stdout == "ok\n", "\(integrity)")
        return (onModel.stdout, onMount.stdout)
    }

    /// Every errno case of the matrix is the one the machine's own file system gives.
    @Test func errnoMatrixMatchesTheModel() throws {
        let (model, mount) = try runBoth(Self.matrix)
        let modelLines = model.split(separator: "\n"), mountLines = mount.split(separator: "\n")
        #expect(modelLines.count == mountLines.count)
        for (expected, actual) in zip(modelLines, mountLines) where expected != actual {
            Issue.record("model: \(expected)\nmount: \(actual)")
        }
        #expect(model.contains("rename dir into itself => EINVAL") && model.contains("name too long => ENAMETOOLONG"))
    }

    /// Random operations (seeded), each compared with the model, then the whole tree.
    @Test(arguments: [1, 2, 3])
    func randomOperationsMatchTheModel(seed: Int) throws {
        let (model, mount) = try runBoth(Self.randomOperations, arguments: [String(seed), "400"])
        let modelLines = model.split(separator: "\n"), mountLines = mount.split(separator: "\n")
        var differences = 0
        for (expected, actual) in zip(modelLines, mountLines) where expected != actual {
            differences += 1
            if differences <= 5 { Issue.record("seed \(seed): model: \(expected)\nmount: \(actual)") }
        }
        #expect(modelLines.count == mountLines.count && differences == 0, "\(differences) differences")
    }

    @Test func fsyncedDataSurvivesKillNine() throws {
        let store = try MountedStore()
        defer { store.close() }
        let pid = try #require(Int32(try store.status()["pid"] ?? ""))
        let write = Run.program("python3", ["-c", """
            import os, sys
            fd = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT, 0o644)
            os.write(fd, b'durable ' * 10000); os.fsync(fd); os.close(fd)
            """, store.path("cache/kept")])
        #expect(write.status == 0, "\(write)")
        kill(pid, SIGKILL)
        #expect(Poll.until { !ProcessState.isRunning(pid) })
        Run.program("fusermount3", ["-uz", store.mountPoint])
        #expect(Run.program("sqlite3", [store.dataDirectory + "/cache.sqlite", "PRAGMA integrity_check"]).stdout == "ok\n")
        #expect(Run.mtmfs("mount", "--data-dir", store.dataDirectory, store.mountPoint).status == 0)
        #expect(Run.shell("head -c 16 \(store.path("cache/kept")); stat -c %s \(store.path("cache/kept"))").stdout == "durable durable 80000\n")
    }

    /// A database inside commits by small writes and an fsync each: its file, past the
    /// inline limit, lives in a data file of its own, and every fsynced byte survives a
    /// kill -9 that comes right after.
    @Test func aDatabaseInsideSurvivesKillNine() throws {
        let store = try MountedStore()
        defer { store.close() }
        let pid = try #require(Int32(try store.status()["pid"] ?? ""))
        let write = Run.program("python3", ["-c", """
            import hashlib, os, sys
            path, pid = sys.argv[1], int(sys.argv[2])
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
            data = bytearray(os.urandom(200000))
            os.pwrite(fd, bytes(data), 0); os.fsync(fd)
            for i in range(60):
                piece = os.urandom(100 + i * 37); at = (i * 7919) % 200000 + (250000 if i % 5 == 0 else 0)
                if len(data) < at + len(piece): data.extend(bytes(at + len(piece) - len(data)))
                data[at:at + len(piece)] = piece
                os.pwrite(fd, piece, at); os.fsync(fd)
            os.kill(pid, 9)
            print(len(data), hashlib.sha256(bytes(data)).hexdigest())
            """, store.path("cache/inner.db-wal"), String(pid)])
        let fields = write.stdout.split(separator: " ").map { $0.trimmingCharacters(in: .whitespacesAndNewlines) }
        try #require(write.status == 0 && fields.count == 2, "\(write)")
        #expect(Poll.until { !ProcessState.isRunning(pid) })
        Run.program("fusermount3", ["-uz", store.mountPoint])
        let check = Run.mtmfs("check", "--data-dir", store.dataDirectory)
        #expect(check.status == 0, "\(check)")
        let mount = Run.mtmfs("mount", "--data-dir", store.dataDirectory, store.mountPoint)
        #expect(mount.status == 0, "\(mount)")
        let file = store.path("cache/inner.db-wal")
        #expect(Run.shell("stat -c %s \(file); sha256sum < \(file) | cut -d' ' -f1").stdout == "\(fields[0])\n\(fields[1])\n")
    }

    /// A real SQLite database inside cache/ (WAL mode, synchronous=FULL: every commit an
    /// fsync of its log), killed with the daemon in the middle of its commits, three times:
    /// after each remount it passes `PRAGMA integrity_check` and holds every row whose
    /// commit returned (its files pass the inline limit on the way: both kinds are covered).
    @Test func aSQLiteDatabaseInsidePassesItsIntegrityCheckAfterEachKill() throws {
        let store = try MountedStore()
        defer { store.close() }
        let database = store.path("cache/app.db")
        var committed = 0
        for round in 0..<3 {
            let pid = try #require(Int32(try store.status()["pid"] ?? ""))
            // Commits rows until the daemon is killed under it (from a thread, mid-commit).
            let run = Run.program("python3", ["-c", """
                import os, sqlite3, sys, threading, time
                path, pid, start = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
                db = sqlite3.connect(path, isolation_level=None)
                db.execute("PRAGMA journal_mode=WAL"); db.execute("PRAGMA synchronous=FULL")
                db.execute("CREATE TABLE IF NOT EXISTS t(id INTEGER PRIMARY KEY, v BLOB)")
                # (A commit cut by the kill may be there or not: rows are counted, not numbered.)
                done = db.execute("SELECT count(*) FROM t").fetchone()[0]
                if done < start: print("lost rows:", done, "<", start, file=sys.stderr)
                threading.Timer(0.4, lambda: os.kill(pid, 9)).start()
                try:
                    for i in range(100000):
                        db.execute("INSERT INTO t(v) VALUES (?)", (os.urandom(700),))
                        done += 1
                except Exception as error:
                    print("stopped by", repr(error), file=sys.stderr)
                print(done)
                """, database, String(pid), String(committed)], timeout: 60)
            let reached = Int(run.stdout.trimmingCharacters(in: .whitespacesAndNewlines)) ?? -1
            try #require(reached > committed && !run.stderr.contains("lost rows"), "round \(round): \(run)")
            committed = reached
            #expect(Poll.until { !ProcessState.isRunning(pid) })
            Run.program("fusermount3", ["-uz", store.mountPoint])
            let mount = Run.mtmfs("mount", "--data-dir", store.dataDirectory, store.mountPoint)
            try #require(mount.status == 0, "\(mount)")
            let check = Run.program("sqlite3", [database, "PRAGMA integrity_check; SELECT count(*) >= \(committed) FROM t;"])
            #expect(check.stdout == "ok\n1\n", "round \(round), \(committed) rows committed: \(check)")
        }
        #expect(Run.program("sqlite3", [store.dataDirectory + "/cache.sqlite", "PRAGMA integrity_check"]).stdout == "ok\n")
        #expect(Run.mtmfs("check", "--data-dir", store.dataDirectory).status == 0)
    }

    /// SPEC §5: an fsync of a large file that nothing else changed costs that file's own
    /// sync. Counted with strace on the daemon (`-y` names each descriptor's file): 20
    /// writes and fsyncs of a database inside sync its data file 20 times and the
    /// database's log never; a new file's first fsync syncs the log too (its name is new).
    @Test func aLargeFilesFsyncSyncsItsDataFileAlone() throws {
        let store = try MountedStore()
        defer { store.close() }
        let pid = try #require(try store.status()["pid"])
        let run = Run.program("python3", ["-c", """
            import os, subprocess, sys, time
            path, daemon = sys.argv[1:3]
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
            os.pwrite(fd, os.urandom(300000), 0); os.fsync(fd)
            time.sleep(0.5)  # the checkpoint of that first fsync's commit (background) done
            tracer = subprocess.Popen(["strace", "-f", "-y", "-e", "trace=fsync,fdatasync", "-p", daemon],
                                      stderr=subprocess.PIPE, text=True, start_new_session=True)
            tracer.stderr.readline(); time.sleep(0.3)
            for i in range(20):
                os.pwrite(fd, os.urandom(4096), i * 8192); os.fsync(fd)
            time.sleep(0.3)
            tracer.terminate(); out = tracer.communicate()[1]
            lines = [l for l in out.splitlines() if "sync(" in l and "resumed" not in l]
            data = sum(1 for l in lines if "/cache.data/" in l)
            log = sum(1 for l in lines if "cache.sqlite-wal" in l)
            print(data, log)
            """, store.path("cache/inside.db"), pid], timeout: 60)
        let counts = run.stdout.split(separator: " ").compactMap { Int($0.trimmingCharacters(in: .whitespacesAndNewlines)) }
        try #require(run.status == 0 && counts.count == 2, "\(run)")
        #expect(counts[0] >= 20, "data file syncs: \(run.stdout)")
        #expect(counts[1] == 0, "log syncs: \(run.stdout)")
    }

    /// Write-behind (`HostPages`): a stream of 1 MiB writes into a large file
    /// starts the writeback of each 8 MiB it passes (strace on the daemon counts the
    /// `sync_file_range` calls on the data file: 64 MiB, 8 of them), so that the fsync at
    /// the end waits for the last stride only; 4 KiB writes inside one stride start none.
    @Test func aStreamIsWrittenBehind() throws {
        let store = try MountedStore()
        defer { store.close() }
        let pid = try #require(try store.status()["pid"])
        let run = Run.program("python3", ["-c", """
            import os, subprocess, sys, time
            path, daemon = sys.argv[1:3]
            tracer = subprocess.Popen(["strace", "-f", "-y", "-e", "trace=sync_file_range", "-p", daemon],
                                      stderr=subprocess.PIPE, text=True, start_new_session=True)
            tracer.stderr.readline(); time.sleep(0.3)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
            block = os.urandom(1 << 20)
            for i in range(64): os.write(fd, block)
            for i in range(100): os.pwrite(fd, block[:4096], (64 << 20) + 4096 * i)
            os.fsync(fd); os.close(fd)
            time.sleep(0.3)
            tracer.terminate(); out = tracer.communicate()[1]
            print(sum(1 for l in out.splitlines() if "sync_file_range(" in l and "/cache.data/" in l))
            """, store.path("cache/stream.bin"), pid], timeout: 60)
        let calls = Int(run.stdout.trimmingCharacters(in: .whitespacesAndNewlines))
        try #require(run.status == 0 && calls != nil, "\(run)")
        #expect(calls == 8, "writebacks started: \(run.stdout)")
        #expect(Run.program("stat", ["-c", "%s", store.path("cache/stream.bin")]).stdout == "\((64 << 20) + 409_600)\n")
    }

    /// Drop-behind (`HostPages.wrote`): the kernel keeps its own copy of the pages
    /// written through the mount, so the host's copy of a stream's bytes goes once written
    /// back. 64 MiB written as a stream leaves the last two strides (16 MiB) of its data file
    /// in the host's page cache (`fincore`; up to 40 MiB while a slow disk still writes the
    /// strides before); the same 64 MiB written from the end backwards (in place, not a
    /// stream) keeps all of it. Both read back whole.
    @Test func aStreamLeavesNoSecondCopy() throws {
        let store = try MountedStore()
        defer { store.close() }
        let run = Run.program("python3", ["-c", """
            import hashlib, os, subprocess, sys
            cache, data = sys.argv[1:3]
            def resident(before):
                files = [os.path.join(d, f) for d, _, fs in os.walk(data) for f in fs]
                new = [f for f in files if f not in before]
                assert len(new) == 1, new
                out = subprocess.run(["fincore", "--bytes", "--noheadings", "--output", "RES", new[0]],
                                     capture_output=True, text=True, check=True).stdout
                return new[0], int(out.split()[0])
            blocks = [hashlib.sha256(bytes([i])).digest() * 32768 for i in range(64)]
            whole = b"".join(blocks)
            for name, order in (("stream.bin", range(64)), ("backwards.bin", reversed(range(64)))):
                before = {os.path.join(d, f) for d, _, fs in os.walk(data) for f in fs}
                path = os.path.join(cache, name)
                fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
                for i in order: os.pwrite(fd, blocks[i], i << 20)
                os.fsync(fd); os.close(fd)
                file, res = resident(before)
                with open(path, "rb") as f: back = f.read()
                with open(file, "rb") as f: stored = f.read()
                print(name, res >> 20, back == whole, stored == whole)
            """, store.path("cache"), store.dataDirectory + "/cache.data"], timeout: 120)
        try #require(run.status == 0, "\(run)")
        let lines = run.stdout.split(separator: "\n").map { $0.split(separator: " ").map(String.init) }
        try #require(lines.count == 2 && lines.allSatisfy { $0.count == 4 }, "\(run)")
        #expect(Int(lines[0][1])! <= 40, "a stream's data file keeps \(lines[0][1]) MiB in the page cache")
        #expect(Int(lines[1][1])! == 64, "a file written in place keeps \(lines[1][1]) MiB in the page cache")
        #expect(lines.allSatisfy { $0[2] == "True" && $0[3] == "True" }, "\(run)")
    }

    /// Drop-behind on reads (`HostPages.read`): a large file read through as a stream
    /// (O_DIRECT, so that every read reaches the daemon whatever the kernel kept) leaves the
    /// last two strides of its data file in the host's page cache, up to 40 MiB as above, not
    /// all 64 MiB; it reads back whole.
    @Test func aReadStreamLeavesNoSecondCopy() throws {
        let store = try MountedStore()
        defer { store.close() }
        let run = Run.program("python3", ["-c", """
            import hashlib, mmap, os, subprocess, sys
            path, data = sys.argv[1:3]
            blocks = [hashlib.sha256(bytes([i])).digest() * 32768 for i in range(64)]
            fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
            for i in reversed(range(64)): os.pwrite(fd, blocks[i], i << 20)
            os.fsync(fd); os.close(fd)
            [file] = [os.path.join(d, f) for d, _, fs in os.walk(data) for f in fs]
            def resident():
                out = subprocess.run(["fincore", "--bytes", "--noheadings", "--output", "RES", file],
                                     capture_output=True, text=True, check=True).stdout
                return int(out.split()[0]) >> 20
            before = resident()
            buffer = mmap.mmap(-1, 1 << 20)
            fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
            same = all(os.preadv(fd, [buffer], i << 20) == 1 << 20 and buffer[:] == blocks[i] for i in range(64))
            os.close(fd)
            print(before, resident(), same)
            """, store.path("cache/read.bin"), store.dataDirectory + "/cache.data"], timeout: 120)
        try #require(run.status == 0, "\(run)")
        let fields = run.stdout.split(whereSeparator: \.isWhitespace).map(String.init)
        try #require(fields.count == 3, "\(run)")
        #expect(fields[0] == "64", "written in place, the data file keeps its pages: \(run.stdout)")
        #expect(Int(fields[1])! <= 40, "a read stream's data file keeps \(fields[1]) MiB in the page cache")
        #expect(fields[2] == "True", "\(run)")
    }

    /// An outside exerciser's run reduced to ten lines: small writes each fsynced, one more
    /// small write, then whole chunks (a version with an fsync journal died there; here the
    /// file moves to a data file). Then a kill -9 right after an fsync keeps every byte it
    /// covered.
    @Test func wholeChunksAfterFsyncsThenKillNine() throws {
        let store = try MountedStore()
        defer { store.close() }
        let pid = try #require(Int32(try store.status()["pid"] ?? ""))
        let run = Run.program("python3", ["-c", """
            import hashlib, os, sys
            fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o644)
            for i in range(4):
                os.pwrite(fd, b"a" * 100, 300 * i); os.fsync(fd)
            os.pwrite(fd, b"b" * 100, 5000)
            os.pwrite(fd, b"c" * 131072, 65536)
            os.pwrite(fd, b"d" * 50, 1000); os.fsync(fd)
            os.pwrite(fd, b"e" * 70, 2000); os.fsync(fd)
            os.pwrite(fd, b"f" * 10, 3000)
            os.kill(int(sys.argv[2]), 9)
            expected = bytearray(196608)
            for i in range(4): expected[300 * i:300 * i + 100] = b"a" * 100
            expected[5000:5100] = b"b" * 100
            expected[65536:196608] = b"c" * 131072
            expected[1000:1050] = b"d" * 50
            expected[2000:2070] = b"e" * 70
            print(hashlib.sha256(bytes(expected)).hexdigest())
            """, store.path("cache/db.bin"), String(pid)])
        try #require(run.status == 0, "\(run)")
        #expect(Poll.until { !ProcessState.isRunning(pid) })
        Run.program("fusermount3", ["-uz", store.mountPoint])
        let mount = Run.mtmfs("mount", "--data-dir", store.dataDirectory, store.mountPoint)
        try #require(mount.status == 0, "\(mount)")
        // The last write was not fsynced: it may be there or not, every other byte must.
        let file = store.path("cache/db.bin")
        let found = Run.program("python3", ["-c", """
            import hashlib, sys
            data = bytearray(open(sys.argv[1], 'rb').read())
            if data[3000:3010] == b"f" * 10: data[3000:3010] = bytes(10)
            print(len(data), hashlib.sha256(bytes(data)).hexdigest())
            """, file])
        #expect(found.stdout == "196608 \(run.stdout)", "\(found)")
        #expect(Run.program("sqlite3", [store.dataDirectory + "/cache.sqlite", "PRAGMA integrity_check"]).stdout == "ok\n")
    }

    /// `.mtmfs/status` says how often requests woke the committing thread and how many data
    /// files are open — and an idle mount adds no wake.
    @Test func statusCountsCommitterWakesAndOpenDataFiles() throws {
        let store = try MountedStore()
        defer { store.close() }
        let run = Run.program("python3", ["-c", """
            import os, sys, time
            fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o644)
            for i in range(4):
                os.pwrite(fd, b"a" * 100, 300 * i); os.fsync(fd)
            os.pwrite(fd, b"c" * 131072, 65536); os.fsync(fd)
            print(open(sys.argv[2]).read()); os.close(fd)
            """, store.path("cache/db.bin"), store.path(".mtmfs/status")])
        try #require(run.status == 0, "\(run)")
        #expect(run.stdout.contains("cache_data_files_open=1"), "\(run.stdout)")
        let after = try store.status()
        #expect(after["cache_data_files_open"] == "0", "\(after)")
        let wakes = after["cache_committer_wakes"]
        #expect(wakes != nil)
        usleep(1_500_000)
        let idle = try store.status()
        #expect(idle["cache_committer_wakes"] == wakes, "\(idle)")
    }

    /// docs/cache-schema.md: the write-ahead log is copied into the database file once the
    /// store is quiet (not inside requests), and unmounting checkpoints and truncates it.
    @Test func logIsCheckpointedWhenQuietAndTruncatedAtUnmount() throws {
        let store = try MountedStore()
        defer { store.close() }
        let database = store.dataDirectory + "/cache.sqlite"
        func size(_ path: String) -> Int { Int(Run.program("stat", ["-c", "%s", path]).stdout.trimmingCharacters(in: .newlines)) ?? -1 }
        let before = size(database)
        // 2 MB of small files (their bytes are rows of the database).
        #expect(Run.shell("for i in $(seq 40); do head -c 50000 /dev/urandom > \(store.path("cache"))/blob$i; done").status == 0)
        #expect(Poll.until(seconds: 5) { size(database) >= before + 2_000_000 }, "database \(size(database)) bytes, was \(before)")
        #expect(Run.mtmfs("unmount", store.mountPoint).status == 0)
        #expect(!FileManager.default.fileExists(atPath: database + "-wal") || size(database + "-wal") == 0)
        #expect(Run.program("sqlite3", [database, "SELECT count(*) FROM inodes JOIN contents USING(ino) WHERE size = 50000"]).stdout == "40\n")
    }

    @Test func sqliteReadsTheTreeWhileMountedAndMmapWorks() throws {
        let store = try MountedStore()
        defer { store.close() }
        #expect(Run.shell("mkdir \(store.path("cache/dir")) && echo content > \(store.path("cache/dir/file"))").status == 0)
        usleep(100_000)  // changes reach the file within 5 ms (group commit)
        let query = Run.program("sqlite3", [store.dataDirectory + "/cache.sqlite",
                                            "SELECT e.name, i.size FROM entries e JOIN inodes i USING(ino) ORDER BY e.name"])
        #expect(query.stdout == "dir|0\nfile|8\n", "\(query)")
        let mmap = Run.program("python3", ["-c", """
            import mmap, os, sys
            fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o644); os.ftruncate(fd, 8192)
            m = mmap.mmap(fd, 8192); m[100:105] = b'hello'; m.flush(); m.close(); os.close(fd)
            print(open(sys.argv[1], 'rb').read()[100:105].decode())
            """, store.path("cache/mapped")])
        #expect(mmap.stdout == "hello\n", "\(mmap)")
    }

    @Test func packagedStressorsPass() throws {
        let store = try MountedStore()
        defer { store.close() }
        let cache = store.path("cache")
        if Run.shell("command -v fio").status == 0 {
            let fio = Run.shell("cd \(cache) && fio --name=verify --rw=randwrite --bs=4k --size=4m --numjobs=2 --verify=crc32c --do_verify=1 --ioengine=psync --output-format=terse --minimal >/dev/null", timeout: 300)
            #expect(fio.status == 0, "fio: \(fio.stderr)")
        }
        if Run.shell("command -v postmark").status == 0 {
            let postmark = Run.shell("printf 'set location \(cache)\\nset number 300\\nset transactions 1000\\nrun\\nquit\\n' | postmark", timeout: 300)
            #expect(postmark.status == 0 && postmark.stdout.contains("transactions"), "postmark: \(postmark)")
        }
        if Run.shell("command -v dbench").status == 0 {
            // Samba's file server load (creates, writes, renames, deletes, locks) by 2 clients.
            let dbench = Run.shell("cd \(cache) && dbench -D . -t 10 2 2>&1", timeout: 120)
            #expect(dbench.status == 0 && dbench.stdout.contains("Throughput"), "dbench: \(dbench.stdout.suffix(1500))")
        }
        if Run.shell("command -v stress-ng").status == 0 {
            let stress = Run.shell("cd \(cache) && stress-ng --temp-path . --hdd 1 --hdd-ops 200 --hdd-opts wr-rnd,rd-rnd --verify --link 1 --link-ops 200 --rename 1 --rename-ops 500 --dir 1 --dir-ops 200 --timeout 30s --metrics-brief 2>&1", timeout: 300)
            #expect(stress.status == 0, "stress-ng: \(stress.stdout.suffix(1500))")
        }
        #expect(Run.program("sqlite3", [store.dataDirectory + "/cache.sqlite", "PRAGMA integrity_check"]).stdout == "ok\n")
    }

    /// Review findings: O_TRUNC on an existing file, times outside 1677–2262 and before 1970,
    /// expiry on a directory.
    @Test func overwriteTruncatesAndTimesAreSafe() throws {
        let store = try MountedStore()
        defer { store.close() }
        let c = store.path("cache")
        #expect(Run.shell("printf 'hello world\\n' > \(c)/f && echo hi > \(c)/f && cat \(c)/f && stat -c %s \(c)/f").stdout == "hi\n3\n")
        #expect(Run.shell("printf 'long line\\n' > \(c)/g && python3 -c \"open('\(c)/g','w').write('x')\" && cat \(c)/g").stdout == "x")
        #expect(Run.shell("touch -d '2300-01-01' \(c)/f && touch -d '1600-01-01' \(c)/f && stat -c %s \(c)/f").status == 0)
        #expect(Run.shell("touch -d '1969-12-31 23:59:59.5' \(c)/f && stat -c %y \(c)/f").stdout.hasPrefix("1969-12-31 23:59:59.5"))
        #expect(Run.shell("cat \(store.path(".mtmfs/status"))").status == 0, "the daemon survived")
        #expect(Run.shell("mkdir \(c)/d && setfattr -n user.cache.expires -v 1 \(c)/d").stderr.contains("Operation not permitted"))
    }

    /// The attributes cache/ keeps (user.*) go in and out with the tools that copy them, and
    /// those it does not keep (security.*, ACLs) answer as a file system without them:
    /// `getfattr -d`, `setfattr`, `cp -a`, `rsync -aX`, `tar --xattrs`.
    @Test func attributesTravelWithTheToolsThatCopyThem() throws {
        let store = try MountedStore()
        defer { store.close() }
        let c = store.path("cache"), outside = store.scratch.sub("outside")
        func sh(_ line: String) -> CommandResult { Run.shell(line) }
        #expect(sh("mkdir -p \(outside)/src/sub && echo one > \(outside)/src/a && echo two > \(outside)/src/sub/b "
                   + "&& setfattr -n user.color -v blue \(outside)/src/a && setfattr -n user.k -v 0x00ff \(outside)/src/sub/b").status == 0)
        let dump = "cd %@ && getfattr -R -d -m '^user\\.' -e hex . 2>&1 | sort"
        let expected = sh(dump.replacingOccurrences(of: "%@", with: outside + "/src")).stdout
        #expect(expected.contains("user.color=0x626c7565"), "\(expected)")
        // In: cp -a, rsync -aX, tar --xattrs; each copy has the attributes of the source.
        let copies = [("cp", "cp -a \(outside)/src \(c)/cp"),
                      ("rsync", "rsync -aX \(outside)/src/ \(c)/rsync/"),
                      ("tar", "mkdir \(c)/tar && tar --xattrs -C \(outside)/src -cf - . | tar --xattrs --xattrs-include='user.*' -C \(c)/tar -xf -")]
        for (tool, line) in copies {
            let copied = sh(line)
            #expect(copied.status == 0 && !copied.stderr.contains("Operation not supported"), "\(tool): \(copied)")
            #expect(sh(dump.replacingOccurrences(of: "%@", with: "\(c)/\(tool)")).stdout == expected, "\(tool) into cache/")
        }
        // Out again, and getfattr -d of every attribute (no security.* or ACL among them).
        let out = sh("cp -a \(c)/rsync \(outside)/back && rsync -aX \(c)/tar/ \(outside)/back2/ && tar --xattrs -C \(c)/cp -cf \(outside)/t.tar .")
        #expect(out.status == 0 && out.stderr.isEmpty, "\(out)")
        #expect(sh(dump.replacingOccurrences(of: "%@", with: outside + "/back")).stdout == expected)
        #expect(sh(dump.replacingOccurrences(of: "%@", with: outside + "/back2")).stdout == expected)
        #expect(sh("tar --xattrs -tvvf \(outside)/t.tar 2>&1").status == 0)
        let all = sh("getfattr -d -m - \(c)/cp/a 2>&1")
        #expect(all.stdout.contains("user.color=\"blue\"") && !all.stdout.contains("security.") && !all.stdout.contains("system."), "\(all)")
        // What cache/ does not keep: EOPNOTSUPP, as on a file system without the feature.
        #expect(sh("setfattr -n security.test -v 1 \(c)/cp/a").stderr.contains("Operation not supported"))
        #expect(sh("setfattr -n trusted.test -v 1 \(c)/cp/a").stderr.contains("Operation not supported"))
        #expect(sh("getfattr -n system.posix_acl_access \(c)/cp/a").stderr.contains("Operation not supported"))
        #expect(sh("setfattr -x user.color \(c)/cp/a && getfattr -d \(c)/cp/a").stdout.isEmpty)
    }

    @Test func cacheLimitEvictsTheLeastRecentlyUsedClosedFiles() throws {
        let store = try MountedStore(options: ["--cache-limit", "300K"])
        defer { store.close() }
        let c = store.path("cache")
        // "one" is the oldest but open: it must stay. Opened before the others are written:
        // the limit is passed at "four", and eviction may run at once (it did, before an open
        // that came after "five", in one CI run in a few).
        #expect(Run.shell("head -c 102400 /dev/urandom > \(c)/one").status == 0)
        let held = open(c + "/one", O_RDONLY | O_CLOEXEC)
        defer { close(held) }
        for name in ["two", "three", "four", "five"] {
            #expect(Run.shell("sleep 0.05 && head -c 102400 /dev/urandom > \(c)/\(name)").status == 0)
        }
        #expect(Poll.until(seconds: 3) { (try? store.status()["cache_bytes"]).flatMap { Int($0) } ?? .max <= 300 * 1024 })
        let names = Set(try FileManager.default.contentsOfDirectory(atPath: c))
        #expect(names.contains("one") && names.contains("five") && !names.contains("two"), "\(names)")
        let status = try store.status()
        #expect(Int(status["cache_evictions"] ?? "") ?? 0 >= 2 && status["cache_limit"] == "307200", "\(status)")
    }

    @Test func expiryRemovesFilesAtTheirTime() throws {
        let store = try MountedStore()
        defer { store.close() }
        let c = store.path("cache")
        #expect(Run.shell("echo a > \(c)/soon && echo b > \(c)/later && echo c > \(c)/iso").status == 0)
        #expect(Run.shell("setfattr -n user.cache.expires -v $(($(date +%s) + 1)) \(c)/soon").status == 0)
        #expect(Run.shell("setfattr -n user.cache.expires -v 2999-01-01T00:00:00Z \(c)/later").status == 0)
        #expect(Run.shell("setfattr -n user.cache.expires -v $(date -u -d @$(($(date +%s) + 1)) +%Y-%m-%dT%H:%M:%S+00:00) \(c)/iso").status == 0)
        let bad = Run.shell("setfattr -n user.cache.expires -v tomorrow \(c)/later")
        #expect(bad.status != 0 && bad.stderr.contains("Invalid argument"), "\(bad)")
        #expect(Poll.until(seconds: 4) { !FileManager.default.fileExists(atPath: c + "/soon") && !FileManager.default.fileExists(atPath: c + "/iso") })
        #expect(FileManager.default.fileExists(atPath: c + "/later"))
        #expect(try store.status()["cache_expired"] == "2")
    }

    /// The data directory on a full file system: the writer gets ENOSPC, the database stays
    /// intact, and writes work again once space is freed.
    @Test func fullDiskGivesENOSPCAndRecovers() throws {
        let scratch = Scratch()
        let small = scratch.sub("small"), mnt = scratch.sub("mnt")
        mkdir(small, 0o755)
        mkdir(mnt, 0o755)
        try #require(Run.program("mount", ["-t", "tmpfs", "-o", "size=24m", "tmpfs", small]).status == 0)
        defer {
            Run.mtmfs("unmount", mnt)
            Run.program("umount", ["-l", small])
            scratch.remove()
        }
        #expect(Run.initStore(small + "/data").status == 0)
        #expect(Run.mtmfs("mount", "--data-dir", small + "/data", mnt).status == 0)
        let fill = Run.shell("dd if=/dev/zero of=\(mnt)/cache/big bs=1M count=64 2>&1")
        #expect(fill.status != 0 && fill.stdout.contains("No space left on device"), "\(fill)")
        #expect(Run.program("sqlite3", [small + "/data/cache.sqlite", "PRAGMA integrity_check"]).stdout == "ok\n")
        #expect(Run.shell("cat \(mnt)/settings/IsFirstRun").stdout == "true\n")
        #expect(Run.shell("rm \(mnt)/cache/big && sleep 0.2 && echo again > \(mnt)/cache/small && cat \(mnt)/cache/small").stdout == "again\n")
    }

    @Test func damagedCacheGivesEIOAndTheOtherStoresWork() throws {
        var before = Data()
        let store = try MountedStore { data in
            #expect(Run.shell("head -c 8192 /dev/urandom > \(data)/cache.sqlite").status == 0)
            before = try Data(contentsOf: URL(fileURLWithPath: data + "/cache.sqlite"))
        }
        defer { store.close() }
        let mnt = store.mountPoint, data = store.dataDirectory
        let listing = Run.shell("ls \(mnt)/cache")
        #expect(listing.status != 0 && listing.stderr.contains("Input/output error"), "\(listing)")
        #expect(Run.shell("cat \(mnt)/settings/IsFirstRun && ls \(mnt)/accounts").status == 0)
        #expect(try Data(contentsOf: URL(fileURLWithPath: data + "/cache.sqlite")) == before)
    }
}
