import Foundation
import Lockbox
import LockboxCore
import LockboxTestSupport
import LockboxVault
import Testing

@testable import LockboxSync

/// A synchronizable generic password "`service`" (account "user") with the optional attributes
/// given, nil ones absent.
private func described(
    _ service: String, _ value: String, label: String? = nil, comment: String? = nil, generic: Data? = nil,
    itemDescription: String? = nil
) -> Item {
    var item = Item.genericPassword(service: service, account: "user", data: SecretBytes(utf8: value))
    item.attributes.synchronizable = true
    item.attributes.label = label
    item.attributes.comment = comment
    item.attributes.generic = generic
    item.attributes.itemDescription = itemDescription
    return item
}

/// The attributes of `machine`'s synchronizable item `service` (account "user").
private func attributes(_ machine: Machine, _ service: String) throws -> ItemAttributes {
    var query = machine.query(service, "user")
    query.returning = [.attributes]
    return try machine.vault.item(matching: query).attributes
}

/// What an item says of itself beyond its key and its dates: the attributes that must be the same
/// on every machine.
private func description(_ attributes: ItemAttributes) -> [String?] {
    [attributes.label, attributes.comment, attributes.itemDescription, attributes.generic.map { $0.base64EncodedString() }]
}

extension SyncTests {
    /// A record carries the whole item: a pulled or pushed-over write replaces every attribute of
    /// the row it lands on, so an attribute the writer's item no longer has is gone everywhere.
    @Suite("Sync: a record replaces every attribute")
    struct Attributes {
        @Test("An item deleted and added again without its label, comment, description and generic data loses them on every machine")
        func readdedWithoutOptionalAttributes() throws {
            let (groups, machines) = try threeMachines()
            try machines[0].vault.add(
                described("notes.example", "v1", label: "Notes", comment: "the old comment", generic: Data([0, 1, 2]), itemDescription: "web"))
            for group in groups { try group.sync() }
            #expect(try attributes(machines[2], "notes.example").comment == "the old comment")

            try machines[0].delete("notes.example", "user")
            tick()
            try machines[0].vault.add(described("notes.example", "v2"))
            for group in groups { try group.sync() }
            for machine in machines {
                #expect(try machine.value("notes.example", "user") == "v2")
                #expect(try description(attributes(machine, "notes.example")) == [nil, nil, nil, nil])
                #expect(try machine.verify())
            }
        }

        @Test("Two machines that created one item apart, with different attributes, converge to the later one's, attribute for attribute")
        func createdApartConverge() throws {
            let (groups, machines) = try threeMachines()
            try machines[0].vault.add(described("apart.example", "from A", label: "A's label", comment: "A's comment"))
            tick()
            try machines[1].vault.add(described("apart.example", "from B", generic: Data("B's".utf8), itemDescription: "B's kind"))
            // A pushes first; B's later write wins over it when B pushes, and reaches A and C.
            try groups[0].sync()
            try groups[1].sync()
            for group in groups { try group.sync() }
            let expected = [nil, nil, "B's kind", Data("B's".utf8).base64EncodedString()]
            for machine in machines {
                #expect(try machine.value("apart.example", "user") == "from B")
                #expect(try description(attributes(machine, "apart.example")) == expected)
                #expect(try machine.count() == 1)
                #expect(try machine.verify())
            }
        }

        @Test("The earlier of two items created apart loses its attributes to the later one's on the machine that pushed it")
        func earlierCreationReplacedByLater() throws {
            let (groups, machines) = try threeMachines()
            try machines[1].vault.add(described("apart.example", "from B", label: "B's label", comment: "B's comment"))
            tick()
            try machines[0].vault.add(described("apart.example", "from A", itemDescription: "A's kind"))
            // B pushes its earlier item first; A's later one then wins on A's push and replaces B's row.
            try groups[1].sync()
            try groups[0].sync()
            for group in groups { try group.sync() }
            for machine in machines {
                #expect(try machine.value("apart.example", "user") == "from A")
                #expect(try description(attributes(machine, "apart.example")) == [nil, nil, "A's kind", nil])
                #expect(try machine.verify())
            }
        }

        @Test("An edit that changes only the label keeps every other attribute, on every machine")
        func labelEditKeepsTheRest() throws {
            let (groups, machines) = try threeMachines()
            try machines[0].vault.add(described("kept.example", "v1", label: "old", comment: "kept", generic: Data([9])))
            for group in groups { try group.sync() }
            var change = ItemAttributes()
            change.label = "new"
            try machines[2].vault.update(matching: machines[2].query("kept.example", "user"), to: ItemUpdate(attributes: change))
            for group in groups.reversed() { try group.sync() }
            for group in groups { try group.sync() }
            for machine in machines {
                #expect(try description(attributes(machine, "kept.example")) == ["new", "kept", nil, Data([9]).base64EncodedString()])
            }
        }
    }
}
