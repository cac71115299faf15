import Foundation
import Lockbox
import LockboxTestSupport
import Synchronization
import Testing

#if canImport(FoundationNetworking)
import FoundationNetworking
#endif

@testable import LockboxSync

/// The OAuth test server of the fleet test (scripts/test starts it in LOCKBOX_FLEET_OAUTH_STATE).
struct FleetServer {
    let url: URL

    init() throws {
        let state = try #require(
            ProcessInfo.processInfo.environment["LOCKBOX_FLEET_OAUTH_STATE"],
            "LOCKBOX_FLEET_OAUTH_STATE is not set: scripts/test starts a second OAuth server for the fleet test there")
        let text = try String(contentsOfFile: state + "/url", encoding: .utf8)
        url = try #require(URL(string: text.trimmingCharacters(in: .whitespacesAndNewlines)), "no OAuth server URL in \(state)/url")
    }

    @discardableResult
    func admin(_ method: String, _ path: String, _ body: [String: Any]? = nil) async throws -> Any {
        var request = URLRequest(url: url.appendingPathComponent(path))
        request.httpMethod = method
        if let body {
            request.httpBody = try JSONSerialization.data(withJSONObject: body)
            request.setValue("application/json", forHTTPHeaderField: "Content-Type")
        }
        let (data, response) = try await URLSession.shared.data(for: request)
        #expect((response as? HTTPURLResponse)?.statusCode == 200, "the fleet OAuth server refused \(method) \(path)")
        return try JSONSerialization.jsonObject(with: data)
    }

    func counters() async throws -> [String: Int] {
        try await admin("GET", "test/counters") as? [String: Int] ?? [:]
    }
}

extension SyncTests {
    @Test("A fleet of 3 machines x 4 processes shares one OAuth session: one refresh per access-token lifetime, no reuse detection, no sign-out")
    func fleetSharesOneSession() async throws {
        let server = try FleetServer()
        let database = try testDatabase()
        try await server.admin("POST", "test/reset")
        let lifetime = 4.0
        try await server.admin("POST", "test/faults", ["access_token_lifetime": Int(lifetime)])
        let (groups, machines) = try threeMachines()
        defer { withExtendedLifetime(machines) {} }
        let url = server.url.absoluteString
        @Sendable func worker(_ machine: Int, _ arguments: [String], timeout: Double) -> String {
            let result = try? run(
                builtProduct("lockbox-fleet-worker"),
                [
                    "--keychain", machines[machine].vault.path, "--database", database, "--group", groups[machine].groupID,
                    "--issuer", url, "--client-id", "lockbox-cli",
                ] + arguments, environment: SyncCLI.environment(machines[machine]), timeout: timeout)
            return (result?.standardOutput.split(separator: "\n").last.map(String.init) ?? "") + "\t" + (result?.standardError ?? "no process")
        }
        func parsed(_ output: String) -> [String: Any] {
            let line = String(output.prefix { $0 != "\t" })
            return (try? JSONSerialization.jsonObject(with: Data(line.utf8)) as? [String: Any]) ?? ["outcome": "no answer: \(output)"]
        }
        // The sign-in's tokens are canaries: they must never be found in the database.
        let canaries = [makeCanary("fleet-access"), makeCanary("fleet-refresh")]
        try await server.admin("POST", "test/faults", ["canary_access_token": canaries[0], "canary_refresh_token": canaries[1]])
        let signIn = parsed(worker(0, ["sign-in"], timeout: 60))
        #expect(signIn["outcome"] as? String == "ok", "sign-in: \(signIn)")
        // The database holds the signed-in session sealed: neither canary token in clear.
        let rows = try PostgresConnection(database).execute(
            "SELECT session_id, version, refresh_token, access_token FROM lockbox_fleet_sessions WHERE group_id = $1",
            [.text(groups[0].groupID)])
        #expect(rows.count == 1 && rows.first?[2] != nil && rows.first?[3] != nil, "the session is not in the database")
        var stored: [UInt8] = []
        for row in rows {
            stored += Array((row[0] ?? "").utf8)
            for column in [row[2], row[3]] where column != nil { stored += try PostgresConnection.bytes(column) }
        }
        for canary in canaries { #expect(!contains(stored, Array(canary.utf8)), "a token is in the database in clear") }
        let before = try await server.counters()

        let duration = 13.0
        let outputs = Mutex<[String]>([])
        // Twelve threads, so all twelve processes run at once (Dispatch would run only as many
        // as there are cores).
        let finished = DispatchGroup()
        for index in 0..<12 {
            finished.enter()
            Thread.detachNewThread {
                let output = worker(index % 3, ["calls", String(duration)], timeout: duration + 60)
                outputs.withLock { $0.append(output) }
                finished.leave()
            }
        }
        finished.wait()
        let results = outputs.withLock { $0 }.map(parsed)
        let after = try await server.counters()
        #expect(results.count == 12)
        for result in results {
            #expect(result["outcome"] as? String == "ok", "a worker: \(result)")
            #expect(result["signed_out"] as? Int == 0)
            #expect((result["successes"] as? Int ?? 0) > 0)
        }
        let refreshes = (after["refresh_successes"] ?? 0) - (before["refresh_successes"] ?? 0)
        // Each access token is fresh for its lifetime minus a tenth (the refresh leeway); the
        // workers asked from the first one's start to the last one's end.
        let window = (results.compactMap { $0["ended"] as? Double }.max() ?? 0) - (results.compactMap { $0["started"] as? Double }.min() ?? 0)
        #expect(window >= duration)
        let crossed = Int((window / (lifetime * 0.9)).rounded(.up))
        #expect(refreshes >= crossed / 2, "\(refreshes) refreshes in \(window) s of \(lifetime) s tokens")
        #expect(refreshes <= crossed + 1, "\(refreshes) refreshes in \(window) s of \(lifetime) s tokens: the fleet refreshed more than once per lifetime")
        #expect(after["reuse_detections"] == before["reuse_detections"])
        #expect(after["families_revoked"] == before["families_revoked"])
        #expect(after["refresh_rejections"] == before["refresh_rejections"])
        try await server.admin("POST", "test/faults", ["access_token_lifetime": 3600])
    }
}
