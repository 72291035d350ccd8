#if canImport(Glibc)
import Glibc
#endif
import Posix
import SecureMemory

/// A single-file vault (format 1 or 2) converted to a folder of format 3 (SPEC §2b: at its
/// first unlock). The folder is written under a name of its own beside the file; the caller
/// then renames the file to `vault.v2` and the folder into its place (`swapInConverted`).
/// The single file is only read (`Vault`) and converted here: the product writes folders.
///
/// Thread-safety: functions of the paths given; `write` as the vault it reads.
public enum VaultConversion {
    /// Where a conversion writes the folder before it takes the vault's name.
    public static func conversionPath(for path: String) -> String { path + ".converting" }

    /// Where the single file is kept after a conversion, until a later unlock succeeds.
    public static func keptFilePath(for path: String) -> String { path + ".v2" }

    /// This unlocked single-file vault written as a new folder at `path` (which must not
    /// exist): every account in its order, its fields and trusted list, and the guarding
    /// flag; the key slot wraps a new master key under `passphrase` with this vault's limits.
    public static func write(_ vault: Vault, asFolderAt path: String, passphrase: SecureBytes) throws(VaultError) {
        guard !vault.isFolder else { throw .io(.invalidArgument) }
        _ = try vault.requireKey()
        let converted = try Vault.createFolder(at: path, passphrase: passphrase, parameters: vault.kdfParameters, guarded: vault.guarded)
        defer { converted.lock() }
        try converted.folderAddAccounts(vault.records.map { record in
            (record.uuid, record.name, vault.fields[record.uuid] ?? [:], vault.trusted[record.uuid] ?? [])
        })
    }

    /// Converts the single-file vault at `path` into a folder in place, as a mount's first
    /// unlock does, for a command that finds one unconverted (`mtmfs passwd`): written beside
    /// it, swapped in, the renames synced. Returns the folder (locked); the file is kept as
    /// `keptFilePath` for the caller to remove once the folder has served.
    public static func convert(at path: String, passphrase: SecureBytes) throws(VaultError) -> Vault {
        let converting = conversionPath(for: path)
        removeConversionLeftover(at: converting)
        do throws(VaultError) {
            let source = try Vault(path: path)
            try source.unlock(passphrase: passphrase)
            defer { source.lock() }
            try write(source, asFolderAt: converting, passphrase: passphrase)
        } catch {
            removeConversionLeftover(at: converting)
            throw error
        }
        try swapInConverted(at: path)
        do throws(Errno) {
            try AtomicFile.syncDirectory(AtomicFile.parentDirectory(of: path))
        } catch {
            throw .io(error)
        }
        return try Vault(path: path)
    }

    /// Removes a folder a conversion left half-made (a crash): its files, one level of
    /// folders below, then the folder.
    public static func removeConversionLeftover(at path: String) {
        guard Vault.isFolder(path) else { return }
        for name in (try? Syscall.listDirectory(path)) ?? [] {
            let inner = path + "/" + name
            if Vault.isFolder(inner) {
                for file in (try? Syscall.listDirectory(inner)) ?? [] { try? Syscall.unlink(inner + "/" + file) }
                try? Syscall.removeDirectory(inner)
            } else {
                try? Syscall.unlink(inner)
            }
        }
        try? Syscall.removeDirectory(path)
    }

    /// The file becomes `vault.v2`, the converted folder takes its name. Also finishes a
    /// conversion a crash cut between the two renames (the file kept, the folder beside).
    public static func swapInConverted(at path: String) throws(VaultError) {
        let converting = conversionPath(for: path), kept = keptFilePath(for: path)
        do throws(Errno) {
            if (try? Syscall.lstat(path)) != nil { try Syscall.rename(path, kept) }
            try Syscall.rename(converting, path)
        } catch {
            throw .io(error)
        }
    }

    /// At a mount: a conversion cut by a crash after the file was renamed is finished (the
    /// folder is whole: it was written before either rename).
    public static func finishInterruptedConversion(at path: String) {
        guard (try? Syscall.lstat(path)) == nil, (try? Syscall.lstat(keptFilePath(for: path))) != nil,
              Vault.isFolder(conversionPath(for: path)) else { return }
        try? swapInConverted(at: path)
    }
}
