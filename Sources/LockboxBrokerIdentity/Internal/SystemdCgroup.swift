/// The systemd user unit a process belongs to, read from `/proc/PID/cgroup`.
package enum SystemdCgroup {
    /// The service of `uid`'s user manager that the cgroup file places the process in; nil for a
    /// process outside the user manager, in a scope, or in the manager itself.
    ///
    /// The unified hierarchy's line (`0::PATH`) is read; on a legacy or hybrid layout whose
    /// unified line is empty, systemd's named hierarchy (`N:name=systemd:PATH`). In the path,
    /// the unit is the first component after `user@UID.service` that is not a slice; only a
    /// `.service` counts. A scope is made by whoever starts a process (a terminal, a desktop
    /// launcher, `systemd-run --scope`) to group what it already runs, so it tells nothing
    /// about the program.
    package static func userService(cgroupFile text: String, uid: UInt32) -> String? {
        var unified: String?
        var named: String?
        for line in text.split(separator: "\n") {
            let fields = line.split(separator: ":", maxSplits: 2, omittingEmptySubsequences: false)
            guard fields.count == 3 else { continue }
            if fields[0] == "0" && fields[1].isEmpty {
                unified = String(fields[2])
            } else if fields[1] == "name=systemd" {
                named = String(fields[2])
            }
        }
        let path = (unified.flatMap { $0 == "/" ? nil : $0 }) ?? named
        guard let path else { return nil }
        let components = path.split(separator: "/")
        guard let manager = components.firstIndex(where: { $0 == "user@\(uid).service" }) else { return nil }
        guard let unit = components[(manager + 1)...].first(where: { !$0.hasSuffix(".slice") }) else { return nil }
        guard unit.hasSuffix(".service"), isUnitName(unit) else { return nil }
        return String(unit)
    }

    /// systemd's unit-name characters: ASCII letters, digits, `:-_.\@`, at most 255 bytes.
    static func isUnitName(_ name: Substring) -> Bool {
        !name.isEmpty && name.utf8.count <= 255
            && name.utf8.allSatisfy { byte in
                (byte >= 0x30 && byte <= 0x39) || (byte >= 0x41 && byte <= 0x5a) || (byte >= 0x61 && byte <= 0x7a)
                    || ":-_.\\@".utf8.contains(byte)
            }
    }
}

/// A Flatpak sandbox's `/.flatpak-info` (a key file written by `flatpak run`).
package enum FlatpakInfo {
    /// The `name` key of the `[Application]` group; nil when the file has no such key or the
    /// value is not a valid app id (a runtime run directly names no application).
    package static func appID(keyFile text: String) -> String? {
        var group = ""
        for rawLine in text.split(whereSeparator: { $0 == "\n" || $0 == "\r\n" }) {
            let line = rawLine.trimmingWhitespace
            if line.isEmpty || line.hasPrefix("#") { continue }
            if line.hasPrefix("[") && line.hasSuffix("]") {
                group = String(line.dropFirst().dropLast())
                continue
            }
            guard group == "Application", let equals = line.firstIndex(of: "=") else { continue }
            if line[..<equals].trimmingWhitespace == "name" {
                let value = line[line.index(after: equals)...].trimmingWhitespace
                return isAppID(value) ? String(value) : nil
            }
        }
        return nil
    }

    /// Flatpak's rule: at most 255 bytes, at least two dot-separated elements, each of ASCII
    /// letters, digits, `_` and `-` (`-` only in the last), none starting with a digit.
    static func isAppID(_ name: Substring) -> Bool {
        guard !name.isEmpty, name.utf8.count <= 255 else { return false }
        let elements = name.split(separator: ".", omittingEmptySubsequences: false)
        guard elements.count >= 2 else { return false }
        for (index, element) in elements.enumerated() {
            guard let first = element.utf8.first, !(first >= 0x30 && first <= 0x39) else { return false }
            let isLast = index == elements.count - 1
            let valid = element.utf8.allSatisfy { byte in
                (byte >= 0x30 && byte <= 0x39) || (byte >= 0x41 && byte <= 0x5a) || (byte >= 0x61 && byte <= 0x7a)
                    || byte == UInt8(ascii: "_") || (isLast && byte == UInt8(ascii: "-"))
            }
            if !valid { return false }
        }
        return true
    }
}

extension StringProtocol {
    /// Without leading and trailing spaces and tabs.
    var trimmingWhitespace: Substring {
        let text = Substring(self)
        guard let start = text.firstIndex(where: { $0 != " " && $0 != "\t" }) else { return "" }
        let end = text.lastIndex(where: { $0 != " " && $0 != "\t" })!
        return text[start...end]
    }
}
