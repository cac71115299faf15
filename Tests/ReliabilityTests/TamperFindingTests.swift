import Foundation
import Lockbox
import LockboxTestSupport
import Testing
import VaultStorage

// What the tamper campaign (scripts/campaign tamper) found in its first runs, kept as tests: each
// plays the attacker who can write the vault file and names the promise it checks.

@Suite("Tamper campaign findings, each refused")
struct TamperFindingTests {
    /// A vault whose device key and unlocked keys stay in a temporary directory and this process.
    func makeFixture(_ state: TemporaryDirectory) throws -> VaultFixture {
        try VaultFixture {
            $0.device = DeviceIdentity(keyPath: state.file("device-key"))
            $0.unlockCache = .processMemory
        }
    }

    // The integrity element of a row covers its id, version and digests, not the plain columns
    // that the query's SQL filters on (item_class, synchronizable, access_group when the query
    // names a group, device_id). An edit of one of them takes the row out of the query's result
    // while its bucket still adds up: the read answers "not found", a deletion nobody noticed.
    static let hidingEdits = [
        "UPDATE items SET synchronizable = 1 WHERE rowid = 1",
        "UPDATE items SET item_class = 'internetPassword' WHERE rowid = 1",
        "UPDATE items SET access_group = 'other.group' WHERE rowid = 1",
        "UPDATE items SET device_id = '0123456789abcdef' WHERE rowid = 1",
    ]

    @Test("a column the query filters on, edited outside Lockbox -> errSecDecode, not errSecItemNotFound",
          arguments: hidingEdits)
    func filteredColumnEdited_failsClosed(edit: String) throws {
        let state = TemporaryDirectory("lockbox-tamper-state")
        let fixture = try makeFixture(state)
        try fixture.vault.add(.genericPassword(service: "svc", account: "alice", data: SecretBytes(utf8: "alice-secret")))
        let database = try Database(path: fixture.path, create: false)
        try database.execute(edit)
        let query = Query.genericPassword(service: "svc", account: "alice", accessGroup: Vault.defaultAccessGroup)
        #expect(status { _ = try fixture.vault.data(matching: query) } == -26275)
        let reopened = try fixture.reopen()
        try reopened.unlock(passphrase: fixture.passphrase)
        #expect(status { _ = try reopened.data(matching: query) } == -26275)
    }

    // A query that names the server (or service) but not the whole primary key, as the git
    // credential helper's does, finds its rows by the name digest and verifies only the buckets of
    // the rows it found: when the row was deleted (or its name digest edited) it finds none,
    // verifies nothing, and answers "not found".
    static let nameQueryEdits = [
        "DELETE FROM items WHERE rowid = 1",
        "UPDATE items SET name_digest = zeroblob(32) WHERE rowid = 1",
    ]

    @Test("a row deleted or its name digest edited, asked for by server and account -> errSecDecode, not errSecItemNotFound",
          arguments: nameQueryEdits)
    func nameQueryAfterDeletion_failsClosed(edit: String) throws {
        let state = TemporaryDirectory("lockbox-tamper-state")
        let fixture = try makeFixture(state)
        try fixture.vault.add(
            Item(.internetPassword, attributes: .internet(server: "git.example.com", account: "alice", protocol: .https),
                 data: SecretBytes(utf8: "git-secret")))
        let query = Query(.internetPassword, attributes: .internet(server: "git.example.com", account: "alice"))
        #expect(try fixture.vault.data(matching: query) == SecretBytes(utf8: "git-secret"))
        let database = try Database(path: fixture.path, create: false)
        try database.execute(edit)
        #expect(status { _ = try fixture.vault.data(matching: query) } == -26275)
        let reopened = try fixture.reopen()
        try reopened.unlock(passphrase: fixture.passphrase)
        #expect(status { _ = try reopened.data(matching: query) } == -26275)
    }

    // `Vault.verify` (`lockbox verify`, the way out the error messages name) opens every row's
    // attributes but not its item key or value; with the index root at hand it checks only the
    // integrity record's index-root MAC, not the `always` one that readers before the first
    // unlock rely on; and it counts a row with another machine's device id as that machine's.
    // Each edit below makes reads fail (closed, or "not found"), yet verify calls the file sound.
    static let verifyBlindSpots = [
        "UPDATE items SET secret = randomblob(length(secret)) WHERE rowid = 1",
        "UPDATE items SET wrapped_key = randomblob(length(wrapped_key)) WHERE rowid = 1",
        // The record's `always` MAC: in the group rows of the highest generation (state format 4).
        "UPDATE integrity_groups SET always_mac = randomblob(length(always_mac)) WHERE generation = (SELECT max(generation) FROM integrity_groups)",
        "UPDATE items SET device_id = '0123456789abcdef' WHERE rowid = 1",
    ]

    @Test("an edit that makes an always item unreadable -> Vault.verify reports a problem",
          arguments: verifyBlindSpots)
    func editBreakingReads_isReportedByVerify(edit: String) throws {
        let state = TemporaryDirectory("lockbox-tamper-state")
        // Keys in the kernel keyring, as after `lockbox unlock`: verify then has every key.
        let fixture = try VaultFixture { $0.device = DeviceIdentity(keyPath: state.file("device-key")) }
        try fixture.vault.add(
            .genericPassword(service: "boot", account: "pin", data: SecretBytes(utf8: "pin-secret"), accessibility: .always))
        let database = try Database(path: fixture.path, create: false)
        try database.execute(edit)
        // A reader before the first unlock (no keys but the device's) does not get the value...
        let early = status {
            let handle = try fixture.reopen { $0.unlockCache = .processMemory }
            _ = try handle.data(matching: .genericPassword(service: "boot", account: "pin"))
        }
        #expect(early != nil)
        // ... and verify, with every key, must say why.
        let report = try Vault.verify(at: fixture.path, configuration: fixture.vault.configuration)
        #expect(!report.isSound, "verify calls the file sound after: \(edit)")
    }

    // The attempt counter's MAC covers the vault id, the count and the time, not the vault's
    // generation: the row as it was before the failures (after any successful unlock it is
    // "0 failures at time 0", the same bytes every time) is accepted when put back.
    @Test("the attempt counter's row replayed from before 4 failed unlocks -> the count stays 4 or more")
    func attemptCounterReplayed_keepsCount() throws {
        let state = TemporaryDirectory("lockbox-tamper-state")
        let fixture = try makeFixture(state)
        let database = try Database(path: fixture.path, create: false)
        let saved = try #require(
            try database.firstRow("SELECT quote(failures), quote(last_failure), quote(mac) FROM unlock_attempts WHERE id = 1") {
                [$0.text(0) ?? "NULL", $0.text(1) ?? "NULL", $0.text(2) ?? "NULL"]
            })
        // The fourth guess waits 1 s: on a clock the test moves, not slept.
        let clock = ManualClock()
        let guesser = try fixture.reopen { $0.clock = clock }
        for _ in 0..<4 {
            #expect(status { try guesser.unlock(passphrase: SecretBytes(utf8: "wrong guess")) } == -25293)
        }
        #expect(clock.sleeps == [.seconds(1)])
        #expect(try guesser.status().failedUnlockAttempts == 4)
        try database.execute(
            "UPDATE unlock_attempts SET failures = \(saved[0]), last_failure = \(saved[1]), mac = \(saved[2]) WHERE id = 1")
        #expect(try fixture.reopen().status().failedUnlockAttempts >= 4)
    }
}
