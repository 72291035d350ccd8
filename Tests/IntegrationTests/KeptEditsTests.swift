import Foundation
import TestSupport
import Testing
#if canImport(Glibc)
import Glibc
#endif

/// SPEC §0 in `settings/` and `accounts/`: a name written and closed is stored — across an
/// unmount — or the call fails with an errno; what `ls` shows after a rename or a removal is
/// what a remount shows; array elements save like keys; every key is a file. Each case is
/// one a tester met (a write that returned 0 and was gone after the unmount, a rename that
/// came undone, vim's save that took an array's next element).
@Suite(.enabled(if: FuseAvailability.isAvailable, "needs /dev/fuse")) struct KeptEditsTests {
    static let uuid = "5f1c7a3e-2b4d-4e8f-9a6b-0c1d2e3f4a5b"

    /// A mounted, unlocked store with one account; `keys` (a Python dict) added to the
    /// default settings before the mount.
    static func store(_ keys: String = "{}") throws -> MountedStore {
        let store = try MountedStore(prepare: { data in
            let python = "import plistlib,sys; d={'IsFirstRun': True, 'ActiveServiceAccountUUID': ''}; "
                + "d.update(eval(sys.argv[2])); plistlib.dump(d, open(sys.argv[1], 'wb'))"
            let made = Run.program("python3", ["-c", python, data + "/Settings.plist", keys])
            try #require(made.status == 0, "\(made)")
        })
        let unlock = Run.mtmfs("unlock", store.mountPoint, input: Run.passphrase + "\n")
        try #require(unlock.status == 0, "\(unlock)")
        try #require(mkdir(store.path("accounts/\(uuid)"), 0o700) == 0)
        return store
    }

    static func remount(_ store: MountedStore, unlock: Bool = false) throws {
        try #require(Run.mtmfs("unmount", store.mountPoint).status == 0)
        let mounted = Run.program(Run.mtmfs, ["mount", "--data-dir", store.dataDirectory, store.mountPoint])
        try #require(mounted.status == 0, "\(mounted)")
        if unlock {
            let unlocked = Run.mtmfs("unlock", store.mountPoint, input: Run.passphrase + "\n")
            try #require(unlocked.status == 0, "\(unlocked)")
        }
    }

    /// The plist as plistlib reads it, as JSON (dates and data as text).
    static func stored(_ store: MountedStore) -> String {
        Run.program("python3", ["-c", """
            import plistlib, sys, json
            d = plistlib.load(open(sys.argv[1], 'rb'))
            print(json.dumps(d, default=str, sort_keys=True, ensure_ascii=False))
            """, store.dataDirectory + "/Settings.plist"]).stdout.trimmingCharacters(in: .newlines)
    }

    /// Names that were taken for editors' files are keys: stored across an unmount.
    @Test func everyNameWrittenAndClosedIsStored() throws {
        let store = try Self.store()
        defer { store.close() }
        let s = store.path("settings")
        let names = ["2024", "notes.bak", "x.tmp", "x.swp", ".hidden", "½", "一二三", "tmp.txt", "K.orig"]
        for name in names {
            #expect(Run.program("/bin/sh", ["-c", "echo v > \"$1\"", "sh", s + "/" + name]).status == 0, "\(name)")
        }
        #expect(Run.shell("touch \(s)/NewKey").status == 0)
        try Self.remount(store)
        for name in names {
            #expect((try? String(contentsOfFile: s + "/" + name, encoding: .utf8)) == "v\n", "\(name)")
        }
        #expect((try? String(contentsOfFile: s + "/NewKey", encoding: .utf8)) == "\n")
    }

    /// Names that can be no key are refused at create, never shown and dropped later.
    @Test func namesThatCanBeNoKeyAreRefused() throws {
        let store = try Self.store("{'List': ['a', 'b']}")
        defer { store.close() }
        let s = store.path("settings"), account = store.path("accounts/\(Self.uuid)")
        for name in ["List/5", "List/x", "List/02", "List/3"] {
            #expect(errnoOf { open(s + "/" + name, O_WRONLY | O_CREAT | O_CLOEXEC, 0o644) } == EINVAL, "\(name)")
        }
        #expect(Run.shell("echo c > \(s)/List/2 && ls \(s)/List").stdout == "0\n1\n2\n")
        for name in ["notes", "password.bak", "x.tmp"] {
            #expect(errnoOf { open(account + "/" + name, O_WRONLY | O_CREAT | O_CLOEXEC, 0o600) } == EINVAL, "\(name)")
        }
        // attributes/: only the names the escape rule makes (`.` is never escaped inside one).
        for name in ["with%2Edot", "xdg%3Aschema", "%41", "50%"] {
            #expect(errnoOf { open(account + "/attributes/" + name, O_WRONLY | O_CREAT | O_CLOEXEC, 0o600) } == EINVAL, "\(name)")
        }
        #expect(Run.shell("cd \(account)/attributes && echo 1 > with.dot && echo 2 > %2E && echo 3 > xdg:schema && ls -A").stdout
                == "%2E\nwith.dot\nxdg:schema\n")
        // A settings name no key has: an escape the rule never writes; a link is no key.
        #expect(errnoOf { open(s + "/a%2Eb", O_WRONLY | O_CREAT | O_CLOEXEC, 0o644) } == EINVAL)
        #expect(errnoOf { symlink("x", s + "/Link") } == EPERM)
        // An integer key refuses the empty value, at the truncate's close.
        #expect(Run.shell("echo 5 > \(s)/N").status == 0)
        let truncated = Run.shell("truncate -s 0 \(s)/N")
        #expect(truncated.status != 0 && truncated.stderr.contains("Invalid argument"), "\(truncated)")
        #expect(Run.shell("cat \(s)/N").stdout == "5\n")
        try Self.remount(store, unlock: true)
        #expect(Run.shell("ls \(s)/List").stdout == "0\n1\n2\n")
        #expect(Run.shell("ls -A \(account)/attributes").stdout == "%2E\nwith.dot\nxdg:schema\n")
    }

    /// Renames and removals stay as `ls` showed them after a remount.
    @Test func renamesAndRemovalsNeverComeUndone() throws {
        let store = try Self.store()
        defer { store.close() }
        let s = store.path("settings"), account = store.path("accounts/\(Self.uuid)")
        #expect(Run.shell("cd \(s) && echo k > Keep && mv Keep Keep.bak && echo kk > K && mv K K~ && mv K~ L").status == 0)
        // vim saving an empty buffer: the old text to `password~`, an empty new file, the backup gone.
        #expect(Run.shell("cd \(account) && echo s3cret > password && vim -es -u NONE -i NONE -N -c '%d' -c wq password").status == 0)
        #expect(Poll.until(seconds: 3) { Run.shell("ls \(s)").stdout == "ActiveServiceAccountUUID\nIsFirstRun\nKeep.bak\nL\n" },
                "\(Run.shell("ls \(s)").stdout)")
        #expect(Run.shell("cat \(account)/password").stdout == "\n")
        try Self.remount(store, unlock: true)
        #expect(Run.shell("ls \(s)").stdout == "ActiveServiceAccountUUID\nIsFirstRun\nKeep.bak\nL\n")
        #expect(Run.shell("cat \(s)/Keep.bak \(s)/L").stdout == "k\nkk\n")
        #expect(Run.shell("cat \(account)/password").stdout == "\n")
    }

    /// A removal waiting for its delay never undoes a later write.
    @Test func aRemovalNeverUndoesALaterWrite() throws {
        let store = try Self.store("{'Arr': ['s0', {'Mode': 'm1'}]}")
        defer { store.close() }
        let s = store.path("settings"), a = store.path("accounts/\(Self.uuid)")
        #expect(Run.shell("cd \(a) && echo https://h.example:8443/p > url && rm url && echo imap > protocol").status == 0)
        #expect(Run.shell("cd \(a) && echo https://h.example:8443/p > comment && rm port && echo ssh://h:22 > url").status == 0)
        #expect(Run.shell("rm \(s)/Arr/1/Mode && rm \(s)/Arr/0").status == 0)
        usleep(1_500_000)
        #expect(Run.shell("cd \(a) && cat protocol server port path").stdout == "ssh\nh\n22\n\n")
        #expect(Poll.until(seconds: 3) { Self.stored(store).contains("\"Arr\": [{}]") }, "\(Self.stored(store))")
        // With no server the URL reads empty; written back as read it changes nothing.
        #expect(Run.shell("cd \(a) && echo https > protocol && echo > server && echo /p > path && cat url > /tmp/mtmfs-url-$$ && cp /tmp/mtmfs-url-$$ url; r=$?; rm -f /tmp/mtmfs-url-$$; exit $r").status == 0)
        #expect(Run.shell("cd \(a) && cat protocol path").stdout == "https\n/p\n")
        try Self.remount(store, unlock: true)
        #expect(Run.shell("cd \(a) && cat protocol path").stdout == "https\n/p\n")
        #expect(Run.shell("ls -R \(s)/Arr").stdout.contains("Arr/0:\n") == true)
    }

    /// vim's default save, and an unlink-then-create save, of each element of a nine-element
    /// array: nine elements, that one changed.
    @Test func vimSavesEveryArrayElementInPlace() throws {
        let words = ["zero", "one", "two", "日本語", "four", "five", "six", "seven", "eight"]
        let store = try Self.store("{'Some UTF8 strings': [" + words.map { "'\($0)'" }.joined(separator: ", ") + "]}")
        defer { store.close() }
        let array = store.path("settings/Some UTF8 strings")
        var expected = words
        for index in words.indices {
            let vim = Run.program("/bin/sh", ["-c", "cd \"$1\" && vim -es -u NONE -i NONE -N -c 's/$/X/' -c wq \(index)", "sh", array])
            #expect(vim.status == 0, "\(index): \(vim)")
            expected[index] += "X"
            #expect(Run.shell("cd '\(array)' && ls | wc -l").stdout == "9\n", "after element \(index)")
        }
        // vim's fallback where it cannot rename (and install's, mv's from another file
        // system): unlink, then create — a rewrite in place, never a shift.
        for index in words.indices {
            let rewrite = Run.program("python3", ["-c", "import os,sys; os.unlink(sys.argv[1]); open(sys.argv[1], 'w').write(sys.argv[2])",
                                                  array + "/\(index)", expected[index] + "Y\n"])
            #expect(rewrite.status == 0, "\(index): \(rewrite)")
            expected[index] += "Y"
            #expect(Run.shell("cd '\(array)' && ls | wc -l").stdout == "9\n", "after element \(index)")
        }
        let listing = Run.shell("cd '\(array)' && for i in 0 1 2 3 4 5 6 7 8; do cat $i; done").stdout
        #expect(listing == expected.map { $0 + "\n" }.joined())
        try Self.remount(store)
        #expect(Run.shell("cd '\(array)' && for i in 0 1 2 3 4 5 6 7 8; do cat $i; done").stdout == listing)
    }

    /// Keys that cannot be file names have one by the naming rule, and are read, written,
    /// renamed and removed through it.
    @Test func everyKeyIsAFile() throws {
        let long = String(repeating: "k", count: 300)
        let store = try Self.store("{'': 'empty', 'a/b': 'slash', '.': 'dot', '..': 'dots', '50%': 'pct', '\(long)': 'long'}")
        defer { store.close() }
        let s = store.path("settings")
        let names = Run.shell("ls -A \(s)").stdout.split(separator: "\n").map(String.init)
        let cut = try #require(names.first { $0.hasPrefix("kkk") })
        #expect(cut.utf8.count == 255 && cut.dropLast(8).hasSuffix("~"), "\(cut)")
        #expect(Set(names).isSuperset(of: ["%", "a%2Fb", "%2E", "%2E%2E", "50%25"]), "\(names)")
        #expect(Run.shell("cd \(s) && cat % a%2Fb %2E %2E%2E 50%25 \(cut)").stdout == "empty\nslash\ndot\ndots\npct\nlong\n")
        #expect(Run.shell("cd \(s) && echo E > % && echo S > a%2Fb && mv 50%25 100%25 && echo L > \(cut) && rm %2E").status == 0)
        try Self.remount(store)
        let stored = Self.stored(store)
        #expect(stored.contains("\"\": \"E\"") && stored.contains("\"a/b\": \"S\"") && stored.contains("\"100%\": \"pct\"")
                && stored.contains("\"\(long)\": \"L\"") && !stored.contains("\".\": ") && stored.contains("\"..\": \"dots\""), "\(stored)")
    }

    /// A plist that cannot be read: said at mount, in .mtmfs/status and by `mtmfs status`.
    @Test func anUnreadablePlistIsNamed() throws {
        let store = try MountedStore(prepare: { data in
            try Data("{ OpenStep = text; }".utf8).write(to: URL(fileURLWithPath: data + "/Settings.plist"))
        })
        defer { store.close() }
        #expect(errnoOf { open(store.path("settings/IsFirstRun"), O_RDONLY | O_CLOEXEC) } == EIO)
        #expect(try store.status()["settings_error"]?.contains("Settings.plist") == true)
        #expect(Run.mtmfs("status", store.mountPoint).stdout.contains("settings:"))
        #expect(Run.mtmfs("unmount", store.mountPoint).status == 0)
        let mounted = Run.program(Run.mtmfs, ["mount", "--data-dir", store.dataDirectory, store.mountPoint])
        #expect(mounted.status == 0 && mounted.stderr.contains("Settings.plist"), "\(mounted)")
        #expect(try Data(contentsOf: URL(fileURLWithPath: store.dataDirectory + "/Settings.plist")) == Data("{ OpenStep = text; }".utf8))
    }
}
