import Foundation
import TestSupport
import Testing
#if canImport(Glibc)
import Glibc
#endif

/// One table of save strategies, run by the real tools through a real mount on a settings
/// key and on an account field (SPEC §2, §4): each tool gets the same result in both trees,
/// the value is saved, and no editor file is left as a name.
@Suite(.enabled(if: FuseAvailability.isAvailable, "needs /dev/fuse")) struct EditingTests {
    static let uuid = "6ba7b810-9dad-11d1-80b4-00c04fd430c8"

    /// (name, command): the command edits `N` (holding 5) to hold 6; `S` is a second, text
    /// value some commands use as a scratch place.
    static let tools: [(String, String)] = [
        ("vim", "vim -es -c '%s/5/6/' -c wq N"),
        ("vim backupcopy=yes", "vim -es -c 'set backupcopy=yes' -c '%s/5/6/' -c wq N"),
        ("neovim", "nvim --headless -c '%s/5/6/' -c wq N"),
        ("nano", "nano N"),  // driven through a terminal below
        ("emacs", "emacs --batch N --eval '(progn (goto-char (point-min)) (delete-char 1) (insert \"6\") (save-buffer))'"),
        ("sed -i", "sed -i s/5/6/ N"),
        ("perl -pi", "perl -pi -e s/5/6/ N"),
        ("ed", "printf ',s/5/6/\\nw\\nq\\n' | ed -s N"),
        (">", "echo 6 > N"),
        (">>", ": > S && echo 6 >> S && cat S > N"),
        ("tee", "echo 6 | tee N > /dev/null"),
        ("cp", "echo 6 > /tmp/mtmfs-cp-$$ && cp /tmp/mtmfs-cp-$$ N; r=$?; rm -f /tmp/mtmfs-cp-$$; exit $r"),
        ("mv from another file system", "echo 6 > /tmp/mtmfs-mv-$$ && mv /tmp/mtmfs-mv-$$ N; r=$?; rm -f /tmp/mtmfs-mv-$$; exit $r"),
        ("install", "echo 6 > /tmp/mtmfs-in-$$ && install -m 600 /tmp/mtmfs-in-$$ N; r=$?; rm -f /tmp/mtmfs-in-$$; exit $r"),
        ("git checkout", """
            python3 -c "import os; os.unlink('N'); fd = os.open('N', os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644); os.write(fd, b'6\\\\n'); os.close(fd)"
            """),
        ("Python tempfile + os.replace", """
            python3 -c "
            import os, tempfile
            f = tempfile.NamedTemporaryFile(dir='.', delete=False); f.write(b'6\\\\n'); f.close()
            try: os.replace(f.name, 'N')
            except OSError: os.unlink(f.name); raise"
            """),
        ("Python open('w')", "python3 -c \"open('N', 'w').write('6\\\\n')\""),
        // (An integer key refuses the empty value: `truncate` says EINVAL there, a field takes it.)
        ("truncate", "truncate -s 0 N; echo 6 > N"),
    ]

    /// A mounted, unlocked store with one account; the settings key `N` and the field
    /// `port` hold 5, `S` and `comment` hold text.
    func store() throws -> MountedStore {
        let store = try MountedStore()
        do {
            let unlock = Run.mtmfs("unlock", store.mountPoint, input: Run.passphrase + "\n")
            try #require(unlock.status == 0, "\(unlock)")
            try #require(mkdir(store.path("accounts/\(Self.uuid)"), 0o700) == 0)
            let set = Run.shell("""
                cd \(store.path("settings")) && echo 5 > N && echo text > S && \
                cd \(store.path("accounts/\(Self.uuid)")) && echo 5 > port && echo text > comment
                """)
            try #require(set.status == 0, "\(set)")
        } catch {
            store.close()  // a failed set-up leaves no mount behind
            throw error
        }
        return store
    }

    /// Runs `command` in `directory` with `N` and `S` standing for `key` and `other`.
    func run(_ tool: String, _ command: String, in directory: String, key: String, other: String) -> CommandResult {
        if tool == "nano" {
            let nano = TerminalSession("cd \(directory) && nano \(key)")
            defer { nano.close() }
            nano.send("C-k", "6", "C-o")
            nano.send("Enter")
            nano.send("C-x")
            let saved = Poll.until(seconds: 10) { readValue(directory + "/" + key) == "6\n" }
            return CommandResult(status: saved ? 0 : 1, stdout: "", stderr: saved ? "" : "nano did not save")
        }
        let line = command.replacingOccurrences(of: " N", with: " \(key)").replacingOccurrences(of: "'N'", with: "'\(key)'")
            .replacingOccurrences(of: " S", with: " \(other)")
        // The tools' own temporaries (neovim's runtime directory) go into one of the test's.
        let temporary = Scratch("editor")
        defer { temporary.remove() }
        return Run.shell("export TMPDIR=\(temporary.path) && cd \(directory) && \(line)", timeout: 30)
    }

    func readValue(_ path: String) -> String? { try? String(contentsOfFile: path, encoding: .utf8) }

    @Test(arguments: tools.map(\.0))
    func everyToolSavesAKeyAndAFieldAlike(tool: String) throws {
        let command = Self.tools.first { $0.0 == tool }!.1
        let store = try store()
        defer { store.close() }
        let settings = store.path("settings"), account = store.path("accounts/\(Self.uuid)")
        let keyNames = Run.shell("ls -A \(settings)").stdout, fieldNames = Run.shell("ls -A \(account)").stdout

        let inSettings = run(tool, command, in: settings, key: "N", other: "S")
        let inAccounts = run(tool, command, in: account, key: "port", other: "comment")
        #expect(inSettings.status == 0, "\(tool) in settings/: \(inSettings)")
        #expect(inAccounts.status == 0, "\(tool) in accounts/: \(inAccounts)")
        #expect(readValue(settings + "/N") == "6\n", "\(tool)")
        #expect(readValue(account + "/port") == "6\n", "\(tool)")
        // No editor file is left as a name (emacs keeps its backup `N~`, in memory only).
        let leftInSettings = Run.shell("ls -A \(settings)").stdout, leftInAccount = Run.shell("ls -A \(account)").stdout
        #expect(leftInSettings.replacingOccurrences(of: "N~\n", with: "") == keyNames, "\(tool): \(leftInSettings)")
        #expect(leftInAccount.replacingOccurrences(of: "port~\n", with: "") == fieldNames, "\(tool): \(leftInAccount)")
        #expect(try DataFiles.names(in: store.dataDirectory).sorted() == ["Settings.plist", "cache.sqlite", "device", "mtmfs.lock", "vault"])
    }

    /// A value the key or field does not take: the same tool fails in both trees and the old
    /// value stays (vim, sed -i, install, git checkout, mv, os.replace: each at its own step).
    @Test func aRefusedValueKeepsTheOldOneInBothTrees() throws {
        let store = try store()
        defer { store.close() }
        let settings = store.path("settings"), account = store.path("accounts/\(Self.uuid)")
        for (tool, command) in Self.tools where !["nano", "truncate", ">>", "emacs"].contains(tool) {
            var bad = command
            for (good, refused) in [("s/5/6/", "s/5/x/"), ("echo 6", "echo x"), ("b'6", "b'x"), ("write('6", "write('x")] {
                bad = bad.replacingOccurrences(of: good, with: refused)
            }
            #expect(bad != command, "\(tool)")
            let inSettings = run(tool, bad, in: settings, key: "N", other: "S")
            let inAccounts = run(tool, bad, in: account, key: "port", other: "comment")
            #expect(inSettings.status == inAccounts.status, "\(tool): \(inSettings) / \(inAccounts)")
            #expect(readValue(settings + "/N") == "5\n", "\(tool)")
            #expect(readValue(account + "/port") == "5\n", "\(tool)")
        }
        // Nothing left behind once the tools gave up (their temporaries, the refused files).
        #expect(Poll.until(seconds: 3) { Run.shell("ls -A \(settings)").stdout == "ActiveServiceAccountUUID\nIsFirstRun\nN\nS\n" },
                "\(Run.shell("ls -A \(settings)").stdout)")
        #expect(Poll.until(seconds: 3) { Run.shell("ls -A \(account)").stdout.split(separator: "\n").count == 11 },
                "\(Run.shell("ls -A \(account)").stdout)")
    }

    /// An editor's file unlinked while open reads until it is closed, in both trees; the
    /// daemon frees it then.
    @Test func anUnlinkedOpenScratchFileReadsInBothTrees() throws {
        let store = try store()
        defer { store.close() }
        for directory in [store.path("settings"), store.path("accounts/\(Self.uuid)")] {
            let read = Run.program("python3", ["-c", """
                import os, sys
                os.chdir(sys.argv[1])
                fd = os.open('.N.swp', os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
                os.write(fd, b'swap data')
                os.unlink('.N.swp')
                print(os.pread(fd, 100, 0).decode(), os.path.exists('.N.swp'))
                os.close(fd)
                """, directory])
            #expect(read.stdout == "swap data False\n", "\(directory): \(read)")
        }
    }
}
