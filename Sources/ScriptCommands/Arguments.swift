/// One subcommand's arguments, parsed against the options it declares: flags (`-f`),
/// options with a value (`--data-dir DIR`, `--data-dir=DIR`, `-o OPTS`, `-oOPTS`), `--`,
/// and positionals. Parsing is by hand: the package depends on nothing outside the toolchain.
package struct Arguments {
    private(set) var flags: Set<String> = []
    private(set) var values: [String: [String]] = [:]
    private(set) var positionals: [String] = []
    package let command: String

    package init(_ arguments: [String], command: String, flags knownFlags: Set<String>,
         options knownOptions: Set<String>) throws(CommandFailure) {
        self.command = command
        let knownFlags = knownFlags.union(["--help", "-h"])
        var index = 0
        var onlyPositionals = false
        while index < arguments.count {
            let argument = arguments[index]
            index += 1
            if onlyPositionals || argument == "-" || !argument.hasPrefix("-") {
                positionals.append(argument)
                continue
            }
            if argument == "--" {
                onlyPositionals = true
                continue
            }
            var name = argument
            var value: String?
            if argument.hasPrefix("--"), let equals = argument.firstIndex(of: "=") {
                name = String(argument[..<equals])
                value = String(argument[argument.index(after: equals)...])
            } else if !argument.hasPrefix("--") && argument.count > 2 {
                let short = String(argument.prefix(2))
                if knownOptions.contains(short) {
                    name = short
                    value = String(argument.dropFirst(2))
                }
            }
            if knownFlags.contains(name) && value == nil {
                flags.insert(name)
            } else if knownOptions.contains(name) {
                if value == nil {
                    guard index < arguments.count else {
                        throw CommandFailure.usage("option \(name) needs a value", command: command)
                    }
                    value = arguments[index]
                    index += 1
                }
                values[name, default: []].append(value!)
            } else {
                throw CommandFailure.usage("unknown option \(name)", command: command)
            }
        }
    }

    package var wantsHelp: Bool { flags.contains("--help") || flags.contains("-h") }

    package func has(_ flag: String) -> Bool { flags.contains(flag) }

    /// The last value given for `option`.
    package func value(_ option: String) -> String? { values[option]?.last }

    /// Every value given for `option`, in order.
    package func allValues(_ option: String) -> [String] { values[option] ?? [] }

    /// The positionals, which must number within `range`.
    package func positionals(_ range: ClosedRange<Int>, named names: String) throws(CommandFailure) -> [String] {
        if positionals.count < range.lowerBound {
            throw CommandFailure.usage("missing \(names)", command: command)
        }
        if positionals.count > range.upperBound {
            throw CommandFailure.usage("unexpected argument \(positionals[range.upperBound])", command: command)
        }
        return positionals
    }
}
