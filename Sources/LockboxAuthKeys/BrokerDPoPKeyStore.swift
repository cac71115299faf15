import Foundation
import LockboxAuth
import LockboxBroker
import LockboxCore
import LockboxKeys

/// Sessions' DPoP keys inside the broker (`lockboxd`, docs/BROKER.md): non-extractable P-256
/// keys (ES256) that the broker makes and signs with, so that the client sends what to sign and
/// never holds the key. Each key carries ``ManagedProofSigningKey/applicationTag`` and a label
/// made of the session (``CredentialKey/storageAccount``) and a random suffix (the broker finds a
/// key by its tag and label); which of a session's keys its tokens are bound to is recorded
/// beside them, through the same broker, as that key's label (public, not secret).
///
/// ```swift
/// let manager = CredentialsManager(
///     configuration: configuration, tokenStore: tokenStore, dpopKeys: BrokerDPoPKeyStore(broker: broker))
/// ```
public struct BrokerDPoPKeyStore: DPoPKeyStore {
    /// The broker the session keys live in.
    public let broker: BrokerStore
    /// The keychain service of the records naming each session's bound key.
    public static let bindingService = "lockbox.oauth.dpop-key.broker"

    /// Session keys inside `broker`.
    public init(broker: BrokerStore) {
        self.broker = broker
    }

    public func makeKey(for session: CredentialKey) async throws(LockboxError) -> any ProofSigningKey {
        // Unique, not secret: the system's random generator suffices.
        let suffix = String(UInt64.random(in: .min ... .max), radix: 16)
        let label = session.storageAccount + Self.separator + String(repeating: "0", count: 16 - suffix.count) + suffix
        let broker = self.broker
        let der = try await BlockingCall.run { () throws(LockboxError) -> Data in
            try broker.generateKey(
                algorithm: "p256", purposes: KeyPurposes.sign.rawValue, applicationTag: ManagedProofSigningKey.applicationTag,
                label: label)
        }
        return try BrokerProofSigningKey(broker: broker, label: label, publicKeyDER: der)
    }

    public func boundKey(for session: CredentialKey) async throws(LockboxError) -> (any ProofSigningKey)? {
        guard let label = try await record(session).read() else { return nil }
        guard Self.isKeyLabel(label, of: session) else {
            throw LockboxError(.decode, "The record of this session's DPoP key names a key of another session.")
        }
        let broker = self.broker
        do {
            let der = try await BlockingCall.run { () throws(LockboxError) -> Data in
                try broker.publicKey(applicationTag: ManagedProofSigningKey.applicationTag, label: label)
            }
            return try BrokerProofSigningKey(broker: broker, label: label, publicKeyDER: der)
        } catch LockboxError.itemNotFound {
            return nil
        }
    }

    public func bind(_ key: any ProofSigningKey, to session: CredentialKey) async throws(LockboxError) {
        guard let key = key as? BrokerProofSigningKey, key.broker === broker, Self.isKeyLabel(key.label, of: session) else {
            throw LockboxError(.param, "The DPoP key to bind was not made for this session by this key store.")
        }
        try await record(session).write(key.label)
        for label in try await sessionKeyLabels(session) where label != key.label {
            try await deleteKey(label: label)
        }
    }

    public func deleteKeys(for session: CredentialKey) async throws(LockboxError) {
        try await record(session).delete()
        for label in try await sessionKeyLabels(session) {
            try await deleteKey(label: label)
        }
    }

    public func discard(_ key: any ProofSigningKey, of session: CredentialKey) async throws(LockboxError) {
        guard let key = key as? BrokerProofSigningKey, key.broker === broker, Self.isKeyLabel(key.label, of: session) else {
            throw LockboxError(.param, "The DPoP key to discard was not made for this session by this key store.")
        }
        guard try await record(session).read() != key.label else { return }
        try await deleteKey(label: key.label)
    }

    // MARK: Internals

    static let separator = "#"

    /// A label ``makeKey(for:)`` makes for `session`: its storage account, the separator and 16
    /// hexadecimal digits.
    static func isKeyLabel(_ label: String, of session: CredentialKey) -> Bool {
        let prefix = session.storageAccount + separator
        guard label.hasPrefix(prefix) else { return false }
        let suffix = label.dropFirst(prefix.count)
        return suffix.count == 16 && suffix.allSatisfy(\.isHexDigit)
    }

    private func sessionKeyLabels(_ session: CredentialKey) async throws(LockboxError) -> [String] {
        var query = Query(.key, limit: .all, returning: [.attributes])
        query.attributes.applicationTag = ManagedProofSigningKey.applicationTag
        do {
            return try await broker.async.items(matching: query).compactMap(\.attributes.label)
                .filter { Self.isKeyLabel($0, of: session) }
        } catch LockboxError.itemNotFound {
            return []
        }
    }

    private func deleteKey(label: String) async throws(LockboxError) {
        var query = Query(.key, limit: .all, returning: [])
        query.attributes.applicationTag = ManagedProofSigningKey.applicationTag
        query.attributes.label = label
        do {
            try await broker.async.delete(matching: query)
        } catch LockboxError.itemNotFound {}
    }

    private func record(_ session: CredentialKey) -> SessionKeyRecord {
        SessionKeyRecord(service: Self.bindingService, session: session, store: broker.async)
    }
}

/// A P-256 key inside the broker as a DPoP signer (ES256): each signature is one request to
/// `lockboxd`, which answers with the signature only.
public struct BrokerProofSigningKey: ProofSigningKey {
    /// The broker that holds the key.
    public let broker: BrokerStore
    /// The key's label (with ``ManagedProofSigningKey/applicationTag``, how the broker finds it).
    public let label: String
    public let publicJWK: [String: String]
    public var jwsAlgorithm: String { "ES256" }

    /// - Throws: `decode` when `publicKeyDER` is not a P-256 public key.
    init(broker: BrokerStore, label: String, publicKeyDER: Data) throws(LockboxError) {
        let point = Array(try PublicKey(derRepresentation: publicKeyDER).rawRepresentation)
        guard point.count == 65, point[0] == 0x04 else {
            throw LockboxError(.decode, "The broker returned a DPoP key that is not a P-256 key.")
        }
        publicJWK = [
            "kty": "EC", "crv": "P-256", "x": ManagedProofSigningKey.base64URL(point[1..<33]),
            "y": ManagedProofSigningKey.base64URL(point[33..<65]),
        ]
        self.broker = broker
        self.label = label
    }

    public func jwsSignature(for signingInput: Data) async throws(LockboxError) -> Data {
        let broker = self.broker
        let label = self.label
        let der = try await BlockingCall.run { () throws(LockboxError) -> Data in
            try broker.sign(signingInput, applicationTag: ManagedProofSigningKey.applicationTag, label: label)
        }
        guard let raw = ManagedProofSigningKey.rawSignature(Array(der)) else {
            throw LockboxError(.decode, "The broker returned a P-256 signature that is not DER.")
        }
        return Data(raw)
    }
}
