import Foundation
import Lockbox
import LockboxAuth
import LockboxAuthKeys
import LockboxKeys
import LockboxTestSupport
import Testing

/// DPoP proofs signed by a managed key, checked by Python `cryptography` (the peer that
/// verifies ES256 here) and by the claims RFC 9449 requires.
@Suite("DPoP proofs over managed keys")
struct DPoPProofTests {
    static let verifier = """
        import base64, hashlib, json, sys
        from cryptography.hazmat.primitives import hashes
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.hazmat.primitives.asymmetric.utils import encode_dss_signature
        def b64(text): return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
        proof, token = sys.argv[1], sys.argv[2].encode()
        header_part, payload_part, signature_part = proof.split(".")
        header, payload = json.loads(b64(header_part)), json.loads(b64(payload_part))
        jwk = header["jwk"]
        key = ec.EllipticCurvePublicNumbers(int.from_bytes(b64(jwk["x"]), "big"), int.from_bytes(b64(jwk["y"]), "big"), ec.SECP256R1()).public_key()
        signature = b64(signature_part)
        assert len(signature) == 64
        key.verify(encode_dss_signature(int.from_bytes(signature[:32], "big"), int.from_bytes(signature[32:], "big")),
                   (header_part + "." + payload_part).encode(), ec.ECDSA(hashes.SHA256()))
        assert header["typ"] == "dpop+jwt" and header["alg"] == "ES256" and set(jwk) == {"kty", "crv", "x", "y"}
        assert payload["ath"] == base64.urlsafe_b64encode(hashlib.sha256(token).digest()).rstrip(b"=").decode()
        thumbprint = json.dumps({k: jwk[k] for k in ("crv", "kty", "x", "y")}, separators=(",", ":"), sort_keys=True)
        print(payload["htm"], payload["htu"], payload["nonce"], base64.urlsafe_b64encode(hashlib.sha256(thumbprint.encode()).digest()).rstrip(b"=").decode())
        """

    @Test("a proof verifies with its jwk, carries htm/htu (no query)/iat/jti/ath/nonce, and the thumbprint is RFC 7638's")
    func proof_verifiesAndCarriesTheClaims() async throws {
        let fixture = try VaultFixture()
        let key = try ManagedProofSigningKey.generate(in: SoftwareKeyStore(vault: fixture.vault), session: "alice")
        #expect(!key.key.isExtractable)
        let proofs = DPoPProofFactory(key: key)
        let token = makeCanary("access")
        let proof = try await proofs.proof(
            method: "get", url: URL(string: "https://api.example.org/v1/items?page=2#top")!, accessToken: SecretBytes(utf8: token), nonce: "n-1")
        #expect(!proof.contains(token))
        let result = try run("/usr/bin/env", ["python3", "-c", Self.verifier, proof, token], timeout: 60)
        #expect(result.status == 0, "python3 with cryptography (scripts/bootstrap --test): \(result.standardError)")
        #expect(result.standardOutput == "GET https://api.example.org/v1/items n-1 \(proofs.thumbprint)\n")

        // The proof's iat is the time it was made: between these two (an await can be suspended
        // for a long time while a parallel test run keeps the cooperative threads busy).
        let before = Int(Date().timeIntervalSince1970)
        let second = try await proofs.proof(method: "POST", url: URL(string: "https://issuer.example.org/token")!)
        let after = Int(Date().timeIntervalSince1970)
        let claims = try JSONSerialization.jsonObject(with: Data(base64URL: String(second.split(separator: ".")[1]))!) as! [String: Any]
        let first = try JSONSerialization.jsonObject(with: Data(base64URL: String(proof.split(separator: ".")[1]))!) as! [String: Any]
        #expect(claims["jti"] as? String != first["jti"] as? String)
        #expect(claims["ath"] == nil && claims["nonce"] == nil)
        let issuedAt = try #require(claims["iat"] as? Int)
        #expect(issuedAt >= before && issuedAt <= after, "iat \(issuedAt) outside [\(before), \(after)]")
    }

    @Test("a proof's header and claims escape what JSON must (they parse back as given), the header is the key's in every proof, and every jti is new")
    func proofJSON_isEscapedAndEveryJTIIsNew() async throws {
        struct OddKey: ProofSigningKey {
            var jwsAlgorithm: String { "ES256" }
            var publicJWK: [String: String] { ["kty": "EC", "crv": "P-256", "x": "q\"b\\s\u{1}/é", "y": "y"] }
            func jwsSignature(for signingInput: Data) async throws(LockboxError) -> Data { Data(repeating: 1, count: 64) }
        }
        let proofs = DPoPProofFactory(key: OddKey())
        var identifiers = Set<String>()
        var headers = Set<Substring>()
        for _ in 0..<200 {
            let proof = try await proofs.proof(method: "pa\"t\\ch", url: URL(string: "https://api.example.org/a%22b?q=1")!, nonce: "n!#[]~")
            let parts = proof.split(separator: ".")
            #expect(parts.count == 3)
            headers.insert(parts[0])
            let header = try JSONSerialization.jsonObject(with: try #require(Data(base64URL: String(parts[0])))) as? [String: Any]
            let claims = try JSONSerialization.jsonObject(with: try #require(Data(base64URL: String(parts[1])))) as? [String: Any]
            #expect((header?["jwk"] as? [String: String])?["x"] == "q\"b\\s\u{1}/é")
            #expect(header?["typ"] as? String == "dpop+jwt")
            #expect(claims?["htm"] as? String == "PA\"T\\CH")
            #expect(claims?["htu"] as? String == "https://api.example.org/a%22b")
            #expect(claims?["nonce"] as? String == "n!#[]~")
            let jti = try #require(claims?["jti"] as? String)
            #expect(Data(base64URL: jti)?.count == 16)
            identifiers.insert(jti)
        }
        #expect(identifiers.count == 200)
        #expect(headers.count == 1)
    }

    @Test("a locked keychain: the proof fails with storeLocked, not a proof without a key")
    func lockedKeychain_failsWithStoreLocked() async throws {
        let fixture = try VaultFixture()
        let key = try ManagedProofSigningKey.generate(in: SoftwareKeyStore(vault: fixture.vault), session: "bob")
        fixture.vault.lockAll()
        do {
            _ = try await DPoPProofFactory(key: key).proof(method: "POST", url: URL(string: "https://issuer.example.org/token")!)
            Issue.record("a locked keychain signed a proof")
        } catch {
            #expect(error.code == .storeLocked)
            #expect(error.storeError?.code == .interactionNotAllowed)
        }
    }

    @Test("an Ed25519 or agreement-only key is refused as a DPoP key")
    func wrongKey_isRefused() throws {
        let fixture = try VaultFixture()
        let store = SoftwareKeyStore(vault: fixture.vault)
        let ed25519 = try store.generate(KeySpecification(algorithm: .ed25519, purposes: [.sign]))
        let agreement = try store.generate(KeySpecification(algorithm: .p256, purposes: [.keyAgreement]))
        #expect(status { _ = try ManagedProofSigningKey(ed25519) } == LockboxError.Code.param.rawValue)
        #expect(status { _ = try ManagedProofSigningKey(agreement) } == LockboxError.Code.param.rawValue)
    }
}

extension Data {
    init?(base64URL text: String) {
        var base64 = text.replacingOccurrences(of: "-", with: "+").replacingOccurrences(of: "_", with: "/")
        base64 += String(repeating: "=", count: (4 - base64.count % 4) % 4)
        self.init(base64Encoded: base64)
    }
}
