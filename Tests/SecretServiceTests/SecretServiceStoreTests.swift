import Foundation
import Lockbox
import LockboxCore
import LockboxTestSupport
import SecretService
import Testing

/// The ItemStore contract, against gnome-keyring on the private test bus.
@Suite("SecretServiceStore: the ItemStore contract")
struct SecretServiceStoreTests {
    @Test func add_thenFindByServiceAndAccount_returnsDataAndAttributes() throws {
        let store = try TestBus.store()
        let service = TestBus.unique("svc")
        let canary = TestBus.canary()
        try store.add(.genericPassword(service: service, account: "alice", data: SecretBytes(utf8: canary), label: "Alice's token"))
        let found = try store.item(matching: .genericPassword(service: service, account: "alice"))
        #expect(found.data?.utf8String == canary)
        #expect(found.itemClass == .genericPassword)
        #expect(found.attributes.service == service)
        #expect(found.attributes.account == "alice")
        #expect(found.attributes.label == "Alice's token")
        #expect(found.attributes.creationDate != nil)
        #expect(!"\(found)".contains(canary))
    }

    @Test func add_sameServiceAndAccountTwice_throwsDuplicateItem() throws {
        let store = try TestBus.store()
        let service = TestBus.unique("dup")
        try store.add(.genericPassword(service: service, account: "alice", data: SecretBytes(utf8: "one")))
        expectError(.duplicateItem) {
            try store.add(.genericPassword(service: service, account: "alice", data: SecretBytes(utf8: "two")))
        }
        #expect(try store.data(matching: .genericPassword(service: service, account: "alice")).utf8String == "one")
    }

    @Test func add_sameKeyInAnotherAccountOrAccessGroup_isNotADuplicate() throws {
        let store = try TestBus.store()
        let service = TestBus.unique("key")
        try store.add(.genericPassword(service: service, account: "alice", data: SecretBytes(utf8: "a")))
        try store.add(.genericPassword(service: service, account: "bob", data: SecretBytes(utf8: "b")))
        try store.add(.genericPassword(service: service, account: "alice", data: SecretBytes(utf8: "g"), accessGroup: "team"))
        var all = Query.genericPassword(service: service)
        all.limit = .all
        #expect(try store.items(matching: all).count == 3)
        #expect(try store.data(matching: .genericPassword(service: service, account: "alice", accessGroup: "team")).utf8String == "g")
    }

    @Test func add_sameKeyForOtherItemClass_isNotADuplicate() throws {
        let store = try TestBus.store()
        let server = TestBus.unique("host")
        var internet = ItemAttributes.internet(server: server, account: "alice", protocol: .https)
        internet.label = "web"
        try store.add(Item(.internetPassword, attributes: internet, data: SecretBytes(utf8: "web")))
        expectError(.duplicateItem) {
            try store.add(Item(.internetPassword, attributes: internet, data: SecretBytes(utf8: "again")))
        }
        // The same host on another port or protocol is another item.
        var otherPort = internet
        otherPort.port = 8443
        try store.add(Item(.internetPassword, attributes: otherPort, data: SecretBytes(utf8: "8443")))
        try store.add(.genericPassword(service: server, account: "alice", data: SecretBytes(utf8: "generic")))
        var query = Query(.internetPassword, attributes: .internet(server: server, account: "alice", protocol: .https, port: 8443))
        query.returning = [.data]
        #expect(try store.data(matching: query).utf8String == "8443")
    }

    @Test func limitAll_returnsEveryMatch_limitOne_returnsOne() throws {
        let store = try TestBus.store()
        let service = TestBus.unique("limit")
        for account in ["a", "b", "c"] {
            try store.add(.genericPassword(service: service, account: account, data: SecretBytes(utf8: account)))
        }
        var query = Query.genericPassword(service: service)
        query.limit = .all
        query.returning = [.attributes, .data]
        let all = try store.items(matching: query)
        #expect(Set(all.compactMap(\.attributes.account)) == ["a", "b", "c"])
        #expect(all.allSatisfy { $0.data?.utf8String == $0.attributes.account })
        query.limit = .one
        #expect(try store.items(matching: query).count == 1)
    }

    @Test func returningAttributesOnly_hasNoData_returningDataOnly_hasNoAttributes() throws {
        let store = try TestBus.store()
        let service = TestBus.unique("ret")
        try store.add(.genericPassword(service: service, account: "alice", data: SecretBytes(utf8: "v")))
        var query = Query.genericPassword(service: service, account: "alice")
        query.returning = [.attributes]
        let attributesOnly = try #require(try store.items(matching: query).first)
        #expect(attributesOnly.data == nil)
        #expect(attributesOnly.attributes.service == service)
        query.returning = [.data]
        let dataOnly = try #require(try store.items(matching: query).first)
        #expect(dataOnly.data?.utf8String == "v")
        #expect(dataOnly.attributes.service == nil)
        #expect(try store.contains(.genericPassword(service: service, account: "alice")))
    }

    @Test(arguments: ItemClass.allCases)
    func items_nothingStored_throwsItemNotFound(itemClass: ItemClass) throws {
        let store = try TestBus.store()
        var query = Query(itemClass)
        switch itemClass {
        case .genericPassword: query.attributes.service = TestBus.unique("none")
        case .internetPassword: query.attributes.server = TestBus.unique("none")
        case .key: query.attributes.applicationTag = Data(TestBus.unique("none").utf8)
        case .certificate: query.attributes.issuer = Data(TestBus.unique("none").utf8)
        }
        expectError(.itemNotFound) { try store.items(matching: query) }
        expectError(.itemNotFound) { try store.delete(matching: query) }
        expectError(.itemNotFound) {
            try store.update(matching: query, to: ItemUpdate(data: SecretBytes(utf8: "x")))
        }
        #expect(try store.contains(query) == false)
    }

    @Test func update_dataAndLabel_replacesThem() throws {
        let store = try TestBus.store()
        let service = TestBus.unique("upd")
        try store.add(.genericPassword(service: service, account: "alice", data: SecretBytes(utf8: "old")))
        var changes = ItemAttributes()
        changes.label = "renamed"
        changes.comment = "rotated"
        try store.update(
            matching: .genericPassword(service: service, account: "alice"),
            to: ItemUpdate(attributes: changes, data: SecretBytes(utf8: "new")))
        let item = try store.item(matching: .genericPassword(service: service, account: "alice"))
        #expect(item.data?.utf8String == "new")
        #expect(item.attributes.label == "renamed")
        #expect(item.attributes.comment == "rotated")
    }

    @Test func update_accountOntoAnExistingKey_throwsDuplicateItem() throws {
        let store = try TestBus.store()
        let service = TestBus.unique("updup")
        try store.add(.genericPassword(service: service, account: "alice", data: SecretBytes(utf8: "a")))
        try store.add(.genericPassword(service: service, account: "bob", data: SecretBytes(utf8: "b")))
        expectError(.duplicateItem) {
            try store.update(
                matching: .genericPassword(service: service, account: "bob"),
                to: ItemUpdate(attributes: ItemAttributes(account: "alice")))
        }
        #expect(try store.data(matching: .genericPassword(service: service, account: "bob")).utf8String == "b")
    }

    @Test func update_account_movesTheItem() throws {
        let store = try TestBus.store()
        let service = TestBus.unique("move")
        try store.add(.genericPassword(service: service, account: "alice", data: SecretBytes(utf8: "a")))
        try store.update(
            matching: .genericPassword(service: service, account: "alice"),
            to: ItemUpdate(attributes: ItemAttributes(account: "carol")))
        #expect(try store.data(matching: .genericPassword(service: service, account: "carol")).utf8String == "a")
        expectError(.itemNotFound) {
            try store.data(matching: .genericPassword(service: service, account: "alice"))
        }
    }

    @Test func delete_removesOnlyTheMatch() throws {
        let store = try TestBus.store()
        let service = TestBus.unique("del")
        try store.add(.genericPassword(service: service, account: "alice", data: SecretBytes(utf8: "a")))
        try store.add(.genericPassword(service: service, account: "bob", data: SecretBytes(utf8: "b")))
        try store.delete(matching: .genericPassword(service: service, account: "alice"))
        expectError(.itemNotFound) {
            try store.data(matching: .genericPassword(service: service, account: "alice"))
        }
        #expect(try store.data(matching: .genericPassword(service: service, account: "bob")).utf8String == "b")
    }

    @Test func internetPassword_withEveryKeyAttribute_roundTrips() throws {
        let store = try TestBus.store()
        let server = TestBus.unique("web")
        let attributes = ItemAttributes.internet(
            server: server, account: "alice", protocol: .https, port: 8443, path: "repo.git",
            securityDomain: "realm", authenticationType: .httpBasic)
        try store.add(Item(.internetPassword, attributes: attributes, data: SecretBytes(utf8: "pw")))
        let item = try store.item(matching: Query(.internetPassword, attributes: .internet(server: server)))
        #expect(item.attributes.protocol == .https)
        #expect(item.attributes.port == 8443)
        #expect(item.attributes.path == "repo.git")
        #expect(item.attributes.securityDomain == "realm")
        #expect(item.attributes.authenticationType == .httpBasic)
        #expect(item.attributes.account == "alice")
        #expect(item.data?.utf8String == "pw")
    }

    @Test func keyAndCertificate_withBinaryAttributes_roundTripAndStayApart() throws {
        let store = try TestBus.store()
        let tag = Data(TestBus.unique("tag").utf8) + Data([0, 255, 10])
        var key = ItemAttributes()
        key.applicationTag = tag
        key.keyClass = .symmetric
        key.keyType = .aes
        key.keySizeInBits = 256
        let keyBytes = SecretBytes(copying: (0..<32).map { UInt8($0) })
        try store.add(Item(.key, attributes: key, data: keyBytes))
        var keyQuery = Query(.key)
        keyQuery.attributes.applicationTag = tag
        let storedKey = try store.item(matching: keyQuery)
        #expect(storedKey.data == keyBytes)
        #expect(storedKey.attributes.keyClass == .symmetric)
        #expect(storedKey.attributes.keySizeInBits == 256)
        expectError(.duplicateItem) { try store.add(Item(.key, attributes: key, data: keyBytes)) }

        var certificate = ItemAttributes()
        certificate.issuer = Data(TestBus.unique("issuer").utf8)
        certificate.serialNumber = Data([1, 2, 3])
        certificate.certificateType = 3
        try store.add(Item(.certificate, attributes: certificate, data: SecretBytes(copying: [0x30, 0x82])))
        var certificateQuery = Query(.certificate)
        certificateQuery.attributes.issuer = certificate.issuer
        #expect(try store.item(matching: certificateQuery).attributes.serialNumber == Data([1, 2, 3]))
        // A key query never returns the certificate and vice versa.
        var wrongClass = Query(.key)
        wrongClass.attributes.applicationTag = certificate.issuer
        expectError(.itemNotFound) { try store.items(matching: wrongClass) }
    }

    @Test func synchronizableItem_matchesOnlyQueriesThatAskForIt() throws {
        let store = try TestBus.store()
        let service = TestBus.unique("sync")
        var item = Item.genericPassword(service: service, account: "alice", data: SecretBytes(utf8: "s"))
        item.attributes.synchronizable = true
        try store.add(item)
        expectError(.itemNotFound) { try store.items(matching: .genericPassword(service: service)) }
        var query = Query.genericPassword(service: service)
        query.synchronizable = .any
        #expect(try store.items(matching: query).count == 1)
        query.synchronizable = .synchronizable
        #expect(try store.items(matching: query).first?.attributes.synchronizable == true)
        // Not a duplicate of the synchronizable one.
        try store.add(.genericPassword(service: service, account: "alice", data: SecretBytes(utf8: "local")))
    }

    @Test func persistentReference_inAQuery_findsExactlyThatItem() throws {
        let store = try TestBus.store()
        let service = TestBus.unique("ref")
        try store.add(.genericPassword(service: service, account: "a", data: SecretBytes(utf8: "1")))
        try store.add(.genericPassword(service: service, account: "b", data: SecretBytes(utf8: "2")))
        let b = try store.item(matching: .genericPassword(service: service, account: "b"))
        var query = Query.genericPassword(service: service)
        query.persistentReference = b.persistentReference
        query.returning = [.data]
        query.limit = .all
        let found = try store.items(matching: query)
        #expect(found.count == 1)
        #expect(found.first?.data?.utf8String == "2")
    }

    @Test func vaultKey_storedThenReplaced_readsTheLatest_andDeleteRemovesIt() throws {
        let store = try TestBus.store()
        let vault = TestBus.unique("vault")
        var generator = SeededGenerator("binary secrets")
        let first = SecretBytes(copying: generator.bytes(32))
        let second = SecretBytes(copying: generator.bytes(32))
        expectError(.itemNotFound) { try store.slotKey(vaultIdentifier: vault) }
        try store.storeSlotKey(first, vaultIdentifier: vault)
        #expect(try store.slotKey(vaultIdentifier: vault) == first)
        try store.storeSlotKey(second, vaultIdentifier: vault)
        #expect(try store.slotKey(vaultIdentifier: vault) == second)
        try store.deleteSlotKey(vaultIdentifier: vault)
        expectError(.itemNotFound) { try store.slotKey(vaultIdentifier: vault) }
        expectError(.itemNotFound) { try store.deleteSlotKey(vaultIdentifier: vault) }
    }

    @Test func vaultKey_ofWrongLength_throwsParam() throws {
        let store = try TestBus.store()
        expectError(.param) {
            try store.storeSlotKey(SecretBytes(copying: [1, 2, 3]), vaultIdentifier: TestBus.unique("vault"))
        }
    }
}

/// The behaviour suite's expectations that need a store of its own.
@Suite("SecretServiceStore in a fresh collection")
struct FreshCollectionTests {
    @Test func everythingQuery_countsOnlyThisCollection_withDefaults() throws {
        let fresh = try FreshCollection()
        try fresh.store.add(.genericPassword(service: "svc", account: "alice", data: SecretBytes(utf8: "1")))
        try fresh.store.add(.genericPassword(service: "", account: "", data: .empty))
        let everything = try fresh.store.items(matching: Query(.genericPassword, limit: .all, returning: [.attributes, .data]))
        #expect(everything.count == 2)
        #expect(everything.allSatisfy { $0.attributes.accessibility == .whenUnlocked && $0.attributes.accessGroup == "default" })
        let empty = try fresh.store.item(matching: .genericPassword(service: "", account: ""))
        #expect(empty.data?.count == 0)
        #expect(empty.attributes.service == "")
        expectError(.itemNotFound) { try fresh.store.items(matching: Query(.internetPassword, limit: .all)) }
    }

    @Test func valueOverTheSizeLimit_throwsParam_atTheLimitIsStored() throws {
        let fresh = try FreshCollection(maximumValueSize: 1024)
        let atLimit = SecretBytes(copying: [UInt8](repeating: 7, count: 1024))
        try fresh.store.add(.genericPassword(service: "s", account: "fits", data: atLimit))
        #expect(try fresh.store.data(matching: .genericPassword(service: "s", account: "fits")) == atLimit)
        let over = SecretBytes(copying: [UInt8](repeating: 7, count: 1025))
        expectError(.param) { try fresh.store.add(.genericPassword(service: "s", account: "over", data: over)) }
        expectError(.param) {
            try fresh.store.update(matching: .genericPassword(service: "s", account: "fits"), to: ItemUpdate(data: over))
        }
    }
}
