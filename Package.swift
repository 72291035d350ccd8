// swift-tools-version:6.0
// mtmfs — a FUSE filesystem that mounts an app's credential vault, settings plist and
// SQLite cache as one tree. Dependency direction (each arrow: "is used by"):
//   C shims → Posix → FuseLowLevel → MountedTree → MountAssembly → mtmfs-core (CLI)
//   C shims → Posix → stores (SettingsStore, CacheStore; CredentialVault over SecureMemory) → MountedTree
//   Posix, SecureMemory → ScriptCommands → mtmfs (the command; it runs mtmfs-core for the rest)
import PackageDescription

let packageDirectory = Context.packageDirectory

// The modules of the `mtmfs` program, which a script may start for each secret: generic
// types' metadata through accessor functions, not by demangling their names at run time
// (a quarter of a millisecond a start otherwise).
let quickStart: [SwiftSetting] = [.unsafeFlags(["-Xfrontend", "-disable-concrete-type-metadata-mangled-name-accessors"])]

let package = Package(
    name: "mtmfs",
    platforms: [.macOS(.v15)],
    products: [
        .executable(name: "mtmfs", targets: ["mtmfs"]),
        .executable(name: "mtmfs-core", targets: ["mtmfs-core"]),
        .executable(name: "mtmfs-bench", targets: ["mtmfs-bench"]),
        .executable(name: "mtmfs-floor", targets: ["mtmfs-floor"]),
        .executable(name: "mtmfs-reliability", targets: ["mtmfs-reliability"]),
        .executable(name: "mtmfs-fuzz", targets: ["mtmfs-fuzz"]),
    ],
    targets: [
        // System libraries: a module map and a shim header each.
        .systemLibrary(name: "CFuse", pkgConfig: "fuse3",
                       providers: [.apt(["libfuse3-dev"])]),
        .systemLibrary(name: "CSQLite", providers: [.apt(["libsqlite3-dev"])]),
        .systemLibrary(name: "CSodium", pkgConfig: "libsodium",
                       providers: [.apt(["libsodium-dev"])]),
        // OpenSSL's libcrypto: HMAC-SHA1 for one-time codes (libsodium has no SHA-1); the
        // Secret Service's DH sessions (big numbers, AES-128-CBC, HMAC-SHA256).
        .systemLibrary(name: "CCrypto", pkgConfig: "libcrypto",
                       providers: [.apt(["libssl-dev"])]),
        // sd-bus (libsystemd): the Secret Service on the session bus.
        .systemLibrary(name: "CSDBus", pkgConfig: "libsystemd",
                       providers: [.apt(["libsystemd-dev"])]),
        // libc calls Swift cannot make directly (variadic prctl, syslog).
        .systemLibrary(name: "CPosixShims"),

        // The one place where libc is called: Errno, syscalls, atomic files, logging.
        .target(name: "Posix", dependencies: ["CPosixShims"], swiftSettings: quickStart),
        // libfuse's low-level API as a Swift protocol with errno results.
        .target(name: "FuseLowLevel", dependencies: ["CFuse", "Posix"]),
        // Stores, each usable without a mount.
        .target(name: "SettingsStore", dependencies: ["Posix"]),
        .target(name: "CacheStore", dependencies: ["CSQLite", "Posix"]),
        // Memory for secrets (sodium_malloc), under one budget: beneath the vault and the bus.
        .target(name: "SecureMemory", dependencies: ["CSodium", "Posix"], swiftSettings: quickStart),
        .target(name: "CredentialVault", dependencies: ["CSodium", "CCrypto", "Posix", "SecureMemory"]),
        // The Secret Service (org.freedesktop.secrets) on the session bus, over a store of
        // items it is given (the mounted tree's accounts).
        .target(name: "SecretService", dependencies: ["CSDBus", "CCrypto", "SecureMemory", "Posix"]),
        // systemd-logind's sleep and screen-lock signals on the system bus, for a mount that
        // locks with the session.
        .target(name: "LoginSession", dependencies: ["CSDBus", "Posix"]),
        // The mounted tree: root, control files, and the routing to each store.
        .target(name: "MountedTree",
                dependencies: ["FuseLowLevel", "Posix", "SettingsStore", "CacheStore", "SecureMemory", "CredentialVault", "SecretService"]),
        // The composition root: the data directory's stores assembled into the tree, served
        // by FUSE and (optionally) on the bus.
        .target(name: "MountAssembly",
                dependencies: ["MountedTree", "FuseLowLevel", "SecretService", "LoginSession", "SecureMemory", "CredentialVault", "Posix"]),
        // The command line's common ground (arguments, exit codes, finding the mount) and the
        // commands that give secrets to scripts: run, inject, read, find. libsodium alone beneath.
        .target(name: "ScriptCommands", dependencies: ["Posix", "SecureMemory"], swiftSettings: quickStart),
        // `mtmfs`: the script commands in a small program that starts fast; it runs
        // mtmfs-core for every other command.
        // Linked static and at fixed addresses: no dynamic loader, no library to map, and
        // nothing to relocate at each start — 1.44 ms for `mtmfs run -- true` where a
        // static-pie start, which writes the 70 pages of pointers it relocates, takes 1.70
        // (a dynamic one maps and relocates the Swift runtime's libraries: a millisecond
        // more). What it reads is the user's own (arguments, environment,
        // the mount's files, the command's output), as for 1Password's `op` and gopass,
        // Go programs linked the same way; its stack, heap and secure memory stay random.
        .executableTarget(name: "mtmfs", dependencies: ["ScriptCommands", "Posix"], swiftSettings: quickStart,
                          linkerSettings: [.unsafeFlags(["-static-executable"])]),
        // Every other command, the daemon among them.
        .executableTarget(name: "mtmfs-core", dependencies: ["ScriptCommands", "MountAssembly", "MountedTree", "FuseLowLevel", "SettingsStore", "CacheStore", "SecureMemory", "CredentialVault", "SecretService", "Posix"]),
        // Side-by-side measurements against a native directory and peers.
        .executableTarget(name: "mtmfs-bench", dependencies: ["Posix", "SecureMemory", "CredentialVault", "CSQLite"]),
        // The benchmark's floor, in C: the least a libfuse low-level daemon does (a tree in
        // memory, cache/'s kernel-cache settings), mounted by mtmfs-bench beside mtmfs.
        // CFuse brings fuse3's pkg-config flags; floor.c includes <fuse_lowlevel.h> itself.
        .executableTarget(name: "mtmfs-floor", dependencies: ["CFuse"]),
        // Faults, bad input and attackers: crash, full disk, damaged stores, concurrency, security.
        .executableTarget(name: "mtmfs-reliability",
                          dependencies: ["Posix", "CPosixShims", "CSodium", "SecureMemory", "CredentialVault", "SettingsStore", "TestSupport"]),
        // Shared by the integration tests and the reliability suite: programs, scratch, mounts.
        .target(name: "TestSupport", dependencies: ["Posix"]),

        // Parsers of untrusted bytes as fuzzing entry points, and their libFuzzer driver
        // (mount-helpers/fuzz builds it with -sanitize=fuzzer; a normal build replays inputs).
        .target(name: "FuzzTargets", dependencies: ["SecureMemory", "CredentialVault", "SettingsStore", "CSodium"]),
        .executableTarget(name: "mtmfs-fuzz", dependencies: ["FuzzTargets", "CPosixShims"]),

        .testTarget(name: "FuzzTargetsTests", dependencies: ["FuzzTargets"], exclude: ["Corpus"]),
        .testTarget(name: "PosixTests", dependencies: ["Posix"]),
        .testTarget(name: "FuseLowLevelTests", dependencies: ["FuseLowLevel", "CFuse", "Posix"]),
        .testTarget(name: "SettingsStoreTests", dependencies: ["SettingsStore"]),
        .testTarget(name: "CacheStoreTests", dependencies: ["CacheStore", "Posix", "TestSupport"]),
        .testTarget(name: "SecureMemoryTests", dependencies: ["SecureMemory", "Posix"]),
        .testTarget(name: "CredentialVaultTests", dependencies: ["CredentialVault", "SecureMemory", "Posix", "TestSupport"]),
        .testTarget(name: "SecretServiceTests", dependencies: ["SecretService", "CCrypto", "SecureMemory", "CredentialVault", "Posix"]),
        .testTarget(name: "MountedTreeTests", dependencies: ["MountedTree", "SecureMemory", "CredentialVault", "SecretService", "FuseLowLevel", "Posix", "TestSupport"]),
        .testTarget(name: "IntegrationTests", dependencies: ["Posix", "TestSupport", "SecureMemory", "CredentialVault"]),
    ]
)
