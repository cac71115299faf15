import Foundation
import LockboxCore
import SecretService
import Testing

@Suite("SecretServiceStore against gnome-keyring")
struct SecretServiceStoreTests {
    @Test func add_thenFindByServiceAndAccount_returnsTheData() throws {
        let store = try TestBus.store()
        let service = TestBus.unique("svc")
        let canary = TestBus.canary()
        try store.add(.genericPassword(service: service, account: "alice", data: SecretBytes(utf8: canary)))
        let found = try store.item(matching: .genericPassword(service: service, account: "alice"))
        #expect(found.data?.utf8String == canary)
        #expect(found.attributes.service == service)
        #expect(found.attributes.account == "alice")
        #expect(found.itemClass == .genericPassword)
    }
}
