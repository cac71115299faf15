import Foundation
#if canImport(FoundationNetworking)
import FoundationNetworking
#endif
import Lockbox
import LockboxAuth
import LockboxAuthKeys
import LockboxKeys
import LockboxTestSupport
import Testing

extension LifecycleTests {
    /// Sender-constrained tokens against the real server, which checks every proof (signature,
    /// typ, htm, htu, iat, jti, ath, nonce) and binds the tokens to the proof's key.
    @Suite("DPoP: proofs sent, tokens bound, nonces, refusals")
    struct DPoPTests {
        static let nonceClientID = "lockbox-dpop-nonce"

        @Test("sign-in, refresh and API calls carry proofs of one non-extractable session key, and the tokens are bound to it")
        func signInRefreshAndAPICall_areBoundToTheSessionKey() async throws {
            let server = try await TestServer.running()
            let vault = try TestVault()
            let events = EventRecorder()
            let manager = try await vault.dpopManager(server.dpopConfiguration(), events: events)
            let tokens = try await server.signInWithDPoP(manager)
            #expect(tokens.tokenType == "DPoP")

            let key = try #require(try await vault.dpopKeys.boundKey(for: manager.key) as? ManagedProofSigningKey)
            #expect(!key.key.isExtractable)
            #expect(try await server.boundThumbprints() == [key.jwkThumbprint])

            let (body, response) = try await manager.send(server.api("api/dpop/resource"))
            #expect(response.statusCode == 200)
            #expect((try JSONSerialization.jsonObject(with: body) as? [String: Any])?["jkt"] as? String == key.jwkThumbprint)
            let (_, posted) = try await manager.send(server.api("api/dpop/resource", method: "POST"))
            #expect(posted.statusCode == 200)

            let refreshed = try await manager.credentials(minTTL: forceRefresh)
            #expect(refreshed.tokenType == "DPoP")
            #expect(refreshed.accessToken != tokens.accessToken)
            let (_, again) = try await manager.send(server.api("api/dpop/resource"))
            #expect(again.statusCode == 200)
            // The refresh's tokens are bound to the same key: one thumbprint across both grants.
            #expect(try await server.boundThumbprints() == [key.jwkThumbprint])

            let counters = try await server.counters()
            #expect(counters["dpop_api_calls"] == 3)
            #expect(counters["refresh_successes"] == 1)
            #expect(counters["dpop_proofs_accepted"] == 5)  // code exchange, refresh, three API calls
            #expect(counters["dpop_proofs_rejected"] == 0)

            // A bound access token is no bearer token.
            var bearer = server.api("api/resource")
            bearer.setValue("Bearer " + refreshed.accessToken.temporaryText, forHTTPHeaderField: "Authorization")
            #expect(try await httpData(for: bearer).1.statusCode == 401)
        }

        @Test("the device flow polls with proofs and yields a bound session")
        func deviceFlow_pollsWithProofs() async throws {
            let server = try await TestServer.running()
            let vault = try TestVault()
            let manager = try await vault.dpopManager(server.dpopConfiguration())
            let flow = DeviceAuthorizationFlow(
                configuration: manager.configuration, slowDownIncrement: .seconds(1), dpop: try await manager.signInProofs())
            let authorization = try await flow.start()
            async let approval = flow.waitForApproval(authorization)
            #expect(try await eventually { try await server.counters()["device_polls"] ?? 0 >= 1 })
            try await server.admin("POST", "test/device/approve", ["user_code": authorization.userCode])
            let tokens = try await approval
            #expect(tokens.tokenType == "DPoP")
            try await manager.signIn(with: tokens)
            let key = try #require(try await vault.dpopKeys.boundKey(for: manager.key))
            #expect(try await server.boundThumbprints() == [key.jwkThumbprint])
            #expect(try await manager.send(server.api("api/dpop/resource")).1.statusCode == 200)
        }

        @Test("DPoP turned on without proofs, or proofs without DPoP turned on: a configuration error, no request sent")
        func mismatchedConfiguration_isRefused() async throws {
            let server = try await TestServer.running()
            let vault = try TestVault()
            let configuration = try await server.dpopConfiguration()
            #expect(await authErrorCode { _ = try AuthorizationCodeFlow(configuration: configuration).start() } == .configuration)
            var bearerOnly = configuration
            bearerOnly.usesDPoP = false
            let proofs = try await vault.dpopManager(configuration).signInProofs()
            #expect(await authErrorCode { _ = try AuthorizationCodeFlow(configuration: bearerOnly, dpop: proofs).start() } == .configuration)
            let withoutKeys = CredentialsManager(configuration: configuration, tokenStore: vault.tokenStore(for: configuration))
            #expect(await authErrorCode { _ = try await withoutKeys.signInProofs() } == .configuration)
            #expect(try await server.counters()["code_exchanges"] == 0)
        }

        @Test("a stolen refresh token is refused without the key and with another key, and stays usable by its session")
        func stolenRefreshToken_isRefusedWithoutTheKey() async throws {
            let server = try await TestServer.running()
            let vault = try TestVault()
            let configuration = try await server.dpopConfiguration()
            let manager = vault.dpopManager(configuration)
            _ = try await server.signInWithDPoP(manager)
            let stolen = try #require(try await vault.tokenStore(for: configuration).refreshToken())

            // Without a proof: a plain refresh, as any OAuth client would send it.
            var request = URLRequest(url: configuration.tokenEndpoint)
            request.httpMethod = "POST"
            request.setValue("application/x-www-form-urlencoded", forHTTPHeaderField: "Content-Type")
            request.httpBody = Data(
                "grant_type=refresh_token&client_id=\(configuration.clientID)&refresh_token=\(stolen.temporaryText)".utf8)
            let (body, bare) = try await httpData(for: request)
            #expect(bare.statusCode == 400)
            #expect((try JSONSerialization.jsonObject(with: body) as? [String: Any])?["error"] as? String == "invalid_dpop_proof")

            // With another key: the thief's own Lockbox, its own bound key, the stolen token.
            let thiefVault = try TestVault()
            let thiefKeys = thiefVault.dpopKeys
            let thiefKey = try await thiefKeys.makeKey(for: CredentialKey(configuration: configuration))
            try await thiefKeys.bind(thiefKey, to: CredentialKey(configuration: configuration))
            try await thiefVault.tokenStore(for: configuration).saveRefreshToken(stolen)
            let thief = thiefVault.dpopManager(configuration)
            do {
                _ = try await thief.credentials()
                Issue.record("a stolen refresh token was refreshed with another key")
            } catch {
                #expect(isAuthError(error, .proofRejected, oauthError: "invalid_dpop_proof", status: 400), "\(error)")
            }
            #expect(try await server.counters()["dpop_binding_refusals"] == 2)

            // The session that owns the key goes on with the same token.
            #expect(try await vault.tokenStore(for: configuration).refreshToken() == stolen)
            _ = try await manager.credentials(minTTL: forceRefresh)
            #expect(try await server.counters()["refresh_successes"] == 1)
        }

        @Test("a nonce the server asks for is fetched by one retry, at the token endpoint and at the resource, and remembered")
        func nonce_isRetriedOnceAndRemembered() async throws {
            let server = try await TestServer.running()
            let vault = try TestVault()
            let events = EventRecorder()
            let nonces = DPoPNonces()
            let manager = try await vault.dpopManager(server.dpopConfiguration(clientID: Self.nonceClientID), events: events, nonces: nonces)
            _ = try await server.signInWithDPoP(manager)
            #expect(try await server.counters()["dpop_nonce_challenges"] == 1)
            let tokenEndpoint = manager.configuration.tokenEndpoint
            let first = try #require(nonces.nonce(for: tokenEndpoint))

            // Remembered: the API call carries it and needs no retry.
            #expect(try await manager.send(server.api("api/dpop/resource")).1.statusCode == 200)
            #expect(try await server.counters()["dpop_nonce_challenges"] == 1)

            // The server forgets its nonces: the resource answers 401 use_dpop_nonce, one retry.
            try await server.admin("POST", "test/dpop/expire-nonces")
            #expect(try await manager.send(server.api("api/dpop/resource", method: "POST")).1.statusCode == 200)
            #expect(try await server.counters()["dpop_nonce_challenges"] == 2)
            #expect(events.events.contains { $0.kind == .requestRetried && $0.reason == "use_dpop_nonce" })
            #expect(nonces.nonce(for: tokenEndpoint) != first)

            // And at the token endpoint (400 use_dpop_nonce), for a refresh.
            try await server.admin("POST", "test/dpop/expire-nonces")
            _ = try await manager.credentials(minTTL: forceRefresh)
            let counters = try await server.counters()
            #expect(counters["dpop_nonce_challenges"] == 3)
            #expect(counters["refresh_successes"] == 1)
            #expect(counters["api_post"] == 0 && counters["dpop_api_calls"] == 2)
        }

        @Test("a server that asks for a new nonce every time: one retry, then a clear error, and nothing stored changes")
        func nonceLoop_endsAfterOneRetry() async throws {
            let server = try await TestServer.running()
            let vault = try TestVault()
            let configuration = try await server.dpopConfiguration()
            let manager = vault.dpopManager(configuration)
            _ = try await server.signInWithDPoP(manager)
            let stored = try await vault.tokenStore(for: configuration).refreshToken()
            let key = try await vault.dpopKeys.boundKey(for: manager.key)?.jwkThumbprint
            try await server.faults(["dpop_nonce_loop": true])

            #expect(await authErrorCode { _ = try await manager.credentials(minTTL: forceRefresh) } == .proofRejected)
            #expect(try await server.counters()["dpop_nonce_challenges"] == 2)
            do {
                _ = try await manager.send(server.api("api/dpop/resource"))
                Issue.record("a nonce loop at the resource returned an answer")
            } catch {
                #expect(isAuthError(error, .proofRejected, oauthError: "use_dpop_nonce", status: 401), "\(error)")
                #expect("\(error)".contains("use_dpop_nonce"))
            }
            #expect(try await server.counters()["dpop_nonce_challenges"] == 4)

            #expect(try await vault.tokenStore(for: configuration).refreshToken() == stored)
            #expect(try await vault.dpopKeys.boundKey(for: manager.key)?.jwkThumbprint == key)
            #expect(isSignedIn(await manager.state))
            try await server.faults(["dpop_nonce_loop": false])
            _ = try await manager.credentials(minTTL: forceRefresh)
        }

        @Test("garbage and huge DPoP-Nonce headers are not used: a clear error without a retry, the session unchanged")
        func badNonceHeaders_areRefused() async throws {
            let server = try await TestServer.running()
            let vault = try TestVault()
            let configuration = try await server.dpopConfiguration(clientID: Self.nonceClientID)
            let manager = vault.dpopManager(configuration, nonces: DPoPNonces())
            _ = try await server.signInWithDPoP(manager)
            let stored = try await vault.tokenStore(for: configuration).refreshToken()
            let key = try await vault.dpopKeys.boundKey(for: manager.key)?.jwkThumbprint

            for (index, header) in ["not a \"nonce\"", String(repeating: "n", count: 60_000)].enumerated() {
                try await server.admin("POST", "test/dpop/expire-nonces")
                try await server.faults(["dpop_nonce_header": header])
                do {
                    _ = try await manager.credentials(minTTL: forceRefresh)
                    Issue.record("a refresh went on with an unusable nonce")
                } catch {
                    #expect(isAuthError(error, .proofRejected, oauthError: "use_dpop_nonce", status: 400), "\(error)")
                    #expect(!"\(error)".contains(header))
                }
                // A failed re-login leaves the session as it was, too.
                #expect(await authErrorCode { try await server.signInWithDPoP(manager) } == .proofRejected)
                #expect(try await server.counters()["dpop_nonce_challenges"] == 1 + 2 * (index + 1))
            }
            #expect(try await vault.tokenStore(for: configuration).refreshToken() == stored)
            #expect(try await vault.dpopKeys.boundKey(for: manager.key)?.jwkThumbprint == key)
            try await server.faults(["dpop_nonce_header": ""])
            _ = try await manager.credentials(minTTL: forceRefresh)
        }

        @Test("a proof the server rejects (stale iat): a clear error at the token endpoint and the resource, the session unchanged")
        func rejectedProof_isAnErrorAndKeepsTheSession() async throws {
            let server = try await TestServer.running()
            let vault = try TestVault()
            let configuration = try await server.dpopConfiguration()
            let clock = ShiftedClock()
            let manager = vault.dpopManager(configuration, clock: clock)
            _ = try await server.signInWithDPoP(manager)
            let stored = try await vault.tokenStore(for: configuration).refreshToken()

            // Two minutes ahead: the access token is still fresh, the proof's iat is not.
            clock.advance(by: .seconds(120))
            do {
                _ = try await manager.send(server.api("api/dpop/resource"))
                Issue.record("a stale proof was accepted")
            } catch {
                #expect(isAuthError(error, .proofRejected, oauthError: "invalid_dpop_proof", status: 401), "\(error)")
            }
            do {
                _ = try await manager.credentials(minTTL: forceRefresh)
                Issue.record("a stale proof refreshed")
            } catch {
                #expect(isAuthError(error, .proofRejected, oauthError: "invalid_dpop_proof", status: 400), "\(error)")
            }
            #expect(try await server.counters()["dpop_proofs_rejected"] == 2)
            #expect(try await vault.tokenStore(for: configuration).refreshToken() == stored)
            #expect(isSignedIn(await manager.state))
            // The same session with a right clock goes on.
            _ = try await vault.dpopManager(configuration).credentials(minTTL: forceRefresh)
        }

        @Test("a proof sent twice is refused the second time (jti replay)")
        func replayedProof_isRefusedByTheServer() async throws {
            let server = try await TestServer.running()
            let vault = try TestVault()
            let manager = try await vault.dpopManager(server.dpopConfiguration())
            _ = try await server.signInWithDPoP(manager)
            let request = try await manager.authorizedRequest(server.api("api/dpop/resource"))
            #expect(request.value(forHTTPHeaderField: "Authorization")?.hasPrefix("DPoP ") == true)
            #expect(try await httpData(for: request).1.statusCode == 200)
            let (_, replay) = try await httpData(for: request)
            #expect(replay.statusCode == 401)
            #expect(replay.value(forHTTPHeaderField: "WWW-Authenticate")?.contains("invalid_dpop_proof") == true)
            #expect(try await server.counters()["dpop_replays"] == 1)
        }

        @Test("a server that answers a DPoP request with a Bearer token: an error, and no session is stored")
        func bearerAnswer_isAnError() async throws {
            let server = try await TestServer.running()
            let vault = try TestVault()
            let configuration = try await server.dpopConfiguration()
            let manager = vault.dpopManager(configuration)
            try await server.faults(["dpop_answer_bearer": true])
            #expect(await authErrorCode { try await server.signInWithDPoP(manager) } == .invalidResponse)
            #expect(try await vault.tokenStore(for: configuration).hasCredentials() == false)
            #expect(try await vault.dpopKeys.boundKey(for: manager.key) == nil)
        }

        @Test("logout deletes the session's key; a new sign-in replaces the key")
        func logoutAndRelogin_deleteTheKey() async throws {
            let server = try await TestServer.running()
            let vault = try TestVault()
            let manager = try await vault.dpopManager(server.dpopConfiguration())
            _ = try await server.signInWithDPoP(manager)
            let first = try #require(try await vault.dpopKeys.boundKey(for: manager.key)?.jwkThumbprint)
            _ = try await server.signInWithDPoP(manager)
            let second = try #require(try await vault.dpopKeys.boundKey(for: manager.key)?.jwkThumbprint)
            #expect(first != second)
            #expect(try vault.sessionKeys(manager.key).count == 1)
            #expect(try await manager.send(server.api("api/dpop/resource")).1.statusCode == 200)

            try await manager.logout()
            #expect(try await vault.dpopKeys.boundKey(for: manager.key) == nil)
            #expect(try vault.sessionKeys(manager.key).isEmpty)
        }

        @Test("a sign-in that does not finish: its new key is discarded, the session's bound key never")
        func stoppedSignIn_discardsItsKeyOnly() async throws {
            let server = try await TestServer.running()
            let vault = try TestVault()
            let manager = try await vault.dpopManager(server.dpopConfiguration())
            _ = try await server.signInWithDPoP(manager)
            let bound = try #require(try await vault.dpopKeys.boundKey(for: manager.key)?.jwkThumbprint)

            // A second sign-in made its key, then stopped (cancelled, denied, expired).
            let stopped = try #require(try await manager.signInProofs())
            #expect(try vault.sessionKeys(manager.key).count == 2)
            try await manager.discardSignInProofs(stopped)
            #expect(try vault.sessionKeys(manager.key).count == 1)
            #expect(try await vault.dpopKeys.boundKey(for: manager.key)?.jwkThumbprint == bound)
            // Twice, or nil: nothing more to do.
            try await manager.discardSignInProofs(stopped)
            try await manager.discardSignInProofs(nil)

            // The bound key's own proofs are never discarded: the session keeps signing.
            let boundKey = try #require(try await vault.dpopKeys.boundKey(for: manager.key))
            try await manager.discardSignInProofs(DPoPProofFactory(key: boundKey))
            #expect(try vault.sessionKeys(manager.key).count == 1)
            #expect(try await manager.send(server.api("api/dpop/resource")).1.statusCode == 200)

            // Locked: an error, and the key stays for the next sign-in or sign-out.
            let another = try #require(try await manager.signInProofs())
            vault.vault.lockAll()
            #expect(await authErrorCode { try await manager.discardSignInProofs(another) } == .storeLocked)
            try vault.vault.unlock(passphrase: TestVault.passphrase)
            #expect(try vault.sessionKeys(manager.key).count == 2)
            try await manager.logout()
            #expect(try vault.sessionKeys(manager.key).isEmpty)
        }

        @Test("another process signs in again with a new key: this manager's next refresh reads the new key")
        func signInElsewhere_isFollowedByTheNextRefresh() async throws {
            let server = try await TestServer.running()
            let vault = try TestVault()
            let configuration = try await server.dpopConfiguration()
            let first = vault.dpopManager(configuration)
            _ = try await server.signInWithDPoP(first)
            #expect(try await first.send(server.api("api/dpop/resource")).1.statusCode == 200)
            let other = vault.dpopManager(configuration)
            _ = try await server.signInWithDPoP(other)

            let refreshed = try await first.credentials(minTTL: forceRefresh)
            #expect(refreshed.tokenType == "DPoP")
            #expect(try await first.send(server.api("api/dpop/resource")).1.statusCode == 200)
            let bound = try #require(try await vault.dpopKeys.boundKey(for: first.key)?.jwkThumbprint)
            #expect(try await server.boundThumbprints().contains(bound))
            #expect(try vault.sessionKeys(first.key).count == 1)
        }

        @Test("canary tokens and proofs appear in no description, error or event")
        func canaries_appearNowhere() async throws {
            let server = try await TestServer.running()
            let vault = try TestVault()
            let events = EventRecorder()
            let configuration = try await server.dpopConfiguration()
            let clock = ShiftedClock()
            let manager = vault.dpopManager(configuration, events: events, clock: clock)
            let canaryAccess = makeCanary("dpop-access")
            let canaryRefresh = makeCanary("dpop-refresh")
            try await server.faults(["canary_access_token": canaryAccess, "canary_refresh_token": canaryRefresh])
            let tokens = try await server.signInWithDPoP(manager)
            #expect(tokens.accessToken == SecretBytes(utf8: canaryAccess))
            var texts = ["\(tokens)", String(reflecting: tokens)]
            let request = try await manager.authorizedRequest(server.api("api/dpop/resource"))
            let proof = try #require(request.value(forHTTPHeaderField: "DPoP"))
            let credentials = try await manager.credentials()
            texts += ["\(credentials)", String(reflecting: credentials), "\(await manager.state)"]
            if let proofs = try await manager.signInProofs() {
                texts += ["\(proofs)", String(reflecting: proofs)]
            }
            clock.advance(by: .seconds(120))
            let attempts: [() async throws -> Void] = [
                { _ = try await manager.send(server.api("api/dpop/resource")) }, { _ = try await manager.credentials(minTTL: forceRefresh) },
            ]
            for attempt in attempts {
                do {
                    try await attempt()
                    Issue.record("a stale proof was accepted")
                } catch {
                    texts += ["\(error)", String(reflecting: error)]
                }
            }
            texts += events.events.map(\.description) + events.events.map { String(reflecting: $0) }
            #expect(texts.count > 8)
            for text in texts {
                #expect(!text.contains(canaryAccess) && !text.contains(canaryRefresh) && !text.contains(proof), "\(text)")
                #expect(!text.contains(String(proof.split(separator: ".")[2])))
            }
        }
    }
}

/// A test's own request, outside Lockbox: the body and the HTTP response.
func httpData(for request: URLRequest) async throws -> (Data, HTTPURLResponse) {
    let (data, response) = try await URLSession.shared.data(for: request)
    return (data, try #require(response as? HTTPURLResponse))
}

/// The code of the ``AuthError`` `body` throws; nil when it succeeds or throws something else.
func authErrorCode(_ body: () async throws -> Void) async -> AuthError.Code? {
    do {
        try await body()
        return nil
    } catch {
        return (error as? AuthError)?.code
    }
}

extension TestServer {
    func dpopConfiguration(clientID: String = TestServer.clientID) async throws -> ClientConfiguration {
        var configuration = try await configuration(clientID: clientID)
        configuration.usesDPoP = true
        return configuration
    }

    /// The authorization code flow with the manager's new proofs, playing the browser.
    @discardableResult
    func signInWithDPoP(_ manager: CredentialsManager) async throws -> TokenResponse {
        let session = try AuthorizationCodeFlow(configuration: manager.configuration, dpop: try await manager.signInProofs()).start()
        async let browser: Void = {
            _ = try? await URLSession.shared.data(from: session.authorizationURL)
        }()
        let tokens: TokenResponse
        do {
            tokens = try await session.waitForTokens(timeout: .seconds(20))
        } catch {
            await browser
            throw error
        }
        await browser
        try await manager.signIn(with: tokens)
        return tokens
    }

    /// The distinct `jkt` of the tokens the server issued.
    func boundThumbprints() async throws -> Set<String> {
        let bindings = try await admin("GET", "test/dpop/bindings") as? [[String: Any]] ?? []
        return Set(bindings.compactMap { $0["jkt"] as? String })
    }
}

extension TestVault {
    var dpopKeys: ManagedDPoPKeyStore { ManagedDPoPKeyStore(keys: SoftwareKeyStore(vault: vault)) }

    func dpopManager(
        _ configuration: ClientConfiguration, events: EventRecorder = EventRecorder(), nonces: DPoPNonces = DPoPNonces(),
        clock: ShiftedClock = ShiftedClock()
    ) -> CredentialsManager {
        CredentialsManager(
            configuration: configuration, tokenStore: tokenStore(for: configuration), lockDirectory: lockDirectory,
            outbox: RevocationOutbox(store: vault, events: events.record), dpopKeys: dpopKeys, nonces: nonces, now: clock.now,
            events: events.record)
    }

    /// Every DPoP key made for `session`, bound or not.
    func sessionKeys(_ session: CredentialKey) throws -> [ManagedKey] {
        try SoftwareKeyStore(vault: vault).keys(applicationTag: ManagedProofSigningKey.applicationTag, label: session.storageAccount)
    }
}

extension SecretBytes {
    /// The bytes as text, for a test's own request.
    var temporaryText: String { withUnsafeBytes { String(decoding: $0, as: UTF8.self) } }
}
