import Foundation
import KeychainCompatibility
import Lockbox
import LockboxTestSupport
import Testing

@testable import LockboxBroker

/// `SecKey` over the broker backend: a permanent key is made inside `lockboxd`, signs and
/// decrypts there, and never reaches the program.
@Suite("SecKey through lockboxd")
struct BrokerSecKeyTests {
    @Test("SecKeyCreateRandomKey makes the key inside lockboxd; SecKeyCreateSignature and SecKeyCreateDecryptedData run there; it is found again")
    func secKey_signsAndDecryptsInsideTheBroker() throws {
        let fixture = try BrokerFixture()
        let store = try fixture.store()
        try store.unlock(passphrase: SecretBytes(utf8: BrokerFixture.passphraseText))
        let tag = Data("com.example.broker-key".utf8)
        let canary = makeCanary("seckey")
        try SecItemStore.withStore(store) {
            var error: Unmanaged<CFError>?
            let parameters: [String: Any] = [
                kSecAttrKeyType as String: kSecAttrKeyTypeECSECPrimeRandom,
                kSecAttrKeySizeInBits as String: 256,
                kSecPrivateKeyAttrs as String: [kSecAttrIsPermanent as String: true, kSecAttrApplicationTag as String: tag],
            ]
            let privateKey = SecKeyCreateRandomKey(parameters as CFDictionary, &error)
            if let error { Issue.record("SecKeyCreateRandomKey failed: \(error.takeRetainedValue())") }
            let key = try #require(privateKey)
            #expect("\(key)".contains("inside lockboxd"))
            let publicKey = try #require(SecKeyCopyPublicKey(key))

            // Signed inside the broker, verified here.
            let message = Data("sign me".utf8)
            let signature = try #require(SecKeyCreateSignature(key, .ecdsaSignatureMessageX962SHA256, message as CFData, &error))
            #expect(SecKeyVerifySignature(publicKey, .ecdsaSignatureMessageX962SHA256, message as CFData, signature, &error))

            // Encrypted here to the public half, decrypted inside the broker.
            let algorithm = SecKeyAlgorithm.eciesEncryptionCofactorVariableIVX963SHA256AESGCM
            let box = try #require(SecKeyCreateEncryptedData(publicKey, algorithm, Data(canary.utf8) as CFData, &error))
            let opened = try #require(SecKeyCreateDecryptedData(key, algorithm, box, &error)) as Data
            #expect(opened == Data(canary.utf8))

            // The private key never leaves: no external representation, no shared secret.
            error = nil
            #expect(SecKeyCopyExternalRepresentation(key, &error) == nil)
            #expect(error != nil)
            let attributes = try #require(SecKeyCopyAttributes(key) as? [String: Any])
            #expect(attributes[kSecAttrIsExtractable as String] as? Bool == false)

            // Found again by its tag: the same key, still used inside the broker.
            var result: CFTypeRef?
            let query: [String: Any] = [
                kSecClass as String: kSecClassKey, kSecAttrApplicationTag as String: tag, kSecReturnRef as String: true,
            ]
            #expect(SecItemCopyMatching(query as CFDictionary, &result) == errSecSuccess)
            let found = try #require(result as? SecKey)
            #expect(found == key)
            let again = try #require(SecKeyCreateDecryptedData(found, algorithm, box, &error)) as Data
            #expect(again == Data(canary.utf8))
            // A tampered message: errSecDecode, as SecKey says it.
            var tampered = box as Data
            tampered[tampered.count - 1] ^= 1
            error = nil
            #expect(SecKeyCreateDecryptedData(found, algorithm, tampered as CFData, &error) == nil)
            #expect(error.map { CFErrorGetCode($0.takeRetainedValue()) } == -26275)
        }
    }
}
