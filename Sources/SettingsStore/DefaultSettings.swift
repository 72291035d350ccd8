/// The `Settings.plist` that `mtmfs init` writes: the app's shipped defaults
/// (`IsFirstRun` = true, `ActiveServiceAccountUUID` = empty). Kept in the binary rather than
/// as a package resource: a resource needs Foundation's `Bundle` (and so all of Foundation
/// in the daemon's memory) and a bundle directory next to an installed executable.
///
/// Thread-safety: constants only.
public enum DefaultSettings {
    /// The text of the shipped XML property list.
    public static let xml = """
        <?xml version="1.0" encoding="UTF-8"?>
        <!DOCTYPE plist PUBLIC "-//Apple//DTD PLIST 1.0//EN" "http://www.apple.com/DTDs/PropertyList-1.0.dtd">
        <plist version="1.0">
        <dict>
        \t<key>IsFirstRun</key>
        \t<true/>
        \t<key>ActiveServiceAccountUUID</key>
        \t<string></string>
        </dict>
        </plist>

        """

    /// The bytes of the shipped XML property list.
    public static func propertyList() -> [UInt8] { Array(xml.utf8) }
}
