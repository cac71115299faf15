import Foundation
import Lockbox
import LockboxTestSupport
import LockboxVault
import Testing

@testable import LockboxSync

/// The TLS connection string scripts/postgres wrote for its role `lockbox_tls` (which may log
/// in only over TLS), and the server's state directory (tls-ca.pem signed the server's
/// certificate, other-ca.pem nothing it has).
func tlsDatabase() throws -> (conninfo: String, state: String) {
    let state = try #require(
        ProcessInfo.processInfo.environment["LOCKBOX_POSTGRES_STATE"],
        "LOCKBOX_POSTGRES_STATE is not set: start PostgreSQL with `scripts/postgres start` and export its state directory")
    let file = state + "/conninfo-tls"
    let conninfo = try #require(
        try? String(contentsOfFile: file, encoding: .utf8),
        "\(file) is missing: the server was started by a scripts/postgres without TLS; start it again")
    return (conninfo.trimmingCharacters(in: .whitespacesAndNewlines), state)
}

///
/// Nested in the serialized suite of the sync tests: none of them runs while another stops the
/// database (SyncDeviceTests.swift, the restart test).
extension SyncTests {
    @Suite("Sync over TLS", .serialized)
    struct SyncTransportTests {
        @Test("Two machines sync through a server reached over TLS, its certificate and name verified; sync status says so")
        func syncOverVerifiedTLS() throws {
            let (conninfo, _) = try tlsDatabase()
            let machines = [try Machine(), try Machine()]
            let first = try SyncGroup.create(vault: machines[0].vault, database: conninfo, passphrase: groupPassphrase)
            let second = try SyncGroup.join(first.groupID, vault: machines[1].vault, database: conninfo, passphrase: groupPassphrase)
            try machines[0].add("tls.example", "alice", "over tls")
            #expect(try first.sync().pushed == 1)
            #expect(try second.sync().pulled == 1)
            #expect(try machines[1].value("tls.example", "alice") == "over tls")
            let connection = try PostgresConnection(conninfo)
            #expect(try connection.execute("SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()").first?[0] == "t")
            #expect(connection.transport.hasSuffix("the server's certificate and name verified"))
            let status = try second.status()
            #expect(status.transport?.hasSuffix("the server's certificate and name verified") == true)
            #expect(status.pendingRemoteVersions == 0)
            // The command line shows it, in text and JSON.
            try SyncCLI.configure(machines[1], group: first.groupID, database: conninfo)
            let shown = try SyncCLI.run(machines[1], ["sync", "status"])
            #expect(shown.status == 0, "\(shown.standardError)")
            #expect(shown.standardOutput.contains("database:         TLS"), "\(shown.standardOutput)")
            #expect(shown.standardOutput.contains("the server's certificate and name verified"), "\(shown.standardOutput)")
            let json = try SyncCLI.run(machines[1], ["sync", "status", "--json"])
            #expect(json.standardOutput.contains("\"transport\": \"TLS"), "\(json.standardOutput)")
        }

        @Test("A server whose certificate another CA signed, or whose certificate names another host, is refused before anything is sent; the error names the check")
        func untrustedServerRefused() throws {
            let (conninfo, state) = try tlsDatabase()
            let otherCA = conninfo.replacingOccurrences(of: state + "/tls-ca.pem", with: state + "/other-ca.pem")
            #expect(otherCA != conninfo)
            let error = #expect(throws: LockboxError.self) { try PostgresConnection(otherCA) }
            #expect(error?.code == .notAvailable)
            #expect(error?.message.contains("certificate verify failed") == true, "\(error?.message ?? "")")
            #expect(error?.message.contains("sslrootcert=FILE") == true, "the error says how to name the CA")
            let wrongName = conninfo.replacingOccurrences(of: "host=localhost", with: "host=wrong.example")
            #expect(wrongName != conninfo)
            let nameError = #expect(throws: LockboxError.self) { try PostgresConnection(wrongName) }
            #expect(nameError?.code == .notAvailable)
            #expect(nameError?.message.contains("does not match host name") == true, "\(nameError?.message ?? "")")
            // Through the library: no group is made there, and the keychain is untouched.
            let machine = try Machine()
            let createError = #expect(throws: LockboxError.self) {
                try SyncGroup.create(vault: machine.vault, database: otherCA, passphrase: groupPassphrase)
            }
            #expect(createError?.code == .notAvailable)
            #expect(try machine.count() == 0)
        }

        @Test("A server on another machine is reached with TLS and verified unless the connection string says otherwise, against the system's certificate authorities when none is given; never plain text without a word")
        func remoteServerDefaultsToVerifiedTLS() throws {
            let (conninfo, state) = try tlsDatabase()
            // A name that is not this machine's (the address still loopback), no sslmode given: TLS,
            // verified against the run's CA.
            let remote = conninfo.replacingOccurrences(of: "host=localhost", with: "host=lockbox-postgres.test")
                .replacingOccurrences(of: " sslmode=verify-full", with: "")
            #expect(!remote.contains("sslmode") && remote.contains("lockbox-postgres.test"))
            #expect(try PostgresConnection(remote).transport.hasSuffix("the server's certificate and name verified"))
            // No CA given either: the system's, which did not sign the server's certificate.
            let systemCAs = remote.replacingOccurrences(of: " sslrootcert=\(state)/tls-ca.pem", with: "")
            #expect(!systemCAs.contains("sslrootcert"))
            let error = #expect(throws: LockboxError.self) { try PostgresConnection(systemCAs) }
            #expect(error?.code == .notAvailable)
            #expect(error?.message.contains("certificate verify failed") == true, "\(error?.message ?? "")")

            // The defaults as computed: only for a host elsewhere, and only what is not given.
            let nothingSet: (String) -> String? = { _ in nil }
            let elsewhere = PostgresConnection.transportDefaults(["host": "db.example.com"], environment: nothingSet)
            #expect(elsewhere.first.map { [$0.0, $0.1] } == ["sslmode", "verify-full"])
            for local in [[:], ["host": "localhost"], ["host": "/run/postgresql"], ["host": "127.0.0.1"], ["host": "::1"], ["hostaddr": "127.0.0.2"]] {
                #expect(PostgresConnection.transportDefaults(local, environment: nothingSet).isEmpty, "\(local)")
            }
            for remote in [
                ["hostaddr": "10.0.0.5"], ["host": "localhost,db.example.com"], ["host": "192.0.2.1", "hostaddr": "127.0.0.1"],
                ["host": "localhost", "hostaddr": "203.0.113.5"],
            ] {
                #expect(PostgresConnection.transportDefaults(remote, environment: nothingSet).first?.1 == "verify-full", "\(remote)")
            }
            #expect(PostgresConnection.transportDefaults(["host": "db.example.com", "sslmode": "disable"], environment: nothingSet).isEmpty)
            #expect(PostgresConnection.transportDefaults(["host": "db.example.com", "service": "sync"], environment: nothingSet).isEmpty)
            #expect(PostgresConnection.transportDefaults(["host": "db.example.com"], environment: { $0 == "PGSSLMODE" ? "disable" : nil }).isEmpty)
            #expect(PostgresConnection.transportDefaults(["host": "localhost"], environment: { $0 == "PGHOSTADDR" ? "203.0.113.5" : nil }).first?.1 == "verify-full")
            #expect(PostgresConnection.transportDefaults(["host": "db.example.com", "sslrootcert": "/ca.pem"], environment: nothingSet).count == 1)

            // An explicit choice is kept, and shown for what it is.
            let unverified = conninfo.replacingOccurrences(of: "sslmode=verify-full", with: "sslmode=require")
            #expect(try PostgresConnection(unverified).transport.hasSuffix("the server not verified (sslmode=require)"))
            let plain = try testDatabase() + " sslmode=disable"
            #expect(try PostgresConnection(plain).transport == "not encrypted")
            // Plain text for a role the server admits over TLS only: refused by the server.
            let plainTLSRole = conninfo.replacingOccurrences(of: "sslmode=verify-full", with: "sslmode=disable")
            let refused = #expect(throws: LockboxError.self) { try PostgresConnection(plainTLSRole) }
            #expect(refused?.code == .notAvailable)
        }
    }
}
