import FoundationEssentials
import LockboxCore
import VaultCrypto

#if canImport(Glibc)
import Glibc
#endif

/// A fleet's OAuth sessions in the group's database (`lockbox_fleet_sessions`), sealed with the
/// group's fleet key, which only the group's machines hold: the administrator sees a session
/// identifier (a keyed digest of issuer, client and account), a version and ciphertext.
/// `LockboxFleet` puts LockboxAuth's `TokenStore`, `AccessTokenCache` and `RefreshLock` on these.
extension SyncGroup {
    /// What a session row holds.
    package enum FleetField: String, Sendable {
        case refreshToken = "refresh_token"
        case accessToken = "access_token"
    }

    /// The opaque identifier of the session `account` names (a storage account of LockboxAuth).
    package func fleetSessionID(_ account: String) -> String {
        var encoder = FieldEncoder()
        encoder.string("lockbox.fleet.session.v1")
        encoder.string(account)
        return Array(Crypto.keyedDigest(encoder.bytes, key: keys.naming).prefix(20)).hexString
    }

    /// A connection with this device at the group's current key epoch.
    package func fleetConnection() throws(LockboxError) -> PostgresConnection {
        let connection = try PostgresConnection(database)
        try SyncSchema.migrate(connection, acceptingNewer: true)
        try catchUpKeys(connection)
        return connection
    }

    /// What a field's two boxes are bound to: the group, the session, the field, which box, the
    /// key epoch and (from format 2) the field's version, so that no sealed field passes for
    /// another, or for another version of itself.
    private func fleetAssociatedData(
        session: String, field: FleetField, part: Int, epoch: Int64, version: Int64?, refreshVersion: Int64? = nil
    ) -> [UInt8] {
        var encoder = FieldEncoder()
        encoder.string(version == nil ? "lockbox.fleet.v1" : refreshVersion == nil ? "lockbox.fleet.v2" : "lockbox.fleet.v3")
        encoder.string(groupID)
        encoder.string(session)
        encoder.string(field.rawValue)
        encoder.integer(part)
        encoder.integer(Int(epoch))
        if let version { encoder.integer(Int(version)) }
        if let refreshVersion { encoder.integer(Int(refreshVersion)) }
        return encoder.bytes
    }

    /// Seals a secret and its (non-secret) details for one field of a session, at `version`.
    /// An access token also carries, sealed with it, the version of the refresh token the row
    /// held when it was stored (format 3): every machine that reads the access token, which all
    /// do at every call, learns how far the refresh token has gone, not only the machine that
    /// last refreshed (``readFleetTimed(_:session:field:caughtUp:)``).
    func sealFleet(
        _ secret: SecretBytes, details: [UInt8], session: String, field: FleetField, version: Int64, refreshVersion: Int64? = nil,
        keys: SyncKeys
    ) -> [UInt8] {
        func data(_ part: Int) -> [UInt8] {
            fleetAssociatedData(session: session, field: field, part: part, epoch: keys.epoch, version: version, refreshVersion: refreshVersion)
        }
        var encoder = FieldEncoder()
        encoder.bytes(Crypto.seal(details, key: keys.fleet, associatedData: data(0)))
        encoder.bytes(Crypto.seal(secret, key: keys.fleet, associatedData: data(1)))
        encoder.integer(Int(version))
        if let refreshVersion { encoder.integer(Int(refreshVersion)) }
        return encoder.bytes
    }

    /// Opens a sealed field: its secret, details and version (0 for a field of the first
    /// format, which had none), and for an access token of format 3 the refresh token's version
    /// it was stored beside.
    func openFleet(_ sealed: [UInt8], session: String, field: FleetField, keys: SyncKeys) throws(LockboxError) -> (
        secret: SecretBytes, details: [UInt8], version: Int64, refreshVersion: Int64?
    ) {
        let failure = LockboxError.syncDatabase("A fleet session in the sync database")
        var decoder = FieldDecoder(sealed)
        guard let detailsBox = try? decoder.bytes(), let secretBox = try? decoder.bytes() else { throw failure }
        var version: Int64?
        var refreshVersion: Int64?
        if !decoder.isAtEnd {
            guard let number = try? decoder.integer(), number > 0 else { throw failure }
            version = Int64(number)
            if !decoder.isAtEnd {
                guard field == .accessToken, let refresh = try? decoder.integer(), refresh >= 0 else { throw failure }
                refreshVersion = Int64(refresh)
            }
            guard decoder.isAtEnd else { throw failure }
        }
        func data(_ part: Int) -> [UInt8] {
            fleetAssociatedData(session: session, field: field, part: part, epoch: keys.epoch, version: version, refreshVersion: refreshVersion)
        }
        guard let details = try? Crypto.openBytes(detailsBox, key: keys.fleet, associatedData: data(0)),
            let secret = try? Crypto.open(secretBox, key: keys.fleet, associatedData: data(1))
        else { throw failure }
        return (secret, details, version ?? 0, refreshVersion)
    }

    /// A sealed field's version, authenticated by its details box alone (bound to it): the
    /// token itself is not opened.
    func fleetVersion(_ sealed: [UInt8], session: String, field: FleetField, keys: SyncKeys) throws(LockboxError) -> Int64 {
        let failure = LockboxError.syncDatabase("A fleet session in the sync database")
        var decoder = FieldDecoder(sealed)
        guard let detailsBox = try? decoder.bytes(), (try? decoder.bytes()) != nil else { throw failure }
        guard !decoder.isAtEnd else { return 0 }
        guard let number = try? decoder.integer(), number > 0 else { throw failure }
        var refreshVersion: Int64?
        if !decoder.isAtEnd { refreshVersion = (try? decoder.integer()).map(Int64.init) }
        let data = fleetAssociatedData(
            session: session, field: field, part: 0, epoch: keys.epoch, version: Int64(number), refreshVersion: refreshVersion)
        guard (try? Crypto.openBytes(detailsBox, key: keys.fleet, associatedData: data)) != nil else { throw failure }
        return Int64(number)
    }

    /// This machine's marks of the versions it saw (``FleetMarks``).
    var fleetMarks: FleetMarks { FleetMarks(path: FleetMarks.path(vault: vault.path, groupID: groupID), key: device.stateKey) }

    /// One field of a session, opened; nil when there is none.
    /// - Throws: `errSecDecode` for a field that fails to open, or one older than a version this
    ///   machine already read or wrote (an older token put back in the database).
    package func readFleet(_ connection: PostgresConnection, session: String, field: FleetField) throws(LockboxError) -> (
        secret: SecretBytes, details: [UInt8]
    )? {
        try readFleetTimed(connection, session: session, field: field).map { ($0.secret, $0.details) }
    }

    /// ``readFleet(_:session:field:)``, with the database's time in milliseconds when it read
    /// the field (times in a field's details are in that clock: one clock for the fleet).
    package func readFleetTimed(_ connection: PostgresConnection, session: String, field: FleetField, caughtUp: Bool = false) throws(LockboxError) -> (
        secret: SecretBytes, details: [UInt8], databaseTime: Int64
    )? {
        // The mark as it was before the database was asked: a newer version that another
        // process of this machine writes and marks meanwhile is not a replay.
        let mark = try fleetMarks.mark(session: session, field: field)
        let rows = try connection.execute(
            "SELECT \(field.rawValue), \(Self.fleetClock), version FROM lockbox_fleet_sessions WHERE group_id = $1 AND session_id = $2",
            [.text(groupID), .text(session)])
        guard let row = rows.first else { return nil }
        guard let value = row[0] else {
            // Signed out (or the access token removed) at the row's version: a field sealed
            // before then, put back by the database, is refused like any older one. A later
            // write is sealed past that version.
            fleetMarks.raise(session: session, field: field, to: try PostgresConnection.integer(row[2]))
            return nil
        }
        let databaseTime = try PostgresConnection.integer(row[1])
        let opened: (secret: SecretBytes, details: [UInt8], version: Int64, refreshVersion: Int64?)
        do {
            opened = try openFleet(try PostgresConnection.bytes(value), session: session, field: field, keys: keys)
        } catch where error.code == .decode && !caughtUp {
            // A device removal may have re-sealed the row under a new epoch since this
            // connection caught up: caught up again, and read once more.
            try catchUpKeys(connection)
            return try readFleetTimed(connection, session: session, field: field, caughtUp: true)
        }
        if let mark, opened.version < mark { throw fleetMarks.replayed() }
        fleetMarks.raise(session: session, field: field, to: opened.version)
        // The refresh token this access token was stored beside: one older put back is refused
        // on this machine too, though it has not refreshed since (before, only the machine that
        // had last read the refresh token could tell).
        if let refreshVersion = opened.refreshVersion, refreshVersion > 0 {
            fleetMarks.raise(session: session, field: .refreshToken, to: refreshVersion)
        }
        return (opened.secret, opened.details, databaseTime)
    }

    /// Writes (or, with nil, clears) one field of a session; committed when it returns. The
    /// field is sealed at the row's next version, taken under the row's lock: versions only
    /// grow, across sign-outs too (a cleared session keeps its row).
    package func writeFleet(
        _ connection: PostgresConnection, session: String, field: FleetField, secret: SecretBytes?, details: [UInt8] = []
    ) throws(LockboxError) {
        // The group's epoch is checked under a shared lock of its row, which a device removal
        // holds exclusively while it re-seals the sessions: a field is never sealed with a key
        // the removal has just replaced. A removal that committed first is caught up with, and
        // the write made again.
        // Above the newest version of the field this machine has read or written, too: the row's
        // version and the clock are the database's, and an administrator who moved the row's
        // version up, then down, would otherwise have a newer token sealed below an older one
        // that this machine then took for the newer.
        // (A marks file that cannot be read does not fail the store, as for its raise below: a
        // read of the field fails on it instead.)
        let seen = ((try? fleetMarks.mark(session: session, field: field)) ?? nil) ?? 0
        // A rotated (or new) refresh token ends any refresh in flight (``markRefreshInFlight``).
        let endsRefresh = field == .refreshToken ? ", refresh_in_flight_until = NULL" : ""
        for _ in 0..<3 {
            let keys = self.keys
            let written = try connection.transaction { () throws(LockboxError) -> Int64? in
                let group = try connection.execute(
                    "SELECT key_epoch, \(Self.fleetClock) FROM lockbox_sync_groups WHERE group_id = $1 FOR SHARE", [.text(groupID)])
                guard let epoch = group.first else {
                    throw groupGone()
                }
                guard try PostgresConnection.integer(epoch[0]) == keys.epoch else { return nil }
                let rows = try connection.execute(
                    "SELECT version, refresh_token FROM lockbox_fleet_sessions WHERE group_id = $1 AND session_id = $2 FOR UPDATE",
                    [.text(groupID), .text(session)])
                // Past the row's version, and at least the database's time in milliseconds: a
                // row deleted (by the administrator, or a Lockbox of the first format signing
                // out) and written again does not start over below what the machines saw of it.
                let previous = try rows.first.map { row throws(LockboxError) in try PostgresConnection.integer(row[0]) } ?? 0
                let version = max(try SyncHead.version(after: previous), try PostgresConnection.integer(epoch[1]), try SyncHead.version(after: seen))
                // An access token carries the version of the refresh token beside it, as opened
                // (one that does not open vouches for nothing: none is carried).
                var refreshVersion: Int64?
                if field == .accessToken, let stored = rows.first?[1] {
                    refreshVersion = try? fleetVersion(try PostgresConnection.bytes(stored), session: session, field: .refreshToken, keys: keys)
                }
                let value: PostgresConnection.Value =
                    secret.map {
                        .bytes(sealFleet($0, details: details, session: session, field: field, version: version, refreshVersion: refreshVersion, keys: keys))
                    } ?? .null
                try connection.execute(
                    """
                    INSERT INTO lockbox_fleet_sessions (group_id, session_id, version, \(field.rawValue)) VALUES ($1, $2, $3, $4)
                    ON CONFLICT (group_id, session_id) DO UPDATE SET \(field.rawValue) = excluded.\(field.rawValue), version = excluded.version\(endsRefresh)
                    """,
                    [.text(groupID), .text(session), .integer(version), value])
                return version
            }
            if let written {
                // A removal too: the field it removed, put back, is refused here as older.
                fleetMarks.raise(session: session, field: field, to: written)
                return
            }
            try catchUpKeys(connection)
        }
        throw LockboxError(.io, "The sync group's key kept changing while a fleet token was stored (devices being removed). Try again.")
    }

    /// The versions a refresh needs left below the largest before it presents its token (its
    /// two stores, and a good many more): only a row edited to within this of the largest lacks
    /// it. Small, so that a version merely moved up (which this machine's marks then follow,
    /// every later write going past them) leaves the session usable.
    static let fleetVersionRoom: Int64 = 1 << 20

    /// The database's time in milliseconds, which fleet versions are at least (``writeFleet``).
    static let fleetClock = "(extract(epoch FROM clock_timestamp()) * 1000)::bigint"

    /// The group's fleet sessions that hold a refresh token (signed in). A device removed from
    /// the group may have read their tokens in clear: re-sealing protects only what is written
    /// afterwards (`lockbox sync remove-device` says so when there are any).
    public func signedInFleetSessions() throws(LockboxError) -> Int {
        let connection = try PostgresConnection(database)
        let rows = try connection.execute(
            "SELECT count(*) FROM lockbox_fleet_sessions WHERE group_id = $1 AND refresh_token IS NOT NULL", [.text(groupID)])
        return Int(try PostgresConnection.integer(rows.first?.first ?? nil))
    }

    /// The database's time in milliseconds.
    package func databaseTime(_ connection: PostgresConnection) throws(LockboxError) -> Int64 {
        try PostgresConnection.integer(try connection.execute("SELECT \(Self.fleetClock)").first?.first ?? nil)
    }

    /// Signs a session out (both tokens gone). The row stays, with its version, so that the
    /// tokens of a later sign-in are newer than any this session had.
    /// Both fields' marks are raised to the cleared row's version, so that the database cannot
    /// undo the sign-out by putting the last sealed tokens back.
    package func clearFleet(_ connection: PostgresConnection, session: String) throws(LockboxError) {
        let rows = try connection.execute(
            """
            UPDATE lockbox_fleet_sessions SET refresh_token = NULL, access_token = NULL, refresh_in_flight_until = NULL,
                version = GREATEST(version + 1, \(Self.fleetClock)) WHERE group_id = $1 AND session_id = $2 RETURNING version
            """,
            [.text(groupID), .text(session)])
        guard let row = rows.first else { return }
        let version = try PostgresConnection.integer(row[0])
        for field in [FleetField.refreshToken, .accessToken] { fleetMarks.raise(session: session, field: field, to: version) }
    }

    /// Waits for the session's advisory lock on a connection of its own, which holds it until
    /// it is closed: a machine that dies holding it loses it with its connection. The server
    /// probes that connection every 10 seconds after 20 idle ones, and gives up on it after 3
    /// unanswered probes or 60 seconds of unacknowledged data, so a machine that loses power or
    /// its network holding the lock loses it within about a minute (the server's defaults would
    /// keep it for over two hours), well within the others' wait.
    package func lockFleetSession(_ session: String) throws(LockboxError) -> PostgresConnection {
        let connection = try PostgresConnection(database)
        try connection.execute(
            """
            SELECT set_config('tcp_keepalives_idle', '20', false), set_config('tcp_keepalives_interval', '10', false),
                set_config('tcp_keepalives_count', '3', false), set_config('tcp_user_timeout', '60000', false)
            """)
        try SyncSchema.migrate(connection, acceptingNewer: true)
        try connection.execute("SELECT pg_advisory_lock($1)", [.integer(Self.fleetLockKey(session))])
        try awaitRefreshInFlight(connection, session: session)
        return connection
    }

    /// What a record of a refresh in flight allows beyond the token requests, for storing the
    /// rotated token: a connection (10 s unless the connection string says otherwise), the
    /// statements, and a wait of some 20 s for the group's row (which a push holds while it
    /// writes). A store that waits longer still succeeds (while the lock is held, nobody else
    /// presents the token); only a holder that lost its lock as well then risks the next
    /// holder presenting the token before it is stored.
    package static let fleetStoreBound: Duration = .seconds(30)

    /// The longest a lock's new holder waits on a refresh in flight, whatever the record says
    /// (an edited one cannot stop the fleet for longer).
    static let longestRefreshInFlight: Duration = .seconds(300)

    /// Records, on the lock's connection and with the lock held, that its holder is about to
    /// present the session's stored refresh token, and may be doing so for `limit`. A holder
    /// that loses the lock meanwhile (its connection ended by a server restart or failover, a
    /// network cut longer than the probes, an administrator) does not know it, and goes on: the
    /// machine that takes the lock next waits until the record ends (the rotated token stored,
    /// the hold released, or `limit` past) before it reads the stored token, instead of
    /// presenting the one being presented, which the authorization server would take for reuse.
    /// - Throws: when the lock's connection has ended: the lock may be another's, and nothing
    ///   may be presented.
    package func markRefreshInFlight(_ connection: PostgresConnection, session: String, for limit: Duration) throws(LockboxError) {
        let milliseconds = limit.components.seconds * 1000 + limit.components.attoseconds / 1_000_000_000_000_000
        // The rotated token must be storable once the server has it: a row whose version leaves
        // no room for the two writes that follow (the refresh token's, the access token's) would
        // fail them after the token was presented, and the next machine would present the used-up
        // one (refused here instead, before anything is sent).
        let lost = LockboxError(
            .notAvailable,
            "The fleet's refresh lock was lost (its connection to the sync database ended) before the refresh token was "
                + "presented; nothing was sent. Try again.")
        let version: [[String?]]
        do {
            version = try connection.execute(
                "SELECT version FROM lockbox_fleet_sessions WHERE group_id = $1 AND session_id = $2", [.text(groupID), .text(session)])
        } catch {
            throw lost
        }
        let marks = (try? fleetMarks.load()) ?? [:]
        let seen = [FleetField.refreshToken, .accessToken].compactMap { marks[FleetMarks.markName(session: session, field: $0)] }.max() ?? 0
        if let row = version.first, max(try PostgresConnection.integer(row[0]), seen) >= Int64.max - Self.fleetVersionRoom {
            throw LockboxError(
                .decode,
                "A fleet session's version in the sync database (or this machine's record of it, \(fleetMarks.path)) is at the "
                    + "largest a version can be: the rotated token could not be stored, so the refresh token was not presented. "
                    + "The row was edited outside Lockbox. Have the administrator sign the session's row out (delete it), remove "
                    + "\(fleetMarks.path) on each machine of the fleet, and sign in again.")
        }
        do {
            try connection.execute(
                "UPDATE lockbox_fleet_sessions SET refresh_in_flight_until = \(Self.fleetClock) + $3 WHERE group_id = $1 AND session_id = $2",
                [.text(groupID), .text(session), .integer(milliseconds)])
        } catch {
            throw lost
        }
    }

    /// Ends this holder's record of a refresh in flight (the hold released): best effort, on the
    /// lock's connection, which holds the lock (a record the next holder then meets only ends
    /// at its time).
    package func endRefreshInFlight(_ connection: PostgresConnection, session: String, within limit: Duration = .seconds(5)) {
        _ = try? connection.execute(
            "UPDATE lockbox_fleet_sessions SET refresh_in_flight_until = NULL WHERE group_id = $1 AND session_id = $2 AND refresh_in_flight_until IS NOT NULL",
            [.text(groupID), .text(session)], within: limit)
    }

    /// Waits, holding the lock, while the session's record of a refresh in flight has not ended
    /// (``markRefreshInFlight``), for at most ``longestRefreshInFlight``.
    func awaitRefreshInFlight(_ connection: PostgresConnection, session: String) throws(LockboxError) {
        let start = ContinuousClock.now
        while ContinuousClock.now - start < Self.longestRefreshInFlight {
            // Clamped in SQL: an edited record of any value (the smallest bigint, say) cannot make
            // the subtraction overflow, which failed every refresh until a sign-in.
            let rows = try connection.execute(
                """
                SELECT LEAST(GREATEST(refresh_in_flight_until, now_ms), now_ms + 600000) - now_ms
                FROM lockbox_fleet_sessions, (SELECT \(Self.fleetClock) AS now_ms) AS clock WHERE group_id = $1 AND session_id = $2
                """,
                [.text(groupID), .text(session)])
            guard let row = rows.first, let left = row[0], let milliseconds = Int64(left), milliseconds > 0 else { return }
            usleep(useconds_t(min(milliseconds, 100) * 1000))
        }
    }

    /// The advisory lock's key of a session: its identifier's first 64 bits.
    static func fleetLockKey(_ session: String) -> Int64 {
        let digits = Array(session.utf8.prefix(16))
        return Int64(bitPattern: UInt64(String(decoding: digits, as: UTF8.self), radix: 16) ?? 0)
    }

    /// Takes, for the transaction, the advisory lock of every session of the group (a device
    /// removal, before it locks the group's row): a refresh in flight on any machine stores its
    /// rotated token first, under the key it holds, and is re-sealed with the rest. (Taken after
    /// the group's row, it would wait on a refresh whose store waits on that row.)
    func lockFleetSessionsForRemoval(_ connection: PostgresConnection) throws(LockboxError) {
        let sessions = try connection.execute("SELECT session_id FROM lockbox_fleet_sessions WHERE group_id = $1 ORDER BY session_id", [.text(groupID)])
        for row in sessions {
            guard let session = row[0] else { continue }
            try connection.execute("SELECT pg_advisory_xact_lock($1)", [.integer(Self.fleetLockKey(session))])
        }
    }

    /// Re-seals every fleet session under the new epoch's key (inside a device removal).
    /// Returns how many fields did not open with the current key and were cleared: no device
    /// could have used them, and a row that fails (a device of the group, or the administrator,
    /// may plant one) must not stop the removal, which would leave the removed device the key.
    @discardableResult
    func resealFleetSessions(_ connection: PostgresConnection, from old: SyncKeys, to new: SyncKeys) throws(LockboxError) -> Int {
        // Locked as they are read: a token stored meanwhile would otherwise be overwritten by
        // the older one re-sealed here.
        let rows = try connection.execute(
            "SELECT session_id, refresh_token, access_token FROM lockbox_fleet_sessions WHERE group_id = $1 FOR UPDATE", [.text(groupID)])
        var cleared = 0
        for row in rows {
            guard let session = row[0] else { continue }
            var values: [PostgresConnection.Value] = []
            for (index, field) in [FleetField.refreshToken, .accessToken].enumerated() {
                if let value = row[index + 1] {
                    // The field keeps its version: the new epoch's key is what makes the old
                    // ciphertext useless to put back.
                    let opened: (secret: SecretBytes, details: [UInt8], version: Int64, refreshVersion: Int64?)
                    do throws(LockboxError) {
                        opened = try openFleet(try PostgresConnection.bytes(value), session: session, field: field, keys: old)
                    } catch where error.code == .decode {
                        values.append(.null)
                        cleared += 1
                        continue
                    }
                    values.append(
                        .bytes(
                            sealFleet(
                                opened.secret, details: opened.details, session: session, field: field, version: max(opened.version, 1),
                                refreshVersion: opened.refreshVersion, keys: new)))
                } else {
                    values.append(.null)
                }
            }
            try connection.execute(
                "UPDATE lockbox_fleet_sessions SET refresh_token = $3, access_token = $4, version = version + 1 WHERE group_id = $1 AND session_id = $2",
                [.text(groupID), .text(session)] + values)
        }
        return cleared
    }
}
