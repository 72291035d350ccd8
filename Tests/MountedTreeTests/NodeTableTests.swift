import CredentialVault
import Foundation
import FuseLowLevel
@testable import MountedTree
import Posix
import Testing
#if canImport(Glibc)
import Glibc
#endif

/// The kernel's references live in one `NodeTable`: counted in the same visit that finds a
/// node (lookups, listings), dropped by FORGET, and a node goes only when its last one went
/// and none came back — whichever thread gets there first.
@Suite struct NodeTableTests {
    let context = RequestContext(uid: getuid(), gid: getgid(), pid: 1, umask: 0o022)

    @Test func countsReleasesAndSaysWhenTheLastReferenceWent() {
        let table = NodeTable()
        table.reference(7)
        table.reference(7, count: 2)
        #expect(table.isReferenced(7))
        #expect(!table.release(7, count: 2))
        #expect(table.release(7, count: 1))
        #expect(!table.isReferenced(7))
        // A FORGET of more than was counted, or of an inode never counted, frees nothing twice.
        #expect(!table.release(7, count: 1))
        table.reference(8)
        #expect(table.release(8, count: 5))
        #expect(table.referencedInodes == 0)
    }

    /// Both editing trees: a listing (READDIRPLUS) counts its entries under the tree's lock;
    /// every listed key is then unlinked, as another process would before the reply reaches
    /// the kernel: the kernel can still reach each file it was handed, until it forgets it.
    @Test func aListedNameUnlinkedBeforeTheReplyKeepsItsFileUntilForgotten() throws {
        let trees = try EditorStrategyTests.Trees()
        let accountDirectory = try trees.accounts.lookup(parent: trees.accounts.space.root, name: trees.accountName,
                                                         context: context).inode
        trees.accounts.forget(inode: accountDirectory, lookups: 1)
        let cases: [(tree: any Subtree, directory: InodeNumber, census: () -> Int)] = [
            (trees.settings, trees.settings.space.root, { trees.settings.census.files }),
            (trees.accounts, accountDirectory, { trees.accounts.census.files }),
        ]
        for (tree, directory, files) in cases {
            #expect(tree.countsListing(of: directory))
            let listed = try tree.listDirectory(directory, context: context)
            let keys = listed.filter { ["username", "port"].contains($0.name) }
            #expect(keys.count == 2, "\(listed.map(\.name))")
            for key in keys { try tree.unlink(parent: directory, name: key.name, context: context) }
            for key in keys {
                #expect(throws: Never.self) { _ = try tree.attributes(of: key.entry.inode, context: context) }
                #expect(tree.nodes.isReferenced(key.entry.inode))
            }
            #expect(files() >= 2)
            for entry in listed { tree.forget(inode: entry.entry.inode, lookups: 1) }
            #expect(files() == 0, "\(tree.name): files left after the kernel forgot them")
            #expect(tree.nodes.referencedInodes == 0)
        }
    }

    /// The last FORGET of a key's file drops its count to 0; before that thread runs the
    /// tree's hook, another lookup finds the same file and counts it again. The hook must
    /// then keep the file: the kernel holds its inode number anew.
    @Test func aLookupBetweenTheLastForgetAndItsHookKeepsTheNode() throws {
        let trees = try EditorStrategyTests.Trees()
        let settings = trees.settings
        let first = try settings.lookup(parent: settings.space.root, name: "port", context: context).inode
        #expect(settings.nodes.release(first, count: 1))  // the FORGET's thread, before its hook
        let again = try settings.lookup(parent: settings.space.root, name: "port", context: context).inode
        #expect(again == first)
        settings.lastReferenceGone(first)  // the hook, late
        #expect(settings.census.files == 1)
        #expect(try settings.attributes(of: first, context: context).0.size == 5)  // "8080\n"
        let third = try settings.lookup(parent: settings.space.root, name: "port", context: context).inode
        #expect(third == first)
        settings.forget(inode: first, lookups: 2)
        #expect(settings.census.files == 0)
        #expect(settings.nodes.referencedInodes == 0)
    }

    /// The mount's subtrees share one table: routed through the root, each subtree's top
    /// directory and files are counted there, and forgetting them empties it.
    @Test func theRootCountsInTheTableItsSubtreesShare() throws {
        let nodes = NodeTable()
        let ownership = Ownership.currentProcess()
        let root = RootTree(subtrees: [
            ControlTree(files: [ControlTree.File(name: "status", mode: 0o444, contents: { "ok\n" })], ownership: ownership,
                        nodes: nodes),
        ], ownership: ownership)
        let control = try root.lookup(parent: RootTree.rootInode, name: ".mtmfs", context: context)
        let status = try root.lookup(parent: control.inode, name: "status", context: context)
        #expect(nodes.referencedInodes == 2)
        root.forget(inode: status.inode, lookups: 1)
        root.forget(inode: control.inode, lookups: 1)
        #expect(nodes.referencedInodes == 0)
    }
}
