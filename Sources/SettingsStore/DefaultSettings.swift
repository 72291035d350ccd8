import Foundation

/// The `Settings.plist` that `mtmfs init` writes: the app's shipped defaults
/// (`IsFirstRun` = true, `ActiveServiceAccountUUID` = empty), kept as a package resource.
public enum DefaultSettings {
    /// The bytes of the shipped XML property list.
    public static func propertyList() -> [UInt8] {
        guard let url = Bundle.module.url(forResource: "Settings", withExtension: "plist"),
              let data = try? Data(contentsOf: url) else {
            fatalError("the package resource Settings.plist is missing from \(Bundle.module.bundlePath)")
        }
        return [UInt8](data)
    }
}
