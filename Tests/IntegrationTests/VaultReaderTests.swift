import Foundation
import TestSupport
import Testing

/// docs/vault-format-3.md is enough to read a vault: `Tests/VaultReader/read_vault.py`, a
/// reader in Python (PyNaCl) written from that document alone by someone who had not read
/// the code, reads the document's own test vectors and real vaults made through a mount
/// (every field, attributes, a passphrase change and a fold, two machines' conflicts, a
/// guarded vault with trusted lists, damaged files), and agrees with what the mount shows.
@Suite(.enabled(if: FuseAvailability.isAvailable, "needs /dev/fuse")) struct VaultReaderTests {
    static let directory = Run.repository + "/Tests/VaultReader"
    /// Debian's python3 (PyNaCl is its package python3-nacl).
    static let python = "/usr/bin/python3"

    @Test func theDocumentsVectorsReadBack() {
        let result = Run.program(Self.python, [Self.directory + "/read_vault.py", "--vectors", Run.repository + "/docs/vault-format-3.md"])
        #expect(result.status == 0, "\(result.stdout)\(result.stderr)")
    }

    @Test func realVaultsReadAsTheMountShowsThem() {
        let result = Run.program(Self.python, [Self.directory + "/check_real.py", "--mtmfs", Run.mtmfs], timeout: 600)
        #expect(result.status == 0 && result.stdout.contains(" passed, 0 failed"), "\(result.stdout)\(result.stderr)")
    }
}
