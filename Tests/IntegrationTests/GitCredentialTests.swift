import Foundation
import Posix
import TestSupport
import Testing
#if canImport(Glibc)
import Glibc
#endif

/// mtmfs as git's credential helper (SPEC §2a), with a real `git` against a small HTTP
/// server of the test's own that wants Basic auth (`git http-backend` behind it), on
/// 127.0.0.1 only. The server stops by itself after two minutes.
@Suite(.serialized, .enabled(if: FuseAvailability.isAvailable, "needs /dev/fuse")) struct GitCredentialTests {
    static let server = #"""
    import base64, http.server, os, subprocess, sys, threading
    root, expected_file, port_file = sys.argv[1:4]

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self): self.serve()
        def do_POST(self): self.serve()
        def serve(self):
            expected = open(expected_file).read().strip()
            if self.headers.get('Authorization', '') != 'Basic ' + base64.b64encode(expected.encode()).decode():
                self.send_response(401)
                self.send_header('WWW-Authenticate', 'Basic realm="test"')
                self.send_header('Content-Length', '0')
                self.end_headers()
                return
            path, _, query = self.path.partition('?')
            body = self.rfile.read(int(self.headers.get('Content-Length') or 0))
            env = dict(os.environ, GIT_PROJECT_ROOT=root, GIT_HTTP_EXPORT_ALL='1', PATH_INFO=path,
                       QUERY_STRING=query, REQUEST_METHOD=self.command, CONTENT_LENGTH=str(len(body)),
                       CONTENT_TYPE=self.headers.get('Content-Type', ''), REMOTE_USER=expected.split(':')[0])
            out = subprocess.run(['git', 'http-backend'], input=body, env=env, capture_output=True).stdout
            separator = b'\r\n\r\n' if b'\r\n\r\n' in out else b'\n\n'
            head, _, payload = out.partition(separator)
            status, headers = 200, []
            for line in head.replace(b'\r\n', b'\n').split(b'\n'):
                key, _, value = line.decode().partition(':')
                if key.lower() == 'status':
                    status = int(value.split()[0])
                elif key:
                    headers.append((key, value.strip()))
            self.send_response(status)
            for key, value in headers:
                self.send_header(key, value)
            self.send_header('Content-Length', str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)
        def log_message(self, *args): pass

    server = http.server.ThreadingHTTPServer(('127.0.0.1', 0), Handler)
    threading.Timer(120, server.shutdown).start()
    with open(port_file + '.tmp', 'w') as f: f.write(str(server.server_address[1]))
    os.rename(port_file + '.tmp', port_file)
    server.serve_forever()
    """#

    /// A store mounted and unlocked, a bare repository served over HTTP with Basic auth
    /// (`bob:first`), and a `git` set up with `credential.helper mtmfs` and nothing else.
    final class World {
        let store: MountedStore
        var scratch: Scratch { store.scratch }
        let port: String
        let serverPID: pid_t

        init() throws {
            store = try MountedStore()
            let s = store.scratch
            let unlock = Run.mtmfs("unlock", store.mountPoint, input: Run.passphrase + "\n")
            let setUp = Run.shell("""
                set -e
                mkdir -p '\(s.sub("home"))' '\(s.sub("bin"))'
                ln -s '\(Run.mtmfs)' '\(s.sub("bin/git-credential-mtmfs"))'
                git -c init.defaultBranch=main init -q '\(s.sub("source"))'
                git -C '\(s.sub("source"))' -c user.name=t -c user.email=t@example.org commit -q --allow-empty -m first
                git clone -q --bare '\(s.sub("source"))' '\(s.sub("served/repo.git"))'
                echo bob:first > '\(s.sub("expected"))'
                printf '#!/bin/sh\\ncase "$1" in Username*) echo bob ;; *) echo first ;; esac\\n' > '\(s.sub("askpass"))'
                printf '#!/bin/sh\\nexit 1\\n' > '\(s.sub("no-askpass"))'
                chmod +x '\(s.sub("askpass"))' '\(s.sub("no-askpass"))'
                """)
            try TestFile.write(GitCredentialTests.server, to: s.sub("server.py"))
            serverPID = Run.start("python3", [s.sub("server.py"), s.sub("served"), s.sub("expected"), s.sub("port")],
                                  stderr: s.sub("server.log"))
            let started = Poll.until(seconds: 10) { FileManager.default.fileExists(atPath: s.sub("port")) }
            port = (try? String(contentsOfFile: s.sub("port"), encoding: .utf8)) ?? ""
            guard unlock.status == 0, setUp.status == 0, started, !port.isEmpty else {
                kill(serverPID, SIGKILL)
                Run.wait(serverPID, timeout: 5)
                store.close()
                throw SetUpFailure(description: "unlock: \(unlock)\nset-up: \(setUp)\nserver started: \(started)")
            }
        }

        struct SetUpFailure: Error, CustomStringConvertible { var description: String }

        var url: String { "http://127.0.0.1:\(port)/repo.git" }

        /// `git clone` into a new directory with the helper (and `askpass` for a prompt).
        func clone(askpass: String = "no-askpass", helper: String? = nil) -> CommandResult {
            let target = scratch.sub("clone-\(UUID().uuidString)")
            var environment = ProcessInfo.processInfo.environment
            environment["HOME"] = scratch.sub("home")
            environment["GIT_CONFIG_NOSYSTEM"] = "1"
            environment["GIT_TERMINAL_PROMPT"] = "0"
            environment["GIT_ASKPASS"] = scratch.sub(askpass)
            environment["PATH"] = scratch.sub("bin") + ":" + (environment["PATH"] ?? "/usr/bin:/bin")
            return Run.program("git", ["-c", "credential.helper=" + (helper ?? "mtmfs --mount \(store.mountPoint)"),
                                       "clone", "-q", url, target], environment: environment, timeout: 60)
        }

        func find(_ arguments: String...) -> CommandResult {
            Run.program(Run.mtmfs, ["find", store.mountPoint, "--server", "127.0.0.1", "--port", port] + arguments)
        }

        func close() {
            kill(serverPID, SIGKILL)
            Run.wait(serverPID, timeout: 5)
            store.close()
        }
    }

    @Test func getStoreAndErase() throws {
        let world = try World()
        defer { world.close() }
        // No account: no password to be had (GIT_TERMINAL_PROMPT=0, askpass fails).
        #expect(world.clone().status != 0)

        // store: the password typed through GIT_ASKPASS goes into a new account.
        let typed = world.clone(askpass: "askpass")
        #expect(typed.status == 0, "\(typed)")
        let made = world.find("--print", "label")
        #expect(made.stdout == "127.0.0.1:\(world.port) (git)\n", "\(made)")
        #expect(world.find("--print", "password").stdout == "first\n")
        #expect(world.find("--print", "username").stdout == "bob\n")
        #expect(world.find("--print", "protocol").stdout == "http\n")

        // get: the next clone needs nobody to type anything — also as `credential.helper mtmfs`
        // found on PATH as git-credential-mtmfs.
        let again = world.clone()
        #expect(again.status == 0, "\(again)")

        // erase: the server now wants another password; git rejects the stored one.
        try TestFile.write("bob:second\n", to: world.scratch.sub("expected"))
        #expect(world.clone().status != 0)
        let erased = world.find()
        #expect(erased.status == 3 && erased.stdout.isEmpty, "the account store made is removed: \(erased)")  // 3: no match
    }

    /// The helper's matching and checks, without git: path (decoded by git, a URL path in
    /// the account), username, port, and a value no account can hold (nothing is made).
    @Test func matchingAndRefusedValues() throws {
        let store = try MountedStore()
        defer { store.close() }
        #expect(Run.mtmfs("unlock", store.mountPoint, input: Run.passphrase + "\n").status == 0)
        func helper(_ action: String, _ lines: String...) -> CommandResult {
            Run.program(Run.mtmfs, ["credential", "--mount", store.mountPoint, action],
                        input: lines.joined(separator: "\n") + "\n\n", timeout: 20)
        }
        let stored = helper("store", "protocol=https", "host=git.example.org", "path=team/my repo.git", "username=bob",
                            "password=pw")
        #expect(stored.status == 0, "\(stored)")
        let find = Run.mtmfs("find", store.mountPoint, "--server", "git.example.org", "--print", "path")
        #expect(find.stdout == "/team/my%20repo.git\n", "\(find)")
        #expect(helper("get", "protocol=https", "host=git.example.org", "path=team/my repo.git").stdout == "username=bob\npassword=pw\n")
        #expect(helper("get", "protocol=https", "host=git.example.org").stdout == "username=bob\npassword=pw\n", "no path sent: any")
        #expect(helper("get", "protocol=https", "host=git.example.org", "path=other.git").stdout.isEmpty)
        #expect(helper("get", "protocol=https", "host=git.example.org", "username=carol").stdout.isEmpty)
        #expect(helper("get", "protocol=http", "host=git.example.org").stdout.isEmpty, "the protocol must match")
        #expect(helper("get", "protocol=https", "host=git.example.org:8443").stdout.isEmpty, "the port must match")
        // A second store of the same credential changes the password, makes no account.
        #expect(helper("store", "protocol=https", "host=git.example.org", "path=team/my repo.git", "username=bob",
                       "password=pw2").status == 0)
        #expect(Run.mtmfs("find", store.mountPoint, "--server", "git.example.org").stdout.split(separator: "\n").count == 1)
        #expect(helper("get", "protocol=https", "host=git.example.org").stdout == "username=bob\npassword=pw2\n")
        // A host name no account can hold: refused before anything is made.
        let refused = helper("store", "protocol=https", "host=my_host", "username=bob", "password=pw")
        #expect(refused.status == 1 && refused.stderr.contains("my_host"), "\(refused)")
        #expect(Run.mtmfs("find", store.mountPoint).stdout.split(separator: "\n").count == 1, "no half-made account")
        // erase with the password git rejects: a newer one stays; the rejected one goes.
        #expect(helper("erase", "protocol=https", "host=git.example.org", "username=bob", "password=pw").status == 0)
        #expect(helper("get", "protocol=https", "host=git.example.org").stdout == "username=bob\npassword=pw2\n")
        #expect(helper("erase", "protocol=https", "host=git.example.org", "username=bob", "password=pw2").status == 0)
        #expect(Run.mtmfs("find", store.mountPoint).status == 3, "the account store made is gone")
        #expect(helper("get", "protocol=https", "host=git.example.org").stdout.isEmpty)
        let unknown = helper("bogus")
        #expect(unknown.status == 0 && unknown.stdout.isEmpty, "an action git may add later is ignored: \(unknown)")
        // An account whose URL spells out the protocol's own port is git's host without one.
        let spelled = store.path("accounts/7B1C2D3E-4F50-4A6B-8C7D-9E0F1A2B3C4D")
        #expect(mkdir(spelled, 0o700) == 0)
        try TestFile.write("https://git.example.org:443\n", to: spelled + "/url")
        try TestFile.write("pw3\n", to: spelled + "/password")
        #expect(helper("get", "protocol=https", "host=git.example.org").stdout == "password=pw3\n", "no username: none said")
    }

    @Test func getFromAnAccountMadeByHandAndLockedMountsAnswerAtOnce() throws {
        let world = try World()
        defer { world.close() }
        let account = world.store.path("accounts/5A0C1E2D-3B4F-4A5C-9D6E-7F8091A2B3C4")
        #expect(mkdir(account, 0o700) == 0)
        for (field, value) in [("url", "http://127.0.0.1:\(world.port)"), ("username", "bob"), ("password", "first"),
                               ("label", "my server"), ("comment", "made by hand")] {
            try TestFile.write(value + "\n", to: account + "/" + field)
        }
        let cloned = world.clone(helper: "\(Run.mtmfs) credential --mount \(world.store.mountPoint)")
        #expect(cloned.status == 0, "\(cloned)")

        // A rejected password of an account made by hand is cleared, the account stays.
        try TestFile.write("bob:second\n", to: world.scratch.sub("expected"))
        #expect(world.clone().status != 0)
        #expect(world.find("--print", "password").stdout == "\n")
        #expect(world.find("--print", "comment").stdout == "made by hand\n")

        // Locked: get prints nothing and exits 0 at once; store and erase change nothing.
        try TestFile.write(("second") + "\n", to: account + "/password")
        #expect(Run.mtmfs("lock", world.store.mountPoint).status == 0)
        let question = "protocol=http\nhost=127.0.0.1:\(world.port)\n\n"
        let started = ContinuousClock.now
        let get = Run.program(Run.mtmfs, ["credential", "--mount", world.store.mountPoint, "get"], input: question, timeout: 10)
        #expect(get.status == 0 && get.stdout.isEmpty, "\(get)")
        #expect(started.secondsElapsed < 5, "get must not hang on a locked mount")
        let store = Run.program(Run.mtmfs, ["credential", "--mount", world.store.mountPoint, "store"],
                                input: "protocol=http\nhost=example.org\nusername=x\npassword=y\n\n")
        #expect(store.status == 1 && store.stderr.contains("locked"), "\(store)")
        #expect(world.clone().status != 0, "git gets nothing and asks (here: nobody answers)")
        // No mount at all: get still answers at once with nothing.
        let noMount = Run.program(Run.mtmfs, ["credential", "--mount", world.scratch.path, "get"], input: question, timeout: 10)
        #expect(noMount.status == 0 && noMount.stdout.isEmpty, "\(noMount)")
        #expect(Run.mtmfs("unlock", world.store.mountPoint, input: Run.passphrase + "\n").status == 0)
        #expect(world.clone().status == 0)
    }
}
