import Foundation
import Posix
import TestSupport
import Testing
#if canImport(Glibc)
import Glibc
#endif

/// Finding an account by what it is for (SPEC §2a): the by-server and by-label views and
/// `mtmfs find`, through a real mount.
@Suite(.enabled(if: FuseAvailability.isAvailable, "needs /dev/fuse")) struct FindingTests {
    static let mail = "6F9619FF-8B86-D011-B42D-00C04FC964FF"
    static let files = "3e4666bf-d5e5-4aa7-b8ce-cefe41c7568a"

    /// A mounted, unlocked store with two accounts.
    static func store() throws -> MountedStore {
        let store = try MountedStore()
        do {
            let unlock = Run.mtmfs("unlock", store.mountPoint, input: Run.passphrase + "\n")
            try #require(unlock.status == 0, "\(unlock)")
            try make(store, mail, ["label": "Work mail", "url": "https://mail.example.com/owa", "username": "alice",
                                   "password": "correct-horse-42"])
            try make(store, files, ["label": "Team files", "url": "https://files.example.com:8443/dav",
                                    "username": "alice@example.com", "password": "tr0ub4dor&3"])
        } catch {
            store.close()
            throw error
        }
        return store
    }

    static func make(_ store: MountedStore, _ name: String, _ fields: [String: String]) throws {
        try #require(mkdir(store.path("accounts/\(name)"), 0o700) == 0, "mkdir \(name): \(Errno.current)")
        for (field, value) in fields.sorted(by: { $0.key < $1.key }) {
            try TestFile.write(value + "\n", to: store.path("accounts/\(name)/\(field)"))
        }
    }

    static func list(_ path: String) -> [String]? { try? FileManager.default.contentsOfDirectory(atPath: path).sorted() }
    static func link(_ path: String) -> String? { try? FileManager.default.destinationOfSymbolicLink(atPath: path) }
    static func read(_ path: String) -> String? { TestFile.read(path) }

    @Test func viewsListLinkAndFollowEveryChange() throws {
        let store = try Self.store()
        defer { store.close() }
        let accounts = store.path("accounts")
        #expect(Self.list(accounts) == [Self.files, Self.mail, "by-label", "by-server"])
        #expect(Self.list(accounts + "/by-server") == ["files.example.com", "mail.example.com"])
        #expect(Self.list(accounts + "/by-server/mail.example.com") == ["alice"])
        #expect(Self.link(accounts + "/by-server/mail.example.com/alice") == "../../\(Self.mail)")
        #expect(Self.read(accounts + "/by-server/files.example.com/alice@example.com/password") == "tr0ub4dor&3\n")
        #expect(Self.list(accounts + "/by-label") == ["Team files", "Work mail"])
        #expect(Self.link(accounts + "/by-label/Work mail") == "../\(Self.mail)")
        #expect(Self.read(accounts + "/by-label/Work mail/username") == "alice\n")

        // A changed server moves the link at once.
        #expect(Run.shell("echo new.example.org > '\(accounts)/\(Self.mail)/server'").status == 0)
        #expect(Self.list(accounts + "/by-server") == ["files.example.com", "new.example.org"])
        #expect(Self.read(accounts + "/by-server/new.example.org/alice/password") == "correct-horse-42\n")
        #expect(Self.list(accounts + "/by-server/mail.example.com") == nil)
        // Editors' save strategies too: sed -i (temporary file, rename) and vim.
        #expect(Run.shell("sed -i s/alice/carol/ '\(accounts)/\(Self.mail)/username'").status == 0)
        #expect(Self.list(accounts + "/by-server/new.example.org") == ["carol"])
        #expect(Run.shell("vim -es -c '%s/Work/Home/' -c wq '\(accounts)/\(Self.mail)/label'", timeout: 30).status == 0)
        #expect(Self.list(accounts + "/by-label") == ["Home mail", "Team files"])
        // A URL sets the server (and port, path).
        #expect(Run.shell("echo https://other.example.net:9000/x > '\(accounts)/\(Self.mail)/url'").status == 0)
        #expect(Self.read(accounts + "/by-server/other.example.net/carol/port") == "9000\n")
        // A new account shows; a removed one goes.
        let third = "0A1B2C3D-4E5F-4A6B-8C7D-9E0F1A2B3C4D"
        try Self.make(store, third, ["server": "other.example.net", "username": "dave", "label": "Third"])
        #expect(Self.list(accounts + "/by-server/other.example.net") == ["carol", "dave"])
        #expect(Run.shell("rm -r '\(accounts)/\(third)'").status == 0)
        #expect(Self.list(accounts + "/by-server/other.example.net") == ["carol"])
        #expect(Self.list(accounts + "/by-label") == ["Home mail", "Team files"])

        // Locked: both views are empty directories; unlocked again: the same names.
        #expect(Run.mtmfs("lock", store.mountPoint).status == 0)
        #expect(Self.list(accounts + "/by-server") == [])
        #expect(Self.list(accounts + "/by-label") == [])
        #expect(Self.read(accounts + "/by-label/Team files/username") == nil)
        #expect(Self.link(accounts + "/by-server/files.example.com/alice@example.com") == nil)
        #expect(Run.mtmfs("unlock", store.mountPoint, input: Run.passphrase + "\n").status == 0)
        #expect(Self.list(accounts + "/by-label") == ["Home mail", "Team files"])
        #expect(Self.read(accounts + "/by-label/Team files/username") == "alice@example.com\n")
    }

    /// README's loop over the accounts visits each account once: not `active`, not the views.
    @Test func readmesLoopVisitsEachAccountOnce() throws {
        let store = try Self.store()
        defer { store.close() }
        #expect(Run.shell("ln -s \(Self.mail) '\(store.path("accounts/active"))'").status == 0)
        let loop = """
            cd '\(store.mountPoint)'
            for d in accounts/*-*-*-*-*/; do
                [ -d "$d" ] || continue
                printf '%s\\t%s\\n' "$(cat "$d/label")" "$(cat "$d/url")"
            done
            """
        let result = Run.shell(loop)
        #expect(result.stdout == "Team files\thttps://files.example.com:8443/dav\nWork mail\thttps://mail.example.com/owa\n", "\(result)")
        #expect(Run.shell("ls -d '\(store.path("accounts"))'/*/ | wc -l").stdout.trimmingCharacters(in: .whitespacesAndNewlines) == "5",
                "accounts/*/ sees the two accounts, active and both views")
    }

    /// Changes in a view get EACCES, as in a read-only directory (also for root, whom the
    /// kernel's permission check lets through).
    @Test func viewsRefuseChanges() throws {
        let store = try Self.store()
        defer { store.close() }
        let labels = store.path("accounts/by-label"), servers = store.path("accounts/by-server")
        #expect(errnoOf { mkdir(servers + "/x", 0o700) } == EACCES)
        #expect(errnoOf { mkdir(servers + "/mail.example.com/x", 0o700) } == EACCES)
        #expect(errnoOf { open(labels + "/new", O_WRONLY | O_CREAT | O_CLOEXEC, 0o600) } == EACCES)
        #expect(errnoOf { unlink(labels + "/Work mail") } == EACCES)
        #expect(errnoOf { unlink(servers + "/mail.example.com/alice") } == EACCES)
        #expect(errnoOf { rename(labels + "/Work mail", labels + "/Other") } == EACCES)
        #expect(errnoOf { rename(labels + "/Work mail", store.path("accounts/x")) } == EACCES)
        #expect(errnoOf { symlink("../\(Self.mail)", labels + "/mine") } == EACCES)
        #expect(errnoOf { rmdir(servers + "/mail.example.com") } == EACCES)
        #expect(errnoOf { rmdir(servers) } == EACCES)
        #expect(errnoOf { mkdir(servers, 0o700) } == EEXIST)
        #expect(errnoOf { unlink(labels) } == EISDIR)
        #expect(errnoOf { rename(labels, store.path("accounts/elsewhere")) } == EACCES)
        #expect(errnoOf { chmod(labels, 0o777) } == EACCES)
        #expect(Self.list(labels) == ["Team files", "Work mail"])
    }

    /// README's naming rules: empty values, duplicates, `/`, `.`, long names.
    @Test func namingRules() throws {
        let store = try Self.store()
        defer { store.close() }
        let accounts = store.path("accounts")
        let names = (1...5).map { String(format: "%08x-0000-4000-8000-00000000000%d", 0xA0000000 + $0, $0) }
        try Self.make(store, names[0], ["server": "dup.example.com"])  // no username, no label
        try Self.make(store, names[1], ["label": "Dup", "server": "dup.example.com", "username": "bob"])
        try Self.make(store, names[2], ["label": "Dup", "server": "dup.example.com", "username": "bob"])
        try Self.make(store, names[3], ["label": "a/b"])
        try Self.make(store, names[4], ["label": "."])
        #expect(Self.list(accounts + "/by-server/dup.example.com") == ["_", "bob", "bob~a0000003"])
        #expect(Self.link(accounts + "/by-server/dup.example.com/bob~a0000003") == "../../\(names[2])")
        #expect(Self.list(accounts + "/by-server/_")?.isEmpty == false, "accounts without a server are under _")
        let labels = Set(Self.list(accounts + "/by-label") ?? [])
        #expect(labels.isSuperset(of: ["_", "Dup", "Dup~a0000003", "a%2Fb", "%2E"]), "\(labels)")
        #expect(Self.link(accounts + "/by-label/a%2Fb") == "../\(names[3])")
        #expect(Self.link(accounts + "/by-label/%2E") == "../\(names[4])")
        // A label that looks like a suffixed name is written so that it cannot be one.
        try TestFile.write("Dup~a0000002\n", to: accounts + "/\(names[4])/label")
        #expect(Self.link(accounts + "/by-label/Dup%7Ea0000002") == "../\(names[4])")
        #expect(Self.link(accounts + "/by-label/Dup~a0000003") == "../\(names[2])")
        // Stable: another duplicate renames nobody; the first one gone, the next takes the name.
        try TestFile.write(String(repeating: "L", count: 300) + "\n", to: accounts + "/\(names[0])/label")
        let long = String(repeating: "L", count: 246) + "~a0000001"
        #expect(Self.link(accounts + "/by-label/" + long) == "../\(names[0])", "cut at 246 bytes, suffixed: \(Self.list(accounts + "/by-label") ?? [])")
        #expect(Self.link(accounts + "/by-label/Dup") == "../\(names[1])")
        #expect(Run.shell("rm -r '\(accounts)/\(names[1])'").status == 0)
        #expect(Self.link(accounts + "/by-label/Dup") == "../\(names[2])")
        #expect(Self.list(accounts + "/by-server/dup.example.com") == ["_", "bob"])
        #expect(Self.link(accounts + "/by-label/Dup~a0000003") == nil)
    }

    @Test func findByEachFilterAndPrint() throws {
        let store = try Self.store()
        defer { store.close() }
        let m = store.mountPoint
        func find(_ arguments: String...) -> CommandResult { Run.program(Run.mtmfs, ["find", m] + arguments) }
        let mailDirectory = "\(m)/accounts/\(Self.mail)\n", filesDirectory = "\(m)/accounts/\(Self.files)\n"
        #expect(find("--server", "mail.example.com").stdout == mailDirectory)
        #expect(find("--username", "alice@example.com").stdout == filesDirectory)
        #expect(find("--label", "Work mail").stdout == mailDirectory)
        #expect(find("--protocol", "https").stdout == mailDirectory + filesDirectory, "vault order")
        #expect(find("--port", "8443").stdout == filesDirectory)
        #expect(find("--port", "").stdout == mailDirectory, "an empty value matches an empty field")
        #expect(find("--path", "/owa").stdout == mailDirectory)
        #expect(find("--comment", "").stdout == mailDirectory + filesDirectory)
        #expect(find("--protocol", "https", "--server", "files.example.com", "--username", "alice@example.com").stdout == filesDirectory)
        #expect(find().stdout == mailDirectory + filesDirectory)
        let password = find("--server", "files.example.com", "--print", "password")
        #expect(password.status == 0 && password.stdout == "tr0ub4dor&3\n", "\(password)")
        #expect(find("--label", "Work mail", "--print", "url").stdout == "https://mail.example.com/owa\n")

        let none = find("--server", "nowhere.example.com")
        #expect(none.status == 3 && none.stdout.isEmpty && none.stderr.contains("no account matches"), "\(none)")
        let several = find("--protocol", "https", "--print", "password")
        #expect(several.status == 4 && several.stdout.isEmpty && several.stderr.contains("2 accounts match"), "\(several)")
        #expect(find("--port", "http").status == 2)
        #expect(find("--print", "secret").status == 2)
        #expect(find("--bogus", "x").status == 2)
        let noMount = Run.mtmfs("find", store.scratch.path, "--server", "mail.example.com")
        #expect(noMount.status == 6 && noMount.stderr.contains("is not an mtmfs mount"), "\(noMount)")

        #expect(Run.mtmfs("lock", m).status == 0)
        let locked = find("--server", "mail.example.com")
        #expect(locked.status == 5 && locked.stderr.contains("locked"), "\(locked)")
        // The control file itself: one question, its answer on the same descriptor.
        let fd = open(store.path(".mtmfs/find"), O_RDWR | O_CLOEXEC)
        #expect(fd >= 0)
        #expect(errnoOf { Int32(write(fd, "server=mail.example.com\n", 24)) } == EACCES)
        close(fd)
        #expect(errnoOf { open(store.path(".mtmfs/find"), O_RDONLY | O_CLOEXEC) } == EACCES, "ask and read on one descriptor")
        #expect(Run.mtmfs("unlock", m, input: Run.passphrase + "\n").status == 0)
        let bad = open(store.path(".mtmfs/find"), O_RDWR | O_CLOEXEC)
        #expect(errnoOf { Int32(write(bad, "password=x\n", 11)) } == EINVAL, "the password is not searchable")
        close(bad)
    }
}
