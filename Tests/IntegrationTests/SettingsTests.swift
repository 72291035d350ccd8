import Foundation
import TestSupport
import Testing
#if canImport(Glibc)
import Glibc
#endif

/// `settings/` through a real mount (SPEC §4).
@Suite(.enabled(if: FuseAvailability.isAvailable, "needs /dev/fuse")) struct SettingsTests {
    /// The plist as Python's plistlib sees it: `key:type=value` per key, in file order.
    static func dump(_ dataDirectory: String) -> String {
        let result = Run.program("python3", ["-c", """
            import plistlib, sys, datetime
            with open(sys.argv[1], 'rb') as f: d = plistlib.load(f)
            def t(v):
                if isinstance(v, bool): return 'bool'
                if isinstance(v, int): return 'integer'
                if isinstance(v, float): return 'real'
                if isinstance(v, str): return 'string'
                if isinstance(v, datetime.datetime): return 'date'
                if isinstance(v, bytes): return 'data'
                if isinstance(v, list): return 'array'
                return 'dict'
            print(' '.join(f'{k}:{t(v)}={v!r}' for k, v in d.items()))
            """, dataDirectory + "/Settings.plist"])
        return result.status == 0 ? result.stdout.trimmingCharacters(in: .newlines) : "unreadable: \(result.stderr)"
    }

    static let defaults = "IsFirstRun:bool=True ActiveServiceAccountUUID:string=''"

    /// Readers are served from the kernel's pages of a key: a read right after a change —
    /// a write, a refused write (its bytes reached the kernel's pages), a change of the plist
    /// by another program — gives the key's text (as last written while it means the stored
    /// value), never the cached or refused bytes.
    @Test func readsRightAfterChangesAreFresh() throws {
        let store = try MountedStore()
        defer { store.close() }
        let key = store.path("settings/IsFirstRun")
        let script = """
            for i in $(seq 10); do
              cat "$1" > /dev/null
              echo no > "$1"; test "$(cat "$1")" = no || exit 1
              echo bogus > "$1" 2>/dev/null && exit 2; test "$(cat "$1")" = no || exit 3
              echo 1 > "$1"; test "$(cat "$1")" = 1 || exit 4
            done
            echo fresh
            """
        let result = Run.program("/bin/sh", ["-c", script, "sh", key])
        #expect(result.stdout == "fresh\n", "\(result)")
        // Another program changes the plist: the mount shows it within a second.
        #expect(Run.shell("cat \(key)").stdout == "1\n")
        let plist = store.dataDirectory + "/Settings.plist"
        #expect(Run.program("python3", ["-c", "import plistlib,sys; d=plistlib.load(open(sys.argv[1],'rb')); d['IsFirstRun']=False; plistlib.dump(d, open(sys.argv[1],'wb'))", plist]).status == 0)
        #expect(Poll.until(seconds: 3) { Run.shell("cat \(key)").stdout == "false\n" })
    }

    @Test func defaultsAndEachTypesForms() throws {
        let store = try MountedStore()
        defer { store.close() }
        let s = store.path("settings")
        #expect(Run.shell("cat \(s)/IsFirstRun").stdout == "true\n")
        #expect(Run.shell("cat \(s)/ActiveServiceAccountUUID").stdout == "\n")
        #expect(Run.shell("getfattr --only-values -n user.plist.type \(s)/IsFirstRun").stdout == "bool")
        let script = """
            set -e
            cd \(s)
            echo 42 > Count; echo -7 > Negative; echo 1.5 > Ratio; echo 'héllo wörld' > Text
            echo 2024-01-02T05:04:05+02:00 > When
            touch Blob; setfattr -n user.plist.type -v data Blob; echo AAEC/w== > Blob
            echo OFF > IsFirstRun
            for k in Count Negative Ratio Text When Blob IsFirstRun; do printf '%s=' $k; getfattr --only-values -n user.plist.type $k; printf ' '; cat $k; done
            """
        let result = Run.shell(script)
        #expect(result.status == 0, "\(result)")
        #expect(result.stdout == """
            Count=integer 42
            Negative=integer -7
            Ratio=real 1.5
            Text=string héllo wörld
            When=date 2024-01-02T05:04:05+02:00
            Blob=data AAEC/w==
            IsFirstRun=bool OFF

            """, "\(result.stdout)")
        #expect(Self.dump(store.dataDirectory) == "IsFirstRun:bool=False ActiveServiceAccountUUID:string='' Count:integer=42 Negative:integer=-7 Ratio:real=1.5 Text:string='héllo wörld' When:date=datetime.datetime(2024, 1, 2, 3, 4, 5) Blob:data=b'\\x00\\x01\\x02\\xff'")
        // Values set by another program are shown in the canonical form.
        let plistutil = Run.program("plistutil", ["-i", store.dataDirectory + "/Settings.plist", "-f", "xml"])
        #expect(plistutil.status == 0 && plistutil.stdout.contains("<date>2024-01-02T03:04:05Z</date>"), "\(plistutil)")
    }

    @Test func badValuesGetEINVALAndThePlistKeepsItsLastGoodValue() throws {
        let store = try MountedStore()
        defer { store.close() }
        let s = store.path("settings")
        #expect(Run.shell("cd \(s) && echo 5 > Count && echo x > Text && echo 2024-01-02T03:04:05Z > When && touch Blob && setfattr -n user.plist.type -v data Blob && echo AAAA > Blob").status == 0)
        let before = try Data(contentsOf: URL(fileURLWithPath: store.dataDirectory + "/Settings.plist"))
        let cases: [(String, String)] = [
            ("IsFirstRun", "echo maybe"), ("Count", "echo 12abc"), ("Count", "echo 060"),
            ("Count", "echo 18446744073709551616"), ("Text", "printf '\\377\\376'"), ("When", "echo yesterday"),
            ("When", "echo 2024-02-30T00:00:00Z"), ("Blob", "echo 'not base64!'"), ("Count", "printf ''"),
        ]
        for (key, producer) in cases {
            let result = Run.shell("\(producer) > \(s)/\(key)")
            if producer != "printf ''" { #expect(result.status != 0, "\(key) \(producer): \(result)") }
        }
        // The errno itself, as a program sees it.
        let fd = open(s + "/Count", O_WRONLY | O_TRUNC | O_CLOEXEC)
        #expect(fd >= 0)
        #expect(errnoOf { Int32(Glibc.write(fd, "12abc\n", 6)) } == EINVAL)
        #expect(errnoOf { close(fd) } == EINVAL)
        let after = try Data(contentsOf: URL(fileURLWithPath: store.dataDirectory + "/Settings.plist"))
        #expect(before == after)
        #expect(Run.shell("cat \(s)/Count \(s)/IsFirstRun").stdout == "5\ntrue\n")
        // Over 1 MiB: EFBIG.
        let big = Run.shell("head -c 1100000 /dev/zero | tr '\\0' a > \(s)/Text")
        #expect(big.status != 0, "\(big.status) \(big.stderr.prefix(200))")
        #expect(Run.shell("cat \(s)/Text").stdout == "x\n")
        // One single-threaded process holds the descriptor (see AccountsTests).
        let oversized = Run.program("python3", ["-c", """
            import os, sys, errno
            fd = os.open(sys.argv[1], os.O_WRONLY | os.O_TRUNC)
            os.write(fd, b'a' * (1 << 20))
            for step in (lambda: os.write(fd, b'a' * 10), lambda: os.close(fd)):
                try:
                    step(); print('ok')
                except OSError as e:
                    print(errno.errorcode[e.errno])
            """, s + "/Text"])
        #expect(oversized.stdout == "EFBIG\nEINVAL\n", "\(oversized)")
        // The plist is the ground truth: it kept the last good value.
        #expect(Self.dump(store.dataDirectory).contains("Text:string='x'"))
        // setfattr with an unknown type, other xattrs.
        #expect(Run.shell("setfattr -n user.plist.type -v float \(s)/Count").status != 0)
        #expect(Run.shell("setfattr -n user.other -v v \(s)/Count").stderr.contains("Operation not supported"))
        #expect(Run.shell("getfattr -n user.other \(s)/Count").stderr.contains("No such attribute"))
    }

    static let tools: [(String, String)] = [
        ("vim", "vim -es -c '%s/5/6/' -c wq N"),
        ("vim backupcopy=yes", "vim -es -c 'set backupcopy=yes' -c '%s/5/6/' -c wq N"),
        ("emacs", "emacs --batch N --eval '(progn (goto-char (point-min)) (delete-char 1) (insert \"6\") (save-buffer))'"),
        ("sed -i", "sed -i s/5/6/ N"),
        ("perl -pi", "perl -pi -e s/5/6/ N"),
        ("ed", "printf ',s/5/6/\\nw\\nq\\n' | ed -s N"),
        (">", "echo 6 > N"),
        (">>", "printf '' > S && echo 6 >> S && cat S > N"),
        ("tee", "echo 6 | tee N > /dev/null"),
        ("cp", "echo 6 > /tmp/mtmfs-cp-$$ && cp /tmp/mtmfs-cp-$$ N; r=$?; rm -f /tmp/mtmfs-cp-$$; exit $r"),
        ("mv", "echo 6 > /tmp/mtmfs-mv-$$ && mv /tmp/mtmfs-mv-$$ N"),
        ("install", "echo 6 > /tmp/mtmfs-in-$$ && install -m 644 /tmp/mtmfs-in-$$ N; r=$?; rm -f /tmp/mtmfs-in-$$; exit $r"),
        ("truncate", "truncate -s 0 S && echo 6 > N"),
        ("python", "python3 -c \"open('N', 'w').write('6\\\\n')\""),
        ("mv within", "echo 6 > .N.new && mv .N.new N"),
    ]

    @Test(arguments: tools.map(\.0))
    func everyToolSavesAKeyAndLeavesOnlyTheIntendedKeys(tool: String) throws {
        let command = Self.tools.first { $0.0 == tool }!.1
        let store = try MountedStore()
        defer { store.close() }
        let s = store.path("settings")
        #expect(Run.shell("cd \(s) && echo 5 > N && echo text > S").status == 0)
        let result = Run.shell("cd \(s) && \(command)", timeout: 30)
        #expect(result.status == 0, "\(tool): \(result)")
        #expect(Run.shell("cat \(s)/N").stdout == "6\n", "\(tool)")
        let expectedS = tool == "truncate" || tool == ">>" ? "S:string=''" : "S:string='text'"
        let expected = tool == ">>" ? "S:string='6'" : expectedS
        #expect(Self.dump(store.dataDirectory) == "\(Self.defaults) N:integer=6 \(expected)", "\(tool)")
        let listing = Run.shell("ls -A \(s)").stdout
        #expect(!listing.contains(".swp") && !listing.contains("4913"), "\(tool): \(listing)")
        // No editor file reached the data directory.
        #expect(try DataFiles.names(in: store.dataDirectory).sorted() == ["Settings.plist", "cache.sqlite", "device", "mtmfs.lock", "vault"])
    }

    /// A key renamed away (vim's `K~`) or unlinked (mv, install) and recreated keeps its
    /// type and its position; a rename onto a key is validated against that type.
    @Test func recreatedKeysKeepTypeAndPositionAndRenamesAreValidated() throws {
        let store = try MountedStore()
        defer { store.close() }
        let s = store.path("settings")
        #expect(Run.shell("cd \(s) && echo abc > Code && echo 5 > Count && echo last > Tail").status == 0)
        let script = """
            cd \(s)
            vim -es -c '%s/abc/42/' -c wq Code
            echo 7 > /tmp/mtmfs-t-$$ && mv /tmp/mtmfs-t-$$ Count
            echo 8 > /tmp/mtmfs-u-$$ && install /tmp/mtmfs-u-$$ Code; rm -f /tmp/mtmfs-u-$$
            """
        #expect(Run.shell(script).status == 0)
        #expect(Self.dump(store.dataDirectory) == "\(Self.defaults) Code:string='8' Count:integer=7 Tail:string='last'")
        // sed -i with a value that does not fit: the rename onto the key is refused.
        let sed = Run.shell("cd \(s) && sed -i s/7/seven/ Count")
        #expect(sed.status != 0 && sed.stderr.contains("Invalid argument"), "\(sed)")
        #expect(Self.dump(store.dataDirectory) == "\(Self.defaults) Code:string='8' Count:integer=7 Tail:string='last'")
        // vim's backup K~ and swap .K.swp never became keys, and a plain rename of a
        // scratch file onto a key sets it.
        #expect(Run.shell("cd \(s) && echo 9 > .Count.new && mv .Count.new Count && cat Count").stdout == "9\n")
        #expect(Run.shell("ls -A \(s)").stdout == "ActiveServiceAccountUUID\nCode\nCount\nIsFirstRun\nTail\n")
        // RENAME_NOREPLACE onto a key.
        #expect(Run.shell("cd \(s) && echo 1 > .x && mv --no-clobber .x Count; cat Count").stdout == "9\n")
    }

    /// A key renamed onto the name of a hidden key (one an editor moved to `K~`) shows,
    /// and deleting the backup afterwards does not delete it.
    @Test func renameOntoAHiddenKeyKeepsIt() throws {
        let store = try MountedStore()
        defer { store.close() }
        let s = store.path("settings")
        #expect(Run.shell("cd \(s) && echo a > A && echo b > B && mv B B~ && mv A B && rm B~ && cat B").stdout == "a\n")
        // (`B~` made by mv, which exited: a key until its removal a moment after the rm.)
        #expect(Poll.until(seconds: 5) { Self.dump(store.dataDirectory) == "\(Self.defaults) B:string='a'" })
        let nested = Run.shell("mkdir -p \(s)/$(python3 -c 'print(\"d/\" * 520)')")
        #expect(nested.status != 0)
        #expect(Self.dump(store.dataDirectory).hasPrefix(Self.defaults))
    }

    @Test func nanoSavesThroughATerminal() throws {
        let store = try MountedStore()
        defer { store.close() }
        let s = store.path("settings")
        #expect(Run.shell("echo 5 > \(s)/N").status == 0)
        let nano = TerminalSession("nano N", directory: s)
        defer { nano.close() }
        nano.send("C-k", "6", "C-o")
        nano.send("Enter")
        nano.send("C-x")
        #expect(Poll.until(seconds: 5) { Run.shell("cat \(s)/N").stdout == "6\n" })
        #expect(Poll.until(seconds: 5) { !Run.shell("ls -A \(s)").stdout.contains(".N.swp") })
        #expect(Self.dump(store.dataDirectory) == "\(Self.defaults) N:integer=6")
    }

    @Test func anotherProgramsChangeShowsWithinASecond() throws {
        let store = try MountedStore()
        defer { store.close() }
        let s = store.path("settings")
        #expect(Run.shell("cat \(s)/IsFirstRun").stdout == "true\n")  // cached by the kernel now
        let edit = Run.program("python3", ["-c", """
            import plistlib, sys
            p = sys.argv[1]
            with open(p, 'rb') as f: d = plistlib.load(f)
            d['IsFirstRun'] = False; d['Added'] = 'by python'
            with open(p + '.new', 'wb') as f: plistlib.dump(d, f, sort_keys=False)
            import os; os.replace(p + '.new', p)
            """, store.dataDirectory + "/Settings.plist"])
        #expect(edit.status == 0, "\(edit)")
        let start = Date()
        #expect(Poll.until(seconds: 1.0) {
            Run.shell("cat \(s)/IsFirstRun").stdout == "false\n" && Run.shell("cat \(s)/Added").stdout == "by python\n"
        }, "not visible after \(Date().timeIntervalSince(start)) s")
        // A write merges with the other program's change instead of clobbering it.
        #expect(Run.shell("echo 7 > \(s)/Count").status == 0)
        #expect(Self.dump(store.dataDirectory) == "IsFirstRun:bool=False ActiveServiceAccountUUID:string='' Added:string='by python' Count:integer=7")
    }

    @Test func binaryFormatAndKeyOrderAreKept() throws {
        let store = try MountedStore { data in
            #expect(Run.program("python3", ["-c", """
                import plistlib, sys
                d = {'Zeta': 1, 'Alpha': {'b': True, 'a': [1, 'x']}, 'Mid': 'm'}
                open(sys.argv[1], 'wb').write(plistlib.dumps(d, fmt=plistlib.FMT_BINARY, sort_keys=False))
                """, data + "/Settings.plist"]).status == 0)
        }
        defer { store.close() }
        let data = store.dataDirectory
        let s = store.path("settings")
        #expect(Run.shell("ls -f \(s) | grep -v '^\\.'").stdout == "Zeta\nAlpha\nMid\n")
        #expect(Run.shell("ls -f \(s)/Alpha | grep -v '^\\.'").stdout == "b\na\n")
        #expect(Run.shell("ls -f \(s)/Alpha/a | grep -v '^\\.'").stdout == "0\n1\n")
        #expect(Run.shell("cat \(s)/Alpha/a/1").stdout == "x\n")
        #expect(Run.shell("getfattr --only-values -n user.plist.type \(s)/Alpha/a").stdout == "array")
        #expect(Run.shell("cd \(s) && echo 2 > Zeta && echo y > Alpha/a/2 && sed -i s/m/n/ Mid").status == 0)
        let bytes = try Data(contentsOf: URL(fileURLWithPath: data + "/Settings.plist"))
        #expect(bytes.starts(with: Array("bplist00".utf8)))
        #expect(Self.dump(data) == "Zeta:integer=2 Alpha:dict={'b': True, 'a': [1, 'x', 'y']} Mid:string='n'")
    }

    @Test func directoriesDictsAndArrays() throws {
        let store = try MountedStore()
        defer { store.close() }
        let s = store.path("settings")
        #expect(Run.shell("cd \(s) && mkdir Server && echo host > Server/Name && mkdir Server/Ports && setfattr -n user.plist.type -v array Server/Ports && echo 80 > Server/Ports/0 && echo 443 > Server/Ports/1").status == 0)
        #expect(Self.dump(store.dataDirectory) == "\(Self.defaults) Server:dict={'Name': 'host', 'Ports': [80, 443]}")
        #expect(errnoOf { rmdir(s + "/Server") } == ENOTEMPTY)
        // An element leaves a moment after its unlink (SPEC §4), then the later ones renumber.
        #expect(Run.shell("rm \(s)/Server/Ports/0 && ls \(s)/Server/Ports").stdout == "1\n")
        #expect(Poll.until(seconds: 5) { Run.shell("cat \(s)/Server/Ports/0").stdout == "443\n" })
        #expect(Run.shell("rm -r \(s)/Server").status == 0)
        #expect(Poll.until(seconds: 5) { Self.dump(store.dataDirectory) == Self.defaults })
        #expect(Run.shell("mv \(s)/IsFirstRun \(s)/WasFirstRun && cat \(s)/WasFirstRun").stdout == "true\n")
        #expect(Self.dump(store.dataDirectory) == "WasFirstRun:bool=True ActiveServiceAccountUUID:string=''")
        // An editor's name is no directory; a dot name is a key like any other.
        #expect(errnoOf { mkdir(s + "/x~", 0o755) } == EINVAL)
        #expect(errnoOf { mkdir(s + "/.hidden", 0o755) } == 0)
    }

    @Test(arguments: ["random", "truncated", "deep"])
    func damagedPlistGivesEIOAndTheOtherStoresKeepWorking(kind: String) throws {
        var before = Data()
        let store = try MountedStore { data in
            let plist = data + "/Settings.plist"
            switch kind {
            case "random": #expect(Run.shell("head -c 4096 /dev/urandom > \(plist)").status == 0)
            case "truncated": #expect(Run.shell("head -c 100 \(plist) > \(plist).cut && mv \(plist).cut \(plist)").status == 0)
            default: #expect(Run.shell("python3 -c \"print('<plist>' + '<array>' * 100000 + '</array>' * 100000 + '</plist>')\" > \(plist)").status == 0)
            }
            before = try Data(contentsOf: URL(fileURLWithPath: plist))
        }
        defer { store.close() }
        let mnt = store.mountPoint, plist = store.dataDirectory + "/Settings.plist"
        let listing = Run.shell("ls \(mnt)/settings")
        #expect(listing.status != 0 && listing.stderr.contains("Input/output error"), "\(listing)")
        #expect(Run.shell("echo x > \(mnt)/settings/K").stderr.contains("Input/output error"))
        #expect(Run.shell("ls \(mnt)/accounts \(mnt)/cache && cat \(mnt)/.mtmfs/status").status == 0)
        #expect(Run.shell("ls \(mnt)").stdout == "accounts\ncache\nsettings\n")
        #expect(try Data(contentsOf: URL(fileURLWithPath: plist)) == before)
    }

    /// Found by the reliability suite's crash driver: `mv`/`install` from another file system
    /// unlink K and then create it; a kill between the two lost the key. Now an unlinked key
    /// leaves the plist a second later (or at unmount) unless a new K comes first.
    @Test func unlinkedKeyLeavesThePlistLaterAndSurvivesAKillBeforeItsRecreation() throws {
        let store = try MountedStore()
        defer { store.close() }
        let s = store.path("settings")
        #expect(Run.shell("echo kept > \(s)/Key && echo gone > \(s)/Other").status == 0)
        let pid = try #require(Int32(try store.status()["pid"] ?? ""))
        // unlink, then the daemon dies before the new file arrives.
        #expect(Run.shell("rm \(s)/Key && kill -9 \(pid)").status == 0)
        Run.program("fusermount3", ["-uz", store.mountPoint])
        #expect(Self.dump(store.dataDirectory).contains("Key:string='kept'"))
        #expect(Run.mtmfs("mount", "--data-dir", store.dataDirectory, store.mountPoint).status == 0)
        #expect(Run.shell("cat \(s)/Key").stdout == "kept\n")
        // mv from another file system: the value is replaced in place, type and position kept.
        let outside = store.scratch.sub("outside")
        #expect(Run.shell("echo new > \(outside) && mv \(outside) \(s)/Key && cat \(s)/Key").stdout == "new\n")
        #expect(Self.dump(store.dataDirectory) == Self.defaults + " Key:string='new' Other:string='gone'")
        // A plain rm: hidden at once, out of the plist within a second or so.
        #expect(Run.shell("rm \(s)/Other; ls \(s)").stdout == "ActiveServiceAccountUUID\nIsFirstRun\nKey\n")
        #expect(Poll.until(seconds: 5) { !Self.dump(store.dataDirectory).contains("Other") })
        // And at unmount at once.
        #expect(Run.shell("rm \(s)/Key").status == 0)
        #expect(Run.mtmfs("unmount", store.mountPoint).status == 0)
        #expect(Self.dump(store.dataDirectory) == Self.defaults)
    }

    @Test func killDuringABurstOfWritesLeavesAValidPlist() throws {
        let store = try MountedStore()
        defer { store.close() }
        let s = store.path("settings")
        let pid = try #require(Int32(try store.status()["pid"] ?? ""))
        let writer = Run.program("/bin/sh", ["-c", "(i=0; while [ $i -lt 100000 ]; do echo $i > \(s)/Counter 2>/dev/null || exit 0; echo \"v$i\" > \(s)/Text$((i % 5)) 2>/dev/null || exit 0; i=$((i+1)); done) & sleep 0.5; kill -9 \(pid); wait"], timeout: 30)
        #expect(writer.status == 0, "\(writer)")
        let dump = Self.dump(store.dataDirectory)
        #expect(dump.hasPrefix(Self.defaults) && dump.contains("Counter:integer="), "\(dump)")
        // The next mount clears a temporary file the killed daemon may have left.
        Run.program("fusermount3", ["-uz", store.mountPoint])
        #expect(Run.mtmfs("mount", "--data-dir", store.dataDirectory, store.mountPoint).status == 0)
        #expect(Poll.until(seconds: 2) {
            (try? DataFiles.names(in: store.dataDirectory).sorted()) == ["Settings.plist", "cache.sqlite", "device", "mtmfs.lock", "vault"]
        })
    }
}

enum DataFiles {
    /// The files of a data directory, less the companions of the open cache database
    /// (SQLite's -wal and -shm, and the folder of large files' data) and the daemon's log.
    static func names(in path: String) throws -> [String] {
        try FileManager.default.contentsOfDirectory(atPath: path)
            .filter { !["cache.sqlite-wal", "cache.sqlite-shm", "cache.data", "mtmfs.log", "mtmfs.log.1"].contains($0) }
    }
}

extension SettingsTests {
    /// SPEC §7: no request waits on another's disk sync. A save's two fsyncs (the file's and
    /// its directory's) happen with the tree's lock let go: with each fsync of the daemon
    /// slowed to 1.5 s (strace's fault injection), reads of other keys answer at once while
    /// the save waits for its syncs.
    @Test func readsAnswerWhileASaveSyncs() throws {
        let store = try MountedStore()
        defer { store.close() }
        let pid = try #require(try store.status()["pid"])
        let run = Run.program("python3", ["-c", """
            import os, sys, time, subprocess, threading
            mnt, daemon = sys.argv[1:3]
            tracer = subprocess.Popen(["strace", "-f", "-e", "trace=fsync", "-e", "inject=fsync:delay_enter=1500000",
                                       "-p", daemon], stderr=subprocess.PIPE, text=True, start_new_session=True)
            line = tracer.stderr.readline()               # "attached" once it is in place
            time.sleep(0.5)
            took = {}
            def save():
                start = time.time()
                with open(os.path.join(mnt, "settings", "Note"), "w") as f: f.write("saved slowly\\n")
                took["save"] = time.time() - start
            writer = threading.Thread(target=save); writer.start()
            time.sleep(0.5)                               # the save is in its first fsync
            start = time.time()
            with open(os.path.join(mnt, "settings", "IsFirstRun")) as f: f.read()
            os.listdir(os.path.join(mnt, "settings"))
            took["read"] = time.time() - start
            writer.join()
            tracer.kill(); tracer.wait()
            print("%s save %.2f read %.2f" % (line.strip().split()[0] if line else "-", took["save"], took["read"]))
            """, store.mountPoint, pid], timeout: 60)
        try #require(run.status == 0, "\(run)")
        let numbers = run.stdout.split(separator: " ").compactMap { Double($0.trimmingCharacters(in: .whitespacesAndNewlines)) }
        try #require(numbers.count == 2, "\(run)")
        #expect(numbers[0] >= 2.5, "the syncs were not slowed: \(run.stdout)")
        #expect(numbers[1] < 1, "a read waited for the save's syncs: \(run.stdout)")
        #expect(Run.program("cat", [store.path("settings/Note")]).stdout == "saved slowly\n")
    }
}
