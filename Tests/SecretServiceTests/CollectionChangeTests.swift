import Foundation
import Lockbox
import LockboxCore
import SecretService
import Testing

/// The store keeps its connection and its collection between calls; another client that locks,
/// unlocks, deletes or recreates the collection meanwhile is noticed by the next call.
@Suite("SecretServiceStore: a collection changed by another client")
struct CollectionChangeTests {
    @Test func collectionLockedBetweenTwoReads_secondReadThrowsInteractionNotAllowed_untilUnlocked() throws {
        let password = TestBus.unique("password")
        let path = try createCollection(TestBus.unique("lock-between"), password)
        defer { _ = try? runProcess(Paths.secretServiceScript, ["delete-collection", path]) }
        let store = try TestBus.store(collection: path)
        let service = TestBus.unique("between")
        try store.add(.genericPassword(service: service, account: "alice", data: SecretBytes(utf8: "first")))
        try store.storeSlotKey(SecretBytes(copying: [UInt8](repeating: 7, count: 32)), vaultIdentifier: service)
        #expect(try store.data(matching: .genericPassword(service: service, account: "alice")).utf8String == "first")

        try outside(["lock", path])
        expectError(.interactionNotAllowed) { try store.data(matching: .genericPassword(service: service, account: "alice")) }
        expectError(.interactionNotAllowed) { try store.items(matching: .genericPassword(service: service, account: "nobody")) }
        expectError(.interactionNotAllowed) { try store.slotKey(vaultIdentifier: service) }
        expectError(.interactionNotAllowed) { try store.slotKey(vaultIdentifier: TestBus.unique("no-such-vault")) }
        expectError(.interactionNotAllowed) {
            try store.add(.genericPassword(service: service, account: "bob", data: SecretBytes(utf8: "x")))
        }
        expectError(.interactionNotAllowed) {
            try store.update(matching: .genericPassword(service: service, account: "alice"), to: ItemUpdate(data: SecretBytes(utf8: "x")))
        }
        expectError(.interactionNotAllowed) { try store.delete(matching: .genericPassword(service: service, account: "nobody")) }
        try store.checkAvailable()

        try outside(["unlock", path, password])
        #expect(try store.data(matching: .genericPassword(service: service, account: "alice")).utf8String == "first")
        #expect(try store.slotKey(vaultIdentifier: service).count == 32)
        try store.add(.genericPassword(service: service, account: "bob", data: SecretBytes(utf8: "second")))
        #expect(try store.data(matching: .genericPassword(service: service, account: "bob")).utf8String == "second")
    }

    @Test func collectionDeletedWhileTheStoreLives_throwsNotAvailable_thenItsRecreationIsUsedEmpty() throws {
        let label = TestBus.unique("deleted")
        let path = try createCollection(label, TestBus.unique("password"))
        defer { _ = try? runProcess(Paths.secretServiceScript, ["delete-collection", path]) }
        let store = try TestBus.store(collection: path)
        let service = TestBus.unique("vanishing")
        try store.add(.genericPassword(service: service, account: "alice", data: SecretBytes(utf8: "old")))
        #expect(try store.data(matching: .genericPassword(service: service, account: "alice")).utf8String == "old")

        try outside(["delete-collection", path])
        let readError = expectError(.notAvailable) {
            try store.data(matching: .genericPassword(service: service, account: "alice"))
        }
        #expect(readError?.message.contains("no collection at \(path)") == true, "\(String(describing: readError))")
        expectError(.notAvailable) {
            try store.add(.genericPassword(service: service, account: "bob", data: SecretBytes(utf8: "x")))
        }
        expectError(.notAvailable) { try store.checkAvailable() }

        // gnome-keyring gives a new collection with the same label the same path.
        let recreated = try createCollection(label, TestBus.unique("password"))
        try #require(recreated == path, "the recreated collection has another path: \(recreated)")
        expectError(.itemNotFound) { try store.data(matching: .genericPassword(service: service, account: "alice")) }
        try store.add(.genericPassword(service: service, account: "alice", data: SecretBytes(utf8: "new")))
        #expect(try store.data(matching: .genericPassword(service: service, account: "alice")).utf8String == "new")
    }

    @Test func itemDeletedByAnotherClientBetweenReads_isNotFound_andAnotherClientsItemIsFound() throws {
        let fresh = try FreshCollection()
        let store = fresh.store
        let service = TestBus.unique("other-client")
        try store.add(.genericPassword(service: service, account: "alice", data: SecretBytes(utf8: "mine")))
        #expect(try store.data(matching: .genericPassword(service: service, account: "alice")).utf8String == "mine")
        // Another store object (its own connection state) stands in for another client.
        let other = SecretServiceStore(configuration: store.configuration)
        try other.delete(matching: .genericPassword(service: service, account: "alice"))
        expectError(.itemNotFound) { try store.data(matching: .genericPassword(service: service, account: "alice")) }
        try other.add(.genericPassword(service: service, account: "alice", data: SecretBytes(utf8: "theirs")))
        #expect(try store.data(matching: .genericPassword(service: service, account: "alice")).utf8String == "theirs")
    }

    private func createCollection(_ label: String, _ password: String) throws -> String {
        _ = try TestBus.address()
        let created = try runProcess(Paths.secretServiceScript, ["create-collection", label, password])
        try #require(created.status == 0, "create-collection failed: \(created.stderr)")
        return created.stdout.trimmingCharacters(in: .whitespacesAndNewlines)
    }

    private func outside(_ arguments: [String]) throws {
        let result = try runProcess(Paths.secretServiceScript, arguments)
        try #require(result.status == 0, "secret-service \(arguments[0]) failed: \(result.stderr)")
    }
}
