import Foundation
import Posix
import TestSupport
import Testing
#if canImport(Glibc)
import Glibc
#endif

extension MountedStore {
    /// The accounts' directories (UUIDs).
    var accounts: [String] {
        ((try? FileManager.default.contentsOfDirectory(atPath: path("accounts"))) ?? []).filter { $0.count == 36 }.sorted()
    }
}

/// Moving in and out (SPEC §6): `mtmfs generate`, `mtmfs new`, `mtmfs export` and
/// `mtmfs import`, through real mounts.
@Suite(.enabled(if: FuseAvailability.isAvailable, "needs /dev/fuse")) struct MovingInAndOutTests {
    static let mail = FindingTests.mail, files = FindingTests.files

    /// An unlocked store with the two accounts of `FindingTests` and an attribute.
    static func store() throws -> MountedStore {
        let store = try FindingTests.store()
        do {
            try TestFile.write("eu/west\n", to: store.path("accounts/\(mail)/attributes/region%2Fzone"))
            try TestFile.write("Line one, \"quoted\"\nline two\n", to: store.path("accounts/\(mail)/comment"))
        } catch {
            store.close()
            throw error
        }
        return store
    }

    /// Each account's fields and attributes as the files show them.
    static func snapshot(_ store: MountedStore) -> [String: [String: String]] {
        var all: [String: [String: String]] = [:]
        for account in store.accounts {
            var fields: [String: String] = [:]
            for field in ["label", "url", "username", "password", "otp", "comment"] {
                let value = TestFile.read(store.path("accounts/\(account)/\(field)")) ?? ""
                if value != "\n" && !value.isEmpty { fields[field] = value }
            }
            for attribute in FindingTests.list(store.path("accounts/\(account)/attributes")) ?? [] {
                fields["attributes/" + attribute] = TestFile.read(store.path("accounts/\(account)/attributes/\(attribute)"))
            }
            all[account] = fields
        }
        return all
    }

    @Test func generateMakesPasswordsOfEveryClassAndSaysTheirStrength() throws {
        var seen = Set<String>()
        for _ in 0..<20 {
            let made = Run.mtmfs("generate")
            #expect(made.status == 0, "\(made)")
            let password = String(made.stdout.dropLast())
            #expect(password.count == 20 && made.stdout.hasSuffix("\n"))
            #expect(password.contains { $0.isLowercase } && password.contains { $0.isUppercase } && password.contains { $0.isNumber })
            #expect(password.contains { "#%&()*+,-./:;<=>?@[]^_{|}~".contains($0) }, "\(password)")
            #expect(!password.contains { "'\"\\$`! ".contains($0) }, "\(password)")
            seen.insert(password)
            #expect(made.stderr.contains("about 129 bits (20 characters of 88)"), "\(made.stderr)")
        }
        #expect(seen.count == 20)
        let plain = Run.mtmfs("generate", "--length", "32", "--no-symbols")
        #expect(plain.stdout.count == 33 && plain.stdout.dropLast().allSatisfy { $0.isLetter || $0.isNumber }, "\(plain)")
        #expect(Run.mtmfs("generate", "--length", "3").status == 2)
        #expect(Run.mtmfs("generate", "--length", "x").status == 2)
        let words = Run.mtmfs("generate", "--words", "5")
        if FileManager.default.fileExists(atPath: "/usr/share/dict/words") {
            #expect(words.status == 0 && words.stdout.split(separator: "-").count == 5, "\(words)")
        } else {
            #expect(words.status == 1 && words.stderr.contains("apt-get install wamerican"), "\(words)")
        }
    }

    @Test func newMakesAnAccountWithAGeneratedPassword() throws {
        let store = try Self.store()
        defer { store.close() }
        let made = Run.mtmfs("new", "--mount", store.mountPoint, "--label", "Forge", "--url", "https://forge.example.com:8443/git",
                             "--username", "carol", "--generate", "--length", "24")
        #expect(made.status == 0, "\(made)")
        let directory = made.stdout.trimmingCharacters(in: .whitespacesAndNewlines)
        #expect(directory.hasPrefix(store.path("accounts/")))
        #expect(TestFile.read(directory + "/server") == "forge.example.com\n")
        #expect(TestFile.read(directory + "/port") == "8443\n")
        #expect(TestFile.read(directory + "/username") == "carol\n")
        #expect(TestFile.read(directory + "/password")?.count == 25)
        #expect(made.stderr.contains("bits"), "\(made)")
        // A value its field refuses: an error, and no account left behind.
        let before = store.accounts
        let refused = Run.mtmfs("new", "--mount", store.mountPoint, "--label", "Bad", "--url", "not a url")
        #expect(refused.status == 2, "\(refused)")
        #expect(store.accounts == before)
        #expect(Run.mtmfs("new", "--mount", store.mountPoint).status == 2, "--label is needed")
    }

    @Test func exportNeedsThePassphraseAndWritesEveryFormat() throws {
        let store = try Self.store()
        defer { store.close() }
        let pass = store.scratch.sub("pass"), wrong = store.scratch.sub("wrong")
        try (Run.passphrase + "\n").write(toFile: pass, atomically: true, encoding: .utf8)
        try "not it\n".write(toFile: wrong, atomically: true, encoding: .utf8)
        let csv = store.scratch.sub("out.csv")
        let refused = Run.mtmfs("export", "csv", "--mount", store.mountPoint, "--passphrase-file", wrong, "-o", csv)
        #expect(refused.status == 1 && refused.stderr.contains("wrong passphrase"), "\(refused)")
        #expect(!FileManager.default.fileExists(atPath: csv))
        let exported = Run.mtmfs("export", "csv", "--mount", store.mountPoint, "--passphrase-file", pass, "-o", csv)
        #expect(exported.status == 0 && exported.stderr.contains("clear text"), "\(exported)")
        #expect(try Syscall.stat(csv).st_mode & 0o7777 == 0o600)
        let text = TestFile.read(csv) ?? ""
        #expect(text.hasPrefix("name,url,username,password,note\n"), "\(text)")
        #expect(text.contains("\"Work mail\",\"https://mail.example.com/owa\",\"alice\",\"correct-horse-42\",\"Line one, \"\"quoted\"\"\nline two\""),
                "\(text)")
        // Bitwarden's JSON and KeePass's XML parse (python's parsers), with every account.
        for format in ["bitwarden", "keepassxc"] {
            let file = store.scratch.sub("out." + format)
            #expect(Run.mtmfs("export", format, "--mount", store.mountPoint, "--passphrase-file", pass, "-o", file).status == 0)
            let check = format == "bitwarden"
                ? "import json,sys; d=json.load(open(sys.argv[1])); print(sorted((i['name'], i['login']['password']) for i in d['items']), [f['name'] for i in d['items'] for f in i['fields']])"
                : "import xml.etree.ElementTree as E,sys; r=E.parse(sys.argv[1]).getroot(); print(sorted(tuple(s.find('Value').text for s in e.findall('String') if s.find('Key').text in ('Title','Password')) for e in r.iter('Entry')), [s.find('Key').text for e in r.iter('Entry') for s in e.findall('String') if s.find('Key').text not in ('Title','UserName','Password','URL','Notes')])"
            let parsed = Run.program("/usr/bin/python3", ["-c", check, file])
            #expect(parsed.status == 0, "\(format): \(parsed)")
            #expect(parsed.stdout.contains("correct-horse-42") && parsed.stdout.contains("tr0ub4dor&3")
                    && parsed.stdout.contains("region/zone"), "\(format): \(parsed.stdout)")
        }
        // Locked: refused, nothing written.
        #expect(Run.mtmfs("lock", store.mountPoint).status == 0)
        let locked = store.scratch.sub("locked.csv")
        #expect(Run.mtmfs("export", "csv", "--mount", store.mountPoint, "--passphrase-file", pass, "-o", locked).status == 5)
        #expect(!FileManager.default.fileExists(atPath: locked))
    }

    /// An export imported into another store gives the same accounts; a second import
    /// updates them in place; a damaged file changes nothing.
    @Test func anExportImportedBackGivesTheSameAccounts() throws {
        let source = try Self.store()
        defer { source.close() }
        let target = try MountedStore()
        defer { target.close() }
        #expect(Run.mtmfs("unlock", target.mountPoint, input: Run.passphrase + "\n").status == 0)
        let pass = source.scratch.sub("pass")
        try (Run.passphrase + "\n").write(toFile: pass, atomically: true, encoding: .utf8)
        let json = source.scratch.sub("export.json")
        #expect(Run.mtmfs("export", "bitwarden", "--mount", source.mountPoint, "--passphrase-file", pass, "-o", json).status == 0)
        let first = Run.mtmfs("import", "bitwarden", "--mount", target.mountPoint, json)
        #expect(first.stdout == "imported 2 accounts: 2 made, 0 updated\n", "\(first)")
        // The same accounts: their UUIDs (Bitwarden's ids), fields and attributes.
        func without(_ snapshot: [String: [String: String]]) -> [String: [String: String]] {
            snapshot.mapValues { $0.filter { !["server", "port", "path", "protocol"].contains($0.key) } }
        }
        #expect(without(Self.snapshot(target)) == without(Self.snapshot(source)), "\(Self.snapshot(target))\n\(Self.snapshot(source))")
        let again = Run.mtmfs("import", "bitwarden", "--mount", target.mountPoint, json)
        #expect(again.stdout == "imported 2 accounts: 0 made, 2 updated\n", "\(again)")
        #expect(target.accounts.count == 2)

        // KeePass XML: its UUIDs kept, so the same accounts again (updated, none made).
        let xml = source.scratch.sub("export.xml")
        #expect(Run.mtmfs("export", "keepassxc", "--mount", source.mountPoint, "--passphrase-file", pass, "-o", xml).status == 0)
        let fromXML = Run.mtmfs("import", "keepassxc", "--mount", target.mountPoint, xml)
        #expect(fromXML.stdout == "imported 2 accounts: 0 made, 2 updated\n", "\(fromXML)")
        #expect(without(Self.snapshot(target)) == without(Self.snapshot(source)))
        // CSV: no ids; matched by label, url and username the second time.
        let csv = source.scratch.sub("export.csv")
        #expect(Run.mtmfs("export", "csv", "--mount", source.mountPoint, "--passphrase-file", pass, "-o", csv).status == 0)
        let third = try MountedStore()
        defer { third.close() }
        #expect(Run.mtmfs("unlock", third.mountPoint, input: Run.passphrase + "\n").status == 0)
        #expect(Run.mtmfs("import", "csv", "--mount", third.mountPoint, csv).stdout == "imported 2 accounts: 2 made, 0 updated\n")
        #expect(Run.mtmfs("import", "csv", "--mount", third.mountPoint, csv).stdout == "imported 2 accounts: 0 made, 2 updated\n")
        let imported = Self.snapshot(third).values.first { $0["label"] == "Work mail\n" }
        #expect(imported?["password"] == "correct-horse-42\n" && imported?["comment"] == "Line one, \"quoted\"\nline two\n",
                "\(String(describing: imported))")

        // Damaged or foreign files: an error, nothing changed.
        let before = Self.snapshot(third)
        for (name, text) in [("unclosed.csv", "name,url,username,password,note\n\"A,https://a.example/,u,p,n\n"),
                             ("unknown.csv", "name,url,username,password,colour\nA,https://a.example/,u,p,red\n"),
                             ("short.csv", "name,url,username,password,note\nA,https://a.example/,u\n")] {
            let file = third.scratch.sub(name)
            try TestFile.write(text, to: file)
            let failed = Run.mtmfs("import", "csv", "--mount", third.mountPoint, file)
            #expect(failed.status == 1 && failed.stderr.contains("nothing was imported"), "\(name): \(failed)")
        }
        let encrypted = third.scratch.sub("encrypted.json")
        try TestFile.write(#"{"encrypted": true, "items": []}"#, to: encrypted)
        #expect(Run.mtmfs("import", "bitwarden", "--mount", third.mountPoint, encrypted).stderr.contains("encrypted Bitwarden export"))
        #expect(Self.snapshot(third) == before)
    }

    /// Exports written as the other programs document them: Firefox's CSV (its guid the
    /// account's UUID), 1Password's, and a Bitwarden JSON with a card (not an account), a
    /// note, custom fields and a TOTP secret.
    @Test func otherProgramsExportsImport() throws {
        let store = try MountedStore()
        defer { store.close() }
        #expect(Run.mtmfs("unlock", store.mountPoint, input: Run.passphrase + "\n").status == 0)
        let firefox = store.scratch.sub("firefox.csv")
        try TestFile.write("""
            "url","username","password","httpRealm","formActionOrigin","guid","timeCreated","timeLastUsed","timePasswordChanged"
            "https://shop.example.com","dave","s3cret, with comma","","https://shop.example.com","{5a1b6c2d-3e4f-4a5b-8c6d-7e8f9a0b1c2d}","1700000000000","1700000000000","1700000000000"

            """, to: firefox)
        #expect(Run.mtmfs("import", "csv", "--mount", store.mountPoint, firefox).status == 0)
        #expect(TestFile.read(store.path("accounts/5a1b6c2d-3e4f-4a5b-8c6d-7e8f9a0b1c2d/password")) == "s3cret, with comma\n")
        #expect(TestFile.read(store.path("accounts/5a1b6c2d-3e4f-4a5b-8c6d-7e8f9a0b1c2d/server")) == "shop.example.com\n")
        let onePassword = store.scratch.sub("1password.csv")
        try TestFile.write("\u{FEFF}Title,Url,Username,Password,OTPAuth,Favorite,Archived,Tags,Notes\r\n"
                           + "Bank,https://bank.example.com,erin,b4nk,otpauth://totp/Bank:erin?secret=JBSWY3DPEHPK3PXP&issuer=Bank,false,false,,\r\n",
                           to: onePassword)
        let imported = Run.mtmfs("import", "csv", "--mount", store.mountPoint, onePassword)
        #expect(imported.status == 0, "\(imported)")
        let bank = try #require(store.accounts.first { TestFile.read(store.path("accounts/\($0)/label")) == "Bank\n" })
        #expect(TestFile.read(store.path("accounts/\(bank)/totp"))?.count == 7, "the otp imported: a code reads")
        // KeePassXC's XML export: entries in nested groups, an old version in its History
        // (not an account), a custom string, entities; a protected value is refused.
        let keepassXML = store.scratch.sub("keepassxc.xml")
        try TestFile.write("""
            <?xml version="1.0" encoding="utf-8" standalone="yes"?>
            <KeePassFile>
              <Meta><Generator>KeePassXC</Generator></Meta>
              <Root><Group><UUID>AAAAAAAAAAAAAAAAAAAAAA==</UUID><Name>Root</Name>
                <Group><Name>Servers</Name>
                  <Entry><UUID>MDEyMzQ1Njc4OWFiY2RlZg==</UUID>
                    <String><Key>Title</Key><Value>Router &amp; &lt;AP&gt;</Value></String>
                    <String><Key>UserName</Key><Value>admin</Value></String>
                    <String><Key>Password</Key><Value ProtectInMemory="True">r0ut3r&#x21;</Value></String>
                    <String><Key>URL</Key><Value>https://192.168.1.1</Value></String>
                    <String><Key>Serial</Key><Value>SN-42</Value></String>
                    <History><Entry><UUID>MDEyMzQ1Njc4OWFiY2RlZg==</UUID>
                      <String><Key>Title</Key><Value>Old router</Value></String></Entry></History>
                  </Entry>
                </Group>
              </Group></Root>
            </KeePassFile>

            """, to: keepassXML)
        let fromKeePass = Run.mtmfs("import", "keepassxc", "--mount", store.mountPoint, keepassXML)
        #expect(fromKeePass.stdout == "imported 1 accounts: 1 made, 0 updated\n", "\(fromKeePass)")
        let router = store.path("accounts/30313233-3435-3637-3839-616263646566")
        #expect(TestFile.read(router + "/label") == "Router & <AP>\n")
        #expect(TestFile.read(router + "/password") == "r0ut3r!\n")
        #expect(TestFile.read(router + "/attributes/Serial") == "SN-42\n")
        let protected = store.scratch.sub("protected.xml")
        try TestFile.write(#"<KeePassFile><Root><Group><Entry><String><Key>Password</Key><Value Protected="True">AbC=</Value></String></Entry></Group></Root></KeePassFile>"#,
                           to: protected)
        #expect(Run.mtmfs("import", "keepassxc", "--mount", store.mountPoint, protected).stderr.contains("protected value"))
        // KeePassXC's CSV (`keepassxc-cli export --format csv`).
        let keepassxc = store.scratch.sub("keepassxc.csv")
        try TestFile.write("""
            "Group","Title","Username","Password","URL","Notes","TOTP","Icon","Last Modified","Created"
            "Root/Work","Wiki","grace","w1k1","https://wiki.example.com","on the intranet","","0","2024-01-02T03:04:05Z","2024-01-02T03:04:05Z"

            """, to: keepassxc)
        #expect(Run.mtmfs("import", "csv", "--mount", store.mountPoint, keepassxc).status == 0)
        let wiki = try #require(store.accounts.first { TestFile.read(store.path("accounts/\($0)/label")) == "Wiki\n" })
        #expect(TestFile.read(store.path("accounts/\(wiki)/comment")) == "on the intranet\n")
        let bitwarden = store.scratch.sub("bitwarden.json")
        try TestFile.write(#"""
            {"encrypted": false, "folders": [], "items": [
              {"id": "0f0e0d0c-0b0a-4908-8706-050403020100", "type": 1, "name": "Mail \u00e9t\u00e9", "notes": null,
               "fields": [{"name": "recovery", "value": "r3c\"overy", "type": 1}, {"name": "a/b", "value": "x", "type": 0}],
               "login": {"uris": [{"match": null, "uri": "imaps://mail.example.com:993"}], "username": "frank",
                         "password": "p\\w\nd", "totp": "JBSWY3DPEHPK3PXP"}},
              {"id": "1f0e0d0c-0b0a-4908-8706-050403020100", "type": 3, "name": "A card", "card": {"number": "4111"}},
              {"id": "2f0e0d0c-0b0a-4908-8706-050403020100", "type": 2, "name": "A note", "notes": "just text", "secureNote": {"type": 0}}
            ]}
            """#, to: bitwarden)
        let fromBitwarden = Run.mtmfs("import", "bitwarden", "--mount", store.mountPoint, bitwarden)
        #expect(fromBitwarden.stdout == "imported 2 accounts: 2 made, 0 updated, 1 items that are no account (cards, identities) left out\n",
                "\(fromBitwarden)")
        let account = store.path("accounts/0f0e0d0c-0b0a-4908-8706-050403020100")
        #expect(TestFile.read(account + "/label") == "Mail été\n")
        #expect(TestFile.read(account + "/password") == "p\\w\nd\n")
        #expect(TestFile.read(account + "/port") == "993\n")
        #expect(TestFile.read(account + "/attributes/recovery") == "r3c\"overy\n")
        #expect(TestFile.read(account + "/attributes/a%2Fb") == "x\n")
        #expect(TestFile.read(account + "/totp")?.count == 7)
    }

    /// A `pass` store made by `pass` itself with a throwaway GPG key: every entry imports
    /// (password, username, url, otp, other `key: value` lines, the rest as comment); a
    /// second import updates; without the key nothing changes.
    @Test(.enabled(if: Spawn.exists("pass") && Spawn.exists("gpg")))
    func aPassStoreImports() throws {
        let store = try MountedStore()
        defer { store.close() }
        #expect(Run.mtmfs("unlock", store.mountPoint, input: Run.passphrase + "\n").status == 0)
        let gnupg = store.scratch.sub("gnupg"), passStore = store.scratch.sub("password-store")
        mkdir(gnupg, 0o700)
        var environment = ProcessInfo.processInfo.environment
        environment["GNUPGHOME"] = gnupg
        environment["PASSWORD_STORE_DIR"] = passStore
        defer { Run.program("gpgconf", ["--kill", "all"], environment: environment) }
        let key = Run.program("gpg", ["--batch", "--passphrase", "", "--quick-gen-key", "mtmfs-test@example.com", "default", "default",
                                      "never"], environment: environment)
        try #require(key.status == 0, "\(key)")
        try #require(Run.program("pass", ["init", "mtmfs-test@example.com"], environment: environment).status == 0)
        let entry = "s3cret-pass\nuser: alice\nurl: https://github.com/login\notpauth://totp/GitHub:alice?secret=JBSWY3DPEHPK3PXP\n"
            + "recovery: r3c0v3ry\nsome free text\n"
        #expect(Run.program("pass", ["insert", "-m", "web/github"], input: entry, environment: environment).status == 0)
        #expect(Run.program("pass", ["insert", "-m", "mail"], input: "m41l\n", environment: environment).status == 0)
        func importing(_ environment: [String: String]) -> CommandResult {
            Run.program(Run.mtmfs, ["import", "pass", "--mount", store.mountPoint, passStore], environment: environment)
        }
        let first = importing(environment)
        #expect(first.stdout == "imported 2 accounts: 2 made, 0 updated\n", "\(first)")
        let github = try #require(store.accounts.first { TestFile.read(store.path("accounts/\($0)/label")) == "web/github\n" })
        let directory = store.path("accounts/\(github)")
        #expect(TestFile.read(directory + "/password") == "s3cret-pass\n")
        #expect(TestFile.read(directory + "/username") == "alice\n")
        #expect(TestFile.read(directory + "/url") == "https://github.com/login\n")
        #expect(TestFile.read(directory + "/totp")?.count == 7)
        #expect(TestFile.read(directory + "/attributes/recovery") == "r3c0v3ry\n")
        #expect(TestFile.read(directory + "/comment") == "some free text\n")
        #expect(importing(environment).stdout == "imported 2 accounts: 0 made, 2 updated\n")
        // Without the key (another GNUPGHOME): an error, nothing changed.
        let other = store.scratch.sub("other-gnupg")
        mkdir(other, 0o700)
        var keyless = environment
        keyless["GNUPGHOME"] = other
        defer { Run.program("gpgconf", ["--kill", "all"], environment: keyless) }
        let before = store.accounts
        let refused = importing(keyless)
        #expect(refused.status == 1 && refused.stderr.contains("gpg could not decrypt"), "\(refused)")
        #expect(store.accounts == before)
    }

    /// KeePassXC's own command line both ways: a database it made exports (XML and CSV) and
    /// imports; mtmfs's KeePass XML export is a database KeePassXC imports and reads.
    @Test(.enabled(if: Spawn.exists("keepassxc-cli")))
    func keepassxcsExportsImportAndItReadsOurs() throws {
        let store = try MountedStore()
        defer { store.close() }
        #expect(Run.mtmfs("unlock", store.mountPoint, input: Run.passphrase + "\n").status == 0)
        var environment = ProcessInfo.processInfo.environment
        environment["QT_QPA_PLATFORM"] = "offscreen"
        environment["HOME"] = store.scratch.path
        func keepassxc(_ arguments: [String], input: String) -> CommandResult {
            Run.program("keepassxc-cli", arguments, input: input, environment: environment)
        }
        let database = store.scratch.sub("theirs.kdbx")
        try #require(keepassxc(["db-create", "-p", database], input: "dbpass\ndbpass\n").status == 0)
        try #require(keepassxc(["add", "-q", "-u", "alice", "--url", "https://example.com/login", "-p", database, "Mail"],
                               input: "dbpass\nhunt3r2\n").status == 0)
        let xml = store.scratch.sub("theirs.xml"), csv = store.scratch.sub("theirs.csv")
        try TestFile.write(keepassxc(["export", "-q", "-f", "xml", database], input: "dbpass\n").stdout, to: xml)
        try TestFile.write(keepassxc(["export", "-q", "-f", "csv", database], input: "dbpass\n").stdout, to: csv)
        let fromXML = Run.mtmfs("import", "keepassxc", "--mount", store.mountPoint, xml)
        #expect(fromXML.stdout == "imported 1 accounts: 1 made, 0 updated\n", "\(fromXML)")
        let mail = try #require(store.accounts.first)
        #expect(TestFile.read(store.path("accounts/\(mail)/username")) == "alice\n")
        #expect(TestFile.read(store.path("accounts/\(mail)/password")) == "hunt3r2\n")
        #expect(TestFile.read(store.path("accounts/\(mail)/url")) == "https://example.com/login\n")
        #expect(Run.mtmfs("import", "csv", "--mount", store.mountPoint, csv).stdout == "imported 1 accounts: 0 made, 1 updated\n")

        let pass = store.scratch.sub("pass")
        try (Run.passphrase + "\n").write(toFile: pass, atomically: true, encoding: .utf8)
        let ours = store.scratch.sub("ours.xml"), imported = store.scratch.sub("ours.kdbx")
        #expect(Run.mtmfs("export", "keepassxc", "--mount", store.mountPoint, "--passphrase-file", pass, "-o", ours).status == 0)
        let made = keepassxc(["import", "-p", ours, imported], input: "newpass\nnewpass\n")
        #expect(made.status == 0, "\(made)")
        let shown = keepassxc(["show", "-s", "-a", "Password", imported, "Mail"], input: "newpass\n")
        #expect(shown.stdout.hasSuffix("hunt3r2\n"), "\(shown)")
    }
}
