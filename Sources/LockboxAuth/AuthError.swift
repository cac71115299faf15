import Foundation
import LockboxCore

/// Why a session ended. The raw value is the reason code events and the CLI show.
public enum SignOutReason: String, Sendable, Hashable, Codable {
    /// Nothing was stored for this account.
    case noCredentials = "no_credentials"
    /// The server answered `invalid_grant`: the refresh token expired, was revoked, or was
    /// used twice (reuse detection revoked its family).
    case refreshTokenRejected = "invalid_grant"
    /// The server answered `invalid_client`.
    case clientRejected = "invalid_client"
    /// The user logged out.
    case loggedOut = "logged_out"
    /// Another process signed this account out (the stored token vanished).
    case signedOutElsewhere = "signed_out_elsewhere"
    /// The server rotated the refresh token but the store refused the new one (too large, or
    /// another permanent store error): the previous token is used up, so the session ended.
    case rotatedTokenNotStored = "rotated_token_not_stored"
}

/// The errors of the credential lifecycle: a ``Code`` to match, a message that says what to do,
/// and the cause where there is one (the store's `LockboxError`, the HTTP status, the OAuth
/// error code, the `URLError` code). Messages never contain a token.
///
/// Match codes, not text; new codes may be added without breaking clients:
///
/// ```swift
/// do {
///     let credentials = try await manager.credentials()
/// } catch AuthError.signedOut {
///     // sign in again
/// } catch AuthError.storeLocked {
///     // ask the user to unlock; nothing was cleared
/// }
/// ```
public struct AuthError: Error, Sendable, Hashable, CustomStringConvertible {
    /// What kind of failure this is. The raw value is the reason code events show.
    public struct Code: RawRepresentable, Hashable, Sendable, CustomStringConvertible {
        /// The code's name (`signed_out`, `network`, ...), stable across releases.
        public let rawValue: String
        /// A code from its name.
        public init(rawValue: String) { self.rawValue = rawValue }

        /// There is no session: sign in again. ``AuthError/signOutReason`` says why, and the
        /// credentials were cleared where the reason says so.
        public static let signedOut = Code(rawValue: "signed_out")
        /// The keychain is locked. Credentials are kept; unlock and try again.
        public static let storeLocked = Code(rawValue: "store_locked")
        /// The keychain failed otherwise (``AuthError/storeError`` holds its error). Credentials
        /// are kept.
        public static let store = Code(rawValue: "store_error")
        /// The server could not be reached, TLS failed, or the request's deadline passed
        /// (``AuthError/urlErrorCode``). Credentials are kept.
        public static let network = Code(rawValue: "network")
        /// The server answered with an error that does not end the session (5xx,
        /// `temporarily_unavailable`, ...): see ``AuthError/httpStatus``,
        /// ``AuthError/oauthError`` and ``AuthError/retryAfter``. Credentials are kept.
        public static let server = Code(rawValue: "server")
        /// The server's answer was not valid OAuth, or carried something unsafe to use or show
        /// (an `http:` or `javascript:` verification URI, control characters in a user code).
        public static let invalidResponse = Code(rawValue: "invalid_response")
        /// The server's answer was larger than ``RequestLimits/maximumResponseSize``; it was
        /// not read further.
        public static let responseTooLarge = Code(rawValue: "response_too_large")
        /// The server answered with a redirect that Lockbox does not follow (any redirect from
        /// the token, revocation and device endpoints; from https to http anywhere).
        public static let redirectRefused = Code(rawValue: "redirect_refused")
        /// A sign-in flow ended without tokens: ``AuthError/oauthError`` is the OAuth error
        /// (`access_denied`, `expired_token`, `timeout`, ...).
        public static let flowFailed = Code(rawValue: "flow_failed")
        /// The configuration lacks something (an endpoint, a client id).
        public static let configuration = Code(rawValue: "configuration")
        /// The caller's task was cancelled.
        public static let cancelled = Code(rawValue: "cancelled")
        /// Several stored sessions match what was asked for: ``AuthError/matchingSessions``
        /// lists them.
        public static let ambiguousSession = Code(rawValue: "ambiguous_session")
        /// The server refused the session's DPoP proof (`invalid_dpop_proof`), or asked for a
        /// fresh nonce again after a retry with its nonce (`use_dpop_nonce`), or gave no usable
        /// nonce: ``AuthError/oauthError`` says which. Credentials are kept.
        public static let proofRejected = Code(rawValue: "dpop_proof_rejected")

        /// The code's name.
        public var description: String { rawValue }

        /// Lets `catch AuthError.signedOut` read naturally.
        public static func ~= (code: Code, error: any Error) -> Bool {
            (error as? AuthError)?.code == code
        }

        /// Matches an `AuthError` by its code: `catch AuthError.network`.
        public static func ~= (code: Code, error: AuthError) -> Bool {
            error.code == code
        }
    }

    /// What went wrong; match it rather than the message.
    public let code: Code
    /// What happened and what to do. Never contains a token; fixed text and sanitised codes.
    public let message: String
    /// For ``Code/signedOut``: why.
    public let signOutReason: SignOutReason?
    /// For ``Code/store`` and ``Code/storeLocked`` (and a sign-out caused by the store): the
    /// store's error.
    public let storeError: LockboxError?
    /// The HTTP status of the answer, when there was one.
    public let httpStatus: Int?
    /// The OAuth error code (RFC 6749 section 5.2, RFC 8628 section 3.5), restricted to
    /// `[A-Za-z0-9_.-]`, or the flow's own code (`state_mismatch`, `timeout`).
    public let oauthError: String?
    /// The `Retry-After` header.
    public let retryAfter: Duration?
    /// For ``Code/network``: the `URLError` code (`-1001` when the request deadline passed).
    public let urlErrorCode: Int?
    /// The URL that failed, when naming it helps (the discovery document that answered 404,
    /// the host that could not be resolved). Never carries a token or a code.
    public let failingURL: URL?
    /// For ``Code/ambiguousSession``: the sessions that matched.
    public let matchingSessions: [CredentialKey]

    /// An error with `code`, a `message` without secrets, and the details the code calls for.
    public init(
        _ code: Code, _ message: String, signOutReason: SignOutReason? = nil, storeError: LockboxError? = nil,
        httpStatus: Int? = nil, oauthError: String? = nil, retryAfter: Duration? = nil, urlErrorCode: Int? = nil,
        failingURL: URL? = nil, matchingSessions: [CredentialKey] = []
    ) {
        self.code = code
        self.message = message
        self.signOutReason = signOutReason
        self.storeError = storeError
        self.httpStatus = httpStatus
        self.oauthError = oauthError
        self.retryAfter = retryAfter
        self.urlErrorCode = urlErrorCode
        self.failingURL = failingURL
        self.matchingSessions = matchingSessions
    }

    /// The message; it never contains a token.
    public var description: String { message }

    /// True when the session is gone and the user must sign in again.
    public var isSignedOut: Bool { code == .signedOut }

    /// A short machine-readable reason for events: the OAuth error, `http_503`, the sign-out
    /// reason, or the code.
    var reasonCode: String {
        switch code {
        case .signedOut: signOutReason?.rawValue ?? code.rawValue
        case .server: oauthError ?? httpStatus.map { "http_\($0)" } ?? code.rawValue
        case .flowFailed, .proofRejected: oauthError ?? code.rawValue
        default: code.rawValue
        }
    }

    /// ``Code/signedOut``, for `catch AuthError.signedOut`.
    public static let signedOut = Code.signedOut
    /// ``Code/storeLocked``.
    public static let storeLocked = Code.storeLocked
    /// ``Code/store``.
    public static let store = Code.store
    /// ``Code/network``.
    public static let network = Code.network
    /// ``Code/server``.
    public static let server = Code.server
    /// ``Code/invalidResponse``.
    public static let invalidResponse = Code.invalidResponse
    /// ``Code/responseTooLarge``.
    public static let responseTooLarge = Code.responseTooLarge
    /// ``Code/redirectRefused``.
    public static let redirectRefused = Code.redirectRefused
    /// ``Code/flowFailed``.
    public static let flowFailed = Code.flowFailed
    /// ``Code/configuration``.
    public static let configuration = Code.configuration
    /// ``Code/cancelled``.
    public static let cancelled = Code.cancelled
    /// ``Code/proofRejected``.
    public static let proofRejected = Code.proofRejected
    /// ``Code/ambiguousSession``.
    public static let ambiguousSession = Code.ambiguousSession
}

extension AuthError {
    static func signedOut(_ reason: SignOutReason, storeError: LockboxError? = nil) -> AuthError {
        AuthError(.signedOut, "Signed out (\(reason.rawValue)). Sign in again.", signOutReason: reason, storeError: storeError)
    }

    static func network(_ detail: String, urlErrorCode: Int? = nil, failingURL: URL? = nil) -> AuthError {
        AuthError(
            .network, "The authorization server could not be reached: \(detail). Credentials are kept; try again later.",
            urlErrorCode: urlErrorCode, failingURL: failingURL)
    }

    static func server(status: Int, error: String?, retryAfter: Int?) -> AuthError {
        AuthError(
            .server,
            "The authorization server answered \(status)\(error.map { " (\($0))" } ?? "")"
                + (retryAfter.map { "; retry after \($0) s" } ?? "") + ". Credentials are kept.",
            httpStatus: status, oauthError: error, retryAfter: retryAfter.map { .seconds($0) })
    }

    static func invalidResponse(_ detail: String, status: Int? = nil) -> AuthError {
        AuthError(.invalidResponse, "The authorization server's answer was not valid OAuth: \(detail).", httpStatus: status)
    }

    static func flowFailed(_ oauthError: String, _ detail: String, status: Int? = nil) -> AuthError {
        AuthError(.flowFailed, "Sign-in failed (\(oauthError)): \(detail). Start the sign-in again.", httpStatus: status, oauthError: oauthError)
    }

    static func configuration(_ detail: String) -> AuthError {
        AuthError(.configuration, "OAuth configuration: \(detail).")
    }

    static let cancelledError = AuthError(.cancelled, "Cancelled.")

    /// The server refused a DPoP proof (`invalid_dpop_proof`).
    static func proofRefused(status: Int) -> AuthError {
        AuthError(
            .proofRejected,
            "The server refused the session's DPoP proof (invalid_dpop_proof, HTTP \(status)). Credentials are kept; check "
                + "the system clock (a proof carries the time), then try again.",
            httpStatus: status, oauthError: "invalid_dpop_proof")
    }

    /// The server asked for a nonce again after a retry with its own, or gave none to use.
    static func nonceNotSettled(status: Int, nonceGiven: Bool) -> AuthError {
        AuthError(
            .proofRejected,
            (nonceGiven
                ? "The server asked for a new DPoP nonce again after a retry with the nonce it gave (use_dpop_nonce, HTTP \(status)); "
                    + "the request was not repeated further. "
                : "The server asked for a DPoP nonce (use_dpop_nonce, HTTP \(status)) without a valid DPoP-Nonce header to use. ")
                + "Credentials are kept; try again later, and report the server's nonce handling if this persists.",
            httpStatus: status, oauthError: "use_dpop_nonce")
    }

    static func responseTooLarge(limit: Int) -> AuthError {
        AuthError(
            .responseTooLarge,
            "The authorization server's answer is over \(limit) bytes and was refused unread. Credentials are kept; "
                + "if the server's tokens are legitimately this large, raise RequestLimits.maximumResponseSize.")
    }

    static func redirectRefused(status: Int?, detail: String) -> AuthError {
        AuthError(.redirectRefused, "The authorization server answered with a redirect that was not followed: \(detail).", httpStatus: status)
    }

    /// A store error as the lifecycle reports it: `storeLocked` when the store is locked, `store`
    /// otherwise (for ``TokenStore`` and ``RefreshLock`` implementations).
    public static func from(_ error: LockboxError) -> AuthError {
        if error.code == .interactionNotAllowed {
            return AuthError(
                .storeLocked, "The keychain is locked; credentials are kept. Unlock it and try again.", storeError: error)
        }
        return AuthError(.store, "The keychain failed: \(error)", storeError: error)
    }
}
