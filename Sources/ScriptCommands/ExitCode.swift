/// Every exit status of `mtmfs`, in one place.
package enum ExitCode {
    /// It worked.
    package static let success: Int32 = 0
    /// It could not be done: a missing store, a busy mount point, a wrong passphrase, …
    package static let failure: Int32 = 1
    /// The command line is wrong: an unknown option, a missing argument.
    package static let usage: Int32 = 2
    /// `find`, `read`: no account matches.
    package static let noMatch: Int32 = 3
    /// `find --print`: several accounts match where one is needed.
    package static let ambiguous: Int32 = 4
    /// The accounts are locked: run `mtmfs unlock`.
    package static let locked: Int32 = 5
    /// No mount: none is up, the one named is not an mtmfs mount, or it is stale.
    package static let noMount: Int32 = 6
    /// Guarding refused the program that asked (not trusted, or denied at the prompt).
    package static let refused: Int32 = 7
}

/// A failure the user can act on: one line saying what went wrong and what to do.
package struct CommandFailure: Error, CustomStringConvertible {
    package var description: String
    package var exitCode: Int32

    package init(_ description: String, exitCode: Int32 = ExitCode.failure) {
        self.description = description
        self.exitCode = exitCode
    }

    package static func usage(_ message: String, command: String) -> CommandFailure {
        CommandFailure("\(message); see `mtmfs \(command) --help`", exitCode: ExitCode.usage)
    }
}
