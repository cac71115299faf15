import Foundation
import Glibc
import Lockbox
import LockboxAuth
import Testing

extension LifecycleTests {
    @Test func processKilled_afterServerRotatedBeforeResponseRead_restartsSignedOutWithReason() async throws {
        let server = try await TestServer.running()
        let vault = try TestVault()
        let manager = vault.manager(try await server.configuration())
        _ = try await server.signIn(manager)
        try await server.faults(["token_hang_after_rotate": 5])

        let process = try Worker.launch(vault: vault, server: server, ["refresh"])
        let rotated = try await eventually { try await server.logEvents().contains("token_hang_after_rotate") }
        kill(process.processIdentifier, SIGKILL)
        process.waitUntilExit()
        try await server.faults(["token_hang_after_rotate": 0])
        #expect(rotated)

        // The stored token is the one the server already rotated: presenting it again is reuse.
        let restart = try await Worker.run(vault: vault, server: server, ["check"])
        #expect(restart["outcome"] as? String == "signed_out", "restart: \(restart)")
        #expect(restart["reason"] as? String == "invalid_grant")
        #expect(try await vault.tokenStore(for: manager.configuration).hasCredentials() == false)
        let events = try await server.logEvents()
        #expect(events.contains("refresh_rotated"))
        #expect(events.contains("reuse_detected"))
        // A second restart stays signed out without calling the server again: no loop.
        let refreshesBefore = try await server.counters()["refresh_requests"]!
        let again = try await Worker.run(vault: vault, server: server, ["check"])
        #expect(again["outcome"] as? String == "signed_out")
        #expect(again["reason"] as? String == "no_credentials")
        #expect(try await server.counters()["refresh_requests"]! == refreshesBefore)
    }

    @Test func processKilled_rightAfterPersistingRotation_restartsWithValidSession() async throws {
        let server = try await TestServer.running()
        let vault = try TestVault()
        let manager = vault.manager(try await server.configuration())
        _ = try await server.signIn(manager)

        let worker = try Worker.launch(vault: vault, server: server, ["die-after-persist"])
        let killed = try await Worker.output(of: worker)
        #expect(worker.terminationReason == .uncaughtSignal && worker.terminationStatus == SIGKILL, "the worker should have died in its hook: \(killed)")

        let restart = try await Worker.run(vault: vault, server: server, ["check"])
        #expect(restart["outcome"] as? String == "ok", "restart: \(restart)")
        let counters = try await server.counters()
        #expect(counters["reuse_detections"] == 0)
        #expect(counters["refresh_successes"] == 2)
    }

    @Test func responseDroppedAfterRotation_keepsCredentials_thenSignsOutCleanlyWithoutLoop() async throws {
        let server = try await TestServer.running()
        let vault = try TestVault()
        let events = EventRecorder()
        let manager = vault.manager(try await server.configuration(), events: events)
        _ = try await server.signIn(manager)
        try await server.faults(["token_drop_after_rotate": 1])

        await #expect {
            try await manager.credentials(minTTL: forceRefresh)
        } throws: { error in
            isAuthError(error, .network)
        }
        #expect(try await vault.tokenStore(for: manager.configuration).hasCredentials())
        #expect(isSignedIn(await manager.state))

        // The stored token was rotated at the server: the next refresh is reuse, which ends
        // the session cleanly, once.
        await #expect {
            try await manager.credentials(minTTL: forceRefresh)
        } throws: { isAuthError($0, .signedOut, reason: .refreshTokenRejected) }
        await #expect {
            try await manager.credentials(minTTL: forceRefresh)
        } throws: { isAuthError($0, .signedOut, reason: .refreshTokenRejected) }
        let counters = try await server.counters()
        #expect(counters["refresh_requests"] == 2)
        #expect(counters["dropped_responses"] == 1)
        #expect(await manager.state == .signedOut(.refreshTokenRejected))
        #expect(events.count(.signedOut) == 1)
    }
}
