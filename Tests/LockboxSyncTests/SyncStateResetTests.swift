import Foundation
import Lockbox
import LockboxCore
import LockboxTestSupport
import LockboxVault
import Synchronization
import Testing
import VaultStorage

@testable import LockboxSync

private final class Unchecked<T>: @unchecked Sendable {
    let value: T
    init(_ value: T) { self.value = value }
}

/// Sets the database's record of how far `group`'s device pulled (the administrator's doing).
private func setDatabasePulledVersion(_ group: SyncGroup, _ value: Int64) throws {
    try PostgresConnection(try testDatabase()).execute(
        "UPDATE lockbox_sync_devices SET pulled_version = $3 WHERE group_id = $1 AND device_id = $2",
        [.text(group.groupID), .text(group.deviceID), .integer(value)])
}

/// A device's sync state lost, emptied, put back from an older copy or damaged: a sync refuses
/// it (it could undo edits made elsewhere), and `lockbox sync reset` rebuilds it from the group
/// with the group's versions taking precedence (docs/SYNC.md, "Rebuilding the state").
extension SyncTests {
    @Suite("Sync state: refused when behind or damaged, rebuilt from the group", .serialized)
    struct StateReset {
        enum Loss: String, CaseIterable, Sendable {
            case emptied, removed, olderCopy
        }

        /// A's state lost after B changed the item and A saved its old value again unchanged (a
        /// credential helper stores after each use).
        func lostAfterEditElsewhere(_ loss: Loss, deleteElsewhere: Bool) throws -> (groups: [SyncGroup], machines: [Machine]) {
            let (groups, machines) = try threeMachines()
            try groups[0].sync()
            let older = try copyState(groups[0].statePath)
            try machines[0].add("helper.example", "user", "v1")
            try groups[0].sync()
            try groups[1].sync()
            try groups[2].sync()
            tick()
            if deleteElsewhere { try machines[1].delete("helper.example", "user") } else { try machines[1].set("helper.example", "user", "v2 from B") }
            try groups[1].sync()
            tick()
            try machines[0].set("helper.example", "user", "v1")
            switch loss {
            case .emptied: try restoreState(StateCopy(file: Data(), log: nil), at: groups[0].statePath)
            case .removed: try restoreState(nil, at: groups[0].statePath)
            case .olderCopy: try restoreState(older, at: groups[0].statePath)
            }
            return (groups, machines)
        }

        @Test(
            "A state emptied, removed or put back from an older copy is refused, naming the reset, and nothing is synced; the reset keeps the edit or delete made elsewhere on every device",
            arguments: Loss.allCases, [false, true])
        func lostStateIsRefusedThenRebuilt(loss: Loss, deleteElsewhere: Bool) throws {
            let (groups, machines) = try lostAfterEditElsewhere(loss, deleteElsewhere: deleteElsewhere)
            defer { withExtendedLifetime(machines) {} }
            let wanted: String? = deleteElsewhere ? nil : "v2 from B"
            let refused = #expect(throws: LockboxError.self) { try groups[0].sync() }
            #expect(refused?.code == .decode)
            #expect(refused?.message.contains("lockbox sync reset") == true, "\(refused?.message ?? "")")
            #expect(refused?.message.contains("Restore it from a backup") == false)
            // Refused before anything was written: the other devices keep B's change.
            try groups[1].sync()
            try groups[2].sync()
            #expect(try machines[2].value("helper.example", "user") == wanted)
            // Refused again until reset, and status says so; the keychain stays readable.
            #expect(throws: LockboxError.self) { try groups[0].sync() }
            let status = try groups[0].status()
            #expect(status.databaseProblem?.contains("lockbox sync reset") == true)
            // No count of changes against a state that no longer knows the items.
            #expect(status.stateBehind && status.pendingLocalChanges == 0, "\(status.pendingLocalChanges) pending")
            #expect(try machines[0].value("helper.example", "user") == "v1")

            try groups[0].resetState()
            #expect(try !groups[0].status().stateBehind)
            for group in groups { try group.sync() }
            for (index, machine) in machines.enumerated() {
                #expect(try machine.value("helper.example", "user") == wanted, "machine \(index)")
            }
            // The rebuilt state syncs as any other.
            tick()
            if deleteElsewhere { try machines[0].add("helper.example", "user", "v3 from A") } else { try machines[0].set("helper.example", "user", "v3 from A") }
            for group in groups { try group.sync() }
            for machine in machines { #expect(try machine.value("helper.example", "user") == "v3 from A") }
        }

        @Test("A reset sends the items the group does not hold, takes the group's versions for the others (a delete made here since comes back), and deletes nothing elsewhere")
        func resetSendsNewItemsAndDeletesNothingElsewhere() throws {
            let (groups, machines) = try threeMachines()
            defer { withExtendedLifetime(machines) {} }
            try machines[0].add("kept.example", "user", "k1")
            try machines[0].add("edited.example", "user", "e1")
            for group in groups { try group.sync() }
            tick()
            // On B, since its last sync: a delete, an edit and a new item; then its state is lost.
            try machines[1].delete("kept.example", "user")
            try machines[1].set("edited.example", "user", "e2 on B")
            try machines[1].add("new.example", "user", "n1")
            try restoreState(nil, at: groups[1].statePath)
            #expect(throws: LockboxError.self) { try groups[1].sync() }
            let report = try groups[1].resetState()
            #expect(report.pushed == 1)
            for group in groups { try group.sync() }
            for (index, machine) in machines.enumerated() {
                #expect(try machine.value("kept.example", "user") == "k1", "machine \(index): an item was deleted elsewhere")
                #expect(try machine.value("edited.example", "user") == "e1", "machine \(index)")
                #expect(try machine.value("new.example", "user") == "n1", "machine \(index): the new item was not sent")
            }
        }

        @Test("A damaged state's error says the keychain is not affected and names the reset, not a restore of the keychain; the reset rebuilds it")
        func damagedStateNamesTheReset() throws {
            let (groups, machines) = try threeMachines()
            defer { withExtendedLifetime(machines) {} }
            try machines[0].add("x.example", "user", "1")
            try groups[0].sync()
            try groups[1].sync()
            let database = try Database(path: groups[1].statePath, create: false)
            try database.execute("UPDATE progress SET cursor = cursor + 1")
            let error = #expect(throws: LockboxError.self) { try groups[1].sync() }
            #expect(error?.code == .decode)
            #expect(error?.message.contains("lockbox sync reset") == true, "\(error?.message ?? "")")
            #expect(error?.message.contains("do not restore the keychain") == true)
            #expect(error?.message.contains("Restore it from a backup") == false)
            try groups[1].resetState()
            tick()
            try machines[0].set("x.example", "user", "2")
            try groups[0].sync()
            try groups[1].sync()
            #expect(try machines[1].value("x.example", "user") == "2")
        }

        @Test("An intact state is never refused as behind: syncs, a restart of the process, and a device that has not pulled yet")
        func intactStateIsNotRefused() throws {
            let (groups, machines) = try threeMachines()
            defer { withExtendedLifetime(machines) {} }
            for group in groups { try group.sync() }
            try machines[0].add("x.example", "user", "1")
            try groups[0].sync()
            let again = try SyncGroup(groups[1].groupID, vault: try machines[1].reopened { _ in }, database: try testDatabase())
            try again.sync()
            #expect(try machines[1].value("x.example", "user") == "1")
            #expect(try again.status().databaseProblem == nil)
        }

        @Test("lockbox sync reset from the command line: a refused state rebuilt, the way out named by sync now")
        func resetFromTheCommandLine() throws {
            let (groups, machines) = try lostAfterEditElsewhere(.removed, deleteElsewhere: false)
            defer { withExtendedLifetime(machines) {} }
            try SyncCLI.configure(machines[0], group: groups[0].groupID, database: try testDatabase())
            let refused = try SyncCLI.run(machines[0], ["sync", "now"])
            #expect(refused.status == 1)
            #expect(refused.standardError.contains("lockbox sync reset"), "\(refused.standardError)")
            let reset = try SyncCLI.run(machines[0], ["sync", "reset"])
            #expect(reset.status == 0, "\(reset.standardError)")
            #expect(reset.standardOutput.contains("rebuilt this device's sync state"))
            #expect(try SyncCLI.run(machines[0], ["sync", "reset", "extra"]).status == 64)
            #expect(try machines[0].value("helper.example", "user") == "v2 from B")
        }

        @Test("The database raising this device's pulled version neither refuses an intact state nor leads to a reset: an edit not yet synced reaches every device")
        func raisedDatabaseNumberChangesNothing() throws {
            let (groups, machines) = try threeMachines()
            defer { withExtendedLifetime(machines) {} }
            try machines[0].add("bank.example", "user", "old password")
            for group in groups { try group.sync() }
            tick()
            try machines[0].set("bank.example", "user", "new password")
            try setDatabasePulledVersion(groups[0], 1_000_000)
            #expect(try groups[0].status().databaseProblem == nil)
            try groups[0].sync()
            for group in groups { try group.sync() }
            for (index, machine) in machines.enumerated() {
                #expect(try machine.value("bank.example", "user") == "new password", "machine \(index)")
            }
        }

        @Test("The database lowering this device's pulled version, or deleting its row, does not hide a state put back from an older copy")
        func loweredDatabaseNumberHidesNothing() throws {
            let (groups, machines) = try lostAfterEditElsewhere(.olderCopy, deleteElsewhere: false)
            defer { withExtendedLifetime(machines) {} }
            try setDatabasePulledVersion(groups[0], 0)
            #expect(throws: LockboxError.self) { try groups[0].sync() }
            try PostgresConnection(try testDatabase()).execute(
                "DELETE FROM lockbox_sync_devices WHERE group_id = $1 AND device_id = $2", [.text(groups[0].groupID), .text(groups[0].deviceID)])
            #expect(throws: LockboxError.self) { try groups[0].sync() }
            for group in groups.dropFirst() { try group.sync() }
            for machine in machines.dropFirst() { #expect(try machine.value("helper.example", "user") == "v2 from B") }
        }

        @Test("A reset refuses a database rolled back below what this machine recorded of its last pull, and takes none of its older values")
        func resetRefusesRolledBackDatabase() throws {
            let (groups, machines) = try threeMachines()
            defer { withExtendedLifetime(machines) {} }
            let admin = try PostgresConnection(try testDatabase())
            let group = groups[0].groupID
            try machines[0].add("mail.example", "user", "v1")
            for group in groups { try group.sync() }
            try admin.execute("CREATE TEMPORARY TABLE snapshot_items AS SELECT * FROM lockbox_sync_items WHERE group_id = $1", [.text(group)])
            try admin.execute("CREATE TEMPORARY TABLE snapshot_group AS SELECT * FROM lockbox_sync_groups WHERE group_id = $1", [.text(group)])
            tick()
            try machines[1].set("mail.example", "user", "v2 from B")
            try groups[1].sync()
            for group in groups { try group.sync() }
            try admin.execute("DELETE FROM lockbox_sync_items WHERE group_id = $1", [.text(group)])
            try admin.execute("INSERT INTO lockbox_sync_items SELECT * FROM snapshot_items")
            try admin.execute("UPDATE lockbox_sync_groups g SET counter = s.counter, head = s.head FROM snapshot_group s WHERE g.group_id = s.group_id")
            try setDatabasePulledVersion(groups[0], 1_000_000)
            let refused = #expect(throws: LockboxError.self) { try groups[0].sync() }
            #expect(refused?.message.contains("lockbox sync reset") == false, "\(refused?.message ?? "")")
            try restoreState(nil, at: groups[0].statePath)
            #expect(throws: LockboxError.self) { try groups[0].resetState() }
            #expect(try machines[0].value("mail.example", "user") == "v2 from B")
        }

        @Test("sync status while another process's sync commits is not told its state is behind")
        func statusDuringSyncIsNotBehind() throws {
            let (groups, machines) = try threeMachines()
            defer { withExtendedLifetime(machines) {} }
            for group in groups { try group.sync() }
            try machines[0].add("new.example", "user", "1")
            try groups[0].sync()
            let other = try SyncGroup(groups[1].groupID, vault: try machines[1].reopened { _ in }, database: try testDatabase())
            let result = Mutex<SyncGroup.Status?>(nil)
            let failure = Mutex<String?>(nil)
            let done = Mutex(false)
            let conninfo = try testDatabase()
            let blocker = Unchecked(try PostgresConnection(conninfo))
            // The status runs while the sync is between its listing and its commits; the schema
            // table locked holds the status's database part until the sync has committed.
            groups[1].afterListingAdded.withLock {
                $0 = { () throws(LockboxError) in
                    try blocker.value.execute("BEGIN")
                    try blocker.value.execute("LOCK TABLE lockbox_sync_schema IN ACCESS EXCLUSIVE MODE")
                    Thread.detachNewThread {
                        do {
                            let status = try other.status()
                            result.withLock { $0 = status }
                        } catch {
                            failure.withLock { $0 = "\(error)" }
                        }
                        done.withLock { $0 = true }
                    }
                    let watcher = try PostgresConnection(conninfo)
                    for _ in 0..<200 {
                        if try watcher.execute("SELECT count(*) FROM pg_locks WHERE NOT granted").first?[0] != "0" { break }
                        usleep(20_000)
                    }
                }
            }
            try groups[1].sync()
            groups[1].afterListingAdded.withLock { $0 = nil }
            try blocker.value.execute("COMMIT")
            while !done.withLock({ $0 }) { usleep(10_000) }
            #expect(failure.withLock { $0 } == nil)
            #expect(result.withLock { $0 }?.databaseProblem == nil, "\(result.withLock { $0 }?.databaseProblem ?? "")")
        }

        /// A database restored from a backup taken before B's edit, and A's state lost.
        func rolledBackThenStateLost() throws -> (groups: [SyncGroup], machines: [Machine]) {
            let (groups, machines) = try threeMachines()
            try machines[0].add("mail.example", "user", "v1")
            for group in groups { try group.sync() }
            let backup = try SyncTests.DatabaseBackup(groups[0].groupID)
            tick()
            try machines[1].set("mail.example", "user", "v2 from B")
            try groups[1].sync()
            for group in groups { try group.sync() }
            try backup.restore()
            try restoreState(nil, at: groups[0].statePath)
            return (groups, machines)
        }

        @Test("A reset refused by a rolled-back database stays refused when tried again, and so does a sync: neither takes the older values")
        func resetRefusalHolds() throws {
            let (groups, machines) = try rolledBackThenStateLost()
            defer { withExtendedLifetime(machines) {} }
            #expect(throws: LockboxError.self) { try groups[0].resetState() }
            #expect(throws: LockboxError.self) { try groups[0].resetState() }
            #expect(throws: LockboxError.self) { try groups[0].sync() }
            #expect(try machines[0].value("mail.example", "user") == "v2 from B")
        }

        @Test("After a refused reset, a recovery (the database restored on purpose) goes on, and sets this machine's record anew: the next sync is not refused")
        func recoveryAfterRefusedReset() throws {
            let (groups, machines) = try rolledBackThenStateLost()
            defer { withExtendedLifetime(machines) {} }
            #expect(throws: LockboxError.self) { try groups[0].resetState() }
            _ = try groups[0].recoverDatabase()
            let cursor = try SyncState(path: groups[0].statePath, device: groups[0].device.id, key: groups[0].device.stateKey).cursor
            #expect(try pulledVersion(groups[0]) == cursor)
            try groups[0].sync()
        }

        @Test("A recovery that moves the state's cursor down sets this machine's record to it, so the next sync is not refused as behind")
        func recoveryLowersTheRecord() throws {
            let (groups, machines) = try threeMachines()
            defer { withExtendedLifetime(machines) {} }
            try machines[0].add("x.example", "user", "x0")
            for group in groups { try group.sync() }
            let backup = try SyncTests.DatabaseBackup(groups[0].groupID)
            for edit in 1...5 {
                tick()
                try machines[0].set("x.example", "user", "x\(edit)")
                try groups[0].sync()
            }
            try backup.restore()
            #expect(throws: LockboxError.self) { try groups[0].sync() }
            let before = try pulledVersion(groups[0])
            _ = try groups[0].recoverDatabase()
            let cursor = try SyncState(path: groups[0].statePath, device: groups[0].device.id, key: groups[0].device.stateKey).cursor
            #expect(cursor < before)
            #expect(try pulledVersion(groups[0]) == cursor)
            try groups[0].sync()
            for group in groups { try group.sync() }
            for machine in machines { #expect(try machine.value("x.example", "user") == "x5") }
        }

        enum MarkDamage: String, CaseIterable, Sendable {
            case flippedByte, truncated, otherDevices, link
        }

        @Test(
            "This machine's record of the last pull changed outside Lockbox refuses every sync, naming the reset, and status says so; the reset writes it anew",
            arguments: MarkDamage.allCases)
        func damagedRecordIsRefusedThenRebuilt(damage: MarkDamage) throws {
            let (groups, machines) = try threeMachines()
            defer { withExtendedLifetime(machines) {} }
            try machines[0].add("x.example", "user", "x1")
            for group in groups { try group.sync() }
            let path = groups[0].pulledMark.path
            var bytes = [UInt8](try Data(contentsOf: URL(fileURLWithPath: path)))
            #expect(bytes.count == 40)
            switch damage {
            case .flippedByte:
                bytes[0] ^= 0x01
                try Data(bytes).write(to: URL(fileURLWithPath: path))
            case .truncated:
                try Data(bytes.prefix(12)).write(to: URL(fileURLWithPath: path))
            case .otherDevices:
                // B's record, valid under B's key: not this device's.
                try Data(contentsOf: URL(fileURLWithPath: groups[1].pulledMark.path)).write(to: URL(fileURLWithPath: path))
            case .link:
                try FileManager.default.removeItem(atPath: path)
                try FileManager.default.createSymbolicLink(atPath: path, withDestinationPath: groups[1].pulledMark.path)
            }
            #expect(groups[0].pulledMark.read() == .damaged)
            tick()
            try machines[1].set("x.example", "user", "x2 from B")
            try groups[1].sync()
            let refused = #expect(throws: LockboxError.self) { try groups[0].sync() }
            #expect(refused?.code == .decode)
            #expect(refused?.message.contains("lockbox sync reset") == true, "\(refused?.message ?? "")")
            #expect(refused?.message.contains(path) == true)
            #expect(try groups[0].status().databaseProblem?.contains("changed outside Lockbox") == true)
            #expect(try machines[0].value("x.example", "user") == "x1")

            try groups[0].resetState()
            let cursor = try SyncState(path: groups[0].statePath, device: groups[0].device.id, key: groups[0].device.stateKey).cursor
            #expect(groups[0].pulledMark.read() == .cursor(cursor))
            for group in groups { try group.sync() }
            for machine in machines { #expect(try machine.value("x.example", "user") == "x2 from B") }
        }

        @Test("A reset while this machine's record of the last pull is damaged keeps an edit made here: refused with the change it would replace, until --discard-local-changes")
        func resetWithADamagedRecordKeepsLocalChanges() throws {
            let (groups, machines) = try threeMachines()
            defer { withExtendedLifetime(machines) {} }
            try machines[0].add("x.example", "user", "x1")
            for group in groups { try group.sync() }
            tick()
            try machines[0].set("x.example", "user", "edited here")
            let path = groups[0].pulledMark.path
            var bytes = [UInt8](try Data(contentsOf: URL(fileURLWithPath: path)))
            bytes[0] ^= 0x01
            try Data(bytes).write(to: URL(fileURLWithPath: path))
            let synced = #expect(throws: LockboxError.self) { try groups[0].sync() }
            #expect(synced?.message.contains("--discard-local-changes") == true, "\(synced?.message ?? "")")
            let refused = #expect(throws: LockboxError.self) { try groups[0].resetState() }
            #expect(refused?.code == .param)
            #expect(refused?.message.contains("1 change made here") == true, "\(refused?.message ?? "")")
            #expect(refused?.message.contains(path) == true && refused?.message.contains("--discard-local-changes") == true)
            #expect(try machines[0].value("x.example", "user") == "edited here")
            #expect(groups[0].pulledMark.read() == .damaged)
            // Asked for plainly: the group's version replaces the edit.
            try groups[0].resetState(discardingLocalChanges: true)
            #expect(try machines[0].value("x.example", "user") == "x1")
            for group in groups { try group.sync() }
            for machine in machines { #expect(try machine.value("x.example", "user") == "x1") }
        }

        @Test("A reset while the record of the last pull is damaged and nothing was changed here goes on without a flag")
        func resetWithADamagedRecordAndNoChanges() throws {
            let (groups, machines) = try threeMachines()
            defer { withExtendedLifetime(machines) {} }
            try machines[0].add("x.example", "user", "x1")
            for group in groups { try group.sync() }
            try Data(repeating: 7, count: 40).write(to: URL(fileURLWithPath: groups[0].pulledMark.path))
            try groups[0].resetState()
            #expect(groups[0].pulledMark.read() != .damaged)
            #expect(try machines[0].value("x.example", "user") == "x1")
        }

        @Test("An empty record (what a power loss can leave of its first write) checks nothing and is written anew by the next sync")
        func emptyRecordIsNone() throws {
            let (groups, machines) = try threeMachines()
            defer { withExtendedLifetime(machines) {} }
            try machines[0].add("x.example", "user", "x1")
            for group in groups { try group.sync() }
            try Data().write(to: URL(fileURLWithPath: groups[0].pulledMark.path))
            #expect(groups[0].pulledMark.read() == .none)
            tick()
            try machines[1].set("x.example", "user", "x2 from B")
            try groups[1].sync()
            try groups[0].sync()
            #expect(try machines[0].value("x.example", "user") == "x2 from B")
            let cursor = try SyncState(path: groups[0].statePath, device: groups[0].device.id, key: groups[0].device.stateKey).cursor
            #expect(groups[0].pulledMark.read() == .cursor(cursor))
        }

        @Test("A write of the record stopped before its rename leaves a file that a later write removes once it is a minute old; a newer one is left to the write in flight")
        func stoppedWritesLeftoversAreRemoved() throws {
            let (groups, machines) = try threeMachines()
            defer { withExtendedLifetime(machines) {} }
            try machines[0].add("x.example", "user", "x1")
            try groups[0].sync()
            let path = groups[0].pulledMark.path
            let old = path + ".partial-00112233445566aa"
            let recent = path + ".partial-00112233445566bb"
            let unrelated = path + ".partial-notours"
            for leftover in [old, recent, unrelated] { try Data([1, 2, 3]).write(to: URL(fileURLWithPath: leftover)) }
            try FileManager.default.setAttributes([.modificationDate: Date(timeIntervalSinceNow: -3600)], ofItemAtPath: old)
            try FileManager.default.setAttributes([.modificationDate: Date(timeIntervalSinceNow: -3600)], ofItemAtPath: unrelated)
            tick()
            try machines[0].set("x.example", "user", "x2")
            try groups[0].sync()
            #expect(!FileManager.default.fileExists(atPath: old))
            #expect(FileManager.default.fileExists(atPath: recent))
            #expect(FileManager.default.fileExists(atPath: unrelated))
        }

        @Test("A device removal made in step raises this machine's record with the state it moves")
        func removalRaisesTheRecord() throws {
            let (groups, machines) = try threeMachines()
            defer { withExtendedLifetime(machines) {} }
            try machines[0].add("x.example", "user", "x1")
            for group in groups { try group.sync() }
            let before = try pulledVersion(groups[0])
            try groups[0].removeDevice(groups[2].deviceID)
            let cursor = try SyncState(path: groups[0].statePath, device: groups[0].device.id, key: groups[0].device.stateKey).cursor
            #expect(cursor > before)
            #expect(try pulledVersion(groups[0]) == cursor)
            try groups[0].sync()
        }
    }
}
