#if canImport(Glibc)
import Glibc
#endif
import Foundation
import Posix
import TestSupport

/// The data directory on a 32 MiB tmpfs: cache/ fills it up to its headroom, then another
/// program takes the rest. Writers of every store get ENOSPC (never EIO, never a torn
/// store); everything stays readable; after space is freed every store takes writes again,
/// and a remount shows the last acknowledged values.
final class FullDisk {
    let scratch = Scratch("reliability-full-disk")
    let tally = Tally("full disk (ENOSPC for each store's writers, stores intact, recovery)")

    func run() -> Tally {
        defer { scratch.remove() }
        let disk = scratch.sub("disk")
        mkdir(disk, 0o755)
        guard Run.program("mount", ["-t", "tmpfs", "-o", "size=32m", "tmpfs", disk]).status == 0 else {
            tally.record("set-up", ["cannot mount a tmpfs (needs root)"])
            return tally
        }
        defer { Run.program("umount", ["-l", disk]) }
        do {
            let store = try Store(in: scratch, dataDirectory: disk + "/data")
            defer { store.unmount() }
            try store.mount()
            let account = "accounts/\(Workload.account)"
            let field = "\(account)/password", key = "settings/FullDiskKey"
            guard mkdir(store.path(account), 0o700) == 0, writeFile(store.path(field), Array("before\n".utf8)) == 0,
                  writeFile(store.path(key), Array("before\n".utf8)) == 0, mkdir(store.path("cache/fill"), 0o755) == 0 else {
                throw SuiteError("set-up writes failed")
            }
            var field_ = "before", key_ = "before"

            // 1. cache/ alone: its writer gets ENOSPC before the disk is full.
            var cacheFiles = 0
            var cacheError: Int32 = 0
            while cacheError == 0 && cacheFiles < 200 {
                cacheError = writeFile(store.path("cache/fill/f\(cacheFiles)"), Workload.cacheContent(cacheFiles, size: 1 << 20), sync: true)
                if cacheError == 0 { cacheFiles += 1 }
            }
            tally.record("cache writer on a filling disk", cacheError == ENOSPC ? [] : ["got \(errnoName(cacheError)) after \(cacheFiles) MiB"])

            // 2. Another program takes the rest: the vault and the plist writers get ENOSPC too.
            Run.shell("dd if=/dev/zero of=\(disk)/filler bs=64k 2>/dev/null; sync")
            for (path, value) in [(field, "during"), (key, "during")] {
                let error = writeFile(store.path(path), Array((value + "\n").utf8))
                if error == 0 { if path == field { field_ = value } else { key_ = value } }
                tally.record("write \(path) on a full disk", [0, ENOSPC].contains(error) ? [] : ["got \(errnoName(error))"])
            }
            let mkdirError = mkdir(store.path("accounts/00000000-0000-4000-8000-0000000000ff"), 0o700) == 0 ? 0 : errno
            tally.record("mkdir an account on a full disk", [0, ENOSPC].contains(mkdirError) ? [] : ["got \(errnoName(mkdirError))"])
            let cacheSmall = writeFile(store.path("cache/small"), Array("x".utf8), sync: true)
            tally.record("small cache write on a full disk", [0, ENOSPC].contains(cacheSmall) ? [] : ["got \(errnoName(cacheSmall))"])

            // 3. Everything still reads, and the files on disk are whole.
            tally.record("stores readable on a full disk", readable(store, field: field, fieldValue: field_, key: key, keyValue: key_, cacheFiles: cacheFiles))
            tally.record("Settings.plist parses on a full disk", plistlibProblem(store.dataDirectory + "/Settings.plist").map { [$0] } ?? [])

            // 4. Space comes back: every store takes writes again.
            unlink(disk + "/filler")
            for index in 0..<cacheFiles { unlink(store.path("cache/fill/f\(index)")) }
            usleep(300_000)
            var after: [String] = []
            if writeFile(store.path(field), Array("after\n".utf8)) != 0 { after.append("field write") } else { field_ = "after" }
            if writeFile(store.path(key), Array("after\n".utf8)) != 0 { after.append("settings write") } else { key_ = "after" }
            let refill = writeFile(store.path("cache/fill/again"), Workload.cacheContent(7, size: 4 << 20), sync: true)
            if refill != 0 { after.append("cache write: \(errnoName(refill))") }
            tally.record("writes after space is freed", after)

            store.unmount()
            tally.record("integrity_check after the full disk", integrityProblem(store.dataDirectory + "/cache.sqlite").map { [$0] } ?? [])
            try store.mount()
            var remounted = readable(store, field: field, fieldValue: field_, key: key, keyValue: key_, cacheFiles: 0)
            if readFile(store.path("cache/fill/again")).bytes != Workload.cacheContent(7, size: 4 << 20) { remounted.append("cache/fill/again differs") }
            tally.record("remount after the full disk", remounted)
        } catch {
            tally.record("run", ["\(error)"])
        }
        return tally
    }

    func readable(_ store: Store, field: String, fieldValue: String, key: String, keyValue: String, cacheFiles: Int) -> [String] {
        var problems: [String] = []
        if readText(store.path(field)) != fieldValue + "\n" { problems.append("\(field) ≠ \(fieldValue)") }
        if readText(store.path(key)) != keyValue + "\n" { problems.append("\(key) ≠ \(keyValue)") }
        if readText(store.path("settings/IsFirstRun")) == nil { problems.append("settings/IsFirstRun unreadable") }
        for index in 0..<cacheFiles where readFile(store.path("cache/fill/f\(index)")).bytes != Workload.cacheContent(index, size: 1 << 20) {
            problems.append("cache/fill/f\(index) differs")
        }
        return problems
    }
}
