import Foundation
import TestSupport
import Testing

/// The model-based test of the editable trees (`Tests/ModelBased/editable_trees.py`): seeded
/// random sequences over hard names and every tool's save, each step compared with a model,
/// and the plist and the fields compared again after an unmount and a mount. CI runs the
/// form the issue asks for — 10 seeds × 300 steps in each tree; a failure names the seed
/// and the last steps.
@Suite(.enabled(if: FuseAvailability.isAvailable, "needs /dev/fuse")) struct ModelBasedTests {
    static let script = Run.repository + "/Tests/ModelBased/editable_trees.py"

    @Test(arguments: ["settings", "accounts"])
    func randomSequencesMatchTheModel(tree: String) {
        let result = Run.program("python3", [Self.script, "--mtmfs", Run.mtmfs, "--tree", tree, "--seeds", "10", "--steps", "300"],
                                 timeout: 1200)
        #expect(result.status == 0, "\(tree):\n\(result.stdout)\(result.stderr)")
    }
}
