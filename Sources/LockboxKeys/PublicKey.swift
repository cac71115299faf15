import FoundationEssentials
import KeyCrypto
import LockboxCore
import VaultCrypto

/// The public half of a P-256, Ed25519 or X25519 key: checked when made, exported in the
/// encodings other tools read, and able to verify signatures on its own.
///
/// ```swift
/// let theirs = try PublicKey(pemRepresentation: pem)
/// guard try theirs.isValidSignature(signature, for: message) else { throw ... }
/// ```
public struct PublicKey: Sendable, Hashable, CustomStringConvertible {
    public let algorithm: KeyAlgorithm
    /// The X9.63 uncompressed point `04 || X || Y` for P-256 (what Apple's
    /// `SecKeyCopyExternalRepresentation` gives for a public EC key); the 32 raw bytes for
    /// Ed25519 and X25519.
    public let rawRepresentation: Data

    /// A public key from its raw form (see ``rawRepresentation``).
    /// - Throws: `param` when the bytes are not a valid key of that algorithm.
    public init(rawRepresentation: Data, algorithm: KeyAlgorithm) throws(LockboxError) {
        let bytes = Array(rawRepresentation)
        switch algorithm {
        case .p256:
            guard P256.isValidPublicKey(bytes) else {
                throw LockboxError(
                    .param, "The P-256 public key is malformed: expected an X9.63 uncompressed point (65 bytes, 04 || X || Y) on the curve.")
            }
        case .ed25519, .x25519:
            guard bytes.count == Curve25519.publicKeyByteCount else {
                throw LockboxError(.param, "The \(algorithm) public key is malformed: expected 32 bytes, got \(bytes.count).")
            }
        case .aes256GCM:
            throw LockboxError(.param, "AES-256-GCM keys are symmetric and have no public key.")
        }
        self.algorithm = algorithm
        self.rawRepresentation = Data(bytes)
    }

    /// A P-256 public key from the X9.63 uncompressed point Apple exports.
    public init(x963Representation: Data) throws(LockboxError) {
        try self.init(rawRepresentation: x963Representation, algorithm: .p256)
    }

    /// A public key from DER `SubjectPublicKeyInfo` (RFC 5280), as `openssl pkey -pubout
    /// -outform DER` writes it.
    public init(derRepresentation: Data) throws(LockboxError) {
        let bytes = Array(derRepresentation)
        for algorithm in [KeyAlgorithm.p256, .ed25519, .x25519] {
            let prefix = SubjectPublicKeyInfo.prefix(for: algorithm)
            if bytes.count == prefix.count + algorithm.publicKeyByteCount, bytes.starts(with: prefix) {
                try self.init(rawRepresentation: Data(bytes[prefix.count...]), algorithm: algorithm)
                return
            }
        }
        throw LockboxError(
            .param,
            "The public key is not a DER SubjectPublicKeyInfo of a P-256 (uncompressed point), Ed25519 or X25519 key.")
    }

    /// A public key from PEM (`-----BEGIN PUBLIC KEY-----`).
    public init(pemRepresentation: String) throws(LockboxError) {
        guard let der = PEM.decode(pemRepresentation, label: "PUBLIC KEY") else {
            throw LockboxError(.param, "The text is not a PEM public key (-----BEGIN PUBLIC KEY----- ... -----END PUBLIC KEY-----).")
        }
        try self.init(derRepresentation: Data(der))
    }

    /// DER `SubjectPublicKeyInfo`.
    public var derRepresentation: Data {
        Data(SubjectPublicKeyInfo.prefix(for: algorithm) + Array(rawRepresentation))
    }

    /// PEM `SubjectPublicKeyInfo`, as OpenSSL and Python `cryptography` read it.
    public var pemRepresentation: String {
        PEM.encode(Array(derRepresentation), label: "PUBLIC KEY")
    }

    /// The key as one line of `authorized_keys` (`ecdsa-sha2-nistp256 AAAA... comment`,
    /// `ssh-ed25519 AAAA... comment`), RFC 5656 and RFC 8709.
    /// - Throws: `param` for X25519, which SSH has no public key format for.
    public func openSSHRepresentation(comment: String? = nil) throws(LockboxError) -> String {
        var blob: [UInt8] = []
        let name: String
        switch algorithm {
        case .p256:
            name = "ecdsa-sha2-nistp256"
            SSHEncoding.appendString(Array(name.utf8), to: &blob)
            SSHEncoding.appendString(Array("nistp256".utf8), to: &blob)
        case .ed25519:
            name = "ssh-ed25519"
            SSHEncoding.appendString(Array(name.utf8), to: &blob)
        case .x25519, .aes256GCM:
            throw LockboxError(.param, "SSH has no public key format for \(algorithm) keys; only P-256 and Ed25519 keys have one.")
        }
        SSHEncoding.appendString(Array(rawRepresentation), to: &blob)
        var line = name + " " + Data(blob).base64EncodedString()
        // One line whatever the label holds (``PrintableText``): a newline in it would add a line
        // to an `authorized_keys` file this is pasted into.
        if let comment, !comment.isEmpty { line += " " + PrintableText.oneLine(comment) }
        return line
    }

    /// OpenSSH's fingerprint of the key (`ssh-keygen -l`): `SHA256:` and the base64 of the
    /// SHA-256 of its public key blob, without padding. Nil for keys SSH has no format for.
    public var openSSHFingerprint: String? {
        guard let line = try? openSSHRepresentation(), let encoded = line.split(separator: " ").dropFirst().first,
            let blob = Data(base64Encoded: String(encoded))
        else { return nil }
        let digest = Data(MessageDigest.sha256(Array(blob))).base64EncodedString()
        return "SHA256:" + digest.prefix(while: { $0 != "=" })
    }

    /// Whether `signature` is a valid signature of `message` by this key: ECDSA P-256 with
    /// SHA-256 (DER) or Ed25519.
    /// - Throws: `param` when the signature cannot be one of this algorithm (wrong length or not
    ///   DER), or the key is an X25519 key, which cannot verify.
    public func isValidSignature(_ signature: Data, for message: Data) throws(LockboxError) -> Bool {
        let signature = Array(signature)
        switch algorithm {
        case .p256:
            // DER: SEQUENCE of two INTEGERs of at most 33 bytes each.
            guard signature.count >= 8, signature.count <= 72, signature[0] == 0x30 else {
                throw LockboxError(
                    .param, "The signature is not a DER ECDSA signature (8 to 72 bytes, starting with 30); got \(signature.count) bytes.")
            }
            return try P256.isValidSignature(signature, for: Array(message), publicKey: Array(rawRepresentation))
        case .ed25519:
            guard signature.count == Curve25519.signatureByteCount else {
                throw LockboxError(.param, "An Ed25519 signature is 64 bytes; got \(signature.count).")
            }
            return Curve25519.isValidSignature(signature, for: Array(message), publicKey: Array(rawRepresentation))
        case .x25519, .aes256GCM:
            throw LockboxError(.keyUsageIncorrect, "An \(algorithm) key cannot verify signatures; use a P-256 or Ed25519 key.")
        }
    }

    public var description: String { "PublicKey(\(algorithm), \(rawRepresentation.count) bytes)" }
}

extension KeyAlgorithm {
    var publicKeyByteCount: Int {
        switch self {
        case .p256: P256.publicKeyByteCount
        case .ed25519, .x25519: Curve25519.publicKeyByteCount
        case .aes256GCM: 0
        }
    }
}
