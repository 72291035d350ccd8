import Foundation
import TestSupport
import Testing
#if canImport(Glibc)
import Glibc
#endif

/// The mounted root through the kernel: its entries, `.mtmfs/status`, and refusals.
@Suite(.enabled(if: FuseAvailability.isAvailable, "needs /dev/fuse")) struct RootTreeTests {
    @Test func rootListsTheStoresAndControlDirectory() throws {
        let store = try MountedStore()
        defer { store.close() }
        let names = try FileManager.default.contentsOfDirectory(atPath: store.mountPoint).sorted()
        #expect(names == [".mtmfs", "accounts", "cache", "settings"])
        let listing = Run.shell("ls -la '\(store.mountPoint)'")
        #expect(listing.status == 0, "\(listing)")
        var st = stat()
        #expect(stat(store.mountPoint, &st) == 0)
        #expect(st.st_ino == 1 && st.st_mode & S_IFMT == S_IFDIR && st.st_uid == getuid())
        for name in ["accounts", "settings", "cache", ".mtmfs"] {
            #expect(stat(store.path(name), &st) == 0 && st.st_mode & S_IFMT == S_IFDIR, "\(name)")
        }
        // A new store: no account (only the two views), an empty cache.
        #expect(try FileManager.default.contentsOfDirectory(atPath: store.path("accounts")).sorted() == ["by-label", "by-server"])
        #expect(try FileManager.default.contentsOfDirectory(atPath: store.path("cache")) == [])
        #expect(try FileManager.default.contentsOfDirectory(atPath: store.path("settings")).sorted()
                == ["ActiveServiceAccountUUID", "IsFirstRun"])
    }

    @Test func statusFileReportsStateVersionAndDataDirectory() throws {
        let store = try MountedStore()
        defer { store.close() }
        let status = try store.status()
        #expect(status["state"] == "locked")
        #expect(status["version"]?.hasPrefix("0.") == true)
        #expect(status["data_dir"] == store.dataDirectory)
        #expect(status["mount_point"] == store.mountPoint)
        #expect(status["accounts"] == "0")
        #expect(Int32(status["pid"] ?? "") != nil)
        // Plain tools read it whole (direct I/O: the size on stat is not what bounds a read).
        let cat = Run.shell("cat '\(store.path(".mtmfs/status"))'")
        #expect(cat.stdout.hasPrefix("state=locked\n"), "\(cat)")
        var st = stat()
        #expect(stat(store.path(".mtmfs/status"), &st) == 0 && st.st_mode & 0o777 == 0o444)
        #expect(errnoOf { open(store.path(".mtmfs/status"), O_WRONLY) } == EACCES)
    }

    @Test func rootRefusesEveryCreation() throws {
        let store = try MountedStore()
        defer { store.close() }
        let root = store.mountPoint
        #expect(errnoOf { mkdir(root + "/new", 0o755) } == EACCES)
        #expect(errnoOf { open(root + "/new", O_CREAT | O_WRONLY, 0o644) } == EACCES)
        #expect(errnoOf { symlink("accounts", root + "/link") } == EACCES)
        #expect(errnoOf { mknod(root + "/fifo", S_IFIFO | 0o644, 0) } == EACCES)
        #expect(errnoOf { link(root + "/.mtmfs/status", root + "/hard") } == EACCES)
        #expect(errnoOf { rename(root + "/cache", root + "/moved") } == EACCES)
        #expect(errnoOf { rmdir(root + "/settings") } == EACCES)
        #expect(errnoOf { unlink(root + "/accounts") } == EISDIR)  // the kernel answers, as on ext4
        #expect(errnoOf { rename(root + "/.mtmfs/status", root + "/cache/status") } == EXDEV)
        // And the shell tools say so.
        let touch = Run.shell("touch '\(root)/file'")
        #expect(touch.status != 0 && touch.stderr.contains("Permission denied"), "\(touch)")
        #expect(try FileManager.default.contentsOfDirectory(atPath: root).sorted()
                == [".mtmfs", "accounts", "cache", "settings"])
    }

    @Test func statfsReportsTheDataDirectorysFileSystem() throws {
        let store = try MountedStore()
        defer { store.close() }
        let df = Run.shell("df -P '\(store.mountPoint)' | tail -1")
        #expect(df.status == 0 && df.stdout.hasPrefix(store.dataDirectory), "\(df)")
        var fs = statvfs()
        #expect(statvfs(store.mountPoint, &fs) == 0)
        #expect(fs.f_namemax == 255 && fs.f_blocks > 0)
    }

    @Test func mountTableShowsTypeAndSource() throws {
        let store = try MountedStore()
        defer { store.close() }
        let line = try String(contentsOfFile: "/proc/mounts", encoding: .utf8)
            .split(separator: "\n").first { $0.contains(" \(store.mountPoint) ") }
        let fields = try #require(line).split(separator: " ")
        #expect(fields[0] == store.dataDirectory)
        #expect(fields[2] == "fuse.mtmfs")
    }
}
