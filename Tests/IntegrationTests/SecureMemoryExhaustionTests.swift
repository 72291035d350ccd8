import Foundation
import TestSupport
import Testing
#if canImport(Glibc)
import Glibc
#endif

/// Secure memory spent through the files (issue 50): scratch files in an account's
/// directory hold up to 16 MiB each in locked memory. Past the daemon's budget a write
/// answers ENOMEM — no trap — and the mount goes on; once the files are gone, fields are
/// written and read again.
@Suite(.enabled(if: FuseAvailability.isAvailable, "needs /dev/fuse")) struct SecureMemoryExhaustionTests {
    static let uuid = "6ba7b810-9dad-11d1-80b4-00c04fd430c8"

    @Test func spendingLockedMemoryAnswersENOMEMAndTheMountLives() throws {
        let store = try MountedStore()
        defer { store.close() }
        #expect(Run.mtmfs("unlock", store.mountPoint, input: Run.passphrase + "\n").status == 0)
        let a = store.path("accounts/\(Self.uuid)")
        try #require(mkdir(a, 0o700) == 0)
        #expect(Run.shell("echo 'kept secret' > \(a)/password").status == 0)
        let pid = try #require(Int32(try store.status()["pid"] ?? ""))

        // Swap-file names (`.N.swp`): scratch files this process made, so they stay while
        // it runs. 20 × 16 MiB is more than the 256 MiB budget.
        let chunk = [UInt8](repeating: 0x61, count: 1 << 20)
        var descriptors: [Int32] = []
        var refusal: Int32 = 0
        filling: for index in 0..<20 {
            let fd = open("\(a)/.s\(index).swp", O_CREAT | O_WRONLY, 0o600)
            guard fd >= 0 else { refusal = errno; break }
            descriptors.append(fd)
            for _ in 0..<16 where Glibc.write(fd, chunk, chunk.count) != chunk.count {
                refusal = errno
                break filling
            }
        }
        #expect(refusal == ENOMEM, "the write past the budget: \(String(cString: strerror(refusal)))")
        #expect(descriptors.count >= 10, "the budget held \(descriptors.count) scratch files")
        #expect(kill(pid, 0) == 0, "the daemon is gone")

        // The mount answers meanwhile; a read of a field either succeeds or is ENOMEM too.
        #expect(Run.shell("cat \(store.mountPoint)/.mtmfs/status").status == 0)
        #expect(Run.shell("ls \(a)").status == 0)
        let during = Run.shell("cat \(a)/password")
        #expect(during.stdout == "kept secret\n" || during.stderr.contains("Cannot allocate memory"), "\(during)")

        // Gone: the memory is back, and fields work as before.
        for (index, fd) in descriptors.enumerated() {
            close(fd)
            #expect(unlink("\(a)/.s\(index).swp") == 0)
        }
        #expect(Run.shell("echo 'new secret' > \(a)/password").status == 0)
        #expect(Run.shell("cat \(a)/password").stdout == "new secret\n")
        #expect(Run.shell("head -c 16777216 /dev/zero > \(a)/.big.swp; echo $?").stdout == "0\n")
        #expect(kill(pid, 0) == 0)
    }
}
