import FoundationEssentials
import LockboxCore
import LockboxVault

extension SyncGroup {
    /// What `lockbox sync status` shows.
    public struct Status: Sendable {
        /// The group's identifier.
        public var groupID: String
        /// This device's identifier in the group.
        public var deviceID: String
        /// The key epoch this device holds (after catching up, when the database answered).
        public var keyEpoch: Int64
        /// The group version this device has pulled up to.
        public var pulledVersion: Int64
        /// The first 8 bytes (hex) of the digest of the group's head this device last verified
        /// at ``pulledVersion``; nil before its first verified pull. Two devices at one version
        /// with different fingerprints were served different histories (a fork).
        public var headFingerprint: String?
        /// Items this device has synced (not counting tombstones).
        public var syncedItems: Int
        /// The changes the next push would write: items added or changed here since the last
        /// push (not ThisDeviceOnly ones, which never leave), and items deleted here.
        public var pendingLocalChanges: Int
        /// This device's sync state is behind this machine's record of its last pull (removed,
        /// emptied or put back from an older copy): a sync refuses it, and the reset it needs
        /// takes the group's versions, so ``pendingLocalChanges`` is 0, not every item counted
        /// against a state that no longer knows them.
        public var stateBehind = false
        /// The keychain is an older copy than its sync state recorded (accepted with `lockbox
        /// verify --accept-older`): sync refuses it until `lockbox sync reset`.
        public var olderKeychain = false
        /// Records this device wrote while another device was writing, that no head it verified
        /// lists yet: its next pull must find each of them (else the database undid it).
        public var unverifiedWrites = 0
        /// The group's items not applied here because an item of this vault that does not sync
        /// (ThisDeviceOnly, or under access control) holds their primary key: the local item
        /// is kept, and each sync tries them again.
        public var heldBack = 0
        /// Versions the database holds above this device's cursor; nil when unreachable.
        public var pendingRemoteVersions: Int?
        /// When this device last synced (the database's clock, UTC); nil when never or unreachable.
        public var lastSync: String?
        /// The group's devices; nil when the database is unreachable.
        public var devices: [Device]?
        /// Why the database could not be asked (the keychain stays usable); nil when it answered.
        public var unreachable: String?
        /// How the connection to the database travels (TLS, and what of the server was
        /// verified, or not encrypted); nil when it could not be made.
        public var transport: String?
        /// The record of the devices this device has seen cannot be read (changed outside
        /// Lockbox, or not a file): a removal is refused until it is dealt with. Nil when sound.
        public var deviceRecordProblem: String?
        /// What the database answered that a sync would refuse (its data changed, this device
        /// without a key for the current epoch); nil when nothing. The local part is shown all
        /// the same.
        public var databaseProblem: String?
        /// The records of items deleted here that the next push stamps its tombstones with, and
        /// whether a sync would accept them (``Vault/deletionRecordHealth()``).
        public var deletionRecords = Vault.DeletionRecordHealth(records: 0, isSound: true)
    }

    /// This device's view of the group, and the database's when it answers.
    /// - Throws: `interactionNotAllowed` when the vault is locked. An unreachable database is
    ///   not an error here: ``Status/unreachable`` says why.
    public func status() throws(LockboxError) -> Status {
        try Self.requireUnlocked(vault, "Unlock it to see the sync status.")
        return try syncing.withLock { _ throws(LockboxError) -> Status in
            // Rows a stopped sync listed as being added are settled first, as a sync would,
            // unless a sync runs now (it settles them itself): the state is opened once the
            // lock is held, so that it is not one a sync committed past meanwhile.
            let lock = try SyncLock.ifFree(statePath: statePath)
            let mark = pulledMark.read()
            let state = try SyncState(path: statePath, device: device.id, key: device.stateKey)
            if lock != nil, !state.applying.isEmpty { try adoptApplying(state, connection: nil) }
            // Held to the end when it was free, so that no sync changes the state while it is
            // read; when a sync holds it, the state may change under the reads, and the
            // records are not checked against it (that sync checks them).
            defer { withExtendedLifetime(lock) {} }
            let behind = mark.cursor.map { $0 > state.cursor } ?? false
            var olderKeychain = false
            if !behind { olderKeychain = try isOlderCopy(than: state) }
            let pending = behind || olderKeychain ? 0 : try pendingChanges(state: state)
            var status = Status(
                groupID: groupID, deviceID: device.id, keyEpoch: keys.epoch, pulledVersion: state.cursor,
                syncedItems: try state.liveEntryCount, pendingLocalChanges: pending)
            status.stateBehind = behind
            status.olderKeychain = olderKeychain
            status.headFingerprint = state.accumulator.map { Array($0.prefix(8)).hexString }
            status.unverifiedWrites = state.unverifiedWrites.count
            status.heldBack = state.heldBack.count
            status.deletionRecords = try vault.deletionRecordHealth()
            if knownDevices.read() == .damaged {
                status.deviceRecordProblem =
                    "this device's record of the group's devices (\(knownDevices.path)) cannot be read: it was changed outside Lockbox, "
                    + "or is not a file. A removal is refused until it is removed; then the devices listed now are taken as they are, "
                    + "so check the list first"
            }
            // Only with the lock: a recovery or reset in another process may lower the record and
            // then commit a lower state between the two reads.
            if lock != nil {
                do throws(LockboxError) {
                    try checkNotBehind(mark, state: state)
                } catch {
                    status.databaseProblem = error.message
                }
            }
            do throws(LockboxError) {
                let connection = try PostgresConnection(database)
                status.transport = connection.transport
                try SyncSchema.migrate(connection)
                try catchUpKeys(connection)
                status.keyEpoch = keys.epoch
                let devices = try devicesRecordingKeys(connection)
                status.devices = devices
                // A group row below what this device verified: the sync would be refused.
                let counter = try connection.execute("SELECT counter FROM lockbox_sync_groups WHERE group_id = $1", [.text(groupID)])
                if let row = counter.first, try PostgresConnection.integer(row[0]) < state.cursor { throw rolledBack() }
                // What else a sync would refuse: the records above the cursor checked against the
                // head as a push not in step checks them (withheld, replayed, this device's
                // writes undone), in one snapshot.
                if lock != nil, state.accumulator != nil {
                    let keys = self.keys
                    try connection.transaction { () throws(LockboxError) in
                        try connection.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
                        let rows = try connection.execute(
                            "SELECT counter, key_epoch, head FROM lockbox_sync_groups WHERE group_id = $1", [.text(groupID)])
                        guard let row = rows.first, try PostgresConnection.integer(row[1]) == keys.epoch else { return }
                        let head = try SyncHead.open(
                            try row[2].map { text throws(LockboxError) in try PostgresConnection.bytes(text) },
                            counter: try PostgresConnection.integer(row[0]), group: groupID, keys: keys)
                        _ = try verifiedAbove(connection, cursor: state.cursor, head: head, state: state, pending: SyncState.Changes(), since: nil)
                    }
                }
                let pending = try connection.execute(
                    "SELECT count(*) FROM lockbox_sync_items WHERE group_id = $1 AND version > $2", [.text(groupID), .integer(state.cursor)])
                status.pendingRemoteVersions = Int(try PostgresConnection.integer(pending.first?[0] ?? nil))
                status.lastSync = devices.first(where: { $0.id == device.id })?.lastSync
            } catch where error.code == .notAvailable {
                status.unreachable = error.message
            } catch where error.code != .interactionNotAllowed {
                status.databaseProblem = error.message
            }
            return status
        }
    }

    /// What the next push would write, found as the push finds it (``push(_:state:report:)``)
    /// without writing anything: rows read and compared with what the group has of them, and
    /// items whose row went away.
    func pendingChanges(state: SyncState) throws(LockboxError) -> Int {
        let found = try localChanges(state: state)
        var pending = 0
        var former = Set(found.gone.values.compactMap { $0 })
        // Rows a stopped push listed as holding an item held it too (as the push counts them).
        for reference in found.gone.keys { if let listed = state.pushedListing(of: reference) { former.insert(listed) } }
        var produced = Set<String>()
        for start in stride(from: 0, to: found.toRead.count, by: Self.pushBatch) {
            let batch = found.toRead[start..<min(start + Self.pushBatch, found.toRead.count)]
            let read = try readLocal(batch)
            for reference in batch {
                let stateRow = try state.row(reference)
                if case .some(.some(let old)) = stateRow { former.insert(old) }
                if let listed = state.pushedListing(of: reference) { former.insert(listed) }
                guard let local = read[reference] else { continue }
                let id = itemID(local.item)
                produced.insert(id)
                if !Self.holdsAgainAfterStoppedPush(reference, id, stateRow: stateRow, state: state),
                    Self.isPushed(local, id: id, stateRow: stateRow, known: try state.entry(id))
                {
                    continue
                }
                pending += 1
            }
        }
        return pending + (try Self.deleted(former: former, produced: produced, state: state)).count
    }
}
