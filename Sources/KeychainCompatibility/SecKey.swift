#if !canImport(Darwin)
import Foundation
import KeyCrypto
import Lockbox
import LockboxKeys

/// A key, as Apple's `SecKey`: a P-256 key pair's private or public half (Apple's default key
/// type), or a managed Ed25519 / X25519 key.
///
/// A private key is either kept in the keychain (made with `kSecAttrIsPermanent`, added with
/// `kSecValueRef`, or found with `kSecReturnRef`: a ``LockboxKeys/ManagedKey``, whose bytes stay
/// in the vault) or held in this process only (made without `kSecAttrIsPermanent`, or by
/// ``SecKeyCreateWithData(_:_:_:)``), in guarded memory.
public final class SecKey: @unchecked Sendable, Hashable, CustomStringConvertible {
    enum Material {
        /// A private key in the keychain.
        case stored(ManagedKey)
        /// A P-256 private key in this process: `04 || X || Y || D`.
        case memory(privateRepresentation: SecretBytes, publicKey: PublicKey)
        /// A public key.
        case publicKey(PublicKey)
        /// A private key inside `lockboxd`, used through it (the broker backend).
        case brokered(BrokeredKey)
    }

    let material: Material
    /// `kSecUseAuthenticationContext` of the query that found the key: its operations ask
    /// through it.
    let context: AuthenticationContext?

    init(_ material: Material, context: AuthenticationContext? = nil) {
        self.material = material
        self.context = context
    }

    var algorithm: KeyAlgorithm {
        switch material {
        case .stored(let key): key.algorithm
        case .memory: .p256
        case .publicKey(let key): key.algorithm
        case .brokered(let key): key.algorithm
        }
    }

    var isPrivate: Bool {
        if case .publicKey = material { return false }
        return true
    }

    var publicKey: PublicKey? {
        switch material {
        case .stored(let key): key.publicKey
        case .memory(_, let publicKey): publicKey
        case .publicKey(let key): key
        case .brokered(let key): key.publicKey
        }
    }

    public static func == (lhs: SecKey, rhs: SecKey) -> Bool {
        switch (lhs.material, rhs.material) {
        case (.stored(let left), .stored(let right)): left.persistentReference == right.persistentReference
        case (.publicKey(let left), .publicKey(let right)): left == right
        case (.memory, .memory): lhs === rhs || lhs.publicKey == rhs.publicKey
        case (.brokered(let left), .brokered(let right)): left.publicKey == right.publicKey
        default: false
        }
    }

    public func hash(into hasher: inout Hasher) {
        hasher.combine(isPrivate)
        hasher.combine(publicKey?.rawRepresentation)
    }

    public var description: String {
        let kind = isPrivate ? "private" : "public"
        let place: String
        switch material {
        case .stored(let key): place = key.isExtractable ? "keychain" : "keychain, not extractable"
        case .memory: place = "in memory"
        case .publicKey: place = "public"
        case .brokered: place = "inside lockboxd, not extractable"
        }
        return "<SecKey \(algorithm) \(kind), \(place)>"
    }
}

/// The type identifier of `SecKey` objects: `CFGetTypeID(item) == SecKeyGetTypeID()`.
public func SecKeyGetTypeID() -> CFTypeID { TypeIdentifier.key }

// MARK: - Algorithms

/// An algorithm a key operation uses, with Apple's names and identifiers.
public struct SecKeyAlgorithm: RawRepresentable, Hashable, Sendable {
    public let rawValue: String
    public init(rawValue: String) { self.rawValue = rawValue }
    public init(_ rawValue: CFString) { self.rawValue = rawValue as String }

    /// ECDSA over the SHA-256 of the message; a DER (X9.62) signature.
    public static let ecdsaSignatureMessageX962SHA256 = SecKeyAlgorithm(rawValue: "algid:sign:ECDSA:message-X962:SHA256")
    /// ECDSA over the SHA-256 of the message; the signature as `r || s` (RFC 4754, JWS ES256).
    public static let ecdsaSignatureMessageRFC4754SHA256 = SecKeyAlgorithm(rawValue: "algid:sign:ECDSA:message-RFC4754:SHA256")
    /// ECDSA over a SHA-256 digest given by the caller; a DER signature.
    public static let ecdsaSignatureDigestX962SHA256 = SecKeyAlgorithm(rawValue: "algid:sign:ECDSA:digest-X962:SHA256")
    /// ECDSA over a SHA-256 digest given by the caller; `r || s`.
    public static let ecdsaSignatureDigestRFC4754SHA256 = SecKeyAlgorithm(rawValue: "algid:sign:ECDSA:digest-RFC4754:SHA256")

    /// ECDH: the raw shared secret (the X coordinate).
    public static let ecdhKeyExchangeStandard = SecKeyAlgorithm(rawValue: "algid:keyexchange:ECDH")
    /// Cofactor ECDH: the same as standard on P-256 (cofactor 1).
    public static let ecdhKeyExchangeCofactor = SecKeyAlgorithm(rawValue: "algid:keyexchange:ECDHC")
    public static let ecdhKeyExchangeStandardX963SHA1 = SecKeyAlgorithm(rawValue: "algid:keyexchange:ECDH:KDFX963:SHA1")
    public static let ecdhKeyExchangeStandardX963SHA224 = SecKeyAlgorithm(rawValue: "algid:keyexchange:ECDH:KDFX963:SHA224")
    public static let ecdhKeyExchangeStandardX963SHA256 = SecKeyAlgorithm(rawValue: "algid:keyexchange:ECDH:KDFX963:SHA256")
    public static let ecdhKeyExchangeStandardX963SHA384 = SecKeyAlgorithm(rawValue: "algid:keyexchange:ECDH:KDFX963:SHA384")
    public static let ecdhKeyExchangeStandardX963SHA512 = SecKeyAlgorithm(rawValue: "algid:keyexchange:ECDH:KDFX963:SHA512")
    public static let ecdhKeyExchangeCofactorX963SHA1 = SecKeyAlgorithm(rawValue: "algid:keyexchange:ECDHC:KDFX963:SHA1")
    public static let ecdhKeyExchangeCofactorX963SHA224 = SecKeyAlgorithm(rawValue: "algid:keyexchange:ECDHC:KDFX963:SHA224")
    public static let ecdhKeyExchangeCofactorX963SHA256 = SecKeyAlgorithm(rawValue: "algid:keyexchange:ECDHC:KDFX963:SHA256")
    public static let ecdhKeyExchangeCofactorX963SHA384 = SecKeyAlgorithm(rawValue: "algid:keyexchange:ECDHC:KDFX963:SHA384")
    public static let ecdhKeyExchangeCofactorX963SHA512 = SecKeyAlgorithm(rawValue: "algid:keyexchange:ECDHC:KDFX963:SHA512")

    /// ECIES with a zero IV (Apple's "legacy" form): `ephemeral public key || ciphertext || tag`.
    public static let eciesEncryptionStandardX963SHA1AESGCM = SecKeyAlgorithm(rawValue: "algid:encrypt:ECIES:ECDH:KDFX963:SHA1:AESGCM")
    public static let eciesEncryptionStandardX963SHA224AESGCM = SecKeyAlgorithm(rawValue: "algid:encrypt:ECIES:ECDH:KDFX963:SHA224:AESGCM")
    public static let eciesEncryptionStandardX963SHA256AESGCM = SecKeyAlgorithm(rawValue: "algid:encrypt:ECIES:ECDH:KDFX963:SHA256:AESGCM")
    public static let eciesEncryptionStandardX963SHA384AESGCM = SecKeyAlgorithm(rawValue: "algid:encrypt:ECIES:ECDH:KDFX963:SHA384:AESGCM")
    public static let eciesEncryptionStandardX963SHA512AESGCM = SecKeyAlgorithm(rawValue: "algid:encrypt:ECIES:ECDH:KDFX963:SHA512:AESGCM")
    public static let eciesEncryptionCofactorX963SHA1AESGCM = SecKeyAlgorithm(rawValue: "algid:encrypt:ECIES:ECDHC:KDFX963:SHA1:AESGCM")
    public static let eciesEncryptionCofactorX963SHA224AESGCM = SecKeyAlgorithm(rawValue: "algid:encrypt:ECIES:ECDHC:KDFX963:SHA224:AESGCM")
    public static let eciesEncryptionCofactorX963SHA256AESGCM = SecKeyAlgorithm(rawValue: "algid:encrypt:ECIES:ECDHC:KDFX963:SHA256:AESGCM")
    public static let eciesEncryptionCofactorX963SHA384AESGCM = SecKeyAlgorithm(rawValue: "algid:encrypt:ECIES:ECDHC:KDFX963:SHA384:AESGCM")
    public static let eciesEncryptionCofactorX963SHA512AESGCM = SecKeyAlgorithm(rawValue: "algid:encrypt:ECIES:ECDHC:KDFX963:SHA512:AESGCM")
    /// ECIES with the IV derived by the KDF (Apple's recommended form).
    public static let eciesEncryptionStandardVariableIVX963SHA224AESGCM = SecKeyAlgorithm(rawValue: "algid:encrypt:ECIES:ECDH:KDFX963:SHA224:AESGCM-KDFIV")
    public static let eciesEncryptionStandardVariableIVX963SHA256AESGCM = SecKeyAlgorithm(rawValue: "algid:encrypt:ECIES:ECDH:KDFX963:SHA256:AESGCM-KDFIV")
    public static let eciesEncryptionStandardVariableIVX963SHA384AESGCM = SecKeyAlgorithm(rawValue: "algid:encrypt:ECIES:ECDH:KDFX963:SHA384:AESGCM-KDFIV")
    public static let eciesEncryptionStandardVariableIVX963SHA512AESGCM = SecKeyAlgorithm(rawValue: "algid:encrypt:ECIES:ECDH:KDFX963:SHA512:AESGCM-KDFIV")
    public static let eciesEncryptionCofactorVariableIVX963SHA224AESGCM = SecKeyAlgorithm(rawValue: "algid:encrypt:ECIES:ECDHC:KDFX963:SHA224:AESGCM-KDFIV")
    public static let eciesEncryptionCofactorVariableIVX963SHA256AESGCM = SecKeyAlgorithm(rawValue: "algid:encrypt:ECIES:ECDHC:KDFX963:SHA256:AESGCM-KDFIV")
    public static let eciesEncryptionCofactorVariableIVX963SHA384AESGCM = SecKeyAlgorithm(rawValue: "algid:encrypt:ECIES:ECDHC:KDFX963:SHA384:AESGCM-KDFIV")
    public static let eciesEncryptionCofactorVariableIVX963SHA512AESGCM = SecKeyAlgorithm(rawValue: "algid:encrypt:ECIES:ECDHC:KDFX963:SHA512:AESGCM-KDFIV")

    /// What the identifier names, parsed from its parts.
    var kind: Kind? {
        let parts = rawValue.split(separator: ":").map(String.init)
        guard parts.count >= 3, parts[0] == "algid" else { return nil }
        switch (parts[1], parts[2]) {
        case ("sign", "ECDSA") where parts.count == 5 && parts[4] == "SHA256":
            switch parts[3] {
            case "message-X962": return .signature(digest: false, raw: false)
            case "message-RFC4754": return .signature(digest: false, raw: true)
            case "digest-X962": return .signature(digest: true, raw: false)
            case "digest-RFC4754": return .signature(digest: true, raw: true)
            default: return nil
            }
        case ("keyexchange", "ECDH"), ("keyexchange", "ECDHC"):
            if parts.count == 3 { return .keyExchange(kdf: nil) }
            guard parts.count == 5, parts[3] == "KDFX963", let hash = Self.hash(parts[4]) else { return nil }
            return .keyExchange(kdf: hash)
        case ("encrypt", "ECIES"):
            guard parts.count == 7, parts[3] == "ECDH" || parts[3] == "ECDHC", parts[4] == "KDFX963",
                let hash = Self.hash(parts[5]), parts[6] == "AESGCM" || parts[6] == "AESGCM-KDFIV"
            else { return nil }
            return .ecies(hash: hash, variableIV: parts[6] == "AESGCM-KDFIV")
        default:
            return nil
        }
    }

    enum Kind {
        case signature(digest: Bool, raw: Bool)
        case keyExchange(kdf: HashFunction?)
        case ecies(hash: HashFunction, variableIV: Bool)
    }

    private static func hash(_ name: String) -> HashFunction? {
        switch name {
        case "SHA1": .sha1
        case "SHA224": .sha224
        case "SHA256": .sha256
        case "SHA384": .sha384
        case "SHA512": .sha512
        default: nil
        }
    }
}

/// The operation ``SecKeyIsAlgorithmSupported(_:_:_:)`` asks about.
public enum SecKeyOperationType: Int, Sendable {
    case sign = 0
    case verify = 1
    case encrypt = 2
    case decrypt = 3
    case keyExchange = 4
}

/// `SecKeyCopyKeyExchangeResult` parameter: the number of bytes the KDF makes.
nonisolated(unsafe) public let kSecKeyKeyExchangeParameterRequestedSize: CFString = "requestedSize"
/// `SecKeyCopyKeyExchangeResult` parameter: the KDF's shared information (`Data`).
nonisolated(unsafe) public let kSecKeyKeyExchangeParameterSharedInfo: CFString = "sharedInfo"

// MARK: - Errors

typealias ErrorPointer = UnsafeMutablePointer<Unmanaged<CFError>?>?

/// Runs `body`, reporting a failure through `error` as Apple does (an `NSError` in
/// `NSOSStatusErrorDomain` whose code is the status) and returning nil.
func reporting<Result>(_ error: ErrorPointer, _ body: () throws(LockboxError) -> Result) -> Result? {
    do {
        return try body()
    } catch let failure {
        error?.pointee = Unmanaged.passRetained(
            NSError(domain: "NSOSStatusErrorDomain", code: Int(failure.code.rawValue), userInfo: [
                NSLocalizedDescriptionKey: failure.message
            ]))
        return nil
    }
}

// MARK: - Making keys

/// Makes a new key pair and returns its private key.
///
/// ```swift
/// let attributes: [String: Any] = [
///     kSecAttrKeyType as String: kSecAttrKeyTypeECSECPrimeRandom,
///     kSecAttrKeySizeInBits as String: 256,
///     kSecPrivateKeyAttrs as String: [
///         kSecAttrIsPermanent as String: true,
///         kSecAttrApplicationTag as String: Data("com.example.dpop".utf8),
///     ],
/// ]
/// var error: Unmanaged<CFError>?
/// guard let key = SecKeyCreateRandomKey(attributes as CFDictionary, &error) else { throw error!.takeRetainedValue() as Error }
/// ```
///
/// `kSecAttrKeyTypeECSECPrimeRandom` (256 bits) is Apple's type; `kSecAttrKeyTypeEd25519` and
/// `kSecAttrKeyTypeX25519` give Lockbox's other managed keys (permanent only). A permanent key is
/// stored in the keychain and is **not extractable** unless `kSecAttrIsExtractable` is true
/// (Lockbox's default, stricter than iOS for software keys); one made without
/// `kSecAttrIsPermanent` lives in this process only. `kSecAttrTokenID: kSecAttrTokenIDSecureEnclave`
/// asks for hardware: see ``SecKeyHardware``.
/// - Returns: The private key, or nil with `error` set: `errSecParam` for an unknown type or
///   size, `errSecUnimplemented` for RSA or for hardware this machine does not have.
public func SecKeyCreateRandomKey(_ parameters: CFDictionary, _ error: UnsafeMutablePointer<Unmanaged<CFError>?>?) -> SecKey? {
    reporting(error) { () throws(LockboxError) -> SecKey in
        let request = try KeyRequest(parameters)
        if request.wantsHardware {
            return try SecKeyHardware.createRandomKey(request)
        }
        guard request.isPermanent else {
            guard request.algorithm == .p256 else {
                throw LockboxError(
                    .unimplemented, "Only P-256 keys can live outside the keychain; give kSecAttrIsPermanent for \(request.algorithm) keys.")
            }
            let (secret, point) = try P256.generate()
            return SecKey(.memory(privateRepresentation: secret, publicKey: try PublicKey(x963Representation: Data(point))))
        }
        if let broker = try SecItemStore.current() as? BrokerStore {
            return SecKey(.brokered(try BrokeredKey.generate(request, in: broker)), context: request.context)
        }
        let keys = try SecKeyStore.current()
        return SecKey(.stored(try keys.generate(request.specification)), context: request.context)
    }
}

/// The public key of `key` (itself for a public key).
public func SecKeyCopyPublicKey(_ key: SecKey) -> SecKey? {
    guard let publicKey = key.publicKey else { return nil }
    return SecKey(.publicKey(publicKey))
}

/// A key from its external representation: a P-256 public key as the X9.63 point
/// `04 || X || Y` (65 bytes), a private key as `04 || X || Y || D` (97 bytes), as Apple's
/// `SecKeyCopyExternalRepresentation` gives them. The key lives in this process; add it to the
/// keychain with `SecItemAdd` and `kSecValueRef`.
/// - Parameters:
///   - attributes: `kSecAttrKeyType` (`kSecAttrKeyTypeECSECPrimeRandom`) and `kSecAttrKeyClass`
///     (`kSecAttrKeyClassPublic` or `kSecAttrKeyClassPrivate`); `kSecAttrKeySizeInBits` 256 if given.
/// - Returns: The key, or nil with `errSecParam` for bytes that are not such a key.
public func SecKeyCreateWithData(
    _ keyData: CFData, _ attributes: CFDictionary, _ error: UnsafeMutablePointer<Unmanaged<CFError>?>?
) -> SecKey? {
    reporting(error) { () throws(LockboxError) -> SecKey in
        guard let dictionary = attributes.stringKeyed else { throw LockboxError(.param, "The attribute keys must be strings.") }
        let type = dictionary[kSecAttrKeyType].flatMap(KeyRequest.code)
        guard type == kSecAttrKeyTypeECSECPrimeRandom as String || type == kSecAttrKeyTypeEC as String else {
            throw LockboxError(.param, "SecKeyCreateWithData reads P-256 keys (kSecAttrKeyTypeECSECPrimeRandom) only.")
        }
        if let size = dictionary[kSecAttrKeySizeInBits].flatMap(QueryValue.integer), size != 256 {
            throw LockboxError(.param, "A P-256 key is 256 bits; kSecAttrKeySizeInBits was \(size).")
        }
        let bytes = keyData as Data
        switch dictionary[kSecAttrKeyClass].flatMap(KeyRequest.code) {
        case kSecAttrKeyClassPublic:
            return SecKey(.publicKey(try PublicKey(x963Representation: bytes)))
        case kSecAttrKeyClassPrivate:
            let representation = SecretBytes(copying: bytes)
            guard representation.count == P256.privateRepresentationByteCount else {
                throw LockboxError(.param, "A P-256 private key is 97 bytes (04 || X || Y || D); got \(representation.count).")
            }
            let point = try PublicKey(x963Representation: bytes.prefix(P256.publicKeyByteCount))
            let probe = Array("lockbox key check".utf8)
            guard let signature = try? P256.sign(probe, privateRepresentation: representation),
                (try? point.isValidSignature(Data(signature), for: Data(probe))) == true
            else {
                throw LockboxError(.param, "The bytes are not a P-256 private key: its public point does not match its scalar.")
            }
            return SecKey(.memory(privateRepresentation: representation, publicKey: point))
        default:
            throw LockboxError(.param, "kSecAttrKeyClass must be kSecAttrKeyClassPublic or kSecAttrKeyClassPrivate.")
        }
    }
}

/// The key's external representation: a public key's X9.63 point; an extractable private
/// key's `04 || X || Y || D`.
/// - Returns: nil with `errSecParam` for a non-extractable private key (Lockbox's default for
///   keys made in the keychain; iOS refuses Secure Enclave keys the same way).
public func SecKeyCopyExternalRepresentation(_ key: SecKey, _ error: UnsafeMutablePointer<Unmanaged<CFError>?>?) -> CFData? {
    reporting(error) { () throws(LockboxError) -> CFData in
        switch key.material {
        case .publicKey(let publicKey):
            return publicKey.rawRepresentation as NSData
        case .memory(let secret, _):
            return secret.withUnsafeBytes { NSData(bytes: $0.baseAddress, length: $0.count) }
        case .stored(let managed):
            guard managed.algorithm == .p256 else {
                throw LockboxError(.param, "Only P-256 private keys have an external representation here.")
            }
            let secret = try SecKeyStore.current().exportPrivateKey(of: managed, context: key.context)
            return secret.withUnsafeBytes { NSData(bytes: $0.baseAddress, length: $0.count) }
        case .brokered:
            throw LockboxError(
                .param, "This private key is inside lockboxd and never leaves it; use it with SecKeyCreateSignature or SecKeyCreateDecryptedData.")
        }
    }
}

/// The key's attributes: class, type, size, application tag and label, label, usage.
public func SecKeyCopyAttributes(_ key: SecKey) -> CFDictionary? {
    var attributes: [String: Any] = [
        kSecClass as String: kSecClassKey as String,
        kSecAttrKeyClass as String: (key.isPrivate ? kSecAttrKeyClassPrivate : kSecAttrKeyClassPublic) as String,
        kSecAttrKeyType as String: key.algorithm.keyType.rawValue,
        kSecAttrKeySizeInBits as String: 256,
        kSecAttrEffectiveKeySize as String: 256,
        kSecAttrCanSign as String: key.isPrivate && key.purposes.contains(.sign),
        kSecAttrCanVerify as String: !key.isPrivate && key.algorithm != .x25519,
        kSecAttrCanDecrypt as String: key.isPrivate && key.purposes.contains(.keyAgreement) && key.algorithm == .p256,
        kSecAttrCanEncrypt as String: !key.isPrivate && key.algorithm == .p256,
        kSecAttrCanDerive as String: key.purposes.contains(.keyAgreement),
    ]
    if let publicKey = key.publicKey {
        attributes[kSecAttrApplicationLabel as String] = Data(MessageDigest.sha1(Array(publicKey.rawRepresentation)))
    }
    switch key.material {
    case .stored(let managed):
        attributes[kSecAttrIsPermanent as String] = true
        attributes[kSecAttrIsExtractable as String] = managed.isExtractable
        attributes[kSecAttrApplicationLabel as String] = managed.applicationLabel
        attributes[kSecAttrAccessible as String] = managed.accessibility.code
        if let tag = managed.applicationTag { attributes[kSecAttrApplicationTag as String] = tag }
        if let label = managed.label { attributes[kSecAttrLabel as String] = label }
    case .brokered(let brokered):
        attributes[kSecAttrIsPermanent as String] = true
        attributes[kSecAttrIsExtractable as String] = false
        attributes[kSecAttrApplicationTag as String] = brokered.applicationTag
        if let label = brokered.label { attributes[kSecAttrLabel as String] = label }
    case .memory, .publicKey:
        attributes[kSecAttrIsPermanent as String] = false
        attributes[kSecAttrIsExtractable as String] = true
    }
    return attributes as NSDictionary
}

extension SecKey {
    /// What the key may do.
    var purposes: KeyPurposes {
        switch material {
        case .stored(let managed): managed.purposes
        case .brokered(let brokered): brokered.purposes
        case .memory: [.sign, .verify, .keyAgreement]
        case .publicKey(let key): key.algorithm == .x25519 ? [] : [.verify]
        }
    }
}

// MARK: - Operations

/// Whether `key` can do `operation` with `algorithm`.
public func SecKeyIsAlgorithmSupported(_ key: SecKey, _ operation: SecKeyOperationType, _ algorithm: SecKeyAlgorithm) -> Bool {
    guard let kind = algorithm.kind, key.algorithm == .p256 else { return false }
    switch (kind, operation) {
    case (.signature(let digest, _), .sign): return !digest && key.isPrivate && key.purposes.contains(.sign)
    case (.signature(let digest, _), .verify): return !digest
    case (.ecies, .encrypt): return true
    case (.ecies, .decrypt), (.keyExchange, .keyExchange): return key.isPrivate && key.purposes.contains(.keyAgreement)
    default: return false
    }
}

/// Signs `dataToSign` with a private key.
///
/// Supported: `.ecdsaSignatureMessageX962SHA256` (DER) and `.ecdsaSignatureMessageRFC4754SHA256`
/// (`r || s`, 64 bytes) with P-256 keys. The digest forms are refused (`errSecUnimplemented`):
/// the signing primitive hashes the message itself.
/// - Returns: The signature, or nil with `error` set (`errSecParam` for a public key or another
///   algorithm, `errSecInteractionNotAllowed` when locked, `errSecKeyUsageIncorrect`...).
public func SecKeyCreateSignature(
    _ key: SecKey, _ algorithm: SecKeyAlgorithm, _ dataToSign: CFData, _ error: UnsafeMutablePointer<Unmanaged<CFError>?>?
) -> CFData? {
    reporting(error) { () throws(LockboxError) -> CFData in
        guard case .signature(let digest, let raw) = algorithm.kind, key.algorithm == .p256 else {
            throw LockboxError(.param, "\(algorithm.rawValue) is not a signature algorithm of this \(key.algorithm) key.")
        }
        guard !digest else {
            throw LockboxError(.unimplemented, "Digest signatures are not supported; use .ecdsaSignatureMessageX962SHA256 with the message.")
        }
        let message = dataToSign as Data
        let der: Data
        switch key.material {
        case .publicKey:
            throw LockboxError(.param, "A public key cannot sign; use the private key.")
        case .memory(let secret, _):
            der = Data(try P256.sign(Array(message), privateRepresentation: secret))
        case .stored(let managed):
            der = try managed.sign(message, context: key.context)
        case .brokered(let brokered):
            der = try brokered.sign(message)
        }
        guard raw else { return der as NSData }
        guard let signature = ECDSASignature.raw(fromDER: der) else { throw LockboxError.integrity("A signature") }
        return signature as NSData
    }
}

/// Whether `signature` is a valid signature of `signedData` by `key` (a public key, or a private
/// key's public half).
/// - Returns: false, with `errSecVerifyFailed` (-67808) in `error`, for a signature that does not verify.
public func SecKeyVerifySignature(
    _ key: SecKey, _ algorithm: SecKeyAlgorithm, _ signedData: CFData, _ signature: CFData,
    _ error: UnsafeMutablePointer<Unmanaged<CFError>?>?
) -> Bool {
    reporting(error) { () throws(LockboxError) -> Bool in
        guard case .signature(let digest, let raw) = algorithm.kind, key.algorithm == .p256, let publicKey = key.publicKey else {
            throw LockboxError(.param, "\(algorithm.rawValue) is not a signature algorithm of this \(key.algorithm) key.")
        }
        guard !digest else {
            throw LockboxError(.unimplemented, "Digest signatures are not supported; use .ecdsaSignatureMessageX962SHA256 with the message.")
        }
        let given = signature as Data
        let failed = LockboxError(LockboxError.Code(rawValue: errSecVerifyFailed), "The signature does not match the data and key.")
        let der: Data
        if raw {
            guard let converted = ECDSASignature.der(fromRaw: given) else { throw failed }
            der = converted
        } else {
            der = given
        }
        guard (try? publicKey.isValidSignature(der, for: signedData as Data)) == true else { throw failed }
        return true
    } ?? false
}

/// `-67808`: The signature does not verify (`errSecVerifyFailed`).
public let errSecVerifyFailed: OSStatus = -67808

/// Encrypts `plaintext` to a P-256 public key (or a private key's public half) with Apple's ECIES:
/// an ephemeral P-256 key, ECDH, the ANSI X9.63 KDF over the shared secret with the ephemeral
/// public key as shared information, and AES-GCM (a 128-bit key for P-256; a zero 16-byte IV,
/// or one made by the KDF for the `VariableIV` algorithms).
/// - Returns: `ephemeral public key (65) || ciphertext || tag (16)`, as iOS gives it.
public func SecKeyCreateEncryptedData(
    _ key: SecKey, _ algorithm: SecKeyAlgorithm, _ plaintext: CFData, _ error: UnsafeMutablePointer<Unmanaged<CFError>?>?
) -> CFData? {
    reporting(error) { () throws(LockboxError) -> CFData in
        guard case .ecies(let hash, let variableIV) = algorithm.kind, key.algorithm == .p256, let publicKey = key.publicKey else {
            throw LockboxError(.param, "\(algorithm.rawValue) is not an ECIES algorithm of this \(key.algorithm) key.")
        }
        let (ephemeral, ephemeralPoint) = try P256.generate()
        let shared = try P256.sharedSecret(privateRepresentation: ephemeral, peerPublicKey: Array(publicKey.rawRepresentation))
        let (aesKey, iv) = ECIES.keyAndIV(shared, ephemeralPoint: ephemeralPoint, hash: hash, variableIV: variableIV)
        let sealed = try GCMWithDerivedIV.seal(Array(plaintext as Data), key: aesKey, iv: iv)
        return Data(ephemeralPoint + sealed) as NSData
    }
}

/// Decrypts what ``SecKeyCreateEncryptedData(_:_:_:_:)`` (or iOS) made for this private key.
/// - Returns: The plaintext, or nil with `errSecDecode` for a ciphertext that fails
///   authentication (one opaque error for any tampering).
public func SecKeyCreateDecryptedData(
    _ key: SecKey, _ algorithm: SecKeyAlgorithm, _ ciphertext: CFData, _ error: UnsafeMutablePointer<Unmanaged<CFError>?>?
) -> CFData? {
    reporting(error) { () throws(LockboxError) -> CFData in
        guard case .ecies(let hash, let variableIV) = algorithm.kind, key.algorithm == .p256, key.isPrivate else {
            throw LockboxError(.param, "\(algorithm.rawValue) is not an ECIES algorithm this key can decrypt with.")
        }
        if case .brokered(let brokered) = key.material {
            // Inside the broker, with the same schedule.
            let plaintext = try brokered.decrypt(ciphertext as Data, algorithm: algorithm, context: key.context)
            return plaintext.withUnsafeBytes { NSData(bytes: $0.baseAddress, length: $0.count) }
        }
        let plaintext = try ECIES.open(Array(ciphertext as Data), hash: hash, variableIV: variableIV) { (point) throws(LockboxError) in
            try key.sharedSecret(with: try PublicKey(x963Representation: Data(point)))
        }
        return plaintext.withUnsafeBytes { NSData(bytes: $0.baseAddress, length: $0.count) }
    }
}

/// ECDH between `privateKey` and `publicKey`: the raw shared secret (`.ecdhKeyExchangeStandard`,
/// `.ecdhKeyExchangeCofactor`), or the ANSI X9.63 KDF of it (`...X963SHA*`), whose size
/// (`kSecKeyKeyExchangeParameterRequestedSize`, required) and shared information
/// (`kSecKeyKeyExchangeParameterSharedInfo`) come from `parameters`.
public func SecKeyCopyKeyExchangeResult(
    _ privateKey: SecKey, _ algorithm: SecKeyAlgorithm, _ publicKey: SecKey, _ parameters: CFDictionary,
    _ error: UnsafeMutablePointer<Unmanaged<CFError>?>?
) -> CFData? {
    reporting(error) { () throws(LockboxError) -> CFData in
        guard case .keyExchange(let kdf) = algorithm.kind, privateKey.isPrivate, let peer = publicKey.publicKey else {
            throw LockboxError(.param, "\(algorithm.rawValue) is not a key-exchange algorithm for this private key and public key.")
        }
        let shared = try privateKey.sharedSecret(with: peer)
        guard let kdf else {
            return shared.withUnsafeBytes { NSData(bytes: $0.baseAddress, length: $0.count) }
        }
        let dictionary = parameters.stringKeyed ?? [:]
        guard let size = dictionary[kSecKeyKeyExchangeParameterRequestedSize].flatMap(QueryValue.integer), size > 0, size <= 1 << 16 else {
            throw LockboxError(.param, "A KDF key exchange needs kSecKeyKeyExchangeParameterRequestedSize (a positive number of bytes).")
        }
        let sharedInfo = dictionary[kSecKeyKeyExchangeParameterSharedInfo].flatMap(QueryValue.data) ?? Data()
        let derived = kdf.x963(shared, sharedInfo: Array(sharedInfo), count: size)
        return derived.withUnsafeBytes { NSData(bytes: $0.baseAddress, length: $0.count) }
    }
}

extension SecKey {
    func sharedSecret(with peer: PublicKey) throws(LockboxError) -> SecretBytes {
        switch material {
        case .publicKey:
            throw LockboxError(.param, "A public key cannot agree on a secret; use the private key.")
        case .memory(let secret, _):
            guard peer.algorithm == .p256 else { throw LockboxError(.param, "The peer's key is not a P-256 key.") }
            return try P256.sharedSecret(privateRepresentation: secret, peerPublicKey: Array(peer.rawRepresentation))
        case .stored(let managed):
            return try managed.sharedSecret(with: peer, context: context)
        case .brokered:
            throw LockboxError(
                .unimplemented,
                "A key inside lockboxd does not send its shared secrets out; decrypt ECIES messages with SecKeyCreateDecryptedData.")
        }
    }
}

/// ECDSA signature encodings: DER (X9.62) and `r || s` (RFC 4754).
enum ECDSASignature {
    static let coordinateCount = 32

    static func raw(fromDER der: Data) -> Data? {
        let bytes = Array(der)
        guard bytes.count >= 8, bytes[0] == 0x30, Int(bytes[1]) == bytes.count - 2 else { return nil }
        var index = 2
        var output: [UInt8] = []
        for _ in 0..<2 {
            guard index + 2 <= bytes.count, bytes[index] == 0x02 else { return nil }
            let length = Int(bytes[index + 1])
            index += 2
            guard length > 0, index + length <= bytes.count else { return nil }
            var integer = Array(bytes[index..<(index + length)])
            index += length
            while integer.count > coordinateCount, integer.first == 0 { integer.removeFirst() }
            guard integer.count <= coordinateCount else { return nil }
            output += [UInt8](repeating: 0, count: coordinateCount - integer.count) + integer
        }
        return index == bytes.count ? Data(output) : nil
    }

    static func der(fromRaw raw: Data) -> Data? {
        let bytes = Array(raw)
        guard bytes.count == 2 * coordinateCount else { return nil }
        func integer(_ part: ArraySlice<UInt8>) -> [UInt8] {
            var value = Array(part.drop { $0 == 0 })
            if value.isEmpty { value = [0] }
            if value[0] & 0x80 != 0 { value.insert(0, at: 0) }
            return [0x02, UInt8(value.count)] + value
        }
        let body = integer(bytes[0..<coordinateCount]) + integer(bytes[coordinateCount...])
        return Data([0x30, UInt8(body.count)] + body)
    }
}
#endif
