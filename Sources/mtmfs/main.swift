// The `mtmfs` command. Everything lives in types; nothing here runs on a FUSE thread.
#if canImport(Glibc)
import Glibc
#endif

exit(CommandLineTool.main(Array(CommandLine.arguments.dropFirst())))
