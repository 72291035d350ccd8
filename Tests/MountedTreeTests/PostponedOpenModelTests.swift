@testable import CredentialVault
import SecureMemory
import Foundation
import FuseLowLevel
@testable import MountedTree
import Posix
import Testing
import TestSupport
#if canImport(Glibc)
import Glibc
#endif

/// `accounts/` guarded, in front of the kernel model, whose OPEN can be postponed as the
/// kernel's can: an untrusted reader's open of a password waits for the prompt (a pinentry
/// of the test's, answering from a file) and gets what the person answered; a Ctrl-C of the
/// reader while asked ends its wait with EINTR and the prompt with it. The tree is the
/// user nobody's (as root, every program is one its user could replace, which the guard
/// refuses outright), and the reader is a `sleep` of nobody's.
@Suite(.serialized) struct PostponedOpenModelTests {
    final class GuardedAccounts {
        let scratch: String
        let accounts: AccountsTree
        let answers: String
        let record: String
        let accountName = "2F1C2A3B-4D5E-4F60-8172-93A4B5C6D7E8"
        /// The process the reads are made for: nobody's `sleep`.
        let requester: pid_t
        let sleeper: Process
        static let nobody: uid_t = 65534

        init() throws {
            scratch = FileManager.default.temporaryDirectory.appendingPathComponent("mtmfs-postponed-\(UUID().uuidString)").path
            try FileManager.default.createDirectory(atPath: scratch, withIntermediateDirectories: true)
            answers = scratch + "/answer"
            record = scratch + "/asked"
            let pinentry = scratch + "/pinentry"
            try TestFile.writeProgram(TestPinentry.script(answers: answers, record: record, passphrase: "correct horse"), to: pinentry)
            let passphrase = try SecureBytes(copying: Array("correct horse".utf8))
            defer { passphrase.wipe() }
            let vault = try Vault.create(at: scratch + "/vault", passphrase: passphrase, parameters: .interactive)
            vault.lock()
            let sleeper = Process()
            sleeper.executableURL = URL(fileURLWithPath: "/usr/bin/setpriv")
            sleeper.arguments = ["--reuid=65534", "--regid=65534", "--clear-groups", "/bin/sleep", "120"]
            try sleeper.run()
            let pid = sleeper.processIdentifier
            requester = pid
            self.sleeper = sleeper
            // Once it runs sleep (setpriv has changed its user and exec'd).
            for _ in 0..<500 where (try? FileManager.default.destinationOfSymbolicLink(atPath: "/proc/\(pid)/exe"))?.hasSuffix("/sleep") != true {
                usleep(10_000)
            }
            let ownership = Ownership(uid: Self.nobody, gid: Self.nobody, since: .now())
            accounts = AccountsTree(vaultPath: scratch + "/vault", ownership: ownership, notifier: KernelCacheNotifier(),
                                    active: ActiveAccountLink(get: { nil }, set: { _ in }), autoLockSeconds: 0,
                                    prompts: PromptSettings(program: pinentry, environment: ["DISPLAY=:99"], timeout: 20,
                                                            mountPoint: scratch),
                                    nodes: NodeTable())
            try accounts.service.unlock(passphrase: passphrase)
            // Made before guarding is on: nobody is trusted with it.
            let maker = KernelModel(accounts, directory: "")
            maker.context = RequestContext(uid: Self.nobody, gid: Self.nobody, pid: 1, umask: 0o022)
            #expect(maker.makeDirectory(accountName) >= 0, "\(maker.trace)")
            let owner = KernelModel(accounts, directory: accountName)
            owner.context = maker.context
            let fd = owner.open("password", O_WRONLY | O_TRUNC)
            owner.write(fd, "hunter2\n")
            owner.close(fd)
            try accounts.service.setGuarding(true, passphrase: passphrase)
        }

        deinit {
            kill(requester, SIGKILL)
            sleeper.waitUntilExit()
            accounts.shutDown()
            try? FileManager.default.removeItem(atPath: scratch)
        }

        /// The model as the requester: a program no one trusted with the account.
        func reader() -> KernelModel {
            let k = KernelModel(accounts, directory: accountName)
            k.context = RequestContext(uid: Self.nobody, gid: Self.nobody, pid: requester, umask: 0o022)
            return k
        }

        func answer(_ word: String) { try? (word + "\n").write(toFile: answers, atomically: true, encoding: .utf8) }
        var prompts: Int { ((try? String(contentsOfFile: record, encoding: .utf8)) ?? "").components(separatedBy: "CONFIRM").count - 1 }
    }

    @Test func anOpenWaitsForThePromptAndGetsItsAnswer() throws {
        let g = try GuardedAccounts()
        let k = g.reader()
        g.answer("ok")
        #expect(k.contents("password") == "hunter2\n", "\(k.trace)")
        #expect(k.postponedOpens == 1, "the open was not postponed: \(k.trace)")
        #expect(g.prompts == 1)
        // Allowed once: for this run of the program, asked no more.
        g.answer("cancel")
        #expect(k.contents("password") == "hunter2\n", "\(k.trace)")
        #expect(g.prompts == 1)
    }

    @Test func aDenyAtThePromptIsEACCES() throws {
        let g = try GuardedAccounts()
        let k = g.reader()
        g.answer("cancel")
        #expect(k.open("password", O_RDONLY) == -EACCES, "\(k.trace)")
        #expect(k.postponedOpens == 1, "the open was not postponed: \(k.trace)")
        #expect(g.prompts == 1)
    }

    @Test func aCtrlCWhileAskedEndsTheWaitAndThePrompt() throws {
        let g = try GuardedAccounts()
        let k = g.reader()
        k.interruptAfter = 1
        g.answer("hang")
        let started = ContinuousClock.now
        #expect(k.open("password", O_RDONLY) == -EINTR, "\(k.trace)")
        #expect(started.duration(to: .now) < .seconds(8), "the interrupted open waited for the prompt's timeout")
        #expect(k.postponedOpens == 1)
        // Asked again afterwards: the interrupted prompt did not leave a decision behind.
        g.answer("ok")
        k.interruptAfter = 30
        #expect(k.contents("password") == "hunter2\n", "\(k.trace)")
    }
}
