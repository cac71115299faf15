import Foundation
#if canImport(FoundationNetworking)
import FoundationNetworking
#endif
import Glibc
import KeyProviders
import Lockbox
import LockboxAuth
import LockboxAuthKeyring
import LockboxTestSupport
import Synchronization
import Testing

extension LifecycleTests {
/// The access-token cache in the kernel keyring, through the library and the built binaries.
@Suite("Shared access-token cache, the OAuth CLI's waiting and messages")
struct SharedTokenCacheTests {
    /// A manager sharing its tokens in the kernel keyring under the vault's lock directory,
    /// the namespace the CLI uses.
    static func manager(_ vault: TestVault, _ configuration: ClientConfiguration, events: EventRecorder = EventRecorder()) throws
        -> CredentialsManager
    {
        CredentialsManager(
            configuration: configuration, tokenStore: vault.tokenStore(for: configuration), lockDirectory: vault.lockDirectory,
            outbox: RevocationOutbox(store: vault.vault, events: events.record),
            accessTokenCache: try KernelKeyringTokenCache(namespace: vault.lockDirectory), events: events.record)
    }

    static func cachedEntry(_ vault: TestVault, _ configuration: ClientConfiguration) throws -> AccessTokenKeyring.Entry? {
        try AccessTokenKeyring.read(namespace: vault.lockDirectory, identity: CredentialKey(configuration: configuration).storageAccount)
    }

    /// Removes the test's entry: the user's key quota is small (200 keys), and entries otherwise
    /// stay until their timeout.
    static func forget(_ vault: TestVault, _ configuration: ClientConfiguration) {
        try? AccessTokenKeyring.remove(namespace: vault.lockDirectory, identity: CredentialKey(configuration: configuration).storageAccount)
    }

    /// `lockbox` alone in a directory: no `lockbox-oauth` beside it, so it can only answer
    /// from the cache (no HTTP stack at all).
    static func loneLockbox(in directory: TemporaryDirectory) throws -> String {
        let path = directory.path + "/lone/lockbox"
        try FileManager.default.createDirectory(atPath: directory.path + "/lone", withIntermediateDirectories: true)
        try FileManager.default.copyItem(atPath: builtProduct("lockbox"), toPath: path)
        return path
    }

    @Test func cachedToken_isPrintedByLockboxAlone_withoutRefresh_andGoneAfterLogout() async throws {
        let server = try await TestServer.running()
        let vault = try TestVault()
        let configuration = try await server.configuration()
        let manager = try Self.manager(vault, configuration)
        let tokens = try await server.signIn(manager)
        let accessToken = tokens.accessToken.withUnsafeBytes { String(decoding: $0, as: UTF8.self) }
        let entry = try #require(try Self.cachedEntry(vault, configuration), "sign-in shares the access token")
        #expect(entry.token == tokens.accessToken)
        #expect(entry.scope == "api")
        let before = try await server.counters()

        let lone = try Self.loneLockbox(in: vault.directory)
        let cached = try run(lone, ["--keychain", vault.vault.path, "token"])
        #expect(cached.status == 0, "lockbox token from the cache: \(cached.standardError)")
        #expect(cached.standardOutput == accessToken + "\n")
        let full = try run(builtProduct("lockbox"), ["--keychain", vault.vault.path, "token"])
        #expect(full.standardOutput == accessToken + "\n")
        #expect(try await server.counters()["refresh_requests"] == before["refresh_requests"])

        let status = try run(builtProduct("lockbox"), ["--keychain", vault.vault.path, "auth", "status"])
        #expect(status.standardOutput.contains("granted: api"), "auth status: \(status.standardOutput)")
        #expect(status.standardOutput.contains("expires at"))
        #expect(status.standardOutput.contains("subject: not known"))
        #expect(status.standardOutput.contains("no refresh seen yet"))
        #expect(!status.standardOutput.contains(accessToken))
        // After a refresh, the stored session says the server rotates.
        _ = try await manager.credentials(minTTL: forceRefresh)
        let refreshed = try run(builtProduct("lockbox"), ["--keychain", vault.vault.path, "auth", "status", "--json"])
        #expect(refreshed.standardOutput.contains(#""refreshTokenRotates" : true"#), "auth status: \(refreshed.standardOutput)")

        let logout = try run(builtProduct("lockbox"), ["--keychain", vault.vault.path, "logout"])
        #expect(logout.status == 0, "logout: \(logout.standardError)")
        #expect(try Self.cachedEntry(vault, configuration) == nil)
        let afterLogout = try run(lone, ["--keychain", vault.vault.path, "token"])
        #expect(afterLogout.status == 1)
        #expect(afterLogout.standardOutput.isEmpty)
    }

    /// The cache outlives `lockbox lock --all`: a new process's manager must not hand out the
    /// cached token while the refresh token cannot be read (the store says locked, and the
    /// session is kept), nor after the session was removed from the store behind the cache.
    @Test func lockedKeychain_orSessionRemovedFromTheStore_getsNoCachedToken() async throws {
        let server = try await TestServer.running()
        let vault = try TestVault()
        let configuration = try await server.configuration()
        let tokens = try await server.signIn(try Self.manager(vault, configuration))
        #expect(try Self.cachedEntry(vault, configuration) != nil)

        vault.vault.lockAll()
        await #expect {
            try await Self.manager(vault, configuration).credentials()
        } throws: { isAuthError($0, .storeLocked) }
        #expect(try Self.cachedEntry(vault, configuration) != nil, "a locked store keeps the session and its cache")
        let lone = try Self.loneLockbox(in: vault.directory)
        let locked = try run(lone, ["--keychain", vault.vault.path, "token"])
        #expect(locked.status == 1 && locked.standardOutput.isEmpty, "lockbox token while locked: \(locked.standardOutput)")

        try vault.vault.unlock(passphrase: TestVault.passphrase)
        let before = try await server.counters()
        #expect(try await Self.manager(vault, configuration).credentials().accessToken == tokens.accessToken)
        #expect(try await server.counters()["refresh_requests"] == before["refresh_requests"])

        try await vault.tokenStore(for: configuration).clearCredentials()
        await #expect {
            try await Self.manager(vault, configuration).credentials()
        } throws: { isAuthError($0, .signedOut) }
        #expect(try Self.cachedEntry(vault, configuration) == nil)
        Self.forget(vault, configuration)
    }

    /// One identity (issuer, client, account) signed in twice, in the vault and in the desktop
    /// keyring (maybe as different users of the server): `lockbox --backend secret-service token`
    /// must answer with the desktop keyring's session, never from the vault session's cache entry.
    @Test func desktopKeyringSession_neverAnswersWithTheVaultSessionsCachedToken() async throws {
        let bus = ProcessInfo.processInfo.environment["DBUS_SESSION_BUS_ADDRESS"] ?? ""
        try #require(!bus.isEmpty, "No D-Bus session bus: run the tests inside `scripts/secret-service run -- swift test ...`")
        let server = try await TestServer.running()
        let vault = try TestVault()
        let configuration = try await server.configuration()
        let vaultTokens = try await server.signIn(try Self.manager(vault, configuration))
        let vaultToken = vaultTokens.accessToken.withUnsafeBytes { String(decoding: $0, as: UTF8.self) }

        let desktop = try Keychain.open(Keychain.Options(backend: .secretService, path: vault.vault.path)).store
        let desktopStore = ItemStoreTokenStore(store: desktop, key: CredentialKey(configuration: configuration), configuration: configuration)
        defer { try? desktopStore.clearCredentials() }
        _ = try await server.signIn(CredentialsManager(configuration: configuration, tokenStore: desktopStore, lockDirectory: vault.lockDirectory))

        let viaDesktop = try run(builtProduct("lockbox"), ["--keychain", vault.vault.path, "--backend", "secret-service", "token"], timeout: 60)
        #expect(viaDesktop.status == 0, "lockbox --backend secret-service token: \(viaDesktop.standardError)")
        #expect(!viaDesktop.standardOutput.isEmpty)
        #expect(viaDesktop.standardOutput != vaultToken + "\n", "the desktop keyring's session answered with the vault session's token")
        let viaVault = try run(builtProduct("lockbox"), ["--keychain", vault.vault.path, "token"])
        #expect(viaVault.standardOutput == vaultToken + "\n")
        #expect(viaVault.standardOutput != viaDesktop.standardOutput)
        Self.forget(vault, configuration)
        try? AccessTokenKeyring.remove(
            namespace: vault.lockDirectory + "\u{0}secret-service", identity: CredentialKey(configuration: configuration).storageAccount)
    }

    /// Where the kernel keyring does not exist (a seccomp profile forbids `keyctl`), the shared
    /// cache cannot be used: `lockbox token` says so and names the switch that turns it off,
    /// never silently doing without; with the switch, the token comes from the store as before.
    /// The session is in the desktop keyring, which needs no kernel keyring.
    @Test func withoutAKernelKeyring_theCacheFailsNamingTheSwitch_andTheSwitchWorks() async throws {
        let bus = ProcessInfo.processInfo.environment["DBUS_SESSION_BUS_ADDRESS"] ?? ""
        try #require(!bus.isEmpty, "No D-Bus session bus: run the tests inside `scripts/secret-service run -- swift test ...`")
        let server = try await TestServer.running()
        let vault = try TestVault()
        let configuration = try await server.configuration()
        let desktop = try Keychain.open(Keychain.Options(backend: .secretService, path: vault.vault.path)).store
        let desktopStore = ItemStoreTokenStore(store: desktop, key: CredentialKey(configuration: configuration), configuration: configuration)
        defer { try? desktopStore.clearCredentials() }
        _ = try await server.signIn(CredentialsManager(configuration: configuration, tokenStore: desktopStore, lockDirectory: vault.lockDirectory))

        let wrapper = NoKernelKeyring.wrapper(in: vault.directory.path)
        let arguments = [wrapper, builtProduct("lockbox"), "--keychain", vault.vault.path, "--backend", "secret-service", "token"]
        let refused = try run("/usr/bin/python3", arguments, timeout: 60)
        #expect(refused.status != 0)
        #expect(refused.standardOutput.isEmpty, "nothing printed without the cache the command was asked to use")
        #expect(refused.standardError.contains("LOCKBOX_ACCESS_TOKEN_CACHE=off"), "\(refused.standardError)")

        var environment = ProcessInfo.processInfo.environment
        environment["LOCKBOX_ACCESS_TOKEN_CACHE"] = "off"
        let uncached = try run("/usr/bin/python3", arguments, environment: environment, timeout: 60)
        #expect(uncached.status == 0, "with LOCKBOX_ACCESS_TOKEN_CACHE=off: \(uncached.standardError)")
        #expect(!uncached.standardOutput.isEmpty)
    }

    /// Entries planted under a session's description (garbage, truncated, lengths past the end,
    /// an empty token, a valid entry for another identity, a stale one): `lockbox token` answers
    /// none of them, crashes on none, and prints nothing planted.
    @Test func plantedCacheEntries_areNeverServed_andNeverCrashTheFastPath() async throws {
        let server = try await TestServer.running()
        let vault = try TestVault()
        let configuration = try await server.configuration()
        let identity = CredentialKey(configuration: configuration).storageAccount
        try await vault.tokenStore(for: configuration).saveRefreshToken(SecretBytes(utf8: "not-a-real-refresh-token"))
        let description = AccessTokenKeyring.description(namespace: vault.lockDirectory, identity: identity)
        let lone = try Self.loneLockbox(in: vault.directory)
        let planted = "PLANTED-" + UUID().uuidString
        let future = Int64((Date().timeIntervalSince1970 + 3600) * 1000)

        func entry(identity: String, fresh: Int64 = future, token: String = planted) throws -> [UInt8] {
            let other = AccessTokenKeyring.Entry(
                token: SecretBytes(utf8: token), tokenType: "Bearer", expiresAtMilliseconds: future, freshUntilMilliseconds: fresh,
                scope: "api", identity: identity)
            try AccessTokenKeyring.store(other, namespace: vault.lockDirectory + "/planted", timeout: 60)
            defer { try? AccessTokenKeyring.remove(namespace: vault.lockDirectory + "/planted", identity: identity) }
            let serial = try KernelKeyring.find(AccessTokenKeyring.description(namespace: vault.lockDirectory + "/planted", identity: identity))
            return try KernelKeyring.read(serial).withUnsafeBytes { Array($0) }
        }
        let valid = try entry(identity: identity)
        var payloads: [[UInt8]] = [[1], [2] + valid.dropFirst(), Array(valid.prefix(20)), [1] + [UInt8](repeating: 0xff, count: 40)]
        payloads.append(try entry(identity: identity + "x"))
        payloads.append(try entry(identity: identity, fresh: future - 7_200_000))
        payloads.append(Array(valid.prefix(valid.count - planted.utf8.count)))
        for (index, payload) in payloads.enumerated() {
            _ = try KernelKeyring.store(SecretBytes(copying: payload), description: description, timeout: 60)
            let result = try run(lone, ["--keychain", vault.vault.path, "token"])
            #expect(result.status == 1, "planted payload \(index): status \(result.status), \(result.standardError)")
            #expect(result.standardOutput.isEmpty, "planted payload \(index) was served")
            #expect(!result.standardError.contains(planted))
        }
        // The real entry, for contrast, is served.
        _ = try KernelKeyring.store(SecretBytes(copying: valid), description: description, timeout: 60)
        #expect(try run(lone, ["--keychain", vault.vault.path, "token"]).standardOutput == planted + "\n")
        Self.forget(vault, configuration)
    }

    /// An access token is 1*VSCHAR (RFC 6749, appendix A.12). One holding a terminal escape or
    /// CR LF would be printed by `lockbox token` into a terminal, shared in the cache, and sent
    /// in an Authorization header: the response is refused instead.
    @Test func accessTokenWithControlCharacters_isRefused_andNeverPrinted() async throws {
        let server = try await TestServer.running()
        let vault = try TestVault()
        let configuration = try await server.configuration()
        _ = try await server.signIn(try Self.manager(vault, configuration))
        Self.forget(vault, configuration)
        try await server.faults(["canary_access_token": "evil\u{1b}]0;pwned\u{07}\r\nX-Injected: 1"])

        let token = try run(builtProduct("lockbox"), ["--keychain", vault.vault.path, "token"], timeout: 60)
        #expect(token.status == 1, "lockbox token: status \(token.status)")
        #expect(token.standardOutput.isEmpty, "printed: \(token.standardOutput.debugDescription)")
        #expect(!token.standardError.contains("\u{1b}") && !token.standardError.contains("X-Injected"))
        #expect(token.standardError.contains("(invalid_response"), "\(token.standardError)")
        #expect(try Self.cachedEntry(vault, configuration) == nil)
    }

    @Test func invalidGrant_removesTheCachedToken() async throws {
        let server = try await TestServer.running()
        let vault = try TestVault()
        let configuration = try await server.configuration()
        let manager = try Self.manager(vault, configuration)
        let tokens = try await server.signIn(manager)
        #expect(try Self.cachedEntry(vault, configuration) != nil)
        // The grant is revoked behind the manager's back: the next refresh gets invalid_grant.
        #expect(try await Self.post(configuration.revocationEndpoint!, "token_type_hint=refresh_token", tokens.refreshToken!).0 == 200)
        await #expect {
            try await manager.credentials(minTTL: forceRefresh)
        } throws: { isAuthError($0, .signedOut, reason: .refreshTokenRejected) }
        #expect(try Self.cachedEntry(vault, configuration) == nil)
    }

    @Test func rebootedKeyring_losesTheToken_andTheNextCallRefreshesOnce() async throws {
        let server = try await TestServer.running()
        let vault = try TestVault()
        let configuration = try await server.configuration()
        let tokens = try await server.signIn(try Self.manager(vault, configuration))
        let description = AccessTokenKeyring.description(
            namespace: vault.lockDirectory, identity: CredentialKey(configuration: configuration).storageAccount)
        // What a reboot does to the entry, with the kernel's own tool.
        let found = try run("/usr/bin/keyctl", ["search", "@u", "user", description])
        #expect(found.status == 0, "keyctl search: \(found.standardError)")
        let serial = found.standardOutput.trimmingCharacters(in: .whitespacesAndNewlines)
        #expect(try run("/usr/bin/keyctl", ["invalidate", serial]).status == 0)
        #expect(try Self.cachedEntry(vault, configuration) == nil)

        let lone = try Self.loneLockbox(in: vault.directory)
        #expect(try run(lone, ["--keychain", vault.vault.path, "token"]).status == 1)
        let before = try await server.counters()
        let refreshed = try run(builtProduct("lockbox"), ["--keychain", vault.vault.path, "token"])
        #expect(refreshed.status == 0, "token: \(refreshed.standardError)")
        #expect(refreshed.standardOutput != tokens.accessToken.withUnsafeBytes { String(decoding: $0, as: UTF8.self) } + "\n")
        #expect(try await server.counters()["refresh_requests"]! - before["refresh_requests"]! == 1)
        #expect(try run(lone, ["--keychain", vault.vault.path, "token"]).standardOutput == refreshed.standardOutput)
        Self.forget(vault, configuration)
    }

    @Test func fourProcesses_afterACacheMiss_shareOneRefresh_withoutReuse() async throws {
        let server = try await TestServer.running()
        let vault = try TestVault()
        let configuration = try await server.configuration()
        _ = try await server.signIn(try Self.manager(vault, configuration))
        try AccessTokenKeyring.remove(namespace: vault.lockDirectory, identity: CredentialKey(configuration: configuration).storageAccount)
        let before = try await server.counters()

        let outputs = Mutex<[ProcessResult]>([])
        DispatchQueue.concurrentPerform(iterations: 4) { _ in
            if let result = try? run(builtProduct("lockbox"), ["--keychain", vault.vault.path, "token"], timeout: 60) {
                outputs.withLock { $0.append(result) }
            }
        }
        let results = outputs.withLock { $0 }
        let after = try await server.counters()
        #expect(results.count == 4)
        #expect(results.allSatisfy { $0.status == 0 }, "\(results.map(\.standardError))")
        #expect(Set(results.map(\.standardOutput)).count == 1)
        #expect(after["refresh_requests"]! - before["refresh_requests"]! == 1)
        #expect(after["reuse_detections"] == before["reuse_detections"])
        var request = server.api("api/resource")
        request.setValue("Bearer " + results[0].standardOutput.trimmingCharacters(in: .newlines), forHTTPHeaderField: "Authorization")
        let (_, response) = try await URLSession.shared.data(for: request)
        #expect((response as? HTTPURLResponse)?.statusCode == 200)
        Self.forget(vault, configuration)
    }

    @Test func canaryAccessToken_appearsInNoFileLogArgvOrEnvironment() async throws {
        let server = try await TestServer.running()
        let vault = try TestVault()
        let configuration = try await server.configuration()
        let canary = "CANARY-SHARED-ACCESS-" + UUID().uuidString
        try await server.faults(["canary_access_token": canary])
        let events = EventRecorder()
        _ = try await server.signIn(try Self.manager(vault, configuration, events: events))
        #expect(try Self.cachedEntry(vault, configuration)?.token == SecretBytes(utf8: canary))

        let token = try run(builtProduct("lockbox"), ["--keychain", vault.vault.path, "token"])
        #expect(token.standardOutput == canary + "\n")
        let status = try run(builtProduct("lockbox"), ["--keychain", vault.vault.path, "auth", "status", "--json"])
        var texts = [token.standardError, status.standardOutput, status.standardError]
        texts += events.events.map(\.description)
        texts += [try String(contentsOfFile: "/proc/keys", encoding: .utf8)]
        // Every file the test's keychain, lock directory and XDG tree hold.
        let root = vault.directory.path
        let files = FileManager.default.enumerator(atPath: root)?.compactMap { $0 as? String } ?? []
        for file in files where !file.hasPrefix("lone/") {
            if let data = FileManager.default.contents(atPath: root + "/" + file) { texts.append(String(decoding: data, as: UTF8.self)) }
        }
        // argv and environment of this process (the tests' parent of every CLI run).
        texts.append(try String(contentsOfFile: "/proc/self/cmdline", encoding: .utf8))
        texts.append(try String(contentsOfFile: "/proc/self/environ", encoding: .utf8))
        #expect(files.count > 0)
        #expect(!texts.contains { $0.contains(canary) })
        Self.forget(vault, configuration)
    }

    /// A server naming an absurd lifetime (10^17 s) must not crash the refresh or the cache's
    /// millisecond and timeout arithmetic: the lifetime is taken as ten years at most.
    @Test func absurdExpiresIn_isBounded_andLockboxTokenStillAnswers() async throws {
        let server = try await TestServer.running()
        let vault = try TestVault()
        let configuration = try await server.configuration()
        _ = try await server.signIn(try Self.manager(vault, configuration))
        Self.forget(vault, configuration)
        try await server.faults(["access_token_lifetime": 100_000_000_000_000_000])

        let token = try run(builtProduct("lockbox"), ["--keychain", vault.vault.path, "token"], timeout: 60)
        #expect(token.status == 0, "lockbox token: status \(token.status), \(token.standardError)")
        #expect(!token.standardOutput.isEmpty)
        let entry = try #require(try Self.cachedEntry(vault, configuration), "the refreshed token is shared")
        let tenYearsAndADay = Int64((Date().timeIntervalSince1970 + Double(10 * 366 * 24 * 3600 + 86_400)) * 1000)
        #expect(entry.expiresAtMilliseconds < tenYearsAndADay)
        #expect(entry.freshUntilMilliseconds < entry.expiresAtMilliseconds)
        try await server.faults(["access_token_lifetime": 3600])
        Self.forget(vault, configuration)
    }

    @Test func signingInAgain_revokesTheReplacedGrant() async throws {
        let server = try await TestServer.running()
        let vault = try TestVault()
        let configuration = try await server.configuration()
        let manager = try Self.manager(vault, configuration)
        let first = try await server.signIn(manager)
        let session = try AuthorizationCodeFlow(configuration: configuration).start()
        async let browser: Void = { _ = try? await URLSession.shared.data(from: session.authorizationURL) }()
        let second = try await session.waitForTokens(timeout: .seconds(20))
        await browser
        #expect(try await manager.signIn(with: second) == .revoked)
        #expect(try await server.counters()["revocations"] == 1)
        #expect(try await Self.post(configuration.tokenEndpoint, "grant_type=refresh_token", first.refreshToken!).1 == "invalid_grant")
        #expect(try await vault.tokenStore(for: configuration).refreshToken() == second.refreshToken)
        Self.forget(vault, configuration)
    }

    @Test func ambiguousSessions_areListed_andTheErrorEndsWithItsCode() async throws {
        let server = try await TestServer.running()
        let vault = try TestVault()
        let configuration = try await server.configuration()
        for account in ["work", "home"] {
            let key = CredentialKey(configuration: configuration, account: account)
            try await ItemStoreTokenStore(store: vault.vault, key: key, configuration: configuration)
                .saveRefreshToken(SecretBytes(utf8: "not-a-real-token-\(account)"))
        }
        let result = try run(builtProduct("lockbox"), ["--keychain", vault.vault.path, "token"])
        #expect(result.status == 64)
        #expect(result.standardError.contains("(account work)") && result.standardError.contains("(account home)"), "\(result.standardError)")
        #expect(result.standardError.hasSuffix("(ambiguous_session)\n"))
    }

    @Test func wrongIssuer_namesTheWellKnownURL_andUnknownHost_saysItCouldNotBeResolved() async throws {
        let server = try await TestServer.running()
        let vault = try TestVault()
        let wrong = server.url.absoluteString + "/no-such-tenant"
        let notFound = try run(builtProduct("lockbox"), ["--keychain", vault.vault.path, "login", "--issuer", wrong, "--client-id", "x"])
        #expect(notFound.status == 64)
        #expect(notFound.standardError.contains("/.well-known/oauth-authorization-server/no-such-tenant answered 404"), "\(notFound.standardError)")
        #expect(notFound.standardError.contains("Check --issuer."))
        #expect(notFound.standardError.hasSuffix("(configuration, HTTP 404)\n"))

        let unknown = try run(
            builtProduct("lockbox"), ["--keychain", vault.vault.path, "login", "--issuer", "https://no-such-host.invalid", "--client-id", "x"],
            timeout: 60)
        #expect(unknown.status == 1)
        #expect(unknown.standardError.contains("no-such-host.invalid could not be resolved"), "\(unknown.standardError)")
        #expect(unknown.standardError.contains("(network, URLError"))
    }

    @Test func deviceLogin_waitsWithoutCPU_andCtrlC_leavesTheStoredSessionAsItWas() async throws {
        let server = try await TestServer.running()
        let vault = try TestVault()
        let configuration = try await server.configuration()
        let tokens = try await server.signIn(try Self.manager(vault, configuration))

        // --browser without a display says so and uses the device flow.
        var environment = ProcessInfo.processInfo.environment
        environment["DISPLAY"] = nil
        environment["WAYLAND_DISPLAY"] = nil
        var login = try WaitingLogin(
            ["--keychain", vault.vault.path, "login", "--browser", "--issuer", server.url.absoluteString, "--client-id", TestServer.clientID],
            environment: environment)
        #expect(login.said.contains("using the device flow instead"), "\(login.said)")
        #expect(login.said.contains("enter the code"))
        #expect(login.said.contains("the code expires at"))
        // Waiting: the process sleeps between polls.
        let cpuBefore = try Self.cpuSeconds(login.process.processIdentifier)
        try await Task.sleep(for: .seconds(3))
        let cpuUsed = try Self.cpuSeconds(login.process.processIdentifier) - cpuBefore
        #expect(cpuUsed < 0.3, "a waiting login used \(cpuUsed) s of CPU in 3 s")

        let collected = login.stop(with: SIGINT)
        #expect(login.process.terminationStatus == 1)
        #expect(collected.contains("Cancelled; the stored session is as it was. (cancelled)"), "\(collected)")
        #expect(try await vault.tokenStore(for: configuration).refreshToken() == tokens.refreshToken)
        #expect(try Self.cachedEntry(vault, configuration)?.token == tokens.accessToken)
        Self.forget(vault, configuration)
    }

    @Test func browserLogin_opensXdgOpen_andSignsIn() async throws {
        let server = try await TestServer.running()
        let vault = try TestVault()
        // xdg-open played by curl: the test server approves at once and redirects to the
        // loopback listener.
        let bin = vault.directory.path + "/bin"
        try FileManager.default.createDirectory(atPath: bin, withIntermediateDirectories: true)
        try "#!/bin/sh\nexec curl -s -L -o /dev/null \"$1\"\n".write(toFile: bin + "/xdg-open", atomically: true, encoding: .utf8)
        chmod(bin + "/xdg-open", 0o755)
        var environment = ProcessInfo.processInfo.environment
        environment["DISPLAY"] = ":99"
        environment["PATH"] = bin + ":" + (environment["PATH"] ?? "/usr/bin:/bin")
        let login = try run(
            builtProduct("lockbox"),
            ["--keychain", vault.vault.path, "login", "--browser", "--issuer", server.url.absoluteString, "--client-id", TestServer.clientID, "--scope", "api"],
            environment: environment, timeout: 60)
        #expect(login.status == 0, "\(login.standardError)")
        #expect(login.standardError.contains("Opening the sign-in page in the browser"))
        #expect(login.standardError.contains("Signed in to"))
        #expect(try await server.counters()["code_exchanges"] == 1)
        #expect(try run(builtProduct("lockbox"), ["--keychain", vault.vault.path, "token"]).status == 0)
        Self.forget(vault, try await server.configuration())
    }

    /// Posts `fields` and `token=` or `refresh_token=` the token; the status and the OAuth error.
    static func post(_ url: URL, _ fields: String, _ token: SecretBytes) async throws -> (Int, String?) {
        var request = URLRequest(url: url)
        request.httpMethod = "POST"
        request.setValue("application/x-www-form-urlencoded", forHTTPHeaderField: "Content-Type")
        let name = fields.hasPrefix("grant_type") ? "refresh_token" : "token"
        request.httpBody = token.withUnsafeBytes { bytes in
            Data("\(fields)&client_id=\(TestServer.clientID)&\(name)=".utf8) + Data(bytes)
        }
        let (data, response) = try await URLSession.shared.data(for: request)
        let error = (try? JSONSerialization.jsonObject(with: data) as? [String: Any])?["error"] as? String
        return ((response as? HTTPURLResponse)?.statusCode ?? 0, error)
    }

    /// User plus system CPU time of a process so far, from /proc/PID/stat.
    static func cpuSeconds(_ pid: Int32) throws -> Double {
        let stat = try String(contentsOfFile: "/proc/\(pid)/stat", encoding: .utf8)
        let fields = stat[stat.index(after: stat.lastIndex(of: ")")!)...].split(separator: " ")
        let ticks = Double(fields[11])! + Double(fields[12])!
        return ticks / Double(sysconf(Int32(_SC_CLK_TCK)))
    }
}
}
