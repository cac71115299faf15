import Foundation
#if canImport(FoundationNetworking)
import FoundationNetworking
#endif
import LockboxCore

/// One account's OAuth 2.0 session: hands out fresh access tokens, refreshes them once for
/// all callers (in this process and across processes sharing the store), rotates refresh
/// tokens safely, and signs out only when the server says the grant is gone.
///
/// ```swift
/// let manager = CredentialsManager(
///     configuration: configuration,
///     tokenStore: ItemStoreTokenStore(store: vault, key: CredentialKey(configuration: configuration)),
///     lockDirectory: vault.path + ".oauth-locks")
/// let (data, response) = try await manager.send(URLRequest(url: apiURL))
/// ```
///
/// The access token lives in this actor's memory, and, when an ``AccessTokenCache`` is given,
/// in that cache (the kernel keyring: memory only) so that other processes use it instead of
/// refreshing. Refresh tokens are read from the ``TokenStore`` under a cross-process lock right
/// before each refresh, so a token another process rotated is never presented twice (which a
/// strict server treats as theft).
public actor CredentialsManager {
    /// The client and server this manager holds a session with.
    public nonisolated let configuration: ClientConfiguration
    /// Where the session is stored: issuer, client and account.
    public nonisolated let key: CredentialKey
    private let tokenStore: any TokenStore
    private let transport: any HTTPTransport
    private let lockFilePath: String?
    private let refreshLock: (any RefreshLock)?
    private let outbox: RevocationOutbox?
    private let accessTokenCache: (any AccessTokenCache)?
    private let dpopKeys: (any DPoPKeyStore)?
    private let nonces: DPoPNonces
    private let now: @Sendable () -> Date
    private let eventHandler: @Sendable (AuthEvent) -> Void

    private var current: Credentials?
    /// The proofs of the session's DPoP key, once read from ``dpopKeys``.
    private var sessionProofs: DPoPProofFactory? {
        didSet { sessionProofsGeneration += 1 }
    }
    /// Changes whenever ``sessionProofs`` is set or cleared: a proof made in advance is used only
    /// while it is unchanged.
    private var sessionProofsGeneration = 0
    /// Set only when persisting a rotated token failed: the session goes on in memory.
    private var memoryOnlyRefreshToken: SecretBytes? {
        didSet { if memoryOnlyRefreshToken == nil { memoryOnlyReplaced = nil } }
    }
    /// While ``memoryOnlyRefreshToken`` is set: the stored token it replaced, which the store
    /// still holds (used up at the server) unless someone stored another since.
    private var memoryOnlyReplaced: SecretBytes?
    private var lastRefreshTokenFingerprint: String?
    /// Why this manager signed out, so later calls report the same reason.
    private var signOutReason: SignOutReason?
    private var refreshTask: Task<Credentials, any Error>?
    private var rotationHook: (@Sendable (Rotation) async -> Void)?
    private var observers: [UUID: AsyncStream<CredentialsState>.Continuation] = [:]

    /// The state once known: the store is asked on first use (off the cooperative pool), never
    /// in `init`.
    private var knownState: CredentialsState? {
        didSet {
            guard let knownState, knownState != oldValue else { return }
            for observer in observers.values { observer.yield(knownState) }
        }
    }

    /// The session's state; see also ``states()``. The first read asks the store whether
    /// credentials exist.
    public var state: CredentialsState {
        get async { await resolvedState() }
    }

    /// Set when persisting a rotated refresh token failed: the store's error.
    private(set) var rotationStoreError: LockboxError?

    /// True after persisting a rotated refresh token failed: the session works until this
    /// process ends, and the app should tell the user that staying signed in is unavailable.
    /// Lockbox never falls back to weaker storage.
    public private(set) var isPersistentSignInDisabled = false

    /// A manager of the session `tokenStore` holds for `configuration`'s client.
    ///
    /// - Parameters:
    ///   - configuration: the client and its authorization server.
    ///   - account: the account name the session is stored under.
    ///   - tokenStore: where the refresh token is kept.
    ///   - transport: how requests reach the server.
    ///   - lockDirectory: a directory for cross-process lock files; pass the same one in every
    ///     process sharing `tokenStore` (e.g. `vault.path + ".oauth-locks"`). `nil` limits
    ///     single flight to this process.
    ///   - outbox: where failed revocations wait for a retry; `nil` drops them.
    ///   - accessTokenCache: where access tokens are shared with this user's other processes
    ///     (`KernelKeyringTokenCache` from `LockboxAuthKeyring`); `nil`, the default, keeps
    ///     them in this actor's memory only.
    ///   - refreshLock: a lock shared beyond this machine (a fleet's); when given, it replaces
    ///     the `lockDirectory` file lock.
    ///   - dpopKeys: where the session's DPoP key lives (`ManagedDPoPKeyStore` from
    ///     `LockboxAuthKeys`); required when ``ClientConfiguration/usesDPoP`` is on.
    ///   - nonces: the servers' latest DPoP nonces; by default this process's.
    ///   - now: the current time, for token expiry and proofs' `iat` (tests move it instead of
    ///     waiting).
    ///   - events: called synchronously for each ``AuthEvent``; keep it quick.
    public init(
        configuration: ClientConfiguration, account: String = "default", tokenStore: any TokenStore,
        transport: any HTTPTransport = URLSessionTransport(), lockDirectory: String? = nil,
        outbox: RevocationOutbox? = nil, accessTokenCache: (any AccessTokenCache)? = nil, refreshLock: (any RefreshLock)? = nil,
        dpopKeys: (any DPoPKeyStore)? = nil, nonces: DPoPNonces = .shared, now: @escaping @Sendable () -> Date = { Date() },
        events: @escaping @Sendable (AuthEvent) -> Void = { _ in }
    ) {
        self.dpopKeys = dpopKeys
        self.nonces = nonces
        let key = CredentialKey(configuration: configuration, account: account)
        self.configuration = configuration
        self.key = key
        self.tokenStore = tokenStore
        self.transport = transport
        self.lockFilePath = lockDirectory.map { $0 + "/" + key.lockName + ".lock" }
        self.refreshLock = refreshLock
        self.outbox = outbox
        self.accessTokenCache = accessTokenCache
        self.now = now
        self.eventHandler = events
    }

    private func resolvedState() async -> CredentialsState {
        if let knownState { return knownState }
        let found: CredentialsState
        do {
            found = try await tokenStore.hasCredentials() ? .signedIn(accessTokenExpiresAt: nil) : .signedOut(.noCredentials)
        } catch {
            // Unknown is not "signed out": the first refresh finds out and reports the error.
            found = error.code == .interactionNotAllowed ? .storeLocked : .signedIn(accessTokenExpiresAt: nil)
        }
        // Something else may have set the state while the store answered: it is newer.
        if let knownState { return knownState }
        knownState = found
        return found
    }

    /// A stream of state changes, starting with the current state.
    public func states() async -> AsyncStream<CredentialsState> {
        let id = UUID()
        let (stream, continuation) = AsyncStream<CredentialsState>.makeStream(bufferingPolicy: .bufferingNewest(16))
        continuation.yield(await resolvedState())
        observers[id] = continuation
        continuation.onTermination = { _ in Task { await self.removeObserver(id) } }
        return stream
    }

    private func removeObserver(_ id: UUID) {
        observers[id] = nil
    }

    /// Sets a hook called after each rotated refresh token is stored (or failed to be), before
    /// any caller sees the new access token.
    public func setRotationHook(_ hook: (@Sendable (Rotation) async -> Void)?) {
        rotationHook = hook
    }

    // MARK: Signing in

    /// What became of the grant a sign-in replaced.
    public enum ReplacedGrant: Sendable, Hashable {
        /// There was no stored session for this account.
        case noPreviousSession
        /// The server confirmed the old refresh token's revocation (RFC 7009).
        case revoked
        /// The server could not be reached; the revocation waits in the outbox.
        case queued
        /// The revocation failed and there is no outbox (or no revocation endpoint), or the
        /// server refused it for good: the old grant may stay valid until it expires.
        case notRevoked
    }

    /// Proofs for a new sign-in: with ``ClientConfiguration/usesDPoP``, a new non-extractable
    /// key in the ``DPoPKeyStore``, to pass to the flow; nil when DPoP is off. The key becomes
    /// the session's in ``signIn(with:)``; until then the current session and its key are
    /// untouched.
    ///
    /// ```swift
    /// let flow = DeviceAuthorizationFlow(configuration: configuration, dpop: try await manager.signInProofs())
    /// let authorization = try await flow.start()
    /// try await manager.signIn(with: try await flow.waitForApproval(authorization))
    /// ```
    /// - Throws: ``AuthError/Code/configuration`` when DPoP is on and the manager has no key
    ///   store; the key store's error (``AuthError/Code/storeLocked``, ...).
    public func signInProofs() async throws(AuthError) -> DPoPProofFactory? {
        guard configuration.usesDPoP else { return nil }
        let keys = try requireKeyStore()
        do {
            return DPoPProofFactory(key: try await keys.makeKey(for: key), nonces: nonces, now: now)
        } catch {
            throw AuthError.from(error)
        }
    }

    /// Deletes the key of proofs from ``signInProofs()`` whose sign-in did not finish (the user
    /// cancelled, the server denied it, the code expired), so that it does not stay beside the
    /// session's key. The session's own key is never deleted this way. Nothing to do for nil.
    /// - Throws: the key store's error (``AuthError/Code/storeLocked``, ...); the key then stays
    ///   until the next sign-in or sign-out deletes it.
    public func discardSignInProofs(_ proofs: DPoPProofFactory?) async throws(AuthError) {
        guard let proofs else { return }
        let keys = try requireKeyStore()
        do {
            try await keys.discard(proofs.key, of: key)
        } catch {
            throw AuthError.from(error)
        }
    }

    private func requireKeyStore() throws(AuthError) -> any DPoPKeyStore {
        guard let dpopKeys else {
            throw .configuration("DPoP is turned on for this client, but the CredentialsManager has no DPoPKeyStore (dpopKeys)")
        }
        return dpopKeys
    }

    /// Starts a session from a flow's token response: revokes the grant it replaces (RFC
    /// 7009; queued in the outbox when the server cannot be reached), then stores the new
    /// refresh token. With DPoP, the response's key becomes the session's key and the
    /// replaced session's key is deleted.
    /// - Returns: what became of the replaced grant.
    /// - Throws: ``AuthError/Code/invalidResponse`` when the response has no refresh token;
    ///   store errors (nothing is kept in memory then, so a locked store never yields a session
    ///   that silently vanishes).
    @discardableResult
    public func signIn(with response: TokenResponse) async throws(AuthError) -> ReplacedGrant {
        guard let refresh = response.refreshToken else {
            throw .invalidResponse("the server issued no refresh token; ask for offline access")
        }
        let proofKey = response.proofKey
        if configuration.usesDPoP != (proofKey != nil) {
            throw .configuration(
                configuration.usesDPoP
                    ? "DPoP is turned on for this client, but the tokens are not bound to a key: sign in with signInProofs()"
                    : "the tokens are bound to a DPoP key, but this client's configuration does not turn on usesDPoP")
        }
        let keys = configuration.usesDPoP ? try requireKeyStore() : nil
        let lock = try await acquireCrossProcessLock()
        defer { withExtendedLifetime(lock) {} }
        let replaced: ReplacedGrant
        do {
            var previous = memoryOnlyRefreshToken
            if previous == nil { previous = try await tokenStore.refreshToken() }
            replaced = try await revokeReplaced(previous, by: refresh)
            try await tokenStore.saveRefreshToken(refresh, details: SessionDetails(subject: response.idTokenSubject))
            if let keys, let proofKey { try await keys.bind(proofKey, to: key) }
        } catch let error as LockboxError {
            throw AuthError.from(error)
        } catch let error as AuthError {
            throw error
        } catch {
            throw .cancelledError
        }
        memoryOnlyRefreshToken = nil
        isPersistentSignInDisabled = false
        rotationStoreError = nil
        signOutReason = nil
        lastRefreshTokenFingerprint = TokenFingerprint.of(refresh)
        sessionProofs = proofKey.map { DPoPProofFactory(key: $0, nonces: nonces, now: now) }
        let credentials = Credentials(response)
        current = credentials
        knownState = .signedIn(accessTokenExpiresAt: credentials.expiresAt)
        emit(.signedIn, "signed_in", lastRefreshTokenFingerprint)
        await shareInCache(credentials)
        return replaced
    }

    /// Revokes `previous`, the refresh token a sign-in replaces: queued in the outbox first, so a
    /// failed revocation is retried later; removed from it once the server answers.
    private func revokeReplaced(_ previous: SecretBytes?, by new: SecretBytes) async throws(AuthError) -> ReplacedGrant {
        guard let previous, previous != new else { return .noPreviousSession }
        await removeFromCache()
        guard let endpoint = configuration.revocationEndpoint else { return .notRevoked }
        let outboxID = try await outbox?.enqueue(
            token: previous, hint: "refresh_token", endpoint: endpoint, clientID: configuration.clientID, account: key.description)
        let outcome = await revokeRefreshToken(previous, queuedAs: outboxID, endpoint: endpoint, reason: "replaced_by_sign_in")
        return outcome.revoked ? .revoked : outcome.queued ? .queued : .notRevoked
    }

    /// Revokes a refresh token already queued in the outbox (as `outboxID`, when there is an
    /// outbox) and settles the queue entry: removed once the server answered, kept for a retry
    /// when it could not be reached.
    private func revokeRefreshToken(
        _ token: SecretBytes, queuedAs outboxID: String?, endpoint: URL, reason success: String
    ) async -> (revoked: Bool, queued: Bool) {
        let fingerprint = TokenFingerprint.of(token)
        switch await RevocationOutbox.revoke(
            token: token, hint: "refresh_token", endpoint: endpoint, clientID: configuration.clientID, transport: transport,
            limits: configuration.requestLimits)
        {
        case .revoked:
            if let outboxID { await outbox?.remove(outboxID) }
            emit(.revocationSucceeded, success, fingerprint)
            return (true, false)
        case .refused(let reason):
            if let outboxID { await outbox?.remove(outboxID) }
            emit(.revocationDropped, reason, fingerprint)
            return (false, false)
        case .failed(let reason):
            emit(outboxID == nil ? .revocationDropped : .revocationQueued, reason, fingerprint)
            return (false, outboxID != nil)
        }
    }

    // MARK: Access tokens

    /// The refresh leeway for a token that lives `lifetime`: 30 s, or a tenth of the lifetime
    /// when that is shorter (a token that lives 10 s is refreshed 1 s before it expires, not at
    /// once). Without a known lifetime, 30 s.
    public static func refreshLeeway(lifetime: Duration?) -> Duration {
        guard let lifetime else { return .seconds(30) }
        return min(.seconds(30), lifetime / 10)
    }

    /// A valid access token, refreshed when it expires within `minTTL`, or, when `minTTL` is
    /// nil (the default), within the refresh leeway (``refreshLeeway(lifetime:)``). With an
    /// ``AccessTokenCache``, a token another process refreshed is used before refreshing.
    ///
    /// Concurrent callers share one refresh; a caller that is cancelled while waiting leaves at
    /// once with ``AuthError/Code/cancelled`` and does not cancel the refresh for the others.
    /// - Throws: ``AuthError/Code/signedOut`` when the grant is gone; ``AuthError/Code/storeLocked``,
    ///   ``AuthError/Code/network`` or ``AuthError/Code/server`` when the session is kept and a
    ///   later call may succeed.
    public func credentials(minTTL: Duration? = nil) async throws(AuthError) -> Credentials {
        if let current, current.isFresh(for: minTTL, at: now()) {
            return current
        }
        if refreshTask == nil, let cached = try await freshFromCache(minTTL: minTTL, rejecting: nil) {
            return cached
        }
        return try await sharedRefresh(minTTL: minTTL, rejecting: nil)
    }

    /// `request` with an `Authorization` header carrying a valid access token: `Bearer`, or
    /// for a DPoP session `DPoP` with a proof for this request's method and URL in the `DPoP`
    /// header (send it once: the server refuses a proof it has seen).
    public func authorizedRequest(_ request: URLRequest, minTTL: Duration? = nil) async throws(AuthError) -> URLRequest {
        let credentials = try await credentials(minTTL: minTTL)
        return try await authorized(request, with: credentials)
    }

    /// A proof for one request that carries `credentials`' DPoP-bound token, for a caller that
    /// sends the request itself (`lockbox token --url`): bound to the token (`ath`), `method`
    /// and `url`, and `nonce` (by default the server's latest this process saw). Good for that
    /// request, once.
    /// - Throws: ``AuthError/Code/configuration`` for bearer credentials or a malformed nonce;
    ///   `store`/`storeLocked` when the session's key cannot sign.
    public func proof(method: String, url: URL, for credentials: Credentials, nonce: String? = nil) async throws(AuthError) -> String {
        guard credentials.tokenType == "DPoP" else {
            throw .configuration("These credentials hold a bearer token, which is sent without a DPoP proof")
        }
        if let nonce, !DPoPNonces.isValid(nonce) {
            throw .configuration("The DPoP nonce is not one (RFC 9449: 1 to 512 printable ASCII characters, no quote or backslash)")
        }
        let proofs = try await requireSessionProofs()
        return try await proofs.proof(method: method, url: url, accessToken: credentials.accessToken, nonce: nonce ?? nonces.nonce(for: url))
    }

    /// `request` carrying `credentials`: a bearer token, or a DPoP-bound token with a fresh
    /// proof bound to it (`ath`) and to the server's latest nonce.
    private func authorized(_ request: URLRequest, with credentials: Credentials) async throws(AuthError) -> URLRequest {
        var request = request
        guard credentials.tokenType == "DPoP" else {
            request.setValue(credentials.authorizationHeaderValue, forHTTPHeaderField: "Authorization")
            return request
        }
        let proofs = try await requireSessionProofs()
        request.setValue("DPoP " + credentials.accessToken.temporaryString, forHTTPHeaderField: "Authorization")
        request.setValue(try await proofs.proof(for: request, accessToken: credentials.accessToken), forHTTPHeaderField: "DPoP")
        return request
    }

    /// Sends `request` with `credentials`; for a DPoP session, answers a resource server's
    /// `use_dpop_nonce` challenge by one retry with its nonce (the server did not act on a
    /// request it refused for its nonce), and turns `invalid_dpop_proof` into an error.
    private func exchange(_ request: URLRequest, with credentials: Credentials) async throws(AuthError) -> (Data, HTTPURLResponse) {
        var retriedWithNonce = false
        while true {
            let answer = try await transport.exchangeBearerRequest(try await authorized(request, with: credentials))
            guard credentials.tokenType == "DPoP", let url = request.url else { return answer }
            let nonceGiven = nonces.remember(from: answer.1, for: url) != nil
            switch DPoPChallenge(answer.1) {
            case .other:
                return answer
            case .invalidProof:
                emit(.requestNotRetried, "invalid_dpop_proof", credentials.fingerprint)
                throw .proofRefused(status: answer.1.statusCode)
            case .useNonce:
                guard nonceGiven, !retriedWithNonce else {
                    emit(.requestNotRetried, "use_dpop_nonce", credentials.fingerprint)
                    throw .nonceNotSettled(status: answer.1.statusCode, nonceGiven: nonceGiven)
                }
                retriedWithNonce = true
                emit(.requestRetried, "use_dpop_nonce", credentials.fingerprint)
            }
        }
    }

    /// Sends `request` with a valid access token, applying the 401 policy: on a 401
    /// `invalid_token`, one refresh, then one retry only when the request is safe to repeat
    /// (GET, HEAD, OPTIONS, PUT, DELETE, or an `Idempotency-Key` header). Otherwise the 401
    /// comes back to the caller with fresh credentials in place. A 403 never refreshes.
    /// There is never more than one refresh and one retry. Redirects are followed only within
    /// the request's origin (never to http), so the bearer token does not travel elsewhere; other
    /// redirects come back as the answer.
    public func send(_ request: URLRequest, minTTL: Duration? = nil) async throws(AuthError) -> (Data, HTTPURLResponse) {
        let used = try await credentials(minTTL: minTTL)
        let answer = try await exchange(request, with: used)
        guard Self.isInvalidTokenChallenge(answer.1) else { return answer }

        let fresh = try await credentialsReplacing(used)
        guard Self.isSafeToRepeat(request) else {
            emit(.requestNotRetried, "not_idempotent", used.fingerprint)
            return answer
        }
        emit(.requestRetried, "invalid_token", fresh.fingerprint)
        return try await exchange(request, with: fresh)
    }

    /// Whether repeating `request` cannot do harm twice.
    public static func isSafeToRepeat(_ request: URLRequest) -> Bool {
        let method = (request.httpMethod ?? "GET").uppercased()
        if ["GET", "HEAD", "OPTIONS", "PUT", "DELETE"].contains(method) { return true }
        return request.value(forHTTPHeaderField: "Idempotency-Key") != nil
    }

    /// A 401 whose challenge says the token was bad (`invalid_token`), or gives no error code
    /// at all. Other 401s (`invalid_request`) and every 403 (`insufficient_scope`) are not
    /// fixed by a refresh.
    static func isInvalidTokenChallenge(_ response: HTTPURLResponse) -> Bool {
        guard response.statusCode == 401 else { return false }
        guard let challenge = response.value(forHTTPHeaderField: "WWW-Authenticate") else { return true }
        if challenge.range(of: "error=", options: .caseInsensitive) == nil { return true }
        return challenge.range(of: "invalid_token", options: .caseInsensitive) != nil
    }

    /// After the server rejected `rejected`: the credentials another caller already refreshed,
    /// or one new refresh.
    private func credentialsReplacing(_ rejected: Credentials) async throws(AuthError) -> Credentials {
        if let current, current.fingerprint != rejected.fingerprint {
            return current
        }
        current = nil
        return try await sharedRefresh(minTTL: nil, rejecting: rejected.fingerprint)
    }

    // MARK: Refresh

    private func sharedRefresh(minTTL: Duration?, rejecting rejected: String?) async throws(AuthError) -> Credentials {
        let task: Task<Credentials, any Error>
        if let running = refreshTask {
            task = running
        } else {
            // Unstructured on purpose: cancelling one waiter must not cancel the refresh.
            task = Task { try await self.refreshUnderLock(minTTL: minTTL, rejecting: rejected) }
            refreshTask = task
        }
        switch await SharedResult.wait(for: task) {
        case .success(let credentials): return credentials
        case .failure(let error as AuthError): throw error
        case .failure: throw .cancelledError
        }
    }

    private func refreshUnderLock(minTTL: Duration?, rejecting rejected: String?) async throws(AuthError) -> Credentials {
        defer { refreshTask = nil }
        knownState = .refreshing
        do throws(AuthError) {
            let lock = try await acquireCrossProcessLock()
            defer { withExtendedLifetime(lock) {} }
            let advance = proofInAdvance()
            // Another process may have refreshed while this one waited for the lock.
            if memoryOnlyRefreshToken == nil, let cached = try await freshFromCache(minTTL: minTTL, rejecting: rejected) {
                return cached
            }
            do throws(AuthError) {
                let credentials = try await refresh(advance, lock: lock)
                await lock?.ended()
                return credentials
            } catch {
                await lock?.ended()
                throw error
            }
        } catch {
            // A sign-out or a locked store set their own state; any other failure keeps the
            // session as it was (the stored refresh token is untouched).
            if knownState == .refreshing {
                knownState = .signedIn(accessTokenExpiresAt: current?.expiresAt)
            }
            throw error
        }
    }

    /// One refresh. Runs with the cross-process lock (`lock`) held. `advance` is the token
    /// request's proof when it was started before the stored refresh token was read.
    /// `retried`: this refresh follows one whose token was rejected after another holder had
    /// stored a newer one.
    private func refresh(_ advance: ProofInAdvance? = nil, lock: (any RefreshLockHold)?, retried: Bool = false) async throws(AuthError)
        -> Credentials
    {
        // Read the latest token: another process may have rotated it since we last looked.
        let refreshToken: SecretBytes
        if let memoryOnly = memoryOnlyRefreshToken {
            refreshToken = memoryOnly
        } else {
            let stored: SecretBytes?
            do {
                stored = try await tokenStore.refreshToken()
            } catch {
                emit(.refreshFailed, error.code == .interactionNotAllowed ? "store_locked" : "store_error", nil)
                if error.code == .interactionNotAllowed { knownState = .storeLocked }
                throw AuthError.from(error)
            }
            guard let stored else {
                let reason = signOutReason ?? (lastRefreshTokenFingerprint == nil ? .noCredentials : .signedOutElsewhere)
                await signOutLocally(reason, clearStore: false)
                throw .signedOut(reason)
            }
            refreshToken = stored
        }
        let fingerprint = TokenFingerprint.of(refreshToken)
        if let last = lastRefreshTokenFingerprint, last != fingerprint {
            emit(.refreshTokenChangedElsewhere, "rotated_by_another_process", fingerprint)
            // Another process may have signed in again, with a new DPoP key: read it anew.
            sessionProofs = nil
        }
        lastRefreshTokenFingerprint = fingerprint
        emit(.refreshStarted, current == nil ? "no_access_token" : "expiring", fingerprint)

        let request = FormBody.post(configuration.tokenEndpoint, [
            ("grant_type", "refresh_token"), ("refresh_token", refreshToken.temporaryString),
            ("client_id", configuration.clientID),
        ])
        let result: TokenEndpointResult
        do {
            // The lock still held (one a database connection holds can be lost unseen), and the
            // refresh recorded as in flight.
            try await lock?.presenting(within: configuration.requestLimits.deadline)
            let proofs = configuration.usesDPoP ? try await requireSessionProofs() : nil
            // The proof made in advance is sent when it is by the session's key (the proofs it
            // was made with are still the session's: a sign-in elsewhere, noticed above, clears
            // them) and was made at most a few seconds ago (a slow store read makes a new one).
            let usable = advance.flatMap { $0.generation == sessionProofsGeneration && now().timeIntervalSince($0.madeAt) < 5 ? $0 : nil }
            let firstProof = try await usable?.proof.value.get()
            result = try await TokenEndpoint.call(
                request, transport: transport, limits: configuration.requestLimits, now: now, dpop: proofs, firstProof: firstProof)
        } catch {
            emit(.refreshFailed, error.reasonCode, fingerprint)
            throw error
        }
        switch result {
        case .success(let response):
            return try await adopt(response, replacing: refreshToken)
        case .oauthError(_, let error, _) where error == "invalid_grant" || error == "invalid_client":
            let reason: SignOutReason = error == "invalid_grant" ? .refreshTokenRejected : .clientRejected
            emit(.refreshFailed, error, fingerprint)
            // The store is cleared only while it still holds what it held when this token was
            // presented (the token itself, or for one kept in memory only, the stored one it
            // replaced): a token stored meanwhile (rotated by a holder of a lock this one took
            // after it was lost, or a new sign-in) is never erased unasked, and is tried once
            // instead. A store that cannot be read is not cleared either.
            let expected = memoryOnlyRefreshToken == nil ? refreshToken : memoryOnlyReplaced
            let current: SecretBytes??
            do { current = .some(try await tokenStore.refreshToken()) } catch { current = nil }
            if error == "invalid_grant", !retried, let expected, case let stored?? = current, stored != expected, stored != refreshToken {
                memoryOnlyRefreshToken = nil
                return try await refresh(lock: lock, retried: true)
            }
            let stillHeld = expected != nil && current.map { $0 != nil && $0 == expected } == true
            await signOutLocally(reason, clearStore: stillHeld)
            throw .signedOut(reason)
        case .oauthError(let status, let error, let retryAfter):
            emit(.refreshFailed, error, fingerprint)
            throw .server(status: status, error: error, retryAfter: retryAfter)
        case .httpError(let status, let retryAfter):
            emit(.refreshFailed, "http_\(status)", fingerprint)
            throw .server(status: status, error: nil, retryAfter: retryAfter)
        }
    }

    /// Stores a rotated refresh token, runs the hook, then publishes the new access token.
    ///
    /// When the store refuses the rotated token for good (`errSecParam`: over its size limit),
    /// the session ends: the server has consumed the previous token, so keeping it stored would
    /// only make the next refresh look like reuse. The stored token is cleared, the unstorable
    /// one is revoked (best effort), and ``AuthError/Code/signedOut`` with
    /// ``SignOutReason/rotatedTokenNotStored`` is thrown. Any other store failure (locked, I/O)
    /// keeps the session in memory only (``isPersistentSignInDisabled``).
    private func adopt(_ response: TokenResponse, replacing used: SecretBytes) async throws(AuthError) -> Credentials {
        let usedFingerprint = TokenFingerprint.of(used)
        if let rotated = response.refreshToken, rotated != used {
            let newFingerprint = TokenFingerprint.of(rotated)
            var persisted = true
            do {
                try await tokenStore.saveRefreshToken(rotated, details: SessionDetails(refreshTokenRotates: true))
                memoryOnlyRefreshToken = nil
                isPersistentSignInDisabled = false
                rotationStoreError = nil
                emit(.rotationPersisted, "rotated", newFingerprint)
            } catch let error where error.code == .param {
                emit(.rotationNotPersisted, "store_refused", newFingerprint)
                throw await endSessionWithUnstorableToken(rotated, error: error)
            } catch {
                // Keep the session in memory; never write the token anywhere weaker.
                persisted = false
                // The store still holds the token first kept in memory only replaced.
                if memoryOnlyRefreshToken == nil { memoryOnlyReplaced = used }
                memoryOnlyRefreshToken = rotated
                // Other processes hold the used-up token: they must not go on from a cached
                // access token as if the session were intact.
                await removeFromCache()
                isPersistentSignInDisabled = true
                rotationStoreError = error
                emit(.rotationNotPersisted, error.code == .interactionNotAllowed ? "store_locked" : "store_error", newFingerprint)
            }
            lastRefreshTokenFingerprint = newFingerprint
            if let rotationHook {
                await rotationHook(Rotation(previousFingerprint: usedFingerprint, newFingerprint: newFingerprint, persisted: persisted))
            }
        }
        let credentials = Credentials(response)
        current = credentials
        signOutReason = nil
        knownState = .signedIn(accessTokenExpiresAt: credentials.expiresAt)
        emit(.refreshSucceeded, response.refreshToken == nil ? "not_rotated" : "rotated", credentials.fingerprint)
        if memoryOnlyRefreshToken == nil { await shareInCache(credentials) }
        return credentials
    }

    private func endSessionWithUnstorableToken(_ rotated: SecretBytes, error: LockboxError) async -> AuthError {
        await signOutLocally(.rotatedTokenNotStored, clearStore: true)
        if let endpoint = configuration.revocationEndpoint {
            let outcome = await RevocationOutbox.revoke(
                token: rotated, hint: "refresh_token", endpoint: endpoint, clientID: configuration.clientID, transport: transport,
                limits: configuration.requestLimits)
            switch outcome {
            case .revoked: emit(.revocationSucceeded, "unstorable_token", TokenFingerprint.of(rotated))
            case .refused(let reason), .failed(let reason): emit(.revocationDropped, reason, TokenFingerprint.of(rotated))
            }
        }
        return AuthError(
            .signedOut,
            "The server issued a new refresh token that the keychain cannot store (\(error.message)). The previous one is "
                + "used up, so the session was ended and cleared. Sign in again; if this repeats, the server's tokens are over "
                + "the keychain's size limit.",
            signOutReason: .rotatedTokenNotStored, storeError: error)
    }

    private func signOutLocally(_ reason: SignOutReason, clearStore: Bool) async {
        await removeFromCache()
        if clearStore {
            // A locked store cannot be cleared now; the token is dead at the server anyway.
            try? await tokenStore.clearCredentials()
            await deleteSessionKeys()
        }
        current = nil
        memoryOnlyRefreshToken = nil
        let alreadySignedOut = signOutReason != nil
        signOutReason = reason
        knownState = .signedOut(reason)
        if alreadySignedOut { return }
        emit(.signedOut, reason.rawValue, lastRefreshTokenFingerprint)
    }

    // MARK: Logout

    /// What ``logout()`` achieved.
    public struct LogoutResult: Sendable, Hashable {
        /// The server confirmed the refresh token's revocation.
        public let revoked: Bool
        /// The revocation failed and waits in the outbox for ``RevocationOutbox/retryPending()``.
        public let queued: Bool

        /// A result: whether the server revoked the session, and whether a revocation was queued.
        public init(revoked: Bool, queued: Bool) {
            self.revoked = revoked
            self.queued = queued
        }
    }

    /// Signs out: queues the refresh token's revocation durably, clears the session locally,
    /// then revokes (RFC 7009) the refresh and access tokens. Local clearing happens even when
    /// revocation fails; a failed revocation stays in the outbox.
    /// - Throws: ``AuthError/Code/storeLocked`` (nothing changed) when the store is locked.
    @discardableResult
    public func logout() async throws(AuthError) -> LogoutResult {
        if let running = refreshTask { _ = try? await running.value }
        let lock = try await acquireCrossProcessLock()
        var refreshToken = memoryOnlyRefreshToken
        var outboxID: String?
        do throws(LockboxError) {
            if refreshToken == nil { refreshToken = try await tokenStore.refreshToken() }
        } catch {
            throw AuthError.from(error)
        }
        if let refreshToken, let endpoint = configuration.revocationEndpoint, let outbox {
            outboxID = try await outbox.enqueue(
                token: refreshToken, hint: "refresh_token", endpoint: endpoint, clientID: configuration.clientID, account: key.description)
        }
        do throws(LockboxError) {
            try await tokenStore.clearCredentials()
        } catch {
            throw AuthError.from(error)
        }
        await deleteSessionKeys()
        await removeFromCache()
        let accessToken = current?.accessToken
        current = nil
        memoryOnlyRefreshToken = nil
        isPersistentSignInDisabled = false
        rotationStoreError = nil
        signOutReason = .loggedOut
        knownState = .signedOut(.loggedOut)
        emit(.logout, "user_requested", refreshToken.map(TokenFingerprint.of))
        withExtendedLifetime(lock) {}

        guard let endpoint = configuration.revocationEndpoint else {
            return LogoutResult(revoked: false, queued: false)
        }
        if let accessToken {
            _ = await RevocationOutbox.revoke(
                token: accessToken, hint: "access_token", endpoint: endpoint, clientID: configuration.clientID, transport: transport,
                limits: configuration.requestLimits)
        }
        guard let refreshToken else { return LogoutResult(revoked: false, queued: false) }
        let outcome = await revokeRefreshToken(refreshToken, queuedAs: outboxID, endpoint: endpoint, reason: "revoked")
        return LogoutResult(revoked: outcome.revoked, queued: outcome.queued)
    }

    // MARK: The shared cache

    /// A token from the cache that is fresh for `minTTL` (or its own leeway), adopted as the
    /// current one; nil on a miss. A cached token the server just rejected is removed.
    ///
    /// The cache outlives a lock of the keychain, and a session removed from the store by other
    /// means (a logout whose removal from the cache failed, a deleted item): a cached token is
    /// handed out only while the store can be read now and still holds the session.
    /// - Throws: ``AuthError/Code/storeLocked`` (or the store's error) when the store cannot say.
    private func freshFromCache(minTTL: Duration?, rejecting rejected: String?) async throws(AuthError) -> Credentials? {
        guard let accessTokenCache else { return nil }
        let cached: CachedAccessToken?
        do {
            cached = try await accessTokenCache.cachedAccessToken(for: key)
        } catch {
            emit(.accessTokenCacheFailed, "read", nil)
            return nil
        }
        guard let cached else { return nil }
        let credentials = cached.credentials
        if let rejected, credentials.fingerprint == rejected {
            await removeFromCache()
            return nil
        }
        let fresh = minTTL.map { credentials.isValid(for: $0, at: now()) } ?? (now() < cached.freshUntil)
        guard fresh else { return nil }
        do {
            guard try await tokenStore.hasCredentials() else {
                await removeFromCache()
                return nil
            }
        } catch {
            if error.code == .interactionNotAllowed { knownState = .storeLocked }
            throw AuthError.from(error)
        }
        current = credentials
        if knownState != .refreshing { knownState = .signedIn(accessTokenExpiresAt: credentials.expiresAt) }
        emit(.accessTokenFromCache, "fresh", credentials.fingerprint)
        return credentials
    }

    /// How long a token whose lifetime the server did not give is shared with other processes:
    /// long enough that a command run in a loop (`lockbox token`) does not refresh, and rotate
    /// the refresh token, at every call, short enough that a token shorter-lived than the
    /// server said nothing about is not handed out long after it expired.
    static let unknownLifetimeSharing: TimeInterval = 60

    private func shareInCache(_ credentials: Credentials) async {
        guard let accessTokenCache else { return }
        // A token without an expiry is shared for a minute (``unknownLifetimeSharing``).
        let freshUntil = credentials.freshUntil ?? (credentials.issuedAt ?? now()).addingTimeInterval(Self.unknownLifetimeSharing)
        guard freshUntil > now() else {
            await removeFromCache()
            return
        }
        do {
            try await accessTokenCache.storeAccessToken(CachedAccessToken(credentials: credentials, freshUntil: freshUntil), for: key)
        } catch {
            emit(.accessTokenCacheFailed, "store", credentials.fingerprint)
        }
    }

    private func removeFromCache() async {
        guard let accessTokenCache else { return }
        do {
            try await accessTokenCache.removeAccessToken(for: key)
        } catch {
            emit(.accessTokenCacheFailed, "remove", nil)
        }
    }

    // MARK: The DPoP key

    /// A token request's proof, started before the stored refresh token is read so that its
    /// signature (on a thread of its own) overlaps that read instead of following it.
    struct ProofInAdvance {
        let proof: Task<Result<String, AuthError>, Never>
        let generation: Int
        let madeAt: Date
    }

    /// The refresh's proof, started now, when the session's key is already known (nil before
    /// its first use, which reads it from the key store, and without DPoP). It is not used
    /// when the refresh does not happen or the session's key changes meanwhile; either way a
    /// proof that is never sent has no effect.
    private func proofInAdvance() -> ProofInAdvance? {
        guard configuration.usesDPoP, let proofs = sessionProofs else { return nil }
        let endpoint = configuration.tokenEndpoint
        // Detached: the claims and the hop to the signing thread need nothing of this actor.
        let task = Task.detached { () async -> Result<String, AuthError> in
            do throws(AuthError) {
                return .success(try await proofs.proof(method: "POST", url: endpoint, nonce: proofs.nonces.nonce(for: endpoint)))
            } catch {
                return .failure(error)
            }
        }
        return ProofInAdvance(proof: task, generation: sessionProofsGeneration, madeAt: now())
    }

    /// The proofs of the session's key, read from the key store on first use.
    /// - Throws: the store's error (``AuthError/Code/storeLocked`` when locked); ``AuthError/Code/store``
    ///   when the session has no key (the tokens cannot be used without it: sign in again).
    private func requireSessionProofs() async throws(AuthError) -> DPoPProofFactory {
        if let sessionProofs { return sessionProofs }
        let keys = try requireKeyStore()
        let bound: (any ProofSigningKey)?
        do {
            bound = try await keys.boundKey(for: key)
        } catch {
            if error.code == .interactionNotAllowed { knownState = .storeLocked }
            throw AuthError.from(error)
        }
        guard let bound else {
            throw AuthError(
                .store,
                "The session's DPoP key is missing from the keychain, and its tokens are bound to that key. Nothing was "
                    + "changed; sign in again to start a session with a new key.",
                storeError: LockboxError(.itemNotFound, "No DPoP key is bound to this session."))
        }
        let proofs = DPoPProofFactory(key: bound, nonces: nonces, now: now)
        sessionProofs = proofs
        return proofs
    }

    /// Deletes the session's DPoP keys with the session. A failure leaves an unbound key that
    /// the next sign-in's ``DPoPKeyStore/bind(_:to:)`` removes.
    private func deleteSessionKeys() async {
        sessionProofs = nil
        guard let dpopKeys else { return }
        do {
            try await dpopKeys.deleteKeys(for: key)
        } catch {
            emit(.dpopKeyNotDeleted, error.code == .interactionNotAllowed ? "store_locked" : "store_error", nil)
        }
    }

    // MARK: Helpers

    private func acquireCrossProcessLock() async throws(AuthError) -> (any RefreshLockHold)? {
        if let refreshLock { return try await refreshLock.acquire(for: key) }
        guard let lockFilePath else { return nil }
        // A holder may send up to three requests (a nonce retry, a second refresh), each within
        // the request deadline, and then wait for the keychain's write lock (10 s by default).
        return try await FileLock.acquire(path: lockFilePath, limit: configuration.requestLimits.deadline * 3 + .seconds(15))
    }

    private func emit(_ kind: AuthEvent.Kind, _ reason: String, _ fingerprint: String?) {
        eventHandler(AuthEvent(kind: kind, reason: reason, fingerprint: fingerprint, account: key.description, date: now()))
    }

}

extension Credentials {
    init(_ response: TokenResponse) {
        self.init(
            accessToken: response.accessToken, tokenType: response.tokenType, expiresAt: response.expiresAt, scope: response.scope,
            issuedAt: response.requestedAt)
    }
}
