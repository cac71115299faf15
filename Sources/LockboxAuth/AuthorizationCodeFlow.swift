import Foundation
#if canImport(FoundationNetworking)
import FoundationNetworking
#endif
import LockboxCore

/// Signs in through the system browser: authorization code with PKCE S256 (RFC 7636) and a
/// loopback redirect on 127.0.0.1 (RFC 8252).
///
/// ```swift
/// let flow = AuthorizationCodeFlow(configuration: configuration)
/// let session = try flow.start()
/// openInBrowser(session.authorizationURL)
/// let tokens = try await session.waitForTokens()
/// try await manager.signIn(with: tokens)
/// ```
public struct AuthorizationCodeFlow: Sendable {
    /// The client and server this flow signs in to.
    public let configuration: ClientConfiguration
    private let transport: any HTTPTransport
    private let dpop: DPoPProofFactory?
    private let now: @Sendable () -> Date

    /// A flow for `configuration`, over `transport`, reading the time from `now`.
    ///
    /// With ``ClientConfiguration/usesDPoP``, pass `dpop`, the new session's proofs from
    /// ``CredentialsManager/signInProofs()``: the code exchange carries a proof and the tokens
    /// come back bound to its key.
    public init(
        configuration: ClientConfiguration, transport: any HTTPTransport = URLSessionTransport(), dpop: DPoPProofFactory? = nil,
        now: @escaping @Sendable () -> Date = { Date() }
    ) {
        self.configuration = configuration
        self.transport = transport
        self.dpop = dpop
        self.now = now
    }

    /// Opens the loopback listener and builds the authorization URL to open in a browser.
    public func start(scope: [String]? = nil, extraParameters: [String: String] = [:]) throws(AuthError) -> AuthorizationCodeSession {
        try DPoPProofFactory.check(dpop, for: configuration)
        guard let endpoint = configuration.authorizationEndpoint,
            var components = URLComponents(url: endpoint, resolvingAgainstBaseURL: false)
        else {
            throw .configuration("the server has no authorization_endpoint")
        }
        let listener = try LoopbackListener()
        let verifier = Self.randomToken()
        let state = Self.randomToken()
        let challenge = verifier.withUnsafeBytes { Array(SHA256.hash($0)).base64URLString }
        let redirectURI = "http://127.0.0.1:\(listener.port)/callback"
        var items = components.queryItems ?? []
        items += [
            URLQueryItem(name: "response_type", value: "code"),
            URLQueryItem(name: "client_id", value: configuration.clientID),
            URLQueryItem(name: "redirect_uri", value: redirectURI),
            URLQueryItem(name: "code_challenge", value: challenge),
            URLQueryItem(name: "code_challenge_method", value: "S256"),
            URLQueryItem(name: "state", value: state.temporaryString),
        ]
        let scope = scope ?? configuration.scope
        if !scope.isEmpty { items.append(URLQueryItem(name: "scope", value: scope.joined(separator: " "))) }
        for (name, value) in extraParameters.sorted(by: { $0.key < $1.key }) {
            items.append(URLQueryItem(name: name, value: value))
        }
        components.queryItems = items
        guard let url = components.url else { throw .configuration("the authorization URL is malformed") }
        return AuthorizationCodeSession(
            authorizationURL: url, redirectURI: redirectURI, state: state, verifier: verifier, listener: listener,
            configuration: configuration, transport: transport, dpop: dpop, now: now)
    }

    /// 32 random bytes, base64url: 43 characters, as RFC 7636 recommends for a verifier.
    static func randomToken() -> SecretBytes {
        var generator = SystemRandomNumberGenerator()
        var bytes = (0..<32).map { _ in UInt8.random(in: .min ... .max, using: &generator) }
        defer { bytes.wipe() }
        return SecretBytes(utf8: bytes.base64URLString)
    }
}

/// One browser sign-in in progress.
public final class AuthorizationCodeSession: Sendable {
    /// Open this in the user's browser.
    public let authorizationURL: URL
    /// The loopback redirect URI registered for this attempt (`http://127.0.0.1:PORT/...`).
    public let redirectURI: String
    private let state: SecretBytes
    private let verifier: SecretBytes
    private let listener: LoopbackListener
    private let configuration: ClientConfiguration
    private let transport: any HTTPTransport
    private let dpop: DPoPProofFactory?
    private let now: @Sendable () -> Date

    init(
        authorizationURL: URL, redirectURI: String, state: SecretBytes, verifier: SecretBytes, listener: LoopbackListener,
        configuration: ClientConfiguration, transport: any HTTPTransport, dpop: DPoPProofFactory?, now: @escaping @Sendable () -> Date
    ) {
        self.dpop = dpop
        self.authorizationURL = authorizationURL
        self.redirectURI = redirectURI
        self.state = state
        self.verifier = verifier
        self.listener = listener
        self.configuration = configuration
        self.transport = transport
        self.now = now
    }

    /// Waits for the browser's redirect and exchanges the code. A request to the redirect URI
    /// whose `state` is missing or wrong is answered 400 and ignored: the sign-in keeps waiting
    /// for its own redirect (a page or another local process cannot end it, or inject a code).
    /// - Throws: ``AuthError/Code/flowFailed`` with the server's error (`access_denied`, ...)
    ///   or `timeout` as ``AuthError/oauthError``.
    public func waitForTokens(timeout: Duration = .seconds(300)) async throws(AuthError) -> TokenResponse {
        let state = self.state
        let query = try await listener.waitForRedirect(path: "/callback", timeout: timeout) { query in
            // Constant time: SecretBytes compares without an early exit.
            SecretBytes(utf8: query.first { $0.name == "state" }?.value ?? "") == state
        }
        func value(_ name: String) -> String? { query.first { $0.name == name }?.value }
        if let error = value("error") {
            throw .flowFailed(TokenEndpoint.sanitize(error), "the authorization server refused the sign-in")
        }
        guard let code = value("code") else {
            throw .invalidResponse("the redirect carries no code")
        }
        let request = FormBody.post(configuration.tokenEndpoint, [
            ("grant_type", "authorization_code"), ("code", code), ("redirect_uri", redirectURI),
            ("client_id", configuration.clientID), ("code_verifier", verifier.temporaryString),
        ])
        switch try await TokenEndpoint.call(request, transport: transport, limits: configuration.requestLimits, now: now, dpop: dpop) {
        case .success(let tokens):
            return tokens
        case .oauthError(let status, let error, _):
            throw .flowFailed(error, "the server refused the authorization code", status: status)
        case .httpError(let status, let retryAfter):
            throw .server(status: status, error: nil, retryAfter: retryAfter)
        }
    }
}
