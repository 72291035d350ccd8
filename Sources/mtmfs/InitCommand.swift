import MountedTree

/// `mtmfs init`: creates a data directory with empty stores.
struct InitCommand: Command {
    static let name = "init"
    static let abstract = "create a data directory with empty stores"
    static let usage = """
    Usage: mtmfs init [--data-dir DIR]

    Creates DIR (mode 0700) with the default Settings.plist and an empty cache.sqlite.
    A directory that already holds a store is left alone (exit 1).

    Options:
      --data-dir DIR   where the stores live (default $XDG_DATA_HOME/mtmfs,
                       else ~/.local/share/mtmfs)
    """
    static let flags: Set<String> = []
    static let options: Set<String> = ["--data-dir"]

    let dataDirectory: DataDirectory

    init(_ arguments: Arguments) throws(CommandFailure) {
        _ = try arguments.positionals(0...0, named: "")
        dataDirectory = DataDirectory(path: Paths.dataDirectory(arguments.value("--data-dir")))
    }

    func run() throws(CommandFailure) {
        do {
            try dataDirectory.initialize()
        } catch {
            throw CommandFailure(error.description)
        }
        print("Initialized an mtmfs store in \(dataDirectory.path)")
    }
}
