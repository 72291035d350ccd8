// mtmfs-bench: side-by-side measurements of mtmfs against a native directory and peers.
#if canImport(Glibc)
import Glibc
#endif

exit(Benchmark.main(Array(CommandLine.arguments.dropFirst())))
