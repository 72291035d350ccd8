import CredentialVault
import SecureMemory
import FuseLowLevel
import Foundation
@testable import MountedTree
import Posix
import Testing
#if canImport(Glibc)
import Glibc
#endif

/// The root router and the control tree, called directly (no kernel).
@Suite struct RootTreeRoutingTests {
    let context = RequestContext(uid: 0, gid: 0, pid: 1, umask: 0o022)
    let ownership = Ownership(uid: 1000, gid: 1000, since: Timestamp(seconds: 1_700_000_000))

    func makeTree(status: @escaping @Sendable () -> String = { "state=locked\n" }) -> RootTree {
        RootTree(subtrees: [
            EmptyDirectoryTree(name: "accounts", space: .accounts, ownership: ownership),
            EmptyDirectoryTree(name: "cache", space: .cache, ownership: ownership),
            ControlTree(files: [ControlTree.File(name: "status", mode: 0o444, contents: status)], ownership: ownership,
                        nodes: NodeTable()),
        ], ownership: ownership)
    }

    @Test func inodeSpacesRoundTrip() {
        let space = InodeSpace.cache
        let inode = space.inode(12345)
        #expect(InodeSpace.tag(of: inode) == 4)
        #expect(space.local(inode) == 12345)
        #expect(space.contains(inode) && !InodeSpace.accounts.contains(inode))
        #expect(space.root == (4 << 56) | 1)
        #expect(InodeSpace.tag(of: RootTree.rootInode) == 0)
    }

    @Test func lookupRoutesToSubtreeRoots() throws {
        let tree = makeTree()
        let accounts = try tree.lookup(parent: 1, name: "accounts", context: context)
        #expect(accounts.inode == InodeSpace.accounts.root)
        #expect(accounts.attributes.isDirectory && accounts.attributes.uid == 1000)
        #expect(throws: Errno.noSuchFileOrDirectory) { try tree.lookup(parent: 1, name: "nope", context: context) }
        #expect(throws: Errno.noSuchFileOrDirectory) {
            try tree.lookup(parent: InodeSpace.accounts.root, name: "x", context: context)
        }
        let names = try tree.listDirectory(1, context: context).map(\.name)
        #expect(names == ["accounts", "cache", ".mtmfs"])
        let (root, _) = try tree.attributes(of: 1, context: context)
        #expect(root.linkCount == 5 && root.isDirectory)
    }

    @Test func rootRefusesChangesAndSubtreesStayApart() {
        let tree = makeTree()
        #expect(throws: Errno.permissionDenied) { try tree.makeDirectory(parent: 1, name: "x", mode: 0o755, context: context) }
        #expect(throws: Errno.permissionDenied) { try tree.create(parent: 1, name: "x", mode: 0o644, flags: 0, context: context) }
        #expect(throws: Errno.permissionDenied) { try tree.makeSymbolicLink(target: "t", parent: 1, name: "x", context: context) }
        #expect(throws: Errno.permissionDenied) { try tree.removeDirectory(parent: 1, name: "cache", context: context) }
        #expect(throws: Errno.permissionDenied) {
            try tree.rename(parent: 1, name: "cache", newParent: 1, newName: "c", flags: [], context: context)
        }
        #expect(throws: Errno.crossDevice) {
            try tree.rename(parent: InodeSpace.accounts.root, name: "a", newParent: InodeSpace.cache.root,
                            newName: "a", flags: [], context: context)
        }
        #expect(throws: Errno.noSuchFileOrDirectory) { try tree.attributes(of: InodeSpace.settings.root, context: context) }
    }

    @Test func controlFilesReadASnapshotTakenAtOpen() throws {
        let counter = Mutex(0)
        let tree = makeTree(status: {
            let n = counter.withLock { $0 += 1; return $0 }
            return "count=\(n)\n"
        })
        let status = try tree.lookup(parent: InodeSpace.control.root, name: "status", context: context)
        #expect(status.cache == .none)
        let opened = try tree.open(status.inode, flags: O_RDONLY, context: context)
        #expect(opened.directIO)
        let first = try tree.read(status.inode, handle: opened.handle, offset: 0, size: 3, context: context)
        let rest = try tree.read(status.inode, handle: opened.handle, offset: 3, size: 100, context: context)
        let expected = String(decoding: first + rest, as: UTF8.self)
        #expect(expected.hasPrefix("count=") && expected.hasSuffix("\n"))
        #expect(try tree.read(status.inode, handle: opened.handle, offset: 1000, size: 10, context: context) == [])
        tree.release(status.inode, handle: opened.handle, flags: 0)
        #expect(throws: Errno.badFileDescriptor) {
            try tree.read(status.inode, handle: opened.handle, offset: 0, size: 1, context: context)
        }
        #expect(throws: Errno.permissionDenied) { try tree.open(status.inode, flags: O_WRONLY, context: context) }
    }
}

import Synchronization

@Suite struct DataDirectoryTests {
    func scratch() -> String {
        var template = Array("/tmp/mtmfs-datadir.XXXXXX".utf8CString)
        return String(cString: mkdtemp(&template)!)
    }

    @Test func defaultPathFollowsXDG() {
        #expect(DataDirectory.defaultPath(environment: ["XDG_DATA_HOME": "/x/data", "HOME": "/home/u"]) == "/x/data/mtmfs")
        #expect(DataDirectory.defaultPath(environment: ["HOME": "/home/u"]) == "/home/u/.local/share/mtmfs")
        // A relative XDG_DATA_HOME is invalid per the spec and ignored.
        #expect(DataDirectory.defaultPath(environment: ["XDG_DATA_HOME": "rel", "HOME": "/home/u"]) == "/home/u/.local/share/mtmfs")
    }

    @Test func initializeThenCheck() throws {
        let base = scratch()
        defer { try? FileManager.default.removeItem(atPath: base) }
        let directory = DataDirectory(path: base + "/a/b/")
        #expect(directory.path == base + "/a/b")
        #expect(throws: DataDirectoryError.self) { try directory.check() }
        let passphrase = try SecureBytes(copying: Array("unit test".utf8))
        try directory.initialize(passphrase: passphrase, kdf: .interactive)
        try directory.check()
        #expect(try Syscall.stat(directory.path).st_mode & 0o777 == 0o700)
        #expect(throws: DataDirectoryError.self) { try directory.initialize(passphrase: passphrase, kdf: .interactive) }
    }

    @Test func checkNamesTheProblem() throws {
        let base = scratch()
        defer { try? FileManager.default.removeItem(atPath: base) }
        func message(_ path: String) -> String {
            do { try DataDirectory(path: path).check(); return "" } catch { return error.description }
        }
        #expect(message(base + "/missing").contains("run `mtmfs init"))
        #expect(message(base).contains("holds no mtmfs store"))
        _ = FileManager.default.createFile(atPath: base + "/file", contents: Data())
        #expect(message(base + "/file").contains("is not a directory"))
    }
}
