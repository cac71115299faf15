import Foundation
import LockboxCore
import LockboxKeys
import LockboxTestSupport
import LockboxVault
import Testing

/// P-256 keys made inside a TPM 2.0 (a software TPM, swtpm, started by scripts/swtpm): made and
/// used there, refused elsewhere, and never a silent software key.
@Suite("managed keys, hardware (TPM)")
struct HardwareKeyTests {
    let message = Data("a challenge to sign inside the TPM".utf8)

    func hardwareStore(_ fixture: KeyFixture, device: String? = nil) throws -> SoftwareKeyStore {
        SoftwareKeyStore(vault: fixture.vault.vault, tpmDevice: try device ?? TestTPM.shared())
    }

    func hardwareSpecification(_ purposes: KeyPurposes = [.sign, .verify]) -> KeySpecification {
        var specification = KeySpecification(algorithm: .p256, purposes: purposes)
        specification.token = .secureEnclave
        specification.applicationTag = Data("com.example.tpm".utf8)
        return specification
    }

    @Test func availability_saysYesWithTheTPMAndWhyNotWithout() throws {
        let yes = SoftwareKeyStore.hardwareAvailability(device: try TestTPM.shared())
        #expect(yes.isAvailable, "swtpm did not answer: \(yes.reason)")
        let no = SoftwareKeyStore.hardwareAvailability(device: "device:/nonexistent/tpmrm9")
        #expect(!no.isAvailable)
        #expect(no.reason.contains("/nonexistent/tpmrm9 does not exist"))
        let unreachable = SoftwareKeyStore.hardwareAvailability(device: "swtpm:path=/nonexistent/socket")
        #expect(!unreachable.isAvailable)
        #expect(unreachable.reason.contains("cannot be reached"))
    }

    @Test func withoutATPM_askingForHardwareFailsAndStoresNothing() throws {
        let fixture = try KeyFixture()
        let keys = try hardwareStore(fixture, device: "device:/nonexistent/tpmrm9")
        #expect(status { _ = try keys.generate(hardwareSpecification()) } == LockboxError.Code.notAvailable.rawValue)
        #expect(try keys.keys().isEmpty, "no software key may stand in for the hardware one")
    }

    @Test func hardwareKey_signsAndOpenSSLVerifies() throws {
        let fixture = try KeyFixture()
        let keys = try hardwareStore(fixture)
        let key = try keys.generate(hardwareSpecification())
        #expect(key.token == .hardware)
        #expect(!key.isExtractable)
        let signature = try key.sign(message)
        #expect(try key.isValidSignature(signature, for: message))
        #expect(try !key.isValidSignature(signature, for: message + Data([1])))
        let publicKey = try #require(key.publicKey)
        let pem = try fixture.write(Array(publicKey.pemRepresentation.utf8), to: "tpm.pem")
        let messageFile = try fixture.write(message, to: "message")
        let signatureFile = try fixture.write(signature, to: "signature.der")
        let verified = try peer("openssl", ["dgst", "-sha256", "-verify", pem, "-signature", signatureFile, messageFile])
        #expect(verified.standardOutput.contains("Verified OK"))

        // Listed again, from another handle on the vault, it is still the hardware key.
        let again = try #require(try keys.keys(applicationTag: Data("com.example.tpm".utf8)).first)
        #expect(again.token == .hardware)
        #expect(try again.publicKey!.isValidSignature(try again.sign(message), for: message))
    }

    @Test func copiedVault_yieldsNothingUsableWithAnotherTPM() throws {
        let fixture = try KeyFixture()
        let key = try hardwareStore(fixture).generate(hardwareSpecification())
        // The stored value is the TPM's wrapped blob, not a P-256 scalar: nothing OpenSSL or
        // Lockbox's software path could sign with.
        let stored = try fixture.storedValue(of: key)
        #expect(stored.count > 97)
        // Another machine: the same vault file with another TPM.
        let otherMachine = try PrivateTPM()
        let elsewhere = SoftwareKeyStore(vault: fixture.vault.vault, tpmDevice: otherMachine.device)
        let copy = try #require(try elsewhere.keys().first)
        #expect(status { _ = try copy.sign(message) } == LockboxError.Code.invalidKeyRef.rawValue)
        // Still usable at home: nothing was changed by the refusal.
        #expect(try key.isValidSignature(try key.sign(message), for: message))
    }

    @Test func tpmThatDisappears_givesNotAvailableAndChangesNothing() throws {
        let tpm = try PrivateTPM()
        let fixture = try KeyFixture()
        let keys = try hardwareStore(fixture, device: tpm.device)
        let key = try keys.generate(hardwareSpecification())
        _ = try key.sign(message)
        tpm.kill()
        let error = try #require(throws: LockboxError.self) { try key.sign(message) }
        #expect(error.code == .notAvailable)
        #expect(error.message.contains("stopped answering") || error.message.contains("cannot be reached"))
        #expect(status { _ = try keys.generate(hardwareSpecification()) } == LockboxError.Code.notAvailable.rawValue)
        #expect(try keys.keys().count == 1, "the key is still stored, and no other was made")
        #expect(!SoftwareKeyStore.hardwareAvailability(device: tpm.device).isAvailable)
    }

    @Test func hardwareKey_refusesWhatTheTPMCannotHold() throws {
        let fixture = try KeyFixture()
        let keys = try hardwareStore(fixture)
        var ed25519 = hardwareSpecification()
        ed25519.algorithm = .ed25519
        #expect(status { _ = try keys.generate(ed25519) } == LockboxError.Code.param.rawValue)
        #expect(status { _ = try keys.generate(hardwareSpecification([.sign, .keyAgreement])) } == LockboxError.Code.param.rawValue)
        var extractable = hardwareSpecification()
        extractable.isExtractable = true
        #expect(status { _ = try keys.generate(extractable) } == LockboxError.Code.param.rawValue)
        #expect(try keys.keys().isEmpty)
        // A verify-only hardware key cannot sign.
        let verifier = try keys.generate(hardwareSpecification([.verify]))
        #expect(status { _ = try verifier.sign(message) } == LockboxError.Code.keyUsageIncorrect.rawValue)
    }

    @Test func lockedVault_refusesTheHardwareKey() throws {
        let fixture = try KeyFixture()
        let key = try hardwareStore(fixture).generate(hardwareSpecification())
        fixture.vault.vault.lock()
        #expect(status { _ = try key.sign(message) } == LockboxError.Code.interactionNotAllowed.rawValue)
        try fixture.vault.vault.unlock(passphrase: fixture.vault.passphrase)
        #expect(try key.isValidSignature(try key.sign(message), for: message))
    }
}
