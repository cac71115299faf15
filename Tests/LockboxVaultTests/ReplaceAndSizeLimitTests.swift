import Foundation
import Lockbox
import LockboxTestSupport
import Testing

@testable import LockboxVault

@Suite("Replacing an item's attributes, and whose size limit applies")
struct ReplaceAndSizeLimitTests {
    static func reference(_ vault: Vault, service: String, account: String) throws -> Data {
        var query = Query.genericPassword(service: service, account: account)
        query.returning = [.attributes, .persistentReference]
        query.synchronizable = .any
        return try #require(try vault.items(matching: query).first?.persistentReference)
    }

    @Test("a replacement without an access group cannot give a row the primary key of another")
    func replaceWithoutGroup_keepsPrimaryKeysUnique() throws {
        let fixture = try VaultFixture()
        let vault = fixture.vault
        try vault.add(.genericPassword(service: "svc", account: "alice", data: SecretBytes(utf8: "a")))
        try vault.add(.genericPassword(service: "svc", account: "bob", data: SecretBytes(utf8: "b")))
        let bob = try Self.reference(vault, service: "svc", account: "bob")
        // Another device's item, as `SyncedChange.replace` takes it: no access group given.
        let replacement = Item.genericPassword(service: "svc", account: "alice", data: SecretBytes(utf8: "from elsewhere"))
        #expect(replacement.attributes.accessGroup == nil)
        let result = status {
            _ = try vault.applyChanges(count: 1) { _ throws(LockboxError) in .replace(reference: bob, with: replacement) }
        }
        #expect(result == LockboxError.Code.duplicateItem.rawValue, "replace accepted a second (svc, alice)")
        var query = Query.genericPassword(service: "svc", account: "alice")
        query.limit = .all
        query.returning = [.attributes, .data]
        let rows = try vault.items(matching: query)
        #expect(rows.count == 1, "rows with the primary key (svc, alice, \(rows.map { $0.attributes.accessGroup ?? "nil" })): \(rows.count)")
    }

    @Test("a replacement without an access group leaves the item where the store writes (not in a group it cannot see)")
    func replaceWithoutGroup_keepsItemVisible() throws {
        let fixture = try VaultFixture { $0.accessGroups = ["app.one"] }
        let vault = fixture.vault
        try vault.add(.genericPassword(service: "svc", account: "alice", data: SecretBytes(utf8: "a")))
        let alice = try Self.reference(vault, service: "svc", account: "alice")
        let replacement = Item.genericPassword(service: "svc", account: "alice", data: SecretBytes(utf8: "renewed"))
        _ = try vault.applyChanges(count: 1) { _ throws(LockboxError) in .replace(reference: alice, with: replacement) }
        // An add of the same item lands in app.one; the replaced one should stay readable.
        #expect(status { _ = try vault.data(matching: .genericPassword(service: "svc", account: "alice")) } == nil)
    }

    @Test("a replacement cannot move an item into a group this store may not write")
    func replace_checksAccessGroup() throws {
        let fixture = try VaultFixture { $0.accessGroups = ["app.one"] }
        let vault = fixture.vault
        try vault.add(.genericPassword(service: "svc", account: "alice", data: SecretBytes(utf8: "a")))
        let alice = try Self.reference(vault, service: "svc", account: "alice")
        var moved = Item.genericPassword(service: "svc", account: "alice", data: SecretBytes(utf8: "moved"))
        moved.attributes.accessGroup = "someone.else"
        let replacement = moved
        let result = status {
            _ = try vault.applyChanges(count: 1) { _ throws(LockboxError) in .replace(reference: alice, with: replacement) }
        }
        #expect(result == LockboxError.Code.missingEntitlement.rawValue)
    }

    @Test("the public applyChanges does not take a value over this store's limit from any caller")
    func publicApplyChanges_keepsStoreLimit() throws {
        let fixture = try VaultFixture { $0.maximumValueSize = 1024 }
        let vault = fixture.vault
        let big = Item.genericPassword(service: "svc", account: "big", data: SecretBytes(copying: Array(repeating: UInt8(0x41), count: 8192)))
        #expect(status { try vault.add(big) } == LockboxError.Code.param.rawValue)
        let viaApply = status { _ = try vault.applyChanges(count: 1) { _ throws(LockboxError) in .add(big) } }
        let big2 = Item.genericPassword(service: "svc", account: "big2", data: SecretBytes(copying: Array(repeating: UInt8(0x41), count: 8192)))
        let viaBulk = status { _ = try vault.applyChanges(count: 1, concurrently: { _ throws(LockboxError) in .add(big2) }) }
        #expect(viaApply == LockboxError.Code.param.rawValue, "applyChanges(count:_:) stored 8192 bytes past a 1024-byte limit")
        #expect(viaBulk == LockboxError.Code.param.rawValue, "applyChanges(count:concurrently:) stored 8192 bytes past a 1024-byte limit")
    }
}
