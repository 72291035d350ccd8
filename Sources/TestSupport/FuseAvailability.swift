#if canImport(Glibc)
import Glibc
#endif
import Posix

/// Whether this process can use FUSE: /dev/fuse exists and opens for reading and writing.
/// Where it cannot (a container without the device), the integration tests are skipped
/// (`@Suite(.enabled(if: FuseAvailability.isAvailable, …))`) and the reliability suite
/// reports "skipped", rather than failing on every mount.
///
/// Thread-safety: decided once, on first use (`static let`); readable from any thread.
public enum FuseAvailability {
    /// Why FUSE cannot be used ("/dev/fuse: No such file or directory"), nil when it can.
    public static let problem: String? = {
        do {
            let fd = try Syscall.open("/dev/fuse", O_RDWR)
            Syscall.close(fd)
            return nil
        } catch {
            return "/dev/fuse: \(error)"
        }
    }()

    public static var isAvailable: Bool { problem == nil }
}
