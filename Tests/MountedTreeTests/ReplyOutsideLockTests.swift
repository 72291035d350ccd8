import CredentialVault
import Foundation
import FuseLowLevel
@testable import MountedTree
import Posix
import Synchronization
import Testing
#if canImport(Glibc)
import Glibc
#endif

/// A read's reply is sent after the tree's lock is let go: while the kernel takes a reply
/// (a slow reader, a full pipe), other requests of the tree go on. Here another thread asks
/// the tree for the file's attributes from inside the reply, and must be answered before
/// the reply returns.
@Suite struct ReplyOutsideLockTests {
    /// True when `request` (run on a thread of its own) ends within two seconds.
    static func answersMeanwhile(_ request: @escaping @Sendable () -> Void) -> Bool {
        let done = Mutex(false)
        _ = Threads.detach {
            request()
            done.withLock { $0 = true }
        }
        let started = ContinuousClock.now
        while started.duration(to: .now) < .seconds(2) {
            if done.withLock({ $0 }) { return true }
            usleep(1_000)
        }
        return false
    }

    @Test func accountsAndSettingsReplyAfterTheirLock() throws {
        let trees = try EditorStrategyTests.Trees()
        let context = RequestContext(uid: getuid(), gid: getgid(), pid: 1, umask: 0o022)
        let cases: [(FileSystem, InodeNumber)] = [
            (trees.accounts, try trees.accounts.lookup(
                parent: trees.accounts.lookup(parent: trees.accounts.space.root, name: trees.accountName, context: context).inode,
                name: "username", context: context).inode),
            (trees.settings, try trees.settings.lookup(parent: trees.settings.space.root, name: "username", context: context).inode),
        ]
        for (tree, inode) in cases {
            let opened = try tree.open(inode, flags: O_RDONLY, context: context)
            var text = ""
            var answered = false
            let shared = tree
            try tree.read(inode, handle: opened.handle, offset: 0, size: 4096, context: context) { bytes in
                text = String(decoding: bytes, as: UTF8.self)
                answered = Self.answersMeanwhile { _ = try? shared.attributes(of: inode, context: context) }
            }
            tree.release(inode, handle: opened.handle, flags: O_RDONLY)
            #expect(text == "old\n")
            #expect(answered, "\(type(of: tree)) held its lock while replying")
        }
    }
}
