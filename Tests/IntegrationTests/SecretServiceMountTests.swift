import Foundation
import Posix
import TestSupport
import Testing
#if canImport(Glibc)
import Glibc
#endif

/// A session bus of the test's own (`dbus-daemon --session --fork`), ended at `close()`.
final class PrivateBus {
    let address: String
    let pid: pid_t

    init() throws {
        let started = Run.program("dbus-daemon", ["--session", "--fork", "--nopidfile", "--print-address=1", "--print-pid=1"])
        let lines = started.stdout.split(separator: "\n").map(String.init)
        try #require(started.status == 0 && lines.count >= 2, "dbus-daemon: \(started)")
        address = lines[0]
        pid = pid_t(lines[1]) ?? 0
    }

    /// Our environment with this bus as the session bus.
    var environment: [String: String] {
        var values = ProcessInfo.processInfo.environment
        values["DBUS_SESSION_BUS_ADDRESS"] = address
        return values
    }

    func close() {
        if pid > 0 { kill(pid, SIGTERM) }
        _ = Poll.until(seconds: 5) { !ProcessState.isRunning(self.pid) }
    }
}

/// A store mounted with `--secret-service` on a private bus.
final class ServedStore {
    let bus: PrivateBus
    let scratch = Scratch("secret-service")
    var data: String { scratch.sub("data") }
    var mountPoint: String { scratch.sub("mnt") }
    private(set) var mountOutput = ""

    /// `pinentry`: prompts go to the test's pinentry (`answer`, `asked`).
    init(unlock: Bool = true, extraMount: [String] = [], pinentry: Bool = false) throws {
        bus = try PrivateBus()
        #expect(Run.initStore(data).status == 0)
        mkdir(mountPoint, 0o755)
        try (Run.passphrase + "\n").write(toFile: scratch.sub("pass"), atomically: true, encoding: .utf8)
        var prompts: [String] = []
        if pinentry {
            try TestFile.writeProgram(GuardedMount.pinentryScript(answers: scratch.sub("answer"), record: scratch.sub("asked")),
                                      to: scratch.sub("pinentry"))
            prompts = ["--pinentry", scratch.sub("pinentry")]
        }
        mountArguments = ["mount", "--secret-service", "--data-dir", data] + extraMount + prompts
        try mount(unlock: unlock)
    }

    private var mountArguments: [String] = []

    private func mount(unlock: Bool) throws {
        let mounted = run(Run.mtmfs, mountArguments + (unlock ? ["--unlock", "--passphrase-file", scratch.sub("pass")] : []) + [mountPoint])
        mountOutput = mounted.stderr
        try #require(mounted.status == 0, "mount: \(mounted)")
    }

    /// Unmounted and mounted again, with the same options (`unlock`: unlocked at once).
    func remount(unlock: Bool) throws {
        try #require(run(Run.mtmfs, ["unmount", mountPoint]).status == 0)
        try mount(unlock: unlock)
    }

    @discardableResult
    func run(_ program: String, _ arguments: [String], input: String? = nil) -> CommandResult {
        Run.program(program, arguments, input: input, environment: bus.environment, timeout: 30)
    }

    @discardableResult
    func python(_ script: String) -> CommandResult { run("/usr/bin/python3", ["-c", script]) }

    func path(_ relative: String) -> String { mountPoint + "/" + relative }

    /// What the test's pinentry answers next (see `GuardedMount.answer`), and all it was told.
    func answer(_ word: String) { try? (word + "\n").write(toFile: scratch.sub("answer"), atomically: true, encoding: .utf8) }
    var asked: String { (try? String(contentsOfFile: scratch.sub("asked"), encoding: .utf8)) ?? "" }

    /// The accounts' directories (UUIDs).
    var accounts: [String] {
        ((try? FileManager.default.contentsOfDirectory(atPath: path("accounts"))) ?? []).filter { $0.count == 36 }.sorted()
    }

    func field(_ account: String, _ name: String) -> String {
        (try? String(contentsOfFile: path("accounts/\(account)/\(name)"), encoding: .utf8)) ?? "?"
    }

    func busctl(_ arguments: [String]) -> CommandResult { run("busctl", ["--user", "--no-pager"] + arguments) }

    /// Python for what no client sends (busctl prints an error's message, never its name):
    /// `call(path, interface, member, signature, body, connection=a)` sends one method call
    /// with jeepney and gives the reply's arguments, or `error NAME`. `a` and `b` are two
    /// connections; `S` and `C` the service's and the collection's paths; `SERVICE`,
    /// `COLLECTION`, `ITEM`, `SESSION`, `PROPERTIES` the interfaces; `DH` the encrypted
    /// session's algorithm.
    static let rawCalls = """
        from jeepney import new_method_call, DBusAddress, MessageType, HeaderFields
        from jeepney.io.blocking import open_dbus_connection
        a, b = open_dbus_connection(bus='SESSION'), open_dbus_connection(bus='SESSION')
        S = '/org/freedesktop/secrets'
        C = S + '/collection/login'
        SERVICE, COLLECTION, ITEM = 'org.freedesktop.Secret.Service', 'org.freedesktop.Secret.Collection', 'org.freedesktop.Secret.Item'
        SESSION, PROPERTIES = 'org.freedesktop.Secret.Session', 'org.freedesktop.DBus.Properties'
        DH = 'dh-ietf1024-sha256-aes128-cbc-pkcs7'
        def call(path, interface, member, signature='', body=(), connection=a):
            address = DBusAddress(path, bus_name='org.freedesktop.secrets', interface=interface)
            reply = connection.send_and_get_reply(new_method_call(address, member, signature, body), timeout=20)
            if reply.header.message_type == MessageType.error:
                return 'error ' + reply.header.fields[HeaderFields.error_name]
            return reply.body

        """

    /// `body` after `rawCalls`.
    @discardableResult
    func raw(_ body: String) -> CommandResult { python(Self.rawCalls + body) }

    func close() {
        if MountTable.isMounted(mountPoint) { run(Run.mtmfs, ["unmount", mountPoint]) }
        if MountTable.isMounted(mountPoint) { Run.program("fusermount3", ["-uz", mountPoint]) }
        bus.close()
        scratch.remove()
    }
}

/// A listener of the service's signals (`SecretServiceMountTests.signalListener`), one line
/// a signal, in a file of the store's scratch directory; ended at `close()`.
final class SignalListener {
    let file: String
    let pid: pid_t
    private var from = 0

    init(_ store: ServedStore) throws {
        file = store.scratch.sub("signals")
        pid = Run.start("/usr/bin/env", ["DBUS_SESSION_BUS_ADDRESS=" + store.bus.address, "/usr/bin/python3", "-c",
                                         SecretServiceMountTests.signalListener], stdout: file, stderr: file)
        try #require(Poll.until(seconds: 10) { self.lines().first == "listening" }, "the listener: \(lines())")
        from = 1
    }

    /// The lines heard since the last `heard`.
    func lines() -> [String] { Array((TestFile.read(file) ?? "").split(separator: "\n").map(String.init).dropFirst(from)) }

    /// Waits until every one of `expected` is heard (and `settle` more), expects it, and
    /// returns what was heard; the next call hears only what comes after.
    @discardableResult
    func heard(_ expected: [String], _ what: String, settle: UInt32 = 0) -> [String] {
        let all = Poll.until(seconds: 10) { expected.allSatisfy(self.lines().contains) }
        if settle > 0 { usleep(settle) }
        let now = lines()
        #expect(all, "\(what): heard \(now)")
        from += now.count
        return now
    }

    func close() {
        kill(pid, SIGTERM)
        _ = Run.wait(pid, timeout: 5)
    }
}

/// gnome-keyring's Secret Service on a bus of its own (the reference): a fresh login
/// keyring in the scratch home, unlocked with a password on standard input.
final class ReferenceKeyring {
    let bus: PrivateBus
    let scratch = Scratch("gnome-keyring")
    private var pid: pid_t = 0

    init() throws {
        bus = try PrivateBus()
        for directory in ["home", "run"] { mkdir(scratch.sub(directory), 0o700) }
        try "reference".write(toFile: scratch.sub("password"), atomically: true, encoding: .utf8)
        pid = Run.start("/usr/bin/env", ["DBUS_SESSION_BUS_ADDRESS=\(bus.address)", "HOME=\(scratch.sub("home"))",
                                          "XDG_RUNTIME_DIR=\(scratch.sub("run"))", "gnome-keyring-daemon", "--unlock",
                                          "--components=secrets", "--foreground"], stdin: scratch.sub("password"))
        let up = Poll.until(seconds: 10) {
            Run.program("busctl", ["--user", "status", "org.freedesktop.secrets"], environment: self.bus.environment).status == 0
        }
        try #require(up, "gnome-keyring-daemon did not take the name")
    }

    func python(_ script: String) -> CommandResult {
        var environment = bus.environment
        environment["HOME"] = scratch.sub("home")
        return Run.program("/usr/bin/python3", ["-c", script], environment: environment, timeout: 30)
    }

    func close() {
        if pid > 0 {
            kill(pid, SIGTERM)
            if Run.wait(pid, timeout: 5) == -1 { kill(pid, SIGKILL); _ = Run.wait(pid, timeout: 5) }
        }
        bus.close()
        scratch.remove()
    }
}

/// SPEC §2c through real clients on a private session bus: libsecret's `secret-tool`,
/// Python's `secretstorage` and `keyring`, and `busctl` for what no client sends.
@Suite(.serialized, .enabled(if: FuseAvailability.isAvailable && Spawn.exists("dbus-daemon") && Spawn.exists("secret-tool")))
struct SecretServiceMountTests {
    @Test func secretToolStoresLooksUpSearchesAndClears() throws {
        let store = try ServedStore()
        defer { store.close() }
        let stored = store.run("secret-tool", ["store", "--label=Mail", "service", "mail", "user", "alice", "server", "imap.example.org"],
                               input: "s3cret")
        #expect(stored.status == 0, "\(stored)")
        #expect(store.run("secret-tool", ["lookup", "service", "mail", "user", "alice"]).stdout == "s3cret")
        // One account, its fields in files: the mapped attributes are fields.
        let accounts = store.accounts
        try #require(accounts.count == 1, "\(accounts)")
        let account = accounts[0]
        #expect(store.field(account, "password") == "s3cret\n")
        #expect(store.field(account, "label") == "Mail\n")
        #expect(store.field(account, "username") == "alice\n")
        #expect(store.field(account, "server") == "imap.example.org\n")
        // (secret-tool prints the attributes on standard error.)
        let search = store.run("secret-tool", ["search", "--all", "service", "mail"])
        let found = search.stdout + search.stderr
        #expect(found.contains("label = Mail") && found.contains("attribute.service = mail")
                && found.contains("attribute.user = alice") && found.contains("secret = s3cret"), "\(search)")
        // A change in a file shows on the bus at once.
        #expect(Run.shell("echo changed > \(store.path("accounts/\(account)/password"))").status == 0)
        #expect(store.run("secret-tool", ["lookup", "service", "mail", "user", "alice"]).stdout == "changed")
        // Stored again with the same attributes: replaced in place (libsecret's replace).
        #expect(store.run("secret-tool", ["store", "--label=Mail 2", "service", "mail", "user", "alice", "server", "imap.example.org"],
                          input: "second").status == 0)
        #expect(store.accounts == [account])
        #expect(store.field(account, "password") == "second\n" && store.field(account, "label") == "Mail 2\n")
        // Other attributes narrow the search; an unknown value finds nothing.
        #expect(store.run("secret-tool", ["lookup", "service", "other"]).status != 0)
        #expect(store.run("secret-tool", ["clear", "service", "mail", "user", "alice"]).status == 0)
        #expect(store.accounts.isEmpty)
        // Nothing of it in clear in the data directory.
        #expect(Run.shell("grep -rl -e second -e alice -e 'service' \(store.data)/vault").stdout.isEmpty)
    }

    @Test func secretstorageSeesTheSameItemsAsTheFiles() throws {
        let store = try ServedStore()
        defer { store.close() }
        // An account made with mkdir is an item.
        let made = "0d5c7a1e-3b2f-4c6d-8e9f-a0b1c2d3e4f5"
        #expect(Run.shell("""
            mkdir \(store.path("accounts/\(made)")) && cd \(store.path("accounts/\(made)")) &&
            echo bob > username && echo git.example.org > server && echo 'Git' > label && echo hunter2 > password
            """).status == 0)
        // Run with each session kind: dh-ietf1024-sha256-aes128-cbc-pkcs7 (secretstorage's
        // first choice), then plain (its fallback, forced by naming an algorithm no service has).
        func script(encrypted: Bool) -> String { """
            import secretstorage, secretstorage.util
            \(encrypted ? "" : "secretstorage.util.ALGORITHM_DH = 'none-such'")
            connection = secretstorage.dbus_init()
            collection = secretstorage.get_default_collection(connection)
            collection.session = secretstorage.util.open_session(connection)
            assert collection.session.encrypted == \(encrypted ? "True" : "False")
            assert not collection.is_locked()
            [made] = list(collection.search_items({"user": "bob", "server": "git.example.org"}))
            assert made.get_label() == "Git", made.get_label()
            assert made.get_secret() == b"hunter2", made.get_secret()
            assert made.get_attributes() == {"user": "bob", "server": "git.example.org"}, made.get_attributes()
            item = collection.create_item("Py", {"application": "test", "user": "carol"}, b"pw1")
            assert item.get_secret() == b"pw1" and item.get_secret_content_type() == "text/plain"
            item.set_label("Py 2")
            item.set_attributes({"application": "test", "user": "carol", "extra": "a b"})
            assert item.get_label() == "Py 2" and item.get_attributes()["extra"] == "a b"
            binary = collection.create_item("Bin", {"application": "bin"}, b"\\x00\\x01\\xff", content_type="application/octet-stream")
            assert binary.get_secret() == b"\\x00\\x01\\xff" and binary.get_secret_content_type() == "application/octet-stream"
            empty = collection.create_item("Empty", {"application": "empty"}, b"")
            assert empty.get_secret() == b""
            twin = collection.create_item("Twin", {"application": "test", "user": "carol", "extra": "a b"}, b"pw2")
            assert len(list(collection.search_items({"application": "test"}))) == 2
            print(item.item_path.split("/")[-1])
            """
        }
        let encrypted = store.python(script(encrypted: true))
        #expect(encrypted.status == 0, "\(encrypted)")
        for account in store.accounts where account != made { #expect(Run.shell("rm -r \(store.path("accounts/\(account)"))").status == 0) }
        let result = store.python(script(encrypted: false))
        #expect(result.status == 0, "\(result)")
        // The item made on the bus is an account; its attributes beyond the fields are files' too.
        let accounts = store.accounts
        #expect(accounts.count == 5, "\(accounts)")
        let renamed = accounts.first { store.field($0, "label") == "Py 2\n" }
        #expect(renamed.map { store.field($0, "username") } == "carol\n")
        #expect(renamed.map { store.field($0, "password") } == "pw1\n")
        // A secret that is not text: its bytes, and the one newline of every field.
        let binary = accounts.first { store.field($0, "label") == "Bin\n" }
        #expect(binary.map { Run.shell("od -An -tx1 \(store.path("accounts/\($0)/password"))").stdout } == " 00 01 ff 0a\n")
    }

    @Test func pythonKeyringUsesIt() throws {
        let store = try ServedStore()
        defer { store.close() }
        let result = store.python("""
            import keyring
            from keyring.backends import SecretService
            keyring.set_keyring(SecretService.Keyring())
            keyring.set_password("svc", "dave", "pw")
            assert keyring.get_password("svc", "dave") == "pw"
            keyring.set_password("svc", "dave", "pw2")
            assert keyring.get_password("svc", "dave") == "pw2"
            keyring.delete_password("svc", "dave")
            assert keyring.get_password("svc", "dave") is None
            print("ok")
            """)
        #expect(result.stdout == "ok\n", "\(result)")
    }

    /// One secretstorage script run against mtmfs and against gnome-keyring gives the same
    /// answers: items made, replaced in place, two alike, a binary and an empty secret,
    /// labels and attributes changed, searches by one and two attributes, a deletion, a lock
    /// and a search while locked. Told apart only where gnome-keyring loses something: it
    /// drops content types, and adds `xdg:schema` to an item now and then; the comparison
    /// leaves both out, and mtmfs's content type is checked on its own.
    @Test(.enabled(if: Spawn.exists("gnome-keyring-daemon"))) func theSameScriptAnswersAsGnomeKeyring() throws {
        let script = #"""
            import secretstorage
            c = secretstorage.dbus_init()
            col = secretstorage.get_default_collection(c)
            out = []
            def show(tag, items):
                rows = sorted((i.get_label(), sorted((k, v) for k, v in i.get_attributes().items() if k != 'xdg:schema'),
                               i.get_secret()) for i in items)
                out.append(tag + ': ' + repr(rows))
            mail = {'service': 'mail', 'user': 'alice', 'server': 'imap.example.org'}
            a = col.create_item('Mail', mail, b's3cret')
            show('created', col.search_items({'service': 'mail'}))
            col.create_item('Mail 2', mail, b'second', replace=True)
            show('replaced', col.search_items({'service': 'mail'}))
            out.append('same path after replace: %s' % (a.item_path == list(col.search_items(mail))[0].item_path))
            col.create_item('Mail 3', mail, b'third', replace=False)
            show('two alike', col.search_items({'service': 'mail'}))
            b = col.create_item('Bin', {'kind': 'binary'}, b'\x00\x01\xff', content_type='application/octet-stream')
            show('binary', col.search_items({'kind': 'binary'}))
            types = [i.get_secret_content_type() for i in col.search_items({'kind': 'binary'})]
            col.create_item('Empty', {'kind': 'empty'}, b'')
            show('empty', col.search_items({'kind': 'empty'}))
            b.set_label('Bin 2')
            b.set_attributes({'kind': 'binary', 'extra': 'x'})
            show('relabelled', col.search_items({'kind': 'binary'}))
            show('by extra', col.search_items({'extra': 'x'}))
            show('by two', col.search_items({'service': 'mail', 'user': 'alice'}))
            show('none', col.search_items({'kind': 'none'}))
            show('empty value', col.search_items({'kind': ''}))
            b.delete()
            show('deleted', col.search_items({'kind': 'binary'}))
            out.append('items: %d' % len(list(col.get_all_items())))
            out.append('locked: %s, label: %s' % (col.is_locked(), col.get_label()))
            col.lock()
            found = list(col.search_items({'service': 'mail'}))
            out.append('after Lock: %s; search: %d items, locked %s' % (col.is_locked(), len(found), [i.is_locked() for i in found]))
            print('\n'.join(out))
            print('content types: %s' % types)
            """#
        let reference = try ReferenceKeyring()
        let expected = reference.python(script)
        reference.close()
        try #require(expected.status == 0, "gnome-keyring: \(expected)")
        let store = try ServedStore()
        defer { store.close() }
        let ours = store.python(script)
        try #require(ours.status == 0, "mtmfs: \(ours)")
        let answers = { (result: CommandResult) in result.stdout.split(separator: "\n").filter { !$0.hasPrefix("content types") } }
        #expect(answers(ours) == answers(expected), "mtmfs:\n\(ours.stdout)\ngnome-keyring:\n\(expected.stdout)")
        #expect(ours.stdout.contains("content types: ['application/octet-stream']"), "\(ours.stdout)")
        #expect(answers(ours).count == 15, "\(ours.stdout)")
    }

    /// Attributes other than the mapped ones are files of `accounts/<UUID>/attributes/`,
    /// edited like fields (echo, sed -i, rm, mv), and a change on either side shows on the other.
    @Test func attributesAreFilesEditedLikeFields() throws {
        let store = try ServedStore()
        defer { store.close() }
        func bus(_ body: String) -> String {
            let result = store.python("""
                import secretstorage
                connection = secretstorage.dbus_init()
                collection = secretstorage.get_default_collection(connection)
                items = list(collection.get_all_items())
                \(body)
                """)
            return result.stdout.trimmingCharacters(in: .whitespacesAndNewlines) + (result.status == 0 ? "" : " [\(result.stderr)]")
        }
        #expect(bus("collection.create_item('Mail', {'service': 'mail', 'xdg:schema': 'org.example.Mail', 'a/b': 'slash', "
                    + "'user': 'alice'}, b's3cret'); print('made')") == "made")
        let account = try #require(store.accounts.first)
        let attributes = store.path("accounts/\(account)/attributes")
        let listed = (try? FileManager.default.contentsOfDirectory(atPath: attributes))?.sorted() ?? []
        #expect(listed == ["a%2Fb", "service", "xdg:schema"], "the mapped user is the username field: \(listed)")
        #expect(store.field(account, "attributes/service") == "mail\n")
        #expect(store.field(account, "attributes/a%2Fb") == "slash\n")
        #expect(store.field(account, "username") == "alice\n")
        func attributesOnTheBus() -> String { bus("print(sorted(items[0].get_attributes().items()))") }

        #expect(Run.shell("echo imap > \(attributes)/service && sed -i s/Mail/Post/ '\(attributes)/xdg:schema'").status == 0)
        #expect(Run.shell("echo new > \(attributes)/extra && mv \(attributes)/a%2Fb \(attributes)/moved").status == 0)
        #expect(attributesOnTheBus() == "[('extra', 'new'), ('moved', 'slash'), ('service', 'imap'), ('user', 'alice'), "
                + "('xdg:schema', 'org.example.Post')]")
        #expect(bus("print(len(list(collection.search_items({'extra': 'new'}))))") == "1", "found by the new attribute")
        // vim's save (a backup renamed away, a new file written, the backup removed).
        let edited = Run.program("vim", ["-es", "-u", "NONE", "-c", "%s/new/newer/", "-c", "wq", attributes + "/extra"])
        #expect(edited.status == 0, "\(edited)")
        #expect(bus("print(items[0].get_attributes()['extra'])") == "newer")
        #expect((try? FileManager.default.contentsOfDirectory(atPath: attributes))?.sorted() == ["extra", "moved", "service", "xdg:schema"])
        #expect(Run.shell("rm \(attributes)/extra").status == 0)
        #expect(attributesOnTheBus() == "[('moved', 'slash'), ('service', 'imap'), ('user', 'alice'), ('xdg:schema', 'org.example.Post')]")
        // Changed on the bus: the files follow at once.
        #expect(bus("items[0].set_attributes({'service': 'smtp', 'user': 'alice', '..': 'dots'}); print('set')") == "set")
        #expect(store.field(account, "attributes/service") == "smtp\n")
        #expect(store.field(account, "attributes/%2E%2E") == "dots\n")
        #expect(!FileManager.default.fileExists(atPath: attributes + "/moved"))
        // What an attribute cannot hold, and what the directory cannot have.
        let twoLines = Run.program("/usr/bin/python3", ["-c", "import os, sys; fd = os.open(sys.argv[1], os.O_WRONLY | os.O_TRUNC); "
                                                        + "os.write(fd, b'a\\nb\\n')", attributes + "/service"])
        #expect(twoLines.status != 0 && twoLines.stderr.contains("Invalid argument"), "\(twoLines)")
        #expect(store.field(account, "attributes/service") == "smtp\n")
        #expect(Run.shell("mkdir \(attributes)/d").stderr.contains("Permission denied"))
        #expect(Run.shell("mv \(attributes)/service \(store.path("accounts/\(account)"))/label").status != 0, "not a field's")
        // `rm -r` of the account takes its attributes with it.
        let removed = Run.shell("rm -r \(store.path("accounts/\(account)"))")
        #expect(removed.status == 0, "\(removed)")
        #expect(store.accounts.isEmpty && bus("print(len(items))") == "0")
    }

    @Test func lockedAndUnlockedOnTheBus() throws {
        let store = try ServedStore(pinentry: true)
        defer { store.close() }
        #expect(store.run("secret-tool", ["store", "--label=L", "service", "s"], input: "v").status == 0)
        #expect(store.run(Run.mtmfs, ["lock", store.mountPoint]).status == 0)
        let locked = store.python("""
            import secretstorage
            from secretstorage.exceptions import LockedException
            connection = secretstorage.dbus_init()
            collection = secretstorage.get_default_collection(connection)
            assert collection.is_locked()
            try:
                collection.create_item("x", {"a": "b"}, b"c")
                print("created while locked")
            except LockedException:
                print("refused")
            """)
        #expect(locked.stdout == "refused\n", "\(locked)")
        // Locked, a search finds the item in its locked list, and Unlock's prompt asks for
        // the passphrase: cancelled, or wrong three times, it stays locked.
        store.answer("cancel")
        #expect(store.run("secret-tool", ["lookup", "service", "s"]).status != 0)
        #expect(store.asked.components(separatedBy: "GETPIN").count - 1 == 1, "\(store.asked)")
        store.answer("wrong")
        #expect(store.run("secret-tool", ["lookup", "service", "s"]).status != 0)
        #expect(store.asked.components(separatedBy: "GETPIN").count - 1 == 4, "three tries: \(store.asked)")
        #expect(store.asked.contains("SETERROR Wrong passphrase"), "\(store.asked)")
        #expect(Run.shell("grep -x state=locked \(store.path(".mtmfs/status"))").status == 0)
        #expect(store.asked.contains("SETDESC") && store.asked.contains("secret-tool"), "the prompt names the caller")
        // A pinentry that asked the Secret Service for a cached passphrase would ask this
        // very service: its external cache is never offered.
        #expect(!store.asked.contains("allow-external-password-cache") && !store.asked.contains("SETKEYINFO"), "\(store.asked)")
        // The passphrase: unlocked, and the lookup that asked gets its secret.
        store.answer("passphrase")
        #expect(store.run("secret-tool", ["lookup", "service", "s"]).stdout == "v")
        #expect(Run.shell("grep -x state=unlocked \(store.path(".mtmfs/status"))").status == 0)
        #expect(store.run(Run.mtmfs, ["lock", store.mountPoint]).status == 0)
        #expect(store.run(Run.mtmfs, ["unlock", "--passphrase-file", store.scratch.sub("pass"), store.mountPoint]).status == 0)
        #expect(store.run("secret-tool", ["lookup", "service", "s"]).stdout == "v")
        // Lock on the bus locks the mount.
        let lock = store.busctl(["call", "org.freedesktop.secrets", "/org/freedesktop/secrets", "org.freedesktop.Secret.Service",
                                 "Lock", "ao", "1", "/org/freedesktop/secrets/collection/login"])
        #expect(lock.status == 0, "\(lock)")
        #expect(Run.shell("grep -x state=locked \(store.path(".mtmfs/status"))").status == 0)
    }

    /// Before a mount's first unlock nothing can be found (the attributes are sealed): a
    /// search waits and asks for the passphrase, never answering "nothing" (a browser would
    /// write a new key over its old one).
    @Test func aSearchBeforeTheFirstUnlockAsksForThePassphrase() throws {
        let store = try ServedStore(pinentry: true)
        defer { store.close() }
        #expect(store.run("secret-tool", ["store", "--label=Chrome Safe Storage", "application", "chrome"], input: "key1").status == 0)
        try store.remount(unlock: false)
        #expect(Run.shell("grep -x state=locked \(store.path(".mtmfs/status"))").status == 0)
        // Cancelled: IsLocked, not an empty list.
        store.answer("cancel")
        let search = store.busctl(["call", "org.freedesktop.secrets", "/org/freedesktop/secrets", "org.freedesktop.Secret.Service",
                                   "SearchItems", "a{ss}", "1", "application", "chrome"])
        #expect(search.status != 0 && search.stderr.contains("locked"), "\(search)")
        #expect(store.asked.components(separatedBy: "GETPIN").count - 1 == 1, "\(store.asked)")
        let collection = store.busctl(["call", "org.freedesktop.secrets", "/org/freedesktop/secrets/collection/login",
                                       "org.freedesktop.Secret.Collection", "SearchItems", "a{ss}", "1", "application", "chrome"])
        #expect(collection.status != 0 && collection.stderr.contains("locked"), "\(collection)")
        #expect(Run.shell("grep -x state=locked \(store.path(".mtmfs/status"))").status == 0)
        // Given: the search that asked is answered, with the item.
        store.answer("passphrase")
        #expect(store.run("secret-tool", ["lookup", "application", "chrome"]).stdout == "key1")
        #expect(Run.shell("grep -x state=unlocked \(store.path(".mtmfs/status"))").status == 0)
        // Locked again, the index the lock kept answers at once, without asking.
        #expect(store.run(Run.mtmfs, ["lock", store.mountPoint]).status == 0)
        let before = store.asked.components(separatedBy: "GETPIN").count
        let locked = store.busctl(["call", "org.freedesktop.secrets", "/org/freedesktop/secrets", "org.freedesktop.Secret.Service",
                                   "SearchItems", "a{ss}", "1", "application", "chrome"])
        #expect(locked.status == 0 && locked.stdout.hasPrefix("aoao 0 1 "), "\(locked)")
        #expect(store.asked.components(separatedBy: "GETPIN").count == before)
        // A search waiting while the mount is unlocked another way is answered then, and
        // its dialog goes.
        try store.remount(unlock: false)
        store.answer("hang")
        let output = store.scratch.sub("waiting.out")
        let waiting = Run.start("/usr/bin/env", ["DBUS_SESSION_BUS_ADDRESS=" + store.bus.address, "busctl", "--user", "--no-pager",
                                                 "call", "org.freedesktop.secrets", "/org/freedesktop/secrets",
                                                 "org.freedesktop.Secret.Service", "SearchItems", "a{ss}", "1", "application", "chrome"],
                                stdout: output, stderr: output)
        #expect(waiting > 0)
        #expect(Poll.until(seconds: 10) { store.asked.components(separatedBy: "GETPIN").count > before }, "\(store.asked)")
        #expect(store.run(Run.mtmfs, ["unlock", "--passphrase-file", store.scratch.sub("pass"), store.mountPoint]).status == 0)
        #expect(Run.wait(waiting, timeout: 10) == 0)
        let answered = (try? String(contentsOfFile: output, encoding: .utf8)) ?? ""
        #expect(answered.hasPrefix("aoao 1 "), "\(answered)")
        #expect(Poll.until(seconds: 5) { Run.shell("pgrep -f '^/bin/sh \(store.scratch.sub("pinentry"))'").stdout.isEmpty }, "the dialog went")
    }

    /// What no client sends gets the specification's error by its name (the Secret
    /// Service's NoSuchObject and NoSession, D-Bus's for the rest), and changes nothing.
    @Test func badInputGetsTheSpecificationsErrors() throws {
        let store = try ServedStore()
        defer { store.close() }
        #expect(store.run("secret-tool", ["store", "--label=L", "service", "s"], input: "v").status == 0)
        let secret = "org.freedesktop.Secret.Error.", dbus = "org.freedesktop.DBus.Error."
        let invalidArgs = [dbus + "InvalidArgs"], noSession = [secret + "NoSession"], notSupported = [dbus + "NotSupported"]
        let unknownObject = [dbus + "UnknownObject"], noSuchObject = [secret + "NoSuchObject"], unknownMethod = [dbus + "UnknownMethod"]
        // (An unknown interface: D-Bus has UnknownInterface; GDBus, and so gnome-keyring, says UnknownMethod.)
        let unknownInterface = [dbus + "UnknownInterface", dbus + "UnknownMethod"]
        let unknownProperty = [dbus + "UnknownInterface", dbus + "UnknownProperty", dbus + "InvalidArgs"]
        let noSuchInterface = [dbus + "UnknownInterface", dbus + "InvalidArgs"]
        let readOnly = [dbus + "PropertyReadOnly", dbus + "AccessDenied"]
        let notYours = [secret + "NoSession", dbus + "AccessDenied", dbus + "UnknownObject"]
        // Each a Python call with PATH the item and SA a plain session of connection a, and
        // the names its error may have. In order: SA is closed by b near the end.
        let cases: [(call: String, names: [String], what: String)] = [
            ("call(S, SERVICE, 'OpenSession', 'sv', ('dh-ietf512-bogus', ('s', '')))", notSupported, "an unknown session algorithm"),
            ("call(S, SERVICE, 'OpenSession', 'sv', (DH, ('s', 'abc')))", invalidArgs, "a DH input that is no ay"),
            ("call(S, SERVICE, 'OpenSession', 'sv', (DH, ('ay', bytes([5] * 129))))", invalidArgs, "a DH public key longer than the group's 128 bytes"),
            ("call(S, SERVICE, 'OpenSession', 'sv', (DH, ('ay', b'')))", invalidArgs, "an empty DH public key"),
            ("call(S, SERVICE, 'OpenSession', 'sv', (DH, ('ay', bytes([1]))))", invalidArgs, "a DH public key of 1 (its powers are trivial)"),
            ("call(S, SERVICE, 'OpenSession', 's', ('plain',))", invalidArgs, "OpenSession without its input"),
            // (What secretstorage and libsecret map to "no such item", as gnome-keyring's answer is mapped.)
            ("call(C + '/00', ITEM, 'GetSecret', 'o', ('/',))", noSuchObject, "a path under the collection that is no item's"),
            ("call(S + '/collection/nothing', PROPERTIES, 'Get', 'ss', (COLLECTION, 'Label'))", noSuchObject, "a collection that does not exist"),
            ("call(C + '/' + '0' * 32, ITEM, 'GetSecret', 'o', ('/',))", noSuchObject, "an item that does not exist"),
            ("call(S + '/nothing', 'org.freedesktop.DBus.Introspectable', 'Introspect')", unknownObject, "an unknown path"),
            ("call(S, SERVICE, 'NoSuchMethod')", unknownMethod, "an unknown method"),
            ("call(S, 'org.example.Nothing', 'OpenSession', 'sv', ('plain', ('s', '')))", unknownInterface, "an unknown interface on the service"),
            ("call(C, 'org.example.Nothing', 'SearchItems', 'a{ss}', ({},))", unknownInterface, "an unknown interface on the collection"),
            ("call(PATH, 'org.example.Nothing', 'GetSecret', 'o', (SA,))", unknownInterface, "an unknown interface on an item"),
            ("call(C, SERVICE, 'OpenSession', 'sv', ('plain', ('s', '')))", unknownInterface, "the service's method on the collection"),
            ("call(S, PROPERTIES, 'Get', 'ss', ('org.example.Nothing', 'Collections'))", unknownProperty, "a property of an unknown interface"),
            ("call(S, PROPERTIES, 'GetAll', 's', ('org.example.Nothing',))", noSuchInterface,
             "all properties of an unknown interface: an error, not an empty list"),
            ("call(S, SERVICE, 'SearchItems', 's', ('x',))", invalidArgs, "a wrong signature"),
            ("call(C, COLLECTION, 'CreateItem', 'a{sv}sb', ({}, 'x', False))", invalidArgs, "CreateItem with a secret that is no (oayays)"),
            ("call(C, COLLECTION, 'CreateItem', 'a{sv}(oayays)b', ({'org.freedesktop.Secret.Item.Label': ('i', 1)}, (SA, b'', b'new', 'text/plain'), False))",
             invalidArgs, "CreateItem with a label that is no string"),
            ("call(PATH, PROPERTIES, 'Set', 'ssv', (ITEM, 'Label', ('i', 5)))", invalidArgs, "Properties.Set of Label with an integer"),
            ("call(PATH, PROPERTIES, 'Set', 'ssv', (ITEM, 'Attributes', ('s', 'x')))", invalidArgs, "Properties.Set of Attributes with a string"),
            ("call(PATH, PROPERTIES, 'Set', 'ssv', (ITEM, 'Locked', ('b', True)))", readOnly, "Properties.Set of a read-only property"),
            ("call(PATH, ITEM, 'GetSecret', 'o', (S + '/session/s999',))", noSession, "a session that does not exist"),
            ("call(PATH, ITEM, 'GetSecret', 'o', (SA,), connection=b)", noSession, "another connection's session"),
            ("call(PATH, ITEM, 'SetSecret', '(oayays)', ((SA, b'', b'x', 'text/plain'),), connection=b)", noSession,
             "SetSecret with another connection's session"),
            ("call(S, SERVICE, 'GetSecrets', 'aoo', ([PATH], SA), connection=b)", noSession, "GetSecrets with another connection's session"),
            ("call(PATH, ITEM, 'SetSecret', '(oayays)', ((SA, b'0' * 16, b'x', 'text/plain'),))", invalidArgs,
             "a plain session's secret with parameters"),
            ("call(C, COLLECTION, 'Delete')", notSupported, "deleting the collection"),
            ("call(SA, SESSION, 'Close', connection=b)", notYours, "closing another connection's session"),
        ]
        let calls = cases.map { "print(\($0.call))" }.joined(separator: "\n")
        let result = store.raw("""
            [[PATH], _] = call(S, SERVICE, 'SearchItems', 'a{ss}', ({'service': 's'},))
            [_, SA] = call(S, SERVICE, 'OpenSession', 'sv', ('plain', ('s', '')))
            \(calls)
            answer = call(PATH, ITEM, 'GetSecret', 'o', (SA,))
            print('still open' if not isinstance(answer, str) and answer[0][2] == b'v' else answer)
            print(PATH)
            """)
        try #require(result.status == 0, "\(result)")
        let answers = result.stdout.split(separator: "\n").map(String.init)
        try #require(answers.count == cases.count + 2, "\(result)")
        for (answer, expected) in zip(answers, cases) {
            #expect(expected.names.contains { answer == "error " + $0 }, "\(expected.what): \(answer)")
        }
        #expect(answers[cases.count] == "still open", "a session is closed only by its own connection (or its end)")
        let itemPath = answers[cases.count + 1]
        // Secrets of an encrypted session with a wrong IV, length or padding.
        let tampered = store.python("""
            import os, secretstorage, secretstorage.util
            from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
            connection = secretstorage.dbus_init()
            collection = secretstorage.get_default_collection(connection)
            session = secretstorage.util.open_session(connection)
            assert session.encrypted
            iv = os.urandom(16)
            encryptor = Cipher(algorithms.AES(session.aes_key), modes.CBC(iv)).encryptor()
            bad_padding = encryptor.update(bytes(16)) + encryptor.finalize()
            properties = {"org.freedesktop.Secret.Item.Label": ("s", "bad"),
                          "org.freedesktop.Secret.Item.Attributes": ("a{ss}", {"bad": "1"})}
            for (parameters, value) in [(iv, bad_padding), (iv[:8], bad_padding), (iv, bad_padding[:15]), (iv, b"")]:
                try:
                    collection._collection.call("CreateItem", "a{sv}(oayays)b", properties,
                                                (session.object_path, parameters, value, "text/plain"), False)
                    print("accepted")
                except Exception as error:
                    print("refused" if "InvalidArgs" in str(type(error)) + str(error.args) else "other: %r" % (error,))
            """)
        #expect(tampered.stdout == "refused\nrefused\nrefused\nrefused\n", "\(tampered)")
        let accounts = store.accounts
        #expect(accounts.count == 1, "nothing made: \(accounts)")
        #expect(accounts.first.map { store.field($0, "label") } == "L\n", "nothing changed")
        #expect(store.run("secret-tool", ["lookup", "service", "s"]).stdout == "v", "nothing changed")
        // Introspection lists the item under the collection.
        let introspected = store.busctl(["introspect", "--xml-interface", "org.freedesktop.secrets", "/org/freedesktop/secrets/collection/login"])
        #expect(introspected.stdout.contains("<node name=\"\(itemPath.split(separator: "/").last ?? "")\"/>"), "\(introspected)")
    }

    /// The name held by another program: the mount says who in one line, and serves the files.
    @Test func aSecondMountFindsTheNameTaken() throws {
        let first = try ServedStore()
        defer { first.close() }
        let scratch = Scratch("secret-service-second")
        defer { scratch.remove() }
        let (data, mnt) = scratch.initializedStore()
        let second = first.run(Run.mtmfs, ["mount", "--secret-service", "--data-dir", data, mnt])
        defer { first.run(Run.mtmfs, ["unmount", mnt]) }
        #expect(second.status == 0, "\(second)")
        #expect(second.stderr.contains("org.freedesktop.secrets is taken by mtmfs"), "\(second)")
        #expect(second.stderr.split(separator: "\n").count == 1, "one line: \(second.stderr)")
        #expect(FileManager.default.fileExists(atPath: mnt + "/settings/IsFirstRun"))
    }

    /// `--secret-service=replace` takes the name from an owner that lets it go (a mount
    /// asks for the name allowing that): no line about the name, and the clients now reach
    /// the new mount's accounts; the first mount serves its files on.
    @Test func replaceTakesTheNameFromAMountThatAllowsIt() throws {
        let first = try ServedStore()
        defer { first.close() }
        let scratch = Scratch("secret-service-replace")
        defer { scratch.remove() }
        let (data, mnt) = scratch.initializedStore()
        let second = first.run(Run.mtmfs, ["mount", "--secret-service=replace", "--data-dir", data, "--unlock", "--passphrase-file",
                                           first.scratch.sub("pass"), mnt])
        // (Unmounted before the bus ends. Nobody is asked for the name after: a session bus
        // would start gnome-keyring for it.)
        defer { first.run(Run.mtmfs, ["unmount", mnt]) }
        try #require(second.status == 0, "\(second)")
        #expect(!second.stderr.contains("org.freedesktop.secrets"), "taken without a word: \(second.stderr)")
        let owner = first.busctl(["status", "org.freedesktop.secrets"]).stdout.split(separator: "\n").first { $0.hasPrefix("PID=") }
        let pid = try MountStatus.read(mnt)["pid"] ?? "?"
        #expect(owner.map(String.init) == "PID=" + pid, "the name is the second mount's")
        #expect(first.run("secret-tool", ["store", "--label=New", "service", "new"], input: "n").status == 0)
        let made = (try? FileManager.default.contentsOfDirectory(atPath: mnt + "/accounts"))?.filter { $0.count == 36 } ?? []
        #expect(made.count == 1, "\(made)")
        #expect(first.accounts.isEmpty, "nothing went to the first mount")
        #expect(FileManager.default.fileExists(atPath: first.path("settings/IsFirstRun")), "the first mount serves its files")
    }

    /// gnome-keyring does not let its name be taken: `--secret-service=replace` says so in
    /// one line naming it, and the mount serves the files without the bus.
    @Test(.enabled(if: Spawn.exists("gnome-keyring-daemon"))) func replaceLeavesGnomeKeyringItsName() throws {
        let reference = try ReferenceKeyring()
        defer { reference.close() }
        let scratch = Scratch("secret-service-keyring")
        defer { scratch.remove() }
        let (data, mnt) = scratch.initializedStore()
        func status() -> String { Run.program("busctl", ["--user", "status", "org.freedesktop.secrets"], environment: reference.bus.environment).stdout }
        let keyring = status().split(separator: "\n").first { $0.hasPrefix("PID=") }
        try #require(keyring != nil, "\(status())")
        let mounted = Run.program(Run.mtmfs, ["mount", "--secret-service=replace", "--data-dir", data, mnt], environment: reference.bus.environment)
        defer { Run.mtmfs("unmount", mnt) }
        #expect(mounted.status == 0, "\(mounted)")
        #expect(mounted.stderr.contains("org.freedesktop.secrets is taken by gnome-keyring")
                && mounted.stderr.contains("does not let it be replaced"), "\(mounted)")
        #expect(mounted.stderr.split(separator: "\n").count == 1, "one line: \(mounted.stderr)")
        #expect(status().split(separator: "\n").first { $0.hasPrefix("PID=") } == keyring, "gnome-keyring keeps it")
        #expect(FileManager.default.fileExists(atPath: mnt + "/settings/IsFirstRun"))
    }

    /// Two collections (SPEC §2c): the vault's (aliases `default` and `login`) and the
    /// session's (alias `session`). CreateCollection with one of those aliases gives its
    /// collection back (no prompt), any other is NotSupported; ReadAlias names them, "/" for
    /// any other; /org/freedesktop/secrets/aliases/default is an object of its own with the
    /// collection's properties and items.
    @Test func theAliasesNameTheTwoCollections() throws {
        let store = try ServedStore()
        defer { store.close() }
        #expect(store.run("secret-tool", ["store", "--label=L", "service", "s"], input: "v").status == 0)
        let result = store.raw("""
            import secretstorage
            [[PATH], _] = call(S, SERVICE, 'SearchItems', 'a{ss}', ({'service': 's'},))
            label = {'org.freedesktop.Secret.Collection.Label': ('s', 'Another')}
            print(call(S, SERVICE, 'CreateCollection', 'a{sv}s', (label, 'default')))
            print(call(S, SERVICE, 'CreateCollection', 'a{sv}s', (label, 'another')))
            print(call(S, SERVICE, 'CreateCollection', 'a{sv}s', (label, '')))
            print(secretstorage.create_collection(secretstorage.dbus_init(), 'Another', 'default').collection_path)
            print(call(S, SERVICE, 'ReadAlias', 's', ('default',)))
            print(call(S, SERVICE, 'ReadAlias', 's', ('login',)))
            print(call(S, SERVICE, 'ReadAlias', 's', ('another',)))
            print(call(S, SERVICE, 'ReadAlias', 's', ('session',)))
            print(call(S, SERVICE, 'CreateCollection', 'a{sv}s', (label, 'session')))
            print(call(S, SERVICE, 'SetAlias', 'so', ('default', C)))
            print(call(S, PROPERTIES, 'Get', 'ss', (SERVICE, 'Collections')))
            alias = call(S + '/aliases/default', PROPERTIES, 'GetAll', 's', (COLLECTION,))
            print(sorted(alias[0]), alias == call(C, PROPERTIES, 'GetAll', 's', (COLLECTION,)), alias[0]['Items'] == ('ao', [PATH]))
            print(call(S + '/aliases/default', PROPERTIES, 'Get', 'ss', (COLLECTION, 'Label')))
            print(call(S + '/aliases/default', COLLECTION, 'SearchItems', 'a{ss}', ({'service': 's'},)) == ([PATH],))
            """)
        #expect(result.status == 0, "\(result)")
        let collection = "/org/freedesktop/secrets/collection/login"
        #expect(result.stdout.split(separator: "\n").map(String.init) == [
            "('\(collection)', '/')",
            "error org.freedesktop.DBus.Error.NotSupported",
            "error org.freedesktop.DBus.Error.NotSupported",
            collection,
            "('\(collection)',)",
            "('\(collection)',)",
            "('/',)",
            "('/org/freedesktop/secrets/collection/session',)",
            "('/org/freedesktop/secrets/collection/session', '/')",
            "()",
            "(('ao', ['\(collection)', '/org/freedesktop/secrets/collection/session']),)",
            "['Created', 'Items', 'Label', 'Locked', 'Modified'] True True",
            "(('s', 'Login'),)",
            "True",
        ], "\(result.stdout)")
    }

    /// The signals a client of the bus listens for (as Python's jeepney): each prints a line,
    /// the member and the item's last path part, or for PropertiesChanged its path,
    /// interface and the properties it names.
    static let signalListener = """
        from jeepney import MatchRule, message_bus, HeaderFields
        from jeepney.io.blocking import open_dbus_connection, Proxy
        connection = open_dbus_connection(bus='SESSION')
        rule = MatchRule(type='signal', path_namespace='/org/freedesktop/secrets')
        Proxy(message_bus, connection).AddMatch(rule)
        with connection.filter(rule, bufsize=10000) as queue:
            print('listening', flush=True)
            while True:
                message = connection.recv_until_filtered(queue)
                member, body = message.header.fields[HeaderFields.member], message.body
                if member == 'PropertiesChanged':
                    named = ' '.join(sorted(set(body[1]) | set(body[2])))
                    print(member, message.header.fields[HeaderFields.path], body[0], named, flush=True)
                else:
                    print(member, str(body[0]).split('/')[-1] if body else '', flush=True)
        """

    /// A change on either side shows on the bus at once (SPEC §2c): a listener hears
    /// ItemCreated, ItemChanged and ItemDeleted, and the collection's PropertiesChanged of
    /// Items when the list changes, for items made, changed and deleted on the bus, and for
    /// an account made with mkdir and its fields, a field written, and `rm -r`.
    @Test func changesOnEitherSideAreSignalledOnTheBus() throws {
        let store = try ServedStore()
        defer { store.close() }
        // Two items made before anyone listens: each side changes one of its own, so that
        // no late signal of one step is taken for the next's.
        #expect(store.run("secret-tool", ["store", "--label=Mail", "service", "mail"], input: "s3cret").status == 0)
        let mail = try #require(store.accounts.first)
        #expect(store.run("secret-tool", ["store", "--label=Other", "service", "other"], input: "o").status == 0)
        let other = try #require(store.accounts.first { $0 != mail })
        func item(_ account: String) -> String { account.replacingOccurrences(of: "-", with: "").lowercased() }
        let listener = try SignalListener(store)
        defer { listener.close() }
        /// Waits until every one of `expected` is heard; then listens afresh.
        func expectHeard(_ expected: [String], _ what: String) { _ = listener.heard(expected, what) }
        let items = "PropertiesChanged /org/freedesktop/secrets/collection/login org.freedesktop.Secret.Collection Items"
        // In the mount: a field written, an account made with mkdir and its fields, rm -r.
        #expect(Run.shell("echo changed > \(store.path("accounts/\(mail)/password"))").status == 0)
        expectHeard(["ItemChanged \(item(mail))"], "a field written in the mount")
        let account = "0d5c7a1e-3b2f-4c6d-8e9f-a0b1c2d3e4f5"
        let directory = store.path("accounts/\(account)")
        #expect(Run.shell("mkdir \(directory) && echo bob > \(directory)/username && echo Git > \(directory)/label "
                          + "&& echo hunter2 > \(directory)/password").status == 0)
        expectHeard(["ItemCreated \(item(account))", items], "an account made with mkdir and its fields written")
        #expect(Run.shell("rm -r \(directory)").status == 0)
        expectHeard(["ItemDeleted \(item(account))", items], "an account removed with rm -r")
        // On the bus: made, changed (label, secret), deleted.
        func bus(_ body: String) -> CommandResult {
            store.python("""
                import secretstorage
                collection = secretstorage.get_default_collection(secretstorage.dbus_init())
                \(body)
                """)
        }
        let made = bus("print(collection.create_item('Bus', {'service': 'bus'}, b'one').item_path.split('/')[-1])")
        let onTheBus = made.stdout.trimmingCharacters(in: .whitespacesAndNewlines)
        try #require(made.status == 0 && onTheBus.count == 32, "\(made)")
        expectHeard(["ItemCreated \(onTheBus)", items], "an item made on the bus")
        #expect(bus("[found] = collection.search_items({'service': 'other'}); found.set_label('Other 2'); found.set_secret(b'two')").status == 0)
        expectHeard(["ItemChanged \(item(other))"], "an item changed on the bus")
        #expect(bus("[found] = collection.search_items({'service': 'bus'}); found.delete()").status == 0)
        expectHeard(["ItemDeleted \(onTheBus)", items], "an item deleted on the bus")
    }
}
