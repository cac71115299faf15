import Foundation
import Lockbox
import LockboxTestSupport
import LockboxVault
import Synchronization
import Testing

@testable import LockboxFleet
@testable import LockboxSync
import LockboxAuth

#if canImport(Glibc)
import Glibc
#endif

private func plain(_ opened: (secret: SecretBytes, details: [UInt8])?) -> String? {
    opened.map { $0.secret.withUnsafeBytes { String(decoding: $0, as: UTF8.self) } }
}

/// Machine 0 writes "refresh-1", then "refresh-2", which machine 1 reads; then the
/// administrator puts the sealed "refresh-1" back in the database.
private func putBackAnOlderToken(_ groups: [SyncGroup], session: String) throws {
    let database = try PostgresConnection(try testDatabase())
    func sealed() throws -> String? {
        try database.execute(
            "SELECT refresh_token FROM lockbox_fleet_sessions WHERE group_id = $1 AND session_id = $2", [.text(groups[0].groupID), .text(session)]
        ).first?[0] ?? nil
    }
    try groups[0].writeFleet(try groups[0].fleetConnection(), session: session, field: .refreshToken, secret: SecretBytes(utf8: "refresh-1"))
    let first = try sealed()
    try groups[0].writeFleet(try groups[0].fleetConnection(), session: session, field: .refreshToken, secret: SecretBytes(utf8: "refresh-2"))
    #expect(try plain(groups[1].readFleet(try groups[1].fleetConnection(), session: session, field: .refreshToken)) == "refresh-2")
    try database.execute(
        "UPDATE lockbox_fleet_sessions SET refresh_token = $3::bytea WHERE group_id = $1 AND session_id = $2",
        [.text(groups[0].groupID), .text(session), first.map { .text($0) } ?? .null])
}

extension SyncTests {
    /// The fleet's session rows and lock against what the administrator, a device removal and an
    /// operator's mistakes do to them.
    @Suite("Fleet: session versions, marks, the lock and device removal")
    struct FleetRobustness {
        @Test("A session row deleted in the database and written again (a new sign-in) is newer than anything the machines saw, not refused as older")
        func deletedRowThenSignInIsNewer() throws {
            let (groups, machines) = try threeMachines()
            defer { withExtendedLifetime(machines) {} }
            let session = groups[0].fleetSessionID("account-deleted")
            for round in 1...3 {
                try groups[0].writeFleet(try groups[0].fleetConnection(), session: session, field: .refreshToken, secret: SecretBytes(utf8: "refresh-\(round)"))
                #expect(try plain(groups[1].readFleet(try groups[1].fleetConnection(), session: session, field: .refreshToken)) == "refresh-\(round)")
            }
            try PostgresConnection(try testDatabase()).execute(
                "DELETE FROM lockbox_fleet_sessions WHERE group_id = $1 AND session_id = $2", [.text(groups[0].groupID), .text(session)])
            #expect(try groups[1].readFleet(try groups[1].fleetConnection(), session: session, field: .refreshToken) == nil)
            try groups[0].writeFleet(try groups[0].fleetConnection(), session: session, field: .refreshToken, secret: SecretBytes(utf8: "refresh-after-sign-in"))
            for index in 0..<2 {
                let read = outcome { try plain(groups[index].readFleet(try groups[index].fleetConnection(), session: session, field: .refreshToken)) }
                #expect((try? read.get()) == "refresh-after-sign-in", "machine \(index) after a new sign-in: \(read)")
            }
        }

        @Test("A sign-out is not undone by the database putting the last sealed tokens back, on the machine that signed out nor on one that saw it; a later sign-in is read")
        func signOutNotUndoneByPutBack() throws {
            let (groups, machines) = try threeMachines()
            defer { withExtendedLifetime(machines) {} }
            let database = try PostgresConnection(try testDatabase())
            let session = groups[0].fleetSessionID("account-signed-out")
            try groups[0].writeFleet(try groups[0].fleetConnection(), session: session, field: .refreshToken, secret: SecretBytes(utf8: "refresh-last"))
            try groups[0].writeFleet(try groups[0].fleetConnection(), session: session, field: .accessToken, secret: SecretBytes(utf8: "access-last"))
            #expect(try plain(groups[1].readFleet(try groups[1].fleetConnection(), session: session, field: .refreshToken)) == "refresh-last")
            let sealed = try database.execute(
                "SELECT refresh_token, access_token FROM lockbox_fleet_sessions WHERE group_id = $1 AND session_id = $2",
                [.text(groups[0].groupID), .text(session)]
            ).first
            try groups[0].clearFleet(try groups[0].fleetConnection(), session: session)
            #expect(try groups[1].readFleet(try groups[1].fleetConnection(), session: session, field: .refreshToken) == nil)
            #expect(try groups[1].readFleet(try groups[1].fleetConnection(), session: session, field: .accessToken) == nil)
            try database.execute(
                "UPDATE lockbox_fleet_sessions SET refresh_token = $3::bytea, access_token = $4::bytea WHERE group_id = $1 AND session_id = $2",
                [.text(groups[0].groupID), .text(session), (sealed?[0] ?? nil).map { .text($0) } ?? .null, (sealed?[1] ?? nil).map { .text($0) } ?? .null])
            for index in 0..<2 {
                for field in [SyncGroup.FleetField.refreshToken, .accessToken] {
                    let read = outcome { try plain(groups[index].readFleet(try groups[index].fleetConnection(), session: session, field: field)) }
                    guard case .failure(let error) = read else {
                        Issue.record("machine \(index) serves the signed-out session's \(field.rawValue): \(read)")
                        continue
                    }
                    #expect((error as? LockboxError)?.code == .decode)
                }
            }
            try groups[0].writeFleet(try groups[0].fleetConnection(), session: session, field: .refreshToken, secret: SecretBytes(utf8: "refresh-new"))
            for index in 0..<2 {
                #expect(try plain(groups[index].readFleet(try groups[index].fleetConnection(), session: session, field: .refreshToken)) == "refresh-new")
            }
        }

        @Test("A replayed token's error names the way out (the marks file of each machine), and the token is not served")
        func replayErrorNamesTheWayOut() throws {
            let (groups, machines) = try threeMachines()
            defer { withExtendedLifetime(machines) {} }
            let session = groups[0].fleetSessionID("account-replay")
            try putBackAnOlderToken(groups, session: session)
            let refused = #expect(throws: LockboxError.self) { _ = try groups[1].readFleet(try groups[1].fleetConnection(), session: session, field: .refreshToken) }
            #expect(refused?.code == .decode)
            #expect(refused?.message.contains(groups[1].fleetMarks.path) == true, "\(String(describing: refused?.message))")
        }

        @Test("A marks file this user cannot read is an error naming it, not taken for no marks (which would serve a rotated-out token)")
        func unreadableMarksAreAnError() throws {
            let (groups, machines) = try threeMachines()
            defer { withExtendedLifetime(machines) {} }
            let session = groups[0].fleetSessionID("account-marks")
            try putBackAnOlderToken(groups, session: session)
            // The marks file made unreadable to the reader: as another user (the tests run as
            // root, which reads any file) on one thread, through setfsuid.
            let path = groups[1].fleetMarks.path
            #expect(FileManager.default.fileExists(atPath: path))
            let reported = Mutex("not run")
            let reader = groups[1]
            let done = DispatchSemaphore(value: 0)
            Thread.detachNewThread {
                defer { done.signal() }
                guard let connection = try? reader.fleetConnection() else { return reported.withLock { $0 = "no connection" } }
                typealias SetFSUID = @convention(c) (UInt32) -> Int32
                let setfsuid = unsafeBitCast(dlsym(dlopen(nil, RTLD_NOW), "setfsuid"), to: SetFSUID.self)
                let unprivileged = getuid() == 0
                if unprivileged { _ = setfsuid(65534) } else { chmod(path, 0) }
                let read = outcome { try plain(reader.readFleet(connection, session: session, field: .refreshToken)) }
                if unprivileged { _ = setfsuid(0) } else { chmod(path, 0o600) }
                reported.withLock { $0 = "\(read)" }
            }
            done.wait()
            let seen = reported.withLock { $0 }
            #expect(!seen.contains("refresh-1"), "an unreadable marks file was taken for no marks, and the rotated-out token was served: \(seen)")
            #expect(seen.contains("Cannot read") && seen.contains(path), "\(seen)")
        }

        @Test("The lock's connection asks the server to notice a dead holder within about a minute, not the two hours of its defaults")
        func deadHolderLosesTheLockSoon() throws {
            let (groups, machines) = try threeMachines()
            defer { withExtendedLifetime(machines) {} }
            let hold = try groups[0].lockFleetSession(groups[0].fleetSessionID("account-lock"))
            func setting(_ name: String) throws -> Int {
                let value = try hold.execute("SELECT current_setting($1)", [.text(name)]).first?.first ?? nil
                return Int(value ?? "") ?? -1
            }
            let idle = try setting("tcp_keepalives_idle")
            let interval = try setting("tcp_keepalives_interval")
            let count = try setting("tcp_keepalives_count")
            let userTimeout = try setting("tcp_user_timeout")
            #expect(idle > 0 && idle + interval * count <= 120, "idle \(idle), interval \(interval), count \(count)")
            #expect(userTimeout > 0 && userTimeout <= 120_000, "tcp_user_timeout \(userTimeout) ms")
        }

        @Test("A read that meets a device removal (the row re-sealed under the new epoch after this connection caught up) catches up and reads it, not reported as tampered with")
        func readDuringRemovalCatchesUp() throws {
            let (groups, machines) = try threeMachines()
            defer { withExtendedLifetime(machines) {} }
            let session = groups[0].fleetSessionID("account-removal")
            try groups[0].writeFleet(try groups[0].fleetConnection(), session: session, field: .refreshToken, secret: SecretBytes(utf8: "refresh-1"))
            let connection = try groups[1].fleetConnection()
            try groups[0].removeDevice(groups[2].deviceID)
            let read = outcome { try plain(groups[1].readFleet(connection, session: session, field: .refreshToken)) }
            #expect((try? read.get()) == "refresh-1", "\(read)")
        }

        @Test("An access token stored by a machine whose clock runs a minute ahead is fresh, on a machine with the right clock, only for its own lifetime: the times travel in the database's clock")
        func skewedWriterClock() async throws {
            let (groups, machines) = try threeMachines()
            defer { withExtendedLifetime(machines) {} }
            let key = CredentialKey(issuer: "https://issuer.example", clientID: "fleet-clock")
            let ahead = FleetAccessTokenCache(group: groups[1], now: { Date().addingTimeInterval(60) })
            // Lifetimes long enough that a slow machine's reads do not eat them: a token in the
            // writer's clock would read as fresh for 80 s here, or as expired.
            let aheadNow = Date().addingTimeInterval(60)
            let credentials = Credentials(
                accessToken: SecretBytes(utf8: "access token"), tokenType: "Bearer", expiresAt: aheadNow.addingTimeInterval(24), scope: ["api"])
            try await ahead.storeAccessToken(CachedAccessToken(credentials: credentials, freshUntil: aheadNow.addingTimeInterval(20)), for: key)
            let read = try #require(try await FleetAccessTokenCache(group: groups[2]).cachedAccessToken(for: key))
            let fresh = read.freshUntil.timeIntervalSinceNow
            #expect(fresh > 10 && fresh < 22, "fresh for \(fresh) s on the machine with the right clock")
            let expires = try #require(read.credentials.expiresAt).timeIntervalSinceNow
            #expect(expires > 14 && expires < 26, "expires in \(expires) s")
            // And read back by the machine that runs ahead, in its own clock.
            let own = try #require(try await ahead.cachedAccessToken(for: key))
            #expect(abs(own.freshUntil.timeIntervalSince(aheadNow.addingTimeInterval(20))) < 5)
            // Once its lifetime is over by the database's clock, no machine takes it for fresh: a
            // token fresh for one second, read two seconds later (a slow read only adds to that).
            let shortNow = Date().addingTimeInterval(60)
            let short = Credentials(
                accessToken: SecretBytes(utf8: "short token"), tokenType: "Bearer", expiresAt: shortNow.addingTimeInterval(1.5), scope: ["api"])
            try await ahead.storeAccessToken(CachedAccessToken(credentials: short, freshUntil: shortNow.addingTimeInterval(1)), for: key)
            try await Task.sleep(for: .seconds(2))
            #expect(try await FleetAccessTokenCache(group: groups[2]).cachedAccessToken(for: key) == nil)
        }

        @Test("Removing a device from the command line says when the group holds signed-in fleet sessions, whose tokens the removed device may still hold")
        func removalWarnsOfSignedInSessions() throws {
            let (groups, machines) = try threeMachines()
            defer { withExtendedLifetime(machines) {} }
            #expect(try groups[0].signedInFleetSessions() == 0)
            let session = groups[0].fleetSessionID("account-removed")
            let canary = makeCanary("fleet-removed")
            try groups[0].writeFleet(try groups[0].fleetConnection(), session: session, field: .refreshToken, secret: SecretBytes(utf8: canary))
            #expect(try groups[0].signedInFleetSessions() == 1)
            try SyncCLI.configure(machines[0], group: groups[0].groupID, database: try testDatabase())
            let removed = try SyncCLI.run(machines[0], ["sync", "remove-device", groups[2].deviceID])
            #expect(removed.status == 0, "\(removed.standardError)")
            #expect(removed.standardOutput.contains("1 signed-in fleet session"), "\(removed.standardOutput)")
            #expect(!removed.standardOutput.contains(canary) && !removed.standardError.contains(canary))
            try groups[0].clearFleet(try groups[0].fleetConnection(), session: session)
            #expect(try groups[0].signedInFleetSessions() == 0)
        }

        @Test("A device removal waits for a refresh in flight (the session's lock held) and re-seals the token it stored, instead of overwriting it with the older one")
        func removalWaitsForARefreshInFlight() throws {
            let (groups, machines) = try threeMachines()
            defer { withExtendedLifetime(machines) {} }
            let session = groups[1].fleetSessionID("account-in-flight")
            try groups[1].writeFleet(try groups[1].fleetConnection(), session: session, field: .refreshToken, secret: SecretBytes(utf8: "before the refresh"))
            // Machine 1 takes the session's lock, as the manager does before a refresh.
            var hold: PostgresConnection? = try groups[1].lockFleetSession(session)
            #expect(hold != nil)
            let removed = Mutex<String?>(nil)
            let remover = groups[0]
            let leaving = groups[2].deviceID
            let finished = DispatchSemaphore(value: 0)
            Thread.detachNewThread {
                let result = outcome { try remover.removeDevice(leaving) }
                removed.withLock { $0 = "\(result)" }
                finished.signal()
            }
            // The removal waits while the refresh is in flight.
            #expect(finished.wait(timeout: .now() + 1.5) == .timedOut, "the removal did not wait for the session's lock: \(removed.withLock { $0 } ?? "")")
            // The refresh stores its rotated token, then lets the lock go.
            try groups[1].writeFleet(try groups[1].fleetConnection(), session: session, field: .refreshToken, secret: SecretBytes(utf8: "rotated"))
            hold = nil
            #expect(finished.wait(timeout: .now() + 30) == .success)
            #expect(removed.withLock { $0 }?.hasPrefix("success") == true, "\(removed.withLock { $0 } ?? "")")
            for index in 0..<2 {
                #expect(try plain(groups[index].readFleet(try groups[index].fleetConnection(), session: session, field: .refreshToken)) == "rotated")
            }
        }
    }
}
