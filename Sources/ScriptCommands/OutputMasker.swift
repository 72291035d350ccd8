#if canImport(Glibc)
import Glibc
#endif
import Posix
import SecureMemory

/// Replaces every secret in a stream with `<concealed by mtmfs>` (what `mtmfs run` does to
/// its command's output). A secret split across two writes is still found: the bytes at
/// the end of a write that begin a secret are held back until the next write (or the end)
/// tells. Only those: everything else passes at once, so an interactive program's prompt
/// is not delayed unless it ends with the beginning of a secret.
///
/// The stream's bytes are kept in secure memory while they are looked at (they may hold a
/// secret).
///
/// Thread-safety: none of its own; one stream, one thread.
package final class OutputMasker {
    package static let replacement = Array("<concealed by mtmfs>".utf8)

    /// The values to conceal, longest first (where two begin at one place, the longer goes).
    private let secrets: [SecureBytes]
    /// Bytes held back from the last write: the beginning of a secret, perhaps.
    private let pending = SecureBytes()
    /// Where the next write is put together with what was held back.
    private let work = SecureBytes()

    /// `secrets`: the values (the masker keeps them; empty ones conceal nothing).
    package init(secrets: [SecureBytes]) {
        self.secrets = secrets.filter { $0.count > 0 }.sorted { $0.count > $1.count }
    }

    /// Takes `chunk` and hands on what can be shown now (possibly in several pieces).
    package func feed(_ chunk: UnsafeRawBufferPointer, emit: (UnsafeRawBufferPointer) -> Void) throws(Errno) {
        guard !secrets.isEmpty else { return emit(chunk) }
        try work.resize(to: 0)
        try pending.withUnsafeBytes { (held) throws(Errno) in try work.append(held) }
        try work.append(chunk)
        try pending.resize(to: 0)
        let held = try work.withUnsafeBytes { (data) throws(Errno) -> Range<Int>? in
            scan(data, final: false, emit: emit)
        }
        if let held {
            try work.withUnsafeBytes { (data) throws(Errno) in try pending.append(UnsafeRawBufferPointer(rebasing: data[held])) }
        }
    }

    /// The stream ended: what was held back is shown, with any secret in it concealed.
    package func finish(emit: (UnsafeRawBufferPointer) -> Void) {
        pending.withUnsafeBytes { held in if !held.isEmpty { _ = scan(held, final: true, emit: emit) } }
        pending.wipe()
        work.wipe()
    }

    /// Emits `data` with every secret replaced; returns the tail to hold back (a prefix of
    /// a secret that the next write may complete), unless `final`.
    private func scan(_ data: UnsafeRawBufferPointer, final: Bool, emit: (UnsafeRawBufferPointer) -> Void) -> Range<Int>? {
        var index = 0, shownFrom = 0
        while index < data.count {
            var matched = 0
            var couldBegin = false
            for secret in secrets {
                secret.withUnsafeBytes { value in
                    guard let start = value.baseAddress, let here = data.baseAddress.map({ $0 + index }), value[0] == data[index] else { return }
                    let available = data.count - index
                    if available >= value.count {
                        if memcmp(start, here, value.count) == 0 { matched = value.count }
                    } else if memcmp(start, here, available) == 0 {
                        couldBegin = true
                    }
                }
                if matched > 0 { break }  // (longest first: no longer one can begin here now)
            }
            if couldBegin && !final {
                // (A longer secret may begin here: the next write tells.)
                if index > shownFrom { emit(UnsafeRawBufferPointer(rebasing: data[shownFrom..<index])) }
                return index..<data.count
            } else if matched > 0 {
                if index > shownFrom { emit(UnsafeRawBufferPointer(rebasing: data[shownFrom..<index])) }
                Self.replacement.withUnsafeBytes { emit($0) }
                index += matched
                shownFrom = index
            } else {
                index += 1
            }
        }
        if data.count > shownFrom { emit(UnsafeRawBufferPointer(rebasing: data[shownFrom...])) }
        return nil
    }
}
