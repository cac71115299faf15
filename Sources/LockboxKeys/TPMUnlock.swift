import LockboxCore
import LockboxVault
import TPMAccess

/// The vault's TPM unlock slot: a random slot key sealed by the machine's TPM 2.0, optionally
/// to the current values of some PCRs, kept in the vault's header. A service then unlocks at
/// boot with no passphrase and no desktop session, as `systemd-cryptenroll --tpm2-device`
/// lets a disk open; a copy of the vault opens nowhere else (another TPM cannot unseal), and
/// with PCRs bound, not after the boot chain changes.
///
/// ```swift
/// try vault.enroll(sealing: TPMUnlockSlot(pcrs: [7]))   // once, unlocked, with the passphrase
/// try vault.unlock(sealing: TPMUnlockSlot())             // at boot, in the service
/// ```
public struct TPMUnlockSlot: SealingKeyKeeper {
    public let slotKind = "tpm2"
    /// The SHA-256 PCRs the slot key is sealed to when enrolled (7: Secure Boot state; 0-7
    /// firmware and boot loader). Empty: the TPM alone. Unlocking reads the PCR list from the
    /// sealed blob, so it needs none.
    public var pcrs: [Int]
    let tpm: TPM

    /// - Parameter device: the TPM's TCTI configuration; nil is `LOCKBOX_TPM_TCTI`, else
    ///   `device:/dev/tpmrm0`.
    public init(device: String? = nil, pcrs: [Int] = []) {
        tpm = TPM.at(device)
        self.pcrs = pcrs
    }

    public func seal(_ key: SecretBytes) throws(LockboxError) -> [UInt8] {
        let (available, reason) = tpm.availability()
        guard available else { throw LockboxError(.notAvailable, "The TPM unlock method needs a TPM: \(reason)") }
        return try tpm.seal(key, pcrs: pcrs)
    }

    public func unseal(_ sealed: [UInt8]) throws(LockboxError) -> SecretBytes {
        try tpm.unseal(sealed)
    }
}
