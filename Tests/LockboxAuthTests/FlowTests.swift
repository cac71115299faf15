import Foundation
#if canImport(FoundationNetworking)
import FoundationNetworking
#endif
import Lockbox
import LockboxAuth
import Testing

extension LifecycleTests {
    @Test func deviceFlow_endToEnd_withSlowDown_signsInAndServesTokens() async throws {
        let server = try await TestServer.running()
        let vault = try TestVault()
        let session = CommandLineSession(store: vault.vault, lockDirectory: vault.lockDirectory)
        try await server.faults(["device_slow_down": 1])

        let pending = try await session.beginLogin(issuer: server.url, clientID: TestServer.clientID, scope: ["api"])
        #expect(TerminalText.isPrintable(pending.authorization.userCode))
        #expect(!"\(pending.authorization)".contains("device_code:"))
        // The user approves in a browser while the CLI polls.
        let flow = DeviceAuthorizationFlow(configuration: pending.configuration, slowDownIncrement: .seconds(1))
        async let login = session.completeLogin(pending, flow: flow)
        // Approve once the server has told the CLI to slow down (its first poll).
        #expect(try await eventually { try await server.counters()["slow_downs"] == 1 }, "the CLI never polled")
        try await server.admin("POST", "test/device/approve", ["user_code": pending.authorization.userCode])
        let result = try await login

        #expect(result.issuer.absoluteString.hasPrefix(server.url.absoluteString))
        #expect(result.replacedGrant == .noPreviousSession)
        let counters = try await server.counters()
        #expect(counters["slow_downs"] == 1)
        #expect(counters["device_polls"]! >= 2)
        let status = try await session.status()
        #expect(status.sessions.map(\.clientID) == [TestServer.clientID])
        #expect(status.sessions.first?.requestedScope == ["api"])

        // `lockbox token` in a later run: a fresh access token that the API accepts.
        let token = try await CommandLineSession(store: vault.vault, lockDirectory: vault.lockDirectory).accessToken()
        var request = server.api("api/resource")
        request.setValue(token.withUnsafeBytes { "Bearer " + String(decoding: $0, as: UTF8.self) }, forHTTPHeaderField: "Authorization")
        let (_, response) = try await URLSession.shared.data(for: request)
        #expect((response as? HTTPURLResponse)?.statusCode == 200)
        #expect(try await session.logout().revoked)
        #expect(try await session.status().sessions.isEmpty)
    }

    @Test func deviceFlow_deniedByUser_failsWithAccessDenied() async throws {
        let server = try await TestServer.running()
        let configuration = try await server.configuration()
        let flow = DeviceAuthorizationFlow(configuration: configuration, slowDownIncrement: .seconds(1))
        let authorization = try await flow.start()
        try await server.admin("POST", "test/device/approve", ["user_code": authorization.userCode, "approve": false])

        await #expect {
            try await flow.waitForApproval(authorization)
        } throws: { isAuthError($0, .flowFailed, oauthError: "access_denied") }
    }

    @Test func authorizationCodeFlow_withPKCEAndLoopback_signsIn() async throws {
        let server = try await TestServer.running()
        let vault = try TestVault()
        let manager = vault.manager(try await server.configuration())

        let tokens = try await server.signIn(manager)

        #expect(tokens.refreshToken != nil)
        #expect(tokens.scope == ["api"])
        #expect(try await server.counters()["code_exchanges"] == 1)
        let (_, response) = try await manager.send(server.api("api/resource"))
        #expect(response.statusCode == 200)
    }

    @Test func loopbackRedirect_withWrongOrMissingState_isAnswered400AndSignInGoesOn() async throws {
        let server = try await TestServer.running()
        let vault = try TestVault()
        let manager = vault.manager(try await server.configuration())
        let session = try AuthorizationCodeFlow(configuration: manager.configuration).start()
        let waiting = Task { try await session.waitForTokens(timeout: .seconds(20)) }

        // A page or a local process sends a redirect with a forged state, then one with none.
        let (forgedBody, forged) = try await URLSession.shared.data(from: URL(string: session.redirectURI + "?code=stolen&state=forged")!)
        let (_, missing) = try await URLSession.shared.data(from: URL(string: session.redirectURI + "?code=stolen")!)

        #expect((forged as? HTTPURLResponse)?.statusCode == 400)
        #expect((missing as? HTTPURLResponse)?.statusCode == 400)
        #expect(!String(decoding: forgedBody, as: UTF8.self).contains("Signed in"))
        // The sign-in kept waiting: the real browser redirect completes it.
        _ = try await URLSession.shared.data(from: session.authorizationURL)
        let tokens = try await waiting.value
        try await manager.signIn(with: tokens)
        #expect(try await server.counters()["code_exchanges"] == 1)
        let (_, response) = try await manager.send(server.api("api/resource"))
        #expect(response.statusCode == 200)
    }

    @Test func discovery_findsEveryEndpointOverTLS() async throws {
        let server = try await TestServer.running()
        let metadata = try await AuthorizationServerMetadata.discover(issuer: server.url)

        #expect(metadata.issuer == server.url)
        #expect(metadata.tokenEndpoint == server.url.appendingPathComponent("token"))
        #expect(metadata.revocationEndpoint != nil)
        #expect(metadata.deviceAuthorizationEndpoint != nil)
        #expect(metadata.codeChallengeMethodsSupported == ["S256"])
    }

    @Test func certificateFromUntrustedCA_isRejected() async throws {
        _ = try await TestServer.running()
        let rogue = try TestServer.rogueURL()

        await #expect {
            try await AuthorizationServerMetadata.discover(issuer: rogue)
        } throws: { error in
            isAuthError(error, .network) && (error as? AuthError)?.urlErrorCode != URLError.cannotConnectToHost.rawValue
        }
    }
}
