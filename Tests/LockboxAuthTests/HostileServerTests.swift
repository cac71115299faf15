import Foundation
#if canImport(FoundationNetworking)
import FoundationNetworking
#endif
import Lockbox
import LockboxAuth
import LockboxTestSupport
import Testing

/// A hostile or broken authorization server (issue: OAuth input hardening): each test plays the
/// server through a fault switch of the real test server and expects a clear, closed failure.
extension LifecycleTests {
    // MARK: A total deadline on every request

    @Test(.timeLimit(.minutes(1)))
    func tricklingTokenEndpoint_failsAtTheRequestDeadline_andKeepsCredentials() async throws {
        let server = try await TestServer.running()
        let vault = try TestVault()
        var configuration = try await server.configuration()
        configuration.requestLimits = RequestLimits(deadline: .seconds(2))
        let manager = vault.manager(configuration)
        _ = try await server.signIn(manager)
        // One byte a second, for an hour: the 30 s idle timeout never fires.
        try await server.faults(["token_trickle": 1.0])
        let clock = ContinuousClock()
        let start = clock.now

        await #expect {
            try await manager.credentials(minTTL: forceRefresh)
        } throws: { error in
            isAuthError(error, .network) && (error as? AuthError)?.urlErrorCode == URLError.timedOut.rawValue
        }

        let elapsed = start.duration(to: clock.now)
        #expect(elapsed >= .seconds(2) && elapsed < .seconds(10), "the refresh took \(elapsed)")
        #expect(try await server.counters()["trickled_responses"] == 1)
        #expect(isSignedIn(await manager.state))
        #expect(try await vault.tokenStore(for: configuration).hasCredentials())
        // The token was never consumed, and the cross-process lock is free: another process
        // refreshes with it once the server behaves.
        try await server.faults(["token_trickle": 0])
        let worker = try await Worker.run(vault: vault, server: server, ["refresh"])
        #expect(worker["outcome"] as? String == "ok", "worker: \(worker)")
        #expect(try await server.counters()["reuse_detections"] == 0)
    }

    @Test(.timeLimit(.minutes(1)))
    func tricklingTokenEndpoint_lockboxTokenExits1AtTheStoredDeadline() async throws {
        let server = try await TestServer.running()
        let vault = try TestVault()
        var configuration = try await server.configuration()
        configuration.requestLimits = RequestLimits(deadline: .seconds(2))
        // The configuration, with its limits, is stored with the session: `lockbox token` uses it.
        _ = try await server.signIn(vault.manager(configuration))
        try await server.faults(["token_trickle": 1.0])
        let clock = ContinuousClock()
        let start = clock.now

        let token = try run(builtProduct("lockbox"), ["--keychain", vault.vault.path, "token"], timeout: 40)

        let elapsed = start.duration(to: clock.now)
        #expect(token.status == 1, "token: \(token.standardError)")
        #expect(token.standardOutput.isEmpty)
        #expect(elapsed < .seconds(15), "lockbox token took \(elapsed)")
        try await server.faults(["token_trickle": 0])
    }

    // MARK: Redirects

    @Test func discoveryRedirectedFromHTTPSToHTTP_isRefusedWithoutContactingTheHTTPServer() async throws {
        let server = try await TestServer.running()
        // The plain-HTTP document names this issuer and https endpoints, as an attacker's would.
        let issuer = server.url.appendingPathComponent("redirect-to-http")

        await #expect {
            try await AuthorizationServerMetadata.discover(issuer: issuer)
        } throws: { isAuthError($0, .redirectRefused, status: 302) }

        #expect(try await server.counters()["plain_http_requests"] == 0)
    }

    @Test func discoveryRedirectedWithinHTTPS_isFollowed() async throws {
        let server = try await TestServer.running()
        let issuer = server.url.appendingPathComponent("redirect-to-https")

        let metadata = try await AuthorizationServerMetadata.discover(issuer: issuer)

        #expect(metadata.issuer == issuer)
        #expect(metadata.tokenEndpoint == server.url.appendingPathComponent("token"))
    }

    @Test func tokenEndpointRedirect_isNotFollowed_andTheGrantIsNotResent() async throws {
        let server = try await TestServer.running()
        let vault = try TestVault()
        let manager = vault.manager(try await server.configuration())
        _ = try await server.signIn(manager)
        try await server.faults(["token_redirect": 1])

        await #expect {
            try await manager.credentials(minTTL: forceRefresh)
        } throws: { isAuthError($0, .redirectRefused, status: 307) }

        let counters = try await server.counters()
        #expect(counters["token_redirects"] == 1)
        #expect(counters["redirected_token_requests"] == 0)
        #expect(isSignedIn(await manager.state))
        _ = try await manager.credentials(minTTL: forceRefresh)
        #expect(try await server.counters()["reuse_detections"] == 0)
    }

    // MARK: Bounded answers

    @Test(.timeLimit(.minutes(1)))
    func hugeAccessToken_isRefusedWithoutBufferingIt_andCredentialsAreKept() async throws {
        let server = try await TestServer.running()
        let vault = try TestVault()
        let manager = vault.manager(try await server.configuration())
        _ = try await server.signIn(manager)
        // 200 MB, streamed without a Content-Length: only reading can tell its size.
        try await server.faults(["token_huge_access_token": 200_000_000])
        let before = try PeakMemory.resetAndRead()

        await #expect {
            try await manager.credentials(minTTL: forceRefresh)
        } throws: { isAuthError($0, .responseTooLarge) }

        // Buffering the answer would have raised the peak by 200 MB or more (660 MB was seen).
        // The peak is the whole test process's, with other suites running beside this one (70
        // MiB of growth was seen on a fresh machine): the bound leaves them room and still
        // catches a buffered answer.
        let growth = try PeakMemory.read() - before
        #expect(growth < 128 << 20, "the peak resident size grew by \(growth >> 20) MiB")
        #expect(try await server.counters()["huge_bytes_sent"]! > 1 << 20)
        #expect(isSignedIn(await manager.state))
        #expect(try await vault.tokenStore(for: manager.configuration).hasCredentials())
        _ = try await manager.credentials(minTTL: forceRefresh)
        #expect(try await server.counters()["reuse_detections"] == 0)
    }

    // MARK: What the terminal shows

    @Test func userCodeWithEscapeSequences_isRefused() async throws {
        let server = try await TestServer.running()
        let flow = DeviceAuthorizationFlow(configuration: try await server.configuration())
        for code in ["\u{1B}]0;owned\u{07}ABCD-EFGH", "ABCD\u{1B}[2J", "AB\u{202E}CD", "ABCD\nEFGH"] {
            try await server.faults(["device_user_code": code])
            await #expect {
                try await flow.start()
            } throws: { isAuthError($0, .invalidResponse) }
        }
    }

    @Test func verificationURIThatIsNotHTTPS_isRefused() async throws {
        let server = try await TestServer.running()
        let flow = DeviceAuthorizationFlow(configuration: try await server.configuration())
        let hostile = ["javascript:alert(1)", "http://127.0.0.1/device", "http://example.com/device", "data:text/html,hi", "https:///no-host"]
        for uri in hostile {
            try await server.faults(["device_verification_uri": uri])
            await #expect {
                try await flow.start()
            } throws: { isAuthError($0, .invalidResponse) }
            try await server.faults(["device_verification_uri": ""])
        }
        for uri in hostile {
            try await server.faults(["device_verification_uri_complete": uri])
            await #expect {
                try await flow.start()
            } throws: { isAuthError($0, .invalidResponse) }
            try await server.faults(["device_verification_uri_complete": ""])
        }
        // The server's own answer passes.
        let authorization = try await flow.start()
        #expect(authorization.verificationURI.scheme == "https")
    }

    @Test(.timeLimit(.minutes(1)))
    func lockboxLogin_withEscapeSequencesInUserCode_printsNoEscapeAndExits1() async throws {
        let server = try await TestServer.running()
        let vault = try TestVault()
        try await server.faults(["device_user_code": "\u{1B}]0;owned\u{07}\u{1B}[2JABCD"])

        let login = try run(
            builtProduct("lockbox"),
            ["--keychain", vault.vault.path, "login", "--issuer", server.url.absoluteString, "--client-id", TestServer.clientID],
            timeout: 40)

        #expect(login.status == 1, "login: \(login.standardError)")
        #expect(!login.standardErrorBytes.contains(0x1B))
        #expect(!login.standardOutputBytes.contains(0x1B))
        #expect(!login.standardErrorBytes.contains(0x07))
    }

    // MARK: A rotated refresh token the store cannot keep

    @Test func rotatedRefreshTokenTooLargeToStore_endsTheSessionAndClearsTheConsumedToken() async throws {
        let server = try await TestServer.running()
        let vault = try TestVault()
        let events = EventRecorder()
        let configuration = try await server.configuration()
        let manager = vault.manager(configuration, events: events)
        _ = try await server.signIn(manager)
        // 100 KB: under the 1 MiB answer limit, over the vault's 64 KiB value limit.
        try await server.faults(["canary_refresh_token": String(repeating: "R", count: 100_000)])

        await #expect {
            try await manager.credentials(minTTL: forceRefresh)
        } throws: { error in
            isAuthError(error, .signedOut, reason: .rotatedTokenNotStored) && (error as? AuthError)?.storeError?.code == .param
        }

        #expect(await manager.state == .signedOut(.rotatedTokenNotStored))
        #expect(try await vault.tokenStore(for: configuration).hasCredentials() == false)
        // The token the store refused was revoked at the server.
        #expect(try await server.counters()["revocations"] == 1)
        #expect(events.count(.rotationNotPersisted) == 1)
        // No loop: the next call fails at once without another refresh.
        let refreshes = try await server.counters()["refresh_requests"]
        await #expect {
            try await manager.credentials(minTTL: forceRefresh)
        } throws: { isAuthError($0, .signedOut) }
        #expect(try await server.counters()["refresh_requests"] == refreshes)
    }

    @Test func rotatedRefreshTokenTooLargeToStore_lockboxTokenExits1AndPrintsNoToken() async throws {
        let server = try await TestServer.running()
        let vault = try TestVault()
        _ = try await server.signIn(vault.manager(try await server.configuration()))
        try await server.faults(["canary_refresh_token": String(repeating: "R", count: 100_000)])
        let binary = builtProduct("lockbox")

        let token = try run(binary, ["--keychain", vault.vault.path, "token"], timeout: 40)

        #expect(token.status == 1, "token: \(token.standardError)")
        #expect(token.standardOutput.isEmpty)
        let status = try run(binary, ["--keychain", vault.vault.path, "auth", "status"], timeout: 40)
        #expect(status.standardOutput.contains("Not signed in"))
        #expect(try await server.counters()["reuse_detections"] == 0)
    }
}

@Suite("Text for the terminal")
struct TerminalTextTests {
    @Test func sanitized_replacesControlFormatAndSeparatorCharacters() {
        #expect(TerminalText.sanitized("a\u{1B}[2Jb\u{07}c\u{9B}d\u{202E}e\u{200B}f\u{2028}g\nh") == "a\u{FFFD}[2Jb\u{FFFD}c\u{FFFD}d\u{FFFD}e\u{FFFD}f\u{FFFD}g\u{FFFD}h")
        #expect(TerminalText.sanitized("ABCD-EFGH é 日本") == "ABCD-EFGH é 日本")
    }

    @Test func isPrintable_isFalseForAnyEscapeOrControl() {
        #expect(TerminalText.isPrintable("WDJB-MJHT"))
        #expect(!TerminalText.isPrintable("WDJB\u{1B}MJHT"))
        #expect(!TerminalText.isPrintable("WDJB\u{7F}"))
        #expect(!TerminalText.isPrintable("\u{9B}31m"))
    }
}

/// This process's peak resident size (`VmHWM`), which Linux resets on request.
enum PeakMemory {
    /// Resets the peak to the current resident size, then reads it.
    static func resetAndRead() throws -> Int {
        // "5" resets the peak resident size (proc(5), /proc/pid/clear_refs).
        try "5".write(toFile: "/proc/self/clear_refs", atomically: false, encoding: .utf8)
        return try read()
    }

    static func read() throws -> Int {
        let status = try String(contentsOfFile: "/proc/self/status", encoding: .utf8)
        guard let line = status.split(separator: "\n").first(where: { $0.hasPrefix("VmHWM:") }),
            let kilobytes = Int(line.split(separator: " ", omittingEmptySubsequences: true).dropFirst().first ?? "")
        else {
            throw MissingPeer(description: "/proc/self/status has no VmHWM line")
        }
        return kilobytes * 1024
    }
}

@Suite("Request limits and redirect rules")
struct RequestLimitsTests {
    @Test func storedConfigurationWithoutLimits_decodesWithTheDefaults() throws {
        // What ItemStoreTokenStore stored before the limits existed.
        let stored = #"{"issuer":"https:\/\/auth.example.com","clientID":"cli","tokenEndpoint":"https:\/\/auth.example.com\/token","scope":["api"]}"#
        let configuration = try JSONDecoder().decode(ClientConfiguration.self, from: Data(stored.utf8))
        #expect(configuration.requestLimits == RequestLimits())
        #expect(configuration.requestLimits.deadline == .seconds(30))
        #expect(configuration.requestLimits.maximumResponseSize == 1 << 20)
    }

    @Test func configurationWithLimits_roundTripsThroughJSON() throws {
        var configuration = ClientConfiguration(
            issuer: URL(string: "https://auth.example.com")!, clientID: "cli", tokenEndpoint: URL(string: "https://auth.example.com/token")!)
        configuration.requestLimits = RequestLimits(deadline: .milliseconds(2500), maximumResponseSize: 4096)
        let decoded = try JSONDecoder().decode(ClientConfiguration.self, from: JSONEncoder().encode(configuration))
        #expect(decoded == configuration)
    }

    @Test func storedLimitsThatAreNotPositive_areRefused() {
        let stored = #"{"deadlineMilliseconds":0,"maximumResponseSize":10}"#
        #expect(throws: DecodingError.self) { try JSONDecoder().decode(RequestLimits.self, from: Data(stored.utf8)) }
    }

    @Test func redirectPolicies_neverAllowHTTPSToHTTP() {
        let https = URL(string: "https://auth.example.com/a")!
        for policy in [RedirectPolicy.refuse, .httpsOnly, .sameOrigin] {
            #expect(!policy.allows(from: https, to: URL(string: "http://auth.example.com/a")!), "\(policy)")
        }
        #expect(!RedirectPolicy.refuse.allows(from: https, to: URL(string: "https://auth.example.com/b")!))
        #expect(RedirectPolicy.httpsOnly.allows(from: https, to: URL(string: "https://other.example.com/b")!))
        #expect(RedirectPolicy.sameOrigin.allows(from: https, to: URL(string: "https://auth.example.com/b")!))
        #expect(!RedirectPolicy.sameOrigin.allows(from: https, to: URL(string: "https://other.example.com/a")!))
        #expect(!RedirectPolicy.sameOrigin.allows(from: https, to: URL(string: "https://auth.example.com:8443/a")!))
    }
}
