import Foundation
import Lockbox
import LockboxAuth
import LockboxTestSupport
import LockboxVault
import Synchronization
import Testing

#if canImport(FoundationNetworking)
import FoundationNetworking
#endif
#if canImport(Glibc)
import Glibc
#endif

@testable import LockboxFleet
@testable import LockboxSync

/// A strict token endpoint in the test process: each refresh token works once, and a second use
/// is reuse (`invalid_grant`). The first request can be held until ``release()``, and a hook
/// runs as a request arrives.
private final class StrictTokenEndpoint: HTTPTransport, @unchecked Sendable {
    struct State {
        var used: Set<String> = []
        var presented: [String] = []
        var reuse = 0
        var next = 1
        var holdFirst: Bool
        var released = false
        var rejected: Set<String> = []
    }
    enum Mode: Sendable { case rotating, failing, notRotating }
    let state: Mutex<State>
    let arriving: (@Sendable (String) async -> Void)?
    let mode: Mode

    init(
        holdFirst: Bool = false, rejecting rejected: Set<String> = [], mode: Mode = .rotating,
        arriving: (@Sendable (String) async -> Void)? = nil
    ) {
        state = Mutex(State(holdFirst: holdFirst, rejected: rejected))
        self.arriving = arriving
        self.mode = mode
    }

    func release() { state.withLock { $0.released = true } }
    func reject(_ token: String) { _ = state.withLock { $0.rejected.insert(token) } }
    var presented: [String] { state.withLock { $0.presented } }
    var reuse: Int { state.withLock { $0.reuse } }

    func send(_ request: URLRequest) async throws -> (Data, HTTPURLResponse) {
        let body = String(decoding: request.httpBody ?? Data(), as: UTF8.self)
        var token = ""
        for pair in body.split(separator: "&") {
            let parts = pair.split(separator: "=", maxSplits: 1).map(String.init)
            if parts.count == 2, parts[0] == "refresh_token" { token = parts[1].removingPercentEncoding ?? parts[1] }
        }
        await arriving?(token)
        let (hold, refused, number) = state.withLock { state -> (Bool, Bool, Int) in
            state.presented.append(token)
            let reused = mode == .rotating && !state.used.insert(token).inserted
            if reused { state.reuse += 1 }
            let hold = state.holdFirst
            state.holdFirst = false
            state.next += 1
            return (hold, reused || state.rejected.contains(token), state.next - 1)
        }
        if hold {
            while !state.withLock({ $0.released }) { try await Task.sleep(for: .milliseconds(20)) }
        }
        let url = request.url!
        let headers = ["Content-Type": "application/json"]
        if mode == .failing {
            return (Data("{}".utf8), HTTPURLResponse(url: url, statusCode: 503, httpVersion: "HTTP/1.1", headerFields: headers)!)
        }
        if mode == .notRotating {
            let json = #"{"access_token":"at-\#(number)","token_type":"Bearer","expires_in":3600}"#
            return (Data(json.utf8), HTTPURLResponse(url: url, statusCode: 200, httpVersion: "HTTP/1.1", headerFields: headers)!)
        }
        if refused {
            return (Data(#"{"error":"invalid_grant"}"#.utf8), HTTPURLResponse(url: url, statusCode: 400, httpVersion: "HTTP/1.1", headerFields: headers)!)
        }
        let json = #"{"access_token":"at-\#(number)","token_type":"Bearer","expires_in":3600,"refresh_token":"rt-\#(number)"}"#
        return (Data(json.utf8), HTTPURLResponse(url: url, statusCode: 200, httpVersion: "HTTP/1.1", headerFields: headers)!)
    }
}

/// The fleet's store, whose saves fail while `failing` (the database unreachable for a moment).
private final class FailingSaves: TokenStore, @unchecked Sendable {
    let inner: FleetTokenStore
    let failing = Mutex(false)
    init(_ inner: FleetTokenStore) { self.inner = inner }
    func refreshToken() async throws(LockboxError) -> SecretBytes? { try await inner.refreshToken() }
    func saveRefreshToken(_ token: SecretBytes) async throws(LockboxError) {
        if failing.withLock({ $0 }) { throw LockboxError(.io, "The sync database cannot be reached (test).") }
        try await inner.saveRefreshToken(token)
    }
    func clearCredentials() async throws(LockboxError) { try await inner.clearCredentials() }
    func hasCredentials() async throws(LockboxError) -> Bool { try await inner.hasCredentials() }
}

private func outcomeAsync<T>(_ body: () async throws -> T) async -> Result<T, any Error> {
    do { return .success(try await body()) } catch { return .failure(error) }
}

/// A manager of `fleet`'s session that reaches the token endpoint through `endpoint`.
private func fleetManager(_ fleet: FleetSession, _ endpoint: any HTTPTransport, _ configuration: ClientConfiguration = configuration) -> CredentialsManager {
    CredentialsManager(
        configuration: configuration, tokenStore: fleet.tokenStore, transport: endpoint, accessTokenCache: fleet.accessTokenCache,
        refreshLock: fleet.refreshLock)
}

/// Waits until `condition` holds, for at most 10 s.
private func waitFor(_ condition: () -> Bool) async throws {
    var waited = 0
    while !condition() && waited < 500 {
        try await Task.sleep(for: .milliseconds(20))
        waited += 1
    }
}

private func opened(_ value: (secret: SecretBytes, details: [UInt8])?) -> String? {
    value.map { $0.secret.withUnsafeBytes { String(decoding: $0, as: UTF8.self) } }
}

private let configuration = ClientConfiguration(
    issuer: URL(string: "https://auth.example")!, clientID: "fleet-fencing", tokenEndpoint: URL(string: "https://auth.example/token")!)

/// Ends the connections that hold advisory locks (a server restart or failover, a network cut
/// longer than the probes, an administrator): their holders are not told.
private func endLockConnections() throws -> Int {
    try PostgresConnection(try testDatabase()).execute(
        "SELECT pg_terminate_backend(pid) FROM pg_locks WHERE locktype = 'advisory' AND granted AND pid <> pg_backend_pid()"
    ).count
}

/// The session's record of a refresh in flight, in milliseconds from now (nil: none).
private func inFlight(_ group: SyncGroup, _ session: String) throws -> Int64? {
    let rows = try PostgresConnection(try testDatabase()).execute(
        "SELECT refresh_in_flight_until - \(SyncGroup.fleetClock) FROM lockbox_fleet_sessions WHERE group_id = $1 AND session_id = $2",
        [.text(group.groupID), .text(session)])
    return try rows.first?[0].map { text throws in try #require(Int64(text)) }
}

extension SyncTests {
    @Suite("Fleet: a lock lost unseen, versions the database moves, tokens rejected after a newer one was stored", .serialized)
    struct FleetFencing {
        @Test("A holder whose lock's connection ends while it presents the refresh token: the next holder waits for the rotated token instead of presenting the same one (no reuse, no sign-out)")
        func lockLostMidRefreshIsWaitedFor() async throws {
            let (groups, machines) = try threeMachines()
            defer { withExtendedLifetime(machines) {} }
            let endpoint = StrictTokenEndpoint(holdFirst: true)
            let fleets = groups.map { FleetSession(group: $0, key: CredentialKey(configuration: configuration)) }
            try await fleets[0].tokenStore.saveRefreshToken(SecretBytes(utf8: "rt-0"))
            let managers = fleets.prefix(2).map { fleetManager($0, endpoint, configuration) }
            let first = Task { try await managers[0].credentials() }
            try await waitFor { !endpoint.presented.isEmpty }
            #expect(endpoint.presented == ["rt-0"])
            #expect(try endLockConnections() == 1)
            let second = Task { try await managers[1].credentials() }
            // The second machine holds the lock now, and waits: it presents nothing while the
            // first one's request is out.
            try await Task.sleep(for: .milliseconds(1500))
            #expect(endpoint.presented == ["rt-0"])
            endpoint.release()
            let firstResult = await first.result
            let secondResult = await second.result
            #expect(endpoint.reuse == 0, "presented: \(endpoint.presented)")
            let token = try #require(try? firstResult.get())
            #expect(token.accessToken == SecretBytes(utf8: "at-1"))
            #expect((try? secondResult.get()) != nil, "the second machine: \(secondResult)")
            #expect(try opened(groups[2].readFleet(try groups[2].fleetConnection(), session: fleets[0].group.fleetSessionID(fleets[0].key.storageAccount), field: .refreshToken)) != nil)
        }

        @Test("A hold whose lock's connection has ended presents nothing: the refresh fails with an error that says so, and the stored token is kept")
        func lockLostBeforePresentingPresentsNothing() async throws {
            let (groups, machines) = try threeMachines()
            defer { withExtendedLifetime(machines) {} }
            let fleet = FleetSession(group: groups[0], key: CredentialKey(configuration: configuration))
            try await fleet.tokenStore.saveRefreshToken(SecretBytes(utf8: "rt-0"))
            let hold = try await fleet.refreshLock.acquire(for: fleet.key)
            #expect(try endLockConnections() == 1)
            let refused = await #expect(throws: AuthError.self) { try await hold.presenting(within: .seconds(30)) }
            #expect(refused?.message.contains("lock was lost") == true, "\(refused?.message ?? "")")
            #expect(refused?.message.contains("rt-0") == false)
            withExtendedLifetime(hold) {}
            #expect(try await fleet.tokenStore.refreshToken() == SecretBytes(utf8: "rt-0"))
        }

        @Test("A record of a refresh in flight left by a holder that stopped: the next holder waits until its time, then goes on; a hold released ends its own record")
        func recordOfAStoppedHolderEndsAtItsTime() async throws {
            let (groups, machines) = try threeMachines()
            defer { withExtendedLifetime(machines) {} }
            let fleet = FleetSession(group: groups[0], key: CredentialKey(configuration: configuration))
            let session = groups[0].fleetSessionID(fleet.key.storageAccount)
            try await fleet.tokenStore.saveRefreshToken(SecretBytes(utf8: "rt-0"))
            // A released hold ends its record: the next one does not wait.
            var hold: (any RefreshLockHold)? = try await fleet.refreshLock.acquire(for: fleet.key)
            try await hold?.presenting(within: .seconds(30))
            #expect(try inFlight(groups[0], session).map { $0 > 60_000 } == true)
            hold = nil
            // (Ended by a thread of the hold's own, just after its release.)
            var ended = false
            for _ in 0..<100 where !ended {
                ended = try inFlight(groups[0], session) == nil
                if !ended { try await Task.sleep(for: .milliseconds(20)) }
            }
            #expect(ended)
            // A holder that stopped with its record set (its connection gone with it).
            let stopped = try await fleet.refreshLock.acquire(for: fleet.key)
            try PostgresConnection(try testDatabase()).execute(
                "UPDATE lockbox_fleet_sessions SET refresh_in_flight_until = \(SyncGroup.fleetClock) + 1500 WHERE group_id = $1 AND session_id = $2",
                [.text(groups[0].groupID), .text(session)])
            #expect(try endLockConnections() == 1)
            withExtendedLifetime(stopped) {}
            let other = FleetSession(group: groups[1], key: fleet.key)
            let start = ContinuousClock.now
            let next = try await other.refreshLock.acquire(for: other.key)
            let waited = ContinuousClock.now - start
            #expect(waited >= .milliseconds(1200), "waited \(waited)")
            #expect(waited < .seconds(10), "waited \(waited)")
            withExtendedLifetime(next) {}
        }

        @Test("A refresh token rejected after another holder (or a sign-in) stored a newer one: the store keeps the newer one, which is tried instead; no sign-out")
        func rejectedAfterNewerStoredIsNotErased() async throws {
            let (groups, machines) = try threeMachines()
            defer { withExtendedLifetime(machines) {} }
            let fleet = FleetSession(group: groups[0], key: CredentialKey(configuration: configuration))
            let other = FleetSession(group: groups[1], key: fleet.key)
            try await fleet.tokenStore.saveRefreshToken(SecretBytes(utf8: "rt-old"))
            // While rt-old is being presented, another machine stores rt-new (signed in again).
            let endpoint = StrictTokenEndpoint(rejecting: ["rt-old"]) { token in
                if token == "rt-old" { try? await other.tokenStore.saveRefreshToken(SecretBytes(utf8: "rt-new")) }
            }
            let manager = fleetManager(fleet, endpoint)
            let credentials = try await manager.credentials()
            #expect(endpoint.presented == ["rt-old", "rt-new"])
            #expect(credentials.accessToken == SecretBytes(utf8: "at-2"))
            #expect(try await fleet.tokenStore.refreshToken() == SecretBytes(utf8: "rt-2"))
            // The rejected token, still stored, is cleared as before.
            let rejecting = StrictTokenEndpoint(rejecting: ["rt-2"])
            let next = CredentialsManager(
                configuration: configuration, tokenStore: other.tokenStore, transport: rejecting, refreshLock: other.refreshLock)
            let signedOut = await #expect(throws: AuthError.self) { try await next.credentials() }
            #expect(signedOut?.code == .signedOut)
            #expect(try await other.tokenStore.refreshToken() == nil)
        }

        @Test("A version column the database moves up, then down: the next token is still sealed above every version this machine saw, and the rotated-out one put back is refused")
        func versionColumnRewoundCannotServeARotatedOutToken() throws {
            let (groups, machines) = try threeMachines()
            defer { withExtendedLifetime(machines) {} }
            let database = try PostgresConnection(try testDatabase())
            let group = groups[0].groupID
            let session = groups[0].fleetSessionID("rewound")
            func sealed() throws -> String? {
                try database.execute(
                    "SELECT refresh_token FROM lockbox_fleet_sessions WHERE group_id = $1 AND session_id = $2", [.text(group), .text(session)]
                ).first?[0] ?? nil
            }
            func setVersion(_ version: Int64) throws {
                try database.execute(
                    "UPDATE lockbox_fleet_sessions SET version = $3 WHERE group_id = $1 AND session_id = $2",
                    [.text(group), .text(session), .integer(version)])
            }
            func read(_ index: Int) -> Result<String?, any Error> {
                outcome { try opened(groups[index].readFleet(try groups[index].fleetConnection(), session: session, field: .refreshToken)) }
            }
            try groups[0].writeFleet(try groups[0].fleetConnection(), session: session, field: .refreshToken, secret: SecretBytes(utf8: "refresh-1"))
            #expect((try? read(2).get()) == "refresh-1")
            try setVersion(4_000_000_000_000_000)
            try groups[0].writeFleet(try groups[0].fleetConnection(), session: session, field: .refreshToken, secret: SecretBytes(utf8: "refresh-2"))
            #expect((try? read(2).get()) == "refresh-2")
            let second = try sealed()
            try setVersion(0)
            try groups[0].writeFleet(try groups[0].fleetConnection(), session: session, field: .refreshToken, secret: SecretBytes(utf8: "refresh-3"))
            #expect((try? read(2).get()) == "refresh-3")
            try database.execute(
                "UPDATE lockbox_fleet_sessions SET refresh_token = $3::bytea WHERE group_id = $1 AND session_id = $2",
                [.text(group), .text(session), second.map { .text($0) } ?? .null])
            for index in [0, 2] {
                let served = read(index)
                #expect((try? served.get()) == nil, "machine \(index) served \(served)")
            }
        }

        @Test("An access token this machine removed, put back by the database, is refused here too")
        func removedAccessTokenPutBackIsRefusedToItsRemover() throws {
            let (groups, machines) = try threeMachines()
            defer { withExtendedLifetime(machines) {} }
            let database = try PostgresConnection(try testDatabase())
            let group = groups[0].groupID
            let session = groups[0].fleetSessionID("removed")
            try groups[0].writeFleet(try groups[0].fleetConnection(), session: session, field: .refreshToken, secret: SecretBytes(utf8: "refresh-1"))
            try groups[0].writeFleet(try groups[0].fleetConnection(), session: session, field: .accessToken, secret: SecretBytes(utf8: "access-removed"))
            let sealed: String? = try database.execute(
                "SELECT access_token FROM lockbox_fleet_sessions WHERE group_id = $1 AND session_id = $2", [.text(group), .text(session)]
            ).first?[0] ?? nil
            try groups[0].writeFleet(try groups[0].fleetConnection(), session: session, field: .accessToken, secret: nil)
            try database.execute(
                "UPDATE lockbox_fleet_sessions SET access_token = $3::bytea WHERE group_id = $1 AND session_id = $2",
                [.text(group), .text(session), sealed.map { .text($0) } ?? .null])
            let read = outcome { try opened(groups[0].readFleet(try groups[0].fleetConnection(), session: session, field: .accessToken)) }
            #expect((try? read.get()) == nil, "served \(read)")
            #expect(((try? read.get()) ?? nil) != "access-removed")
        }

        @Test("A token kept in memory only (its store failed), then rejected: a newer sign-in stored meanwhile by another machine is kept")
        func memoryOnlyRejectionKeepsANewerSignIn() async throws {
            let (groups, machines) = try threeMachines()
            defer { withExtendedLifetime(machines) {} }
            let fleets = groups.map { FleetSession(group: $0, key: CredentialKey(configuration: configuration)) }
            try await fleets[0].tokenStore.saveRefreshToken(SecretBytes(utf8: "rt-0"))
            let endpoint = StrictTokenEndpoint()
            let store = FailingSaves(fleets[0].tokenStore)
            store.failing.withLock { $0 = true }
            let manager = CredentialsManager(
                configuration: configuration, tokenStore: store, transport: endpoint, accessTokenCache: fleets[0].accessTokenCache,
                refreshLock: fleets[0].refreshLock)
            _ = try await manager.credentials()
            #expect(await manager.isPersistentSignInDisabled)
            store.failing.withLock { $0 = false }
            endpoint.reject("rt-1")
            try await fleets[1].tokenStore.saveRefreshToken(SecretBytes(utf8: "rt-signin"))
            // The memory-only rt-1 is rejected; the store now holds another than the one it
            // replaced: that one is tried, and kept.
            let credentials = try await manager.credentials(minTTL: .seconds(7200))
            #expect(endpoint.presented == ["rt-0", "rt-1", "rt-signin"])
            #expect(credentials.accessToken == SecretBytes(utf8: "at-3"))
            #expect(try await fleets[2].tokenStore.refreshToken() == SecretBytes(utf8: "rt-3"))
            // A memory-only token rejected while the store still holds the one it replaced:
            // that used-up one is cleared, as before.
            store.failing.withLock { $0 = true }
            _ = try await manager.credentials(minTTL: .seconds(7200))
            store.failing.withLock { $0 = false }
            endpoint.reject("rt-4")
            let signedOut = await #expect(throws: AuthError.self) { try await manager.credentials(minTTL: .seconds(7200)) }
            #expect(signedOut?.code == .signedOut)
            #expect(try await fleets[2].tokenStore.refreshToken() == nil)
        }

        @Test("A holder whose lock was lost and whose store of the rotated token waits for the group row (a push holds it): the next holder still waits for the rotated token")
        func slowStoreIsWaitedFor() async throws {
            let (groups, machines) = try threeMachines()
            defer { withExtendedLifetime(machines) {} }
            let quick = ClientConfiguration(
                issuer: URL(string: "https://auth.example")!, clientID: "fleet-fencing-quick", tokenEndpoint: URL(string: "https://auth.example/token")!,
                requestLimits: RequestLimits(deadline: .seconds(1)))
            let fleets = groups.map { FleetSession(group: $0, key: CredentialKey(configuration: quick)) }
            try await fleets[0].tokenStore.saveRefreshToken(SecretBytes(utf8: "rt-0"))
            final class Holder: @unchecked Sendable { var push: PostgresConnection? }
            let holder = Holder()
            let ready = Mutex(false)
            let groupID = groups[0].groupID
            let endpoint = StrictTokenEndpoint { token in
                guard token == "rt-0", !ready.withLock({ $0 }) else { return }
                // A push holds the group row, and the first holder's lock's connection ends.
                let push = try! PostgresConnection(try! testDatabase())
                try! push.execute("BEGIN")
                try! push.execute("SELECT 1 FROM lockbox_sync_groups WHERE group_id = $1 FOR UPDATE", [.text(groupID)])
                _ = try? endLockConnections()
                holder.push = push
                ready.withLock { $0 = true }
            }
            let managers = fleets.prefix(2).map { fleetManager($0, endpoint, quick) }
            let first = Task { try await managers[0].credentials() }
            try await waitFor { ready.withLock({ $0 }) }
            // The push commits 8 s later: past 2 x the deadline + 5 s, within the store's wait.
            let push = Task.detached {
                try await Task.sleep(for: .seconds(8))
                try holder.push?.execute("COMMIT")
            }
            let second = Task { try await managers[1].credentials() }
            let secondResult = await second.result
            try await push.value
            let firstResult = await first.result
            #expect(endpoint.reuse == 0, "presented: \(endpoint.presented); first: \(firstResult); second: \(secondResult)")
            #expect((try? firstResult.get()) != nil && (try? secondResult.get()) != nil)
        }

        @Test("A database one migration ahead (a machine upgraded past this one): the fleet session goes on; a sync refuses it")
        func fleetGoesOnWithANewerSchema() async throws {
            let (groups, machines) = try threeMachines()
            defer { withExtendedLifetime(machines) {} }
            let fleet = FleetSession(group: groups[0], key: CredentialKey(configuration: configuration))
            try await fleet.tokenStore.saveRefreshToken(SecretBytes(utf8: "rt-0"))
            try PostgresConnection(try testDatabase()).execute("INSERT INTO lockbox_sync_schema (version) VALUES (\(SyncSchema.currentVersion + 1))")
            defer {
                _ = try? PostgresConnection(try testDatabase()).execute("DELETE FROM lockbox_sync_schema WHERE version > \(SyncSchema.currentVersion)")
            }
            let read = await outcomeAsync { try await fleet.tokenStore.refreshToken() }
            #expect((try? read.get()) == SecretBytes(utf8: "rt-0"), "\(read)")
            let lock = await outcomeAsync { try await fleet.refreshLock.acquire(for: fleet.key) }
            #expect((try? lock.get()) != nil, "\(lock)")
            let sync = #expect(throws: LockboxError.self) { try groups[0].sync() }
            #expect(sync?.message.contains("newer than this Lockbox knows") == true)
        }

        @Test("A hold's release does not block the manager: a caller with a token in memory is served while the lock's connection stops answering")
        func holdReleaseDoesNotBlockTheManager() async throws {
            let (groups, machines) = try threeMachines()
            defer { withExtendedLifetime(machines) {} }
            let fleet = FleetSession(group: groups[0], key: CredentialKey(configuration: configuration))
            try await fleet.tokenStore.saveRefreshToken(SecretBytes(utf8: "rt-0"))
            let stopped = Mutex<Int32?>(nil)
            // As the token request goes out, the lock's connection stops answering.
            let endpoint = StrictTokenEndpoint { _ in
                guard let rows = try? PostgresConnection(try testDatabase()).execute(
                    "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted AND pid <> pg_backend_pid()"),
                    let text = rows.first?[0], let pid = Int32(text)
                else { return }
                kill(pid, SIGSTOP)
                stopped.withLock { $0 = pid }
            }
            let manager = fleetManager(fleet, endpoint)
            let first = Task { try await manager.credentials() }
            try await waitFor { stopped.withLock({ $0 }) != nil }
            let pid = try #require(stopped.withLock { $0 })
            defer { kill(pid, SIGCONT) }
            // The rotated token is stored (on a connection of its own).
            var stored: SecretBytes?
            for _ in 0..<50 {
                stored = try await fleet.tokenStore.refreshToken()
                if stored == SecretBytes(utf8: "rt-1") { break }
                try await Task.sleep(for: .milliseconds(100))
            }
            #expect(stored == SecretBytes(utf8: "rt-1"))
            try await Task.sleep(for: .milliseconds(300))
            let start = ContinuousClock.now
            let probe = Task { () -> Duration in
                _ = try await manager.credentials()
                return ContinuousClock.now - start
            }
            try await Task.sleep(for: .seconds(4))
            kill(pid, SIGCONT)
            let took = try await probe.value
            _ = try await first.value
            #expect(took < .seconds(2), "a caller with a token in memory waited \(took) on the hold's release")
        }

        @Test("A refresh that fails, or that the server does not rotate, ends its record before the manager answers: a process that exits at once leaves no wait behind")
        func recordEndsWithTheRefresh() async throws {
            let (groups, machines) = try threeMachines()
            defer { withExtendedLifetime(machines) {} }
            for mode in [StrictTokenEndpoint.Mode.failing, .notRotating, .rotating] {
                let key = CredentialKey(configuration: configuration)
                let fleet = FleetSession(group: groups[0], key: key)
                let session = groups[0].fleetSessionID(key.storageAccount)
                try await fleet.tokenStore.saveRefreshToken(SecretBytes(utf8: "rt-0"))
                let manager = fleetManager(fleet, StrictTokenEndpoint(mode: mode))
                _ = try? await manager.credentials(minTTL: .seconds(7200))
                #expect(try inFlight(groups[0], session) == nil, "\(mode): a record outlives the refresh")
                let start = ContinuousClock.now
                let next = try await FleetSession(group: groups[1], key: key).refreshLock.acquire(for: key)
                #expect(ContinuousClock.now - start < .seconds(3), "\(mode)")
                withExtendedLifetime(next) {}
                try await fleet.tokenStore.clearCredentials()
            }
        }

        @Test("A healthy fleet whose group row a sync holds for 12 s: the rotated token's store waits for it, and the next machine uses it (no reuse)")
        func storeWaitsForTheGroupRow() async throws {
            let (groups, machines) = try threeMachines()
            defer { withExtendedLifetime(machines) {} }
            let fleets = groups.map { FleetSession(group: $0, key: CredentialKey(configuration: configuration)) }
            try await fleets[0].tokenStore.saveRefreshToken(SecretBytes(utf8: "rt-0"))
            let endpoint = StrictTokenEndpoint()
            let managers = fleets.prefix(2).map { fleetManager($0, endpoint, configuration) }
            let push = try PostgresConnection(try testDatabase())
            try push.execute("BEGIN")
            try push.execute("SELECT 1 FROM lockbox_sync_groups WHERE group_id = $1 FOR UPDATE", [.text(groups[0].groupID)])
            final class Holder: @unchecked Sendable { let push: PostgresConnection; init(_ push: PostgresConnection) { self.push = push } }
            let holder = Holder(push)
            let commit = Task.detached {
                try await Task.sleep(for: .seconds(12))
                try holder.push.execute("COMMIT")
            }
            _ = try await managers[0].credentials()
            #expect(await !managers[0].isPersistentSignInDisabled)
            try await commit.value
            _ = try await managers[1].credentials(minTTL: .seconds(7200))
            #expect(endpoint.reuse == 0, "presented \(endpoint.presented)")
            #expect(endpoint.presented == ["rt-0", "rt-1"])
        }
    }
}
