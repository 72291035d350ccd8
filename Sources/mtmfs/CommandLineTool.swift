#if canImport(Glibc)
import Glibc
#endif
import CredentialVault
import MountedTree

/// One `mtmfs` subcommand: its name, its help, the options it takes, a validating
/// initializer (the `validate()` step) and `run()`.
protocol Command {
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

/// The entry point: picks the subcommand, parses, validates, runs, and turns a failure
/// into one line on standard error and an exit status.
enum CommandLineTool {
    static var commands: [any Command.Type] { [
        InitCommand.self, MountCommand.self, UnmountCommand.self, UnlockCommand.self, LockCommand.self,
        StatusCommand.self, PasswdCommand.self, CheckCommand.self, SyncCommand.self, DemoCommand.self, FindCommand.self,
        CredentialCommand.self, GuardCommand.self, TrustCommand.self, UntrustCommand.self, RunCommand.self,
        InjectCommand.self, ReadCommand.self, GenerateCommand.self, NewCommand.self, ImportCommand.self, ExportCommand.self,
    ] }

    static var overview: String {
        var text = """
        mtmfs \(MtmfsVersion.string) — mount an app's credential vault, settings plist and cache as one tree

        Usage: mtmfs COMMAND [OPTIONS] [ARGUMENTS]

        Commands:

        """
        for command in commands {
            text += "  " + command.name + String(repeating: " ", count: max(1, 11 - command.name.count)) + command.abstract + "\n"
        }
        text += "\nRun `mtmfs COMMAND --help` for a command's options; `mtmfs --version` prints the version."
        return text
    }

    static func main(_ arguments: [String]) -> Int32 {
        guard let name = arguments.first else {
            Terminal.error(overview)
            return ExitCode.usage
        }
        switch name {
        case "--version", "-V", "version":
            print("mtmfs \(MtmfsVersion.string)")
            return ExitCode.success
        case "--help", "-h", "help":
            print(overview)
            return ExitCode.success
        case KeyDerivationChild.command:
            return KeyDerivation.serveChild()
        default:
            break
        }
        guard let command = commands.first(where: { $0.name == name }) else {
            Terminal.error("mtmfs: unknown command '\(name)'; see `mtmfs --help`")
            return ExitCode.usage
        }
        do {
            let parsed = try Arguments(Array(arguments.dropFirst()), command: command.name,
                                       flags: command.flags, options: command.options)
            if parsed.wantsHelp {
                print("mtmfs \(command.name) — \(command.abstract)\n\n\(command.usage)")
                return ExitCode.success
            }
            try command.init(parsed).run()
            return ExitCode.success
        } catch {
            Terminal.error("mtmfs \(command.name): \(error.description)")
            return error.exitCode
        }
    }
}

/// Writing to the user.
enum Terminal {
    static func error(_ line: String, newline: Bool = true) {
        let bytes = Array((line + (newline ? "\n" : "")).utf8)
        bytes.withUnsafeBytes { _ = write(2, $0.baseAddress, $0.count) }
    }

    static var isInteractive: Bool { isatty(0) == 1 }

    /// Text from outside (a reference, a path) made safe for one line: control characters
    /// become "?".
    static func printable(_ text: String) -> String {
        String(String.UnicodeScalarView(text.unicodeScalars.map { $0.value < 0x20 || $0.value == 0x7F ? "?" : $0 }))
    }
}
