import FoundationEssentials
import LockboxCore
import LockboxVault
import VaultCrypto

#if canImport(Glibc)
import Glibc
#endif

/// Pushing: this vault's changes since the last sync, sealed and written above the group's
/// head (docs/SYNC.md, "A sync").
extension SyncGroup {
    /// What changed in the vault since the state's generation: the rows to read (written since,
    /// or unknown to the state) and the rows that went away (with the item each held). Nothing
    /// is opened here; a delete is noticed by the count of synchronizable rows, and only then
    /// are all row identifiers compared.
    func localChanges(state: SyncState) throws(LockboxError) -> (generation: Int, toRead: [Data], gone: [Data: String?]) {
        // Before a state's first pull, its rows are counted even when nothing was written
        // since its generation: a rebuilt state (``resetState()``) leaves the rows of items the
        // group does not hold unknown, for this push to read and write as new.
        if olderCopyMarked { throw keychainOlderThanState() }
        var scan = try vault.synchronizableChanges(since: state.generation, listingAll: state.cursor == 0 && state.generation > 0)
        if scan.isUnchanged { return (scan.generation, [], [:]) }
        if scan.generation < state.generation { throw keychainOlderThanState() }
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

    /// An older copy of the keychain was accepted (`lockbox verify --accept-older`): it leaves a
    /// mark beside the keychain until a reset. (Its generation, below the state's until as many
    /// writes were made since, says so too when the mark is gone.)
    var olderCopyMarked: Bool { access(Vault.olderCopyMarkerPath(vaultPath: vault.path), F_OK) == 0 }

    /// Whether this keychain is an older copy than `state` recorded: marked so, or of a lower
    /// generation.
    func isOlderCopy(than state: SyncState) throws(LockboxError) -> Bool {
        if olderCopyMarked { return true }
        return try vault.synchronizableChanges(since: Int.max).generation < state.generation
    }

    /// The error of a sync whose keychain is older than its state recorded: its rows would be
    /// taken for new writes, bringing back on every device what was deleted or changed since.
    func keychainOlderThanState() -> LockboxError {
        LockboxError(
            .decode,
            "This keychain is older than what its sync state recorded: the file was put back from a copy or a backup (and "
                + "accepted with `lockbox verify --accept-older`). Syncing it as it is would send items deleted or changed "
                + "since as new writes, to every device, so nothing was synced. Run `lockbox sync reset`: for the items the "
                + "group holds, its versions replace this keychain's (one deleted since is deleted again), and the items only "
                + "this keychain holds are sent.")
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
                        if Self.isPushed(local, id: id, stateRow: stateRow, known: known) { continue }
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
    /// record, in the row this device knows holds it (`stateRow`): then a push writes nothing
    /// for it. (A value saved again unchanged is not a change: a credential helper stores the
    /// same value after each use, and pushing it as a later write would undo an edit or a
    /// delete made elsewhere since.) A row the state does not know holds the item is the item
    /// created again (its former row deleted here): a later write than a delete or an edit made
    /// elsewhere before it, whatever its content, and pushed as one.
    static func isPushed(_ local: LocalItem, id: String, stateRow: String??, known: SyncState.Entry?) -> Bool {
        guard stateRow == .some(.some(id)) else { return false }
        return known.map { !$0.isTombstone && $0.contentDigest == local.digest } ?? false
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
            for row in try records(
                connection, "item_id = ANY($2::text[])", [.texts(changes.map(\.id))], atMost: Int64(changes.count), tooMany: .syncDatabase())
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
        // No more than the versions: rows the database adds between the count and this fetch (two
        // statements, two snapshots) are refused, not held.
        let rows = try records(connection, "version > $2", [.integer(from)], atMost: head.counter - from)
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
            throw groupGone()
        }
        let counter = try PostgresConnection.integer(row[0])
        guard counter >= cursor else { throw rolledBack() }
        guard try PostgresConnection.integer(row[1]) == keys.epoch else {
            throw LockboxError(.io, "The sync group's key changed during this sync (a device was removed). Sync again.")
        }
        return try SyncHead.open(
            try row[2].map { text throws(LockboxError) in try PostgresConnection.bytes(text) }, counter: counter, group: groupID, keys: keys)
    }
}
