/// ISO 8601 date-times as Unix seconds, shared by the stores that accept them:
/// `YYYY-MM-DDTHH:MM:SS[.fraction](Z|±HH:MM|±HHMM)`, years 1 to 9999, proleptic Gregorian.
///
/// Thread-safety: pure functions.
public enum ISO8601 {
    /// Unix seconds of the text, or nil when it is not that form or out of range.
    public static func unixSeconds(_ text: String) -> Double? {
        let chars = Array(text.utf8)
        func number(_ from: Int, _ count: Int) -> Int64? {
            guard from + count <= chars.count else { return nil }
            var value: Int64 = 0
            for c in chars[from..<from + count] {
                guard c >= 0x30 && c <= 0x39 else { return nil }
                value = value * 10 + Int64(c - 0x30)
            }
            return value
        }
        guard chars.count >= 20, let year = number(0, 4), chars[4] == UInt8(ascii: "-"), let month = number(5, 2),
              chars[7] == UInt8(ascii: "-"), let day = number(8, 2), chars[10] == UInt8(ascii: "T") || chars[10] == UInt8(ascii: "t"),
              let hour = number(11, 2), chars[13] == UInt8(ascii: ":"), let minute = number(14, 2),
              chars[16] == UInt8(ascii: ":"), let second = number(17, 2) else { return nil }
        guard year >= 1, (1...12).contains(month), day >= 1, day <= daysIn(month: month, year: year),
              hour < 24, minute < 60, second < 61 else { return nil }
        var index = 19
        var fraction = 0.0
        if index < chars.count && chars[index] == UInt8(ascii: ".") {
            index += 1
            var scale = 0.1
            let start = index
            while index < chars.count, chars[index] >= 0x30 && chars[index] <= 0x39 {
                fraction += Double(chars[index] - 0x30) * scale
                scale /= 10
                index += 1
            }
            guard index > start else { return nil }
        }
        guard index < chars.count else { return nil }
        var offsetSeconds: Int64 = 0
        if chars[index] == UInt8(ascii: "Z") || chars[index] == UInt8(ascii: "z") {
            index += 1
        } else if chars[index] == UInt8(ascii: "+") || chars[index] == UInt8(ascii: "-") {
            let sign: Int64 = chars[index] == UInt8(ascii: "-") ? -1 : 1
            index += 1
            guard let offsetHours = number(index, 2) else { return nil }
            index += 2
            if index < chars.count && chars[index] == UInt8(ascii: ":") { index += 1 }
            guard let offsetMinutes = number(index, 2), offsetHours < 24, offsetMinutes < 60 else { return nil }
            index += 2
            offsetSeconds = sign * (offsetHours * 3600 + offsetMinutes * 60)
        } else {
            return nil
        }
        guard index == chars.count else { return nil }
        let unix = days(fromCivil: year, month, day) * 86_400 + hour * 3600 + minute * 60 + second - offsetSeconds
        let result = Double(unix) + fraction
        return result >= earliest && result < latest + 1 ? result : nil
    }

    /// `YYYY-MM-DDTHH:MM:SSZ` of Unix seconds (clamped to years 1 to 9999).
    public static func text(unixSeconds: Double) -> String {
        let clamped = unixSeconds.isNaN ? 0 : min(max(unixSeconds, earliest), latest)
        let unix = Int64(clamped.rounded(.down))
        let days = unix >= 0 ? unix / 86_400 : (unix - 86_399) / 86_400
        let secondOfDay = unix - days * 86_400
        let (year, month, day) = civil(fromDays: days)
        func two(_ n: Int64) -> String { n < 10 ? "0\(n)" : "\(n)" }
        var yearText = String(year)
        while yearText.count < 4 { yearText = "0" + yearText }
        return "\(yearText)-\(two(month))-\(two(day))T\(two(secondOfDay / 3600)):\(two(secondOfDay / 60 % 60)):\(two(secondOfDay % 60))Z"
    }

    /// 0001-01-01T00:00:00Z and 9999-12-31T23:59:59Z.
    public static let earliest = Double(days(fromCivil: 1, 1, 1) * 86_400)
    public static let latest = Double(days(fromCivil: 9999, 12, 31) * 86_400 + 86_399)

    static func daysIn(month: Int64, year: Int64) -> Int64 {
        switch month {
        case 2: return (year % 4 == 0 && year % 100 != 0) || year % 400 == 0 ? 29 : 28
        case 4, 6, 9, 11: return 30
        default: return 31
        }
    }

    /// Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's algorithm).
    static func days(fromCivil year: Int64, _ month: Int64, _ day: Int64) -> Int64 {
        let y = month <= 2 ? year - 1 : year
        let era = (y >= 0 ? y : y - 399) / 400
        let yearOfEra = y - era * 400
        let dayOfYear = (153 * (month + (month > 2 ? -3 : 9)) + 2) / 5 + day - 1
        let dayOfEra = yearOfEra * 365 + yearOfEra / 4 - yearOfEra / 100 + dayOfYear
        return era * 146_097 + dayOfEra - 719_468
    }

    static func civil(fromDays days: Int64) -> (Int64, Int64, Int64) {
        let z = days + 719_468
        let era = (z >= 0 ? z : z - 146_096) / 146_097
        let dayOfEra = z - era * 146_097
        let yearOfEra = (dayOfEra - dayOfEra / 1460 + dayOfEra / 36_524 - dayOfEra / 146_096) / 365
        let dayOfYear = dayOfEra - (365 * yearOfEra + yearOfEra / 4 - yearOfEra / 100)
        let mp = (5 * dayOfYear + 2) / 153
        let day = dayOfYear - (153 * mp + 2) / 5 + 1
        let month = mp < 10 ? mp + 3 : mp - 9
        return (yearOfEra + era * 400 + (month <= 2 ? 1 : 0), month, day)
    }
}
