import Dispatch
import Foundation
import Lockbox
import LockboxTestSupport
import LockboxVault
import Testing

@testable import LockboxSync

/// A database restored from a backup: every device that synced after the backup refuses it,
/// and `recoverDatabase()` puts back what each knew.
extension SyncTests {
    /// A backup of one group's rows, as an administrator's dump would hold them, kept in
    /// temporary tables of one connection.
    final class DatabaseBackup {
        let connection: PostgresConnection
        let group: String

        init(_ group: String) throws {
            self.group = group
            connection = try PostgresConnection(try testDatabase())
            for table in ["lockbox_sync_groups", "lockbox_sync_items", "lockbox_sync_devices", "lockbox_sync_key_grants"] {
                try connection.execute("CREATE TEMPORARY TABLE backup_\(table) AS SELECT * FROM \(table) WHERE group_id = $1", [.text(group)])
            }
        }

        /// Puts the group's rows back as they were at the backup.
        func restore() throws {
            try connection.transaction { () throws(LockboxError) in
                for table in ["lockbox_sync_items", "lockbox_sync_devices", "lockbox_sync_key_grants"] {
                    try connection.execute("DELETE FROM \(table) WHERE group_id = $1", [.text(group)])
                    try connection.execute("INSERT INTO \(table) SELECT * FROM backup_\(table)")
                }
                try connection.execute(
                    """
                    UPDATE lockbox_sync_groups g SET counter = b.counter, head = b.head FROM backup_lockbox_sync_groups b
                    WHERE g.group_id = b.group_id
                    """)
            }
        }
    }

    @Test("A database restored from a backup: the devices that synced since refuse it and name the recovery; each recovers what it knew, local changes and deletes included, and all converge")
    func restoredDatabaseIsRecovered() throws {
        let (groups, machines) = try threeMachines()
        for name in ["a", "b", "c", "d"] { try machines[0].add("\(name).example", "user", "\(name)1") }
        for group in groups { try group.sync() }
        let backup = try DatabaseBackup(groups[0].groupID)
        // After the backup: A edits a, adds e, deletes b; B sees that and edits c.
        tick()
        try machines[0].set("a.example", "user", "a2")
        try machines[0].add("e.example", "user", "e1")
        try machines[0].delete("b.example", "user")
        try groups[0].sync()
        try groups[1].sync()
        tick()
        try machines[1].set("c.example", "user", "c2")
        try groups[1].sync()
        try backup.restore()

        // A and B saw later versions: a rollback, an error that names the way out.
        for index in 0...1 {
            let error = #expect(throws: LockboxError.self) { try groups[index].sync() }
            #expect(error?.code == .decode)
            #expect(error?.message.contains("lockbox sync recover") == true)
        }
        // C saw nothing after the backup: it syncs, and writes an offline edit.
        tick()
        try machines[2].set("d.example", "user", "d2")
        try groups[2].sync()
        // A's change made since its last push, and an item it deleted since.
        tick()
        try machines[0].set("a.example", "user", "a3")
        try machines[0].delete("e.example", "user")

        let first = try groups[0].recoverDatabase()
        #expect(first.checked == 4)
        // a (its local edit), b (deleted before the backup's loss) and e (deleted since).
        #expect(first.restored == 3)
        #expect(first.restoredDeletions == 2)
        #expect(first.sync.pulled == 1)
        #expect(try machines[0].value("d.example", "user") == "d2")

        // B is now behind a history it never saw: refused, until it recovers too.
        let behind = #expect(throws: LockboxError.self) { try groups[1].sync() }
        #expect(behind?.code == .decode)
        let second = try groups[1].recoverDatabase()
        #expect(second.restored == 1)  // c2: A's records of a, b and e are as new as B knew them or newer
        #expect(second.restoredDeletions == 0)

        for group in groups + groups { try group.sync() }
        let (late, lateMachine) = try newcomer(groups[0])
        try late.sync()
        for machine in machines + [lateMachine] {
            #expect(try machine.value("a.example", "user") == "a3")
            #expect(try machine.value("b.example", "user") == nil)
            #expect(try machine.value("c.example", "user") == "c2")
            #expect(try machine.value("d.example", "user") == "d2")
            #expect(try machine.value("e.example", "user") == nil)
            #expect(try machine.count() == 3)
            #expect(try machine.verify())
        }
        // Recovered, each device verifies heads again: nothing is pending, a further
        // recovery puts back nothing.
        for group in groups { #expect(try group.sync().changedNothing) }
        #expect(try groups[0].recoverDatabase().restored == 0)
        #expect(try groups[0].sync().changedNothing)
    }

    @Test("Recovery takes only a whole database: records that do not add up to its head are refused and nothing is written")
    func recoveryRefusesAnIncompleteDatabase() throws {
        let (groups, machines) = try threeMachines()
        for name in ["a", "b"] { try machines[0].add("\(name).example", "user", "\(name)1") }
        for group in groups { try group.sync() }
        let connection = try PostgresConnection(try testDatabase())
        let group = groups[0].groupID
        let id = try itemID(groups[0], machines[0], "b.example")
        try connection.execute("DELETE FROM lockbox_sync_items WHERE group_id = $1 AND item_id = $2", [.text(group), .text(id)])
        let before = try groupHead(group)
        let error = #expect(throws: LockboxError.self) { try groups[1].recoverDatabase() }
        #expect(error?.code == .decode)
        #expect(try groupHead(group) == before)
        #expect(try storedRecords(group).count == 1)
        #expect(try machines[1].value("b.example", "user") == "b1")
        // The device's verified head is kept: put back, the record syncs as before.
        let (late, lateMachine) = try newcomer(groups[0])
        #expect(throws: LockboxError.self) { try late.sync() }
        #expect(try lateMachine.count() == 0)
    }

    @Test("Recovery of a database restored from before a device removal is refused with what to do; nothing is written")
    func recoveryRefusesAnEarlierEpoch() throws {
        let (groups, machines) = try threeMachines()
        try machines[0].add("a.example", "user", "a1")
        for group in groups { try group.sync() }
        let backup = try DatabaseBackup(groups[0].groupID)
        try groups[0].removeDevice(groups[2].deviceID)
        try groups[1].sync()
        try backup.connection.execute(
            "UPDATE lockbox_sync_groups SET key_epoch = 0 WHERE group_id = $1", [.text(groups[0].groupID)])
        try backup.restore()
        let before = try groupHead(groups[0].groupID)
        let error = #expect(throws: LockboxError.self) { try groups[1].recoverDatabase() }
        #expect(error?.code == .decode)
        #expect(error?.message.contains("earlier key epoch") == true)
        #expect(try groupHead(groups[0].groupID) == before)
    }

    @Test("lockbox sync recover: sync now names it after a restore, it puts back what was lost and syncs; it takes no argument")
    func recoverCommand() throws {
        let (groups, machines) = try threeMachines()
        try SyncCLI.configure(machines[0], group: groups[0].groupID, database: try testDatabase())
        let canary = makeCanary("recover-cli")
        try machines[0].add("a.example", "user", "a1")
        for group in groups { try group.sync() }
        let backup = try DatabaseBackup(groups[0].groupID)
        tick()
        try machines[0].set("a.example", "user", canary)
        #expect(try SyncCLI.run(machines[0], ["sync", "now"]).status == 0)
        try backup.restore()

        let refused = try SyncCLI.run(machines[0], ["sync", "now"])
        #expect(refused.status == 1 && refused.standardError.contains("-26275"))
        #expect(refused.standardError.contains("lockbox sync recover"))
        let status = try SyncCLI.run(machines[0], ["sync", "status"])
        #expect(status.standardOutput.contains("lockbox sync recover"))
        for wrong in [["sync", "recover", "now"], ["sync", "recover", "--json"], ["sync", "recover", canary]] {
            let usage = try SyncCLI.run(machines[0], wrong)
            #expect(usage.status == 64)
            #expect(!usage.standardError.contains(canary))
        }
        let recovered = try SyncCLI.run(machines[0], ["sync", "recover"])
        #expect(recovered.status == 0, "sync recover: \(recovered.standardError)")
        #expect(recovered.standardOutput.contains("checked the database's 1 record against its head"))
        #expect(recovered.standardOutput.contains("put back 1 change this device knew and the database had lost (0 of them deletes)"))
        #expect(recovered.standardOutput.contains("then synced: pushed 0, pulled 0"))
        #expect(!(recovered.standardOutput + recovered.standardError).contains(canary))
        try groups[1].sync()
        #expect(try machines[1].value("a.example", "user") == canary)
        let again = try SyncCLI.run(machines[0], ["sync", "recover"])
        #expect(again.standardOutput.contains("it had lost nothing this device knew; nothing was put back"))
        #expect(try SyncCLI.run(machines[0], ["sync", "now"]).standardOutput.contains("pushed 0, pulled 0"))
    }

    @Test("A recovery cut off after the database committed, before the device saved its state, runs again: nothing is put back twice, and all converge")
    func recoveryCutOffIsRunAgain() throws {
        let (groups, machines) = try threeMachines()
        for name in ["a", "b"] { try machines[0].add("\(name).example", "user", "\(name)1") }
        for group in groups { try group.sync() }
        let backup = try DatabaseBackup(groups[0].groupID)
        tick()
        try machines[0].set("a.example", "user", "a2")
        try machines[0].add("c.example", "user", "c1")
        try groups[0].sync()
        try backup.restore()
        // Changed here since the last push: an edit and a delete.
        tick()
        try machines[0].set("a.example", "user", "a3")
        try machines[0].delete("c.example", "user")
        let saved = try copyState(groups[0].statePath)
        let pulled = try pulledVersion(groups[0])
        let first = try groups[0].recoverDatabase()
        #expect(first.restored == 2 && first.restoredDeletions == 1)
        let written = try storedRecords(groups[0].groupID)
        // Cut off: the database holds the records put back, the device's state is as before.
        try restoreStoppedSync(saved, of: groups[0], pulled: pulled)
        #expect(throws: LockboxError.self) { try groups[0].sync() }
        let again = try groups[0].recoverDatabase()
        #expect(again.checked == 3)
        #expect(again.restored == 0)
        #expect(again.sync.pushed == 0)
        #expect(try storedRecords(groups[0].groupID).map(\.version) == written.map(\.version))
        for group in groups { try group.sync() }
        for machine in machines {
            #expect(try machine.value("a.example", "user") == "a3")
            #expect(try machine.value("b.example", "user") == "b1")
            #expect(try machine.value("c.example", "user") == nil)
            #expect(try machine.verify())
        }
        for group in groups { #expect(try group.sync().changedNothing) }
    }

    /// Three machines; a.example ("a1") added on the first, synced everywhere and backed up;
    /// then edited there ("a2") and pushed; then the database restored from the backup, which
    /// lacks the edit.
    static func threeMachinesRestoredPastAnEdit() throws -> (groups: [SyncGroup], machines: [Machine]) {
        let (groups, machines) = try threeMachines()
        try machines[0].add("a.example", "user", "a1")
        for group in groups { try group.sync() }
        let backup = try DatabaseBackup(groups[0].groupID)
        tick()
        try machines[0].set("a.example", "user", "a2")
        try groups[0].sync()
        try backup.restore()
        return (groups, machines)
    }

    /// Pushes machine A's changes (a sync cut off before its pull).
    func pushOnly(_ group: SyncGroup) throws -> SyncGroup.Report {
        var report = SyncGroup.Report()
        try group.push(try PostgresConnection(group.database), state: try stateOf(group), report: &report)
        return report
    }

    /// Three machines that synced `x.example`; B then adds an item, the administrator copies the
    /// group's rows, and A pushes an edit of `x` not in step (its sync cut off before the pull):
    /// one unverified write.
    func unverifiedWrite() throws -> (groups: [SyncGroup], machines: [Machine], group: String, copy: DatabaseBackup) {
        let (groups, machines, group) = try itemSyncedEverywhere()
        // B writes: A is no longer in step with the database.
        tick()
        try machines[1].add("y.example", "user", "y1")
        try groups[1].sync()
        let copy = try DatabaseBackup(group)
        tick()
        try machines[0].set("x.example", "user", "x2 from A")
        #expect(try pushOnly(groups[0]).pushed == 1)
        return (groups, machines, group, copy)
    }

    @Test("A push not in step, undone by the administrator and hidden behind another device's later write before the device pulls, is an error at the pull (nothing applied), and recovered")
    func undoneUnverifiedPushIsFound() throws {
        let (groups, machines, _, backup) = try unverifiedWrite()
        #expect(try stateOf(groups[0]).unverifiedWrites.count == 1)
        // Undone, and C's write moves the head past where A's write was.
        try backup.restore()
        tick()
        try machines[2].add("z.example", "user", "z1")
        try groups[2].sync()
        let error = #expect(throws: LockboxError.self) { try groups[0].sync() }
        #expect(error?.code == .decode)
        #expect(error?.message.contains("no longer holds 1 record this device wrote") == true)
        #expect(error?.message.contains("lockbox sync recover") == true)
        #expect(try machines[0].value("y.example", "user") == nil && machines[0].value("z.example", "user") == nil)
        #expect(try machines[0].value("x.example", "user") == "x2 from A")

        let recovery = try groups[0].recoverDatabase()
        #expect(recovery.restored == 1)
        #expect(try stateOf(groups[0]).unverifiedWrites.isEmpty)
        for syncing in groups { try syncing.sync() }
        for machine in machines {
            #expect(try machine.value("x.example", "user") == "x2 from A")
            #expect(try machine.value("y.example", "user") == "y1")
            #expect(try machine.value("z.example", "user") == "z1")
        }
    }

    @Test("A push not in step, undone back to the head the device verified, is found by its next push (which writes nothing) and by a removal; a pull that lists it clears it")
    func undoneToVerifiedHeadIsFound() throws {
        let (groups, machines, group) = try itemSyncedEverywhere()
        let backup = try DatabaseBackup(group)
        tick()
        try machines[1].add("y.example", "user", "y1")
        try groups[1].sync()
        tick()
        try machines[0].set("x.example", "user", "x2 from A")
        #expect(try pushOnly(groups[0]).pushed == 1)
        try backup.restore()
        tick()
        try machines[0].add("w.example", "user", "w1")
        let before = try groupHead(group)
        let error = #expect(throws: LockboxError.self) { try groups[0].sync() }
        #expect(error?.code == .decode)
        #expect(error?.message.contains("no longer holds 1 record this device wrote") == true)
        #expect(try groupHead(group) == before)
        let removal = #expect(throws: LockboxError.self) { try groups[0].removeDevice(groups[2].deviceID) }
        #expect(removal?.code == .decode)
        #expect(groups[0].keyEpoch == 0)
        #expect(try groupHead(group) == before)

        // Not undone: the pull that follows a push cut off before it receives the write and
        // clears it.
        let (others, otherMachines, _) = try itemSyncedEverywhere()
        tick()
        try otherMachines[1].add("y.example", "user", "y1")
        try others[1].sync()
        tick()
        try otherMachines[0].set("x.example", "user", "x2")
        #expect(try pushOnly(others[0]).pushed == 1)
        #expect(try stateOf(others[0]).unverifiedWrites.count == 1)
        // Status shows it, in the library and from the command line.
        #expect(try others[0].status().unverifiedWrites == 1)
        try SyncCLI.configure(otherMachines[0], group: others[0].groupID, database: try testDatabase())
        let text = try SyncCLI.run(otherMachines[0], ["sync", "status"])
        #expect(text.standardOutput.contains("written here:     1 record(s) while another device wrote"), "\(text.standardOutput)")
        let json = try SyncCLI.run(otherMachines[0], ["sync", "status", "--json"])
        #expect(json.standardOutput.contains("\"unverifiedWrites\": 1"))
        #expect(try others[0].sync().pulled == 1)
        #expect(try stateOf(others[0]).unverifiedWrites.isEmpty)
        #expect(try others[0].status().unverifiedWrites == 0)
        try others[1].sync()
        #expect(try otherMachines[1].value("x.example", "user") == "x2")
    }

    /// The administrator acting at a chosen moment: `body` (PL/pgSQL) runs after each update or
    /// insert of a row of `table` for which `condition` (on NEW and OLD) holds. Returns what
    /// removes the trigger.
    func administratorTrigger(on table: String, when condition: String, body: String) throws -> () -> Void {
        let name = "administrator_\(table)"
        let connection = try PostgresConnection(try testDatabase())
        try connection.execute("CREATE OR REPLACE FUNCTION \(name)() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN \(body) RETURN NEW; END $$")
        try connection.execute(
            "CREATE TRIGGER \(name) AFTER \(condition.contains("OLD.") ? "UPDATE" : "INSERT OR UPDATE") ON \(table) FOR EACH ROW "
                + "WHEN (\(condition)) EXECUTE FUNCTION \(name)()")
        return {
            _ = try? connection.execute("DROP TRIGGER IF EXISTS \(name) ON \(table)")
            _ = try? connection.execute("DROP FUNCTION IF EXISTS \(name)()")
        }
    }

    @Test("The administrator removes a record and the head in the middle of a recovery: the recovering device refuses, and vouches for nothing")
    func headRemovedDuringRecovery() throws {
        let (groups, machines) = try threeMachines()
        for name in ["a", "b"] { try machines[0].add("\(name).example", "user", "\(name)1") }
        for group in groups { try group.sync() }
        try machines[1].add("x.example", "user", "x1")
        try groups[1].sync()
        let group = groups[0].groupID
        let x = try itemID(groups[1], machines[1], "x.example")
        let remove = try administratorTrigger(
            on: "lockbox_sync_devices", when: "NEW.group_id = '\(group)' AND NEW.device_id = '\(groups[0].deviceID)'",
            body: """
                IF EXISTS (SELECT 1 FROM lockbox_sync_items WHERE group_id = '\(group)' AND item_id = '\(x)') THEN
                  DELETE FROM lockbox_sync_items WHERE group_id = '\(group)' AND item_id = '\(x)';
                  UPDATE lockbox_sync_groups SET head = NULL WHERE group_id = '\(group)';
                END IF;
                """)
        defer { remove() }
        let error = #expect(throws: LockboxError.self) { try groups[0].recoverDatabase() }
        #expect(error?.code == .decode)
        remove()
        #expect(throws: LockboxError.self) { try groups[0].sync() }
        #expect(throws: LockboxError.self) { try groups[2].sync() }
        let (late, lateMachine) = try newcomer(groups[0])
        #expect(throws: LockboxError.self) { try late.sync() }
        #expect(try lateMachine.count() == 0)
    }

    @Test("A recovery whose pull fails after the database committed leaves the device's verified head as it was: it still refuses a database whose head was removed")
    func failedRecoveryKeepsTheVerifiedHead() throws {
        let (groups, machines) = try threeMachines()
        for name in ["a", "b"] { try machines[0].add("\(name).example", "user", "\(name)1") }
        for group in groups { try group.sync() }
        let group = groups[0].groupID
        let backup = try DatabaseBackup(group)
        tick()
        try machines[0].add("c.example", "user", "c1")
        try groups[0].sync()
        try backup.restore()
        let before = try stateOf(groups[0])
        // With the recovery's write, the administrator deletes a record: its pull refuses.
        let a = try itemID(groups[0], machines[0], "a.example")
        let remove = try administratorTrigger(
            on: "lockbox_sync_groups", when: "NEW.group_id = '\(group)' AND NEW.counter > OLD.counter",
            body: "DELETE FROM lockbox_sync_items WHERE group_id = '\(group)' AND item_id = '\(a)';")
        defer { remove() }
        let error = #expect(throws: LockboxError.self) { try groups[0].recoverDatabase() }
        #expect(error?.code == .decode)
        remove()
        let after = try stateOf(groups[0])
        #expect(after.cursor == before.cursor && after.accumulator == before.accumulator && after.accumulator != nil)
        try PostgresConnection(try testDatabase()).execute("UPDATE lockbox_sync_groups SET head = NULL WHERE group_id = $1", [.text(group)])
        let refused = #expect(throws: LockboxError.self) { try groups[0].sync() }
        #expect(refused?.code == .decode)
        #expect(try machines[0].value("a.example", "user") == "a1")
    }

    @Test("The recovery's own refusal of a database that does not add up names the ways out, not the recovery")
    func refusalDoesNotNameItself() throws {
        let (groups, machines) = try threeMachines()
        for name in ["a", "b"] { try machines[0].add("\(name).example", "user", "\(name)1") }
        for group in groups { try group.sync() }
        let connection = try PostgresConnection(try testDatabase())
        let id = try itemID(groups[0], machines[0], "b.example")
        try connection.execute("DELETE FROM lockbox_sync_items WHERE group_id = $1 AND item_id = $2", [.text(groups[0].groupID), .text(id)])
        let error = #expect(throws: LockboxError.self) { try groups[1].recoverDatabase() }
        #expect(error?.code == .decode)
        #expect(error?.message.contains("lockbox sync recover") == false)
        #expect(error?.message.contains("restored in part") == true)
    }

    @Test("A recovery of 40,000 items the database lost reads and seals their values a batch at a time (all at once, the guarded memory of so many values exhausts the process's mappings)")
    func largeRecovery() throws {
        let (groups, machines) = try threeMachines()
        let backup = try DatabaseBackup(groups[0].groupID)
        let count = 40_000
        for start in stride(from: 0, to: count, by: 1000) {
            try machines[0].vault.add(contentsOf: synchronizableItems(1000, prefix: "large\(start)-"))
        }
        #expect(try groups[0].sync().pushed == count)
        try backup.restore()
        let recovery = try groups[0].recoverDatabase()
        #expect(recovery.restored == count)
        #expect(recovery.sync.pulled == 0 && recovery.sync.pushed == 0)
        #expect(try storedRecords(groups[0].groupID).count == count)
    }

    @Test("An item deleted and added again here since the last push is put back as it is now, not as a delete")
    func reAddedItemIsPutBackLive() throws {
        let (groups, machines) = try Self.threeMachinesRestoredPastAnEdit()
        tick()
        try machines[0].delete("a.example", "user")
        try machines[0].add("a.example", "user", "a3")
        let recovery = try groups[0].recoverDatabase()
        #expect(recovery.restored == 1 && recovery.restoredDeletions == 0)
        for group in groups { try group.sync() }
        for machine in machines { #expect(try machine.value("a.example", "user") == "a3") }
        for group in groups { #expect(try group.sync().changedNothing) }
    }

    @Test("Not in step, a push over a database that undid this device's unverified write (put back from a copy signed by another device) is refused before it writes; so is a removal")
    func pushOverUndoneUnverifiedWrite() throws {
        let (groups, machines, group, backup) = try unverifiedWrite()
        try backup.restore()
        let before = try groupHead(group)
        tick()
        try machines[0].add("w.example", "user", "w1")
        let error = #expect(throws: LockboxError.self) { try groups[0].sync() }
        #expect(error?.code == .decode)
        #expect(error?.message.contains("no longer holds 1 record this device wrote") == true)
        #expect(try groupHead(group) == before, "nothing written")
        let removal = #expect(throws: LockboxError.self) { try groups[0].removeDevice(groups[2].deviceID) }
        #expect(removal?.code == .decode)
        #expect(try groupHead(group) == before)
        #expect(groups[0].keyEpoch == 0)
        try groups[2].sync()
        #expect(try machines[2].value("w.example", "user") == nil)
        // Recovered: both writes reach everyone.
        try groups[0].recoverDatabase()
        for syncing in groups { try syncing.sync() }
        for machine in machines {
            #expect(try machine.value("x.example", "user") == "x2 from A")
            #expect(try machine.value("w.example", "user") == "w1")
        }
    }

    @Test("A device removal on a database restored from a backup (older than what the remover saw) is refused as a sync is, and re-seals nothing")
    func removalOnRestoredDatabase() throws {
        let (groups, machines) = try threeMachines()
        try machines[0].add("a.example", "user", "a1")
        for group in groups { try group.sync() }
        let group = groups[0].groupID
        let backup = try DatabaseBackup(group)
        tick()
        try machines[0].set("a.example", "user", "a2")
        try groups[0].sync()
        try groups[1].sync()
        try backup.restore()
        let before = try groupHead(group)
        // B too: its own record is older than it saw, though the counter is not (C's write).
        tick()
        try machines[2].add("c.example", "user", "c1")
        try groups[2].sync()
        for index in 0...1 {
            let error = #expect(throws: LockboxError.self) { try groups[index].removeDevice(groups[2].deviceID) }
            #expect(error?.code == .decode)
            #expect(groups[index].keyEpoch == 0)
        }
        #expect(try groupHead(group).counter == before.counter + 1)
        try groups[0].recoverDatabase()
        try groups[1].recoverDatabase()
        try groups[0].removeDevice(groups[2].deviceID)
        try groups[1].sync()
        #expect(try machines[1].value("a.example", "user") == "a2")
        #expect(try machines[1].value("c.example", "user") == "c1")
    }

    /// A copy of the group's records and row in tables of the database (`prefix`_items,
    /// `prefix`_groups), which a trigger can put in place at a chosen moment. Returns what
    /// drops them.
    func copyInDatabase(_ group: String, prefix: String) throws -> () -> Void {
        let admin = try PostgresConnection(try testDatabase())
        for table in ["\(prefix)_items", "\(prefix)_groups"] { try admin.execute("DROP TABLE IF EXISTS \(table)") }
        try admin.execute("CREATE TABLE \(prefix)_items AS SELECT * FROM lockbox_sync_items WHERE group_id = $1", [.text(group)])
        try admin.execute("CREATE TABLE \(prefix)_groups AS SELECT * FROM lockbox_sync_groups WHERE group_id = $1", [.text(group)])
        return { for table in ["\(prefix)_items", "\(prefix)_groups"] { _ = try? admin.execute("DROP TABLE IF EXISTS \(table)") } }
    }

    /// PL/pgSQL that puts the copy `prefix` in place of the group's records and row.
    func swapIn(_ group: String, prefix: String) -> String {
        """
        DELETE FROM lockbox_sync_items WHERE group_id = '\(group)';
        INSERT INTO lockbox_sync_items SELECT * FROM \(prefix)_items;
        UPDATE lockbox_sync_groups SET counter = (SELECT counter FROM \(prefix)_groups), head = (SELECT head FROM \(prefix)_groups)
        WHERE group_id = '\(group)';
        """
    }

    @Test("The administrator swaps in, as the recovery writes, a later view of the restored group that lacks the record it put back: the recovery's pull refuses it, and nothing is lost")
    func recoveryPullRefusesAViewWithoutItsRecords() throws {
        let (groups, machines) = try threeMachines()
        try machines[0].add("a.example", "user", "a1")
        for group in groups { try group.sync() }
        let group = groups[0].groupID
        let backup = try DatabaseBackup(group)
        let restoredCounter = try groupHead(group).counter
        tick()
        try machines[0].add("x.example", "user", "x1")
        try groups[0].sync()
        try backup.restore()
        // C, behind the backup, writes into the restored database: a later view, signed, without x.
        for name in ["c1", "c2", "c3"] { try machines[2].add("\(name).example", "user", name) }
        try groups[2].sync()
        let drop = try copyInDatabase(group, prefix: "lockbox_test_view")
        defer { drop() }
        try backup.restore()
        let swap = try administratorTrigger(
            on: "lockbox_sync_groups", when: "NEW.group_id = '\(group)' AND NEW.counter = \(restoredCounter + 1)",
            body: swapIn(group, prefix: "lockbox_test_view"))
        defer { swap() }
        let error = #expect(throws: LockboxError.self) { try groups[0].recoverDatabase() }
        #expect(error?.code == .decode)
        swap()
        // Run again on that view: x is put back, and everyone gets it.
        let recovery = try groups[0].recoverDatabase()
        #expect(recovery.restored == 1)
        let x = try itemID(groups[0], machines[0], "x.example")
        #expect(try storedRecords(group).map(\.id).contains(x))
        let (late, lateMachine) = try newcomer(groups[0])
        try late.sync()
        #expect(try lateMachine.value("x.example", "user") == "x1")
        #expect(try lateMachine.value("c3.example", "user") == "c3")
    }

    @Test("A device that joined after the backup keeps an attested row when the database is restored from before it: a later removal of another device leaves it in the group")
    func deviceJoinedAfterBackupStaysAttested() throws {
        let (groups, machines) = try threeMachines()
        try machines[0].add("a.example", "user", "a1")
        for group in groups { try group.sync() }
        let backup = try DatabaseBackup(groups[0].groupID)
        let (late, lateMachine) = try newcomer(groups[0])
        try late.sync()
        #expect(try lateMachine.value("a.example", "user") == "a1")
        try backup.restore()
        for group in groups + [late] { try group.sync() }
        #expect(try groups[0].devices().first { $0.id == late.deviceID }?.isAttested == true)
        try groups[0].removeDevice(groups[2].deviceID)
        try late.sync()
        try machines[0].set("a.example", "user", "a2")
        try groups[0].sync()
        try late.sync()
        #expect(try lateMachine.value("a.example", "user") == "a2")
    }

    @Test("A push whose first batch was written in step, undone by the administrator before its second: the second batch refuses before it writes")
    func undoneInStepBatchIsFoundByTheNext() throws {
        let (groups, machines, group) = try itemSyncedEverywhere()
        let verified = try DatabaseBackup(group)
        try machines[1].vault.add(contentsOf: synchronizableItems(600, prefix: "b-"))
        try groups[1].sync()
        let drop = try copyInDatabase(group, prefix: "lockbox_test_other")
        defer { drop() }
        let other = try groupHead(group).counter
        try verified.restore()
        let start = try groupHead(group).counter
        try machines[0].vault.add(contentsOf: synchronizableItems(600, prefix: "a-"))
        let swap = try administratorTrigger(
            on: "lockbox_sync_groups", when: "NEW.group_id = '\(group)' AND NEW.counter = \(start + Int64(SyncGroup.pushBatch))",
            body: swapIn(group, prefix: "lockbox_test_other"))
        defer { swap() }
        let error = #expect(throws: LockboxError.self) { try groups[0].sync() }
        swap()
        #expect(error?.code == .decode)
        #expect(error?.message.contains("no longer holds 500 records this device wrote") == true, "\(error?.message ?? "")")
        #expect(try groupHead(group).counter == other, "the second batch wrote nothing")
    }

    @Test("A backup from before heads restored after the devices verified heads: sync and recovery say how to give it a head, and recovery then works")
    func preHeadsBackupRestored() throws {
        let (groups, machines) = try threeMachines()
        try machines[0].add("a.example", "user", "a1")
        for group in groups { try group.sync() }
        let group = groups[0].groupID
        // As a group from before heads: no head, and devices that pulled it without one.
        try PostgresConnection(try testDatabase()).execute("UPDATE lockbox_sync_groups SET head = NULL WHERE group_id = $1", [.text(group)])
        for syncing in groups { try stateOf(syncing).forgetVerifiedHead() }
        let backup = try DatabaseBackup(group)
        tick()
        try machines[0].set("a.example", "user", "a2")
        try groups[0].sync()
        try backup.restore()
        let refused = #expect(throws: LockboxError.self) { try groups[0].sync() }
        #expect(refused?.message.contains("before heads") == true && refused?.message.contains("lockbox sync recover") == true)
        let recoveryRefused = #expect(throws: LockboxError.self) { try groups[0].recoverDatabase() }
        #expect(recoveryRefused?.message.contains("before heads") == true)
        try groups[1].sync()
        #expect(try groups[0].recoverDatabase().restored == 1)
        try groups[1].sync()
        #expect(try machines[1].value("a.example", "user") == "a2")
    }

    @Test("A device removed while its pull is in flight does not write its row back (it is not listed again)")
    func removedDeviceInFlightStaysRemoved() throws {
        let (groups, machines) = try threeMachines()
        try machines[0].add("a.example", "user", "a1")
        for group in groups { try group.sync() }
        let removed = groups[1]
        // The removed device's row write waits two seconds, while the removal runs.
        let drop = try slowInserts(into: "lockbox_sync_devices", when: "NEW.device_id = '\(removed.deviceID)'", seconds: 2)
        defer { drop() }
        let done = DispatchSemaphore(value: 0)
        let thread = Thread {
            _ = try? removed.sync()
            done.signal()
        }
        thread.start()
        Thread.sleep(forTimeInterval: 0.7)
        try groups[0].removeDevice(removed.deviceID)
        done.wait()
        #expect(try !groups[0].devices().contains { $0.id == removed.deviceID })
        #expect(throws: LockboxError.self) { try removed.sync() }
    }

    @Test("sync status reports what a sync would refuse past the rollback check: a restored database another device wrote past, and this device's write undone")
    func statusReportsWhatASyncRefuses() throws {
        let (groups, machines) = try Self.threeMachinesRestoredPastAnEdit()
        for index in 0..<3 {
            tick()
            try machines[2].add("c\(index).example", "user", "c")
        }
        try groups[2].sync()
        let status = try groups[0].status()
        #expect(status.databaseProblem?.contains("lockbox sync recover") == true, "\(status.databaseProblem ?? "no problem shown")")
        #expect(status.pendingLocalChanges == 0)

        let (others, otherMachines, _, copy) = try unverifiedWrite()
        try copy.restore()
        tick()
        try otherMachines[2].add("z.example", "user", "z1")
        try others[2].sync()
        let undone = try others[0].status()
        #expect(undone.unverifiedWrites == 1)
        #expect(undone.databaseProblem?.contains("no longer holds 1 record this device wrote") == true, "\(undone.databaseProblem ?? "none")")
        // An honest group: no problem shown.
        #expect(try others[1].status().databaseProblem == nil)
    }
}
