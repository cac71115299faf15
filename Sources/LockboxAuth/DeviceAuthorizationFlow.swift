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
    public let configuration: ClientConfiguration
    private let transport: any HTTPTransport
    private let slowDownIncrement: Duration
    private let now: @Sendable () -> Date

    /// - Parameter slowDownIncrement: added to the polling interval on each `slow_down`
    ///   (RFC 8628 section 3.5 says 5 seconds; tests may shorten it).
    public init(
        configuration: ClientConfiguration, transport: any HTTPTransport = URLSessionTransport(),
        slowDownIncrement: Duration = .seconds(5), now: @escaping @Sendable () -> Date = { Date() }
    ) {
        self.configuration = configuration
        self.transport = transport
        self.slowDownIncrement = slowDownIncrement
        self.now = now
    }

    /// Asks the server for a device code and a user code.
    public func start(scope: [String]? = nil) async throws(AuthError) -> DeviceAuthorization {
        guard let endpoint = configuration.deviceAuthorizationEndpoint else {
            throw .configuration("the server has no device_authorization_endpoint")
        }
        var fields = [("client_id", configuration.clientID)]
        let scope = scope ?? configuration.scope
        if !scope.isEmpty { fields.append(("scope", scope.joined(separator: " "))) }
        let (data, response) = try await transport.exchange(FormBody.post(endpoint, fields))
        let object = (try? JSONSerialization.jsonObject(with: data)) as? [String: Any]
        guard response.statusCode == 200 else {
            if let error = object?["error"] as? String {
                throw .flowFailed(code: TokenEndpoint.sanitize(error), message: "the server refused the device authorization request")
            }
            throw .server(status: response.statusCode, error: nil, retryAfter: nil)
        }
        guard let object, let deviceCode = object["device_code"] as? String, let userCode = object["user_code"] as? String,
            let uriText = object["verification_uri"] as? String, let uri = URL(string: uriText)
        else {
            throw .invalidResponse("the device authorization response lacks device_code, user_code or verification_uri")
        }
        let expiresIn = (object["expires_in"] as? NSNumber)?.intValue ?? 600
        let interval = max(1, (object["interval"] as? NSNumber)?.intValue ?? 5)
        return DeviceAuthorization(
            deviceCode: SecretBytes(utf8: deviceCode), userCode: userCode, verificationURI: uri,
            verificationURIComplete: (object["verification_uri_complete"] as? String).flatMap(URL.init(string:)),
            expiresAt: now().addingTimeInterval(TimeInterval(expiresIn)), interval: .seconds(interval))
    }

    /// Polls the token endpoint until the user approves, denies, or the code expires.
    /// Honours `slow_down` (the interval grows for this and all later polls) and backs off
    /// exponentially on network errors and 5xx answers. Cancel the task to stop.
    /// - Throws: ``AuthError/flowFailed(code:message:)`` with `access_denied` or
    ///   `expired_token`; ``AuthError/cancelled``.
    public func waitForApproval(_ authorization: DeviceAuthorization) async throws(AuthError) -> TokenResponse {
        var interval = authorization.interval
        var backoff = Duration.zero
        while true {
            do {
                try await Task.sleep(for: interval + backoff)
            } catch {
                throw .cancelled
            }
            guard now() < authorization.expiresAt else {
                throw .flowFailed(code: "expired_token", message: "the user code expired before it was approved")
            }
            let request = FormBody.post(configuration.tokenEndpoint, [
                ("grant_type", "urn:ietf:params:oauth:grant-type:device_code"),
                ("device_code", authorization.deviceCode.temporaryString), ("client_id", configuration.clientID),
            ])
            let result: TokenEndpointResult
            do {
                result = try await TokenEndpoint.call(request, transport: transport, now: now)
            } catch .network {
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
            case .oauthError(_, "access_denied", _):
                throw .flowFailed(code: "access_denied", message: "the user denied the request")
            case .oauthError(_, "expired_token", _):
                throw .flowFailed(code: "expired_token", message: "the user code expired before it was approved")
            case .oauthError(let status, let error, let retryAfter) where status >= 500 || error == "temporarily_unavailable":
                backoff = max(Self.nextBackoff(backoff, interval: interval), .seconds(retryAfter ?? 0))
            case .oauthError(_, let error, _):
                throw .flowFailed(code: error, message: "the server refused the device code")
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
    /// The code the user types at ``verificationURI``.
    public let userCode: String
    public let verificationURI: URL
    /// The URI with the code filled in, for a QR code or a link.
    public let verificationURIComplete: URL?
    public let expiresAt: Date
    /// The polling interval the server asked for.
    public let interval: Duration

    /// What to tell the user.
    public var instructions: String {
        "Open \(verificationURI.absoluteString) and enter the code \(userCode)"
            + (verificationURIComplete.map { " (or open \($0.absoluteString))" } ?? "") + "."
    }

    public var description: String { "DeviceAuthorization(userCode: \(userCode), deviceCode: <redacted>)" }
}
