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
    public let vault: Vault
    let database: String
    let keys: SyncKeys
    /// Where this vault keeps what it knows of the group (see ``SyncState``).
    public let statePath: String
    /// One sync at a time through this value (the state file is read, then rewritten).
    private let syncing = Mutex(())

    /// What one ``sync()`` did.
    public struct Report: Sendable, Equatable {
        /// Records this device wrote (edits and tombstones); a record the database already held
        /// is not counted.
        public var pushed = 0
        /// Records of other devices applied here (including deletes).
        public var pulled = 0
        /// Local edits that lost to a later write of another device (that write was applied).
        public var superseded = 0
    }

    static let keyService = "lockbox.sync.group-key"
    static let keyAccessGroup = "lockbox.sync"

    private init(groupID: String, vault: Vault, database: String, groupKey: SecretBytes) {
        self.groupID = groupID
        self.vault = vault
        self.database = database
        keys = SyncKeys(groupKey: groupKey)
        statePath = vault.path + ".sync/" + groupID + ".state"
    }

    // MARK: Creating, joining, opening

    /// Creates a group (this vault is its first device): a random group key, kept in this vault
    /// as a `ThisDeviceOnly` item, and in the database only sealed by a key derived from
    /// `passphrase` (Argon2id), for other devices to join with.
    public static func create(vault: Vault, database: String, passphrase: SecretBytes) throws(LockboxError) -> SyncGroup {
        guard !passphrase.isEmpty else {
            throw LockboxError(.param, "The group passphrase is empty. Choose one to protect the sync group.")
        }
        let connection = try PostgresConnection(database)
        try SyncSchema.migrate(connection)
        let groupID = Crypto.randomBytes(16).hexString
        let groupKey = Crypto.generateKey()
        let derivation = PassphraseKeyDerivation(strength: .interactive)
        guard let wrappingKey = try derivation.deriveKey(from: passphrase) else {
            throw LockboxError(.allocate, "Cannot allocate memory to derive the group key. Free some memory and try again.")
        }
        var wrap = FieldEncoder()
        wrap.bytes(derivation.encoded())
        wrap.bytes(Crypto.seal(groupKey, key: wrappingKey, associatedData: keyWrapAssociatedData(groupID, derivation.encoded())))
        try storeGroupKey(groupKey, groupID: groupID, in: vault)
        try connection.execute(
            "INSERT INTO lockbox_sync_groups (group_id, counter, key_wrap) VALUES ($1, 0, $2)",
            [.text(groupID), .bytes(wrap.bytes)])
        return SyncGroup(groupID: groupID, vault: vault, database: database, groupKey: groupKey)
    }

    /// Joins an existing group with its passphrase; the group key is then kept in this vault.
    /// - Throws: `authFailed` for a wrong passphrase; `itemNotFound` when there is no such group.
    public static func join(
        _ groupID: String, vault: Vault, database: String, passphrase: SecretBytes
    ) throws(LockboxError) -> SyncGroup {
        let connection = try PostgresConnection(database)
        try SyncSchema.migrate(connection)
        let rows = try connection.execute("SELECT key_wrap FROM lockbox_sync_groups WHERE group_id = $1", [.text(groupID)])
        guard let row = rows.first else {
            throw LockboxError(.itemNotFound, "There is no sync group \(groupID) in that database. Check the group identifier.")
        }
        var decoder = FieldDecoder(try PostgresConnection.bytes(row[0]))
        guard let parameters = try? decoder.bytes(), let box = try? decoder.bytes(), decoder.isAtEnd,
            let derivation = PassphraseKeyDerivation(decoding: parameters), derivation.meetsMinimum
        else { throw LockboxError.integrity("The sync group's key") }
        guard let wrappingKey = try derivation.deriveKey(from: passphrase) else {
            throw LockboxError(.allocate, "Cannot allocate memory to derive the group key. Free some memory and try again.")
        }
        guard let groupKey = try? Crypto.open(box, key: wrappingKey, associatedData: keyWrapAssociatedData(groupID, parameters)),
            groupKey.count == Crypto.keyByteCount
        else {
            throw LockboxError(.authFailed, "The group passphrase is wrong. Enter the passphrase the group was created with.")
        }
        try storeGroupKey(groupKey, groupID: groupID, in: vault)
        return SyncGroup(groupID: groupID, vault: vault, database: database, groupKey: groupKey)
    }

    /// A group this vault already belongs to, with the group key from the vault.
    /// - Throws: `itemNotFound` when this vault has not joined the group.
    public convenience init(_ groupID: String, vault: Vault, database: String) throws(LockboxError) {
        var query = Query.genericPassword(service: Self.keyService, account: groupID, accessGroup: Self.keyAccessGroup)
        query.returning = [.data]
        let groupKey: SecretBytes
        do {
            groupKey = try vault.data(matching: query)
        } catch where error.code == .itemNotFound {
            throw LockboxError(.itemNotFound, "This keychain has not joined the sync group \(groupID). Join it with the group passphrase.")
        }
        guard groupKey.count == Crypto.keyByteCount else { throw LockboxError.integrity("The sync group's key") }
        self.init(groupID: groupID, vault: vault, database: database, groupKey: groupKey)
    }

    static func keyWrapAssociatedData(_ groupID: String, _ parameters: [UInt8]) -> [UInt8] {
        var encoder = FieldEncoder()
        encoder.string("lockbox.sync.group-key.v1")
        encoder.string(groupID)
        encoder.bytes(parameters)
        return encoder.bytes
    }

    /// The group key as an item of this vault: sealed by its `afterFirstUnlockThisDeviceOnly`
    /// class key, so it never leaves the machine (not in backups, not in a copied file), and
    /// never synchronized.
    static func storeGroupKey(_ key: SecretBytes, groupID: String, in vault: Vault) throws(LockboxError) {
        let item = Item.genericPassword(
            service: keyService, account: groupID, data: key, accessibility: .afterFirstUnlockThisDeviceOnly,
            accessGroup: keyAccessGroup, label: "Lockbox sync group key")
        do {
            try vault.add(item)
        } catch where error.code == .duplicateItem {
            let query = Query.genericPassword(service: keyService, account: groupID, accessGroup: keyAccessGroup)
            guard try vault.data(matching: query) == key else {
                throw LockboxError(.duplicateItem, "This keychain already holds another key for the sync group \(groupID).")
            }
        }
    }

    // MARK: Syncing

    /// One local item that may sync.
    struct LocalItem {
        var item: Item
        var digest: [UInt8]
    }

    static let syncedClasses: [ItemClass] = [.genericPassword, .internetPassword, .certificate]

    /// Pushes this vault's changes since the last sync, then pulls the other devices' (only
    /// records newer than this device's cursor). Each phase is one database transaction; a
    /// crash or a dropped connection at any point loses nothing and duplicates nothing: run it
    /// again.
    /// - Throws: `interactionNotAllowed` when the vault is locked (a locked item is never taken
    ///   for a deleted one); `notAvailable` when the database cannot be reached (the vault is
    ///   untouched); `decode` when the database served a record that fails to open, or one
    ///   older than this device has already seen (a replay).
    @discardableResult
    public func sync() throws(LockboxError) -> Report {
        guard try vault.isUnlocked else {
            throw LockboxError.locked("Unlock it to sync: locked items cannot be read, and are never taken for deleted ones.")
        }
        return try syncing.withLock { _ throws(LockboxError) -> Report in
            let connection = try PostgresConnection(database)
            try SyncSchema.migrate(connection)
            var state = try SyncState.load(statePath, keys: keys) ?? SyncState(device: Crypto.randomBytes(8).hexString)
            var local = try localItems()
            var report = Report()
            try push(connection, state: &state, local: &local, report: &report)
            try state.save(statePath, keys: keys)
            try pull(connection, state: &state, local: &local, report: &report)
            try state.save(statePath, keys: keys)
            return report
        }
    }

    /// This vault's synchronizable items by opaque identifier.
    func localItems() throws(LockboxError) -> [String: LocalItem] {
        var result: [String: LocalItem] = [:]
        for itemClass in Self.syncedClasses {
            let listing = Query(itemClass, limit: .all, returning: [.attributes, .persistentReference], synchronizable: .synchronizable)
            let listed: [Item]
            do { listed = try vault.items(matching: listing) } catch where error.code == .itemNotFound { continue }
            let eligible = listed.filter { item in
                item.accessControl == nil && !(item.attributes.accessibility ?? .default).isThisDeviceOnly
            }
            if eligible.isEmpty { continue }
            var items: [Item]
            if eligible.count == listed.count {
                items = try vault.items(
                    matching: Query(itemClass, limit: .all, returning: [.attributes, .data, .persistentReference], synchronizable: .synchronizable))
            } else {
                items = []
                for candidate in eligible {
                    var query = Query(itemClass, returning: [.attributes, .data, .persistentReference], synchronizable: .any)
                    query.persistentReference = candidate.persistentReference
                    items += try vault.items(matching: query)
                }
            }
            for item in items where item.accessControl == nil && !(item.attributes.accessibility ?? .default).isThisDeviceOnly {
                result[itemID(item)] = LocalItem(item: item, digest: SyncRecord.contentDigest(item, keys: keys))
            }
        }
        return result
    }

    func itemID(_ item: Item) -> String {
        Array(Crypto.keyedDigest(PrimaryKey.encode(item.itemClass, item.attributes), key: keys.naming).prefix(20)).hexString
    }

    static func milliseconds(_ date: Date?) -> Int64 {
        Int64(((date ?? Date()).timeIntervalSince1970 * 1000).rounded(.down))
    }

    func push(
        _ connection: PostgresConnection, state: inout SyncState, local: inout [String: LocalItem], report: inout Report
    ) throws(LockboxError) {
        // What changed here since the last sync: edits and additions, then deletes.
        var changes: [(id: String, record: SyncRecord)] = []
        for (id, entry) in local.sorted(by: { $0.key < $1.key }) {
            let known = state.entries[id]
            if let known, !known.isTombstone, known.contentDigest == entry.digest { continue }
            // Causally after the version this device had seen, whatever its clock says.
            let modified = max(Self.milliseconds(entry.item.attributes.modificationDate), (known?.stamp.modified ?? 0) + 1)
            var item = entry.item
            item.attributes = SyncRecord.travelling(item.attributes)
            item.persistentReference = nil
            changes.append((id, SyncRecord(stamp: SyncStamp(modified: modified, device: state.device), item: item, contentDigest: entry.digest)))
        }
        for (id, known) in state.entries.sorted(by: { $0.key < $1.key }) where !known.isTombstone && local[id] == nil {
            let modified = max(Self.milliseconds(nil), known.stamp.modified + 1)
            changes.append((id, SyncRecord(stamp: SyncStamp(modified: modified, device: state.device), item: nil, contentDigest: [])))
        }
        guard !changes.isEmpty else { return }

        var written: [(id: String, record: SyncRecord)] = []
        var superseding: [(id: String, record: SyncRecord)] = []
        var writes = 0
        let cursor = state.cursor
        try connection.transaction { () throws(LockboxError) in
            // The group row's lock orders every writer of the group: versions commit in order.
            var counter = try lockedCounter(connection, cursor: cursor)
            for change in changes {
                let rows = try connection.execute(
                    "SELECT version, payload FROM lockbox_sync_items WHERE group_id = $1 AND item_id = $2",
                    [.text(groupID), .text(change.id)])
                if let row = rows.first {
                    let remote = try SyncRecord.open(
                        try PostgresConnection.bytes(row[1]), group: groupID, itemID: change.id,
                        version: try PostgresConnection.integer(row[0]), keys: keys)
                    if remote.stamp == change.record.stamp {
                        // Written by an earlier run that stopped before saving its state.
                        written.append(change)
                        continue
                    }
                    if remote.contentDigest == change.record.contentDigest && remote.isTombstone == change.record.isTombstone {
                        // The same content already (a state file lost, an item applied before
                        // its state was saved): adopt the database's record, write nothing.
                        written.append((change.id, remote))
                        continue
                    }
                    if change.record.stamp < remote.stamp {
                        superseding.append((change.id, remote))
                        continue
                    }
                }
                counter += 1
                try connection.execute(
                    """
                    INSERT INTO lockbox_sync_items (group_id, item_id, version, device_id, payload) VALUES ($1, $2, $3, $4, $5)
                    ON CONFLICT (group_id, item_id) DO UPDATE
                    SET version = excluded.version, device_id = excluded.device_id, payload = excluded.payload
                    """,
                    [
                        .text(groupID), .text(change.id), .integer(counter), .text(change.record.stamp.device),
                        .bytes(change.record.seal(group: groupID, itemID: change.id, version: counter, keys: keys)),
                    ])
                written.append(change)
                writes += 1
            }
            try connection.execute(
                "UPDATE lockbox_sync_groups SET counter = $2 WHERE group_id = $1", [.text(groupID), .integer(counter)])
        }
        for change in written {
            state.entries[change.id] = SyncState.Entry(
                stamp: change.record.stamp, contentDigest: change.record.contentDigest, isTombstone: change.record.isTombstone)
        }
        report.pushed += writes
        for change in superseding {
            try apply(change.record, id: change.id, local: &local)
            state.entries[change.id] = SyncState.Entry(
                stamp: change.record.stamp, contentDigest: change.record.contentDigest, isTombstone: change.record.isTombstone)
            report.superseded += 1
        }
    }

    /// The group's counter, row-locked until the transaction ends. A counter below what this
    /// device has pulled means the database was rolled back (restored, or replayed).
    private func lockedCounter(_ connection: PostgresConnection, cursor: Int64) throws(LockboxError) -> Int64 {
        let rows = try connection.execute(
            "SELECT counter FROM lockbox_sync_groups WHERE group_id = $1 FOR UPDATE", [.text(groupID)])
        guard let row = rows.first else {
            throw LockboxError(.itemNotFound, "The sync group \(groupID) is not in the database any more. Nothing was changed here.")
        }
        let counter = try PostgresConnection.integer(row[0])
        guard counter >= cursor else { throw rolledBack() }
        return counter
    }

    private func rolledBack() -> LockboxError {
        LockboxError(
            .decode,
            "The sync database is older than what this device already saw: it was rolled back or is replaying old records. "
                + "Nothing was applied; have the database restored to its latest state.")
    }

    func pull(
        _ connection: PostgresConnection, state: inout SyncState, local: inout [String: LocalItem], report: inout Report
    ) throws(LockboxError) {
        let cursor = state.cursor
        // One snapshot: the counter and the records below it agree.
        let (counter, rows) = try connection.transaction { () throws(LockboxError) -> (Int64, [[String?]]) in
            try connection.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
            let counterRows = try connection.execute(
                "SELECT counter FROM lockbox_sync_groups WHERE group_id = $1", [.text(groupID)])
            guard let counterRow = counterRows.first else {
                throw LockboxError(.itemNotFound, "The sync group \(groupID) is not in the database any more. Nothing was changed here.")
            }
            let counter = try PostgresConnection.integer(counterRow[0])
            guard counter >= cursor else { throw rolledBack() }
            let rows = try connection.execute(
                "SELECT item_id, version, payload FROM lockbox_sync_items WHERE group_id = $1 AND version > $2 ORDER BY version",
                [.text(groupID), .integer(cursor)])
            return (counter, rows)
        }
        for row in rows {
            guard let id = row[0] else { throw LockboxError.integrity("A record of the sync database") }
            let version = try PostgresConnection.integer(row[1])
            guard version > cursor, version <= counter else { throw LockboxError.integrity("A record of the sync database") }
            let record = try SyncRecord.open(try PostgresConnection.bytes(row[2]), group: groupID, itemID: id, version: version, keys: keys)
            let known = state.entries[id]
            if let known {
                if known.stamp == record.stamp { continue }
                if record.stamp < known.stamp { throw rolledBack() }
            }
            let entry = SyncState.Entry(stamp: record.stamp, contentDigest: record.contentDigest, isTombstone: record.isTombstone)
            if let mine = local[id], mine.digest != known?.contentDigest, mine.digest != record.contentDigest {
                // Edited here since the last push: the next push settles it by the same rule.
                continue
            }
            if local[id] == nil && record.isTombstone {
                state.entries[id] = entry
                continue
            }
            if local[id]?.digest != record.contentDigest || record.isTombstone {
                try apply(record, id: id, local: &local)
                report.pulled += 1
            }
            state.entries[id] = entry
        }
        state.cursor = counter
        try connection.execute(
            """
            INSERT INTO lockbox_sync_devices (group_id, device_id, pulled_version) VALUES ($1, $2, $3)
            ON CONFLICT (group_id, device_id) DO UPDATE SET pulled_version = excluded.pulled_version
            """,
            [.text(groupID), .text(state.device), .integer(counter)])
    }

    /// Applies another device's record through the vault's own add, update and delete, so its
    /// integrity record stays current.
    func apply(_ record: SyncRecord, id: String, local: inout [String: LocalItem]) throws(LockboxError) {
        guard let item = record.item else {
            if let existing = local[id] {
                do {
                    _ = try vault.delete(matching: referenceQuery(existing.item))
                } catch where error.code == .itemNotFound {}
                local[id] = nil
            }
            return
        }
        guard item.attributes.synchronizable == true, !(item.attributes.accessibility ?? .default).isThisDeviceOnly,
            Self.syncedClasses.contains(item.itemClass), itemID(item) == id
        else { throw LockboxError.integrity("A record of the sync database") }
        if let existing = local[id] {
            try vault.update(matching: referenceQuery(existing.item), to: ItemUpdate(attributes: item.attributes, data: item.data))
        } else {
            try vault.add(item)
        }
        var stored = item
        var query = Query(item.itemClass, returning: [.persistentReference], synchronizable: .synchronizable)
        query.attributes = item.attributes
        stored.persistentReference = try vault.items(matching: query).first?.persistentReference
        local[id] = LocalItem(item: stored, digest: record.contentDigest)
    }

    func referenceQuery(_ item: Item) -> Query {
        var query = Query(item.itemClass, synchronizable: .any)
        query.persistentReference = item.persistentReference
        return query
    }
}
