import Foundation
import TestSupport
import Testing
#if canImport(Glibc)
import Glibc
#endif

/// SPEC §7: no request waits on another's slow work. An unlock's key derivation (moderate
/// Argon2id here: about half a second) runs outside the lock that accounts/ requests take.
@Suite(.enabled(if: FuseAvailability.isAvailable, "needs /dev/fuse")) struct UnlockStallTests {
    @Test func listingAccountsDuringAnUnlockNeverWaitsLong() throws {
        let scratch = Scratch()
        defer { scratch.remove() }
        let data = scratch.sub("data"), mnt = scratch.sub("mnt")
        mkdir(mnt, 0o755)
        let made = Run.program(Run.mtmfs, ["init", "--kdf", "moderate", "--data-dir", data], input: Run.passphrase + "\n")
        try #require(made.status == 0, "\(made)")
        #expect(Run.mtmfs("mount", "--data-dir", data, mnt).status == 0)
        defer { Run.mtmfs("unmount", mnt) }
        #expect(mkdir(mnt + "/accounts/6ba7b810-9dad-11d1-80b4-00c04fd430c8", 0o700) == -1, "locked: EACCES")
        let result = Run.program("python3", ["-c", #"""
            import os, subprocess, sys, time
            mtmfs, mnt, passphrase = sys.argv[1], sys.argv[2], sys.argv[3]
            unlock = subprocess.Popen([mtmfs, 'unlock', mnt], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL)
            unlock.stdin.write((passphrase + '\n').encode()); unlock.stdin.close()
            started = time.monotonic(); longest = 0; count = 0
            while unlock.poll() is None:
                s = time.monotonic()
                os.listdir(mnt + '/accounts'); open(mnt + '/.mtmfs/status').read()
                longest = max(longest, time.monotonic() - s); count += 1
            print('%.3f %.3f %d %d' % (time.monotonic() - started, longest, count, unlock.returncode))
            """#, Run.mtmfs, mnt, Run.passphrase], timeout: 60)
        let last = result.stdout.split(separator: "\n").last ?? ""
        let numbers = last.split(separator: " ").compactMap { Double($0.trimmingCharacters(in: .whitespacesAndNewlines)) }
        try #require(numbers.count == 4, "\(result)")
        #expect(numbers[3] == 0, "unlock failed: \(result)")
        #expect(numbers[0] > 0.2, "the moderate key derivation took \(numbers[0]) s")
        #expect(numbers[1] < 0.1, "a listing waited \(numbers[1]) s during the unlock (\(Int(numbers[2])) listings)")
        #expect(Run.shell("grep state= \(mnt)/.mtmfs/status").stdout == "state=unlocked\n")
    }
}
