#if canImport(Glibc)
import Glibc
#endif
import CredentialVault
import MountedTree
import ScriptCommands

/// The entry point: picks the subcommand, parses, validates, runs, and turns a failure
/// into one line on standard error and an exit status.
enum CommandLineTool {
    static var commands: [any Command.Type] { [
        InitCommand.self, MountCommand.self, UnmountCommand.self, UnlockCommand.self, LockCommand.self,
        StatusCommand.self, PasswdCommand.self, RecoveryKeyCommand.self, CheckCommand.self, SyncCommand.self, DemoCommand.self, FindCommand.self,
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
        return command.main(Array(arguments.dropFirst()))
    }
}
