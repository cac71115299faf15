import Foundation
import Lockbox
import LockboxCore
import LockboxTestSupport
import Testing
import VaultCrypto
import VaultStorage

@testable import LockboxVault

/// An attacker's and a careless user's review of the write path and the integrity record of
/// schema 4 (the primary-key check inside the writer, record format 4, the remembered
/// generation, the write confirmation): what a write transaction checks of rows it has already
/// changed, and what rebuilds the integrity record.
@Suite("Write path review: checks inside a write, rebuilding the record")
struct WritePathReviewTests {
    static func internetItem(_ server: String) -> Item {
        var item = Item(.internetPassword, attributes: ItemAttributes())
        item.attributes.server = server
        item.attributes.account = "user"
        item.data = SecretBytes(utf8: "internet \(server)")
        return item
    }

    // MARK: Buckets checked after the same transaction changed them

    @Test(
        "a sync batch that adds an item, then deletes a row by reference, applies on a handle that had checked no bucket yet",
        arguments: [false, true])
    func batch_addThenDeleteByReference_freshHandle(concurrently: Bool) throws {
        let fixture = try VaultFixture()
        let added = try fixture.vault.applyChanges(count: 1) { _ throws(LockboxError) -> SyncedChange in .add(Self.internetItem("gone.example")) }
        let reference = try #require(added.references[0])
        // Another process: its handle has verified the record, not one bucket of rows.
        let other = try fixture.reopen()
        // The delete names both classes, as a sync does: the first finds the row but not of its
        // class, and checks every bucket before saying so, the new item's bucket included.
        let changes: [SyncedChange] = [
            .add(.genericPassword(service: "new.example", account: "user", data: SecretBytes(utf8: "new"))),
            .delete(reference: reference, classes: [.genericPassword, .internetPassword]),
        ]
        let applied =
            if concurrently {
                try other.applyChanges(count: 2, concurrently: { index throws(LockboxError) -> SyncedChange in changes[index] })
            } else {
                try other.applyChanges(count: 2) { index throws(LockboxError) -> SyncedChange in changes[index] }
            }
        #expect(applied.references.count == 2 && applied.references[1] == nil)
        #expect(readOutcome(fixture.vault, "new.example", "user") == "new")
        #expect(try Vault.verify(at: fixture.path, configuration: fixture.vault.configuration).isSound)
    }

    @Test("a sync batch that adds an item, then replaces another of the same bucket, applies on a fresh handle")
    func batch_addThenReplaceInSameBucket_freshHandle() throws {
        let fixture = try VaultFixture()
        // Two generic passwords of one service and account, in two access groups: one lookup
        // digest, so one bucket.
        let existing = try fixture.vault.applyChanges(count: 1) { _ throws(LockboxError) -> SyncedChange in
            .add(.genericPassword(service: "svc.example", account: "alice", data: SecretBytes(utf8: "shared"), accessGroup: "team.shared"))
        }
        let reference = try #require(existing.references[0])
        let other = try fixture.reopen()
        var replacement = Item.genericPassword(
            service: "svc.example", account: "alice", data: SecretBytes(utf8: "shared, replaced"), accessGroup: "team.shared")
        replacement.attributes.label = "replaced"
        let changes: [SyncedChange] = [
            .add(.genericPassword(service: "svc.example", account: "alice", data: SecretBytes(utf8: "default"), accessGroup: "default")),
            .replace(reference: reference, with: replacement),
        ]
        _ = try other.applyChanges(count: 2) { index throws(LockboxError) -> SyncedChange in changes[index] }
        #expect(try fixture.vault.data(matching: .genericPassword(service: "svc.example", account: "alice", accessGroup: "default"))
            == SecretBytes(utf8: "default"))
        #expect(try fixture.vault.data(matching: .genericPassword(service: "svc.example", account: "alice", accessGroup: "team.shared"))
            == SecretBytes(utf8: "shared, replaced"))
        #expect(try Vault.verify(at: fixture.path, configuration: fixture.vault.configuration).isSound)
    }

    @Test("a restore that adds an item, then meets an existing one of the same bucket, completes on a fresh handle")
    func restore_addThenExistingInSameBucket_freshHandle() throws {
        let source = try VaultFixture()
        try source.vault.add(.genericPassword(service: "svc.example", account: "alice", data: SecretBytes(utf8: "default"), accessGroup: "default"))
        try source.vault.add(
            .genericPassword(service: "svc.example", account: "alice", data: SecretBytes(utf8: "shared"), accessGroup: "team.shared"))
        let backup = source.directory.file("backup.lockbox-backup")
        let backupPassphrase = SecretBytes(utf8: "backup passphrase")
        _ = try source.vault.backup(to: backup, passphrase: backupPassphrase)

        let target = try VaultFixture()
        try target.vault.add(
            .genericPassword(service: "svc.example", account: "alice", data: SecretBytes(utf8: "kept"), accessGroup: "team.shared"))
        let other = try target.reopen()
        try other.unlock(passphrase: target.passphrase)
        // The backup's first item is new (added), its second exists (kept: it is newer here).
        let summary = try other.restore(from: backup, passphrase: backupPassphrase)
        #expect(summary == Vault.RestoreSummary(added: 1, replaced: 0, kept: 1))
        #expect(try target.vault.data(matching: .genericPassword(service: "svc.example", account: "alice", accessGroup: "default"))
            == SecretBytes(utf8: "default"))
        #expect(try Vault.verify(at: target.path, configuration: target.vault.configuration).isSound)
    }

    // MARK: Two rows of one primary key

    @Test(
        "file: an item hidden from the primary-key check while the same item is added, then shown again, is errSecDecode, not the older value",
        arguments: ["primary_digest", "lookup_digest"])
    func hiddenRowDuringAdd_thenShown_failsClosed(column: String) throws {
        let fixture = try VaultFixture()
        try fixture.vault.add(.genericPassword(service: "svcA", account: "alice", data: SecretBytes(utf8: "alice-old")))
        let database = try Database(path: fixture.path, create: false)
        // The attacker hides the row from the writer's check (a digest replaced)...
        try database.execute("CREATE TABLE kept AS SELECT rowid, \(column) FROM items")
        try database.execute("UPDATE items SET \(column) = randomblob(32)")
        // ... the user, or an app's add-or-update, adds the item again (its only way to set a value) ...
        try fixture.vault.add(.genericPassword(service: "svcA", account: "alice", data: SecretBytes(utf8: "alice-new")))
        // ... and the attacker puts the digest back: both rows are counted in the record.
        try database.execute("UPDATE items SET \(column) = (SELECT \(column) FROM kept WHERE kept.rowid = items.rowid) WHERE rowid IN (SELECT rowid FROM kept); DROP TABLE kept")
        #expect(try database.firstRow("SELECT count(*) FROM items GROUP BY primary_digest ORDER BY 1 DESC") { $0.integer(0) } == 2)
        #expect(readOutcome(fixture.vault, "svcA", "alice") == "status -26275")
        #expect(readOutcome(try fixture.reopen(), "svcA", "alice") == "status -26275")
        var every = Query(.genericPassword, limit: .all, returning: [.data])
        every.attributes.service = "svcA"
        #expect(status { _ = try fixture.vault.items(matching: every) } == -26275)
        #expect(!(try Vault.verify(at: fixture.path, configuration: fixture.vault.configuration).isSound))
    }

    @Test("file: a primary digest stored as text (the same bytes) is refused when read, and lets no add or restore store the item twice")
    func textTypedPrimaryDigest_isStillTheSameKey() throws {
        let fixture = try VaultFixture()
        try fixture.vault.add(.genericPassword(service: "svcA", account: "alice", data: SecretBytes(utf8: "alice-old")))
        let backup = fixture.directory.file("backup.lockbox-backup")
        let backupPassphrase = SecretBytes(utf8: "backup passphrase")
        _ = try fixture.vault.backup(to: backup, passphrase: backupPassphrase)
        let database = try Database(path: fixture.path, create: false)
        try database.execute("UPDATE items SET primary_digest = CAST(primary_digest AS TEXT)")
        #expect(try database.firstRow("SELECT typeof(primary_digest) FROM items") { $0.text(0) } == "text")
        #expect(readOutcome(try fixture.reopen(), "svcA", "alice") == "status -26275")
        // The writer's check does not verify the bucket (an add stays cheap); it must still see
        // the row, or a second one is stored next to it.
        #expect(status { try fixture.vault.add(.genericPassword(service: "svcA", account: "alice", data: SecretBytes(utf8: "alice-new"))) }
            == -25299)
        #expect(status { _ = try fixture.vault.restore(from: backup, passphrase: backupPassphrase) } == -26275)
        #expect(try database.firstRow("SELECT count(*) FROM items") { $0.integer(0) } == 1)
    }

    @Test(
        "file: a column edited to another storage type with the same bytes (counted the same) hides no row from a query",
        arguments: [
            "name_digest = CAST(name_digest AS TEXT)", "synchronizable = 'no'", "access_group = CAST(access_group AS BLOB)",
            "item_class = CAST(item_class AS BLOB)",
        ])
    func columnOfAnotherType_hidesNoRow(edit: String) throws {
        let fixture = try VaultFixture()
        try fixture.vault.add(.genericPassword(service: "svcB", account: "bob", data: SecretBytes(utf8: "bob-secret")))
        let database = try Database(path: fixture.path, create: false)
        try database.execute("UPDATE items SET \(edit)")
        // By its name (the name digest), and in a listing of its group (SQL filters a scan).
        var byName = Query(.genericPassword, limit: .all, returning: [.data])
        byName.attributes.service = "svcB"
        var inGroup = Query(.genericPassword, limit: .all, returning: [.data])
        inGroup.attributes.accessGroup = Vault.defaultAccessGroup
        for query in [byName, inGroup] {
            for vault in [fixture.vault, try fixture.reopen()] {
                let found = Result { try vault.items(matching: query) }
                switch found {
                case .success(let items):
                    #expect(items.map(\.data) == [SecretBytes(utf8: "bob-secret")])
                case .failure(let error):
                    #expect((error as? LockboxError)?.status == -26275)
                }
            }
        }
    }

    // MARK: Rebuilding the integrity record

    /// A vault with alice's item at "alice-old", then at "alice-new"; the older row kept in a
    /// side table, as an attacker keeps an older copy of the file.
    func vaultWithOlderRow() throws -> (VaultFixture, Database) {
        let fixture = try VaultFixture()
        try fixture.vault.add(.genericPassword(service: "svcA", account: "alice", data: SecretBytes(utf8: "alice-old")))
        let database = try Database(path: fixture.path, create: false)
        try database.execute("CREATE TABLE kept AS SELECT * FROM items")
        try fixture.vault.update(matching: .genericPassword(service: "svcA", account: "alice"), to: ItemUpdate(data: SecretBytes(utf8: "alice-new")))
        return (fixture, database)
    }

    /// The older row put back and the integrity record deleted.
    func replayWithoutRecord(_ database: Database) throws {
        try database.execute("DELETE FROM items; INSERT INTO items SELECT * FROM kept; DROP TABLE kept; DELETE FROM vault_state")
    }

    @Test("file: the integrity record deleted under a running process is not rebuilt over a replayed row at the next unlock")
    func deletedRecord_unlock_doesNotBlessReplayedRow() throws {
        let (fixture, database) = try vaultWithOlderRow()
        try replayWithoutRecord(database)
        fixture.vault.lockAll()
        #expect(status { try fixture.vault.unlock(passphrase: fixture.passphrase) } == -26275)
        #expect(readOutcome(fixture.vault, "svcA", "alice") == "status -26275")
        #expect(try database.firstRow("SELECT count(*) FROM vault_state") { $0.integer(0) } == 0)
        #expect(!(try Vault.verify(at: fixture.path, configuration: fixture.vault.configuration).isSound))
    }

    @Test("file: the integrity record deleted is not rebuilt over a replayed row by a passphrase change")
    func deletedRecord_changePassphrase_doesNotBlessReplayedRow() throws {
        let (fixture, database) = try vaultWithOlderRow()
        try replayWithoutRecord(database)
        #expect(status { _ = try fixture.vault.changePassphrase(from: fixture.passphrase, to: SecretBytes(utf8: "another passphrase")) } == -26275)
        #expect(readOutcome(fixture.vault, "svcA", "alice") == "status -26275")
        #expect(try database.firstRow("SELECT count(*) FROM vault_state") { $0.integer(0) } == 0)
    }

    // MARK: Rows counted from the row written (record format 5's add path)

    /// One row of each kind the integrity element distinguishes: no name digest, a device,
    /// access control (an item key sealed to the presence key), synchronizable, a key, each
    /// class, an access group beyond ASCII.
    static func rowOfEveryKind() -> [Item] {
        var noName = Item(.genericPassword, attributes: ItemAttributes())
        noName.attributes.account = "no-service"
        noName.data = SecretBytes(utf8: "no name")
        var thisDevice = Item.genericPassword(
            service: "svc.kinds", account: "device", data: SecretBytes(utf8: "device"), accessibility: .whenUnlockedThisDeviceOnly)
        thisDevice.attributes.label = "this device"
        var controlled = Item.genericPassword(service: "svc.kinds", account: "controlled", data: SecretBytes(utf8: "controlled"))
        controlled.accessControl = .userPresence
        var synchronizable = Item.genericPassword(service: "svc.kinds", account: "synced", data: SecretBytes(utf8: "synced"))
        synchronizable.attributes.synchronizable = true
        var key = Item(.key, attributes: ItemAttributes(), data: SecretBytes(utf8: "key bytes"))
        key.attributes.keyClass = .symmetric
        key.attributes.applicationTag = Data("com.example.kinds".utf8)
        key.attributes.applicationLabel = Data([1, 2, 3])
        var untaggedKey = Item(.key, attributes: ItemAttributes(), data: SecretBytes(utf8: "untagged"))
        untaggedKey.attributes.keyClass = .private
        untaggedKey.attributes.applicationLabel = Data([4, 5, 6])
        var certificate = Item(.certificate, attributes: ItemAttributes(), data: SecretBytes(utf8: "certificate"))
        certificate.attributes.certificateType = 3
        certificate.attributes.issuer = Data("CN=Kinds CA".utf8)
        certificate.attributes.serialNumber = Data([0x01, 0x02])
        return [
            .genericPassword(service: "svc.kinds", account: "plain", data: SecretBytes(utf8: "plain")), noName, thisDevice, controlled,
            synchronizable, internetItem("kinds.example"), key, untaggedKey, certificate,
            .genericPassword(service: "svc.kinds", account: "group", data: SecretBytes(utf8: "group"), accessGroup: "équipe.partagée"),
        ]
    }

    /// A row being written is counted from the `SealedRow` itself; a bucket check and a
    /// recount read the file, in place; the plain way makes a `RowIdentity`. All three must give
    /// the same element for every kind of row, or a row just written reads as tampered (or a
    /// replaced row's old element is subtracted wrongly and the bucket never adds up again).
    @Test("every kind of row counts the same written, read back as a row, as an identity and in place, before and after a replace")
    func rowOfEveryKind_countsTheSameEveryWay() throws {
        let fixture = try VaultFixture()
        for item in Self.rowOfEveryKind() { try fixture.vault.add(item) }
        let database = try Database(path: fixture.path, create: false)
        func compare(_ when: String) throws {
            // Any key shows whether two encodings are the same bytes.
            let key = Crypto.generateKey()
            var fromRows = IntegrityState.empty()
            var fromIdentities = IntegrityState.empty()
            let rows = try database.statement("SELECT \(SealedRow.columns()), \(IntegrityState.RowIdentity.columns) FROM items")
            defer { rows.reset() }
            var count = 0
            while try rows.step() {
                fromRows.add(try SealedRow.read(from: rows), key: key)
                fromIdentities.add(try IntegrityState.RowIdentity(rows, first: 17), key: key)
                count += 1
            }
            #expect(count == Self.rowOfEveryKind().count, "\(when)")
            let recounted = try IntegrityState.recount(database: database, key: key)
            #expect(fromRows.accumulators == fromIdentities.accumulators, "\(when)")
            #expect(fromRows.accumulators == recounted.accumulators, "\(when)")
            // The record the writes sealed, counted from the rows as they were written, is the
            // one the file's rows give.
            #expect(try Vault.verify(at: fixture.path, configuration: fixture.vault.configuration).isSound, "\(when)")
        }
        try compare("after the adds")
        // Each row replaced (its old element removed as read, the new one added as written).
        // The access-controlled row's item key is sealed with the associated data written in
        // place, then sealed to the presence key: it must open through both, before and after.
        let verified = AuthenticationContext(verifier: ScriptedVerifier(.passphrase(VaultFixture.passphraseText)))
        var controlled = Query.genericPassword(service: "svc.kinds", account: "controlled")
        controlled.authenticationContext = verified
        #expect(try fixture.vault.data(matching: controlled) == SecretBytes(utf8: "controlled"))
        for (index, item) in Self.rowOfEveryKind().enumerated() {
            var query = Query(item.itemClass, attributes: item.attributes.primaryKeyOnly(of: item.itemClass))
            query.attributes.accessGroup = item.attributes.accessGroup
            query.synchronizable = item.attributes.synchronizable == true ? .synchronizable : .notSynchronizable
            if item.accessControl != nil { query.authenticationContext = verified }
            try fixture.vault.update(matching: query, to: ItemUpdate(data: SecretBytes(utf8: "replaced \(index)")))
        }
        try compare("after the replaces")
        let reader = try fixture.reopen()
        #expect(readOutcome(reader, "svc.kinds", "plain") == "replaced 0")
        #expect(readOutcome(reader, "svc.kinds", "device") == "replaced 2")
        #expect(try reader.data(matching: controlled) == SecretBytes(utf8: "replaced 3"))
    }

    /// SQLite reads text up to its first NUL, and Lockbox binds it so: an access group holding
    /// one is stored cut there. The row's element and associated data would be made of the
    /// whole string and its file of the cut one: the item could never be read, and every item
    /// of its bucket would read as tampered from then on.
    @Test("an access group holding a NUL is refused at add and update; a query naming one finds and deletes nothing")
    func accessGroupWithNUL_isRefused() throws {
        let fixture = try VaultFixture()
        try fixture.vault.add(.genericPassword(service: "svc.nul", account: "alice", data: SecretBytes(utf8: "kept"), accessGroup: "team"))
        try fixture.vault.add(.genericPassword(service: "svc.nul", account: "bob", data: SecretBytes(utf8: "bob"), accessGroup: "team"))
        #expect(
            status { try fixture.vault.add(.genericPassword(service: "svc.nul", account: "carol", data: SecretBytes(utf8: "x"), accessGroup: "team\u{0}x")) }
                == -50)
        var moved = ItemAttributes()
        moved.accessGroup = "team\u{0}y"
        #expect(status { try fixture.vault.update(matching: .genericPassword(service: "svc.nul", account: "bob"), to: ItemUpdate(attributes: moved)) } == -50)
        // A synced replace comes to the writer without the update's checks of the group.
        let synced = try fixture.vault.applyChanges(count: 1) { _ throws(LockboxError) -> SyncedChange in
            .add(.genericPassword(service: "svc.nul", account: "dave", data: SecretBytes(utf8: "dave"), accessGroup: "team"))
        }
        let reference = try #require(synced.references[0])
        #expect(status {
            _ = try fixture.vault.applyChanges(count: 1) { _ throws(LockboxError) -> SyncedChange in
                .replace(reference: reference, with: .genericPassword(service: "svc.nul", account: "dave", data: SecretBytes(utf8: "x"), accessGroup: "team\u{0}z"))
            }
        } == -50)
        #expect(status { try fixture.vault.delete(matching: .genericPassword(service: "svc.nul", account: "alice", accessGroup: "team\u{0}x")) } == -25300)
        #expect(readOutcome(fixture.vault, "svc.nul", "dave") == "dave")
        #expect(readOutcome(fixture.vault, "svc.nul", "alice") == "kept")
        #expect(readOutcome(fixture.vault, "svc.nul", "bob") == "bob")
        #expect(try Vault.verify(at: fixture.path, configuration: fixture.vault.configuration).isSound)
        #expect(readOutcome(try fixture.reopen(), "svc.nul", "bob") == "bob")
    }

    // MARK: One associated-data encoder for a row's blobs

    /// ``FieldEncoder/truncate(to:)`` only moves the length: a copy made before must keep its
    /// bytes when the original then writes over them, and the reverse.
    @Test("a truncated encoder writing after its prefix leaves a copy of it as it was, and a copy truncated leaves the original")
    func truncatedEncoder_leavesCopiesIntact() {
        var original = FieldEncoder(capacity: 64)
        original.string("prefix")
        let prefixLength = original.byteCount
        original.string("first purpose")
        let copy = original
        let copied = copy.bytes
        original.truncate(to: prefixLength)
        original.string("second")
        #expect(copy.bytes == copied)
        var expected = FieldEncoder()
        expected.string("prefix")
        expected.string("second")
        #expect(original.bytes == expected.bytes)

        var truncatedCopy = original
        truncatedCopy.truncate(to: prefixLength)
        truncatedCopy.string("third")
        #expect(original.bytes == expected.bytes)
        var third = FieldEncoder()
        third.string("prefix")
        third.string("third")
        #expect(truncatedCopy.bytes == third.bytes)
    }
}
