import LockboxCore

/// The policy file's grammar (see `BrokerPolicy`): sections, `key = value` lines, comments.
enum PolicyParser {
    static func parse(_ text: String, path: String) throws(LockboxError) -> BrokerPolicy {
        var entries: [BrokerPolicy.Entry] = []
        var lockboxExecutables: [String]?
        enum Section { case none, entry(Int), lockbox }
        var section = Section.none

        func malformed(_ number: Int, _ what: String) -> LockboxError {
            LockboxError(.param, "\(path), line \(number): \(what) The file's format is described in docs/BROKER.md.")
        }

        for (index, rawLine) in text.split(separator: "\n", omittingEmptySubsequences: false).enumerated() {
            let number = index + 1
            let line = rawLine.hasSuffix("\r") ? rawLine.dropLast().trimmingWhitespace : rawLine.trimmingWhitespace
            if line.isEmpty || line.hasPrefix("#") || line.hasPrefix(";") { continue }
            if line.utf8.contains(where: { $0 < 0x20 && $0 != 0x09 }) {
                throw malformed(number, "control characters are not allowed.")
            }

            if line.hasPrefix("[") {
                guard line.hasSuffix("]") else { throw malformed(number, "a section header ends with ].") }
                let header = line.dropFirst().dropLast().trimmingWhitespace
                if header == "lockbox" {
                    guard lockboxExecutables == nil else { throw malformed(number, "[lockbox] appears twice.") }
                    lockboxExecutables = []
                    section = .lockbox
                    continue
                }
                guard let space = header.firstIndex(where: { $0 == " " || $0 == "\t" }) else {
                    throw malformed(number, "a section is [app ID], [unit NAME.service], [executable /PATH] or [lockbox].")
                }
                let kind = header[..<space]
                let name = header[space...].trimmingWhitespace
                let identity: PeerIdentity.Kind
                switch kind {
                case "app":
                    guard FlatpakInfo.isAppID(name) else { throw malformed(number, "\"\(name)\" is not a Flatpak app id.") }
                    identity = .flatpak(appID: String(name))
                case "unit":
                    guard name.hasSuffix(".service"), SystemdCgroup.isUnitName(name) else {
                        throw malformed(number, "\"\(name)\" is not a systemd service name (NAME.service).")
                    }
                    identity = .systemdUnit(String(name))
                case "executable":
                    guard name.hasPrefix("/") else { throw malformed(number, "an executable is named by its absolute path.") }
                    identity = .executable(path: String(name))
                default:
                    throw malformed(number, "a section is [app ID], [unit NAME.service], [executable /PATH] or [lockbox].")
                }
                guard !entries.contains(where: { $0.identity == identity }) else {
                    throw malformed(number, "\(BrokerPolicy.sectionHeader(for: identity)) appears twice.")
                }
                entries.append(BrokerPolicy.Entry(identity: identity, accessGroups: []))
                section = .entry(entries.count - 1)
                continue
            }

            guard let equals = line.firstIndex(of: "=") else { throw malformed(number, "expected key = value.") }
            let key = line[..<equals].trimmingWhitespace
            let value = line[line.index(after: equals)...].trimmingWhitespace
            switch (section, key) {
            case (.none, _):
                throw malformed(number, "\(key) is outside any section.")
            case (.entry(let entry), "access-groups"):
                let groups = value.split(whereSeparator: { $0 == "," || $0 == " " || $0 == "\t" })
                guard !groups.isEmpty else { throw malformed(number, "access-groups names no group.") }
                for group in groups {
                    guard group.utf8.count <= 255 else { throw malformed(number, "an access group name is at most 255 bytes.") }
                    if !entries[entry].accessGroups.contains(String(group)) { entries[entry].accessGroups.append(String(group)) }
                }
            case (.entry(let entry), "executable-sha256"):
                let digest = value.lowercased()
                guard digest.utf8.count == 64, digest.utf8.allSatisfy({ ($0 >= 0x30 && $0 <= 0x39) || ($0 >= 0x61 && $0 <= 0x66) }) else {
                    throw malformed(number, "executable-sha256 is 64 hexadecimal digits (sha256sum prints them).")
                }
                guard entries[entry].executableSHA256 == nil else { throw malformed(number, "executable-sha256 appears twice.") }
                entries[entry].executableSHA256 = digest
            case (.lockbox, "executable"):
                guard value.hasPrefix("/") else { throw malformed(number, "an executable is named by its absolute path.") }
                lockboxExecutables?.append(String(value))
            default:
                throw malformed(number, "\(key) is not a key of this section (access-groups, executable-sha256; in [lockbox]: executable).")
            }
        }
        return BrokerPolicy(entries: entries, lockboxExecutables: lockboxExecutables ?? BrokerPolicy.defaultLockboxExecutables, path: path)
    }
}
