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
            "This device's sync state (\(path)) is older than what this device last pulled from the group: it was removed, "
                + "emptied, or put back from a copy. Syncing with it could take items left unchanged here for edits, and undo "
                + "changes made on the other devices, so nothing was synced. The keychain's items are not affected. Run "
                + "`lockbox sync reset` to rebuild the state from the group.")
    }

    /// Refuses a state older than the database's record of this device's last pull.
    func checkNotBehind(_ connection: PostgresConnection, state: SyncState) throws(LockboxError) {
        let rows = try connection.execute(
            "SELECT pulled_version FROM lockbox_sync_devices WHERE group_id = $1 AND device_id = $2", [.text(groupID), .text(device.id)])
        guard let row = rows.first else { return }
        if try PostgresConnection.integer(row[0]) > state.cursor { throw stateBehind(statePath) }
    }

    /// Rebuilds this device's sync state from the group, then syncs.
    ///
    /// For the items the group holds, the group's versions replace this keychain's (edits and
    /// deletes made here since the last sync are not sent: such an item takes the group's
    /// value, and one deleted here comes back); items the group does not hold are pushed as
    /// new. Nothing is deleted on another device. The former state is removed, whatever it
    /// holds: use this when a sync reports it damaged or older than this device's last pull.
    /// - Throws: `notAvailable` when the database cannot be reached (nothing changed);
    ///   `interactionNotAllowed` when the vault is locked.
    @discardableResult
    public func resetState() throws(LockboxError) -> Report {
        try Self.requireUnlocked(vault, "Unlock it to rebuild the sync state: locked items cannot be read.")
        try syncing.withLock { _ throws(LockboxError) in
            let lock = try SyncLock(statePath: statePath)
            defer { withExtendedLifetime(lock) {} }
            let connection = try PostgresConnection(database)
            try SyncSchema.migrate(connection)
            try catchUpKeys(connection)
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
                    if held.contains(id) { changes.setRow(reference, .some(id)) }
                }
            }
            changes.generation = scan.generation
            for file in [statePath, statePath + "-wal", statePath + "-shm"] where unlink(file) != 0 && errno != ENOENT {
                throw LockboxError(.io, "Cannot remove \(file), the sync state being rebuilt. Check the directory's permissions, then reset again.")
            }
            let state = try SyncState(path: statePath, device: device.id, key: device.stateKey)
            try state.commit(changes)
            // The database's record of this device's pulls starts over with the state: the sync
            // below (or the next, should this process stop first) is not refused as behind.
            try connection.execute(
                "UPDATE lockbox_sync_devices SET pulled_version = 0 WHERE group_id = $1 AND device_id = $2", [.text(groupID), .text(device.id)])
        }
        return try sync()
    }
}
