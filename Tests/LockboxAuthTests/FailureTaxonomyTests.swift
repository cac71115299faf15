import Foundation
import Lockbox
import LockboxAuth
import Testing

extension LifecycleTests {
    @Test func refreshRejectedByServer_signsOutAndClearsStore() async throws {
        let server = try await TestServer.running()
        let vault = try TestVault()
        let events = EventRecorder()
        let manager = vault.manager(try await server.configuration(), events: events)
        _ = try await server.signIn(manager)
        try await server.admin("POST", "test/revoke-all")
        let states = await manager.states()

        await #expect {
            try await manager.credentials(minTTL: forceRefresh)
        } throws: { isAuthError($0, .signedOut, reason: .refreshTokenRejected) }
        #expect(await manager.state == .signedOut(.refreshTokenRejected))
        var observed: [CredentialsState] = []
        for await state in states {
            observed.append(state)
            if case .signedOut = state { break }
        }
        #expect(observed.count == 3)
        #expect(isSignedIn(observed[0]))
        #expect(observed.dropFirst().first == .refreshing)
        #expect(observed.last == .signedOut(.refreshTokenRejected))
        #expect(try await vault.tokenStore(for: manager.configuration).hasCredentials() == false)
        #expect(events.events.contains { $0.kind == .signedOut && $0.reason == "invalid_grant" })
    }

    @Test func serverAnswers503WithRetryAfter_credentialsAreKept() async throws {
        let server = try await TestServer.running()
        let vault = try TestVault()
        let manager = vault.manager(try await server.configuration())
        _ = try await server.signIn(manager)
        try await server.faults(["token_503": 1])

        await #expect {
            try await manager.credentials(minTTL: forceRefresh)
        } throws: { isAuthError($0, .server, oauthError: "temporarily_unavailable", status: 503) && ($0 as? AuthError)?.retryAfter == .seconds(1) }
        #expect(isSignedIn(await manager.state))
        #expect(try await vault.tokenStore(for: manager.configuration).hasCredentials())
        // The kept token still works once the server is back.
        _ = try await manager.credentials(minTTL: forceRefresh)
        #expect(try await server.counters()["reuse_detections"] == 0)
    }

    @Test func networkDown_credentialsAreKept() async throws {
        let server = try await TestServer.running()
        let vault = try TestVault()
        var configuration = try await server.configuration()
        let manager = vault.manager(configuration)
        _ = try await server.signIn(manager)
        // The same account, with its token endpoint on a port where nothing listens.
        configuration.tokenEndpoint = URL(string: "https://127.0.0.1:9/token")!
        let unreachable = vault.manager(configuration)

        await #expect {
            try await unreachable.credentials(minTTL: forceRefresh)
        } throws: { error in
            isAuthError(error, .network)
        }
        #expect(isSignedIn(await unreachable.state))
        #expect(try await vault.tokenStore(for: manager.configuration).hasCredentials())
        _ = try await manager.credentials(minTTL: forceRefresh)
        #expect(try await server.counters()["reuse_detections"] == 0)
    }

    @Test func lockedStore_isNotASignOut_andCredentialsSurviveUnlock() async throws {
        let server = try await TestServer.running()
        let vault = try TestVault()
        let configuration = try await server.configuration()
        // whenUnlocked, so locking the vault makes the refresh token unreadable.
        let manager = vault.manager(configuration, accessibility: .whenUnlocked)
        _ = try await server.signIn(manager)
        vault.vault.lock()

        await #expect {
            try await manager.credentials(minTTL: forceRefresh)
        } throws: { isAuthError($0, .storeLocked) }
        #expect(await manager.state == .storeLocked)
        #expect(try await server.counters()["refresh_requests"] == 0)

        try vault.vault.unlock(passphrase: TestVault.passphrase)
        let credentials = try await manager.credentials(minTTL: forceRefresh)
        #expect(isSignedIn(await manager.state))
        #expect(credentials.fingerprint.count == 8)
    }

    @Test func rotationHook_runsAfterNewRefreshTokenIsStored() async throws {
        let server = try await TestServer.running()
        let vault = try TestVault()
        let configuration = try await server.configuration()
        let manager = vault.manager(configuration)
        _ = try await server.signIn(manager)
        let store = vault.tokenStore(for: configuration)
        let seen = EventRecorder()
        await manager.setRotationHook { rotation in
            let stored = (try? store.refreshToken()).flatMap { $0 }.map(TokenFingerprint.of)
            seen.record(AuthEvent(kind: .rotationPersisted, reason: stored == rotation.newFingerprint ? "stored" : "not_stored", fingerprint: rotation.newFingerprint, account: ""))
        }

        _ = try await manager.credentials(minTTL: forceRefresh)

        #expect(seen.events.map(\.reason) == ["stored"])
        #expect(seen.events.first?.fingerprint != nil)
    }
}

extension LifecycleTests {
    @Test func rotatedTokenCannotBePersisted_sessionContinuesInMemoryAndPersistsLater() async throws {
        let server = try await TestServer.running()
        let vault = try TestVault()
        let events = EventRecorder()
        let configuration = try await server.configuration()
        let transport = ObservedTransport()
        let manager = vault.manager(configuration, events: events, accessibility: .whenUnlocked, transport: transport)
        _ = try await server.signIn(manager)
        // The refresh reads the stored token, then the server takes a second to answer, and
        // the vault locks in between: the rotated token cannot be written.
        try await server.faults(["token_delay": 1.0])
        let requests = transport.requestsStarted(toPathEnding: "/token")
        let refresh = Task { try await manager.credentials(minTTL: forceRefresh) }
        // Lock once the refresh request is at the server, i.e. past its read of the stored token.
        #expect(try await transport.waitForRequest(toPathEnding: "/token", after: requests), "the refresh never started")
        vault.vault.lock()
        let credentials = try await refresh.value

        #expect(isSignedIn(await manager.state))
        #expect(await manager.isPersistentSignInDisabled)
        #expect(events.count(.rotationNotPersisted) == 1)
        let (_, response) = try await manager.send(server.api("api/resource"))
        #expect(response.statusCode == 200)
        #expect(credentials.fingerprint.count == 8)

        // Once the vault is unlocked, the next rotation (from the in-memory token) is stored.
        try await server.faults(["token_delay": 0])
        try vault.vault.unlock(passphrase: TestVault.passphrase)
        _ = try await manager.credentials(minTTL: forceRefresh)
        #expect(await manager.isPersistentSignInDisabled == false)
        #expect(try await server.counters()["reuse_detections"] == 0)
        let stored = try await vault.tokenStore(for: configuration).refreshToken().map(TokenFingerprint.of)
        #expect(stored == events.events.last { $0.kind == .rotationPersisted }?.fingerprint)
    }
}
