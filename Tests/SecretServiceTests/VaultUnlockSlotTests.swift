import Foundation
import Lockbox
import LockboxTestSupport
import SecretService
import Testing

/// The vault's master-key slot kept in the desktop keyring.
@Suite("The Secret Service as an unlock method for the vault")
struct VaultUnlockSlotTests {
    @Test func enrolledVault_opensWithTheDesktopSession_withoutItsPassphrase() throws {
        let keyring = try TestBus.store()
        let fixture = try VaultFixture()
        try fixture.vault.add(.genericPassword(service: "svc", account: "a", data: SecretBytes(utf8: "v")))
        try fixture.vault.enroll(keyring)
        #expect(fixture.vault.enrolledKeepers == ["secret-service"])
        #expect(try fixture.vault.status().unlockMethods == ["passphrase", "secret-service"])
        fixture.vault.lockAll()

        // Keychain.open takes the first available unlock method: the desktop keyring.
        var options = Keychain.Options(path: fixture.path)
        options.vault = fixture.vault.configuration
        options.secretService = keyring.configuration
        let opened = try Keychain.open(options)
        #expect(opened.reason.contains("desktop keyring"))
        #expect(try opened.store.data(matching: .genericPassword(service: "svc", account: "a")) == SecretBytes(utf8: "v"))

        // The passphrase still works, and unenrolling removes the key from the keyring.
        fixture.vault.lockAll()
        try fixture.vault.unlock(passphrase: fixture.passphrase)
        let identifier = fixture.vault.identifier
        #expect(try keyring.vaultKey(vaultIdentifier: identifier).count == 32)
        try fixture.vault.unenroll(keyring)
        #expect(throws: LockboxError.self) { _ = try keyring.vaultKey(vaultIdentifier: identifier) }
        fixture.vault.lockAll()
        #expect(throws: LockboxError.self) { try fixture.vault.unlock(with: keyring) }
    }

    @Test func lockedDesktopKeyring_leavesTheVaultLocked_andSaysWhy() throws {
        let fresh = try FreshCollection()
        let fixture = try VaultFixture()
        try fixture.vault.enroll(fresh.store)
        fixture.vault.lockAll()
        let locked = try runProcess(Paths.secretServiceScript, ["lock", fresh.path])
        #expect(locked.status == 0, "lock failed: \(locked.stderr)")
        do {
            try fixture.vault.unlock(with: fresh.store)
            Issue.record("a locked desktop keyring unlocked the vault")
        } catch {
            // Locked is never "not found": the vault stays locked and says the keyring is locked.
            #expect(error.status == -25308)
        }
        #expect(try fixture.vault.status().isUnlocked == false)
    }
}
