import Foundation
import Posix
import TestSupport
import Testing
#if canImport(Glibc)
import Glibc
#endif

/// Secrets for scripts (SPEC §6): `mtmfs run`, `mtmfs inject` and `mtmfs read` with
/// `mtmfs://` references, through a real mount.
@Suite(.enabled(if: FuseAvailability.isAvailable, "needs /dev/fuse")) struct ScriptSecretsTests {
    static let ci = "6F9619FF-8B86-D011-B42D-00C04FC964FF"
    static let db = "3e4666bf-d5e5-4aa7-b8ce-cefe41c7568a"
    static let token = "s3cr3t-token-42"

    /// A mounted, unlocked store: account CI (a token) and account db (a user and password,
    /// an attribute).
    static func store() throws -> MountedStore {
        let store = try MountedStore()
        do {
            let unlock = Run.mtmfs("unlock", store.mountPoint, input: Run.passphrase + "\n")
            try #require(unlock.status == 0, "\(unlock)")
            try FindingTests.make(store, ci, ["label": "CI", "password": token])
            try FindingTests.make(store, db, ["label": "Database", "url": "postgres://db.example.com:5432/app",
                                              "username": "app", "password": "pg pass with spaces"])
            try TestFile.write("eu-west-1\n", to: store.path("accounts/\(db)/attributes/region"))
        } catch {
            store.close()
            throw error
        }
        return store
    }

    /// `mtmfs run` in a shell, with `variables` set for it: what the shell saw.
    static func run(_ store: MountedStore, _ variables: String, _ arguments: String, command: String) -> CommandResult {
        Run.shell("\(variables) \(Run.mtmfs) run --mount \(store.mountPoint) \(arguments) -- /bin/sh -c '\(command)'")
    }

    @Test func theSecretIsInTheCommandsEnvironmentAloneAndMaskedInItsOutput() throws {
        let store = try Self.store()
        defer { store.close() }
        let reference = "mtmfs://by-label/CI/password"
        // The child has it; its output shows it concealed, on both streams.
        let seen = Self.run(store, "TOKEN=\(reference) PLAIN=kept", "", command: """
            test "$TOKEN" = "s3cr3t-$(echo token)-42" && echo same; echo "[$TOKEN]"; echo "err $TOKEN" >&2; echo "$PLAIN"
            tr "\\0" "\\n" < /proc/$PPID/environ | grep -c -- "$TOKEN" || true
            tr "\\0" "\\n" < /proc/$PPID/environ | grep -c "^TOKEN=\(reference)$" || true
            tr "\\0" " " < /proc/$PPID/cmdline | grep -c -- "$TOKEN" || true
            """)
        #expect(seen.status == 0, "\(seen)")
        // (`/proc/<mtmfs run>/environ` holds the reference, never the value; nor does its argv.)
        #expect(seen.stdout == "same\n[<concealed by mtmfs>]\nkept\n0\n1\n0\n", "\(seen)")
        #expect(seen.stderr == "err <concealed by mtmfs>\n", "\(seen)")
        #expect(!seen.stdout.contains(Self.token) && !seen.stderr.contains(Self.token))
        // The caller's environment keeps the reference.
        let caller = Run.shell("TOKEN=\(reference); \(Run.mtmfs) run --mount \(store.mountPoint) -- true; echo \"$TOKEN\"")
        #expect(caller.stdout == reference + "\n", "\(caller)")

        // Split across two writes, and at the end with no newline.
        let split = Self.run(store, "TOKEN=\(reference)", "", command: "printf s3cr3t-; sleep 0.3; printf token-42; printf \" and s3cr3t-\"")
        #expect(split.stdout == "<concealed by mtmfs> and s3cr3t-", "\(split)")
        // Two references to one field in one environment: read once, both set.
        let twice = Self.run(store, "A=\(reference) B=mtmfs://\(Self.ci)/password U=mtmfs://by-server/db.example.com/app/username",
                             "", command: "test \"$A\" = \"$B\" && test \"$U\" = app && echo ok; echo \"$U\"")
        // (Every value a reference brought is concealed, a username too.)
        #expect(twice.stdout == "ok\n<concealed by mtmfs>\n", "\(twice)")
        // --no-masking: the command writes to our output itself.
        let plain = Self.run(store, "TOKEN=\(reference)", "--no-masking", command: "echo \"$TOKEN\"")
        #expect(plain.stdout == Self.token + "\n", "\(plain)")
        // The exit status is the command's; a program that does not exist: 127.
        #expect(Self.run(store, "TOKEN=\(reference)", "", command: "exit 42").status == 42)
        #expect(Run.mtmfs("run", "--mount", store.mountPoint, "--", "/nonexistent/program").status == 127)
        // A command killed by a signal: 128 + N, as a shell says it.
        #expect(Self.run(store, "", "", command: "kill -TERM $$").status == 128 + SIGTERM)
    }

    @Test func anEnvironmentFileAndItsReferences() throws {
        let store = try Self.store()
        defer { store.close() }
        let file = store.scratch.sub("app.env")
        try TestFile.write("""
            # the app's settings
            export DB_USER=mtmfs://\(Self.db)/username
            DB_PASSWORD="mtmfs://by-label/Database/password"
            REGION=mtmfs://\(Self.db)/attributes/region

            MODE=production
            """, to: file)
        let seen = Self.run(store, "", "--env-file \(file)", command: "echo \"$DB_USER|$DB_PASSWORD|$REGION|$MODE\"")
        #expect(seen.stdout == "<concealed by mtmfs>|<concealed by mtmfs>|<concealed by mtmfs>|production\n", "\(seen)")
        let unmasked = Self.run(store, "", "--env-file \(file) --no-masking", command: "echo \"$DB_USER|$DB_PASSWORD|$REGION|$MODE\"")
        #expect(unmasked.stdout == "app|pg pass with spaces|eu-west-1|production\n", "\(unmasked)")
        try TestFile.write("not a setting\n", to: file)
        #expect(Self.run(store, "", "--env-file \(file)", command: "true").status == 2)
    }

    @Test func injectWritesTheWholeFileWithItsModeOrNothing() throws {
        let store = try Self.store()
        defer { store.close() }
        let template = store.scratch.sub("config.tpl"), output = store.scratch.sub("config.yml")
        try TestFile.write("""
            user: {{ mtmfs://by-server/db.example.com/app/username }}
            password: "{{mtmfs://by-label/Database/password}}"
            token: {{ mtmfs://\(Self.ci)/password }}
            region: {{ mtmfs://\(Self.db)/attributes/region }}
            other: {{ .Values.kept }}

            """, to: template)
        let made = Run.mtmfs("inject", "--mount", store.mountPoint, "-i", template, "-o", output)
        #expect(made.status == 0, "\(made)")
        #expect(TestFile.read(output) == """
            user: app
            password: "pg pass with spaces"
            token: \(Self.token)
            region: eu-west-1
            other: {{ .Values.kept }}

            """)
        #expect(try Syscall.stat(output).st_mode & 0o7777 == 0o600)
        // Standard input to standard output; another mode.
        let piped = Run.program(Run.mtmfs, ["inject", "--mount", store.mountPoint], input: "t={{ mtmfs://\(Self.ci)/password }}")
        #expect(piped.stdout == "t=\(Self.token)", "\(piped)")
        #expect(Run.mtmfs("inject", "--mount", store.mountPoint, "-i", template, "-o", output, "--file-mode", "0640").status == 0)
        #expect(try Syscall.stat(output).st_mode & 0o7777 == 0o640)
        // One reference that cannot be read: nothing written, the old file as it was, no
        // temporary file left beside it.
        let before = TestFile.read(output)
        try TestFile.write("a: {{ mtmfs://\(Self.ci)/password }}\nb: {{ mtmfs://by-label/Nobody/password }}\n", to: template)
        let failed = Run.mtmfs("inject", "--mount", store.mountPoint, "-i", template, "-o", output)
        #expect(failed.status == 3, "\(failed)")
        #expect(!failed.stderr.contains(Self.token))
        #expect(TestFile.read(output) == before)
        #expect(FindingTests.list(store.scratch.path)?.filter { $0.contains(".tmp-") } == [])
    }

    @Test func readPrintsOneSecret() throws {
        let store = try Self.store()
        defer { store.close() }
        #expect(Run.mtmfs("read", "--mount", store.mountPoint, "mtmfs://by-label/CI/password").stdout == Self.token + "\n")
        #expect(Run.mtmfs("read", "--mount", store.mountPoint, "-n", "mtmfs://\(Self.db)/password").stdout == "pg pass with spaces")
        let file = store.scratch.sub("token")
        #expect(Run.mtmfs("read", "--mount", store.mountPoint, "-o", file, "mtmfs://by-label/CI/password").status == 0)
        #expect(TestFile.read(file) == Self.token + "\n")
        #expect(try Syscall.stat(file).st_mode & 0o7777 == 0o600)
    }

    /// Every failure: one line, its own exit status, nothing of a value.
    @Test func everyErrorHasItsExitStatus() throws {
        let store = try Self.store()
        defer { store.close() }
        func read(_ reference: String, mount: String? = nil) -> CommandResult {
            Run.mtmfs("read", "--mount", mount ?? store.mountPoint, reference)
        }
        // No such account or field: 3.
        #expect(read("mtmfs://by-label/Nobody/password").status == 3)
        #expect(read("mtmfs://0A1B2C3D-4E5F-4A6B-8C7D-9E0F1A2B3C4D/password").status == 3)
        #expect(read("mtmfs://\(Self.ci)/nonsense").status == 3)
        // Malformed: 2.
        for malformed in ["mtmfs://", "mtmfs://by-label/CI", "mtmfs://not-a-uuid/password", "mtmfs://\(Self.ci)/../x",
                          "mtmfs://\(Self.ci)/a/b", "https://example.com"] {
            let result = read(malformed)
            #expect(result.status == 2, "\(malformed): \(result)")
            #expect(result.stderr.split(separator: "\n").count == 1, "\(result)")
        }
        // A label two accounts share: 4, naming the other's name. The links' count says it
        // (what `mtmfs` learns from the lookup alone), and the suffixed name reads.
        #expect(try Syscall.lstat(store.mountPoint + "/accounts/by-label/CI").st_nlink == 1)
        try FindingTests.make(store, "0A1B2C3D-4E5F-4A6B-8C7D-9E0F1A2B3C4D", ["label": "CI", "password": "other"])
        let ambiguous = read("mtmfs://by-label/CI/password")
        #expect(ambiguous.status == 4, "\(ambiguous)")
        #expect(ambiguous.stderr.contains("by-label/CI~0a1b2c3d") || ambiguous.stderr.contains("by-label/CI~0A1B2C3D"), "\(ambiguous)")
        #expect(try Syscall.lstat(store.mountPoint + "/accounts/by-label/CI").st_nlink == 2)
        #expect(try Syscall.lstat(store.mountPoint + "/accounts/by-label/CI~0a1b2c3d").st_nlink == 2)
        #expect(read("mtmfs://by-label/CI~0a1b2c3d/password").stdout == "other\n")
        #expect(read("mtmfs://\(Self.ci)/password").stdout == Self.token + "\n")
        // Not a mount: 6.
        #expect(read("mtmfs://\(Self.ci)/password", mount: store.scratch.path).status == 6)
        // Locked: 5, and the command does not run.
        #expect(Run.mtmfs("lock", store.mountPoint).status == 0)
        #expect(read("mtmfs://\(Self.ci)/password").status == 5)
        #expect(read("mtmfs://by-label/CI~0a1b2c3d/password").status == 5)  // (the views are empty while locked)
        let locked = Self.run(store, "T=mtmfs://\(Self.ci)/password", "", command: "echo ran")
        #expect(locked.status == 5 && locked.stdout.isEmpty, "\(locked)")
        #expect(Run.program(Run.mtmfs, ["inject", "--mount", store.mountPoint], input: "{{ mtmfs://\(Self.ci)/password }}").status == 5)
        // With no reference, nothing is read: the command runs even while locked.
        #expect(Self.run(store, "", "", command: "echo ran").stdout == "ran\n")
    }
}
