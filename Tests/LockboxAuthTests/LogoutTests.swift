import Foundation
#if canImport(FoundationNetworking)
import FoundationNetworking
#endif
import Lockbox
import LockboxAuth
import Testing

extension LifecycleTests {
    /// Presents `token` to the token endpoint directly and returns the OAuth error, if any.
    private func refreshError(_ server: TestServer, _ token: SecretBytes) async throws -> String? {
        var request = URLRequest(url: server.url.appendingPathComponent("token"))
        request.httpMethod = "POST"
        request.setValue("application/x-www-form-urlencoded", forHTTPHeaderField: "Content-Type")
        request.httpBody = token.withUnsafeBytes { bytes in
            Data("grant_type=refresh_token&client_id=\(TestServer.clientID)&refresh_token=".utf8) + Data(bytes)
        }
        let (data, _) = try await URLSession.shared.data(for: request)
        return (try JSONSerialization.jsonObject(with: data) as? [String: Any])?["error"] as? String
    }

    @Test func logout_withRevocationWorking_revokesAtServerAndClearsLocally() async throws {
        let server = try await TestServer.running()
        let vault = try TestVault()
        let events = EventRecorder()
        let manager = vault.manager(try await server.configuration(), events: events)
        let tokens = try await server.signIn(manager)

        let result = try await manager.logout()

        #expect(result == CredentialsManager.LogoutResult(revoked: true, queued: false))
        #expect(await manager.state == .signedOut(.loggedOut))
        #expect(try await vault.tokenStore(for: manager.configuration).hasCredentials() == false)
        #expect(try await RevocationOutbox(store: vault.vault).pendingCount() == 0)
        #expect(try await server.counters()["revocations"]! >= 1)
        #expect(try await refreshError(server, tokens.refreshToken!) == "invalid_grant")
        #expect(events.count(.revocationSucceeded) == 1)
        await #expect {
            try await manager.credentials()
        } throws: { isAuthError($0, .signedOut, reason: .loggedOut) }
    }

    @Test func logout_withRevocationFailing_clearsLocallyQueuesThenRetrySucceeds() async throws {
        let server = try await TestServer.running()
        let vault = try TestVault()
        let events = EventRecorder()
        let manager = vault.manager(try await server.configuration(), events: events)
        let tokens = try await server.signIn(manager)
        // Both revocations fail: the access token's, then the refresh token's.
        try await server.faults(["revoke_fail": 2])

        let result = try await manager.logout()

        #expect(result == CredentialsManager.LogoutResult(revoked: false, queued: true))
        #expect(await manager.state == .signedOut(.loggedOut))
        #expect(try await vault.tokenStore(for: manager.configuration).hasCredentials() == false)
        #expect(try await RevocationOutbox(store: vault.vault).pendingCount() == 1)
        #expect(events.count(.revocationQueued) == 1)
        // The queued entry never restores the session.
        await #expect {
            try await manager.credentials()
        } throws: { isAuthError($0, .signedOut, reason: .loggedOut) }

        // `lockbox logout --retry`, from another handle on the same vault.
        let session = CommandLineSession(store: try Vault.open(at: vault.vault.path), lockDirectory: vault.lockDirectory)
        let retry = try await session.retryPendingLogouts()

        #expect(retry.revoked == 1 && retry.remaining == 0)
        #expect(try await RevocationOutbox(store: vault.vault).pendingCount() == 0)
        #expect(try await server.counters()["revocations"] == 1)
        #expect(try await refreshError(server, tokens.refreshToken!) == "invalid_grant")
    }

    @Test func retryPendingLogouts_whileServerStillFails_keepsEntry() async throws {
        let server = try await TestServer.running()
        let vault = try TestVault()
        let manager = vault.manager(try await server.configuration())
        _ = try await server.signIn(manager)
        try await server.faults(["revoke_fail": 3])
        _ = try await manager.logout()

        let session = CommandLineSession(store: vault.vault, lockDirectory: vault.lockDirectory)
        let result = try await session.retryPendingLogouts()

        #expect(result.remaining == 1)
        #expect(try await RevocationOutbox(store: vault.vault).pendingCount() == 1)
        #expect(try await session.status().pendingRevocations == 1)
        #expect(try await session.status().sessions.isEmpty)
    }
}
