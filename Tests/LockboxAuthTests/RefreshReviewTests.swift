import Foundation
#if canImport(FoundationNetworking)
import FoundationNetworking
#endif
import Glibc
import KeyProviders
import Lockbox
@testable import LockboxAuth
import LockboxAuthKeyring
import LockboxTestSupport
import Testing

/// A careless user's ways with refreshes: a command stopped while its refresh is in flight, a
/// server that gives no lifetime, a lock holder that stops without dying.
extension LifecycleTests.SharedTokenCacheTests {
    /// A session signed in through a manager that shares its tokens (``manager(_:_:events:)``),
    /// its configuration changed by `configure` first.
    static func signedInSession(_ configure: (inout ClientConfiguration) -> Void = { _ in }) async throws
        -> (server: TestServer, vault: TestVault, configuration: ClientConfiguration, manager: CredentialsManager, tokens: TokenResponse)
    {
        let server = try await TestServer.running()
        let vault = try TestVault()
        var configuration = try await server.configuration()
        configure(&configuration)
        let manager = try Self.manager(vault, configuration)
        let tokens = try await server.signIn(manager)
        return (server, vault, configuration, manager, tokens)
    }

    @Test("a token whose lifetime the server did not give (none, 0, negative) is shared for a minute: lockbox token refreshes once, not at every call")
    func unknownLifetime_isSharedForAMinute() async throws {
        let (server, vault, configuration, manager, _) = try await Self.signedInSession()
        defer { Self.forget(vault, configuration) }
        for lifetime in ["omit", "0", "-5"] {
            try await server.faults(["token_expires_in": lifetime])
            let refreshed = try await manager.credentials(minTTL: forceRefresh)
            #expect(refreshed.expiresAt == nil, "\(lifetime): taken as no lifetime given")
            let entry = try #require(try Self.cachedEntry(vault, configuration), "\(lifetime): not shared")
            #expect(entry.token == refreshed.accessToken)
            let before = try await server.counters()
            for _ in 0..<3 {
                let printed = try run(builtProduct("lockbox"), ["--keychain", vault.vault.path, "token"])
                #expect(printed.status == 0, "\(lifetime): \(printed.standardError)")
                #expect(printed.standardOutput == refreshed.accessToken.withUnsafeBytes { String(decoding: $0, as: UTF8.self) } + "\n")
            }
            let after = try await server.counters()
            #expect(after["refresh_successes"] == before["refresh_successes"], "\(lifetime): lockbox token refreshed")
        }
        try await server.faults(["token_expires_in": ""])
    }

    @Test("lockbox token stopped (SIGTERM, SIGINT, SIGHUP) while its refresh is in flight: it stores the rotated token first, so the session survives with no reuse detection; a SIGHUP it was started ignoring stays ignored")
    func stoppedDuringRefresh_keepsTheSession() async throws {
        let (server, vault, configuration, _, _) = try await Self.signedInSession()
        defer { Self.forget(vault, configuration) }
        // Each signal as a terminal delivers it (at its default action: the test runner may have
        // been started with some ignored), then SIGHUP to a `nohup`ed one, which stays ignored.
        for (stop, ignored) in [(SIGTERM, false), (SIGINT, false), (SIGHUP, false), (SIGHUP, true)] {
            Self.forget(vault, configuration)
            let before = try await server.counters()
            try await server.faults(["token_hang_after_rotate": 2.0])
            let token = Process()
            token.executableURL = URL(fileURLWithPath: "/usr/bin/env")
            token.arguments =
                [ignored ? "--ignore-signal=HUP" : "--default-signal=INT,TERM,HUP", builtProduct("lockbox"), "--keychain", vault.vault.path, "token"]
            let errors = Pipe()
            token.standardError = errors
            token.standardOutput = Pipe()
            try token.run()
            // The server has rotated the refresh token and holds its answer back.
            let deadline = Date().addingTimeInterval(20)
            while try await server.counters()["refresh_successes"] == before["refresh_successes"], Date() < deadline {
                try await Task.sleep(for: .milliseconds(50))
            }
            kill(token.processIdentifier, stop)
            token.waitUntilExit()
            let said = String(decoding: errors.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self)
            if ignored {
                #expect(token.terminationReason == .exit && token.terminationStatus == 0, "an ignored SIGHUP stopped it: \(said)")
            } else {
                #expect(token.terminationReason == .exit && token.terminationStatus == 128 + stop, "signal \(stop): \(token.terminationStatus) \(said)")
                #expect(said.contains("Stopping once the refresh in progress has stored its new token"), "\(said)")
            }
            try await server.faults(["token_hang_after_rotate": 0.0])
            // The next call uses the rotated token: no reuse, no sign-out.
            Self.forget(vault, configuration)
            let next = try run(builtProduct("lockbox"), ["--keychain", vault.vault.path, "token"])
            #expect(next.status == 0, "signal \(stop): \(next.standardError)")
            let after = try await server.counters()
            #expect(after["reuse_detections"] == before["reuse_detections"], "signal \(stop): a refresh token was presented twice")
        }
    }

    @Test("a refresh lock held by a process that stopped without dying: the others give up after three request deadlines and 15 s and say why, the session unchanged")
    func stoppedLockHolder_isWaitedForALimitedTime() async throws {
        let (_, vault, configuration, manager, tokens) = try await Self.signedInSession { $0.requestLimits = RequestLimits(deadline: .seconds(1)) }
        defer { Self.forget(vault, configuration) }
        // Another process's refresh, stopped (SIGSTOP) while it holds the lock.
        let lockPath = vault.lockDirectory + "/" + CredentialKey(configuration: configuration).lockName + ".lock"
        let holder = Process()
        holder.executableURL = URL(fileURLWithPath: "/usr/bin/flock")
        holder.arguments = ["--no-fork", lockPath, "/bin/sleep", "60"]
        try holder.run()
        defer {
            kill(holder.processIdentifier, SIGKILL)
            holder.waitUntilExit()
        }
        try await Task.sleep(for: .milliseconds(300))
        kill(holder.processIdentifier, SIGSTOP)
        let started = ContinuousClock.now
        let waited = await authErrorCode { _ = try await manager.credentials(minTTL: forceRefresh) }
        let elapsed = ContinuousClock.now - started
        #expect(waited != nil, "the refresh did not wait for the lock")
        #expect(elapsed >= .seconds(17) && elapsed < .seconds(40), "waited \(elapsed)")
        #expect(try await vault.tokenStore(for: configuration).refreshToken() == tokens.refreshToken)
    }
}
