import Foundation
import LockboxCore

/// What the `lockbox` CLI's OAuth verbs do, as values: nothing here prints. The CLI maps
/// each call to output and an exit status.
///
/// | Command | Call |
/// |---|---|
/// | `lockbox login --issuer URL --client-id ID [--scope S]...` | ``beginLogin(issuer:clientID:scope:)``, print `instructions`, then `completeLogin` |
/// | `lockbox token [--issuer URL] [--client-id ID]` | ``accessToken(issuer:clientID:)`` (write its bytes to stdout) |
/// | `lockbox logout [--issuer URL] [--client-id ID]` | ``logout(issuer:clientID:)`` |
/// | `lockbox logout --retry` | ``retryPendingLogouts()`` |
/// | `lockbox auth status` | ``status()`` |
public struct CommandLineSession: Sendable {
    /// Where sessions and the revocation outbox are kept.
    public let store: any ItemStore
    /// The directory of cross-process lock files; use `vault.path + ".oauth-locks"`.
    public let lockDirectory: String
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
    ///   - events: called synchronously for each ``AuthEvent``.
    public init(
        store: any ItemStore, lockDirectory: String, transport: any HTTPTransport = URLSessionTransport(),
        requestLimits: RequestLimits = RequestLimits(), events: @escaping @Sendable (AuthEvent) -> Void = { _ in }
    ) {
        self.store = store
        self.lockDirectory = lockDirectory
        self.transport = transport
        self.requestLimits = requestLimits
        self.events = events
    }

    /// A device sign-in waiting for the user.
    public struct PendingLogin: Sendable {
        /// The client the login is for.
        public let configuration: ClientConfiguration
        /// The device code and the user code to show.
        public let authorization: DeviceAuthorization
        /// "Open https://... and enter the code ABCD-EFGH." The code and URIs were checked to
        /// hold no control characters; the text is sanitised again for the terminal.
        public var instructions: String { TerminalText.sanitized(authorization.instructions) }
    }

    /// One stored session, for `lockbox auth status`. Holds no token.
    public struct SessionStatus: Sendable, Hashable, CustomStringConvertible {
        /// The issuer the session belongs to.
        public let issuer: String
        /// The client's identifier.
        public let clientID: String
        /// The account name the session is stored under.
        public let account: String
        /// The scopes granted.
        public let scope: [String]

        /// One line for a terminal; values read from the store are sanitised.
        public var description: String {
            TerminalText.sanitized(
                "\(issuer)  client \(clientID)  account \(account)  signed in"
                    + (scope.isEmpty ? "" : "  scope: \(scope.joined(separator: " "))"))
        }
    }

    /// The answer of ``status()``.
    public struct Status: Sendable, Hashable {
        /// The stored sessions.
        public let sessions: [SessionStatus]
        /// Revocations waiting in the outbox for a retry.
        public let pendingRevocations: Int

        /// Lines for a terminal.
        public var lines: [String] {
            (sessions.isEmpty ? ["Not signed in."] : sessions.map(\.description))
                + (pendingRevocations > 0 ? ["\(pendingRevocations) revocation(s) pending: run `lockbox logout --retry`."] : [])
        }
    }

    /// Discovers the issuer (RFC 8414) and starts a device authorization (RFC 8628).
    public func beginLogin(issuer: URL, clientID: String, scope: [String] = []) async throws(AuthError) -> PendingLogin {
        let configuration = try await ClientConfiguration.discover(
            issuer: issuer, clientID: clientID, scope: scope, transport: transport, requestLimits: requestLimits)
        let authorization = try await DeviceAuthorizationFlow(configuration: configuration, transport: transport).start()
        return PendingLogin(configuration: configuration, authorization: authorization)
    }

    /// Waits for the user's approval, then stores the session. Returns a message to show.
    public func completeLogin(_ pending: PendingLogin, flow: DeviceAuthorizationFlow? = nil) async throws(AuthError) -> String {
        let flow = flow ?? DeviceAuthorizationFlow(configuration: pending.configuration, transport: transport)
        let tokens = try await flow.waitForApproval(pending.authorization)
        let manager = makeManager(pending.configuration)
        try await manager.signIn(with: tokens)
        return "Signed in to \(pending.configuration.issuer.absoluteString) as client \(pending.configuration.clientID)."
    }

    /// A fresh access token, for scripts (`lockbox token`). Each call in a new process
    /// refreshes, since access tokens are never stored.
    ///
    /// - Throws: besides the manager's errors, ``AuthError/Code/store`` (the store's error in
    ///   ``AuthError/storeError``) when the server rotated the refresh token and the store could
    ///   not keep the new one: this process ends, so the session cannot continue in memory, and
    ///   the token is not handed out as if all were well.
    public func accessToken(issuer: String? = nil, clientID: String? = nil) async throws(AuthError) -> SecretBytes {
        let manager = try await manager(issuer: issuer, clientID: clientID)
        let credentials = try await manager.credentials()
        if await manager.isPersistentSignInDisabled {
            let cause = await manager.rotationStoreError
            throw AuthError(
                .store,
                "The server rotated the refresh token, but the keychain could not store the new one"
                    + (cause.map { " (\($0.message))" } ?? "") + ". The stored one is used up: unlock the keychain if it is "
                    + "locked, then sign in again with `lockbox login`.",
                storeError: cause)
        }
        return credentials.accessToken
    }

    /// Signs out and revokes. Returns a message to show.
    public func logout(issuer: String? = nil, clientID: String? = nil) async throws(AuthError) -> String {
        let manager = try await manager(issuer: issuer, clientID: clientID)
        let result = try await manager.logout()
        if result.revoked { return "Signed out; the server revoked the session." }
        if result.queued { return "Signed out locally. The server could not be reached to revoke the session; run `lockbox logout --retry` later." }
        return "Signed out."
    }

    /// Retries pending revocations (`lockbox logout --retry`). Returns a message to show.
    public func retryPendingLogouts() async throws(AuthError) -> String {
        let result = try await outbox.retryPending()
        if result.remaining > 0 {
            return "\(result.revoked) revocation(s) delivered; \(result.remaining) still pending (the server is unreachable)."
        }
        return result.revoked + result.dropped == 0 ? "No pending revocations." : "All pending revocations delivered."
    }

    /// The stored sessions and pending revocations (`lockbox auth status`). Prints no token.
    public func status() async throws(AuthError) -> Status {
        let sessions: [SessionStatus]
        do {
            sessions = try await StoredSession.all(in: store).map {
                SessionStatus(issuer: $0.key.issuer, clientID: $0.key.clientID, account: $0.key.account, scope: $0.configuration?.scope ?? [])
            }
        } catch {
            throw AuthError.from(error)
        }
        return Status(sessions: sessions, pendingRevocations: try await outbox.pendingCount())
    }

    /// The manager of the one stored session matching the filters.
    /// - Throws: ``AuthError/Code/signedOut`` when none matches; ``AuthError/Code/configuration``
    ///   when several do (name one with `--issuer` and `--client-id`).
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
            throw .configuration("several sessions match; name one with --issuer and --client-id")
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
            transport: transport, lockDirectory: lockDirectory, outbox: outbox, events: events)
    }
}
