import Foundation
import Lockbox
import LockboxCore
import LockboxTestSupport
import Testing
import VaultStorage

@testable import LockboxVault

/// The records of deleted synchronizable rows (`sync_deletions`), which sync stamps its
/// tombstones with: an edited record is found, refused and can be dropped alone.
@Suite("Deletion records: checked by verify, refused by sync, dropped on request")
struct DeletionRecordTests {
    /// A vault whose synchronizable items (one per account) were deleted, with their rows' references.
    func vaultWithDeletions(
        _ accounts: [String] = ["first", "second"], clock: ManualClock? = nil
    ) throws -> (VaultFixture, [Data]) {
        let fixture = try VaultFixture { configuration in
            if let clock { configuration.clock = clock }
        }
        var references: [Data] = []
        for account in accounts {
            var item = Item.genericPassword(service: "deleted.example", account: account, data: SecretBytes(utf8: "v-\(account)"))
            item.attributes.synchronizable = true
            item.attributes.accessibility = .afterFirstUnlock
            try fixture.vault.add(item)
            var query = Query.genericPassword(service: "deleted.example", account: account)
            query.synchronizable = .synchronizable
            query.returning = [.attributes]
            references.append(try #require(try fixture.vault.items(matching: query).first?.persistentReference))
        }
        for account in accounts {
            var query = Query.genericPassword(service: "deleted.example", account: account)
            query.synchronizable = .synchronizable
            #expect(try fixture.vault.delete(matching: query) == 1)
        }
        return (fixture, references)
    }

    /// Edits the record of `reference` in the file as an attacker would (`assignment` is SQL).
    func edit(_ raw: Database, _ assignment: String, _ reference: Data) throws {
        let statement = try raw.statement("UPDATE sync_deletions SET \(assignment) WHERE reference = ?")
        statement.bind(1, Array(reference))
        try statement.run()
        statement.reset()
    }

    /// Puts a record back into the file as it was read before.
    func insertRecord(_ raw: Database, _ reference: Data, _ saved: (Int, Int, [UInt8])) throws {
        let insert = try raw.statement("INSERT INTO sync_deletions (reference, deleted_at, generation, mac) VALUES (?, ?, ?, ?)")
        insert.bind(1, Array(reference))
        insert.bind(2, saved.0)
        insert.bind(3, saved.1)
        insert.bind(4, saved.2)
        try insert.run()
        insert.reset()
    }

    /// Moves the clock past the 180 days records are kept and deletes another synchronizable
    /// item: that write prunes the expired records.
    func deleteAfterExpiry(_ fixture: VaultFixture, clock: ManualClock) throws {
        clock.advance(by: .seconds(181 * 24 * 3600))
        try fixture.vault.unlock(passphrase: fixture.passphrase)
        var item = Item.genericPassword(service: "later.example", account: "x", data: SecretBytes(utf8: "later"))
        item.attributes.synchronizable = true
        try fixture.vault.add(item)
        var query = Query.genericPassword(service: "later.example", account: "x")
        query.synchronizable = .synchronizable
        #expect(try fixture.vault.delete(matching: query) == 1)
    }

    func vaultWithTwoDeletions(clock: ManualClock? = nil) throws -> (VaultFixture, first: Data, second: Data) {
        let (fixture, references) = try vaultWithDeletions(clock: clock)
        return (fixture, references[0], references[1])
    }

    @Test("An edited record: verify reports it, sync's lookup refuses it with the way out, and forgetting drops it alone")
    func editedRecordIsFoundAndDroppedAlone() throws {
        let (fixture, first, second) = try vaultWithTwoDeletions()
        let times = try fixture.vault.deletionTimes(of: [first, second])
        #expect(times.count == 2)
        #expect(try Vault.verify(at: fixture.path, configuration: fixture.vault.configuration).isSound)

        // The attacker moves the first delete a day later, so that it would beat later edits.
        let raw = try Database(path: fixture.path, create: false)
        try edit(raw, "deleted_at = deleted_at + 86400000", first)
        #expect(raw.totalChanges == 1)

        let report = try Vault.verify(at: fixture.path, configuration: fixture.vault.configuration)
        #expect(!report.isSound)
        #expect(report.deletionRecords == 2)
        #expect(report.damagedDeletionRecords == 1)
        #expect(report.problems.contains { $0.contains("lockbox sync forget-damaged-deletions") })

        let refused = #expect(throws: LockboxError.self) { try fixture.vault.deletionTimes(of: [first]) }
        #expect(refused?.code == .decode)
        #expect(refused?.message.contains("lockbox sync forget-damaged-deletions") == true)
        // The records are checked as a set: the sound one is refused too until the damaged one goes.
        #expect(status { _ = try fixture.vault.deletionTimes(of: [second]) } == -26275)

        // Only its time was edited: it still shows its own MAC, so the repair can tell that
        // nothing else changed in the set.
        #expect(try fixture.vault.forgetDamagedDeletionRecords() == Vault.DeletionRecordRepair(dropped: 1, acceptedChangedSet: false))
        #expect(try fixture.vault.deletionTimes(of: [first, second]) == [second: times[second]!])
        #expect(try fixture.vault.forgetDamagedDeletionRecords().changedNothing)
        let after = try Vault.verify(at: fixture.path, configuration: fixture.vault.configuration)
        #expect(after.isSound)
        #expect(after.deletionRecords == 1 && after.damagedDeletionRecords == 0)
    }

    @Test("Records whose columns changed storage class or were forged are damaged everywhere; forgetting drops exactly them, and writes nothing when nothing is wrong")
    func storageClassEditsAndForgeriesAreDamaged() throws {
        let (fixture, references) = try vaultWithDeletions(["a", "b", "c", "d"])
        let times = try fixture.vault.deletionTimes(of: references)
        #expect(times.count == 4)
        let generation = try Vault.verify(at: fixture.path, configuration: fixture.vault.configuration).generation
        // Nothing damaged: nothing written.
        #expect(try fixture.vault.forgetDamagedDeletionRecords().changedNothing)
        #expect(try Vault.verify(at: fixture.path, configuration: fixture.vault.configuration).generation == generation)

        let raw = try Database(path: fixture.path, create: false)
        // a: its time as text that SQLite would read as the same number; b: its MAC as text
        // (the same bytes); c: its generation as a real that is not a whole number; and a
        // forged record carrying d's time, generation and MAC under another reference.
        try edit(raw, "deleted_at = deleted_at || 'ms'", references[0])
        try edit(raw, "mac = CAST(mac AS TEXT)", references[1])
        try edit(raw, "generation = generation + 0.5", references[2])
        try raw.execute(
            "INSERT INTO sync_deletions (reference, deleted_at, generation, mac) SELECT X'00112233', deleted_at, generation, mac FROM sync_deletions WHERE reference = X'\(hex(references[3]))'"
        )
        let report = try Vault.verify(at: fixture.path, configuration: fixture.vault.configuration)
        #expect(report.deletionRecords == 5)
        #expect(report.damagedDeletionRecords == 4)
        for reference in references.prefix(3) {
            let refused = #expect(throws: LockboxError.self) { try fixture.vault.deletionTimes(of: [reference]) }
            #expect(refused?.code == .decode)
        }
        #expect(try fixture.vault.forgetDamagedDeletionRecords() == Vault.DeletionRecordRepair(dropped: 4, acceptedChangedSet: true))
        #expect(try raw.firstRow("SELECT count(*) FROM sync_deletions", read: { $0.integer(0) }) == 1)
        #expect(try fixture.vault.deletionTimes(of: references) == [references[3]: times[references[3]]!])
        let after = try Vault.verify(at: fixture.path, configuration: fixture.vault.configuration)
        #expect(after.isSound)
        // Dropping records is a write of the integrity record, which covers their sum.
        #expect(after.generation == generation.map { $0 + 1 })
    }

    @Test("A record removed from the file, or put back after the vault dropped it, no longer adds up: refused, reported, and accepted on request")
    func removedOrReplayedRecordIsFound() throws {
        let clock = ManualClock()
        let (fixture, references) = try vaultWithDeletions(["a", "b"], clock: clock)
        let times = try fixture.vault.deletionTimes(of: references)
        let raw = try Database(path: fixture.path, create: false)
        let saved = try raw.firstRow("SELECT deleted_at, generation, mac FROM sync_deletions WHERE reference = X'\(hex(references[0]))'") {
            ($0.integer(0)!, $0.integer(1)!, $0.blob(2)!)
        }!
        // Removed: every sound record left is refused as a set, verify says so.
        try raw.execute("DELETE FROM sync_deletions WHERE reference = X'\(hex(references[0]))'")
        let refused = #expect(throws: LockboxError.self) { try fixture.vault.deletionTimes(of: [references[1]]) }
        #expect(refused?.code == .decode)
        let report = try Vault.verify(at: fixture.path, configuration: fixture.vault.configuration)
        #expect(!report.isSound && report.damagedDeletionRecords == 0)
        #expect(report.problems.contains { $0.contains("removed or put back") })
        // Put back as it was: it adds up again.
        try insertRecord(raw, references[0], saved)
        #expect(try fixture.vault.deletionTimes(of: references) == times)

        // The vault drops expired records itself; the attacker puts one back from a copy.
        try deleteAfterExpiry(fixture, clock: clock)
        #expect(try fixture.vault.deletionTimes(of: references).isEmpty)
        try insertRecord(raw, references[0], saved)
        let replayed = #expect(throws: LockboxError.self) { try fixture.vault.deletionTimes(of: [references[0]]) }
        #expect(replayed?.code == .decode)

        // Accepted on the user's request: nothing dropped, the set taken as it is.
        #expect(try fixture.vault.forgetDamagedDeletionRecords() == Vault.DeletionRecordRepair(dropped: 0, acceptedChangedSet: true))
        #expect(try fixture.vault.deletionTimes(of: [references[0]]).count == 1)
        #expect(try Vault.verify(at: fixture.path, configuration: fixture.vault.configuration).isSound)
    }

    @Test("A table made again without its key, holding copies of a record, or removed altogether: found, and repaired on request")
    func copiedRecordsAndAMissingTableAreFound() throws {
        let (fixture, references) = try vaultWithDeletions(["a", "b"])
        let raw = try Database(path: fixture.path, create: false)
        // The table rebuilt without its primary key, so that a record can be there twice.
        try raw.execute(
            """
            CREATE TABLE copy AS SELECT * FROM sync_deletions;
            DROP TABLE sync_deletions;
            CREATE TABLE sync_deletions (reference BLOB, deleted_at INTEGER, generation INTEGER, mac BLOB);
            INSERT INTO sync_deletions SELECT * FROM copy;
            INSERT INTO sync_deletions SELECT * FROM copy WHERE reference = X'\(hex(references[0]))';
            DROP TABLE copy;
            """)
        let report = try Vault.verify(at: fixture.path, configuration: fixture.vault.configuration)
        #expect(report.deletionRecords == 3 && report.damagedDeletionRecords == 1)
        #expect(status { _ = try fixture.vault.deletionTimes(of: [references[1]]) } == -26275)
        // Both copies go (which one is genuine cannot be told); the other record stays. The
        // copies show one MAC, the record's own: nothing else in the set changed.
        #expect(try fixture.vault.forgetDamagedDeletionRecords() == Vault.DeletionRecordRepair(dropped: 2, acceptedChangedSet: false))
        #expect(try fixture.vault.deletionTimes(of: references).keys.sorted { $0.lexicographicallyPrecedes($1) } == [references[1]])

        // The table removed: verify and sync say so; the repair makes it again, empty.
        try raw.execute("DROP TABLE sync_deletions")
        let missing = try Vault.verify(at: fixture.path, configuration: fixture.vault.configuration)
        #expect(missing.problems.contains { $0.contains("missing") })
        let refused = #expect(throws: LockboxError.self) { try fixture.vault.deletionTimes(of: references) }
        #expect(refused?.code == .decode)
        #expect(refused?.message.contains("forget-damaged-deletions") == true)
        #expect(try fixture.vault.forgetDamagedDeletionRecords() == Vault.DeletionRecordRepair(dropped: 0, acceptedChangedSet: true))
        #expect(try fixture.vault.deletionTimes(of: references).isEmpty)
        #expect(try Vault.verify(at: fixture.path, configuration: fixture.vault.configuration).isSound)
    }

    @Test("The record relabelled format 5 with its sum emptied, to have a removal summed anew at the next write: refused")
    func relabelledRecordIsRefused() throws {
        let (fixture, references) = try vaultWithDeletions(["a", "b"])
        let raw = try Database(path: fixture.path, create: false)
        try raw.execute("DELETE FROM sync_deletions WHERE reference = X'\(hex(references[0]))'")
        try raw.execute("UPDATE vault_state SET format = 5, accumulators = X''")
        // The handle open before, and a new one (which its open already refuses).
        #expect(status { _ = try fixture.vault.deletionTimes(of: [references[1]]) } == -26275)
        #expect(status {
            try fixture.vault.add(.genericPassword(service: "after.example", account: "x", data: SecretBytes(utf8: "v")))
        } == -26275)
        #expect(status { _ = try fixture.reopen().deletionTimes(of: [references[1]]) } == -26275)
        // Verify refuses the record outright, or reports it.
        let verified = try? Vault.verify(at: fixture.path, configuration: fixture.vault.configuration)
        #expect(verified?.isSound != true)
    }

    @Test("A passphrase change neither blesses a removed record nor is blocked by it")
    func passphraseChangeCarriesTheSum() throws {
        let (fixture, references) = try vaultWithDeletions(["a", "b"])
        let raw = try Database(path: fixture.path, create: false)
        try raw.execute("DELETE FROM sync_deletions WHERE reference = X'\(hex(references[0]))'")
        try fixture.vault.changePassphrase(from: fixture.passphrase, to: SecretBytes(utf8: "another passphrase"))
        // The rebuilt record carried the sum as it was: the removal is still found.
        #expect(status { _ = try fixture.vault.deletionTimes(of: [references[1]]) } == -26275)
        #expect(try fixture.vault.forgetDamagedDeletionRecords().acceptedChangedSet)
        #expect(try fixture.vault.deletionTimes(of: references).count == 1)
    }

    @Test("Old records go at the next synchronizable delete, but a damaged one stays to be reported")
    func pruneKeepsDamagedRecords() throws {
        let clock = ManualClock()
        let (fixture, first, second) = try vaultWithTwoDeletions(clock: clock)
        let raw = try Database(path: fixture.path, create: false)
        // The attacker ages the first record, hoping the prune makes it vanish unnoticed.
        try edit(raw, "deleted_at = 1", first)
        try deleteAfterExpiry(fixture, clock: clock)
        // The sound, expired record went; the damaged one and the new one are there.
        let left = try raw.firstRow("SELECT count(*) FROM sync_deletions", read: { $0.integer(0) })
        #expect(left == 2)
        #expect(try raw.firstRow("SELECT count(*) FROM sync_deletions WHERE reference = X'\(hex(second))'", read: { $0.integer(0) }) == 0)
        let refused = #expect(throws: LockboxError.self) { try fixture.vault.deletionTimes(of: [first]) }
        #expect(refused?.code == .decode)
        #expect(try Vault.verify(at: fixture.path, configuration: fixture.vault.configuration).damagedDeletionRecords == 1)
    }

    @Test("A handle that read while locked finds the records once unlocked (its integrity cache lacked the state key)")
    func recordsReadableAfterUnlockingAHandleThatReadLocked() throws {
        let (fixture, first, _) = try vaultWithTwoDeletions()
        let handle = try fixture.reopen()
        handle.lockAll()
        // A read while locked fills the handle's integrity cache without the state key.
        let locked = #expect(throws: LockboxError.self) { try handle.deletionTimes(of: [first]) }
        #expect(locked?.code == .interactionNotAllowed)
        _ = try? handle.items(matching: Query(.genericPassword, limit: .all))
        try handle.unlock(passphrase: fixture.passphrase)
        #expect(try handle.deletionTimes(of: [first]).count == 1)
    }

    func hex(_ data: Data) -> String { data.map { String(format: "%02x", $0) }.joined() }
}
