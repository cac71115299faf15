import Foundation
#if canImport(FoundationNetworking)
import FoundationNetworking
#endif
import Lockbox
import LockboxAuth
import Testing

extension LifecycleTests {
    @Test func canaryTokens_appearInNoLogEventErrorDescriptionOrFile() async throws {
        let server = try await TestServer.running()
        let vault = try TestVault()
        let events = EventRecorder()
        let configuration = try await server.configuration()
        let manager = vault.manager(configuration, events: events)
        _ = try await server.signIn(manager)
        let canaryRefresh = "CANARY-REFRESH-" + UUID().uuidString
        let canaryAccess = "CANARY-ACCESS-" + UUID().uuidString
        try await server.faults(["canary_refresh_token": canaryRefresh, "canary_access_token": canaryAccess])
        var texts: [String] = []

        // The canaries go through rotation, storage, use, a 401, failures and a queued logout.
        let credentials = try await manager.credentials(minTTL: forceRefresh)
        #expect(credentials.accessToken == SecretBytes(utf8: canaryAccess))
        texts.append("\(credentials)")
        texts.append(String(reflecting: credentials))
        texts.append("\(await manager.state)")
        texts.append("\(try await vault.tokenStore(for: configuration).refreshToken() as Any)")
        let (_, ok) = try await manager.send(server.api("api/resource"))
        #expect(ok.statusCode == 200)
        try await server.faults(["token_503": 1])
        do {
            _ = try await manager.credentials(minTTL: forceRefresh)
        } catch {
            texts.append("\(error)")
            texts.append(String(reflecting: error))
        }
        // Another process receives a second pair of canaries; its event log is a file here.
        let workerRefresh = "CANARY-WORKER-REFRESH-" + UUID().uuidString
        let workerAccess = "CANARY-WORKER-ACCESS-" + UUID().uuidString
        try await server.faults(["canary_refresh_token": workerRefresh, "canary_access_token": workerAccess])
        let worker = try await Worker.run(vault: vault, server: server, ["calls", "1"])
        #expect(worker["outcome"] as? String == "ok", "worker: \(worker)")
        texts.append("\(worker)")
        #expect(try await vault.tokenStore(for: configuration).refreshToken() == SecretBytes(utf8: workerRefresh))

        try await server.faults(["revoke_fail": 2])
        let result = try await manager.logout()
        #expect(result.queued)
        let session = CommandLineSession(store: vault.vault, lockDirectory: vault.lockDirectory)
        texts.append("\(try await session.status())")
        texts.append("\(try await session.retryPendingLogouts())")
        do {
            _ = try await manager.credentials()
        } catch {
            texts.append("\(error)")
        }
        texts.append(contentsOf: events.events.map(\.description))
        texts.append(contentsOf: events.events.map { String(reflecting: $0) })
        #expect(events.events.contains { $0.kind == .rotationPersisted })

        #expect(regularFiles(in: vault.directory).contains { $0.hasSuffix(".log") })
        for canary in [canaryRefresh, canaryAccess, workerRefresh, workerAccess] {
            for text in texts {
                #expect(!text.contains(canary), "a description leaks the canary: \(text.prefix(80))")
            }
            for file in regularFiles(in: vault.directory) + [TestServer.stateDirectory + "/server.log"] {
                let contents = try Data(contentsOf: URL(fileURLWithPath: file))
                #expect(contents.range(of: Data(canary.utf8)) == nil, "\(file) holds the canary in clear")
            }
        }
        // The vault did hold the rotated canary (sealed): the files are not trivially empty.
        #expect(regularFiles(in: vault.directory).contains(vault.vault.path))
        #expect(events.events.contains { $0.fingerprint == TokenFingerprint.of(SecretBytes(utf8: canaryRefresh)) })
    }
}
