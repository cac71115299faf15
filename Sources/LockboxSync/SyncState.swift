import FoundationEssentials
import LockboxCore
import VaultCrypto
import VaultStorage

#if canImport(Glibc)
import Glibc
#endif

/// What one device knows of its group, in a small SQLite file next to its vault
/// (`VAULT.sync/GROUP.db`, mode 0600), so that a sync reads and writes only what changed:
///
/// - `progress`: how far this device has pulled (`cursor`, a database version) and pushed
///   (`generation`, the vault's write generation its last push covered).
/// - `entries`: per item (opaque identifier) the last version this device saw or wrote: its
///   stamp, content digest and whether it is a tombstone.
/// - `rows`: which vault row (persistent reference) holds which item; nil for a synchronizable
///   row that does not sync (ThisDeviceOnly, access control). A row known here and gone from
///   the vault is a delete.
///
/// - `verified`: per item, the version and head element (``SyncHead``) of its record as the
///   last head this device verified lists it; `progress` keeps that head's digest. A pull
///   checks what it receives against the next head from these (withheld or replayed records).
///
/// Nothing in it is secret (identifiers are opaque, digests keyed); each row carries a MAC made
/// with the device's state key, so an edited row (which could make this device push a delete
/// the user never made) is an error, not a reason to act.
///
/// Each phase of a sync updates it in one SQLite transaction after the database committed; a
/// crash before that only repeats work: pushing an item whose record is already the
/// database's writes nothing, and pulling a record already applied changes nothing.
final class SyncState {
    struct Entry: Equatable {
        var stamp: SyncStamp
        var contentDigest: [UInt8]
        var isTombstone: Bool
    }

    private let database: Database
    private let key: SecretBytes
    let device: String
    private(set) var cursor: Int64
    private(set) var generation: Int
    /// The digest of the head at `cursor` this device verified; nil before its first verified
    /// pull (or in a state from before heads): the next pull then starts from version 0.
    private(set) var accumulator: [UInt8]?

    static func path(vault: String, groupID: String) -> String { vault + ".sync/" + groupID + ".db" }

    /// Opens (creating when missing) the state of `device` in the group.
    init(path: String, device: String, key: SecretBytes) throws(LockboxError) {
        let directory = String(path[..<(path.lastIndex(of: "/") ?? path.startIndex)])
        let oldMask = umask(0o077)
        defer { umask(oldMask) }
        if !directory.isEmpty && mkdir(directory, 0o700) != 0 && errno != EEXIST {
            throw LockboxError(.io, "Cannot create \(directory). Check the directory's permissions, then sync again.")
        }
        database = try Database(path: path, create: true)
        // The write-ahead log is synced at checkpoints, not at every commit: a power loss may
        // then take back the last commits of this file, which leaves it as a crash just before
        // them would (behind the vault and the database, which a sync already recovers from:
        // it repeats work, never loses or duplicates any). The vault itself stays fully
        // synchronous.
        try database.execute("PRAGMA synchronous=NORMAL")
        // Nor is it checkpointed when this connection closes (at the end of every sync): a
        // sync then writes the file without a single sync of the disk. The log is kept short,
        // since the next connection reads all of it first: checkpointed automatically past 100
        // pages, and emptied after a large commit (``commit(_:)``).
        try database.keepWriteAheadLogOnClose()
        try database.execute("PRAGMA wal_autocheckpoint=100")
        self.key = key
        self.device = device
        try database.execute(
            """
            CREATE TABLE IF NOT EXISTS progress (
                id INTEGER PRIMARY KEY CHECK (id = 1), device TEXT NOT NULL, cursor INTEGER NOT NULL,
                generation INTEGER NOT NULL, mac BLOB NOT NULL);
            CREATE TABLE IF NOT EXISTS entries (
                item_id TEXT PRIMARY KEY, modified INTEGER NOT NULL, writer TEXT NOT NULL, digest BLOB NOT NULL,
                tombstone INTEGER NOT NULL, mac BLOB NOT NULL) WITHOUT ROWID;
            CREATE TABLE IF NOT EXISTS rows (
                reference BLOB PRIMARY KEY, item_id TEXT, mac BLOB NOT NULL) WITHOUT ROWID;
            CREATE INDEX IF NOT EXISTS rows_by_item ON rows(item_id);
            CREATE TABLE IF NOT EXISTS verified (
                item_id TEXT PRIMARY KEY, version INTEGER NOT NULL, element BLOB NOT NULL) WITHOUT ROWID;
            """)
        // A state from before heads: its progress gains the head's digest (none yet).
        let hasAccumulator = try database.firstRow("SELECT count(*) FROM pragma_table_info('progress') WHERE name = 'accumulator'") {
            $0.integer(0) ?? 0
        }
        if hasAccumulator == 0 { try database.execute("ALTER TABLE progress ADD COLUMN accumulator BLOB") }
        let statement = try database.statement("SELECT device, cursor, generation, mac, accumulator FROM progress WHERE id = 1")
        defer { statement.reset() }
        if try statement.step() {
            let stored = statement.text(0) ?? ""
            let cursor = Int64(statement.integer(1) ?? -1)
            let generation = statement.integer(2) ?? -1
            let accumulator = statement.blob(4)
            guard
                statement.blob(3)
                    == Self.progressMAC(device: stored, cursor: cursor, generation: generation, accumulator: accumulator, key: key)
            else {
                throw LockboxError.integrity("The sync state \(path)")
            }
            if stored == device {
                self.cursor = cursor
                self.generation = generation
                self.accumulator = accumulator
            } else {
                // The state of another device identity (joined again): start over; the first
                // sync adopts what the database already holds.
                self.cursor = 0
                self.generation = 0
                try database.execute("DELETE FROM entries; DELETE FROM rows; DELETE FROM verified; DELETE FROM progress")
            }
        } else {
            cursor = 0
            generation = 0
        }
    }

    // MARK: MACs

    private static func progressMAC(device: String, cursor: Int64, generation: Int, accumulator: [UInt8]?, key: SecretBytes) -> [UInt8] {
        var encoder = FieldEncoder()
        encoder.string(accumulator == nil ? "progress" : "progress.v2")
        encoder.string(device)
        encoder.integer(Int(cursor))
        encoder.integer(generation)
        if let accumulator { encoder.bytes(accumulator) }
        return Crypto.keyedDigest(encoder.bytes, key: key)
    }

    private func entryMAC(_ id: String, _ entry: Entry) -> [UInt8] {
        var encoder = FieldEncoder()
        encoder.string("entry")
        encoder.string(id)
        encoder.integer(Int(entry.stamp.modified))
        encoder.string(entry.stamp.device)
        encoder.bytes(entry.contentDigest)
        encoder.integer(entry.isTombstone ? 1 : 0)
        return Crypto.keyedDigest(encoder.bytes, key: key)
    }

    private func rowMAC(_ reference: [UInt8], _ id: String?) -> [UInt8] {
        var encoder = FieldEncoder()
        encoder.string("row")
        encoder.bytes(reference)
        encoder.string(id)
        return Crypto.keyedDigest(encoder.bytes, key: key)
    }

    private var failure: LockboxError { LockboxError.integrity("The sync state \(database.path)") }

    // MARK: Reading

    func entry(_ id: String) throws(LockboxError) -> Entry? {
        let statement = try database.statement("SELECT modified, writer, digest, tombstone, mac FROM entries WHERE item_id = ?")
        defer { statement.reset() }
        statement.bind(1, id)
        guard try statement.step() else { return nil }
        let entry = Entry(
            stamp: SyncStamp(modified: Int64(statement.integer(0) ?? 0), device: statement.text(1) ?? ""),
            contentDigest: statement.blob(2) ?? [], isTombstone: statement.integer(3) == 1)
        guard statement.blob(4) == entryMAC(id, entry) else { throw failure }
        return entry
    }

    /// The item a vault row held at the last sync: `.some(nil)` for a row that does not sync,
    /// nil for a row this device does not know.
    func row(_ reference: Data) throws(LockboxError) -> String?? {
        let statement = try database.statement("SELECT item_id, mac FROM rows WHERE reference = ?")
        defer { statement.reset() }
        statement.bind(1, Array(reference))
        guard try statement.step() else { return nil }
        let id = statement.text(0)
        guard statement.blob(1) == rowMAC(Array(reference), id) else { throw failure }
        return .some(id)
    }

    /// The vault row that holds `id`, if this device knows one.
    func reference(of id: String) throws(LockboxError) -> Data? {
        let statement = try database.statement("SELECT reference, mac FROM rows WHERE item_id = ?")
        defer { statement.reset() }
        statement.bind(1, id)
        guard try statement.step(), let reference = statement.blob(0) else { return nil }
        guard statement.blob(1) == rowMAC(reference, id) else { throw failure }
        return Data(reference)
    }

    var rowCount: Int {
        get throws(LockboxError) {
            let statement = try database.statement("SELECT count(*) FROM rows")
            defer { statement.reset() }
            _ = try statement.step()
            return statement.integer(0) ?? 0
        }
    }

    /// Every known row and the item it holds (the slow path that finds deletes).
    func allRows() throws(LockboxError) -> [Data: String?] {
        let statement = try database.statement("SELECT reference, item_id, mac FROM rows")
        defer { statement.reset() }
        var rows: [Data: String?] = [:]
        while try statement.step() {
            let reference = statement.blob(0) ?? []
            let id = statement.text(1)
            guard statement.blob(2) == rowMAC(reference, id) else { throw failure }
            rows[Data(reference)] = .some(id)
        }
        return rows
    }

    /// The version and head element of `id`'s record in the last verified head; nil when that
    /// head lists no record of it. (An edited row only makes the next check fail.)
    func verified(_ id: String) throws(LockboxError) -> Listed? {
        let statement = try database.statement("SELECT version, element FROM verified WHERE item_id = ?")
        defer { statement.reset() }
        statement.bind(1, id)
        guard try statement.step() else { return nil }
        return Listed(version: Int64(statement.integer(0) ?? 0), element: statement.blob(1) ?? [])
    }

    /// True when this device has recorded nothing yet (before its first pull).
    var isEmpty: Bool {
        get throws(LockboxError) {
            let statement = try database.statement("SELECT EXISTS (SELECT 1 FROM entries) OR EXISTS (SELECT 1 FROM rows)")
            defer { statement.reset() }
            _ = try statement.step()
            return statement.integer(0) == 0
        }
    }

    /// Items with a live entry (not tombstones): how many, for `lockbox sync status`.
    var liveEntryCount: Int {
        get throws(LockboxError) {
            let statement = try database.statement("SELECT count(*) FROM entries WHERE tombstone = 0")
            defer { statement.reset() }
            _ = try statement.step()
            return statement.integer(0) ?? 0
        }
    }

    // MARK: Writing

    /// One item's record as a verified head lists it.
    struct Listed: Equatable {
        var version: Int64
        var element: [UInt8]
    }

    /// Changes of one phase, applied in one transaction.
    struct Changes {
        var entries: [String: Entry] = [:]
        /// Records of the newly verified head (with `replacesVerified`, all of them).
        var verified: [String: Listed] = [:]
        var replacesVerified = false
        /// The newly verified head's digest (with `cursor`, its counter).
        var accumulator: [UInt8]?
        /// Reference -> item (nil: a row that does not sync); `.none` as a value removes the row.
        var rows: [Data: String??] = [:]
        var cursor: Int64?
        var generation: Int?

        /// True when committing would write nothing new to a state at `cursor`, `generation`
        /// and `accumulator`.
        func changesNothing(of state: SyncState) -> Bool {
            entries.isEmpty && verified.isEmpty && !replacesVerified && rows.isEmpty && (cursor ?? state.cursor) == state.cursor
                && (generation ?? state.generation) == state.generation && (accumulator ?? state.accumulator) == state.accumulator
        }
    }

    /// Rows past which a commit empties the write-ahead log after it.
    static let largeCommit = 300

    /// Writes `changes` in one transaction; nothing when they change nothing (a sync with
    /// nothing to push or pull writes no local state).
    func commit(_ changes: Changes) throws(LockboxError) {
        if changes.changesNothing(of: self) { return }
        try database.writeTransaction { () throws(LockboxError) in
            let putEntry = try database.statement(
                "INSERT OR REPLACE INTO entries (item_id, modified, writer, digest, tombstone, mac) VALUES (?, ?, ?, ?, ?, ?)")
            // Each table is written in its key's order: SQLite appends to its B-tree instead of
            // splitting pages all over it (a first pull writes 10,000 rows to each).
            for (id, entry) in changes.entries.sorted(by: { $0.key < $1.key }) {
                putEntry.reset()
                putEntry.bind(1, id)
                putEntry.bind(2, Int(entry.stamp.modified))
                putEntry.bind(3, entry.stamp.device)
                putEntry.bind(4, entry.contentDigest)
                putEntry.bind(5, entry.isTombstone ? 1 : 0)
                putEntry.bind(6, entryMAC(id, entry))
                try putEntry.run()
            }
            putEntry.reset()
            let putRow = try database.statement("INSERT OR REPLACE INTO rows (reference, item_id, mac) VALUES (?, ?, ?)")
            let dropRow = try database.statement("DELETE FROM rows WHERE reference = ?")
            let rows = changes.rows.map { (reference: Array($0.key), id: $0.value) }.sorted {
                $0.reference.lexicographicallyPrecedes($1.reference)
            }
            for (reference, id) in rows {
                if let id {
                    putRow.reset()
                    putRow.bind(1, reference)
                    putRow.bind(2, id)
                    putRow.bind(3, rowMAC(reference, id))
                    try putRow.run()
                } else {
                    dropRow.reset()
                    dropRow.bind(1, reference)
                    try dropRow.run()
                }
            }
            putRow.reset()
            dropRow.reset()
            if changes.replacesVerified { try database.execute("DELETE FROM verified") }
            let putVerified = try database.statement("INSERT OR REPLACE INTO verified (item_id, version, element) VALUES (?, ?, ?)")
            for (id, listed) in changes.verified.sorted(by: { $0.key < $1.key }) {
                putVerified.reset()
                putVerified.bind(1, id)
                putVerified.bind(2, Int(listed.version))
                putVerified.bind(3, listed.element)
                try putVerified.run()
            }
            putVerified.reset()
            let cursor = changes.cursor ?? self.cursor
            let generation = changes.generation ?? self.generation
            let accumulator = changes.accumulator ?? self.accumulator
            let putProgress = try database.statement(
                "INSERT OR REPLACE INTO progress (id, device, cursor, generation, mac, accumulator) VALUES (1, ?, ?, ?, ?, ?)")
            defer { putProgress.reset() }
            putProgress.bind(1, device)
            putProgress.bind(2, Int(cursor))
            putProgress.bind(3, generation)
            putProgress.bind(
                4, Self.progressMAC(device: device, cursor: cursor, generation: generation, accumulator: accumulator, key: key))
            putProgress.bind(5, accumulator)
            try putProgress.run()
        }
        // A large commit (a first pull) leaves a long log that every later sync would read
        // when it opens the file: it is moved into the file and emptied now.
        if changes.entries.count + changes.verified.count + changes.rows.count > Self.largeCommit {
            database.truncateWriteAheadLog()
        }
        if let cursor = changes.cursor { self.cursor = cursor }
        if let generation = changes.generation { self.generation = generation }
        if let accumulator = changes.accumulator { self.accumulator = accumulator }
    }

    /// Forgets what this device pushed and pulled (after a key rotation re-sealed every record).
    func reset() throws(LockboxError) {
        try database.writeTransaction { () throws(LockboxError) in
            try database.execute("DELETE FROM entries; DELETE FROM rows; DELETE FROM verified; DELETE FROM progress")
        }
        cursor = 0
        generation = 0
        accumulator = nil
    }
}
