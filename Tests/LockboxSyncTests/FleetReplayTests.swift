import Foundation
import Lockbox
import LockboxTestSupport
import LockboxVault
import Synchronization
import Testing
import VaultCrypto

@testable import LockboxSync

extension SyncTests {
    func text(_ opened: (secret: SecretBytes, details: [UInt8])?) -> String? {
        opened.map { $0.secret.withUnsafeBytes { String(decoding: $0, as: UTF8.self) } }
    }

    @Test("An older fleet token put back in the database is refused by the machines that saw a newer one; a sign-out and a new sign-in are not taken for one")
    func fleetTokenReplayIsRefused() throws {
        let (groups, machines) = try threeMachines()
        defer { withExtendedLifetime(machines) {} }
        let database = try PostgresConnection(try testDatabase())
        let group = groups[0].groupID
        let session = groups[0].fleetSessionID("account-1")
        func sealedRefreshToken() throws -> String? {
            try database.execute(
                "SELECT refresh_token FROM lockbox_fleet_sessions WHERE group_id = $1 AND session_id = $2", [.text(group), .text(session)]
            ).first?[0] ?? nil
        }
        func putBack(_ sealed: String?) throws {
            try database.execute(
                "UPDATE lockbox_fleet_sessions SET refresh_token = $3::bytea WHERE group_id = $1 AND session_id = $2",
                [.text(group), .text(session), sealed.map { .text($0) } ?? .null])
        }
        try groups[0].writeFleet(try groups[0].fleetConnection(), session: session, field: .refreshToken, secret: SecretBytes(utf8: "refresh-1"))
        #expect(try text(groups[1].readFleet(try groups[1].fleetConnection(), session: session, field: .refreshToken)) == "refresh-1")
        let first = try sealedRefreshToken()
        try groups[0].writeFleet(try groups[0].fleetConnection(), session: session, field: .refreshToken, secret: SecretBytes(utf8: "refresh-2"))
        #expect(try text(groups[1].readFleet(try groups[1].fleetConnection(), session: session, field: .refreshToken)) == "refresh-2")
        let second = try sealedRefreshToken()

        // The rotated-out token put back: the reader and the writer refuse it (the server would
        // take its use for reuse and revoke the session everywhere).
        try putBack(first)
        for index in 0..<2 {
            let replayed = #expect(throws: LockboxError.self) {
                try groups[index].readFleet(try groups[index].fleetConnection(), session: session, field: .refreshToken)
            }
            #expect(replayed?.code == .decode && replayed?.message.contains("older") == true, "\(String(describing: replayed))")
        }
        // The access token field of the same row, written later, does not make the refresh
        // token look old.
        try putBack(second)
        try groups[0].writeFleet(
            try groups[0].fleetConnection(), session: session, field: .accessToken, secret: SecretBytes(utf8: "access-1"), details: [])
        #expect(try text(groups[1].readFleet(try groups[1].fleetConnection(), session: session, field: .refreshToken)) == "refresh-2")
        #expect(try text(groups[1].readFleet(try groups[1].fleetConnection(), session: session, field: .accessToken)) == "access-1")

        // Signed out, then in again on another machine: the new token is newer than any before.
        try groups[0].clearFleet(try groups[0].fleetConnection(), session: session)
        #expect(try groups[1].readFleet(try groups[1].fleetConnection(), session: session, field: .refreshToken) == nil)
        try groups[2].writeFleet(try groups[2].fleetConnection(), session: session, field: .refreshToken, secret: SecretBytes(utf8: "refresh-3"))
        #expect(try text(groups[1].readFleet(try groups[1].fleetConnection(), session: session, field: .refreshToken)) == "refresh-3")
        #expect(try text(groups[0].readFleet(try groups[0].fleetConnection(), session: session, field: .refreshToken)) == "refresh-3")

        // A device removal re-seals the fields under the new key, keeping their versions.
        try groups[0].removeDevice(groups[2].deviceID)
        #expect(try text(groups[1].readFleet(try groups[1].fleetConnection(), session: session, field: .refreshToken)) == "refresh-3")

        // The machine's marks edited: refused, with the way out; removed: trusted again.
        let marks = groups[1].fleetMarks.path
        var bytes = try #require(FileManager.default.contents(atPath: marks))
        bytes[bytes.count / 2] ^= 1
        try bytes.write(to: URL(fileURLWithPath: marks))
        let edited = #expect(throws: LockboxError.self) {
            try groups[1].readFleet(try groups[1].fleetConnection(), session: session, field: .refreshToken)
        }
        #expect(edited?.code == .decode && edited?.message.contains("Remove the file") == true)
        try FileManager.default.removeItem(atPath: marks)
        #expect(try text(groups[1].readFleet(try groups[1].fleetConnection(), session: session, field: .refreshToken)) == "refresh-3")
        let mode = try FileManager.default.attributesOfItem(atPath: marks)[.posixPermissions] as? Int
        #expect(mode == 0o600)
    }

    @Test("A refresh token put back after another machine rotated past it is refused by a machine that only read the access token since, as by the machine that rotated")
    func refreshTokenPutBackIsRefusedByAReaderOfTheAccessToken() throws {
        let (groups, machines) = try threeMachines()
        defer { withExtendedLifetime(machines) {} }
        let database = try PostgresConnection(try testDatabase())
        let group = groups[0].groupID
        let session = groups[0].fleetSessionID("account-1")
        func column(_ name: String) throws -> String? {
            try database.execute(
                "SELECT \(name) FROM lockbox_fleet_sessions WHERE group_id = $1 AND session_id = $2", [.text(group), .text(session)]
            ).first?[0] ?? nil
        }
        // Machine 1 refreshes: its rotated token, then the access token beside it.
        try groups[1].writeFleet(try groups[1].fleetConnection(), session: session, field: .refreshToken, secret: SecretBytes(utf8: "refresh-1"))
        try groups[1].writeFleet(
            try groups[1].fleetConnection(), session: session, field: .accessToken, secret: SecretBytes(utf8: "access-1"), details: [])
        let machineOnesToken = try column("refresh_token")
        // Machine 0 refreshes later, rotating past it.
        try groups[0].writeFleet(try groups[0].fleetConnection(), session: session, field: .refreshToken, secret: SecretBytes(utf8: "refresh-2"))
        try groups[0].writeFleet(
            try groups[0].fleetConnection(), session: session, field: .accessToken, secret: SecretBytes(utf8: "access-2"), details: [])
        // Machine 1 reads the shared access token (as every call does), never the refresh token.
        #expect(try text(groups[1].readFleet(try groups[1].fleetConnection(), session: session, field: .accessToken)) == "access-2")
        // Its own last refresh token put back: before, machine 1 took it for current and
        // presented it, which the server answers by revoking the session everywhere.
        try database.execute(
            "UPDATE lockbox_fleet_sessions SET refresh_token = $3::bytea WHERE group_id = $1 AND session_id = $2",
            [.text(group), .text(session), machineOnesToken.map { .text($0) } ?? .null])
        let replayed = #expect(throws: LockboxError.self) {
            try groups[1].readFleet(try groups[1].fleetConnection(), session: session, field: .refreshToken)
        }
        #expect(replayed?.code == .decode && replayed?.message.contains("older") == true, "\(String(describing: replayed))")
        // The access token's record of the refresh token is sealed with it: moved to another
        // access token, or cut off, it does not open.
        let access = try #require(try column("access_token"))
        try database.execute(
            "UPDATE lockbox_fleet_sessions SET access_token = substring($3::bytea from 1 for length($3::bytea) - 9) WHERE group_id = $1 AND session_id = $2",
            [.text(group), .text(session), .text(access)])
        #expect(throws: LockboxError.self) { try groups[2].readFleet(try groups[2].fleetConnection(), session: session, field: .accessToken) }
    }

    @Test("A fleet session whose row's version was moved to near the largest is refused before a refresh presents anything; a record of a refresh in flight of any value is waited out for at most its cap")
    func editedVersionAndRecordAreRefusedOrCapped() throws {
        let (groups, machines) = try threeMachines()
        defer { withExtendedLifetime(machines) {} }
        let database = try PostgresConnection(try testDatabase())
        let group = groups[0].groupID
        let session = groups[0].fleetSessionID("account-1")
        try groups[0].writeFleet(try groups[0].fleetConnection(), session: session, field: .refreshToken, secret: SecretBytes(utf8: "refresh-1"))
        // The smallest bigint as the record: waited out at once (it has ended), no overflow.
        try database.execute(
            "UPDATE lockbox_fleet_sessions SET refresh_in_flight_until = -9223372036854775808 WHERE group_id = $1 AND session_id = $2",
            [.text(group), .text(session)])
        let start = ContinuousClock.now
        try groups[1].awaitRefreshInFlight(try groups[1].fleetConnection(), session: session)
        #expect(ContinuousClock.now - start < .seconds(5))
        // The version at the largest: the refresh is refused before the token is presented.
        try database.execute(
            "UPDATE lockbox_fleet_sessions SET version = 9223372036854775807 WHERE group_id = $1 AND session_id = $2",
            [.text(group), .text(session)])
        let refused = #expect(throws: LockboxError.self) {
            try groups[1].markRefreshInFlight(try groups[1].fleetConnection(), session: session, for: .seconds(10))
        }
        #expect(refused?.code == .decode, "\(String(describing: refused))")
    }

    @Test("Threads of one machine storing and reading a session's tokens at once: no token taken for a replay, no failed store")
    func fleetWritersAndReadersOfOneMachine() throws {
        let (groups, machines) = try threeMachines()
        defer { withExtendedLifetime(machines) {} }
        let sessions = [groups[0].fleetSessionID("account-a"), groups[0].fleetSessionID("account-b")]
        let group = groups[0]
        let failures = Mutex<[String]>([])
        let rounds = 150
        DispatchQueue.concurrentPerform(iterations: 4) { worker in
            let session = sessions[worker % 2]
            do {
                let connection = try group.fleetConnection()
                for round in 0..<rounds {
                    if worker < 2 {
                        try group.writeFleet(connection, session: session, field: .refreshToken, secret: SecretBytes(utf8: "token \(round)"))
                    } else {
                        _ = try group.readFleet(connection, session: session, field: .refreshToken)
                    }
                }
            } catch {
                failures.withLock { $0.append("worker \(worker): \(error)") }
            }
        }
        #expect(failures.withLock { $0 }.isEmpty, "\(failures.withLock { $0 })")
        for session in sessions {
            #expect(try text(groups[1].readFleet(try groups[1].fleetConnection(), session: session, field: .refreshToken)) == "token \(rounds - 1)")
            // The mark is the last write's version, the row's (versions are at least the
            // database's time in milliseconds, and grow with each write).
            let row = try PostgresConnection(try testDatabase()).execute(
                "SELECT version FROM lockbox_fleet_sessions WHERE group_id = $1 AND session_id = $2", [.text(groups[0].groupID), .text(session)])
            #expect(try groups[0].fleetMarks.mark(session: session, field: .refreshToken) == PostgresConnection.integer(row.first?.first ?? nil))
        }
    }

    @Test("A fleet token sealed before versions (the first format) is still read")
    func firstFormatFleetTokenIsRead() throws {
        let (groups, machines) = try threeMachines()
        defer { withExtendedLifetime(machines) {} }
        let group = groups[0].groupID
        let session = groups[0].fleetSessionID("account-old")
        let keys = groups[0].keys
        func associatedData(_ part: Int) -> [UInt8] {
            var encoder = FieldEncoder()
            encoder.string("lockbox.fleet.v1")
            encoder.string(group)
            encoder.string(session)
            encoder.string("refresh_token")
            encoder.integer(part)
            encoder.integer(Int(keys.epoch))
            return encoder.bytes
        }
        var sealed = FieldEncoder()
        sealed.bytes(Crypto.seal([UInt8](), key: keys.fleet, associatedData: associatedData(0)))
        sealed.bytes(Crypto.seal(SecretBytes(utf8: "old format"), key: keys.fleet, associatedData: associatedData(1)))
        try PostgresConnection(try testDatabase()).execute(
            "INSERT INTO lockbox_fleet_sessions (group_id, session_id, version, refresh_token) VALUES ($1, $2, 1, $3)",
            [.text(group), .text(session), .bytes(sealed.bytes)])
        #expect(try text(groups[1].readFleet(try groups[1].fleetConnection(), session: session, field: .refreshToken)) == "old format")
        // The next write is of the new format, at a later version.
        try groups[0].writeFleet(try groups[0].fleetConnection(), session: session, field: .refreshToken, secret: SecretBytes(utf8: "new format"))
        #expect(try text(groups[1].readFleet(try groups[1].fleetConnection(), session: session, field: .refreshToken)) == "new format")
    }
}
