import Foundation
import Synchronization
import LockboxAuth
import LockboxCore
import LockboxSync
import VaultCrypto

/// One OAuth session shared by the machines of a sync group (docs/SYNC.md, "A fleet's OAuth
/// session"): the refresh token and the current access token live in the group's PostgreSQL
/// database, sealed with a key only the group's machines hold, and refreshes are single-flight
/// across every machine through a PostgreSQL advisory lock.
///
/// ```swift
/// let fleet = FleetSession(group: try SyncGroup(groupID, vault: vault, database: conninfo), key: CredentialKey(configuration: configuration))
/// let manager = CredentialsManager(
///     configuration: configuration, tokenStore: fleet.tokenStore,
///     accessTokenCache: fleet.accessTokenCache, refreshLock: fleet.refreshLock)
/// ```
///
/// The manager takes the lock, then reads the shared access token and the stored refresh token
/// again, as it does with the one-machine `flock`: a machine that waited uses the token another
/// refreshed, and a rotated refresh token is seen by everyone before anyone presents the old
/// one. The lock is held by a connection of its own: a machine that dies holding it loses it
/// when the server notices the connection is gone.
public struct FleetSession: Sendable {
    /// The sync group whose database and keys hold the session.
    public let group: SyncGroup
    /// Which session: issuer, client and account.
    public let key: CredentialKey

    /// The session `key` in `group`'s database.
    public init(group: SyncGroup, key: CredentialKey) {
        self.group = group
        self.key = key
    }

    /// The refresh token's store, for `CredentialsManager(tokenStore:)`.
    public var tokenStore: FleetTokenStore { FleetTokenStore(group: group, key: key) }
    /// The shared access token, for `CredentialsManager(accessTokenCache:)`.
    public var accessTokenCache: FleetAccessTokenCache { FleetAccessTokenCache(group: group) }
    /// The fleet-wide refresh lock, for `CredentialsManager(refreshLock:)`.
    public var refreshLock: FleetRefreshLock { FleetRefreshLock(group: group) }
}

/// The refresh token in the group's database (see ``FleetSession``).
public struct FleetTokenStore: TokenStore {
    let group: SyncGroup
    let key: CredentialKey

    private var session: String { group.fleetSessionID(key.storageAccount) }

    public func refreshToken() async throws(LockboxError) -> SecretBytes? {
        let group = group
        let session = session
        return try await BlockingCall.run { () throws(LockboxError) -> SecretBytes? in
            try group.readFleet(try group.fleetConnection(), session: session, field: .refreshToken)?.secret
        }
    }

    public func saveRefreshToken(_ token: SecretBytes) async throws(LockboxError) {
        let group = group
        let session = session
        try await BlockingCall.run { () throws(LockboxError) in
            try group.writeFleet(try group.fleetConnection(), session: session, field: .refreshToken, secret: token)
        }
    }

    public func clearCredentials() async throws(LockboxError) {
        let group = group
        let session = session
        try await BlockingCall.run { () throws(LockboxError) in
            try group.clearFleet(try group.fleetConnection(), session: session)
        }
    }

    public func hasCredentials() async throws(LockboxError) -> Bool {
        try await refreshToken() != nil
    }
}

/// The current access token in the group's database, sealed, so the fleet refreshes once per
/// lifetime rather than once per machine (see ``FleetSession``).
///
/// Its expiry and freshness are kept in the database's clock, and each machine translates them
/// to its own through the database's time when it stores or reads them: a machine whose clock
/// runs ahead or behind neither hands the others an expired token as fresh nor refreshes early.
/// The layout is the one earlier Lockboxes wrote in their writer's clock, so that a fleet being
/// upgraded machine by machine still shares the token (an earlier machine compares the times
/// with its own clock, as it did; a token it stores is read as in the database's clock, which
/// is as near as its writer's was).
public struct FleetAccessTokenCache: AccessTokenCache {
    let group: SyncGroup
    /// This machine's clock (a test gives one that runs ahead).
    let now: @Sendable () -> Date

    init(group: SyncGroup, now: @escaping @Sendable () -> Date = { Date() }) {
        self.group = group
        self.now = now
    }

    public func cachedAccessToken(for key: CredentialKey) async throws(LockboxError) -> CachedAccessToken? {
        let group = group
        let session = group.fleetSessionID(key.storageAccount)
        let now = now
        return try await BlockingCall.run { () throws(LockboxError) -> CachedAccessToken? in
            guard let stored = try group.readFleetTimed(try group.fleetConnection(), session: session, field: .accessToken) else { return nil }
            let here = now()
            var decoder = FieldDecoder(stored.details)
            guard let type = try? decoder.string(), let expires = try? decoder.integer(), let fresh = try? decoder.integer(),
                let scope = try? decoder.string()
            else { throw LockboxError.syncDatabase("A fleet session in the sync database") }
            // (A fifth field, 1, marked the database's clock in one earlier build.)
            if !decoder.isAtEnd {
                guard (try? decoder.integer()) == 1, decoder.isAtEnd else { throw LockboxError.syncDatabase("A fleet session in the sync database") }
            }
            // A time of the details (the database's clock), in this machine's.
            func local(_ time: Int) -> Date { here.addingTimeInterval(Double(Int64(time) - stored.databaseTime) / 1000) }
            let credentials = Credentials(
                accessToken: stored.secret, tokenType: type, expiresAt: local(expires), scope: scope.split(separator: " ").map(String.init))
            let freshUntil = local(fresh)
            return freshUntil > here ? CachedAccessToken(credentials: credentials, freshUntil: freshUntil) : nil
        }
    }

    public func storeAccessToken(_ token: CachedAccessToken, for key: CredentialKey) async throws(LockboxError) {
        let group = group
        let session = group.fleetSessionID(key.storageAccount)
        guard let expiresAt = token.credentials.expiresAt else {
            try await removeAccessToken(for: key)
            return
        }
        let type = token.credentials.tokenType
        let scope = token.credentials.scope.joined(separator: " ")
        let freshUntil = token.freshUntil
        let secret = token.credentials.accessToken
        let now = now
        try await BlockingCall.run { () throws(LockboxError) in
            let connection = try group.fleetConnection()
            // This machine's times, moved to the database's clock.
            let databaseTime = try group.databaseTime(connection)
            let here = now()
            func shared(_ date: Date) -> Int { Int(databaseTime) + Int((date.timeIntervalSince(here) * 1000).rounded()) }
            var details = FieldEncoder()
            details.string(type)
            details.integer(shared(expiresAt))
            details.integer(shared(freshUntil))
            details.string(scope)
            try group.writeFleet(connection, session: session, field: .accessToken, secret: secret, details: details.bytes)
        }
    }

    public func removeAccessToken(for key: CredentialKey) async throws(LockboxError) {
        let group = group
        let session = group.fleetSessionID(key.storageAccount)
        try await BlockingCall.run { () throws(LockboxError) in
            try group.writeFleet(try group.fleetConnection(), session: session, field: .accessToken, secret: nil)
        }
    }
}

/// A PostgreSQL advisory lock per session, on a connection of its own (see ``FleetSession``).
public struct FleetRefreshLock: RefreshLock {
    let group: SyncGroup

    public func acquire(for key: CredentialKey) async throws(AuthError) -> any RefreshLockHold {
        let group = group
        let session = group.fleetSessionID(key.storageAccount)
        do {
            return try await BlockingCall.run { () throws(LockboxError) -> FleetLockHold in
                FleetLockHold(try group.lockFleetSession(session), group: group, session: session)
            }
        } catch {
            throw AuthError.from(error)
        }
    }
}

/// The connection that holds an advisory lock: closing it (when the hold is released, or the
/// process dies) releases the lock. It also records the refresh in flight
/// (``SyncGroup/markRefreshInFlight(_:session:for:)``), and ends that record as it is released.
final class FleetLockHold: RefreshLockHold, @unchecked Sendable {
    private let connection: PostgresConnection
    private let group: SyncGroup
    private let session: String
    private let marked = Mutex(false)

    init(_ connection: PostgresConnection, group: SyncGroup, session: String) {
        self.connection = connection
        self.group = group
        self.session = session
    }

    func presenting(within limit: Duration) async throws(AuthError) {
        // Twice the request's limit (a DPoP nonce asks for a second request), and the longest a
        // store of the rotated token takes before it gives up (``SyncGroup/fleetStoreBound``).
        let until = limit * 2 + SyncGroup.fleetStoreBound
        do {
            try await BlockingCall.run { [self] () throws(LockboxError) in
                try group.markRefreshInFlight(connection, session: session, for: until)
            }
        } catch {
            throw AuthError(.store, error.message, storeError: error)
        }
        marked.withLock { $0 = true }
    }

    func ended() async {
        guard marked.withLock({ $0 }) else { return }
        // Off the caller's thread, and given up after a few seconds if the connection stopped
        // answering (the record then ends at its time).
        await BlockingCall.run { [self] () in group.endRefreshInFlight(connection, session: session) }
        marked.withLock { $0 = false }
    }

    deinit {
        // A refresh that did not end through ``ended()`` (cancelled, say).
        guard marked.withLock({ $0 }) else { return }
        // Ended on a thread of its own, never on the caller's (a Swift concurrency thread: a
        // connection that stopped answering would hold it): the lock is released when that
        // thread closes the connection, once the record is ended (or the statement failed).
        let release = Release(group: group, session: session, connection: connection)
        Thread.detachNewThread { release.run() }
    }

    /// What a released hold still does: end its record, then close the connection.
    private final class Release: @unchecked Sendable {
        let group: SyncGroup
        let session: String
        var connection: PostgresConnection?

        init(group: SyncGroup, session: String, connection: PostgresConnection) {
            (self.group, self.session, self.connection) = (group, session, connection)
        }

        func run() {
            if let connection { group.endRefreshInFlight(connection, session: session) }
            connection = nil
        }
    }
}
