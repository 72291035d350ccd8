#if canImport(Glibc)
import Glibc
#endif
import CredentialVault
import ScriptCommands
import SecureMemory
import MountedTree
import Posix
import SettingsStore

/// `mtmfs demo`: a throwaway store, mounted, with a short tour printed.
struct DemoCommand: Command {
    static let name = "demo"
    static let abstract = "make a demo store, mount it and print a short tour"
    static let usage = """
    Usage: mtmfs demo [MOUNT]

    Creates a throwaway data directory under /tmp, mounts it on MOUNT (default
    ./mtmfs-demo, created if missing) and prints a tour. End it with `mtmfs unmount MOUNT`.
    """
    static let flags: Set<String> = []
    static let options: Set<String> = []

    let given: String

    init(_ arguments: Arguments) throws(CommandFailure) {
        given = try arguments.positionals(0...1, named: "").first ?? "mtmfs-demo"
    }

    func run() throws(CommandFailure) {
        let absolute = Paths.absolute(given)
        if (try? Syscall.lstat(absolute)) == nil {
            do {
                try Syscall.mkdir(absolute, mode: 0o755)
            } catch {
                throw CommandFailure("cannot create the mount point \(given): \(error)")
            }
        }
        let mountPoint = try MountPointCheck.validate(given)
        var template = Array("/tmp/mtmfs-demo-data.XXXXXX".utf8CString)
        guard let created = mkdtemp(&template) else {
            throw CommandFailure("cannot create a demo data directory in /tmp: \(Errno.current)")
        }
        let dataDirectory = DataDirectory(path: String(cString: created))
        let passphrase: SecureBytes
        do throws(Errno) { passphrase = try SecureBytes(copying: Array(Self.passphrase.utf8)) } catch {
            throw CommandFailure("no secure memory for the passphrase: \(error)")
        }
        defer { passphrase.wipe() }
        do {
            try dataDirectory.initialize(passphrase: passphrase, kdf: .interactive)
            try Self.addSampleAccounts(dataDirectory, passphrase: passphrase)
            try Self.addSampleSettings(dataDirectory)
        } catch let error as DataDirectoryError {
            throw CommandFailure(error.description)
        } catch {
            throw CommandFailure("cannot write the demo stores: \(error)")
        }
        _ = try Daemon.start(dataDirectory: dataDirectory.path, mountPoint: mountPoint, options: [], discardDataDirectory: true)
        Self.addSampleCacheFiles(mountPoint + "/cache")
        let locked = tour(mountPoint: mountPoint, dataDirectory: dataDirectory.path)
        try PassphraseInput.unlock(mountPoint: mountPoint, with: passphrase)
        print(locked + "\n" + unlockedTour(mountPoint: mountPoint) + footer(dataDirectory: dataDirectory.path))
    }

    /// A few files in cache/, written through the mount like any program would.
    static func addSampleCacheFiles(_ cache: String) {
        func write(_ path: String, _ text: String) {
            guard let fd = try? Syscall.open(cache + "/" + path, O_WRONLY | O_CREAT | O_TRUNC, mode: 0o644) else { return }
            try? Syscall.writeAll(fd, Array(text.utf8))
            Syscall.close(fd)
        }
        _ = try? Syscall.mkdir(cache + "/avatars", mode: 0o755)
        _ = try? Syscall.mkdir(cache + "/http", mode: 0o755)
        write("http/index.json", "{\"etag\": \"W/\\\"5f2a\\\"\", \"items\": 42}\n")
        write("avatars/alice.svg", "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"8\" height=\"8\"><circle cx=\"4\" cy=\"4\" r=\"4\"/></svg>\n")
        write("README.txt", "Anything can live here: files, directories, links. It is all one SQLite database.\n")
        symlink("avatars/alice.svg", cache + "/me.svg")
    }

    /// `mtmfs` as the user can type it here: the tour's commands run as printed.
    static let command = Paths.commandName()

    /// Said when `mtmfs` alone would not find this build.
    static var pathHint: String {
        guard command != "mtmfs" else { return "" }
        let directory = command.split(separator: "/").dropLast().joined(separator: "/")
        return "\n\n`mtmfs` alone is not this build; to type it so: export PATH=\"/\(directory):$PATH\""
    }

    /// The demo vault's passphrase (printed: this store is for show only).
    static let passphrase = "demo passphrase"
    static let sampleAccounts: [(String, [AccountField: String])] = [
        ("6F9619FF-8B86-D011-B42D-00C04FC964FF", [.label: "Work mail", .protocol: "https", .server: "mail.example.com",
                                                  .path: "/owa", .username: "alice", .password: "correct-horse-42",
                                                  .comment: "imap-primary"]),
        ("3e4666bf-d5e5-4aa7-b8ce-cefe41c7568a", [.label: "Team files", .protocol: "https", .server: "files.example.com",
                                                  .port: "8443", .path: "/dav", .username: "alice@example.com",
                                                  .password: "tr0ub4dor&3"]),
    ]

    static func addSampleAccounts(_ dataDirectory: DataDirectory, passphrase: SecureBytes) throws {
        let vault = try Vault(path: dataDirectory.vaultPath)
        try vault.unlock(passphrase: passphrase)
        defer { vault.lock() }
        for (name, fields) in sampleAccounts {
            let uuid = AccountName.uuidBytes(name)!
            try vault.addAccount(uuid: uuid, name: name)
            var values: [AccountField: SecureBytes] = [:]
            for (field, value) in fields { values[field] = try SecureBytes(copying: Array(value.utf8)) }
            try vault.setFields(values, of: uuid)
        }
        let document = try SettingsDocument(path: dataDirectory.settingsPath)
        var root = document.root
        root["ActiveServiceAccountUUID"] = .string(sampleAccounts[0].0)
        try document.save(root)
    }

    func unlockedTour(mountPoint: String) -> String {
        let shown = given
        let account = Self.sampleAccounts[1].0
        func cat(_ relative: String) -> String {
            String(decoding: (try? readFile(mountPoint + "/" + relative)) ?? [], as: UTF8.self).trimmingSuffix("\n")
        }
        return """

        The accounts are locked at first. This demo's passphrase is "\(Self.passphrase)":

        $ \(Self.command) unlock \(shown)          # asks for it (no echo); done for you here
        $ ls \(shown)/accounts/\(account)
        \(((try? Syscall.listDirectory(mountPoint + "/accounts/" + account)) ?? []).joined(separator: "  "))
        $ cat \(shown)/accounts/\(account)/url \(shown)/accounts/\(account)/username
        \(cat("accounts/\(account)/url"))
        \(cat("accounts/\(account)/username"))
        $ readlink \(shown)/accounts/active
        \((try? FileManagerLink.read(mountPoint + "/accounts/active")) ?? "")

        The accounts stay unlocked for you to look around. To lock them again (keys and
        plaintext zeroed; also after 900 s without a secret read, or on SIGUSR1):
          \(Self.command) lock \(shown)
        """
    }

    /// A few settings of every type, nested ones included.
    static func addSampleSettings(_ dataDirectory: DataDirectory) throws {
        let document = try SettingsDocument(path: dataDirectory.settingsPath)
        var root = document.root
        root["IsFirstRun"] = .bool(false)
        root["SyncIntervalSeconds"] = .integer(900)
        root["LastSync"] = .date(PlistText.parseDate("2026-11-29T08:30:00Z")!)
        root["Appearance"] = .dictionary(PlistDictionary([
            ("Theme", .string("dark")), ("FontScale", .real(1.25)), ("ShowBadges", .bool(true)),
        ]))
        root["RecentServers"] = .array([.string("https://mail.example.com"), .string("https://files.example.com:8443/dav")])
        root["DeviceToken"] = .data(Array("demo-device-token".utf8))
        try document.save(root)
    }

    func tour(mountPoint: String, dataDirectory: String) -> String {
        let shown = given
        let top = ((try? Syscall.listDirectory(mountPoint)) ?? []).sorted().joined(separator: "  ")
        let status = String(decoding: (try? readFile(mountPoint + "/.mtmfs/status")) ?? [], as: UTF8.self)
        let settings = ((try? Syscall.listDirectory(mountPoint + "/settings")) ?? []).joined(separator: "  ")
        func cat(_ relative: String) -> String {
            String(decoding: (try? readFile(mountPoint + "/" + relative)) ?? [], as: UTF8.self).trimmingSuffix("\n")
        }
        return """
        mtmfs demo: a throwaway store in \(dataDirectory),
        mounted on \(mountPoint).

        $ ls -A \(shown)
        \(top)

        $ cat \(shown)/.mtmfs/status
        \(status.trimmingSuffix("\n"))

        $ ls \(shown)/settings
        \(settings)

        $ cat \(shown)/settings/Appearance/Theme \(shown)/settings/RecentServers/1
        \(cat("settings/Appearance/Theme"))
        \(cat("settings/RecentServers/1"))

        $ ls \(shown)/cache
        \(((try? Syscall.listDirectory(mountPoint + "/cache")) ?? []).sorted().joined(separator: "  "))
        """
    }

    /// What to try next: commands not run by the demo, listed apart from those it ran.
    func footer(dataDirectory: String) -> String {
        let shown = given
        return """


        Try these yourself (not run here):
          sqlite3 \(dataDirectory)/cache.sqlite 'SELECT count(*) FROM inodes'   # the same tree, in SQLite
          echo light > \(shown)/settings/Appearance/Theme       # saved to Settings.plist at once
          getfattr -n user.plist.type \(shown)/settings/LastSync    # the key's plist type: date
          vim \(shown)/settings/SyncIntervalSeconds                # any editor works; bad values get EINVAL

        The tree:
          \(shown)/accounts/   service accounts from the encrypted vault (locked until unlocked)
          \(shown)/settings/   the keys of Settings.plist, one file per key
          \(shown)/cache/      a file tree in SQLite (large files in data files beside it)
          \(shown)/.mtmfs/     status and control files

        Look around with ls and cat; `\(Self.command) status` summarizes every mount.
        The demo's data directory goes with its mount.
        When done: \(Self.command) unmount \(shown)\(Self.pathHint)
        """
    }

    func readFile(_ path: String) throws(Errno) -> [UInt8] { try Syscall.readFile(path) }
}

enum FileManagerLink {
    static func read(_ path: String) throws(Errno) -> String {
        var buffer = [CChar](repeating: 0, count: 4096)
        let n = readlink(path, &buffer, buffer.count - 1)
        guard n >= 0 else { throw Errno.current }
        return String(decoding: buffer[0..<n].map { UInt8(bitPattern: $0) }, as: UTF8.self)
    }
}
