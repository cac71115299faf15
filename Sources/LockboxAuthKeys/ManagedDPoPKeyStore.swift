import Foundation
import LockboxAuth
import LockboxCore
import LockboxKeys

/// Sessions' DPoP keys as managed keys: non-extractable P-256 keys (ES256) in a key store,
/// labelled with the session (``CredentialKey/storageAccount``) under
/// ``ManagedProofSigningKey/applicationTag``. Which of a session's keys its tokens are bound to
/// is recorded beside them, in the same vault, as the key's JWK thumbprint (public, not secret).
///
/// ```swift
/// let manager = CredentialsManager(
///     configuration: configuration, tokenStore: tokenStore,
///     dpopKeys: ManagedDPoPKeyStore(keys: SoftwareKeyStore(vault: vault)))
/// ```
public struct ManagedDPoPKeyStore: DPoPKeyStore {
    /// The key store the session keys live in.
    public let keys: SoftwareKeyStore
    /// The keychain service of the records naming each session's bound key.
    public static let bindingService = "lockbox.oauth.dpop-key"

    /// Session keys in `keys`.
    public init(keys: SoftwareKeyStore) {
        self.keys = keys
    }

    public func makeKey(for session: CredentialKey) async throws(LockboxError) -> any ProofSigningKey {
        var specification = KeySpecification(algorithm: .p256, purposes: [.sign])
        specification.applicationTag = ManagedProofSigningKey.applicationTag
        specification.label = session.storageAccount
        specification.accessibility = .afterFirstUnlockThisDeviceOnly
        return try ManagedProofSigningKey(await keys.generate(specification))
    }

    public func boundKey(for session: CredentialKey) async throws(LockboxError) -> (any ProofSigningKey)? {
        guard let bound = try await record(session).read() else { return nil }
        return try await sessionKeys(session).first { $0.jwkThumbprint == bound }
    }

    public func bind(_ key: any ProofSigningKey, to session: CredentialKey) async throws(LockboxError) {
        let thumbprint = key.jwkThumbprint
        let candidates = try await sessionKeys(session)
        guard candidates.contains(where: { $0.jwkThumbprint == thumbprint }) else {
            throw LockboxError(.param, "The DPoP key to bind was not made for this session by this key store.")
        }
        try await record(session).write(thumbprint)
        for other in candidates where other.jwkThumbprint != thumbprint {
            try await other.key.delete()
        }
    }

    public func deleteKeys(for session: CredentialKey) async throws(LockboxError) {
        try await record(session).delete()
        for key in try await sessionKeys(session) {
            try await key.key.delete()
        }
    }

    public func discard(_ key: any ProofSigningKey, of session: CredentialKey) async throws(LockboxError) {
        let thumbprint = key.jwkThumbprint
        guard try await record(session).read() != thumbprint else { return }
        for candidate in try await sessionKeys(session) where candidate.jwkThumbprint == thumbprint {
            try await candidate.key.delete()
        }
    }

    private func sessionKeys(_ session: CredentialKey) async throws(LockboxError) -> [ManagedProofSigningKey] {
        let found: [ManagedKey]
        do {
            found = try await keys.keys(applicationTag: ManagedProofSigningKey.applicationTag, label: session.storageAccount)
        } catch LockboxError.itemNotFound {
            return []
        }
        return found.compactMap { try? ManagedProofSigningKey($0) }
    }

    private func record(_ session: CredentialKey) -> SessionKeyRecord {
        SessionKeyRecord(service: Self.bindingService, session: session, store: keys.vault.async)
    }
}
