@testable import CredentialVault
import SecureMemory
import Foundation
import FuseLowLevel
@testable import MountedTree
import Posix
import SettingsStore
import Testing
#if canImport(Glibc)
import Glibc
#endif

/// Every save strategy of SPEC §4, replayed as the system calls the tools make, against
/// `settings/` and `accounts/` with no mount (`KernelModel` plays the kernel): each leaves
/// the intended value, no stray name, no node held once the kernel forgot them, and the two
/// trees answer every call alike.
@Suite struct EditorStrategyTests {
    /// One way to save `text` (no trailing newline) as the file `name` of the working directory.
    struct Strategy: Sendable, CustomStringConvertible {
        let description: String
        let save: @Sendable (KernelModel, String, String) -> Void
    }

    /// Write a temporary file, rename it onto the key; remove it when the rename fails.
    static func replaceThroughTemporary(_ k: KernelModel, _ temp: String, _ name: String, _ text: String) {
        let fd = k.open(temp, O_RDWR | O_CREAT | O_EXCL, mode: 0o600)
        k.write(fd, text + "\n")
        k.close(fd)
        if k.rename(temp, name) < 0 { k.unlink(temp) }
    }

    /// Unlink the key, create it again with O_EXCL, write, close.
    static func unlinkThenCreate(_ k: KernelModel, _ name: String, _ text: String, mode: mode_t) {
        k.unlink(name)
        let fd = k.open(name, O_WRONLY | O_CREAT | O_EXCL, mode: mode)
        k.write(fd, text + "\n")
        k.close(fd)
    }

    static let strategies: [Strategy] = [
        Strategy(description: "vim") { k, name, text in
            let swap = k.open(".\(name).swp", O_RDWR | O_CREAT | O_EXCL, mode: 0o600)
            k.write(swap, "b0VIM 9.1")
            k.stat(name)
            let probe = k.open("4913", O_WRONLY | O_CREAT | O_EXCL, mode: 0o644)
            k.close(probe)
            k.unlink("4913")
            k.rename(name, name + "~")
            let fd = k.open(name, O_WRONLY | O_CREAT | O_TRUNC, mode: 0o644)
            if k.write(fd, text + "\n") < 0 || k.fsync(fd) < 0 {
                k.close(fd)
                k.rename(name + "~", name)  // vim puts its backup back
            } else {
                k.close(fd)
                k.unlink(name + "~")
            }
            k.close(swap)
            k.unlink(".\(name).swp")
        },
        Strategy(description: "neovim") { k, name, text in
            let probe = k.open("4913", O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW, mode: 0o644)
            k.close(probe)
            k.unlink("4913")
            k.rename(name, name + "~")
            let fd = k.open(name, O_WRONLY | O_CREAT | O_TRUNC, mode: 0o644)
            let ok = k.write(fd, text + "\n") >= 0 && k.fsync(fd) >= 0
            let closed = k.close(fd) >= 0
            if ok && closed { k.unlink(name + "~") } else { k.rename(name + "~", name) }
        },
        Strategy(description: "vim backupcopy=yes") { k, name, text in
            let old = k.contents(name) ?? ""
            let backup = k.open(name + "~", O_WRONLY | O_CREAT | O_TRUNC, mode: 0o644)
            k.write(backup, old)
            k.close(backup)
            let fd = k.open(name, O_WRONLY | O_TRUNC)
            k.write(fd, text + "\n")
            k.fsync(fd)
            k.close(fd)
            k.unlink(name + "~")
        },
        Strategy(description: "nano") { k, name, text in
            let lock = k.open(".\(name).swp", O_WRONLY | O_CREAT | O_EXCL, mode: 0o600)
            k.write(lock, "b0nano 7.2")
            k.close(lock)
            let fd = k.open(name, O_WRONLY | O_CREAT | O_TRUNC, mode: 0o666)
            k.write(fd, text + "\n")
            k.close(fd)
            k.unlink(".\(name).swp")
        },
        Strategy(description: "emacs") { k, name, text in
            k.symlink("user@host.1234:1700000000", ".#\(name)")
            let autosave = k.open("#\(name)#", O_WRONLY | O_CREAT | O_TRUNC, mode: 0o600)
            k.write(autosave, text + "\n")
            k.close(autosave)
            k.rename(name, name + "~")
            let fd = k.open(name, O_WRONLY | O_CREAT | O_EXCL, mode: 0o644)
            k.write(fd, text + "\n")
            k.fsync(fd)
            if k.close(fd) < 0 { k.rename(name + "~", name) }
            k.unlink("#\(name)#")
            k.unlink(".#\(name)")
            k.unlink(name + "~")  // (emacs keeps it; deleted here to compare listings)
        },
        Strategy(description: "sed -i") { k, name, text in replaceThroughTemporary(k, "sedA1b2C3", name, text) },
        Strategy(description: "perl -pi") { k, name, text in replaceThroughTemporary(k, "XXq7Rz2k", name, text) },
        Strategy(description: "ed") { k, name, text in
            let fd = k.open(name, O_WRONLY | O_CREAT | O_TRUNC, mode: 0o666)
            k.write(fd, text + "\n")
            k.close(fd)
        },
        Strategy(description: "install") { k, name, text in unlinkThenCreate(k, name, text, mode: 0o600) },
        Strategy(description: "mv from another file system") { k, name, text in
            k.stat(name)
            unlinkThenCreate(k, name, text, mode: 0o644)
        },
        Strategy(description: "cp") { k, name, text in
            let fd = k.open(name, O_WRONLY | O_TRUNC)
            k.write(fd, text + "\n")
            k.close(fd)
        },
        Strategy(description: "git checkout") { k, name, text in unlinkThenCreate(k, name, text, mode: 0o644) },
        Strategy(description: "Python tempfile + os.replace") { k, name, text in replaceThroughTemporary(k, "tmpk3_x9q2z", name, text) },
        Strategy(description: "shell > (open, dup2, close, write)") { k, name, text in
            let fd = k.open(name, O_WRONLY | O_CREAT | O_TRUNC, mode: 0o666)
            let dup = k.open(name, O_WRONLY)  // the shell's first descriptor closes before the write
            k.close(dup)
            k.write(fd, text + "\n")
            k.close(fd)
        },
        Strategy(description: "truncate, then >>") { k, name, text in
            let fd = k.open(name, O_WRONLY | O_TRUNC)
            k.close(fd)
            let append = k.open(name, O_WRONLY | O_APPEND)
            k.write(append, text + "\n")
            k.close(append)
        },
    ]

    /// A settings tree whose plist holds `username` (string) and `port` (integer), and an
    /// accounts tree with one unlocked account whose `username` and `port` are set alike.
    final class Trees {
        let scratch: String
        let settings: SettingsTree
        let accounts: AccountsTree
        let accountName = "2F1C2A3B-4D5E-4F60-8172-93A4B5C6D7E8"

        init() throws {
            scratch = FileManager.default.temporaryDirectory.appendingPathComponent("mtmfs-editors-\(UUID().uuidString)").path
            try FileManager.default.createDirectory(atPath: scratch, withIntermediateDirectories: true)
            let ownership = Ownership.currentProcess()
            let plist = scratch + "/Settings.plist"
            try """
            <?xml version="1.0" encoding="UTF-8"?>
            <!DOCTYPE plist PUBLIC "-//Apple//DTD PLIST 1.0//EN" "http://www.apple.com/DTDs/PropertyList-1.0.dtd">
            <plist version="1.0"><dict><key>username</key><string>old</string><key>port</key><integer>8080</integer></dict></plist>
            """.write(toFile: plist, atomically: true, encoding: .utf8)
            settings = SettingsTree(plistPath: plist, ownership: ownership, notifier: KernelCacheNotifier(), nodes: NodeTable())
            let passphrase = try SecureBytes(copying: Array("correct horse".utf8))
            let vault = try Vault.create(at: scratch + "/vault", passphrase: passphrase, parameters: .interactive)
            vault.lock()
            accounts = AccountsTree(vaultPath: scratch + "/vault", ownership: ownership, notifier: KernelCacheNotifier(),
                                    active: ActiveAccountLink(get: { nil }, set: { _ in }), autoLockSeconds: 0,
                                    prompts: PromptSettings(environment: [], mountPoint: scratch), nodes: NodeTable())
            try accounts.service.unlock(passphrase: passphrase)
            let context = RequestContext(uid: getuid(), gid: getgid(), pid: 1, umask: 0o022)
            let account = try accounts.makeDirectory(parent: accounts.space.root, name: accountName, mode: 0o700, context: context)
            accounts.forget(inode: account.inode, lookups: 1)
            let k = KernelModel(accounts, directory: accountName)
            for (name, value) in [("username", "old"), ("port", "8080")] {
                let fd = k.open(name, O_WRONLY | O_TRUNC)
                k.write(fd, value + "\n")
                k.close(fd)
            }
        }

        deinit {
            settings.shutDown()
            accounts.shutDown()
            try? FileManager.default.removeItem(atPath: scratch)
        }

        func settingsModel() -> KernelModel { KernelModel(settings, directory: "") }
        func accountsModel() -> KernelModel { KernelModel(accounts, directory: accountName) }
    }

    @Test(arguments: strategies)
    func everyStrategySavesAValueAlikeInBothTrees(strategy: Strategy) throws {
        let trees = try Trees()
        let inSettings = trees.settingsModel(), inAccounts = trees.accountsModel()
        let settingsNames = inSettings.list(), accountNames = inAccounts.list()

        strategy.save(inSettings, "username", "new value")
        strategy.save(inAccounts, "username", "new value")
        #expect(inSettings.trace == inAccounts.trace, "the trees answered differently")
        #expect(!inSettings.trace.contains { !$0.hasSuffix("→ ok") && !$0.hasPrefix("stat") && !$0.contains("unlink") },
                "a call failed: \(inSettings.trace)")
        #expect(inSettings.contents("username") == "new value\n")
        #expect(inAccounts.contents("username") == "new value\n")
        #expect(inSettings.list() == settingsNames)
        #expect(inAccounts.list() == accountNames)

        // A value the key does not take: refused at some call, the same one in both trees,
        // and the old value stays. (`: > key` first commits an empty value, which a field
        // takes — unset — and an integer key does not: the stores differ there, not the engine.)
        if strategy.description.hasPrefix("truncate") { return }
        let settingsTrace = inSettings.trace.count, accountsTrace = inAccounts.trace.count
        strategy.save(inSettings, "port", "not a port")
        strategy.save(inAccounts, "port", "not a port")
        #expect(Array(inSettings.trace[settingsTrace...]) == Array(inAccounts.trace[accountsTrace...]))
        #expect(inSettings.trace[settingsTrace...].contains { $0.hasSuffix("EINVAL") })
        #expect(inSettings.contents("port") == "8080\n")
        #expect(inAccounts.contents("port") == "8080\n")

        // The kernel forgot everything: no file is held but the editors' files still linked.
        #expect(trees.settings.census.files == trees.settings.census.scratch, "\(trees.settings.census)")
        #expect(trees.accounts.census.files == trees.accounts.census.scratch, "\(trees.accounts.census)")
        // Every reference handed out (lookups, creates, listings) was counted once and forgotten.
        #expect(trees.settings.nodes.referencedInodes == 0)
        #expect(trees.accounts.nodes.referencedInodes == 0)
    }

    @Test func anUnlinkedOpenScratchFileReadsUntilClosedInBothTrees() throws {
        let trees = try Trees()
        for k in [trees.settingsModel(), trees.accountsModel()] {
            let fd = k.open(".username.swp", O_RDWR | O_CREAT | O_EXCL, mode: 0o600)
            k.write(fd, "swap data")
            k.unlink(".username.swp")
            #expect(k.read(fd) == "swap data")
            #expect(k.contents(".username.swp") == nil)
            k.close(fd)
        }
        #expect(trees.settings.census.files == 0)
        #expect(trees.accounts.census.files == 0)
    }

    @Test func manySavesHoldNoMoreNodesThanOne() throws {
        let trees = try Trees()
        for k in [trees.settingsModel(), trees.accountsModel()] {
            for round in 0..<200 {
                let strategy = Self.strategies[round % Self.strategies.count]
                strategy.save(k, "username", "value \(round)")
            }
            #expect(k.contents("username") == "value 199\n")
        }
        #expect(trees.settings.census.files == 0 && trees.settings.census.hidden == 0, "\(trees.settings.census)")
        #expect(trees.accounts.census.files == 0 && trees.accounts.census.hidden == 0, "\(trees.accounts.census)")
        #expect(trees.settings.nodes.referencedInodes == 0 && trees.accounts.nodes.referencedInodes == 0)
    }

    @Test func aDescriptorFromBeforeALockChangesNothingAfterTheNextUnlock() throws {
        let trees = try Trees()
        let k = trees.accountsModel()
        let fd = k.open("password", O_WRONLY)
        k.write(fd, "typed before the lock\n")
        trees.accounts.service.lock(reason: "test")
        try trees.accounts.service.unlock(passphrase: try SecureBytes(copying: Array("correct horse".utf8)))
        #expect(k.ftruncate(fd, 0) == -EACCES)
        #expect(k.close(fd) == -EACCES)
        #expect(k.contents("password") == "\n")
        #expect(k.contents("username") == "old\n")
    }

    @Test func aRenameOntoAKeyRemovedAMomentAgoTakesTheSourcesType() throws {
        let trees = try Trees()
        let k = trees.settingsModel()
        k.unlink("port")  // an integer, leaving in a second
        #expect(k.rename("username", "port") == 0)
        #expect(k.contents("port") == "old\n")
        #expect(k.contents("username") == nil)
    }

    @Test func anOutsideChangeBelowADictionaryShows() throws {
        let trees = try Trees()
        let context = RequestContext(uid: getuid(), gid: getgid(), pid: 1, umask: 0o022)
        let prefs = try trees.settings.makeDirectory(parent: trees.settings.space.root, name: "Prefs", mode: 0o755, context: context)
        trees.settings.forget(inode: prefs.inode, lookups: 1)
        let k = KernelModel(trees.settings, directory: "Prefs")
        let fd = k.open("Level", O_WRONLY | O_CREAT | O_TRUNC)
        k.write(fd, "1\n")
        k.close(fd)
        #expect(k.contents("Level") == "1\n")
        // Keep the file known to the daemon, as a kernel holding it would.
        let held = k.open("Level", O_RDONLY)
        func rewrite(_ body: String) throws {
            try """
            <?xml version="1.0" encoding="UTF-8"?>
            <!DOCTYPE plist PUBLIC "-//Apple//DTD PLIST 1.0//EN" "http://www.apple.com/DTDs/PropertyList-1.0.dtd">
            <plist version="1.0"><dict>\(body)</dict></plist>
            """.write(toFile: trees.scratch + "/Settings.plist.new", atomically: false, encoding: .utf8)
            rename(trees.scratch + "/Settings.plist.new", trees.scratch + "/Settings.plist")
            usleep(600_000)  // the watcher looks every 0.2 s
        }
        try rewrite("<key>username</key><string>old</string>")
        try rewrite("<key>Prefs</key><dict><key>Level</key><integer>2</integer></dict>")
        #expect(k.contents("Level") == "2\n")
        k.close(held)
    }

    @Test func aKeySetAgainAfterItsUnlinkStays() throws {
        let trees = try Trees()
        let k = trees.settingsModel()
        k.unlink("username")
        try trees.settings.setString("again", forKey: "username")  // as `ln -sfn` on accounts/active does
        usleep(1_500_000)  // past the unlinked key's delay
        #expect(k.contents("username") == "again\n")
    }
}
