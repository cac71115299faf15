import LockboxCore

/// The sync database's tables, created and upgraded by numbered migrations.
///
/// The tables hold ciphertext, opaque identifiers, versions and device identifiers only:
/// - `lockbox_sync_groups`: one row per group: its change counter, its head (the counter and a
///   digest of its records, MACed with the group key) and the group key sealed by a key derived
///   from the group passphrase (Argon2id).
/// - `lockbox_sync_items`: the latest sealed record of each item (a tombstone after a delete):
///   the item's opaque identifier (a keyed digest of its primary key), the counter value it was
///   written at (`version`) and the device that wrote it.
/// - `lockbox_sync_devices`: each device's public key (attested with the group key), how far it
///   has pulled and when it last synced.
/// - `lockbox_sync_key_grants`: the group key of an epoch sealed to one device's public key
///   (written when a device is removed and the key rotates).
/// - `lockbox_sync_invitations`: one-time pairing codes' wraps of the group key, until used or
///   expired.
/// - `lockbox_fleet_sessions`: OAuth sessions a fleet shares, sealed with the group key.
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
        ],
        // 2: devices and key epochs (pairing codes, removal with key rotation), fleet sessions.
        [
            "ALTER TABLE lockbox_sync_groups ADD COLUMN key_epoch bigint NOT NULL DEFAULT 0",
            "ALTER TABLE lockbox_sync_groups ALTER COLUMN key_wrap DROP NOT NULL",
            "ALTER TABLE lockbox_sync_devices ADD COLUMN public_key bytea",
            "ALTER TABLE lockbox_sync_devices ADD COLUMN attestation bytea",
            "ALTER TABLE lockbox_sync_devices ADD COLUMN last_sync timestamptz",
            """
        CREATE TABLE lockbox_sync_key_grants (
            group_id text NOT NULL REFERENCES lockbox_sync_groups ON DELETE CASCADE,
            device_id text NOT NULL,
            epoch bigint NOT NULL,
            sealed_key bytea NOT NULL,
            PRIMARY KEY (group_id, device_id, epoch))
        """,
            """
        CREATE TABLE lockbox_sync_invitations (
            group_id text NOT NULL REFERENCES lockbox_sync_groups ON DELETE CASCADE,
            invitation_id text NOT NULL,
            key_wrap bytea NOT NULL,
            expires_at timestamptz NOT NULL,
            PRIMARY KEY (group_id, invitation_id))
        """,
            """
        CREATE TABLE lockbox_fleet_sessions (
            group_id text NOT NULL REFERENCES lockbox_sync_groups ON DELETE CASCADE,
            session_id text NOT NULL,
            version bigint NOT NULL,
            refresh_token bytea,
            access_token bytea,
            PRIMARY KEY (group_id, session_id))
        """,
        ],
        // 3: the group's head (counter and digest of its records, MACed: SyncHead).
        [
            "ALTER TABLE lockbox_sync_groups ADD COLUMN head bytea",
        ],
        // 4: a fleet session's refresh in flight: until when (the database's clock, in
        // milliseconds) the lock's holder may still be presenting the stored refresh token.
        [
            "ALTER TABLE lockbox_fleet_sessions ADD COLUMN refresh_in_flight_until bigint",
        ],
    ]

    static var currentVersion: Int { migrations.count }

    /// Brings the database to ``currentVersion``. Concurrent callers wait on a transaction-scoped
    /// advisory lock, so each migration runs once. A database newer than this code is refused.
    /// Only `creating` (a group being created) makes the tables in a database that has none:
    /// anything else (a status, a sync, a join) pointed at a database without them is an error
    /// that changes nothing there (a mistyped `dbname=` is not filled with tables).
    /// - Parameter acceptingNewer: a schema newer than this code is taken as it is (a fleet
    ///   session's reads, stores and lock, whose table later versions keep as they are), not
    ///   refused (a sync's records and heads).
    static func migrate(_ connection: PostgresConnection, creating: Bool = false, acceptingNewer: Bool = false) throws(LockboxError) {
        // Current already (every sync but the first after an upgrade): one query, no lock, no
        // DDL. Anything else (no table yet, an older or newer version, an error) takes the
        // locked path, which says what is wrong.
        if let rows = try? connection.execute("SELECT coalesce(max(version), 0) FROM lockbox_sync_schema"),
            let version = try? PostgresConnection.integer(rows.first?.first ?? nil),
            Int(version) == currentVersion || acceptingNewer && Int(version) > currentVersion
        {
            return
        }
        try connection.transaction { () throws(LockboxError) in
            try connection.execute("SELECT pg_advisory_xact_lock(7170656173)")
            // A table the role cannot see for want of USAGE on its schema (one its search path
            // names) reads as absent to to_regclass(): the catalog, which every role reads, tells
            // the two apart.
            let found = try connection.execute(
                """
                SELECT to_regclass('lockbox_sync_schema') IS NOT NULL,
                    EXISTS (SELECT 1 FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
                        WHERE c.relname = 'lockbox_sync_schema' AND NOT has_schema_privilege(n.oid, 'USAGE')
                        AND (n.nspname = current_user
                            OR n.nspname = ANY(string_to_array(replace(replace(current_setting('search_path'), '"', ''), ' ', ''), ',')))),
                    current_schema() IS NOT NULL
                """)
            let visible = found.first?[0] == "t"
            if !visible, found.first?[1] == "t" || (creating && found.first?[2] != "t") {
                throw PostgresConnection.insufficientPrivilege(
                    found.first?[1] == "t"
                        ? "the Lockbox sync tables are in a schema it may not use" : "it may use no schema of its search path")
            }
            if !creating && !visible {
                throw LockboxError(
                    .itemNotFound,
                    "That database holds no sync group (it has no Lockbox sync tables); nothing was changed there. "
                        + "Check the connection string (its dbname=), or create a group with `lockbox sync create`.")
            }
            if !visible { try connection.execute("CREATE TABLE IF NOT EXISTS lockbox_sync_schema (version integer NOT NULL)") }
            let rows = try connection.execute("SELECT coalesce(max(version), 0) FROM lockbox_sync_schema")
            let version = Int(try PostgresConnection.integer(rows.first?.first ?? nil))
            if acceptingNewer && version > currentVersion { return }
            guard version <= currentVersion else {
                throw LockboxError(
                    .unimplemented,
                    "The sync database has schema version \(version), newer than this Lockbox knows (\(currentVersion)). Upgrade Lockbox on this machine.")
            }
            do throws(LockboxError) {
                for next in version..<currentVersion {
                    for statement in migrations[next] { try connection.execute(statement) }
                    try connection.execute("INSERT INTO lockbox_sync_schema (version) VALUES ($1)", [.integer(Int64(next + 1))])
                }
            } catch where version > 0 && error.message.hasPrefix(PostgresConnection.insufficientPrivilegeMessage) {
                throw LockboxError(
                    .io,
                    "The sync database has schema version \(version), and this Lockbox needs \(currentVersion): upgrading it changes "
                        + "its tables, which this role may not do. Nothing was changed. Run any `lockbox sync` command once with a "
                        + "connection string naming the tables' owner (it upgrades them), then sync again with this one.")
            }
        }
    }
}
