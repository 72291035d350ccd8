/// The version of mtmfs, shown by `mtmfs --version` and in `.mtmfs/status`.
///
/// Thread-safety: a constant.
public enum MtmfsVersion {
    public static let string = "0.1.0"
}
