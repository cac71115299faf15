import FoundationEssentials
import LockboxCore

/// Keys used inside the broker: the client sends what to sign or decrypt and receives the
/// signature or the plaintext; the private key never leaves `lockboxd`.
extension BrokerStore {
    /// Makes a non-extractable key inside the broker, in `accessGroup` (nil: the caller's
    /// default group).
    /// - Parameters:
    ///   - algorithm: the key algorithm's name (`p256`, `ed25519`, `x25519`, `aes256GCM`).
    ///   - purposes: the purposes' bit set (LockboxKeys' `KeyPurposes.rawValue`).
    /// - Returns: the public key in DER (SubjectPublicKeyInfo); empty for a symmetric key.
    /// - Throws: `errSecMissingEntitlement` for a group the caller does not hold.
    public func generateKey(
        algorithm: String, purposes: UInt8, applicationTag: Data, label: String? = nil, accessGroup: String? = nil
    ) throws(LockboxError) -> Data {
        var reply = try request(.generateKey, retryable: false) {
            $0.string(algorithm)
            $0.integer(Int(purposes))
            $0.bytes(applicationTag)
            $0.string(label)
            $0.string(accessGroup)
        }
        guard let der = try? reply.data() else { throw Self.malformedReply }
        return der
    }

    /// Signs `message` with the key found by its application tag (and label), inside the broker.
    /// - Throws: `itemNotFound` when the caller's groups hold no such key.
    public func sign(_ message: Data, applicationTag: Data, label: String? = nil) throws(LockboxError) -> Data {
        var reply = try request(.sign, retryable: true) {
            $0.bytes(applicationTag)
            $0.string(label)
            $0.bytes(message)
        }
        guard let signature = try? reply.data() else { throw Self.malformedReply }
        return signature
    }

    /// The public half (DER) of the key found by its application tag (and label).
    public func publicKey(applicationTag: Data, label: String? = nil) throws(LockboxError) -> Data {
        var reply = try request(.publicKey, retryable: true) {
            $0.bytes(applicationTag)
            $0.string(label)
        }
        guard let der = try? reply.data() else { throw Self.malformedReply }
        return der
    }

    /// Encrypts inside the broker with the AES-256-GCM key found by its application tag (and
    /// label): LockboxKeys' box (`nonce || ciphertext || tag`), which ``decrypt(_:scheme:authenticating:applicationTag:label:context:)`` opens.
    /// - Throws: `keyUsageIncorrect` for a key without the encrypt purpose; `itemNotFound` when
    ///   the caller's groups hold no such key.
    public func encrypt(
        _ plaintext: SecretBytes, authenticating associatedData: Data = Data(), applicationTag: Data, label: String? = nil,
        context: AuthenticationContext? = nil
    ) throws(LockboxError) -> Data {
        var reply = try request(.encrypt, retryable: true, context: context) {
            $0.bytes(applicationTag)
            $0.string(label)
            var copy = plaintext.withUnsafeBytes { Array($0) }
            $0.bytes(copy)
            copy.wipe()
            $0.bytes(associatedData)
        }
        guard let box = try? reply.data() else { throw Self.malformedReply }
        return box
    }

    /// Decrypts inside the broker with the key found by its application tag (and label).
    /// - Parameters:
    ///   - box: for `scheme` `aes-gcm`, LockboxKeys' `nonce || ciphertext || tag` (its
    ///     `ManagedKey.encrypt`); for an ECIES algorithm's name
    ///     (`algid:encrypt:ECIES:ECDHC:KDFX963:SHA256:AESGCM`, SecKey's), the message
    ///     `SecKeyCreateEncryptedData` made for the key's public half.
    ///   - associatedData: AES-GCM's associated data; none for ECIES.
    /// - Returns: the plaintext, in guarded memory.
    /// - Throws: `decode` for a box that fails authentication; `keyUsageIncorrect` for a key
    ///   without the decrypt (or key-agreement, for ECIES) purpose; `itemNotFound` when the
    ///   caller's groups hold no such key.
    public func decrypt(
        _ box: Data, scheme: String = "aes-gcm", authenticating associatedData: Data = Data(), applicationTag: Data, label: String? = nil,
        context: AuthenticationContext? = nil
    ) throws(LockboxError) -> SecretBytes {
        var reply = try request(.decrypt, retryable: true, context: context) {
            $0.bytes(applicationTag)
            $0.string(label)
            $0.string(scheme)
            $0.bytes(box)
            $0.bytes(associatedData)
        }
        guard var plaintext = try? reply.bytes() else { throw Self.malformedReply }
        defer { plaintext.wipe() }
        return SecretBytes(copying: plaintext)
    }
}
