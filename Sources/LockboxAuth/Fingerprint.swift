import LockboxCore

/// A short, non-reversible name for a token, for logs and events: the first 8 hex digits of its
/// SHA-256 digest. Enough to tell two tokens apart and to match a client's event to a server's
/// log line (the test server prints the same value); 32 bits of a digest of a high-entropy
/// token reveal nothing usable about it.
public enum TokenFingerprint {
    /// The fingerprint of `token`, e.g. `"3fa91c07"`.
    public static func of(_ token: SecretBytes) -> String {
        token.withUnsafeBytes { Array(SHA256.hash($0).prefix(4)).hexString }
    }
}
