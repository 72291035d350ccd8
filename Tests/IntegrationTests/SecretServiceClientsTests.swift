import Foundation
import Posix
import TestSupport
import Testing
#if canImport(Glibc)
import Glibc
#endif

extension ReferenceKeyring {
    /// A client run against gnome-keyring (its bus, its home).
    func run(_ program: String, _ arguments: [String], input: String? = nil) -> CommandResult {
        var environment = bus.environment
        environment["HOME"] = scratch.sub("home")
        return Run.program(program, arguments, input: input, environment: environment, timeout: 30)
    }
}

/// Real clients nobody here wrote, each run with the same steps against gnome-keyring (the
/// reference) and against mtmfs, asserting the same answers (SPEC §2c): git's own libsecret
/// credential helper, Python's `keyring`, `secretstorage` (the default and the session
/// collection), `secret-tool`, docker's credential helper, and secretstorage's own test
/// suite. Locked, mtmfs's answers (the prompt answered with the passphrase) must be
/// gnome-keyring's unlocked ones: a client that loaded its items while locked still sees
/// their usernames and attributes once unlocked. (gnome-keyring's own unlock prompt needs a
/// desktop prompter: its locked steps are not run.)
@Suite(.serialized, .enabled(if: FuseAvailability.isAvailable && Spawn.exists("dbus-daemon") && Spawn.exists("secret-tool")
                              && Spawn.exists("gnome-keyring-daemon")))
struct SecretServiceClientsTests {
    /// Where Debian's git keeps the source of its libsecret helper.
    static let gitHelperSource = "/usr/share/doc/git/contrib/credential/libsecret/git-credential-libsecret.c"
    /// secretstorage's source release, with its tests (`mount-helpers/install-deps --test`).
    static let secretstorageSuite = "/var/cache/mtmfs-test/SecretStorage-3.3.3"

    /// git's helper built from the source git ships (libsecret-1-dev), into `directory`.
    static func buildGitHelper(in directory: String) throws -> String {
        let helper = directory + "/git-credential-libsecret"
        let built = Run.shell("gcc -O2 -o \(helper) \(gitHelperSource) $(pkg-config --cflags --libs glib-2.0 libsecret-1)")
        try #require(built.status == 0, "building git's libsecret helper: \(built)")
        return helper
    }

    /// secret-tool's output without what differs between any two services (object paths,
    /// times), nor the `schema` line: secret-tool prints the item's `xdg:schema` attribute,
    /// which gnome-keyring adds to an item stored without one in some runs and not others.
    static func comparable(_ output: String) -> String {
        output.split(separator: "\n").filter { line in
            !["[/", "created = ", "modified = ", "schema = "].contains { line.hasPrefix($0) }
        }.joined(separator: "\n")
    }

    @Test(.enabled(if: FileManager.default.fileExists(atPath: gitHelperSource)))
    func gitsLibsecretHelperAnswersAsWithGnomeKeyring() throws {
        let store = try ServedStore(pinentry: true)
        defer { store.close() }
        let reference = try ReferenceKeyring()
        defer { reference.close() }
        let helper = try Self.buildGitHelper(in: store.scratch.path)
        let stored = "protocol=https\nhost=git.example.com:8443\npath=team/repo.git\nusername=alice\npassword=s3cr3t-for-git\n\n"
        let asked = ["protocol=https\nhost=git.example.com:8443\npath=team/repo.git\n\n",
                     "protocol=https\nhost=git.example.com:8443\n\n",
                     "protocol=https\nhost=git.example.com:8443\nusername=alice\n\n",
                     "protocol=https\nhost=git.example.com\n\n"]
        func steps(_ run: (String, String) -> CommandResult) -> [String] {
            var answers = [run("store", stored).stdout]
            for question in asked { answers.append(run("get", question).stdout) }
            return answers
        }
        let ours = steps { store.run(helper, [$0], input: $1) }
        let theirs = steps { reference.run(helper, [$0], input: $1) }
        #expect(ours == theirs, "mtmfs: \(ours)\ngnome-keyring: \(theirs)")
        #expect(ours[1].contains("username=alice\npassword=s3cr3t-for-git\n"), "\(ours)")

        // After a lock (as an auto-lock does), with the prompt answered: the username too.
        #expect(store.run(Run.mtmfs, ["lock", store.mountPoint]).status == 0)
        store.answer("passphrase")
        let afterLock = store.run(helper, ["get"], input: asked[1])
        #expect(afterLock.stdout == theirs[2], "after a lock: \(afterLock)\ngnome-keyring unlocked: \(theirs[2])")
        #expect(store.asked.contains("GETPIN"), "the passphrase was asked")

        // Rejected: gone from both.
        let erase = "protocol=https\nhost=git.example.com:8443\npath=team/repo.git\nusername=alice\npassword=s3cr3t-for-git\n\n"
        #expect(store.run(helper, ["erase"], input: erase).status == reference.run(helper, ["erase"], input: erase).status)
        #expect(store.run(helper, ["get"], input: asked[0]).stdout == reference.run(helper, ["get"], input: asked[0]).stdout)
        #expect(store.run(helper, ["get"], input: asked[0]).stdout.isEmpty)
    }

    @Test func pythonKeyringAndSecretstorageAnswerAsWithGnomeKeyring() throws {
        let store = try ServedStore()
        defer { store.close() }
        let reference = try ReferenceKeyring()
        defer { reference.close() }
        // Python's keyring, then secretstorage on the default and the session collection:
        // create, replace, search, read, relabel, delete (no paths printed: they differ).
        let script = """
            import keyring, secretstorage
            keyring.set_password('mail', 'alice', 'p1')
            keyring.set_password('mail', 'alice', 'p2')
            print(keyring.get_password('mail', 'alice'), keyring.get_password('mail', 'bob'))
            keyring.delete_password('mail', 'alice')
            print(keyring.get_password('mail', 'alice'))
            connection = secretstorage.dbus_init()
            for alias in ['default', 'session']:
                collection = secretstorage.get_collection_by_alias(connection, alias)
                a = collection.create_item('A', {'app': 'x', 'n': '1'}, b'one')
                b = collection.create_item('A again', {'app': 'x', 'n': '1'}, b'uno', replace=True)
                c = collection.create_item('C', {'app': 'x', 'n': '2'}, b'two', content_type='application/octet-stream')
                found = sorted((i.get_label(), i.get_secret(), sorted(i.get_attributes().items())) for i in collection.search_items({'app': 'x'}))
                print(alias, a.item_path == b.item_path, found)
                c.set_label('C2'); c.set_attributes({'app': 'x', 'n': '3'})
                # (A content type is kept here; gnome-keyring answers text/plain for every secret.)
                print(alias, c.get_label(), sorted(c.get_attributes().items()))
                print(alias, [i.get_label() for i in secretstorage.search_items(connection, {'n': '3'})])
                b.delete(); c.delete()
                print(alias, list(collection.search_items({'app': 'x'})))
            """
        let ours = store.python(script)
        let theirs = reference.python(script)
        #expect(ours.status == 0 && theirs.status == 0, "mtmfs: \(ours)\ngnome-keyring: \(theirs)")
        #expect(ours.stdout == theirs.stdout, "mtmfs:\n\(ours.stdout)\ngnome-keyring:\n\(theirs.stdout)")
        // The session collection's items are nowhere in accounts/ nor in the vault.
        let typed = store.python("""
            import secretstorage
            c = secretstorage.get_collection_by_alias(secretstorage.dbus_init(), 'session')
            print(c.create_item('B', {'k': 'v'}, b'\\x00\\x01', content_type='application/octet-stream').get_secret_content_type())
            """)
        #expect(typed.stdout == "application/octet-stream\n", "\(typed)")
        let kept = store.python("""
            import secretstorage
            c = secretstorage.get_collection_by_alias(secretstorage.dbus_init(), 'session')
            c.create_item('Only in memory', {'kind': 'session'}, b'kept-in-memory')
            print(c.get_label(), c.collection_path)
            """)
        #expect(kept.stdout == "Session /org/freedesktop/secrets/collection/session\n", "\(kept)")
        #expect(!Run.shell("grep -rl 'Only in memory' \(store.mountPoint)/accounts").stdout.contains("accounts"))
        // Locked with the vault: found locked, its secret refused; unlocked, there again.
        #expect(store.run(Run.mtmfs, ["lock", store.mountPoint]).status == 0)
        let locked = store.python("""
            import secretstorage
            c = secretstorage.get_collection_by_alias(secretstorage.dbus_init(), 'session')
            print(c.is_locked())
            """)
        #expect(locked.stdout == "True\n", "\(locked)")
        #expect(store.run(Run.mtmfs, ["unlock", "--passphrase-file", store.scratch.sub("pass"), store.mountPoint]).status == 0)
        #expect(store.run("secret-tool", ["lookup", "kind", "session"]).stdout == "kept-in-memory")
    }

    @Test func secretToolAndDockersHelperAnswerAsWithGnomeKeyring() throws {
        let store = try ServedStore(pinentry: true)
        defer { store.close() }
        let reference = try ReferenceKeyring()
        defer { reference.close() }
        func secretTool(_ run: ([String], String?) -> CommandResult) -> [String] {
            [
                run(["store", "--label=Mail", "service", "mail", "user", "alice"], "m41l").stdout,
                run(["store", "--label=Session thing", "--collection=session", "service", "gvfs"], "gv").stdout,
                run(["lookup", "service", "mail"], nil).stdout,
                run(["lookup", "service", "gvfs"], nil).stdout,
                Self.comparable({ let r = run(["search", "--all", "service", "mail"], nil); return r.stdout + r.stderr }()),
                run(["clear", "service", "gvfs"], nil).stdout,
                run(["lookup", "service", "gvfs"], nil).stdout,
            ]
        }
        let ours = secretTool { store.run("secret-tool", $0, input: $1) }
        let theirs = secretTool { reference.run("secret-tool", $0, input: $1) }
        #expect(ours == theirs, "mtmfs: \(ours)\ngnome-keyring: \(theirs)")
        #expect(ours[4].contains("attribute.user = alice"), "\(ours)")

        let docker = "docker-credential-secretservice"
        if Spawn.exists(docker) {
            let credentials = #"{"ServerURL":"https://registry.example.com/v1/","Username":"bob","Secret":"t0ken"}"#
            func steps(_ run: ([String], String?) -> CommandResult) -> [String] {
                [run(["store"], credentials).status.description, run(["get"], "https://registry.example.com/v1/").stdout,
                 run(["list"], nil).stdout]
            }
            let ourDocker = steps { store.run(docker, $0, input: $1) }
            let theirDocker = steps { reference.run(docker, $0, input: $1) }
            #expect(ourDocker == theirDocker, "mtmfs: \(ourDocker)\ngnome-keyring: \(theirDocker)")
            // After a lock, the prompt answered: the same answers (no crash, no empty account).
            #expect(store.run(Run.mtmfs, ["lock", store.mountPoint]).status == 0)
            store.answer("passphrase")
            let get = store.run(docker, ["get"], input: "https://registry.example.com/v1/")
            #expect(get.status == 0 && get.stdout == theirDocker[1], "after a lock: \(get)")
            #expect(store.run(Run.mtmfs, ["lock", store.mountPoint]).status == 0)
            let list = store.run(docker, ["list"])
            #expect(list.status == 0 && list.stdout == theirDocker[2], "after a lock: \(list)")
        }

        // `secret-tool search --all --unlock` while locked, the prompt answered: gnome-keyring's
        // unlocked answer (label and attributes, not blank).
        #expect(store.run(Run.mtmfs, ["lock", store.mountPoint]).status == 0)
        store.answer("passphrase")
        let unlocked = store.run("secret-tool", ["search", "--all", "--unlock", "service", "mail"])
        #expect(Self.comparable(unlocked.stdout + unlocked.stderr) == theirs[4], "locked then unlocked: \(unlocked)")
    }

    /// secretstorage's own test suite, from its source release, against each service: the
    /// same result (OK, and skipped only where gnome-keyring skips).
    @Test(.enabled(if: FileManager.default.fileExists(atPath: secretstorageSuite + "/tests")))
    func secretstoragesOwnSuitePassesAsWithGnomeKeyring() throws {
        let store = try ServedStore()
        defer { store.close() }
        let reference = try ReferenceKeyring()
        defer { reference.close() }
        let script = """
            import sys, unittest
            sys.path.insert(0, '\(Self.secretstorageSuite)')
            result = unittest.TextTestRunner(verbosity=0).run(unittest.TestLoader().discover('\(Self.secretstorageSuite)/tests'))
            print('ran', result.testsRun, 'failures', len(result.failures), 'errors', len(result.errors), 'skipped', len(result.skipped))
            """
        let ours = store.python(script)
        let theirs = reference.python(script)
        let summary = { (result: CommandResult) in result.stdout.split(separator: "\n").last.map(String.init) ?? "" }
        #expect(summary(theirs).contains("failures 0 errors 0"), "gnome-keyring: \(theirs)")
        #expect(summary(ours) == summary(theirs), "mtmfs: \(ours)\ngnome-keyring: \(theirs)")
    }

    /// At a lock and an unlock every item is told (PropertiesChanged of the item with what
    /// changed, ItemChanged), before any Completed; a file another machine synced that
    /// changes one account tells that one item, and no other.
    @Test func locksUnlocksAndASyncedChangeSignalWhatChanged() throws {
        let store = try ServedStore()
        defer { store.close() }
        for name in ["one", "two", "three"] {
            #expect(store.run("secret-tool", ["store", "--label=\(name)", "service", name], input: name).status == 0)
        }
        let accounts = store.accounts
        try #require(accounts.count == 3)
        func item(_ account: String) -> String { account.replacingOccurrences(of: "-", with: "").lowercased() }
        let path = { (account: String) in "/org/freedesktop/secrets/collection/login/" + item(account) }
        let listener = try SignalListener(store)
        defer { listener.close() }
        // (And nothing more than expected, a moment after.)
        func heardAll(_ expected: [String], _ what: String) -> [String] { listener.heard(expected, what, settle: 300_000) }
        let itemInterface = "org.freedesktop.Secret.Item"
        #expect(store.run(Run.mtmfs, ["lock", store.mountPoint]).status == 0)
        let atLock = heardAll(accounts.flatMap { ["PropertiesChanged \(path($0)) \(itemInterface) Locked", "ItemChanged \(item($0))"] }, "a lock")
        #expect(atLock.filter { $0.hasPrefix("ItemChanged") }.count == 3, "\(atLock)")
        #expect(store.run(Run.mtmfs, ["unlock", "--passphrase-file", store.scratch.sub("pass"), store.mountPoint]).status == 0)
        let unlocked = "Attributes Created Label Locked Modified Type"
        let atUnlock = heardAll(accounts.flatMap { ["PropertiesChanged \(path($0)) \(itemInterface) \(unlocked)", "ItemChanged \(item($0))"] },
                                "an unlock")
        #expect(atUnlock.filter { $0.hasPrefix("ItemChanged") }.count == 3, "\(atUnlock)")

        // Another machine: a copy of the vault folder (a device of its own at its first
        // mount) changes the label of one account; its new file is copied in.
        let other = store.scratch.sub("other"), otherMount = store.scratch.sub("other-mnt")
        #expect(Run.initStore(other).status == 0)
        try FileManager.default.removeItem(atPath: other + "/vault")
        try? FileManager.default.removeItem(atPath: other + "/device")
        try FileManager.default.copyItem(atPath: store.data + "/vault", toPath: other + "/vault")
        mkdir(otherMount, 0o755)
        try #require(Run.program(Run.mtmfs, ["mount", "--unlock", "--passphrase-file", store.scratch.sub("pass"), "--data-dir", other,
                                             otherMount]).status == 0)
        #expect(Run.shell("echo relabelled > \(otherMount)/accounts/\(accounts[1])/label").status == 0)
        #expect(Run.mtmfs("unmount", otherMount).status == 0)
        let ours = Set(try FileManager.default.contentsOfDirectory(atPath: store.data + "/vault"))
        for device in try FileManager.default.contentsOfDirectory(atPath: other + "/vault") where !ours.contains(device) {
            try FileManager.default.copyItem(atPath: other + "/vault/" + device, toPath: store.data + "/vault/" + device)
        }
        let synced = heardAll(["PropertiesChanged \(path(accounts[1])) \(itemInterface) Attributes Created Label Modified Type",
                               "ItemChanged \(item(accounts[1]))"], "a synced change")
        #expect(synced.count == 2, "one item's signals, no other: \(synced)")
        #expect(store.field(accounts[1], "label") == "relabelled\n")
    }

    /// A page that sets a cookie at /set and shows `document.cookie` (a local server on a
    /// port of its own, written to `portFile`).
    static let cookieServer = """
        import http.server, sys
        class Page(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                self.send_response(200)
                if self.path.startswith('/set'):
                    self.send_header('Set-Cookie', 'token=chromium-cookie-42; Max-Age=3600; Path=/')
                self.send_header('Content-Type', 'text/html')
                self.end_headers()
                self.wfile.write(b'<html><body><p id="c"></p><script>document.getElementById("c").textContent = '
                                 b'"seen " + document.cookie;</script></body></html>')
            def log_message(self, *a): pass
        server = http.server.HTTPServer(('127.0.0.1', 0), Page)
        open(sys.argv[1], 'w').write(str(server.server_address[1]))
        server.serve_forever()
        """

    /// Chromium keeps its cookies encrypted with a key it stores in the Secret Service
    /// ("Chromium Safe Storage"): a cookie set in one run must decrypt in the next, also
    /// when the mount is locked at the second start (the prompt answered), and the key is
    /// never written twice (a browser that finds none makes a new one: its cookies are lost).
    @Test(.enabled(if: Spawn.exists("chromium")))
    func chromiumsCookiesDecryptInTheNextRunAlsoLockedAtStart() throws {
        let store = try ServedStore(pinentry: true)
        defer { store.close() }
        let portFile = store.scratch.sub("port")
        let server = Run.start("/usr/bin/python3", ["-c", Self.cookieServer, portFile])
        defer {
            kill(-server, SIGTERM)
            _ = Run.wait(server, timeout: 5)
        }
        try #require(Poll.until(seconds: 10) { (TestFile.read(portFile) ?? "").count > 0 })
        let site = "http://127.0.0.1:" + (TestFile.read(portFile) ?? "")
        func browse(_ page: String) -> String {
            let shown = store.run("chromium", ["--headless=new", "--no-sandbox", "--disable-gpu", "--password-store=gnome-libsecret",
                                               "--user-data-dir=" + store.scratch.sub("profile"), "--dump-dom", site + page])
            return shown.stdout.components(separatedBy: "<p id=\"c\">").dropFirst().first?.components(separatedBy: "<").first ?? shown.description
        }
        #expect(browse("/set") == "seen token=chromium-cookie-42")
        #expect(browse("/get") == "seen token=chromium-cookie-42", "the cookie decrypts in the next run")
        #expect(store.run(Run.mtmfs, ["lock", store.mountPoint]).status == 0)
        store.answer("passphrase")
        #expect(browse("/get") == "seen token=chromium-cookie-42", "locked at start: the prompt answered, the same key")
        let keys = store.run("secret-tool", ["search", "--all", "application", "chromium"])
        #expect(keys.stdout.components(separatedBy: "label = Chromium Safe Storage").count - 1 == 1, "one key: \(keys)")
    }

    /// `mtmfs import secret-service` from gnome-keyring on its bus: the same items, in the
    /// files and on the mount's own bus; a second import updates; a locked collection is
    /// refused with nothing changed.
    @Test func importFromARunningSecretService() throws {
        let reference = try ReferenceKeyring()
        defer { reference.close() }
        #expect(reference.run("secret-tool", ["store", "--label=Mail", "server", "mail.example.com", "user", "alice", "protocol", "imaps",
                                              "port", "993"], input: "m41l").status == 0)
        #expect(reference.run("secret-tool", ["store", "--label=App key", "application", "myapp"], input: "k3y").status == 0)
        let store = try ServedStore()
        defer { store.close() }
        func importing() -> CommandResult {
            var environment = reference.bus.environment
            environment["HOME"] = reference.scratch.sub("home")
            return Run.program(Run.mtmfs, ["import", "secret-service", "--mount", store.mountPoint], environment: environment)
        }
        let first = importing()
        #expect(first.stdout == "imported 2 accounts: 2 made, 0 updated\n", "\(first)")
        let mail = try #require(store.accounts.first { store.field($0, "label") == "Mail\n" })
        #expect(store.field(mail, "username") == "alice\n" && store.field(mail, "url") == "imaps://mail.example.com:993\n"
                && store.field(mail, "password") == "m41l\n")
        // On the mount's own bus, as any item.
        #expect(store.run("secret-tool", ["lookup", "server", "mail.example.com", "user", "alice"]).stdout == "m41l")
        #expect(store.run("secret-tool", ["lookup", "application", "myapp"]).stdout == "k3y")
        #expect(importing().stdout == "imported 2 accounts: 0 made, 2 updated\n")
        // gnome-keyring locked: refused, nothing changed.
        #expect(reference.python("""
            import secretstorage
            secretstorage.get_default_collection(secretstorage.dbus_init()).lock()
            """).status == 0)
        let before = store.accounts
        let locked = importing()
        #expect(locked.status == 1 && locked.stderr.contains("is locked"), "\(locked)")
        #expect(store.accounts == before)
    }
}
