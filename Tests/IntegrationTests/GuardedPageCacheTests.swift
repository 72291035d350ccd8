import Foundation
import Posix
import TestSupport
import Testing
#if canImport(Glibc)
import Glibc
#endif

/// Guarded reads through the page cache (SPEC §3a): a decided reader's second `cat` is
/// served by the kernel, and every narrowing (`guard on`, `untrust`) revokes the handles
/// opened before it — their reads and their mappings get nothing, also once a trusted
/// program has read the field again — until they are closed, when caching comes back.
@Suite(.serialized, .enabled(if: FuseAvailability.isAvailable))
struct GuardedPageCacheTests {
    /// Opens a file, reads it and maps it, then at each `go<N>` file reads it again by
    /// `pread` and through the mapping (in a child: a SIGBUS ends only that one), until a
    /// `quit` file; says what it got in `out`.
    static let holder = """
        import mmap, os, sys, time
        path, out, go = sys.argv[1:4]
        def say(text):
            with open(out, "a") as f:
                f.write(text + "\\n")
        fd = os.open(path, os.O_RDONLY)
        mapped = mmap.mmap(fd, 0, prot=mmap.PROT_READ)
        say("opened " + os.pread(fd, 100, 0).decode().strip() + " " + bytes(mapped[:7]).decode())
        step = 0
        while not os.path.exists(go + "quit"):
            if not os.path.exists(go + str(step)):
                time.sleep(0.01)
                continue
            try:
                say("read " + os.pread(fd, 100, 0).decode().strip())
            except OSError as error:
                say("error %d" % error.errno)
            child = os.fork()
            if child == 0:
                os.write(1, bytes(mapped[:7]))
                os._exit(0)
            _, status = os.waitpid(child, 0)
            say("mapped " + ("SIGBUS" if os.WIFSIGNALED(status) and os.WTERMSIG(status) == 7 else "read"))
            step += 1
        mapped.close()
        os.close(fd)
        say("closed")
        """

    final class Holder {
        let mount: GuardedMount
        let pid: pid_t
        var out: String { mount.writable + "/holder.out" }
        var go: String { mount.writable + "/go" }
        private var steps = 0

        init(_ mount: GuardedMount, program: String = "/usr/bin/python3") throws {
            self.mount = mount
            pid = mount.start(program, ["-c", GuardedPageCacheTests.holder, mount.password, mount.writable + "/holder.out",
                                        mount.writable + "/go"])
            try #require(Poll.until(seconds: 20) { self.lines.contains { $0.hasPrefix("opened") } }, "\(lines) \(mount.daemonLog)")
        }

        var lines: [String] {
            ((try? String(contentsOfFile: out, encoding: .utf8)) ?? "").split(separator: "\n").map(String.init)
        }

        /// Reads again by pread and through the mapping: the two lines it says.
        func readAgain() -> [String] {
            let before = lines.count
            FileManager.default.createFile(atPath: go + "\(steps)", contents: nil)
            chmod(go + "\(steps)", 0o644)
            steps += 1
            _ = Poll.until(seconds: 20) { self.lines.count >= before + 2 }
            return Array(lines.dropFirst(before))
        }

        /// Closes its descriptor and ends.
        func quit() {
            FileManager.default.createFile(atPath: go + "quit", contents: nil)
            _ = Run.wait(pid, timeout: 20)
        }
    }

    func status(_ mount: GuardedMount) -> [String: String] {
        var values: [String: String] = [:]
        for line in mount.run("/bin/cat", [mount.path(".mtmfs/status")]).stdout.split(separator: "\n") {
            let parts = line.split(separator: "=", maxSplits: 1)
            if parts.count == 2 { values[String(parts[0])] = String(parts[1]) }
        }
        return values
    }

    func fieldReads(_ mount: GuardedMount) -> Int { Int(status(mount)["field_reads"] ?? "") ?? -1 }

    /// The revoked handles are all closed (a RELEASE comes after close(2) returned).
    func revokedCloses(_ mount: GuardedMount) -> Bool {
        Poll.until(seconds: 10) { status(mount)["revoked_open"] == "0" }
    }

    /// `cat` twice by a trusted program: the second one is served from the kernel's pages.
    func expectCached(_ mount: GuardedMount, _ reader: String, _ comment: String) {
        #expect(mount.run(reader, ["-c", "100", mount.password]).stdout == "hunter2\n", "\(comment)")
        let reads = fieldReads(mount)
        #expect(mount.run(reader, ["-c", "100", mount.password]).stdout == "hunter2\n", "\(comment)")
        #expect(fieldReads(mount) == reads, "no READ for the second cat, \(comment)")
    }

    @Test func guardOnRevokesWhatWasOpenBefore() throws {
        let mount = try GuardedMount(guarded: false)
        defer { mount.close() }
        try mount.makeAccount()
        let reader = mount.trustedReader()
        // Opened while guarding is off: not decided; python3 is trusted with nothing.
        let holder = try Holder(mount)
        defer { holder.quit() }
        #expect(holder.lines.first == "opened hunter2 hunter2")
        #expect(mount.mtmfs("guard", "on", "--passphrase-file", mount.scratch.sub("pass"), mount.mountPoint).status == 0)
        #expect(status(mount)["revoked_open"] == "1")
        // A trusted program reads it again (by direct I/O: the old handle is still open)...
        let reads = fieldReads(mount)
        #expect(mount.run(reader, ["-c", "100", mount.password]).stdout == "hunter2\n")
        #expect(mount.run(reader, ["-c", "100", mount.password]).stdout == "hunter2\n")
        #expect(fieldReads(mount) >= reads + 2, "each read reaches the daemon while an old handle is open")
        // ...and the old handle reads nothing, neither by read nor through its mapping.
        #expect(holder.readAgain() == ["error 13", "mapped SIGBUS"], "\(holder.lines)")
        #expect(mount.run("/bin/cat", [mount.password]).status != 0, "a new open of the untrusted program is refused")
        holder.quit()
        #expect(revokedCloses(mount))
        expectCached(mount, reader, "once the old handle is closed")
    }

    @Test func untrustRevokesTheProgramsOpenHandles() throws {
        let mount = try GuardedMount()
        defer { mount.close() }
        try mount.makeAccount()
        let reader = mount.trustedReader()
        expectCached(mount, reader, "a decided reader, nothing narrowed")
        let python = Run.shell("readlink -f /usr/bin/python3").stdout.trimmingCharacters(in: .whitespacesAndNewlines)
        let account = mount.path("accounts/\(GuardedMount.uuid)")
        let pass = mount.scratch.sub("pass")
        #expect(mount.mtmfs("trust", "--passphrase-file", pass, account, python).status == 0)
        let holder = try Holder(mount, program: python)
        defer { holder.quit() }
        #expect(holder.lines.first == "opened hunter2 hunter2", "\(holder.lines)")
        #expect(holder.readAgain() == ["read hunter2", "mapped read"], "trusted: \(holder.lines)")
        #expect(mount.mtmfs("untrust", "--passphrase-file", pass, account, python).status == 0)
        #expect(status(mount)["revoked_open"] == "1")
        #expect(mount.run(reader, ["-c", "100", mount.password]).stdout == "hunter2\n")
        #expect(holder.readAgain() == ["error 13", "mapped SIGBUS"], "\(holder.lines)")
        // Another account's handles are not touched by this one's narrowing.
        #expect(mount.run("/bin/cat", [account + "/label"]).stdout == "mail for \(GuardedMount.uuid)\n")
        holder.quit()
        #expect(revokedCloses(mount))
        expectCached(mount, reader, "once the old handle is closed")
    }

    /// A trusted program replaced by another version at its path narrows too: once the new
    /// version asks (and is refused), the old version's open handle reads nothing more.
    @Test func aReplacedProgramsOldHandlesAreRevoked() throws {
        let mount = try GuardedMount()
        defer { mount.close() }
        try mount.makeAccount()
        let bin = mount.scratch.sub("bin")
        mkdir(bin, 0o755)
        let program = bin + "/python"
        #expect(Run.shell("cp \"$(readlink -f /usr/bin/python3)\" \(program) && chmod 755 \(program)").status == 0)
        let account = mount.path("accounts/\(GuardedMount.uuid)")
        #expect(mount.mtmfs("trust", "--passphrase-file", mount.scratch.sub("pass"), account, program).status == 0)
        let holder = try Holder(mount, program: program)
        defer { holder.quit() }
        #expect(holder.lines.first == "opened hunter2 hunter2", "\(holder.lines)")
        // Another version (one byte more) takes its place; it is asked about, and denied.
        #expect(Run.shell("cp \(program) \(program).new && printf x >> \(program).new && mv \(program).new \(program)").status == 0)
        mount.answer("cancel")
        let replaced = mount.run(program, ["-c", "print(open('\(mount.password)').read())"])
        #expect(replaced.status != 0 && !replaced.stdout.contains("hunter2"), "\(replaced)")
        #expect(status(mount)["revoked_open"] == "1")
        #expect(holder.readAgain() == ["error 13", "mapped SIGBUS"], "\(holder.lines)")
    }
}
