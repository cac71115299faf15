import Foundation
import Lockbox
import LockboxKeys
import LockboxTestSupport
import Testing

@testable import LockboxBroker

/// The item store through a real `lockboxd`: the Keychain's results, the lock state kept in the
/// broker, the broker's claim on the vault.
@Suite("Items through lockboxd")
struct BrokerStoreTests {
    @Test("add, find, update, delete through the broker give the Keychain's results")
    func itemOperations_throughBroker_behaveAsTheVault() throws {
        let fixture = try BrokerFixture()
        let store = try fixture.store()
        try store.unlock(passphrase: SecretBytes(utf8: BrokerFixture.passphraseText))
        let canary = makeCanary("broker-item")
        try store.add(.genericPassword(service: "api", account: "alice", data: SecretBytes(utf8: canary)))
        #expect(status { try store.add(.genericPassword(service: "api", account: "alice", data: SecretBytes(utf8: "x"))) } == -25299)
        let read = try store.data(matching: .genericPassword(service: "api", account: "alice"))
        #expect(read == SecretBytes(utf8: canary))
        try store.update(matching: .genericPassword(service: "api", account: "alice"), to: ItemUpdate(data: SecretBytes(utf8: "new")))
        #expect(try store.data(matching: .genericPassword(service: "api", account: "alice")) == SecretBytes(utf8: "new"))
        #expect(try store.delete(matching: .genericPassword(service: "api")) == 1)
        #expect(status { _ = try store.data(matching: .genericPassword(service: "api", account: "alice")) } == -25300)
    }

    @Test("locked through the broker reads as locked (-25308), never not found; unlock reopens it")
    func lock_throughBroker_readsAsLocked() throws {
        let fixture = try BrokerFixture()
        let store = try fixture.store()
        try store.unlock(passphrase: SecretBytes(utf8: BrokerFixture.passphraseText))
        try store.add(.genericPassword(service: "api", account: "alice", data: SecretBytes(utf8: "v")))
        try store.lock()
        #expect(status { _ = try store.data(matching: .genericPassword(service: "api", account: "alice")) } == -25308)
        let state = try store.status()
        #expect(!state.isUnlocked)
        #expect(state.unlockCache == .processMemory)
        #expect(status { try store.unlock(passphrase: SecretBytes(utf8: "wrong")) } == -25293)
        try store.unlock(passphrase: SecretBytes(utf8: BrokerFixture.passphraseText))
        #expect(try store.data(matching: .genericPassword(service: "api", account: "alice")) == SecretBytes(utf8: "v"))
    }

    @Test("while lockboxd serves a vault, opening it directly is refused with a message naming the broker")
    func embeddedOpen_whileServed_isRefused() throws {
        let fixture = try BrokerFixture()
        var configuration = Vault.Configuration()
        configuration.unlockCache = .processMemory
        do {
            _ = try Vault.open(at: fixture.vaultPath, configuration: configuration)
            Issue.record("the vault opened beside its broker")
        } catch {
            #expect(error.code == .notAvailable)
            #expect(error.message.contains("lockboxd serves the keychain"), "\(error.message)")
        }
        // And a second broker on another socket is refused too.
        let second = try run(
            fixture.brokerd, ["--socket", fixture.directory.file("other.sock"), "--keychain", fixture.vaultPath], timeout: 30)
        #expect(second.status == 1)
        #expect(second.standardError.contains("is in use by another lockboxd"), "\(second.standardError)")
    }

    @Test("while a program has the vault open directly, lockboxd refuses to start on it")
    func brokerStart_whileOpenEmbedded_isRefused() throws {
        let fixture = try BrokerFixture()
        fixture.stop()
        var configuration = Vault.Configuration()
        configuration.unlockCache = .processMemory
        do {
            let embedded = try Vault.open(at: fixture.vaultPath, configuration: configuration)
            let refused = try run(fixture.brokerd, ["--socket", fixture.socketPath, "--keychain", fixture.vaultPath], timeout: 30)
            #expect(refused.status == 1)
            #expect(refused.standardError.contains("opened it directly (embedded mode)"), "\(refused.standardError)")
            withExtendedLifetime(embedded) {}
        }
        // Once the program lets go, the broker starts.
        try fixture.start()
        #expect(try fixture.store().status().path == fixture.vaultPath)
    }

    @Test("Keychain.open with the broker backend says so in its reason")
    func keychainOpen_brokerBackend_saysSoInReason() throws {
        let fixture = try BrokerFixture()
        var options = Keychain.Options(backend: .broker, path: fixture.vaultPath)
        options.brokerSocket = fixture.socketPath
        let opened = try Keychain.open(options)
        #expect(opened.backend == .broker)
        #expect(opened.reason.contains("lockboxd"), "\(opened.reason)")
        #expect(opened.broker != nil && opened.vault == nil)
    }

    @Test("a client whose broker is killed gets errSecNotAvailable, then reaches a restarted broker")
    func brokerKilled_clientReconnectsToRestarted() throws {
        let fixture = try BrokerFixture()
        let store = try fixture.store()
        try store.unlock(passphrase: SecretBytes(utf8: BrokerFixture.passphraseText))
        try store.add(.genericPassword(service: "api", account: "alice", data: SecretBytes(utf8: "v")))
        fixture.stop(signal: SIGKILL)
        let failure = status { try store.add(.genericPassword(service: "api", account: "bob", data: SecretBytes(utf8: "w"))) }
        #expect(failure == -25291)
        try fixture.start()
        // The keys died with the broker: the restarted one starts locked, and says so.
        #expect(status { _ = try store.data(matching: .genericPassword(service: "api", account: "alice")) } == -25308)
        try store.unlock(passphrase: SecretBytes(utf8: BrokerFixture.passphraseText))
        #expect(try store.data(matching: .genericPassword(service: "api", account: "alice")) == SecretBytes(utf8: "v"))
    }

    @Test("a key made inside the broker signs there; its private half never reaches the client")
    func brokerKey_signsInside_neverExported() throws {
        let fixture = try BrokerFixture()
        let store = try fixture.store()
        try store.unlock(passphrase: SecretBytes(utf8: BrokerFixture.passphraseText))
        let tag = Data("broker-key".utf8)
        let der = try store.generateKey(
            algorithm: KeyAlgorithm.p256.rawValue, purposes: KeyPurposes([.sign, .verify]).rawValue, applicationTag: tag)
        let publicKey = try PublicKey(derRepresentation: der)
        let message = Data("sign me".utf8)
        let signature = try store.sign(message, applicationTag: tag)
        #expect(try publicKey.isValidSignature(signature, for: message))
        #expect(try store.publicKey(applicationTag: tag) == der)
        // Asking for the key item's data gives no private key.
        var query = Query(.key, limit: .all, returning: [.data, .attributes])
        query.attributes.applicationTag = tag
        let code = status { _ = try store.items(matching: query) }
        #expect(code == -25316, "the private key was readable (status \(String(describing: code)))")
        // Another executable's group holds no such key.
        #expect(status { _ = try store.sign(message, applicationTag: Data("absent".utf8)) } == -25300)
    }

    @Test("with no broker running, the client starts lockboxd on demand; an idle broker holding no key exits")
    func noBroker_startedOnDemand_exitsWhenIdle() throws {
        let directory = TemporaryDirectory("lbx-demand")
        let vaultPath = directory.file("keychains/demand.lockbox")
        var configuration = Vault.Configuration()
        configuration.keyDerivation = .interactive
        configuration.unlockCache = .processMemory
        _ = try Vault.create(at: vaultPath, passphrase: SecretBytes(utf8: "pw"), configuration: configuration)
        let socketPath = directory.file("run/lockboxd.sock")
        let store = try BrokerStore.connect(socketPath: socketPath, vaultPath: vaultPath, startOnDemand: true)
        let pid = store.brokerProcessIdentifier
        #expect(pid > 0 && kill(pid, 0) == 0)
        #expect(try store.status().isUnlocked == false)
        defer { kill(pid, SIGTERM) }
        // A broker started by hand with a short idle exit, never unlocked: it goes away and
        // takes its socket with it.
        let idleSocket = directory.file("idle/lockboxd.sock")
        kill(pid, SIGTERM)
        for _ in 0..<300 where kill(pid, 0) == 0 { usleep(10_000) }
        let started = try run(
            builtProduct("lockboxd"), ["--detach", "--socket", idleSocket, "--keychain", vaultPath, "--idle-exit", "1"], timeout: 30)
        #expect(started.status == 0, "\(started.standardError)")
        #expect(BrokerStore.isRunning(socketPath: idleSocket))
        var gone = false
        for _ in 0..<100 {
            if !FileManager.default.fileExists(atPath: idleSocket) {
                gone = true
                break
            }
            usleep(100_000)
        }
        #expect(gone, "the idle broker did not exit")
    }
}
