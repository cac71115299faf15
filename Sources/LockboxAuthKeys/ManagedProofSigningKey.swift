import Foundation
import LockboxCore
import LockboxKeys

/// A managed P-256 key as a DPoP signer (ES256): LockboxAuth signs proofs through
/// ``ProofSigningKey`` and never sees the key store. Works for any key with the `sign` purpose
/// that the key store's public API returns, software or hardware.
///
/// ```swift
/// let key = try ManagedProofSigningKey.generate(in: SoftwareKeyStore(vault: vault), session: "alice@issuer")
/// let proofs = DPoPProofFactory(key: key)
/// ```
public struct ManagedProofSigningKey: ProofSigningKey {
    public let key: ManagedKey
    public let publicJWK: [String: String]
    public var jwsAlgorithm: String { "ES256" }

    /// The application tag of session keys made by ``generate(in:session:)``.
    public static let applicationTag = Data("org.lockbox.dpop".utf8)

    /// - Throws: `param` for a key that is not P-256 or cannot sign.
    public init(_ key: ManagedKey) throws(LockboxError) {
        guard key.algorithm == .p256, key.purposes.contains(.sign), let publicKey = key.publicKey else {
            throw LockboxError(.param, "A DPoP key (ES256) is a P-256 key with the sign purpose.")
        }
        let point = Array(publicKey.rawRepresentation)  // 04 || X || Y
        publicJWK = ["kty": "EC", "crv": "P-256", "x": Self.base64URL(point[1..<33]), "y": Self.base64URL(point[33..<65])]
        self.key = key
    }

    /// Makes a non-extractable P-256 key for one session (label `session`).
    public static func generate(in store: SoftwareKeyStore, session: String) throws(LockboxError) -> ManagedProofSigningKey {
        var specification = KeySpecification(algorithm: .p256, purposes: [.sign])
        specification.applicationTag = applicationTag
        specification.label = session
        specification.accessibility = .afterFirstUnlockThisDeviceOnly
        return try ManagedProofSigningKey(store.generate(specification))
    }

    public func jwsSignature(for signingInput: Data) async throws(LockboxError) -> Data {
        let der = try await key.sign(signingInput)
        guard let raw = Self.rawSignature(Array(der)) else {
            throw LockboxError(.decode, "The key store returned a P-256 signature that is not DER.")
        }
        return Data(raw)
    }

    /// DER `SEQUENCE { r, s }` to the fixed 64-byte `r || s` of JWS.
    static func rawSignature(_ der: [UInt8]) -> [UInt8]? {
        guard der.count >= 8, der[0] == 0x30, Int(der[1]) == der.count - 2 else { return nil }
        var index = 2
        var parts: [[UInt8]] = []
        for _ in 0..<2 {
            guard index + 2 <= der.count, der[index] == 0x02 else { return nil }
            let length = Int(der[index + 1])
            index += 2
            guard length > 0, index + length <= der.count else { return nil }
            let value = Array(der[index..<index + length].drop { $0 == 0 })
            guard value.count <= 32 else { return nil }
            parts.append([UInt8](repeating: 0, count: 32 - value.count) + value)
            index += length
        }
        guard index == der.count else { return nil }
        return parts[0] + parts[1]
    }

    static func base64URL(_ bytes: ArraySlice<UInt8>) -> String {
        Data(bytes).base64EncodedString().replacingOccurrences(of: "+", with: "-").replacingOccurrences(of: "/", with: "_")
            .replacingOccurrences(of: "=", with: "")
    }
}
