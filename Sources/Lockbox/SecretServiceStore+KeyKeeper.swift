import LockboxVault
import SecretService

/// The desktop keyring keeps a vault slot key: the vault then opens with the login session
/// (like a LUKS key slot held by the login keyring). The Secret Service backend knows nothing
/// of vaults: this adapter gives its schema secrets that meaning.
extension SecretServiceStore: ExternalKeyKeeper {
    /// The `xdg:schema` of vault key items; not a Keychain item class, so the ItemStore calls
    /// never return them.
    static let vaultKeySchemaName = "io.lockbox.VaultKey"
    /// The attribute naming the vault a key belongs to.
    static let vaultIdentifierAttributeName = "lockbox-vault-id"
    /// The length of a vault key.
    static let vaultKeyByteCount = 32

    /// `secret-service`, as recorded in the vault header.
    public var slotKind: String { "secret-service" }

    /// Stores `key` as the key slot of vault `vaultIdentifier`, replacing any previous one.
    /// - Throws: `param` unless `key` is 32 bytes; `interactionNotAllowed` when the keyring is
    ///   locked; `notAvailable` without a Secret Service.
    public func storeSlotKey(_ key: SecretBytes, vaultIdentifier: String) throws(LockboxError) {
        guard key.count == Self.vaultKeyByteCount else {
            throw LockboxError(.param, "A vault key is \(Self.vaultKeyByteCount) bytes long.")
        }
        try storeSchemaSecret(
            key, schema: Self.vaultKeySchemaName, attributes: [Self.vaultIdentifierAttributeName: vaultIdentifier],
            label: "Lockbox vault key (\(vaultIdentifier))", operation: "store the vault key")
    }

    /// The key slot of vault `vaultIdentifier`.
    /// - Throws: `itemNotFound` when there is none; `decode` when the stored value is not a
    ///   vault key; `interactionNotAllowed` when the keyring is locked.
    public func slotKey(vaultIdentifier: String) throws(LockboxError) -> SecretBytes {
        guard
            let key = try schemaSecret(
                schema: Self.vaultKeySchemaName, attributes: [Self.vaultIdentifierAttributeName: vaultIdentifier],
                operation: "read the vault key")
        else {
            throw LockboxError(.itemNotFound, "The desktop keyring holds no key for this vault.")
        }
        guard key.count == Self.vaultKeyByteCount else {
            throw LockboxError.integrity("The vault key in the desktop keyring")
        }
        return key
    }

    /// Removes the key slot of vault `vaultIdentifier`.
    /// - Throws: `itemNotFound` when there is none.
    public func deleteSlotKey(vaultIdentifier: String) throws(LockboxError) {
        let deleted = try deleteSchemaSecrets(
            schema: Self.vaultKeySchemaName, attributes: [Self.vaultIdentifierAttributeName: vaultIdentifier],
            operation: "delete the vault key")
        guard deleted > 0 else {
            throw LockboxError(.itemNotFound, "The desktop keyring holds no key for this vault.")
        }
    }
}

// The earlier names, from when the backend kept vault keys itself.
extension SecretServiceStore {
    /// The attribute naming the vault a key belongs to.
    @available(*, deprecated, message: "Vault keys belong to the facade's key keeper; use storeSlotKey/slotKey/deleteSlotKey.")
    public static var vaultIdentifierAttribute: String { vaultIdentifierAttributeName }
    /// The length of a vault key.
    @available(*, deprecated, message: "Vault keys belong to the facade's key keeper; use storeSlotKey/slotKey/deleteSlotKey.")
    public static var vaultKeyLength: Int { vaultKeyByteCount }

    /// Stores `key` as the key slot of vault `vaultIdentifier`.
    @available(*, deprecated, renamed: "storeSlotKey(_:vaultIdentifier:)")
    public func storeVaultKey(_ key: SecretBytes, vaultIdentifier: String) throws(LockboxError) {
        try storeSlotKey(key, vaultIdentifier: vaultIdentifier)
    }

    /// The key slot of vault `vaultIdentifier`.
    @available(*, deprecated, renamed: "slotKey(vaultIdentifier:)")
    public func vaultKey(vaultIdentifier: String) throws(LockboxError) -> SecretBytes {
        try slotKey(vaultIdentifier: vaultIdentifier)
    }

    /// Removes the key slot of vault `vaultIdentifier`.
    @available(*, deprecated, renamed: "deleteSlotKey(vaultIdentifier:)")
    public func deleteVaultKey(vaultIdentifier: String) throws(LockboxError) {
        try deleteSlotKey(vaultIdentifier: vaultIdentifier)
    }
}
