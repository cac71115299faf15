internal import CCrypto
import LockboxCore
import Synchronization

/// NIST P-256 (secp256r1) over OpenSSL: ECDSA with SHA-256 and ECDH, in the encodings Apple's
/// Security framework uses.
///
/// A private key is held as Apple's external representation of an EC private key: the X9.63
/// uncompressed public point followed by the private scalar, `04 || X || Y || D` (97 bytes), in
/// guarded memory. A public key is the X9.63 point `04 || X || Y` (65 bytes).
package enum P256 {
    package static let publicKeyByteCount = 65
    package static let privateRepresentationByteCount = 97
    private static let coordinateByteCount = 32
    /// OpenSSL's name for the curve.
    private static let groupName = "prime256v1"
    // An OSSL_PARAM keeps its key's pointer, so the keys must outlive the call that builds it:
    // static strings do (a Swift String passed as `const char *` lives for that call only).
    private static let groupKey: StaticString = "group"  // OSSL_PKEY_PARAM_GROUP_NAME
    private static let publicKeyKey: StaticString = "pub"  // OSSL_PKEY_PARAM_PUB_KEY
    private static let privateKeyKey: StaticString = "priv"  // OSSL_PKEY_PARAM_PRIV_KEY

    private static func cString(_ key: StaticString) -> UnsafePointer<CChar> {
        UnsafeRawPointer(key.utf8Start).assumingMemoryBound(to: CChar.self)
    }

    /// A new key pair from OpenSSL's generator.
    package static func generate() throws(LockboxError) -> (privateRepresentation: SecretBytes, publicKey: [UInt8]) {
        let operation = try KeyOperation(algorithm: "EC")
        guard EVP_PKEY_keygen_init(operation.pointer) == 1, EVP_PKEY_CTX_set_group_name(operation.pointer, groupName) == 1 else {
            throw OpenSSLFailure.error("EVP_PKEY_keygen_init")
        }
        var generated: OpaquePointer?
        guard EVP_PKEY_generate(operation.pointer, &generated) == 1, let generated else {
            throw OpenSSLFailure.error("EVP_PKEY_generate")
        }
        let key = KeyObject(taking: generated)
        let publicKey = try encodedPublicKey(of: key)
        let scalar = SecretNumber()
        guard EVP_PKEY_get_bn_param(key.pointer, OSSL_PKEY_PARAM_PRIV_KEY, &scalar.pointer) == 1 else {
            throw OpenSSLFailure.error("EVP_PKEY_get_bn_param")
        }
        let representation = try SecretBytes(capacity: privateRepresentationByteCount) { (buffer) throws(LockboxError) -> Int in
            buffer.copyBytes(from: publicKey)
            let target = buffer.baseAddress!.advanced(by: publicKeyByteCount).assumingMemoryBound(to: UInt8.self)
            guard BN_bn2binpad(scalar.pointer, target, Int32(coordinateByteCount)) == Int32(coordinateByteCount) else {
                throw OpenSSLFailure.error("BN_bn2binpad")
            }
            return privateRepresentationByteCount
        }
        return (representation, publicKey)
    }

    /// True when `publicKey` is an uncompressed point on the curve (not the point at infinity).
    ///
    /// A point found valid is remembered (public bytes, at most ``checkedPointLimit`` of them):
    /// OpenSSL's check builds the group and multiplies the point, as costly as a signature, and
    /// every listing of managed keys (an SSH agent's `ssh-add -L`, a DPoP key's lookup) makes the
    /// same keys' public keys again. An invalid point is checked, and refused, every time.
    package static func isValidPublicKey(_ publicKey: [UInt8]) -> Bool {
        if isRemembered(publicKey) { return true }
        guard (try? publicKeyObject(publicKey)) != nil else { return false }
        checkedPoints.withLock { points in
            if points.count >= checkedPointLimit { points.removeAll() }
            points.insert(publicKey)
        }
        return true
    }

    private static let checkedPoints = Mutex<Set<[UInt8]>>([])
    package static let checkedPointLimit = 256

    /// Whether `publicKey` is among the points already found valid (the next check of it
    /// costs a lookup): for tests.
    package static func isRemembered(_ publicKey: [UInt8]) -> Bool {
        checkedPoints.withLock { $0.contains(publicKey) }
    }

    /// An ASN.1 DER ECDSA signature (`ECDSA-Sig-Value`) over SHA-256 of `message`: Apple's
    /// `.ecdsaSignatureMessageX962SHA256`.
    package static func sign(_ message: [UInt8], privateRepresentation: SecretBytes) throws(LockboxError) -> [UInt8] {
        try sign(message, key: try privateKeyObject(privateRepresentation))
    }

    /// A private key imported into OpenSSL once, for repeated signatures without the import
    /// (the in-process reference of the benchmark, `lockbox-key-bench`).
    package final class SigningKey {
        private let key: KeyObject

        package init(privateRepresentation: SecretBytes) throws(LockboxError) {
            key = try P256.privateKeyObject(privateRepresentation)
        }

        package func sign(_ message: [UInt8]) throws(LockboxError) -> [UInt8] {
            try P256.sign(message, key: key)
        }
    }

    private static func sign(_ message: [UInt8], key: KeyObject) throws(LockboxError) -> [UInt8] {
        let digest = try DigestOperation()
        guard EVP_DigestSignInit(digest.pointer, nil, EVP_sha256(), nil, key.pointer) == 1 else {
            throw OpenSSLFailure.error("EVP_DigestSignInit")
        }
        // A DER signature of two 256-bit integers is at most 72 bytes.
        var signature = [UInt8](repeating: 0, count: 80)
        var length = signature.count
        guard EVP_DigestSign(digest.pointer, &signature, &length, message, message.count) == 1 else {
            throw OpenSSLFailure.error("EVP_DigestSign")
        }
        signature.removeSubrange(length...)
        return signature
    }

    /// Whether `signature` (DER) is a valid ECDSA-SHA256 signature of `message` by `publicKey`.
    /// - Throws: `param` when the public key is not a point on P-256.
    package static func isValidSignature(_ signature: [UInt8], for message: [UInt8], publicKey: [UInt8]) throws(LockboxError) -> Bool {
        let key = try publicKeyObject(publicKey)
        let digest = try DigestOperation()
        guard EVP_DigestVerifyInit(digest.pointer, nil, EVP_sha256(), nil, key.pointer) == 1 else {
            throw OpenSSLFailure.error("EVP_DigestVerifyInit")
        }
        let result = EVP_DigestVerify(digest.pointer, signature, signature.count, message, message.count)
        // 0 is a wrong signature, below 0 a malformed one: neither is valid, neither is news.
        ERR_clear_error()
        return result == 1
    }

    /// The ECDH shared secret (the X coordinate, 32 bytes), as Apple's
    /// `.ecdhKeyExchangeStandard` gives it.
    /// - Throws: `param` when `peerPublicKey` is not a point on P-256.
    package static func sharedSecret(privateRepresentation: SecretBytes, peerPublicKey: [UInt8]) throws(LockboxError) -> SecretBytes {
        let key = try privateKeyObject(privateRepresentation)
        let peer = try publicKeyObject(peerPublicKey)
        let operation = try KeyOperation(key: key)
        guard EVP_PKEY_derive_init(operation.pointer) == 1, EVP_PKEY_derive_set_peer(operation.pointer, peer.pointer) == 1 else {
            throw OpenSSLFailure.error("EVP_PKEY_derive_set_peer")
        }
        return try SecretBytes(capacity: coordinateByteCount) { (buffer) throws(LockboxError) -> Int in
            var length = coordinateByteCount
            guard EVP_PKEY_derive(operation.pointer, buffer.baseAddress!.assumingMemoryBound(to: UInt8.self), &length) == 1,
                length == coordinateByteCount
            else { throw OpenSSLFailure.error("EVP_PKEY_derive") }
            return length
        }
    }

    // MARK: Key objects

    private static func encodedPublicKey(of key: KeyObject) throws(LockboxError) -> [UInt8] {
        var publicKey = [UInt8](repeating: 0, count: publicKeyByteCount)
        var length = 0
        guard EVP_PKEY_get_octet_string_param(key.pointer, OSSL_PKEY_PARAM_PUB_KEY, &publicKey, publicKey.count, &length) == 1,
            length == publicKeyByteCount, publicKey[0] == 0x04
        else { throw OpenSSLFailure.error("EVP_PKEY_get_octet_string_param") }
        return publicKey
    }

    /// An OpenSSL public key from an X9.63 point, checked to lie on the curve.
    private static func publicKeyObject(_ publicKey: [UInt8]) throws(LockboxError) -> KeyObject {
        let malformed = LockboxError(
            .param, "The public key is not an uncompressed P-256 point (X9.63, 65 bytes starting with 04, on the curve).")
        guard publicKey.count == publicKeyByteCount, publicKey[0] == 0x04 else { throw malformed }
        var publicCopy = publicKey
        let key: KeyObject? = groupName.withCString { group in
            publicCopy.withUnsafeMutableBytes { point in
                var parameters = [
                    OSSL_PARAM_construct_utf8_string(cString(groupKey), UnsafeMutablePointer(mutating: group), 0),
                    OSSL_PARAM_construct_octet_string(cString(publicKeyKey), point.baseAddress, point.count),
                    OSSL_PARAM_construct_end(),
                ]
                return importKey(&parameters, selection: lockbox_evp_pkey_public_key)
            }
        }
        guard let key else { throw malformed }
        let check = try KeyOperation(key: key)
        guard EVP_PKEY_public_check(check.pointer) == 1 else {
            ERR_clear_error()
            throw malformed
        }
        return key
    }

    /// An OpenSSL key pair from Apple's private representation. The scalar reaches OpenSSL
    /// from guarded memory (native byte order, as OpenSSL's integer parameters are).
    fileprivate static func privateKeyObject(_ representation: SecretBytes) throws(LockboxError) -> KeyObject {
        guard representation.count == privateRepresentationByteCount else { throw LockboxError.integrity("A stored P-256 key") }
        let scalar = SecretBytes(capacity: coordinateByteCount) { buffer in
            representation.withUnsafeBytes { bytes in
                for index in 0..<coordinateByteCount {
                    // Big-endian in the representation, little-endian for OpenSSL on this machine.
                    buffer[index] = bytes[privateRepresentationByteCount - 1 - index]
                }
            }
            return coordinateByteCount
        }
        var point = representation.withUnsafeBytes { Array($0[0..<publicKeyByteCount]) }
        let key: KeyObject? = groupName.withCString { group in
            point.withUnsafeMutableBytes { pointBytes in
                scalar.withUnsafeBytes { scalarBytes in
                    var parameters = [
                        OSSL_PARAM_construct_utf8_string(cString(groupKey), UnsafeMutablePointer(mutating: group), 0),
                        OSSL_PARAM_construct_octet_string(cString(publicKeyKey), pointBytes.baseAddress, pointBytes.count),
                        OSSL_PARAM_construct_BN(
                            cString(privateKeyKey),
                            UnsafeMutablePointer(mutating: scalarBytes.baseAddress!.assumingMemoryBound(to: UInt8.self)),
                            scalarBytes.count),
                        OSSL_PARAM_construct_end(),
                    ]
                    return importKey(&parameters, selection: lockbox_evp_pkey_keypair)
                }
            }
        }
        guard let key else { throw LockboxError.integrity("A stored P-256 key") }
        return key
    }

    private static func importKey(_ parameters: inout [OSSL_PARAM], selection: Int32) -> KeyObject? {
        guard let operation = try? KeyOperation(algorithm: "EC"), EVP_PKEY_fromdata_init(operation.pointer) == 1 else {
            ERR_clear_error()
            return nil
        }
        var imported: OpaquePointer?
        guard EVP_PKEY_fromdata(operation.pointer, &imported, selection, &parameters) == 1, let imported else {
            ERR_clear_error()
            return nil
        }
        return KeyObject(taking: imported)
    }
}
