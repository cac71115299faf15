import LockboxCore
import VaultStorage

/// The vault file's schema and its migrations.
///
/// The schema version lives in `PRAGMA user_version`. Opening a vault runs every migration
/// from its version up to ``current`` in one write transaction, so a failed migration leaves
/// the file as it was. A file from a newer Lockbox is refused rather than guessed at.
package enum VaultSchema {
    /// The version this build writes.
    ///
    /// - 1: the first release.
    /// - 2: rows bind their lookup digests and a version into their authenticated data and are
    ///   padded; an authenticated integrity state (a generation and one accumulator per bucket
    ///   of rows) detects replayed, deleted and rolled-back rows; the attempt counter is
    ///   authenticated. The schema step adds the columns; the rows are resealed at the first
    ///   unlock (``Vault/upgradeRows``), which needs the keys.
    /// - 3: the accumulators move to `integrity_groups`, one row per group of 16 buckets, and
    ///   the state's MACs cover a digest per group, so a write rewrites one small row instead of
    ///   8 KiB; bucket checks read a range of the lookup index, and the two indexes only they
    ///   and class scans used (`items_by_bucket`, `items_by_class`) are dropped; a partial index
    ///   of the synchronizable rows by version lets sync find what changed without a scan of
    ///   every row (other rows' writes do not touch it). The schema step
    ///   needs no keys: a state of format 2 stays readable where it is until the next write
    ///   converts it (``IntegrityState/load(from:)``).
    /// - 4: the UNIQUE index of primary digests is gone (the table is rebuilt without it; rows,
    ///   row ids and the other indexes stay as they were): a write checks that a primary key is
    ///   new through the lookup index (``Vault/RowWriter``), so an add changes one index fewer.
    ///   The group rows get columns for the record's generation and MACs, which a write puts in
    ///   the rows it changes (state format 4) instead of rewriting `vault_state` too. An add
    ///   thus writes two pages fewer to the write-ahead log. No keys needed: a record of format
    ///   3 stays where it is until the next write converts it.
    /// - 5: the integrity record's MACs cover a tree of digests (state format 5,
    ///   ``IntegrityState/currentFormat``): an add digests about 1.4 KiB for the record instead
    ///   of about 1.8 KiB under keys, with no change to the tables. The step changes nothing but
    ///   the version, so that a Lockbox of schema 4, which cannot verify a record of format 5,
    ///   refuses the file as newer instead of reporting it tampered; the record is converted
    ///   at the next write, like format 3's was.
    /// - 6: `sync_deletions`: the deletion of a synchronizable row is recorded with its time
    ///   (and the writing generation, under a MAC of the unlocked vault's state key), so that
    ///   sync stamps the delete with when it was made, not with when it was noticed.
    /// - 7: the integrity record's MACs also cover a sum of one keyed value per such record
    ///   (state format 6, kept in `vault_state.accumulators`), so a record removed, or one put
    ///   back from an older copy, is found like a row. The step changes nothing but the version, so that a
    ///   Lockbox of schema 6 refuses the file as newer instead of reporting it tampered; the
    ///   record is converted at the next write.
    static let current = 7

    /// The page size of vault files created by this build (SQLite's default is 4096; a file
    /// keeps the size it was created with). Every page a write changes is appended whole to the
    /// write-ahead log and checksummed there: an add changes about eight (the items table, its
    /// four indexes, the integrity record), so half-size pages halve the bytes each durable
    /// write copies and checksums. A row (about 600 bytes) still fits a page three times, and a
    /// lookup at 100,000 items goes one level deeper, from pages SQLite's cache keeps.
    package static let pageSize = 2048

    /// Takes a vault from `version` to `version + 1`. A later schema adds a case here.
    static func migrate(_ database: Database, from version: Int) throws(LockboxError) {
        switch version {
        case 0: try createVersion1(database)
        case 1: try addVersion2(database)
        case 2: try addVersion3(database)
        case 3: try addVersion4(database)
        case 4: break
        case 5: try addVersion6(database)
        case 6: break
        default: throw LockboxError(.param, "No migration from keychain schema version \(version).")
        }
    }

    /// Brings `database` to ``current``.
    static func migrate(_ database: Database) throws(LockboxError) {
        let found = try database.userVersion
        guard found <= current else {
            throw LockboxError(
                .param,
                "The keychain at \(database.path) has schema version \(found), newer than this Lockbox (\(current)). "
                    + "Upgrade Lockbox to open it.")
        }
        guard found < current else { return }
        do {
            try database.writeTransaction { () throws(LockboxError) in
                // Re-read inside the transaction: another process may have migrated meanwhile.
                var version = try database.userVersion
                while version < current {
                    try migrate(database, from: version)
                    version += 1
                    try database.execute("PRAGMA user_version = \(version)")
                }
            }
        } catch where says(error.message, "already exists") || says(error.message, "duplicate column") {
            // A step that finds what it would add already there: the file's tables are of a later
            // schema than its version says (the version number was edited). Nothing was changed.
            throw LockboxError(
                .decode,
                "The keychain's schema version (\(found)) does not match its tables, which are of a later one: the keychain file "
                    + "was modified or is damaged. Restore it from a backup.", cause: error.cause)
        }
    }

    /// True when `message` holds `words` (compared as bytes: what string searching Foundation
    /// offers would link it, and CoreFoundation with it, into the lean programs).
    private static func says(_ message: String, _ words: String) -> Bool {
        let text = Array(message.utf8)
        let wanted = Array(words.utf8)
        guard !wanted.isEmpty, text.count >= wanted.count else { return false }
        return (0...(text.count - wanted.count)).contains { start in text[start..<start + wanted.count].elementsEqual(wanted) }
    }

    private static func addVersion2(_ database: Database) throws(LockboxError) {
        try database.execute(
            """
            ALTER TABLE items ADD COLUMN format INTEGER NOT NULL DEFAULT 1;
            ALTER TABLE items ADD COLUMN version INTEGER NOT NULL DEFAULT 0;
            ALTER TABLE items ADD COLUMN bucket INTEGER NOT NULL DEFAULT 0;
            CREATE INDEX items_by_bucket ON items(bucket, id, version, primary_digest, lookup_digest, name_digest);
            CREATE TABLE vault_state (
                id INTEGER PRIMARY KEY CHECK (id = 1),
                generation INTEGER NOT NULL,
                accumulators BLOB NOT NULL,
                mac BLOB NOT NULL,
                always_mac BLOB NOT NULL
            );
            ALTER TABLE unlock_attempts ADD COLUMN mac BLOB;
            """)
    }

    private static func addVersion3(_ database: Database) throws(LockboxError) {
        try database.execute(
            """
            CREATE TABLE integrity_groups (
                id INTEGER PRIMARY KEY CHECK (id >= 0 AND id < 16),
                accumulators BLOB NOT NULL
            );
            ALTER TABLE vault_state ADD COLUMN format INTEGER NOT NULL DEFAULT 2;
            DROP INDEX items_by_bucket;
            DROP INDEX items_by_class;
            CREATE INDEX items_synchronizable ON items(version) WHERE synchronizable = 1;
            """)
    }

    /// SQLite cannot drop a column's UNIQUE constraint: the table is copied into one without
    /// it, row by row with the same row ids, the old one dropped (its pages zeroed:
    /// `secure_delete`), the copy renamed and its indexes made again. Columns keep their order.
    private static func addVersion4(_ database: Database) throws(LockboxError) {
        let columns =
            "rowid, id, item_class, accessibility, access_group, synchronizable, device_id, access_control, primary_digest, "
            + "lookup_digest, name_digest, wrapped_key, metadata, secret, format, version, bucket"
        try database.execute(
            """
            CREATE TABLE items_schema4 (
                rowid INTEGER PRIMARY KEY,
                id BLOB NOT NULL UNIQUE,
                item_class TEXT NOT NULL,
                accessibility TEXT NOT NULL,
                access_group TEXT NOT NULL,
                synchronizable INTEGER NOT NULL,
                device_id TEXT NOT NULL,
                access_control TEXT NOT NULL,
                primary_digest BLOB NOT NULL,
                lookup_digest BLOB NOT NULL,
                name_digest BLOB,
                wrapped_key BLOB NOT NULL,
                metadata BLOB NOT NULL,
                secret BLOB NOT NULL,
                format INTEGER NOT NULL DEFAULT 1,
                version INTEGER NOT NULL DEFAULT 0,
                bucket INTEGER NOT NULL DEFAULT 0
            );
            INSERT INTO items_schema4 (\(columns)) SELECT \(columns) FROM items ORDER BY rowid;
            DROP TABLE items;
            ALTER TABLE items_schema4 RENAME TO items;
            CREATE INDEX items_by_lookup ON items(lookup_digest);
            CREATE INDEX items_by_name ON items(name_digest);
            CREATE INDEX items_synchronizable ON items(version) WHERE synchronizable = 1;
            ALTER TABLE integrity_groups ADD COLUMN generation INTEGER;
            ALTER TABLE integrity_groups ADD COLUMN mac BLOB;
            ALTER TABLE integrity_groups ADD COLUMN always_mac BLOB;
            """)
    }

    private static func addVersion6(_ database: Database) throws(LockboxError) {
        try createDeletionRecords(database)
    }

    /// The table of schema 6: also made again, empty, when it was removed outside Lockbox and
    /// the user asks for it (``Vault/forgetDamagedDeletionRecords()``).
    static func createDeletionRecords(_ database: Database) throws(LockboxError) {
        try database.execute(
            """
            CREATE TABLE sync_deletions (
                reference BLOB PRIMARY KEY,
                deleted_at INTEGER NOT NULL,
                generation INTEGER NOT NULL,
                mac BLOB NOT NULL
            ) WITHOUT ROWID;
            """)
    }

    private static func createVersion1(_ database: Database) throws(LockboxError) {
        try database.execute(
            """
            CREATE TABLE header (name TEXT PRIMARY KEY, value BLOB NOT NULL) WITHOUT ROWID;
            CREATE TABLE key_slots (
                id INTEGER PRIMARY KEY,
                kind TEXT NOT NULL,
                parameters BLOB NOT NULL,
                wrapped_master_key BLOB NOT NULL,
                wrapped_presence_key BLOB
            );
            CREATE TABLE class_keys (
                accessibility TEXT NOT NULL,
                device_id TEXT NOT NULL,
                wrapped_key BLOB NOT NULL,
                PRIMARY KEY (accessibility, device_id)
            ) WITHOUT ROWID;
            CREATE TABLE items (
                rowid INTEGER PRIMARY KEY,
                id BLOB NOT NULL UNIQUE,
                item_class TEXT NOT NULL,
                accessibility TEXT NOT NULL,
                access_group TEXT NOT NULL,
                synchronizable INTEGER NOT NULL,
                device_id TEXT NOT NULL,
                access_control TEXT NOT NULL,
                primary_digest BLOB NOT NULL UNIQUE,
                lookup_digest BLOB NOT NULL,
                name_digest BLOB,
                wrapped_key BLOB NOT NULL,
                metadata BLOB NOT NULL,
                secret BLOB NOT NULL
            );
            CREATE INDEX items_by_lookup ON items(lookup_digest);
            CREATE INDEX items_by_name ON items(name_digest);
            CREATE INDEX items_by_class ON items(item_class, access_group);
            CREATE TABLE unlock_attempts (
                id INTEGER PRIMARY KEY CHECK (id = 1),
                failures INTEGER NOT NULL,
                last_failure REAL NOT NULL
            );
            """)
    }
}
