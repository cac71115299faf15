import Foundation
import Lockbox
import LockboxAuth
import Testing

/// Every test that talks to the test OAuth server. They share its counters and fault
/// switches, so they run one at a time; each starts from a reset server and a fresh vault.
@Suite("OAuth lifecycle against the real server and the real vault", .serialized)
struct LifecycleTests {}

@Suite("Fingerprints")
struct FingerprintTests {
    @Test func fingerprint_ofKnownInput_isFirstEightHexDigitsOfSHA256() {
        #expect(TokenFingerprint.of(SecretBytes(utf8: "abc")) == "ba7816bf")
        #expect(TokenFingerprint.of(SecretBytes(utf8: "")) == "e3b0c442")
        // Two blocks of padding (56..63 bytes of input).
        let long = String(repeating: "a", count: 60)
        #expect(TokenFingerprint.of(SecretBytes(utf8: long)) == "11ee391211c6256460b6ed375957fadd8061cafbb31daf967db875aebd5aaad4".prefix(8).description)
    }
}
