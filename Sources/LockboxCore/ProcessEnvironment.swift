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

    /// The first variable Lockbox reads (`HOME`, the XDG base directories, every `LOCKBOX_*`)
    /// whose value is not UTF-8 text, if any. Swift reads such a value with its invalid bytes
    /// as U+FFFD, so two different keychain paths would name one file: programs refuse to run
    /// with one, naming the variable, never its value.
    package static func firstVariableNotUTF8() -> String? {
        let read: Set<String> = ["HOME", "XDG_DATA_HOME", "XDG_STATE_HOME", "XDG_CONFIG_HOME", "XDG_RUNTIME_DIR", "XDG_CACHE_HOME"]
        var entry = environ
        while let pointer = entry.pointee {
            defer { entry += 1 }
            guard String(validatingCString: pointer) == nil else { continue }
            // The name (up to '=') is shown only when it is text itself.
            let bytes = UnsafeBufferPointer(start: UnsafeRawPointer(pointer).assumingMemoryBound(to: UInt8.self), count: strlen(pointer))
            let name = bytes.firstIndex(of: UInt8(ascii: "=")).map { Array(bytes[..<$0]) } ?? Array(bytes)
            guard let text = String(validating: name, as: UTF8.self) else { continue }
            if read.contains(text) || text.hasPrefix("LOCKBOX_") { return text }
        }
        return nil
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
