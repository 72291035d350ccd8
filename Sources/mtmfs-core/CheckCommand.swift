#if canImport(Glibc)
import Glibc
#endif
import CacheStore
import Posix
import ScriptCommands
import CredentialVault
import MountedTree
import SettingsStore

/// `mtmfs check`: reads every store of a data directory through and says what is wrong.
struct CheckCommand: Command {
    static let name = "check"
    static let abstract = "check every store of a data directory (also while mounted)"
    static let usage = """
    Usage: mtmfs check [--repair] [--passphrase-file FILE] [--data-dir DIR]

    Checks the credential vault (a folder: its id, key slots and every change file's
    framing, naming each file that is skipped — damaged, half-synced, renamed, foreign or
    a synchroniser's own; a file of another vault only the key tells, so those an unlocked
    mount of the data directory found are named from it; a single file: header, checksum,
    every record's framing; the contents stay encrypted), Settings.plist (parses as a property list) and the cache:
    cache.sqlite (SQLite's full integrity check, which reads every page: seconds per
    gigabyte) with its data files in cache.data/ (every large file's data file present;
    data files that no file names are said). Reads only; safe while the store is mounted.
    With the passphrase (asked on a terminal, or --passphrase-file) every change file and
    key slot is opened too, so that a damaged one is found by its seal; without it the
    output says the seals were not checked. One line per store; exit 1 if any is damaged
    (a change file or key slot skipped for damage counts; a synchroniser's or an editor's
    own file is only named). A mount runs the cache's full check by itself after an
    unclean shutdown only.

    Options:
      --repair         remove the data files that no file names (not while mounted; a
                       mount after an unclean shutdown does it too)
      --passphrase-file FILE   the vault's passphrase, from FILE's first line
      --data-dir DIR   the data directory (default $XDG_DATA_HOME/mtmfs, else ~/.local/share/mtmfs)
    """
    static let flags: Set<String> = ["--repair"]
    static let options: Set<String> = ["--data-dir", "--passphrase-file"]

    let dataDirectory: DataDirectory
    let repair: Bool
    let passphraseFile: String?

    init(_ arguments: Arguments) throws(CommandFailure) {
        _ = try arguments.positionals(0...0, named: "")
        dataDirectory = DataDirectory(path: Paths.dataDirectory(arguments.value("--data-dir")))
        repair = arguments.has("--repair")
        passphraseFile = arguments.value("--passphrase-file")
    }

    func run() throws(CommandFailure) {
        do {
            try dataDirectory.check()
        } catch {
            throw CommandFailure(error.description)
        }
        // A repair holds the data directory's claim: no mount can start meanwhile.
        var claim: DataDirectoryClaim?
        if repair {
            do {
                claim = try DataDirectoryClaim(dataDirectory, holder: .command("mtmfs check --repair"))
            } catch {
                throw CommandFailure(error.description)
            }
            try MountTable.refuseMounted(dataDirectory.path)
        }
        defer { withExtendedLifetime(claim) {} }
        var damaged: [String] = []
        func report(_ store: String, _ problem: String?) {
            print("\(store): \(problem ?? "ok")")
            if problem != nil { damaged.append(store) }
        }
        do {
            let vault = try Vault(path: dataDirectory.vaultPath)
            // With the passphrase every file is opened (a flipped byte shows only to its seal).
            var sealsChecked = false
            var openedSkipped: [String: String] = [:]
            if vault.folderFiles != nil, passphraseFile != nil || isatty(0) == 1 {
                let passphrase = try? PassphraseInput.read(prompt: "Passphrase (every file's seal is checked with it): ",
                                                          file: passphraseFile)
                defer { passphrase?.wipe() }
                if let passphrase {
                    let opened = Result { () throws(VaultError) in try vault.unlock(passphrase: passphrase, tidying: false) }
                    openedSkipped = vault.folderFiles?.skipped ?? [:]  // (what the key found, before the lock)
                    vault.lock()
                    switch opened {
                    case .success: sealsChecked = true
                    case .failure(.wrongPassphrase):
                        throw VaultError.damaged("no key slot opens with this passphrase (a wrong passphrase, or damaged slots)")
                    case .failure(let error): throw error
                    }
                }
            }
            // A folder: the files passed over are named (the rest loads). Without the key a
            // file of another vault looks whole: an unlocked mount of this data directory has
            // told them apart, and its status names them.
            if let files = vault.folderFiles {
                var skipped = files.skipped.merging(openedSkipped) { first, _ in first }
                for (relative, why) in Self.skippedByTheMount(of: dataDirectory.path) where skipped[relative] == nil {
                    skipped[relative] = why
                }
                // A synchroniser's or an editor's file is only named; a damaged one is damage.
                let damage = skipped.filter { !$0.value.hasPrefix("not a ") }
                report("vault", damage.isEmpty ? nil : "\(damage.count) damaged file(s), skipped (the others load)")
                if !skipped.isEmpty {
                    print("vault: \(skipped.count) file(s) skipped, every other file loads")
                    for (relative, why) in skipped.sorted(by: { $0.key < $1.key }) { print("vault: skipped \(relative): \(why)") }
                }
                if !sealsChecked {
                    Terminal.error("mtmfs check: note: the vault's seals were not checked (they need the passphrase: --passphrase-file FILE)")
                }
            } else {
                report("vault", nil)
            }
        } catch {
            report("vault", (error as? VaultError)?.description ?? "\(error)")
        }
        do {
            _ = try SettingsDocument(path: dataDirectory.settingsPath)
            report("Settings.plist", nil)
        } catch {
            report("Settings.plist", error.description)
        }
        do throws(CacheStoreError) {
            let note = try CacheStore.check(path: dataDirectory.cachePath, repair: repair) { line in
                if isatty(2) == 1 { Terminal.error("mtmfs: " + line) }
            }
            if let note { Terminal.error("mtmfs: " + note) }
            report("cache.sqlite", nil)
        } catch {
            report("cache.sqlite", error.description)
        }
        if !damaged.isEmpty {
            throw CommandFailure("damaged: \(damaged.joined(separator: ", ")); the files are left as they are (restore them from a backup, or move them away and run `mtmfs init`)")
        }
    }

    /// The change files an unlocked mount of `dataDirectory` skipped, as its `.mtmfs/status`
    /// names them (`vault_skipped_file=PATH: why`, the first 20).
    static func skippedByTheMount(of dataDirectory: String) -> [String: String] {
        guard let mount = MountTable.ownMtmfsMounts().first(where: { $0.source == dataDirectory }),
              let bytes = try? Syscall.readFile(mount.mountPoint + "/.mtmfs/status") else { return [:] }
        var skipped: [String: String] = [:]
        for line in String(decoding: bytes, as: UTF8.self).split(separator: "\n") where line.hasPrefix("vault_skipped_file=") {
            // "PATH: why" (a path holds no ": ").
            let entry = String(line.dropFirst("vault_skipped_file=".count))
            let parts = entry.split(separator: ":", maxSplits: 1)
            guard parts.count == 2 else { continue }
            skipped[String(parts[0])] = String(parts[1].drop { $0 == " " })
        }
        return skipped
    }
}
