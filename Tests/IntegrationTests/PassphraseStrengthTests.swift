import Foundation
import TestSupport
import Testing

/// `init` and `passwd` refuse a weak passphrase (a zxcvbn-like estimate under 2^27
/// guesses) unless `--weak-passphrase` is given; before, a one-character passphrase was
/// taken without a word.
@Suite struct PassphraseStrengthTests {
    func initWith(_ passphrase: String, _ extra: [String] = []) -> (CommandResult, Scratch) {
        let scratch = Scratch("strength")
        let result = Run.program(Run.mtmfs, ["init", "--kdf", "interactive", "--data-dir", scratch.sub("d")] + extra,
                                 input: passphrase + "\n")
        return (result, scratch)
    }

    @Test(arguments: ["x", "password", "hunter2", "qwertyuiop", "123456789", "abc123def", "aaaaaaaaaaaa", "1987"])
    func weakOnesAreRefused(passphrase: String) {
        let (refused, scratch) = initWith(passphrase)
        defer { scratch.remove() }
        #expect(refused.status == 1 && refused.stderr.contains("weak") && refused.stderr.contains("--weak-passphrase"), "\(refused)")
        #expect(!FileManager.default.fileExists(atPath: scratch.sub("d") + "/vault"), "nothing made")
        let (taken, again) = initWith(passphrase, ["--weak-passphrase"])
        defer { again.remove() }
        #expect(taken.status == 0, "\(taken)")
    }

    @Test(arguments: ["correct horse battery staple", "Tr0ub4dor&3", "kx7!Qm2z", "seven uncommon wombats"])
    func strongOnesAreTaken(passphrase: String) {
        let (taken, scratch) = initWith(passphrase)
        defer { scratch.remove() }
        #expect(taken.status == 0, "\(taken)")
    }

    @Test func passwdRefusesAWeakNewOne() throws {
        let (made, scratch) = initWith("correct horse battery staple")
        defer { scratch.remove() }
        try #require(made.status == 0)
        try "correct horse battery staple\n".write(toFile: scratch.sub("old"), atomically: true, encoding: .utf8)
        try "letmein\n".write(toFile: scratch.sub("new"), atomically: true, encoding: .utf8)
        let arguments = ["passwd", "--data-dir", scratch.sub("d"), "--kdf", "interactive",
                         "--passphrase-file", scratch.sub("old"), "--new-passphrase-file", scratch.sub("new")]
        let refused = Run.program(Run.mtmfs, arguments)
        #expect(refused.status == 1 && refused.stderr.contains("weak"), "\(refused)")
        #expect(Run.program(Run.mtmfs, arguments + ["--weak-passphrase"]).status == 0)
    }
}
