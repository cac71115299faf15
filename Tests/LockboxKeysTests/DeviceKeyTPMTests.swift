import Foundation
import LockboxCore
import LockboxTestSupport
import LockboxVault
import TPMAccess
import Testing

/// The device key (which binds `*ThisDeviceOnly` items) sealed by a TPM: migration from the
/// clear file, unsealing in other processes, a copy on another TPM, no TPM at all.
@Suite("device key sealed by the TPM")
struct DeviceKeyTPMTests {
    let directory = TemporaryDirectory("lockbox-device-key")
    var keyPath: String { directory.file("state/lockbox/device-key") }

    func identity(_ tpm: String) -> DeviceIdentity {
        DeviceIdentity(keyPath: keyPath, tpmDevice: tpm)
    }

    func configuration(_ tpm: String) -> Vault.Configuration {
        var configuration = Vault.Configuration()
        configuration.keyDerivation = .interactive
        configuration.unlockCache = .processMemory
        configuration.device = identity(tpm)
        return configuration
    }

    static let local = Item.genericPassword(
        service: "local", account: "a", data: SecretBytes(utf8: "this device only"), accessibility: .whenUnlockedThisDeviceOnly)
    static let always = Item.genericPassword(
        service: "always-local", account: "a", data: SecretBytes(utf8: "always, this device"), accessibility: .alwaysThisDeviceOnly)
    static let portable = Item.genericPassword(
        service: "portable", account: "a", data: SecretBytes(utf8: "portable"), accessibility: .whenUnlocked)

    /// A vault with one item of each kind, made while the device key is a clear file.
    func vaultWithItems(_ tpm: String) throws -> (path: String, passphrase: SecretBytes) {
        let path = directory.file("keychains/device.lockbox")
        let passphrase = SecretBytes(utf8: "device key passphrase")
        let vault = try Vault.create(at: path, passphrase: passphrase, configuration: configuration(tpm))
        for item in [Self.local, Self.always, Self.portable] { try vault.add(item) }
        vault.lockAll()
        return (path, passphrase)
    }

    func readAll(_ vault: Vault) throws -> [String] {
        try ["local", "always-local", "portable"].map { service in
            String(decoding: try vault.data(matching: .genericPassword(service: service, account: "a")).withUnsafeBytes { Array($0) }, as: UTF8.self)
        }
    }

    @Test func migration_keepsEveryThisDeviceOnlyItem_andLeavesNoClearKey() throws {
        let tpm = try PrivateTPM()
        let (path, passphrase) = try vaultWithItems(tpm.device)
        let clearKey = try #require(FileManager.default.contents(atPath: keyPath))
        #expect(clearKey.count == 32)
        #expect(try identity(tpm.device).storage == .file)

        #expect(try identity(tpm.device).sealWithTPM() == .migratedFromFile)
        #expect(try identity(tpm.device).storage == .tpm(pcrs: []))
        let sealedFile = try #require(FileManager.default.contents(atPath: keyPath))
        #expect(!contains(Array(sealedFile), Array(clearKey)), "the clear key is gone from the file")
        #expect(try FileManager.default.attributesOfItem(atPath: keyPath)[.posixPermissions] as? Int == 0o600)
        #expect(try FileManager.default.contentsOfDirectory(atPath: directory.file("state/lockbox")).allSatisfy { !$0.contains(".sealing-") })

        // Another handle (as another process would) unseals it and reads every item.
        let vault = try Vault.open(at: path, configuration: configuration(tpm.device))
        try vault.unlock(passphrase: passphrase)
        #expect(try readAll(vault) == ["this device only", "always, this device", "portable"])
        // New ThisDeviceOnly items work too, and sealing again (to other PCRs) keeps them.
        try vault.add(Item.genericPassword(service: "later", account: "a", data: SecretBytes(utf8: "x"), accessibility: .afterFirstUnlockThisDeviceOnly))
        vault.lockAll()
        #expect(try identity(tpm.device).sealWithTPM(pcrs: [16]) == .resealed)
        #expect(try identity(tpm.device).storage == .tpm(pcrs: [16]))
        let again = try Vault.open(at: path, configuration: configuration(tpm.device))
        try again.unlock(passphrase: passphrase)
        #expect(try readAll(again) == ["this device only", "always, this device", "portable"])
        #expect(try again.data(matching: .genericPassword(service: "later", account: "a")) == SecretBytes(utf8: "x"))
        again.lockAll()
    }

    @Test func copyOnAnotherTPM_thisDeviceOnlyItemsAreUnavailable_othersWork() throws {
        let tpm = try PrivateTPM()
        let (path, passphrase) = try vaultWithItems(tpm.device)
        try identity(tpm.device).sealWithTPM()

        // The vault and the sealed device key file on a machine with another TPM.
        let other = try PrivateTPM()
        let vault = try Vault.open(at: path, configuration: configuration(other.device))
        let beforeUnlock = try #require(throws: LockboxError.self) {
            try vault.data(matching: .genericPassword(service: "always-local", account: "a"))
        }
        // Before the first unlock its lookup key is missing: locked, as everywhere, not absent.
        #expect(beforeUnlock.code == .interactionNotAllowed)
        try vault.unlock(passphrase: passphrase)
        #expect(try vault.data(matching: .genericPassword(service: "portable", account: "a")) == SecretBytes(utf8: "portable"))
        for service in ["local", "always-local"] {
            let error = try #require(throws: LockboxError.self) { try vault.data(matching: .genericPassword(service: service, account: "a")) }
            #expect(error.code == .authFailed, "\(service): \(error)")
            #expect(error.code != .itemNotFound)
        }
        // Nothing new can be bound to a device key that is not there, and nothing is dropped.
        let add = try #require(throws: LockboxError.self) {
            try vault.add(Item.genericPassword(service: "new", account: "a", data: SecretBytes(utf8: "n"), accessibility: .whenUnlockedThisDeviceOnly))
        }
        #expect(add.code == .authFailed)
        #expect(
            status { _ = try vault.changePassphrase(from: passphrase, to: SecretBytes(utf8: "another")) }
                == LockboxError.Code.authFailed.rawValue)
        vault.lockAll()

        // Back on the first TPM, everything is where it was.
        let home = try Vault.open(at: path, configuration: configuration(tpm.device))
        try home.unlock(passphrase: passphrase)
        #expect(try readAll(home) == ["this device only", "always, this device", "portable"])
        home.lockAll()
    }

    @Test func noTPM_saysSo_andNeverFallsBackToAKeyFile() throws {
        let tpm = try PrivateTPM()
        let (path, passphrase) = try vaultWithItems(tpm.device)
        try identity(tpm.device).sealWithTPM()
        let sealedFile = try #require(FileManager.default.contents(atPath: keyPath))
        tpm.kill()

        let vault = try Vault.open(at: path, configuration: configuration(tpm.device))
        try vault.unlock(passphrase: passphrase)
        #expect(try vault.data(matching: .genericPassword(service: "portable", account: "a")) == SecretBytes(utf8: "portable"))
        let error = try #require(throws: LockboxError.self) { try vault.data(matching: .genericPassword(service: "local", account: "a")) }
        #expect(error.code == .notAvailable)
        #expect(error.message.contains("no TPM can be used here") && error.message.contains(tpm.device), "\(error.message)")
        vault.lockAll()
        // The sealed file is untouched: no clear key took its place.
        #expect(FileManager.default.contents(atPath: keyPath) == sealedFile)
        // Sealing needs the TPM and changes nothing without one; a new vault needs its key.
        #expect(status { try identity(tpm.device).sealWithTPM() } == LockboxError.Code.notAvailable.rawValue)
        #expect(FileManager.default.contents(atPath: keyPath) == sealedFile)
        #expect(
            status { _ = try Vault.create(at: directory.file("keychains/new.lockbox"), passphrase: passphrase, configuration: configuration(tpm.device)) }
                == LockboxError.Code.notAvailable.rawValue)
    }

    @Test func noDeviceKeyYet_sealingMakesOneThatNeverExistsInClear() throws {
        let tpm = try PrivateTPM()
        #expect(try identity(tpm.device).storage == DeviceKeyStorage.none)
        #expect(try identity(tpm.device).sealWithTPM() == .created)
        #expect(try identity(tpm.device).storage == .tpm(pcrs: []))
        let vault = try Vault.create(at: directory.file("keychains/sealed.lockbox"), passphrase: SecretBytes(utf8: "p"), configuration: configuration(tpm.device))
        try vault.add(Self.local)
        #expect(try vault.data(matching: .genericPassword(service: "local", account: "a")) == SecretBytes(utf8: "this device only"))
        vault.lockAll()
    }

    @Test func editedSealedFile_isRefused() throws {
        let tpm = try PrivateTPM()
        _ = try vaultWithItems(tpm.device)
        try identity(tpm.device).sealWithTPM()
        var bytes = try #require(FileManager.default.contents(atPath: keyPath))
        // Another identifier in the header: the file no longer matches the key it holds.
        let index = Array("lockbox-device-key tpm2 v1\n".utf8).count
        bytes[index] = bytes[index] == UInt8(ascii: "0") ? UInt8(ascii: "1") : UInt8(ascii: "0")
        try bytes.write(to: URL(fileURLWithPath: keyPath))
        #expect(
            status { _ = try Vault.open(at: directory.file("keychains/device.lockbox"), configuration: configuration(tpm.device)) }
                == LockboxError.Code.decode.rawValue)
    }
    @Test func failedMigration_leavesTheClearFileAsItWas() throws {
        let tpm = try PrivateTPM()
        _ = try vaultWithItems(tpm.device)
        let clearKey = try #require(FileManager.default.contents(atPath: keyPath))
        tpm.kill()
        #expect(status { try identity(tpm.device).sealWithTPM() } == LockboxError.Code.notAvailable.rawValue)
        #expect(FileManager.default.contents(atPath: keyPath) == clearKey)
        #expect(try identity(tpm.device).storage == .file)
        #expect(try FileManager.default.contentsOfDirectory(atPath: directory.file("state/lockbox")).allSatisfy { !$0.contains(".sealing-") })
    }

    @Test func pcrBoundDeviceKey_refusedOnceThePCRChanges_portableItemsStillRead() throws {
        let tpm = try PrivateTPM()
        let (path, passphrase) = try vaultWithItems(tpm.device)
        try identity(tpm.device).sealWithTPM(pcrs: [16])
        try TPMTestAccess.extendPCR(16, device: tpm.device)
        let vault = try Vault.open(at: path, configuration: configuration(tpm.device))
        try vault.unlock(passphrase: passphrase)
        #expect(try vault.data(matching: .genericPassword(service: "portable", account: "a")) == SecretBytes(utf8: "portable"))
        let error = try #require(throws: LockboxError.self) { try vault.data(matching: .genericPassword(service: "local", account: "a")) }
        #expect(error.code == .authFailed && error.message.contains("PCRs it is bound to changed"))
        #expect(vault.deviceKeyUnavailability?.code == .authFailed)
        vault.lockAll()
    }

    /// Keys cached in the kernel keyring by a process without the device secret hold a mark
    /// for the device-bound classes; a process that has the secret never takes the mark for a key.
    @Test func keysCachedWithoutTheDeviceKey_areNeverServedAsKeys() throws {
        let tpm = try PrivateTPM()
        let other = try PrivateTPM()
        var shared = configuration(tpm.device)
        shared.unlockCache = .kernelKeyring
        let path = directory.file("keychains/cached.lockbox")
        let passphrase = SecretBytes(utf8: "cached passphrase")
        try identity(tpm.device).sealWithTPM()
        let made = try Vault.create(at: path, passphrase: passphrase, configuration: shared)
        defer { made.lockAll() }
        try made.add(
            Item.genericPassword(
                service: "after", account: "a", data: SecretBytes(utf8: "after first unlock, here"), accessibility: .afterFirstUnlockThisDeviceOnly))
        made.lockAll()

        var elsewhere = shared
        elsewhere.device.tpmDevice = other.device
        try Vault.open(at: path, configuration: elsewhere).unlock(passphrase: passphrase)
        let here = try Vault.open(at: path, configuration: shared)
        #expect(try here.data(matching: .genericPassword(service: "after", account: "a")) == SecretBytes(utf8: "after first unlock, here"))
        here.lock()
        let locked = try #require(throws: LockboxError.self) { try here.data(matching: .genericPassword(service: "after", account: "a")) }
        #expect(locked.code == .interactionNotAllowed && locked.message.contains("were not kept"), "\(locked.message)")
        try here.unlock(passphrase: passphrase)
        here.lock()
        #expect(try here.data(matching: .genericPassword(service: "after", account: "a")) == SecretBytes(utf8: "after first unlock, here"))
    }
}
