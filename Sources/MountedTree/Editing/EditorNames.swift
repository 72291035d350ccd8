/// The names editors and tools give their own files while they save (SPEC §4): a file
/// created under such a name is held in memory as a scratch file, for its editor's save
/// only. What happens to it once the program that made it has exited (`EditorFile`):
/// the editor's own state goes with the editor; a copy still there is what someone meant
/// to keep, and becomes a key under its name.
///
/// Only the names editors really make count: `2024`, `notes.bak`, `x.tmp`, `x.swp`,
/// `.hidden` or `½` are keys like any other.
///
/// Thread-safety: pure functions.
enum EditorNames {
    /// What an editor's file is for.
    enum Kind: Equatable {
        /// The editor's state while it runs: vim's and nano's swap files (`.K.swp`, `.K.swo`,
        /// …), vim's write probe (`4913`, then 4913 + 123·k), emacs's lock link (`.#K`),
        /// kate's swap file. Never a key: it goes when its editor has exited.
        case state
        /// A copy on its way to a key or a backup: `K~` (vim, emacs, nano), emacs's
        /// auto-save `#K#`, `sedXXXXXX` (sed -i), `XXXXXXXX` (perl -i), Python's
        /// `tmpXXXXXXXX`, nano's `K.save`, rsync's `.K.XXXXXX`, GLib's
        /// `.goutputstream-XXXXXX`, JetBrains' `K___jb_tmp___`. Still there once its
        /// creator has exited, it is a key.
        case copy
    }

    static func isEditorFile(_ name: String) -> Bool { kind(of: name) != nil }

    static func kind(of name: String) -> Kind? {
        let utf8 = Array(name.utf8)
        guard !utf8.isEmpty else { return nil }
        if isVimProbe(utf8) { return .state }
        if name.hasPrefix(".") {
            if name.hasPrefix(".#") && utf8.count > 2 { return .state }  // emacs lock
            if name.hasSuffix(".kate-swp") { return .state }
            // vim and nano swap files: .K.swp, then .swo, .swn … .swa, .svz … .sva; vim's
            // test of long names first makes the same with an `x` added (`.K.swpx`).
            if isSwapSuffix(utf8) || (utf8.last == UInt8(ascii: "x") && isSwapSuffix(Array(utf8.dropLast()))) {
                return .state
            }
            if name.hasPrefix(".goutputstream-") && utf8.count == 21 && utf8[15...].allSatisfy(isAlphanumeric) { return .copy }
            // rsync: .K.XXXXXX
            if utf8.count >= 9, utf8[utf8.count - 7] == UInt8(ascii: "."), utf8[(utf8.count - 6)...].allSatisfy(isAlphanumeric) {
                return .copy
            }
            return nil
        }
        if name.hasSuffix("~") && utf8.count > 1 { return .copy }
        if name.hasPrefix("#") && name.hasSuffix("#") && utf8.count > 2 { return .copy }  // emacs auto-save
        if name.hasSuffix(".save") && utf8.count > 5 { return .copy }  // nano's K.save
        let parts = name.split(separator: ".", omittingEmptySubsequences: false)
        if parts.count >= 3, parts[parts.count - 2] == "save", !parts[0].isEmpty, let last = parts.last, !last.isEmpty,
           last.utf8.allSatisfy({ $0 >= UInt8(ascii: "0") && $0 <= UInt8(ascii: "9") }) {
            return .copy  // nano's K.save.1
        }
        if name.hasPrefix("sed") && utf8.count == 9 && utf8[3...].allSatisfy(isAlphanumeric) { return .copy }  // sed -i
        if name.hasPrefix("XX") && utf8.count == 8 && utf8[2...].allSatisfy(isAlphanumeric) { return .copy }   // perl -i
        if name.hasPrefix("tmp") && utf8.count == 11 && utf8[3...].allSatisfy({ isAlphanumeric($0) || $0 == UInt8(ascii: "_") }) {
            return .copy  // Python's tempfile
        }
        if name.hasSuffix("___jb_tmp___") || name.hasSuffix("___jb_old___") { return .copy }  // JetBrains safe write
        return nil
    }

    /// vim's test of whether it may create files: `4913`, or 4913 + 123·k while that exists.
    static func isVimProbe(_ utf8: [UInt8]) -> Bool {
        guard utf8.count >= 4, utf8.count <= 6, utf8.first != UInt8(ascii: "0"),
              utf8.allSatisfy({ $0 >= UInt8(ascii: "0") && $0 <= UInt8(ascii: "9") }),
              let number = Int(String(decoding: utf8, as: UTF8.self)) else { return false }
        return number >= 4913 && (number - 4913) % 123 == 0
    }

    /// `.swp`-like: a dot, `sw` or `sv`, a lowercase letter, at the end.
    private static func isSwapSuffix(_ utf8: [UInt8]) -> Bool {
        guard utf8.count >= 4 else { return false }
        let n = utf8.count
        return utf8[n - 4] == UInt8(ascii: ".") && utf8[n - 3] == UInt8(ascii: "s")
            && (utf8[n - 2] == UInt8(ascii: "w") || utf8[n - 2] == UInt8(ascii: "v")) && isLowercaseLetter(utf8[n - 1])
    }

    private static func isAlphanumeric(_ c: UInt8) -> Bool {
        (c >= 0x30 && c <= 0x39) || (c >= 0x41 && c <= 0x5A) || (c >= 0x61 && c <= 0x7A)
    }

    private static func isLowercaseLetter(_ c: UInt8) -> Bool { c >= 0x61 && c <= 0x7A }
}
