import FoundationEssentials
import LockboxCore

extension SyncGroup {
    /// What ``recoverDatabase()`` did.
    public struct Recovery: Sendable, Equatable {
        /// Records the database held (all checked against its head).
        public var checked = 0
        /// Items whose latest change this device knew and the database had lost (no record, or
        /// an older one), written back; `restoredDeletions` of them deletes.
        public var restored = 0
        public var restoredDeletions = 0
        /// The sync that followed (the other devices' changes pulled, this one's pushed).
        public var sync = Report()

        public init() {}
    }

    /// Puts back into the database what it lost, after it was restored from a backup (or lost
    /// records some other way): every item whose latest change this device knows, and that the
    /// database holds no record of or an older one, is written again, a delete as a delete;
    /// then this device syncs, reading and checking every record. The user's explicit answer to
    /// a sync that reports the database rolled back or missing records.
    ///
    /// Only a database that is whole is taken: its records must add up to its head (signed
    /// with the group key), or nothing is written. What it holds that is newer than this device
    /// knows is kept and pulled; nothing this device knows is given up for an older record, so a
    /// database that was rolled back on purpose gets back every change this device saw. Run it
    /// on each device that reports the rollback: each puts back what it knew.
    ///
    /// - Throws: `decode` when the database's records do not add up to its head (a damaged or
    ///   tampered database, not a restored one); `authFailed` or `decode` when it holds an
    ///   earlier key epoch than this device (restored from before a device was removed:
    ///   recovery cannot give the devices it has not granted a key back, see docs/SYNC.md);
    ///   `interactionNotAllowed` when the keychain is locked.
    @discardableResult
    public func recoverDatabase() throws(LockboxError) -> Recovery {
        try Self.requireUnlocked(vault, "Unlock it to recover the sync database: what this device puts back is read from its items.")
        return try syncing.withLock { _ throws(LockboxError) -> Recovery in
            let lock = try SyncLock(statePath: statePath)
            defer { withExtendedLifetime(lock) {} }
            let connection = try PostgresConnection(database)
            try SyncSchema.migrate(connection)
            let epochs = try connection.execute("SELECT key_epoch FROM lockbox_sync_groups WHERE group_id = $1", [.text(groupID)])
            if let row = epochs.first, try PostgresConnection.integer(row[0]) < keys.epoch { throw Self.restoredBeforeRemoval() }
            try catchUpKeys(connection)
            let state = try SyncState(path: statePath, device: device.id, key: device.stateKey)
            var recovery = Recovery()
            var pending = SyncState.Changes()
            let written = try restore(connection, state: state, pending: &pending, recovery: &recovery)
            // The head this device verified belongs to the history the database lost: the next
            // pull checks every record against the database's head from nothing. The cursor
            // stays a bound below which a head is a rollback.
            pending.cursor = written
            pending.forgetsVerifiedHead = true
            // Its writes the database lost are among those just put back.
            pending.clearsUnverified = true
            try state.commit(pending)
            // This device's own row, as joining wrote it (a restored database may predate it).
            try connection.execute(
                """
                INSERT INTO lockbox_sync_devices (group_id, device_id, pulled_version, public_key, attestation) VALUES ($1, $2, 0, $3, $4)
                ON CONFLICT (group_id, device_id) DO UPDATE SET public_key = excluded.public_key, attestation = excluded.attestation
                """,
                [
                    .text(groupID), .text(device.id), .bytes(device.publicKey),
                    .bytes(attestation(device.id, device.publicKey, keys: keys)),
                ])
            let pushed = try push(connection, state: state, report: &recovery.sync)
            try pull(connection, state: state, report: &recovery.sync, floor: max(pushed, written))
            return recovery
        }
    }

    /// In one transaction holding the group row's lock: every record read and checked against
    /// the head, then a record written for each item this device knows newer than the database
    /// does. Returns the counter after it.
    private func restore(
        _ connection: PostgresConnection, state: SyncState, pending: inout SyncState.Changes, recovery: inout Recovery
    ) throws(LockboxError) -> Int64 {
        let keys = self.keys
        let known = try state.allEntries()
        return try connection.transaction { () throws(LockboxError) -> Int64 in
            let groups = try connection.execute(
                "SELECT counter, key_epoch, head FROM lockbox_sync_groups WHERE group_id = $1 FOR UPDATE", [.text(groupID)])
            guard let row = groups.first else {
                throw LockboxError(.itemNotFound, "The sync group \(groupID) is not in the database any more. Nothing was changed here.")
            }
            var counter = try PostgresConnection.integer(row[0])
            guard try PostgresConnection.integer(row[1]) == keys.epoch else {
                throw LockboxError(.io, "The sync group's key changed during the recovery (a device was removed). Run it again.")
            }
            var head = try SyncHead.open(
                try row[2].map { text throws(LockboxError) in try PostgresConnection.bytes(text) }, counter: counter, group: groupID, keys: keys)
            let listed = try connection.execute("SELECT count(*) FROM lockbox_sync_items WHERE group_id = $1", [.text(groupID)])
            guard try PostgresConnection.integer(listed.first?[0] ?? nil) <= counter else {
                throw LockboxError.syncDatabase("The records of the sync database (more than its versions)")
            }
            let rows = try connection.executeBinary(
                "SELECT item_id, version, payload FROM lockbox_sync_items WHERE group_id = $1 ORDER BY version", [.text(groupID)])
            let received = try receive(rows, from: 0, counter: counter, keys: keys)
            var sum = SyncHead.empty.accumulator
            var held: [String: ReceivedRecord] = [:]
            held.reserveCapacity(received.count)
            for record in received {
                guard record.isFitting else { throw LockboxError.syncDatabase() }
                SyncHead.add(record.element, to: &sum)
                held[record.id] = record
            }
            // A database that does not add up to its own head is damaged or tampered with, not
            // restored: nothing is written over it.
            guard SyncHead.equal(sum, head.accumulator) else { throw SyncHead.withheld() }
            recovery.checked = received.count
            // What this device knows newer than the database: its last record of the item, as
            // it was written (same stamp: a device that knew it too sees nothing new), or this
            // device's change since, if it made one (what its next push would write).
            let lost = known.filter { id, entry in held[id].map { $0.sealed.record.stamp < entry.stamp } ?? true }
            guard !lost.isEmpty else { return counter }
            var rowOf: [String: Data] = [:]
            for (id, entry) in lost where !entry.isTombstone {
                if let reference = try Self.reference(of: id, pending: pending, state: state)() { rowOf[id] = reference }
            }
            let local = try readLocal(rowOf.values)
            let deletedAt = try vault.deletionTimes(of: rowOf.values.filter { local[$0] == nil })
            var stored: [StoredRecord] = []
            for id in lost.keys.sorted() {
                let entry = lost[id]!
                let record: SyncRecord
                let reference = rowOf[id]
                if entry.isTombstone {
                    record = SyncRecord(stamp: entry.stamp, item: nil, contentDigest: [])
                } else if let reference, let mine = local[reference], itemID(mine.item) == id {
                    var item = mine.item
                    item.attributes = SyncRecord.travelling(item.attributes)
                    item.persistentReference = nil
                    let stamp =
                        mine.digest == entry.contentDigest
                        ? entry.stamp
                        : SyncStamp(
                            modified: max(Self.milliseconds(mine.item.attributes.modificationDate), entry.stamp.modified + 1), device: device.id)
                    record = SyncRecord(stamp: stamp, item: item, contentDigest: mine.digest)
                } else {
                    // Deleted here since this device's last push (or its row holds another item
                    // now): the delete its next push would write.
                    let madeAt = reference.flatMap { deletedAt[$0] }.map(Self.milliseconds) ?? 0
                    record = SyncRecord(
                        stamp: SyncStamp(modified: max(madeAt, entry.stamp.modified + 1), device: device.id), item: nil, contentDigest: [])
                }
                counter = try SyncHead.version(after: counter)
                if let replaced = held[id] { SyncHead.subtract(replaced.element, from: &head.accumulator) }
                SyncHead.add(SyncHead.element(itemID: id, version: counter, record: record, keys: keys), to: &head.accumulator)
                stored.append(
                    StoredRecord(
                        id: id, version: counter, device: record.stamp.device,
                        payload: record.seal(group: groupID, itemID: id, version: counter, keys: keys)))
                pending.entries[id] = SyncState.Entry(stamp: record.stamp, contentDigest: record.contentDigest, isTombstone: record.isTombstone)
                recovery.restored += 1
                if record.isTombstone { recovery.restoredDeletions += 1 }
            }
            try Self.store(stored, group: groupID, connection: connection)
            head.counter = counter
            try connection.execute(
                "UPDATE lockbox_sync_groups SET counter = $2, head = $3 WHERE group_id = $1",
                [.text(groupID), .integer(counter), .bytes(head.sealed(group: groupID, keys: keys))])
            return counter
        }
    }

    static func restoredBeforeRemoval() -> LockboxError {
        LockboxError(
            .decode,
            "The sync database holds an earlier key epoch than this device: it was restored from before a device was removed. "
                + "Nothing was written. Recovery cannot hand the new key back to the devices that kept it; create a new group "
                + "(`lockbox sync create --replace-group`) and join the devices to it, or restore a later backup of the database.")
    }

    /// How a rollback or missing records reported by a sync are answered when the database was
    /// restored from a backup.
    static let recoveryHint =
        " If it was restored from a backup, run `lockbox sync recover` on each device of the group: each puts back what it knew."
}
