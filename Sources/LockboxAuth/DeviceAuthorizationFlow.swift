import Foundation
#if canImport(FoundationNetworking)
import FoundationNetworking
#endif
import LockboxCore

/// Signs in on a device without a browser (RFC 8628): show ``DeviceAuthorization/userCode``
/// and ``DeviceAuthorization/verificationURI`` to the user, then wait for the approval.
///
/// ```swift
/// let flow = DeviceAuthorizationFlow(configuration: configuration)
/// let authorization = try await flow.start()
/// print("Open \(authorization.verificationURI) and enter \(authorization.userCode)")
/// let tokens = try await flow.waitForApproval(authorization)
/// try await manager.signIn(with: tokens)
/// ```
public struct DeviceAuthorizationFlow: Sendable {
    /// The client and server this flow signs in to.
    public let configuration: ClientConfiguration
    private let transport: any HTTPTransport
    private let slowDownIncrement: Duration
    private let dpop: DPoPProofFactory?
    private let now: @Sendable () -> Date

    /// A device flow for `configuration`'s client.
    ///
    /// - Parameters:
    ///   - configuration: the client and its authorization server.
    ///   - transport: how requests reach the server.
    ///   - slowDownIncrement: added to the polling interval on each `slow_down`
    ///     (RFC 8628 section 3.5 says 5 seconds; tests may shorten it).
    ///   - dpop: with ``ClientConfiguration/usesDPoP``, the new session's proofs from
    ///     ``CredentialsManager/signInProofs()``: each poll carries a proof and the tokens come
    ///     back bound to its key.
    ///   - now: the current time, for the device code's expiry.
    public init(
        configuration: ClientConfiguration, transport: any HTTPTransport = URLSessionTransport(),
        slowDownIncrement: Duration = .seconds(5), dpop: DPoPProofFactory? = nil, now: @escaping @Sendable () -> Date = { Date() }
    ) {
        self.dpop = dpop
        self.configuration = configuration
        self.transport = transport
        self.slowDownIncrement = slowDownIncrement
        self.now = now
    }

    /// Asks the server for a device code and a user code.
    public func start(scope: [String]? = nil) async throws(AuthError) -> DeviceAuthorization {
        try DPoPProofFactory.check(dpop, for: configuration)
        guard let endpoint = configuration.deviceAuthorizationEndpoint else {
            throw .configuration("the server has no device_authorization_endpoint")
        }
        var fields = [("client_id", configuration.clientID)]
        let scope = scope ?? configuration.scope
        if !scope.isEmpty { fields.append(("scope", scope.joined(separator: " "))) }
        let (data, response) = try await transport.exchange(
            FormBody.post(endpoint, fields), limits: configuration.requestLimits, redirects: .refuse)
        let object = (try? JSONSerialization.jsonObject(with: data)) as? [String: Any]
        guard response.statusCode == 200 else {
            if let error = object?["error"] as? String {
                throw .flowFailed(TokenEndpoint.sanitize(error), "the server refused the device authorization request", status: response.statusCode)
            }
            throw .server(status: response.statusCode, error: nil, retryAfter: nil)
        }
        guard let object, let deviceCode = object["device_code"] as? String, let userCode = object["user_code"] as? String,
            let uriText = object["verification_uri"] as? String
        else {
            throw .invalidResponse("the device authorization response lacks device_code, user_code or verification_uri")
        }
        // The user code and the URIs are shown to the user: refuse what could rewrite the
        // terminal or send the user anywhere but an https page.
        guard !userCode.isEmpty, userCode.count <= 64, TerminalText.isPrintable(userCode) else {
            throw .invalidResponse("the user_code is empty, over 64 characters, or holds control characters")
        }
        let uri = try Self.verificationURI(uriText, field: "verification_uri")
        let complete = try (object["verification_uri_complete"] as? String).map { text throws(AuthError) in
            try Self.verificationURI(text, field: "verification_uri_complete")
        }
        let expiresIn = TokenEndpoint.boundedLifetime(object["expires_in"]) ?? 600
        let interval = max(1, (object["interval"] as? NSNumber)?.intValue ?? 5)
        return DeviceAuthorization(
            deviceCode: SecretBytes(utf8: deviceCode), userCode: userCode, verificationURI: uri,
            verificationURIComplete: complete,
            expiresAt: now().addingTimeInterval(TimeInterval(expiresIn)), interval: .seconds(interval))
    }

    /// A verification URI the user may be sent to: https with a host, printable, at most 2,048
    /// characters. `http:` is refused even for loopback hosts: the user opens it on another
    /// device, where a loopback address means something else.
    static func verificationURI(_ text: String, field: String) throws(AuthError) -> URL {
        guard text.utf8.count <= 2048, TerminalText.isPrintable(text), let url = URL(string: text),
            url.scheme?.lowercased() == "https", let host = url.host, !host.isEmpty, url.user == nil, url.password == nil
        else {
            throw .invalidResponse("\(field) is not an https URL that can be shown safely")
        }
        return url
    }

    /// Polls the token endpoint until the user approves, denies, or the code expires.
    /// Honours `slow_down` (the interval grows for this and all later polls) and backs off
    /// exponentially on network errors and 5xx answers. Cancel the task to stop.
    /// - Throws: ``AuthError/Code/flowFailed`` with `access_denied` or `expired_token` as its
    ///   ``AuthError/oauthError``; ``AuthError/Code/cancelled``.
    public func waitForApproval(_ authorization: DeviceAuthorization) async throws(AuthError) -> TokenResponse {
        try DPoPProofFactory.check(dpop, for: configuration)
        var interval = authorization.interval
        var backoff = Duration.zero
        while true {
            do {
                try await Task.sleep(for: interval + backoff)
            } catch {
                throw .cancelledError
            }
            guard now() < authorization.expiresAt else {
                throw .flowFailed("expired_token", "the user code expired before it was approved")
            }
            let request = FormBody.post(configuration.tokenEndpoint, [
                ("grant_type", "urn:ietf:params:oauth:grant-type:device_code"),
                ("device_code", authorization.deviceCode.temporaryString), ("client_id", configuration.clientID),
            ])
            let result: TokenEndpointResult
            do {
                result = try await TokenEndpoint.call(
                    request, transport: transport, limits: configuration.requestLimits, now: now, dpop: dpop)
            } catch AuthError.network {
                backoff = Self.nextBackoff(backoff, interval: interval)
                continue
            }
            switch result {
            case .success(let tokens):
                return tokens
            case .oauthError(_, "authorization_pending", _):
                backoff = .zero
            case .oauthError(_, "slow_down", _):
                interval += slowDownIncrement
            case .oauthError(let status, "access_denied", _):
                throw .flowFailed("access_denied", "the user denied the request", status: status)
            case .oauthError(let status, "expired_token", _):
                throw .flowFailed("expired_token", "the user code expired before it was approved", status: status)
            case .oauthError(let status, let error, let retryAfter) where status >= 500 || error == "temporarily_unavailable":
                backoff = max(Self.nextBackoff(backoff, interval: interval), .seconds(retryAfter ?? 0))
            case .oauthError(let status, let error, _):
                throw .flowFailed(error, "the server refused the device code", status: status)
            case .httpError(let status, let retryAfter) where status >= 500 || status == 429:
                backoff = max(Self.nextBackoff(backoff, interval: interval), .seconds(retryAfter ?? 0))
            case .httpError(let status, _):
                throw .server(status: status, error: nil, retryAfter: nil)
            }
        }
    }

    private static func nextBackoff(_ current: Duration, interval: Duration) -> Duration {
        min(current == .zero ? interval : current * 2, .seconds(60))
    }
}

/// A pending device authorization: what to show the user, and the device code (kept secret).
public struct DeviceAuthorization: Sendable, CustomStringConvertible {
    let deviceCode: SecretBytes
    /// The code the user types at ``verificationURI``: printable (no control or escape
    /// characters), at most 64 characters.
    public let userCode: String
    /// An https URL.
    public let verificationURI: URL
    /// The URI with the code filled in, for a QR code or a link; https.
    public let verificationURIComplete: URL?
    /// When the device code expires; polling stops then.
    public let expiresAt: Date
    /// The polling interval the server asked for.
    public let interval: Duration

    /// The user code; the device code prints as `<redacted>`.
    public var description: String { "DeviceAuthorization(userCode: \(userCode), deviceCode: <redacted>)" }
}
