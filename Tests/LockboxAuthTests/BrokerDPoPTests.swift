import Foundation
#if canImport(FoundationNetworking)
import FoundationNetworking
#endif
import Lockbox
import LockboxAuth
import LockboxAuthKeys
import LockboxBroker
import LockboxTestSupport
import Testing

extension LifecycleTests.DPoPTests {
    @Test("through lockboxd: the session key is made and signs inside the broker; sign-in, refresh and API calls are bound to it; logout deletes it")
    func throughTheBroker_theSessionKeyStaysInside() async throws {
        let server = try await TestServer.running()
        let broker = try DPoPBroker()
        defer { broker.stop() }
        let store = try broker.store()
        try store.unlock(passphrase: SecretBytes(utf8: DPoPBroker.passphrase))
        let configuration = try await server.dpopConfiguration()
        let dpopKeys = BrokerDPoPKeyStore(broker: store)
        let manager = CredentialsManager(
            configuration: configuration,
            tokenStore: ItemStoreTokenStore(
                store: store, key: CredentialKey(configuration: configuration), accessibility: .afterFirstUnlockThisDeviceOnly,
                configuration: configuration),
            lockDirectory: broker.directory.file("oauth-locks"), dpopKeys: dpopKeys)

        let tokens = try await server.signInWithDPoP(manager)
        #expect(tokens.tokenType == "DPoP")
        let key = try #require(try await dpopKeys.boundKey(for: manager.key) as? BrokerProofSigningKey)
        #expect(try await server.boundThumbprints().contains(key.jwkThumbprint))

        let (body, response) = try await manager.send(server.api("api/dpop/resource"))
        #expect(response.statusCode == 200)
        #expect((try JSONSerialization.jsonObject(with: body) as? [String: Any])?["jkt"] as? String == key.jwkThumbprint)
        let refreshed = try await manager.credentials(minTTL: forceRefresh)
        #expect(refreshed.tokenType == "DPoP")
        #expect(refreshed.accessToken != tokens.accessToken)
        #expect(try await manager.send(server.api("api/dpop/resource")).1.statusCode == 200)

        // The session has exactly one key, and its private half never leaves the broker.
        var keys = Query(.key, limit: .all, returning: [.attributes])
        keys.attributes.applicationTag = ManagedProofSigningKey.applicationTag
        #expect(try store.items(matching: keys).compactMap(\.attributes.label) == [key.label])
        keys.returning = [.data]
        #expect(status { _ = try store.items(matching: keys) } != nil)

        // A key of another session is never bound to this one, nor discarded as one of its own.
        let other = CredentialKey(issuer: "https://other.example", clientID: "other", account: "default")
        let foreign = try await dpopKeys.makeKey(for: other)
        await #expect(throws: LockboxError.self) { try await dpopKeys.bind(foreign, to: manager.key) }
        await #expect(throws: LockboxError.self) { try await dpopKeys.discard(foreign, of: manager.key) }

        // A sign-in that did not finish: its key is discarded, the bound key never.
        keys.returning = [.attributes]
        let stopped = try #require(try await manager.signInProofs())
        #expect(try store.items(matching: keys).count == 3)
        try await manager.discardSignInProofs(stopped)
        try await manager.discardSignInProofs(DPoPProofFactory(key: key))
        #expect(Set(try store.items(matching: keys).compactMap(\.attributes.label)).contains(key.label))
        #expect(try store.items(matching: keys).count == 2)
        #expect(try await manager.send(server.api("api/dpop/resource")).1.statusCode == 200)

        // Logout deletes the session's key; the other session's key stays.
        _ = try await manager.logout()
        #expect(try await dpopKeys.boundKey(for: manager.key) == nil)
        #expect(try store.items(matching: Query(.key, limit: .all, returning: [.attributes])).compactMap(\.attributes.label)
            .allSatisfy { $0.hasPrefix(other.storageAccount) })
    }
}

/// A vault served by a real `lockboxd` (the built product) on a socket of its own, made without
/// an embedded handle kept open (which would keep the broker out).
final class DPoPBroker: @unchecked Sendable {
    static let passphrase = "dpop broker passphrase"
    let directory = TemporaryDirectory("lbx-dpop-broker")
    let vaultPath: String
    let socketPath: String
    private var process: Int32 = 0

    init() throws {
        vaultPath = directory.file("keychains/dpop.lockbox")
        socketPath = directory.file("run/lockboxd.sock")
        var configuration = Vault.Configuration()
        configuration.keyDerivation = .interactive
        configuration.unlockCache = .processMemory
        _ = try Vault.create(at: vaultPath, passphrase: SecretBytes(utf8: Self.passphrase), configuration: configuration).identifier
        let started = try run(
            builtProduct("lockboxd"), ["--detach", "--socket", socketPath, "--keychain", vaultPath, "--access", "executable"],
            timeout: 60)
        #expect(started.status == 0, "lockboxd did not start: \(started.standardError)")
        process = try store().brokerProcessIdentifier
    }

    func store() throws -> BrokerStore {
        try BrokerStore.connect(socketPath: socketPath, vaultPath: vaultPath, startOnDemand: false)
    }

    func stop() {
        guard process > 0 else { return }
        kill(process, SIGTERM)
        for _ in 0..<500 where kill(process, 0) == 0 { usleep(10_000) }
        process = 0
    }

    deinit { stop() }
}
