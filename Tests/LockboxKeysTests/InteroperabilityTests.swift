import Foundation
import LockboxCore
import LockboxKeys
import LockboxTestSupport
import Testing

/// Every algorithm's operations, checked against OpenSSL's command line and Python
/// `cryptography` in both directions.
@Suite("managed keys, interoperability")
struct InteroperabilityTests {
    let message = Data("the message to sign, with a byte \u{1} in it".utf8)

    @Test func p256Signature_verifiesWithOpenSSLAndPythonAndHere() throws {
        let fixture = try KeyFixture()
        let key = try fixture.generate(.p256, [.sign, .verify])
        let signature = try key.sign(message)
        #expect(signature.first == 0x30, "an X9.62 signature is DER")
        #expect(try key.isValidSignature(signature, for: message))
        var other = message
        other[0] ^= 1
        #expect(try !key.isValidSignature(signature, for: other))

        let publicKey = try #require(key.publicKey)
        let pem = try fixture.write(Array(publicKey.pemRepresentation.utf8), to: "p256.pem")
        let messageFile = try fixture.write(message, to: "message")
        let signatureFile = try fixture.write(signature, to: "signature.der")
        let verified = try peer("openssl", ["dgst", "-sha256", "-verify", pem, "-signature", signatureFile, messageFile])
        #expect(verified.standardOutput.contains("Verified OK"))

        let script = """
            import sys
            from cryptography.hazmat.primitives import hashes, serialization
            from cryptography.hazmat.primitives.asymmetric import ec
            key = serialization.load_pem_public_key(open(sys.argv[1], 'rb').read())
            key.verify(open(sys.argv[3], 'rb').read(), open(sys.argv[2], 'rb').read(), ec.ECDSA(hashes.SHA256()))
            print('ok')
            """
        let result = try run("/usr/bin/env", ["python3", "-c", script, pem, messageFile, signatureFile])
        #expect(result.standardOutput == "ok\n", "python3 cryptography did not verify: \(result.standardError)")
    }

    @Test func openSSLP256Signature_verifiesWithImportedPEMPublicKey() throws {
        let fixture = try KeyFixture()
        let privateFile = fixture.vault.directory.file("theirs.pem")
        try peer("openssl", ["genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out", privateFile])
        let publicPEM = try peer("openssl", ["pkey", "-in", privateFile, "-pubout"]).standardOutput
        let messageFile = try fixture.write(message, to: "message")
        let signatureFile = fixture.vault.directory.file("signature")
        try peer("openssl", ["dgst", "-sha256", "-sign", privateFile, "-out", signatureFile, messageFile])
        let theirs = try PublicKey(pemRepresentation: publicPEM)
        #expect(theirs.algorithm == .p256)
        let signature = try fixture.read("signature")
        #expect(try theirs.isValidSignature(signature, for: message))
        #expect(try !theirs.isValidSignature(signature, for: message + Data([0])))
        // The same key from its X9.63 point and its DER form.
        let der = try peer("openssl", ["pkey", "-in", privateFile, "-pubout", "-outform", "DER"]).standardOutputBytes
        #expect(try PublicKey(derRepresentation: Data(der)) == theirs)
        #expect(try PublicKey(x963Representation: theirs.rawRepresentation) == theirs)
        #expect(theirs.pemRepresentation == publicPEM)
    }

    @Test func ed25519Signature_verifiesWithOpenSSLAndTheirsVerifiesHere() throws {
        let fixture = try KeyFixture()
        let key = try fixture.generate(.ed25519, [.sign, .verify])
        let signature = try key.sign(message)
        #expect(signature.count == 64)
        #expect(try key.isValidSignature(signature, for: message))
        let pem = try fixture.write(Array(try #require(key.publicKey).pemRepresentation.utf8), to: "ed.pem")
        let messageFile = try fixture.write(message, to: "message")
        let signatureFile = try fixture.write(signature, to: "signature")
        let verified = try peer(
            "openssl", ["pkeyutl", "-verify", "-pubin", "-inkey", pem, "-rawin", "-in", messageFile, "-sigfile", signatureFile])
        #expect(verified.standardOutput.contains("Signature Verified Successfully"))

        let privateFile = fixture.vault.directory.file("theirs.pem")
        try peer("openssl", ["genpkey", "-algorithm", "ED25519", "-out", privateFile])
        let theirs = try PublicKey(pemRepresentation: try peer("openssl", ["pkey", "-in", privateFile, "-pubout"]).standardOutput)
        let theirSignatureFile = fixture.vault.directory.file("their-signature")
        try peer("openssl", ["pkeyutl", "-sign", "-inkey", privateFile, "-rawin", "-in", messageFile, "-out", theirSignatureFile])
        #expect(theirs.algorithm == .ed25519)
        #expect(try theirs.isValidSignature(try fixture.read("their-signature"), for: message))
    }

    @Test func x25519Agreement_matchesOpenSSLDerive() throws {
        let fixture = try KeyFixture()
        let key = try fixture.generate(.x25519, [.keyAgreement])
        let theirsFile = fixture.vault.directory.file("theirs.pem")
        try peer("openssl", ["genpkey", "-algorithm", "X25519", "-out", theirsFile])
        let theirs = try PublicKey(pemRepresentation: try peer("openssl", ["pkey", "-in", theirsFile, "-pubout"]).standardOutput)
        let ours = try fixture.write(Array(try #require(key.publicKey).pemRepresentation.utf8), to: "ours.pem")
        let secret = try key.sharedSecret(with: theirs)
        let derived = try peer("openssl", ["pkeyutl", "-derive", "-inkey", theirsFile, "-peerkey", ours]).standardOutputBytes
        #expect(secret.count == 32)
        #expect(secret.withUnsafeBytes { Array($0) } == derived)
    }

    @Test func p256Agreement_matchesOpenSSLDeriveAndAnotherManagedKey() throws {
        let fixture = try KeyFixture()
        let key = try fixture.generate(.p256, [.keyAgreement])
        let other = try fixture.generate(.p256, [.keyAgreement], tag: "other")
        let one = try key.sharedSecret(with: try #require(other.publicKey))
        let two = try other.sharedSecret(with: try #require(key.publicKey))
        #expect(one == two)

        let theirsFile = fixture.vault.directory.file("theirs.pem")
        try peer("openssl", ["genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out", theirsFile])
        let theirs = try PublicKey(pemRepresentation: try peer("openssl", ["pkey", "-in", theirsFile, "-pubout"]).standardOutput)
        let ours = try fixture.write(Array(try #require(key.publicKey).pemRepresentation.utf8), to: "ours.pem")
        let derived = try peer("openssl", ["pkeyutl", "-derive", "-inkey", theirsFile, "-peerkey", ours]).standardOutputBytes
        #expect(try key.sharedSecret(with: theirs).withUnsafeBytes { Array($0) } == derived)
    }

    @Test func aesGCM_roundTripsAndOpensWithPythonCryptography() throws {
        let fixture = try KeyFixture()
        let key = try fixture.generate(.aes256GCM, [.encrypt, .decrypt]) { $0.isExtractable = true }
        let plaintext = SecretBytes(utf8: makeCanary("plaintext"))
        let associated = Data("header".utf8)
        let box = try key.encrypt(plaintext, authenticating: associated)
        #expect(box.count == 12 + plaintext.count + 16)
        #expect(try key.decrypt(box, authenticating: associated) == plaintext)
        // A fresh nonce each time.
        #expect(try key.encrypt(plaintext, authenticating: associated) != box)
        // Tampering, or other associated data: one opaque error.
        var tampered = box
        tampered[20] ^= 1
        #expect(status { _ = try key.decrypt(tampered, authenticating: associated) } == LockboxError.Code.decode.rawValue)
        #expect(status { _ = try key.decrypt(box) } == LockboxError.Code.decode.rawValue)
        #expect(status { _ = try key.decrypt(Data(box.prefix(20))) } == LockboxError.Code.decode.rawValue)

        // The key of an extractable key is readable as an item; its last 32 bytes are the AES key.
        let value = try fixture.storedValue(of: key)
        let aesKey = Array(value.suffix(32))
        let script = """
            import sys
            from cryptography.hazmat.primitives.ciphers.aead import AESGCM
            box = bytes.fromhex(sys.argv[2])
            print(AESGCM(bytes.fromhex(sys.argv[1])).decrypt(box[:12], box[12:], b'header').decode())
            """
        let result = try python(script.replacingOccurrences(of: "sys.argv[1]", with: "'\(hex(aesKey))'")
            .replacingOccurrences(of: "sys.argv[2]", with: "'\(hex(box))'"))
        #expect(result.standardOutput == plaintext.withUnsafeBytes { String(decoding: $0, as: UTF8.self) } + "\n")
    }

    @Test func publicKeyExports_matchOpenSSLAndSSHKeygen() throws {
        let fixture = try KeyFixture()
        for algorithm in [KeyAlgorithm.p256, .ed25519] {
            let key = try fixture.generate(algorithm, [.sign], tag: algorithm.rawValue)
            let publicKey = try #require(key.publicKey)
            if algorithm == .p256 {
                #expect(publicKey.rawRepresentation.count == 65 && publicKey.rawRepresentation.first == 0x04)
            }
            let derFile = try fixture.write(publicKey.derRepresentation, to: "\(algorithm).der")
            let converted = try peer("openssl", ["pkey", "-pubin", "-inform", "DER", "-in", derFile]).standardOutput
            #expect(converted == publicKey.pemRepresentation)
            let pemFile = try fixture.write(Array(publicKey.pemRepresentation.utf8), to: "\(algorithm).pem")
            if algorithm == .p256 {
                // Debian 12's ssh-keygen converts only RSA and ECDSA keys from PKCS#8.
                let ssh = try peer("ssh-keygen", ["-i", "-m", "PKCS8", "-f", pemFile]).standardOutput
                #expect(ssh.trimmingCharacters(in: .whitespacesAndNewlines) == (try publicKey.openSSHRepresentation()))
            }
            let script = """
                import sys
                from cryptography.hazmat.primitives import serialization as s
                key = s.load_pem_public_key(open(sys.argv[1], 'rb').read())
                print(key.public_bytes(s.Encoding.OpenSSH, s.PublicFormat.OpenSSH).decode())
                """
            let python = try run("/usr/bin/env", ["python3", "-c", script, pemFile])
            #expect(python.standardOutput == (try publicKey.openSSHRepresentation()) + "\n", "python3 cryptography: \(python.standardError)")
            let line = try publicKey.openSSHRepresentation(comment: "deploy@example")
            #expect(line.hasPrefix(algorithm == .p256 ? "ecdsa-sha2-nistp256 AAAA" : "ssh-ed25519 AAAA"))
            #expect(line.hasSuffix(" deploy@example"))
            let fingerprint = try peer("ssh-keygen", ["-l", "-f", "-"], input: Array((line + "\n").utf8))
            #expect(fingerprint.standardOutput.contains("SHA256:"))
        }
        let x25519 = try fixture.generate(.x25519, [.keyAgreement], tag: "x")
        #expect(status { _ = try x25519.publicKey!.openSSHRepresentation() } == LockboxError.Code.param.rawValue)
        let derFile = try fixture.write(x25519.publicKey!.derRepresentation, to: "x.der")
        #expect(try peer("openssl", ["pkey", "-pubin", "-inform", "DER", "-in", derFile]).standardOutput == x25519.publicKey!.pemRepresentation)
    }
}
