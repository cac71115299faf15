import Foundation
#if canImport(FoundationNetworking)
import FoundationNetworking
#endif

/// Who the client is and where the authorization server's endpoints are. Nothing here is
/// secret: public clients (CLIs, desktop apps) have no client secret.
public struct ClientConfiguration: Sendable, Hashable, Codable {
    /// The issuer identifier (RFC 8414), e.g. `https://auth.example.com`.
    public var issuer: URL
    /// The client's identifier at the authorization server.
    public var clientID: String
    /// The token endpoint (RFC 6749 section 3.2).
    public var tokenEndpoint: URL
    /// The revocation endpoint (RFC 7009), if the server has one.
    public var revocationEndpoint: URL?
    /// The device authorization endpoint (RFC 8628), if the server has one.
    public var deviceAuthorizationEndpoint: URL?
    /// The authorization endpoint, for the authorization-code flow with PKCE.
    public var authorizationEndpoint: URL?
    /// The scopes to ask for at sign-in.
    public var scope: [String]
    /// The total deadline and the answer size limit of every request to the server.
    public var requestLimits: RequestLimits
    /// Sender-constrained tokens (DPoP, RFC 9449): each session gets a non-extractable key at
    /// sign-in, every token and API request carries a proof signed by it, and the server binds
    /// the tokens to it, so a stolen refresh or access token is useless without the key. Needs
    /// a ``DPoPKeyStore`` in ``CredentialsManager``. Off by default.
    public var usesDPoP: Bool

    /// A client configuration given endpoint by endpoint (see also discovery).
    public init(
        issuer: URL, clientID: String, tokenEndpoint: URL, revocationEndpoint: URL? = nil,
        deviceAuthorizationEndpoint: URL? = nil, authorizationEndpoint: URL? = nil, scope: [String] = [],
        requestLimits: RequestLimits = RequestLimits(), usesDPoP: Bool = false
    ) {
        self.usesDPoP = usesDPoP
        self.issuer = issuer
        self.clientID = clientID
        self.tokenEndpoint = tokenEndpoint
        self.revocationEndpoint = revocationEndpoint
        self.deviceAuthorizationEndpoint = deviceAuthorizationEndpoint
        self.authorizationEndpoint = authorizationEndpoint
        self.scope = scope
        self.requestLimits = requestLimits
    }

    /// A configuration from discovered metadata.
    public init(
        metadata: AuthorizationServerMetadata, clientID: String, scope: [String] = [], requestLimits: RequestLimits = RequestLimits()
    ) {
        self.init(
            issuer: metadata.issuer, clientID: clientID, tokenEndpoint: metadata.tokenEndpoint,
            revocationEndpoint: metadata.revocationEndpoint,
            deviceAuthorizationEndpoint: metadata.deviceAuthorizationEndpoint,
            authorizationEndpoint: metadata.authorizationEndpoint, scope: scope, requestLimits: requestLimits)
    }

    private enum CodingKeys: String, CodingKey {
        case issuer, clientID, tokenEndpoint, revocationEndpoint, deviceAuthorizationEndpoint, authorizationEndpoint, scope
        case requestLimits, usesDPoP
    }

    /// Decodes configurations stored before `requestLimits` existed with the default limits.
    public init(from decoder: any Decoder) throws {
        let container = try decoder.container(keyedBy: CodingKeys.self)
        self.init(
            issuer: try container.decode(URL.self, forKey: .issuer), clientID: try container.decode(String.self, forKey: .clientID),
            tokenEndpoint: try container.decode(URL.self, forKey: .tokenEndpoint),
            revocationEndpoint: try container.decodeIfPresent(URL.self, forKey: .revocationEndpoint),
            deviceAuthorizationEndpoint: try container.decodeIfPresent(URL.self, forKey: .deviceAuthorizationEndpoint),
            authorizationEndpoint: try container.decodeIfPresent(URL.self, forKey: .authorizationEndpoint),
            scope: try container.decode([String].self, forKey: .scope),
            requestLimits: try container.decodeIfPresent(RequestLimits.self, forKey: .requestLimits) ?? RequestLimits(),
            usesDPoP: try container.decodeIfPresent(Bool.self, forKey: .usesDPoP) ?? false)
    }

    /// Discovers the server's endpoints (RFC 8414) and builds a configuration.
    ///
    /// ```swift
    /// let configuration = try await ClientConfiguration.discover(
    ///     issuer: URL(string: "https://auth.example.com")!, clientID: "my-cli", scope: ["api"])
    /// ```
    public static func discover(
        issuer: URL, clientID: String, scope: [String] = [], transport: any HTTPTransport = URLSessionTransport(),
        requestLimits: RequestLimits = RequestLimits()
    ) async throws(AuthError) -> ClientConfiguration {
        let metadata = try await AuthorizationServerMetadata.discover(issuer: issuer, transport: transport, requestLimits: requestLimits)
        return ClientConfiguration(metadata: metadata, clientID: clientID, scope: scope, requestLimits: requestLimits)
    }
}

/// Authorization server metadata (RFC 8414): the fields Lockbox uses.
public struct AuthorizationServerMetadata: Sendable, Hashable {
    /// `issuer`.
    public var issuer: URL
    /// `token_endpoint`.
    public var tokenEndpoint: URL
    /// `authorization_endpoint`.
    public var authorizationEndpoint: URL?
    /// `revocation_endpoint`.
    public var revocationEndpoint: URL?
    /// `device_authorization_endpoint`.
    public var deviceAuthorizationEndpoint: URL?
    /// `code_challenge_methods_supported`.
    public var codeChallengeMethodsSupported: [String]
    /// `grant_types_supported`.
    public var grantTypesSupported: [String]

    /// Fetches `/.well-known/oauth-authorization-server` for `issuer` and checks that the
    /// document names the same issuer (RFC 8414 section 3.3), so a mix-up cannot redirect
    /// tokens to another server. Every endpoint must be HTTPS. Redirects are followed only to
    /// https URLs, within `requestLimits`.
    public static func discover(
        issuer: URL, transport: any HTTPTransport = URLSessionTransport(), requestLimits: RequestLimits = RequestLimits()
    ) async throws(AuthError) -> AuthorizationServerMetadata {
        guard issuer.scheme == "https", var components = URLComponents(url: issuer, resolvingAgainstBaseURL: false) else {
            throw .configuration("the issuer must be an https URL")
        }
        // RFC 8414 section 3.1: the well-known segment goes between the host and the issuer's path.
        var path = components.path
        if path.hasSuffix("/") { path.removeLast() }
        components.path = "/.well-known/oauth-authorization-server" + path
        components.query = nil
        guard let url = components.url else { throw .configuration("the issuer URL is malformed") }
        var request = URLRequest(url: url)
        request.setValue("application/json", forHTTPHeaderField: "Accept")
        let (data, response) = try await transport.exchange(request, limits: requestLimits, redirects: .httpsOnly)
        if response.statusCode == 404 || response.statusCode == 410 {
            throw AuthError(
                .configuration,
                "No authorization server answers at this issuer: \(url.absoluteString) answered \(response.statusCode). Check "
                    + "the issuer URL (RFC 8414 discovery puts /.well-known/oauth-authorization-server before the issuer's path).",
                httpStatus: response.statusCode, failingURL: url)
        }
        guard response.statusCode == 200 else {
            throw .server(status: response.statusCode, error: nil, retryAfter: nil)
        }
        guard let object = (try? JSONSerialization.jsonObject(with: data)) as? [String: Any] else {
            throw .invalidResponse("the discovery document is not a JSON object")
        }
        func endpoint(_ name: String) throws(AuthError) -> URL? {
            guard let text = object[name] as? String else { return nil }
            guard let url = URL(string: text), url.scheme == "https" else {
                throw .invalidResponse("\(name) is not an https URL")
            }
            return url
        }
        guard let issued = object["issuer"] as? String, normalized(issued) == normalized(issuer.absoluteString),
            let issuedURL = URL(string: issued)
        else {
            throw .invalidResponse("the discovery document names another issuer")
        }
        guard let token = try endpoint("token_endpoint") else {
            throw .invalidResponse("the discovery document has no token_endpoint")
        }
        return AuthorizationServerMetadata(
            issuer: issuedURL, tokenEndpoint: token,
            authorizationEndpoint: try endpoint("authorization_endpoint"),
            revocationEndpoint: try endpoint("revocation_endpoint"),
            deviceAuthorizationEndpoint: try endpoint("device_authorization_endpoint"),
            codeChallengeMethodsSupported: object["code_challenge_methods_supported"] as? [String] ?? [],
            grantTypesSupported: object["grant_types_supported"] as? [String] ?? [])
    }

    private static func normalized(_ issuer: String) -> String {
        issuer.hasSuffix("/") ? String(issuer.dropLast()) : issuer
    }
}
