import Foundation
import FuseLowLevel
@testable import MountedTree
import Testing
#if canImport(Glibc)
import Glibc
#endif

/// `settings/` in front of the kernel model, which honours what its opens answer: a
/// reader's second `cat` of a key that did not change comes from the pages (no READ), a
/// reader's close sends no FLUSH, and a change reaches the next reader.
@Suite struct PageCacheModelTests {
    @Test func readersKeepPagesUntilTheKeyChanges() throws {
        let scratch = FileManager.default.temporaryDirectory.appendingPathComponent("mtmfs-pages-\(UUID().uuidString)").path
        try FileManager.default.createDirectory(atPath: scratch, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: scratch) }
        try """
        <?xml version="1.0" encoding="UTF-8"?>
        <plist version="1.0"><dict><key>username</key><string>old</string></dict></plist>
        """.write(toFile: scratch + "/Settings.plist", atomically: true, encoding: .utf8)
        let settings = SettingsTree(plistPath: scratch + "/Settings.plist", ownership: .currentProcess(), notifier: KernelCacheNotifier(),
                                    nodes: NodeTable())
        defer { settings.shutDown() }
        let k = KernelModel(settings, directory: "", forgets: false)
        #expect(k.contents("username") == "old\n")
        #expect(k.contents("username") == "old\n")
        #expect(k.readsFromTree == 1 && k.readsFromPages == 1, "the second read came from the tree")
        #expect(k.flushes == 0, "a reader's close sent FLUSH")
        let fd = k.open("username", O_WRONLY | O_TRUNC)
        k.write(fd, "new\n")
        k.close(fd)
        #expect(k.flushes == 1)
        #expect(k.contents("username") == "new\n")
        #expect(k.readsFromTree == 2)
        // Changed from outside the tree: the watcher's invalidation reaches the pages.
        try """
        <?xml version="1.0" encoding="UTF-8"?>
        <plist version="1.0"><dict><key>username</key><string>outside</string></dict></plist>
        """.write(toFile: scratch + "/Settings.plist", atomically: true, encoding: .utf8)
        var seen: String?
        for _ in 0..<100 {
            seen = k.contents("username")
            if seen == "outside\n" { break }
            usleep(20_000)
        }
        #expect(seen == "outside\n")
    }
}
