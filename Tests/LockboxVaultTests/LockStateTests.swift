import Foundation
import KeyProviders
import Lockbox
import LockboxTestSupport
import Testing

@Suite("Lock state, passphrases and the kernel keyring")
struct LockStateTests {
    let query = Query.genericPassword(service: "svc", account: "alice")

    @Test("after lock a whenUnlocked item is errSecInteractionNotAllowed and the key leaves the kernel keyring")
    func lock_makesWhenUnlockedItemUnreadableAndRemovesKey() throws {
        let fixture = try VaultFixture()
        try fixture.vault.add(.genericPassword(service: "svc", account: "alice", data: SecretBytes(utf8: "v")))
        let description = "lockbox:v1:\(fixture.vault.identifier):unlocked"
        #expect((try? KernelKeyring.find(description)) != nil)

        fixture.vault.lock()

        #expect(status { _ = try fixture.vault.data(matching: query) } == -25308)
        #expect(status { _ = try KernelKeyring.find(description) } != nil)
        // The kernel agrees: `keyctl search` finds nothing.
        let search = try run("/usr/bin/keyctl", ["search", "@u", "user", description])
        #expect(search.status != 0)
        // An item that does not exist at all is truthfully "not found" (the lookup index stays
        // readable after the first unlock), while one that exists but is locked is -25308.
        #expect(status { _ = try fixture.vault.data(matching: .genericPassword(service: "svc", account: "nobody")) } == -25300)
        var byLabel = Query(.genericPassword, limit: .all)
        byLabel.attributes.label = "needs the sealed metadata"
        #expect(status { _ = try fixture.vault.items(matching: byLabel) } == -25308)
        #expect(status { try fixture.vault.add(.genericPassword(service: "svc", account: "new", data: SecretBytes(utf8: "x"))) } == -25308)
        #expect(status { try fixture.vault.update(matching: query, to: ItemUpdate(data: SecretBytes(utf8: "x"))) } == -25308)
    }

    @Test("keys changed in the kernel keyring (the same user can) are named beside the file, with lock --all and an unlock before any restore; those fix it")
    func changedKeyringEntry_namesTheKeyringBeforeARestore() throws {
        let fixture = try VaultFixture()
        var item = Item.genericPassword(service: "svc", account: "alice", data: SecretBytes(utf8: "kept"))
        item.attributes.accessibility = .afterFirstUnlock
        try fixture.vault.add(item)
        fixture.vault.lock()
        // The after-first-unlock entry's index root (its first 32 bytes), one bit changed.
        let serial = try KernelKeyring.find("lockbox:v1:\(fixture.vault.identifier):after-first-unlock")
        var payload = try KernelKeyring.read(serial).withUnsafeBytes { Array($0) }
        payload[0] ^= 1
        #expect(KernelKeyring.update(serial, with: payload))
        do {
            _ = try fixture.reopen().data(matching: query)
            Issue.record("read with changed keys")
        } catch let error as LockboxError {
            #expect(error.status == -26275)
            #expect(error.message.contains("kernel keyring") && error.message.contains("lock --all"), "\(error.message)")
        }
        // What `lockbox lock --all` does, then an unlock.
        fixture.vault.lockAll()
        let reopened = try fixture.reopen()
        try reopened.unlock(passphrase: fixture.passphrase)
        #expect(try reopened.data(matching: query) == SecretBytes(utf8: "kept"))
    }

    @Test("a device key file replaced while the vault is unlocked: its portable items stay readable, as status says, and its ThisDeviceOnly items are another device's")
    func deviceKeyReplacedWhileUnlocked_portableItemsReadOn() throws {
        let fixture = try VaultFixture()
        var afu = Item.genericPassword(service: "svc", account: "afu", data: SecretBytes(utf8: "after first unlock"))
        afu.attributes.accessibility = .afterFirstUnlock
        try fixture.vault.add(afu)
        try fixture.vault.add(.genericPassword(service: "svc", account: "unlocked", data: SecretBytes(utf8: "while unlocked")))
        var tdo = Item.genericPassword(service: "svc", account: "tdo", data: SecretBytes(utf8: "this device's"))
        tdo.attributes.accessibility = .whenUnlockedThisDeviceOnly
        try fixture.vault.add(tdo)
        // A new device key file (the old one removed while unlocked): another device identity.
        let replaced = try fixture.reopen { $0.device = DeviceIdentity(keyPath: fixture.directory.file("new-state/device-key")) }
        #expect(try replaced.isUnlocked)
        #expect(try replaced.data(matching: .genericPassword(service: "svc", account: "afu")) == SecretBytes(utf8: "after first unlock"))
        #expect(try replaced.data(matching: .genericPassword(service: "svc", account: "unlocked")) == SecretBytes(utf8: "while unlocked"))
        #expect(status { _ = try replaced.data(matching: .genericPassword(service: "svc", account: "tdo")) } == -25300)
        // Back with the original key file, nothing was lost.
        #expect(try fixture.reopen().data(matching: .genericPassword(service: "svc", account: "tdo")) == SecretBytes(utf8: "this device's"))
    }

    @Test("unlock makes a locked item readable again")
    func unlock_makesItemReadableAgain() throws {
        let fixture = try VaultFixture()
        try fixture.vault.add(.genericPassword(service: "svc", account: "alice", data: SecretBytes(utf8: "v")))
        fixture.vault.lock()
        try fixture.vault.unlock(passphrase: fixture.passphrase)
        #expect(try fixture.vault.data(matching: query) == SecretBytes(utf8: "v"))
    }

    @Test("a wrong passphrase is errSecAuthFailed and leaves the vault locked")
    func wrongPassphrase_throwsAuthFailed() throws {
        let fixture = try VaultFixture()
        try fixture.vault.add(.genericPassword(service: "svc", account: "alice", data: SecretBytes(utf8: "v")))
        fixture.vault.lock()
        #expect(status { try fixture.vault.unlock(passphrase: SecretBytes(utf8: "wrong")) } == -25293)
        #expect(status { _ = try fixture.vault.data(matching: query) } == -25308)
        #expect(try fixture.vault.status().failedUnlockAttempts == 1)
        try fixture.vault.unlock(passphrase: fixture.passphrase)
        #expect(try fixture.vault.status().failedUnlockAttempts == 0)
    }

    @Test("repeated wrong passphrases announce a growing delay")
    func repeatedWrongPassphrases_growTheDelay() throws {
        #expect(Vault.delay(afterFailures: 1) == 0)
        #expect(Vault.delay(afterFailures: 2) == 0)
        #expect(Vault.delay(afterFailures: 3) == 1)
        #expect(Vault.delay(afterFailures: 4) == 2)
        #expect(Vault.delay(afterFailures: 6) == 8)
        #expect(Vault.delay(afterFailures: 50) == 30)
        let fixture = try VaultFixture()
        fixture.vault.lock()
        var lastMessage = ""
        for _ in 0..<3 {
            do {
                try fixture.vault.unlock(passphrase: SecretBytes(utf8: "wrong"))
            } catch {
                lastMessage = error.message
            }
        }
        #expect(lastMessage.contains("attempt 3"))
        #expect(lastMessage.contains("waits 1 s"))
        #expect(try fixture.vault.status().failedUnlockAttempts == 3)
    }

    @Test("a second handle shares the unlocked state through the kernel keyring, and its lock locks both")
    func secondHandle_sharesUnlockAndLock() throws {
        let fixture = try VaultFixture()
        try fixture.vault.add(.genericPassword(service: "svc", account: "alice", data: SecretBytes(utf8: "v")))
        let other = try fixture.reopen()
        #expect(try other.data(matching: query) == SecretBytes(utf8: "v"))
        other.lock()
        #expect(status { _ = try fixture.vault.data(matching: query) } == -25308)
        try fixture.vault.unlock(passphrase: fixture.passphrase)
        #expect(try other.data(matching: query) == SecretBytes(utf8: "v"))
    }

    @Test("with the process-memory cache another handle stays locked")
    func processMemoryCache_doesNotShareUnlock() throws {
        let fixture = try VaultFixture { $0.unlockCache = .processMemory }
        try fixture.vault.add(.genericPassword(service: "svc", account: "alice", data: SecretBytes(utf8: "v")))
        let other = try fixture.reopen()
        #expect(status { _ = try other.data(matching: query) } == -25308)
        try other.unlock(passphrase: fixture.passphrase)
        #expect(try other.data(matching: query) == SecretBytes(utf8: "v"))
    }

    @Test("after the idle timeout a whenUnlocked item is locked again; each use restarts the countdown")
    func idleTimeout_locksWhenUnlockedItems() throws {
        let fixture = try VaultFixture()
        try fixture.vault.add(.genericPassword(service: "svc", account: "alice", data: SecretBytes(utf8: "v")))
        let clock = ManualClock()
        let handle = try fixture.reopen {
            $0.idleTimeout = .seconds(60)
            $0.unlockCache = .processMemory
            $0.clock = clock
        }
        try handle.unlock(passphrase: fixture.passphrase)
        clock.advance(by: .seconds(59))
        #expect(try handle.data(matching: query) == SecretBytes(utf8: "v"))
        clock.advance(by: .seconds(59))
        #expect(try handle.data(matching: query) == SecretBytes(utf8: "v"), "a use did not restart the countdown")
        clock.advance(by: .seconds(60))
        #expect(status { _ = try handle.data(matching: query) } == -25308)
        // The lookup keys stay: this is "locked", and never "not found".
        #expect(status { _ = try handle.data(matching: .genericPassword(service: "svc", account: "nobody")) } == -25300)
        #expect(try handle.status().wasUnlockedSinceBoot)
        try handle.unlock(passphrase: fixture.passphrase)
        #expect(try handle.data(matching: query) == SecretBytes(utf8: "v"))
    }

    @Test("in the kernel keyring the idle timeout is the unlocked key's own countdown, which every process shares")
    func idleTimeout_kernelKeyring_expiresTheKey() throws {
        let fixture = try VaultFixture()
        try fixture.vault.add(.genericPassword(service: "svc", account: "alice", data: SecretBytes(utf8: "v")))
        // The kernel's countdown cannot be moved by a test clock: this one test waits for it,
        // polling, with the shortest timeout the kernel takes (1 s, which ends within 2 s).
        let short = try fixture.reopen { $0.idleTimeout = .seconds(1) }
        try short.unlock(passphrase: fixture.passphrase)
        // Polled in the keyring itself: a read through a handle is a use, which restarts the
        // countdown.
        let description = "lockbox:v1:\(fixture.vault.identifier):unlocked"
        let started = ContinuousClock.now
        while (try? KernelKeyring.find(description)) != nil, ContinuousClock.now - started < .seconds(5) {
            Thread.sleep(forTimeInterval: 0.05)
        }
        #expect(ContinuousClock.now - started < .seconds(5), "the unlocked key never expired")
        #expect(status { _ = try short.data(matching: query) } == -25308)
        #expect(status { _ = try fixture.vault.data(matching: query) } == -25308)
        #expect(try short.status().wasUnlockedSinceBoot)
    }

    @Test("after failed passphrases the next check waits the delay, less the time already passed")
    func failedUnlocks_nextCheckWaitsTheDelay() throws {
        let clock = ManualClock()
        let fixture = try VaultFixture {
            $0.unlockCache = .processMemory
            $0.clock = clock
        }
        let wrong = SecretBytes(utf8: "wrong guess")
        // The first three failures cost nothing; from then on 1, 2, 4 ... s (at most 30).
        for _ in 0..<3 { #expect(status { try fixture.vault.unlock(passphrase: wrong) } == -25293) }
        #expect(clock.sleeps.isEmpty)
        #expect(status { try fixture.vault.unlock(passphrase: wrong) } == -25293)
        #expect(clock.sleeps == [.seconds(1)])
        #expect(status { try fixture.vault.unlock(passphrase: wrong) } == -25293)
        #expect(clock.sleeps == [.seconds(1), .seconds(2)])
        // Time that passed since the last failure counts toward the wait.
        clock.advance(by: .milliseconds(2500))
        try fixture.vault.unlock(passphrase: fixture.passphrase)
        #expect(clock.sleeps == [.seconds(1), .seconds(2), .milliseconds(1500)])
        // A success clears the count: the next failures start again without a wait.
        #expect(status { try fixture.vault.unlock(passphrase: wrong) } == -25293)
        #expect(clock.sleeps.count == 3)
    }

    @Test("on the real clock the fourth failed passphrase really waits its second before answering")
    func failedUnlocks_reallyWaitOnTheSystemClock() throws {
        // The default clock: what the CLI and every application get.
        let fixture = try VaultFixture { $0.unlockCache = .processMemory }
        let wrong = SecretBytes(utf8: "wrong guess")
        for _ in 0..<3 { #expect(status { try fixture.vault.unlock(passphrase: wrong) } == -25293) }
        let started = ContinuousClock.now
        #expect(status { try fixture.vault.unlock(passphrase: wrong) } == -25293)
        let waited = ContinuousClock.now - started
        #expect(waited >= .seconds(1), "the fourth attempt answered after \(waited)")
        #expect(try fixture.vault.status().failedUnlockAttempts == 4)
    }

    @Test("afterFirstUnlock items stay readable after lock and lock at reboot")
    func afterFirstUnlockItems_surviveLockButNotReboot() throws {
        let fixture = try VaultFixture()
        try fixture.vault.add(.genericPassword(service: "svc", account: "alice", data: SecretBytes(utf8: "v"), accessibility: .afterFirstUnlock))
        fixture.vault.lock()
        #expect(try fixture.vault.data(matching: query) == SecretBytes(utf8: "v"))
        fixture.vault.lockAll()
        #expect(status { _ = try fixture.vault.data(matching: query) } == -25308)
        try fixture.vault.unlock(passphrase: fixture.passphrase)
        fixture.vault.lock()
        #expect(try fixture.vault.data(matching: query) == SecretBytes(utf8: "v"))
    }

    @Test("changing the passphrase rotates the keys: every row is resealed, the old passphrase fails, the new one opens every item")
    func changePassphrase_rewrapsSlot() throws {
        let fixture = try VaultFixture()
        for index in 0..<20 {
            try fixture.vault.add(.genericPassword(service: "svc", account: "user\(index)", data: SecretBytes(utf8: "v\(index)")))
        }
        let before = try fixture.vault.withDatabase { database throws(LockboxError) in
            let statement = try database.statement("SELECT group_concat(hex(secret)) FROM items")
            _ = try statement.step()
            return statement.text(0)
        }
        let newPassphrase = SecretBytes(utf8: "a new passphrase")
        try fixture.vault.changePassphrase(from: fixture.passphrase, to: newPassphrase)
        let after = try fixture.vault.withDatabase { database throws(LockboxError) in
            let statement = try database.statement("SELECT group_concat(hex(secret)) FROM items")
            _ = try statement.step()
            return statement.text(0)
        }
        #expect(before != after)
        fixture.vault.lockAll()
        #expect(status { try fixture.vault.unlock(passphrase: fixture.passphrase) } == -25293)
        try fixture.vault.unlock(passphrase: newPassphrase)
        #expect(try fixture.vault.data(matching: .genericPassword(service: "svc", account: "user7")) == SecretBytes(utf8: "v7"))
    }

    @Test("changing the passphrase with a wrong old one is errSecAuthFailed")
    func changePassphraseWithWrongOld_throwsAuthFailed() throws {
        let fixture = try VaultFixture()
        #expect(status { try fixture.vault.changePassphrase(from: SecretBytes(utf8: "nope"), to: SecretBytes(utf8: "new")) } == -25293)
    }

    @Test("a locked keychain deletes nothing: delete is errSecInteractionNotAllowed, as find is")
    func lockedItem_deleteIsRefused() throws {
        let fixture = try VaultFixture()
        try fixture.vault.add(.genericPassword(service: "svc", account: "alice", data: SecretBytes(utf8: "v")))
        try fixture.vault.add(.genericPassword(service: "svc", account: "bob", data: SecretBytes(utf8: "w"), accessibility: .afterFirstUnlock))
        fixture.vault.lock()
        #expect(status { try fixture.vault.delete(matching: query) } == -25308)
        // A query that also matches a readable item deletes nothing either.
        #expect(status { try fixture.vault.delete(matching: .genericPassword(service: "svc")) } == -25308)
        try fixture.vault.unlock(passphrase: fixture.passphrase)
        #expect(try fixture.vault.data(matching: query) == SecretBytes(utf8: "v"))
        #expect(try fixture.vault.delete(matching: .genericPassword(service: "svc")) == 2)
    }

    @Test("before the first unlock every lookup is errSecInteractionNotAllowed")
    func beforeFirstUnlock_lookupsAreLocked() throws {
        let fixture = try VaultFixture()
        try fixture.vault.add(.genericPassword(service: "svc", account: "alice", data: SecretBytes(utf8: "v"), accessibility: .afterFirstUnlock))
        fixture.vault.lockAll()
        let rebooted = try fixture.reopen()
        #expect(status { _ = try rebooted.data(matching: query) } == -25308)
        #expect(status { try rebooted.delete(matching: query) } == -25308)
        #expect(try rebooted.status().readableClasses == [.always, .alwaysThisDeviceOnly])
    }

    @Test("an unlock by a process with another device key (another XDG_STATE_HOME) never makes this device's ThisDeviceOnly items read as damaged: locked at worst, with what to do")
    func unlockWithAnotherDeviceKey_leavesThisDevicesItemsSound() throws {
        let fixture = try VaultFixture { $0.device = DeviceIdentity(keyPath: nil, machineIDPath: "/etc/machine-id") }
        let tdo = Query.genericPassword(service: "svc.tdo", account: "alice")
        var item = Item.genericPassword(service: "svc.tdo", account: "alice", data: SecretBytes(utf8: "this device's"))
        item.attributes.accessibility = .afterFirstUnlockThisDeviceOnly
        try fixture.vault.add(item)
        let other = try fixture.reopen { $0.device = DeviceIdentity(keyPath: fixture.directory.file("other-state/device-key")) }
        try other.unlock(passphrase: fixture.passphrase)
        // The other device key's process: the item is another device's, and a new one of the
        // same name is refused saying so.
        #expect(status { _ = try other.data(matching: tdo) } == -25300)
        var mine = item
        mine.data = SecretBytes(utf8: "the other device's")
        do {
            try other.add(mine)
            Issue.record("an item of the same name as another device's was added")
        } catch {
            #expect(error.status == -25299)
            #expect(error.message.contains("bound to another device key"), "\(error.message)")
        }
        // This device's process, unlocked: reads as before.
        let here = try fixture.reopen()
        #expect(try here.data(matching: tdo) == SecretBytes(utf8: "this device's"))
        // Locked (after first unlock): the kernel keyring holds the other device's keys, so the
        // item reads as locked with what to do, never as damaged (-26275) or absent.
        here.lock()
        let locked = try fixture.reopen()
        do {
            _ = try locked.data(matching: tdo)
            Issue.record("read another device's class key")
        } catch {
            #expect(error.status == -25308)
            #expect(error.message.contains("another device key"), "\(error.message)")
        }
        let report = try Vault.verify(at: fixture.path, configuration: locked.configuration)
        #expect(report.isSound, "\(report.problems)")
        // Unlocked here again, then locked: this device's keys are kept again.
        try locked.unlock(passphrase: fixture.passphrase)
        locked.lock()
        #expect(try fixture.reopen().data(matching: tdo) == SecretBytes(utf8: "this device's"))
    }

    @Test("a handle that read before another process changed the passphrase reads the new file with the new keys, never as damaged")
    func passphraseChangedByAnotherHandle_readsOn() throws {
        let fixture = try VaultFixture()
        try fixture.vault.add(.genericPassword(service: "svc", account: "alice", data: SecretBytes(utf8: "v")))
        var local = Item.genericPassword(service: "svc", account: "bob", data: SecretBytes(utf8: "w"))
        local.attributes.accessibility = .always
        try fixture.vault.add(local)
        let reader = try fixture.reopen()
        #expect(try reader.data(matching: query) == SecretBytes(utf8: "v"))
        let writer = try fixture.reopen()
        try writer.changePassphrase(from: fixture.passphrase, to: SecretBytes(utf8: "another passphrase entirely"))
        // The reader's keys derived from the former header (its `always` class key) are stale.
        #expect(try reader.data(matching: query) == SecretBytes(utf8: "v"))
        #expect(try reader.data(matching: .genericPassword(service: "svc", account: "bob")) == SecretBytes(utf8: "w"))
        try reader.add(.genericPassword(service: "svc", account: "carol", data: SecretBytes(utf8: "x")))
        #expect(try Vault.verify(at: fixture.path, configuration: reader.configuration).isSound)
    }

    @Test("a handle opened while the keychain was locked reads on after another process changes the passphrase (and so unlocks it), never as damaged")
    func passphraseChangedByAnotherHandleWhileLocked_readsOn() throws {
        let fixture = try VaultFixture()
        try fixture.vault.add(.genericPassword(service: "svc", account: "alice", data: SecretBytes(utf8: "v")))
        fixture.vault.lockAll()
        // Opened locked: only what the header gives without an unlock (its `always` class key).
        let reader = try fixture.reopen()
        #expect(status { _ = try reader.data(matching: query) } == -25308)
        let writer = try fixture.reopen()
        try writer.changePassphrase(from: fixture.passphrase, to: SecretBytes(utf8: "another passphrase entirely"))
        #expect(try reader.data(matching: query) == SecretBytes(utf8: "v"))
    }
}
