import FoundationEssentials
import LockboxCore
import LockboxVault
import Synchronization
import VaultCrypto

/// A vault's membership of a sync group: synchronizable items, end-to-end encrypted, through a
/// PostgreSQL database (docs/SYNC.md).
///
/// ```swift
/// let group = try SyncGroup.create(vault: vault, database: "host=db.example dbname=lockbox", passphrase: groupPassphrase)
/// // on another machine:
/// let member = try SyncGroup.join(group.groupID, vault: otherVault, database: conninfo, passphrase: groupPassphrase)
/// try member.sync()
/// ```
///
/// Synced: items with `synchronizable = true` whose accessibility has no `ThisDeviceOnly`, of
/// the password and certificate classes, without access control. The database sees opaque
/// item identifiers, versions, device identifiers and ciphertext.
///
/// Conflicts: the later modification wins (the writer's clock, in milliseconds, and never
/// earlier than the version the writer had seen); equal times go to the greater device
/// identifier. A delete is such a write (a tombstone): it wins over older edits, so a device
/// that edited offline before the delete does not bring the item back.
public final class SyncGroup: Sendable {
    /// The group's public identifier (hex).
    public let groupID: String
    /// The vault whose synchronizable items this group syncs.
    public let vault: Vault
    let database: String
    /// This vault's identity in the group (see ``DeviceSecret``).
    let device: DeviceSecret
    /// The group's keys at the newest epoch this device holds.
    private let current: Mutex<SyncKeys>
    /// Where this vault keeps what it knows of the group (see ``SyncState``).
    public let statePath: String
    /// One sync at a time through this value (the state is read, then rewritten).
    let syncing = Mutex(())
    /// Where the last pull spent its time (lockbox-sync-bench prints it).
    package let lastPullTimings = Mutex(PullTimings())
    /// The device this keychain was in the group before it joined again as a new device (its
    /// device key gone: the keychain made anew at the same path, or the key deleted), as the
    /// local state it left said; nil when it was none, or the state did not say. Its row stays
    /// listed in the group until a device of the group removes it.
    public let replacedDevice: String?
    /// Called once the rows a pull adds are listed in the state, before the vault commits them
    /// (what it throws rolls the vault's transaction back): the tests copy the state there, as
    /// a process stopped after the vault's commit leaves it, or stop the commit.
    let afterListingAdded = Mutex<(@Sendable () throws(LockboxError) -> Void)?>(nil)
    /// Called before a push applies here the records that won over its changes: the tests
    /// change the vault there, as another process may between the push's read and that apply.
    let beforeApplyingSuperseding = Mutex<(@Sendable () throws(LockboxError) -> Void)?>(nil)

    var keys: SyncKeys { current.withLock { $0 } }
    /// This device's identifier in the group (random, public).
    public var deviceID: String { device.id }
    /// The key epoch this device holds: 0 at creation, one more at each device removal.
    public var keyEpoch: Int64 { keys.epoch }

    /// What one ``sync()`` did.
    public struct Report: Sendable, Equatable {
        /// Records this device wrote (edits and tombstones); a record the database already held
        /// is not counted.
        public var pushed = 0
        /// Records of other devices applied here (including deletes).
        public var pulled = 0
        /// Local edits that lost to a later write of another device (that write was applied).
        public var superseded = 0

        /// Vault rows the push read to find changes: the rows written since the last push, not
        /// every synchronizable item (rows a pull added are read once, by the next push).
        public var examined = 0

        /// A report of nothing done.
        public init() {}

        /// True when this sync wrote nothing to the database or the vault.
        public var changedNothing: Bool { pushed == 0 && pulled == 0 && superseded == 0 }
    }

    static let keyService = "lockbox.sync.group-key"
    static let deviceService = "lockbox.sync.device"
    static let keyAccessGroup = "lockbox.sync"

    init(groupID: String, vault: Vault, database: String, keys: SyncKeys, device: DeviceSecret, replacedDevice: String? = nil) {
        self.groupID = groupID
        self.vault = vault
        self.database = database
        self.device = device
        self.replacedDevice = replacedDevice
        current = Mutex(keys)
        statePath = SyncState.path(vault: vault.path, groupID: groupID)
    }

    func install(_ keys: SyncKeys) throws(LockboxError) {
        try Self.storeGroupKeys(keys, groupID: groupID, in: vault)
        current.withLock { $0 = keys }
    }

    // MARK: Creating, joining, opening

    /// Creates a group (this vault is its first device): random group keys, kept in this vault
    /// as a `ThisDeviceOnly` item. With `passphrase`, the database also holds them sealed by a
    /// key derived from it (Argon2id), for other devices to join with; without, devices join
    /// only with a pairing code (``pairingCode(validFor:)``).
    public static func create(vault: Vault, database: String, passphrase: SecretBytes? = nil) throws(LockboxError) -> SyncGroup {
        try requireUnlocked(vault, "Unlock it to create a sync group.")
        try requireWholeKeychain(vault)
        if let passphrase { try checkNewPassphrase(passphrase) }
        let connection = try PostgresConnection(database)
        try SyncSchema.migrate(connection, creating: true)
        let groupID = Crypto.randomBytes(16).hexString
        let keys = SyncKeys.generate()
        let wrap = try passphrase.map { passphrase throws(LockboxError) in try wrapKeys(keys, groupID: groupID, purpose: "passphrase", secret: passphrase) }
        try connection.execute(
            "INSERT INTO lockbox_sync_groups (group_id, counter, key_wrap, key_epoch) VALUES ($1, 0, $2, 0)",
            [.text(groupID), wrap.map { .bytes($0) } ?? .null])
        return try enroll(groupID: groupID, vault: vault, database: database, keys: keys, connection: connection)
    }

    /// Joins an existing group with its passphrase; the group keys are then kept in this vault.
    /// - Throws: `authFailed` for a wrong passphrase (or a group that has none since a device
    ///   was removed); `itemNotFound` when there is no such group.
    public static func join(
        _ groupID: String, vault: Vault, database: String, passphrase: SecretBytes
    ) throws(LockboxError) -> SyncGroup {
        try checkGroupIdentifier(groupID)
        try requireUnlocked(vault, "Unlock it to join a sync group.")
        try requireWholeKeychain(vault)
        let connection = try PostgresConnection(database)
        try SyncSchema.migrate(connection)
        let rows = try connection.execute("SELECT key_wrap FROM lockbox_sync_groups WHERE group_id = $1", [.text(groupID)])
        guard let row = rows.first else { throw noSuchGroup(groupID) }
        guard row[0] != nil else {
            throw LockboxError(
                .authFailed, "The sync group \(groupID) has no passphrase (it was created without one, or a device was removed). Join it with a pairing code from one of its devices.")
        }
        let keys = try unwrapKeys(try PostgresConnection.bytes(row[0]), groupID: groupID, purpose: "passphrase", secret: passphrase)
        return try enroll(groupID: groupID, vault: vault, database: database, keys: keys, connection: connection)
    }

    /// Joins an existing group with a one-time pairing code that one of its devices showed
    /// (``pairingCode(validFor:)``). The code is used up by the attempt, right or wrong.
    /// - Throws: `authFailed` for a wrong, used or expired code.
    public static func join(
        _ groupID: String, vault: Vault, database: String, pairingCode: String
    ) throws(LockboxError) -> SyncGroup {
        try checkGroupIdentifier(groupID)
        let code = PairingCode.normalized(pairingCode)
        guard code.count == PairingCode.length else {
            throw LockboxError(.param, "A pairing code has \(PairingCode.length) letters and digits (dashes optional). Check the code shown on the other device.")
        }
        // Before the code is used up: a join that could not keep the keys would waste it.
        try requireUnlocked(vault, "Unlock it to join a sync group; the pairing code was not used.")
        try requireWholeKeychain(vault)
        let connection = try PostgresConnection(database)
        try SyncSchema.migrate(connection)
        guard try !connection.execute("SELECT 1 FROM lockbox_sync_groups WHERE group_id = $1", [.text(groupID)]).isEmpty else {
            throw noSuchGroup(groupID)
        }
        let invitation = String(code.prefix(PairingCode.invitationLength))
        // Taken and removed in one statement: a code serves one attempt only.
        let rows = try connection.execute(
            "DELETE FROM lockbox_sync_invitations WHERE group_id = $1 AND invitation_id = $2 RETURNING key_wrap, expires_at > now()",
            [.text(groupID), .text(invitation)])
        let refused = LockboxError(
            .authFailed, "The pairing code is wrong, already used or expired. Ask a device of the group for a new one (`lockbox sync invite`).")
        guard let row = rows.first, row[1] == "t" else { throw refused }
        let secret = SecretBytes(copying: Array(code.utf8))
        let keys: SyncKeys
        do {
            keys = try unwrapKeys(try PostgresConnection.bytes(row[0]), groupID: groupID, purpose: "invitation:" + invitation, secret: secret)
        } catch where error.code == .authFailed {
            throw refused
        }
        return try enroll(groupID: groupID, vault: vault, database: database, keys: keys, connection: connection)
    }

    static func noSuchGroup(_ groupID: String) -> LockboxError {
        LockboxError(
            .itemNotFound,
            "There is no sync group \(groupID) in that database. Check the group identifier (`lockbox sync status` shows it on a device of the group) and the connection string.")
    }

    /// Whether `text` has the form of a group identifier: 32 lowercase hexadecimal digits, as
    /// ``create(vault:database:passphrase:)`` makes them.
    public static func isGroupIdentifier(_ text: String) -> Bool { isLowercaseHex(text, digits: 32) }

    /// Whether `text` is `digits` lowercase hexadecimal digits (identifiers made by `hexString`).
    private static func isLowercaseHex(_ text: String, digits: Int) -> Bool {
        text.utf8.count == digits && text.utf8.allSatisfy { (UInt8(ascii: "0")...UInt8(ascii: "9")).contains($0) || (UInt8(ascii: "a")...UInt8(ascii: "f")).contains($0) }
    }

    /// Whether `text` has the form of a device identifier: 16 lowercase hexadecimal digits.
    static func isDeviceIdentifier(_ text: String) -> Bool { isLowercaseHex(text, digits: 16) }

    /// Refuses what is not a group identifier, without repeating it (it may be a secret typed
    /// in the wrong place).
    package static func checkGroupIdentifier(_ text: String) throws(LockboxError) {
        guard isGroupIdentifier(text) else {
            throw LockboxError(
                .param, "That is not a sync group identifier (32 hexadecimal digits, as `lockbox sync create` printed it); not shown, in case it is a secret.")
        }
    }

    /// The fewest characters other than spaces a new group passphrase may have. The database holds the group keys
    /// sealed under it (Argon2id), so whoever can read the database can guess at it offline.
    public static let minimumPassphraseLength = 12

    static func checkNewPassphrase(_ passphrase: SecretBytes) throws(LockboxError) {
        // Characters counted in place (no copy of the passphrase in a String): the UTF-8
        // bytes that start one, but not ASCII spaces, tabs or line breaks, since twelve spaces
        // are no passphrase.
        let characters = passphrase.withUnsafeBytes { bytes in
            bytes.count { $0 & 0xC0 != 0x80 && ![0x20, 0x09, 0x0A, 0x0B, 0x0C, 0x0D].contains($0) }
        }
        guard characters >= minimumPassphraseLength else {
            throw LockboxError(
                .param,
                "The group passphrase is too short: anyone who can read the sync database can guess at it offline. Choose one of at least \(minimumPassphraseLength) characters (a few words), or none and join devices with pairing codes.")
        }
    }

    /// Creating, joining and managing a group hand out or take in its keys: only while the user
    /// has the keychain unlocked, as the keychain's own secrets.
    package static func requireUnlocked(_ vault: Vault, _ hint: String) throws(LockboxError) {
        guard try vault.isUnlocked else { throw LockboxError.locked(hint) }
    }

    /// Sync reads and writes every synchronizable item of the keychain, of every access group:
    /// a handle that sees only some groups would take the others' changes for deletes, and could
    /// not apply their records. Refused, before anything is read or written.
    package static func requireWholeKeychain(_ vault: Vault) throws(LockboxError) {
        guard vault.configuration.accessGroups != nil else { return }
        throw LockboxError(
            .param,
            "Sync works on the whole keychain, every access group: open it without an access-group restriction "
                + "(Vault.Configuration.accessGroups nil) to sync it.")
    }

    /// A group this vault already belongs to, with its keys from the vault.
    /// - Throws: `itemNotFound` when this vault has not joined the group; `errSecParam` for a
    ///   handle restricted to some access groups (``requireWholeKeychain(_:)``).
    public convenience init(_ groupID: String, vault: Vault, database: String) throws(LockboxError) {
        try Self.requireWholeKeychain(vault)
        var query = Query.genericPassword(service: Self.keyService, account: groupID, accessGroup: Self.keyAccessGroup)
        query.returning = [.data, .attributes]
        let item: Item
        do {
            item = try vault.item(matching: query)
        } catch where error.code == .itemNotFound {
            throw LockboxError(.itemNotFound, "This keychain has not joined the sync group \(groupID). Join it with a pairing code or the group passphrase.")
        }
        guard let secrets = item.data, secrets.count == 2 * Crypto.keyByteCount, let generic = item.attributes.generic,
            let epoch = Int64(String(decoding: generic, as: UTF8.self))
        else { throw LockboxError.integrity("The sync group's key") }
        guard let device = try DeviceSecret.load(groupID: groupID, from: vault) else {
            throw LockboxError(
                .itemNotFound,
                "This keychain holds the sync group \(groupID)'s key but no device key for it (deleted). Join the group again "
                    + "(`lockbox sync join \(groupID)`) as a new device, then remove the old one from a device of the group.")
        }
        self.init(groupID: groupID, vault: vault, database: database, keys: SyncKeys(secrets: secrets, epoch: epoch), device: device)
    }

    /// The groups this vault belongs to (their identifiers).
    public static func groups(in vault: Vault) throws(LockboxError) -> [String] {
        var query = Query(.genericPassword, limit: .all, returning: [.attributes])
        query.attributes.service = keyService
        query.attributes.accessGroup = keyAccessGroup
        do {
            return try vault.items(matching: query).compactMap { $0.attributes.account }.sorted()
        } catch where error.code == .itemNotFound {
            return []
        }
    }

    /// Keeps the keys and a device identity in `vault`, and registers the device (its public key
    /// attested with the group key) in the database.
    static func enroll(
        groupID: String, vault: Vault, database: String, keys: SyncKeys, connection: PostgresConnection
    ) throws(LockboxError) -> SyncGroup {
        let device: DeviceSecret
        var replaced: String?
        if let existing = try DeviceSecret.load(groupID: groupID, from: vault) {
            device = existing
        } else {
            device = try DeviceSecret.create(groupID: groupID, in: vault)
            // A local state (or fleet marks) left at this keychain's path by an earlier device
            // of it in the group (the keychain made anew, or its device key deleted) is under a
            // key that is gone: it can be neither checked nor used, and would fail every sync as
            // damaged. Removed once the new device is made, so never while the earlier key is
            // only out of sight (a handle of another device identity, whose new key the vault
            // refuses as a duplicate of the earlier one's): a join that fails removes nothing.
            // Should the removal fail, the new key is taken back, so that the next join (the
            // cause fixed) removes them then.
            do throws(LockboxError) {
                replaced = try SyncState.removeStale(path: SyncState.path(vault: vault.path, groupID: groupID))
                try FleetMarks.removeStale(path: FleetMarks.path(vault: vault.path, groupID: groupID))
            } catch {
                try DeviceSecret.remove(groupID: groupID, from: vault)
                throw error
            }
        }
        try storeGroupKeys(keys, groupID: groupID, in: vault)
        let group = SyncGroup(groupID: groupID, vault: vault, database: database, keys: keys, device: device, replacedDevice: replaced)
        try group.register(connection)
        return group
    }

    /// Writes this device's row in the database: its public key, attested with the group key.
    func register(_ connection: PostgresConnection) throws(LockboxError) {
        try connection.execute(
            """
            INSERT INTO lockbox_sync_devices (group_id, device_id, pulled_version, public_key, attestation) VALUES ($1, $2, 0, $3, $4)
            ON CONFLICT (group_id, device_id) DO UPDATE SET public_key = excluded.public_key, attestation = excluded.attestation
            """,
            [.text(groupID), .text(device.id), .bytes(device.publicKey), .bytes(attestation(device.id, device.publicKey, keys: keys))])
    }

    /// Seals the group keys under a key derived from `secret` (a passphrase or a pairing code)
    /// with Argon2id.
    static func wrapKeys(_ keys: SyncKeys, groupID: String, purpose: String, secret: SecretBytes) throws(LockboxError) -> [UInt8] {
        let derivation = PassphraseKeyDerivation(strength: .interactive)
        guard let wrappingKey = try derivation.deriveKey(from: secret) else {
            throw LockboxError(.allocate, "Cannot allocate memory to derive the group key. Free some memory and try again.")
        }
        var wrap = FieldEncoder()
        wrap.bytes(derivation.encoded())
        wrap.integer(Int(keys.epoch))
        wrap.bytes(
            Crypto.seal(
                keys.secrets, key: wrappingKey,
                associatedData: keyWrapAssociatedData(groupID, derivation.encoded(), epoch: keys.epoch, purpose: purpose)))
        return wrap.bytes
    }

    static func unwrapKeys(_ wrap: [UInt8], groupID: String, purpose: String, secret: SecretBytes) throws(LockboxError) -> SyncKeys {
        var decoder = FieldDecoder(wrap)
        guard let parameters = try? decoder.bytes(), let epoch = try? decoder.integer(), let box = try? decoder.bytes(), decoder.isAtEnd,
            let derivation = PassphraseKeyDerivation(decoding: parameters), derivation.meetsMinimum
        else { throw LockboxError.syncDatabase("The sealed group key in the sync database") }
        guard let wrappingKey = try derivation.deriveKey(from: secret) else {
            throw LockboxError(.allocate, "Cannot allocate memory to derive the group key. Free some memory and try again.")
        }
        guard
            let secrets = try? Crypto.open(
                box, key: wrappingKey, associatedData: keyWrapAssociatedData(groupID, parameters, epoch: Int64(epoch), purpose: purpose)),
            secrets.count == 2 * Crypto.keyByteCount
        else {
            throw LockboxError(.authFailed, "The group passphrase is wrong. Enter the passphrase the group was created with.")
        }
        return SyncKeys(secrets: secrets, epoch: Int64(epoch))
    }

    static func keyWrapAssociatedData(_ groupID: String, _ parameters: [UInt8], epoch: Int64, purpose: String) -> [UInt8] {
        var encoder = FieldEncoder()
        encoder.string("lockbox.sync.group-key.v2")
        encoder.string(groupID)
        encoder.bytes(parameters)
        encoder.integer(Int(epoch))
        encoder.string(purpose)
        return encoder.bytes
    }

    /// The group keys as an item of this vault: sealed by its `afterFirstUnlockThisDeviceOnly`
    /// class key, so they never leave the machine (not in backups, not in a copied file), and
    /// never synchronized. The epoch is the item's `generic` attribute.
    static func storeGroupKeys(_ keys: SyncKeys, groupID: String, in vault: Vault) throws(LockboxError) {
        let epoch = Data(String(keys.epoch).utf8)
        var item = Item.genericPassword(
            service: keyService, account: groupID, data: keys.secrets, accessibility: .afterFirstUnlockThisDeviceOnly,
            accessGroup: keyAccessGroup, label: "Lockbox sync group key")
        item.attributes.generic = epoch
        do {
            try vault.add(item)
        } catch where error.code == .duplicateItem {
            let query = Query.genericPassword(service: keyService, account: groupID, accessGroup: keyAccessGroup)
            var attributes = item.attributes
            attributes.generic = epoch
            try vault.update(matching: query, to: ItemUpdate(attributes: attributes, data: keys.secrets))
        }
    }

    // MARK: Syncing

    /// One local item that may sync.
    struct LocalItem {
        var item: Item
        var digest: [UInt8]
    }

    /// Passwords, certificates and software keys, as iOS 14 and later sync.
    static let syncedClasses: [ItemClass] = [.genericPassword, .internetPassword, .certificate, .key]

    /// Pushes this vault's changes since the last sync, then pulls the other devices' (only
    /// records newer than this device's cursor). Finding the changes costs a pass over the
    /// vault's row identifiers plus reading the changed rows, not a read of every item. Each
    /// phase is one database transaction; a crash or a dropped connection at any point loses
    /// nothing and duplicates nothing: run it again.
    /// - Throws: `interactionNotAllowed` when the vault is locked (a locked item is never taken
    ///   for a deleted one); `notAvailable` when the database cannot be reached (the vault is
    ///   untouched); `decode` when the database served a record that fails to open, or one
    ///   older than this device has already seen (a replay); `authFailed` when this device was
    ///   removed from the group.
    @discardableResult
    public func sync() throws(LockboxError) -> Report {
        try Self.requireUnlocked(vault, "Unlock it to sync: locked items cannot be read, and are never taken for deleted ones.")
        return try session { connection, state throws(LockboxError) -> Report in
            var report = Report()
            let written = try push(connection, state: state, report: &report)
            try pull(connection, state: state, report: &report, floor: written)
            return report
        }
    }

    /// Runs `body` as one sync of this vault and group (across processes too, under the sync
    /// lock), with a connection whose schema and keys are current and the local state.
    func session<T>(_ body: (PostgresConnection, SyncState) throws(LockboxError) -> T) throws(LockboxError) -> T {
        try syncing.withLock { _ throws(LockboxError) -> T in
            let lock = try SyncLock(statePath: statePath)
            defer { withExtendedLifetime(lock) {} }
            let connection = try PostgresConnection(database)
            try SyncSchema.migrate(connection)
            try catchUpKeys(connection)
            let state = try SyncState(path: statePath, device: device.id, key: device.stateKey)
            try adoptApplying(state, connection: connection)
            return try body(connection, state)
        }
    }

    /// Lists `rows`, which the vault is about to add, in `state` (``SyncState/recordApplying(_:)``).
    func listAdding(_ rows: [Data: SyncState.Applying], in state: SyncState) throws(LockboxError) {
        guard !rows.isEmpty else { return }
        try state.recordApplying(rows)
        try afterListingAdded.withLock { $0 }?()
    }

    /// Settles the rows an earlier pull listed as being added (``SyncState/applying``) and whose
    /// process stopped before the state recorded them. A row the vault holds is the item's, as
    /// is one it deleted since (it has a deletion record): both are recorded with the entry of
    /// the record applied, so that the push compares the row with that record, and writes the
    /// delete of one deleted here (or made local: no longer synchronizable, or ThisDeviceOnly).
    /// (Without this, the pull would not know the item was ever here, and would bring it back.) A row the vault neither holds nor deleted was never
    /// committed: the pull applies its record again. Identifiers are never reused (each holds
    /// random bytes), so a row held now is the one the pull added.
    ///
    /// A row a push listed (``SyncState/Applying/pushed``) holds the item's record only if the
    /// database holds that record's stamp or a later one (which replaced it, or which it lost
    /// to): then it is recorded as a pulled one is; otherwise (the transaction never committed)
    /// only as the row that holds the item, which the push compares with what the group has. Without `connection`
    /// (``status()``), a list holding such a row is left for the next sync.
    func adoptApplying(_ state: SyncState, connection: PostgresConnection?) throws(LockboxError) {
        guard !state.applying.isEmpty else { return }
        // The earliest stamp a push listed of each item (a listing per row; one item, one row).
        let pushed = Dictionary(state.applying.values.filter(\.pushed).map { ($0.id, $0.entry.stamp) }, uniquingKeysWith: min)
        var inGroup: Set<String> = []
        if !pushed.isEmpty {
            guard let connection else { return }
            let keys = self.keys
            for row in try connection.executeBinary(
                "SELECT item_id, version, payload FROM lockbox_sync_items WHERE group_id = $1 AND item_id = ANY($2::text[])",
                [.text(groupID), .texts(Array(pushed.keys))])
            {
                guard let id = row[0].map({ String(decoding: $0, as: UTF8.self) }), let payload = row[2] else { throw LockboxError.syncDatabase() }
                let record = try SyncRecord.open(payload, group: groupID, itemID: id, version: try PostgresConnection.integer(binary: row[1]), keys: keys)
                // The listed record, or a later one (which replaced it, or which it would have lost to).
                if let listed = pushed[id], listed <= record.stamp { inGroup.insert(id) }
            }
        }
        // Held synchronizable or not: one made local since is the item's, whose delete the push writes.
        let present = try vault.presentRows(among: state.applying.keys)
        let deleted = try vault.deletionTimes(of: state.applying.keys.filter { !present.contains($0) })
        var changes = SyncState.Changes()
        changes.settlesApplying = true
        for (reference, row) in state.applying where present.contains(reference) || deleted[reference] != nil {
            if row.pushed, try state.row(reference) != nil {
                // A row the state knows as holding another item, or none that syncs (renamed,
                // made to sync): its mapping stays, so that the push still writes the delete of
                // what it held; the listing stays too, if the record reached the group, for the
                // push to write this item's delete if the row is gone or holds another item,
                // and to push the item the state has it hold after the delete of it that the
                // stopped push wrote, should it hold that item again (``push(_:state:report:)``).
                // A push that never committed wrote nothing: its listing is dropped.
                if inGroup.contains(row.id) { changes.applying[reference] = row }
            } else {
                changes.setRow(reference, .some(row.id))
            }
            if row.pushed && !inGroup.contains(row.id) { continue }
            if let known = try state.entry(row.id), known.stamp >= row.entry.stamp { continue }
            changes.entries[row.id] = row.entry
        }
        try state.commit(changes)
    }

    static func isEligible(_ item: Item) -> Bool {
        item.attributes.synchronizable == true && item.accessControl == nil
            && !(item.attributes.accessibility ?? .default).isThisDeviceOnly && syncedClasses.contains(item.itemClass)
            // A hardware key's value is its TPM's wrapped blob: it never leaves the machine.
            && !(item.itemClass == .key && ManagedKeyValue.isHardwareKey(descriptor: item.attributes.generic))
    }

    /// The item in the vault row `reference`, when it syncs; nil when the row is gone or does
    /// not sync (another class, ThisDeviceOnly, access control).
    /// - Throws: `interactionNotAllowed` when the row is locked: a locked item is never taken
    ///   for one that does not sync (its last record would be replaced by a delete).
    func readLocal(_ reference: Data) throws(LockboxError) -> LocalItem? {
        try readLocal([reference])[reference]
    }

    /// ``readLocal(_:)`` for many rows, in one read of the vault: the rows that sync, by
    /// reference.
    func readLocal(_ references: some Collection<Data>) throws(LockboxError) -> [Data: LocalItem] {
        var local: [Data: LocalItem] = [:]
        for (reference, item) in try vault.synchronizableItems(inRows: Array(references), classes: Self.syncedClasses)
        where Self.isEligible(item) {
            local[reference] = LocalItem(item: item, digest: SyncRecord.contentDigest(item, keys: keys))
        }
        return local
    }

    func itemID(_ item: Item) -> String {
        Self.itemID(item, keys: keys)
    }

    /// An item's opaque identifier in the group: a keyed digest of its primary key.
    static func itemID(_ item: Item, keys: SyncKeys) -> String {
        Array(Crypto.keyedDigest(PrimaryKey.encode(item.itemClass, item.attributes), key: keys.naming).prefix(20)).hexString
    }

    /// When a record was written: the date a vault gives the change it applies from it.
    static func date(_ stamp: SyncStamp) -> Date {
        Date(timeIntervalSince1970: Double(stamp.modified) / 1000)
    }

    /// The date a change another device made is applied with here: its stamp, but never later
    /// than now here. A writer whose clock runs ahead must not give items dates in this machine's
    /// future, which would sort them after every later local change (a restore's newer copy,
    /// the order items are listed in). Earlier than the stamp is the safe side: were this
    /// device's state lost, the change would be pushed again with that date, and it would
    /// lose, not win, against anything written after the stamp elsewhere.
    /// `now` is the vault's clock, which dates its own writes.
    static func appliedDate(_ stamp: SyncStamp, now: Date) -> Date {
        min(date(stamp), now)
    }

    static func milliseconds(_ date: Date?) -> Int64 {
        Int64(((date ?? Date()).timeIntervalSince1970 * 1000).rounded(.down))
    }

    /// What changed in the vault since the state's generation: the rows to read (written since,
    /// or unknown to the state) and the rows that went away (with the item each held). Nothing
    /// is opened here; a delete is noticed by the count of synchronizable rows, and only then
    /// are all row identifiers compared.
    func localChanges(state: SyncState) throws(LockboxError) -> (generation: Int, toRead: [Data], gone: [Data: String?]) {
        var scan = try vault.synchronizableChanges(since: state.generation)
        if scan.isUnchanged { return (scan.generation, [], [:]) }
        var unknown = 0
        for reference in scan.changed where try state.row(reference) == nil { unknown += 1 }
        var toRead = scan.changed
        var gone: [Data: String?] = [:]
        if scan.count != (try state.rowCount) + unknown {
            // A row this device knew is gone: compare every row identifier once.
            scan = try vault.synchronizableChanges(since: state.generation, listingAll: true)
            let present = scan.all ?? []
            let known = try state.allRows()
            for (reference, id) in known where !present.contains(reference) { gone[reference] = id }
            let changed = Set(scan.changed)
            toRead = scan.changed + present.filter { known[$0] == nil && !changed.contains($0) }
        }
        return (scan.generation, toRead, gone)
    }

    /// Rows read and pushed per database transaction: bounds the values held in guarded memory.
    static let pushBatch = 500

    /// - Returns: the highest counter this push found or left under the group row's lock: a
    ///   head below it, seen later, was rolled back.
    @discardableResult
    func push(_ connection: PostgresConnection, state: SyncState, report: inout Report) throws(LockboxError) -> Int64 {
        try establishHead(connection, state: state)
        let found = try localChanges(state: state)
        report.examined = found.toRead.count
        var former = Set(found.gone.values.compactMap { $0 })
        // A gone row an earlier push listed as holding an item the state had it hold no longer
        // (``adoptApplying(_:connection:)``) held that item too: its delete is written as well.
        var listedGone: [Data: String] = [:]
        for reference in found.gone.keys {
            guard let listed = state.pushedListing(of: reference) else { continue }
            listedGone[reference] = listed
            former.insert(listed)
        }
        var produced = Set<String>()
        // The state is committed once, at the end: a crash before then repeats reading and
        // comparing only, as a record the database already holds with the same stamp is not
        // written again.
        var pending = SyncState.Changes()
        var inStep = VerifiedHead(of: state)
        var checked: VerifiedHead?
        var floor = state.cursor
        // The rows this push writes and the state does not know yet are listed in it before
        // each database transaction (``SyncState/applying``): should the process stop after the
        // database's commit and before the state's, a row deleted here meanwhile is still known
        // to have held an item the group has.
        pending.settlesApplying = true
        for start in stride(from: 0, to: found.toRead.count, by: Self.pushBatch) {
            var changes: [(id: String, record: SyncRecord)] = []
            // Each change's row as read: its content and modification (``applySuperseding``).
            var readAs: [String: (digest: [UInt8], modified: Int64)] = [:]
            var unknown: [Data: SyncState.Applying] = [:]
            let batch = found.toRead[start..<min(start + Self.pushBatch, found.toRead.count)]
            let read = try readLocal(batch)
            try state.inSnapshot { () throws(LockboxError) in
                for reference in batch {
                    let stateRow = try state.row(reference)
                    if case .some(.some(let old)) = stateRow { former.insert(old) }
                    // A row an earlier push listed as holding an item (its state not saved since)
                    // held that item too: if the row holds another one now, or none that syncs,
                    // the item's delete is written as well.
                    if let listed = state.pushedListing(of: reference) { former.insert(listed) }
                    guard let local = read[reference] else {
                        pending.setRow(reference, .some(nil))
                        continue
                    }
                    let id = itemID(local.item)
                    produced.insert(id)
                    pending.setRow(reference, .some(id))
                    let known = try state.entry(id, after: pending)
                    let record: SyncRecord
                    if Self.holdsAgainAfterStoppedPush(reference, id, stateRow: stateRow, state: state), let known {
                        // A push that stopped before its state's commit listed this row as
                        // holding another item, and so wrote this one's delete (the state still
                        // has the row hold it): the row holds it again since (renamed back), a
                        // later write than that delete, whatever the clocks say.
                        record = self.record(of: local, after: SyncState.Entry(deletion(madeAt: 0, after: known)))
                    } else {
                        if Self.isPushed(local, known: known) { continue }
                        record = self.record(of: local, after: known)
                    }
                    try checkSyncable(local.item)
                    changes.append((id, record))
                    readAs[id] = (local.digest, Self.milliseconds(local.item.attributes.modificationDate))
                    if stateRow != .some(.some(id)) { unknown[reference] = SyncState.Applying(id: id, entry: SyncState.Entry(record), pushed: true) }
                }
            }
            try listAdding(unknown, in: state)
            let superseding = try state.inSnapshot { () throws(LockboxError) in
                try write(
                    changes, connection: connection, state: state, pending: &pending, inStep: &inStep, checked: &checked, floor: &floor,
                    report: &report)
            }
            try applySuperseding(superseding, pushed: readAs, state: state, pending: &pending, report: &report)
        }
        // Deletes: items whose row went away or now holds another item. A delete is stamped
        // with when it was made, as the vault recorded it, so that an edit made elsewhere after
        // it wins. Without a record (a row that now holds another item or no longer syncs,
        // whose change the vault does not date: its modification date may be a later edit of
        // what it holds now; a row deleted by an older Lockbox; a record removed from the
        // file), just after the version this device knew: it replaces that version, and loses
        // to any later one, so that no edit made elsewhere is lost to it.
        for (reference, _) in found.gone { pending.setRow(reference, .none) }
        var deletedAt: [String: Int64] = [:]
        for (reference, date) in try vault.deletionTimes(of: found.gone.keys) {
            for id in [found.gone[reference] ?? nil, listedGone[reference]].compactMap({ $0 }) {
                deletedAt[id] = max(deletedAt[id] ?? 0, Self.milliseconds(date))
            }
        }
        var tombstones: [(id: String, record: SyncRecord)] = []
        for (id, known) in try Self.deleted(former: former, produced: produced, state: state) {
            tombstones.append((id, deletion(madeAt: deletedAt[id] ?? 0, after: known)))
        }
        let superseding = try write(
            tombstones, connection: connection, state: state, pending: &pending, inStep: &inStep, checked: &checked, floor: &floor,
            report: &report)
        try applySuperseding(superseding, state: state, pending: &pending, report: &report)
        pending.generation = found.generation
        // Nobody else wrote between this device's last verified head and its writes: the head
        // it wrote is verified too, and the pull that follows does not fetch its own records.
        if let inStep, inStep.counter != state.cursor { inStep.record(in: &pending) }
        try state.commit(pending)
        return floor
    }

    /// The group's head as this device verified it, carried through its own writes while
    /// every batch finds the database's head equal to it (nobody else wrote since): then the
    /// head after the push is the verified one plus what this device wrote, and the records it
    /// lists are known without fetching them.
    struct VerifiedHead {
        var counter: Int64
        var accumulator: [UInt8]
        /// The records this push wrote, as the head lists them.
        var listed: [String: SyncState.Listed] = [:]
        /// The verified head was the empty group's (this device had verified none, and the
        /// group had no record): the records listed are all the head holds.
        let replacesAll: Bool

        /// A head checked during a push (``SyncGroup/verifiedAbove(_:cursor:head:state:pending:)``),
        /// listing the records above the cursor; never recorded as the state's verified head.
        init(counter: Int64, accumulator: [UInt8], listed: [String: SyncState.Listed]) {
            (self.counter, self.accumulator, self.listed, replacesAll) = (counter, accumulator, listed, false)
        }

        /// Whether the database's `head` is this one (nobody else wrote).
        func isAt(_ head: SyncHead) -> Bool {
            counter == head.counter && SyncHead.equal(accumulator, head.accumulator)
        }

        /// Records this head in `changes` as the one verified, with the records it lists;
        /// `replacingAll` when they are all it holds (else they replace only their items').
        func record(in changes: inout SyncState.Changes, replacingAll: Bool? = nil) {
            changes.cursor = counter
            changes.accumulator = accumulator
            changes.replacesVerified = replacingAll ?? replacesAll
            for (id, listed) in listed { changes.verified[id] = listed }
        }

        /// The state's verified head; the empty group's for a state that has verified none
        /// and pulled nothing (found equal to the database's only if the group is empty);
        /// nil for a state that pulled before heads.
        init?(of state: SyncState) {
            if let accumulator = state.accumulator {
                (counter, self.accumulator, replacesAll) = (state.cursor, accumulator, false)
            } else if state.cursor == 0 {
                (counter, self.accumulator, replacesAll) = (0, SyncHead.empty.accumulator, true)
            } else {
                return nil
            }
        }
    }

    /// Refuses to send an item larger than the other devices take (``Vault/syncedItemSizeLimit``:
    /// this store may allow more).
    func checkSyncable(_ item: Item) throws(LockboxError) {
        let limit = Vault.syncedItemSizeLimit
        guard (item.data?.count ?? 0) <= limit, item.attributes.encoded().count <= limit else {
            throw LockboxError(
                .param,
                "An item to sync holds \(item.data?.count ?? 0) bytes, over sync's limit of \(limit) bytes: the other devices would "
                    + "not take it. Make it smaller, or not synchronizable; the sync stopped before writing it.")
        }
    }

    /// The record a push writes of a local item: stamped when it was modified, and causally after
    /// the version this device had seen, whatever its clock says: at least two past it, so that
    /// it also beats a delete without a time of its own written after that version (one past
    /// it, ``deletion(madeAt:after:)``), whatever the device identifiers.
    func record(of local: LocalItem, after known: SyncState.Entry?) -> SyncRecord {
        let modified = max(Self.milliseconds(local.item.attributes.modificationDate), (known?.stamp.modified ?? 0) + 2)
        var item = local.item
        item.attributes = SyncRecord.travelling(item.attributes)
        item.persistentReference = nil
        return SyncRecord(stamp: SyncStamp(modified: modified, device: device.id), item: item, contentDigest: local.digest)
    }

    /// The tombstone a push writes of an item deleted here at `madeAt` (milliseconds; 0 when the
    /// vault recorded no time). Dated, it is a write like an edit (at least two past the version
    /// this device knew); undated, just one past that version: it replaces that version and
    /// loses to every write made after it elsewhere, even one whose clock runs behind.
    func deletion(madeAt: Int64, after known: SyncState.Entry) -> SyncRecord {
        let modified = madeAt > 0 ? max(madeAt, known.stamp.modified + 2) : known.stamp.modified + 1
        return SyncRecord(stamp: SyncStamp(modified: modified, device: device.id), item: nil, contentDigest: [])
    }

    /// Whether the vault row `reference`, which holds the item `id` now, was listed by a push
    /// that stopped before its state's commit as holding another item, while the state still
    /// has it hold `id`: that push wrote the delete of `id`, and the row holds it again since.
    static func holdsAgainAfterStoppedPush(_ reference: Data, _ id: String, stateRow: String??, state: SyncState) -> Bool {
        guard let listed = state.pushedListing(of: reference) else { return false }
        return listed != id && stateRow == .some(.some(id))
    }

    /// Whether the group already holds an item's local content, as this device last saw its
    /// record: then a push writes nothing for it. (A value saved again unchanged is not a
    /// change: a credential helper stores the same value after each use, and pushing it as a
    /// later write would undo an edit or a delete made elsewhere since.)
    static func isPushed(_ local: LocalItem, known: SyncState.Entry?) -> Bool {
        known.map { !$0.isTombstone && $0.contentDigest == local.digest } ?? false
    }

    /// The items a push writes a tombstone for, in order: those a gone or replaced row held
    /// (`former`) that no row holds now (`produced`), and whose last known record is not one.
    static func deleted(former: Set<String>, produced: Set<String>, state: SyncState) throws(LockboxError) -> [(String, SyncState.Entry)] {
        var deleted: [(String, SyncState.Entry)] = []
        for id in former.subtracting(produced).sorted() {
            if let known = try state.entry(id), !known.isTombstone { deleted.append((id, known)) }
        }
        return deleted
    }

    /// Writes one batch of changes in one transaction. Every record it replaces must be the one
    /// the locked head lists: in step, as this device verified it; otherwise as checked here
    /// (`checked`, carried from batch to batch while nobody else writes). Returns the changes
    /// that lost to the database's record, with that record, which the caller applies here
    /// instead (``applySuperseding(_:state:pending:report:)``), outside any read of the state.
    func write(
        _ changes: [(id: String, record: SyncRecord)], connection: PostgresConnection, state: SyncState,
        pending: inout SyncState.Changes, inStep: inout VerifiedHead?, checked: inout VerifiedHead?, floor: inout Int64,
        report: inout Report
    ) throws(LockboxError) -> [(id: String, record: SyncRecord)] {
        guard !changes.isEmpty else { return [] }
        var stepped = inStep
        var expected: VerifiedHead?
        var seen = floor
        var written: [(id: String, record: SyncRecord)] = []
        var superseding: [(id: String, record: SyncRecord)] = []
        var writes = 0
        var stored: [StoredRecord] = []
        // This batch's writes that no head this device verified lists.
        var unverified: [String: SyncState.Listed] = [:]
        let cursor = state.cursor
        let keys = self.keys
        try connection.transaction { () throws(LockboxError) in
            // The group row's lock orders every writer of the group: versions commit in order.
            var head = try lockedHead(connection, cursor: cursor, keys: keys)
            // Below what an earlier batch of this push found or wrote: rolled back.
            guard head.counter >= seen else { throw rolledBack() }
            let lockedCounter = head.counter
            var counter = head.counter
            if let verified = stepped {
                if verified.isAt(head) {
                    // The head this device verified, though it wrote above it since: those
                    // writes were undone in the database.
                    guard state.unverifiedWrites.isEmpty else { throw SyncHead.lostWrites(state.unverifiedWrites.count) }
                } else {
                    // Another device wrote: what earlier batches of this push wrote in step is
                    // no longer covered by a head this device verifies.
                    unverified = verified.listed
                    stepped = nil
                }
            }
            if let stepped {
                expected = stepped
            } else if let checked, checked.isAt(head) {
                expected = checked
            } else {
                // What earlier batches of this push wrote in step is unverified now too: the check
                // requires it above the cursor with the rest.
                var carried = pending
                for (id, listed) in unverified { carried.unverified[id] = listed }
                expected = try verifiedAbove(connection, cursor: cursor, head: head, state: state, pending: carried, since: checked)
            }
            // The database's records of the changed items, in one round trip.
            var existing: [String: (version: Int64, payload: [UInt8])] = [:]
            for row in try connection.executeBinary(
                "SELECT item_id, version, payload FROM lockbox_sync_items WHERE group_id = $1 AND item_id = ANY($2::text[])",
                [.text(groupID), .texts(changes.map(\.id))])
            {
                guard let id = row[0], let payload = row[2] else { throw LockboxError.syncDatabase() }
                existing[String(decoding: id, as: UTF8.self)] = (try PostgresConnection.integer(binary: row[1]), payload)
            }
            for change in changes {
                var change = change
                let known = try state.entry(change.id, after: pending)
                var replaced: [UInt8]?
                // In step, the database's head is the one this device verified: each record must
                // be the one that head lists (none for an item it does not list).
                var listed: SyncState.Listed?
                if let expected {
                    listed = expected.listed[change.id]
                    if listed == nil { listed = try state.verified(change.id) }
                }
                if let row = existing[change.id] {
                    // No record is newer than the head that counts it.
                    guard row.version <= lockedCounter else { throw LockboxError.syncDatabase() }
                    let remote = try SyncRecord.open(row.payload, group: groupID, itemID: change.id, version: row.version, keys: keys)
                    // Older than what this device already saw of the item: a replay.
                    if let known, remote.stamp < known.stamp { throw rolledBack() }
                    replaced = SyncHead.element(itemID: change.id, version: row.version, record: remote, keys: keys)
                    if expected != nil, listed?.version != row.version || !SyncHead.equal(listed?.element ?? [], replaced ?? []) {
                        throw SyncHead.withheld()
                    }
                    if remote.stamp == change.record.stamp {
                        if remote.contentDigest == change.record.contentDigest && remote.isTombstone == change.record.isTombstone {
                            // Written by an earlier run that stopped before saving its state.
                            if stepped == nil, let replaced { unverified[change.id] = SyncState.Listed(version: row.version, element: replaced) }
                            written.append(change)
                            continue
                        }
                        // This device's stamp on other content: not this change. An earlier run's
                        // write of what the item held before (its state not saved, and a clock
                        // behind the version it saw gave both the same stamp), or the write of
                        // another keychain with this device's identity (a copied home directory).
                        // This change is written after it, so that every device takes it: at one
                        // stamp, devices that hold either record would keep theirs.
                        change.record.stamp.modified = remote.stamp.modified + 2
                    }
                    if remote.contentDigest == change.record.contentDigest && remote.isTombstone == change.record.isTombstone
                        && change.record.stamp.modified <= remote.stamp.modified
                    {
                        // The same content already, written no earlier than this change (a
                        // state lost, an item applied before its state was saved: it carries
                        // the record's time): adopt the database's record, write nothing. A
                        // later write of the same content (a delete after another device's
                        // delete) is written: its time is what an edit made between the two
                        // must lose to.
                        written.append((change.id, remote))
                        continue
                    }
                    if change.record.stamp < remote.stamp {
                        superseding.append((change.id, remote))
                        continue
                    }
                } else if known != nil || listed != nil {
                    // This device saw a record of the item, and records are never deleted.
                    throw SyncHead.withheld()
                }
                counter = try SyncHead.version(after: counter)
                if let replaced { SyncHead.subtract(replaced, from: &head.accumulator) }
                let element = SyncHead.element(itemID: change.id, version: counter, record: change.record, keys: keys)
                SyncHead.add(element, to: &head.accumulator)
                stepped?.listed[change.id] = SyncState.Listed(version: counter, element: element)
                expected?.listed[change.id] = SyncState.Listed(version: counter, element: element)
                if stepped == nil { unverified[change.id] = SyncState.Listed(version: counter, element: element) }
                stored.append(
                    StoredRecord(
                        id: change.id, version: counter, device: change.record.stamp.device,
                        payload: change.record.seal(group: groupID, itemID: change.id, version: counter, keys: keys)))
                written.append(change)
                writes += 1
            }
            try Self.store(stored, group: groupID, connection: connection)
            head.counter = counter
            try connection.execute(
                "UPDATE lockbox_sync_groups SET counter = $2, head = $3 WHERE group_id = $1",
                [.text(groupID), .integer(counter), .bytes(head.sealed(group: groupID, keys: keys))])
            stepped?.counter = counter
            stepped?.accumulator = head.accumulator
            expected?.counter = counter
            expected?.accumulator = head.accumulator
            seen = counter
        }
        // Committed: what this batch wrote is part of the head.
        inStep = stepped
        checked = stepped == nil ? expected : nil
        floor = max(floor, seen)
        for (id, listed) in unverified { pending.unverified[id] = listed }
        for change in written {
            pending.entries[change.id] = SyncState.Entry(change.record)
        }
        report.pushed += writes
        return superseding
    }

    /// Applies here the database's records that won over this device's changes
    /// (``write(_:connection:state:pending:inStep:checked:floor:report:)``); `pushed` holds the
    /// content and modification time of each changed row as the push read it. A row changed
    /// here since the push read it (edited, written again, deleted, made ThisDeviceOnly or
    /// renamed, by another process) is neither overwritten, nor deleted, nor brought back: that
    /// change is later than the push's, and the next push settles it against the record by
    /// the rule. So is one written again here with the item's key after the push read it gone
    /// (``apply(_:id:existing:state:)``).
    func applySuperseding(
        _ superseding: [(id: String, record: SyncRecord)], pushed: [String: (digest: [UInt8], modified: Int64)] = [:],
        state: SyncState, pending: inout SyncState.Changes, report: inout Report
    ) throws(LockboxError) {
        guard !superseding.isEmpty else { return }
        try beforeApplyingSuperseding.withLock { $0 }?()
        for change in superseding {
            let existing = Self.reference(of: change.id, pending: pending, state: state)
            if let old = try existing() {
                guard let mine = try readLocal(old), itemID(mine.item) == change.id,
                    pushed[change.id].map({ $0.digest == mine.digest && $0.modified == Self.milliseconds(mine.item.attributes.modificationDate) })
                        ?? true
                else { continue }
            }
            switch try apply(change.record, id: change.id, existing: try existing(), state: state) {
            case .row(let reference):
                pending.setRow(reference, .some(change.id))
                report.superseded += 1
            case .kept(let reference):
                pending.setRow(reference, .some(change.id))
            case .deleted:
                report.superseded += 1
                if let old = try existing() { pending.setRow(old, .none) }
            case .heldBack:
                if let old = try existing() { pending.setRow(old, .none) }
                pending.holdBack(change.id)
                continue
            }
            pending.entries[change.id] = SyncState.Entry(change.record)
        }
    }

    /// The locked `head` checked as a pull would check it, for a push that is not in step: the
    /// records above the cursor (what other devices, and this one's writes not yet verified,
    /// wrote since the head this device verified) read, opened, and summed with that head's
    /// other records, which must give `head`; a record older than this device knows is a
    /// replay, and each of this device's unverified writes must be among them (else the
    /// database undid it). With `since`, a head an earlier batch checked, only the records
    /// above it are read. Returns `head` with the records above the cursor; nil for a state
    /// that pulled before heads (it has no head to start from).
    func verifiedAbove(
        _ connection: PostgresConnection, cursor: Int64, head: SyncHead, state: SyncState, pending: SyncState.Changes,
        since base: VerifiedHead?
    ) throws(LockboxError) -> VerifiedHead? {
        var sum: [UInt8]
        var listed: [String: SyncState.Listed]
        let from: Int64
        if let base {
            (sum, listed, from) = (base.accumulator, base.listed, base.counter)
            guard head.counter >= from else { throw rolledBack() }
        } else {
            guard let verified = state.accumulator ?? (cursor == 0 ? SyncHead.empty.accumulator : nil) else { return nil }
            (sum, listed, from) = (verified, [:], cursor)
        }
        let counted = try connection.execute(
            "SELECT count(*) FROM lockbox_sync_items WHERE group_id = $1 AND version > $2", [.text(groupID), .integer(from)])
        guard try PostgresConnection.integer(counted.first?[0] ?? nil) <= max(head.counter - from, 0) else {
            throw LockboxError.syncDatabase("The records of the sync database (more than its versions)")
        }
        let rows = try connection.executeBinary(
            "SELECT item_id, version, payload FROM lockbox_sync_items WHERE group_id = $1 AND version > $2",
            [.text(groupID), .integer(from)])
        for record in try receive(rows, from: from, counter: head.counter, keys: keys) {
            if let known = try state.entry(record.id, after: pending), record.sealed.record.stamp < known.stamp { throw rolledBack() }
            var old = listed[record.id]
            if old == nil { old = try state.verified(record.id) }
            if let old { SyncHead.subtract(old.element, from: &sum) }
            SyncHead.add(record.element, to: &sum)
            listed[record.id] = SyncState.Listed(version: record.version, element: record.element)
        }
        guard SyncHead.equal(sum, head.accumulator) else { throw SyncHead.withheld() }
        // This device's writes above the cursor that the head no longer lists there: undone.
        let lost = Set(state.unverifiedWrites.keys).union(pending.unverified.keys).count { listed[$0] == nil }
        guard lost == 0 else { throw SyncHead.lostWrites(lost) }
        return VerifiedHead(counter: head.counter, accumulator: head.accumulator, listed: listed)
    }

    /// A sealed record as a push writes it to the database.
    struct StoredRecord {
        let id: String
        let version: Int64
        let device: String
        let payload: [UInt8]
    }

    /// Rows per statement when records are written (as arrays, in the binary format): a push of
    /// thousands of items makes a few round trips, not one a record (on loopback a round trip
    /// costs more than sealing the record).
    static let recordsPerStatement = 500

    /// Payload bytes per statement (records of large values: a statement stays far below
    /// PostgreSQL's 1 GB for one value, the array).
    static let bytesPerStatement = 16 << 20

    /// Writes records (new, or replacing the item's record) within the caller's transaction,
    /// many to a statement. An item appears once: one statement cannot write a row twice.
    static func store(_ records: [StoredRecord], group: String, connection: PostgresConnection) throws(LockboxError) {
        guard Set(records.map(\.id)).count == records.count else {
            // Two rows of one primary key: the vault's uniqueness allows it only in a damaged file.
            throw LockboxError.integrity("Two items the push read")
        }
        var start = 0
        while start < records.count {
            // Up to `recordsPerStatement` records, and no more bytes than `bytesPerStatement`
            // unless one record alone is larger.
            var end = start
            var bytes = 0
            while end < records.count && end - start < recordsPerStatement && (end == start || bytes + records[end].payload.count <= bytesPerStatement) {
                bytes += records[end].payload.count
                end += 1
            }
            let chunk = records[start..<end]
            start = end
            try connection.execute(
                """
                INSERT INTO lockbox_sync_items (group_id, item_id, version, device_id, payload)
                SELECT $1, * FROM unnest($2::text[], $3::bigint[], $4::text[], $5::bytea[])
                ON CONFLICT (group_id, item_id) DO UPDATE
                SET version = excluded.version, device_id = excluded.device_id, payload = excluded.payload
                """,
                [
                    .text(group), .texts(chunk.map(\.id)), .integers(chunk.map(\.version)), .texts(chunk.map(\.device)),
                    .byteStrings(chunk.map(\.payload)),
                ])
        }
    }

    /// The vault row holding `id`: as this phase recorded it so far, else as the state knows it.
    static func reference(of id: String, pending: SyncState.Changes, state: SyncState) -> () throws(LockboxError) -> Data? {
        { () throws(LockboxError) -> Data? in
            if let reference = pending.holder(of: id) { return reference }
            guard let reference = try state.reference(of: id) else { return nil }
            // Recorded as gone or as another item in this phase.
            if let change = pending.rows[reference], change != .some(.some(id)) { return nil }
            return reference
        }
    }

    /// The group's head (counter and digest, checked), the group row locked until the
    /// transaction ends. A counter below what this device has pulled means the database was
    /// rolled back (restored, or replayed); another key epoch means a device was removed since
    /// this device caught up.
    private func lockedHead(_ connection: PostgresConnection, cursor: Int64, keys: SyncKeys) throws(LockboxError) -> SyncHead {
        let rows = try connection.execute(
            "SELECT counter, key_epoch, head FROM lockbox_sync_groups WHERE group_id = $1 FOR UPDATE", [.text(groupID)])
        guard let row = rows.first else {
            throw LockboxError(.itemNotFound, "The sync group \(groupID) is not in the database any more. Nothing was changed here.")
        }
        let counter = try PostgresConnection.integer(row[0])
        guard counter >= cursor else { throw rolledBack() }
        guard try PostgresConnection.integer(row[1]) == keys.epoch else {
            throw LockboxError(.io, "The sync group's key changed during this sync (a device was removed). Sync again.")
        }
        return try SyncHead.open(
            try row[2].map { text throws(LockboxError) in try PostgresConnection.bytes(text) }, counter: counter, group: groupID, keys: keys)
    }

    /// A group from before heads (sync schema 3) gets one from the first device that syncs
    /// after the upgrade, computed from every record as the database holds them (trusted once,
    /// as on first use). A device that has verified a head refuses a group without one.
    func establishHead(_ connection: PostgresConnection, state: SyncState) throws(LockboxError) {
        let missing = "SELECT counter FROM lockbox_sync_groups WHERE group_id = $1 AND head IS NULL AND counter > 0"
        guard try !connection.execute(missing, [.text(groupID)]).isEmpty else { return }
        guard state.accumulator == nil else { throw Self.headRemoved() }
        // Only a device that pulled the group before heads may vouch for its records, and only
        // for a set that holds, at least as new, every record it saw. A pull since heads always
        // records the head it verified with its cursor: a cursor without a head is a pull from
        // before them (a state reset after a key rotation has neither). Any other device (a new
        // one, or one whose first pull failed after its push) cannot tell such a group from one
        // whose head was removed in the database to hide records: trusting it would let the
        // database drop any record it likes.
        guard state.cursor > 0 else { throw Self.headless() }
        let known = try state.allEntries()
        let keys = self.keys
        try connection.transaction { () throws(LockboxError) in
            guard let row = try connection.execute(missing + " FOR UPDATE", [.text(groupID)]).first else { return }
            var head = SyncHead(counter: try PostgresConnection.integer(row[0]), accumulator: SyncHead.empty.accumulator)
            var seen = Set<String>()
            for record in try connection.executeBinary(
                "SELECT item_id, version, payload FROM lockbox_sync_items WHERE group_id = $1", [.text(groupID)])
            {
                guard let idBytes = record[0], let payload = record[2] else { throw LockboxError.syncDatabase() }
                let id = String(decoding: idBytes, as: UTF8.self)
                let version = try PostgresConnection.integer(binary: record[1])
                let opened = try SealedValueRecord(payload, group: groupID, itemID: id, version: version, keys: keys)
                if let entry = known[id], opened.record.stamp < entry.stamp { throw rolledBack() }
                seen.insert(id)
                SyncHead.add(SyncHead.element(itemID: id, version: version, record: opened.record, keys: keys), to: &head.accumulator)
            }
            guard known.keys.allSatisfy(seen.contains) else { throw SyncHead.withheld() }
            try connection.execute(
                "UPDATE lockbox_sync_groups SET head = $2 WHERE group_id = $1", [.text(groupID), .bytes(head.sealed(group: groupID, keys: keys))])
        }
    }

    /// A group without a head, seen by a device that verified one.
    static func headRemoved() -> LockboxError {
        LockboxError(
            .decode,
            "The sync database holds no head (the signed list of its records), though this device verified one: the head was "
                + "removed, or the database was restored from a backup made before heads. Nothing was applied. If it was restored, "
                + "sync once on a device that synced the group before heads and not since (it restores the head), then run "
                + "`lockbox sync recover` here; if there is none, create a new group (`lockbox sync create --replace-group`) and join "
                + "the devices to it.")
    }

    static func headless() -> LockboxError {
        LockboxError(
            .decode,
            "The sync database holds no head for this group (the signed list of its records), and this device has pulled nothing "
                + "yet, so it cannot tell a group last written before heads from a head removed in the database. Nothing was applied. "
                + "Sync once on a device of the group that synced before: it restores the head, or reports the database as changed.")
    }

    func rolledBack() -> LockboxError {
        LockboxError(
            .decode,
            "The sync database is older than what this device already saw: it was rolled back or is replaying old records. "
                + "Nothing was applied; have the database restored to its latest state." + Self.recoveryHint)
    }

    /// The counter, the head and every record with a version above `from`, in one snapshot, so
    /// that they agree: records in binary form, one query. A counter below `cursor` (what this
    /// device already saw) is a rollback; a key epoch other than `keys`' an error.
    func fetchRecords(
        _ connection: PostgresConnection, above from: Int64, cursor: Int64, keys: SyncKeys
    ) throws(LockboxError) -> (SyncHead, [[[UInt8]?]]) {
        try connection.transaction { () throws(LockboxError) -> (SyncHead, [[[UInt8]?]]) in
            try connection.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
            let counterRows = try connection.execute(
                "SELECT counter, key_epoch, head FROM lockbox_sync_groups WHERE group_id = $1", [.text(groupID)])
            guard let counterRow = counterRows.first else {
                throw LockboxError(.itemNotFound, "The sync group \(groupID) is not in the database any more. Nothing was changed here.")
            }
            let counter = try PostgresConnection.integer(counterRow[0])
            guard counter >= cursor else { throw rolledBack() }
            guard try PostgresConnection.integer(counterRow[1]) == keys.epoch else {
                throw LockboxError(.io, "The sync group's key changed during this sync (a device was removed). Sync again.")
            }
            let head = try SyncHead.open(
                try counterRow[2].map { text throws(LockboxError) in try PostgresConnection.bytes(text) }, counter: counter, group: groupID,
                keys: keys)
            // Each version is one record's: more records above `from` than versions up to the
            // counter were added in the database. Refused before they are fetched, so such rows
            // cost no memory here.
            let listed = try connection.execute(
                "SELECT count(*) FROM lockbox_sync_items WHERE group_id = $1 AND version > $2", [.text(groupID), .integer(from)])
            guard try PostgresConnection.integer(listed.first?[0] ?? nil) <= max(counter - from, 0) else {
                throw LockboxError.syncDatabase("The records of the sync database (more than its versions)")
            }
            let rows = try connection.executeBinary(
                "SELECT item_id, version, payload FROM lockbox_sync_items WHERE group_id = $1 AND version > $2 ORDER BY version",
                [.text(groupID), .integer(from)])
            return (head, rows)
        }
    }

    /// - Parameters:
    ///   - floor: a counter the push just before found or left under the group row's lock: a
    ///     head below it is a rollback, though above the cursor.
    ///   - fromScratch: every record is read and checked against the head from nothing, and a
    ///     head below the cursor (but not below `floor`) is taken (a recovery of the database).
    ///   - seed: changes to the state made before the pull (a recovery's records), committed
    ///     with it.
    func pull(
        _ connection: PostgresConnection, state: SyncState, report: inout Report, floor: Int64 = 0, fromScratch: Bool = false,
        seed: SyncState.Changes = SyncState.Changes()
    ) throws(LockboxError) {
        var timer = PhaseTimer(PullTimings())
        let cursor = state.cursor
        let keys = self.keys
        // Records above what the last verified head covered; all of them when this device has
        // verified none yet.
        let from = state.accumulator == nil || fromScratch ? 0 : cursor
        let (head, rows) = try fetchRecords(connection, above: from, cursor: fromScratch ? floor : max(cursor, floor), keys: keys)
        let counter = head.counter
        timer.timings.records = rows.count
        timer.lap(\.fetch)
        // Every record's metadata is opened before anything is applied: a record that fails to
        // open stops the pull with the vault untouched. Values stay sealed until written.
        var failure: LockboxError { LockboxError.syncDatabase() }
        let received = try receive(rows, from: from, counter: counter, keys: keys)
        timer.lap(\.open)
        // A device that knows nothing yet (its first sync) has nothing to look up per record.
        let knowsNothing = try state.isEmpty
        // The records received, with those the last verified head listed, must give this head:
        // a record withheld, deleted or replaced with an older one does not add up. Checked
        // before anything is applied.
        var pending = seed
        pending.entries.reserveCapacity(received.count)
        pending.verified.reserveCapacity(received.count)
        var accumulator = from == 0 ? SyncHead.empty.accumulator : state.accumulator ?? []
        for record in received {
            if from > 0, let listed = try state.verified(record.id) {
                SyncHead.subtract(listed.element, from: &accumulator)
            }
            // Older than what this device already saw of the item: a replay.
            if !knowsNothing, let known = try state.entry(record.id, after: seed), record.sealed.record.stamp < known.stamp {
                throw rolledBack()
            }
            SyncHead.add(record.element, to: &accumulator)
            pending.verified[record.id] = SyncState.Listed(version: record.version, element: record.element)
        }
        guard SyncHead.equal(accumulator, head.accumulator) else { throw SyncHead.withheld() }
        // The items received, made once for the checks below that need it.
        lazy var receivedIDs = Set(received.map(\.id))
        if fromScratch {
            // Records are never deleted: every item this device knows, and every record a
            // recovery just wrote, must be among those the head lists (a signed view of the
            // group that lacks them is an older or other one).
            guard try state.allEntries().keys.allSatisfy(receivedIDs.contains), seed.entries.keys.allSatisfy(receivedIDs.contains) else {
                throw SyncHead.withheld()
            }
        }
        // This device's writes that no verified head listed yet are above the cursor: each must
        // be received (a later record of the item, or an older one, is judged above). One not
        // received was undone in the database, and the head hides it. (A recovery's pull reads
        // every record, after writing back every item this device knew newer.)
        if !fromScratch && !state.unverifiedWrites.isEmpty {
            let lost = state.unverifiedWrites.keys.count { !receivedIDs.contains($0) }
            guard lost == 0 else { throw SyncHead.lostWrites(lost) }
        }
        // The records of items held back here, which this pull did not receive: checked against
        // the same head, before anything is applied. A head checked from nothing that lists no
        // record of one (a database recovered from a backup that predates it) no longer holds
        // it back.
        var held: [(id: String, sealed: SealedValueRecord)] = []
        if !state.heldBack.isEmpty {
            if from == 0 {
                for id in state.heldBack where !receivedIDs.contains(id) { pending.heldBack[id] = false }
            } else {
                held = try heldBackRecords(connection, state: state, received: receivedIDs, counter: counter)
            }
        }
        pending.clearsUnverified = true
        // The rows this pull adds are listed in the state before the vault commits them, and
        // dropped from the list by the commit that records them.
        pending.settlesApplying = true
        pending.replacesVerified = from == 0
        pending.accumulator = head.accumulator
        timer.lap(\.verify)
        var changes: [(id: String, existing: Data?, sealed: SealedValueRecord)] = []
        changes.reserveCapacity(received.count)
        // Rows written here since the push (by another process): checked before overwriting.
        var recent: Set<Data>?
        let heldBack = state.heldBack
        for received in received {
            let id = received.id
            let sealed = received.sealed
            let record = sealed.record
            // A later record of an item held back: judged as any other (and held back again
            // if it still may not be applied).
            if heldBack.contains(id) { pending.heldBack[id] = false }
            var known = pending.entries[id]
            if known == nil && !knowsNothing { known = try state.entry(id) }
            if let known {
                if known.stamp == record.stamp { continue }
                if record.stamp < known.stamp { throw rolledBack() }
            }
            let entry = SyncState.Entry(record)
            let existing = knowsNothing ? nil : try Self.reference(of: id, pending: pending, state: state)()
            if let existing {
                if recent == nil { recent = Set(try vault.synchronizableChanges(since: state.generation).changed) }
                if recent?.contains(existing) == true {
                    guard let mine = try readLocal(existing), itemID(mine.item) == id else {
                        // Changed here since the push so that it no longer holds this item as
                        // one that syncs (made ThisDeviceOnly, renamed): neither overwritten nor
                        // deleted; the next push settles it by the same rule.
                        continue
                    }
                    if mine.digest != known?.contentDigest && mine.digest != record.contentDigest {
                        // Edited here since the last push: the next push settles it by the same rule.
                        continue
                    }
                    if mine.digest == record.contentDigest && !record.isTombstone {
                        // The same content: the record's entry is adopted, unless the edit here
                        // is the later write, which the next push writes with its own time.
                        if Self.milliseconds(mine.item.attributes.modificationDate) <= record.stamp.modified { pending.entries[id] = entry }
                        continue
                    }
                } else if let known, !known.isTombstone, !record.isTombstone, known.contentDigest == record.contentDigest {
                    pending.entries[id] = entry
                    continue
                }
            } else if record.isTombstone {
                pending.entries[id] = entry
                continue
            }
            // An item that may not sync, or not the one its identifier names (checked as it was opened).
            guard received.isFitting else { throw failure }
            report.pulled += 1
            pending.entries[id] = entry
            // Applied with the others in one vault transaction.
            changes.append((id, existing, sealed))
        }
        timer.lap(\.decide)
        pending.cursor = counter
        // A large pull's state is written while the vault commits, and committed after it.
        var notApplied = 0
        let started = try applyPulled(
            changes, keys: keys, pending: &pending, coveredGeneration: state.generation, state: state, notApplied: &notApplied)
        report.pulled -= notApplied
        timer.lap(\.vault)
        if let started { try started.commit() } else { try state.commit(pending) }
        try retryHeldBack(held, state: state, report: &report)
        timer.lap(\.state)
        try recordPull(connection, counter: counter)
        timer.lap(\.cursor)
        lastPullTimings.withLock { $0 = timer.timings }
    }

    /// This device's cursor and last sync in its row. A row missing (a database restored from
    /// before this device joined) is written again as joining wrote it, attested: an
    /// unattested row is dropped at the next removal. Under a shared lock of the group row, and
    /// only while the group's key epoch is still this device's: a removal of this device that
    /// committed during the pull is not undone by writing its row back.
    func recordPull(_ connection: PostgresConnection, counter: Int64) throws(LockboxError) {
        let keys = self.keys
        try connection.transaction { () throws(LockboxError) in
            let epoch = try connection.execute(
                "SELECT key_epoch FROM lockbox_sync_groups WHERE group_id = $1 FOR SHARE", [.text(groupID)])
            guard let row = epoch.first, try PostgresConnection.integer(row[0]) == keys.epoch else { return }
            // With the group's expired pairing codes deleted, in the same statement (no round
            // trip more): their rows hold the group's secrets sealed under the codes.
            try connection.execute(
                """
                WITH expired AS (DELETE FROM lockbox_sync_invitations WHERE group_id = $1 AND expires_at <= now())
                INSERT INTO lockbox_sync_devices (group_id, device_id, pulled_version, last_sync, public_key, attestation)
                VALUES ($1, $2, $3, now(), $4, $5)
                ON CONFLICT (group_id, device_id) DO UPDATE SET pulled_version = excluded.pulled_version, last_sync = now()
                """,
                [
                    .text(groupID), .text(device.id), .integer(counter), .bytes(device.publicKey),
                    .bytes(attestation(device.id, device.publicKey, keys: keys)),
                ])
        }
    }

    /// Changes from which a pull applies them through ``Vault/applyChanges(count:concurrently:)``.
    static let bulkApplyMinimum = 128

    /// Applies pulled records in one vault transaction (``Vault/applyChanges(count:_:)``, or for
    /// many ``Vault/applyChanges(count:concurrently:)``), each
    /// value opened just before the vault seals it: new items added, others replaced, tombstones
    /// deleted. The state records the rows at once; when nothing else was written to the vault
    /// since the push listed its rows, the push's generation moves past these changes too, so
    /// the next push does not read them back. Should the vault have changed under the state (a
    /// row gone, an item already there), each record is applied on its own instead.
    ///
    /// With many changes, `state`'s commit of `pending` is started (``SyncState/startCommit(_:)``)
    /// once the vault has written them, while the vault commits, let go once the vault has
    /// committed (while the vault moves its log into its file), and returned: the caller waits
    /// for it (``SyncState/PendingCommit/commit()``). Otherwise the caller commits `pending`.
    func applyPulled(
        _ changes: [(id: String, existing: Data?, sealed: SealedValueRecord)], keys: SyncKeys, pending: inout SyncState.Changes,
        coveredGeneration: Int, state: SyncState, notApplied: inout Int
    ) throws(LockboxError) -> SyncState.PendingCommit? {
        guard !changes.isEmpty else { return nil }
        // What the state records of the applied changes: the rows that hold the items.
        func record(_ applied: AppliedChanges, in pending: inout SyncState.Changes) {
            for (change, reference) in zip(changes, applied.references) {
                if let reference {
                    pending.setRow(reference, .some(change.id))
                } else if let existing = change.existing {
                    pending.setRow(existing, .none)
                }
            }
            if applied.previousGeneration == coveredGeneration { pending.generation = applied.generation }
        }
        // Before the vault commits, the rows it adds are listed in the state (``SyncState/applying``).
        func listAdded(_ applied: AppliedChanges) throws(LockboxError) {
            var added: [Data: SyncState.Applying] = [:]
            for (change, reference) in zip(changes, applied.references) where change.existing == nil {
                if let reference { added[reference] = SyncState.Applying(id: change.id, entry: SyncState.Entry(change.sealed.record)) }
            }
            try listAdding(added, in: state)
        }
        var started: SyncState.PendingCommit?
        let now = vault.now
        do throws(LockboxError) {
            let change = { @Sendable (index: Int) throws(LockboxError) -> SyncedChange in
                let change = changes[index]
                // Dated as the other device made it: a row applied here whose state is then
                // lost (a crash between the two commits) is pushed again with its own stamp,
                // not taken for a newer edit made here.
                guard var item = try change.sealed.opened(keys: keys).item else {
                    guard let existing = change.existing else { preconditionFailure("a tombstone of nothing here is not applied") }
                    return .delete(reference: existing, classes: Self.syncedClasses, madeAt: Self.appliedDate(change.sealed.record.stamp, now: now))
                }
                item.attributes.modificationDate = Self.appliedDate(change.sealed.record.stamp, now: now)
                guard let existing = change.existing else { return .add(item) }
                return .replace(reference: existing, with: item)
            }
            // Many changes (a new device's import) are staged and sealed on other threads, and
            // the state written while the vault commits.
            let applied: AppliedChanges
            do throws(LockboxError) {
                if changes.count >= Self.bulkApplyMinimum {
                    let written = pending
                    applied = try vault.applyChanges(
                        count: changes.count, concurrently: change, sizeLimit: Vault.syncedItemSizeLimit,
                        beforeCommit: { applied throws(LockboxError) in
                            // Called again only if the vault ran its transaction again: the
                            // first attempt's state is rolled back first.
                            started?.abandon()
                            try listAdded(applied)
                            var recorded = written
                            record(applied, in: &recorded)
                            started = state.startCommit(recorded)
                        },
                        afterCommit: { started?.proceed() })
                } else {
                    applied = try vault.applyChanges(count: changes.count, change, sizeLimit: Vault.syncedItemSizeLimit, beforeCommit: listAdded)
                }
            } catch {
                // The state's commit is rolled back with the vault's; should that rollback have
                // failed, its connection is unusable, which is the error to report.
                if let failed = started?.abandon() { throw failed }
                started = nil
                throw error
            }
            record(applied, in: &pending)
            return started
        } catch where error.code == .duplicateItem || error.code == .itemNotFound {
            // New items, added together below: one transaction, their rows listed once.
            var adds: [(id: String, record: SyncRecord, item: Item)] = []
            for change in changes {
                let record = try change.sealed.opened(keys: keys)
                // No row the state knows holds the item: none known, or the known one deleted
                // or replaced here after the push listed the rows (another process).
                if let item = record.item, try !holds(change.existing, change.id) {
                    switch try unknownLocal(sameKeyAs: item) {
                    case .syncing(let reference, let local):
                        // A row of this item the state does not know: written here after the
                        // push, so this sync has not compared it with the record. Not
                        // overwritten: the same content written no later than the record is
                        // adopted; other content, or a later write of the same, is left for the
                        // next push, which settles it against this record by the rule (the
                        // later write wins), as an edit made since the push is.
                        if local.digest == record.contentDigest
                            && Self.milliseconds(local.item.attributes.modificationDate) <= record.stamp.modified
                        {
                            pending.setRow(reference, .some(change.id))
                        } else {
                            pending.entries.removeValue(forKey: change.id)
                        }
                        notApplied += 1
                        continue
                    case .notSyncing:
                        // An item of the same primary key here that does not sync (ThisDeviceOnly,
                        // say): what the user keeps on this device is neither overwritten nor
                        // duplicated; the record is held back until its key is free here.
                        pending.holdBack(change.id)
                        notApplied += 1
                        continue
                    case .none:
                        break
                    }
                    if change.existing != nil {
                        // Deleted here since the push: not brought back. The next push sees the
                        // row gone and writes the delete, as for one made before this sync.
                        pending.entries.removeValue(forKey: change.id)
                        notApplied += 1
                        continue
                    }
                    guard Self.isEligible(item), itemID(item) == change.id else { throw LockboxError.syncDatabase() }
                    adds.append((change.id, record, item))
                    continue
                }
                switch try apply(record, id: change.id, existing: change.existing, state: state) {
                case .row(let reference):
                    pending.setRow(reference, .some(change.id))
                case .kept(let reference):
                    pending.setRow(reference, .some(change.id))
                    notApplied += 1
                case .deleted:
                    if let existing = change.existing { pending.setRow(existing, .none) }
                case .heldBack:
                    if let existing = change.existing { pending.setRow(existing, .none) }
                    pending.holdBack(change.id)
                    notApplied += 1
                }
            }
            guard !adds.isEmpty else { return nil }
            let applied = try vault.applyChanges(
                count: adds.count,
                { index throws(LockboxError) -> SyncedChange in
                    // Dated as the other device made it (see above).
                    var item = adds[index].item
                    item.attributes.modificationDate = Self.appliedDate(adds[index].record.stamp, now: now)
                    return .add(item)
                },
                sizeLimit: Vault.syncedItemSizeLimit,
                beforeCommit: { applied throws(LockboxError) in
                    var added: [Data: SyncState.Applying] = [:]
                    for (add, reference) in zip(adds, applied.references) {
                        if let reference { added[reference] = SyncState.Applying(id: add.id, entry: SyncState.Entry(add.record)) }
                    }
                    try listAdding(added, in: state)
                })
            for (add, reference) in zip(adds, applied.references) {
                if let reference { pending.setRow(reference, .some(add.id)) }
            }
            return nil
        }
    }

    /// True when the vault row `reference` (if any) still holds the item `id`.
    private func holds(_ reference: Data?, _ id: String) throws(LockboxError) -> Bool {
        guard let reference, let local = try readLocal(reference) else { return false }
        return itemID(local.item) == id
    }

    /// The row of this vault with an item of some item's primary key (``unknownLocal(sameKeyAs:)``).
    enum LocalRow {
        /// None.
        case none
        /// One that syncs: its reference and item.
        case syncing(Data, LocalItem)
        /// One that does not sync (ThisDeviceOnly, access control).
        case notSyncing
    }

    /// The row holding an item of `item`'s primary key (its class's key attributes, access
    /// group and sync flag, whatever its other attributes), if any, and whether it syncs.
    private func unknownLocal(sameKeyAs item: Item) throws(LockboxError) -> LocalRow {
        var query = Query(item.itemClass, limit: .all, returning: [.attributes, .persistentReference], synchronizable: .synchronizable)
        var key = ItemAttributes()
        for field in ItemAttributes.primaryKeyFields(of: item.itemClass) { field.copy(from: item.attributes, to: &key) }
        key.accessGroup = item.attributes.accessGroup
        query.attributes = key
        let wanted = PrimaryKey.encode(item.itemClass, item.attributes)
        let found: [Item]
        do {
            found = try vault.items(matching: query)
        } catch where error.code == .itemNotFound {
            return .none
        }
        guard let reference = found.first(where: { PrimaryKey.encode(item.itemClass, $0.attributes) == wanted })?.persistentReference else {
            return .none
        }
        guard let local = try readLocal(reference) else { return .notSyncing }
        return .syncing(reference, local)
    }

    /// What ``apply(_:id:existing:state:)`` left in the vault.
    enum AppliedRecord: Equatable {
        /// The row that holds the item.
        case row(Data)
        /// The row that holds the item, written here (another process) after the record and
        /// kept: the record is not applied, and the next push writes the row.
        case kept(Data)
        /// None: the record was a delete.
        case deleted
        /// None: an item of this vault that does not sync holds the item's primary key, and is
        /// kept (``SyncState/heldBack``).
        case heldBack
    }

    /// Applies another device's record through the vault's own add, update and delete, so its
    /// integrity record stays current; a row it adds is listed in `state` before the vault
    /// commits it (``SyncState/applying``).
    func apply(_ record: SyncRecord, id: String, existing: Data?, state: SyncState) throws(LockboxError) -> AppliedRecord {
        guard let item = record.item else {
            if let existing {
                for itemClass in Self.syncedClasses {
                    var query = Query(itemClass, synchronizable: .any)
                    query.persistentReference = existing
                    do {
                        _ = try vault.delete(matching: query, recordingDeletionAt: Self.appliedDate(record.stamp, now: vault.now))
                    } catch where error.code == .itemNotFound {}
                }
            }
            return .deleted
        }
        guard Self.isEligible(item), itemID(item) == id else { throw LockboxError.syncDatabase() }
        // Dated as the other device made it (see ``applyPulled``).
        var dated = item
        dated.attributes.modificationDate = Self.appliedDate(record.stamp, now: vault.now)
        // The item in the row `reference` replaced by the record's, as a pull's bulk apply does.
        func replace(_ reference: Data) throws(LockboxError) {
            _ = try vault.applyChanges(
                count: 1, { _ throws(LockboxError) in .replace(reference: reference, with: dated) }, sizeLimit: Vault.syncedItemSizeLimit,
                beforeCommit: { _ throws(LockboxError) in })
        }
        if let existing {
            do {
                try replace(existing)
                // Replaced in place: the row is the one that held the item. (Not looked up by
                // the item's attributes: a query leaves an absent key attribute, a port say,
                // unmatched, and would find a sibling item's row.)
                return .row(existing)
            } catch where error.code == .itemNotFound {}
        }
        do {
            let applied = try vault.applyChanges(count: 1, { _ throws(LockboxError) in .add(dated) }, sizeLimit: Vault.syncedItemSizeLimit) { applied throws(LockboxError) in
                guard let reference = applied.references.first ?? nil else { return }
                try listAdding([reference: SyncState.Applying(id: id, entry: SyncState.Entry(record))], in: state)
            }
            return (applied.references.first ?? nil).map { .row($0) } ?? .deleted
        } catch where error.code == .duplicateItem {
            switch try unknownLocal(sameKeyAs: item) {
            case .notSyncing:
                // An item of the same primary key that does not sync (ThisDeviceOnly, say):
                // what the user keeps on this device is not overwritten; not applied.
                return .heldBack
            case .syncing(let reference, let local) where Self.milliseconds(local.item.attributes.modificationDate) > record.stamp.modified:
                // Written here (another process) after the record: the later write, kept;
                // the next push finds it changed from the record and writes it.
                return .kept(reference)
            case .syncing(let reference, _):
                // The row moved (another process re-added it, earlier): the record replaces it.
                try replace(reference)
                return .row(reference)
            case .none:
                throw error
            }
        }
    }

    /// The records of the group's items held back here (``SyncState/heldBack``) that a pull did
    /// not receive, each checked against the head the pull verified: the one it lists, or a
    /// later one written since (above `counter`, left to the next pull, which receives it). A
    /// record missing, or another one, is refused as withheld before anything is applied.
    func heldBackRecords(
        _ connection: PostgresConnection, state: SyncState, received: Set<String>, counter: Int64
    ) throws(LockboxError) -> [(id: String, sealed: SealedValueRecord)] {
        let waiting = state.heldBack.subtracting(received)
        guard !waiting.isEmpty else { return [] }
        let keys = self.keys
        var fetched: Set<String> = []
        var records: [(id: String, sealed: SealedValueRecord)] = []
        for row in try connection.executeBinary(
            "SELECT item_id, version, payload FROM lockbox_sync_items WHERE group_id = $1 AND item_id = ANY($2::text[])",
            [.text(groupID), .texts(waiting.sorted())])
        {
            guard row.count == 3, let idBytes = row[0], let payload = row[2] else { throw LockboxError.syncDatabase() }
            let id = String(decoding: idBytes, as: UTF8.self)
            guard waiting.contains(id), fetched.insert(id).inserted else { throw LockboxError.syncDatabase() }
            let version = try PostgresConnection.integer(binary: row[1])
            if version > counter { continue }
            guard let listed = try state.verified(id), listed.version == version else { throw SyncHead.withheld() }
            let sealed = try SealedValueRecord(payload, group: groupID, itemID: id, version: version, keys: keys)
            guard SyncHead.equal(SyncHead.element(itemID: id, version: version, record: sealed.record, keys: keys), listed.element) else {
                throw SyncHead.withheld()
            }
            records.append((id, sealed))
        }
        // Records are never deleted: the head lists a record of every item held back.
        guard fetched == waiting else { throw SyncHead.withheld() }
        return records
    }

    /// Tries again the group's items held back by a local item of their primary key
    /// (``SyncState/heldBack``), with their records (``heldBackRecords(_:state:received:counter:)``):
    /// one is applied once no item here holds its key; a delete is taken as known. One whose
    /// record, or a later one, the state knows since (this device pushed the item: the local
    /// item was made to sync, and its write won or lost by the rule) is no longer held back, nor
    /// is one a syncing row here holds that the state does not know yet (another process wrote
    /// it during this sync): the next push settles it by the rule. (An older record the state
    /// knows, from before the item was held back, ends nothing.)
    func retryHeldBack(
        _ records: [(id: String, sealed: SealedValueRecord)], state: SyncState, report: inout Report
    ) throws(LockboxError) {
        guard !records.isEmpty else { return }
        var changes = SyncState.Changes()
        // The rows applied here are recorded by this commit: their listing is settled with it.
        changes.settlesApplying = true
        let keys = self.keys
        for (id, sealed) in records where state.heldBack.contains(id) {
            if let known = try state.entry(id), known.stamp >= sealed.record.stamp {
                changes.heldBack[id] = false
                continue
            }
            let record = try sealed.opened(keys: keys)
            guard let item = record.item else {
                changes.heldBack[id] = false
                changes.entries[id] = SyncState.Entry(record)
                continue
            }
            guard Self.isEligible(item), itemID(item) == id else { throw LockboxError.syncDatabase() }
            switch try unknownLocal(sameKeyAs: item) {
            case .notSyncing:
                continue
            case .syncing:
                changes.heldBack[id] = false
                continue
            case .none:
                break
            }
            switch try apply(record, id: id, existing: nil, state: state) {
            case .row(let reference):
                changes.setRow(reference, .some(id))
                changes.entries[id] = SyncState.Entry(record)
                changes.heldBack[id] = false
                report.pulled += 1
            case .kept:
                // Written here meanwhile: as a syncing row found above.
                changes.heldBack[id] = false
            case .deleted, .heldBack:
                continue
            }
        }
        try state.commit(changes)
    }
}

/// The phases of a pull, timed.
package struct PullTimings: Sendable {
    /// Records fetched (those above the cursor).
    package var records = 0
    /// The counter and the records, from PostgreSQL.
    package var fetch = Duration.zero
    /// Opening every record's metadata.
    package var open = Duration.zero
    /// Checking the records received against the group's head.
    package var verify = Duration.zero
    /// Comparing with what this device knows; applying updates and deletes.
    package var decide = Duration.zero
    /// The vault's one transaction: new items added, others replaced or deleted (values opened there).
    package var vault = Duration.zero
    /// The local state's commit.
    package var state = Duration.zero
    /// The device's cursor, written to the database.
    package var cursor = Duration.zero

    package init() {}
}

