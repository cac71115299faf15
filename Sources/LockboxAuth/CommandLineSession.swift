import Foundation
import LockboxCore

/// What the `lockbox` CLI's OAuth verbs do, as values: nothing here prints or words a message
/// for a terminal. The CLI maps each result to output and an exit status.
///
/// | Command | Calls |
/// |---|---|
/// | `lockbox login --issuer URL --client-id ID [--scope S]...` | ``beginLogin(issuer:clientID:scope:)``, ``waitForApproval(_:)``, ``signIn(_:tokens:)`` |
/// | `lockbox login --browser ...` | ``discover(issuer:clientID:scope:)``, ``AuthorizationCodeFlow``, ``signIn(_:tokens:)`` |
/// | `lockbox login --dpop ...` | the same, with ``ClientConfiguration/usesDPoP`` on (the key in ``dpopKeys``) |
/// | `lockbox token [--issuer URL] [--client-id ID]` | ``accessToken(issuer:clientID:)`` (write its bytes to stdout) |
/// | `lockbox token --url URL [--method M] [--nonce N]` | ``requestAuthorization(method:url:nonce:issuer:clientID:)`` |
/// | `lockbox logout [--issuer URL] [--client-id ID]` | ``logout(issuer:clientID:)`` |
/// | `lockbox logout --retry` | ``retryPendingLogouts()`` |
/// | `lockbox auth status` | ``status()`` |
public struct CommandLineSession: Sendable {
    /// Where sessions and the revocation outbox are kept.
    public let store: any ItemStore
    /// The directory of cross-process lock files; use `vault.path + ".oauth-locks"`.
    public let lockDirectory: String
    /// Where access tokens are shared between processes; nil keeps them in one process.
    public let accessTokenCache: (any AccessTokenCache)?
    /// Where DPoP sessions' keys live; nil when the store cannot hold them (no DPoP sessions).
    public let dpopKeys: (any DPoPKeyStore)?
    private let transport: any HTTPTransport
    private let requestLimits: RequestLimits
    private let events: @Sendable (AuthEvent) -> Void

    /// A session over `store`.
    ///
    /// - Parameters:
    ///   - store: where sessions and the revocation outbox are kept.
    ///   - lockDirectory: the directory of cross-process lock files.
    ///   - transport: how requests reach the server.
    ///   - requestLimits: the limits of a new sign-in's requests (stored with its
    ///     configuration; later commands use the stored ones).
    ///   - accessTokenCache: shared between processes (the CLI passes the kernel keyring's).
    ///   - dpopKeys: where DPoP sessions' keys live (`ManagedDPoPKeyStore` over the same vault,
    ///     from `LockboxAuthKeys`); needed to sign in or use a session with
    ///     ``ClientConfiguration/usesDPoP``.
    ///   - events: called synchronously for each ``AuthEvent``.
    public init(
        store: any ItemStore, lockDirectory: String, transport: any HTTPTransport = URLSessionTransport(),
        requestLimits: RequestLimits = RequestLimits(), accessTokenCache: (any AccessTokenCache)? = nil,
        dpopKeys: (any DPoPKeyStore)? = nil, events: @escaping @Sendable (AuthEvent) -> Void = { _ in }
    ) {
        self.store = store
        self.lockDirectory = lockDirectory
        self.transport = transport
        self.requestLimits = requestLimits
        self.accessTokenCache = accessTokenCache
        self.dpopKeys = dpopKeys
        self.events = events
    }

    /// Whether sessions with ``ClientConfiguration/usesDPoP`` can be signed in and used here.
    public var supportsDPoP: Bool { dpopKeys != nil }

    /// A device sign-in waiting for the user.
    public struct PendingLogin: Sendable {
        /// The client the login is for.
        public let configuration: ClientConfiguration
        /// What to show: ``DeviceAuthorization/userCode`` and the verification URIs, checked
        /// to hold no control characters.
        public let authorization: DeviceAuthorization
        /// The new session's proofs, with DPoP: each poll carries one.
        let proofs: DPoPProofFactory?
    }

    /// What a script needs for one request to a resource server: the access token and, for a
    /// DPoP session, the proof for that request. Its description never shows either.
    public struct RequestAuthorization: Sendable, CustomStringConvertible {
        /// The access token.
        public let accessToken: SecretBytes
        /// `Bearer`, or `DPoP` for a token bound to the session's key.
        public let tokenType: String
        /// The `DPoP` header's value for the request (good for that request, once); nil for a
        /// bearer token.
        public let proof: String?

        /// Names the token type only: never the token or the proof.
        public var description: String { "RequestAuthorization(\(tokenType), token: <redacted>, proof: \(proof == nil ? "none" : "<redacted>"))" }
    }

    /// A finished sign-in.
    public struct LoginResult: Sendable, Hashable {
        /// The issuer signed in to.
        public let issuer: URL
        /// The client that signed in.
        public let clientID: String
        /// What became of the session this sign-in replaced.
        public let replacedGrant: CredentialsManager.ReplacedGrant
    }

    /// One stored session, for `lockbox auth status`. Holds no token.
    public struct SessionStatus: Sendable, Hashable {
        /// The issuer the session belongs to.
        public let issuer: String
        /// The client's identifier.
        public let clientID: String
        /// The account name the session is stored under.
        public let account: String
        /// The scopes asked for at sign-in.
        public let requestedScope: [String]
        /// The scopes the server granted with the cached access token, when one is cached.
        public let grantedScope: [String]?
        /// When the cached access token expires, when one is cached.
        public let accessTokenExpiresAt: Date?
        /// The ID token's subject from the sign-in, when the server sent an ID token.
        public let subject: String?
        /// True once a refresh rotated the refresh token; nil before any refresh was seen.
        public let refreshTokenRotates: Bool?
    }

    /// The answer of ``status()``.
    public struct Status: Sendable, Hashable {
        /// The stored sessions.
        public let sessions: [SessionStatus]
        /// Revocations waiting in the outbox for a retry.
        public let pendingRevocations: Int
    }

    /// Discovers the issuer's endpoints (RFC 8414).
    public func discover(issuer: URL, clientID: String, scope: [String] = []) async throws(AuthError) -> ClientConfiguration {
        try await ClientConfiguration.discover(
            issuer: issuer, clientID: clientID, scope: scope, transport: transport, requestLimits: requestLimits)
    }

    /// Discovers the issuer (RFC 8414) and starts a device authorization (RFC 8628).
    public func beginLogin(issuer: URL, clientID: String, scope: [String] = []) async throws(AuthError) -> PendingLogin {
        try await beginLogin(try await discover(issuer: issuer, clientID: clientID, scope: scope))
    }

    /// Starts a device authorization (RFC 8628) with a discovered configuration. With
    /// ``ClientConfiguration/usesDPoP``, makes the new session's key first (unbound until
    /// ``signIn(_:tokens:)``: a sign-in that does not finish leaves the stored session as it was).
    public func beginLogin(_ configuration: ClientConfiguration) async throws(AuthError) -> PendingLogin {
        let proofs = try await signInProofs(configuration)
        let authorization: DeviceAuthorization
        do throws(AuthError) {
            authorization = try await DeviceAuthorizationFlow(configuration: configuration, transport: transport, dpop: proofs).start()
        } catch {
            try? await discard(proofs, configuration: configuration)
            throw error
        }
        return PendingLogin(configuration: configuration, authorization: authorization, proofs: proofs)
    }

    /// Deletes the new key of a sign-in that did not finish: `proofs` from ``signInProofs(_:)``,
    /// or a ``PendingLogin``'s (``discard(_:)``). The session's own key is never deleted this
    /// way; nothing to do for nil.
    /// - Throws: the key store's error; the key then stays until the next sign-in or sign-out.
    public func discard(_ proofs: DPoPProofFactory?, configuration: ClientConfiguration) async throws(AuthError) {
        guard proofs != nil else { return }
        try await makeManager(configuration).discardSignInProofs(proofs)
    }

    /// Deletes the new key of a device login that did not finish (``discard(_:configuration:)``).
    public func discard(_ pending: PendingLogin) async throws(AuthError) {
        try await discard(pending.proofs, configuration: pending.configuration)
    }

    /// Proofs of a new key for a sign-in with `configuration` (an ``AuthorizationCodeFlow``'s
    /// `dpop`); nil when ``ClientConfiguration/usesDPoP`` is off.
    /// - Throws: ``AuthError/Code/configuration`` when DPoP is on and there is no ``dpopKeys``.
    public func signInProofs(_ configuration: ClientConfiguration) async throws(AuthError) -> DPoPProofFactory? {
        try await makeManager(configuration).signInProofs()
    }

    /// Waits for the user's approval; cancel the task to stop (nothing is stored until
    /// ``signIn(_:tokens:)``).
    public func waitForApproval(_ pending: PendingLogin, flow: DeviceAuthorizationFlow? = nil) async throws(AuthError) -> TokenResponse {
        let flow = flow ?? DeviceAuthorizationFlow(configuration: pending.configuration, transport: transport, dpop: pending.proofs)
        return try await flow.waitForApproval(pending.authorization)
    }

    /// Stores the session a flow's tokens start, revoking the one it replaces.
    public func signIn(_ configuration: ClientConfiguration, tokens: TokenResponse) async throws(AuthError) -> LoginResult {
        let replaced = try await makeManager(configuration).signIn(with: tokens)
        return LoginResult(issuer: configuration.issuer, clientID: configuration.clientID, replacedGrant: replaced)
    }

    /// Waits for the user's approval, then stores the session.
    public func completeLogin(_ pending: PendingLogin, flow: DeviceAuthorizationFlow? = nil) async throws(AuthError) -> LoginResult {
        try await signIn(pending.configuration, tokens: try await waitForApproval(pending, flow: flow))
    }

    /// A fresh access token, for scripts (`lockbox token`): from the shared cache when it holds
    /// a fresh one, else refreshed (once across processes) and shared.
    ///
    /// - Throws: besides the manager's errors, ``AuthError/Code/store`` (the store's error in
    ///   ``AuthError/storeError``) when the server rotated the refresh token and the store could
    ///   not keep the new one: this process ends, so the session cannot continue in memory, and
    ///   the token is not handed out as if all were well. ``AuthError/Code/configuration`` for a
    ///   DPoP session, whose token is refused without a proof: use
    ///   ``requestAuthorization(method:url:nonce:issuer:clientID:)``.
    public func accessToken(issuer: String? = nil, clientID: String? = nil) async throws(AuthError) -> SecretBytes {
        let manager = try await manager(issuer: issuer, clientID: clientID)
        if manager.configuration.usesDPoP {
            throw .configuration(
                "This session's tokens are bound to its DPoP key and are refused without a proof: ask for the token with the "
                    + "request it is for (`lockbox token --url URL [--method METHOD]`)")
        }
        return try await usableCredentials(manager).accessToken
    }

    /// The access token for one request and, for a DPoP session, the proof for it: bound to
    /// the token (`ath`), `method` and `url` (`htm`, `htu`), and `nonce` when given. The token
    /// comes from the shared cache when fresh there, else from a refresh (with its own proof).
    /// - Parameters:
    ///   - nonce: the resource server's `DPoP-Nonce`, when it sent one.
    /// - Throws: as ``accessToken(issuer:clientID:)``; ``AuthError/Code/configuration`` for a
    ///   nonce that is not one (RFC 9449: printable ASCII without `"` and `\`, at most 512
    ///   bytes); `store`/`storeLocked` when the session's key cannot sign.
    public func requestAuthorization(
        method: String, url: URL, nonce: String? = nil, issuer: String? = nil, clientID: String? = nil
    ) async throws(AuthError) -> RequestAuthorization {
        let manager = try await manager(issuer: issuer, clientID: clientID)
        let credentials = try await usableCredentials(manager)
        guard credentials.tokenType == "DPoP" else {
            return RequestAuthorization(accessToken: credentials.accessToken, tokenType: credentials.tokenType, proof: nil)
        }
        let proof = try await manager.proof(method: method, url: url, for: credentials, nonce: nonce)
        return RequestAuthorization(accessToken: credentials.accessToken, tokenType: credentials.tokenType, proof: proof)
    }

    /// The manager's credentials, unless the rotated refresh token could not be stored.
    private func usableCredentials(_ manager: CredentialsManager) async throws(AuthError) -> Credentials {
        let credentials = try await manager.credentials()
        if await manager.isPersistentSignInDisabled {
            let cause = await manager.rotationStoreError
            throw AuthError(
                .store,
                "The server rotated the refresh token, but the keychain could not store the new one"
                    + (cause.map { " (\($0.message))" } ?? "") + ". The stored one is used up: unlock the keychain if it is "
                    + "locked, then sign in again.",
                storeError: cause)
        }
        return credentials
    }

    /// Signs out and revokes.
    public func logout(issuer: String? = nil, clientID: String? = nil) async throws(AuthError) -> CredentialsManager.LogoutResult {
        try await manager(issuer: issuer, clientID: clientID).logout()
    }

    /// Retries pending revocations (`lockbox logout --retry`).
    public func retryPendingLogouts() async throws(AuthError) -> RevocationOutbox.RetryResult {
        try await outbox.retryPending()
    }

    /// The stored sessions and pending revocations (`lockbox auth status`). Reads no token
    /// from the store; the cache is asked for each session's expiry and granted scopes.
    public func status() async throws(AuthError) -> Status {
        let stored: [StoredSession]
        do {
            stored = try await StoredSession.all(in: store)
        } catch {
            throw AuthError.from(error)
        }
        var sessions: [SessionStatus] = []
        for session in stored {
            let cached = try? await accessTokenCache?.cachedAccessToken(for: session.key)
            sessions.append(
                SessionStatus(
                    issuer: session.key.issuer, clientID: session.key.clientID, account: session.key.account,
                    requestedScope: session.configuration?.scope ?? [], grantedScope: cached?.credentials.scope,
                    accessTokenExpiresAt: cached?.credentials.expiresAt, subject: session.details?.subject,
                    refreshTokenRotates: session.details?.refreshTokenRotates))
        }
        return Status(sessions: sessions, pendingRevocations: try await outbox.pendingCount())
    }

    /// The manager of the one stored session matching the filters.
    /// - Throws: ``AuthError/Code/signedOut`` when none matches; ``AuthError/Code/ambiguousSession``
    ///   with ``AuthError/matchingSessions`` when several do.
    public func manager(issuer: String? = nil, clientID: String? = nil) async throws(AuthError) -> CredentialsManager {
        let sessions: [StoredSession]
        do {
            sessions = try await StoredSession.all(in: store)
        } catch {
            throw AuthError.from(error)
        }
        let wanted = issuer.map { CredentialKey(issuer: $0, clientID: "").issuer }
        let matches = sessions.filter { session in
            (wanted == nil || session.key.issuer == wanted) && (clientID == nil || session.key.clientID == clientID)
        }
        guard let session = matches.first, let configuration = session.configuration else {
            throw .signedOut(.noCredentials)
        }
        guard matches.count == 1 else {
            throw AuthError(
                .ambiguousSession, "Several stored sessions match: name one by its issuer and client id.",
                matchingSessions: matches.map(\.key))
        }
        return makeManager(configuration, account: session.key.account)
    }

    private var outbox: RevocationOutbox {
        RevocationOutbox(store: store, transport: transport, events: events)
    }

    private func makeManager(_ configuration: ClientConfiguration, account: String = "default") -> CredentialsManager {
        let key = CredentialKey(configuration: configuration, account: account)
        return CredentialsManager(
            configuration: configuration, account: account,
            tokenStore: ItemStoreTokenStore(store: store, key: key, configuration: configuration),
            transport: transport, lockDirectory: lockDirectory, outbox: outbox, accessTokenCache: accessTokenCache,
            dpopKeys: dpopKeys, events: events)
    }
}
