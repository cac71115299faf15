import Foundation
#if canImport(FoundationNetworking)
import FoundationNetworking
#endif
import Lockbox
import LockboxAuth
import Testing

extension LifecycleTests {
    @Test func hundredConcurrentCallers_withExpiredAccessToken_shareExactlyOneRefresh() async throws {
        let server = try await TestServer.running()
        let vault = try TestVault()
        let clock = ShiftedClock()
        let manager = vault.manager(try await server.configuration(), clock: clock)
        // The signed-in access token lives an hour; to the manager two have passed when the
        // callers arrive, so it has expired. The refreshed one lives an hour from then.
        _ = try await server.signIn(manager)
        clock.advance(by: .seconds(7200))
        let before = try await server.counters()

        let statuses = try await withThrowingTaskGroup(of: Int.self) { group in
            for _ in 0..<100 {
                group.addTask { try await manager.send(server.api("api/resource")).1.statusCode }
            }
            return try await group.reduce(into: [Int]()) { $0.append($1) }
        }

        let after = try await server.counters()
        #expect(statuses.count == 100)
        #expect(statuses.allSatisfy { $0 == 200 })
        #expect(after["refresh_requests"]! - before["refresh_requests"]! == 1)
        #expect(after["reuse_detections"] == 0)
        #expect(after["api_get"]! - before["api_get"]! == 100)
    }

    @Test func cancelledWaiter_duringSharedRefresh_leavesAtOnceWithoutCancellingIt() async throws {
        let server = try await TestServer.running()
        let vault = try TestVault()
        let transport = ObservedTransport()
        let manager = vault.manager(try await server.configuration(), transport: transport)
        _ = try await server.signIn(manager)
        try await server.faults(["token_delay": 1.0])
        let before = try await server.counters()

        let requests = transport.requestsStarted(toPathEnding: "/token")
        let cancelled = Task { try await manager.credentials(minTTL: forceRefresh) }
        // The refresh has reached the server before the second caller comes.
        #expect(try await transport.waitForRequest(toPathEnding: "/token", after: requests), "the refresh never started")
        let waiter = Task { try await manager.credentials(minTTL: forceRefresh) }
        let clock = ContinuousClock()
        let cancelledAt = clock.now
        cancelled.cancel()
        // The cancelled caller leaves at once; the refresh goes on for the other one.
        let cancelledResult = await cancelled.result
        let cancelledAfter = cancelledAt.duration(to: clock.now)
        let credentials = try await waiter.value
        let refreshedAfter = cancelledAt.duration(to: clock.now)

        #expect { try cancelledResult.get() } throws: { isAuthError($0, .cancelled) }
        #expect(cancelledAfter < refreshedAfter)

        let after = try await server.counters()
        #expect(after["refresh_requests"]! - before["refresh_requests"]! == 1)
        #expect(after["refresh_successes"]! - before["refresh_successes"]! == 1)
        #expect(await manager.state == .signedIn(accessTokenExpiresAt: credentials.expiresAt))
        let (_, response) = try await manager.send(server.api("api/resource"))
        #expect(response.statusCode == 200)
    }

    @Test func fourProcesses_sharingOneVault_fiftyRotationsEach_causeZeroReuseDetections() async throws {
        let server = try await TestServer.running()
        let vault = try TestVault()
        let manager = vault.manager(try await server.configuration())
        _ = try await server.signIn(manager)
        let before = try await server.counters()

        let processes = try (0..<4).map { _ in try Worker.launch(vault: vault, server: server, ["calls", "50"]) }
        var outputs: [[String: Any]] = []
        for process in processes {
            outputs.append(try await Worker.output(of: process))
        }

        let after = try await server.counters()
        for output in outputs {
            #expect(output["outcome"] as? String == "ok", "worker: \(output)")
            #expect(output["successes"] as? Int == 50)
        }
        #expect(after["reuse_detections"] == 0)
        #expect(after["refresh_rejections"] == 0)
        #expect(after["refresh_successes"]! - before["refresh_successes"]! == 200)
        // The session is still good for the process that signed in, with the latest token.
        let (_, response) = try await manager.send(server.api("api/resource"))
        #expect(response.statusCode == 200)
    }
}
