import FoundationEssentials
import LockboxCore
import LockboxVault
import VaultCrypto

/// A managed key as stored: the value of its `.key` item (sealed by the vault like any value).
///
///     magic (12) | version | flags | algorithm | purposes | public key length | public key
///     | binding check (32, only when bound to the passphrase) | secret
///
/// `secret` is the TPM's key blob for a hardware key, else the private key (P-256: Apple's `04 || X || Y || D`; Ed25519: libsodium's
/// seed || public key; X25519: the scalar; AES: the key), or, for a key bound to the
/// passphrase, that sealed with the vault's passphrase binding key and the header bytes as
/// associated data. The binding check (a keyed digest of a fixed text under the binding key)
/// tells "the passphrase changed since" (`errSecInvalidKeyRef`) apart from a damaged value
/// (`errSecDecode`).
struct KeyEnvelope {
    struct Flags: OptionSet {
        let rawValue: UInt8
        static let nonExtractable = Flags(rawValue: ManagedKeyValue.nonExtractableFlag)
        static let invalidatedByPassphraseChange = Flags(rawValue: 1 << 1)
        /// Made inside the TPM: the secret is the TPM's key blob (TPM2B_PUBLIC || TPM2B_PRIVATE),
        /// whose private part only that TPM can unwrap.
        static let hardware = Flags(rawValue: ManagedKeyValue.hardwareFlag)
    }

    var flags: Flags
    var algorithm: KeyAlgorithm
    var purposes: KeyPurposes
    var publicKey: [UInt8]
    /// Present exactly when `flags` contains `.invalidatedByPassphraseChange`.
    var bindingCheck: [UInt8]?

    static let bindingCheckByteCount = 32

    static func bindingCheck(for bindingKey: SecretBytes) -> [UInt8] {
        Crypto.keyedDigest(Array("lockbox managed-key binding check".utf8), key: bindingKey)
    }

    private var header: [UInt8] {
        var bytes = ManagedKeyValue.magic
        bytes += [ManagedKeyValue.version, flags.rawValue, algorithm.code, purposes.rawValue, UInt8(publicKey.count)]
        bytes += publicKey
        if let bindingCheck { bytes += bindingCheck }
        return bytes
    }

    /// The stored value for `secret`, sealed with `bindingKey` when the key is bound.
    func encode(secret: SecretBytes, bindingKey: SecretBytes?) -> SecretBytes {
        let header = self.header
        if let bindingKey {
            let sealed = Crypto.seal(secret, key: bindingKey, associatedData: header)
            return SecretBytes(copying: header + sealed)
        }
        return SecretBytes(capacity: header.count + secret.count) { buffer in
            buffer.copyBytes(from: header)
            secret.withUnsafeBytes { bytes in
                UnsafeMutableRawBufferPointer(rebasing: buffer[header.count...]).copyMemory(from: bytes)
            }
            return header.count + secret.count
        }
    }

    /// Parses a stored value; the secret part is returned as stored (sealed when bound).
    static func decode(_ value: SecretBytes) throws(LockboxError) -> (envelope: KeyEnvelope, secretPart: SecretBytes) {
        let damaged = LockboxError.integrity("A stored key")
        return try value.withUnsafeBytes { (bytes) throws(LockboxError) in
            let magic = ManagedKeyValue.magic
            guard bytes.count > magic.count + 5, bytes.starts(with: magic) else {
                throw LockboxError(.param, "This keychain item is not a key made by Lockbox's key API.")
            }
            var offset = magic.count
            guard bytes[offset] == ManagedKeyValue.version else {
                throw LockboxError(.param, "This key was made by a newer Lockbox; update Lockbox to use it.")
            }
            let flags = Flags(rawValue: bytes[offset + 1])
            guard let algorithm = KeyAlgorithm(code: bytes[offset + 2]) else { throw damaged }
            let purposes = KeyPurposes(rawValue: bytes[offset + 3])
            guard algorithm.possiblePurposes.isSuperset(of: purposes) else { throw damaged }
            let publicCount = Int(bytes[offset + 4])
            offset += 5
            guard publicCount == algorithm.publicKeyByteCount, bytes.count - offset >= publicCount else { throw damaged }
            let publicKey = Array(bytes[offset..<offset + publicCount])
            offset += publicCount
            var check: [UInt8]?
            if flags.contains(.invalidatedByPassphraseChange) {
                guard bytes.count - offset >= bindingCheckByteCount else { throw damaged }
                check = Array(bytes[offset..<offset + bindingCheckByteCount])
                offset += bindingCheckByteCount
            }
            let envelope = KeyEnvelope(flags: flags, algorithm: algorithm, purposes: purposes, publicKey: publicKey, bindingCheck: check)
            return (envelope, SecretBytes(copying: UnsafeRawBufferPointer(rebasing: bytes[offset...])))
        }
    }

    /// The private key, unsealed with `bindingKey` when the key is bound.
    /// - Throws: `invalidKeyRef` when the passphrase changed or was removed since the key was
    ///   made; `decode` when the value is damaged.
    func openSecret(_ secretPart: SecretBytes, bindingKey: () throws(LockboxError) -> SecretBytes?) throws(LockboxError) -> SecretBytes {
        guard let check = bindingCheck else { return secretPart }
        guard let key = try bindingKey(), constantTimeEqual(Self.bindingCheck(for: key), check) else {
            throw LockboxError(
                .invalidKeyRef,
                "This key was invalidated: it was bound to the keychain passphrase, which has been changed or removed since. "
                    + "Delete the key and make a new one.")
        }
        let sealed = secretPart.withUnsafeBytes { Array($0) }
        guard let secret = try? Crypto.open(sealed, key: key, associatedData: header) else {
            throw LockboxError.integrity("A stored key")
        }
        return secret
    }

    private func constantTimeEqual(_ left: [UInt8], _ right: [UInt8]) -> Bool {
        left.withUnsafeBytes { l in right.withUnsafeBytes { r in constantTimeEquals(l, r) } }
    }
}

/// The public description of a managed key, kept in the item's `kSecAttrGeneric` so keys can
/// be listed and their public halves exported without opening (or authenticating for) the
/// private value: `"lbk1" | algorithm | purposes | flags | public key length | public key`.
/// It is an attribute like any other; the stored value stays the authority, and every use
/// of the private key checks that the two agree.
struct KeyDescriptor: Equatable {
    var algorithm: KeyAlgorithm
    var purposes: KeyPurposes
    var flags: KeyEnvelope.Flags
    var publicKey: [UInt8]

    static let magic = Array("lbk1".utf8)

    var encoded: Data {
        Data(Self.magic + [algorithm.code, purposes.rawValue, flags.rawValue, UInt8(publicKey.count)] + publicKey)
    }

    init(algorithm: KeyAlgorithm, purposes: KeyPurposes, flags: KeyEnvelope.Flags, publicKey: [UInt8]) {
        self.algorithm = algorithm
        self.purposes = purposes
        self.flags = flags
        self.publicKey = publicKey
    }

    init?(_ data: Data?) {
        guard let data else { return nil }
        let bytes = Array(data)
        guard bytes.count >= Self.magic.count + 4, bytes.starts(with: Self.magic),
            let algorithm = KeyAlgorithm(code: bytes[4])
        else { return nil }
        let count = Int(bytes[7])
        // Purposes its algorithm cannot serve (a sign purpose on an X25519 key) make no key:
        // the operations rely on the pair being one Lockbox makes.
        guard count == algorithm.publicKeyByteCount, bytes.count == 8 + count,
            algorithm.possiblePurposes.isSuperset(of: KeyPurposes(rawValue: bytes[5]))
        else { return nil }
        self.init(
            algorithm: algorithm, purposes: KeyPurposes(rawValue: bytes[5]), flags: KeyEnvelope.Flags(rawValue: bytes[6]),
            publicKey: Array(bytes[8...]))
    }
}
