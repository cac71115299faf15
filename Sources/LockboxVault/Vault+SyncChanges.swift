import FoundationEssentials
import LockboxCore
import VaultCrypto
import VaultStorage

/// What changed among the synchronizable rows since a generation: the small, read-only answer
/// sync needs to push only changes (docs/SYNC.md, "Finding local changes").
public struct SynchronizableChanges: Sendable {
    /// The vault's write generation when the rows were listed (one snapshot with them). Pass it
    /// as `since` next time.
    public var generation: Int
    /// How many rows are marked synchronizable now (whatever their accessibility).
    public var count: Int
    /// Persistent references of the synchronizable rows written after `since`.
    public var changed: [Data]
    /// Persistent references of every synchronizable row, when asked for (`listingAll`).
    public var all: Set<Data>?
    /// True when the vault's generation is still `since`: nothing was written, and the rows
    /// were not listed (`count` is then 0).
    public var isUnchanged = false
}

extension Vault {
    /// The synchronizable rows written after generation `since`, found from the rows' plain
    /// columns (each row records the generation that wrote it) without opening any row: the
    /// cost is one pass over the rows' identifiers, not a decryption of every item.
    ///
    /// Nothing is opened, so nothing here is trusted as content: read each changed row through
    /// ``items(matching:)`` (which authenticates it) before using it. When nothing was written
    /// since `since`, the answer says so without listing (``SynchronizableChanges/isUnchanged``). A row whose generation
    /// column was edited fails that authentication when read.
    ///
    /// - Parameters:
    ///   - since: the `generation` of an earlier answer; 0 for every row.
    ///   - listingAll: also return every synchronizable row's reference (to find deletes).
    /// - Throws: `decode` when the integrity record fails its check or was rolled back.
    public func synchronizableChanges(since: Int, listingAll: Bool = false) throws(LockboxError) -> SynchronizableChanges {
        try withState { state throws(LockboxError) -> SynchronizableChanges in
            try state.database.readTransaction { () throws(LockboxError) -> SynchronizableChanges in
                let integrity = try currentIntegrity(state)
                let generation = integrity.state?.generation ?? 0
                // Every write moves the generation: an unchanged one needs no listing.
                if generation == since && since > 0 && !listingAll {
                    return SynchronizableChanges(generation: generation, count: 0, changed: [], all: nil, isUnchanged: true)
                }
                var changes = SynchronizableChanges(generation: generation, count: 0, changed: [], all: listingAll ? [] : nil)
                // The partial index `items_synchronizable` (schema 3) holds the synchronizable
                // rows by version: the count reads it alone, the changes only their entries.
                changes.count = try state.database.firstRow("SELECT count(*) FROM items WHERE synchronizable = 1") {
                    $0.integer(0) ?? 0
                } ?? 0
                let changed = try state.database.statement("SELECT id FROM items WHERE synchronizable = 1 AND version > ?")
                defer { changed.reset() }
                changed.bind(1, since)
                while try changed.step() { changes.changed.append(Data(changed.blob(0) ?? [])) }
                if listingAll {
                    let every = try state.database.statement("SELECT id FROM items WHERE synchronizable = 1")
                    defer { every.reset() }
                    while try every.step() { changes.all?.insert(Data(every.blob(0) ?? [])) }
                }
                return changes
            }
        }
    }
}

extension Vault {
    /// Which of `references` are rows of this vault, of any class and synchronizable or not, as
    /// ``synchronizableChanges(since:listingAll:)`` lists rows (identifiers, nothing opened): a
    /// sync settling the rows it listed before a commit asks which the vault holds.
    public func presentRows(among references: some Collection<Data>) throws(LockboxError) -> Set<Data> {
        guard !references.isEmpty else { return [] }
        return try withState { state throws(LockboxError) -> Set<Data> in
            try state.database.readTransaction { () throws(LockboxError) -> Set<Data> in
                let statement = try state.database.statement("SELECT 1 FROM items WHERE id = ?")
                defer { statement.reset() }
                var present = Set<Data>()
                for reference in references {
                    statement.reset()
                    statement.bind(1, Array(reference))
                    if try statement.step() { present.insert(reference) }
                }
                return present
            }
        }
    }
}

extension Vault {
    /// How long a deletion stays recorded when no sync forgets it: 180 days, in milliseconds.
    static let deletionsKept: Int64 = 180 * 24 * 3600 * 1000

    /// A date in whole milliseconds (rounded: a record's stamp made a date comes back exact).
    static func milliseconds(_ date: Date) -> Int64 {
        Int64((date.timeIntervalSince1970 * 1000).rounded())
    }

    /// The key of deletion records' MACs, derived from the vault's state key.
    static func deletionKey(_ stateKey: SecretBytes) -> SecretBytes {
        Crypto.deriveKey(from: stateKey, context: "lbxdelet", identifier: 1)
    }

    /// The key of the values the integrity record sums for the deletion records, derived from
    /// their MAC key: a record's value is a keyed digest of its MAC, which the file does not
    /// show, so a sum cannot be made up from the MACs it does.
    static func deletionSumKey(_ deletionKey: SecretBytes) -> SecretBytes {
        Crypto.deriveKey(from: deletionKey, context: "lbxdelsm", identifier: 1)
    }

    /// A record's value in the integrity record's sum.
    static func deletionElement(mac: [UInt8], sumKey: SecretBytes) -> [UInt8] {
        Crypto.keyedDigest(mac, key: sumKey)
    }

    static func deletionMAC(reference: [UInt8], milliseconds: Int64, generation: Int, key: SecretBytes) -> [UInt8] {
        var encoder = FieldEncoder()
        encoder.string("lockbox.vault.sync-deletion.v1")
        encoder.bytes(reference)
        encoder.integer(Int(milliseconds))
        encoder.integer(generation)
        return Crypto.keyedDigest(encoder.bytes, key: key)
    }

    /// True when a deletion record's columns are what Lockbox wrote: a blob reference, whole
    /// numbers stored as numbers, a blob MAC, and the MAC over them. `statement`'s current row
    /// holds `reference, deleted_at, generation, mac` from column `first` on.
    static func isSoundDeletionRecord(_ statement: Statement, from first: Int32 = 0, key: SecretBytes) -> Bool {
        // Storage classes first: SQLite reads text "123ms" as the number 123, and text as bytes.
        guard statement.storageClass(first) == .blob, statement.storageClass(first + 1) == .integer,
            statement.storageClass(first + 2) == .integer, statement.storageClass(first + 3) == .blob,
            let reference = statement.blob(first), let milliseconds = statement.integer(first + 1),
            let generation = statement.integer(first + 2), let mac = statement.blob(first + 3)
        else { return false }
        let expected = deletionMAC(reference: reference, milliseconds: Int64(milliseconds), generation: generation, key: key)
        return mac.count == expected.count && mac.withUnsafeBytes { a in expected.withUnsafeBytes { b in constantTimeEquals(a, b) } }
    }

    /// The error for deletion records that fail their check, with the way out.
    func damagedDeletionRecord() -> LockboxError {
        LockboxError(
            .decode,
            "The records of deleted synchronizable items in the keychain \(path) were modified outside Lockbox (a record "
                + "edited, removed or put back), so sync refuses to use them. `lockbox verify` shows what; "
                + "`lockbox sync forget-damaged-deletions` drops the damaged ones and accepts the rest (the deletes they "
                + "recorded, if not yet synced, then lose to any later edit made on another device).")
    }

    /// The deletion records as a whole, as a sync finds them: the table there, every record
    /// sound, and (from the integrity record's format 6) their values summing to what `stored`
    /// covers, so that a record removed, added or put back from an older copy counts like an
    /// edited one.
    struct DeletionRecordAssessment {
        var tableMissing = false
        var records = 0
        var damaged = 0
        /// False when `stored` covers a sum that the records do not make.
        var sumMatches = true

        var isSound: Bool { !tableMissing && damaged == 0 && sumMatches }
    }

    static func assessDeletionRecords(
        in database: Database, key: SecretBytes, stored: IntegrityState?
    ) throws(LockboxError) -> DeletionRecordAssessment {
        guard try hasDeletionRecordTable(database) else { return DeletionRecordAssessment(tableMissing: true) }
        let records = try deletionRecordSum(in: database, key: key)
        var assessment = DeletionRecordAssessment(records: records.all, damaged: records.damaged)
        if let stored, stored.coversDeletions { assessment.sumMatches = IntegrityState.equal(records.sum, stored.deletions) }
        return assessment
    }

    /// ``assessDeletionRecords(in:key:stored:)`` against this transaction's integrity record.
    func assessDeletionRecords(_ state: State, key: SecretBytes) throws(LockboxError) -> DeletionRecordAssessment {
        try Self.assessDeletionRecords(in: state.database, key: key, stored: try currentIntegrity(state).state)
    }

    /// Drops an integrity cache filled before the index root was at hand (a handle that read
    /// while locked, unlocked since by this or another process), so that the next transaction
    /// fills it with the state key. Called before a transaction begins: inside one, the cache
    /// is read once per snapshot.
    func refreshIntegrityWithoutStateKey(_ state: State) {
        if let cached = state.integrity, cached.keys?.state == nil { state.integrity = nil }
    }

    /// The key deletion records are checked with, from this transaction's integrity record.
    func deletionKey(_ state: State) throws(LockboxError) -> SecretBytes {
        guard let stateKey = try currentIntegrity(state).keys?.state else { throw LockboxError.locked("Unlock the keychain to sync it.") }
        return Self.deletionKey(stateKey)
    }

    /// When each of `references`, synchronizable rows, was deleted here, as the deleting write
    /// recorded it (from vault schema 6), so that sync can stamp a delete with when it was
    /// made rather than when it noticed it. A row whose deletion is not recorded (deleted by
    /// an older Lockbox, or forgotten) is absent. A record that fails its check (its MAC, or a
    /// column stored as another kind of value) is an integrity error (`errSecDecode`), never a
    /// time; ``forgetDamagedDeletionRecords()`` drops such records.
    public func deletionTimes(of references: some Collection<Data>) throws(LockboxError) -> [Data: Date] {
        guard !references.isEmpty else { return [:] }
        return try withState { state throws(LockboxError) -> [Data: Date] in
            refreshIntegrityWithoutStateKey(state)
            return try state.database.readTransaction { () throws(LockboxError) -> [Data: Date] in
                let key = try deletionKey(state)
                let assessment = try assessDeletionRecords(state, key: key)
                guard !assessment.tableMissing else { throw missingDeletionRecordTable() }
                guard assessment.isSound else { throw damagedDeletionRecord() }
                let statement = try state.database.statement(
                    "SELECT reference, deleted_at, generation, mac FROM sync_deletions WHERE reference = ?")
                defer { statement.reset() }
                var times: [Data: Date] = [:]
                for reference in references {
                    statement.reset()
                    statement.bind(1, Array(reference))
                    guard try statement.step() else { continue }
                    guard Self.isSoundDeletionRecord(statement, key: key), let milliseconds = statement.integer(1) else {
                        throw damagedDeletionRecord()
                    }
                    times[reference] = Date(timeIntervalSince1970: Double(milliseconds) / 1000)
                }
                return times
            }
        }
    }

    /// The deletion records of the file: how many, how many fail their check under `key` (a
    /// reference present twice, which the table's key forbids, counts as damaged each time
    /// after the first), and the modular sum of the sound ones' values
    /// (``deletionElement(mac:sumKey:)``), what the integrity record covers from its format 6.
    /// The table must be there (``hasDeletionRecordTable(_:)``).
    static func deletionRecordSum(in database: Database, key: SecretBytes) throws(LockboxError) -> (all: Int, damaged: Int, sum: [UInt8]) {
        let sumKey = deletionSumKey(key)
        let statement = try database.statement("SELECT reference, deleted_at, generation, mac FROM sync_deletions")
        defer { statement.reset() }
        var result = (all: 0, damaged: 0, sum: [UInt8](repeating: 0, count: IntegrityState.accumulatorSize))
        var references = Set<[UInt8]>()
        while try statement.step() {
            result.all += 1
            guard isSoundDeletionRecord(statement, key: key), let reference = statement.blob(0), let mac = statement.blob(3),
                references.insert(reference).inserted
            else {
                result.damaged += 1
                continue
            }
            let element = deletionElement(mac: mac, sumKey: sumKey)
            result.sum.withUnsafeMutableBytes { sum in element.withUnsafeBytes { ModularSum.add($0, to: sum) } }
        }
        return result
    }

    /// The sum a record of an older format is converted with: the records as they are, none
    /// when the table is missing (it was covered by nothing before; sync reports it).
    static func deletionSumForConversion(in database: Database, stateKey: SecretBytes) throws(LockboxError) -> [UInt8] {
        guard try hasDeletionRecordTable(database) else { return [UInt8](repeating: 0, count: IntegrityState.accumulatorSize) }
        return try deletionRecordSum(in: database, key: deletionKey(stateKey)).sum
    }

    /// The error for a table of deletion records removed outside Lockbox, with the way out.
    func missingDeletionRecordTable() -> LockboxError {
        LockboxError(
            .decode,
            "The keychain's table of deleted synchronizable items is missing (removed outside Lockbox), so sync refuses to "
                + "run. `lockbox sync forget-damaged-deletions` makes it again, empty.")
    }

    static func hasDeletionRecordTable(_ database: Database) throws(LockboxError) -> Bool {
        try database.firstRow("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'sync_deletions'", read: { _ in true }) ?? false
    }

    /// The state of the records of deleted synchronizable rows, as a sync would find it.
    public struct DeletionRecordHealth: Sendable, Equatable {
        /// Records in the file (a copy of a reference counted each time).
        public var records: Int
        /// False when a sync would refuse them: a record edited, removed, copied or put back
        /// outside Lockbox, or the table missing. ``Vault/forgetDamagedDeletionRecords()``
        /// repairs it.
        public var isSound: Bool

        package init(records: Int, isSound: Bool) {
            self.records = records
            self.isSound = isSound
        }
    }

    /// Checks the records of deleted synchronizable rows as a sync does, without using them.
    /// Needs the keychain unlocked.
    public func deletionRecordHealth() throws(LockboxError) -> DeletionRecordHealth {
        try withState { state throws(LockboxError) -> DeletionRecordHealth in
            refreshIntegrityWithoutStateKey(state)
            return try state.database.readTransaction { () throws(LockboxError) -> DeletionRecordHealth in
                let assessment = try assessDeletionRecords(state, key: try deletionKey(state))
                return DeletionRecordHealth(records: assessment.records, isSound: assessment.isSound)
            }
        }
    }

    /// What ``forgetDamagedDeletionRecords()`` did.
    public struct DeletionRecordRepair: Sendable, Equatable {
        /// Records dropped because they failed their check.
        public var dropped: Int
        /// Besides the dropped records, the set had changed: the records left, with the dropped
        /// ones, no longer summed to what the integrity record covered (records removed, put
        /// back, or altered in their MAC outside Lockbox, or the table removed), and were
        /// accepted as they are.
        public var acceptedChangedSet: Bool

        /// True when nothing was wrong, and nothing was written.
        public var changedNothing: Bool { dropped == 0 && !acceptedChangedSet }
    }

    /// Drops the records of deleted synchronizable rows that fail their check (edited outside
    /// Lockbox), which sync otherwise refuses, and accepts the set left as it is (records
    /// removed or put back outside Lockbox no longer add up to the integrity record's sum,
    /// which sync also refuses); the sound records stay as they are. A delete whose record is
    /// dropped or was removed, if not yet synced, is pushed as one made just after the version
    /// this device knew: it loses to any later edit made on another device. Writes nothing when
    /// nothing is wrong. Needs the keychain unlocked.
    ///
    /// - Returns: what was dropped and accepted.
    /// - Throws: `errSecDecode` when a damaged record could not be dropped.
    public func forgetDamagedDeletionRecords() throws(LockboxError) -> DeletionRecordRepair {
        try withState { state throws(LockboxError) -> DeletionRecordRepair in
            refreshIntegrityWithoutStateKey(state)
            let sound = try state.database.readTransaction { () throws(LockboxError) -> Bool in
                try assessDeletionRecords(state, key: try deletionKey(state)).isSound
            }
            guard !sound else { return DeletionRecordRepair(dropped: 0, acceptedChangedSet: false) }
            return try writeRows(state) { writer throws(LockboxError) -> DeletionRecordRepair in
                guard let stateKey = writer.keys.state else { throw lockedError() }
                let key = Self.deletionKey(stateKey)
                // A table removed outside Lockbox is made again, empty.
                if try !Self.hasDeletionRecordTable(state.database) { try VaultSchema.createDeletionRecords(state.database) }
                let before = try Self.deletionRecordSum(in: state.database, key: key)
                // The MACs the dropped rows show: a record edited only in its other columns
                // still shows its own, so once its value is taken from the covered sum, the
                // rows left add up to it unless others were removed, put back or altered.
                var droppedMACs = Set<[UInt8]>()
                let ofAnotherKind = """
                    typeof(reference) <> 'blob' OR typeof(deleted_at) <> 'integer' OR typeof(generation) <> 'integer' OR typeof(mac) <> 'blob'
                    """
                let shown = try state.database.statement("SELECT mac FROM sync_deletions WHERE (\(ofAnotherKind)) AND typeof(mac) = 'blob'")
                while try shown.step() { droppedMACs.insert(shown.blob(0) ?? []) }
                shown.reset()
                // Rows holding a value of another kind go by their kind, with no value read
                // back and bound again; then those whose MAC fails, by their reference, the
                // primary key, now a blob in every row left.
                try state.database.execute("DELETE FROM sync_deletions WHERE \(ofAnotherKind)")
                let select = try state.database.statement("SELECT reference, deleted_at, generation, mac FROM sync_deletions")
                // Every copy of a reference present twice goes too (the table's key forbids it:
                // the table was made again outside Lockbox), the genuine one with the others.
                var forged = Set<[UInt8]>()
                var macs: [[UInt8]: [[UInt8]]] = [:]
                while try select.step() {
                    let reference = select.blob(0) ?? []
                    if !Self.isSoundDeletionRecord(select, key: key) || macs[reference] != nil { forged.insert(reference) }
                    macs[reference, default: []].append(select.blob(3) ?? [])
                }
                select.reset()
                for reference in forged { droppedMACs.formUnion(macs[reference] ?? []) }
                let delete = try state.database.statement("DELETE FROM sync_deletions WHERE reference = ?")
                defer { delete.reset() }
                for reference in forged {
                    delete.reset()
                    delete.bind(1, reference)
                    try delete.run()
                }
                let after = try Self.deletionRecordSum(in: state.database, key: key)
                guard after.damaged == 0 else {
                    throw LockboxError(
                        .decode, "Some damaged records of deleted items in the keychain \(path) could not be dropped. Restore it from a backup.")
                }
                var expected = after.sum
                let sumKey = Self.deletionSumKey(key)
                for mac in droppedMACs {
                    let element = Self.deletionElement(mac: mac, sumKey: sumKey)
                    expected.withUnsafeMutableBytes { sum in element.withUnsafeBytes { ModularSum.add($0, to: sum) } }
                }
                let accepted = !IntegrityState.equal(expected, writer.integrity.deletions)
                writer.integrity.setDeletions(after.sum)
                return DeletionRecordRepair(dropped: before.all - after.all, acceptedChangedSet: accepted)
            }
        }
    }
}

/// One change that a sync brings to the vault.
///
/// An item added or replaced is checked against this store's limit, or the one the caller gives
/// (sync gives ``Vault/syncedItemSizeLimit``: another device's store may allow larger values,
/// and the group's devices hold the same items).
public enum SyncedChange: Sendable {
    /// A new item. Its modification date, when it has one (the time another device made the
    /// change), is the item's creation and modification date here; otherwise now.
    case add(Item)
    /// The item in the row `reference` replaced: its attributes and value become `item`'s (an
    /// attribute `item` lacks is removed), its modification date `item`'s when it has one (the time another device made the change).
    case replace(reference: Data, with: Item)
    /// The row `reference` (of one of `classes`) deleted. `madeAt`, when the delete was made
    /// (another device's), is the deletion time recorded for the row (``Vault/deletionTimes(of:)``);
    /// nil records now.
    case delete(reference: Data, classes: [ItemClass], madeAt: Date? = nil)
}

/// What ``Vault/applyChanges(count:_:)`` wrote.
public struct AppliedChanges: Sendable {
    /// Per change, in order: the row that holds the item afterwards (a new row for an add, the
    /// same row for a replace), nil for a delete.
    public var references: [Data?]
    /// The vault's write generation just before the changes, in the same transaction: equal to
    /// an earlier ``SynchronizableChanges/generation`` when nothing else was written since.
    public var previousGeneration: Int
    /// The generation the changes wrote (their rows' version).
    public var generation: Int
}

extension Vault {
    /// Applies `count` changes in one write transaction, asking for each as it is written: a
    /// sync that brings thousands of items opens each value just before it is sealed here, so
    /// only one is in memory at a time, and commits once. Each change is made and counted in the
    /// integrity record exactly as ``add(contentsOf:)``, ``update(matching:to:)`` and
    /// ``delete(matching:)`` make it; all of them or (on any error, also one `change` throws)
    /// none.
    ///
    /// - Parameters:
    ///   - count: how many changes `change` gives.
    ///   - change: the change at an index, `0..<count`, each asked for once, in order.
    /// - Returns: the rows written and the generations before and of the changes.
    /// - Throws: `duplicateItem` when an added item is here already, `itemNotFound` when a row
    ///   to replace or delete is gone (nothing is written); what `change` throws.
    public func applyChanges(count: Int, _ change: (Int) throws(LockboxError) -> SyncedChange) throws(LockboxError) -> AppliedChanges {
        try applyChanges(count: count, change, beforeCommit: { _ throws(LockboxError) in })
    }

    /// ``applyChanges(count:_:)``, calling `beforeCommit` with what the call will return once
    /// every change is written, just before the transaction commits (which may still fail): it
    /// writes what must be durable before the vault's commit (a sync lists the rows it adds).
    /// What it throws rolls the transaction back; it may not use this vault. Should the vault
    /// run the transaction again (after asking the user to verify), it is called again.
    public func applyChanges(
        count: Int, _ change: (Int) throws(LockboxError) -> SyncedChange, beforeCommit: (AppliedChanges) throws(LockboxError) -> Void
    ) throws(LockboxError) -> AppliedChanges {
        try applyChanges(count: count, change, sizeLimit: nil, beforeCommit: beforeCommit)
    }

    /// ``applyChanges(count:_:beforeCommit:)``, added and replaced items checked against
    /// `sizeLimit` instead of this store's limit (sync: ``syncedItemSizeLimit``).
    package func applyChanges(
        count: Int, _ change: (Int) throws(LockboxError) -> SyncedChange, sizeLimit: Int?,
        beforeCommit: (AppliedChanges) throws(LockboxError) -> Void
    ) throws(LockboxError) -> AppliedChanges {
        let now = currentDate()
        return try withStateVerifyingUser { state throws(LockboxError) -> AppliedChanges in
            var replaced = false
            let applied = try writeRows(state) { writer throws(LockboxError) -> AppliedChanges in
                var applied = AppliedChanges(references: [], previousGeneration: writer.generation - 1, generation: writer.generation)
                applied.references.reserveCapacity(count)
                for index in 0..<count {
                    let (reference, replacing) = try apply(try change(index), now: now, sizeLimit: sizeLimit, writer: writer, state: state)
                    applied.references.append(reference)
                    if replacing { replaced = true }
                }
                try beforeCommit(applied)
                return applied
            }
            // Replaced and deleted values must not linger in the write-ahead log.
            if replaced { state.database.truncateWriteAheadLog() }
            return applied
        }
    }
}

extension Vault {
    /// Makes one change inside a write transaction already open; returns the row that holds
    /// the item afterwards (nil after a delete) and whether a value was replaced or deleted.
    func apply(_ change: SyncedChange, now: Date, sizeLimit: Int?, writer: RowWriter, state: State) throws(LockboxError) -> (Data?, replacing: Bool) {
        // Several operations in one transaction: each starts with its statements reset, as a
        // single operation does.
        state.database.resetStatements()
        switch change {
        case .add(let item):
            let prepared = try prepareForAdding(item, now: item.attributes.modificationDate ?? now, sizeLimit: sizeLimit)
            return (Data(try insert(prepared, writer: writer, state: state)), false)
        case .replace(let reference, let item):
            var query = Query(item.itemClass, synchronizable: .any)
            query.persistentReference = reference
            try updateRows(
                matching: query, to: ItemUpdate(attributes: item.attributes, data: item.data), replacingAttributes: true,
                sizeLimit: sizeLimit, writer: writer, state: state, modifiedAt: item.attributes.modificationDate)
            return (reference, true)
        case .delete(let reference, let classes, let madeAt):
            writer.deletionTime = madeAt
            defer { writer.deletionTime = nil }
            var deleted = 0
            for itemClass in classes where deleted == 0 {
                state.database.resetStatements()
                var query = Query(itemClass, synchronizable: .any)
                query.persistentReference = reference
                do throws(LockboxError) {
                    deleted = try deleteRows(matching: query, writer: writer, state: state)
                } catch where error.code == .itemNotFound {}
            }
            guard deleted > 0 else { throw LockboxError(.itemNotFound, "The row to delete is gone.") }
            return (nil, true)
        }
    }
}

extension Vault {
    /// Apple's rule, which SecItemAdd and SecItemUpdate enforce with `errSecParam`: an item with
    /// access control is not synchronizable. Its value needs the user of this machine (the
    /// presence key sealing its item key is this keychain's), so it could neither be read to be
    /// sent nor keep its protection elsewhere.
    static func checkSynchronizable(_ attributes: ItemAttributes, hasAccessControl: Bool) throws(LockboxError) {
        guard hasAccessControl, attributes.synchronizable == true else { return }
        throw LockboxError(
            .param,
            "An item with access control cannot be synchronizable: its value needs this machine's user. "
                + "Store it with synchronizable off, or without access control.")
    }
}

extension Vault {
    /// The items sync may send, read from the rows `references` in one snapshot: for the sync
    /// layer only, which seals them end to end for the group's devices (a non-extractable key's
    /// value included, as the key API reads it).
    ///
    /// A row of a class outside `classes`, a row that is gone or that another store of this file
    /// may not see, a row not marked synchronizable or of a `ThisDeviceOnly` accessibility, a
    /// hardware key (its value is its TPM's wrapped blob) and an access-controlled row (its
    /// value needs this machine's user) never sync and have no entry; such a row's value is not
    /// opened, and the user is never asked.
    /// A row this vault cannot open because it is locked is an error, never a missing entry: a
    /// locked item must not be taken for one that no longer syncs.
    /// - Throws: `interactionNotAllowed` when a row's class key is locked; `decode` when a row
    ///   fails its integrity check.
    package func synchronizableItems(inRows references: [Data], classes: [ItemClass]) throws(LockboxError) -> [Data: Item] {
        guard !references.isEmpty else { return [:] }
        return try withState { state throws(LockboxError) -> [Data: Item] in
            try state.database.readTransaction { () throws(LockboxError) -> [Data: Item] in
                _ = try currentIntegrity(state)
                var found: [Data: Item] = [:]
                found.reserveCapacity(references.count)
                for reference in references {
                    for itemClass in classes {
                        // Each row's statements start reset, as each operation's do.
                        state.database.resetStatements()
                        var query = Query(itemClass, returning: [.attributes, .data, .persistentReference], synchronizable: .any)
                        query.persistentReference = reference
                        let plan = try plan(for: query, readingData: true, state: state)
                        guard let row = try verifyIntegrity(of: try candidates(plan, state: state), plan: plan, state: state).first else {
                            continue
                        }
                        guard row.accessControl.isEmpty, row.synchronizable, !row.accessibility.isThisDeviceOnly else { break }
                        guard let classKey = try state.keys.classKey(for: row.accessibility, header: state.header) else {
                            throw lockedError()
                        }
                        let prefix = row.associatedDataPrefix(vaultID: state.header.vaultID)
                        guard let attributes = try openMatching(row, plan: plan, classKey: classKey, prefix: prefix),
                            !(itemClass == .key && ManagedKeyValue.isHardwareKey(descriptor: attributes.generic))
                        else { break }
                        var item = Item(itemClass, attributes: attributes)
                        let valueKey = try valueKey(of: row, classKey: classKey, prefix: prefix, query: query, action: "read", state: state)
                        item.data = try row.openData(valueKey: valueKey, prefix: prefix)
                        item.persistentReference = reference
                        found[reference] = item
                        break
                    }
                }
                state.database.resetStatements()
                return found
            }
        }
    }
}
