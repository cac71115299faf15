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
    /// `base64url(header) "."`: the header (`alg`, the public `jwk`, `typ`) is the same for every
    /// proof of the key, so it is encoded once.
    private let headerPart: [UInt8]

    /// Proofs signed by `key`; `now` gives their `iat` (tests pass a fixed clock); `nonces`
    /// remembers each server's latest `DPoP-Nonce`.
    public init(key: any ProofSigningKey, nonces: DPoPNonces = .shared, now: @escaping @Sendable () -> Date = Date.init) {
        self.key = key
        self.nonces = nonces
        self.now = now
        // JSON written here rather than by JSONSerialization, which costs several signatures'
        // time on Linux; members in sorted order, strings escaped.
        var header = Array(#"{"alg":"#.utf8)
        Self.appendJSONString(key.jwsAlgorithm, to: &header)
        header += #","jwk":{"#.utf8
        for (index, member) in key.publicJWK.sorted(by: { $0.key < $1.key }).enumerated() {
            if index > 0 { header.append(UInt8(ascii: ",")) }
            Self.appendJSONString(member.key, to: &header)
            header.append(UInt8(ascii: ":"))
            Self.appendJSONString(member.value, to: &header)
        }
        header += #"},"typ":"dpop+jwt"}"#.utf8
        var part: [UInt8] = []
        Base64URL.append(header, to: &part)
        part.append(UInt8(ascii: "."))
        headerPart = part
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
        var proof = signingInput(method: method, url: url, accessToken: accessToken, nonce: nonce)
        let signature: Data
        do {
            signature = try await key.jwsSignature(for: Data(proof))
        } catch {
            let code: AuthError.Code = error.code == .interactionNotAllowed ? .storeLocked : .store
            throw AuthError(code, "The session's DPoP key could not sign a proof: \(error.message)", storeError: error)
        }
        proof.append(UInt8(ascii: "."))
        Base64URL.append(signature, to: &proof)
        return String(decoding: proof, as: UTF8.self)
    }

    /// `base64url(header) "." base64url(payload)`, the bytes the key signs. The claims: `ath`
    /// (with a token), `htm`, `htu`, `iat` now, a new random `jti`, `nonce` (when given).
    func signingInput(method: String, url: URL, accessToken: SecretBytes?, nonce: String?) -> [UInt8] {
        var payload: [UInt8] = []
        payload.reserveCapacity(192 + (nonce?.utf8.count ?? 0) + url.absoluteString.utf8.count)
        payload.append(UInt8(ascii: "{"))
        if let accessToken {
            payload += #""ath":""#.utf8
            Base64URL.append(accessToken.withUnsafeBytes { SHA256.hash($0) }, to: &payload)
            payload += #"","#.utf8
        }
        payload += #""htm":"#.utf8
        Self.appendJSONString(method.uppercased(), to: &payload)
        payload += #","htu":"#.utf8
        Self.appendJSONString(Self.targetURI(url), to: &payload)
        payload += #","iat":"#.utf8
        payload += String(Int(now().timeIntervalSince1970)).utf8
        payload += #","jti":""#.utf8
        Self.appendIdentifier(to: &payload)
        payload.append(UInt8(ascii: "\""))
        if let nonce {
            payload += #","nonce":"#.utf8
            Self.appendJSONString(nonce, to: &payload)
        }
        payload.append(UInt8(ascii: "}"))
        var input = headerPart
        Base64URL.append(payload, to: &input)
        return input
    }

    /// 16 random bytes, base64url: unique per proof, so a server can refuse a replay.
    private static func appendIdentifier(to output: inout [UInt8]) {
        var generator = SystemRandomNumberGenerator()
        let words = (generator.next() as UInt64, generator.next() as UInt64)
        withUnsafeBytes(of: words) { Base64URL.append($0, to: &output) }
    }

    /// `htu`: the URL without query and fragment, and without user information (a target URI
    /// has none, RFC 9110 4.2.4: a password in the URL must not travel in a header).
    static func targetURI(_ url: URL) -> String {
        // Cut at the first "?" or "#" rather than through URLComponents, which costs a good part
        // of a signature on Linux; neither character can appear unescaped before them.
        let text = url.absoluteString
        let end = text.firstIndex(where: { $0 == "?" || $0 == "#" }) ?? text.endIndex
        var target = text[..<end]
        if let scheme = target.range(of: "://") {
            let authorityEnd = target[scheme.upperBound...].firstIndex(of: "/") ?? target.endIndex
            if let at = target[scheme.upperBound..<authorityEnd].lastIndex(of: "@") {
                target = target[..<scheme.upperBound] + target[target.index(after: at)...]
            }
            // The scheme in lower case, as RFC 3986's normalization (and every server) has it.
            if target[..<scheme.lowerBound].contains(where: \.isUppercase) {
                target = target[..<scheme.lowerBound].lowercased() + target[scheme.lowerBound...]
            }
        }
        return String(target)
    }

    /// Appends `text` as a JSON string literal (UTF-8; quotes, backslashes and control
    /// characters escaped).
    static func appendJSONString(_ text: String, to output: inout [UInt8]) {
        output.append(UInt8(ascii: "\""))
        for byte in text.utf8 {
            switch byte {
            case UInt8(ascii: "\""), UInt8(ascii: "\\"):
                output.append(UInt8(ascii: "\\"))
                output.append(byte)
            case 0..<0x20:
                let hex = Array("0123456789abcdef".utf8)
                output += Array(#"\u00"#.utf8)
                output.append(hex[Int(byte >> 4)])
                output.append(hex[Int(byte & 0xF)])
            default:
                output.append(byte)
            }
        }
        output.append(UInt8(ascii: "\""))
    }
}
