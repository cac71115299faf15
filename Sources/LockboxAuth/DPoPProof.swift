import Foundation
import LockboxCore

/// Makes DPoP proofs (RFC 9449): a JWT of type `dpop+jwt` signed by a session's key, bound to
/// one request (`htm`, `htu`), fresh (`iat`, a random `jti`), to the access token it carries
/// (`ath`) and to the server's `nonce` when it asked for one.
///
/// ```swift
/// let proofs = DPoPProofFactory(key: sessionKey)
/// request.setValue(try await proofs.proof(method: "POST", url: tokenEndpoint), forHTTPHeaderField: "DPoP")
/// ```
public struct DPoPProofFactory: Sendable {
    public let key: any ProofSigningKey
    private let now: @Sendable () -> Date

    public init(key: any ProofSigningKey, now: @escaping @Sendable () -> Date = Date.init) {
        self.key = key
        self.now = now
    }

    /// The JWK SHA-256 thumbprint (RFC 7638) of the key, base64url: the `jkt` a server binds
    /// tokens to (`cnf.jkt`).
    public var thumbprint: String {
        let canonical = "{" + key.publicJWK.sorted { $0.key < $1.key }.map { "\"\($0.key)\":\"\($0.value)\"" }.joined(separator: ",") + "}"
        return SHA256.hash(Array(canonical.utf8)).base64URLString
    }

    /// A proof for one request.
    /// - Parameters:
    ///   - method: the HTTP method (`htm`).
    ///   - url: the target; its query and fragment are left out of `htu`, as RFC 9449 says.
    ///   - accessToken: the token the request carries (`ath`), for resource requests.
    ///   - nonce: the server's last `DPoP-Nonce`.
    /// - Throws: `store`/`storeLocked` when the key cannot sign (a locked keychain).
    public func proof(method: String, url: URL, accessToken: SecretBytes? = nil, nonce: String? = nil) async throws(AuthError) -> String {
        var header: [String: Any] = ["typ": "dpop+jwt", "alg": key.jwsAlgorithm]
        header["jwk"] = key.publicJWK
        var payload: [String: Any] = [
            "jti": Self.identifier(),
            "htm": method.uppercased(),
            "htu": Self.targetURI(url),
            "iat": Int(now().timeIntervalSince1970),
        ]
        if let accessToken { payload["ath"] = accessToken.withUnsafeBytes { SHA256.hash($0) }.base64URLString }
        if let nonce { payload["nonce"] = nonce }
        let signingInput = Self.segment(header) + "." + Self.segment(payload)
        let signature: Data
        do {
            signature = try await key.jwsSignature(for: Data(signingInput.utf8))
        } catch {
            let code: AuthError.Code = error.code == .interactionNotAllowed ? .storeLocked : .store
            throw AuthError(code, "The session's DPoP key could not sign a proof: \(error.message)", storeError: error)
        }
        return signingInput + "." + Array(signature).base64URLString
    }

    /// 16 random bytes, base64url: unique per proof, so a server can refuse a replay.
    static func identifier() -> String {
        var generator = SystemRandomNumberGenerator()
        return (0..<16).map { _ in UInt8.random(in: .min ... .max, using: &generator) }.base64URLString
    }

    /// `htu`: the URL without query and fragment.
    static func targetURI(_ url: URL) -> String {
        guard var components = URLComponents(url: url, resolvingAgainstBaseURL: false) else { return url.absoluteString }
        components.query = nil
        components.fragment = nil
        return components.string ?? url.absoluteString
    }

    private static func segment(_ object: [String: Any]) -> String {
        // Sorted keys: the same claims give the same bytes, which the tests compare.
        let data = (try? JSONSerialization.data(withJSONObject: object, options: [.sortedKeys, .withoutEscapingSlashes])) ?? Data()
        return Array(data).base64URLString
    }
}
