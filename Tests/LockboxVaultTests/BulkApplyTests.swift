import Foundation
import Lockbox
import LockboxTestSupport
import Synchronization
import Testing
import VaultStorage

@testable import LockboxVault

/// `applyChanges(count:concurrently:)`, the bulk path a new device's first sync takes: the
/// rows it writes must be those single adds write, its duplicate check theirs, its transaction
/// all or nothing.
@Suite("Bulk apply: the same rows, checks and integrity record as single adds")
struct BulkApplyTests {
    /// Items of several classes and accessibilities: portable ones (sealed on the other
    /// threads) and `ThisDeviceOnly` ones (sealed on the writing thread).
    static func items(_ count: Int, prefix: String = "bulk") -> [Item] {
        let accessibilities: [Accessibility] = [.whenUnlocked, .afterFirstUnlock, .always, .whenUnlockedThisDeviceOnly]
        return (0..<count).map { index in
            var item: Item
            if index % 5 == 4 {
                item = Item(.internetPassword, attributes: ItemAttributes())
                item.attributes.server = "\(prefix)\(index).example"
                item.attributes.account = "user"
                item.data = SecretBytes(utf8: "internet value \(index)")
            } else {
                item = .genericPassword(
                    service: "\(prefix)\(index).example", account: "user", data: SecretBytes(utf8: "value \(index) " + String(repeating: "v", count: index % 90)))
            }
            item.attributes.accessibility = accessibilities[index % accessibilities.count]
            item.attributes.synchronizable = item.attributes.accessibility?.isThisDeviceOnly == false
            item.attributes.label = "label \(index)"
            return item
        }
    }

    static func apply(_ items: [Item], to vault: Vault) throws -> AppliedChanges {
        try vault.applyChanges(count: items.count, concurrently: { index throws(LockboxError) -> SyncedChange in .add(items[index]) })
    }

    /// Every row's columns that do not depend on the random id, the keys or the generation.
    static func shapes(_ path: String) throws -> [String] {
        let database = try Database(path: path, create: false)
        let statement = try database.statement(
            """
            SELECT item_class, accessibility, access_group, synchronizable, device_id != '', access_control, format,
                   length(id), length(wrapped_key), length(metadata), length(secret), length(primary_digest), length(lookup_digest)
            FROM items WHERE access_group != 'lockbox.sync'
            """)
        var shapes: [String] = []
        while try statement.step() {
            shapes.append((0..<13).map { statement.text(Int32($0)) ?? "NULL" }.joined(separator: "|"))
        }
        statement.reset()
        return shapes.sorted()
    }

    static func all(_ vault: Vault, _ itemClass: ItemClass) throws -> [Item] {
        try vault.items(matching: Query(itemClass, limit: .all, returning: [.attributes, .data], synchronizable: .any))
    }

    /// Items of the two classes these tests write (none: 0).
    static func count(_ vault: Vault) throws -> Int {
        var total = 0
        for itemClass in [ItemClass.genericPassword, .internetPassword] {
            do {
                total += try all(vault, itemClass).count
            } catch let error as LockboxError where error.code == .itemNotFound {}
        }
        return total
    }

    static func comparable(_ item: Item) -> String {
        var attributes = item.attributes
        attributes.creationDate = nil
        attributes.modificationDate = nil
        let value = item.data.map { $0.withUnsafeBytes { String(decoding: $0, as: UTF8.self) } } ?? "<none>"
        return "\(item.itemClass) \(attributes) \(value)"
    }

    static func isSound(_ fixture: VaultFixture) throws -> Bool {
        let report = try Vault.verify(at: fixture.path, configuration: fixture.vault.configuration)
        return report.isSound && report.checkedItems == report.items
    }

    @Test("300 items applied in bulk read back as 300 single adds do, in rows of the same shape, and both vaults verify")
    func sameAsSingleAdds() throws {
        let items = Self.items(300)
        let bulk = try VaultFixture()
        let single = try VaultFixture()
        let applied = try Self.apply(items, to: bulk.vault)
        for item in items { try single.vault.add(item) }

        #expect(applied.references.count == items.count)
        #expect(Set(applied.references.compactMap { $0 }).count == items.count, "every add has its own row")
        #expect(applied.generation == applied.previousGeneration + 1, "one write, one generation")
        for itemClass in [ItemClass.genericPassword, .internetPassword] {
            let fromBulk = try Self.all(bulk.vault, itemClass).map(Self.comparable).sorted()
            let fromSingle = try Self.all(single.vault, itemClass).map(Self.comparable).sorted()
            #expect(fromBulk.count == items.filter { $0.itemClass == itemClass }.count)
            #expect(fromBulk == fromSingle)
        }
        // The returned references are the rows that hold the items, in order.
        for (index, reference) in applied.references.enumerated() where index % 37 == 0 {
            var query = Query(items[index].itemClass, returning: [.data], synchronizable: .any)
            query.persistentReference = reference
            #expect(try bulk.vault.data(matching: query) == items[index].data!)
        }
        #expect(try Self.shapes(bulk.path) == Self.shapes(single.path))
        #expect(try Self.isSound(bulk))
        #expect(try Self.isSound(single))
        // Another handle (another process) verifies every bucket as it reads them all.
        let other = try bulk.reopen()
        try other.unlock(passphrase: bulk.passphrase)
        #expect(try Self.count(other) == items.count)
    }

    @Test("A duplicate, of an item already there or within the batch, is refused as add refuses it, and nothing is written")
    func duplicatesRefused() throws {
        let fixture = try VaultFixture()
        let items = Self.items(200, prefix: "dup")
        try fixture.vault.add(items[150])
        let single = #expect(throws: LockboxError.self) { try fixture.vault.add(items[150]) }
        let bulk = #expect(throws: LockboxError.self) { _ = try Self.apply(items, to: fixture.vault) }
        #expect(bulk?.code == .duplicateItem)
        #expect(bulk?.message == single?.message)
        #expect(try Self.count(fixture.vault) == 1)

        let twice = Array(items[0..<100]) + [items[42]]
        let within = #expect(throws: LockboxError.self) { _ = try Self.apply(twice, to: fixture.vault) }
        #expect(within?.code == .duplicateItem)
        #expect(try Self.count(fixture.vault) == 1)
        #expect(try Self.isSound(fixture))
    }

    @Test("A change that fails, or a storage fault mid-transaction, leaves the vault as it was; the same batch then applies whole")
    func failureMidBatchWritesNothing() throws {
        let fixture = try VaultFixture()
        let items = Self.items(400, prefix: "fail")
        let asked = Mutex(0)
        let failing = #expect(throws: LockboxError.self) {
            _ = try fixture.vault.applyChanges(count: items.count, concurrently: { index throws(LockboxError) -> SyncedChange in
                asked.withLock { $0 += 1 }
                if index == 333 { throw LockboxError(.decode, "A record fails to open.") }
                return .add(items[index])
            })
        }
        #expect(failing?.code == .decode)
        #expect(asked.withLock { $0 } <= items.count)
        #expect(try Self.count(fixture.vault) == 0)

        // A storage fault among the inserts (as a crash would leave it: the transaction never committed).
        // How many storage operations the whole batch takes, then a fault half-way.
        let counting = StorageFaults(kind: .ioError, failingOperation: Int.max, persistent: false)
        let scratch = try VaultFixture()
        scratch.vault.injectFaults(counting)
        _ = try Self.apply(items, to: scratch.vault)
        #expect(counting.operations > items.count / 2)
        fixture.vault.injectFaults(StorageFaults(kind: .ioError, failingOperation: counting.operations / 2, persistent: false))
        let fault = #expect(throws: LockboxError.self) { _ = try Self.apply(items, to: fixture.vault) }
        fixture.vault.injectFaults(nil)
        #expect(fault?.code == .io)
        #expect(try Self.count(fixture.vault) == 0)
        #expect(try Self.isSound(fixture))

        _ = try Self.apply(items, to: fixture.vault)
        #expect(try Self.count(fixture.vault) == items.count)
        #expect(try Self.isSound(fixture))
    }

    @Test("Replaces and deletes in a bulk apply are made as update and delete make them")
    func replacesAndDeletes() throws {
        let fixture = try VaultFixture()
        let items = Self.items(40, prefix: "mixed")
        let first = try Self.apply(items, to: fixture.vault)
        var changes: [SyncedChange] = []
        for index in 0..<10 {
            var replacement = items[index]
            replacement.data = SecretBytes(utf8: "replaced \(index)")
            // The whole item is replaced: an attribute the replacement lacks is removed, not kept.
            replacement.attributes.label = index.isMultiple(of: 2) ? nil : "relabelled \(index)"
            replacement.attributes.comment = "comment \(index)"
            changes.append(.replace(reference: first.references[index]!, with: replacement))
        }
        for index in 10..<20 { changes.append(.delete(reference: first.references[index]!, classes: [.genericPassword, .internetPassword])) }
        let more = Self.items(300, prefix: "more")
        changes += more.map { .add($0) }
        let applied = try fixture.vault.applyChanges(count: changes.count, concurrently: { [changes] index throws(LockboxError) -> SyncedChange in
            changes[index]
        })
        #expect(applied.references[0..<10].map { $0 } == first.references[0..<10].map { $0 })
        #expect(applied.references[10..<20].allSatisfy { $0 == nil })
        var query = Query(items[3].itemClass, returning: [.data], synchronizable: .any)
        query.persistentReference = first.references[3]
        #expect(try fixture.vault.data(matching: query) == SecretBytes(utf8: "replaced 3"))
        for index in [2, 3] {
            query.persistentReference = first.references[index]
            query.returning = [.attributes]
            let attributes = try fixture.vault.item(matching: query).attributes
            #expect(attributes.label == (index == 2 ? nil : "relabelled 3"))
            #expect(attributes.comment == "comment \(index)")
        }
        query.returning = [.data]
        query.persistentReference = first.references[13]
        #expect(throws: LockboxError.self) { _ = try fixture.vault.data(matching: query) }
        #expect(try Self.count(fixture.vault) == 40 - 10 + 300)
        #expect(try Self.isSound(fixture))
        // A row to delete that is gone: nothing of the batch is written.
        let gone = #expect(throws: LockboxError.self) {
            _ = try fixture.vault.applyChanges(count: 2, concurrently: { [first, items] index throws(LockboxError) -> SyncedChange in
                index == 0 ? .add(Self.items(1, prefix: "late")[0]) : .delete(reference: first.references[12]!, classes: [items[12].itemClass])
            })
        }
        #expect(gone?.code == .itemNotFound)
        #expect(try Self.count(fixture.vault) == 330)
    }

    @Test("A row the bulk path wrote, edited or removed outside Lockbox, is refused (errSecDecode), not served")
    func tamperedRowRefused() throws {
        let fixture = try VaultFixture()
        let items = Self.items(50, prefix: "tamper").filter { $0.itemClass == .genericPassword }
        let applied = try Self.apply(items, to: fixture.vault)
        let database = try Database(path: fixture.path, create: false)
        // One row's sealed value edited.
        let edit = try database.statement("UPDATE items SET secret = randomblob(length(secret)) WHERE id = ?")
        edit.bind(1, Array(applied.references[1]!))
        try edit.run()
        edit.reset()
        let reopened = try fixture.reopen()
        try reopened.unlock(passphrase: fixture.passphrase)
        var query = Query.genericPassword(service: items[1].attributes.service!, account: "user")
        query.synchronizable = .any
        let edited = #expect(throws: LockboxError.self) { _ = try reopened.data(matching: query) }
        #expect(edited?.code == .decode)
        // Another row removed: its bucket no longer adds up.
        let remove = try database.statement("DELETE FROM items WHERE id = ?")
        remove.bind(1, Array(applied.references[2]!))
        try remove.run()
        remove.reset()
        let again = try fixture.reopen()
        try again.unlock(passphrase: fixture.passphrase)
        query.attributes.service = items[2].attributes.service
        let removed = #expect(throws: LockboxError.self) { _ = try again.data(matching: query) }
        #expect(removed?.code == .decode)
        #expect(!(try Self.isSound(fixture)))
    }
}
