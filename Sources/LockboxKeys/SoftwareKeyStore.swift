import FoundationEssentials
import KeyCrypto
import LockboxCore
import LockboxVault
import Synchronization
import TPMAccess
import VaultCrypto

/// Managed keys kept in a vault, computed in software (OpenSSL for P-256 and AES-GCM,
/// libsodium for Ed25519 and X25519), or, for a specification with ``KeyToken/hardware``, made
/// and used inside the machine's TPM 2.0. A copy of the vault file and its passphrase is a
/// copy of the software keys, never of the hardware ones (docs/KEYS.md).
///
/// Each key is a vault item of class `.key` whose value is the private key, sealed like every
/// item; a non-extractable key's value is refused to every other reader of the vault.
///
/// ```swift
/// let keys = SoftwareKeyStore(vault: vault)
/// var specification = KeySpecification(algorithm: .ed25519, purposes: [.sign, .verify])
/// specification.applicationTag = Data("deploy".utf8)
/// let key = try keys.generate(specification)
/// let line = try key.publicKey!.openSSHRepresentation(comment: "deploy")
/// ```
public final class SoftwareKeyStore: Sendable {
    public let vault: Vault
    /// The TPM that hardware keys are made in and used with.
    let tpm: TPM
    /// Keys opened for an operation, kept for the next ones while the vault's
    /// ``KeyUseStamp`` stays the same (unlocked, nothing written since), so a signature costs
    /// a stamp check instead of a read, an unseal and an import (for a hardware key, the read of
    /// its TPM blob; the TPM keeps the key itself loaded); after writes to other items, while
    /// the key's own row and the header keep the versions it was opened under. Never for access-controlled
    /// keys: each of their uses asks, within the reuse window. Dropped at lock.
    private let opened = Mutex<[Data: OpenedKey]>([:])
    private static let openedLimit = 32
    /// The last answers of ``keys(applicationTag:label:)``, by its arguments, reused while the
    /// stamp stays the same (an SSH agent lists its keys for every `ssh-add -L` and `ssh`;
    /// reading and unsealing each key's row again costs more than the rest of the answer). A
    /// write of any key's row here, any write by another connection, or a lock makes the next
    /// call read again; a locked vault is never answered from here.
    private let listings = Mutex<[Listing: (stamp: KeyUseStamp, keys: [ManagedKey])]>([:])
    private static let listingLimit = 16
    private struct Listing: Hashable {
        let applicationTag: Data?
        let label: String?
    }
    private let readCount = Mutex(0)
    private let rowCheckCount = Mutex(0)

    /// How many times a key's private bytes were read from the vault (not taken from the keys
    /// kept opened): for tests of that cache.
    package var keyReads: Int { readCount.withLock { $0 } }
    /// How many times ``keys(applicationTag:label:)`` read the vault (not a kept listing): for
    /// tests of that cache.
    package var listingReads: Int { listingReadCount.withLock { $0 } }
    private let listingReadCount = Mutex(0)
    /// How many times a kept key's row was checked because the vault's stamp had moved: for
    /// tests of that cache.
    package var keyRowChecks: Int { rowCheckCount.withLock { $0 } }

    /// - Parameter tpmDevice: the TPM's TCTI configuration for hardware keys; nil is
    ///   `LOCKBOX_TPM_TCTI`, else `device:/dev/tpmrm0`.
    public init(vault: Vault, tpmDevice: String? = nil) {
        self.vault = vault
        tpm = TPM.at(tpmDevice)
        vault.lockObservers.add(self) { [weak self] in self?.forgetOpenedKeys() }
    }

    deinit {
        vault.lockObservers.remove(self)
    }

    /// Drops the keys kept opened and the listings kept (they are dropped at lock anyway).
    public func forgetOpenedKeys() {
        opened.withLock { $0.removeAll() }
        listings.withLock { $0.removeAll() }
    }

    /// Whether keys with ``KeyToken/hardware`` can be made here (a TPM 2.0 that answers and
    /// can make P-256 keys), and if not why. Asks the TPM, so it takes milliseconds.
    /// - Parameter device: the TPM's TCTI configuration; nil is `LOCKBOX_TPM_TCTI`, else
    ///   `device:/dev/tpmrm0`.
    public static func hardwareAvailability(device: String? = nil) -> HardwareKeyAvailability {
        let tpm = TPM.at(device)
        let (available, reason) = tpm.availability()
        return HardwareKeyAvailability(isAvailable: available, reason: reason, device: tpm.device)
    }

    /// ``hardwareAvailability(device:)`` of this store's TPM.
    public var hardwareAvailability: HardwareKeyAvailability {
        Self.hardwareAvailability(device: tpm.device)
    }

    /// Makes a new key and stores it.
    /// - Throws: `param` when the purposes do not fit the algorithm; `notAvailable` for a key
    ///   bound to the passphrase (or access-controlled) in a keychain without one;
    ///   `interactionNotAllowed` when the vault is locked.
    public func generate(_ specification: KeySpecification) throws(LockboxError) -> ManagedKey {
        let algorithm = specification.algorithm
        if let refusal = synchronizationCheck(specification) { throw refusal }
        guard !specification.purposes.isEmpty else {
            throw LockboxError(.param, "A key needs at least one purpose (sign, verify, encrypt, decrypt, keyAgreement).")
        }
        guard algorithm.possiblePurposes.isSuperset(of: specification.purposes) else {
            throw LockboxError(
                .param,
                "A \(algorithm) key can be made for \(algorithm.possiblePurposes) only, not \(specification.purposes.subtracting(algorithm.possiblePurposes)).")
        }
        var flags: KeyEnvelope.Flags = []
        if !specification.isExtractable { flags.insert(.nonExtractable) }
        if specification.token == .hardware {
            guard algorithm == .p256, specification.purposes.isSubset(of: [.sign, .verify]) else {
                throw LockboxError(
                    .param,
                    "A hardware (TPM) key is a P-256 key for sign and verify; make \(algorithm) keys for \(specification.purposes) in software.")
            }
            guard !specification.isExtractable else {
                throw LockboxError(.param, "A hardware (TPM) key cannot be extractable: its private half never leaves the TPM.")
            }
            flags.insert(.hardware)
        }
        var bindingKey: SecretBytes?
        if specification.isInvalidatedByPassphraseChange {
            flags.insert(.invalidatedByPassphraseChange)
            guard let key = try vault.passphraseBindingKey() else {
                throw LockboxError(
                    .notAvailable,
                    "A key invalidated by a passphrase change needs a passphrase, and this keychain has none. "
                        + "Set one with `lockbox set-passphrase`.")
            }
            bindingKey = key
        }

        let secret: SecretBytes
        let publicKey: [UInt8]
        switch algorithm {
        case .p256 where specification.token == .hardware:
            let availability = tpm.availability()
            guard availability.isAvailable else {
                throw LockboxError(
                    .notAvailable,
                    "A hardware key was asked for, and none can be made here: \(availability.reason) "
                        + "Make a software key (KeyToken.software) if that is acceptable; Lockbox never falls back to one by itself.")
            }
            let made = try tpm.makeSigningKey()
            (secret, publicKey) = (SecretBytes(copying: made.blob), made.publicKey)
        case .p256:
            (secret, publicKey) = try P256.generate()
        case .ed25519:
            (secret, publicKey) = Curve25519.generateSigningKey()
        case .x25519:
            (secret, publicKey) = Curve25519.generateAgreementKey()
        case .aes256GCM:
            secret = try AESGCM.generateKey()
            publicKey = []
        }
        return try store(secret: secret, publicKey: publicKey, flags: flags, bindingKey: bindingKey, specification)
    }

    /// Stores a P-256 private key made elsewhere, given as Apple's external representation
    /// `04 || X || Y || D` (97 bytes; what `SecKeyCopyExternalRepresentation` gives on iOS).
    /// - Throws: `param` when the bytes are not a P-256 private key whose public point is the
    ///   one given, or the specification is not a P-256 one.
    public func importKey(p256PrivateRepresentation representation: SecretBytes, _ specification: KeySpecification)
        throws(LockboxError) -> ManagedKey
    {
        if let refusal = synchronizationCheck(specification) { throw refusal }
        guard specification.algorithm == .p256, algorithmCheck(specification) == nil else {
            throw algorithmCheck(specification)
                ?? LockboxError(.param, "Only P-256 private keys can be imported; this specification is for \(specification.algorithm).")
        }
        guard specification.isInvalidatedByPassphraseChange == false else {
            throw LockboxError(.param, "An imported key cannot be bound to the passphrase: its bytes already exist outside the keychain.")
        }
        guard representation.count == P256.privateRepresentationByteCount else {
            throw LockboxError(.param, "A P-256 private key is 97 bytes (04 || X || Y || D); got \(representation.count).")
        }
        let publicKey = representation.withUnsafeBytes { Array($0[0..<P256.publicKeyByteCount]) }
        // The scalar must produce the point: a signature by it verifies under the point.
        let probe: [UInt8] = Array("lockbox key import".utf8)
        guard P256.isValidPublicKey(publicKey),
            let signature = try? P256.sign(probe, privateRepresentation: representation),
            (try? P256.isValidSignature(signature, for: probe, publicKey: publicKey)) == true
        else {
            throw LockboxError(.param, "The bytes are not a P-256 private key: its public point does not match its scalar.")
        }
        var flags: KeyEnvelope.Flags = []
        if !specification.isExtractable { flags.insert(.nonExtractable) }
        return try store(secret: representation, publicKey: publicKey, flags: flags, bindingKey: nil, specification)
    }

    /// Why a key so specified cannot be synchronizable, if it is asked to be.
    private func synchronizationCheck(_ specification: KeySpecification) -> LockboxError? {
        guard specification.isSynchronizable else { return nil }
        if specification.token == .hardware {
            return LockboxError(
                .param,
                "A hardware (TPM) key cannot be synchronizable: its private half never leaves this machine's TPM. "
                    + "Make a software key to sync it, or keep this one local.")
        }
        if specification.accessibility.isThisDeviceOnly {
            return LockboxError(.param, "A synchronizable key cannot use a ThisDeviceOnly accessibility.")
        }
        if specification.accessControl != nil {
            return LockboxError(
                .param, "A key with access control cannot be synchronizable: its use needs this machine's user. Drop one of the two.")
        }
        if specification.isInvalidatedByPassphraseChange {
            return LockboxError(
                .param, "A key bound to this keychain's passphrase cannot be synchronizable: no other device has that passphrase's key.")
        }
        return nil
    }

    /// The reason `specification` cannot make a key, if any.
    private func algorithmCheck(_ specification: KeySpecification) -> LockboxError? {
        let algorithm = specification.algorithm
        guard !specification.purposes.isEmpty else {
            return LockboxError(.param, "A key needs at least one purpose (sign, verify, encrypt, decrypt, keyAgreement).")
        }
        guard algorithm.possiblePurposes.isSuperset(of: specification.purposes) else {
            return LockboxError(
                .param,
                "A \(algorithm) key can be made for \(algorithm.possiblePurposes) only, not \(specification.purposes.subtracting(algorithm.possiblePurposes)).")
        }
        return nil
    }

    private func store(
        secret: SecretBytes, publicKey: [UInt8], flags: KeyEnvelope.Flags, bindingKey: SecretBytes?, _ specification: KeySpecification
    ) throws(LockboxError) -> ManagedKey {
        let algorithm = specification.algorithm
        let envelope = KeyEnvelope(
            flags: flags, algorithm: algorithm, purposes: specification.purposes, publicKey: publicKey,
            bindingCheck: bindingKey.map(KeyEnvelope.bindingCheck(for:)))
        let descriptor = KeyDescriptor(algorithm: algorithm, purposes: specification.purposes, flags: flags, publicKey: publicKey)

        var attributes = ItemAttributes(label: specification.label, accessibility: specification.accessibility, accessGroup: specification.accessGroup)
        attributes.keyClass = algorithm.isAsymmetric ? .private : .symmetric
        attributes.keyType = algorithm.keyType
        attributes.keySizeInBits = 256
        attributes.applicationTag = specification.applicationTag
        // Apple's application label of an asymmetric key is the SHA-1 of its public key; a
        // symmetric key gets random bytes. Either way it tells keys with one tag apart.
        attributes.applicationLabel = Data(algorithm.isAsymmetric ? MessageDigest.sha1(publicKey) : Crypto.randomBytes(20))
        attributes.generic = descriptor.encoded
        attributes.synchronizable = specification.isSynchronizable
        var item = Item(.key, attributes: attributes, data: envelope.encode(secret: secret, bindingKey: bindingKey))
        item.accessControl = specification.accessControl
        try vault.add(item)

        var query = Query(.key, returning: [.attributes, .persistentReference], synchronizable: .any)
        query.attributes.keyClass = attributes.keyClass
        query.attributes.keyType = attributes.keyType
        query.attributes.keySizeInBits = 256
        query.attributes.applicationLabel = attributes.applicationLabel
        query.attributes.applicationTag = attributes.applicationTag
        query.attributes.accessGroup = specification.accessGroup
        guard let stored = try vault.items(matching: query).first, let key = ManagedKey(stored, store: self) else {
            throw LockboxError.integrity("The new key")
        }
        return key
    }

    /// The managed keys matching `query` (of class `.key`; its `returning` and `limit` are set
    /// here): the SecItem layer's `kSecReturnRef` for keys.
    /// - Returns: an empty array when there is none.
    public func keys(matching query: Query) throws(LockboxError) -> [ManagedKey] {
        var query = query
        query.itemClass = .key
        query.limit = .all
        query.returning = [.attributes, .persistentReference]
        do {
            return try vault.items(matching: query).compactMap { ManagedKey($0, store: self) }
        } catch LockboxError.itemNotFound {
            return []
        }
    }

    /// The private (or symmetric) key's bytes of an extractable key: P-256 as
    /// `04 || X || Y || D`, Ed25519 and X25519 as libsodium's secret key, AES as the 32 bytes.
    /// - Throws: `param` for a non-extractable key (the default), whose bytes never leave Lockbox.
    public func exportPrivateKey(of key: ManagedKey, context: AuthenticationContext? = nil) throws(LockboxError) -> SecretBytes {
        guard key.isExtractable else {
            throw LockboxError(
                .param, "This key is not extractable: its private bytes never leave the keychain. Use it through sign, decrypt or key agreement.")
        }
        return try privateKey(of: key, for: [], context: context)
    }

    /// The managed keys with this application tag and label (either may be nil: any).
    /// - Returns: an empty array when there is none.
    /// - Throws: `interactionNotAllowed` when the vault is locked (never an empty answer).
    public func keys(applicationTag: Data? = nil, label: String? = nil) throws(LockboxError) -> [ManagedKey] {
        let listing = Listing(applicationTag: applicationTag, label: label)
        // Taken before the read: a write in between makes the next call read again.
        let stamp = try vault.keyUseStamp()
        if let stamp, let kept = listings.withLock({ $0[listing] }), kept.stamp == stamp {
            return kept.keys
        }
        listingReadCount.withLock { $0 += 1 }
        // Synchronizable keys too: a key synced from another device is found by its tag.
        var query = Query(.key, limit: .all, returning: [.attributes, .persistentReference], synchronizable: .any)
        query.attributes.applicationTag = applicationTag
        query.attributes.label = label
        let keys: [ManagedKey]
        do {
            keys = try vault.items(matching: query).compactMap { ManagedKey($0, store: self) }
        } catch LockboxError.itemNotFound {
            keys = []
        }
        if let stamp {
            listings.withLock { listings in
                if listings.count >= Self.listingLimit { listings.removeAll() }
                listings[listing] = (stamp, keys)
            }
        }
        return keys
    }

    /// The one managed key with this application tag (and label, when given).
    /// - Throws: `itemNotFound` when there is none; `interactionNotAllowed` when locked.
    public func key(applicationTag: Data, label: String? = nil) throws(LockboxError) -> ManagedKey {
        guard let key = try keys(applicationTag: applicationTag, label: label).first else {
            throw LockboxError(.itemNotFound, "No key with this application tag is in the keychain.")
        }
        return key
    }

    /// Deletes the key. Access control does not apply to deleting, as on iOS.
    /// - Throws: `itemNotFound` when it was already deleted.
    public func delete(_ key: ManagedKey, context: AuthenticationContext? = nil) throws(LockboxError) {
        try vault.delete(matching: key.itemQuery(returning: [], context: context))
    }

    /// The key's private bytes (and for P-256, the key imported into OpenSSL), from the keys
    /// kept opened when the vault is unchanged and still unlocked, else read and opened anew.
    func openedKey(of key: ManagedKey, for purpose: KeyPurposes, context: AuthenticationContext?) throws(LockboxError) -> OpenedKey {
        try key.require(purpose)
        let cacheable = key.accessControl == nil
        guard cacheable else { return try OpenedKey(key, secret: privateKey(of: key, for: purpose, context: context)) }
        // The stamp is taken before the read: a write in between makes the next use read again.
        guard let stamp = try vault.keyUseStamp() else {
            // Locked: nothing opened under the last unlock is kept. The key is read as its own
            // class allows: refused (locked) for `whenUnlocked`, opened for `afterFirstUnlock`
            // and `always`, whose class keys stay; opened too when an unlock came in between.
            // Either way it is not kept, as there is no unlock to tie it to.
            forgetOpenedKeys()
            return try OpenedKey(key, secret: privateKey(of: key, for: purpose, context: context))
        }
        if var kept = opened.withLock({ $0[key.persistentReference] }), let keptStamp = kept.stamp, kept.descriptor == key.descriptor {
            if keptStamp == stamp { return kept }
            // Something was written since, while the vault stayed unlocked: the key is still
            // good when its own row is the one it was opened from (a row check, not a read,
            // an unseal and an import).
            if keptStamp.sameUnlock(as: stamp), let version = kept.version,
                try rowVersion(of: key) == version
            {
                kept.stamp = stamp
                opened.withLock { $0[key.persistentReference] = kept }
                return kept
            }
        }
        // The version is taken before the read too: a write in between leaves an older one,
        // which makes the next use read again.
        let version = try vault.version(ofItem: key.persistentReference)
        readCount.withLock { $0 += 1 }
        var fresh = try OpenedKey(key, secret: privateKey(of: key, for: purpose, context: context))
        fresh.stamp = stamp
        fresh.version = version
        opened.withLock { opened in
            opened = opened.filter { $0.value.stamp.map { $0.sameUnlock(as: stamp) } ?? false }
            if opened.count >= Self.openedLimit { opened.removeAll() }
            opened[key.persistentReference] = fresh
        }
        return fresh
    }

    private func rowVersion(of key: ManagedKey) throws(LockboxError) -> ItemVersion? {
        rowCheckCount.withLock { $0 += 1 }
        return try vault.version(ofItem: key.persistentReference)
    }

    /// The key's envelope and private bytes, through the vault's key-material path.
    func privateKey(of key: ManagedKey, for purpose: KeyPurposes, context: AuthenticationContext?) throws(LockboxError) -> SecretBytes {
        try key.require(purpose)
        guard let item = try vault.keyMaterial(matching: key.itemQuery(returning: [.data, .attributes], context: context)).first,
            let value = item.data
        else {
            throw LockboxError(.itemNotFound, "The key is no longer in the keychain.")
        }
        let (envelope, secretPart) = try KeyEnvelope.decode(value)
        // The descriptor this handle was made from must describe the stored key.
        guard envelope.algorithm == key.algorithm, envelope.publicKey == key.descriptor.publicKey,
            envelope.flags == key.descriptor.flags, envelope.purposes == key.descriptor.purposes
        else { throw LockboxError.integrity("A stored key") }
        let secret = try envelope.openSecret(secretPart) { () throws(LockboxError) -> SecretBytes? in try vault.passphraseBindingKey() }
        if key.token == .hardware {
            guard !secret.isEmpty else { throw LockboxError.integrity("A stored key") }
        } else {
            guard secret.count == key.algorithm.secretByteCount else { throw LockboxError.integrity("A stored key") }
        }
        return secret
    }
}

extension KeyAlgorithm {
    /// The stored private (or symmetric) key's length.
    var secretByteCount: Int {
        switch self {
        case .p256: P256.privateRepresentationByteCount
        case .ed25519: Curve25519.signingSecretKeyByteCount
        case .x25519: Curve25519.agreementSecretKeyByteCount
        case .aes256GCM: AESGCM.keyByteCount
        }
    }
}

/// A managed key's private bytes, opened, and for P-256 imported into OpenSSL once.
struct OpenedKey: @unchecked Sendable {
    // @unchecked: the OpenSSL key is never changed after the import, and OpenSSL allows
    // concurrent signatures with one key (each makes its own digest context).
    let secret: SecretBytes
    let p256: P256.SigningKey?
    let descriptor: KeyDescriptor
    var stamp: KeyUseStamp?
    /// The row it was opened from and the header it was opened under (``Vault/version(ofItem:)``).
    var version: ItemVersion?

    init(_ key: ManagedKey, secret: SecretBytes) throws(LockboxError) {
        self.secret = secret
        descriptor = key.descriptor
        p256 = key.algorithm == .p256 && key.token == .software && key.purposes.contains(.sign)
            ? try P256.SigningKey(privateRepresentation: secret) : nil
    }
}
