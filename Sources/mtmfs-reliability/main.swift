#if canImport(Glibc)
import Glibc
#endif
import Foundation
import TestSupport

// mtmfs-reliability: faults, bad input and attackers (crash, full disk, damaged stores,
// concurrency, security). Each part prints "N tried, N survived"; the exit status is 1
// when anything did not survive, 0 with "skipped" where /dev/fuse cannot be opened.
// `--short` is the CI form.

let usage = """
Usage: mtmfs-reliability [--short] [--seed N] [--keep] [--rounds N] [PART…]

Parts: crash, power-cut, full-disk, damage, concurrency, security, soak, differential, convergence
(default: all).
  --short    the CI form: 20 crashes, 8 processes × 6 s, fewer damage cases, 5,000 saves,
             6 differential sequences of 1,500 operations (60 of 3,000 without it), 3 convergence
             seeds of 80 steps (20 of 200), about 160 power-cut states (about 320)
  --saves N  soak: this many editor saves instead of 100,000 (5,000 with --short)
  --seed N   the random seed (printed at the start, to repeat a run)
  --rounds N crash: this many kills instead of 200 (20 with --short)
  --keep     keep the temporary directories (data, logs) for a look afterwards
"""

var arguments = Array(CommandLine.arguments.dropFirst())
if arguments.first == "worker", arguments.count == 6 {
    // A workload process of the crash driver: worker STORE MOUNT LOG SEED SCRATCH.
    exit(Workload.work(store: arguments[1], mountPoint: arguments[2], log: arguments[3],
                       seed: UInt64(arguments[4]) ?? 1, scratch: arguments[5]))
}
if arguments.first == "actor", arguments.count == 6 {
    // A process of the concurrency run: actor INDEX MOUNT SECONDS SEED MODEL.
    exit(ConcurrencyRun.act(index: Int(arguments[1]) ?? 0, mountPoint: arguments[2],
                            seconds: Double(arguments[3]) ?? 5, seed: UInt64(arguments[4]) ?? 1, model: arguments[5]))
}

var short = false
var seed = UInt64(time(nil))
var parts: [String] = []
var crashRounds: Int?
var soakSaves: Int?
while let argument = arguments.first {
    arguments.removeFirst()
    switch argument {
    case "--short": short = true
    case "--keep": Scratch.keep = true
    case "--rounds":
        guard let value = arguments.first.flatMap({ Int($0) }), value > 0 else { complain(usage); exit(2) }
        crashRounds = value
        arguments.removeFirst()
    case "--saves":
        guard let value = arguments.first.flatMap({ Int($0) }), value > 0 else { complain(usage); exit(2) }
        soakSaves = value
        arguments.removeFirst()
    case "--seed":
        guard let value = arguments.first.flatMap({ UInt64($0) }) else { complain(usage); exit(2) }
        seed = value
        arguments.removeFirst()
    case "-h", "--help": say(usage); exit(0)
    case "crash", "power-cut", "full-disk", "damage", "concurrency", "security", "soak", "differential", "convergence":
        parts.append(argument)
    default: complain("mtmfs-reliability: unknown argument \(argument)\n\(usage)"); exit(2)
    }
}
if parts.isEmpty {
    parts = ["differential", "damage", "full-disk", "security", "concurrency", "crash", "power-cut", "convergence", "soak"]
}
if let problem = FuseAvailability.problem {
    // Every part mounts: without FUSE there is nothing to try, which is not a failure.
    say("mtmfs-reliability: skipped, FUSE cannot be used here (\(problem))")
    exit(0)
}
signal(SIGPIPE, SIG_IGN)
say("mtmfs-reliability: seed \(seed)\(short ? ", short form" : "")")

var tallies: [Tally] = []
for part in parts {
    let started = Date()
    let partTallies: [Tally]
    switch part {
    case "crash": partTallies = [CrashDriver(rounds: crashRounds ?? (short ? 20 : 200), seed: seed).run()]
    case "power-cut": partTallies = [PowerCut(short: short, seed: seed).run()]
    case "full-disk": partTallies = [FullDisk().run()]
    case "damage": partTallies = DamagedStores(short: short, seed: seed).run()
    case "concurrency": partTallies = [ConcurrencyRun(processes: 8, seconds: short ? 6 : 60, seed: seed).run()]
    case "differential":
        partTallies = [Differential(seeds: short ? 6 : 60, operations: short ? 1_500 : 3_000, seed: seed).run()]
    case "convergence": partTallies = [Convergence(seeds: short ? 3 : 20, steps: short ? 80 : 200, seed: seed).run()]
    case "soak": partTallies = Soak(saves: soakSaves ?? (short ? 5_000 : 100_000), seed: seed).run()
    default: partTallies = SecurityChecks().run()
    }
    for tally in partTallies {
        say(tally.line)
        for failure in tally.failures.prefix(20) { say("  FAILED \(failure)") }
    }
    say(String(format: "  (%@: %.1f s)", part, Date().timeIntervalSince(started)))
    tallies += partTallies
}
let failed = tallies.filter { $0.survived != $0.tried }
say(failed.isEmpty ? "mtmfs-reliability: everything survived" : "mtmfs-reliability: \(failed.count) part(s) with failures")
exit(failed.isEmpty ? 0 : 1)
