import Posix

/// Key paths into a property list: a dictionary key or an array index (its decimal text)
/// per level, as `settings/` names them.
///
/// Thread-safety: pure functions on values.
extension PlistValue {
    /// The value at `path` below this one (self for an empty path), or nil.
    public func value(at path: ArraySlice<String>) -> PlistValue? {
        guard let first = path.first else { return self }
        switch self {
        case .dictionary(let dictionary):
            return dictionary[first].flatMap { $0.value(at: path.dropFirst()) }
        case .array(let items):
            guard let index = PlistPath.arrayIndex(first), index < items.count else { return nil }
            return items[index].value(at: path.dropFirst())
        default:
            return nil
        }
    }

    /// Applies `change` to the value at `path` (nil: absent; setting nil removes it). A new
    /// dictionary key goes at `position` when given (a recreated key keeps its place), else
    /// last; an array takes a new element only at its end. ENOENT for a missing parent,
    /// ENOTDIR through a value that is not a container.
    public mutating func modify(at path: ArraySlice<String>, position: Int?,
                                _ change: (inout PlistValue?) throws(Errno) -> Void) throws(Errno) {
        guard let first = path.first else { throw .invalidArgument }
        switch self {
        case .dictionary(var dictionary):
            if path.count == 1 {
                var value = dictionary[first]
                let existed = value != nil
                try change(&value)
                if let value, !existed, let position {
                    dictionary.insert(value, forKey: first, at: position)
                } else {
                    dictionary[first] = value
                }
            } else {
                guard var child = dictionary[first] else { throw .noSuchFileOrDirectory }
                try child.modify(at: path.dropFirst(), position: position, change)
                dictionary[first] = child
            }
            self = .dictionary(dictionary)
        case .array(var items):
            guard let index = PlistPath.arrayIndex(first), index <= items.count else { throw .noSuchFileOrDirectory }
            if path.count == 1 {
                var value: PlistValue? = index < items.count ? items[index] : nil
                try change(&value)
                if index == items.count {
                    if let value { items.append(value) }
                } else if let value {
                    items[index] = value
                } else {
                    items.remove(at: index)
                }
            } else {
                guard index < items.count else { throw .noSuchFileOrDirectory }
                var child = items[index]
                try child.modify(at: path.dropFirst(), position: position, change)
                items[index] = child
            }
            self = .array(items)
        default:
            throw .notDirectory
        }
    }

    /// The position of the dictionary key `path` names in its dictionary.
    public func position(of path: [String]) -> Int? {
        guard let last = path.last, case .dictionary(let dictionary)? = value(at: path.dropLast()[...]) else { return nil }
        return dictionary.index(of: last)
    }
}

/// Helpers on the names of a key path: array indices and prefixes.
///
/// Thread-safety: pure functions.
public enum PlistPath {
    /// The array index a name stands for: canonical decimal only ("0", "12"; not "012", "-1").
    public static func arrayIndex(_ name: String) -> Int? {
        guard name == "0" || (!name.hasPrefix("0") && !name.hasPrefix("-") && !name.hasPrefix("+")) else { return nil }
        return Int(name)
    }

    /// Whether `path` is `prefix` or lies below it.
    public static func isWithin(_ path: [String], _ prefix: [String]) -> Bool {
        path.count >= prefix.count && Array(path.prefix(prefix.count)) == prefix
    }
}
