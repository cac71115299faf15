import Foundation
import Lockbox
import LockboxTestSupport
import Testing
import VaultStorage

@testable import LockboxVault

/// `data(matching:)` by a primary key answers from the snapshot the handle verified, without
/// the general path: these tests check that it gives exactly the general path's answers, and
/// that an edit of the file after a warm read is still refused.
@Suite("Value read by primary key")
struct ValueReadTests {
    /// alice and bob, each read twice, so that their buckets are verified and the second read
    /// took the direct path.
    func makeWarmVault() throws -> (VaultFixture, Database) {
        let fixture = try VaultFixture()
        try fixture.vault.add(.genericPassword(service: "svcA", account: "alice", data: SecretBytes(utf8: "alice-secret")))
        try fixture.vault.add(.genericPassword(service: "svcB", account: "bob", data: SecretBytes(utf8: "bob-secret")))
        for _ in 0..<2 {
            #expect(try fixture.vault.data(matching: .genericPassword(service: "svcA", account: "alice")) == SecretBytes(utf8: "alice-secret"))
            #expect(try fixture.vault.data(matching: .genericPassword(service: "svcB", account: "bob")) == SecretBytes(utf8: "bob-secret"))
        }
        #expect(fixture.vault.directValueReads >= 2, "the warm reads took the direct path")
        return (fixture, try Database(path: fixture.path, create: false))
    }

    /// The status of reading alice with the warm handle; an issue when any value comes back.
    func aliceStatus(_ vault: Vault) -> Int32? {
        do {
            let value = try vault.data(matching: .genericPassword(service: "svcA", account: "alice"))
            Issue.record("a value came back after the edit: \(value.count) bytes, bob's: \(value == SecretBytes(utf8: "bob-secret"))")
            return nil
        } catch {
            return error.status
        }
    }

    static let edits: [(name: String, sql: String)] = [
        ("the lookup digests swapped",
         """
         CREATE TEMP TABLE saved AS SELECT rowid AS r, lookup_digest AS v FROM items;
         UPDATE items SET lookup_digest = (SELECT v FROM saved WHERE r = 3 - items.rowid);
         """),
        ("the values swapped",
         """
         CREATE TEMP TABLE saved AS SELECT rowid AS r, secret AS v FROM items;
         UPDATE items SET secret = (SELECT v FROM saved WHERE r = 3 - items.rowid);
         """),
        ("the attributes swapped",
         """
         CREATE TEMP TABLE saved AS SELECT rowid AS r, metadata AS v FROM items;
         UPDATE items SET metadata = (SELECT v FROM saved WHERE r = 3 - items.rowid);
         """),
        ("bob's value and attributes copied into alice's row",
         "UPDATE items SET secret = (SELECT secret FROM items WHERE rowid = 2), metadata = (SELECT metadata FROM items WHERE rowid = 2) WHERE rowid = 1"),
        ("an attributes byte flipped", "UPDATE items SET metadata = randomblob(length(metadata)) WHERE rowid = 1"),
        ("a value byte flipped", "UPDATE items SET secret = randomblob(length(secret)) WHERE rowid = 1"),
        ("an item key planted", "UPDATE items SET wrapped_key = randomblob(72) WHERE rowid = 1"),
        ("the bucket column moved", "UPDATE items SET bucket = (bucket + 1) % 256 WHERE rowid = 1"),
        ("the class column changed", "UPDATE items SET item_class = 'internetPassword' WHERE rowid = 1"),
        ("the accessibility changed", "UPDATE items SET accessibility = 'afterFirstUnlock' WHERE rowid = 1"),
        ("the access group changed", "UPDATE items SET access_group = 'other' WHERE rowid = 1"),
        ("the sync flag changed", "UPDATE items SET synchronizable = 1 WHERE rowid = 1"),
        ("the version changed", "UPDATE items SET version = version + 1 WHERE rowid = 1"),
        ("the device changed", "UPDATE items SET device_id = 'another-machine' WHERE rowid = 1"),
        ("the row deleted", "DELETE FROM items WHERE rowid = 1"),
        ("a second row with alice's digest added",
         """
         INSERT INTO items (id, item_class, accessibility, access_group, synchronizable, device_id, access_control,
                            primary_digest, lookup_digest, name_digest, wrapped_key, metadata, secret, format, version, bucket)
         SELECT randomblob(16), item_class, accessibility, access_group, synchronizable, device_id, access_control,
                randomblob(32), (SELECT lookup_digest FROM items WHERE rowid = 1), name_digest, wrapped_key, metadata, secret,
                format, version, (SELECT bucket FROM items WHERE rowid = 1)
         FROM items WHERE rowid = 2
         """),
    ]

    @Test("after a warm read, an edit of the file by another connection is refused, never served",
          arguments: Self.edits.map(\.name))
    func editAfterWarmRead_isRefused(edit: String) throws {
        let (fixture, database) = try makeWarmVault()
        try database.execute(try #require(Self.edits.first { $0.name == edit }).sql)
        #expect(aliceStatus(fixture.vault) == -26275, "\(edit)")
        // A second attempt does not find a way around it either.
        #expect(aliceStatus(fixture.vault) == -26275, "\(edit), read again")
    }

    static let unusualForms: [(name: String, sql: String)] = [
        ("the sync flag stored as text", "UPDATE items SET synchronizable = 'x' WHERE rowid = 1"),
        ("the version stored as text", "UPDATE items SET version = CAST(version AS TEXT) || 'x' WHERE rowid = 1"),
        ("the bucket stored as text", "UPDATE items SET bucket = CAST(bucket AS TEXT) || 'x' WHERE rowid = 1"),
        ("the format stored as text", "UPDATE items SET format = '3' WHERE rowid = 1"),
        ("a group with a NUL inside", "UPDATE items SET access_group = access_group || char(0) || 'x' WHERE rowid = 1"),
        ("a group beyond ASCII", "UPDATE items SET access_group = access_group || char(233) WHERE rowid = 1"),
        ("an accessibility with a NUL inside", "UPDATE items SET accessibility = accessibility || char(0) || 'x' WHERE rowid = 1"),
        ("a device with a NUL first", "UPDATE items SET device_id = char(0) || 'x' WHERE rowid = 1"),
        ("access control with a NUL first", "UPDATE items SET access_control = char(0) || 'x' WHERE rowid = 1"),
        ("an item key stored as text with a NUL first", "UPDATE items SET wrapped_key = CAST(x'00' AS TEXT) WHERE rowid = 1"),
        ("an empty item key stored as text", "UPDATE items SET wrapped_key = '' WHERE rowid = 1"),
    ]

    @Test("columns stored in forms Lockbox does not write get the general read's answer, edited after warm reads",
          arguments: Self.unusualForms.map(\.name))
    func unusualStoredForms_getTheGeneralAnswer(edit: String) throws {
        // Two items that share a lookup digest (one name in two groups): a row skipped for a
        // wrong reason would serve the other.
        let fixture = try VaultFixture()
        try fixture.vault.add(.genericPassword(service: "svc", account: "acct", data: SecretBytes(utf8: "in-lockbox")))
        var team = Item.genericPassword(service: "svc", account: "acct", data: SecretBytes(utf8: "in-team"))
        team.attributes.accessGroup = "team"
        try fixture.vault.add(team)
        let query = Query.genericPassword(service: "svc", account: "acct")
        for _ in 0..<2 { #expect(directAnswer(fixture.vault, query) == "value in-lockbox") }
        #expect(fixture.vault.directValueReads > 0)
        let database = try Database(path: fixture.path, create: false)
        try database.execute(try #require(Self.unusualForms.first { $0.name == edit }).sql)
        // The first read after the edit verifies the file again; the next may read directly.
        for _ in 0..<3 {
            #expect(directAnswer(fixture.vault, query) == generalAnswer(fixture.vault, query), "\(edit)")
        }
    }

    @Test("an older copy of the row put back after this handle's own update is refused")
    func replayAfterOwnUpdate_isRefused() throws {
        let (fixture, database) = try makeWarmVault()
        try database.execute("CREATE TABLE old_row AS SELECT * FROM items WHERE rowid = 1")
        try fixture.vault.update(matching: .genericPassword(service: "svcA", account: "alice"), to: ItemUpdate(data: SecretBytes(utf8: "rotated")))
        let before = fixture.vault.directValueReads
        #expect(try fixture.vault.data(matching: .genericPassword(service: "svcA", account: "alice")) == SecretBytes(utf8: "rotated"))
        #expect(fixture.vault.directValueReads == before + 1, "this handle's own write keeps the direct path")
        try database.execute("DELETE FROM items WHERE rowid = 1; INSERT INTO items SELECT * FROM old_row; DROP TABLE old_row")
        #expect(aliceStatus(fixture.vault) == -26275)
    }

    @Test("another handle's write is seen at once, then read directly again")
    func otherHandlesWrite_isSeen() throws {
        let (fixture, _) = try makeWarmVault()
        let other = try fixture.reopen()
        try other.update(matching: .genericPassword(service: "svcA", account: "alice"), to: ItemUpdate(data: SecretBytes(utf8: "from-the-other")))
        let before = fixture.vault.directValueReads
        #expect(try fixture.vault.data(matching: .genericPassword(service: "svcA", account: "alice")) == SecretBytes(utf8: "from-the-other"))
        #expect(fixture.vault.directValueReads == before, "a changed file is verified by the general path first")
        #expect(try fixture.vault.data(matching: .genericPassword(service: "svcA", account: "alice")) == SecretBytes(utf8: "from-the-other"))
        #expect(fixture.vault.directValueReads == before + 1)
    }

    @Test("a locked vault answers errSecInteractionNotAllowed, never not-found")
    func lockedVault_isNotNotFound() throws {
        let (fixture, _) = try makeWarmVault()
        fixture.vault.lock()
        #expect(status { _ = try fixture.vault.data(matching: .genericPassword(service: "svcA", account: "alice")) } == -25308)
    }

    /// The general path's answer for `query`: the value, or the error's status.
    func generalAnswer(_ vault: Vault, _ query: Query) -> String {
        var query = query
        query.returning = [.data]
        query.limit = .one
        do {
            guard let data = try vault.items(matching: query).first?.data else { return "no data" }
            return "value " + String(decoding: data.withUnsafeBytes { Array($0) }, as: UTF8.self)
        } catch {
            return "status \(error.status)"
        }
    }

    func directAnswer(_ vault: Vault, _ query: Query) -> String {
        do {
            let data = try vault.data(matching: query)
            return "value " + String(decoding: data.withUnsafeBytes { Array($0) }, as: UTF8.self)
        } catch {
            return "status \(error.status)"
        }
    }

    @Test("groups, sync flags, accessibility classes and devices: the same answer as the general read",
          arguments: [nil, ["team"], ["lockbox", "team"]] as [[String]?])
    func answers_equalTheGeneralRead(groups: [String]?) throws {
        let fixture = try VaultFixture()
        func add(_ value: String, account: String = "acct", group: String? = nil, synchronizable: Bool? = nil, accessibility: Accessibility? = nil) throws {
            var item = Item.genericPassword(service: "svc", account: account, data: SecretBytes(utf8: value))
            item.attributes.accessGroup = group
            item.attributes.synchronizable = synchronizable
            item.attributes.accessibility = accessibility
            try fixture.vault.add(item)
        }
        try add("default")
        try add("team", group: "team")
        try add("synced", synchronizable: true, accessibility: .afterFirstUnlock)
        try add("this-device", account: "device", accessibility: .whenUnlockedThisDeviceOnly)
        try add("always", account: "early", accessibility: .always)
        let vault = try fixture.reopen { $0.accessGroups = groups }
        var queries: [Query] = []
        for account in ["acct", "device", "early", "missing"] {
            for group in [nil, "lockbox", "team", "nope"] as [String?] {
                for synchronizable in [.notSynchronizable, .synchronizable, .any] as [Query.SynchronizableMatch] {
                    for accessibility in [nil, .whenUnlocked, .afterFirstUnlock, .always] as [Accessibility?] {
                        var query = Query.genericPassword(service: "svc", account: account, accessGroup: group)
                        query.synchronizable = synchronizable
                        query.attributes.accessibility = accessibility
                        queries.append(query)
                    }
                }
            }
        }
        // Twice: the first reads verify the buckets, the second read directly where they can.
        for _ in 0..<2 {
            for query in queries {
                #expect(directAnswer(vault, query) == generalAnswer(vault, query), "\(query.attributes) \(query.synchronizable)")
            }
        }
        #expect(vault.directValueReads > 0)
    }

    @Test("keys, access-controlled items and other query shapes are answered by the general read")
    func otherShapes_takeTheGeneralRead() throws {
        let fixture = try VaultFixture()
        try fixture.vault.add(.genericPassword(service: "svc", account: "acct", data: SecretBytes(utf8: "value")))
        var labelled = Query.genericPassword(service: "svc", account: "acct")
        labelled.attributes.label = "not-this-one"
        var byName = Query.genericPassword(service: "svc")
        byName.limit = .one
        for _ in 0..<2 {
            #expect(status { _ = try fixture.vault.data(matching: labelled) } == -25300)
            #expect(try fixture.vault.data(matching: byName) == SecretBytes(utf8: "value"))
        }
        #expect(fixture.vault.directValueReads == 0)
    }
}
