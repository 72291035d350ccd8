/// The names editors and tools give their temporary, swap, lock and backup files
/// (SPEC §4): a file created under such a name is held in memory as a scratch file and
/// never becomes a key or field by itself — only by a rename onto one.
///
/// Thread-safety: pure functions.
enum EditorNames {
    /// vim (`.K.swp`, `K~`, `4913`), nano (`K.save`, `K.save.1`), emacs (`.#K`, `#K#`,
    /// `K~`), sed -i (`sedXXXXXX`), perl -i (`XXXXXXXX`), Python's tempfile (`tmpXXXXXXXX`),
    /// JetBrains' safe write, and every hidden name.
    static func isEditorFile(_ name: String) -> Bool {
        if name.hasPrefix(".") || name.hasSuffix("~") || name.hasSuffix(".swp") || name.hasSuffix(".swx")
            || name.hasSuffix(".swo") || name.hasSuffix(".save") || name.hasSuffix(".tmp") || name.hasSuffix(".bak") {
            return true
        }
        if name.hasPrefix("#") && name.hasSuffix("#") && name.count > 1 { return true }  // emacs auto-save
        if name.contains(".save.") { return true }  // nano's K.save.1
        if !name.isEmpty && name.allSatisfy(\.isNumber) { return true }  // vim's 4913 probe
        let utf8 = Array(name.utf8)
        let alphanumeric = { (c: UInt8) in (c >= 0x30 && c <= 0x39) || (c >= 0x41 && c <= 0x5A) || (c >= 0x61 && c <= 0x7A) }
        if name.hasPrefix("sed") && utf8.count == 9 && utf8[3...].allSatisfy(alphanumeric) { return true }  // sed -i
        if name.hasPrefix("XX") && utf8.count == 8 && utf8[2...].allSatisfy(alphanumeric) { return true }   // perl -i
        if name.hasPrefix("tmp") && utf8.count == 11 && utf8[3...].allSatisfy({ alphanumeric($0) || $0 == UInt8(ascii: "_") }) {
            return true  // Python's tempfile
        }
        if name.hasSuffix("___jb_tmp___") || name.hasSuffix("___jb_old___") { return true }  // JetBrains safe write
        return false
    }
}
