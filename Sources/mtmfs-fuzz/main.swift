// mtmfs-fuzz: the fuzzing driver of the parsers in FuzzTargets (see Driver.swift).
#if canImport(Glibc)
import Glibc
#endif

exit(Driver.main(CommandLine.arguments))
