#if canImport(Glibc)
import Glibc
#endif
import Foundation
import Posix

/// W20: what guarding (SPEC §3a) costs the program it trusts. Two stores, one guarded with
/// `cat` trusted and one not, are mounted by user nobody (a root requester is refused by a
/// guarded mount: root can write every file it runs) in a mount namespace whose /dev/fuse
/// users may open; `cat` of a password is timed in a loop of `sh` run as nobody in that
/// namespace, so both rows pay the same process start and differ by the decision alone.
extension Bench {
    struct GuardStore {
        let label: String
        let daemon: pid_t
        let password: String
    }

    static let nobody = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]

    func setUpGuardStores() throws -> [GuardStore] {
        guard geteuid() == 0 else {
            notes.append("W20: skipped (needs root to mount as another user in a namespace of its own)")
            return []
        }
        let base = root + "/guard"
        mkdir(base, 0o755)
        try (Bench.passphrase + "\n").write(toFile: base + "/pass", atomically: true, encoding: .utf8)
        chmod(base + "/pass", 0o644)
        var stores: [GuardStore] = []
        for (label, guarded) in [("mtmfs, guard off", false), ("mtmfs, guard on, cat trusted", true)] {
            let name = guarded ? "on" : "off"
            let data = base + "/data-" + name, mount = base + "/m-" + name
            for directory in [data, mount] {
                mkdir(directory, 0o700)
                chown(directory, 65534, 65534)
            }
            guard Spawn.run("setpriv", Array(Bench.nobody.dropFirst()) + [mtmfs, "init", "--kdf", "interactive",
                            "--data-dir", data, "--passphrase-file", base + "/pass"]) == 0 else {
                throw BenchError("W20: mtmfs init as nobody failed")
            }
            let device = base + "/fuse"
            // The namespace's copies of the bench's other mounts go first: a copy would keep
            // their daemons alive after their own unmount (W15 unmounts and remounts).
            let script = """
                awk '$3 ~ /^fuse/ {print $2}' /proc/self/mounts | while read -r m; do umount -l "$m" 2>/dev/null || true; done
                [ -e \(device) ] || { mknod \(device) c 10 229 && chmod 0666 \(device); } &&
                mount --bind \(device) /dev/fuse &&
                exec \(Bench.nobody.joined(separator: " ")) env HOME=\(base) \(mtmfs) mount -f --auto-lock 0 --data-dir \(data) \(mount)
                """
            guard let daemon = try? Spawn.start("unshare", ["-m", "--propagation", "private", "/bin/sh", "-c", script]) else {
                throw BenchError("W20: cannot start unshare")
            }
            Benchmark.namespaceDaemons.append(daemon)
            let started = ContinuousClock.now
            while !((try? String(contentsOfFile: "/proc/\(daemon)/mounts", encoding: .utf8)) ?? "").contains(" \(mount) fuse.mtmfs ") {
                guard started.secondsElapsed < 20 else { throw BenchError("W20: the mount as nobody did not come up") }
                usleep(20_000)
            }
            let store = GuardStore(label: label, daemon: daemon, password: mount + "/accounts/\(Bench.account)/password")
            let account = mount + "/accounts/\(Bench.account)"
            let steps: [[String]] = [
                [mtmfs, "unlock", "--passphrase-file", base + "/pass", mount],
                ["/bin/mkdir", account],
                ["/bin/sh", "-c", "echo correct-horse-battery-staple > \(store.password)"],
            ] + (guarded ? [[mtmfs, "guard", "on", "--passphrase-file", base + "/pass", mount],
                            [mtmfs, "trust", "--passphrase-file", base + "/pass", account, "/bin/cat"]] : [])
            for step in steps {
                guard asNobody(in: store, step) == 0 else { throw BenchError("W20: \(step.joined(separator: " ")) failed") }
            }
            guard asNobody(in: store, ["/bin/cat", store.password]) == 0 else { throw BenchError("W20: cat of the password failed") }
            stores.append(store)
        }
        return stores
    }

    @discardableResult
    func asNobody(in store: GuardStore, _ command: [String]) -> Int32 {
        Spawn.run("nsenter", ["-t", "\(store.daemon)", "-m"] + Bench.nobody + ["env", "HOME=/tmp"] + command)
    }

    func guardRound(_ stores: [GuardStore], round: Int) {
        guard stores.count == 2 else { return }
        let runs = processRuns
        var perCat: [String: Double] = [:]
        for store in round % 2 == 0 ? stores : stores.reversed() {
            let loop = "i=0; while [ $i -lt \(runs) ]; do cat \(store.password) >/dev/null || exit 1; i=$((i+1)); done"
            var status: Int32 = 0
            let total = seconds { status = asNobody(in: store, ["/bin/sh", "-c", loop]) }
            guard status == 0 else {
                notes.append("W20: a cat failed on \(store.label)")
                return
            }
            perCat[store.label] = total / Double(runs) * 1000
            record("W20 cat a password, whole process, \(store.label) (ms)", "mtmfs", total / Double(runs) * 1000)
        }
        if let off = perCat[stores[0].label], let on = perCat[stores[1].label], off > 0 {
            record("W20 guard on ÷ guard off, same round (×)", "mtmfs", on / off)
        }
    }

    /// Ends the namespace daemons (each unmounts its mount on SIGTERM; the namespace goes with it).
    static func stopNamespaceDaemons() {
        for daemon in Benchmark.namespaceDaemons {
            kill(daemon, SIGTERM)
            if Spawn.wait(daemon, timeout: 20) < 0 { kill(daemon, SIGKILL) }
        }
        Benchmark.namespaceDaemons.removeAll()
    }
}
