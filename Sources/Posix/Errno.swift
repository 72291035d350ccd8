#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// A POSIX error number: the single error currency of mtmfs.
///
/// Every failure that reaches the kernel is an `Errno`; stores map their own errors to one
/// of these in one place each. The static names read like the condition, and the doc
/// comment of each names the C constant.
///
/// Thread-safety: a plain value; `Sendable`.
public struct Errno: Error, Hashable, Sendable, CustomStringConvertible {
    /// The C value (`errno`).
    public let rawValue: Int32

    public init(_ rawValue: Int32) { self.rawValue = rawValue }

    /// The calling thread's current `errno`.
    public static var current: Errno { Errno(errno) }

    /// `strerror` text, e.g. "No such file or directory".
    public var description: String { String(cString: strerror(rawValue)) }

    /// `EPERM`
    public static let notPermitted = Errno(EPERM)
    /// `ENOENT`
    public static let noSuchFileOrDirectory = Errno(ENOENT)
    /// `EINTR`
    public static let interrupted = Errno(EINTR)
    /// `EIO`
    public static let ioError = Errno(EIO)
    /// `EBADF`
    public static let badFileDescriptor = Errno(EBADF)
    /// `EAGAIN`
    public static let tryAgain = Errno(EAGAIN)
    /// `ENOMEM`
    public static let noMemory = Errno(ENOMEM)
    /// `EACCES`
    public static let permissionDenied = Errno(EACCES)
    /// `EBUSY`
    public static let busy = Errno(EBUSY)
    /// `EEXIST`
    public static let fileExists = Errno(EEXIST)
    /// `EXDEV`
    public static let crossDevice = Errno(EXDEV)
    /// `ENOTDIR`
    public static let notDirectory = Errno(ENOTDIR)
    /// `EISDIR`
    public static let isDirectory = Errno(EISDIR)
    /// `EINVAL`
    public static let invalidArgument = Errno(EINVAL)
    /// `EFBIG`
    public static let fileTooLarge = Errno(EFBIG)
    /// `ENOSPC`
    public static let noSpace = Errno(ENOSPC)
    /// `EROFS`
    public static let readOnlyFileSystem = Errno(EROFS)
    /// `ERANGE`
    public static let outOfRange = Errno(ERANGE)
    /// `ENAMETOOLONG`
    public static let nameTooLong = Errno(ENAMETOOLONG)
    /// `ENOSYS`
    public static let notImplemented = Errno(ENOSYS)
    /// `ENOTEMPTY`
    public static let directoryNotEmpty = Errno(ENOTEMPTY)
    /// `ENODATA` (no such extended attribute)
    public static let noData = Errno(ENODATA)
    /// `ENOTSUP` / `EOPNOTSUPP`
    public static let notSupported = Errno(ENOTSUP)
    /// `EILSEQ` (a name that is not valid UTF-8)
    public static let illegalByteSequence = Errno(EILSEQ)
    /// `ENOTCONN` (a FUSE mount whose daemon is gone)
    public static let notConnected = Errno(ENOTCONN)
    /// `ESRCH`
    public static let noSuchProcess = Errno(ESRCH)
    /// `ENXIO`: no such device or address (also: `lseek` past the last data or hole).
    public static let noSuchDeviceOrAddress = Errno(ENXIO)
}
