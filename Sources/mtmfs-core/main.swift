// mtmfs-core: every command of `mtmfs` but run, inject, read and find, which the small `mtmfs`
// program answers itself (it becomes this program for the others). Everything lives in
// types; nothing here runs on a FUSE thread.
#if canImport(Glibc)
import Glibc
#endif

// Run as `git-credential-mtmfs` (a link to mtmfs: git's name for the helper `mtmfs`), it
// is `mtmfs credential`.
let invokedAs = CommandLine.arguments.first.map { $0.split(separator: "/").last.map(String.init) ?? $0 } ?? ""
let arguments = Array(CommandLine.arguments.dropFirst())
exit(CommandLineTool.main(invokedAs == "git-credential-mtmfs" ? ["credential"] + arguments : arguments))
