#if !canImport(Darwin)
import Foundation
import KeychainCompatibility
import Lockbox
import LockboxTestSupport
import Testing

/// `SecKey` over the vault's managed keys, checked against OpenSSL and Python `cryptography` in
/// both directions. References: developer.apple.com/documentation/security/seckey and SecKey.h
/// (the algorithm descriptions quoted in each test).
@Suite("SecKey")
struct SecKeyTests {
    let message = Data("DPoP proof: POST https://api.example.com/token".utf8)

    private func permanentKey(tag: String = "com.example.dpop", extractable: Bool? = nil) throws -> SecKey {
        var privateAttributes: [String: Any] = [
            kSecAttrIsPermanent as String: true,
            kSecAttrApplicationTag as String: Data(tag.utf8),
        ]
        if let extractable { privateAttributes[kSecAttrIsExtractable as String] = extractable }
        let attributes: [String: Any] = [
            kSecAttrKeyType as String: kSecAttrKeyTypeECSECPrimeRandom,
            kSecAttrKeySizeInBits as String: 256,
            kSecPrivateKeyAttrs as String: privateAttributes,
        ]
        var error: Unmanaged<CFError>?
        let key = SecKeyCreateRandomKey(attributes as CFDictionary, &error)
        if let error { Issue.record("SecKeyCreateRandomKey failed: \(error.takeRetainedValue())") }
        return try #require(key)
    }

    private func externalRepresentation(_ key: SecKey) throws -> Data {
        var error: Unmanaged<CFError>?
        let data = SecKeyCopyExternalRepresentation(key, &error) as Data?
        if let error { Issue.record("SecKeyCopyExternalRepresentation failed: \(error.takeRetainedValue())") }
        return try #require(data)
    }

    private func write(_ data: Data, _ fixture: VaultFixture, _ name: String) throws -> String {
        let path = fixture.directory.file(name)
        try data.write(to: URL(fileURLWithPath: path))
        return path
    }

    /// Python with `cryptography`; fails naming the peer when it is missing.
    private func python(_ script: String, _ arguments: [String]) throws -> ProcessResult {
        let result = try run("/usr/bin/env", ["python3", "-c", "import cryptography\n" + script] + arguments)
        #expect(result.status == 0, "python3 with cryptography (Debian's python3-cryptography) failed: \(result.standardError)")
        return result
    }

    /// The PEM of a P-256 public point, made by OpenSSL's own tools from the raw point.
    private func pem(ofPoint point: Data, _ fixture: VaultFixture) throws -> String {
        let prefix: [UInt8] = [
            0x30, 0x59, 0x30, 0x13, 0x06, 0x07, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x02, 0x01, 0x06, 0x08, 0x2a, 0x86, 0x48, 0xce, 0x3d,
            0x03, 0x01, 0x07, 0x03, 0x42, 0x00,
        ]
        let der = try write(Data(prefix) + point, fixture, "point.der")
        let pemPath = fixture.directory.file("point.pem")
        let result = try run("/usr/bin/openssl", ["pkey", "-pubin", "-inform", "DER", "-in", der, "-out", pemPath])
        #expect(result.status == 0, "openssl pkey failed: \(result.standardError)")
        return pemPath
    }

    // SecKey.h: kSecKeyAlgorithmECDSASignatureMessageX962SHA256, "SHA256 digest is computed from
    // input data, and ECDSA signature is generated, output is DER encoded X9.62".
    @Test func permanentKeySignature_verifiesWithOpenSSLAndPython() throws {
        let fixture = try VaultFixture()
        try SecItemStore.withStore(fixture.vault) {
            let key = try permanentKey()
            var error: Unmanaged<CFError>?
            let signature = try #require(SecKeyCreateSignature(key, .ecdsaSignatureMessageX962SHA256, message as CFData, &error) as Data?)
            #expect(signature.first == 0x30)
            let publicKey = try #require(SecKeyCopyPublicKey(key))
            #expect(SecKeyVerifySignature(publicKey, .ecdsaSignatureMessageX962SHA256, message as CFData, signature as CFData, &error))
            var tampered = message
            tampered[0] ^= 1
            #expect(!SecKeyVerifySignature(publicKey, .ecdsaSignatureMessageX962SHA256, tampered as CFData, signature as CFData, &error))
            #expect(error.map { CFErrorGetCode($0.takeRetainedValue()) } == Int(errSecVerifyFailed))

            let point = try externalRepresentation(publicKey)
            #expect(point.count == 65 && point.first == 0x04)
            let pemPath = try pem(ofPoint: point, fixture)
            let messagePath = try write(message, fixture, "message")
            let signaturePath = try write(signature, fixture, "signature")
            let verified = try run("/usr/bin/openssl", ["dgst", "-sha256", "-verify", pemPath, "-signature", signaturePath, messagePath])
            #expect(verified.standardOutput.contains("Verified OK"), "openssl: \(verified.standardError)")

            // The RFC 4754 form (r || s, JWS ES256) verifies in Python too.
            let raw = try #require(SecKeyCreateSignature(key, .ecdsaSignatureMessageRFC4754SHA256, message as CFData, &error) as Data?)
            #expect(raw.count == 64)
            let script = """
                import sys
                from cryptography.hazmat.primitives import hashes
                from cryptography.hazmat.primitives.asymmetric import ec, utils
                key = ec.EllipticCurvePublicKey.from_encoded_point(ec.SECP256R1(), bytes.fromhex(sys.argv[1]))
                key.verify(bytes.fromhex(sys.argv[3]), bytes.fromhex(sys.argv[2]), ec.ECDSA(hashes.SHA256()))
                raw = bytes.fromhex(sys.argv[4])
                der = utils.encode_dss_signature(int.from_bytes(raw[:32], 'big'), int.from_bytes(raw[32:], 'big'))
                key.verify(der, bytes.fromhex(sys.argv[2]), ec.ECDSA(hashes.SHA256()))
                print('ok')
                """
            let result = try python(script, [hex(point), hex(message), hex(signature), hex(raw)])
            #expect(result.standardOutput == "ok\n")
        }
    }

    // SecKeyCreateWithData: "for an elliptic curve public key, the format follows the ANSI X9.63
    // standard using a byte string of 04 || X || Y" (developer.apple.com/documentation/security/seckeycopyexternalrepresentation(_:_:)).
    @Test func pythonSignatures_verifyHere_inBothEncodings() throws {
        let fixture = try VaultFixture()
        let script = """
            import sys
            from cryptography.hazmat.primitives import hashes, serialization
            from cryptography.hazmat.primitives.asymmetric import ec, utils
            key = ec.generate_private_key(ec.SECP256R1())
            message = bytes.fromhex(sys.argv[1])
            der = key.sign(message, ec.ECDSA(hashes.SHA256()))
            r, s = utils.decode_dss_signature(der)
            point = key.public_key().public_bytes(serialization.Encoding.X962, serialization.PublicFormat.UncompressedPoint)
            print(point.hex(), der.hex(), (r.to_bytes(32, 'big') + s.to_bytes(32, 'big')).hex())
            """
        let output = try python(script, [hex(message)]).standardOutput.split(separator: " ").map { String($0).trimmingCharacters(in: .whitespacesAndNewlines) }
        try #require(output.count == 3)
        let (point, der, raw) = (try #require(unhex(output[0])), try #require(unhex(output[1])), try #require(unhex(output[2])))
        try SecItemStore.withStore(fixture.vault) {
            var error: Unmanaged<CFError>?
            let attributes: [String: Any] = [
                kSecAttrKeyType as String: kSecAttrKeyTypeECSECPrimeRandom, kSecAttrKeyClass as String: kSecAttrKeyClassPublic,
            ]
            let theirs = try #require(SecKeyCreateWithData(point as CFData, attributes as CFDictionary, &error))
            #expect(SecKeyVerifySignature(theirs, .ecdsaSignatureMessageX962SHA256, message as CFData, der as CFData, &error))
            #expect(SecKeyVerifySignature(theirs, .ecdsaSignatureMessageRFC4754SHA256, message as CFData, raw as CFData, &error))
            #expect(!SecKeyVerifySignature(theirs, .ecdsaSignatureMessageX962SHA256, Data("other".utf8) as CFData, der as CFData, &error))
            // A malformed point is errSecParam, reported through CFError.
            var bad = point
            bad[10] ^= 0xff
            var failure: Unmanaged<CFError>?
            #expect(SecKeyCreateWithData(bad as CFData, attributes as CFDictionary, &failure) == nil)
            let cfError = try #require(failure?.takeRetainedValue())
            #expect(CFErrorGetCode(cfError) == Int(errSecParam))
            #expect(CFErrorGetDomain(cfError) as String == "NSOSStatusErrorDomain")
            #expect((CFErrorCopyUserInfo(cfError) as? [String: Any])?[NSLocalizedDescriptionKey] is String)
        }
    }

    // SecKey.h, kSecKeyAlgorithmECIESEncryptionStandardVariableIVX963SHA256AESGCM and the
    // Standard (zero IV) form: ECDH with an ephemeral key, X9.63 KDF with SHA-256 and the ephemeral
    // public key as sharedInfo, AES-GCM with a 128-bit key for P-256 and a 16-byte tag; the
    // VariableIV form takes the IV from the KDF output after the key. Python implements it here
    // independently, from its own primitives.
    static let pythonECIES = """
        import sys
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.hazmat.primitives.ciphers.aead import AESGCM
        from cryptography.hazmat.primitives.kdf.x963kdf import X963KDF
        def schedule(shared, ephemeral, variable):
            out = X963KDF(algorithm=hashes.SHA256(), length=32 if variable else 16, sharedinfo=ephemeral).derive(shared)
            return out[:16], (out[16:] if variable else bytes(16))
        mode, variable = sys.argv[1], sys.argv[2] == 'variable'
        if mode == 'decrypt':
            scalar = bytes.fromhex(sys.argv[3])[65:]
            key = ec.derive_private_key(int.from_bytes(scalar, 'big'), ec.SECP256R1())
            box = bytes.fromhex(sys.argv[4])
            ephemeral = box[:65]
            peer = ec.EllipticCurvePublicKey.from_encoded_point(ec.SECP256R1(), ephemeral)
            k, iv = schedule(key.exchange(ec.ECDH(), peer), ephemeral, variable)
            print(AESGCM(k).decrypt(iv, box[65:], None).hex())
        else:
            recipient = ec.EllipticCurvePublicKey.from_encoded_point(ec.SECP256R1(), bytes.fromhex(sys.argv[3]))
            eph = ec.generate_private_key(ec.SECP256R1())
            ephemeral = eph.public_key().public_bytes(serialization.Encoding.X962, serialization.PublicFormat.UncompressedPoint)
            k, iv = schedule(eph.exchange(ec.ECDH(), recipient), ephemeral, variable)
            print((ephemeral + AESGCM(k).encrypt(iv, bytes.fromhex(sys.argv[4]), None)).hex())
        """

    @Test(arguments: [
        (SecKeyAlgorithm.eciesEncryptionCofactorVariableIVX963SHA256AESGCM, "variable"),
        (SecKeyAlgorithm.eciesEncryptionStandardVariableIVX963SHA256AESGCM, "variable"),
        (SecKeyAlgorithm.eciesEncryptionStandardX963SHA256AESGCM, "zero"),
        (SecKeyAlgorithm.eciesEncryptionCofactorX963SHA256AESGCM, "zero"),
    ])
    func ecies_interoperatesWithAnIndependentImplementation(_ algorithm: SecKeyAlgorithm, _ iv: String) throws {
        let fixture = try VaultFixture()
        let plaintext = Data("a refresh token, sealed to the device key".utf8)
        try SecItemStore.withStore(fixture.vault) {
            // An extractable key, so that the Python side can hold the same private key.
            let key = try permanentKey(extractable: true)
            let publicKey = try #require(SecKeyCopyPublicKey(key))
            #expect(SecKeyIsAlgorithmSupported(publicKey, .encrypt, algorithm))
            #expect(SecKeyIsAlgorithmSupported(key, .decrypt, algorithm))
            var error: Unmanaged<CFError>?
            let box = try #require(SecKeyCreateEncryptedData(publicKey, algorithm, plaintext as CFData, &error) as Data?)
            #expect(box.count == 65 + plaintext.count + 16)
            #expect(box.first == 0x04)
            #expect(SecKeyCreateDecryptedData(key, algorithm, box as CFData, &error) as Data? == plaintext)

            let representation = try externalRepresentation(key)
            let opened = try python(Self.pythonECIES, ["decrypt", iv, hex(representation), hex(box)]).standardOutput
            #expect(opened.trimmingCharacters(in: .whitespacesAndNewlines) == hex(plaintext))

            let point = try externalRepresentation(publicKey)
            let theirs = try python(Self.pythonECIES, ["encrypt", iv, hex(point), hex(plaintext)]).standardOutput
            let theirBox = try #require(unhex(theirs.trimmingCharacters(in: .whitespacesAndNewlines)))
            #expect(SecKeyCreateDecryptedData(key, algorithm, theirBox as CFData, &error) as Data? == plaintext)

            // Any change to the box is one opaque errSecDecode.
            var tampered = theirBox
            tampered[tampered.count - 1] ^= 1
            var failure: Unmanaged<CFError>?
            #expect(SecKeyCreateDecryptedData(key, algorithm, tampered as CFData, &failure) == nil)
            #expect(failure.map { CFErrorGetCode($0.takeRetainedValue()) } == Int(errSecDecode))
        }
    }

    // developer.apple.com/documentation/security/seckeycopyexternalrepresentation(_:_:): "The
    // operation fails if the key is not exportable, for example if it is bound to a smart card or
    // to the Secure Enclave." Lockbox's keychain keys are not exportable unless asked.
    @Test func nonExtractableKey_refusesExport_andInMemoryKeyRoundTrips() throws {
        let fixture = try VaultFixture()
        try SecItemStore.withStore(fixture.vault) {
            let key = try permanentKey()
            var error: Unmanaged<CFError>?
            #expect(SecKeyCopyExternalRepresentation(key, &error) == nil)
            #expect(error.map { CFErrorGetCode($0.takeRetainedValue()) } == Int(errSecParam))
            let attributes = try #require(SecKeyCopyAttributes(key) as? [String: Any])
            #expect(attributes[kSecAttrIsExtractable as String] as? Bool == false)
            #expect(attributes[kSecAttrKeyClass as String] as? String == kSecAttrKeyClassPrivate as String)

            let transient = try #require(
                SecKeyCreateRandomKey([kSecAttrKeyType as String: kSecAttrKeyTypeECSECPrimeRandom] as CFDictionary, &error))
            let bytes = try externalRepresentation(transient)
            #expect(bytes.count == 97)
            let again = try #require(
                SecKeyCreateWithData(
                    bytes as CFData,
                    [kSecAttrKeyType as String: kSecAttrKeyTypeEC, kSecAttrKeyClass as String: kSecAttrKeyClassPrivate] as CFDictionary,
                    &error))
            let signature = try #require(SecKeyCreateSignature(again, .ecdsaSignatureMessageX962SHA256, message as CFData, &error))
            let transientPublic = try #require(SecKeyCopyPublicKey(transient))
            #expect(SecKeyVerifySignature(transientPublic, .ecdsaSignatureMessageX962SHA256, message as CFData, signature, &error))
        }
    }

    // The attacker's reads of a non-extractable key whose bytes the test knows (made in memory,
    // added with kSecAttrIsExtractable false): no SecItem path hands them out, an update that
    // claims extractability changes nothing, and a backup leaves the key out.
    @Test func nonExtractableKey_bytesLeaveThroughNoSecItemPath() throws {
        let fixture = try VaultFixture()
        try SecItemStore.withStore(fixture.vault) {
            var error: Unmanaged<CFError>?
            let made = try #require(SecKeyCreateRandomKey([kSecAttrKeyType as String: kSecAttrKeyTypeECSECPrimeRandom] as CFDictionary, &error))
            let bytes = try externalRepresentation(made)
            let scalar = bytes.suffix(32)
            let tag = Data("com.example.sealed".utf8)
            let add: [String: Any] = [
                kSecClass as String: kSecClassKey, kSecAttrApplicationTag as String: tag, kSecValueRef as String: made,
                kSecAttrIsExtractable as String: false, kSecReturnPersistentRef as String: true,
            ]
            var added: CFTypeRef?
            #expect(SecItemAdd(add as CFDictionary, &added) == errSecSuccess)
            let reference = try #require((added as? [String: Any])?[kSecValuePersistentRef as String] as? Data ?? added as? Data)
            func leaks(_ value: Any?) -> Bool { "\(value ?? "")".contains(scalar.map { String(format: "%02x", $0) }.joined()) || (value as? Data)?.range(of: scalar) != nil }

            let byTag: [String: Any] = [kSecClass as String: kSecClassKey, kSecAttrApplicationTag as String: tag]
            var result: CFTypeRef?
            for returning in [[kSecReturnData as String: true], [kSecReturnData as String: true, kSecReturnAttributes as String: true]] {
                #expect(SecItemCopyMatching(byTag.merging(returning) { $1 } as CFDictionary, &result) == errSecDataNotAvailable)
                #expect(result == nil)
            }
            let byReference: [String: Any] = [kSecValuePersistentRef as String: reference, kSecReturnData as String: true]
            #expect(SecItemCopyMatching(byReference as CFDictionary, &result) == errSecDataNotAvailable)
            #expect(SecItemCopyMatching(byTag.merging([kSecReturnAttributes as String: true, kSecMatchLimit as String: kSecMatchLimitAll]) { $1 } as CFDictionary, &result) == errSecSuccess)
            #expect(!leaks(result))
            for returning in [[kSecReturnRef as String: true], [kSecReturnRef as String: true, kSecReturnAttributes as String: true]] {
                #expect(SecItemCopyMatching(byTag.merging(returning) { $1 } as CFDictionary, &result) == errSecSuccess)
                let key = try #require((result as? [String: Any])?[kSecValueRef as String] as? SecKey ?? (result.map { $0 as! SecKey }))
                #expect(SecKeyCopyExternalRepresentation(key, &error) == nil)
                #expect(!leaks(SecKeyCopyAttributes(key)))
            }
            // A caller claiming extractability afterwards changes nothing.
            _ = SecItemUpdate(byTag as CFDictionary, [kSecAttrIsExtractable as String: true] as CFDictionary)
            #expect(SecItemCopyMatching(byTag.merging([kSecReturnRef as String: true]) { $1 } as CFDictionary, &result) == errSecSuccess)
            #expect(SecKeyCopyExternalRepresentation(result as! SecKey, &error) == nil)
            #expect(SecItemCopyMatching(byTag.merging([kSecReturnData as String: true]) { $1 } as CFDictionary, &result) == errSecDataNotAvailable)

            let backup = fixture.directory.file("backup.lockbox")
            let summary = try fixture.vault.backup(to: backup, passphrase: SecretBytes(utf8: "backup passphrase"))
            #expect(summary.skippedNonExtractableKeys == 1)
        }
    }

    // A DPoP key store's round trip: a key made by CryptoKit-style code as bytes, added with
    // kSecValueRef, found with kSecReturnRef (developer.apple.com/documentation/security/storing-keys-in-the-keychain),
    // exported again, deleted by reference.
    @Test func keyAddedByReference_isFoundByTag_asASecKey() throws {
        let fixture = try VaultFixture()
        try SecItemStore.withStore(fixture.vault) {
            var error: Unmanaged<CFError>?
            let made = try #require(SecKeyCreateRandomKey([kSecAttrKeyType as String: kSecAttrKeyTypeECSECPrimeRandom] as CFDictionary, &error))
            let bytes = try externalRepresentation(made)
            let tag = Data("com.example.dpop.imported".utf8)
            let add: [String: Any] = [
                kSecClass as String: kSecClassKey, kSecAttrApplicationTag as String: tag, kSecValueRef as String: made,
                kSecAttrAccessible as String: kSecAttrAccessibleAfterFirstUnlockThisDeviceOnly,
            ]
            #expect(SecItemAdd(add as CFDictionary, nil) == errSecSuccess)
            #expect(SecItemAdd(add as CFDictionary, nil) == errSecDuplicateItem)

            let query: [String: Any] = [
                kSecClass as String: kSecClassKey, kSecAttrApplicationTag as String: tag,
                kSecAttrKeyType as String: kSecAttrKeyTypeECSECPrimeRandom, kSecReturnRef as String: true,
            ]
            var item: CFTypeRef?
            #expect(SecItemCopyMatching(query as CFDictionary, &item) == errSecSuccess)
            #expect(CFGetTypeID(item) == SecKeyGetTypeID())
            let found = item as! SecKey
            #expect(try externalRepresentation(found) == bytes)

            // Key attributes select as Apple names them; usage flags are accepted.
            let byAttributes: [String: Any] = [
                kSecClass as String: kSecClassKey, kSecAttrKeyClass as String: kSecAttrKeyClassPrivate,
                kSecAttrKeySizeInBits as String: 256, kSecAttrApplicationTag as String: tag, kSecAttrCanSign as String: true,
                kSecReturnRef as String: true,
            ]
            var byAttributesResult: CFTypeRef?
            #expect(SecItemCopyMatching(byAttributes as CFDictionary, &byAttributesResult) == errSecSuccess)
            #expect(byAttributesResult is SecKey)
            var publicClass = byAttributes
            publicClass[kSecAttrKeyClass as String] = kSecAttrKeyClassPublic
            #expect(SecItemCopyMatching(publicClass as CFDictionary, &byAttributesResult) == errSecItemNotFound)

            // kSecReturnData gives the key's external representation, as on iOS.
            var dataQuery = query
            dataQuery[kSecReturnRef as String] = nil
            dataQuery[kSecReturnData as String] = true
            var returned: CFTypeRef?
            #expect(SecItemCopyMatching(dataQuery as CFDictionary, &returned) == errSecSuccess)
            #expect(returned as? Data == bytes)

            var both: CFTypeRef?
            var withAttributes = query
            withAttributes[kSecReturnAttributes as String] = true
            withAttributes[kSecMatchLimit as String] = kSecMatchLimitAll
            #expect(SecItemCopyMatching(withAttributes as CFDictionary, &both) == errSecSuccess)
            let rows = try #require(both as? [[String: Any]])
            #expect(rows.count == 1)
            #expect(rows.first?[kSecAttrApplicationTag as String] as? Data == tag)
            #expect(rows.first?[kSecValueRef as String] is SecKey)

            // A SecKey in kSecValueRef names the item and its class: no kSecClass needed.
            #expect(SecItemDelete([kSecValueRef as String: found] as CFDictionary) == errSecSuccess)
            #expect(SecItemCopyMatching(query as CFDictionary, &item) == errSecItemNotFound)
        }
    }

    // SecKey.h, kSecKeyAlgorithmECDHKeyExchangeStandard and ...StandardX963SHA256 (with
    // kSecKeyKeyExchangeParameterRequestedSize and ...SharedInfo); Python's ECDH and X963KDF agree.
    @Test func keyExchange_matchesPython() throws {
        let fixture = try VaultFixture()
        try SecItemStore.withStore(fixture.vault) {
            let key = try permanentKey()
            let ourPublic = try #require(SecKeyCopyPublicKey(key))
            let point = try externalRepresentation(ourPublic)
            let script = """
                import sys
                from cryptography.hazmat.primitives import hashes, serialization
                from cryptography.hazmat.primitives.asymmetric import ec
                from cryptography.hazmat.primitives.kdf.x963kdf import X963KDF
                mine = ec.generate_private_key(ec.SECP256R1())
                peer = ec.EllipticCurvePublicKey.from_encoded_point(ec.SECP256R1(), bytes.fromhex(sys.argv[1]))
                shared = mine.exchange(ec.ECDH(), peer)
                derived = X963KDF(algorithm=hashes.SHA256(), length=42, sharedinfo=b'lockbox').derive(shared)
                point = mine.public_key().public_bytes(serialization.Encoding.X962, serialization.PublicFormat.UncompressedPoint)
                print(point.hex(), shared.hex(), derived.hex())
                """
            let parts = try python(script, [hex(point)]).standardOutput.split(separator: " ").map {
                String($0).trimmingCharacters(in: .whitespacesAndNewlines)
            }
            try #require(parts.count == 3)
            var error: Unmanaged<CFError>?
            let theirPoint = try #require(unhex(parts[0]))
            let theirs = try #require(
                SecKeyCreateWithData(
                    theirPoint as CFData,
                    [kSecAttrKeyType as String: kSecAttrKeyTypeECSECPrimeRandom, kSecAttrKeyClass as String: kSecAttrKeyClassPublic] as CFDictionary,
                    &error))
            let shared = SecKeyCopyKeyExchangeResult(key, .ecdhKeyExchangeStandard, theirs, [:] as CFDictionary, &error) as Data?
            #expect(shared.map(hex) == parts[1])
            let parameters: [String: Any] = [
                kSecKeyKeyExchangeParameterRequestedSize as String: 42,
                kSecKeyKeyExchangeParameterSharedInfo as String: Data("lockbox".utf8),
            ]
            let derived = SecKeyCopyKeyExchangeResult(key, .ecdhKeyExchangeStandardX963SHA256, theirs, parameters as CFDictionary, &error) as Data?
            #expect(derived.map(hex) == parts[2])
        }
    }

}

/// `kSecAttrTokenIDSecureEnclave` maps to the machine's TPM 2.0 (swtpm in the tests). Serialized:
/// the TPM in use (`SecKeyHardware.device`) is process-wide.
@Suite("SecKey: kSecAttrTokenIDSecureEnclave on a TPM", .serialized)
struct SecureEnclaveTokenTests {
    let attributes: [String: Any] = [
        kSecAttrKeyType as String: kSecAttrKeyTypeECSECPrimeRandom, kSecAttrKeySizeInBits as String: 256,
        kSecAttrTokenID as String: kSecAttrTokenIDSecureEnclave,
        kSecPrivateKeyAttrs as String: [kSecAttrIsPermanent as String: true, kSecAttrApplicationTag as String: Data("se".utf8)],
    ]

    // On an Apple device without a Secure Enclave, SecKeyCreateRandomKey with
    // kSecAttrTokenIDSecureEnclave fails (developer.apple.com/documentation/security/protecting-keys-with-the-secure-enclave:
    // "Only devices with a Secure Enclave"): no silent software key instead.
    @Test func secureEnclaveToken_withoutHardware_failsClearly() throws {
        let fixture = try VaultFixture()
        SecKeyHardware.device = "device:/nonexistent/tpmrm9"
        defer { SecKeyHardware.device = nil }
        try SecItemStore.withStore(fixture.vault) {
            var error: Unmanaged<CFError>?
            #expect(SecKeyCreateRandomKey(attributes as CFDictionary, &error) == nil)
            let cfError = try #require(error?.takeRetainedValue())
            #expect(CFErrorGetCode(cfError) == Int(errSecUnimplemented))
            #expect((CFErrorCopyDescription(cfError) as String?)?.contains("/nonexistent/tpmrm9") == true)
            var item: CFTypeRef?
            let query = [kSecClass as String: kSecClassKey, kSecAttrApplicationTag as String: Data("se".utf8), kSecReturnRef as String: true]
            #expect(SecItemCopyMatching(query as CFDictionary, &item) == errSecItemNotFound)
        }
    }

    // With the TPM, the key is made inside it: it signs (ECDSA P-256, X9.62 DER as Apple gives),
    // its public key verifies, and its private half is never exported, as a Secure Enclave
    // key's is not (SecKeyCopyExternalRepresentation fails for it on iOS).
    @Test func secureEnclaveToken_withTheTPM_signsAndNeverExports() throws {
        let fixture = try VaultFixture()
        SecKeyHardware.device = try TestTPM.shared()
        defer { SecKeyHardware.device = nil }
        #expect(SecKeyHardware.availability.isAvailable, "swtpm: \(SecKeyHardware.availability.reason)")
        try SecItemStore.withStore(fixture.vault) {
            var error: Unmanaged<CFError>?
            let key = try #require(SecKeyCreateRandomKey(attributes as CFDictionary, &error), "\(String(describing: error))")
            let message = Data("sign me inside the TPM".utf8)
            let signature = try #require(SecKeyCreateSignature(key, .ecdsaSignatureMessageX962SHA256, message as CFData, &error) as Data?)
            let publicKey = try #require(SecKeyCopyPublicKey(key))
            #expect(SecKeyVerifySignature(publicKey, .ecdsaSignatureMessageX962SHA256, message as CFData, signature as CFData, &error))
            #expect(SecKeyCopyExternalRepresentation(key, &error) == nil)
            // Found again by its tag, it is the same key.
            var item: CFTypeRef?
            let query = [kSecClass as String: kSecClassKey, kSecAttrApplicationTag as String: Data("se".utf8), kSecReturnRef as String: true]
            #expect(SecItemCopyMatching(query as CFDictionary, &item) == errSecSuccess)
            let found = try #require(item.map { $0 as! SecKey })
            let again = try #require(SecKeyCreateSignature(found, .ecdsaSignatureMessageX962SHA256, message as CFData, &error) as Data?)
            #expect(SecKeyVerifySignature(publicKey, .ecdsaSignatureMessageX962SHA256, message as CFData, again as CFData, &error))
        }
    }
}

extension SecKeyTests {
    // Non-negotiable: key bytes never appear in a description or an error message.
    @Test func privateKeyBytes_neverAppearInDescriptionsOrErrors() throws {
        let fixture = try VaultFixture()
        try SecItemStore.withStore(fixture.vault) {
            var error: Unmanaged<CFError>?
            let key = try #require(SecKeyCreateRandomKey([kSecAttrKeyType as String: kSecAttrKeyTypeECSECPrimeRandom] as CFDictionary, &error))
            let bytes = try externalRepresentation(key)
            let scalar = hex(bytes.suffix(32))
            let secret = Data("canary-plaintext-7f3a".utf8)
            let publicKey = try #require(SecKeyCopyPublicKey(key))
            var box = try #require(SecKeyCreateEncryptedData(publicKey, .eciesEncryptionCofactorVariableIVX963SHA256AESGCM, secret as CFData, &error) as Data?)
            box[box.count - 1] ^= 1
            var failure: Unmanaged<CFError>?
            #expect(SecKeyCreateDecryptedData(key, .eciesEncryptionCofactorVariableIVX963SHA256AESGCM, box as CFData, &failure) == nil)
            let messages = [
                key.description, String(describing: key), String(reflecting: key),
                failure.map { "\($0.takeRetainedValue())" } ?? "",
                SecKeyCopyAttributes(key).map { "\($0)" } ?? "",
            ]
            for text in messages {
                #expect(!text.lowercased().contains(scalar), "the private scalar leaked: \(text)")
                #expect(!text.contains("canary-plaintext"), "the plaintext leaked: \(text)")
            }
            // A wrong-length private key's error names lengths, not bytes.
            let canary = Data(repeating: 0x5a, count: 96)
            var lengthError: Unmanaged<CFError>?
            let attributes = [kSecAttrKeyType as String: kSecAttrKeyTypeEC, kSecAttrKeyClass as String: kSecAttrKeyClassPrivate]
            #expect(SecKeyCreateWithData(canary as CFData, attributes as CFDictionary, &lengthError) == nil)
            let text = lengthError.map { "\($0.takeRetainedValue())" } ?? ""
            #expect(!text.contains("5a5a") && !text.contains("ZZZZ"))
        }
    }

    // Bad input: malformed signatures, boxes and points give a clear error and change nothing.
    @Test func malformedSignaturesAndBoxes_areRefusedWithoutCrashing() throws {
        let fixture = try VaultFixture()
        try SecItemStore.withStore(fixture.vault) {
            let key = try permanentKey()
            let publicKey = try #require(SecKeyCopyPublicKey(key))
            var error: Unmanaged<CFError>?
            let good = try #require(SecKeyCreateSignature(key, .ecdsaSignatureMessageX962SHA256, message as CFData, &error) as Data?)
            var badLength = good
            badLength[1] = 0x7f
            var trailing = good
            trailing.append(0)
            let candidates: [(SecKeyAlgorithm, Data)] = [
                (.ecdsaSignatureMessageX962SHA256, Data()), (.ecdsaSignatureMessageX962SHA256, Data([0x30])),
                (.ecdsaSignatureMessageX962SHA256, badLength), (.ecdsaSignatureMessageX962SHA256, trailing),
                (.ecdsaSignatureMessageX962SHA256, Data(repeating: 0x30, count: 200)),
                (.ecdsaSignatureMessageRFC4754SHA256, Data(repeating: 1, count: 63)),
                (.ecdsaSignatureMessageRFC4754SHA256, Data(repeating: 0, count: 64)),
                (.ecdsaSignatureMessageRFC4754SHA256, good),
            ]
            for (algorithm, signature) in candidates {
                #expect(!SecKeyVerifySignature(publicKey, algorithm, message as CFData, signature as CFData, &error))
            }
            #expect(!SecKeyVerifySignature(publicKey, SecKeyAlgorithm(rawValue: "algid:sign:ECDSA:bogus"), message as CFData, good as CFData, &error))
            #expect(error.map { CFErrorGetCode($0.takeRetainedValue()) } == Int(errSecParam))
            let algorithm = SecKeyAlgorithm.eciesEncryptionCofactorVariableIVX963SHA256AESGCM
            for box in [Data(), Data(repeating: 4, count: 80), Data([0x04]) + Data(repeating: 0, count: 64) + Data(repeating: 0, count: 16)] {
                var failure: Unmanaged<CFError>?
                #expect(SecKeyCreateDecryptedData(key, algorithm, box as CFData, &failure) == nil)
                let code = failure.map { CFErrorGetCode($0.takeRetainedValue()) }
                #expect(code == Int(errSecDecode) || code == Int(errSecParam))
            }
            // The key still works.
            #expect(SecKeyVerifySignature(publicKey, .ecdsaSignatureMessageX962SHA256, message as CFData, good as CFData, &error))
        }
    }

    @Test func typeIdentifiers_andCFData() throws {
        let bytes: [UInt8] = [1, 2, 3]
        let data = bytes.withUnsafeBufferPointer { CFDataCreateWithBytesNoCopy(kCFAllocatorDefault, $0.baseAddress, 3, kCFAllocatorNull) }
        #expect(data as Data? == Data(bytes))
        #expect(CFGetTypeID(data) == CFDataGetTypeID())
        #expect(CFGetTypeID(kSecClassKey) == CFStringGetTypeID())
        #expect(CFGetTypeID(kCFBooleanTrue) == CFBooleanGetTypeID())
        #expect(SecKeyGetTypeID() != CFDataGetTypeID())
    }
}

func hex(_ data: some Sequence<UInt8>) -> String { data.map { String(format: "%02x", $0) }.joined() }

func unhex(_ text: String) -> Data? {
    var bytes: [UInt8] = []
    var index = text.startIndex
    while index < text.endIndex {
        guard let next = text.index(index, offsetBy: 2, limitedBy: text.endIndex), let byte = UInt8(text[index..<next], radix: 16) else {
            return nil
        }
        bytes.append(byte)
        index = next
    }
    return Data(bytes)
}
#endif
