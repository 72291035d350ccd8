#if canImport(Glibc)
import Glibc
#endif

/// One `mtmfs` subcommand: its name, its help, the options it takes, a validating
/// initializer (the `validate()` step) and `run()`.
package protocol Command {
    static var name: String { get }
    /// One line for `mtmfs --help`.
    static var abstract: String { get }
    /// The whole `mtmfs NAME --help` text after the abstract.
    static var usage: String { get }
    static var flags: Set<String> { get }
    static var options: Set<String> { get }
    init(_ arguments: Arguments) throws(CommandFailure)
    func run() throws(CommandFailure)
}

extension Command {
    /// Parses `arguments` (those after the command's name), validates, runs, and turns a
    /// failure into one line on standard error and an exit status.
    package static func main(_ arguments: [String]) -> Int32 {
        do {
            let parsed = try Arguments(arguments, command: name, flags: flags, options: options)
            if parsed.wantsHelp {
                print("mtmfs \(name) — \(abstract)\n\n\(usage)")
                return ExitCode.success
            }
            try Self(parsed).run()
            return ExitCode.success
        } catch {
            Terminal.error("mtmfs \(name): \(error.description)")
            return error.exitCode
        }
    }
}

/// Writing to the user.
package enum Terminal {
    package static func error(_ line: String, newline: Bool = true) {
        let bytes = Array((line + (newline ? "\n" : "")).utf8)
        bytes.withUnsafeBytes { _ = write(2, $0.baseAddress, $0.count) }
    }

    package static var isInteractive: Bool { isatty(0) == 1 }

    /// Text from outside (a reference, a path) made safe for one line: control characters
    /// become "?".
    package static func printable(_ text: String) -> String {
        String(String.UnicodeScalarView(text.unicodeScalars.map { $0.value < 0x20 || $0.value == 0x7F ? "?" : $0 }))
    }
}
