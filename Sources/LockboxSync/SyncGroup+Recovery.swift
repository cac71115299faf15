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

    /// Puts back into the database what it lost, after it was restored from a backup: every
    /// item whose latest change this device knows, and that the database holds no record of or
    /// an older one, is written again, a delete as a delete; then this device reads every
    /// record, checks them against the database's head from nothing, applies what other devices
    /// wrote, and syncs. The user's explicit answer to a sync that reports the database rolled
    /// back, or missing records this device wrote.
    ///
    /// Only a database that is whole is taken: its records must add up to its head (signed
    /// with the group key), or nothing is written. What it holds that is newer than this device
    /// knows is kept and pulled; nothing this device knows is given up for an older record, so
    /// a database that was rolled back on purpose gets back every change this device saw. The
    /// values put back are read and sealed 500 at a time, while the group row stays locked
    /// (other devices' syncs wait). Run it on each device that reports the rollback: each puts
    /// back what it knew.
    ///
    /// - Throws: `decode` when the database's records do not add up to its head (tampered with,
    ///   or restored in part: nothing is written), or when it holds an earlier key epoch than
    ///   this device (restored from before a device was removed: recovery cannot give the new
    ///   key back to the devices that kept it, see docs/SYNC.md); `interactionNotAllowed` when
    ///   the keychain is locked.
    @discardableResult
    public func recoverDatabase() throws(LockboxError) -> Recovery {
        try Self.requireUnlocked(vault, "Unlock it to recover the sync database: what this device puts back is read from its items.")
        // A state behind this machine's record of its last pull is taken: after a reset that
        // refused the restored database (or stopped), nothing else can go on. The state's
        // entries are what it puts back; its pull from scratch then refreshes every entry
        // before its push compares the rows with them, and sets the record anew.
        return try session(checkingBehind: false) { connection, state throws(LockboxError) -> Recovery in
            var recovery = Recovery()
            let (written, restored) = try restore(connection, state: state, recovery: &recovery)
            // The database's records, with those just written, read and checked against its head
            // from nothing: what other devices wrote is applied, and that head becomes the one
            // this device verified. Until this pull commits, the state keeps the head it had,
            // so a recovery cut off here leaves a device that still refuses the database (and
            // a headless one), and runs again.
            // (The pull's record of it also writes this device's row, which a restored database
            // may predate; not when a removal changed the key meanwhile, so a device removed
            // during its recovery stays removed.)
            try pull(connection, state: state, report: &recovery.sync, floor: written, fromScratch: true, seed: restored)
            let pushed = try push(connection, state: state, report: &recovery.sync)
            try pull(connection, state: state, report: &recovery.sync, floor: max(pushed, written))
            return recovery
        }
    }

    /// In one transaction holding the group row's lock: every record read and checked against
    /// the head, then a record written for each item this device knows newer than the database
    /// does. Returns the counter after it, and the entries of the records written (for the
    /// state, which the pull that follows commits).
    private func restore(
        _ connection: PostgresConnection, state: SyncState, recovery: inout Recovery
    ) throws(LockboxError) -> (Int64, SyncState.Changes) {
        let keys = self.keys
        let known = try state.allEntries()
        var restored = SyncState.Changes()
        // Its writes the database lost are among those put back here.
        restored.clearsUnverified = true
        let counter = try connection.transaction { () throws(LockboxError) -> Int64 in
            let groups = try connection.execute(
                "SELECT counter, key_epoch, head FROM lockbox_sync_groups WHERE group_id = $1 FOR UPDATE", [.text(groupID)])
            guard let row = groups.first else {
                throw groupGone()
            }
            var counter = try PostgresConnection.integer(row[0])
            guard try PostgresConnection.integer(row[1]) == keys.epoch else {
                throw LockboxError(.io, "The sync group's key changed during the recovery (a device was removed). Run it again.")
            }
            // No head: an empty group's (counter 0), else one removed or from before heads.
            guard row[2] != nil || counter == 0 else { throw Self.headRemoved() }
            var head = try SyncHead.open(
                try row[2].map { text throws(LockboxError) in try PostgresConnection.bytes(text) }, counter: counter, group: groupID, keys: keys)
            let listed = try connection.execute("SELECT count(*) FROM lockbox_sync_items WHERE group_id = $1", [.text(groupID)])
            guard try PostgresConnection.integer(listed.first?[0] ?? nil) <= counter else { throw Self.incompleteDatabase() }
            let rows = try records(connection, atMost: counter, tooMany: Self.incompleteDatabase())
            let received = try receive(rows, from: 0, counter: counter, keys: keys)
            var sum = SyncHead.empty.accumulator
            var held: [String: ReceivedRecord] = [:]
            held.reserveCapacity(received.count)
            for record in received {
                guard record.isFitting else { throw LockboxError.syncDatabase() }
                SyncHead.add(record.element, to: &sum)
                held[record.id] = record
            }
            // A database that does not add up to its own head is damaged, tampered with or
            // restored in part: what it lost cannot be told, and nothing is written over it.
            guard SyncHead.equal(sum, head.accumulator) else { throw Self.incompleteDatabase() }
            recovery.checked = received.count
            // What this device knows newer than the database: its last record of the item, as
            // it was written (same stamp: a device that knew it too sees nothing new), or this
            // device's change since, if it made one (what its next push would write).
            let lost = known.filter { id, entry in held[id].map { $0.sealed.record.stamp < entry.stamp } ?? true }.keys.sorted()
            guard !lost.isEmpty else { return counter }
            // Rows changed here since the last push, by the item they hold now: an item deleted
            // and written again since then is in another row than the state knows.
            var changedHolders: [String: Data]?
            func changedHolder(of id: String) throws(LockboxError) -> Data? {
                if changedHolders == nil {
                    var holders: [String: Data] = [:]
                    let changed = try vault.synchronizableChanges(since: state.generation).changed
                    for start in stride(from: 0, to: changed.count, by: Self.pushBatch) {
                        for (reference, local) in try readLocal(changed[start..<min(start + Self.pushBatch, changed.count)]) {
                            holders[itemID(local.item)] = reference
                        }
                    }
                    changedHolders = holders
                }
                return changedHolders?[id]
            }
            var stored: [StoredRecord] = []
            // A batch of values at a time (each opened value is held in guarded memory); only
            // the sealed records are kept.
            for start in stride(from: 0, to: lost.count, by: Self.pushBatch) {
                let batch = lost[start..<min(start + Self.pushBatch, lost.count)]
                var rowOf: [String: Data] = [:]
                for id in batch where !known[id]!.isTombstone {
                    if let reference = try state.reference(of: id) { rowOf[id] = reference }
                }
                var local = try readLocal(rowOf.values)
                for id in batch where !known[id]!.isTombstone {
                    if let reference = rowOf[id], let mine = local[reference], itemID(mine.item) == id { continue }
                    if let reference = try changedHolder(of: id), let mine = try readLocal(reference), itemID(mine.item) == id {
                        rowOf[id] = reference
                        local[reference] = mine
                    }
                }
                let deletedAt = try vault.deletionTimes(of: rowOf.values.filter { local[$0] == nil })
                for id in batch {
                    let entry = known[id]!
                    var record: SyncRecord
                    let reference = rowOf[id]
                    if entry.isTombstone {
                        record = SyncRecord(stamp: entry.stamp, item: nil, contentDigest: [])
                    } else if let reference, let mine = local[reference], itemID(mine.item) == id {
                        // As a push: nothing the other devices would not take.
                        try checkSyncable(mine.item)
                        record = self.record(of: mine, after: entry)
                        // Unchanged here: the record as this device knew it, with its stamp.
                        if mine.digest == entry.contentDigest { record.stamp = entry.stamp }
                    } else {
                        // Deleted here since this device's last push (or its row holds another
                        // item now): the delete its next push would write.
                        record = deletion(madeAt: reference.flatMap { deletedAt[$0] }.map(Self.milliseconds) ?? 0, after: entry)
                    }
                    counter = try SyncHead.version(after: counter)
                    if let replaced = held[id] { SyncHead.subtract(replaced.element, from: &head.accumulator) }
                    SyncHead.add(SyncHead.element(itemID: id, version: counter, record: record, keys: keys), to: &head.accumulator)
                    stored.append(
                        StoredRecord(
                            id: id, version: counter, device: record.stamp.device,
                            payload: record.seal(group: groupID, itemID: id, version: counter, keys: keys)))
                    restored.entries[id] = SyncState.Entry(stamp: record.stamp, contentDigest: record.contentDigest, isTombstone: record.isTombstone)
                    recovery.restored += 1
                    if record.isTombstone { recovery.restoredDeletions += 1 }
                }
            }
            try Self.store(stored, group: groupID, connection: connection)
            head.counter = counter
            try connection.execute(
                "UPDATE lockbox_sync_groups SET counter = $2, head = $3 WHERE group_id = $1",
                [.text(groupID), .integer(counter), .bytes(head.sealed(group: groupID, keys: keys))])
            return counter
        }
        return (counter, restored)
    }

    /// The recovery's refusal of a database that does not add up to its head.
    static func incompleteDatabase() -> LockboxError {
        LockboxError(
            .decode,
            "The sync database's records do not add up to its signed head: it was changed, or restored in part (not every table, "
                + "or not from one moment). Recovery cannot tell what it lost, and wrote nothing. Restore a complete backup of the "
                + "database, or create a new group (`lockbox sync create --replace-group`) and join the devices to it.")
    }

    static func restoredBeforeRemoval() -> LockboxError {
        LockboxError(
            .decode,
            "The sync database holds an earlier key epoch than this device: it was restored from before a device was removed, "
                + "or rolled back. Nothing was applied or written. Recovery cannot hand the new key back to the devices that kept it; create a new group "
                + "(`lockbox sync create --replace-group`) and join the devices to it, or restore a later backup of the database.")
    }

    /// How a rollback or missing records reported by a sync are answered when the database was
    /// restored from a backup.
    static let recoveryHint =
        " If it was restored from a backup, run `lockbox sync recover` on each device of the group: each puts back what it knew."
}
