import Foundation
import LockboxCore

/// Where a refresh token lives between runs: the small interface the credential lifecycle
/// needs, and nothing more. Access tokens are never stored.
///
/// The calls are async: ``CredentialsManager`` is an actor on Swift's cooperative pool, and an
/// implementation that blocks (a database busy wait, a D-Bus call) must do so off the pool, as
/// ``ItemStoreTokenStore`` does through `AsyncItemStore`.
///
/// Errors keep their meaning: a locked store throws `interactionNotAllowed`, which the
/// lifecycle treats as "try later", never as "signed out".
public protocol TokenStore: Sendable {
    /// The stored refresh token, or `nil` when there is none.
    func refreshToken() async throws(LockboxError) -> SecretBytes?
    /// Stores `token`, replacing any previous one, durably before returning.
    func saveRefreshToken(_ token: SecretBytes) async throws(LockboxError)
    /// Removes the stored credentials; no error when there were none.
    func clearCredentials() async throws(LockboxError)
    /// Whether a refresh token is stored, without reading it.
    func hasCredentials() async throws(LockboxError) -> Bool
    /// Stores `token` as ``saveRefreshToken(_:)`` does, with what is known of the session
    /// beside it (not secret; `lockbox auth status` shows it). The default ignores `details`.
    func saveRefreshToken(_ token: SecretBytes, details: SessionDetails) async throws(LockboxError)
}

extension TokenStore {
    /// Stores the refresh token and drops `details`: for stores that keep no session details.
    public func saveRefreshToken(_ token: SecretBytes, details: SessionDetails) async throws(LockboxError) {
        try await saveRefreshToken(token)
    }
}

/// What is known of a session besides its tokens: shown by `lockbox auth status`, never secret.
public struct SessionDetails: Sendable, Hashable, Codable {
    /// The ID token's `sub` claim from the sign-in, when the server sent an ID token.
    public var subject: String?
    /// True once a refresh returned a new refresh token; nil until a refresh was seen.
    public var refreshTokenRotates: Bool?

    /// Details with what is known so far.
    public init(subject: String? = nil, refreshTokenRotates: Bool? = nil) {
        self.subject = subject
        self.refreshTokenRotates = refreshTokenRotates
    }
}

/// Names one account's credentials: an issuer, a client and an account label.
public struct CredentialKey: Sendable, Hashable, Codable, CustomStringConvertible {
    /// The issuer's URL, as given.
    public var issuer: String
    /// The client's identifier.
    public var clientID: String
    /// A label for the account; `default` when an app has one account per client.
    public var account: String

    /// A key for `clientID` at `issuer`, under `account`.
    public init(issuer: String, clientID: String, account: String = "default") {
        self.issuer = issuer.hasSuffix("/") ? String(issuer.dropLast()) : issuer
        self.clientID = clientID
        self.account = account
    }

    /// The key of `configuration`'s client, under `account`.
    public init(configuration: ClientConfiguration, account: String = "default") {
        self.init(issuer: configuration.issuer.absoluteString, clientID: configuration.clientID, account: account)
    }

    /// The keychain account attribute and the access-token cache's identity: the three parts,
    /// unambiguous (`<length>:<issuer>|<length>:<client id>|<account>`).
    public var storageAccount: String {
        "\(issuer.utf8.count):\(issuer)|\(clientID.utf8.count):\(clientID)|\(account)"
    }

    /// A file-name-safe name for cross-process locks.
    var lockName: String {
        Array(SHA256.hash(Array(storageAccount.utf8)).prefix(16)).hexString
    }

    /// `client@issuer (account)`.
    public var description: String { "\(clientID)@\(issuer) (\(account))" }
}

/// A ``TokenStore`` over any `ItemStore` (the vault, the Secret Service, ...): one generic
/// password per issuer, client and account, under the service ``ItemStoreTokenStore/service``.
///
/// The item's `generic` attribute holds the non-secret client configuration, so tools such as
/// `lockbox auth status` can list sessions without reading a token.
public struct ItemStoreTokenStore: TokenStore {
    /// The keychain service of refresh-token items.
    public static let service = "lockbox.oauth.refresh-token"

    /// The item store the refresh token lives in.
    public let store: any ItemStore
    /// Which session this store holds.
    public let key: CredentialKey
    /// The accessibility of the stored refresh token.
    public let accessibility: Accessibility
    /// The client configuration stored beside the token, if any.
    public let configuration: ClientConfiguration?

    /// A token store for the session `key` in `store`.
    ///
    /// - Parameters:
    ///   - store: the item store the refresh token lives in.
    ///   - key: which session: issuer, client and account.
    ///   - accessibility: `.afterFirstUnlockThisDeviceOnly` by default: a background service can
    ///     refresh while the session is locked, and the token never leaves this machine.
    ///   - configuration: stored next to the token (not secret) for listing sessions.
    public init(
        store: any ItemStore, key: CredentialKey, accessibility: Accessibility = .afterFirstUnlockThisDeviceOnly,
        configuration: ClientConfiguration? = nil
    ) {
        self.store = store
        self.key = key
        self.accessibility = accessibility
        self.configuration = configuration
    }

    private var query: Query {
        Query.genericPassword(service: Self.service, account: key.storageAccount)
    }

    // The async calls (the TokenStore conformance) go through `store.async`, off the
    // cooperative pool; the synchronous twins serve synchronous callers (tools, campaigns).

    /// The stored refresh token; nil when there is none.
    /// - Throws: `errSecInteractionNotAllowed` when the store is locked (never nil then).
    public func refreshToken() async throws(LockboxError) -> SecretBytes? {
        do {
            return try await store.async.data(matching: query)
        } catch LockboxError.itemNotFound {
            return nil
        }
    }

    /// The stored refresh token; nil when there is none (synchronous).
    public func refreshToken() throws(LockboxError) -> SecretBytes? {
        do {
            return try store.data(matching: query)
        } catch LockboxError.itemNotFound {
            return nil
        }
    }

    /// Stores `token`, replacing the earlier one.
    public func saveRefreshToken(_ token: SecretBytes) async throws(LockboxError) {
        try await saveRefreshToken(token, details: SessionDetails())
    }

    /// Stores `token` with `details`. A refresh's save (``SessionDetails/refreshTokenRotates``
    /// set) keeps the stored subject: a refresh knows whether the token rotated, not who signed
    /// in. A sign-in's save replaces both.
    public func saveRefreshToken(_ token: SecretBytes, details: SessionDetails) async throws(LockboxError) {
        let store = self.store.async
        var details = details
        if details.subject == nil, details.refreshTokenRotates != nil, let stored = try? await storedDetails() {
            details.subject = stored.subject
        }
        do {
            try await store.update(matching: query, to: replacement(token, details: details))
        } catch LockboxError.itemNotFound {
            do {
                try await store.add(newItem(token, details: details))
            } catch LockboxError.duplicateItem {
                // Another process added it between our update and add: replace its value.
                try await store.update(matching: query, to: ItemUpdate(data: token))
            }
        }
    }

    /// Stores `token`, replacing the earlier one (synchronous).
    public func saveRefreshToken(_ token: SecretBytes) throws(LockboxError) {
        do {
            try store.update(matching: query, to: replacement(token))
        } catch LockboxError.itemNotFound {
            do {
                try store.add(newItem(token))
            } catch LockboxError.duplicateItem {
                try store.update(matching: query, to: ItemUpdate(data: token))
            }
        }
    }

    /// Removes the stored token and configuration.
    public func clearCredentials() async throws(LockboxError) {
        do {
            try await store.async.delete(matching: query)
        } catch LockboxError.itemNotFound {}
    }

    /// Removes the stored token and configuration (synchronous).
    public func clearCredentials() throws(LockboxError) {
        do {
            try store.delete(matching: query)
        } catch LockboxError.itemNotFound {}
    }

    /// Whether a refresh token is stored.
    public func hasCredentials() async throws(LockboxError) -> Bool {
        try await store.async.contains(query)
    }

    /// Whether a refresh token is stored (synchronous).
    public func hasCredentials() throws(LockboxError) -> Bool {
        try store.contains(query)
    }

    private func replacement(_ token: SecretBytes, details: SessionDetails? = nil) -> ItemUpdate {
        var attributes = ItemAttributes(service: nil, account: nil)
        attributes.generic = configurationData(details)
        return ItemUpdate(attributes: attributes, data: token)
    }

    private func newItem(_ token: SecretBytes, details: SessionDetails? = nil) -> Item {
        var item = Item.genericPassword(
            service: Self.service, account: key.storageAccount, data: token, accessibility: accessibility,
            label: "OAuth refresh token: \(key)")
        item.attributes.generic = configurationData(details)
        return item
    }

    private func configurationData(_ details: SessionDetails?) -> Data? {
        guard let configuration else { return nil }
        return try? JSONEncoder().encode(StoredSession.Metadata(key: key, configuration: configuration, details: details))
    }

    /// The details stored with the token, read from its attributes only.
    private func storedDetails() async throws(LockboxError) -> SessionDetails? {
        var query = self.query
        query.returning = .attributes
        guard let generic = try await store.async.item(matching: query).attributes.generic else { return nil }
        return (try? JSONDecoder().decode(StoredSession.Metadata.self, from: generic))?.details
    }
}

/// A session found in a store: its key and configuration, never its token.
public struct StoredSession: Sendable, Hashable {
    /// Which session this is.
    public let key: CredentialKey
    /// Its client configuration, when one was stored.
    public let configuration: ClientConfiguration?
    /// What was stored of the session beside its token.
    public let details: SessionDetails?

    struct Metadata: Codable {
        let key: CredentialKey
        let configuration: ClientConfiguration
        var details: SessionDetails?
    }

    /// Every session stored in `store`, read from attributes only, off the cooperative pool.
    /// - Throws: `interactionNotAllowed` when the store is locked.
    public static func all(in store: any ItemStore) async throws(LockboxError) -> [StoredSession] {
        var query = Query.genericPassword(service: ItemStoreTokenStore.service)
        query.limit = .all
        query.returning = .attributes
        let items: [Item]
        do {
            items = try await store.async.items(matching: query)
        } catch LockboxError.itemNotFound {
            return []
        }
        return items.compactMap { item in
            guard let generic = item.attributes.generic,
                let metadata = try? JSONDecoder().decode(Metadata.self, from: generic)
            else { return nil }
            return StoredSession(key: metadata.key, configuration: metadata.configuration, details: metadata.details)
        }
    }
}
