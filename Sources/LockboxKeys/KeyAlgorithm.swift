import FoundationEssentials
import LockboxCore

/// The algorithms a managed key can have.
public enum KeyAlgorithm: String, Sendable, Hashable, CaseIterable, CustomStringConvertible {
    /// NIST P-256: ECDSA with SHA-256 (DER signatures, Apple's
    /// `.ecdsaSignatureMessageX962SHA256`) and ECDH (Apple's `.ecdhKeyExchangeStandard`).
    /// Apple's default key type (`kSecAttrKeyTypeECSECPrimeRandom`, 256 bits).
    case p256
    /// Ed25519 signatures (RFC 8032).
    case ed25519
    /// X25519 key agreement (RFC 7748).
    case x25519
    /// AES-256-GCM, a symmetric key: CryptoKit's combined box, `nonce || ciphertext || tag`.
    case aes256GCM

    /// The purposes a key of this algorithm can be created for.
    public var possiblePurposes: KeyPurposes {
        switch self {
        case .p256: [.sign, .verify, .keyAgreement]
        case .ed25519: [.sign, .verify]
        case .x25519: [.keyAgreement]
        case .aes256GCM: [.encrypt, .decrypt]
        }
    }

    /// True for the algorithms whose keys have a public half.
    public var isAsymmetric: Bool { self != .aes256GCM }

    /// `kSecAttrKeyType`.
    public var keyType: KeyType {
        switch self {
        case .p256: .ecSECPrimeRandom
        case .ed25519: .ed25519
        case .x25519: .x25519
        case .aes256GCM: .aes
        }
    }

    public var description: String { rawValue }

    /// The byte that names the algorithm in a stored key.
    var code: UInt8 {
        switch self {
        case .p256: 1
        case .ed25519: 2
        case .x25519: 3
        case .aes256GCM: 4
        }
    }

    init?(code: UInt8) {
        guard let algorithm = Self.allCases.first(where: { $0.code == code }) else { return nil }
        self = algorithm
    }
}

extension KeyType {
    /// X25519 (Apple has no `kSecAttrKeyType` for it; CryptoKit's `Curve25519.KeyAgreement`).
    public static let x25519 = KeyType(rawValue: "x25519")
}

/// What a key may be used for, fixed when it is made (Android Keystore's purposes, Apple's
/// `kSecAttrCanSign` and friends). Using a key for anything else fails with
/// `errSecKeyUsageIncorrect` (-67731).
public struct KeyPurposes: OptionSet, Sendable, Hashable, CustomStringConvertible {
    public let rawValue: UInt8
    public init(rawValue: UInt8) { self.rawValue = rawValue }

    public static let sign = KeyPurposes(rawValue: 1 << 0)
    public static let verify = KeyPurposes(rawValue: 1 << 1)
    public static let encrypt = KeyPurposes(rawValue: 1 << 2)
    public static let decrypt = KeyPurposes(rawValue: 1 << 3)
    public static let keyAgreement = KeyPurposes(rawValue: 1 << 4)

    public var description: String {
        let names: [(KeyPurposes, String)] = [
            (.sign, "sign"), (.verify, "verify"), (.encrypt, "encrypt"), (.decrypt, "decrypt"), (.keyAgreement, "keyAgreement"),
        ]
        return names.filter { contains($0.0) }.map(\.1).joined(separator: ", ")
    }
}

/// Everything about a key that is fixed when it is made.
///
/// ```swift
/// var specification = KeySpecification(algorithm: .p256, purposes: [.sign, .verify])
/// specification.applicationTag = Data("com.example.login".utf8)
/// let key = try keys.generate(specification)
/// let signature = try key.sign(Data("hello".utf8))
/// ```
public struct KeySpecification: Sendable {
    public var algorithm: KeyAlgorithm
    public var purposes: KeyPurposes
    /// When the key can be used, as for any item. Default `whenUnlocked`.
    public var accessibility: Accessibility = .default
    /// `.userPresence`: every use asks the user through the ``AuthenticationContext`` passed to
    /// the operation (with its reuse window), as reading an access-controlled item does.
    public var accessControl: AccessControl?
    /// `kSecAttrApplicationTag`: how the application finds its key again.
    public var applicationTag: Data?
    /// `kSecAttrLabel`: a name for people.
    public var label: String?
    /// `kSecAttrAccessGroup`; nil is the store's default group.
    public var accessGroup: String?
    /// Whether the private (or symmetric) key's bytes may ever be read out. Default false: they
    /// never leave Lockbox, through any API, backup or dump.
    public var isExtractable = false
    /// The key becomes unusable (`errSecInvalidKeyRef`, -67712) once the passphrase is changed
    /// or removed, as an Android Keystore key does after a lock-screen change. Needs a
    /// passphrase when the key is made.
    public var isInvalidatedByPassphraseChange = false

    public init(algorithm: KeyAlgorithm, purposes: KeyPurposes) {
        self.algorithm = algorithm
        self.purposes = purposes
    }
}
