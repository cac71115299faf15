import FoundationEssentials
import LockboxCore
import LockboxVault
import Synchronization
import VaultCrypto
import VaultStorage

#if canImport(Glibc)
import Glibc
#endif

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
    /// The vault whose synchronizable items this group syncs.
    public let vault: Vault
    let database: String
    /// This vault's identity in the group (see ``DeviceSecret``).
    let device: DeviceSecret
    /// The group's keys at the newest epoch this device holds.
    private let current: Mutex<SyncKeys>
    /// Where this vault keeps what it knows of the group (see ``SyncState``).
    public let statePath: String
    /// One sync at a time through this value (the state is read, then rewritten).
    let syncing = Mutex(())
    /// Where the last pull spent its time (lockbox-sync-bench prints it).
    package let lastPullTimings = Mutex(PullTimings())
    /// The device this keychain was in the group before it joined again as a new device (its
    /// device key gone: the keychain made anew at the same path, or the key deleted), as the
    /// local state it left said; nil when it was none, or the state did not say. Its row stays
    /// listed in the group until a device of the group removes it.
    public let replacedDevice: String?
    /// Called once the rows a pull adds are listed in the state, before the vault commits them
    /// (what it throws rolls the vault's transaction back): the tests copy the state there, as
    /// a process stopped after the vault's commit leaves it, or stop the commit.
    let afterListingAdded = Mutex<(@Sendable () throws(LockboxError) -> Void)?>(nil)
    /// Called before a push applies here the records that won over its changes: the tests
    /// change the vault there, as another process may between the push's read and that apply.
    let beforeApplyingSuperseding = Mutex<(@Sendable () throws(LockboxError) -> Void)?>(nil)

    var keys: SyncKeys { current.withLock { $0 } }
    /// This device's identifier in the group (random, public).
    public var deviceID: String { device.id }
    /// The key epoch this device holds: 0 at creation, one more at each device removal.
    public var keyEpoch: Int64 { keys.epoch }

    /// What one ``sync()`` did.
    public struct Report: Sendable, Equatable {
        /// Records this device wrote (edits and tombstones); a record the database already held
        /// is not counted.
        public var pushed = 0
        /// Records of other devices applied here (including deletes).
        public var pulled = 0
        /// Local edits that lost to a later write of another device (that write was applied).
        public var superseded = 0

        /// Vault rows the push read to find changes: the rows written since the last push, not
        /// every synchronizable item (rows a pull added are read once, by the next push).
        public var examined = 0

        /// What this sync could not record on this machine beside its changes (a full disk, a
        /// directory's permissions), each a sentence saying what that weakens until a later sync
        /// records it. The sync itself is complete.
        public var notes: [String] = []

        /// When the sync began (its push lists this vault's changes from then): the database
        /// records this device's last sync as that moment (``recordPull(_:counter:since:)``).
        var started = ContinuousClock.now

        /// A report of nothing done.
        public init() {}

        public static func == (left: Report, right: Report) -> Bool {
            left.pushed == right.pushed && left.pulled == right.pulled && left.superseded == right.superseded
                && left.examined == right.examined && left.notes == right.notes
        }

        /// True when this sync wrote nothing to the database or the vault.
        public var changedNothing: Bool { pushed == 0 && pulled == 0 && superseded == 0 }
    }

    static let keyService = "lockbox.sync.group-key"
    static let deviceService = "lockbox.sync.device"
    static let keyAccessGroup = "lockbox.sync"

    init(groupID: String, vault: Vault, database: String, keys: SyncKeys, device: DeviceSecret, replacedDevice: String? = nil) {
        self.groupID = groupID
        self.vault = vault
        self.database = database
        self.device = device
        self.replacedDevice = replacedDevice
        current = Mutex(keys)
        statePath = SyncState.path(vault: vault.path, groupID: groupID)
    }

    func install(_ keys: SyncKeys) throws(LockboxError) {
        try Self.storeGroupKeys(keys, groupID: groupID, in: vault)
        current.withLock { $0 = keys }
    }

    // MARK: Creating, joining, opening

    /// Creates a group (this vault is its first device): random group keys, kept in this vault
    /// as a `ThisDeviceOnly` item. With `passphrase`, the database also holds them sealed by a
    /// key derived from it (Argon2id), for other devices to join with; without, devices join
    /// only with a pairing code (``pairingCode(validFor:)``).
    public static func create(vault: Vault, database: String, passphrase: SecretBytes? = nil) throws(LockboxError) -> SyncGroup {
        try requireUnlocked(vault, "Unlock it to create a sync group.")
        try requireWholeKeychain(vault)
        if let passphrase { try checkNewPassphrase(passphrase) }
        let connection = try PostgresConnection(database)
        try SyncSchema.migrate(connection, creating: true)
        let groupID = Crypto.randomBytes(16).hexString
        let keys = SyncKeys.generate()
        let wrap = try passphrase.map { passphrase throws(LockboxError) in try wrapKeys(keys, groupID: groupID, purpose: "passphrase", secret: passphrase) }
        try connection.execute(
            "INSERT INTO lockbox_sync_groups (group_id, counter, key_wrap, key_epoch) VALUES ($1, 0, $2, 0)",
            [.text(groupID), wrap.map { .bytes($0) } ?? .null])
        return try enroll(groupID: groupID, vault: vault, database: database, keys: keys, connection: connection)
    }

    /// Joins an existing group with its passphrase; the group keys are then kept in this vault.
    /// - Throws: `authFailed` for a wrong passphrase (or a group that has none since a device
    ///   was removed); `itemNotFound` when there is no such group.
    public static func join(
        _ groupID: String, vault: Vault, database: String, passphrase: SecretBytes
    ) throws(LockboxError) -> SyncGroup {
        try checkGroupIdentifier(groupID)
        try requireUnlocked(vault, "Unlock it to join a sync group.")
        try requireWholeKeychain(vault)
        let connection = try PostgresConnection(database)
        try SyncSchema.migrate(connection)
        let rows = try connection.execute("SELECT key_wrap FROM lockbox_sync_groups WHERE group_id = $1", [.text(groupID)])
        guard let row = rows.first else { throw noSuchGroup(groupID) }
        guard !passphrase.isEmpty else {
            throw LockboxError(.param, "The group passphrase is empty. Enter the group's passphrase, or join with a pairing code from one of its devices.")
        }
        guard row[0] != nil else {
            throw LockboxError(
                .authFailed, "The sync group \(groupID) has no passphrase (it was created without one, or a device was removed). Join it with a pairing code from one of its devices.")
        }
        let keys = try unwrapKeys(try PostgresConnection.bytes(row[0]), groupID: groupID, purpose: "passphrase", secret: passphrase)
        return try enroll(groupID: groupID, vault: vault, database: database, keys: keys, connection: connection)
    }

    /// Joins an existing group with a one-time pairing code that one of its devices showed
    /// (``pairingCode(validFor:)``). The code is used up by the attempt, right or wrong.
    /// - Throws: `authFailed` for a wrong, used or expired code.
    public static func join(
        _ groupID: String, vault: Vault, database: String, pairingCode: String
    ) throws(LockboxError) -> SyncGroup {
        try checkGroupIdentifier(groupID)
        let code = PairingCode.normalized(pairingCode)
        guard PairingCode.isWellFormed(code) else {
            throw LockboxError(
                .param,
                "A pairing code has \(PairingCode.length) letters and digits (dashes optional; no U). Check the code shown on the other device; "
                    + "it was not used.")
        }
        // Before the code is used up: a join that could not keep the keys, or its state,
        // would waste it.
        try requireUnlocked(vault, "Unlock it to join a sync group; the pairing code was not used.")
        try requireWholeKeychain(vault)
        try SyncFiles.prepareDirectory(SyncFiles.directory(vault: vault.path))
        let connection = try PostgresConnection(database)
        try SyncSchema.migrate(connection)
        guard try !connection.execute("SELECT 1 FROM lockbox_sync_groups WHERE group_id = $1", [.text(groupID)]).isEmpty else {
            throw noSuchGroup(groupID)
        }
        // The device key is made before the code is used up: a keychain that cannot keep one
        // (an item of another device key's holds its name: another XDG_STATE_HOME) fails here,
        // with the code still good. Taken back if the join goes no further.
        let prepared = try DeviceSecret.load(groupID: groupID, from: vault) == nil ? try DeviceSecret.create(groupID: groupID, in: vault) : nil
        let keys: SyncKeys
        var seed: [String: [UInt8]]?
        do throws(LockboxError) {
            let invitation = String(code.prefix(PairingCode.invitationLength))
            // Taken and removed in one statement: a code serves one attempt only.
            let rows = try connection.execute(
                "DELETE FROM lockbox_sync_invitations WHERE group_id = $1 AND invitation_id = $2 RETURNING key_wrap, expires_at > now()",
                [.text(groupID), .text(invitation)])
            let refused = LockboxError(
                .authFailed, "The pairing code is wrong, already used or expired. Ask a device of the group for a new one (`lockbox sync invite`).")
            guard let row = rows.first, row[1] == "t" else { throw refused }
            let secret = SecretBytes(copying: Array(code.utf8))
            do throws(LockboxError) {
                let opened = try unwrapKeysAndAttachment(
                    try PostgresConnection.bytes(row[0]), groupID: groupID, purpose: "invitation:" + invitation, secret: secret)
                keys = opened.keys
                if let record = opened.attached {
                    // Sealed under the code: only the inviting device made it. One this Lockbox
                    // cannot read is refused, never taken for no record.
                    guard let devices = SyncKnownDevices.decodeInvitation(record) else {
                        throw LockboxError(
                            .decode,
                            "The pairing code's record of the group's devices cannot be read (made by another version of Lockbox?). "
                                + "Nothing was joined: use a pairing code from a device running this version.")
                    }
                    seed = devices
                }
            } catch where error.code == .authFailed {
                throw refused
            }
        } catch {
            if prepared != nil { try? DeviceSecret.remove(groupID: groupID, from: vault) }
            throw error
        }
        let group = try enroll(groupID: groupID, vault: vault, database: database, keys: keys, connection: connection, prepared: prepared)
        // The inviting device's record of the devices (and its own key), which only it and this
        // device could seal: recorded before the database's list is first read, so that a key a
        // device of the group put in another device's row is not taken for that device's.
        if let seed, !group.knownDevices.seed(seed) {
            throw LockboxError(
                .io,
                "This keychain joined the sync group \(groupID) as device \(group.deviceID), but could not write its record of the "
                    + "group's devices (\(group.knownDevices.path)), which the pairing code vouched for: check that its disk has space "
                    + "and that its directory is this user's. Then join again with a new pairing code: this keychain joins as the "
                    + "same device.")
        }
        return group
    }

    /// The error for a group this device belongs to that the database no longer holds: a
    /// connection string that names another database, or a database restored from before the
    /// group was made (or the group deleted there).
    func groupGone() -> LockboxError {
        LockboxError(
            .itemNotFound,
            "The sync group \(groupID) is not in the database any more. Nothing was changed here, and this keychain keeps its "
                + "items. Check the connection string (`lockbox sync status` uses the same; it is kept in \(vault.path).sync/config). "
                + "If the database was restored from before the group was made, or the group was deleted there, make a new group "
                + "(`lockbox sync create --replace-group`) and join the other devices to it.")
    }

    static func noSuchGroup(_ groupID: String) -> LockboxError {
        LockboxError(
            .itemNotFound,
            "There is no sync group \(groupID) in that database. Check the group identifier (`lockbox sync status` shows it on a device of the group) and the connection string.")
    }

    /// Whether `text` has the form of a group identifier: 32 lowercase hexadecimal digits, as
    /// ``create(vault:database:passphrase:)`` makes them.
    public static func isGroupIdentifier(_ text: String) -> Bool { isLowercaseHex(text, digits: 32) }

    /// Whether `text` is `digits` lowercase hexadecimal digits (identifiers made by `hexString`).
    private static func isLowercaseHex(_ text: String, digits: Int) -> Bool {
        text.utf8.count == digits && text.utf8.allSatisfy { (UInt8(ascii: "0")...UInt8(ascii: "9")).contains($0) || (UInt8(ascii: "a")...UInt8(ascii: "f")).contains($0) }
    }

    /// Whether `text` has the form of a device identifier: 16 lowercase hexadecimal digits.
    package static func isDeviceIdentifier(_ text: String) -> Bool { isLowercaseHex(text, digits: 16) }

    /// Refuses what is not a group identifier, without repeating it (it may be a secret typed
    /// in the wrong place).
    package static func checkGroupIdentifier(_ text: String) throws(LockboxError) {
        guard isGroupIdentifier(text) else {
            throw LockboxError(
                .param, "That is not a sync group identifier (32 hexadecimal digits, as `lockbox sync create` printed it); not shown, in case it is a secret.")
        }
    }

    /// The fewest characters other than spaces a new group passphrase may have. The database holds the group keys
    /// sealed under it (Argon2id), so whoever can read the database can guess at it offline.
    public static let minimumPassphraseLength = 12

    static func checkNewPassphrase(_ passphrase: SecretBytes) throws(LockboxError) {
        // Characters counted in place (no copy of the passphrase in a String), decoded from
        // UTF-8: only those one can see count, since twelve spaces, no-break spaces, NUL bytes
        // or other control or format characters are no passphrase. A byte that is not UTF-8
        // counts as one (a passphrase of random bytes).
        let characters = passphrase.withUnsafeBytes { bytes -> Int in
            var parser = Unicode.UTF8.ForwardParser()
            var input = bytes.makeIterator()
            var count = 0
            while true {
                switch parser.parseScalar(from: &input) {
                case .valid(let encoded):
                    let properties = Unicode.UTF8.decode(encoded).properties
                    switch properties.generalCategory {
                    case .control, .format, .spaceSeparator, .lineSeparator, .paragraphSeparator, .unassigned: continue
                    default: if !properties.isWhitespace { count += 1 }
                    }
                case .error: count += 1
                case .emptyInput: return count
                }
            }
        }
        guard characters >= minimumPassphraseLength else {
            throw LockboxError(
                .param,
                "The group passphrase is too short: anyone who can read the sync database can guess at it offline. Choose one of at least \(minimumPassphraseLength) characters (a few words), or none and join devices with pairing codes.")
        }
    }

    /// Creating, joining and managing a group hand out or take in its keys: only while the user
    /// has the keychain unlocked, as the keychain's own secrets.
    package static func requireUnlocked(_ vault: Vault, _ hint: String) throws(LockboxError) {
        guard try vault.isUnlocked else { throw LockboxError.locked(hint) }
    }

    /// Sync reads and writes every synchronizable item of the keychain, of every access group:
    /// a handle that sees only some groups would take the others' changes for deletes, and could
    /// not apply their records. Refused, before anything is read or written.
    package static func requireWholeKeychain(_ vault: Vault) throws(LockboxError) {
        guard vault.configuration.accessGroups != nil else { return }
        throw LockboxError(
            .param,
            "Sync works on the whole keychain, every access group: open it without an access-group restriction "
                + "(Vault.Configuration.accessGroups nil) to sync it.")
    }

    /// A group this vault already belongs to, with its keys from the vault.
    /// - Throws: `itemNotFound` when this vault has not joined the group; `errSecParam` for a
    ///   handle restricted to some access groups (``requireWholeKeychain(_:)``).
    public convenience init(_ groupID: String, vault: Vault, database: String) throws(LockboxError) {
        try Self.requireWholeKeychain(vault)
        var query = Query.genericPassword(service: Self.keyService, account: groupID, accessGroup: Self.keyAccessGroup)
        query.returning = [.data, .attributes]
        let item: Item
        do {
            item = try vault.item(matching: query)
        } catch where error.code == .itemNotFound {
            // A state of the group beside the keychain: it did join. Its key is bound to the
            // device key of the environment that joined (ThisDeviceOnly), which this process may
            // not use; or it was deleted (a delete with --all deletes it too).
            if access(SyncState.path(vault: vault.path, groupID: groupID), F_OK) == 0 {
                throw LockboxError(
                    .itemNotFound,
                    "This keychain joined the sync group \(groupID), but this process finds no key of the group in it. Either this "
                        + "process uses another device key file than the one that joined (another XDG_STATE_HOME or HOME, as a "
                        + "sandboxed or service environment may set): sync from that environment. Or the group's key was deleted "
                        + "from the keychain (a delete with --all deletes it too): join the group again, as a new device, and remove "
                        + "the former one from another device of the group.")
            }
            throw LockboxError(.itemNotFound, "This keychain has not joined the sync group \(groupID). Join it with a pairing code or the group passphrase.")
        }
        guard let secrets = item.data, secrets.count == 2 * Crypto.keyByteCount, let generic = item.attributes.generic,
            let epoch = Int64(String(decoding: generic, as: UTF8.self))
        else { throw LockboxError.integrity("The sync group's key") }
        guard let device = try DeviceSecret.load(groupID: groupID, from: vault) else {
            throw LockboxError(
                .itemNotFound,
                "This keychain holds the sync group \(groupID)'s key but no device key for it (deleted). Join the group again "
                    + "(`lockbox sync join \(groupID)`) as a new device, then remove the old one from a device of the group.")
        }
        self.init(groupID: groupID, vault: vault, database: database, keys: SyncKeys(secrets: secrets, epoch: epoch), device: device)
    }

    /// The groups this vault belongs to (their identifiers).
    public static func groups(in vault: Vault) throws(LockboxError) -> [String] {
        var query = Query(.genericPassword, limit: .all, returning: [.attributes])
        query.attributes.service = keyService
        query.attributes.accessGroup = keyAccessGroup
        do {
            return try vault.items(matching: query).compactMap { $0.attributes.account }.sorted()
        } catch where error.code == .itemNotFound {
            return []
        }
    }

    /// Keeps the keys and a device identity in `vault`, and registers the device (its public key
    /// attested with the group key) in the database.
    /// - Parameter prepared: a device key made for this join before it used up its pairing
    ///   code, taken as one made here.
    static func enroll(
        groupID: String, vault: Vault, database: String, keys: SyncKeys, connection: PostgresConnection, prepared: DeviceSecret? = nil
    ) throws(LockboxError) -> SyncGroup {
        let device: DeviceSecret
        var replaced: String?
        var created = false
        if prepared == nil, let existing = try DeviceSecret.load(groupID: groupID, from: vault) {
            device = existing
            // A state an earlier device of this keychain left, which a join stopped after it made
            // this device's key (before it removed that state) did not remove: removed now.
            let statePath = SyncState.path(vault: vault.path, groupID: groupID)
            if let named = SyncState.device(atPath: statePath), named != existing.id {
                replaced = try SyncState.removeStale(path: statePath)
                try FleetMarks.removeStale(path: FleetMarks.path(vault: vault.path, groupID: groupID))
            }
        } else {
            if let prepared { device = prepared } else { device = try DeviceSecret.create(groupID: groupID, in: vault) }
            created = true
            // A local state (or fleet marks) left at this keychain's path by an earlier device
            // of it in the group (the keychain made anew, or its device key deleted) is under a
            // key that is gone: it can be neither checked nor used, and would fail every sync as
            // damaged. Removed once the new device is made, so never while the earlier key is
            // only out of sight (a handle of another device identity, whose new key the vault
            // refuses as a duplicate of the earlier one's): a join that fails removes nothing.
            // Should the removal fail, the new key is taken back, so that the next join (the
            // cause fixed) removes them then.
            do throws(LockboxError) {
                replaced = try SyncState.removeStale(path: SyncState.path(vault: vault.path, groupID: groupID))
                try FleetMarks.removeStale(path: FleetMarks.path(vault: vault.path, groupID: groupID))
            } catch {
                try DeviceSecret.remove(groupID: groupID, from: vault)
                throw error
            }
        }
        if let replaced, replaced != device.id { SyncFiles.removeDeviceRecords(vault: vault, group: groupID, deviceID: replaced) }
        let group = SyncGroup(groupID: groupID, vault: vault, database: database, keys: keys, device: device, replacedDevice: replaced)
        do {
            try group.register(connection)
        } catch {
            // Not a member (a removal replaced the key meanwhile, say): a device key made for
            // this join is taken back, and no group key is kept.
            if created { try? DeviceSecret.remove(groupID: groupID, from: vault) }
            throw error
        }
        do {
            try storeGroupKeys(keys, groupID: groupID, in: vault)
        } catch {
            // The database lists this device already (a pairing code is used up): the device key
            // is kept, so that the next join, the cause fixed, joins as the same device.
            throw LockboxError(
                error.code,
                "This keychain joined the sync group \(groupID) as device \(device.id) (the database lists it; a pairing code is "
                    + "used up), but could not keep the group's keys: \(error.message) Once that is fixed, join again with a new "
                    + "pairing code or the group passphrase: this keychain joins as the same device.", cause: error.cause)
        }
        return group
    }

    /// Writes this device's row in the database: its public key, attested with the group key.
    /// Under a shared lock of the group row, at the group's current key epoch only: a device
    /// removal (which holds that row's lock while it seals the new key to the devices it lists)
    /// either sees this row and grants it the new key, or has committed first, and this device,
    /// holding the former key, is refused.
    func register(_ connection: PostgresConnection) throws(LockboxError) {
        try connection.transaction { () throws(LockboxError) in
            let rows = try connection.execute("SELECT key_epoch FROM lockbox_sync_groups WHERE group_id = $1 FOR SHARE", [.text(groupID)])
            guard let row = rows.first else { throw Self.noSuchGroup(groupID) }
            guard try PostgresConnection.integer(row[0]) == keys.epoch else {
                throw LockboxError(
                    .authFailed,
                    "A device was removed from the group while this one joined, which replaced the key this one was given. "
                        + "Nothing was joined: ask a device of the group for a new pairing code (or use the new group passphrase) and join again.")
            }
            try connection.execute(
                """
                INSERT INTO lockbox_sync_devices (group_id, device_id, pulled_version, public_key, attestation) VALUES ($1, $2, 0, $3, $4)
                ON CONFLICT (group_id, device_id) DO UPDATE SET public_key = excluded.public_key, attestation = excluded.attestation
                """,
                [.text(groupID), .text(device.id), .bytes(device.publicKey), .bytes(attestation(device.id, device.publicKey, keys: keys))])
        }
    }

    /// Seals the group keys under a key derived from `secret` (a passphrase or a pairing code)
    /// with Argon2id.
    /// - Parameter attached: bytes sealed beside the keys under the same secret (a pairing code's
    ///   record of the inviting device's devices), as a fourth field.
    static func wrapKeys(
        _ keys: SyncKeys, groupID: String, purpose: String, secret: SecretBytes, attached: [UInt8]? = nil
    ) throws(LockboxError) -> [UInt8] {
        let derivation = PassphraseKeyDerivation(strength: .interactive)
        guard let wrappingKey = try derivation.deriveKey(from: secret) else {
            throw LockboxError(.allocate, "Cannot allocate memory to derive the group key. Free some memory and try again.")
        }
        var wrap = FieldEncoder()
        wrap.bytes(derivation.encoded())
        wrap.integer(Int(keys.epoch))
        // The keys' box says whether a record goes with it: a wrap cut back to three fields (to
        // pass for an earlier Lockbox's, and so carry no record) no longer opens.
        wrap.bytes(
            Crypto.seal(
                keys.secrets, key: wrappingKey,
                associatedData: keyWrapAssociatedData(
                    groupID, derivation.encoded(), epoch: keys.epoch, purpose: attached == nil ? purpose : purpose + Self.withRecord)))
        if let attached {
            wrap.bytes(
                Crypto.seal(
                    SecretBytes(copying: attached), key: wrappingKey,
                    associatedData: keyWrapAssociatedData(groupID, derivation.encoded(), epoch: keys.epoch, purpose: purpose + ":attached")))
        }
        return wrap.bytes
    }

    /// Added to the purpose a wrap's keys are sealed for when a record goes with them.
    static let withRecord = "+record"

    static func unwrapKeys(_ wrap: [UInt8], groupID: String, purpose: String, secret: SecretBytes) throws(LockboxError) -> SyncKeys {
        try unwrapKeysAndAttachment(wrap, groupID: groupID, purpose: purpose, secret: secret).keys
    }

    /// ``unwrapKeys(_:groupID:purpose:secret:)``, with what was sealed beside the keys (nil for a
    /// wrap of three fields: a passphrase's, or a pairing code made by an earlier Lockbox).
    static func unwrapKeysAndAttachment(
        _ wrap: [UInt8], groupID: String, purpose: String, secret: SecretBytes
    ) throws(LockboxError) -> (keys: SyncKeys, attached: [UInt8]?) {
        var decoder = FieldDecoder(wrap)
        guard let parameters = try? decoder.bytes(), let epoch = try? decoder.integer(), let box = try? decoder.bytes(),
            let derivation = PassphraseKeyDerivation(decoding: parameters), derivation.meetsMinimum
        else { throw LockboxError.syncDatabase("The sealed group key in the sync database") }
        var attachedBox: [UInt8]?
        if !decoder.isAtEnd {
            guard let extra = try? decoder.bytes(), decoder.isAtEnd else { throw LockboxError.syncDatabase("The sealed group key in the sync database") }
            attachedBox = extra
        }
        guard let wrappingKey = try derivation.deriveKey(from: secret) else {
            throw LockboxError(.allocate, "Cannot allocate memory to derive the group key. Free some memory and try again.")
        }
        let keysPurpose = attachedBox == nil ? purpose : purpose + withRecord
        guard
            let secrets = try? Crypto.open(
                box, key: wrappingKey, associatedData: keyWrapAssociatedData(groupID, parameters, epoch: Int64(epoch), purpose: keysPurpose)),
            secrets.count == 2 * Crypto.keyByteCount
        else {
            throw LockboxError(.authFailed, "The group passphrase is wrong. Enter the group's current passphrase: the one it was created with, or the one the last device removal set (a removal drops the one before).")
        }
        var attached: [UInt8]?
        if let attachedBox {
            // Sealed under the same secret: the database cannot have made it, only changed it.
            guard
                let opened = try? Crypto.open(
                    attachedBox, key: wrappingKey,
                    associatedData: keyWrapAssociatedData(groupID, parameters, epoch: Int64(epoch), purpose: purpose + ":attached"))
            else { throw LockboxError.syncDatabase("The sealed group key in the sync database") }
            attached = opened.withUnsafeBytes { Array($0) }
        }
        return (SyncKeys(secrets: secrets, epoch: Int64(epoch)), attached)
    }

    static func keyWrapAssociatedData(_ groupID: String, _ parameters: [UInt8], epoch: Int64, purpose: String) -> [UInt8] {
        var encoder = FieldEncoder()
        encoder.string("lockbox.sync.group-key.v2")
        encoder.string(groupID)
        encoder.bytes(parameters)
        encoder.integer(Int(epoch))
        encoder.string(purpose)
        return encoder.bytes
    }

    /// The group keys as an item of this vault: sealed by its `afterFirstUnlockThisDeviceOnly`
    /// class key, so they never leave the machine (not in backups, not in a copied file), and
    /// never synchronized. The epoch is the item's `generic` attribute.
    static func storeGroupKeys(_ keys: SyncKeys, groupID: String, in vault: Vault) throws(LockboxError) {
        let epoch = Data(String(keys.epoch).utf8)
        var item = Item.genericPassword(
            service: keyService, account: groupID, data: keys.secrets, accessibility: .afterFirstUnlockThisDeviceOnly,
            accessGroup: keyAccessGroup, label: "Lockbox sync group key")
        item.attributes.generic = epoch
        do {
            try vault.add(item)
        } catch where error.code == .duplicateItem {
            let query = Query.genericPassword(service: keyService, account: groupID, accessGroup: keyAccessGroup)
            var attributes = item.attributes
            attributes.generic = epoch
            try vault.update(matching: query, to: ItemUpdate(attributes: attributes, data: keys.secrets))
        }
    }

    // MARK: Syncing

    /// One local item that may sync.
    struct LocalItem {
        var item: Item
        var digest: [UInt8]
    }

    /// Passwords, certificates and software keys, as iOS 14 and later sync.
    static let syncedClasses: [ItemClass] = [.genericPassword, .internetPassword, .certificate, .key]

    /// Pushes this vault's changes since the last sync, then pulls the other devices' (only
    /// records newer than this device's cursor). Finding the changes costs a pass over the
    /// vault's row identifiers plus reading the changed rows, not a read of every item. Each
    /// phase is one database transaction; a crash or a dropped connection at any point loses
    /// nothing and duplicates nothing: run it again.
    /// - Throws: `interactionNotAllowed` when the vault is locked (a locked item is never taken
    ///   for a deleted one); `notAvailable` when the database cannot be reached (the vault is
    ///   untouched); `decode` when the database served a record that fails to open, or one
    ///   older than this device has already seen (a replay); `authFailed` when this device was
    ///   removed from the group.
    @discardableResult
    public func sync() throws(LockboxError) -> Report {
        try Self.requireUnlocked(vault, "Unlock it to sync: locked items cannot be read, and are never taken for deleted ones.")
        return try session { connection, state throws(LockboxError) -> Report in
            var report = Report()
            let written = try push(connection, state: state, report: &report)
            try pull(connection, state: state, report: &report, floor: written)
            return report
        }
    }

    /// Runs `body` as one sync of this vault and group (across processes too, under the sync
    /// lock), with a connection whose schema and keys are current and the local state.
    /// - Parameter checkingBehind: false for a recovery only, which takes a database restored
    ///   below what this machine recorded of its last pull, and sets that record anew.
    func session<T>(checkingBehind: Bool = true, _ body: (PostgresConnection, SyncState) throws(LockboxError) -> T) throws(LockboxError) -> T {
        try syncing.withLock { _ throws(LockboxError) -> T in
            let lock = try SyncLock(statePath: statePath)
            defer { withExtendedLifetime(lock) {} }
            let connection = try PostgresConnection(database)
            try SyncSchema.migrate(connection)
            try catchUpKeys(connection)
            let mark = pulledMark.read()
            do throws(LockboxError) {
                let state = try SyncState(path: statePath, device: device.id, key: device.stateKey)
                if checkingBehind { try checkNotBehind(mark, state: state) }
                try adoptApplying(state, connection: connection)
                return try body(connection, state)
            } catch where Database.isDamage(error) && error.message.contains(statePath) {
                // SQLite's own error about the state's file (a table dropped, say): the state is
                // damaged, and said so with its remedy.
                throw SyncState.damaged(statePath)
            }
        }
    }

    /// Lists `rows`, which the vault is about to add, in `state` (``SyncState/recordApplying(_:)``).
    func listAdding(_ rows: [Data: SyncState.Applying], in state: SyncState) throws(LockboxError) {
        guard !rows.isEmpty else { return }
        try state.recordApplying(rows)
        try afterListingAdded.withLock { $0 }?()
    }

    /// Settles the rows an earlier pull listed as being added (``SyncState/applying``) and whose
    /// process stopped before the state recorded them. A row the vault holds is the item's, as
    /// is one it deleted since (it has a deletion record): both are recorded with the entry of
    /// the record applied, so that the push compares the row with that record, and writes the
    /// delete of one deleted here (or made local: no longer synchronizable, or ThisDeviceOnly).
    /// (Without this, the pull would not know the item was ever here, and would bring it back.) A row the vault neither holds nor deleted was never
    /// committed: the pull applies its record again. Identifiers are never reused (each holds
    /// random bytes), so a row held now is the one the pull added.
    ///
    /// A row a push listed (``SyncState/Applying/pushed``) holds the item's record only if the
    /// database holds that record's stamp or a later one (which replaced it, or which it lost
    /// to): then it is recorded as a pulled one is; otherwise (the transaction never committed)
    /// only as the row that holds the item, which the push compares with what the group has. Without `connection`
    /// (``status()``), a list holding such a row is left for the next sync.
    func adoptApplying(_ state: SyncState, connection: PostgresConnection?) throws(LockboxError) {
        guard !state.applying.isEmpty else { return }
        // The earliest stamp a push listed of each item (a listing per row; one item, one row).
        let pushed = Dictionary(state.applying.values.filter(\.pushed).map { ($0.id, $0.entry.stamp) }, uniquingKeysWith: min)
        var inGroup: Set<String> = []
        if !pushed.isEmpty {
            guard let connection else { return }
            let keys = self.keys
            // The stopped push's transaction may still be committing (its COMMIT sent before the
            // process died: the server completes it all the same). It holds the group row until
            // it ends, so the records are read under a shared lock of that row: after it
            // committed or rolled back, never before. Before, a listing read too early was
            // dropped, a later delete of the item was not pushed, and the record that landed
            // then brought the item back on every device.
            let rows = try connection.transaction { () throws(LockboxError) -> [[[UInt8]?]] in
                guard try !connection.execute("SELECT 1 FROM lockbox_sync_groups WHERE group_id = $1 FOR SHARE", [.text(groupID)]).isEmpty
                else { throw groupGone() }
                return try records(
                    connection, "item_id = ANY($2::text[])", [.texts(Array(pushed.keys))], atMost: Int64(pushed.count), tooMany: .syncDatabase())
            }
            for row in rows {
                guard let id = row[0].map({ String(decoding: $0, as: UTF8.self) }), let payload = row[2] else { throw LockboxError.syncDatabase() }
                let record = try SyncRecord.open(payload, group: groupID, itemID: id, version: try PostgresConnection.integer(binary: row[1]), keys: keys)
                // The listed record, or a later one (which replaced it, or which it would have lost to).
                if let listed = pushed[id], listed <= record.stamp { inGroup.insert(id) }
            }
        }
        // Held synchronizable or not: one made local since is the item's, whose delete the push writes.
        let present = try vault.presentRows(among: state.applying.keys)
        let deleted = try vault.deletionTimes(of: state.applying.keys.filter { !present.contains($0) })
        var changes = SyncState.Changes()
        changes.settlesApplying = true
        for (reference, row) in state.applying where present.contains(reference) || deleted[reference] != nil {
            if row.pushed, try state.row(reference) != nil {
                // A row the state knows as holding another item, or none that syncs (renamed,
                // made to sync): its mapping stays, so that the push still writes the delete of
                // what it held; the listing stays too, if the record reached the group, for the
                // push to write this item's delete if the row is gone or holds another item,
                // and to push the item the state has it hold after the delete of it that the
                // stopped push wrote, should it hold that item again (``push(_:state:report:)``).
                // A push that never committed wrote nothing: its listing is dropped.
                if inGroup.contains(row.id) { changes.applying[reference] = row }
            } else {
                changes.setRow(reference, .some(row.id))
            }
            if row.pushed && !inGroup.contains(row.id) { continue }
            if let known = try state.entry(row.id), known.stamp >= row.entry.stamp { continue }
            changes.entries[row.id] = row.entry
        }
        try state.commit(changes)
    }

    static func isEligible(_ item: Item) -> Bool {
        item.attributes.synchronizable == true && item.accessControl == nil
            && !(item.attributes.accessibility ?? .default).isThisDeviceOnly && syncedClasses.contains(item.itemClass)
            // A hardware key's value is its TPM's wrapped blob: it never leaves the machine.
            && !(item.itemClass == .key && ManagedKeyValue.isHardwareKey(descriptor: item.attributes.generic))
    }

    /// The item in the vault row `reference`, when it syncs; nil when the row is gone or does
    /// not sync (another class, ThisDeviceOnly, access control).
    /// - Throws: `interactionNotAllowed` when the row is locked: a locked item is never taken
    ///   for one that does not sync (its last record would be replaced by a delete).
    func readLocal(_ reference: Data) throws(LockboxError) -> LocalItem? {
        try readLocal([reference])[reference]
    }

    /// ``readLocal(_:)`` for many rows, in one read of the vault: the rows that sync, by
    /// reference.
    func readLocal(_ references: some Collection<Data>) throws(LockboxError) -> [Data: LocalItem] {
        var local: [Data: LocalItem] = [:]
        for (reference, item) in try vault.synchronizableItems(inRows: Array(references), classes: Self.syncedClasses)
        where Self.isEligible(item) {
            local[reference] = LocalItem(item: item, digest: SyncRecord.contentDigest(item, keys: keys))
        }
        return local
    }

    func itemID(_ item: Item) -> String {
        Self.itemID(item, keys: keys)
    }

    /// An item's opaque identifier in the group: a keyed digest of its primary key.
    static func itemID(_ item: Item, keys: SyncKeys) -> String {
        Array(Crypto.keyedDigest(PrimaryKey.encode(item.itemClass, item.attributes), key: keys.naming).prefix(20)).hexString
    }

    /// When a record was written: the date a vault gives the change it applies from it.
    static func date(_ stamp: SyncStamp) -> Date {
        Date(timeIntervalSince1970: Double(stamp.modified) / 1000)
    }

    /// The date a change another device made is applied with here: its stamp, but never later
    /// than now here. A writer whose clock runs ahead must not give items dates in this machine's
    /// future, which would sort them after every later local change (a restore's newer copy,
    /// the order items are listed in). Earlier than the stamp is the safe side: were this
    /// device's state lost, the change would be pushed again with that date, and it would
    /// lose, not win, against anything written after the stamp elsewhere.
    /// `now` is the vault's clock, which dates its own writes.
    static func appliedDate(_ stamp: SyncStamp, now: Date) -> Date {
        min(date(stamp), now)
    }

    static func milliseconds(_ date: Date?) -> Int64 {
        Int64(((date ?? Date()).timeIntervalSince1970 * 1000).rounded(.down))
    }
}
