import Foundation
import FuzzTargets
import Testing

/// Replays the fuzzing corpus kept in `Corpus/TARGET/` (minimized by `mount-helpers/fuzz`,
/// and every input that once crashed) through each target: none may crash or break its
/// round-trip property.
@Suite struct CorpusTests {
    static let corpus = URL(fileURLWithPath: #filePath).deletingLastPathComponent().appendingPathComponent("Corpus")

    @Test(arguments: FuzzTarget.allCases)
    func corpusReplays(_ target: FuzzTarget) throws {
        let directory = Self.corpus.appendingPathComponent(target.rawValue)
        let files = try FileManager.default.contentsOfDirectory(atPath: directory.path)
        #expect(files.count >= 3, "the corpus of \(target.rawValue) is missing")
        for file in files {
            let bytes = try [UInt8](Data(contentsOf: directory.appendingPathComponent(file)))
            target.run(bytes)
        }
    }
}
