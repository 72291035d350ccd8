#if canImport(Glibc)
import Glibc
#endif
import CredentialVault
import ScriptCommands
import SecureMemory
import Posix

/// How many guesses a new passphrase would take an attacker who knows how people choose
/// them — the method of Dropbox's zxcvbn, in small: the passphrase is cut into the pieces
/// that are cheapest to guess (a common password or word by its rank, a word of the
/// system's dictionary, a year, a digit or keyboard run, a repeat, else every character of
/// its kind), and the guesses of the pieces multiplied, with a factor for each further
/// piece (the attacker must guess the pattern too).
///
/// `init` and `passwd` refuse fewer than `minimumGuesses` (zxcvbn's score 3, "safely
/// unguessable" against an offline attack on a slow hash — the vault's Argon2id) unless
/// `--weak-passphrase` is given. Works on the passphrase's bytes in place: no copy is made.
///
/// Thread-safety: pure functions; the dictionary is read once.
enum PassphraseStrength {
    static let minimumGuesses = 1e8

    /// log2 of the guesses.
    static func bits(of passphrase: SecureBytes) -> Double {
        passphrase.withUnsafeBytes { estimate($0) }
    }

    /// Passwords and words people choose most, most common first (after the lists zxcvbn
    /// and others publish: each piece's rank is its guesses).
    static let common: [String] = """
        password 123456 12345678 qwerty 123456789 12345 1234 111111 1234567 dragon 123123 baseball abc123 football
        monkey letmein 696969 shadow master 666666 qwertyuiop 123321 mustang 1234567890 michael 654321 superman
        1qaz2wsx 7777777 121212 000000 qazwsx 123qwe killer trustno1 jordan jennifer zxcvbnm asdfgh hunter buster
        soccer harley batman andrew tigger sunshine iloveyou 2000 charlie robert thomas hockey ranger daniel starwars
        klaster 112233 george computer michelle jessica pepper 1111 zxcvbn 555555 11111111 131313 freedom 777777 pass
        maggie 159753 aaaaaa ginger princess joshua cheese amanda summer love ashley nicole chelsea biteme matthew
        access yankees 987654321 dallas austin thunder taylor matrix william corvette hello martin heather secret
        merlin diamond 1234qwer gfhjkm hammer silver 222222 88888888 anthony justin test bailey q1w2e3r4t5 patrick
        internet scooter orange 11111 golfer cookie richard samantha bigdog guitar jackson whatever mickey chicken
        sparky snoopy maverick phoenix camaro peanut morgan welcome falcon cowboy ferrari samsung andrea smokey
        steelers joseph mercedes dakota arsenal eagles melissa boomer booboo spider nascar monster tigers yellow
        xxxxxx 123123123 gateway marina diablo bulldog qwer1234 compaq purple hardcore banana junior hannah 123654
        porsche lakers iceman money cowboys 987654 london tennis 999999 ncc1701 coffee scooby 0000 miller boston
        q1w2e3r4 brandon yamaha chester mother forever johnny edward 333333 oliver redsox player nikita knight
        fender barney midnight please brandy chicago badboy slayer rangers charles angel flower bigdaddy rabbit
        wizard bigdick jasper enter rachel chris steven winner adidas victoria natasha 1q2w3e4r jasmine winter
        prince panties marine ghbdtn fishing cocacola casper james 232323 raiders 888888 marlboro gandalf asdfasdf
        crystal 87654321 12344321 golden blowme 8675309 dolphin admin root changeme mtmfs vault secret1
        abcdef abcd hello123 welcome1 password1 qwerty123 letmein1 iloveyou1 the and you that was for are with his
        they one have this from word but what some can out other were all there when use your how said each she
        which their time will way about many then them write would like these her long make thing see him two has
        look more day could come did number sound most people over know water than call first who may down side
        been now find any new work part take get place made live where after back little only round man year came
        show every good give our under name very through just form sentence great think say help low line differ
        turn cause much mean before move right boy old too same tell does set three want air well also play small
        end put home read hand port large spell add even land here must big high such follow act why ask men change
        went light kind off need house picture try again animal point mother world near build self earth father
        correct horse battery staple
        """.split(whereSeparator: { $0 == " " || $0 == "\n" }).map(String.init)

    /// Words are looked up by a 64-bit FNV-1a hash of their lowercased bytes, computed on
    /// the passphrase's own memory: no piece of it is copied into a key.
    private static func hash(_ bytes: UnsafeRawBufferPointer) -> UInt64 {
        var h: UInt64 = 0xcbf2_9ce4_8422_2325
        for byte in bytes {
            h ^= UInt64(lowered(byte))
            h = h &* 0x100_0000_01b3
        }
        return h
    }

    private static let ranks: [UInt64: Int] = {
        var ranks: [UInt64: Int] = [:]
        for (index, word) in common.enumerated() {
            let key = Array(word.utf8).withUnsafeBytes { hash($0) }
            if ranks[key] == nil { ranks[key] = index + 1 }
        }
        return ranks
    }()

    /// The system's word list, when there is one (`/usr/share/dict/words`, Debian's
    /// wamerican and the like): a word in it counts as one of that many.
    private static let dictionary: Set<UInt64> = {
        guard let bytes = try? Syscall.readFile("/usr/share/dict/words") else { return [] }
        var words = Set<UInt64>()
        for line in bytes.split(separator: 0x0A) where line.count >= 3 && line.count <= 24 {
            words.insert(Array(line).withUnsafeBytes { hash($0) })
        }
        return words
    }()

    private static let keyboardRows = ["qwertyuiop", "asdfghjkl", "zxcvbnm", "1234567890", "qazwsxedcrfvtgbyhnujmikolp"]

    static func estimate(_ bytes: UnsafeRawBufferPointer) -> Double {
        let n = bytes.count
        guard n > 0 else { return 0 }
        // best[i]: log2 of the guesses of the first i bytes.
        var best = [Double](repeating: .infinity, count: n + 1)
        best[0] = 0
        for end in 1...n {
            for start in max(0, end - 40)..<end where best[start].isFinite {
                let piece = log2(max(10, guesses(UnsafeRawBufferPointer(rebasing: bytes[start..<end]))))
                // Each further piece: the attacker guesses where it starts (10 a piece: the
                // pieces are words and numbers a person chose, not random cuts).
                best[end] = min(best[end], best[start] + piece + (start > 0 ? log2(10) : 0))
            }
        }
        return best[n]
    }

    private static func isLower(_ c: UInt8) -> Bool { c >= 0x61 && c <= 0x7A }
    private static func isUpper(_ c: UInt8) -> Bool { c >= 0x41 && c <= 0x5A }
    private static func isDigit(_ c: UInt8) -> Bool { c >= 0x30 && c <= 0x39 }

    /// The guesses of one piece of the passphrase (read in place).
    private static func guesses(_ piece: UnsafeRawBufferPointer) -> Double {
        let count = Double(piece.count)
        let capitals = piece.contains(where: isUpper)
        let isLetters = piece.allSatisfy { isLower($0) || isUpper($0) }
        let isDigits = piece.allSatisfy(isDigit)
        let key = hash(piece)
        if let rank = ranks[key] { return Double(rank) * (capitals ? 2 : 1) }
        if isLetters, dictionary.contains(key) { return Double(dictionary.count) / 2 * (capitals ? 2 : 1) }
        if piece.count >= 2, piece.allSatisfy({ lowered($0) == lowered(piece[0]) }) { return 10 * count }  // aaaa, 1111
        if isDigits, piece.count == 4 {
            let year = piece.reduce(0) { $0 * 10 + Int($1 - 0x30) }
            if (1900...2099).contains(year) { return 200 }
        }
        if piece.count >= 3 {
            // A run (abcd, 4321): its start and direction.
            let step = Int(lowered(piece[1])) - Int(lowered(piece[0]))
            if abs(step) == 1, (1..<piece.count).allSatisfy({ Int(lowered(piece[$0])) - Int(lowered(piece[$0 - 1])) == step }) {
                return 26 * 2 * count
            }
            // A stretch of a keyboard row (qwer, lkjh).
            for row in keyboardRows {
                let keys = Array(row.utf8)
                for reversed in [false, true] {
                    let line = reversed ? Array(keys.reversed()) : keys
                    guard piece.count <= line.count else { continue }
                    for first in 0...(line.count - piece.count)
                    where (0..<piece.count).allSatisfy({ line[first + $0] == lowered(piece[$0]) }) {
                        return 40 * 2 * count
                    }
                }
            }
        }
        // Every character of its kinds.
        var alphabet = 0.0
        if piece.contains(where: isLower) { alphabet += 26 }
        if capitals { alphabet += 26 }
        if piece.contains(where: isDigit) { alphabet += 10 }
        if piece.contains(where: { $0 < 0x80 && !isLower($0) && !isUpper($0) && !isDigit($0) }) { alphabet += 33 }
        if piece.contains(where: { $0 >= 0x80 }) { alphabet += 100 }
        return pow(max(alphabet, 10), count)
    }

    private static func lowered(_ byte: UInt8) -> UInt8 { isUpper(byte) ? byte + 32 : byte }

    /// Refuses a passphrase under `minimumGuesses` unless `allowed`: one line saying why.
    static func require(_ passphrase: SecureBytes, allowed: Bool) throws(CommandFailure) {
        let bits = bits(of: passphrase)
        guard !allowed, bits < log2(minimumGuesses) else { return }
        throw CommandFailure("this passphrase is weak (about 2^\(Int(bits.rounded())) guesses, at least 2^27 needed): take "
                             + "several uncommon words, or give --weak-passphrase to use it anyway; nothing was changed")
    }
}
