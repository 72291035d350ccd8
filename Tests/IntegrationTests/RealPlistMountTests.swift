import Foundation
import TestSupport
import Testing

/// Property lists nobody here wrote, through a real mount (`Tests/RealPlists/check.py`):
/// the ones Debian ships (rust-plist's fixtures, CPython's plists written by Apple's tools)
/// and generated ones (plistutil, plistlib, every binary trailer size): every key shown as
/// plistlib reads it (escaped names included), the file untouched by a mount, an `echo` and
/// a vim edit changing exactly their keys, format, order and integer widths kept.
@Suite(.enabled(if: FuseAvailability.isAvailable, "needs /dev/fuse")) struct RealPlistMountTests {
    @Test(arguments: ["debian", "generated"])
    func everyPlistShowsAndEditsAsPlistlibReadsIt(set: String) throws {
        let scratch = Scratch("plists")
        defer { scratch.remove() }
        let directory = Run.repository + "/Tests/RealPlists"
        let made = Run.program("python3", [directory + "/fixtures.py", set, scratch.sub(set)])
        try #require(made.status == 0, "\(made)")
        let checked = Run.program("python3", [directory + "/check.py", scratch.sub(set), Run.mtmfs], timeout: 600)
        #expect(checked.status == 0 && checked.stdout.contains(" passed, 0 failed"), "\(checked.stdout)\(checked.stderr)")
    }
}
