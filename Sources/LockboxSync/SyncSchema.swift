import LockboxCore

/// The sync database's tables, created and upgraded by numbered migrations.
///
/// The tables hold ciphertext, opaque identifiers, versions and device identifiers only:
/// - `lockbox_sync_groups`: one row per group: its change counter and the group key sealed by
///   a key derived from the group passphrase (Argon2id).
/// - `lockbox_sync_items`: the latest sealed record of each item (a tombstone after a delete):
///   the item's opaque identifier (a keyed digest of its primary key), the counter value it was
///   written at (`version`) and the device that wrote it.
/// - `lockbox_sync_devices`: how far each device has pulled.
enum SyncSchema {
    /// Migration N takes the schema from version N-1 to N. Never edit one that has shipped:
    /// append another.
    /// Each is a list of statements (libpq runs parameterized statements one at a time).
    static let migrations: [[String]] = [
        [
            """
        CREATE TABLE lockbox_sync_groups (
            group_id text PRIMARY KEY,
            counter bigint NOT NULL DEFAULT 0,
            key_wrap bytea NOT NULL)
        """,
            """
        CREATE TABLE lockbox_sync_items (
            group_id text NOT NULL REFERENCES lockbox_sync_groups ON DELETE CASCADE,
            item_id text NOT NULL,
            version bigint NOT NULL,
            device_id text NOT NULL,
            payload bytea NOT NULL,
            PRIMARY KEY (group_id, item_id))
        """,
            "CREATE INDEX lockbox_sync_items_by_version ON lockbox_sync_items (group_id, version)",
            """
        CREATE TABLE lockbox_sync_devices (
            group_id text NOT NULL REFERENCES lockbox_sync_groups ON DELETE CASCADE,
            device_id text NOT NULL,
            pulled_version bigint NOT NULL,
            PRIMARY KEY (group_id, device_id))
        """,
        ]
    ]

    static var currentVersion: Int { migrations.count }

    /// Brings the database to ``currentVersion``. Concurrent callers wait on a transaction-scoped
    /// advisory lock, so each migration runs once. A database newer than this code is refused.
    static func migrate(_ connection: PostgresConnection) throws(LockboxError) {
        try connection.transaction { () throws(LockboxError) in
            try connection.execute("SELECT pg_advisory_xact_lock(7170656173)")
            try connection.execute("CREATE TABLE IF NOT EXISTS lockbox_sync_schema (version integer NOT NULL)")
            let rows = try connection.execute("SELECT coalesce(max(version), 0) FROM lockbox_sync_schema")
            let version = Int(try PostgresConnection.integer(rows.first?.first ?? nil))
            guard version <= currentVersion else {
                throw LockboxError(
                    .unimplemented,
                    "The sync database has schema version \(version), newer than this Lockbox knows (\(currentVersion)). Upgrade Lockbox on this machine.")
            }
            for next in version..<currentVersion {
                for statement in migrations[next] { try connection.execute(statement) }
                try connection.execute("INSERT INTO lockbox_sync_schema (version) VALUES ($1)", [.integer(Int64(next + 1))])
            }
        }
    }
}
