internal import CSodium
import LockboxCore

/// Ed25519 signatures and X25519 key agreement for managed keys, over libsodium (this target
/// stays the only importer of CSodium). Secret keys stay in guarded memory throughout.
package enum Curve25519 {
    package static let publicKeyByteCount = 32
    /// libsodium's Ed25519 secret key: the 32-byte seed followed by the public key.
    package static let signingSecretKeyByteCount = 64
    package static let signatureByteCount = 64
    package static let agreementSecretKeyByteCount = 32

    /// A new Ed25519 key pair.
    package static func generateSigningKey() -> (secretKey: SecretBytes, publicKey: [UInt8]) {
        Crypto.ensureSodium()
        var publicKey = [UInt8](repeating: 0, count: publicKeyByteCount)
        let secretKey = SecretBytes(capacity: signingSecretKeyByteCount) { buffer in
            let result = crypto_sign_keypair(&publicKey, buffer.baseAddress!.assumingMemoryBound(to: UInt8.self))
            precondition(result == 0, "Ed25519 key generation cannot fail")
            return signingSecretKeyByteCount
        }
        return (secretKey, publicKey)
    }

    /// A detached Ed25519 signature (RFC 8032) of `message`.
    package static func sign(_ message: [UInt8], secretKey: SecretBytes) -> [UInt8] {
        Crypto.ensureSodium()
        precondition(secretKey.count == signingSecretKeyByteCount, "an Ed25519 secret key is 64 bytes here")
        var signature = [UInt8](repeating: 0, count: signatureByteCount)
        secretKey.withUnsafeBytes { secret in
            _ = crypto_sign_detached(
                &signature, nil, message, UInt64(message.count), secret.baseAddress!.assumingMemoryBound(to: UInt8.self))
        }
        return signature
    }

    /// Whether `signature` is a valid Ed25519 signature of `message` by `publicKey`. A public
    /// key or signature of the wrong length is simply not valid; callers check lengths first
    /// to give a clear error.
    package static func isValidSignature(_ signature: [UInt8], for message: [UInt8], publicKey: [UInt8]) -> Bool {
        Crypto.ensureSodium()
        guard signature.count == signatureByteCount, publicKey.count == publicKeyByteCount else { return false }
        return crypto_sign_verify_detached(signature, message, UInt64(message.count), publicKey) == 0
    }

    /// A new X25519 key pair.
    package static func generateAgreementKey() -> (secretKey: SecretBytes, publicKey: [UInt8]) {
        Crypto.ensureSodium()
        var publicKey = [UInt8](repeating: 0, count: publicKeyByteCount)
        let secretKey = SecretBytes(capacity: agreementSecretKeyByteCount) { buffer in
            let secret = buffer.baseAddress!.assumingMemoryBound(to: UInt8.self)
            randombytes_buf(secret, agreementSecretKeyByteCount)
            let result = crypto_scalarmult_base(&publicKey, secret)
            precondition(result == 0, "X25519 public key computation cannot fail")
            return agreementSecretKeyByteCount
        }
        return (secretKey, publicKey)
    }

    /// The raw X25519 shared secret (RFC 7748), as OpenSSL's and CryptoKit's key agreement give it.
    /// - Throws: `param` when `peerPublicKey` is not 32 bytes or is a low-order point (the
    ///   result would be all zeros, a secret anyone knows).
    package static func sharedSecret(secretKey: SecretBytes, peerPublicKey: [UInt8]) throws(LockboxError) -> SecretBytes {
        Crypto.ensureSodium()
        let rejected = LockboxError(.param, "The peer's X25519 public key is not 32 bytes or is a low-order point; ask the peer for its real public key.")
        guard peerPublicKey.count == publicKeyByteCount, secretKey.count == agreementSecretKeyByteCount else { throw rejected }
        return try SecretBytes(capacity: 32) { (output) throws(LockboxError) -> Int in
            let result = secretKey.withUnsafeBytes { secret in
                crypto_scalarmult(
                    output.baseAddress!.assumingMemoryBound(to: UInt8.self), secret.baseAddress!.assumingMemoryBound(to: UInt8.self),
                    peerPublicKey)
            }
            guard result == 0 else { throw rejected }
            return 32
        }
    }
}
