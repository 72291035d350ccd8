import Foundation
import Posix
import Testing
#if canImport(Glibc)
import Glibc
#endif

@Suite struct AtomicFileTests {
    func temporaryDirectory() -> String {
        var template = Array("/tmp/mtmfs-posix.XXXXXX".utf8CString)
        return String(cString: mkdtemp(&template)!)
    }

    @Test func replaceWritesWholeFileWithModeAndLeavesNoTemporary() throws {
        let directory = temporaryDirectory()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let path = directory + "/file"
        try AtomicFile.replace(path, with: Array("first".utf8), mode: 0o600)
        try AtomicFile.replace(path, with: Array("second, longer".utf8), mode: 0o640)
        #expect(try String(contentsOfFile: path, encoding: .utf8) == "second, longer")
        #expect(try Syscall.stat(path).st_mode & 0o777 == 0o640)
        #expect(try Syscall.listDirectory(directory) == ["file"])
    }

    @Test func replaceInAMissingDirectoryThrowsENOENT() {
        #expect(throws: Errno.noSuchFileOrDirectory) {
            try AtomicFile.replace("/nonexistent-mtmfs-dir/file", with: [1, 2, 3])
        }
    }

    @Test func temporaryFileIsNeverWiderThanTheFinalMode() throws {
        let directory = temporaryDirectory()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let old = umask(0)
        defer { umask(old) }
        try AtomicFile.replace(directory + "/secret", with: Array("x".utf8), mode: 0o600)
        #expect(try Syscall.stat(directory + "/secret").st_mode & 0o777 == 0o600)
    }

    @Test func parentDirectory() {
        #expect(AtomicFile.parentDirectory(of: "/a/b/c") == "/a/b")
        #expect(AtomicFile.parentDirectory(of: "/c") == "/")
        #expect(AtomicFile.parentDirectory(of: "c") == ".")
    }
}

@Suite struct SyscallTests {
    @Test func errnoNamesAndDescriptions() {
        #expect(Errno.noSuchFileOrDirectory.rawValue == ENOENT)
        #expect(Errno.permissionDenied.description == "Permission denied")
        #expect(Errno(EEXIST) == .fileExists)
    }

    @Test func failingCallsThrowTheirErrno() {
        #expect(throws: Errno.noSuchFileOrDirectory) { try Syscall.stat("/nonexistent-mtmfs") }
        #expect(throws: Errno.noSuchFileOrDirectory) { try Syscall.open("/nonexistent-mtmfs", O_RDONLY) }
        #expect(throws: Errno.notDirectory) { try Syscall.listDirectory("/etc/hostname") }
    }

    @Test func pipeRoundTripAndCloseOnExec() throws {
        let (readEnd, writeEnd) = try Syscall.pipe()
        #expect(fcntl(readEnd, F_GETFD) & FD_CLOEXEC != 0)
        let payload = [UInt8](repeating: 0x5A, count: 40_000)
        try Syscall.writeAll(writeEnd, payload)
        Syscall.close(writeEnd)
        #expect(try Syscall.readAll(readEnd) == payload)
        Syscall.close(readEnd)
    }
}
