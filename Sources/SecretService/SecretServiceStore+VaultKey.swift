import LockboxCore

/// The vault's key slot in the desktop keyring: a 32-byte key stored under the vault's id,
/// so that a vault opens with the desktop session (like a LUKS key slot held by the login
/// keyring).
extension SecretServiceStore {
    /// The `xdg:schema` of vault key items; not a Keychain item class, so the ItemStore calls
    /// never return them.
    static let vaultKeySchemaName = "io.lockbox.VaultKey"
    /// The attribute naming the vault a key belongs to.
    public static let vaultIdentifierAttribute = "lockbox-vault-id"
    /// The length of a vault key.
    public static let vaultKeyLength = 32

    /// Stores `key` as the key slot of vault `vaultIdentifier`, replacing any previous one.
    /// - Throws: `param` unless `key` is ``vaultKeyLength`` bytes; `interactionNotAllowed` when
    ///   the keyring is locked; `notAvailable` without a Secret Service.
    public func storeVaultKey(_ key: SecretBytes, vaultIdentifier: String) throws(LockboxError) {
        guard key.count == Self.vaultKeyLength else {
            throw LockboxError(.param, "A vault key is \(Self.vaultKeyLength) bytes long.")
        }
        let attributes = Self.vaultKeyAttributes(vaultIdentifier)
        try withCollection("store the vault key") { collection, cancellation throws(LockboxError) in
            try self.ensureUnlocked(collection, cancellation)
            _ = try Self.translate("store the vault key") { () throws(GLibFailure) in
                try collection.createItem(
                    attributes: attributes, label: "Lockbox vault key (\(vaultIdentifier))",
                    secret: key, replacing: true, cancellable: cancellation)
            }
        }
    }

    /// The key slot of vault `vaultIdentifier`.
    /// - Throws: `itemNotFound` when there is none; `decode` when the stored value is not a
    ///   vault key; `interactionNotAllowed` when the keyring is locked.
    public func vaultKey(vaultIdentifier: String) throws(LockboxError) -> SecretBytes {
        let attributes = Self.vaultKeyAttributes(vaultIdentifier)
        return try withCollection("read the vault key") { collection, cancellation throws(LockboxError) in
            let found = try Self.translate("read the vault key") { () throws(GLibFailure) in
                try collection.search(attributes, cancellable: cancellation)
            }
            guard let item = found.first else {
                try self.ensureUnlocked(collection, cancellation)
                throw LockboxError(.itemNotFound, "The desktop keyring holds no key for this vault.")
            }
            let secrets = try Self.translate("read the vault key") { () throws(GLibFailure) in
                try collection.secrets(ofItems: [item], cancellable: cancellation)
            }
            guard let key = secrets[item], key.count == Self.vaultKeyLength else {
                throw LockboxError.integrity("The vault key in the desktop keyring")
            }
            return key
        }
    }

    /// Removes the key slot of vault `vaultIdentifier`.
    /// - Throws: `itemNotFound` when there is none.
    public func deleteVaultKey(vaultIdentifier: String) throws(LockboxError) {
        let attributes = Self.vaultKeyAttributes(vaultIdentifier)
        try withCollection("delete the vault key") { collection, cancellation throws(LockboxError) in
            try self.ensureUnlocked(collection, cancellation)
            let found = try Self.translate("delete the vault key") { () throws(GLibFailure) in
                try collection.search(attributes, cancellable: cancellation)
            }
            guard !found.isEmpty else {
                throw LockboxError(.itemNotFound, "The desktop keyring holds no key for this vault.")
            }
            for item in found {
                try Self.translate("delete the vault key") { () throws(GLibFailure) in
                    try collection.deleteItem(item, cancellable: cancellation)
                }
            }
        }
    }

    private static func vaultKeyAttributes(_ vaultIdentifier: String) -> [String: String] {
        ["xdg:schema": vaultKeySchemaName, vaultIdentifierAttribute: vaultIdentifier]
    }
}
