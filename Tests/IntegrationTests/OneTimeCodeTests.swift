#if canImport(Glibc)
import Glibc
#endif
import Foundation
import Testing
import TestSupport

/// `accounts/<UUID>/otp` and `totp` through a real mount (SPEC §2d): the code equals
/// Debian's `oathtool` at the same moment for each algorithm, digit count and period; a read
/// in the next period shows the next code; bad values get EINVAL and keep the old one.
@Suite struct MountedOneTimeCodeTests {
    static let uuid = "6ba7b810-9dad-41d1-80b4-00c04fd430c8"
    static let secret = "JBSWY3DPEHPK3PXPJBSWY3DPEHPK3PXP"

    func unlockedStore() throws -> MountedStore {
        let store = try MountedStore()
        do {
            try #require(Run.mtmfs("unlock", store.mountPoint, input: Run.passphrase + "\n").status == 0)
            try #require(mkdir(store.path("accounts/\(Self.uuid)"), 0o700) == 0)
        } catch {
            store.close()
            throw error
        }
        return store
    }

    /// `totp` read and `oathtool` run in one period (tried again across a period's turn).
    func matchesOathtool(_ store: MountedStore, algorithm: String, digits: Int, period: Int) -> (String, String) {
        let totp = store.path("accounts/\(Self.uuid)/totp")
        var last = ("", "")
        for _ in 0..<3 {
            let before = time(nil)
            let read = Run.program("cat", [totp]).stdout
            let expected = Run.program("oathtool", ["--totp=\(algorithm)", "-b", "-d", "\(digits)", "-s", "\(period)s",
                                                    "-N", "@\(before)", Self.secret]).stdout
            last = (read, expected)
            if time(nil) / period == before / period { return last }
        }
        return last
    }

    @Test func codesMatchOathtoolAndChangeWithThePeriod() throws {
        try #require(Run.shell("command -v oathtool").status == 0, "oathtool is not installed (mount-helpers/install-deps --test)")
        let store = try unlockedStore()
        defer { store.close() }
        let account = store.path("accounts/\(Self.uuid)")
        #expect(!FileManager.default.fileExists(atPath: account + "/totp"), "no totp while otp is empty")
        for (algorithm, digits, period) in [("SHA1", 6, 30), ("SHA256", 8, 60), ("SHA512", 7, 30), ("SHA1", 8, 60)] {
            let uri = "otpauth://totp/Example:alice?secret=\(Self.secret)&issuer=Example&algorithm=\(algorithm)&digits=\(digits)&period=\(period)"
            #expect(Run.shell("printf '%s\\n' '\(uri)' > \(account)/otp").status == 0)
            let (read, expected) = matchesOathtool(store, algorithm: algorithm, digits: digits, period: period)
            #expect(read == expected && read.count == digits + 1, "\(algorithm) \(digits) \(period): \(read) vs \(expected)")
        }
        // A bare secret: 6 digits, 30 s, SHA1.
        #expect(Run.shell("echo \(Self.secret) > \(account)/otp").status == 0)
        let (read, expected) = matchesOathtool(store, algorithm: "SHA1", digits: 6, period: 30)
        #expect(read == expected)
        let listing = Run.program("ls", ["-l", account]).stdout
        #expect(listing.split(separator: "\n").contains { $0.hasPrefix("-r--------") && $0.hasSuffix(" totp") }, "\(listing)")
        #expect(Run.program(Run.mtmfs, ["find", store.mountPoint, "--print", "totp"]).stdout.count == 7)
        // The next period: the next code, not a cached one (a period of 1 s).
        #expect(Run.shell("echo 'otpauth://totp/x?secret=\(Self.secret)&period=1&digits=8' > \(account)/otp").status == 0)
        var codes = Set<String>()
        for _ in 0..<5 {
            codes.insert(Run.program("cat", [account + "/totp"]).stdout)
            usleep(1_100_000)
        }
        #expect(codes.count >= 4, "codes did not change with the period: \(codes)")
        // totp takes no write; rm of otp takes totp away.
        #expect(errnoOf { open(account + "/totp", O_WRONLY) } == EACCES)
        #expect(Run.shell("rm \(account)/otp").status == 0)
        #expect(Poll.until { !FileManager.default.fileExists(atPath: account + "/totp") })
    }

    @Test func badValuesGetEINVALAndKeepTheOldOne() throws {
        let store = try unlockedStore()
        defer { store.close() }
        let otp = store.path("accounts/\(Self.uuid)/otp")
        #expect(Run.shell("echo \(Self.secret) > \(otp)").status == 0)
        for bad in ["otpauth://hotp/x?secret=\(Self.secret)&counter=0", "not-base32!", "otpauth://totp/x?secret=\(Self.secret)&algorithm=MD5",
                    "otpauth://totp/x?secret=\(Self.secret)&digits=9", "otpauth://totp/x?secret=\(Self.secret)&digits=5",
                    "otpauth://totp/x?secret=\(Self.secret)&period=0", "otpauth://totp/x?issuer=nosecret"] {
            let fd = open(otp, O_WRONLY | O_TRUNC)
            let bytes = Array((bad + "\n").utf8)
            let written = write(fd, bytes, bytes.count) < 0 ? errno : 0
            let closed = close(fd) == 0 ? 0 : errno
            #expect(written == EINVAL || closed == EINVAL, "\(bad): write \(written), close \(closed)")
            #expect(Run.program("cat", [otp]).stdout == Self.secret + "\n", "the old value is kept after \(bad)")
        }
        // The secret is sealed: nowhere in the data directory in clear.
        #expect(Run.program("grep", ["-r", "-l", "-F", Self.secret, store.dataDirectory]).stdout.isEmpty)
    }
}
