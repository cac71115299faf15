import Foundation
import Lockbox
import LockboxKeys
import LockboxTestSupport
import LockboxVault
import Testing

@testable import LockboxSync

/// Managed keys and access-controlled items: what syncs, what never does, and what is refused.
extension SyncTests {
    @Test("A synchronizable software key (non-extractable) reaches the other machines and signs there; a local key stays local")
    func synchronizableKeySyncs() throws {
        let (groups, machines) = try threeMachines()
        let keys = SoftwareKeyStore(vault: machines[0].vault)
        var specification = KeySpecification(algorithm: .ed25519, purposes: [.sign, .verify])
        specification.applicationTag = Data("com.example.synced".utf8)
        specification.isSynchronizable = true
        let synced = try keys.generate(specification)
        #expect(synced.isSynchronizable && !synced.isExtractable)
        var local = KeySpecification(algorithm: .p256, purposes: [.sign, .verify])
        local.applicationTag = Data("com.example.local".utf8)
        _ = try keys.generate(local)
        let message = Data("signed on every machine".utf8)
        let first = try synced.sign(message)

        #expect(try groups[0].sync().pushed == 1, "only the synchronizable key is pushed")
        for group in groups.dropFirst() { try group.sync() }
        for machine in machines.dropFirst() {
            let store = SoftwareKeyStore(vault: machine.vault)
            let arrived = try store.key(applicationTag: Data("com.example.synced".utf8))
            #expect(arrived.publicKey == synced.publicKey)
            #expect(arrived.isSynchronizable && !arrived.isExtractable)
            // The same private key: its signature verifies under the first machine's public key.
            #expect(try synced.isValidSignature(try arrived.sign(message), for: message))
            #expect(try arrived.isValidSignature(first, for: message))
            #expect(try store.keys(applicationTag: Data("com.example.local".utf8)).isEmpty)
            // Still non-extractable where it arrived.
            let export = #expect(throws: LockboxError.self) { try store.exportPrivateKey(of: arrived) }
            #expect(export?.code == .param)
            #expect(try machine.verify())
        }
        // Deleting the key on one machine deletes it everywhere.
        try SoftwareKeyStore(vault: machines[1].vault).delete(
            try SoftwareKeyStore(vault: machines[1].vault).key(applicationTag: Data("com.example.synced".utf8)))
        try groups[1].sync()
        try groups[0].sync()
        #expect(try keys.keys(applicationTag: Data("com.example.synced".utf8)).isEmpty)
    }

    @Test("A hardware key, a ThisDeviceOnly, access-controlled or passphrase-bound key cannot be made synchronizable")
    func keysThatCannotSyncAreRefused() throws {
        let machine = try Machine()
        let keys = SoftwareKeyStore(vault: machine.vault)
        var hardware = KeySpecification(algorithm: .p256, purposes: [.sign, .verify])
        hardware.token = .hardware
        var deviceOnly = KeySpecification(algorithm: .ed25519, purposes: [.sign])
        deviceOnly.accessibility = .whenUnlockedThisDeviceOnly
        var controlled = KeySpecification(algorithm: .ed25519, purposes: [.sign])
        controlled.accessControl = AccessControl(.userPresence)
        var bound = KeySpecification(algorithm: .ed25519, purposes: [.sign])
        bound.isInvalidatedByPassphraseChange = true
        for var specification in [hardware, deviceOnly, controlled, bound] {
            specification.isSynchronizable = true
            let error = #expect(throws: LockboxError.self) { try keys.generate(specification) }
            #expect(error?.code == .param)
        }
        #expect(try keys.keys().isEmpty, "a refused key was stored")
    }

    @Test("An item with access control cannot be synchronizable: refused when added and when an update would make it so")
    func accessControlledItemsAreNotSynchronizable() throws {
        let (groups, machines) = try threeMachines()
        var item = Item.genericPassword(service: "ac.example", account: "user", data: SecretBytes(utf8: "guarded"))
        item.attributes.synchronizable = true
        item.accessControl = AccessControl(.userPresence)
        let added = #expect(throws: LockboxError.self) { try machines[0].vault.add(item) }
        #expect(added?.code == .param)
        item.attributes.synchronizable = false
        try machines[0].vault.add(item)
        var query = Query.genericPassword(service: "ac.example", account: "user")
        query.synchronizable = .any
        var attributes = ItemAttributes()
        attributes.synchronizable = true
        let updated = #expect(throws: LockboxError.self) {
            try machines[0].vault.update(matching: query, to: ItemUpdate(attributes: attributes))
        }
        #expect(updated?.code == .param)
        #expect(try groups[0].sync().pushed == 0)
        try groups[1].sync()
        #expect(try machines[1].count() == 0)
    }
}
