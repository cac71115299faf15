import FoundationEssentials
import LockboxCore
import Synchronization
import VaultCrypto

/// The vault's side of managed keys (LockboxKeys): the one rule it enforces for them, and the
/// two entry points the key API uses. Everything else about keys lives in LockboxKeys.
///
/// A managed key's value starts with `magic || version || flags`. When the flags say
/// non-extractable (or the version is unknown), the value is refused to every reader but the
/// key API: `items(matching:)` with `.data` throws `errSecDataNotAvailable` (-25316), and
/// backups leave the item out. The flags sit inside the sealed value, so no attribute update
/// can clear them; replacing the value replaces the key.
package enum ManagedKeyValue {
    package static let magic: [UInt8] = Array("lockbox-key\u{0}".utf8)
    package static let version: UInt8 = 1
    /// Bit 0 of the flags byte.
    package static let nonExtractableFlag: UInt8 = 1
    /// Bit 2 of the flags: the key was made inside the TPM (its value is the TPM's wrapped blob).
    package static let hardwareFlag: UInt8 = 1 << 2

    /// Whether a key item's public description (its `kSecAttrGeneric`, LockboxKeys'
    /// `KeyDescriptor`: `"lbk1" | algorithm | purposes | flags | ...`) marks a hardware key.
    /// For listings only: the sealed value stays the authority.
    package static func isHardwareKey(descriptor: Data?) -> Bool {
        guard let descriptor, descriptor.count >= 8, descriptor.starts(with: Array("lbk1".utf8)) else { return false }
        return descriptor[descriptor.startIndex + 6] & hardwareFlag != 0
    }

    /// True for a managed key's value that must not leave as bytes.
    package static func isNonExtractable(_ value: SecretBytes) -> Bool {
        value.withUnsafeBytes { bytes in
            guard bytes.count >= magic.count + 2, bytes.starts(with: magic) else { return false }
            let version = bytes[magic.count]
            let flags = bytes[magic.count + 1]
            // A version this code does not know is refused rather than guessed at.
            return version != Self.version || flags & nonExtractableFlag != 0
        }
    }

    static let refusal = LockboxError(
        .dataNotAvailable,
        "This is a non-extractable key: its private bytes never leave the keychain. "
            + "Use it through the key API (LockboxKeys) to sign, decrypt or agree on a secret.")
}

extension Vault {
    /// The matching items with their values, non-extractable keys included: the key API's
    /// path to a key's private bytes, which it uses and never returns.
    package func keyMaterial(matching query: Query) throws(LockboxError) -> [Item] {
        try items(matching: query, releasingKeyMaterial: true)
    }

    /// A key bound to the current passphrase: derived from the master key (which
    /// `changePassphrase` replaces) and the presence key (which `removePassphrase` deletes and
    /// `setPassphrase` makes anew). A managed key marked to be invalidated by a passphrase
    /// change seals its private bytes with it.
    /// - Returns: nil when the keychain has no passphrase.
    /// - Throws: `interactionNotAllowed` when the keychain is locked.
    package func passphraseBindingKey() throws(LockboxError) -> SecretBytes? {
        try withState { state throws(LockboxError) -> SecretBytes? in
            guard let master = try state.keys.currentMaster() else { throw lockedError() }
            guard let presence = state.header.presencePublicKey, state.header.hasPassphrase else { return nil }
            let derived = Crypto.deriveKey(from: master, context: "keybind1", identifier: 1)
            return Crypto.combine(derived, with: SecretBytes(copying: presence), context: "lockbox managed-key passphrase binding")
        }
    }
}

/// What a managed key opened earlier was opened under: equal stamps mean that no other
/// connection wrote to the file since, that this handle wrote no managed key's row and not the
/// header (its writes of other items, such as a refresh storing its rotated token, do not
/// count), and that the vault stayed unlocked. The key API keeps using an opened key while the
/// stamp stays the same, and checks the key's row (``Vault/version(ofItem:)``) when it moved.
package struct KeyUseStamp: Equatable, Sendable {
    let dataVersion: Int
    /// This connection's row changes, less those of writes that spared every key row.
    let changesAffectingKeys: Int
    let lockCount: Int

    /// The vault was not locked between the two stamps (this handle's lock count is the same;
    /// a lock by another process drops opened keys through the kernel keyring check).
    package func sameUnlock(as other: KeyUseStamp) -> Bool { lockCount == other.lockCount }
}

extension Vault {
    /// The current stamp; nil when the vault is locked (then no opened key may be used). Checks
    /// the lock as every read does (the kernel keyring entry, the idle timeout).
    package func keyUseStamp() throws(LockboxError) -> KeyUseStamp? {
        try withState { state throws(LockboxError) -> KeyUseStamp? in
            guard try state.keys.currentMaster() != nil else { return nil }
            return KeyUseStamp(
                dataVersion: try state.database.dataVersion, changesAffectingKeys: state.database.totalChanges - state.changesSparingKeys,
                lockCount: state.lockCount)
        }
    }
}

extension Vault {
    /// The write generation that wrote the item `reference` names, checked against the
    /// integrity record; nil when there is no such row. A key opened from the row at this
    /// version is still the key the file holds: the key API uses it to keep an opened key
    /// across writes to other items (a refresh storing its tokens, say) instead of reading and
    /// unsealing it again. An update, a deletion or a passphrase change (which reseals every
    /// row) changes or removes the row's version; a header change (a passphrase removed or set,
    /// which invalidates keys bound to it without rewriting their rows) changes the header's.
    package func version(ofItem reference: Data) throws(LockboxError) -> ItemVersion? {
        try withState { state throws(LockboxError) -> ItemVersion? in
            try state.database.readTransaction { () throws(LockboxError) -> ItemVersion? in
                _ = try currentIntegrity(state)
                let statement = try state.database.statement(
                    "SELECT \(SealedRow.columns(metadata: false, secret: false)) FROM items WHERE id = ?")
                statement.bind(1, Array(reference))
                guard try statement.step() else { return nil }
                let row = try SealedRow.read(from: statement)
                // A row out of its bucket is for the full read to report.
                guard row.isInItsBucket else { return nil }
                try verifyBuckets([row.bucket], state: state)
                return ItemVersion(row: row.version, header: state.header.mac)
            }
        }
    }
}

/// A row's write generation and the header it was read under (its MAC, which any change of the
/// header changes): equal values mean the item and the keys that open it are as they were.
package struct ItemVersion: Equatable, Sendable {
    let row: Int
    let header: [UInt8]
}

/// Whoever keeps something opened under the vault's keys, told when the vault is locked here.
package final class LockObservers: Sendable {
    private let observers = Mutex<[ObjectIdentifier: @Sendable () -> Void]>([:])

    package func add(_ owner: AnyObject, _ body: @escaping @Sendable () -> Void) {
        observers.withLock { $0[ObjectIdentifier(owner)] = body }
    }

    package func remove(_ owner: AnyObject) {
        _ = observers.withLock { $0.removeValue(forKey: ObjectIdentifier(owner)) }
    }

    func notify() {
        for body in observers.withLock({ Array($0.values) }) { body() }
    }
}
