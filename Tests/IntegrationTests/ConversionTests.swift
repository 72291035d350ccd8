#if canImport(Glibc)
import Glibc
#endif
import Foundation
import Testing
import TestSupport

/// A vault of the single-file format (docs/vault-format.md's version-2 test vector:
/// guarded, one account trusting one program) is converted to a folder at its first
/// unlock (SPEC §2b), the file kept as `vault.v2` until a later unlock succeeds.
@Suite struct ConversionTests {
    static let uuid = "6BA7B810-9DAD-11D1-80B4-00C04FD430C8"
    static let passphrase = "correct horse battery staple"

    /// The hex block of docs/vault-format.md (version 2).
    static func vector() throws -> Data {
        let document = try String(contentsOfFile: Run.repository + "/docs/vault-format.md", encoding: .utf8)
        let hex = document.components(separatedBy: "```hex\n").dropFirst().first?.components(separatedBy: "```").first ?? ""
        let digits = Array(hex.filter(\.isHexDigit).utf8)
        return Data(stride(from: 0, to: digits.count - 1, by: 2).map { UInt8(String(decoding: digits[$0...$0 + 1], as: UTF8.self), radix: 16)! })
    }

    @Test func aFormatTwoVaultIsConvertedAtItsFirstUnlock() throws {
        let vector = try Self.vector()
        try #require(vector.count == 443)
        let store = try MountedStore(prepare: { data in
            try FileManager.default.removeItem(atPath: data + "/vault")
            try? FileManager.default.removeItem(atPath: data + "/device")
            try vector.write(to: URL(fileURLWithPath: data + "/vault"))
        })
        defer { store.close() }
        let vault = store.dataDirectory + "/vault"
        var isDirectory: ObjCBool = false
        #expect(FileManager.default.fileExists(atPath: vault, isDirectory: &isDirectory) && !isDirectory.boolValue)
        #expect(Run.mtmfs("unlock", store.mountPoint, input: "wrong\n").status == 1)
        #expect(!FileManager.default.fileExists(atPath: vault + ".v2"), "a wrong passphrase converts nothing")
        let unlocked = Run.mtmfs("unlock", store.mountPoint, input: Self.passphrase + "\n")
        #expect(unlocked.status == 0, "\(unlocked)")
        #expect(FileManager.default.fileExists(atPath: vault, isDirectory: &isDirectory) && isDirectory.boolValue, "now a folder")
        #expect(FileManager.default.contents(atPath: vault + ".v2") == vector, "the file kept as it was")
        #expect(!FileManager.default.fileExists(atPath: vault + ".converting"))
        let account = store.path("accounts/\(Self.uuid)")
        #expect(Run.program("cat", [account + "/username"]).stdout == "alice\n")
        #expect(try store.status()["guard"] == "on", "the guarding flag kept")
        #expect(Run.program("cat", [account + "/trusted"]).stdout
                == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855 /usr/bin/git\n", "the trusted list kept")
        #expect(errnoOf { open(account + "/password", O_RDONLY) } == EACCES, "still guarded: cat is not trusted")
        // A change lands in the folder (guarding off first: cat is trusted with nothing); a
        // later unlock removes vault.v2.
        let off = Run.mtmfs("guard", "off", store.mountPoint, input: Self.passphrase + "\n")
        #expect(off.status == 0, "\(off)")
        #expect(Run.shell("echo bob > \(account)/username").status == 0)
        #expect(Run.mtmfs("lock", store.mountPoint).status == 0)
        #expect(Run.mtmfs("unlock", store.mountPoint, input: Self.passphrase + "\n").status == 0)
        #expect(!FileManager.default.fileExists(atPath: vault + ".v2"))
        #expect(Run.program("cat", [account + "/username"]).stdout == "bob\n")
        // And after a remount.
        #expect(Run.mtmfs("unmount", store.mountPoint).status == 0)
        #expect(Run.program(Run.mtmfs, ["mount", "--data-dir", store.dataDirectory, store.mountPoint]).status == 0)
        #expect(Run.mtmfs("unlock", store.mountPoint, input: Self.passphrase + "\n").status == 0)
        #expect(Run.program("cat", [account + "/username"]).stdout == "bob\n")
    }

    /// A crash between the conversion's two renames (the file already `vault.v2`, the
    /// folder still under its temporary name): the next mount finishes it.
    @Test func aConversionCutBetweenItsRenamesIsFinishedByTheNextMount() throws {
        let vector = try Self.vector()
        let scratch = Scratch("conversion")
        defer { scratch.remove() }
        let first = try MountedStore(prepare: { data in
            try FileManager.default.removeItem(atPath: data + "/vault")
            try? FileManager.default.removeItem(atPath: data + "/device")
            try vector.write(to: URL(fileURLWithPath: data + "/vault"))
        })
        defer { first.close() }
        #expect(Run.mtmfs("unlock", first.mountPoint, input: Self.passphrase + "\n").status == 0)
        #expect(Run.mtmfs("unmount", first.mountPoint).status == 0)
        let vault = first.dataDirectory + "/vault"
        try FileManager.default.moveItem(atPath: vault, toPath: vault + ".converting")  // as if cut between the renames
        let mounted = Run.program(Run.mtmfs, ["mount", "--data-dir", first.dataDirectory, first.mountPoint])
        #expect(mounted.status == 0, "\(mounted)")
        #expect(Run.mtmfs("unlock", first.mountPoint, input: Self.passphrase + "\n").status == 0)
        #expect(Run.program("cat", [first.path("accounts/\(Self.uuid)/username")]).stdout == "alice\n")
        #expect(!FileManager.default.fileExists(atPath: vault + ".converting"))
    }

    /// `mtmfs passwd` of a single file writes no single file: it converts the vault to a
    /// folder first, then changes the passphrase there, and removes the file (which the old
    /// passphrase still opened).
    @Test func passwdConvertsASingleFileFirst() throws {
        let vector = try Self.vector()
        let scratch = Scratch("passwd-conversion")
        defer { scratch.remove() }
        let data = scratch.sub("data")
        try #require(Run.initStore(data).status == 0)
        try FileManager.default.removeItem(atPath: data + "/vault")
        try? FileManager.default.removeItem(atPath: data + "/device")
        try vector.write(to: URL(fileURLWithPath: data + "/vault"))
        let current = scratch.sub("current"), new = scratch.sub("new")
        try (Self.passphrase + "\n").write(toFile: current, atomically: true, encoding: .utf8)
        try "a brand new passphrase for the folder\n".write(toFile: new, atomically: true, encoding: .utf8)
        let changed = Run.mtmfs("passwd", "--data-dir", data, "--kdf", "interactive", "--passphrase-file", current,
                                "--new-passphrase-file", new)
        #expect(changed.status == 0, "\(changed)")
        #expect(changed.stdout.contains("now a folder"), "\(changed)")
        var isDirectory: ObjCBool = false
        #expect(FileManager.default.fileExists(atPath: data + "/vault", isDirectory: &isDirectory) && isDirectory.boolValue)
        #expect(!FileManager.default.fileExists(atPath: data + "/vault.v2"), "the file the old passphrase opens is gone")
        // The new passphrase unlocks the folder, with the account and its guarding kept; the old does not.
        let mountPoint = scratch.sub("mnt")
        mkdir(mountPoint, 0o755)
        try #require(Run.program(Run.mtmfs, ["mount", "--data-dir", data, mountPoint]).status == 0)
        defer { Run.mtmfs("unmount", mountPoint) }
        #expect(Run.mtmfs("unlock", mountPoint, input: Self.passphrase + "\n").status == 1)
        #expect(Run.mtmfs("unlock", mountPoint, input: "a brand new passphrase for the folder\n").status == 0)
        #expect(Run.program("cat", [mountPoint + "/accounts/\(Self.uuid)/username"]).stdout == "alice\n")
        #expect(try MountStatus.read(mountPoint)["guard"] == "on", "guarding kept")
    }
}
