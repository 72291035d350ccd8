import Foundation
import TestSupport

/// The power-cut part: `Tests/CrashStates/crashstates.py` records the daemon's calls on its
/// data directory (strace) while a workload runs through the mount, builds every state a
/// power cut allows at each cut (unsynced data kept or lost page by page, names after the
/// last directory sync kept as a prefix), mounts each and checks what the workload was
/// promised, for all three stores and an SQLite database inside `cache/`. One case a state.
struct PowerCut {
    let short: Bool
    let seed: UInt64

    static let script: String = {
        var url = URL(fileURLWithPath: #filePath)
        for _ in 0..<3 { url = url.deletingLastPathComponent() }
        return url.path + "/Tests/CrashStates/crashstates.py"
    }()

    func run() -> Tally {
        let tally = Tally("power-cut states")
        let arguments = [Self.script, "--mtmfs", Run.mtmfs, "--seed", String(seed % 1_000_000)] + (short ? ["--short"] : [])
        let result = Run.program("python3", arguments, timeout: short ? 900 : 3600)
        let lines = result.stdout.split(separator: "\n").map(String.init)
        for line in lines where line.hasPrefix("states generated") || line.hasPrefix("promises checked") || line.hasPrefix("trace:") {
            say("  " + line)
        }
        // The last line: "N passed, M failed" (states).
        let counts = lines.last { $0.hasSuffix(" failed") && $0.contains(" passed, ") }?
            .split(whereSeparator: { !$0.isNumber }).compactMap { Int($0) }
        guard let counts, counts.count == 2, result.status == 0 || counts[1] > 0 else {
            tally.record("crashstates.py", ["did not run through (exit \(result.status)): \(result.stderr.suffix(400))"])
            return tally
        }
        let failures = lines.filter { $0.hasPrefix("FAIL") }
        for index in 0..<counts[0] { tally.record("state \(index)", []) }
        for index in 0..<counts[1] { tally.record("state", [failures.indices.contains(index) ? failures[index] : "failed"]) }
        return tally
    }
}
