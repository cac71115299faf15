import Foundation
import KeychainWrapper
import Testing
#if os(Linux)
import LocalAuthentication
import Lockbox
import Security

/// Each test gets its own vault; the wrapper's sources know nothing of it.
final class TestVault: @unchecked Sendable {
    let directory: String
    let vault: Vault
    static let passphrase = "consumer test passphrase"

    init() throws {
        directory = FileManager.default.temporaryDirectory.appendingPathComponent("keychain-wrapper-\(UUID().uuidString)").path
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true, attributes: [.posixPermissions: 0o700])
        var configuration = Vault.Configuration()
        configuration.keyDerivation = .interactive
        configuration.unlockCache = .processMemory
        configuration.accessGroups = ["TEAM.com.example.app", "TEAM.com.example.shared"]
        vault = try Vault.create(at: directory + "/test.lockbox", passphrase: SecretBytes(utf8: Self.passphrase), configuration: configuration)
    }

    deinit {
        vault.lockAll()
        try? FileManager.default.removeItem(atPath: directory)
    }
}

struct Passphrase: PresenceVerifier {
    func passphrase(for request: AuthenticationRequest) throws(LockboxError) -> SecretBytes {
        SecretBytes(utf8: TestVault.passphrase)
    }
}

@Suite(.serialized) struct KeychainWrapperTests {
    @Test func setGetDeleteAndAllKeys() throws {
        let fixture = try TestVault()
        try SecItemStore.withStore(fixture.vault) {
            let store = KeychainStore(service: "com.example.tokens")
            try store.set("access-1", forKey: "access")
            try store.set("refresh-1", forKey: "refresh")
            try store.set("access-2", forKey: "access")
            #expect(try store.string(forKey: "access") == "access-2")
            #expect(try store.allKeys() == ["access", "refresh"])
            #expect(try store.remove(forKey: "access"))
            #expect(try !store.remove(forKey: "access"))
            #expect(try store.string(forKey: "access") == nil)
            try store.removeAll()
            #expect(try store.allKeys() == [])
            #expect(try KeychainStore.randomKey().count == 32)
        }
    }

    @Test func dataAccounts_accessGroups_synchronizable_persistentReferences() throws {
        let fixture = try TestVault()
        try SecItemStore.withStore(fixture.vault) {
            let store = KeychainStore(service: "com.example.devices")
            let deviceID = Data([0xde, 0xad, 0xbe, 0xef])
            try store.set(Data("pairing".utf8), forDataAccount: deviceID)
            #expect(try store.dataAccounts() == [deviceID])

            let shared = KeychainStore(service: "com.example.shared", accessGroup: "TEAM.com.example.shared")
            try shared.set("shared", forKey: "token")
            #expect(try shared.string(forKey: "token") == "shared")
            let foreign = KeychainStore(service: "com.example.shared", accessGroup: "OTHER.com.example")
            #expect(throws: KeychainStoreError.missingEntitlement) { try foreign.set("x", forKey: "token") }

            let synced = KeychainStore(service: "com.example.synced", synchronizable: true)
            try synced.set("everywhere", forKey: "token")
            #expect(try synced.string(forKey: "token") == "everywhere")
            #expect(try KeychainStore(service: "com.example.synced").string(forKey: "token") == nil)
            let reference = try #require(try synced.persistentReference(forKey: "token"))
            #expect(try KeychainStore.data(forPersistentReference: reference) == Data("everywhere".utf8))

            let legacy = LegacyTokenCache.save("legacy", account: "alice")
            #expect(legacy == errSecSuccess)
            #expect(LegacyTokenCache.load(account: "alice") == "legacy")
        }
    }

    @Test func accessControl_withLocalAuthentication() async throws {
        let fixture = try TestVault()
        LAContext.presenceVerifier = Passphrase()
        defer { LAContext.presenceVerifier = nil }
        try await SecItemStore.withStore(fixture.vault) {
            let store = KeychainStore(service: "com.example.protected")
            try store.setProtected(Data("guarded".utf8), forKey: "pin")
            #expect(try store.protectedData(forKey: "pin", skipIfAuthenticationNeeded: true) == nil)
            let gate = BiometricGate(reuse: 30)
            #expect(!gate.biometryAvailable)
            let unlocked: Bool = await withCheckedContinuation { continuation in
                gate.unlock(reason: "read the pin") { success, _ in continuation.resume(returning: success) }
            }
            #expect(unlocked)
            #expect(try store.protectedData(forKey: "pin", context: gate.context) == Data("guarded".utf8))
            gate.forget()
            #expect(throws: KeychainStoreError.unhandled(status: errSecInteractionNotAllowed)) {
                try store.protectedData(forKey: "pin", context: gate.context)
            }
            // Deleting needs no authentication, as on iOS.
            #expect(try store.remove(forKey: "pin"))
        }
    }

    @Test func dpopKeyStore() throws {
        let fixture = try TestVault()
        try SecItemStore.withStore(fixture.vault) {
            let keys = DPoPKeyStore(tag: "com.example.dpop")
            #expect(!keys.hasKey())
            let point = try keys.publicKeyPoint()
            #expect(point.count == 65)
            #expect(keys.hasKey())
            #expect(try DPoPKeyStore(tag: "com.example.dpop").publicKeyPoint() == point)
            let input = Data("eyJhbGciOiJFUzI1NiJ9.eyJodG0iOiJQT1NUIn0".utf8)
            let signature = try keys.sign(input)
            #expect(signature.count == 64)
            #expect(try keys.verify(signature, for: input))
            #expect(try !keys.verify(signature, for: input + Data([0x2e])))
            let box = try keys.seal(Data("refresh-token".utf8))
            #expect(try keys.open(box) == Data("refresh-token".utf8))
            try keys.clear()
            #expect(!keys.hasKey())
        }
    }
}
#endif
