#if canImport(Glibc)
import Glibc
#endif
import CPosixShims
import FuzzTargets

/// The target libFuzzer's callback runs (a C callback cannot capture it).
nonisolated(unsafe) var selectedTarget = FuzzTarget.vault

enum Driver {
    static let usage = """
    Usage: mtmfs-fuzz TARGET [FILE|DIRECTORY…]           replay inputs (any build)
           mtmfs-fuzz TARGET [libFuzzer flags] [CORPUS…]  fuzz (built by mount-helpers/fuzz)
    Targets: \(FuzzTarget.allCases.map(\.rawValue).joined(separator: ", "))
    """

    static func main(_ arguments: [String]) -> Int32 {
        // libFuzzer runs copies of this binary (merge, fork) with its own flags only: they
        // find the target in the environment, where the first run put it.
        var rest = Array(arguments.dropFirst())
        let named = rest.first.flatMap { FuzzTarget(rawValue: $0) }
        if named != nil { rest.removeFirst() }
        guard let target = named ?? getenv("MTMFS_FUZZ_TARGET").flatMap({ FuzzTarget(rawValue: String(cString: $0)) }) else {
            print(usage)
            return 2
        }
        setenv("MTMFS_FUZZ_TARGET", target.rawValue, 1)
        selectedTarget = target
        #if FUZZING
        var cArguments: [UnsafeMutablePointer<CChar>?] = ([arguments[0]] + rest).map { strdup($0) } + [nil]
        var count = Int32(cArguments.count - 1)
        return cArguments.withUnsafeMutableBufferPointer { buffer in
            var argv = buffer.baseAddress
            return LLVMFuzzerRunDriver(&count, &argv) { data, size in
                selectedTarget.run(Array(UnsafeBufferPointer(start: data, count: size)))
                return 0
            }
        }
        #else
        var replayed = 0
        for path in rest {
            for file in files(at: path) {
                guard let bytes = contents(of: file) else { continue }
                target.run(bytes)
                replayed += 1
            }
        }
        print("mtmfs-fuzz: \(target.rawValue): \(replayed) inputs replayed, none crashed")
        return 0
        #endif
    }

    static func files(at path: String) -> [String] {
        guard let directory = opendir(path) else { return [path] }
        defer { closedir(directory) }
        var names: [String] = []
        while let entry = readdir(directory) {
            let name = withUnsafeBytes(of: entry.pointee.d_name) { String(cString: $0.bindMemory(to: CChar.self).baseAddress!) }
            if name != "." && name != ".." { names.append(path + "/" + name) }
        }
        return names.sorted()
    }

    static func contents(of path: String) -> [UInt8]? {
        let fd = open(path, O_RDONLY)
        guard fd >= 0 else { return nil }
        defer { close(fd) }
        var bytes: [UInt8] = []
        var buffer = [UInt8](repeating: 0, count: 65_536)
        while true {
            let n = read(fd, &buffer, buffer.count)
            if n <= 0 { return n == 0 ? bytes : nil }
            bytes += buffer[0..<n]
        }
    }
}
