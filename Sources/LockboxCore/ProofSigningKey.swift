import struct Foundation.Data

/// A key that signs proofs of possession (DPoP, RFC 9449) and never hands out its private half.
/// LockboxAuth signs through this interface only; a managed key (software or hardware) supplies
/// it from a module that knows the key store.
public protocol ProofSigningKey: Sendable {
    /// The JWS algorithm (RFC 7518), e.g. `"ES256"`.
    var jwsAlgorithm: String { get }
    /// The public key as a JWK (RFC 7517) with only its required members, e.g. for P-256
    /// `["kty": "EC", "crv": "P-256", "x": ..., "y": ...]` (base64url values).
    var publicJWK: [String: String] { get }
    /// Signs a JWS signing input (`base64url(header).base64url(payload)`); for ES256 the
    /// 64-byte `r || s` of RFC 7518 section 3.4.
    func jwsSignature(for signingInput: Data) async throws(LockboxError) -> Data
}
