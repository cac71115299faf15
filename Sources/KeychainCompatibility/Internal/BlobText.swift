#if !canImport(Darwin)
import Foundation

/// An account or service given as `Data`, kept in the vault's text attribute so that it comes
/// back as `Data` and never equals a string of the same bytes (as on iOS, where the attribute is
/// a blob column and SQLite compares text and blobs as different values).
///
/// The stored text is a NUL, `data:`, and the bytes in base64: no account typed as a string
/// starts with a NUL. Other Lockbox tools show it as such.
enum BlobText {
    static let marker = "\u{0}data:"

    static func encode(_ data: Data) -> String { marker + data.base64EncodedString() }

    static func decode(_ text: String) -> Data? {
        guard text.hasPrefix(marker) else { return nil }
        return Data(base64Encoded: String(text.dropFirst(marker.count)))
    }
}
#endif
