/// Text from a keychain item (a label, a service, an SSH key's comment) made safe to print on
/// one line of a terminal or of a file such as `authorized_keys`.
package enum PrintableText {
    /// Whether `scalar` must not reach a terminal or a line-based file as it is: the C0 and C1
    /// controls (a newline, a carriage return, an escape, CSI), the line and paragraph
    /// separators, and the bidirectional controls, which reorder what follows them on screen
    /// (a right-to-left override can make a fingerprint read backwards).
    package static func isControl(_ scalar: Unicode.Scalar) -> Bool {
        switch scalar.value {
        case 0..<0x20, 0x7F...0x9F, 0x2028, 0x2029, 0x200E, 0x200F, 0x202A...0x202E, 0x2066...0x2069: true
        default: false
        }
    }

    /// `text` with each such character written as `\xNN` (up to U+00FF) or `\u{NNNN}`.
    package static func oneLine(_ text: String) -> String {
        guard text.unicodeScalars.contains(where: isControl) else { return text }
        var written = ""
        for scalar in text.unicodeScalars {
            guard isControl(scalar) else {
                written.unicodeScalars.append(scalar)
                continue
            }
            let hex = String(scalar.value, radix: 16, uppercase: true)
            written += scalar.value <= 0xFF ? "\\x" + (hex.count == 1 ? "0" : "") + hex : "\\u{" + hex + "}"
        }
        return written
    }
}
