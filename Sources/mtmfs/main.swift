// `mtmfs`, the command: `run`, `inject`, `read` and `find` here, in a program kept small so
// that it starts fast (a script may call it for each secret); every other command in mtmfs-core,
// which this program becomes. Nothing here runs on a FUSE thread.
#if canImport(Glibc)
import Glibc
#endif
import Posix
import ScriptCommands

let invokedAs = CommandLine.arguments.first.map { $0.split(separator: "/").last.map(String.init) ?? $0 } ?? ""
if invokedAs != "git-credential-mtmfs", CommandLine.arguments.count > 1 {
    // (A switch, not a list of the commands' types: a start spends nothing on their metadata.)
    let arguments = Array(CommandLine.arguments.dropFirst(2))
    switch CommandLine.arguments[1] {
    case RunCommand.name: exit(RunCommand.main(arguments))
    case InjectCommand.name: exit(InjectCommand.main(arguments))
    case ReadCommand.name: exit(ReadCommand.main(arguments))
    case FindCommand.name: exit(FindCommand.main(arguments))
    default: break
    }
}
// The core gets the arguments as they came, its name included (`git-credential-mtmfs`).
guard let me = ProgramFiles.running(), let core = ProgramFiles.core(besideFront: me) else {
    Terminal.error("mtmfs: \(ProgramFiles.core) is missing beside \(ProgramFiles.running() ?? "this program"): reinstall mtmfs")
    exit(ExitCode.failure)
}
execv(core, CommandLine.unsafeArgv)
Terminal.error("mtmfs: cannot run \(core): \(Errno.current)")
exit(ExitCode.failure)
