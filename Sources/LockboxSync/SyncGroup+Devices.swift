import FoundationEssentials
import LockboxCore
import LockboxVault
import VaultCrypto

/// One device's identity in a group: a random identifier, an X25519 key pair (rotated group
/// keys are sealed to its public half) and a key that authenticates the local sync state. The
/// secret halves are an item of the vault (`afterFirstUnlockThisDeviceOnly`, never synced,
/// never in a backup); the identifier and public key are its `generic` attribute.
struct DeviceSecret: Sendable {
    let id: String
    let publicKey: [UInt8]
    let secretKey: SecretBytes
    let stateKey: SecretBytes

    static func load(groupID: String, from vault: Vault) throws(LockboxError) -> DeviceSecret? {
        var query = Query.genericPassword(service: SyncGroup.deviceService, account: groupID, accessGroup: SyncGroup.keyAccessGroup)
        query.returning = [.data, .attributes]
        let item: Item
        do { item = try vault.item(matching: query) } catch where error.code == .itemNotFound { return nil }
        var decoder = FieldDecoder(Array(item.attributes.generic ?? Data()))
        guard let data = item.data, data.count == 64, let id = try? decoder.string(), let publicKey = try? decoder.bytes(),
            publicKey.count == 32, decoder.isAtEnd
        else { throw LockboxError.integrity("The sync device key") }
        let secretKey = SecretBytes(capacity: 32) { buffer in
            data.withUnsafeBytes { buffer.copyMemory(from: UnsafeRawBufferPointer(rebasing: $0[0..<32])) }
            return 32
        }
        let stateKey = SecretBytes(capacity: 32) { buffer in
            data.withUnsafeBytes { buffer.copyMemory(from: UnsafeRawBufferPointer(rebasing: $0[32..<64])) }
            return 32
        }
        return DeviceSecret(id: id, publicKey: publicKey, secretKey: secretKey, stateKey: stateKey)
    }

    /// Deletes this vault's device key of the group (a join that could not finish takes back the
    /// key it made).
    static func remove(groupID: String, from vault: Vault) throws(LockboxError) {
        try vault.delete(
            matching: Query.genericPassword(service: SyncGroup.deviceService, account: groupID, accessGroup: SyncGroup.keyAccessGroup))
    }

    static func create(groupID: String, in vault: Vault) throws(LockboxError) -> DeviceSecret {
        let (publicKey, secretKey) = Crypto.generateKeyPair()
        let stateKey = Crypto.generateKey()
        let id = Crypto.randomBytes(8).hexString
        let data = SecretBytes(capacity: 64) { buffer in
            secretKey.withUnsafeBytes { buffer.copyMemory(from: $0) }
            stateKey.withUnsafeBytes { UnsafeMutableRawBufferPointer(rebasing: buffer[32...]).copyMemory(from: $0) }
            return 64
        }
        var generic = FieldEncoder()
        generic.string(id)
        generic.bytes(publicKey)
        var item = Item.genericPassword(
            service: SyncGroup.deviceService, account: groupID, data: data, accessibility: .afterFirstUnlockThisDeviceOnly,
            accessGroup: SyncGroup.keyAccessGroup, label: "Lockbox sync device key")
        item.attributes.generic = Data(generic.bytes)
        try vault.add(item)
        return DeviceSecret(id: id, publicKey: publicKey, secretKey: secretKey, stateKey: stateKey)
    }
}

/// One-time pairing codes: 16 characters of Crockford's base32 (80 random bits), shown as
/// four groups of four. The first four name the invitation row; the whole code, through
/// Argon2id, is the key that seals the group keys in it.
enum PairingCode {
    static let length = 16
    static let invitationLength = 4
    private static let alphabet = Array("0123456789ABCDEFGHJKMNPQRSTVWXYZ")

    static func generate() -> String {
        let bytes = Crypto.randomBytes(10)
        var bits = 0
        var value = 0
        var code = ""
        for byte in bytes {
            value = value << 8 | Int(byte)
            bits += 8
            while bits >= 5 {
                bits -= 5
                code.append(alphabet[(value >> bits) & 31])
            }
            value &= (1 << bits) - 1
        }
        return code
    }

    /// Upper case, dashes and spaces dropped, the letters people confuse mapped (O->0, I/L->1).
    static func normalized(_ text: String) -> String {
        String(
            text.uppercased().compactMap { character -> Character? in
                switch character {
                case "-", " ": nil
                case "O": "0"
                case "I", "L": "1"
                default: character
                }
            })
    }

    /// Whether a normalized code has the length and alphabet of a code this generates: one
    /// that cannot be is refused before it uses up the code it was meant to be.
    static func isWellFormed(_ code: String) -> Bool {
        code.count == length && code.allSatisfy { alphabet.contains($0) }
    }

    static func displayed(_ code: String) -> String {
        stride(from: 0, to: code.count, by: 4).map { start in
            String(code.dropFirst(start).prefix(4))
        }.joined(separator: "-")
    }
}

extension SyncGroup {
    // MARK: Devices

    /// A device of the group as the database lists it.
    public struct Device: Sendable, Equatable {
        /// The device's identifier (random, public).
        public var id: String
        /// How far it has pulled (a group version).
        public var pulledVersion: Int64
        /// When it last synced (the database's clock), if ever.
        public var lastSync: String?
        /// False when its public key's attestation fails with the current key: a row this
        /// group's devices did not write (never granted a key).
        public var isAttested: Bool
        /// The public key whose attestation was checked, when it passed: the only key a
        /// removal seals the next epoch's grant to (read with the attestation, in one row).
        var attestedKey: [UInt8]? = nil
        /// True when its row is attested for another public key than the one this device first
        /// saw it with (``SyncKnownDevices``): written by a device of the group (every one
        /// holds the attesting key), never by this device's removal. A removal made here does
        /// not give it the next key.
        public var isKeyReplaced = false
    }

    /// What ``removeDevice(_:newPassphrase:)`` did, besides removing the device.
    public struct DeviceRemoval: Sendable, Equatable {
        /// The device removed.
        public var device: String
        /// False when the database no longer listed it (its row deleted there): since this
        /// device had seen it, the key was replaced all the same.
        public var wasListed: Bool
        /// The other devices given the new key.
        public var keeping: [String] = []
        /// Of those, the ones this device saw listed for the first time: a device of the group
        /// can add rows of its own making, so check that each is one of yours (and remove any
        /// that is not).
        public var firstSeen: [String] = []
        /// Devices not given the new key, and removed: their row holds another public key than
        /// the one this device first saw them with. Join them again with a pairing code.
        public var keyReplaced: [String] = []
        /// Devices not given the new key, and removed: their row's attestation failed (not
        /// written by a device of the group).
        public var unattested: [String] = []
        /// Devices this device saw before whose rows are no longer in the database (deleted
        /// there): given no key. Join them again with a pairing code if they are yours.
        public var missing: [String] = []
        /// Fleet tokens that did not open with the group's key (changed in the database) and
        /// were cleared rather than re-sealed: those sessions sign in again.
        public var clearedFleetTokens = 0
        /// Set when the removal committed in the database but this machine could not record it
        /// (a full disk, say): the error, saying what to do. The removal itself stands; this
        /// device's next sync takes the new key.
        public var unfinishedHere: LockboxError?
    }

    /// The attestation of a device's public key: a MAC with the epoch's device key.
    func attestation(_ deviceID: String, _ publicKey: [UInt8], keys: SyncKeys) -> [UInt8] {
        var encoder = FieldEncoder()
        encoder.string("lockbox.sync.device.v1")
        encoder.string(groupID)
        encoder.string(deviceID)
        encoder.bytes(publicKey)
        encoder.integer(Int(keys.epoch))
        return Crypto.keyedDigest(encoder.bytes, key: keys.devices)
    }

    /// The group's devices.
    public func devices() throws(LockboxError) -> [Device] {
        let connection = try PostgresConnection(database)
        try SyncSchema.migrate(connection)
        try catchUpKeys(connection)
        return try devicesRecordingKeys(connection)
    }

    /// ``devices(_:)``, each attested device not seen before recorded with its key
    /// (``SyncKnownDevices``), and one whose key is not the one it was first seen with marked.
    func devicesRecordingKeys(_ connection: PostgresConnection) throws(LockboxError) -> [Device] {
        var listed = try devices(connection)
        let replaced = knownDevices.record(listed).replaced
        for index in listed.indices {
            let listedDevice = listed[index]
            // This device's own row holding a key other than its own: another device of the
            // group wrote it (this device writes its own back at its next sync).
            let ownReplaced = listedDevice.id == device.id && listedDevice.attestedKey.map { !SyncHead.equal($0, device.publicKey) } == true
            if ownReplaced || replaced.contains(listedDevice.id) { listed[index].isKeyReplaced = true }
        }
        return listed
    }

    func devices(_ connection: PostgresConnection) throws(LockboxError) -> [Device] {
        let keys = self.keys
        return try connection.execute(
            """
            SELECT device_id, pulled_version, to_char(last_sync AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"'), public_key, attestation
            FROM lockbox_sync_devices WHERE group_id = $1 ORDER BY device_id
            """, [.text(groupID)]
        ).map { row throws(LockboxError) -> Device in
            let id = row[0] ?? ""
            var attestedKey: [UInt8]?
            // Only an identifier of the form devices make (16 lowercase hexadecimal digits) is
            // attested: any other (long ones that would swell the record of the devices seen,
            // ones that differ in bytes but compare equal as Swift strings) is a row no device
            // of the group wrote, never granted a key.
            if Self.isDeviceIdentifier(id), let key = row[3], let mac = row[4] {
                let publicKey = try PostgresConnection.bytes(key)
                if SyncHead.equal(try PostgresConnection.bytes(mac), attestation(id, publicKey, keys: keys)) { attestedKey = publicKey }
            }
            return Device(
                id: id, pulledVersion: try PostgresConnection.integer(row[1]), lastSync: row[2], isAttested: attestedKey != nil,
                attestedKey: attestedKey)
        }
    }

    /// A one-time pairing code for another device to join with (``join(_:vault:database:pairingCode:)``):
    /// show it to the user of the new device. It works once, until `validFor` has passed.
    public func pairingCode(validFor: Duration = .seconds(600)) throws(LockboxError) -> String {
        try Self.requireUnlocked(vault, "Unlock it to invite a device: a pairing code hands out the group's keys.")
        let connection = try PostgresConnection(database)
        try SyncSchema.migrate(connection)
        try catchUpKeys(connection)
        let keys = self.keys
        try Self.dropExpiredInvitations(connection, groupID: groupID)
        // The devices this one has seen (the list read now recorded first) and its own key go
        // with the code, sealed under it: the new device starts from this device's record.
        // Only devices listed now, with the key this device first saw them with, and not marked
        // as replaced: a record that the list contradicts (a key this device took from the
        // database in a window) is not passed on, nor are devices removed since.
        let listed = try devicesRecordingKeys(connection)
        let known = knownDevices.read().devices ?? [:]
        var seen: [String: [UInt8]] = [:]
        for listedDevice in listed where listedDevice.id != device.id && listedDevice.isAttested && !listedDevice.isKeyReplaced {
            if let key = known[listedDevice.id] { seen[listedDevice.id] = key }
        }
        seen[device.id] = device.publicKey
        let attached = SyncKnownDevices.encodeInvitation(seen)
        for _ in 0..<8 {
            let code = PairingCode.generate()
            let invitation = String(code.prefix(PairingCode.invitationLength))
            let wrap = try Self.wrapKeys(
                keys, groupID: groupID, purpose: "invitation:" + invitation, secret: SecretBytes(copying: Array(code.utf8)), attached: attached)
            // Inserted under a shared lock of the group row, at the key epoch it wraps: a device
            // removal (which deletes every pending code under that row's lock) either deletes
            // this one, or has committed first, and the code is not handed out with the former
            // key, with which its device could never sync.
            let inserted = try connection.transaction { () throws(LockboxError) -> Bool in
                let group = try connection.execute("SELECT key_epoch FROM lockbox_sync_groups WHERE group_id = $1 FOR SHARE", [.text(groupID)])
                guard let row = group.first else { throw groupGone() }
                guard try PostgresConnection.integer(row[0]) == keys.epoch else {
                    throw LockboxError(.io, "A device was removed from the group while this code was made, which replaced the group's key. No code was made: invite again.")
                }
                let rows = try connection.execute(
                    """
                    INSERT INTO lockbox_sync_invitations (group_id, invitation_id, key_wrap, expires_at)
                    VALUES ($1, $2, $3, now() + make_interval(secs => $4)) ON CONFLICT DO NOTHING RETURNING 1
                    """,
                    [.text(groupID), .text(invitation), .bytes(wrap), .integer(validFor.components.seconds)])
                return !rows.isEmpty
            }
            if inserted { return PairingCode.displayed(code) }
        }
        throw LockboxError(.duplicateItem, "Too many pairing codes are pending for this group. Use or let one expire, then try again.")
    }

    /// Deletes the group's expired pairing codes: their rows hold the group's secrets sealed
    /// under the codes, which should not stay in the database (and its backups) once unusable.
    static func dropExpiredInvitations(_ connection: PostgresConnection, groupID: String) throws(LockboxError) {
        try connection.execute("DELETE FROM lockbox_sync_invitations WHERE group_id = $1 AND expires_at <= now()", [.text(groupID)])
    }

    /// Removes a device: the group's epoch key is replaced, the new one sealed to each remaining
    /// device's public key, every record re-sealed with it, and pending pairing codes dropped.
    /// The removed device keeps what it already had, but opens nothing written afterwards.
    ///
    /// The group passphrase is dropped too (the removed device may know it): pass
    /// `newPassphrase` to let devices join with a passphrase again.
    /// - Throws: `itemNotFound` when there is no such device; `param` for this device itself.
    /// Refuses, as the new passphrase of a removal, the group's current one: the removed device
    /// may know it, and would join again with it.
    private func refuseCurrentPassphrase(_ passphrase: SecretBytes, _ connection: PostgresConnection) throws(LockboxError) {
        let rows = try connection.execute("SELECT key_wrap FROM lockbox_sync_groups WHERE group_id = $1", [.text(groupID)])
        guard let row = rows.first, let wrap = row[0] else { return }
        do {
            _ = try Self.unwrapKeys(try PostgresConnection.bytes(wrap), groupID: groupID, purpose: "passphrase", secret: passphrase)
        } catch where error.code == .authFailed {
            return
        }
        throw LockboxError(
            .param,
            "That is the group's current passphrase, which the removed device may know: it could join again with it. "
                + "Choose a new one, or none (devices then join with pairing codes). Nothing was changed.")
    }

    @discardableResult
    public func removeDevice(_ deviceID: String, newPassphrase: SecretBytes? = nil) throws(LockboxError) -> DeviceRemoval {
        guard deviceID != device.id else {
            throw LockboxError(.param, "A device cannot remove itself. Remove it from another device of the group.")
        }
        try Self.requireUnlocked(vault, "Unlock it to remove a device.")
        if let newPassphrase { try Self.checkNewPassphrase(newPassphrase) }
        let knownDevices = self.knownDevices
        guard let seenDevices = knownDevices.read().devices else {
            throw LockboxError(
                .decode,
                "This device's record of the group's devices (\(knownDevices.path)) was changed outside Lockbox, so it cannot tell "
                    + "whether a device's key in the database was replaced. Nothing was removed. Remove that file to take the "
                    + "database's list as it stands (check with `lockbox sync status` that every device listed is yours), then "
                    + "remove the device again.")
        }
        var removal = DeviceRemoval(device: deviceID, wasListed: true)
        try syncing.withLock { _ throws(LockboxError) in
            // As a sync: no sync of this vault in another process writes the state meanwhile.
            let lock = try SyncLock(statePath: statePath)
            defer { withExtendedLifetime(lock) {} }
            let connection = try PostgresConnection(database)
            try SyncSchema.migrate(connection)
            try catchUpKeys(connection)
            if let newPassphrase { try refuseCurrentPassphrase(newPassphrase, connection) }
            let old = keys
            let new = old.rotated()
            let wrap = try newPassphrase.map { passphrase throws(LockboxError) in
                try Self.wrapKeys(new, groupID: groupID, purpose: "passphrase", secret: passphrase)
            }
            let mark = pulledMark.read()
            let state = try SyncState(path: statePath, device: device.id, key: device.stateKey)
            try checkNotBehind(mark, state: state)
            try establishHead(connection, state: state)
            // The new head, when this device had verified the one it replaces (it then holds
            // every record already: the state records the new versions, and the next pull
            // fetches nothing).
            var inStep: VerifiedHead?
            // What this device knows: the removal re-seals the database's records under the new
            // key only if none is older than this device saw (a database restored from a backup,
            // or rolled back, is refused here as a sync refuses it).
            let known = try state.allEntries()
            var listed: [Device] = []
            try connection.transaction { () throws(LockboxError) in
                try lockFleetSessionsForRemoval(connection)
                let group = try connection.execute(
                    "SELECT counter, key_epoch, head FROM lockbox_sync_groups WHERE group_id = $1 FOR UPDATE", [.text(groupID)])
                guard let row = group.first, try PostgresConnection.integer(row[1]) == old.epoch else {
                    throw LockboxError(.io, "The sync group's key changed meanwhile (another device was removed). Try again.")
                }
                var counter = try PostgresConnection.integer(row[0])
                guard counter >= state.cursor else { throw rolledBack() }
                let oldHead = try SyncHead.open(
                    try row[2].map { text throws(LockboxError) in try PostgresConnection.bytes(text) }, counter: counter, group: groupID,
                    keys: old)
                var served = SyncHead.empty.accumulator
                var stepped = VerifiedHead(of: state)
                if stepped?.isAt(oldHead) == false { stepped = nil }
                // The head this device verified, though it wrote above it since: those writes were
                // undone in the database, and re-sealing its records would vouch for that.
                if stepped != nil, !state.unverifiedWrites.isEmpty { throw SyncHead.lostWrites(state.unverifiedWrites.count) }
                listed = try devices(connection)
                // A device this one has seen, whose row is gone (deleted in the database, by its
                // administrator or by that device): the key is replaced all the same, and the
                // device, not listed, is given none.
                removal = DeviceRemoval(device: deviceID, wasListed: listed.contains { $0.id == deviceID })
                guard removal.wasListed || seenDevices[deviceID] != nil else {
                    throw LockboxError(.itemNotFound, "The sync group has no device of that identifier (not shown, in case it is a secret). `lockbox sync status` lists its devices.")
                }
                // Each grant is sealed to the key whose attestation was checked in the same row
                // (never to one read again: the database could answer a second read with a key of
                // its own, and so be granted the new key), this device's own to the key it holds.
                // One identifier listed twice (a primary key the database dropped) is refused.
                // Compared as bytes: two identifiers Swift takes for equal (é and e + U+0301) are
                // two rows, both unattested, and are removed as such.
                guard Set(listed.map { Array($0.id.utf8) }).count == listed.count else {
                    throw LockboxError.syncDatabase("The device list of the sync database")
                }
                // Devices seen before whose rows are gone: given no key, and said so.
                let listedIDs = Set(listed.map(\.id))
                removal.missing = seenDevices.keys.filter { $0 != deviceID && $0 != device.id && !listedIDs.contains($0) }.sorted()
                // Grants of the new epoch planted before (the database's): never this removal's.
                try connection.execute(
                    "DELETE FROM lockbox_sync_key_grants WHERE group_id = $1 AND epoch > $2", [.text(groupID), .integer(old.epoch)])
                for listedDevice in listed where listedDevice.id != deviceID {
                    let id = listedDevice.id
                    let publicKey: [UInt8]
                    if id == device.id {
                        publicKey = device.publicKey
                    } else {
                        guard let attested = listedDevice.attestedKey else {
                            removal.unattested.append(id)
                            continue
                        }
                        // Every device of the group can attest a key: one seen here before keeps
                        // the key it was seen with (the device being removed could otherwise have
                        // this removal seal the new key to itself, under another device's name).
                        if let seen = seenDevices[id] {
                            guard SyncHead.equal(seen, attested) else {
                                removal.keyReplaced.append(id)
                                continue
                            }
                        } else {
                            removal.firstSeen.append(id)
                        }
                        publicKey = attested
                        removal.keeping.append(id)
                    }
                    try connection.execute(
                        "INSERT INTO lockbox_sync_key_grants (group_id, device_id, epoch, sealed_key) VALUES ($1, $2, $3, $4)",
                        [.text(groupID), .text(id), .integer(new.epoch), .bytes(grant(new, to: id, publicKey: publicKey, under: old))])
                    // The key written back with its attestation: a row changed since it was read
                    // is attested for the key checked, not for what it holds now.
                    try connection.execute(
                        "UPDATE lockbox_sync_devices SET public_key = $3, attestation = $4 WHERE group_id = $1 AND device_id = $2",
                        [.text(groupID), .text(id), .bytes(publicKey), .bytes(attestation(id, publicKey, keys: new))])
                }
                // Rows given no key (unattested, or with a replaced key) go with the removed device.
                // (This device's own row is attested anew above, whatever the database made of it.)
                for id in [deviceID] + removal.unattested + removal.keyReplaced {
                    try connection.execute("DELETE FROM lockbox_sync_devices WHERE group_id = $1 AND device_id = $2", [.text(groupID), .text(id)])
                    try connection.execute("DELETE FROM lockbox_sync_key_grants WHERE group_id = $1 AND device_id = $2", [.text(groupID), .text(id)])
                }
                try connection.execute("DELETE FROM lockbox_sync_invitations WHERE group_id = $1", [.text(groupID)])
                // Every record again under the new key, at new versions: the old ciphertext is gone
                // from the table, and every device pulls the new one (already applied: no change).
                let rows = try records(connection, atMost: counter)
                // Every record gets a new version: the head is computed anew, under the new key.
                var head = SyncHead.empty
                var resealed: [StoredRecord] = []
                var seen = Set<String>()
                for record in rows {
                    guard let idBytes = record[0], let payload = record[2] else { throw LockboxError.syncDatabase() }
                    let id = String(decoding: idBytes, as: UTF8.self)
                    let version = try PostgresConnection.integer(binary: record[1])
                    let opened = try SyncRecord.open(payload, group: groupID, itemID: id, version: version, keys: old)
                    // This device's write not yet verified, no longer above its cursor: undone.
                    if state.unverifiedWrites[id] != nil && version <= state.cursor { throw SyncHead.lostWrites(1) }
                    if let entry = known[id], opened.stamp < entry.stamp { throw rolledBack() }
                    seen.insert(id)
                    SyncHead.add(
                        SyncHead.element(itemID: id, version: version, record: opened, keys: old), to: &served)
                    counter = try SyncHead.version(after: counter)
                    let element = SyncHead.element(itemID: id, version: counter, record: opened, keys: new)
                    SyncHead.add(element, to: &head.accumulator)
                    stepped?.listed[id] = SyncState.Listed(version: counter, element: element)
                    resealed.append(
                        StoredRecord(
                            id: id, version: counter, device: opened.stamp.device,
                            payload: opened.seal(group: groupID, itemID: id, version: counter, keys: new)))
                }
                try Self.store(resealed, group: groupID, connection: connection)
                removal.clearedFleetTokens = try resealFleetSessions(connection, from: old, to: new)
                // Every record was read: they must be exactly the ones the head lists, or the
                // new head would vouch for what the database changed; and hold every item this
                // device knows (records are never deleted).
                guard SyncHead.equal(served, oldHead.accumulator), known.keys.allSatisfy(seen.contains) else { throw SyncHead.withheld() }
                head.counter = counter
                try connection.execute(
                    "UPDATE lockbox_sync_groups SET counter = $2, key_epoch = $3, key_wrap = $4, head = $5 WHERE group_id = $1",
                    [
                        .text(groupID), .integer(counter), .integer(new.epoch), wrap.map { .bytes($0) } ?? .null,
                        .bytes(head.sealed(group: groupID, keys: new)),
                    ])
                stepped?.counter = counter
                stepped?.accumulator = head.accumulator
                inStep = stepped
            }
            // Committed: the device is removed. What follows records it here; should that fail
            // (a full disk), the removal is reported all the same, with the failure, and this
            // device's next sync takes the new key from its own grant as any device does.
            // The devices given the new key are known from now on; the removed one is not, nor
            // those removed with it for a replaced key (joined again, they are seen anew).
            var seen = seenDevices
            seen[deviceID] = nil
            for id in removal.keyReplaced { seen[id] = nil }
            for listedDevice in listed where removal.firstSeen.contains(listedDevice.id) { seen[listedDevice.id] = listedDevice.attestedKey }
            let devicesKept = knownDevices.write(seen)
            do throws(LockboxError) {
                try install(new)
                if let inStep {
                    // Every record was re-sealed: the new head lists them all.
                    var changes = SyncState.Changes()
                    inStep.record(in: &changes, replacingAll: true)
                    try state.commit(changes)
                    // After the state's commit, as a pull raises it.
                    pulledMark.record(inStep.counter)
                }
                if !devicesKept {
                    throw LockboxError(
                        .io,
                        "Its record of the group's devices (\(knownDevices.path)) could not be written (a full disk, or the "
                            + "directory's permissions).")
                }
            } catch {
                removal.unfinishedHere = LockboxError(
                    error.code,
                    "The device was removed from the sync group (the database holds the new key), but this machine could not "
                        + "record it: \(error.message) Once that is fixed, run `lockbox sync now`: it takes the new key as every "
                        + "device does.", cause: error.cause)
            }
        }
        return removal
    }

    /// The new epoch's secrets sealed to a device's public key, with a MAC under the previous
    /// epoch's device key: the database alone cannot hand a device keys of its own making.
    func grant(_ keys: SyncKeys, to deviceID: String, publicKey: [UInt8], under previous: SyncKeys) -> [UInt8] {
        var content = FieldEncoder()
        content.string("lockbox.sync.grant.v1")
        content.string(groupID)
        content.string(deviceID)
        content.integer(Int(keys.epoch))
        keys.secrets.withUnsafeBytes { content.bytes(Array($0)) }
        let box = Crypto.seal(content.bytes, toPublicKey: publicKey)
        var sealed = FieldEncoder()
        sealed.bytes(box)
        sealed.bytes(grantMAC(box, deviceID: deviceID, epoch: keys.epoch, under: previous))
        return sealed.bytes
    }

    private func grantMAC(_ box: [UInt8], deviceID: String, epoch: Int64, under previous: SyncKeys) -> [UInt8] {
        var encoder = FieldEncoder()
        encoder.string("lockbox.sync.grant-mac.v1")
        encoder.string(groupID)
        encoder.string(deviceID)
        encoder.integer(Int(epoch))
        encoder.bytes(box)
        return Crypto.keyedDigest(encoder.bytes, key: previous.devices)
    }

    /// Moves this device to the group's current epoch, one grant at a time (each is checked
    /// with the key of the epoch before it).
    /// - Throws: `authFailed` when this device was removed (no grant for it).
    func catchUpKeys(_ connection: PostgresConnection) throws(LockboxError) {
        let rows = try connection.execute("SELECT key_epoch FROM lockbox_sync_groups WHERE group_id = $1", [.text(groupID)])
        guard let row = rows.first else {
            throw groupGone()
        }
        let epoch = try PostgresConnection.integer(row[0])
        guard epoch >= keys.epoch else { throw Self.restoredBeforeRemoval() }
        while keys.epoch < epoch {
            let previous = keys
            let next = previous.epoch + 1
            let grants = try connection.execute(
                "SELECT sealed_key FROM lockbox_sync_key_grants WHERE group_id = $1 AND device_id = $2 AND epoch = $3",
                [.text(groupID), .text(device.id), .integer(next)])
            guard let grantRow = grants.first else {
                throw LockboxError(
                    .authFailed,
                    "This device holds no key for the sync group \(groupID)'s current key epoch: it was removed from the group, or the "
                        + "database's epoch was changed. `lockbox sync status` on another device of the group lists its devices; if this one "
                        + "is not among them, join again with a pairing code from one of them.")
            }
            let failure = LockboxError.syncDatabase("The sync group's key grant")
            var outer = FieldDecoder(try PostgresConnection.bytes(grantRow[0]))
            guard let box = try? outer.bytes(), let mac = try? outer.bytes(), outer.isAtEnd,
                SyncHead.equal(mac, grantMAC(box, deviceID: device.id, epoch: next, under: previous)),
                let content = try? Crypto.open(box, publicKey: device.publicKey, secretKey: device.secretKey)
            else { throw failure }
            var decoder = FieldDecoder(content)
            guard (try? decoder.string()) == "lockbox.sync.grant.v1", (try? decoder.string()) == groupID,
                (try? decoder.string()) == device.id, (try? decoder.integer()) == Int(next),
                let secrets = try? decoder.bytes(), secrets.count == 2 * Crypto.keyByteCount, decoder.isAtEnd
            else { throw failure }
            let keys = SyncKeys(secrets: SecretBytes(copying: secrets), epoch: next)
            // The base key never changes: a grant with another one is not this group's.
            guard keys.naming == previous.naming else { throw failure }
            try install(keys)
        }
    }
}
