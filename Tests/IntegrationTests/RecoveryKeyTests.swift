import Foundation
import Posix
import Testing
import TestSupport

/// `mtmfs recovery-key`, `unlock --recovery-key` and `passwd --recovery-key` (SPEC §3): the
/// key shown opens the vault; with it a forgotten passphrase is replaced; a second key
/// retires the first.
@Suite struct RecoveryKeyTests {
    static let uuid = "7A0C6E84-5D2B-4F1A-9C3E-2B8D4F6A1E90"

    /// The key in the command's output: the one line of 8 groups of 4 letters.
    static func key(in output: String) -> String? {
        output.split(separator: "\n").map { $0.trimmingCharacters(in: .whitespaces) }
            .first { $0.count == 39 && $0.split(separator: "-").map(\.count) == [4, 4, 4, 4, 4, 4, 4, 4] }
    }

    @Test func aRecoveryKeyUnlocksReplacesAForgottenPassphraseAndTheNextRetiresIt() throws {
        let store = try MountedStore()
        defer { store.close() }
        // Made while mounted: refused, saying why.
        let mounted = Run.mtmfs("recovery-key", "--data-dir", store.dataDirectory, input: Run.passphrase + "\n")
        #expect(mounted.status == 1 && mounted.stderr.contains("mount"), "\(mounted)")
        #expect(Run.mtmfs("unlock", store.mountPoint, input: Run.passphrase + "\n").status == 0)
        #expect(mkdir(store.path("accounts/\(Self.uuid)"), 0o700) == 0)
        #expect(Run.shell("echo hunter2 > \(store.path("accounts/\(Self.uuid)/password"))").status == 0)
        #expect(Run.mtmfs("unmount", store.mountPoint).status == 0)

        // A wrong passphrase makes no key.
        let wrong = Run.mtmfs("recovery-key", "--data-dir", store.dataDirectory, input: "not it\n")
        #expect(wrong.status == 1 && wrong.stderr.contains("wrong passphrase") && Self.key(in: wrong.stdout) == nil, "\(wrong)")
        let made = Run.mtmfs("recovery-key", "--data-dir", store.dataDirectory, input: Run.passphrase + "\n")
        #expect(made.status == 0, "\(made)")
        let first = try #require(Self.key(in: made.stdout), "\(made.stdout)")
        // The key is in no file of the data directory, and the passphrase still unlocks.
        #expect(Run.shell("grep -r -a -l -F '\(first)' \(store.dataDirectory)").stdout.isEmpty)

        #expect(Run.mtmfs("mount", "--data-dir", store.dataDirectory, store.mountPoint).status == 0)
        // Typed in lower case with spaces: the same key. A mistyped letter is caught before
        // any key derivation, a key of the right form but not this vault's is refused.
        let typed = first.lowercased().replacingOccurrences(of: "-", with: " ")
        var typo = Array(first)
        typo[0] = typo[0] == "A" ? "B" : "A"
        let mistyped = Run.mtmfs("unlock", "--recovery-key", store.mountPoint, input: String(typo) + "\n")
        #expect(mistyped.status == 1 && mistyped.stderr.contains("not a recovery key"), "\(mistyped)")
        #expect(Run.mtmfs("unlock", store.mountPoint + "/", "--recovery-key", input: Run.passphrase + "\n").status == 1)
        #expect(try store.status()["state"] == "locked")
        let unlocked = Run.mtmfs("unlock", "--recovery-key", store.mountPoint, input: typed + "\n")
        #expect(unlocked.status == 0, "\(unlocked)")
        #expect(Run.shell("cat \(store.path("accounts/\(Self.uuid)/password"))").stdout == "hunter2\n")
        // The control file refuses another kind's name and a malformed key.
        #expect(Run.shell("printf 'passphrase\\n%s' '\(Run.passphrase)' > \(store.mountPoint)/.mtmfs/unlock-with").status != 0)
        #expect(Run.shell("printf 'recovery\\nAAAA' > \(store.mountPoint)/.mtmfs/unlock-with").status != 0)
        #expect(Run.mtmfs("unmount", store.mountPoint).status == 0)

        // The passphrase forgotten: the recovery key sets a new one; the old one opens nothing.
        try (first + "\n").write(toFile: store.scratch.sub("key"), atomically: true, encoding: .utf8)
        try "a fresh passphrase here\n".write(toFile: store.scratch.sub("new"), atomically: true, encoding: .utf8)
        let changed = Run.mtmfs("passwd", "--recovery-key", "--data-dir", store.dataDirectory, "--kdf", "interactive",
                                "--passphrase-file", store.scratch.sub("key"), "--new-passphrase-file", store.scratch.sub("new"), "--weak-passphrase")
        #expect(changed.status == 0, "\(changed)")
        #expect(Run.mtmfs("mount", "--data-dir", store.dataDirectory, store.mountPoint).status == 0)
        #expect(Run.mtmfs("unlock", store.mountPoint, input: Run.passphrase + "\n").status == 1)
        #expect(Run.mtmfs("unlock", store.mountPoint, input: "a fresh passphrase here\n").status == 0)
        #expect(Run.mtmfs("lock", store.mountPoint).status == 0)
        // …and the recovery key still works after the change.
        #expect(Run.mtmfs("unlock", "--recovery-key", store.mountPoint, input: first + "\n").status == 0)
        #expect(Run.mtmfs("unmount", store.mountPoint).status == 0)

        // A second key retires the first.
        let again = Run.mtmfs("recovery-key", "--data-dir", store.dataDirectory, input: "a fresh passphrase here\n")
        let second = try #require(Self.key(in: again.stdout), "\(again)")
        #expect(second != first)
        #expect(Run.mtmfs("mount", "--data-dir", store.dataDirectory, store.mountPoint).status == 0)
        let retired = Run.mtmfs("unlock", "--recovery-key", store.mountPoint, input: first + "\n")
        #expect(retired.status == 1 && retired.stderr.contains("does not open"), "\(retired)")
        #expect(Run.mtmfs("unlock", "--recovery-key", store.mountPoint, input: second + "\n").status == 0)
        #expect(Run.shell("cat \(store.path("accounts/\(Self.uuid)/password"))").stdout == "hunter2\n")
    }
}
