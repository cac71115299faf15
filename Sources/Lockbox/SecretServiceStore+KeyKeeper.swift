import LockboxVault
import SecretService

/// The desktop keyring keeps a vault slot key: the vault then opens with the login session.
extension SecretServiceStore: ExternalKeyKeeper {
    public var slotKind: String { "secret-service" }

    public func storeSlotKey(_ key: SecretBytes, vaultIdentifier: String) throws(LockboxError) {
        try storeVaultKey(key, vaultIdentifier: vaultIdentifier)
    }

    public func slotKey(vaultIdentifier: String) throws(LockboxError) -> SecretBytes {
        try vaultKey(vaultIdentifier: vaultIdentifier)
    }

    public func deleteSlotKey(vaultIdentifier: String) throws(LockboxError) {
        try deleteVaultKey(vaultIdentifier: vaultIdentifier)
    }
}
