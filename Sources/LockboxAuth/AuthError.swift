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
}

/// The errors of the credential lifecycle. Messages never contain a token.
public enum AuthError: Error, Sendable, Hashable, CustomStringConvertible {
    /// There is no session: sign in again. Credentials were cleared where the reason says so.
    case signedOut(SignOutReason)
    /// The keychain is locked. Credentials are kept; unlock and try again.
    case storeLocked
    /// The keychain failed otherwise. Credentials are kept.
    case store(LockboxError)
    /// The server could not be reached, or TLS failed. Credentials are kept.
    case network(String)
    /// The server answered with an error that does not end the session (5xx,
    /// `temporarily_unavailable`, ...). `retryAfter` is the Retry-After header in seconds.
    case server(status: Int, error: String?, retryAfter: Int?)
    /// The server's answer was not valid OAuth.
    case invalidResponse(String)
    /// A sign-in flow ended without tokens: `code` is the OAuth error (`access_denied`,
    /// `expired_token`, `state_mismatch`, ...).
    case flowFailed(code: String, message: String)
    /// The configuration lacks something (an endpoint, a client id).
    case configuration(String)
    /// The caller's task was cancelled.
    case cancelled

    public var description: String {
        switch self {
        case .signedOut(let reason): "Signed out (\(reason.rawValue)). Sign in again."
        case .storeLocked: "The keychain is locked; credentials are kept. Unlock it and try again."
        case .store(let error): "The keychain failed: \(error)"
        case .network(let message): "The authorization server could not be reached: \(message)"
        case .server(let status, let error, let retryAfter):
            "The authorization server answered \(status)\(error.map { " (\($0))" } ?? "")"
                + (retryAfter.map { "; retry after \($0) s" } ?? "") + ". Credentials are kept."
        case .invalidResponse(let message): "The authorization server's answer was not valid OAuth: \(message)"
        case .flowFailed(let code, let message): "Sign-in failed (\(code)): \(message)"
        case .configuration(let message): "OAuth configuration: \(message)"
        case .cancelled: "Cancelled."
        }
    }

    /// True when the session is gone and the user must sign in again.
    public var isSignedOut: Bool {
        if case .signedOut = self { return true }
        return false
    }

    static func from(_ error: LockboxError) -> AuthError {
        error.code == .interactionNotAllowed ? .storeLocked : .store(error)
    }
}
