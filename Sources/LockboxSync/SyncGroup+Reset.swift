import FoundationEssentials
import LockboxCore
import LockboxVault

#if canImport(Glibc)
import Glibc
#endif

/// A sync state rebuilt from the group, when this device's own is damaged, or older than what
/// the device last pulled (removed, emptied, or put back from a copy).
///
/// Such a state cannot tell an item this device left unchanged from one it changed: a value
/// saved again unchanged (a credential helper stores after each use) would be pushed as the
/// newest write, and undo on every device an edit or a delete made elsewhere. So a sync refuses
/// it (``stateBehind(_:)``), and the rebuild gives the group precedence for the items it holds.
extension SyncGroup {
    /// The error of a sync whose state is older than what the database records this device
    /// pulled.
    func stateBehind(_ path: String) -> LockboxError {
        LockboxError(
            .decode,
            "This device's sync state (\(path)) is older than what this device last pulled from the group (as this machine "
                + "recorded it): it was removed, "
                + "emptied, or put back from a copy. Syncing with it could take items left unchanged here for edits, and undo "
                + "changes made on the other devices, so nothing was synced. The keychain's items are not affected. Run "
                + "`lockbox sync reset` to rebuild the state from the group: for the items the group holds, its versions then "
                + "replace this keychain's, so a change made here since the last sync is not sent.")
    }

    /// The mark of a reset refused for the changes a damaged state could not count: beside the
    /// state, empty, removed by the reset that rebuilds it.
    var refusedResetPath: String { statePath + ".reset-refused" }

    /// This device's mark of how far its state had pulled (``SyncPulledMark``).
    var pulledMark: SyncPulledMark { SyncPulledMark(vault: vault, group: groupID, device: device) }
    var knownDevices: SyncKnownDevices { SyncKnownDevices(vault: vault, group: groupID, device: device) }

    /// Refuses a state whose cursor is below `mark` (read before the state was opened: a sync
    /// that commits meanwhile raises the mark only after its state's commit), and any state
    /// while the mark is damaged: it cannot tell.
    func checkNotBehind(_ mark: SyncPulledMark.Reading, state: SyncState) throws(LockboxError) {
        switch mark {
        case .none: return
        case .cursor(let cursor): if cursor > state.cursor { throw stateBehind(statePath) }
        case .damaged: throw markDamaged(pulledMark.path)
        }
    }

    /// The error of a sync whose record of the last pull was changed outside Lockbox.
    func markDamaged(_ path: String) -> LockboxError {
        LockboxError(
            .decode,
            "This machine's record of its last pull from the sync group (\(path)) was changed outside Lockbox, or cannot be "
                + "read: the sync state cannot be checked against it, so nothing was synced. The keychain's items are not "
                + "affected. If this user cannot read the file, give it back to them (chown, mode 0600); otherwise run "
                + "`lockbox sync reset`, which rebuilds the state from the group and writes the record anew (it first says "
                + "how many changes made here since the last sync it would replace, if any, and asks for "
                + "--discard-local-changes).")
    }

    /// How far the state a reset replaces had pulled: its cursor when it still opens (its
    /// progress passes its MAC, though a bucket may not), else 0. With `refusingSound`, a state
    /// that opens, passes its checks (every bucket's MAC) and is not behind this machine's record
    /// of its last pull is refused: it needs no reset, which would lose the changes made here
    /// since the last sync. So is one whose record of the last pull is damaged or unreadable,
    /// when it holds changes made here: it may well be the latest state, and its changes real
    /// (a state put back from an older copy would list changes no one made, but that cannot be
    /// told). A state that fails anything else (damaged, edited, behind, of a format this build
    /// does not read) goes on to the reset; any other failure to list the changes made here is
    /// thrown.
    ///
    /// `damaged` is true for a state that does not open or fails its checks (not one that is
    /// only behind): it cannot say what changed here since the last sync.
    private func replacedCursor(refusingSound: Bool) throws(LockboxError) -> (cursor: Int64, damaged: Bool) {
        let state: SyncState
        do {
            state = try SyncState(path: statePath, device: device.id, key: device.stateKey)
        } catch {
            return (0, true)
        }
        guard refusingSound else { return (state.cursor, false) }
        let mark = pulledMark.read()
        if mark != .damaged {
            do { try checkNotBehind(mark, state: state) } catch { return (state.cursor, false) }
        }
        // A keychain put back from an older copy: the state is not behind, the keychain is; the
        // reset gives the group's versions precedence, as the sync's error says.
        if try isOlderCopy(than: state) { return (state.cursor, false) }
        do { _ = try state.allEntries() } catch { return (state.cursor, true) }
        let pending: Int
        do {
            pending = try pendingChanges(state: state)
        } catch where error.code == .decode {
            // A bucket of rows found damaged only now: the state is not sound.
            return (state.cursor, true)
        }
        let replaced = "\(pending) change\(pending == 1 ? "" : "s") made here since the last sync"
        guard mark != .damaged else {
            guard pending > 0 else { return (state.cursor, false) }
            throw LockboxError(
                .param,
                "This machine's record of its last pull (\(pulledMark.path)) is damaged or cannot be read, so it cannot tell "
                    + "whether this sync state is the latest. A reset would replace the \(replaced) with the group's versions "
                    + "(a deleted item comes back); nothing was changed. If this user cannot read the file, give it back to them "
                    + "(chown, mode 0600) and sync. Otherwise note those changes, run the reset again with --discard-local-changes, "
                    + "and make them again after it.")
        }
        throw LockboxError(
            .param,
            "This device's sync state is sound and not behind this machine's last pull: it needs no rebuilding, and "
                + "`lockbox sync now` syncs. A reset would replace the \(replaced) with the group's versions (a deleted item "
                + "comes back); nothing was changed. To rebuild it anyway, add --discard-local-changes.")
    }

    /// Rebuilds this device's sync state from the group, then syncs.
    ///
    /// For the items the group holds, the group's versions replace this keychain's (edits and
    /// deletes made here since the last sync are not sent: such an item takes the group's
    /// value, and one deleted here comes back); items the group does not hold are pushed as
    /// new. Nothing is deleted on another device. The former state is removed: use this when a
    /// sync reports it damaged or older than this device's last pull.
    /// - Parameter discardingLocalChanges: rebuild a state that is neither damaged nor behind
    ///   too, or one holding changes made here whose record of the last pull is damaged,
    ///   replacing the changes made here since the last sync; without it, such a state is
    ///   refused (`errSecParam`, with the number of changes it would replace), nothing changed.
    /// - Throws: `notAvailable` when the database cannot be reached (nothing changed);
    ///   `interactionNotAllowed` when the vault is locked.
    @discardableResult
    public func resetState(discardingLocalChanges: Bool = false) throws(LockboxError) -> Report {
        try Self.requireUnlocked(vault, "Unlock it to rebuild the sync state: locked items cannot be read.")
        return try syncing.withLock { _ throws(LockboxError) -> Report in
            let lock = try SyncLock(statePath: statePath)
            defer { withExtendedLifetime(lock) {} }
            let (replaced, damaged) = try replacedCursor(refusingSound: !discardingLocalChanges)
            // A reset refused for the changes a damaged state could not count stays refused until
            // one runs with --discard-local-changes: removing that state by hand (which makes it
            // a state behind, rebuilt without the check) does not get round it.
            let refusedBefore = access(refusedResetPath, F_OK) == 0
            let connection = try PostgresConnection(database)
            try SyncSchema.migrate(connection)
            try catchUpKeys(connection)
            // A damaged state cannot say what changed here since the last sync; the time of this
            // device's last sync, as the database recorded it, bounds it: an item the group holds
            // and this keychain changed since may be a change not sent yet, which the group's
            // version would replace. Refused without --discard-local-changes, as for a sound state.
            // (A state behind is not: the sync that refused it said a change made here since the
            // last sync is not sent, and a value saved again unchanged, which a credential helper
            // does after each use, would count as one.)
            var lastSync: Date?
            if (damaged || refusedBefore) && !discardingLocalChanges {
                let rows = try connection.execute(
                    "SELECT extract(epoch FROM last_sync)::float8 FROM lockbox_sync_devices WHERE group_id = $1 AND device_id = $2",
                    [.text(groupID), .text(device.id)])
                // The database records when that sync began, before its push listed the changes:
                // an edit made while it ran is after it.
                lastSync = rows.first?[0].flatMap { Double($0) }.map { Date(timeIntervalSince1970: $0) } ?? .distantPast
            }
            var changedSince = 0
            var held = Set<String>()
            for row in try connection.execute("SELECT item_id FROM lockbox_sync_items WHERE group_id = $1", [.text(groupID)]) {
                if let id = row[0] { held.insert(id) }
            }
            // Each row of this keychain holding an item the group holds is mapped to it, with
            // no version known: the pull that follows (from the group's first record) replaces
            // it with the group's record, or deletes it for a tombstone. Rows of other items
            // stay unknown, so the push reads them and writes them as new. The generation is
            // taken before the rows are read: a row written meanwhile is read again, and
            // pushed as the later write it is.
            let scan = try vault.synchronizableChanges(since: 0)
            var changes = SyncState.Changes()
            for start in stride(from: 0, to: scan.changed.count, by: Self.pushBatch) {
                let batch = scan.changed[start..<min(start + Self.pushBatch, scan.changed.count)]
                for (reference, local) in try readLocal(batch) {
                    let id = itemID(local.item)
                    guard held.contains(id) else { continue }
                    changes.setRow(reference, .some(id))
                    if let lastSync, (local.item.attributes.modificationDate ?? .distantFuture) > lastSync { changedSince += 1 }
                }
            }
            if changedSince > 0 {
                // Best effort: should the mark not be written, a state removed by hand is reset as
                // any state behind is.
                let mark = open(refusedResetPath, O_WRONLY | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0o600)
                if mark >= 0 { close(mark) }
                throw LockboxError(
                    .param,
                    "This device's sync state cannot say what changed here since the last sync, and \(changedSince) item"
                        + "\(changedSince == 1 ? "" : "s") the group holds changed in this keychain since this device's last sync (as "
                        + "the database recorded it). A reset would replace \(changedSince == 1 ? "it" : "them") with the group's "
                        + "versions, and an item deleted here since then would come back; nothing was changed. Note those changes, "
                        + "run the reset again with --discard-local-changes, and make them again after it.")
            }
            changes.generation = scan.generation
            // What this machine recorded of the last pull: the rebuilt state's first pull must
            // reach it, or the database was rolled back.
            // So must it reach the cursor of the state it replaces, when that state still opens (its
            // progress passes its MAC: a bucket may be damaged, not the cursor): a damaged record
            // (the reset writes it anew) must not let a database rolled back meanwhile pass.
            let floor = max(pulledMark.read().cursor ?? 0, replaced)
            for file in [statePath, statePath + "-wal", statePath + "-shm"] where unlink(file) != 0 && errno != ENOENT {
                throw LockboxError(.io, "Cannot remove \(file), the sync state being rebuilt. Check the directory's permissions, then reset again.")
            }
            let state = try SyncState(path: statePath, device: device.id, key: device.stateKey)
            try state.commit(changes)
            if unlink(refusedResetPath) != 0 && errno != ENOENT {
                throw LockboxError(.io, "Cannot remove \(refusedResetPath), the mark of a refused reset. Check the directory's permissions, then reset again.")
            }
            // The mark is kept: the pull below raises the state to it, or refuses a database
            // below it (rolled back) as a sync does. Should this process stop first, or the
            // database be refused, the rebuilt state is behind the mark and refused until a
            // reset reaches it, or a recovery (the database restored on purpose) sets it anew.
            // An older copy's mark (``Vault/olderCopyMarkerPath(vaultPath:)``) asks for this
            // rebuild: removed once the rebuilt state is committed (a sync with that state, should
            // this one stop, maps the rows the group holds to its records, as this one does).
            let marker = Vault.olderCopyMarkerPath(vaultPath: vault.path)
            if unlink(marker) != 0 && errno != ENOENT {
                throw LockboxError(.io, "Cannot remove \(marker), the mark of an older copy of this keychain. Check the directory's permissions, then reset again.")
            }
            var report = Report()
            let written = try push(connection, state: state, report: &report)
            try pull(connection, state: state, report: &report, floor: max(written, floor))
            return report
        }
    }
}
