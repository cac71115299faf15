import Foundation
import LockboxCore

/// Something the credential lifecycle did, for logs and metrics. Carries a reason code and a
/// token fingerprint (``TokenFingerprint``), never a token.
public struct AuthEvent: Sendable, Hashable, CustomStringConvertible {
    /// What happened.
    public enum Kind: String, Sendable, Hashable {
        /// Tokens were stored after a sign-in.
        case signedIn = "signed_in"
        /// A refresh started.
        case refreshStarted = "refresh_started"
        /// A refresh returned a new access token.
        case refreshSucceeded = "refresh_succeeded"
        /// A refresh failed; the reason code says why.
        case refreshFailed = "refresh_failed"
        /// Another process rotated the refresh token; this one used the new token.
        case refreshTokenChangedElsewhere = "refresh_token_changed_elsewhere"
        /// A rotated refresh token was stored.
        case rotationPersisted = "rotation_persisted"
        /// Persisting the rotated token failed: the session continues in memory only.
        case rotationNotPersisted = "rotation_not_persisted"
        /// The session ended without the user asking (the grant is gone).
        case signedOut = "signed_out"
        /// The user signed out.
        case logout
        /// The server revoked a token (RFC 7009).
        case revocationSucceeded = "revocation_succeeded"
        /// A revocation failed and waits in the outbox for a retry.
        case revocationQueued = "revocation_queued"
        /// A revocation was given up (refused for good, or too old).
        case revocationDropped = "revocation_dropped"
        /// A request that got a 401 was sent again with fresh credentials.
        case requestRetried = "request_retried"
        /// A request that got a 401 was not sent again (not safe to repeat).
        case requestNotRetried = "request_not_retried"
        /// A fresh access token came from the shared cache instead of a refresh.
        case accessTokenFromCache = "access_token_from_cache"
        /// The shared cache failed to store, read or remove an entry (the reason says which);
        /// the session goes on, at the cost of refreshes.
        case accessTokenCacheFailed = "access_token_cache_failed"
        /// A logout or a sign-out could not delete the session's DPoP key (a locked keychain);
        /// the next sign-in deletes it.
        case dpopKeyNotDeleted = "dpop_key_not_deleted"
    }

    /// What happened.
    public let kind: Kind
    /// A short machine-readable reason (`invalid_grant`, `network`, `http_503`, `rotated`, ...).
    public let reason: String
    /// The fingerprint of the token concerned, when there is one.
    public let fingerprint: String?
    /// The account, as ``CredentialKey/description`` prints it.
    public let account: String
    /// When it happened.
    public let date: Date

    /// An event; `fingerprint` identifies a token without revealing it.
    public init(kind: Kind, reason: String, fingerprint: String?, account: String, date: Date = Date()) {
        self.kind = kind
        self.reason = reason
        self.fingerprint = fingerprint
        self.account = account
        self.date = date
    }

    /// One log line: `refresh_failed reason=http_503 token=3fa91c07 account=...`.
    public var description: String {
        "\(kind.rawValue) reason=\(reason) token=\(fingerprint ?? "-") account=\(account)"
    }
}

/// What a session is doing, for a UI or a status line.
public enum CredentialsState: Sendable, Hashable, CustomStringConvertible {
    /// Credentials are stored; `accessTokenExpiresAt` is set once an access token is in memory.
    case signedIn(accessTokenExpiresAt: Date?)
    /// A refresh is in flight.
    case refreshing
    /// No session, and why.
    case signedOut(SignOutReason)
    /// The store is locked, so whether a session exists is unknown; nothing was cleared.
    case storeLocked

    /// The state in words, without tokens.
    public var description: String {
        switch self {
        case .signedIn(let expiry): "signed in" + (expiry.map { ", access token until \($0)" } ?? "")
        case .refreshing: "refreshing"
        case .signedOut(let reason): "signed out (\(reason.rawValue))"
        case .storeLocked: "keychain locked"
        }
    }
}

/// The access token and what came with it. Prints `<redacted>` for the token.
public struct Credentials: Sendable, CustomStringConvertible {
    /// The access token, to send as `Authorization: <tokenType> <token>`.
    public let accessToken: SecretBytes
    /// `Bearer` or `DPoP`, as the server gave it.
    public let tokenType: String
    /// When the access token expires; nil when the server did not say.
    public let expiresAt: Date?
    /// The scopes granted.
    public let scope: [String]
    /// When the token was requested, by the local clock, when known: its lifetime sets the
    /// refresh leeway (``CredentialsManager/refreshLeeway(lifetime:)``).
    public let issuedAt: Date?

    /// Credentials as a token response or a cache entry gave them.
    public init(accessToken: SecretBytes, tokenType: String, expiresAt: Date?, scope: [String], issuedAt: Date? = nil) {
        self.accessToken = accessToken
        self.tokenType = tokenType
        self.expiresAt = expiresAt
        self.scope = scope
        self.issuedAt = issuedAt
    }

    /// Eight hex digits that identify the token in logs without revealing it.
    public var fingerprint: String { TokenFingerprint.of(accessToken) }

    /// Until when the token counts as fresh with no explicit `minTTL`: its expiry minus the
    /// refresh leeway. Nil when the server gave no expiry.
    public var freshUntil: Date? {
        guard let expiresAt else { return nil }
        let lifetime = issuedAt.map { expiresAt.timeIntervalSince($0) }
        let leeway = CredentialsManager.refreshLeeway(lifetime: lifetime.map { .milliseconds(Int64(max(0, $0) * 1000)) })
        return expiresAt.addingTimeInterval(-leeway.timeInterval)
    }

    /// Fresh for `minTTL` after `now`, or, when `minTTL` is nil, until ``freshUntil``.
    func isFresh(for minTTL: Duration?, at now: Date) -> Bool {
        if let minTTL { return isValid(for: minTTL, at: now) }
        guard let freshUntil else { return true }
        return now < freshUntil
    }

    /// True when the token stays valid for at least `minTTL` after `now`.
    public func isValid(for minTTL: Duration, at now: Date) -> Bool {
        guard let expiresAt else { return true }
        let seconds = Double(minTTL.components.seconds) + Double(minTTL.components.attoseconds) / 1e18
        return expiresAt.timeIntervalSince(now) > seconds
    }

    /// `Bearer <token>`, for an `Authorization` header.
    var authorizationHeaderValue: String { "Bearer " + accessToken.temporaryString }

    /// The token type, expiry, scope and fingerprint; never the token.
    public var description: String {
        "Credentials(accessToken: <redacted>, fingerprint: \(fingerprint), expiresAt: \(expiresAt.map { "\($0)" } ?? "-"))"
    }
}

/// Passed to the post-rotation hook, after the new refresh token is stored.
public struct Rotation: Sendable {
    /// The fingerprint of the refresh token that was replaced.
    public let previousFingerprint: String
    /// The fingerprint of the refresh token that replaced it.
    public let newFingerprint: String
    /// False when persisting failed and the session continues in memory only.
    public let persisted: Bool
}

extension Duration {
    /// The duration in seconds, as a `TimeInterval`.
    var timeInterval: TimeInterval {
        Double(components.seconds) + Double(components.attoseconds) / 1e18
    }
}
