import Foundation
import Lockbox
import LockboxTestSupport
import Synchronization
import Testing

/// What reading an item gives in a situation.
enum Outcome: String, CustomStringConvertible {
    case readable
    /// errSecInteractionNotAllowed (-25308): exists, cannot be opened now.
    case locked
    /// errSecItemNotFound (-25300): not there (deleted, never restored, or bound to another machine).
    case absent

    var description: String {
        switch self {
        case .readable: "readable"
        case .locked: "locked (-25308)"
        case .absent: "absent (-25300)"
        }
    }
}

/// The seeds' situations. Each has a test named after it, run for every accessibility value,
/// and a row in docs/PROTECTION-CLASSES.md generated from ``expected``.
enum Situation: String, CaseIterable, CustomTestStringConvertible {
    case firstUnlockNotYetDone = "after boot, before the first unlock"
    case firstUnlockDone = "after the first unlock"
    case screenLocked = "locked (lockbox lock)"
    case idleTimeoutPassed = "idle timeout passed"
    case unlockedAgain = "unlocked again after a lock"
    case rebootAfterUse = "reboot (kernel keyring cleared)"
    case passphraseChanged = "passphrase changed, then reboot and unlock"
    case passphraseRemoved = "passphrase removed"
    case backupRestoredOnSameMachine = "items lost, backup restored on the same machine"
    case backupRestoredOnNewMachine = "backup restored on a new machine"
    case vaultFileCopiedToNewMachine = "vault file copied to a new machine, unlocked there"

    var testDescription: String { rawValue }

    static let expected: [Situation: [Accessibility: Outcome]] = {
        func row(_ whenUnlocked: Outcome, _ afterFirstUnlock: Outcome, _ always: Outcome, passcode: Outcome, thisDevice: Outcome? = nil)
            -> [Accessibility: Outcome]
        {
            [
                .whenUnlocked: whenUnlocked, .afterFirstUnlock: afterFirstUnlock, .always: always,
                .whenUnlockedThisDeviceOnly: thisDevice ?? whenUnlocked,
                .afterFirstUnlockThisDeviceOnly: thisDevice ?? afterFirstUnlock,
                .alwaysThisDeviceOnly: thisDevice ?? always,
                .whenPasscodeSetThisDeviceOnly: passcode,
            ]
        }
        return [
            .firstUnlockNotYetDone: row(.locked, .locked, .readable, passcode: .locked),
            .firstUnlockDone: row(.readable, .readable, .readable, passcode: .readable),
            .screenLocked: row(.locked, .readable, .readable, passcode: .locked),
            .idleTimeoutPassed: row(.locked, .readable, .readable, passcode: .locked),
            .unlockedAgain: row(.readable, .readable, .readable, passcode: .readable),
            .rebootAfterUse: row(.locked, .locked, .readable, passcode: .locked),
            .passphraseChanged: row(.readable, .readable, .readable, passcode: .readable),
            .passphraseRemoved: row(.readable, .readable, .readable, passcode: .absent),
            .backupRestoredOnSameMachine: row(.readable, .readable, .readable, passcode: .absent, thisDevice: .absent),
            .backupRestoredOnNewMachine: row(.readable, .readable, .readable, passcode: .absent, thisDevice: .absent),
            .vaultFileCopiedToNewMachine: row(.readable, .readable, .readable, passcode: .absent, thisDevice: .absent),
        ]
    }()
}

/// A vault with one item per accessibility value, and the moves that make each situation.
final class ProtectionScenario {
    let fixture: VaultFixture
    let newPassphrase = SecretBytes(utf8: "a changed passphrase")

    init(idleTimeout: Duration = .seconds(900)) throws {
        fixture = try VaultFixture { $0.idleTimeout = idleTimeout }
        for accessibility in Accessibility.allCases {
            try fixture.vault.add(
                .genericPassword(
                    service: "protection", account: accessibility.rawValue, data: SecretBytes(utf8: "value-\(accessibility.rawValue)"),
                    accessibility: accessibility))
        }
    }

    static func query(_ accessibility: Accessibility) -> Query {
        .genericPassword(service: "protection", account: accessibility.rawValue)
    }

    func outcome(of accessibility: Accessibility, in vault: Vault) -> Outcome {
        do {
            let data = try vault.data(matching: Self.query(accessibility))
            #expect(data == SecretBytes(utf8: "value-\(accessibility.rawValue)"))
            return .readable
        } catch LockboxError.interactionNotAllowed {
            return .locked
        } catch LockboxError.itemNotFound {
            return .absent
        } catch {
            Issue.record("unexpected error for \(accessibility): \(error)")
            return .absent
        }
    }

    /// A second machine: its own device key and machine-id.
    func newMachine() -> DeviceIdentity {
        let machineID = fixture.directory.file("other-machine-id")
        _ = FileManager.default.createFile(atPath: machineID, contents: Data("0123456789abcdef0123456789abcdef\n".utf8))
        return DeviceIdentity(keyPath: fixture.directory.file("other-state/device-key"), machineIDPath: machineID)
    }

    /// Brings the vault into `situation` and returns the handle to read through.
    func enter(_ situation: Situation) throws -> Vault {
        let vault = fixture.vault
        switch situation {
        case .firstUnlockNotYetDone:
            vault.lockAll()
            return try fixture.reopen()
        case .firstUnlockDone:
            vault.lockAll()
            let booted = try fixture.reopen()
            try booted.unlock(passphrase: fixture.passphrase)
            return booted
        case .screenLocked:
            vault.lock()
            return vault
        case .idleTimeoutPassed:
            // A handle that keeps its keys in the process, timed by a clock the test moves: the
            // timeout passes without waiting (the kernel keyring's own countdown is tested in
            // LockStateTests).
            let clock = ManualClock()
            let short = try fixture.reopen {
                $0.idleTimeout = .seconds(60)
                $0.unlockCache = .processMemory
                $0.clock = clock
            }
            try short.unlock(passphrase: fixture.passphrase)
            clock.advance(by: .seconds(60))
            return short
        case .unlockedAgain:
            vault.lock()
            try vault.unlock(passphrase: fixture.passphrase)
            return vault
        case .rebootAfterUse:
            vault.lockAll()
            return try fixture.reopen()
        case .passphraseChanged:
            try vault.changePassphrase(from: fixture.passphrase, to: newPassphrase)
            vault.lockAll()
            let booted = try fixture.reopen()
            try booted.unlock(passphrase: newPassphrase)
            return booted
        case .passphraseRemoved:
            try vault.removePassphrase(fixture.passphrase)
            vault.lockAll()
            let booted = try fixture.reopen()
            try booted.unlock()
            return booted
        case .backupRestoredOnSameMachine:
            let backup = fixture.directory.file("backup.lbx")
            let summary = try vault.backup(to: backup, passphrase: SecretBytes(utf8: "backup pw"))
            #expect(summary.exported == 3 && summary.skippedThisDeviceOnly == 4)
            for accessibility in Accessibility.allCases { try vault.delete(matching: Self.query(accessibility)) }
            let restored = try vault.restore(from: backup, passphrase: SecretBytes(utf8: "backup pw"))
            #expect(restored.added == 3)
            return vault
        case .backupRestoredOnNewMachine:
            let backup = fixture.directory.file("backup.lbx")
            _ = try vault.backup(to: backup, passphrase: SecretBytes(utf8: "backup pw"))
            var configuration = vault.configuration
            configuration.device = newMachine()
            let other = try Vault.create(
                at: fixture.directory.file("other/new.lockbox"), passphrase: SecretBytes(utf8: "other"), configuration: configuration)
            let restored = try other.restore(from: backup, passphrase: SecretBytes(utf8: "backup pw"))
            #expect(restored.added == 3)
            return other
        case .vaultFileCopiedToNewMachine:
            let copy = fixture.directory.file("copied/keychain.lockbox")
            try FileManager.default.createDirectory(
                atPath: (copy as NSString).deletingLastPathComponent, withIntermediateDirectories: true,
                attributes: [.posixPermissions: 0o700])
            try vault.withDatabase { database throws(LockboxError) in try database.execute("PRAGMA wal_checkpoint(TRUNCATE)") }
            try FileManager.default.copyItem(atPath: fixture.path, toPath: copy)
            var configuration = vault.configuration
            configuration.device = newMachine()
            let copied = try Vault.open(at: copy, configuration: configuration)
            try copied.unlock(passphrase: fixture.passphrase)
            let status = try copied.status()
            #expect(status.itemsBoundToOtherMachines == 4)
            return copied
        }
    }
}

@Suite("Protection classes: every situation, every accessibility value")
struct ProtectionClassTests {
    func check(_ situation: Situation, _ accessibility: Accessibility, idleTimeout: Duration = .seconds(900)) throws {
        let scenario = try ProtectionScenario(idleTimeout: idleTimeout)
        let vault = try scenario.enter(situation)
        defer { vault.lockAll() }
        #expect(
            scenario.outcome(of: accessibility, in: vault) == Situation.expected[situation]![accessibility]!,
            "\(situation.rawValue), \(accessibility.rawValue)")
    }

    @Test("after boot, before the first unlock", arguments: Accessibility.allCases)
    func firstUnlockNotYetDone(_ accessibility: Accessibility) throws { try check(.firstUnlockNotYetDone, accessibility) }

    @Test("after the first unlock", arguments: Accessibility.allCases)
    func firstUnlockDone(_ accessibility: Accessibility) throws { try check(.firstUnlockDone, accessibility) }

    @Test("screen locked", arguments: Accessibility.allCases)
    func screenLocked(_ accessibility: Accessibility) throws { try check(.screenLocked, accessibility) }

    @Test("idle timeout passed", arguments: Accessibility.allCases)
    func idleTimeoutPassed(_ accessibility: Accessibility) throws { try check(.idleTimeoutPassed, accessibility) }

    @Test("unlocked again after a lock", arguments: Accessibility.allCases)
    func unlockedAgain(_ accessibility: Accessibility) throws { try check(.unlockedAgain, accessibility) }

    @Test("simulated reboot: a fresh kernel keyring", arguments: Accessibility.allCases)
    func rebootAfterUse(_ accessibility: Accessibility) throws { try check(.rebootAfterUse, accessibility) }

    @Test("passphrase changed", arguments: Accessibility.allCases)
    func passphraseChanged(_ accessibility: Accessibility) throws { try check(.passphraseChanged, accessibility) }

    @Test("passphrase removed", arguments: Accessibility.allCases)
    func passphraseRemoved(_ accessibility: Accessibility) throws { try check(.passphraseRemoved, accessibility) }

    @Test("backup restored on the same machine", arguments: Accessibility.allCases)
    func backupRestoredOnSameMachine(_ accessibility: Accessibility) throws { try check(.backupRestoredOnSameMachine, accessibility) }

    @Test("backup restored on a new machine", arguments: Accessibility.allCases)
    func backupRestoredOnNewMachine(_ accessibility: Accessibility) throws { try check(.backupRestoredOnNewMachine, accessibility) }

    @Test("vault file copied to a new machine", arguments: Accessibility.allCases)
    func vaultFileCopiedToNewMachine(_ accessibility: Accessibility) throws { try check(.vaultFileCopiedToNewMachine, accessibility) }

    @Test("docs/PROTECTION-CLASSES.md shows exactly the table these tests check")
    func documentationTable_matchesTests() throws {
        let path = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
            .deletingLastPathComponent().appendingPathComponent("docs/PROTECTION-CLASSES.md").path
        let table = Self.renderTable()
        if ProcessInfo.processInfo.environment["LOCKBOX_WRITE_DOCS"] == "1" {
            try Self.renderDocument(table).write(toFile: path, atomically: true, encoding: .utf8)
        }
        let document = try String(contentsOfFile: path, encoding: .utf8)
        #expect(document.contains(table), "docs/PROTECTION-CLASSES.md is out of date: run LOCKBOX_WRITE_DOCS=1 swift test --filter documentationTable")
    }

    static func renderTable() -> String {
        let classes = Accessibility.allCases
        var lines = ["| situation | " + classes.map(\.rawValue).joined(separator: " | ") + " |"]
        lines.append("|---|" + classes.map { _ in "---" }.joined(separator: "|") + "|")
        for situation in Situation.allCases {
            let cells = classes.map { Situation.expected[situation]![$0]!.description }
            lines.append("| \(situation.rawValue) | " + cells.joined(separator: " | ") + " |")
        }
        return lines.joined(separator: "\n")
    }

    static func renderDocument(_ table: String) -> String {
        """
        # Protection classes on Linux

        What reading an item of each accessibility class gives in each situation of the seeds'
        list. The table is generated from, and checked by, `Tests/LockboxVaultTests/ProtectionClassTests.swift`
        (`LOCKBOX_WRITE_DOCS=1 swift test --filter documentationTable` rewrites it), so it cannot drift.

        \(table)

        What the situations mean here:

        - **Boot / reboot**: the kernel keyring holds no key of this vault (`lockbox lock --all`
          simulates it; a real reboot clears the kernel keyring).
        - **Locked**: `lockbox lock` (or the API's `lock()`): the master key leaves the kernel
          keyring; the after-first-unlock keys stay until reboot, as on iOS.
        - **Idle timeout**: the kernel forgets the master key after the configured inactivity.
        - **Passphrase removed**: `lockbox remove-passphrase`: the vault then unlocks on this
          machine without a passphrase, like a phone without a passcode;
          `whenPasscodeSetThisDeviceOnly` items (and access-controlled ones) are deleted and that
          class's key is destroyed.
        - **Backups** hold the portable classes only; `*ThisDeviceOnly` items never leave the
          machine, as iCloud Backup never carries them.
        - **New machine**: another device key and `/etc/machine-id`. The copied file opens with
          its passphrase; its `*ThisDeviceOnly` items stay sealed and invisible ("absent"), and
          `lockbox status` counts them under "unavailable here".
        - `always` and `alwaysThisDeviceOnly` are deprecated by Apple and the weakest classes:
          their keys need no unlock at all, only the file (and, for the second, this machine's
          device key).

        """
    }
}

/// Records how often a verifier was asked, and answers as told.
final class ScriptedVerifier: PresenceVerifier {
    enum Answer: Sendable {
        case passphrase(String)
        case cancel
    }

    let answer: Answer
    private let count = Mutex(0)
    var calls: Int { count.withLock { $0 } }

    init(_ answer: Answer) { self.answer = answer }

    func passphrase(for request: AuthenticationRequest) throws(LockboxError) -> SecretBytes {
        count.withLock { $0 += 1 }
        switch answer {
        case .passphrase(let text): return SecretBytes(utf8: text)
        case .cancel: throw LockboxError(.userCanceled, "The user cancelled.")
        }
    }
}

/// A verifier that signals when asked and answers only when told to.
final class GatedVerifier: PresenceVerifier {
    let asked = DispatchSemaphore(value: 0)
    let answer = DispatchSemaphore(value: 0)
    let done = DispatchSemaphore(value: 0)
    private let passphrase: String
    private let outcome = Mutex<Result<SecretBytes, LockboxError>?>(nil)
    var result: Result<SecretBytes, LockboxError>? { outcome.withLock { $0 } }

    init(_ passphrase: String) { self.passphrase = passphrase }

    func passphrase(for request: AuthenticationRequest) throws(LockboxError) -> SecretBytes {
        asked.signal()
        answer.wait()
        return SecretBytes(utf8: passphrase)
    }

    func finished(_ result: Result<SecretBytes, LockboxError>) {
        outcome.withLock { $0 = result }
        done.signal()
    }
}

@Suite("Access control, access groups and accessibility changes")
struct AccessControlTests {
    let query = Query.genericPassword(service: "bank", account: "alice")

    func protectedVault(_ control: AccessControl = .userPresence) throws -> VaultFixture {
        let fixture = try VaultFixture()
        var item = Item.genericPassword(service: "bank", account: "alice", data: SecretBytes(utf8: "pin-1234"))
        item.accessControl = control
        try fixture.vault.add(item)
        return fixture
    }

    func read(_ vault: Vault, context: AuthenticationContext?) -> Result<SecretBytes, LockboxError> {
        var query = query
        query.authenticationContext = context
        do {
            return .success(try vault.data(matching: query))
        } catch {
            return .failure(error)
        }
    }

    @Test("user presence given: the passphrase re-entered releases the item")
    func userPresenceGiven_releasesItem() throws {
        let fixture = try protectedVault()
        let verifier = ScriptedVerifier(.passphrase(VaultFixture.passphraseText))
        #expect(try read(fixture.vault, context: AuthenticationContext(verifier: verifier)).get() == SecretBytes(utf8: "pin-1234"))
        #expect(verifier.calls == 1)
    }

    @Test("biometric prompt cancelled: errSecUserCanceled (-128)")
    func presenceCancelled_throwsUserCanceled() throws {
        let fixture = try protectedVault()
        let result = read(fixture.vault, context: AuthenticationContext(verifier: ScriptedVerifier(.cancel)))
        #expect(result.failureStatus == -128)
    }

    @Test("user presence failed (wrong passphrase): errSecAuthFailed (-25293)")
    func presenceFailed_throwsAuthFailed() throws {
        let fixture = try protectedVault()
        let result = read(fixture.vault, context: AuthenticationContext(verifier: ScriptedVerifier(.passphrase("guess"))))
        #expect(result.failureStatus == -25293)
    }

    @Test("no verifier or interaction not allowed: -25308, and existence can still be tested")
    func interactionNotAllowed_failsButExistenceIsKnown() throws {
        let fixture = try protectedVault()
        let verifier = ScriptedVerifier(.passphrase(VaultFixture.passphraseText))
        let silent = AuthenticationContext(verifier: verifier, interactionNotAllowed: true)
        #expect(read(fixture.vault, context: silent).failureStatus == -25308)
        #expect(read(fixture.vault, context: nil).failureStatus == -25308)
        var existence = query
        existence.authenticationContext = silent
        #expect(try fixture.vault.contains(existence))
        #expect(verifier.calls == 0)
    }

    @Test("the reuse window spares a second prompt; after it expires the user is asked again")
    func reuseWindow_expires() throws {
        let fixture = try protectedVault()
        let verifier = ScriptedVerifier(.passphrase(VaultFixture.passphraseText))
        let clock = ManualClock()
        let context = AuthenticationContext(verifier: verifier, reuseDuration: .seconds(30), interactionNotAllowed: false, clock: clock)
        _ = try read(fixture.vault, context: context).get()
        clock.advance(by: .seconds(30))
        _ = try read(fixture.vault, context: context).get()
        #expect(verifier.calls == 1)
        // The window runs from the verification, not from the last use.
        clock.advance(by: .milliseconds(1))
        _ = try read(fixture.vault, context: context).get()
        #expect(verifier.calls == 2)
        // The default window is 0: every access asks.
        let strict = ScriptedVerifier(.passphrase(VaultFixture.passphraseText))
        let strictContext = AuthenticationContext(verifier: strict)
        _ = try read(fixture.vault, context: strictContext).get()
        _ = try read(fixture.vault, context: strictContext).get()
        #expect(strict.calls == 2)
    }

    @Test("the user is asked outside the vault's lock: lock() and other reads do not wait behind an open prompt")
    func prompt_doesNotHoldTheVaultLock() throws {
        let fixture = try protectedVault()
        try fixture.vault.add(.genericPassword(service: "plain", account: "bob", data: SecretBytes(utf8: "open")))
        let verifier = GatedVerifier(VaultFixture.passphraseText)
        var protected = query
        protected.authenticationContext = AuthenticationContext(verifier: verifier)
        let vault = fixture.vault
        let asked = protected
        let reader = Thread { verifier.finished(Result { () throws(LockboxError) in try vault.data(matching: asked) }) }
        reader.start()
        // The prompt is open (the reader waits in the verifier) ...
        #expect(verifier.asked.wait(timeout: .now() + 30) == .success, "the verifier was never asked")
        // ... and another thread's read and lock() go through, without waiting for it (were
        // they to wait, the timeout fails the test and the answer then releases them).
        let others = DispatchSemaphore(value: 0)
        let plain = Mutex<SecretBytes?>(nil)
        Thread {
            plain.withLock { $0 = try? vault.data(matching: .genericPassword(service: "plain", account: "bob")) }
            vault.lock()
            others.signal()
        }.start()
        let waitedBehindPrompt = others.wait(timeout: .now() + 20) == .timedOut
        #expect(!waitedBehindPrompt, "a read and lock() waited behind the open prompt")
        if waitedBehindPrompt {
            verifier.answer.signal()
            others.wait()
        }
        #expect(plain.withLock { $0 } == SecretBytes(utf8: "open"))
        #expect(try !vault.isUnlocked)
        // The answer arrives after the lock: the locked vault gives nothing.
        verifier.answer.signal()
        #expect(verifier.done.wait(timeout: .now() + 30) == .success, "the read never finished")
        #expect(verifier.result?.failureStatus == -25308)
        // Unlocked again, the same prompt releases the item.
        try vault.unlock(passphrase: SecretBytes(utf8: VaultFixture.passphraseText))
        let again = GatedVerifier(VaultFixture.passphraseText)
        again.answer.signal()
        protected.authenticationContext = AuthenticationContext(verifier: again)
        #expect(try vault.data(matching: protected) == SecretBytes(utf8: "pin-1234"))
    }

    // Deleting is not guarded, as on iOS: Apple's SecAccessControlCreateWithFlags grants the
    // delete operation unconditionally (SecAccessControl.c:
    // `SecAccessControlAddConstraintForOperation(access_control, kAKSKeyOpDelete, kCFBooleanTrue)`).
    @Test("updating an access-controlled item needs the user; deleting it does not")
    func update_needsPresence_deleteDoesNot() throws {
        let fixture = try protectedVault()
        #expect(throws: LockboxError.self) { try fixture.vault.update(matching: query, to: ItemUpdate(data: SecretBytes(utf8: "x"))) }
        var withUser = query
        let verifier = ScriptedVerifier(.passphrase(VaultFixture.passphraseText))
        withUser.authenticationContext = AuthenticationContext(verifier: verifier)
        try fixture.vault.update(matching: withUser, to: ItemUpdate(data: SecretBytes(utf8: "pin-5678")))
        #expect(try fixture.vault.data(matching: withUser) == SecretBytes(utf8: "pin-5678"))
        let callsBeforeDelete = verifier.calls
        var noUser = query
        noUser.authenticationContext = AuthenticationContext(interactionNotAllowed: true)
        #expect(try fixture.vault.delete(matching: noUser) == 1)
        #expect(verifier.calls == callsBeforeDelete)
        #expect(!(try fixture.vault.contains(query)))
        // A locked keychain still deletes nothing.
        let second = try protectedVault()
        second.vault.lockAll()
        #expect(status { try second.vault.delete(matching: query) } == -25308)
    }

    @Test("the verification is the key: an item copied without its presence layer cannot be opened")
    func presenceLayer_cannotBeSkipped() throws {
        let fixture = try protectedVault()
        // Clearing the column that says "access-controlled" does not make the key readable:
        // the item key is still sealed to the presence key, and the column is authenticated.
        try fixture.vault.withDatabase { database throws(LockboxError) in try database.execute("UPDATE items SET access_control = ''") }
        #expect(read(fixture.vault, context: nil).failureStatus == -26275)
    }

    @Test("biometry cannot be satisfied on Linux: errSecAuthFailed, never the data")
    func biometry_isUnavailable() throws {
        let fixture = try protectedVault(AccessControl(.biometryCurrentSet))
        let result = read(fixture.vault, context: AuthenticationContext(verifier: ScriptedVerifier(.passphrase(VaultFixture.passphraseText))))
        #expect(result.failureStatus == -25293)
    }

    @Test("removing the passphrase deletes access-controlled items; adding one then needs a passphrase")
    func passphraseRemoval_deletesAccessControlledItems() throws {
        let fixture = try protectedVault()
        #expect(try fixture.vault.removePassphrase(fixture.passphrase) == 1)
        #expect(!(try fixture.vault.contains(query)))
        var item = Item.genericPassword(service: "bank", account: "bob", data: SecretBytes(utf8: "x"))
        item.accessControl = .devicePasscode
        #expect(throws: LockboxError.self) { try fixture.vault.add(item) }
        let passcode = Item.genericPassword(service: "p", account: "a", data: SecretBytes(utf8: "x"), accessibility: .whenPasscodeSetThisDeviceOnly)
        do {
            try fixture.vault.add(passcode)
            Issue.record("a whenPasscodeSetThisDeviceOnly item was added without a passphrase")
        } catch {
            #expect(error.status == -25291)
            #expect(error.message.contains("set-passphrase"))
        }
        try fixture.vault.setPassphrase(SecretBytes(utf8: "new one"))
        try fixture.vault.add(passcode)
    }

    @Test("access-group isolation: other groups' items read, list, update and delete as not found")
    func accessGroups_isolateAsNotFound() throws {
        let fixture = try VaultFixture()
        try fixture.vault.add(.genericPassword(service: "s", account: "a", data: SecretBytes(utf8: "A"), accessGroup: "group.a"))
        try fixture.vault.add(.genericPassword(service: "s", account: "b", data: SecretBytes(utf8: "B"), accessGroup: "group.b"))
        let onlyA = try fixture.reopen { $0.accessGroups = ["group.a"] }
        #expect(try onlyA.data(matching: .genericPassword(service: "s", account: "a")) == SecretBytes(utf8: "A"))
        let other = Query.genericPassword(service: "s", account: "b")
        #expect(status { _ = try onlyA.data(matching: other) } == -25300)
        #expect(status { _ = try onlyA.data(matching: .genericPassword(service: "s", account: "b", accessGroup: "group.b")) } == -25300)
        #expect(try onlyA.items(matching: Query(.genericPassword, limit: .all)).count == 1)
        #expect(status { try onlyA.update(matching: other, to: ItemUpdate(data: SecretBytes(utf8: "x"))) } == -25300)
        #expect(status { try onlyA.delete(matching: other) } == -25300)
        #expect(status { try onlyA.add(.genericPassword(service: "s", account: "c", data: SecretBytes(utf8: "C"), accessGroup: "group.b")) } == -34018)
        // Items added without a group go to the store's first group.
        try onlyA.add(.genericPassword(service: "s", account: "d", data: SecretBytes(utf8: "D")))
        #expect(try fixture.vault.item(matching: .genericPassword(service: "s", account: "d")).attributes.accessGroup == "group.a")
        #expect(try fixture.vault.data(matching: other) == SecretBytes(utf8: "B"))
    }

    @Test("changing an item's accessibility in place rewraps its key and keeps its data")
    func accessibilityChange_rewrapsInPlace() throws {
        let fixture = try VaultFixture()
        try fixture.vault.add(.genericPassword(service: "s", account: "a", data: SecretBytes(utf8: "token")))
        var change = ItemAttributes()
        change.accessibility = .afterFirstUnlockThisDeviceOnly
        try fixture.vault.update(matching: .genericPassword(service: "s", account: "a"), to: ItemUpdate(attributes: change))
        fixture.vault.lock()
        let item = try fixture.vault.item(matching: .genericPassword(service: "s", account: "a"))
        #expect(item.data == SecretBytes(utf8: "token"))
        #expect(item.attributes.accessibility == .afterFirstUnlockThisDeviceOnly)
    }
}

@Suite("Backups")
struct BackupTests {
    @Test("a backup never holds ThisDeviceOnly or access-controlled items, nor any secret in clear")
    func backup_leavesOutDeviceBoundItemsAndSealsTheRest() throws {
        let fixture = try VaultFixture()
        let canary = makeCanary()
        try fixture.vault.add(.genericPassword(service: "portable", account: "a", data: SecretBytes(utf8: canary)))
        try fixture.vault.add(.genericPassword(service: "bound", account: "a", data: SecretBytes(utf8: canary), accessibility: .afterFirstUnlockThisDeviceOnly))
        var controlled = Item.genericPassword(service: "controlled", account: "a", data: SecretBytes(utf8: canary))
        controlled.accessControl = .userPresence
        try fixture.vault.add(controlled)
        let file = fixture.directory.file("backup.lbx")
        let summary = try fixture.vault.backup(to: file, passphrase: SecretBytes(utf8: "backup pw"))
        #expect(summary == Vault.BackupSummary(exported: 1, skippedThisDeviceOnly: 1, skippedAccessControlled: 1))
        #expect(filesContaining(canary, in: fixture.directory.path).isEmpty)
        #expect(filesContaining("portable", in: fixture.directory.path).isEmpty)
        let mode = try FileManager.default.attributesOfItem(atPath: file)[.posixPermissions] as? Int
        #expect(mode == 0o600)
    }

    @Test("a wrong backup passphrase is errSecAuthFailed; a damaged backup errSecDecode")
    func wrongPassphraseOrDamage_failClosed() throws {
        let fixture = try VaultFixture()
        try fixture.vault.add(.genericPassword(service: "s", account: "a", data: SecretBytes(utf8: "v")))
        let file = fixture.directory.file("backup.lbx")
        _ = try fixture.vault.backup(to: file, passphrase: SecretBytes(utf8: "right"))
        do {
            _ = try fixture.vault.restore(from: file, passphrase: SecretBytes(utf8: "wrong"))
            Issue.record("a wrong backup passphrase restored")
        } catch {
            #expect(error.status == -25293)
        }
        var bytes = try Data(contentsOf: URL(fileURLWithPath: file))
        bytes[bytes.count - 5] ^= 1
        try bytes.write(to: URL(fileURLWithPath: file))
        do {
            _ = try fixture.vault.restore(from: file, passphrase: SecretBytes(utf8: "right"))
            Issue.record("a damaged backup restored")
        } catch {
            #expect(error.status == -25293 || error.status == -26275)
        }
    }

    @Test("restoring merges: new items added, the newer copy wins, ties keep the existing item")
    func restore_mergesByModificationDate() throws {
        // A second vault holds an older copy of one item, made before everything else. One
        // clock for both vaults, moved between the writes, orders their modification dates.
        let clock = ManualClock()
        let second = try VaultFixture { $0.clock = clock }
        try second.vault.add(.genericPassword(service: "s", account: "old-in-vault", data: SecretBytes(utf8: "ancient")))
        clock.advance(by: .seconds(1))
        let fixture = try VaultFixture { $0.clock = clock }
        try fixture.vault.add(.genericPassword(service: "s", account: "old-in-vault", data: SecretBytes(utf8: "vault-1")))
        try fixture.vault.add(.genericPassword(service: "s", account: "same", data: SecretBytes(utf8: "same")))
        try fixture.vault.add(.genericPassword(service: "s", account: "only-in-backup", data: SecretBytes(utf8: "backup")))
        let file = fixture.directory.file("backup.lbx")
        _ = try fixture.vault.backup(to: file, passphrase: SecretBytes(utf8: "pw"))
        clock.advance(by: .seconds(1))
        try fixture.vault.update(matching: .genericPassword(service: "s", account: "old-in-vault"), to: ItemUpdate(data: SecretBytes(utf8: "vault-2")))
        try fixture.vault.delete(matching: .genericPassword(service: "s", account: "only-in-backup"))
        let summary = try fixture.vault.restore(from: file, passphrase: SecretBytes(utf8: "pw"))
        #expect(summary == Vault.RestoreSummary(added: 1, replaced: 0, kept: 2))
        #expect(try fixture.vault.data(matching: .genericPassword(service: "s", account: "old-in-vault")) == SecretBytes(utf8: "vault-2"))
        #expect(try fixture.vault.data(matching: .genericPassword(service: "s", account: "only-in-backup")) == SecretBytes(utf8: "backup"))
        // Restored into a vault holding an older copy: the backup's newer copy replaces it.
        let newer = fixture.directory.file("newer.lbx")
        _ = try fixture.vault.backup(to: newer, passphrase: SecretBytes(utf8: "pw"))
        let older = second.directory.file("older.lbx")
        _ = try second.vault.backup(to: older, passphrase: SecretBytes(utf8: "pw"))
        let merged = try fixture.vault.restore(from: older, passphrase: SecretBytes(utf8: "pw"))
        #expect(merged.kept == 1)
        let intoOlder = try second.vault.restore(from: newer, passphrase: SecretBytes(utf8: "pw"))
        #expect(intoOlder.replaced == 1)
        #expect(try second.vault.data(matching: .genericPassword(service: "s", account: "old-in-vault")) == SecretBytes(utf8: "vault-2"))
    }

    @Test("a backup taken while another process writes is consistent")
    func backupDuringConcurrentWrites_isConsistent() throws {
        let fixture = try VaultFixture()
        let writer = Process()
        writer.executableURL = URL(fileURLWithPath: builtProduct("lockbox-stress"))
        writer.arguments = ["write", "--keychain", fixture.path, "--prefix", "w", "--count", "300"]
        writer.standardOutput = Pipe()
        try writer.run()
        var counts: [Int] = []
        for index in 0..<4 {
            let file = fixture.directory.file("during-\(index).lbx")
            counts.append(try fixture.vault.backup(to: file, passphrase: SecretBytes(utf8: "pw")).exported)
            let target = try VaultFixture()
            let restored = try target.vault.restore(from: file, passphrase: SecretBytes(utf8: "pw"))
            #expect(restored.added == counts.last)
            // Every restored item: the writer's ("stress") and the counter they all update.
            let all = Query(.genericPassword, limit: .all, returning: [.data, .attributes])
            guard restored.added > 0 else {
                // Taken before the writer's first item: an empty backup restores nothing.
                #expect(status { _ = try target.vault.items(matching: all) } == -25300)
                continue
            }
            let items = try target.vault.items(matching: all)
            #expect(items.count == restored.added)
            for item in items where item.attributes.service == "stress" {
                #expect(item.data == SecretBytes(utf8: "value-\(item.attributes.account ?? "")"))
            }
        }
        writer.waitUntilExit()
        #expect(writer.terminationStatus == 0)
        #expect(counts == counts.sorted())
    }
}

extension Result where Failure == LockboxError {
    var failureStatus: Int32? {
        if case .failure(let error) = self { return error.status }
        return nil
    }
}
