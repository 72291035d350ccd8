#if canImport(Glibc)
import Glibc
#endif
import Posix
import ScriptCommands
import SecureMemory

/// New passwords from libsodium's randomness: characters (letters, digits and, unless told
/// not to, punctuation other than quotes, backslash, `$`, `` ` `` and `!`, which a shell
/// would act on inside double quotes), or words of a dictionary. Made in secure memory.
///
/// Thread-safety: pure functions over libsodium's thread-safe randomness.
enum PasswordGenerator {
    static let lower = Array("abcdefghijklmnopqrstuvwxyz".utf8)
    static let upper = Array("ABCDEFGHIJKLMNOPQRSTUVWXYZ".utf8)
    static let digits = Array("0123456789".utf8)
    static let symbols = Array("#%&()*+,-./:;<=>?@[]^_{|}~".utf8)
    /// Where `--words` takes its words (Debian's `wamerican` and friends).
    static let dictionary = "/usr/share/dict/words"

    /// `length` characters with at least one of each class used (drawn again until so).
    static func characters(_ length: Int, symbols useSymbols: Bool) throws(CommandFailure) -> (SecureBytes, bits: Double) {
        let classes = [lower, upper, digits] + (useSymbols ? [symbols] : [])
        let alphabet = classes.flatMap { $0 }
        guard length >= classes.count, length <= 4096 else {
            throw CommandFailure("a password is \(classes.count) to 4096 characters long", exitCode: ExitCode.usage)
        }
        let password: SecureBytes
        do throws(Errno) { password = try SecureBytes(count: length) } catch {
            throw CommandFailure("no secure memory for the password (\(error))")
        }
        while true {
            password.withUnsafeMutableBytes { bytes in
                for index in 0..<length { bytes[index] = alphabet[Int(Sodium.uniform(UInt32(alphabet.count)))] }
            }
            let complete = password.withUnsafeBytes { bytes in classes.allSatisfy { set in bytes.contains { set.contains($0) } } }
            if complete { break }
        }
        return (password, Double(length) * log2(Double(alphabet.count)))
    }

    /// `count` words of the dictionary (lower-case a–z, 4 to 8 letters), joined by `separator`.
    static func words(_ count: Int, separator: String) throws(CommandFailure) -> (SecureBytes, bits: Double) {
        guard count >= 2, count <= 64 else { throw CommandFailure("--words takes 2 to 64", exitCode: ExitCode.usage) }
        guard let text = try? Syscall.readFile(dictionary) else {
            throw CommandFailure("no word list at \(dictionary): install one (apt-get install wamerican), or use --length")
        }
        var list: [ArraySlice<UInt8>] = []
        for word in text.split(separator: 0x0A) where (4...8).contains(word.count) && word.allSatisfy({ $0 >= 0x61 && $0 <= 0x7A }) {
            if list.last != word { list.append(word) }
        }
        guard list.count >= 1024 else { throw CommandFailure("the word list \(dictionary) has too few plain words (\(list.count))") }
        let password = SecureBytes()
        do throws(Errno) {
            for index in 0..<count {
                if index > 0 { try password.append(Array(separator.utf8)) }
                try password.append(Array(list[Int(Sodium.uniform(UInt32(list.count)))]))
            }
        } catch {
            password.wipe()
            throw CommandFailure("no secure memory for the password (\(error))")
        }
        return (password, Double(count) * log2(Double(list.count)))
    }

    /// From a command's options: `--length N` (default 20), `--words N`, `--no-symbols`.
    static func make(_ arguments: Arguments, command: String) throws(CommandFailure) -> (SecureBytes, bits: Double, what: String) {
        if let words = arguments.value("--words") {
            guard arguments.value("--length") == nil else { throw .usage("--words and --length do not go together", command: command) }
            guard let count = Int(words) else { throw .usage("--words takes a number", command: command) }
            let (password, bits) = try Self.words(count, separator: arguments.value("--separator") ?? "-")
            return (password, bits, "\(count) words")
        }
        guard let length = Int(arguments.value("--length") ?? "20") else { throw .usage("--length takes a number", command: command) }
        let useSymbols = !arguments.has("--no-symbols")
        let (password, bits) = try characters(length, symbols: useSymbols)
        let alphabet = lower.count + upper.count + digits.count + (useSymbols ? symbols.count : 0)
        return (password, bits, "\(length) characters of \(alphabet)")
    }
}

/// `mtmfs generate`: a new password on standard output, its strength on standard error.
struct GenerateCommand: Command {
    static let name = "generate"
    static let abstract = "print a new random password (libsodium's randomness)"
    static let usage = """
    Usage: mtmfs generate [--length N] [--no-symbols] | [--words N [--separator S]]

    Prints a new password: N characters (default 20) of letters, digits and symbols, at
    least one of each (--no-symbols: letters and digits), or N words of /usr/share/dict/words
    (4 to 8 lower-case letters each) joined by S (default -). Its strength, in bits, goes to
    standard error. The randomness is libsodium's (randombytes_uniform: no bias).
    """
    static let flags: Set<String> = ["--no-symbols"]
    static let options: Set<String> = ["--length", "--words", "--separator"]

    let arguments: Arguments

    init(_ arguments: Arguments) throws(CommandFailure) {
        _ = try arguments.positionals(0...0, named: "")
        self.arguments = arguments
        if arguments.has("--no-symbols") && arguments.value("--words") != nil {
            throw .usage("--no-symbols is for characters, not --words", command: Self.name)
        }
    }

    func run() throws(CommandFailure) {
        let (password, bits, what) = try PasswordGenerator.make(arguments, command: Self.name)
        defer { password.wipe() }
        do throws(Errno) {
            try password.append([0x0A])
            try password.withUnsafeBytes { (bytes) throws(Errno) in try Syscall.writeAll(1, bytes) }
        } catch {
            throw CommandFailure("cannot print the password: \(error)")
        }
        Terminal.error("mtmfs generate: about \(Int(bits)) bits (\(what))")
    }
}
