#if canImport(Glibc)
import Glibc
#endif
import CSodium
import Posix
import SecureMemory

/// Argon2id of a passphrase (`crypto_pwhash`), in this process or in a child process made
/// for it.
///
/// A daemon derives in a child (`useChildProcess`) when the derivation is larger than
/// INTERACTIVE's: Argon2's memory (1 GiB at SENSITIVE) is
/// mapped, filled and unmapped by libsodium, and the unmap of that much memory holds the
/// address space's lock for 90 ms on an idle machine, several hundred under load. Every
/// thread of the process that maps memory meanwhile (a `sodium_malloc`, a large allocation)
/// waits for it: requests of the mount stalled at the end of each unlock. A child's memory is
/// its own; the daemon only waits on a pipe.
///
/// What goes to the child, on its standard input: the operations and memory limits (8 bytes
/// each, little-endian), the salt's length (1 byte) and the salt, the passphrase's length
/// (4 bytes) and the passphrase, written from secure memory. What comes back on its standard
/// output: the key, read into secure memory. The child reads the passphrase into secure
/// memory, makes itself undumpable before it reads anything, and exits.
///
/// Thread-safety: the executable is set once, before requests are served; derivations may
/// run on any thread at once (each has its own child).
public enum KeyDerivation {
    private static let helper = Locked<[String]?>(nil)

    /// Derives in a child from now on: `command` is the program and its arguments that run
    /// `serveChild` (for the daemon, its own executable and a hidden command).
    public static func useChildProcess(_ command: [String]) {
        helper.withLock { $0 = command }
    }

    /// Derivations of this much memory or less stay in the process: unmapping 64 MiB takes
    /// a few milliseconds, less than starting the child (about 25 ms).
    static let childAbove = KDFParameters.interactive.memoryBytes

    /// The key for `passphrase`: in a child when one is set up, the derivation is larger
    /// than `childAbove` and the child works; else here.
    static func derive(_ passphrase: SecureBytes, salt: [UInt8], parameters: KDFParameters) throws(VaultError) -> SecureBytes {
        if parameters.memoryBytes > childAbove, let command = helper.withLock({ $0 }) {
            if let key = inChild(command, passphrase, salt: salt, parameters: parameters) { return key }
            Log.warning("the key derivation's child process failed: deriving in the daemon")
        }
        return try here(passphrase, salt: salt, parameters: parameters)
    }

    /// `crypto_pwhash` in this process.
    static func here(_ passphrase: SecureBytes, salt: [UInt8], parameters: KDFParameters) throws(VaultError) -> SecureBytes {
        let key: SecureBytes
        do throws(Errno) { key = try SecureBytes(count: VaultFormat.keySize) } catch { throw .io(error) }
        let rc = passphrase.withUnsafeBytes { secret in
            key.withUnsafeMutableBytes { out in
                crypto_pwhash(out.baseAddress!.assumingMemoryBound(to: UInt8.self), UInt64(out.count),
                              secret.baseAddress?.assumingMemoryBound(to: CChar.self) ?? UnsafePointer(bitPattern: 1)!,
                              UInt64(secret.count), salt, parameters.operations, Int(parameters.memoryBytes),
                              crypto_pwhash_ALG_ARGON2ID13)
            }
        }
        guard rc == 0 else {
            key.wipe()
            throw .io(.noMemory)
        }
        return key
    }

    // MARK: The daemon's side

    static func inChild(_ command: [String], _ passphrase: SecureBytes, salt: [UInt8],
                                parameters: KDFParameters) -> SecureBytes? {
        guard let program = command.first, salt.count <= 255, passphrase.count <= Int(UInt32.max) else { return nil }
        guard let toChild = try? Syscall.pipe() else { return nil }
        guard let fromChild = try? Syscall.pipe() else {
            Syscall.close(toChild.read); Syscall.close(toChild.write)
            return nil
        }
        let pid = try? Spawn.start(program, Array(command.dropFirst()), stdin: .descriptor(toChild.read),
                                   stdout: .descriptor(fromChild.write), environment: [])
        Syscall.close(toChild.read)
        Syscall.close(fromChild.write)
        defer { Syscall.close(fromChild.read) }
        guard let pid else {
            Syscall.close(toChild.write)
            return nil
        }
        var header: [UInt8] = []
        withUnsafeBytes(of: parameters.operations.littleEndian) { header += $0 }
        withUnsafeBytes(of: parameters.memoryBytes.littleEndian) { header += $0 }
        header.append(UInt8(salt.count))
        header += salt
        withUnsafeBytes(of: UInt32(passphrase.count).littleEndian) { header += $0 }
        // A child that died early is an EPIPE here, not a signal.
        let sent = Syscall.withoutBrokenPipeSignal {
            (try? Syscall.writeAll(toChild.write, header)) != nil
                && passphrase.withUnsafeBytes { (try? Syscall.writeAll(toChild.write, $0)) != nil }
        }
        Syscall.close(toChild.write)
        guard let key = try? SecureBytes(count: VaultFormat.keySize) else { return nil }
        let received = sent && key.withUnsafeMutableBytes { readExactly(fromChild.read, into: $0) }
        let status = Spawn.wait(pid)
        guard received, status == 0 else {
            key.wipe()
            return nil
        }
        return key
    }

    // MARK: The child's side

    /// The child: reads the request from standard input, writes the key to standard
    /// output. Its exit status: 0, or 1 when the request was cut short or the derivation failed.
    public static func serveChild() -> Int32 {
        defer { SecureBytes.burnStack() }
        try? Syscall.forbidCoreDumps()  // (before the passphrase is read: no ptrace, no core)
        guard sodium_init() >= 0 else { return 1 }
        var fixed = [UInt8](repeating: 0, count: 17)
        guard fixed.withUnsafeMutableBytes({ readExactly(0, into: $0) }) else { return 1 }
        let operations = UInt64(littleEndian: fixed.withUnsafeBytes { $0.loadUnaligned(fromByteOffset: 0, as: UInt64.self) })
        let memory = UInt64(littleEndian: fixed.withUnsafeBytes { $0.loadUnaligned(fromByteOffset: 8, as: UInt64.self) })
        var salt = [UInt8](repeating: 0, count: Int(fixed[16]))
        var length: UInt32 = 0
        guard salt.withUnsafeMutableBytes({ readExactly(0, into: $0) }),
              withUnsafeMutableBytes(of: &length, { readExactly(0, into: $0) }) else { return 1 }
        guard let passphrase = try? SecureBytes(count: Int(UInt32(littleEndian: length))) else { return 1 }
        defer { passphrase.wipe() }
        guard passphrase.withUnsafeMutableBytes({ readExactly(0, into: $0) }),
              let key = try? here(passphrase, salt: salt, parameters: KDFParameters(operations: operations, memoryBytes: memory))
        else { return 1 }
        defer { key.wipe() }
        return key.withUnsafeBytes { (try? Syscall.writeAll(1, $0)) != nil } ? 0 : 1
    }

    private static func readExactly(_ fd: Int32, into buffer: UnsafeMutableRawBufferPointer) -> Bool {
        (try? Syscall.readExactly(fd, into: buffer)) ?? false
    }
}
