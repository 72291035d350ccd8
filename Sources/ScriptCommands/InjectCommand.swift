#if canImport(Glibc)
import Glibc
#endif
import Posix
import SecureMemory

/// `mtmfs inject`: a template's `{{ mtmfs://ACCOUNT/FIELD }}` replaced by the secrets, to a
/// file written atomically with mode 0600 (or standard output).
package struct InjectCommand: Command {
    package static let name = "inject"
    package static let abstract = "fill a template's {{ mtmfs:// }} references into a 0600 file"
    package static let usage = """
    Usage: mtmfs inject [--mount MOUNT] [-i TEMPLATE] [-o FILE] [--file-mode MODE]

    Copies TEMPLATE (standard input when left out) with every {{ mtmfs://ACCOUNT/FIELD }}
    replaced by that secret (references as in `mtmfs run --help`; other {{ … }} are left as
    they are), to FILE or standard output. FILE is written whole or not at all (a new
    file renamed over it, synced), with MODE (octal, default 0600) from its creation on.
        mtmfs inject -i config.yml.tpl -o config.yml

    Guarding decides on the program that runs `mtmfs inject`. Exit status: 3 no such
    account or field; 4 a view name several accounts share; 5 locked; 6 no mount; 7
    guarding refused; 2 wrong command line or a malformed reference; 1 anything else. On
    any failure FILE is left as it was.
    """
    package static let flags: Set<String> = []
    package static let options: Set<String> = ["--mount", "-i", "-o", "--file-mode"]

    package let mount: String?
    package let template: String?
    package let output: String?
    package let mode: mode_t

    package init(_ arguments: Arguments) throws(CommandFailure) {
        _ = try arguments.positionals(0...0, named: "")
        mount = arguments.value("--mount")
        template = arguments.value("-i")
        output = arguments.value("-o")
        mode = try FileMode.parse(arguments.value("--file-mode"), command: Self.name)
    }

    package func run() throws(CommandFailure) {
        let text: [UInt8]
        do {
            if let template { text = try Syscall.readFile(template) } else { text = try Syscall.readAll(0) }
        } catch {
            throw CommandFailure("cannot read the template \(Terminal.printable(template ?? "(standard input)")): \(error)")
        }
        let filled = try Self.fill(text, mount: mount)
        defer { filled.wipe() }
        try SecretOutput.write(filled, to: output, mode: mode)
    }

    /// The template with each `{{ mtmfs://… }}` replaced, in secure memory.
    package static func fill(_ template: [UInt8], mount given: String?) throws(CommandFailure) -> SecureBytes {
        let out = SecureBytes()
        var reader = SecretReader(mount: given)
        defer { reader.wipe() }
        var index = 0, copiedFrom = 0
        let open = Array("{{".utf8), close = Array("}}".utf8)
        func starts(_ bytes: [UInt8], at position: Int) -> Bool {
            position + bytes.count <= template.count && Array(template[position..<position + bytes.count]) == bytes
        }
        do throws(CommandFailure) {
            while index < template.count {
                guard starts(open, at: index) else {
                    index += 1
                    continue
                }
                var end = index + 2
                while end < template.count && !starts(close, at: end) && template[end] != 0x0A { end += 1 }
                guard end < template.count, starts(close, at: end) else {
                    index += 2
                    continue
                }
                let inside = String(decoding: template[(index + 2)..<end], as: UTF8.self).trimmed(of: " \t")
                guard SecretReference.isReference(inside) else {
                    index = end + 2
                    continue
                }
                let secret = try reader.secret(try SecretReference(inside))
                do throws(Errno) {
                    try out.append(Array(template[copiedFrom..<index]))  // (the template's own text: no secret)
                    try secret.withUnsafeBytes { (bytes) throws(Errno) in try out.append(bytes) }
                } catch {
                    throw CommandFailure("no secure memory for the secrets (\(error))")
                }
                index = end + 2
                copiedFrom = index
            }
            do throws(Errno) {
                try out.append(Array(template[copiedFrom...]))
            } catch {
                throw CommandFailure("no secure memory for the secrets (\(error))")
            }
        } catch {
            out.wipe()
            throw error
        }
        return out
    }
}

/// `mtmfs read REFERENCE`: one secret, to standard output or a 0600 file.
package struct ReadCommand: Command {
    package static let name = "read"
    package static let abstract = "print one secret (an mtmfs:// reference), or write it to a 0600 file"
    package static let usage = """
    Usage: mtmfs read [--mount MOUNT] [-n] [-o FILE] [--file-mode MODE] mtmfs://ACCOUNT/FIELD

    Prints the secret and a newline (-n: no newline); with -o, writes it to FILE instead,
    whole or not at all, with MODE (octal, default 0600). References as in `mtmfs run
    --help`. Guarding decides on the program that runs `mtmfs read`.

    Exit status: 0 read; 3 no such account or field; 4 a view name several accounts share;
    5 locked; 6 no mount; 7 guarding refused; 2 wrong command line or a malformed
    reference; 1 anything else.
    """
    package static let flags: Set<String> = ["-n"]
    package static let options: Set<String> = ["--mount", "-o", "--file-mode"]

    package let reference: SecretReference
    package let mount: String?
    package let newline: Bool
    package let output: String?
    package let mode: mode_t

    package init(_ arguments: Arguments) throws(CommandFailure) {
        reference = try SecretReference(try arguments.positionals(1...1, named: "REFERENCE")[0])
        mount = arguments.value("--mount")
        newline = !arguments.has("-n")
        output = arguments.value("-o")
        mode = try FileMode.parse(arguments.value("--file-mode"), command: Self.name)
    }

    package func run() throws(CommandFailure) {
        let secret = try reference.read(from: try MountChoice.resolve(mount))
        defer { secret.wipe() }
        if newline {
            do { try secret.append([0x0A]) } catch { throw CommandFailure("no secure memory for the secret (\(error))") }
        }
        try SecretOutput.write(secret, to: output, mode: mode)
    }
}

/// Where `inject` and `read` put what they made: a file replaced atomically with its mode,
/// or standard output.
package enum SecretOutput {
    package static func write(_ bytes: SecureBytes, to path: String?, mode: mode_t) throws(CommandFailure) {
        do throws(Errno) {
            try bytes.withUnsafeBytes { (all) throws(Errno) in
                if let path {
                    try AtomicFile.replace(path, with: all, mode: mode)
                } else {
                    try Syscall.writeAll(1, all)
                }
            }
        } catch {
            throw CommandFailure("cannot write \(path.map(Terminal.printable) ?? "standard output"): \(error)")
        }
    }
}

/// `--file-mode`: octal permission bits.
package enum FileMode {
    package static func parse(_ text: String?, command: String) throws(CommandFailure) -> mode_t {
        guard let text else { return 0o600 }
        guard !text.isEmpty, text.count <= 4, let mode = mode_t(text, radix: 8), mode <= 0o777 else {
            throw .usage("--file-mode takes octal permission bits (e.g. 0600)", command: command)
        }
        return mode
    }
}
