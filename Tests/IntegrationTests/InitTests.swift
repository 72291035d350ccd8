import Foundation
import TestSupport
import Testing
#if canImport(Glibc)
import Glibc
#endif

/// `mtmfs init`: the data directory's layout and modes.
@Suite struct InitTests {
    @Test func createsPrivateDirectoryWithDefaultStores() throws {
        let scratch = Scratch()
        defer { scratch.remove() }
        let data = scratch.sub("nested/data")
        let result = Run.initStore(data)
        #expect(result.status == 0, "\(result)")
        #expect(result.stdout.contains(data))

        var st = stat()
        #expect(stat(data, &st) == 0)
        #expect(st.st_mode & 0o7777 == 0o700)
        #expect(stat(data + "/Settings.plist", &st) == 0)
        #expect(st.st_mode & 0o7777 == 0o600)
        #expect(stat(data + "/cache.sqlite", &st) == 0)
        #expect(st.st_mode & 0o7777 == 0o600)
        // The vault: a folder of format 3 (docs/vault-format-3.md), its id and one key slot.
        #expect(stat(data + "/vault", &st) == 0)
        #expect(st.st_mode & 0o7777 == 0o700 && st.st_mode & S_IFMT == S_IFDIR)
        #expect((try? String(contentsOfFile: data + "/vault/id", encoding: .utf8))?.count == 33)
        let slots = try FileManager.default.contentsOfDirectory(atPath: data + "/vault/keys")
        #expect(slots.count == 1 && slots[0].hasSuffix(".slot"), "\(slots)")
        let slot = try Data(contentsOf: URL(fileURLWithPath: data + "/vault/keys/" + slots[0]))
        #expect(slot.starts(with: Data("MTMSLOT3".utf8)))
        #expect(slot.range(of: Data(Run.passphrase.utf8)) == nil)
        #expect(stat(data + "/device", &st) == 0)

        // The shipped defaults, read by real plist readers.
        let python = Run.program("python3", ["-c", """
            import plistlib, sys
            with open(sys.argv[1], 'rb') as f: d = plistlib.load(f)
            print(repr(sorted(d.items())))
            """, data + "/Settings.plist"])
        #expect(python.stdout.trimmingCharacters(in: .whitespacesAndNewlines)
                == "[('ActiveServiceAccountUUID', ''), ('IsFirstRun', True)]", "\(python)")
        let plistutil = Run.program("plistutil", ["-i", data + "/Settings.plist", "-f", "xml"])
        #expect(plistutil.status == 0 && plistutil.stdout.contains("<key>IsFirstRun</key>"), "\(plistutil)")

        // An SQLite database in WAL mode that passes integrity_check.
        let sqlite = Run.program("sqlite3", [data + "/cache.sqlite", "PRAGMA integrity_check; PRAGMA journal_mode;"])
        #expect(sqlite.stdout == "ok\nwal\n", "\(sqlite)")
    }

    @Test func usesTheXDGDefaultLocation() throws {
        let scratch = Scratch()
        defer { scratch.remove() }
        let result = Run.program(Run.mtmfs, ["init", "--kdf", "interactive"], input: Run.passphrase + "\n",
                                 environment: ["XDG_DATA_HOME": scratch.sub("xdg"), "HOME": scratch.path])
        #expect(result.status == 0, "\(result)")
        #expect(FileManager.default.fileExists(atPath: scratch.sub("xdg/mtmfs/Settings.plist")))
        let home = Run.program(Run.mtmfs, ["init", "--kdf", "interactive"], input: Run.passphrase + "\n",
                               environment: ["HOME": scratch.sub("home")])
        #expect(home.status == 0, "\(home)")
        #expect(FileManager.default.fileExists(atPath: scratch.sub("home/.local/share/mtmfs/cache.sqlite")))
    }

    @Test func refusesAnExistingStoreAndLeavesItAlone() throws {
        let scratch = Scratch()
        defer { scratch.remove() }
        let data = scratch.sub("data")
        #expect(Run.initStore(data).status == 0)
        try Data("marker".utf8).write(to: URL(fileURLWithPath: data + "/Settings.plist"))
        let again = Run.initStore(data)
        #expect(again.status == 1, "\(again)")
        #expect(again.stderr.contains("already holds an mtmfs store"), "\(again)")
        #expect(try String(contentsOfFile: data + "/Settings.plist", encoding: .utf8) == "marker")
    }

    @Test func passphraseIsRequiredAndKDFLevelChecked() throws {
        let scratch = Scratch()
        defer { scratch.remove() }
        let none = Run.mtmfs("init", "--data-dir", scratch.sub("a"))
        #expect(none.status == 1 && none.stderr.contains("no passphrase given"), "\(none)")
        #expect(!FileManager.default.fileExists(atPath: scratch.sub("a/vault")))
        let badKDF = Run.mtmfs("init", "--kdf", "weak", "--data-dir", scratch.sub("b"))
        #expect(badKDF.status == 2, "\(badKDF)")
        try "from a file\nsecond line ignored\n".write(toFile: scratch.sub("pass"), atomically: true, encoding: .utf8)
        let fromFile = Run.mtmfs("init", "--kdf", "interactive", "--passphrase-file", scratch.sub("pass"), "--data-dir", scratch.sub("c"))
        #expect(fromFile.status == 0, "\(fromFile)")
    }

    @Test func refusesAFileAsDataDirectory() throws {
        let scratch = Scratch()
        defer { scratch.remove() }
        _ = FileManager.default.createFile(atPath: scratch.sub("file"), contents: Data())
        let result = Run.initStore(scratch.sub("file"))
        #expect(result.status == 1)
        #expect(result.stderr.contains("is not a directory"), "\(result)")
    }

    @Test func commandLineErrorsExitTwo() {
        let unknownOption = Run.mtmfs("init", "--bogus")
        #expect(unknownOption.status == 2)
        #expect(unknownOption.stderr.contains("unknown option --bogus"), "\(unknownOption)")
        let unknownCommand = Run.mtmfs("frobnicate")
        #expect(unknownCommand.status == 2)
        #expect(unknownCommand.stderr.contains("unknown command 'frobnicate'"))
        let missingValue = Run.mtmfs("init", "--data-dir")
        #expect(missingValue.status == 2)
        #expect(missingValue.stderr.contains("needs a value"))
        let extra = Run.mtmfs("init", "stray")
        #expect(extra.status == 2)
    }

    @Test func helpAndVersion() {
        let version = Run.mtmfs("--version")
        #expect(version.status == 0 && version.stdout.hasPrefix("mtmfs 0."))
        let overview = Run.mtmfs("--help")
        for command in ["init", "mount", "unmount", "unlock", "lock", "status", "passwd", "check", "demo"] {
            #expect(overview.stdout.contains("  \(command) "), "\(command) missing from --help")
            let help = Run.mtmfs(command, "--help")
            #expect(help.status == 0 && help.stdout.contains("Usage: mtmfs \(command)"), "\(help)")
        }
    }
}
