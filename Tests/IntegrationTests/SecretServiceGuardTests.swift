import Foundation
import Posix
import TestSupport
import Testing
#if canImport(Glibc)
import Glibc
#endif

/// Guarding through the Secret Service (SPEC §2c, §3a): a guarded mount run as nobody
/// serves a session bus of the test's own (run as nobody too); clients run as nobody in the
/// mount's namespace, and prompts go to the test's pinentry.
@Suite(.serialized, .enabled(if: FuseAvailability.isAvailable && Spawn.exists("dbus-daemon") && Spawn.exists("secret-tool")))
struct SecretServiceGuardTests {
    /// A secretstorage client as nobody: finds the item of `service=mail` and does `action`
    /// (`path`, `locked`, `read`, `unlock-read`, `replace`, `set-secret`, `count`), printing
    /// one line.
    static func client(_ action: String) -> String {
        """
        import sys, secretstorage
        from secretstorage.exceptions import LockedException
        from secretstorage.util import format_secret, open_session
        from jeepney.wrappers import DBusErrorResponse
        connection = secretstorage.dbus_init()
        collection = secretstorage.get_default_collection(connection)
        items = list(collection.search_items({'service': 'mail'}))
        assert len(items) == 1, items
        item = items[0]
        action = '\(action)'
        try:
            if action == 'path':
                print(item.item_path)
            elif action == 'locked':
                print('locked' if item.is_locked() else 'unlocked')
            elif action == 'read':
                print(item.get_secret().decode())
            elif action == 'unlock-read':
                dismissed = item.unlock()
                print('dismissed' if dismissed else item.get_secret().decode())
            elif action == 'replace':
                made = collection.create_item('Taken', {'service': 'mail', 'user': 'alice'}, b'stolen', replace=True)
                print('replaced' if made.item_path == item.item_path else 'made beside it')
            elif action == 'set-secret':
                # (Sent as it is: secretstorage's set_secret refuses a locked item itself.)
                item._item.call('SetSecret', '(oayays)', format_secret(open_session(connection), b'stolen', 'text/plain'))
                print('set')
            elif action == 'count':
                print(len(list(collection.get_all_items())))
        except LockedException:
            print('refused: locked')
        except DBusErrorResponse as e:
            print('refused: ' + e.name)
        """
    }

    @Test func theGuardDecidesForBusCallers() throws {
        let mount = try GuardedMount(secretService: true)
        defer { mount.close() }
        func python(_ action: String) -> String {
            let result = mount.run("/usr/bin/python3", ["-c", Self.client(action)], timeout: 60)
            return result.stdout.trimmingCharacters(in: .whitespacesAndNewlines) + (result.status == 0 ? "" : " [\(result.stderr)]")
        }
        // The creator (secret-tool) is trusted with what it creates: it reads it back unasked.
        mount.answer("cancel")
        let stored = mount.shell("printf s3cret | /usr/bin/secret-tool store --label=Mail service mail user alice")
        try #require(stored.status == 0, "\(stored)")
        #expect(mount.run("/usr/bin/secret-tool", ["lookup", "service", "mail"]).stdout == "s3cret")
        #expect(mount.prompts == 0)

        // Another program sees the item locked, never hidden, and gets no secret.
        #expect(python("locked") == "locked")
        #expect(python("read") == "refused: locked")
        // It may not change or delete it (busctl: secretstorage refuses a locked item itself).
        let path = try #require(mount.run("/usr/bin/python3", ["-c", Self.client("path")]).stdout
            .split(separator: "\n").first.map(String.init))
        func busctl(_ arguments: [String]) -> CommandResult {
            mount.run("/usr/bin/busctl", ["--user", "--no-pager", "call", "org.freedesktop.secrets", path] + arguments)
        }
        let deleted = busctl(["org.freedesktop.Secret.Item", "Delete"])
        #expect(deleted.status != 0 && deleted.stderr.contains("Access denied"), "\(deleted)")
        let relabelled = mount.run("/usr/bin/busctl", ["--user", "--no-pager", "set-property", "org.freedesktop.secrets", path,
                                                       "org.freedesktop.Secret.Item", "Label", "s", "other"])
        #expect(relabelled.status != 0 && relabelled.stderr.contains("Access denied"), "\(relabelled)")
        #expect(mount.run("/usr/bin/secret-tool", ["lookup", "service", "mail"]).stdout == "s3cret", "still there")
        #expect(mount.prompts == 0, "refusals and changes do not ask")

        // Its Unlock asks: denied, the prompt completes dismissed.
        #expect(python("unlock-read") == "dismissed")
        #expect(mount.prompts == 1, "\(mount.decisions)")
        #expect(mount.record.contains("Secret Service") && mount.record.contains("/usr/bin/python3"), "\(mount.record)")
        // Allowed once: for that connection only; the next client is asked again.
        mount.answer("ok")
        #expect(python("unlock-read") == "s3cret")
        #expect(python("locked") == "locked", "allowed once: that connection only")
        #expect(mount.prompts == 2)
        // Always allow (with the passphrase): trusted for good, asked no more, also after a remount.
        mount.answer("notok")
        #expect(python("unlock-read") == "s3cret")
        mount.answer("cancel")
        #expect(python("read") == "s3cret")
        #expect(mount.prompts == 3)
        mount.unmount()
        try mount.mount()
        #expect(mount.mtmfs("unlock", "--passphrase-file", mount.scratch.sub("pass"), mount.mountPoint).status == 0)
        #expect(Poll.until(seconds: 10) { python("read") == "s3cret" }, "trusted across a remount")

        // A traced caller is refused without asking, even a trusted program.
        mount.answer("ok")
        let traced = mount.run("/usr/bin/strace", ["-f", "-o", "/dev/null", "/usr/bin/secret-tool", "lookup", "service", "mail"])
        #expect(!traced.stdout.contains("s3cret"), "\(traced)")
        #expect(mount.prompts == 3, "nobody was asked")
        let decisions = mount.decisions
        #expect(decisions.contains("being traced by pid") && decisions.contains("bus=:"), "\(decisions)")
        #expect(!decisions.contains("s3cret"))
    }

    /// Replacing an item (CreateItem with `replace`) and SetSecret need trust (SPEC §2c,
    /// §3a): a program not trusted with the item is refused without being asked, and the
    /// item keeps its label and secret; no second item is made beside it either.
    @Test func anUntrustedCallersReplaceAndSetSecretAreRefused() throws {
        let mount = try GuardedMount(secretService: true)
        defer { mount.close() }
        func python(_ action: String) -> String {
            let result = mount.run("/usr/bin/python3", ["-c", Self.client(action)], timeout: 60)
            return result.stdout.trimmingCharacters(in: .whitespacesAndNewlines) + (result.status == 0 ? "" : " [\(result.stderr)]")
        }
        mount.answer("cancel")
        let stored = mount.shell("printf s3cret | /usr/bin/secret-tool store --label=Mail service mail user alice")
        try #require(stored.status == 0, "\(stored)")
        func unchanged(_ comment: Comment) {
            #expect(mount.run("/usr/bin/secret-tool", ["lookup", "service", "mail"]).stdout == "s3cret", comment)
            #expect(mount.shell("cat \(mount.path("accounts"))/*/label").stdout == "Mail\n", comment)
            #expect(python("count") == "1", comment)
        }
        #expect(python("replace") == "refused: org.freedesktop.DBus.Error.AccessDenied")
        unchanged("after the refused replace")
        #expect(python("set-secret") == "refused: org.freedesktop.DBus.Error.AccessDenied")
        unchanged("after the refused SetSecret")
        #expect(mount.prompts == 0, "a change is refused, not asked about: \(mount.record)")
        let decisions = mount.decisions
        #expect(decisions.contains("denied") && decisions.contains("/usr/bin/python3"), "\(decisions)")
        #expect(!decisions.contains("s3cret") && !decisions.contains("stolen"))
        // The program trusted with it (its creator) replaces it in place.
        #expect(mount.shell("printf second | /usr/bin/secret-tool store --label=Mail service mail user alice").status == 0)
        #expect(mount.run("/usr/bin/secret-tool", ["lookup", "service", "mail"]).stdout == "second")
        #expect(python("count") == "1")
    }

    /// A client that dies while its prompt is up leaves nothing: the pinentry goes, the
    /// prompt object goes, and what it was allowed once ends with its connection.
    @Test func aClientKilledDuringAPromptLeavesNothing() throws {
        let mount = try GuardedMount(secretService: true)
        defer { mount.close() }
        mount.answer("cancel")
        #expect(mount.shell("printf s3cret | /usr/bin/secret-tool store --label=Mail service mail user alice").status == 0)
        mount.answer("hang")
        let client = mount.start("/usr/bin/python3", ["-c", Self.client("unlock-read")])
        #expect(Poll.until(seconds: 20) { mount.prompts == 1 }, "the prompt is up: \(mount.record)")
        kill(client, SIGKILL)
        _ = Run.wait(client, timeout: 10)
        #expect(Poll.until(seconds: 10) { Run.shell("pgrep -f '^/bin/sh \(mount.scratch.sub("pinentry"))'").stdout.isEmpty },
                "the pinentry went with the client")
        let introspected = mount.run("/usr/bin/busctl", ["--user", "introspect", "--xml-interface", "org.freedesktop.secrets",
                                                          "/org/freedesktop/secrets/prompt"])
        #expect(!introspected.stdout.contains("<node name=\"p"), "no prompt object left: \(introspected.stdout)")
        // The mount goes on: the next client is asked afresh.
        mount.answer("ok")
        let result = mount.run("/usr/bin/python3", ["-c", Self.client("unlock-read")], timeout: 60)
        #expect(result.stdout == "s3cret\n", "\(result)")
    }
}
