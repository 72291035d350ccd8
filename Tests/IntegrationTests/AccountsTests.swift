import Foundation
import TestSupport
import Testing
#if canImport(Glibc)
import Glibc
#endif

/// `accounts/` and lock/unlock through a real mount (SPEC §1–§3).
@Suite(.enabled(if: FuseAvailability.isAvailable, "needs /dev/fuse")) struct AccountsTests {
    static let uuid = "6ba7b810-9dad-11d1-80b4-00c04fd430c8"

    /// A store, mounted and unlocked, with one account.
    func unlockedStore(options: [String] = []) throws -> MountedStore {
        let store = try MountedStore(options: options)
        do {
            let unlock = Run.mtmfs("unlock", store.mountPoint, input: Run.passphrase + "\n")
            try #require(unlock.status == 0, "\(unlock)")
            try #require(mkdir(store.path("accounts/\(Self.uuid)"), 0o700) == 0)
        } catch {
            store.close()  // a failed set-up leaves no mount behind
            throw error
        }
        return store
    }

    @Test func fieldsRoundTripThroughShellVimAndSed() throws {
        let store = try unlockedStore()
        defer { store.close() }
        let a = store.path("accounts/\(Self.uuid)")
        // The fields in their order (`trusted` only while guarding is on: GuardTests; `totp` while `otp` is set).
        #expect(Run.shell("ls -f \(a) | grep -v '^\\.'").stdout == "label\nprotocol\nserver\nport\npath\ncomment\nusername\npassword\notp\nurl\nattributes\n")
        for field in ["label", "comment", "username", "password"] {
            #expect(Run.shell("echo 'value of \(field)' > \(a)/\(field)").status == 0)
            #expect(Run.shell("cat \(a)/\(field)").stdout == "value of \(field)\n")
            #expect(Run.shell("v=$(cat \(a)/\(field)); [ \"$v\" = 'value of \(field)' ]").status == 0)
        }
        #expect(Run.shell("vim -es -c '%s/of password/changed/' -c wq \(a)/password").status == 0)
        #expect(Run.shell("cat \(a)/password").stdout == "value changed\n")
        #expect(Run.shell("sed -i s/changed/again/ \(a)/password && cat \(a)/password").stdout == "value again\n")
        #expect(Run.shell("ls -A \(a)").stdout.split(separator: "\n").count == 11, "editor files left behind")
        // url: composed on read, parsed on write.
        #expect(Run.shell("echo https://mail.example.com:8443/dav > \(a)/url").status == 0)
        #expect(Run.shell("cat \(a)/protocol \(a)/server \(a)/port \(a)/path").stdout == "https\nmail.example.com\n8443\n/dav\n")
        #expect(Run.shell("echo 993 > \(a)/port && cat \(a)/url").stdout == "https://mail.example.com:993/dav\n")
        #expect(Run.shell("echo '[::1]' > \(a)/server && cat \(a)/url").stdout == "https://[::1]:993/dav\n")
    }

    /// Readers are served from the kernel's pages of a field: a read right after a change —
    /// by a write, an editor's rename, or a write of `url` that changes four other fields —
    /// gives the new value every time, never the cached one.
    @Test func readsRightAfterChangesAreFresh() throws {
        let store = try unlockedStore()
        defer { store.close() }
        let a = store.path("accounts/\(Self.uuid)")
        let script = """
            set -e
            for i in $(seq 20); do
              cat "$1/password" "$1/server" "$1/port" > /dev/null
              echo "secret-$i" > "$1/password"; test "$(cat "$1/password")" = "secret-$i"
              echo "https://host$i.example.org:$((8000 + i))/p$i" > "$1/url"
              test "$(cat "$1/server")" = "host$i.example.org"; test "$(cat "$1/port")" = "$((8000 + i))"
              sed -i "s/secret-$i/edited-$i/" "$1/password"; test "$(cat "$1/password")" = "edited-$i"
            done
            echo fresh
            """
        let result = Run.program("/bin/sh", ["-c", script, "sh", a])
        #expect(result.stdout == "fresh\n", "\(result)")
    }

    /// Every field through echo/cat, vim, sed -i; emacs and nano on the password.
    @Test func everyFieldThroughEveryEditor() throws {
        let store = try unlockedStore()
        defer { store.close() }
        let a = store.path("accounts/\(Self.uuid)")
        let values = [("label", "Work", "Home"), ("protocol", "https", "imaps"), ("server", "a.example", "b.example"),
                      ("port", "443", "993"), ("path", "/one", "/two"), ("comment", "note", "memo"),
                      ("username", "alice", "bob"), ("password", "first-secret", "second-secret")]
        for (field, first, second) in values {
            #expect(Run.shell("echo \(first) > \(a)/\(field) && cat \(a)/\(field)").stdout == "\(first)\n", "\(field)")
            #expect(Run.shell("vim -es -c '%s/\(first.replacingOccurrences(of: "/", with: "\\/"))/\(second.replacingOccurrences(of: "/", with: "\\/"))/' -c wq \(a)/\(field)").status == 0, "\(field)")
            #expect(Run.shell("cat \(a)/\(field)").stdout == "\(second)\n", "vim \(field)")
            #expect(Run.shell("sed -i 's|\(second)|\(first)|' \(a)/\(field) && cat \(a)/\(field)").stdout == "\(first)\n", "sed \(field)")
        }
        #expect(Run.shell("cat \(a)/url").stdout == "https://a.example:443/one\n")
        let emacs = Run.shell("emacs --batch \(a)/password --eval '(progn (goto-char (point-min)) (insert \"x\") (save-buffer))'", timeout: 30)
        #expect(emacs.status == 0, "\(emacs)")
        #expect(Run.shell("cat \(a)/password").stdout == "xfirst-secret\n")
        let nano = TerminalSession("nano \(a)/password")
        defer { nano.close() }
        nano.send("C-k", "nano-secret", "C-o")
        nano.send("Enter")
        nano.send("C-x")
        #expect(Poll.until(seconds: 5) { Run.shell("cat \(a)/password").stdout == "nano-secret\n" })
        #expect(Poll.until(seconds: 5) { Run.shell("ls -A \(a)").stdout.split(separator: "\n").count == 11 },
                "\(Run.shell("ls -A \(a)").stdout)")
        for needle in ["first-secret", "second-secret", "nano-secret"] {
            #expect(Run.shell("grep -r -a -l -F '\(needle)' \(store.dataDirectory)").stdout.isEmpty, "\(needle) on disk")
        }
    }

    /// After a lock no plaintext is left in the daemon, no mapping can show a field, and
    /// the passphrase prompt does not echo; the log holds no secret; others are refused.
    @Test func lockLeavesNoPlaintextAnywhere() throws {
        let scratch = Scratch()
        defer { scratch.remove() }
        let (data, mnt) = scratch.initializedStore()
        // A foreground daemon, its log captured.
        let log = scratch.sub("log")
        let start = Run.program("/bin/sh", ["-c", "\"$0\" mount -f --data-dir \"$1\" \"$2\" >\"$3\" 2>&1 & echo $!", Run.mtmfs, data, mnt, log])
        let pid = try #require(Int32(start.stdout.trimmingCharacters(in: .whitespacesAndNewlines)))
        defer { Run.mtmfs("unmount", mnt) }
        #expect(Poll.until { FileManager.default.fileExists(atPath: mnt + "/accounts") })
        // The terminal prompt does not echo the passphrase.
        let first = TerminalSession("\(Run.mtmfs) unlock \(mnt); sleep 5")
        defer { first.close() }
        first.send("wrong guess", "Enter")
        #expect(Poll.until(seconds: 5) { first.screen.contains("wrong passphrase") })
        let second = TerminalSession("\(Run.mtmfs) unlock \(mnt); sleep 5")
        defer { second.close() }
        second.send(Run.passphrase, "Enter")
        #expect(Poll.until(seconds: 5) { second.screen.contains("Unlocked") })
        let screen = second.screen
        #expect(screen.contains("Passphrase for") && !screen.contains(Run.passphrase), "\(screen)")
        let a = mnt + "/accounts/" + Self.uuid
        #expect(mkdir(a, 0o700) == 0)
        #expect(Run.shell("echo ZXQSECRETVALUE77 > \(a)/password && cat \(a)/password > /dev/null").status == 0)
        // While unlocked the kernel may keep a field's pages; a lock drops them: a mapping and
        // a descriptor made before it read nothing after it (SIGBUS, EACCES). Run after the lock below.
        let mapper = Run.program("/bin/sh", ["-c", """
            python3 -c '
            import mmap, os, subprocess, sys
            fd = os.open(sys.argv[1], os.O_RDONLY)
            m = mmap.mmap(fd, 0, prot=mmap.PROT_READ)
            print("mapped", m[:16].decode(), flush=True)
            print("read", os.pread(fd, 100, 0).decode().strip(), flush=True)
            subprocess.run([sys.argv[2], "lock", sys.argv[3]], check=True)
            try:
                print("after lock read", os.pread(fd, 100, 0), flush=True)
            except OSError as error:
                print("after lock read refused:", error.strerror, flush=True)
            print("after lock mapped", m[:16], flush=True)
            ' "$0" "$1" "$2"; echo "exit $?"
            """, a + "/password", Run.mtmfs, mnt])
        // After the lock the descriptor is refused, and touching the mapping kills the
        // reader with SIGBUS (exit 128 + 7).
        let lines = mapper.stdout.split(separator: "\n").map(String.init)
        #expect(lines.count == 4 && lines[0] == "mapped ZXQSECRETVALUE77" && lines[1] == "read ZXQSECRETVALUE77", "\(mapper)")
        #expect(lines.count > 2 && lines[2] == "after lock read refused: Permission denied", "\(mapper)")
        #expect(lines.last == "exit 135", "\(mapper)")
        #expect(Run.shell("\(Run.mtmfs) unlock --passphrase-file /dev/stdin \(mnt)", input: Run.passphrase + "\n").status == 0)
        // Another user cannot even list the mount.
        let other = Run.program("setpriv", ["--reuid", "65534", "--regid", "65534", "--clear-groups", "ls", mnt + "/accounts"])
        #expect(other.status != 0 && other.stderr.contains("Permission denied"), "\(other)")
        #expect(Run.mtmfs("lock", mnt).status == 0)
        let scan = Run.program("python3", ["-c", """
            import re, sys
            pid = int(sys.argv[1]); hits = []
            for line in open(f'/proc/{pid}/maps'):
                m = re.match(r'([0-9a-f]+)-([0-9a-f]+) (\\S+)', line)
                if 'r' not in m[3]: continue
                try:
                    with open(f'/proc/{pid}/mem', 'rb') as f:
                        f.seek(int(m[1], 16)); data = f.read(int(m[2], 16) - int(m[1], 16))
                except Exception: continue
                for needle in (b'ZXQSECRETVALUE77', sys.argv[2].encode()):
                    if needle in data: hits.append((line.strip(), needle))
            print(hits)
            """, "\(pid)", Run.passphrase])
        #expect(scan.stdout.trimmingCharacters(in: .whitespacesAndNewlines) == "[]", "plaintext left in the daemon: \(scan)")
        let logText = try String(contentsOfFile: log, encoding: .utf8)
        #expect(logText.contains("unlock refused") && logText.contains("accounts locked"), "\(logText)")
        #expect(!logText.contains(Run.passphrase) && !logText.contains("ZXQSECRETVALUE77") && !logText.contains("wrong guess"))
    }

    /// With `-o allow_other` other users get in, but permission checks stay on and the
    /// account directories and secret files are the owner's only.
    @Test func allowOtherKeepsSecretsPrivate() throws {
        let store = try unlockedStore(options: ["-o", "allow_other"])
        defer { store.close() }
        chmod(store.scratch.path, 0o755)
        let a = store.path("accounts/\(Self.uuid)")
        #expect(Run.shell("echo hidden-from-others > \(a)/password && stat -c %a \(a)/password \(a) \(store.path("accounts"))").stdout == "600\n700\n700\n")
        func asNobody(_ command: [String]) -> CommandResult {
            Run.program("setpriv", ["--reuid", "65534", "--regid", "65534", "--clear-groups"] + command)
        }
        #expect(asNobody(["ls", store.mountPoint]).status == 0)
        #expect(asNobody(["cat", store.path("settings/IsFirstRun")]).stdout == "true\n")
        let denied = asNobody(["cat", a + "/password"])
        #expect(denied.status != 0 && denied.stderr.contains("Permission denied"), "\(denied)")
        #expect(asNobody(["ls", store.path("accounts")]).stderr.contains("Permission denied"))
    }

    @Test func badInputGetsItsErrorAndChangesNothing() throws {
        let store = try unlockedStore()
        defer { store.close() }
        let a = store.path("accounts/\(Self.uuid)")
        #expect(Run.shell("echo https://h.example/p > \(a)/url").status == 0)
        let vault = try FileManager.default.subpathsOfDirectory(atPath: store.dataDirectory + "/vault").sorted()
        for (field, value) in [("url", "not a url"), ("url", "https://bad host/"), ("url", "1http://h/"), ("url", "https://h:99999/"),
                               ("url", "https://h:0/"), ("protocol", "ht tp"), ("server", "-bad-.example"), ("port", "65536"),
                               ("port", "080"), ("port", "x"), ("path", "no-slash")] {
            let fd = open("\(a)/\(field)", O_WRONLY | O_TRUNC | O_CLOEXEC)
            #expect(fd >= 0)
            let bytes = Array((value + "\n").utf8)
            #expect(errnoOf { Int32(Glibc.write(fd, bytes, bytes.count)) } == EINVAL, "\(field) = \(value)")
            close(fd)
        }
        #expect(try FileManager.default.subpathsOfDirectory(atPath: store.dataDirectory + "/vault").sorted() == vault, "a change file was written")
        #expect(Run.shell("cat \(a)/url").stdout == "https://h.example/p\n")
        // Over 64 KiB: EFBIG.
        let fd = open("\(a)/comment", O_WRONLY | O_TRUNC | O_CLOEXEC)
        let chunk = [UInt8](repeating: 0x61, count: 70_000)
        #expect(errnoOf { Int32(Glibc.write(fd, chunk, chunk.count)) } == EFBIG)
        close(fd)
        #expect(Run.shell("cat \(a)/comment").stdout == "\n")
        // Account names.
        let accounts = store.path("accounts")
        #expect(errnoOf { mkdir(accounts + "/not-a-uuid", 0o700) } == EINVAL)
        #expect(errnoOf { mkdir(accounts + "/" + Self.uuid.uppercased(), 0o700) } == EEXIST)
        let upper = "F47AC10B-58CC-4372-A567-0E02B2C3D479"
        #expect(mkdir(accounts + "/" + upper, 0o700) == 0)
        #expect(Run.shell("ls \(accounts)").stdout == "\(Self.uuid)\n\(upper)\nby-label\nby-server\n")
        #expect(errnoOf { open(accounts + "/file", O_CREAT | O_WRONLY, 0o600) } == EACCES)
        #expect(Run.shell("rm -r \(accounts)/\(upper) && ls \(accounts)").stdout == "\(Self.uuid)\nby-label\nby-server\n")
    }

    @Test func lockedAccountsListButNothingElse() throws {
        let store = try unlockedStore()
        defer { store.close() }
        let a = store.path("accounts/\(Self.uuid)")
        #expect(Run.shell("echo topsecret > \(a)/password").status == 0)
        let held = open("\(a)/password", O_RDONLY | O_CLOEXEC)
        #expect(held >= 0)
        #expect(Run.mtmfs("lock", store.mountPoint).status == 0)
        #expect(try store.status()["state"] == "locked")
        // Listing works; sizes are 0; every read, write, mkdir and rmdir is EACCES.
        #expect(Run.shell("ls \(store.path("accounts"))").stdout == "\(Self.uuid)\nby-label\nby-server\n")
        #expect(Run.shell("stat -c %s \(a)/password \(a)/username").stdout == "0\n0\n")
        var buffer = [UInt8](repeating: 0, count: 64)
        #expect(errnoOf { Int32(Glibc.read(held, &buffer, 64)) } == EACCES, "a descriptor opened before lock")
        close(held)
        #expect(errnoOf { open("\(a)/password", O_RDONLY) } == EACCES)
        #expect(errnoOf { open("\(a)/label", O_WRONLY) } == EACCES)
        #expect(errnoOf { mkdir(store.path("accounts/f47ac10b-58cc-4372-a567-0e02b2c3d479"), 0o700) } == EACCES)
        #expect(errnoOf { rmdir(a) } == EACCES)
        // settings/ and cache/ are not behind the lock.
        #expect(Run.shell("cat \(store.path("settings/IsFirstRun"))").stdout == "true\n")
        #expect(Run.mtmfs("unlock", store.mountPoint, input: Run.passphrase + "\n").status == 0)
        // Field sizes are cached while unlocked (1 s): unlock and every write drop them.
        #expect(Run.shell("stat -c %s \(a)/password \(a)/username").stdout == "10\n1\n")
        #expect(Run.shell("cat \(a)/password").stdout == "topsecret\n")
        #expect(Run.shell("printf abc > \(a)/username && stat -c %s \(a)/username && cat \(a)/username").stdout == "4\nabc\n")
    }

    /// Review findings: rmdir of an account with values is ENOTEMPTY; a write pending when
    /// the lock comes is refused at close, and the descriptor stays refused after unlock.
    @Test func rmdirKeepsValuesAndLockRefusesOldDescriptors() throws {
        let store = try unlockedStore()
        defer { store.close() }
        let a = store.path("accounts/\(Self.uuid)")
        #expect(Run.shell("echo keep > \(a)/password").status == 0)
        #expect(errnoOf { rmdir(a) } == ENOTEMPTY)
        // One single-threaded process holds the descriptor: in this (parallel, spawning)
        // test process any exec elsewhere would close a copy and flush it early.
        let sequence = Run.program("python3", ["-c", """
            import os, sys, errno
            fd = os.open(sys.argv[1], os.O_WRONLY | os.O_TRUNC)
            os.write(fd, b'new\\n')
            with open(sys.argv[2], 'w') as lock: lock.write('lock\\n')
            try:
                os.close(fd); print('closed')
            except OSError as e:
                print(errno.errorcode[e.errno])
            """, a + "/password", store.path(".mtmfs/lock")])
        #expect(sequence.stdout == "EACCES\n", "\(sequence)")
        #expect(Run.mtmfs("unlock", store.mountPoint, input: Run.passphrase + "\n").status == 0)
        #expect(Run.shell("cat \(a)/password").stdout == "keep\n")
        let reader = open(a + "/password", O_RDONLY | O_CLOEXEC)
        #expect(Run.mtmfs("lock", store.mountPoint).status == 0)
        #expect(Run.mtmfs("unlock", store.mountPoint, input: Run.passphrase + "\n").status == 0)
        var buffer = [UInt8](repeating: 0, count: 16)
        #expect(errnoOf { Int32(Glibc.read(reader, &buffer, 16)) } == EACCES, "a descriptor from before a lock")
        close(reader)
        #expect(Run.shell("rm -r \(a) && ls \(store.path("accounts"))").stdout == "by-label\nby-server\n")
    }

    /// On a terminal a step over half a second says it is working (moderate KDF: ~0.5 s).
    @Test func slowStepsSayTheyAreWorking() throws {
        let scratch = Scratch()
        defer { scratch.remove() }
        let session = TerminalSession("\(Run.mtmfs) init --data-dir \(scratch.sub("data")) --kdf sensitive; sleep 10")
        defer { session.close() }
        session.send("long enough phrase", "Enter")
        #expect(session.screen.contains("Repeat the passphrase"), "\(session.screen)")
        session.send("long enough phrase", "Enter")
        #expect(Poll.until(seconds: 15) { session.screen.contains("deriving the key") }, "\(session.screen)")
        #expect(Poll.until(seconds: 15) { session.screen.contains("Initialized an mtmfs store") })
        #expect(!session.screen.contains("long enough phrase"))
    }

    @Test func unlockPathsAndWrongPassphrase() throws {
        let store = try MountedStore()
        defer { store.close() }
        let wrong = Run.mtmfs("unlock", store.mountPoint, input: "not it\n")
        #expect(wrong.status == 1 && wrong.stderr.contains("wrong passphrase"), "\(wrong)")
        let control = open(store.path(".mtmfs/unlock"), O_WRONLY | O_CLOEXEC)
        #expect(errnoOf { Int32(Glibc.write(control, "not it\n", 7)) } == EACCES)
        close(control)
        #expect(errnoOf { open(store.path(".mtmfs/unlock"), O_RDONLY) } == EACCES)
        #expect(try store.status()["state"] == "locked")
        try (Run.passphrase + "\n").write(toFile: store.scratch.sub("pass"), atomically: true, encoding: .utf8)
        let fromFile = Run.mtmfs("unlock", "--passphrase-file", store.scratch.sub("pass"), store.mountPoint)
        #expect(fromFile.status == 0, "\(fromFile)")
        #expect(try store.status()["state"] == "unlocked")
        // While unlocked, `mtmfs unlock` asks for nothing, and a wrong passphrase written to
        // the control file is refused and changes nothing.
        let again = Run.mtmfs("unlock", store.mountPoint, input: "not it\n")
        #expect(again.status == 0 && again.stdout.contains("already unlocked"), "\(again)")
        let unlockedControl = open(store.path(".mtmfs/unlock"), O_WRONLY | O_CLOEXEC)
        #expect(errnoOf { Int32(Glibc.write(unlockedControl, "not it\n", 7)) } == EACCES)
        close(unlockedControl)
        #expect(try store.status()["state"] == "unlocked")
        // mount --unlock asks at once.
        let unmounted = Run.mtmfs("unmount", store.mountPoint)
        #expect(unmounted.status == 0, "\(unmounted)")
        let mounted = Run.program(Run.mtmfs, ["mount", "--unlock", "--data-dir", store.dataDirectory, store.mountPoint],
                                  input: Run.passphrase + "\n")
        #expect(mounted.status == 0, "\(mounted)")
        #expect(try store.status()["state"] == "unlocked")
    }

    @Test func autoLockAndSIGUSR1() throws {
        let store = try unlockedStore(options: ["--auto-lock", "1"])
        defer { store.close() }
        #expect(Run.shell("echo s > \(store.path("accounts/\(Self.uuid)/password"))").status == 0)
        let status = try store.status()
        #expect(status["state"] == "unlocked" && Int(status["auto_lock_in"] ?? "") ?? 99 <= 1, "\(status)")
        #expect(Poll.until(seconds: 3) { (try? store.status()["state"]) == "locked" }, "auto-lock did not fire")
        #expect(Run.mtmfs("unlock", store.mountPoint, input: Run.passphrase + "\n").status == 0)
        let pid = try #require(Int32(try store.status()["pid"] ?? ""))
        kill(pid, SIGUSR1)
        #expect(Poll.until(seconds: 2) { (try? store.status()["state"]) == "locked" }, "SIGUSR1 did not lock")
        // The daemon writes no core file.
        let limits = try String(contentsOfFile: "/proc/\(pid)/limits", encoding: .utf8)
        #expect(limits.split(separator: "\n").contains { $0.hasPrefix("Max core file size") && $0.contains(" 0 ") }, "\(limits)")
    }

    @Test func activeLinkAndSettingAreOneValue() throws {
        let store = try unlockedStore()
        defer { store.close() }
        let setting = store.path("settings/ActiveServiceAccountUUID")
        #expect(errnoOf { unlink(store.path("accounts/active")) } == ENOENT)
        #expect(Run.shell("ln -s \(Self.uuid) \(store.path("accounts/active")) && cat \(setting)").stdout == "\(Self.uuid)\n")
        #expect(Run.shell("echo F47AC10B-58CC-4372-A567-0E02B2C3D479 > \(setting) && readlink \(store.path("accounts/active"))").stdout
                == "F47AC10B-58CC-4372-A567-0E02B2C3D479\n")
        #expect(Run.shell("ln -sfn \(Self.uuid) \(store.path("accounts/active")) && cat \(setting)").stdout == "\(Self.uuid)\n")
        #expect(Run.shell("cat \(store.path("accounts/active/username"))").status == 0)
        #expect(Run.shell("rm \(store.path("accounts/active")) && cat \(setting)").stdout == "\n")
    }

    @Test func nothingSecretReachesAnyFileAndPasswdRewraps() throws {
        let store = try unlockedStore()
        let a = store.path("accounts/\(Self.uuid)")
        let secrets = ["Sup3rSecretPassw0rd", "alice.secret@example.com", "secret-host.example.com", "Private Label Text"]
        #expect(Run.shell("cd \(a) && echo \(secrets[0]) > password && echo \(secrets[1]) > username && echo https://\(secrets[2])/x > url && echo '\(secrets[3])' > label && vim -es -c '%s/Text/Text/' -c wq label && sed -i 's/x/y/' path").status == 0)
        #expect(Run.mtmfs("lock", store.mountPoint).status == 0)
        #expect(Run.mtmfs("unmount", store.mountPoint).status == 0)
        defer { store.close() }
        func grepData(_ needle: String) -> Bool {
            Run.shell("grep -r -a -l -F '\(needle)' \(store.dataDirectory)").stdout.isEmpty == false
        }
        for needle in secrets + [Run.passphrase] { #expect(!grepData(needle), "\(needle) found in the data directory") }
        // passwd: the old passphrase stops working, the new one opens the same accounts.
        try "\(Run.passphrase)\n".write(toFile: store.scratch.sub("old"), atomically: true, encoding: .utf8)
        try "brand new phrase\n".write(toFile: store.scratch.sub("new"), atomically: true, encoding: .utf8)
        let passwd = Run.mtmfs("passwd", "--data-dir", store.dataDirectory, "--kdf", "interactive",
                               "--passphrase-file", store.scratch.sub("old"), "--new-passphrase-file", store.scratch.sub("new"))
        #expect(passwd.status == 0, "\(passwd)")
        #expect(!grepData("brand new phrase"))
        #expect(Run.mtmfs("mount", "--data-dir", store.dataDirectory, store.mountPoint).status == 0)
        #expect(Run.mtmfs("unlock", store.mountPoint, input: Run.passphrase + "\n").status == 1)
        #expect(Run.mtmfs("unlock", store.mountPoint, input: "brand new phrase\n").status == 0)
        #expect(Run.shell("cat \(a)/password").stdout == "\(secrets[0])\n")
    }

    @Test(arguments: ["flip", "truncate", "garbage"])
    func damagedVaultGivesEIOAndTheOtherStoresWork(kind: String) throws {
        var before = Data()
        let store = try MountedStore { data in
            let vault = data + "/vault/id"  // what names the folder: without it, nothing opens
            switch kind {
            case "flip":
                // Every bit of byte 10 inverted (no longer a hex digit).
                let flip = "f = open(sys.argv[1], 'r+b'); f.seek(10); b = f.read(1)[0]; f.seek(10); f.write(bytes([b ^ 0xFF]))"
                #expect(Run.program("python3", ["-c", "import sys; " + flip, vault]).status == 0)
            case "truncate": #expect(Run.shell("truncate -s 100 \(vault)").status == 0)
            default: #expect(Run.shell("head -c 300 /dev/urandom > \(vault)").status == 0)
            }
            before = try Data(contentsOf: URL(fileURLWithPath: vault))
        }
        defer { store.close() }
        let mnt = store.mountPoint, vault = store.dataDirectory + "/vault/id"
        let listing = Run.shell("ls \(mnt)/accounts")
        #expect(listing.status != 0 && listing.stderr.contains("Input/output error"), "\(listing)")
        let status = try String(contentsOfFile: mnt + "/.mtmfs/status", encoding: .utf8)
        #expect(status.contains("vault_error=vault damaged: "), "\(status)")
        let unlock = Run.mtmfs("unlock", mnt, input: Run.passphrase + "\n")
        #expect(unlock.status == 1 && unlock.stderr.contains("damaged"), "\(unlock)")
        #expect(Run.shell("echo 1 > \(mnt)/settings/K && cat \(mnt)/settings/K").stdout == "1\n")
        #expect(try Data(contentsOf: URL(fileURLWithPath: vault)) == before)
    }

    @Test func killDuringWritesLeavesAVaultThatOpens() throws {
        let store = try unlockedStore()
        defer { store.close() }
        let a = store.path("accounts/\(Self.uuid)")
        let pid = try #require(Int32(try store.status()["pid"] ?? ""))
        let writer = Run.program("/bin/sh", ["-c", "(i=0; while [ $i -lt 100000 ]; do echo pw$i > \(a)/password 2>/dev/null || exit 0; i=$((i+1)); done) & sleep 0.5; kill -9 \(pid); wait"], timeout: 30)
        #expect(writer.status == 0)
        Run.program("fusermount3", ["-uz", store.mountPoint])
        #expect(Run.mtmfs("mount", "--unlock", "--data-dir", store.dataDirectory, store.mountPoint, input: Run.passphrase + "\n").status == 0)
        #expect(Run.shell("cat \(a)/password").stdout.hasPrefix("pw"))
    }

    /// Found by mtmfs-reliability: a vault save cut short by a kill left its temporary file
    /// for good. A mount sweeps those of dead processes (also when the pid now belongs to
    /// another program) and keeps the vault itself.
    @Test func mountSweepsTemporariesOfKilledSaves() throws {
        let leftovers = [".vault.tmp-999999-0-1", ".vault.tmp-1-0-2"]  // no such pid; pid 1 is not mtmfs
        let store = try MountedStore { data in
            for name in leftovers {
                #expect(FileManager.default.createFile(atPath: data + "/" + name, contents: Data(repeating: 7, count: 300)))
            }
        }
        defer { store.close() }
        let names = try FileManager.default.contentsOfDirectory(atPath: store.dataDirectory)
        #expect(names.filter { $0.hasPrefix(".vault.tmp-") }.isEmpty, "\(names)")
        #expect(names.contains("vault"))
        #expect(Run.mtmfs("unlock", store.mountPoint, input: Run.passphrase + "\n").status == 0)
    }

    /// A field's save writes and syncs its vault file after the tree's lock is let go
    /// (SPEC §7): with every fsync of the daemon slowed by 1.5 s (strace), a read of
    /// another field and a listing answer meanwhile.
    @Test func readsAnswerWhileAFieldSaveSyncs() throws {
        let store = try unlockedStore()
        defer { store.close() }
        let pid = try #require(try store.status()["pid"])
        let account = store.path("accounts/\(Self.uuid)")
        #expect(writeText(account + "/username", "ann\n") == 0)
        let run = Run.program("python3", ["-c", """
            import os, sys, time, subprocess, threading
            account, daemon = sys.argv[1:3]
            tracer = subprocess.Popen(["strace", "-f", "-e", "trace=fsync", "-e", "inject=fsync:delay_enter=1500000",
                                       "-p", daemon], stderr=subprocess.PIPE, text=True, start_new_session=True)
            line = tracer.stderr.readline()
            time.sleep(0.5)
            took = {}
            def save():
                start = time.time()
                with open(os.path.join(account, "password"), "w") as f: f.write("saved slowly\\n")
                took["save"] = time.time() - start
            writer = threading.Thread(target=save); writer.start()
            time.sleep(0.5)
            start = time.time()
            with open(os.path.join(account, "username")) as f: f.read()
            os.listdir(account); os.listdir(os.path.dirname(account))
            took["read"] = time.time() - start
            writer.join()
            tracer.kill(); tracer.wait()
            print("%s save %.2f read %.2f" % (line.strip().split()[0] if line else "-", took["save"], took["read"]))
            """, account, pid], timeout: 60)
        try #require(run.status == 0, "\(run)")
        let numbers = run.stdout.split(separator: " ").compactMap { Double($0.trimmingCharacters(in: .whitespacesAndNewlines)) }
        try #require(numbers.count == 2, "\(run)")
        #expect(numbers[0] >= 1.5, "the syncs were not slowed: \(run.stdout)")
        #expect(numbers[1] < 1, "a read waited for the save's syncs: \(run.stdout)")
        #expect(Run.program("cat", [account + "/password"]).stdout == "saved slowly\n")
    }

    /// Every save is a new file in the vault folder; the daemon folds its own files (in
    /// the background) so that 300 saves leave a folder of a few files, every value kept.
    @Test func manySavesAreFoldedInTheBackground() throws {
        let store = try unlockedStore()
        defer { store.close() }
        let account = store.path("accounts/\(Self.uuid)")
        #expect(writeText(account + "/username", "ann\n") == 0)
        for round in 0..<300 {
            try #require(writeText(account + "/password", "round \(round)\n") == 0)
        }
        func changeFiles() -> [String] {
            ((try? FileManager.default.subpathsOfDirectory(atPath: store.dataDirectory + "/vault")) ?? []).filter { $0.hasSuffix(".mtv") }
        }
        var waited = 0
        while changeFiles().count > 66 && waited < 100 {
            usleep(50_000)
            waited += 1
        }
        #expect(changeFiles().count <= 66, "\(changeFiles().count) files after 300 saves")
        #expect(Run.program("cat", [account + "/password", account + "/username"]).stdout == "round 299\nann\n")
        #expect(Run.mtmfs("lock", store.mountPoint).status == 0)
        #expect(Run.mtmfs("unlock", store.mountPoint, input: Run.passphrase + "\n").status == 0)
        #expect(Run.program("cat", [account + "/password", account + "/username"]).stdout == "round 299\nann\n")
    }

    /// Change files brought into a mounted vault folder (as Syncthing does: a temporary
    /// name, then a rename) show at once, without a lock and unlock: a field changed on the
    /// other machine, a new account; a synchroniser's temporary file left behind is skipped.
    @Test func changeFilesFromAnotherMachineShowWhileMounted() throws {
        let first = try unlockedStore()
        defer { first.close() }
        let a = first.path("accounts/\(Self.uuid)")
        #expect(writeText(a + "/username", "ann\n") == 0 && writeText(a + "/password", "one\n") == 0)
        let second = try MountedStore { data in
            try FileManager.default.removeItem(atPath: data + "/vault")
            try FileManager.default.copyItem(atPath: first.dataDirectory + "/vault", toPath: data + "/vault")
        }
        defer { second.close() }
        #expect(Run.mtmfs("unlock", second.mountPoint, input: Run.passphrase + "\n").status == 0)
        let b = second.path("accounts/\(Self.uuid)")
        let other = "0f8fad5b-d9cb-469f-a165-70867728950e"
        #expect(writeText(b + "/password", "two\n") == 0 && writeText(b + "/comment", "from b\n") == 0)
        #expect(mkdir(second.path("accounts/\(other)"), 0o700) == 0)
        try Self.copyNewFiles(from: second.dataDirectory, to: first.dataDirectory)
        let source = second.dataDirectory + "/vault", target = first.dataDirectory + "/vault"
        let device = try #require(try FileManager.default.contentsOfDirectory(atPath: source).first { $0.count == 16 && $0 != "keys" })
        #expect(FileManager.default.createFile(atPath: target + "/" + device + "/.syncthing.half.mtv.tmp", contents: Data([1, 2, 3])))
        #expect(Poll.until { Run.program("cat", [a + "/password", a + "/comment", a + "/username"]).stdout == "two\nfrom b\nann\n" },
                "the other machine's values do not show: \(Run.program("cat", [a + "/password", a + "/comment"]).stdout)")
        #expect(Poll.until { (try? FileManager.default.contentsOfDirectory(atPath: first.path("accounts")))?.contains(other) == true })
        #expect(try first.status()["state"] == "unlocked")
        #expect(Poll.until { (try? first.status()["vault_skipped"]) == "1" })
        let check = Run.mtmfs("check", "--data-dir", first.dataDirectory)
        #expect(check.status == 0 && check.stdout.contains("vault: skipped \(device)/.syncthing.half.mtv.tmp: "), "\(check)")
    }

    /// One field changed on two machines apart, and an account removed on one while the
    /// other changed it (SPEC §2b): once synced both show the later value, the other in
    /// `conflicts/<field>` (value escaped, device, time), the kept account's removal in
    /// `conflicts/removed`; `.mtmfs/status` counts them; writing the field resolves it on
    /// both; `conflicts/` takes no writes.
    @Test func conflictsAreShownAndResolvedByWritingTheField() throws {
        let first = try unlockedStore()
        defer { first.close() }
        let other = "0f8fad5b-d9cb-469f-a165-70867728950e"
        #expect(mkdir(first.path("accounts/\(other)"), 0o700) == 0)
        #expect(writeText(first.path("accounts/\(other)/label"), "old\n") == 0)
        let second = try MountedStore { data in
            try FileManager.default.removeItem(atPath: data + "/vault")
            try FileManager.default.copyItem(atPath: first.dataDirectory + "/vault", toPath: data + "/vault")
        }
        defer { second.close() }
        #expect(Run.mtmfs("unlock", second.mountPoint, input: Run.passphrase + "\n").status == 0)
        let a1 = first.path("accounts/\(Self.uuid)"), a2 = second.path("accounts/\(Self.uuid)")
        #expect(writeText(a1 + "/password", "from\tfirst\\\n") == 0)
        usleep(5_000)
        #expect(writeText(a2 + "/password", "from second\n") == 0)
        // Removed on the first (cleared, then rmdir), changed on the second meanwhile.
        #expect(Run.shell("rm -r \(first.path("accounts/\(other)"))").status == 0)
        #expect(writeText(second.path("accounts/\(other)/comment"), "still here\n") == 0)
        try Self.copyNewFiles(from: first.dataDirectory, to: second.dataDirectory)
        try Self.copyNewFiles(from: second.dataDirectory, to: first.dataDirectory)
        let device1 = try #require(Self.device(first.dataDirectory))
        for store in [first, second] {
            let a = store.path("accounts/\(Self.uuid)")
            #expect(Poll.until { Run.program("cat", [a + "/password"]).stdout == "from second\n" }, "the later value shows")
            #expect(Poll.until { (try? store.status()["conflicts"]) == "2" }, "\((try? store.status()) ?? [:])")
            let listing = Run.program("ls", [a, a + "/conflicts"]).stdout
            #expect(listing.contains("conflicts") && listing.contains("password"), "\(listing)")
            let line = Run.program("cat", [a + "/conflicts/password"]).stdout
            #expect(line.hasPrefix("from\\tfirst\\\\\t\(device1)\t20"), "\(line)")
            #expect(line.hasSuffix("Z\n") && line.split(separator: "\n").count == 1, "\(line)")
            let kept = store.path("accounts/\(other)")
            #expect(Run.program("cat", [kept + "/comment"]).stdout == "still here\n", "the change made apart keeps the account")
            #expect(Run.program("cat", [kept + "/conflicts/removed"]).stdout.hasPrefix(device1 + "\t"))
            #expect(errnoOf { open(a + "/conflicts/password", O_WRONLY) } == EACCES)
            #expect(errnoOf { open(a + "/conflicts/new", O_WRONLY | O_CREAT, 0o600) } == EACCES)
            #expect(errnoOf { mkdir(a + "/conflicts/dir", 0o700) } == EACCES)
            #expect(errnoOf { rename(a + "/conflicts/password", a + "/comment") } == EACCES)
        }
        #expect(Run.mtmfs("status", first.mountPoint).stdout.contains("conflicts: 2"))
        // Writing the field resolves it, here and, once synced, there.
        #expect(writeText(a1 + "/password", "agreed\n") == 0)
        #expect(errnoOf { open(a1 + "/conflicts/password", O_RDONLY) } == ENOENT)
        try Self.copyNewFiles(from: first.dataDirectory, to: second.dataDirectory)
        #expect(Poll.until { Run.program("cat", [a2 + "/password"]).stdout == "agreed\n" })
        #expect(Poll.until { (try? second.status()["conflicts"]) == "1" })
        #expect(!Run.program("ls", [a2]).stdout.contains("conflicts"))
    }

    /// Damaged files dropped into a mounted, unlocked vault folder as a synchroniser drops
    /// them (SPEC §2b): a half-synced (truncated) copy of another machine's change file, a
    /// Syncthing conflict copy of a valid one, and a valid change file of another vault.
    /// None is loaded — the conflict copy's value does not show, the other vault's value
    /// for the same account does not replace this one's — `.mtmfs/status` counts and names
    /// each (`vault_skipped`, `vault_skipped_file`), `mtmfs status` and `mtmfs check` name
    /// them, every other file still loads, also after a lock and unlock; once the whole
    /// copy arrives over the truncated one it loads.
    @Test func damagedHalfSyncedAndForeignFilesAreSkippedAndNamedThroughAMount() throws {
        let first = try unlockedStore()
        defer { first.close() }
        let a = first.path("accounts/\(Self.uuid)")
        #expect(writeText(a + "/username", "ann\n") == 0)
        let second = try MountedStore { data in
            try FileManager.default.removeItem(atPath: data + "/vault")
            try FileManager.default.copyItem(atPath: first.dataDirectory + "/vault", toPath: data + "/vault")
        }
        defer { second.close() }
        #expect(Run.mtmfs("unlock", second.mountPoint, input: Run.passphrase + "\n").status == 0)
        let other = "0f8fad5b-d9cb-469f-a165-70867728950e"
        #expect(mkdir(second.path("accounts/\(other)"), 0o700) == 0)
        #expect(writeText(second.path("accounts/\(other)/label"), "made on second\n") == 0)
        #expect(writeText(second.path("accounts/\(Self.uuid)/comment"), "from second\n") == 0)  // its last file
        let stranger = try unlockedStore()  // another vault, same passphrase, same account UUID
        defer { stranger.close() }
        #expect(writeText(stranger.path("accounts/\(Self.uuid)/username"), "stranger\n") == 0)
        let device2 = try #require(Self.device(second.dataDirectory)), strangerDevice = try #require(Self.device(stranger.dataDirectory))
        let files2 = try FileManager.default.contentsOfDirectory(atPath: second.dataDirectory + "/vault/" + device2).filter { $0.hasSuffix(".mtv") }.sorted()
        let last2 = try #require(files2.last)
        let foreign = try #require(try FileManager.default.contentsOfDirectory(atPath: stranger.dataDirectory + "/vault/" + strangerDevice)
            .filter { $0.hasSuffix(".mtv") }.sorted().last)
        let whole = try Data(contentsOf: URL(fileURLWithPath: second.dataDirectory + "/vault/\(device2)/\(last2)"))
        /// Puts `bytes` at `relative` in the first vault as a synchroniser does: a temporary name, then a rename.
        func arrive(_ relative: String, _ bytes: Data) throws {
            let target = first.dataDirectory + "/vault/" + relative
            let folder = (target as NSString).deletingLastPathComponent
            try FileManager.default.createDirectory(atPath: folder, withIntermediateDirectories: true)
            let temporary = folder + "/.syncthing." + (target as NSString).lastPathComponent + ".tmp"
            try bytes.write(to: URL(fileURLWithPath: temporary))
            #expect(rename(temporary, target) == 0)
        }
        for name in files2.dropLast() {  // the second machine's earlier files, whole
            try arrive("\(device2)/\(name)", try Data(contentsOf: URL(fileURLWithPath: second.dataDirectory + "/vault/\(device2)/\(name)")))
        }
        let truncated = "\(device2)/\(last2)"
        let conflictCopy = "\(device2)/" + last2.replacingOccurrences(of: ".mtv", with: ".sync-conflict-20240101-120000-ABCDEFG.mtv")
        let moved = "\(strangerDevice)/\(foreign)"
        try arrive(truncated, whole.prefix(whole.count / 2))
        try arrive(conflictCopy, whole)
        try arrive(moved, try Data(contentsOf: URL(fileURLWithPath: stranger.dataDirectory + "/vault/" + moved)))
        let named = [(truncated, "truncated"), (conflictCopy, "conflict copy"), (moved, "another vault")]
        func skippedLines() -> [String] {
            ((try? String(contentsOfFile: first.path(".mtmfs/status"), encoding: .utf8)) ?? "").split(separator: "\n")
                .filter { $0.hasPrefix("vault_skipped_file=") }.map(String.init)
        }
        for relocked in [false, true] {
            if relocked {
                #expect(Run.mtmfs("lock", first.mountPoint).status == 0)
                #expect(Run.mtmfs("unlock", first.mountPoint, input: Run.passphrase + "\n").status == 0)
            }
            #expect(Poll.until { Run.program("cat", [first.path("accounts/\(other)/label")]).stdout == "made on second\n" },
                    "the other machine's whole files do not load")
            #expect(Poll.until { (try? first.status()["vault_skipped"]) == "3" }, "\((try? first.status()) ?? [:])")
            for (relative, why) in named {
                #expect(skippedLines().contains { $0.hasPrefix("vault_skipped_file=\(relative): ") && $0.contains(why) },
                        "\(relative) not named (\(why)): \(skippedLines())")
            }
            #expect(Run.program("cat", [a + "/username", a + "/comment"]).stdout == "ann\n\n", "a skipped file's value shows")
            let listing = try FileManager.default.contentsOfDirectory(atPath: first.path("accounts")).sorted()
            #expect(listing == [Self.uuid, other, "by-label", "by-server"].sorted(), "\(listing)")
        }
        #expect(Run.mtmfs("status", first.mountPoint).stdout.contains("3 file(s) of the vault folder skipped"))
        // Damaged and half-synced files are damage: named, and exit 1 (the others load).
        let check = Run.mtmfs("check", "--data-dir", first.dataDirectory)
        #expect(check.status == 1 && check.stdout.contains("damaged file(s)"), "\(check)")
        for (relative, _) in named {
            #expect(check.stdout.contains("vault: skipped \(relative): "), "mtmfs check does not name \(relative): \(check.stdout)")
        }
        // The whole copy arrives over the half one: it loads.
        try arrive(truncated, whole)
        #expect(Poll.until { Run.program("cat", [a + "/comment"]).stdout == "from second\n" })
        #expect(Poll.until { (try? first.status()["vault_skipped"]) == "2" }, "\((try? first.status()) ?? [:])")
        #expect(Run.program("cat", [a + "/username"]).stdout == "ann\n")
    }

    /// This machine's device id for the vault of `data`.
    static func device(_ data: String) -> String? {
        (try? String(contentsOfFile: data + "/device", encoding: .utf8))?.split(separator: "\n")
            .first { $0.hasPrefix("device ") }.map { String($0.dropFirst(7)) }
    }

    /// What a synchroniser does: every change file `to` lacks, under a temporary name first.
    static func copyNewFiles(from: String, to: String) throws {
        let source = from + "/vault", target = to + "/vault"
        for relative in try FileManager.default.subpathsOfDirectory(atPath: source) where relative.hasSuffix(".mtv") {
            let destination = target + "/" + relative
            guard !FileManager.default.fileExists(atPath: destination) else { continue }
            let folder = (destination as NSString).deletingLastPathComponent
            try? FileManager.default.createDirectory(atPath: folder, withIntermediateDirectories: true)
            let temporary = folder + "/.syncthing." + (relative as NSString).lastPathComponent + ".tmp"
            try FileManager.default.copyItem(atPath: source + "/" + relative, toPath: temporary)
            try FileManager.default.moveItem(atPath: temporary, toPath: destination)
        }
    }
}

/// Writes `text` over the file at `path` (open, truncate, write, close): 0 or the errno.
private func writeText(_ path: String, _ text: String) -> Int32 {
    let fd = open(path, O_WRONLY | O_TRUNC)
    guard fd >= 0 else { return errno }
    defer { close(fd) }
    let bytes = Array(text.utf8)
    return write(fd, bytes, bytes.count) == bytes.count ? 0 : errno
}
