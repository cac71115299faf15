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
    /// The session's key: it signs every proof, and its public half goes in each proof's `jwk`.
    public let key: any ProofSigningKey
    /// The servers' latest nonces, used by the requests Lockbox sends with these proofs.
    public let nonces: DPoPNonces
    private let now: @Sendable () -> Date

    /// Proofs signed by `key`; `now` gives their `iat` (tests pass a fixed clock); `nonces`
    /// remembers each server's latest `DPoP-Nonce`.
    public init(key: any ProofSigningKey, nonces: DPoPNonces = .shared, now: @escaping @Sendable () -> Date = Date.init) {
        self.key = key
        self.nonces = nonces
        self.now = now
    }

    /// The JWK SHA-256 thumbprint (RFC 7638) of the key, base64url: the `jkt` a server binds
    /// tokens to (`cnf.jkt`).
    public var thumbprint: String { key.jwkThumbprint }

    /// A proof for one request.
    /// - Parameters:
    ///   - method: the HTTP method (`htm`).
    ///   - url: the target; its query and fragment are left out of `htu`, as RFC 9449 says.
    ///   - accessToken: the token the request carries (`ath`), for resource requests.
    ///   - nonce: the server's last `DPoP-Nonce`.
    /// - Throws: `store`/`storeLocked` when the key cannot sign (a locked keychain).
    public func proof(method: String, url: URL, accessToken: SecretBytes? = nil, nonce: String? = nil) async throws(AuthError) -> String {
        // JSON written here rather than by JSONSerialization, which costs several signatures'
        // time on Linux; members in sorted order, strings escaped.
        let jwk = key.publicJWK.sorted { $0.key < $1.key }.map { "\(Self.json($0.key)):\(Self.json($0.value))" }.joined(separator: ",")
        let header = "{\"alg\":\(Self.json(key.jwsAlgorithm)),\"jwk\":{\(jwk)},\"typ\":\"dpop+jwt\"}"
        var payload = "{"
        if let accessToken { payload += "\"ath\":\"\(accessToken.withUnsafeBytes { SHA256.hash($0) }.base64URLString)\"," }
        payload += "\"htm\":\(Self.json(method.uppercased())),\"htu\":\(Self.json(Self.targetURI(url))),"
        payload += "\"iat\":\(Int(now().timeIntervalSince1970)),\"jti\":\"\(Self.identifier())\""
        if let nonce { payload += ",\"nonce\":\(Self.json(nonce))" }
        payload += "}"
        let signingInput = Array(header.utf8).base64URLString + "." + Array(payload.utf8).base64URLString
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
        let words = (generator.next() as UInt64, generator.next() as UInt64)
        return withUnsafeBytes(of: words) { Array($0) }.base64URLString
    }

    /// `htu`: the URL without query and fragment.
    static func targetURI(_ url: URL) -> String {
        // Cut at the first "?" or "#" rather than through URLComponents, which costs a good part
        // of a signature on Linux; neither character can appear unescaped before them.
        let text = url.absoluteString
        guard let end = text.firstIndex(where: { $0 == "?" || $0 == "#" }) else { return text }
        return String(text[..<end])
    }

    /// A JSON string literal: quotes, backslashes and control characters escaped.
    static func json(_ text: String) -> String {
        var out = "\""
        for scalar in text.unicodeScalars {
            switch scalar {
            case "\"": out += "\\\""
            case "\\": out += "\\\\"
            case _ where scalar.value < 0x20: out += String(format: "\\u%04x", scalar.value)
            default: out.unicodeScalars.append(scalar)
            }
        }
        return out + "\""
    }
}
