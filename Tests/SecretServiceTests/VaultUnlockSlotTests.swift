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
        fixture.vault.forgetLoginSession()

        // In a new login session, Keychain.open takes the first available unlock method: the
        // desktop keyring.
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
        #expect(try keyring.slotKey(vaultIdentifier: identifier).count == 32)
        try fixture.vault.unenroll(keyring)
        #expect(throws: LockboxError.self) { _ = try keyring.slotKey(vaultIdentifier: identifier) }
        fixture.vault.lockAll()
        #expect(throws: LockboxError.self) { try fixture.vault.unlock(with: keyring) }
    }

    @Test("an explicit lock holds: neither status nor find reopens the vault through the desktop keyring; lockbox unlock does",
          arguments: [false, true])
    func explicitLock_holdsUntilExplicitUnlock(all: Bool) throws {
        let keyring = try TestBus.store()
        let fixture = try VaultFixture()
        try fixture.vault.add(.genericPassword(service: "svc", account: "a", data: SecretBytes(utf8: "v")))
        try fixture.vault.enroll(keyring)
        if all { fixture.vault.lockAll() } else { fixture.vault.lock() }
        var options = Keychain.Options(path: fixture.path)
        options.vault = fixture.vault.configuration
        options.secretService = keyring.configuration
        for _ in 0..<3 {
            let opened = try Keychain.open(options)
            #expect(opened.reason.contains("locked in this session"))
            #expect(try opened.vault?.isUnlocked == false)
            #expect(status { _ = try opened.store.data(matching: .genericPassword(service: "svc", account: "a")) } == -25308)
        }
        // The command line: status and find leave it locked, unlock opens it with the keyring.
        let lockbox = try Paths.product("lockbox")
        let statusRun = try runProcess(lockbox, ["--keychain", fixture.path, "status"])
        #expect(statusRun.stdout.contains("locked"))
        #expect(try fixture.vault.isUnlocked == false)
        let unlock = try runProcess(lockbox, ["--keychain", fixture.path, "unlock"])
        #expect(unlock.status == 0, "unlock: \(unlock.stderr)")
        #expect(unlock.stderr.contains("desktop keyring"))
        #expect(try fixture.vault.data(matching: .genericPassword(service: "svc", account: "a")) == SecretBytes(utf8: "v"))
        try fixture.vault.unenroll(keyring)
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

/// `lockbox --backend secret-service` stores in and reads from the desktop keyring.
@Suite("lockbox on the Secret Service backend")
struct CommandLineBackendTests {
    @Test func backendOption_choosesTheSecretService_andStatusSaysWhy() throws {
        _ = try TestBus.address()
        let lockbox = try Paths.product("lockbox")
        let service = TestBus.unique("cli-backend")
        let canary = TestBus.canary()
        let add = try runProcess(lockbox, ["--backend", "secret-service", "add-generic-password", "-s", service, "-a", "alice"], input: Array(canary.utf8))
        #expect(add.status == 0, "add: \(add.stderr)")
        let find = try runProcess(lockbox, ["--backend", "secret-service", "find-generic-password", "-s", service, "-a", "alice", "-w"])
        #expect(find.stdout == canary + "\n")
        // secret-tool, which nobody here wrote, finds what lockbox stored.
        let lookup = try runProcess("/usr/bin/secret-tool", ["lookup", "service", service, "account", "alice"])
        #expect(lookup.stdout.trimmingCharacters(in: .newlines) == canary)
        let status = try runProcess(lockbox, ["--backend", "secret-service", "status"])
        #expect(status.stdout.contains("backend: secret-service (chosen by the application)"))
        #expect(!status.stdout.contains(canary))
        let delete = try runProcess(lockbox, ["--backend", "secret-service", "delete-generic-password", "-s", service, "-a", "alice"])
        #expect(delete.status == 0)
        let bad = try runProcess(lockbox, ["--backend", "plaintext", "status"])
        #expect(bad.status == 64)
    }
}
