import FoundationEssentials
import LockboxCore
import LockboxVault
import VaultCrypto

/// Pulling: the records above this device's cursor, checked against the group's head and
/// applied to the vault (docs/SYNC.md, "A sync").
extension SyncGroup {
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
            for record in try records(connection, atMost: head.counter) {
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

    /// The group's records (binary rows: item id, version, payload) that match `condition`
    /// (its parameters numbered from $2, after the group's id), in the order of their versions:
    /// at most `limit`, the number the head's versions or the items asked for allow. One row more
    /// is fetched, to be seen and refused (with `tooMany`, else as more records than versions),
    /// and no more is ever held, whatever a count the database answered apart said.
    func records(
        _ connection: PostgresConnection, _ condition: String? = nil, _ parameters: [PostgresConnection.Value] = [], atMost limit: Int64,
        tooMany: LockboxError? = nil
    ) throws(LockboxError) -> [[[UInt8]?]] {
        let bound = max(limit, 0)
        let rows = try connection.executeBinary(
            "SELECT item_id, version, payload FROM lockbox_sync_items WHERE group_id = $1" + (condition.map { " AND " + $0 } ?? "")
                + " ORDER BY version LIMIT $\(parameters.count + 2)",
            [.text(groupID)] + parameters + [.integer(bound == .max ? .max : bound + 1)])
        guard rows.count <= bound else { throw tooMany ?? LockboxError.syncDatabase("The records of the sync database (more than its versions)") }
        return rows
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
                throw groupGone()
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
            // And no more than the versions is fetched: the count above is a statement of its own,
            // which a database can answer apart from this one.
            return (head, try records(connection, "version > $2", [.integer(from)], atMost: counter - from))
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
        // The decisions below read this keychain's rows; the vault applies them in a transaction
        // of its own, which another process may write just before. Such a write (the later one)
        // must not be overwritten or deleted by an earlier record: the apply is refused when the
        // keychain's generation moved since the rows were read, and the pull decides again.
        let undecided = pending
        let unreported = report.pulled
        var changes: [(id: String, existing: Data?, sealed: SealedValueRecord)] = []
        var decidedGeneration: Int?
        var started: SyncState.PendingCommit?
        var notApplied = 0
        for attempt in 1...Self.pullDecisionAttempts {
            pending = undecided
            report.pulled = unreported
            changes = []
            changes.reserveCapacity(received.count)
            // Rows written here since the push (by another process): checked before overwriting.
            var recent: Set<Data>?
            decidedGeneration = nil
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
                    if recent == nil {
                        let scan = try vault.synchronizableChanges(since: state.generation)
                        recent = Set(scan.changed)
                        decidedGeneration = scan.generation
                    }
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
            notApplied = 0
            do {
                started = try applyPulled(
                    changes, keys: keys, pending: &pending, coveredGeneration: state.generation, decidedGeneration: decidedGeneration,
                    state: state, notApplied: &notApplied)
                break
            } catch where error.message == Self.keychainMovedUnderPull.message && attempt < Self.pullDecisionAttempts {
                continue
            }
        }
        report.pulled -= notApplied
        timer.lap(\.vault)
        // A pull from scratch (a recovery) may move the state's cursor down: the mark is set
        // before the state's commit, so that a stop between the two leaves it at or below the
        // state, never above (a false refusal). Any other pull raises it after the commit.
        if fromScratch && !pulledMark.record(counter, exactly: true) {
            throw LockboxError(
                .io, "Cannot record this device's last pull in \(pulledMark.path). Check that directory's permissions, then recover again; nothing was changed here.")
        }
        if let started { try started.commit() } else { try state.commit(pending) }
        try retryHeldBack(held, state: state, report: &report)
        timer.lap(\.state)
        // After the state's commit: a mark never runs ahead of the state (``SyncPulledMark``).
        if !fromScratch && !pulledMark.record(counter) {
            report.notes.append(
                "This device's record of its last pull (\(pulledMark.path)) could not be written (a full disk, or the directory's "
                    + "permissions): until a sync writes it, a sync state put back from an older copy is not noticed.")
        }
        if try !recordPull(connection, counter: counter, since: report.started) {
            report.notes.append(
                "This device's record of the group's devices (\(knownDevices.path)) could not be written (a full disk, or the "
                    + "directory's permissions): devices seen for the first time are recorded at a later sync.")
        }
        timer.lap(\.cursor)
        lastPullTimings.withLock { $0 = timer.timings }
    }

    /// This device's cursor and last sync in its row. A row missing (a database restored from
    /// before this device joined) is written again as joining wrote it, attested: an
    /// unattested row is dropped at the next removal. Its public key and attestation are
    /// written again each time: another device of the group may have put a key of its own
    /// there (every device holds the attesting key), which a device joining meanwhile would
    /// take for this one's. Under a shared lock of the group row, and
    /// only while the group's key epoch is still this device's: a removal of this device that
    /// committed during the pull is not undone by writing its row back.
    /// Returns false when the devices seen could not be recorded here (``SyncKnownDevices``).
    /// `last_sync` is the database's time when the sync began (`started`, by this machine's
    /// monotonic clock): an edit made here while it ran is after it, as a reset of a damaged state
    /// counts edits not sent.
    func recordPull(_ connection: PostgresConnection, counter: Int64, since started: ContinuousClock.Instant) throws(LockboxError) -> Bool {
        let elapsed = started.duration(to: .now)
        let seconds = Double(elapsed.components.seconds) + Double(elapsed.components.attoseconds) / 1e18
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
                VALUES ($1, $2, $3, now() - make_interval(secs => $6::float8), $4, $5)
                ON CONFLICT (group_id, device_id) DO UPDATE SET pulled_version = excluded.pulled_version, last_sync = excluded.last_sync,
                    public_key = excluded.public_key, attestation = excluded.attestation
                """,
                [
                    .text(groupID), .text(device.id), .integer(counter), .bytes(device.publicKey),
                    .bytes(attestation(device.id, device.publicKey, keys: keys)), .text(String(max(seconds, 0))),
                ])
        }
        // The devices seen, with their keys (``SyncKnownDevices``): best effort, the pull is done.
        guard let listed = try? devices(connection) else { return true }
        return knownDevices.record(listed).kept
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
        coveredGeneration: Int, decidedGeneration: Int? = nil, state: SyncState, notApplied: inout Int
    ) throws(LockboxError) -> SyncState.PendingCommit? {
        guard !changes.isEmpty else { return nil }
        // Refused (rolled back) when the keychain was written since its rows were read for the
        // decisions (`decidedGeneration`): see ``keychainMovedUnderPull``.
        func checkNotMoved(_ applied: AppliedChanges) throws(LockboxError) {
            if let decidedGeneration, applied.previousGeneration != decidedGeneration { throw Self.keychainMovedUnderPull }
        }
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
            try checkNotMoved(applied)
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
                            started = nil
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

    /// How many times a pull decides again when another process wrote the keychain between
    /// its decisions and their apply.
    static let pullDecisionAttempts = 4

    /// The keychain was written (by another process) after a pull read its rows to decide what
    /// to apply, and before the apply's transaction: the apply is rolled back, so that a write
    /// made here meanwhile (the later one) is never overwritten or deleted by an earlier record
    /// on the strength of rows read before it.
    static let keychainMovedUnderPull = LockboxError(
        .io,
        "Another process kept writing this keychain while the sync applied the group's changes, so they were not applied "
            + "(a change made here meanwhile is never overwritten). Nothing was lost; sync again.")

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
        for row in try self.records(
            connection, "item_id = ANY($2::text[])", [.texts(waiting.sorted())], atMost: Int64(waiting.count), tooMany: .syncDatabase())
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

