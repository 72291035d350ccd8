/// The version of mtmfs, shown by `mtmfs --version` and in `.mtmfs/status`.
public enum MtmfsVersion {
    public static let string = "0.1.0"
}
