#if canImport(Glibc)
import Glibc
#endif

/// One environment variable at a time, straight from `getenv`. `ProcessInfo.environment` copies
/// the whole environment into a dictionary on every call, which a command-line process that
/// reads one secret and exits pays for on each lookup.
package enum ProcessEnvironment {
    /// The variable's value; nil when it is unset.
    package static func value(_ name: String) -> String? {
        guard let value = getenv(name) else { return nil }
        return String(cString: value)
    }

    /// The variable's value; nil when it is unset or empty.
    package static func nonEmpty(_ name: String) -> String? {
        guard let value = value(name), !value.isEmpty else { return nil }
        return value
    }

    /// `$HOME`, else the home directory in the password database.
    package static var home: String {
        if let home = nonEmpty("HOME") { return home }
        if let entry = getpwuid(getuid()), let directory = entry.pointee.pw_dir {
            return String(cString: directory)
        }
        return "/"
    }
}

extension [UInt8] {
    /// Lower-case hexadecimal, two digits a byte.
    package var hexString: String {
        let digits: StaticString = "0123456789abcdef"
        return String(unsafeUninitializedCapacity: count * 2) { buffer in
            digits.withUTF8Buffer { digits in
                for (index, byte) in enumerated() {
                    buffer[2 * index] = digits[Int(byte >> 4)]
                    buffer[2 * index + 1] = digits[Int(byte & 0x0f)]
                }
            }
            return count * 2
        }
    }
}
