// A DPoP key store in the style of OAuth SDKs: a P-256 private key kept in the Keychain by
// tag, found again as a SecKey, its public key exported for the JWK, proofs signed with it.
import Foundation
import Security

public enum DPoPError: Error, Equatable {
    case keychain(OSStatus)
    case crypto(Int)
    case notAKey
}

public final class DPoPKeyStore {
    let tag: Data

    public init(tag: String) {
        self.tag = tag.data(using: .utf8)!
    }

    private var query: [String: Any] {
        [
            kSecClass as String: kSecClassKey,
            kSecAttrApplicationTag as String: tag,
            kSecAttrKeyType as String: kSecAttrKeyTypeECSECPrimeRandom,
        ]
    }

    public func hasKey() -> Bool {
        var item: CFTypeRef?
        var lookup = query
        lookup[kSecReturnRef as String] = true
        return SecItemCopyMatching(lookup as CFDictionary, &item) == errSecSuccess
    }

    /// The stored key, made on first use.
    public func privateKey() throws -> SecKey {
        var item: CFTypeRef?
        var lookup = query
        lookup[kSecReturnRef as String] = true
        let status = SecItemCopyMatching(lookup as CFDictionary, &item)
        if status == errSecSuccess {
            guard let item = item, CFGetTypeID(item) == SecKeyGetTypeID() else { throw DPoPError.notAKey }
            return item as! SecKey
        }
        guard status == errSecItemNotFound else { throw DPoPError.keychain(status) }
        return try makeKey()
    }

    /// Makes a key in memory (as CryptoKit code would), and stores it by reference.
    private func makeKey() throws -> SecKey {
        var error: Unmanaged<CFError>?
        let attributes: [String: Any] = [
            kSecAttrKeyType as String: kSecAttrKeyTypeECSECPrimeRandom,
            kSecAttrKeySizeInBits as String: 256,
        ]
        guard let generated = SecKeyCreateRandomKey(attributes as CFDictionary, &error),
              let raw = SecKeyCopyExternalRepresentation(generated, &error) as Data? else {
            throw DPoPError.crypto(error.map { CFErrorGetCode($0.takeRetainedValue()) } ?? -1)
        }
        // Rebuild the key from its bytes, as a store that receives raw key material does.
        let cfData = raw.withUnsafeBytes { buffer in
            CFDataCreateWithBytesNoCopy(kCFAllocatorDefault, buffer.bindMemory(to: UInt8.self).baseAddress, raw.count, kCFAllocatorNull)
        }
        let keyAttributes: [String: Any] = [
            kSecAttrKeyType as String: kSecAttrKeyTypeECSECPrimeRandom,
            kSecAttrKeyClass as String: kSecAttrKeyClassPrivate,
        ]
        guard let cfData = cfData, let key = SecKeyCreateWithData(cfData, keyAttributes as CFDictionary, &error) else {
            throw DPoPError.crypto(error.map { CFErrorGetCode($0.takeRetainedValue()) } ?? -1)
        }
        var add = query
        add[kSecValueRef as String] = key
        add[kSecAttrAccessible as String] = kSecAttrAccessibleAfterFirstUnlockThisDeviceOnly
        let status = SecItemAdd(add as CFDictionary, nil)
        guard status == errSecSuccess else { throw DPoPError.keychain(status) }
        return key
    }

    /// The public key as the X9.63 point of the JWK's x and y.
    public func publicKeyPoint() throws -> Data {
        var error: Unmanaged<CFError>?
        guard let publicKey = SecKeyCopyPublicKey(try privateKey()),
              let point = SecKeyCopyExternalRepresentation(publicKey, &error) as Data? else {
            throw DPoPError.crypto(error.map { CFErrorGetCode($0.takeRetainedValue()) } ?? -1)
        }
        return point
    }

    /// A JWS ES256 signature (r || s) of the proof's signing input.
    public func sign(_ signingInput: Data) throws -> Data {
        var error: Unmanaged<CFError>?
        guard let signature = SecKeyCreateSignature(try privateKey(), .ecdsaSignatureMessageRFC4754SHA256, signingInput as CFData, &error) else {
            throw DPoPError.crypto(error.map { CFErrorGetCode($0.takeRetainedValue()) } ?? -1)
        }
        return signature as Data
    }

    public func verify(_ signature: Data, for signingInput: Data) throws -> Bool {
        var error: Unmanaged<CFError>?
        let attributes: [String: Any] = [
            kSecAttrKeyType as String: kSecAttrKeyTypeECSECPrimeRandom,
            kSecAttrKeyClass as String: kSecAttrKeyClassPublic,
        ]
        guard let publicKey = SecKeyCreateWithData(try publicKeyPoint() as CFData, attributes as CFDictionary, &error) else {
            throw DPoPError.crypto(error.map { CFErrorGetCode($0.takeRetainedValue()) } ?? -1)
        }
        return SecKeyVerifySignature(publicKey, .ecdsaSignatureMessageRFC4754SHA256, signingInput as CFData, signature as CFData, &error)
    }

    /// Seals a secret to the device key (ECIES, as on iOS) and opens it again.
    public func seal(_ secret: Data) throws -> Data {
        var error: Unmanaged<CFError>?
        guard let publicKey = SecKeyCopyPublicKey(try privateKey()),
              let box = SecKeyCreateEncryptedData(publicKey, .eciesEncryptionCofactorVariableIVX963SHA256AESGCM, secret as CFData, &error) else {
            throw DPoPError.crypto(error.map { CFErrorGetCode($0.takeRetainedValue()) } ?? -1)
        }
        return box as Data
    }

    public func open(_ box: Data) throws -> Data {
        var error: Unmanaged<CFError>?
        guard let secret = SecKeyCreateDecryptedData(try privateKey(), .eciesEncryptionCofactorVariableIVX963SHA256AESGCM, box as CFData, &error) else {
            throw DPoPError.crypto(error.map { CFErrorGetCode($0.takeRetainedValue()) } ?? -1)
        }
        return secret as Data
    }

    public func clear() throws {
        let status = SecItemDelete(query as CFDictionary)
        guard status == errSecSuccess || status == errSecItemNotFound else { throw DPoPError.keychain(status) }
    }
}
