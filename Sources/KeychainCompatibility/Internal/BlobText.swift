#if !canImport(Darwin)
import Foundation

/// An account or service given as `Data`, kept in the vault's text attribute so that it comes
/// back as `Data` and never equals a string of the same bytes (as on iOS, where the attribute is
/// a blob column and SQLite compares text and blobs as different values).
///
/// The stored text is a NUL, `data:`, and the bytes in base64. A string that itself starts with
/// a NUL (which a `CFString` may) is stored as a NUL, `text:`, and its UTF-8 in base64, so that
/// no string, however crafted, is stored as the text of a `Data` value or of another string:
/// strings and `Data` stay distinct values both ways. Other Lockbox tools show the stored text.
enum BlobText {
    static let marker = "\u{0}data:"
    static let textMarker = "\u{0}text:"

    static func encode(_ data: Data) -> String { marker + data.base64EncodedString() }

    /// The stored text of an account or service given as a string.
    static func encode(string: String) -> String {
        string.hasPrefix("\u{0}") ? textMarker + Data(string.utf8).base64EncodedString() : string
    }

    /// What ``encode(_:)`` or ``encode(string:)`` stored: `Data` or a `String`; text stored
    /// otherwise (by another Lockbox tool) is returned as it is.
    static func decode(_ text: String) -> Any {
        if text.hasPrefix(marker), let data = Data(base64Encoded: String(text.dropFirst(marker.count))) {
            return data
        }
        if text.hasPrefix(textMarker), let bytes = Data(base64Encoded: String(text.dropFirst(textMarker.count))),
            let string = String(bytes: bytes, encoding: .utf8), string.hasPrefix("\u{0}")
        {
            return string
        }
        return text
    }
}
#endif
