#if canImport(Glibc)
import Glibc
#endif
import Posix

/// Reading and writing a file in one call with a close-on-exec descriptor: tests run in
/// parallel in one process and spawn programs, and a child that inherits a descriptor
/// into a mount (a tmux server lives long) keeps the mount busy and its unmount fails;
/// one that inherits a script open for writing makes every run of it ETXTBSY (seen: a
/// test's pinentry that the daemon could not run).
///
/// Thread-safety: no state.
public enum TestFile {
    /// Writes `text` (O_TRUNC: one open, one write, one close, as `echo > f` does).
    public static func write(_ text: String, to path: String) throws {
        let fd = try Syscall.open(path, O_WRONLY | O_CREAT | O_TRUNC, mode: 0o600)
        defer { Syscall.close(fd) }
        try Syscall.writeAll(fd, Array(text.utf8))
    }

    /// Writes a script to run (mode 0755, whatever the umask), closed before it returns.
    public static func writeProgram(_ text: String, to path: String) throws {
        try write(text, to: path)
        try Syscall.chmod(path, mode: 0o755)
    }

    /// The file's bytes as text; nil when it cannot be read.
    public static func read(_ path: String) -> String? {
        guard let fd = try? Syscall.open(path, O_RDONLY) else { return nil }
        defer { Syscall.close(fd) }
        return (try? Syscall.readAll(fd)).map { String(decoding: $0, as: UTF8.self) }
    }
}
