import FoundationEssentials
import KeyCrypto
import LockboxCore
import VaultCrypto

/// A key stored in a ``SoftwareKeyStore``: its public description, and the operations its
/// purposes allow. The private bytes are read from the vault for each operation, used, and
/// wiped; a non-extractable key's bytes are never handed out.
///
/// Every operation that needs the private key takes an optional ``AuthenticationContext``:
/// an access-controlled key asks the user through it (nil uses the vault's configured one).
public struct ManagedKey: Sendable, CustomStringConvertible {
    public let algorithm: KeyAlgorithm
    public let purposes: KeyPurposes
    public let label: String?
    public let applicationTag: Data?
    /// `kSecAttrApplicationLabel`: the SHA-1 of the public key (Apple's convention), random
    /// bytes for a symmetric key.
    public let applicationLabel: Data
    public let accessibility: Accessibility
    public let accessControl: AccessControl?
    public let isExtractable: Bool
    public let isInvalidatedByPassphraseChange: Bool
    /// `kSecAttrSynchronizable`: the key travels to the keychain's sync groups (LockboxSync).
    public let isSynchronizable: Bool
    /// Where the private key lives: ``KeyToken/hardware`` for a key made inside the TPM.
    public let token: KeyToken
    /// The public half; nil for an AES key.
    public let publicKey: PublicKey?
    /// `kSecValuePersistentRef` of the key's item.
    public let persistentReference: Data

    let descriptor: KeyDescriptor
    let accessGroup: String?
    let store: SoftwareKeyStore

    init?(_ item: Item, store: SoftwareKeyStore) {
        guard item.itemClass == .key, let descriptor = KeyDescriptor(item.attributes.generic),
            let reference = item.persistentReference, let applicationLabel = item.attributes.applicationLabel
        else { return nil }
        guard let publicKey = descriptor.publicHalf else { return nil }
        self.publicKey = publicKey
        self.descriptor = descriptor
        algorithm = descriptor.algorithm
        purposes = descriptor.purposes
        label = item.attributes.label
        applicationTag = item.attributes.applicationTag
        self.applicationLabel = applicationLabel
        accessibility = item.attributes.accessibility ?? .default
        accessControl = item.accessControl
        isExtractable = !descriptor.flags.contains(.nonExtractable)
        isInvalidatedByPassphraseChange = descriptor.flags.contains(.invalidatedByPassphraseChange)
        isSynchronizable = item.attributes.synchronizable == true
        token = descriptor.flags.contains(.hardware) ? .hardware : .software
        persistentReference = reference
        accessGroup = item.attributes.accessGroup
        self.store = store
    }

    // MARK: Operations

    /// Signs `message`: ECDSA P-256 with SHA-256 (a DER signature, Apple's
    /// `.ecdsaSignatureMessageX962SHA256`) or Ed25519 (64 bytes).
    /// - Throws: `keyUsageIncorrect` without the `sign` purpose; `invalidKeyRef` for a key
    ///   invalidated by a passphrase change; `interactionNotAllowed` when locked; for a
    ///   hardware key, `notAvailable` when the TPM cannot be reached and `invalidKeyRef` when
    ///   this TPM cannot load it (another machine's key, or the TPM was cleared).
    public func sign(_ message: Data, context: AuthenticationContext? = nil) throws(LockboxError) -> Data {
        let opened = try store.openedKey(of: self, for: .sign, context: context)
        let secret = opened.secret
        if token == .hardware {
            let blob = secret.withUnsafeBytes { Array($0) }
            let (r, s) = try store.tpm.sign(digest: MessageDigest.sha256(Array(message)), blob: blob)
            return Data(ECDSASignature.der(r: r, s: s))
        }
        switch algorithm {
        case .p256:
            guard let held = opened.p256 else { preconditionFailure("a P-256 signing key is imported when opened") }
            return Data(try held.sign(Array(message)))
        case .ed25519:
            return Data(Curve25519.sign(Array(message), secretKey: secret))
        case .x25519, .aes256GCM:
            preconditionFailure("a \(algorithm) key cannot have the sign purpose")
        }
    }

    /// Whether `signature` is this key's valid signature of `message`. Needs no private key
    /// and no user verification.
    /// - Throws: `keyUsageIncorrect` without the `verify` purpose; `param` for a signature
    ///   that cannot be one (wrong length, not DER).
    public func isValidSignature(_ signature: Data, for message: Data) throws(LockboxError) -> Bool {
        try require(.verify)
        guard let publicKey else { preconditionFailure("a key with the verify purpose has a public key") }
        return try publicKey.isValidSignature(signature, for: message)
    }

    /// Encrypts `plaintext` with AES-256-GCM under a random nonce made here.
    /// - Returns: `nonce (12) || ciphertext || tag (16)`, CryptoKit's `AES.GCM.SealedBox.combined`.
    /// - Throws: `keyUsageIncorrect` without the `encrypt` purpose.
    public func encrypt(_ plaintext: SecretBytes, authenticating associatedData: Data = Data(), context: AuthenticationContext? = nil)
        throws(LockboxError) -> Data
    {
        let key = try store.privateKey(of: self, for: .encrypt, context: context)
        return try plaintext.withUnsafeBytes { (bytes) throws(LockboxError) in
            Data(try AESGCM.seal(bytes, key: key, authenticating: Array(associatedData)))
        }
    }

    /// Encrypts plain `Data` (see ``encrypt(_:authenticating:context:)-(SecretBytes,_,_)``).
    public func encrypt(_ plaintext: Data, authenticating associatedData: Data = Data(), context: AuthenticationContext? = nil)
        throws(LockboxError) -> Data
    {
        try encrypt(SecretBytes(copying: plaintext), authenticating: associatedData, context: context)
    }

    /// Opens a box made by ``encrypt(_:authenticating:context:)-(SecretBytes,_,_)`` (or by CryptoKit's `AES.GCM`).
    /// - Throws: `keyUsageIncorrect` without the `decrypt` purpose; `decode` for any box that
    ///   fails authentication (one opaque error).
    public func decrypt(_ box: Data, authenticating associatedData: Data = Data(), context: AuthenticationContext? = nil)
        throws(LockboxError) -> SecretBytes
    {
        let key = try store.privateKey(of: self, for: .decrypt, context: context)
        return try AESGCM.open(Array(box), key: key, authenticating: Array(associatedData))
    }

    /// The raw shared secret with `peer` (ECDH P-256: the X coordinate; X25519: RFC 7748).
    /// Feed it to a KDF (HKDF) before using it as a key.
    /// - Throws: `keyUsageIncorrect` without the `keyAgreement` purpose; `param` when `peer`
    ///   is another algorithm's key or a low-order point.
    public func sharedSecret(with peer: PublicKey, context: AuthenticationContext? = nil) throws(LockboxError) -> SecretBytes {
        try require(.keyAgreement)
        guard peer.algorithm == algorithm else {
            throw LockboxError(.param, "The peer's key is a \(peer.algorithm) key; key agreement with a \(algorithm) key needs a \(algorithm) public key.")
        }
        let secret = try store.privateKey(of: self, for: .keyAgreement, context: context)
        switch algorithm {
        case .p256:
            return try P256.sharedSecret(privateRepresentation: secret, peerPublicKey: Array(peer.rawRepresentation))
        case .x25519:
            return try Curve25519.sharedSecret(secretKey: secret, peerPublicKey: Array(peer.rawRepresentation))
        case .ed25519, .aes256GCM:
            preconditionFailure("a \(algorithm) key cannot have the keyAgreement purpose")
        }
    }

    /// Deletes the key from the keychain.
    public func delete(context: AuthenticationContext? = nil) throws(LockboxError) {
        try store.delete(self, context: context)
    }

    public var description: String {
        "ManagedKey(\(algorithm), purposes: \(purposes), label: \(label ?? "-"), extractable: \(isExtractable), token: \(token))"
    }

    // MARK: Internals

    func require(_ purpose: KeyPurposes) throws(LockboxError) {
        guard purposes.contains(purpose) else {
            throw LockboxError(
                .keyUsageIncorrect,
                "This \(algorithm) key was made for \(purposes), not \(purpose). Make a key with that purpose instead.")
        }
    }

    func itemQuery(returning: Query.ReturnOptions, context: AuthenticationContext?) -> Query {
        // The reference names one item, synchronizable or not.
        var query = Query(.key, returning: returning, synchronizable: .any)
        query.persistentReference = persistentReference
        query.attributes.accessGroup = accessGroup
        query.authenticationContext = context
        return query
    }
}

/// What a key item's public description (its `kSecAttrGeneric`) says, read without the key: for
/// a program whose keys are inside `lockboxd`.
package struct KeyItemDescription: Sendable {
    package let algorithm: KeyAlgorithm
    package let purposes: KeyPurposes
    /// The public half; nil for an AES key.
    package let publicKey: PublicKey?

    /// Nil for an item that is not a managed key.
    package init?(_ item: Item) {
        guard item.itemClass == .key, let descriptor = KeyDescriptor(item.attributes.generic) else { return nil }
        algorithm = descriptor.algorithm
        purposes = descriptor.purposes
        guard let publicKey = descriptor.publicHalf else { return nil }
        self.publicKey = publicKey
    }
}

extension KeyDescriptor {
    /// The public half the descriptor records: `.some(nil)` for an AES key, nil when an
    /// asymmetric key's recorded public key does not decode (not a managed key then).
    var publicHalf: PublicKey?? {
        guard algorithm.isAsymmetric else { return .some(nil) }
        guard let key = try? PublicKey(rawRepresentation: Data(publicKey), algorithm: algorithm) else { return nil }
        return .some(key)
    }
}
