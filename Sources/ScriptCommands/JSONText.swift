/// JSON text for the `--json` outputs (`find`, `status`), written by hand: the package
/// depends on nothing outside the toolchain, and Foundation's encoder is not needed for
/// strings and flat objects.
///
/// Thread-safety: pure functions.
package enum JSONText {
    /// A JSON string: quotes, backslashes and control characters escaped (RFC 8259).
    package static func string(_ text: String) -> String {
        var out = "\""
        for scalar in text.unicodeScalars {
            switch scalar {
            case "\"": out += "\\\""
            case "\\": out += "\\\\"
            case "\n": out += "\\n"
            case "\r": out += "\\r"
            case "\t": out += "\\t"
            default:
                if scalar.value < 0x20 {
                    let hex = String(scalar.value, radix: 16)
                    out += "\\u" + String(repeating: "0", count: 4 - hex.count) + hex
                } else {
                    out.unicodeScalars.append(scalar)
                }
            }
        }
        return out + "\""
    }

    /// A flat object of string members, in the order given.
    package static func object(_ members: [(String, String)]) -> String {
        "{" + members.map { string($0.0) + ": " + string($0.1) }.joined(separator: ", ") + "}"
    }
}
