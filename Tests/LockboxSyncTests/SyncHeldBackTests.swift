import Foundation
import Lockbox
import LockboxCore
import LockboxTestSupport
import LockboxVault
import Testing
import VaultCrypto
import VaultStorage

@testable import LockboxSync

/// The group's item "dup.example" held back on B by B's own ThisDeviceOnly item of the same key
/// ("local only"), which A wrote to the group as "from A" with `others` more items.
private func heldBackOnB(others: Int = 1) throws -> (groups: [SyncGroup], machines: [Machine]) {
    let (groups, machines) = try threeMachines()
    try groups[1].sync()
    try machines[1].add("dup.example", "user", "local only", accessibility: .whenUnlockedThisDeviceOnly, synchronizable: true)
    try machines[0].add("dup.example", "user", "from A")
    for index in 0..<others { try machines[0].add("other\(index).example", "user", "other \(index)") }
    try groups[0].sync()
    #expect(try groups[1].sync().pulled == others)
    #expect(try machines[1].value("dup.example", "user") == "local only", "the item kept on this device was overwritten")
    #expect(try groups[1].status().heldBack == 1)
    return (groups, machines)
}

/// The group's identifier of the synchronizable item `service` (account "user") of `machine`.
private func groupItemID(_ group: SyncGroup, _ machine: Machine, _ service: String) throws -> String {
    var query = machine.query(service, "user")
    query.returning = [.attributes]
    return group.itemID(try machine.vault.item(matching: query))
}

/// The state at `path` as format 5's code wrote it: its progress's MAC that format's, no list of
/// items held back (which must be empty).
private func toFifthFormat(_ path: String, key: SecretBytes) throws {
    let database = try Database(path: path, create: false)
    var encoder = FieldEncoder()
    encoder.string("lockbox.sync.state.progress.v7")
    let found: [[UInt8]]? = try database.firstRow(
        "SELECT device, cursor, generation, row_count, accumulator, buckets, unverified, applying, held_back FROM progress"
    ) { (row: Statement) -> [[UInt8]] in
        encoder.string(row.text(0) ?? "")
        for index: Int32 in 1...3 { encoder.integer(row.integer(index) ?? 0) }
        encoder.bytes(row.blob(4))
        return (0..<4).map { (index: Int) -> [UInt8] in row.blob(Int32(5 + index)) ?? [] }
    }
    let progress = try #require(found)
    #expect(progress[3].isEmpty)
    for column in progress.prefix(3) { encoder.bytes(column) }
    let put = try database.statement("UPDATE progress SET mac = ?")
    put.bind(1, Crypto.keyedDigest(encoder.bytes, key: key))
    try put.run()
    put.reset()
    try database.execute("ALTER TABLE progress DROP COLUMN held_back; PRAGMA user_version = 5")
}

///
/// Nested in the serialized suite of the sync tests: none of them runs while another stops the
/// database (SyncDeviceTests.swift, the restart test).
extension SyncTests {
    @Suite("Sync: the group's items held back by a local item of their key", .serialized)
    struct SyncHeldBackTests {
        @Test(
            "A group item whose key a local ThisDeviceOnly item holds arrives, at its latest, once that item is deleted; nothing is pushed back",
            arguments: [1, 200])
        func arrivesOnceItsKeyIsFree(others: Int) throws {
            let (groups, machines) = try heldBackOnB(others: others)
            #expect(try machines[1].count() == others + 1)
            // Edited on A meanwhile: still held back, at its new record.
            tick()
            try machines[0].set("dup.example", "user", "edited on A")
            try groups[0].sync()
            #expect(try groups[1].sync().pulled == 0)
            #expect(try machines[1].value("dup.example", "user") == "local only")
            #expect(try groups[1].status().heldBack == 1)
            // A sync with nothing new keeps it held back, and status says so.
            try groups[1].sync()
            #expect(try groups[1].status().heldBack == 1)
            if others == 1 {
                try SyncCLI.configure(machines[1], group: groups[1].groupID, database: try testDatabase())
                let shown = try SyncCLI.run(machines[1], ["sync", "status"])
                #expect(shown.status == 0 && shown.standardOutput.contains("held back:        1 of the group's item(s)"), "\(shown.standardOutput)")
                let json = try SyncCLI.run(machines[1], ["sync", "status", "--json"])
                #expect(json.status == 0 && json.standardOutput.contains("\"heldBack\": 1,"), "\(json.standardOutput)")
            }

            try machines[1].delete("dup.example", "user")
            let report = try groups[1].sync()
            #expect(report.pulled == 1, "the group's item did not arrive once its key was free")
            #expect(report.pushed == 0, "the local item's delete was pushed as the group item's")
            #expect(try machines[1].value("dup.example", "user") == "edited on A")
            #expect(try groups[1].status().heldBack == 0)
            #expect(try groups[1].status().pendingLocalChanges == 0)
            let next = try groups[1].sync()
            #expect(next.pushed == 0 && next.pulled == 0)
            for group in [groups[0], groups[2]] { try group.sync() }
            for machine in machines {
                #expect(try machine.value("dup.example", "user") == "edited on A")
                #expect(try machine.count() == others + 1)
                #expect(try machine.verify())
            }
        }

        @Test("A group item held back here and deleted elsewhere does not arrive once the local item is deleted")
        func deletedElsewhereWhileHeldBack() throws {
            let (groups, machines) = try heldBackOnB()
            tick()
            try machines[0].delete("dup.example", "user")
            try groups[0].sync()
            try groups[1].sync()
            #expect(try groups[1].status().heldBack == 0)
            #expect(try machines[1].value("dup.example", "user") == "local only", "the group's delete removed the item kept on this device")
            try machines[1].delete("dup.example", "user")
            try groups[1].sync()
            #expect(try machines[1].value("dup.example", "user") == nil, "a deleted item came back")
            for group in groups { try group.sync() }
            for machine in machines { #expect(try machine.value("dup.example", "user") == nil) }
        }

        @Test("A local item made to sync over a group item held back: the later write wins everywhere, nothing stays held back")
        func localItemMadeToSync() throws {
            let (groups, machines) = try heldBackOnB()
            tick()
            var attributes = ItemAttributes()
            attributes.accessibility = .afterFirstUnlock
            try machines[1].vault.update(matching: machines[1].query("dup.example", "user"), to: ItemUpdate(attributes: attributes))
            try groups[1].sync()
            #expect(try groups[1].status().heldBack == 0)
            for group in groups { try group.sync() }
            for machine in machines {
                #expect(try machine.value("dup.example", "user") == "local only", "the later write (made to sync here) lost")
                #expect(try machine.verify())
            }
            #expect(try machines[1].count() == 2)
        }

        @Test(
            "The record of an item held back, removed from the database or replaced there with another, is refused (errSecDecode) before anything is applied",
            arguments: ["removed", "replaced"])
        func withheldRecordRefused(edit: String) throws {
            let (groups, machines) = try heldBackOnB()
            let connection = try PostgresConnection(try testDatabase())
            let group = groups[0].groupID
            let id = try groupItemID(groups[0], machines[0], "dup.example")
            if edit == "removed" {
                try connection.execute("DELETE FROM lockbox_sync_items WHERE group_id = $1 AND item_id = $2", [.text(group), .text(id)])
            } else {
                // Another item's record put in its place (the ciphertext of other0, at its version).
                let other = try groupItemID(groups[0], machines[0], "other0.example")
                try connection.execute(
                    """
                    UPDATE lockbox_sync_items SET payload = (SELECT payload FROM lockbox_sync_items WHERE group_id = $1 AND item_id = $3)
                    WHERE group_id = $1 AND item_id = $2
                    """, [.text(group), .text(id), .text(other)])
            }
            // Something new to apply with it: refused all the same.
            try machines[0].add("new.example", "user", "new")
            try groups[0].sync()
            try machines[1].delete("dup.example", "user")
            let error = #expect(throws: LockboxError.self) { try groups[1].sync() }
            #expect(error?.code == .decode)
            #expect(try machines[1].value("new.example", "user") == nil, "a pull refused applied a record")
            #expect(try machines[1].value("dup.example", "user") == nil)
            #expect(try machines[1].verify())
        }

        @Test("A database restored from before a held-back item was written: recovery goes through and no longer holds it back; written back by its writer, it is held back again and arrives once the key is free")
        func restoredFromBeforeTheItem() throws {
            let (groups, machines) = try threeMachines()
            try machines[0].add("base.example", "user", "base")
            for group in groups { try group.sync() }
            let backup = try SyncTests.DatabaseBackup(groups[0].groupID)
            try machines[1].add("dup.example", "user", "local only", accessibility: .whenUnlockedThisDeviceOnly, synchronizable: true)
            try machines[0].add("dup.example", "user", "from A")
            try groups[0].sync()
            try groups[1].sync()
            #expect(try groups[1].status().heldBack == 1)
            try backup.restore()

            #expect(throws: LockboxError.self) { try groups[1].sync() }
            try groups[1].recoverDatabase()
            #expect(try groups[1].status().heldBack == 0)
            #expect(try machines[1].value("dup.example", "user") == "local only")
            // The writer puts its item back; B holds it back again.
            try groups[0].recoverDatabase()
            try groups[1].sync()
            #expect(try groups[1].status().heldBack == 1)
            #expect(try machines[1].value("dup.example", "user") == "local only")
            try machines[1].delete("dup.example", "user")
            try groups[1].sync()
            #expect(try machines[1].value("dup.example", "user") == "from A")
            #expect(try machines[1].verify())
        }

        /// Deletes the local item of "dup.example" on B, syncs B twice: the group's item arrives as
        /// `value`, and nothing stays held back.
        private func expectArrivalOnceFree(_ groups: [SyncGroup], _ machines: [Machine], _ value: String) throws {
            try machines[1].delete("dup.example", "user")
            try groups[1].sync()
            try groups[1].sync()
            #expect(try machines[1].value("dup.example", "user") == value, "the group's item never arrived once its key was free")
            #expect(try groups[1].status().heldBack == 0)
            #expect(try machines[1].verify())
        }

        @Test(
            "An item this device knew, then deleted here (a local item of its key added) or made ThisDeviceOnly here, and written again elsewhere: held back, arrives once the key is free",
            arguments: ["deletedThenAddedLocally", "madeThisDeviceOnly"])
        func knownItemHeldBack(change: String) throws {
            let (groups, machines) = try threeMachines()
            try machines[0].add("dup.example", "user", "first")
            for group in groups { try group.sync() }
            if change == "madeThisDeviceOnly" {
                var attributes = ItemAttributes()
                attributes.accessibility = .whenUnlockedThisDeviceOnly
                try machines[1].vault.update(matching: machines[1].query("dup.example", "user"), to: ItemUpdate(attributes: attributes))
            } else {
                try machines[1].delete("dup.example", "user")
            }
            try groups[1].sync()
            try groups[0].sync()
            #expect(try machines[0].value("dup.example", "user") == nil)
            if change == "deletedThenAddedLocally" {
                try machines[1].add("dup.example", "user", "first", accessibility: .whenUnlockedThisDeviceOnly, synchronizable: true)
            }
            tick()
            try machines[0].add("dup.example", "user", "from A again")
            try groups[0].sync()
            try groups[1].sync()
            #expect(try machines[1].value("dup.example", "user") == "first", "the item kept on this device was overwritten")
            #expect(try groups[1].status().heldBack == 1, "the group's item is not held back")
            try expectArrivalOnceFree(groups, machines, "from A again")
        }

        @Test("A delete here that loses to a later edit elsewhere, while a local item holds the key: the edit is held back and arrives once the key is free")
        func supersededDeleteHeldBack() throws {
            let (groups, machines) = try threeMachines()
            try machines[0].add("dup.example", "user", "first")
            for group in groups { try group.sync() }
            try machines[1].delete("dup.example", "user")
            try machines[1].add("dup.example", "user", "local only", accessibility: .whenUnlockedThisDeviceOnly, synchronizable: true)
            tick()
            try machines[0].set("dup.example", "user", "edited on A")
            try groups[0].sync()
            // The delete lost, but the edit that won is held back, not applied: not counted.
            #expect(try groups[1].sync().superseded == 0)
            #expect(try machines[1].value("dup.example", "user") == "local only")
            #expect(try machines[0].value("dup.example", "user") == "edited on A")
            #expect(try groups[1].status().heldBack == 1, "the group's item is not held back")
            try expectArrivalOnceFree(groups, machines, "edited on A")
        }

        @Test("A record an earlier build skipped (state format 5: the cursor moved past it, nothing listed) is held back when the state is converted, and arrives once the key is free")
        func skippedBeforeFormatSix() throws {
            let (groups, machines) = try heldBackOnB()
            // What format 5's code left: the item neither known nor held back.
            do {
                let state = try SyncState(path: groups[1].statePath, device: groups[1].deviceID, key: groups[1].device.stateKey)
                var changes = SyncState.Changes()
                for id in state.heldBack { changes.heldBack[id] = false }
                try state.commit(changes)
            }
            try toFifthFormat(groups[1].statePath, key: groups[1].device.stateKey)
            #expect(try groups[1].status().heldBack == 1, "the skipped item is not held back after the conversion")
            try expectArrivalOnceFree(groups, machines, "from A")
            for group in groups { try group.sync() }
            for machine in machines { #expect(try machine.count() == 2) }
        }
    }
}
