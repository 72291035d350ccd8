import Foundation
@testable import Posix
import Testing
#if canImport(Glibc)
import Glibc
#endif

/// What a guarded open is decided on, read from this test process's own /proc entries.
@Suite struct ProcessInspectionTests {
    /// The kernel's answer mapping by mapping (PROCMAP_QUERY) is the parse of the text, on a
    /// process that maps a removed file's code beside its own. (A memfd's code: the
    /// reliability suite's "untrusted programs" part, through a mount.)
    @Test func queriedCodeMappingsAreTheParsedOnes() throws {
        var template = Array("/tmp/mtmfs-maps.XXXXXX".utf8CString)
        let directory = String(cString: mkdtemp(&template)!)
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let page = Int(sysconf(Int32(_SC_PAGESIZE)))

        var mapped: [UnsafeMutableRawPointer] = []
        defer { for address in mapped { munmap(address, page) } }
        // A removed file's code.
        let removed = directory + "/removed.so"
        let fd = try Syscall.open(removed, O_RDWR | O_CREAT, mode: 0o700)
        #expect(ftruncate(fd, off_t(page)) == 0)
        if let address = mmap(nil, page, PROT_READ | PROT_EXEC, MAP_PRIVATE, fd, 0), address != MAP_FAILED {
            mapped.append(address)
        }
        Syscall.close(fd)
        unlink(removed)
        let maps = try Syscall.open("/proc/self/maps", O_RDONLY)
        defer { Syscall.close(maps) }
        let parsed = try #require(ProcessInspection.parsedCodeMappings(maps))
        #expect(parsed.contains(.deletedFile(removed)))
        #expect(parsed.contains { if case .file(let path, _, _) = $0 { path.hasSuffix("/libc.so.6") } else { false } })
        let own = try #require(ProcessInspection.executablePath(of: getpid()))
        let exe = try Syscall.stat(own)
        #expect(parsed.contains(.file(own, device: UInt64(exe.st_dev), inode: UInt64(exe.st_ino))))

        guard let queried = ProcessInspection.queriedCodeMappings(maps) else {
            // A kernel before 6.11: the text is what a decision reads.
            #expect(ProcessInspection.codeMappings(of: getpid()) != nil)
            return
        }
        #expect(Set(queried) == Set(parsed))
        #expect(queried.count == parsed.count)
    }

    @Test func statusNamesTheProcessItsThreadsAndItsTracer() throws {
        let status = try #require(ProcessInspection.decisionStatus(of: getpid()))
        #expect(status.process == getpid())
        #expect(status.tracer == 0)
        #expect(status.credentials.uid == geteuid())
        #expect(status.threads == ProcessInspection.threads(of: getpid()).count)
        #expect(ProcessInspection.decisionStatus(of: 0) == nil)
    }

    /// The parent from a pidfd (Linux 6.13) is the one /proc/PID/stat names.
    @Test func parentFromThePidfdIsTheOneStatNames() throws {
        let pin = try ProcessInspection.pin(getpid())
        defer { Syscall.close(pin) }
        let stat = try #require(ProcessInspection.stat(of: getpid()))
        #expect(stat.parent == getppid())
        if let parent = ProcessInspection.parent(pinned: pin) { #expect(parent == getppid()) }
        #expect(ProcessInspection.isRunning(pinned: pin))
    }

    /// An ACL's named entries are bounded by its mask, the mode's group bits.
    @Test func onlyAGroupWritableModeLetsAnACLGrantWriting() {
        var st = stat()
        st.st_mode = S_IFREG | 0o755
        #expect(!ProcessInspection.Credentials.aclMayGrantWrite(st))
        st.st_mode = S_IFREG | 0o775
        #expect(ProcessInspection.Credentials.aclMayGrantWrite(st))
    }
}
