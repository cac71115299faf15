/// Text that came from a server or a store, made safe to print on a terminal.
///
/// A hostile authorization server controls the user code, the verification URIs and its error
/// codes; printed raw, escape sequences in them could rewrite the screen, set the window title,
/// or hide text. Lockbox refuses such values where it can (``DeviceAuthorizationFlow`` rejects a
/// user code or URI that is not ``isPrintable(_:)``) and sanitises everything else it prints.
public enum TerminalText {
    /// `text` with every control, format and line-separator character (C0 and C1 controls, DEL,
    /// ESC, bidirectional overrides, zero-width characters, U+2028/2029) replaced by U+FFFD.
    public static func sanitized(_ text: String) -> String {
        var result = String.UnicodeScalarView()
        for scalar in text.unicodeScalars {
            result.append(isUnsafe(scalar) ? "\u{FFFD}" : scalar)
        }
        return String(result)
    }

    /// Whether `text` holds no character that ``sanitized(_:)`` would replace.
    public static func isPrintable(_ text: String) -> Bool {
        !text.unicodeScalars.contains(where: isUnsafe)
    }

    private static func isUnsafe(_ scalar: Unicode.Scalar) -> Bool {
        switch scalar.properties.generalCategory {
        case .control, .format, .lineSeparator, .paragraphSeparator, .surrogate, .privateUse, .unassigned: true
        default: false
        }
    }
}
