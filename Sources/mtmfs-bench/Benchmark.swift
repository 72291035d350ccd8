#if canImport(Glibc)
import Glibc
#endif
import Foundation
import Posix

/// One measured quantity on one system in one round.
struct Sample {
    var workload: String
    var system: String
    var value: Double
}

/// The systems compared side by side, each a directory to work in.
struct System {
    var name: String
    /// Where plain files of the workload live (for mtmfs: the subtree the workload uses).
    var directory: String
}

/// `mtmfs-bench`: sets up a native directory, a bindfs passthrough of it (when bindfs is
/// installed) and an mtmfs mount side by side on the same disk, runs each workload on each,
/// interleaved round by round, and prints medians (min–max) with the ratio to the native
/// directory measured in the same round, as markdown and JSON. The per-operation rows also
/// run on `mtmfs-floor` (the least a FUSE daemon does) and show mtmfs ÷ floor. Everything it
/// mounts it unmounts, also on Ctrl-C.
enum Benchmark {
    struct Options {
        var quick = false
        var rounds = 5
        var json: String?
        /// Only the cache-engine workloads (W10–W15, W21–W23), after the set-up they need.
        var engineOnly = false
        /// Only the vault workloads (W16, W17), after the set-up they need.
        var vaultOnly = false
        /// Only the daemon workloads (W18 idle wakeups, W19 status cost).
        var daemonOnly = false
        var guardOnly = false
        /// Only W26, the Secret Service beside gnome-keyring.
        var secretServiceOnly = false
        /// Only W5, many small files' metadata beside the floor and the peers.
        var metadataOnly = false
        /// W24's changes before the second unlock (nil: 20,000; 1,000 with --quick).
        var changes: Int?
    }

    nonisolated(unsafe) static var mounts: [String] = []
    /// Daemons mounted inside mount namespaces of their own (W20): ended by SIGTERM.
    nonisolated(unsafe) static var namespaceDaemons: [pid_t] = []
    /// Other processes the bench started (session buses, gnome-keyring): ended by SIGTERM
    /// once the mounts are gone.
    nonisolated(unsafe) static var helpers: [pid_t] = []

    static func stopHelpers() {
        for pid in helpers { kill(pid, SIGTERM) }
        for pid in helpers { _ = Spawn.wait(pid, timeout: 5) }
        helpers.removeAll()
    }
    nonisolated(unsafe) static var interrupted: sig_atomic_t = 0

    static func main(_ arguments: [String]) -> Int32 {
        var options = Options()
        var index = 0
        while index < arguments.count {
            switch arguments[index] {
            case "--quick": options.quick = true; options.rounds = 2
            case "--rounds": index += 1; options.rounds = Int(arguments[safe: index] ?? "") ?? 5
            case "--json": index += 1; options.json = arguments[safe: index]
            case "--engine": options.engineOnly = true
            case "--vault": options.vaultOnly = true
            case "--daemon": options.daemonOnly = true
            case "--guard": options.guardOnly = true
            case "--secret-service": options.secretServiceOnly = true
            case "--metadata": options.metadataOnly = true
            case "--changes": index += 1; options.changes = Int(arguments[safe: index] ?? "")
            case "-h", "--help":
                print("""
                Usage: mtmfs-bench [--quick] [--rounds N] [--json FILE] [--engine] [--vault] [--daemon] [--guard]
                                   [--secret-service] [--metadata] [--changes N]

                Measures mtmfs against a native directory and its peers — a bindfs passthrough, a
                gocryptfs mount and a `pass` store (installed by `mount-helpers/install-deps --bench`;
                skipped when absent) — side by side on the same disk, interleaved round by round.
                The per-operation rows (W1, W2, W4, W5, W10) run on the floor too: mtmfs-floor, a
                minimal low-level FUSE daemon serving from memory with mtmfs's kernel-cache
                settings (built beside mtmfs-bench; skipped when absent), and show mtmfs ÷ floor.
                --quick: few iterations, for a smoke run. --engine: only the cache-engine
                workloads (W10–W15: 4 KiB writes, random writes + fsync, postmark with big files,
                a big write and its log, a big delete under load, mounting with data stored;
                W21–W23: random writes into a sparse file, a SQLite database inside, postmark
                with an app's file sizes).
                --vault: only W16, W17, W24, W25 and W27, the cost of one field change and of finding an
                account (by-server view, `mtmfs find`) with 10, 1,000 and 10,000 fully filled accounts
                (`pass` beside them), an unlock after many changes (--changes N: how many, default
                20,000; 100,000 take about 20 minutes), one change carried to a git remote, `mtmfs run`
                with three references beside `cat` of their files. --daemon: only W18 and W19, idle wakeups a minute (bindfs
                and gocryptfs beside mtmfs locked, unlocked, with --cache-limit over 100,000
                files) and the cost of .mtmfs/status with 10 to 1,000,000 cache files. --guard:
                only W20, `cat` of a password by a trusted program with guarding on beside the
                same with guarding off (both mounted and run as user nobody; needs root).
                --metadata: only W5, 10,000 small files created, listed, read and removed in
                cache/ beside the floor and the peers.
                --secret-service: only W26, the Secret Service beside gnome-keyring, each on a bus of
                its own: `secret-tool lookup` as a whole process, SearchItems round trips among 10
                and 10,000 accounts, idle wakeups with the bus served.
                """)
                return 0
            default:
                FileHandle.standardError.write(Data("mtmfs-bench: unknown option \(arguments[index])\n".utf8))
                return 2
            }
            index += 1
        }
        signal(SIGINT) { _ in Benchmark.interrupted = 1 }
        signal(SIGTERM) { _ in Benchmark.interrupted = 1 }
        do {
            let bench = try Bench(options: options)
            defer { bench.tearDown() }
            try bench.run()
            return 0
        } catch {
            FileHandle.standardError.write(Data("mtmfs-bench: \(error)\n".utf8))
            Bench.stopNamespaceDaemons()
            for mount in mounts { _ = Spawn.run("fusermount3", ["-uz", mount]) }
            stopHelpers()
            return 1
        }
    }
}

extension Array {
    subscript(safe index: Int) -> Element? { indices.contains(index) ? self[index] : nil }
}

struct BenchError: Error, CustomStringConvertible {
    var description: String
    init(_ description: String) { self.description = description }
}

/// Wall-clock seconds of `body`.
func seconds(_ body: () throws -> Void) rethrows -> Double {
    var start = timespec(), end = timespec()
    clock_gettime(CLOCK_MONOTONIC, &start)
    try body()
    clock_gettime(CLOCK_MONOTONIC, &end)
    return Double(end.tv_sec - start.tv_sec) + Double(end.tv_nsec - start.tv_nsec) / 1e9
}
