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
    /// Where the private key is made and kept. Default ``KeyToken/software``; ``KeyToken/hardware``
    /// (the Secure Enclave's role, `kSecAttrTokenIDSecureEnclave`) makes a P-256 signing key
    /// inside the machine's TPM 2.0, and fails with `notAvailable` when there is none: there is
    /// no silent fallback to software.
    public var token: KeyToken = .software
    /// The key becomes unusable (`errSecInvalidKeyRef`, -67712) once the passphrase is changed
    /// or removed, as an Android Keystore key does after a lock-screen change. Needs a
    /// passphrase when the key is made.
    public var isInvalidatedByPassphraseChange = false
    /// `kSecAttrSynchronizable`: the key travels, sealed end to end, to the other devices of the
    /// keychain's sync groups (LockboxSync), as a synchronizable password does. Only a software
    /// key, with an accessibility without `ThisDeviceOnly`, without access control and not
    /// bound to the passphrase: anything else is refused when the key is made (`errSecParam`).
    /// A hardware key never leaves its TPM.
    public var isSynchronizable = false

    public init(algorithm: KeyAlgorithm, purposes: KeyPurposes) {
        self.algorithm = algorithm
        self.purposes = purposes
    }
}

/// Where a key's private half is made and used (`kSecAttrTokenID`).
public enum KeyToken: String, Sendable, Hashable, CaseIterable, CustomStringConvertible {
    /// In software: the private key is sealed in the vault and computed with in this process.
    /// A copy of the vault and its passphrase is a copy of the key (docs/KEYS.md).
    case software
    /// Inside the machine's TPM 2.0: the private key is made there and leaves it only wrapped
    /// by the TPM's storage key, so the vault (or a copy of it) holds nothing usable on any
    /// other machine. P-256 with the sign and verify purposes only. This is Lockbox's Secure
    /// Enclave: the SecItem layer maps `kSecAttrTokenIDSecureEnclave` here.
    case hardware

    /// The Secure Enclave's name for ``hardware``.
    public static var secureEnclave: KeyToken { .hardware }

    public var description: String { rawValue }
}

/// Whether hardware-bound keys (``KeyToken/hardware``) can be made on this machine, and if not,
/// why: from ``SoftwareKeyStore/hardwareAvailability(device:)``.
public struct HardwareKeyAvailability: Sendable, Hashable, CustomStringConvertible {
    public let isAvailable: Bool
    /// What was found ("TPM 2.0 at device:/dev/tpmrm0") or what is missing, and what to do.
    public let reason: String
    /// The TPM's TCTI configuration that was tried (`device:/dev/tpmrm0`; `LOCKBOX_TPM_TCTI`
    /// overrides it, for example `swtpm:path=/run/swtpm/socket`).
    public let device: String

    public var description: String { isAvailable ? "available: \(reason)" : "not available: \(reason)" }
}
