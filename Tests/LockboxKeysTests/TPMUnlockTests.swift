import Foundation
import LockboxCore
import LockboxKeys
import LockboxTestSupport
import LockboxVault
import TPMAccess
import Testing

/// The vault's TPM unlock slot: no passphrase where the TPM unseals, nothing anywhere else.
@Suite("vault TPM unlock slot")
struct TPMUnlockTests {
    @Test func enrolledSlot_unlocksWithoutPassphrase_andOnlyWithThatTPM() throws {
        let fixture = try VaultFixture { $0.unlockCache = .processMemory }
        let device = try TestTPM.shared()
        try fixture.vault.add(Item(.genericPassword, attributes: ItemAttributes(service: "svc", account: "a"), data: SecretBytes(utf8: "v")))
        #expect(status { try fixture.vault.unlock(sealing: TPMUnlockSlot(device: device)) } == LockboxError.Code.notAvailable.rawValue)
        try fixture.vault.enroll(sealing: TPMUnlockSlot(device: device))
        #expect(fixture.vault.enrolledKeepers == ["tpm2"])
        fixture.vault.lock()
        #expect(try !fixture.vault.isUnlocked)
        try fixture.vault.unlock(sealing: TPMUnlockSlot(device: device))
        #expect(try fixture.vault.isUnlocked)

        // A copy of the file on a machine with another TPM does not open.
        fixture.vault.lock()
        let other = try PrivateTPM()
        let error = try #require(throws: LockboxError.self) { try fixture.vault.unlock(sealing: TPMUnlockSlot(device: other.device)) }
        #expect(error.code == .authFailed, "\(error.message)")
        #expect(try !fixture.vault.isUnlocked)

        // Removing it leaves the passphrase; the passphrase change also drops the slot.
        try fixture.vault.unlock(passphrase: fixture.passphrase)
        try fixture.vault.unenroll(sealingKind: "tpm2")
        #expect(status { try fixture.vault.unenroll(sealingKind: "tpm2") } == LockboxError.Code.itemNotFound.rawValue)
        try fixture.vault.enroll(sealing: TPMUnlockSlot(device: device))
        let change = try fixture.vault.changePassphrase(from: fixture.passphrase, to: SecretBytes(utf8: "another passphrase"))
        #expect(change.removedUnlockMethods == ["tpm2"])
        #expect(fixture.vault.enrolledKeepers.isEmpty)
    }

    @Test func pcrBoundSlot_refusesOnceThePCRChanges() throws {
        let fixture = try VaultFixture { $0.unlockCache = .processMemory }
        let tpm = try PrivateTPM()
        // PCR 16 is the debug PCR: anyone may extend it, as a changed boot chain would change 7.
        try fixture.vault.enroll(sealing: TPMUnlockSlot(device: tpm.device, pcrs: [16]))
        fixture.vault.lock()
        try fixture.vault.unlock(sealing: TPMUnlockSlot(device: tpm.device))
        fixture.vault.lock()
        try TPMTestAccess.extendPCR(16, device: tpm.device)
        let error = try #require(throws: LockboxError.self) { try fixture.vault.unlock(sealing: TPMUnlockSlot(device: tpm.device)) }
        #expect(error.code == .authFailed)
        #expect(error.message.contains("PCRs 16"))
        // The passphrase still opens it; nothing was lost.
        try fixture.vault.unlock(passphrase: fixture.passphrase)
        #expect(fixture.vault.enrolledKeepers == ["tpm2"])
    }

    @Test func tpmGone_unlockSaysNotAvailable() throws {
        let fixture = try VaultFixture { $0.unlockCache = .processMemory }
        let tpm = try PrivateTPM()
        try fixture.vault.enroll(sealing: TPMUnlockSlot(device: tpm.device))
        fixture.vault.lock()
        tpm.kill()
        #expect(status { try fixture.vault.unlock(sealing: TPMUnlockSlot(device: tpm.device)) } == LockboxError.Code.notAvailable.rawValue)
        try fixture.vault.unlock(passphrase: fixture.passphrase)
        #expect(fixture.vault.enrolledKeepers == ["tpm2"])
    }
}

/// The TPM's own operations the tests need (a PCR to change).
enum TPMTestAccess {
    static func extendPCR(_ index: Int, device: String) throws {
        try TPM.at(device).extendPCR(index, digest: [UInt8](repeating: 0x5a, count: 32))
    }
}
