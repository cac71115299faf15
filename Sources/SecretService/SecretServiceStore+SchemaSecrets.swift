import LockboxCore

/// Secrets of a schema of the caller's own, outside the Keychain item classes (so the
/// `ItemStore` calls never return them): one secret per set of attributes. The backend gives
/// them no meaning; the facade keeps the vault's key slot this way.
extension SecretServiceStore {
    /// Stores `secret` under `attributes` in schema `schema`, replacing any earlier one.
    /// - Parameters:
    ///   - operation: what the caller is doing, for error messages ("store the vault key").
    /// - Throws: `interactionNotAllowed` when the keyring is locked; `notAvailable` without a
    ///   Secret Service.
    package func storeSchemaSecret(
        _ secret: SecretBytes, schema: String, attributes: [String: String], label: String, operation: String
    ) throws(LockboxError) {
        let attributes = Self.schemaAttributes(schema, attributes)
        try withCollection(operation) { collection, cancellation throws(LockboxError) in
            try self.ensureUnlocked(collection, cancellation)
            _ = try Self.translate(operation) { () throws(GLibFailure) in
                try collection.createItem(attributes: attributes, label: label, secret: secret, replacing: true, cancellable: cancellation)
            }
        }
    }

    /// The secret stored under `attributes` in schema `schema`; nil when there is none.
    /// - Throws: `interactionNotAllowed` when the keyring is locked (never nil for a locked
    ///   keyring); `decode` when the item is there but gives no secret.
    package func schemaSecret(schema: String, attributes: [String: String], operation: String) throws(LockboxError) -> SecretBytes? {
        let attributes = Self.schemaAttributes(schema, attributes)
        return try withCollection(operation) { collection, cancellation throws(LockboxError) in
            let found = try Self.translate(operation) { () throws(GLibFailure) in
                try collection.search(attributes, cancellable: cancellation)
            }
            guard let item = found.first else {
                // Nothing found in a locked collection is "locked", never "not found".
                try self.ensureUnlocked(collection, cancellation)
                return nil
            }
            let secrets = try Self.translate(operation) { () throws(GLibFailure) in
                try collection.secrets(ofItems: [item], cancellable: cancellation)
            }
            // An item that is there but gives no secret is damaged, not absent.
            guard let secret = secrets[item] else { throw LockboxError.integrity("A secret in the desktop keyring") }
            return secret
        }
    }

    /// Removes every secret stored under `attributes` in schema `schema`; returns how many.
    package func deleteSchemaSecrets(schema: String, attributes: [String: String], operation: String) throws(LockboxError) -> Int {
        let attributes = Self.schemaAttributes(schema, attributes)
        return try withCollection(operation) { collection, cancellation throws(LockboxError) in
            try self.ensureUnlocked(collection, cancellation)
            let found = try Self.translate(operation) { () throws(GLibFailure) in
                try collection.search(attributes, cancellable: cancellation)
            }
            for item in found {
                try Self.translate(operation) { () throws(GLibFailure) in
                    try collection.deleteItem(item, cancellable: cancellation)
                }
            }
            return found.count
        }
    }

    private static func schemaAttributes(_ schema: String, _ attributes: [String: String]) -> [String: String] {
        attributes.merging(["xdg:schema": schema]) { _, schema in schema }
    }
}
