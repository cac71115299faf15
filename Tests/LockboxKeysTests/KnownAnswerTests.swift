import Foundation
import KeyCrypto
import LockboxCore
import LockboxKeys
import Testing
import VaultCrypto

/// Published test vectors for each primitive.
@Suite("managed keys, known answers")
struct KnownAnswerTests {
    static func bytes(_ hex: String) -> [UInt8] {
        var bytes: [UInt8] = []
        var index = hex.startIndex
        while index < hex.endIndex {
            let next = hex.index(index, offsetBy: 2)
            bytes.append(UInt8(hex[index..<next], radix: 16)!)
            index = next
        }
        return bytes
    }

    // RFC 6979, A.2.5: P-256, SHA-256, message "sample" (r and s DER-encoded).
    @Test func p256_rfc6979Signature_verifies() throws {
        let point = Self.bytes(
            "04" + "60fed4ba255a9d31c961eb74c6356d68c049b8923b61fa6ce669622e60f29fb6"
                + "7903fe1008b8bc99a41ae9e95628bc64f2f1b20c2d7e9f5177a3c294d4462299")
        let key = try PublicKey(x963Representation: Data(point))
        let signature = Data(
            Self.bytes(
                "3046022100efd48b2aacb6a8fd1140dd9cd45e81d69d2c877b56aaf991c34d0ea84eaf3716"
                    + "022100f7cb1c942d657c41d436c7a1b6e29f65f3e900dbb9aff4064dc4ab2f843acda8"))
        #expect(try key.isValidSignature(signature, for: Data("sample".utf8)))
        #expect(try !key.isValidSignature(signature, for: Data("samplf".utf8)))
    }

    // RFC 8032, 7.1, TEST 1: the empty message.
    @Test func ed25519_rfc8032Test1_verifies() throws {
        let key = try PublicKey(
            rawRepresentation: Data(Self.bytes("d75a980182b10ab7d54bfed3c964073a0ee172f3daa62325af021a68f707511a")), algorithm: .ed25519)
        let signature = Data(
            Self.bytes(
                "e5564300c360ac729086e2cc806e828a84877f1eb8e5d974d873e065224901555fb8821590a33bacc61e39701cf9b46bd25bf5f0595bbe24655141438e7a100b"))
        #expect(try key.isValidSignature(signature, for: Data()))
        #expect(try !key.isValidSignature(signature, for: Data([0])))
    }

    // RFC 7748, 6.1: Alice's private key with Bob's public key.
    @Test func x25519_rfc7748SharedSecret_matches() throws {
        let alice = SecretBytes(copying: Self.bytes("77076d0a7318a57d3c16c17251b26645df4c2f87ebc0992ab177fba51db92c2a"))
        let bob = Self.bytes("de9edb7d7b7dc1b4d35b61c2ece435373f8343c85b78674dadfc7e146f882b4f")
        let shared = try Curve25519.sharedSecret(secretKey: alice, peerPublicKey: bob)
        #expect(shared == SecretBytes(copying: Self.bytes("4a5d9d5ba4ce2de1728e3bf480350f25e07e21c947d19e3376f09b3c1e161742")))
    }

    // The GCM specification's test case 16 (AES-256, 60-byte plaintext, 20-byte AAD).
    @Test func aesGCM_testCase16_opensAndRejectsAFlippedTag() throws {
        let key = SecretBytes(copying: Self.bytes("feffe9928665731c6d6a8f9467308308feffe9928665731c6d6a8f9467308308"))
        let box = Self.bytes(
            "cafebabefacedbaddecaf888"
                + "522dc1f099567d07f47f37a32a84427d643a8cdcbfe5c0c97598a2bd2555d1aa8cb08e48590dbb3da7b08b1056828838c5f61e6393ba7a0abcc9f662"
                + "76fc6ece0f4e1768cddf8853bb2d551b")
        let associated = Self.bytes("feedfacedeadbeeffeedfacedeadbeefabaddad2")
        let plaintext = try AESGCM.open(box, key: key, authenticating: associated)
        #expect(
            plaintext == SecretBytes(
                copying: Self.bytes(
                    "d9313225f88406e5a55909c5aff5269a86a7a9531534f7da2e4c303d8a318a721c3c0c95956809532fcf0e2449a6b525b16aedf5aa0de657ba637b39")))
        var flipped = box
        flipped[flipped.count - 1] ^= 1
        #expect(status { _ = try AESGCM.open(flipped, key: key, authenticating: associated) } == LockboxError.Code.decode.rawValue)
    }

    func status(_ body: () throws -> Void) -> Int32? {
        do {
            try body()
            return nil
        } catch let error as LockboxError {
            return error.status
        } catch {
            return 1
        }
    }
}
