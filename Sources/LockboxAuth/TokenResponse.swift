import Foundation
#if canImport(FoundationNetworking)
import FoundationNetworking
#endif
import LockboxCore

/// A successful token endpoint answer (RFC 6749 section 5.1).
public struct TokenResponse: Sendable, CustomStringConvertible {
    /// The access token.
    public let accessToken: SecretBytes
    /// `token_type`: `Bearer` or `DPoP`.
    public let tokenType: String
    /// `refresh_token`, when the server issued (or rotated) one.
    public let refreshToken: SecretBytes?
    /// `expires_in`.
    public let expiresIn: Duration?
    /// The scopes granted (the requested ones when the server did not say).
    public let scope: [String]
    /// When the request was sent, by the local clock: expiry is measured from here, so the
    /// round trip counts against the token and a server clock that disagrees does not matter.
    public let requestedAt: Date
    /// The server's `Date` header minus the local clock at receipt, when the header was present.
    public let serverClockOffset: Duration?
    /// The `sub` claim of the `id_token`, when the server sent one (OpenID Connect), for
    /// display (`lockbox auth status`). Read without checking the token's signature: never use
    /// it to decide who the user is.
    public let idTokenSubject: String?
    /// The DPoP key the tokens are bound to (`token_type` `DPoP`); nil for bearer tokens.
    /// ``CredentialsManager/signIn(with:)`` makes it the session's key.
    public let proofKey: (any ProofSigningKey)?

    /// When the access token expires, from `expires_in` and the time of the request.
    public var expiresAt: Date? { expiresIn.map { requestedAt.addingTimeInterval($0.timeInterval) } }

    /// The token type, expiry and scope; never a token.
    public var description: String {
        "TokenResponse(access: \(TokenFingerprint.of(accessToken)), refresh: "
            + "\(refreshToken.map(TokenFingerprint.of) ?? "none"), type: \(tokenType), expiresIn: \(expiresIn.map { "\($0)" } ?? "-"))"
    }

    init(accessToken: SecretBytes, tokenType: String, refreshToken: SecretBytes?, expiresIn: Duration?, scope: [String], requestedAt: Date, serverClockOffset: Duration?,
        idTokenSubject: String? = nil, proofKey: (any ProofSigningKey)? = nil
    ) {
        self.proofKey = proofKey
        self.accessToken = accessToken
        self.tokenType = tokenType
        self.refreshToken = refreshToken
        self.expiresIn = expiresIn
        self.scope = scope
        self.requestedAt = requestedAt
        self.serverClockOffset = serverClockOffset
        self.idTokenSubject = idTokenSubject
    }
}

/// What a token endpoint said. An error's `error_description` is dropped on purpose: servers
/// sometimes echo request parameters into it.
enum TokenEndpointResult {
    case success(TokenResponse)
    case oauthError(status: Int, error: String, retryAfter: Int?)
    case httpError(status: Int, retryAfter: Int?)
}

enum TokenEndpoint {
    /// Sends `request` to a token endpoint: no redirect is followed, and `limits` bound the
    /// time and the size of the answer.
    ///
    /// With `dpop`, each attempt carries a fresh proof with the server's latest nonce; a
    /// `use_dpop_nonce` answer is retried once with the nonce it gave, and the tokens must come
    /// back bound (`token_type` `DPoP`).
    /// `firstProof`, when given, is the first attempt's proof, made by `dpop` for this request
    /// just before.
    /// - Throws: ``AuthError/Code/proofRejected`` when the server refuses the proof, or asks
    ///   for a nonce again after the retry.
    static func call(
        _ request: URLRequest, transport: any HTTPTransport, limits: RequestLimits = RequestLimits(), now: @Sendable () -> Date,
        dpop: DPoPProofFactory? = nil, firstProof: String? = nil
    ) async throws(AuthError) -> TokenEndpointResult {
        guard let dpop else {
            return try await attempt(request, transport: transport, limits: limits, now: now, dpop: nil).result
        }
        var retriedWithNonce = false
        var readyProof = firstProof
        while true {
            var signed = request
            if let proof = readyProof {
                readyProof = nil
                signed.setValue(proof, forHTTPHeaderField: "DPoP")
            } else {
                signed.setValue(try await dpop.proof(for: request), forHTTPHeaderField: "DPoP")
            }
            let (result, nonceGiven) = try await attempt(signed, transport: transport, limits: limits, now: now, dpop: dpop)
            switch result {
            case .oauthError(let status, "invalid_dpop_proof", _):
                throw .proofRefused(status: status)
            case .oauthError(let status, "use_dpop_nonce", _):
                // Only a nonce this very answer carried counts: an older one was just refused.
                guard nonceGiven, !retriedWithNonce else { throw .nonceNotSettled(status: status, nonceGiven: nonceGiven) }
                retriedWithNonce = true
            default:
                return result
            }
        }
    }

    private static func attempt(
        _ request: URLRequest, transport: any HTTPTransport, limits: RequestLimits, now: @Sendable () -> Date, dpop: DPoPProofFactory?
    ) async throws(AuthError) -> (result: TokenEndpointResult, nonceGiven: Bool) {
        let requestedAt = now()
        let (data, response) = try await transport.exchange(request, limits: limits, redirects: .refuse)
        let nonceGiven = request.url.flatMap { url in dpop?.nonces.remember(from: response, for: url) } != nil
        let retryAfter = response.value(forHTTPHeaderField: "Retry-After").flatMap { Int($0.trimmingCharacters(in: .whitespaces)) }
        let object = (try? JSONSerialization.jsonObject(with: data)) as? [String: Any]
        if response.statusCode == 200 {
            guard let object, let access = object["access_token"] as? String, !access.isEmpty else {
                throw .invalidResponse("the token response has no access_token", status: 200)
            }
            // RFC 6749, appendix A.12: access-token = 1*VSCHAR. Anything else (a terminal
            // escape, CR LF) would reach a terminal through `lockbox token` and an
            // Authorization header.
            guard access.utf8.allSatisfy({ (0x20...0x7E).contains($0) }) else {
                throw .invalidResponse("the access_token holds characters outside RFC 6749's VSCHAR (control or non-ASCII)", status: 200)
            }
            let tokenType = (object["token_type"] as? String ?? "Bearer").lowercased()
            switch (tokenType, dpop != nil) {
            case ("bearer", false), ("dpop", true):
                break
            case ("bearer", true):
                throw .invalidResponse(
                    "the server answered a DPoP request with a Bearer token, which is not bound to the session's key; the "
                        + "server may not support DPoP (turn usesDPoP off for it) or ignored the proof", status: 200)
            case ("dpop", false):
                throw .invalidResponse("the server issued a DPoP-bound token to a request without a proof", status: 200)
            default:
                throw .invalidResponse("unsupported token_type", status: 200)
            }
            let refresh = (object["refresh_token"] as? String).flatMap { $0.isEmpty ? nil : SecretBytes(utf8: $0) }
            let expiresIn = boundedLifetime(object["expires_in"])
            let scope = (object["scope"] as? String)?.split(separator: " ").map(String.init) ?? []
            var offset: Duration?
            if let header = response.value(forHTTPHeaderField: "Date"), let serverDate = httpDate(header) {
                offset = .milliseconds(Int64((serverDate.timeIntervalSince(now()) * 1000).rounded()))
            }
            return (.success(
                TokenResponse(
                    accessToken: SecretBytes(utf8: access), tokenType: dpop == nil ? "Bearer" : "DPoP", refreshToken: refresh,
                    expiresIn: expiresIn.map { .seconds($0) }, scope: scope, requestedAt: requestedAt, serverClockOffset: offset,
                    idTokenSubject: (object["id_token"] as? String).flatMap(subject(ofIDToken:)), proofKey: dpop?.key)), nonceGiven)
        }
        if let error = object?["error"] as? String {
            return (.oauthError(status: response.statusCode, error: sanitize(error), retryAfter: retryAfter), nonceGiven)
        }
        return (.httpError(status: response.statusCode, retryAfter: retryAfter), nonceGiven)
    }

    /// The `sub` claim of a JWT's payload, when it is printable and at most 256 characters.
    /// The signature is not checked: the value is shown, never trusted.
    static func subject(ofIDToken token: String) -> String? {
        let parts = token.split(separator: ".", omittingEmptySubsequences: false)
        guard parts.count == 3, parts[1].utf8.count <= 16 * 1024 else { return nil }
        var base64 = parts[1].replacingOccurrences(of: "-", with: "+").replacingOccurrences(of: "_", with: "/")
        base64 += String(repeating: "=", count: (4 - base64.count % 4) % 4)
        guard let data = Data(base64Encoded: base64),
            let claims = (try? JSONSerialization.jsonObject(with: data)) as? [String: Any],
            let subject = claims["sub"] as? String, !subject.isEmpty, subject.count <= 256, TerminalText.isPrintable(subject)
        else { return nil }
        return subject
    }

    /// The longest lifetime taken from an `expires_in`: ten years. A server that names more
    /// (say 10^17 seconds) gets this, so that expiry and freshness stay within what dates,
    /// milliseconds and the kernel keyring's timeout can hold instead of overflowing them.
    static let maximumLifetimeSeconds = 10 * 366 * 24 * 3600

    /// An `expires_in` (a JSON number, or a decimal string) as whole seconds within
    /// 1 ... ``maximumLifetimeSeconds``; nil when absent, not a number, or below one second: a
    /// token the server says expired as it was issued (0, or a negative lifetime) is taken as one
    /// whose lifetime it did not give, not handed out as already expired and refreshed again at
    /// every call.
    static func boundedLifetime(_ value: Any?) -> Int? {
        let seconds: Double? =
            if let number = value as? NSNumber { number.doubleValue } else { (value as? String).flatMap { Int($0) }.map(Double.init) }
        guard let seconds, !seconds.isNaN, seconds >= 1 else { return nil }
        return Int(min(seconds, Double(maximumLifetimeSeconds)))
    }

    /// Keeps error codes to the RFC's character set, so a hostile server cannot smuggle text.
    static func sanitize(_ code: String) -> String {
        let allowed = Set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-.")
        return String(code.filter { allowed.contains($0) }.prefix(64))
    }

    /// An HTTP date (`Sun, 06 Nov 1994 08:49:37 GMT`). Anything but short printable ASCII is
    /// refused first: Foundation's DateFormatter on Linux traps on some non-ASCII input (found by
    /// fuzzing), and a server's `Date` header must not be able to crash the client.
    static func httpDate(_ text: String) -> Date? {
        guard text.utf8.count <= 64, text.utf8.allSatisfy({ $0 >= 0x20 && $0 < 0x7F }) else { return nil }
        let formatter = DateFormatter()
        formatter.locale = Locale(identifier: "en_US_POSIX")
        formatter.timeZone = TimeZone(identifier: "GMT")
        formatter.dateFormat = "EEE, dd MMM yyyy HH:mm:ss zzz"
        return formatter.date(from: text)
    }
}
