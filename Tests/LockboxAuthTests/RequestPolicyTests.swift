import Foundation
#if canImport(FoundationNetworking)
import FoundationNetworking
#endif
import Lockbox
import LockboxAuth
import Testing

extension LifecycleTests {
    /// Signs in, then has the server revoke the access token the manager holds, so the next
    /// API call meets a 401 `invalid_token` with a token the client believed valid.
    private func signedInWithRevokedAccessToken() async throws -> (TestServer, TestVault, CredentialsManager, EventRecorder) {
        let server = try await TestServer.running()
        let vault = try TestVault()
        let events = EventRecorder()
        let manager = vault.manager(try await server.configuration(), events: events)
        _ = try await server.signIn(manager)
        let held = try await manager.credentials()
        var revoke = URLRequest(url: server.url.appendingPathComponent("revoke"))
        revoke.httpMethod = "POST"
        revoke.httpBody = held.accessToken.withUnsafeBytes { token in
            Data("token_type_hint=access_token&client_id=\(TestServer.clientID)&token=".utf8) + Data(token)
        }
        revoke.setValue("application/x-www-form-urlencoded", forHTTPHeaderField: "Content-Type")
        let (_, response) = try await URLSession.shared.data(for: revoke)
        #expect((response as? HTTPURLResponse)?.statusCode == 200)
        return (server, vault, manager, events)
    }

    @Test func unauthorizedGet_refreshesOnceAndRetriesOnce() async throws {
        let (server, vault, manager, events) = try await signedInWithRevokedAccessToken()
        defer { withExtendedLifetime(vault) {} }
        let before = try await server.counters()

        let (_, response) = try await manager.send(server.api("api/resource"))

        let after = try await server.counters()
        #expect(response.statusCode == 200)
        #expect(after["api_401"]! - before["api_401"]! == 1)
        #expect(after["refresh_requests"]! - before["refresh_requests"]! == 1)
        #expect(after["api_get"]! - before["api_get"]! == 1)
        #expect(events.count(.requestRetried) == 1)
    }

    @Test func unauthorizedNonIdempotentPost_refreshesButIsNotRetried() async throws {
        let (server, vault, manager, events) = try await signedInWithRevokedAccessToken()
        defer { withExtendedLifetime(vault) {} }
        let before = try await server.counters()

        let (_, response) = try await manager.send(server.api("api/orders", method: "POST"))

        let after = try await server.counters()
        #expect(response.statusCode == 401)
        #expect(after["api_post"]! - before["api_post"]! == 0)
        #expect(after["refresh_requests"]! - before["refresh_requests"]! == 1)
        #expect(events.count(.requestNotRetried) == 1)
        // The refreshed token is in place: the caller's own retry goes through.
        let (_, second) = try await manager.send(server.api("api/orders", method: "POST"))
        #expect(second.statusCode == 201)
        #expect(try await server.counters()["api_post"]! - before["api_post"]! == 1)
    }

    @Test func unauthorizedPostWithIdempotencyKey_isRetriedOnce() async throws {
        let (server, vault, manager, _) = try await signedInWithRevokedAccessToken()
        defer { withExtendedLifetime(vault) {} }
        let before = try await server.counters()
        var request = server.api("api/orders", method: "POST")
        request.setValue(UUID().uuidString, forHTTPHeaderField: "Idempotency-Key")

        let (_, response) = try await manager.send(request)

        let after = try await server.counters()
        #expect(response.statusCode == 201)
        #expect(after["api_post"]! - before["api_post"]! == 1)
        #expect(after["refresh_requests"]! - before["refresh_requests"]! == 1)
    }

    @Test func unauthorizedAgainAfterRefresh_isReturnedWithoutSecondRefreshOrLoop() async throws {
        let server = try await TestServer.running()
        let vault = try TestVault()
        let manager = vault.manager(try await server.configuration())
        _ = try await server.signIn(manager)
        let before = try await server.counters()

        let (_, response) = try await manager.send(server.api("api/always-401"))

        let after = try await server.counters()
        #expect(response.statusCode == 401)
        #expect(after["api_always_401"] == 2)
        #expect(after["refresh_requests"]! - before["refresh_requests"]! == 1)
        #expect(isSignedIn(await manager.state))
    }

    @Test func forbiddenInsufficientScope_isReturnedWithoutRefresh() async throws {
        let server = try await TestServer.running()
        let vault = try TestVault()
        let manager = vault.manager(try await server.configuration())
        _ = try await server.signIn(manager)
        let before = try await server.counters()

        let (_, response) = try await manager.send(server.api("api/admin"))

        let after = try await server.counters()
        #expect(response.statusCode == 403)
        #expect(after["api_403"]! - before["api_403"]! == 1)
        #expect(after["refresh_requests"]! - before["refresh_requests"]! == 0)
    }

    @Test func requestSafety_followsMethodAndIdempotencyKey() {
        for method in ["GET", "HEAD", "OPTIONS", "PUT", "DELETE"] {
            var request = URLRequest(url: URL(string: "https://example.com")!)
            request.httpMethod = method
            #expect(CredentialsManager.isSafeToRepeat(request), "\(method)")
        }
        var post = URLRequest(url: URL(string: "https://example.com")!)
        post.httpMethod = "POST"
        #expect(!CredentialsManager.isSafeToRepeat(post))
        post.setValue("key-1", forHTTPHeaderField: "Idempotency-Key")
        #expect(CredentialsManager.isSafeToRepeat(post))
        var patch = URLRequest(url: URL(string: "https://example.com")!)
        patch.httpMethod = "PATCH"
        #expect(!CredentialsManager.isSafeToRepeat(patch))
    }
}
