import CredentialVault
import Foundation
import FuseLowLevel
@testable import MountedTree
import Posix
import SecureMemory
import Synchronization
import Testing
#if canImport(Glibc)
import Glibc
#endif

/// Guarding's one decision (`AccessGuard.decide`, issue 50): its table, and an open whose
/// decision a trusted-list change overtook.
@Suite struct AccessPolicyTests {
    static let account: [UInt8] = Array(repeating: 7, count: 16)
    static let program = TrustedProgram(sha256: Array(repeating: 1, count: 32), path: "/usr/bin/trusted")
    static let other = TrustedProgram(sha256: Array(repeating: 2, count: 32), path: "/usr/bin/other")

    static func access(_ scope: AccessGuard.Scope = .run) -> AccessGuard.Access {
        var access = AccessGuard.Access(account: account, accountName: "x", what: "password", writing: false, label: "")
        access.scope = scope
        return access
    }

    static func requester(_ program: TrustedProgram?, refusal: String? = nil) -> Requester {
        Requester(process: getpid(), program: program, refusal: refusal, parent: getppid(), isMtmfs: false)
    }

    @Test func theTable() {
        let guardian = AccessGuard(settings: PromptSettings(environment: [], mountPoint: "/tmp"))
        func verdict(_ requester: Requester, _ trusted: [TrustedProgram], _ access: AccessGuard.Access = Self.access(),
                     asking: AccessGuard.Asking = .person) -> AccessGuard.Verdict {
            guardian.decide(requester, access, trusted: trusted, trustVersion: 1, asking: asking).verdict
        }
        // Refused by the inspector: denied, even when its program is trusted.
        #expect(verdict(Self.requester(Self.program, refusal: "traced"), [Self.program]) == .denied("traced"))
        // No program known: denied.
        #expect(verdict(Self.requester(nil), [Self.program]) == .denied("its program is unknown"))
        // Trusted (by hash, not path): allowed.
        #expect(verdict(Self.requester(Self.program), [Self.program]) == .allowed("trusted"))
        #expect(verdict(Self.requester(TrustedProgram(sha256: Self.other.sha256, path: Self.program.path)), [Self.program]) == .ask)
        // Not trusted: a person is asked — or, at a door that asks nobody, denied with its reason.
        #expect(verdict(Self.requester(Self.other), [Self.program]) == .ask)
        let refused = guardian.decide(Self.requester(Self.other), Self.access(), trusted: [], trustVersion: 1, asking: .nobody("no"))
        #expect(refused.verdict == .denied("no") && refused.undecided && !refused.isAllowed)
        // Allowed once: for this run (an open), or this connection (the bus), until it ends.
        guardian.allowOnce(Self.requester(Self.other), Self.access())
        #expect(verdict(Self.requester(Self.other), []) == .allowed("allowed once for this run"))
        #expect(verdict(Self.requester(Self.other), [], Self.access(.connection(":1.5"))) == .ask)
        guardian.allowOnce(Self.requester(Self.other), Self.access(.connection(":1.5")))
        #expect(verdict(Self.requester(Self.other), [], Self.access(.connection(":1.5"))) == .allowed("allowed once for this connection"))
        guardian.connectionClosed(":1.5")
        #expect(verdict(Self.requester(Self.other), [], Self.access(.connection(":1.5"))) == .ask)
        // The decision carries the version of the lists it read.
        #expect(guardian.decide(Self.requester(Self.program), Self.access(), trusted: [Self.program], trustVersion: 42, asking: .person).trustVersion == 42)
    }

    /// A requester the guard can trust: `sleep` run as nobody (a root process runs code
    /// its user can write, and is refused outright).
    static func trustableProcess() throws -> Process {
        let process = Process()
        process.executableURL = URL(fileURLWithPath: "/usr/bin/setpriv")
        process.arguments = ["--reuid=65534", "--regid=65534", "--clear-groups", "/bin/sleep", "60"]
        try process.run()
        for _ in 0..<200 where (try? FileManager.default.destinationOfSymbolicLink(atPath: "/proc/\(process.processIdentifier)/exe"))
            .map({ !$0.hasSuffix("/sleep") }) ?? true {
            usleep(10_000)
        }
        return process
    }

    /// `sleep` (run as nobody) trusted with a guarded account; between an open's decision
    /// and the open, `untrust` takes it off: the open is decided again, and refused (an
    /// open that cannot wait for a prompt).
    @Test func anUntrustBetweenTheDecisionAndTheOpenRefusesTheOpen() throws {
        let trees = try EditorStrategyTests.Trees()
        let accounts = trees.accounts
        let sleeper = try Self.trustableProcess()
        defer { kill(sleeper.processIdentifier, SIGKILL); sleeper.waitUntilExit() }
        let context = RequestContext(uid: getuid(), gid: getgid(), pid: sleeper.processIdentifier, umask: 0o022)
        let directory = try accounts.lookup(parent: accounts.space.root, name: trees.accountName, context: context).inode
        let password = try accounts.lookup(parent: directory, name: "password", context: context).inode
        let passphrase = try SecureBytes(copying: Array("correct horse".utf8))
        defer { passphrase.wipe() }
        try accounts.service.setGuarding(true, passphrase: passphrase)
        let requester = accounts.access.inspector.inspect(thread: sleeper.processIdentifier)
        try #require(requester.refusal == nil, "\(requester.refusal ?? "")")
        let ownProgram = try #require(requester.program)
        let uuid = try #require(AccountName.uuidBytes(trees.accountName))
        try accounts.service.trust(ownProgram, account: uuid)

        // Trusted: opens.
        let opened = try accounts.open(password, flags: O_RDONLY, context: context)
        accounts.release(password, handle: opened.handle, flags: O_RDONLY)

        // Untrusted between the decision and the open: refused.
        let hookRan = Mutex(false)
        let accountName = trees.accountName
        accounts.afterOpenDecision.withLock { hook in
            hook = {
                guard !hookRan.withLock({ $0 }) else { return }
                hookRan.withLock { $0 = true }
                try? accounts.service.changeTrust(adding: false, accountName: accountName, programs: [ownProgram.path], passphrase: passphrase)
            }
        }
        #expect(throws: Errno.permissionDenied) { try accounts.open(password, flags: O_RDONLY, context: context) }
        #expect(hookRan.withLock { $0 })
        #expect(try accounts.service.trustedPrograms(of: uuid).isEmpty)
        // And the record says so: allowed never followed the untrust.
        accounts.afterOpenDecision.withLock { $0 = nil }
        #expect(throws: Errno.permissionDenied) { try accounts.open(password, flags: O_RDONLY, context: context) }
    }
}
