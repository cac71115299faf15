import Foundation
import Lockbox
import LockboxTestSupport
import LockboxVault
import Testing
import VaultStorage

@testable import LockboxSync

extension SyncTests {
    func groupCounter(_ group: SyncGroup) throws -> String? {
        try PostgresConnection(try testDatabase()).execute(
            "SELECT counter FROM lockbox_sync_groups WHERE group_id = $1", [.text(group.groupID)]).first?[0] ?? nil
    }

    @Test("A first pull stopped mid-import or at its commit (a storage fault in the vault's transaction), or after the vault's commit and before the state's, resumes without loss or duplication")
    func firstPullInterrupted() throws {
        let (groups, machines) = try threeMachines()
        let count = 600
        try machines[0].vault.add(contentsOf: synchronizableItems(count, prefix: "first"))
        try groups[0].sync()
        let counter = try groupCounter(groups[0])

        // How many storage operations a whole first pull takes on a new device.
        let counting = StorageFaults(kind: .ioError, failingOperation: Int.max, persistent: false)
        machines[2].vault.injectFaults(counting)
        let before = try? copyState(groups[2].statePath)
        let pulledBefore = try pulledVersion(groups[2])
        #expect(try groups[2].sync().pulled == count)
        machines[2].vault.injectFaults(nil)
        let operations = counting.operations
        #expect(operations > count, "the import's inserts are counted")

        // Machine B fails at the vault's commit of its import, once every row is written and
        // its local state is being written beside that commit: the state is rolled back with
        // the vault (had it committed alone, the next push would take the missing rows for
        // deletes). The import's commit is the last COMMIT of the pull.
        let commit = try #require(counting.statements.lastIndex(of: "COMMIT"), "no COMMIT among the pull's statements") + 1
        #expect(counting.statements[..<(commit - 1)].contains { $0.hasPrefix("INSERT INTO items") }, "the import's inserts come before its commit")
        machines[1].vault.injectFaults(StorageFaults(kind: .ioError, failingOperation: commit, persistent: false))
        let late = #expect(throws: LockboxError.self) { try groups[1].sync() }
        machines[1].vault.injectFaults(nil)
        #expect(late?.code == .io)
        #expect(try machines[1].count() == 0, "a failed commit left items behind")
        #expect(try machines[1].verify())
        let untouched = try SyncState(path: groups[1].statePath, device: groups[1].device.id, key: groups[1].device.stateKey)
        #expect(try untouched.isEmpty, "the local state recorded an import the vault did not commit")
        #expect(untouched.cursor == 0)

        // Machine B fails half-way through its import: nothing of it stays.
        machines[1].vault.injectFaults(StorageFaults(kind: .ioError, failingOperation: operations / 2, persistent: false))
        let error = #expect(throws: LockboxError.self) { try groups[1].sync() }
        machines[1].vault.injectFaults(nil)
        #expect(error?.code == .io)
        #expect(try machines[1].count() == 0, "a failed import left items behind")
        #expect(try machines[1].verify())
        let resumed = try groups[1].sync()
        #expect(resumed.pulled == count)
        #expect(resumed.pushed == 0)
        #expect(try machines[1].count() == count)
        #expect(try machines[1].value("first0.example", "user") == "value 0")
        #expect(try machines[1].value("first\(count - 1).example", "user") == "value \(count - 1)")
        #expect(try machines[1].verify())
        #expect(try groups[1].sync().changedNothing)

        // Machine C as if it died after its vault committed, before its state did.
        try restoreStoppedSync(before, of: groups[2], pulled: pulledBefore)
        let repeated = try groups[2].sync()
        #expect(repeated.pulled == 0)
        #expect(repeated.pushed == 0)
        #expect(repeated.superseded == 0)
        #expect(try machines[2].count() == count)
        #expect(try machines[2].verify())
        #expect(try groups[2].sync().changedNothing)
        #expect(try groupCounter(groups[0]) == counter, "a repeated or resumed pull wrote new versions")
        // Still in step both ways: an edit on C reaches A and B.
        tick()
        try machines[2].set("first7.example", "user", "edited on C")
        #expect(try groups[2].sync().pushed == 1)
        try groups[0].sync()
        try groups[1].sync()
        #expect(try machines[0].value("first7.example", "user") == "edited on C")
        #expect(try machines[1].value("first7.example", "user") == "edited on C")
    }
}

extension SyncTests {
    @Test("A pull that meets an item of the same primary key written here after the push (another process) keeps it, and the next sync settles it by the later write")
    func pullMeetsItemWrittenAfterPush() throws {
        let (groups, machines) = try threeMachines()
        try groups[1].sync()
        try machines[0].vault.add(contentsOf: synchronizableItems(150, prefix: "race"))
        try groups[0].sync()
        // B's sync by hand: its push, then another process of B adds one of the items A wrote,
        // later than A, then B's pull (150 records: the bulk apply, which meets the duplicate).
        try syncByHand(groups[1]) {
            tick()
            try machines[1].add("race7.example", "user", "written on B after its push")
        }
        #expect(try machines[1].value("race7.example", "user") == "written on B after its push", "the later local write was overwritten")
        #expect(try machines[1].value("race8.example", "user") == "value 8")
        #expect(try machines[1].count() == 150)
        #expect(try machines[1].verify())
        // The next sync pushes it (the later write), and A takes it.
        #expect(try groups[1].sync().pushed == 1)
        try groups[0].sync()
        #expect(try machines[0].value("race7.example", "user") == "written on B after its push")
        #expect(try machines[1].value("race7.example", "user") == "written on B after its push")
        #expect(try groups[1].sync().changedNothing)

        // Written here before the record it meets: the record (the later write) wins.
        try groups[2].sync()
        try machines[2].set("race9.example", "user", "C, first")
        try machines[2].delete("race9.example", "user")
        try syncByHand(groups[2]) {
            try machines[2].add("race9.example", "user", "C, re-added")
            tick()
            try machines[0].set("race9.example", "user", "A, later")
            try groups[0].sync()
        }
        try groups[2].sync()
        try groups[0].sync()
        #expect(try machines[2].value("race9.example", "user") == "A, later")
        #expect(try machines[0].value("race9.example", "user") == "A, later")
    }
}

extension SyncTests {
    @Test("A pull whose record meets an item deleted here after the push (another process) does not bring it back; the next sync pushes the delete")
    func pullMeetsItemDeletedAfterPush() throws {
        let (groups, machines) = try threeMachines()
        try machines[0].vault.add(contentsOf: synchronizableItems(3, prefix: "gone"))
        try groups[0].sync()
        try groups[1].sync()
        #expect(try machines[1].value("gone1.example", "user") == "value 1")
        tick()
        try machines[0].set("gone1.example", "user", "edited on A")
        try groups[0].sync()
        // B's sync by hand: its push, then another process of B deletes the item A edited, then B's pull.
        try syncByHand(groups[1]) {
            tick()
            try machines[1].delete("gone1.example", "user")
        }
        #expect(try machines[1].value("gone1.example", "user") == nil, "the pull brought back an item deleted after the push")
        #expect(try machines[1].verify())
        #expect(try groups[1].sync().pushed == 1, "the delete is pushed")
        try groups[0].sync()
        #expect(try machines[0].value("gone1.example", "user") == nil)
        #expect(try machines[0].value("gone2.example", "user") == "value 2")
        #expect(try machines[1].count() == 2)
        #expect(try groups[1].sync().changedNothing)
    }
}

extension SyncTests {
    /// A sync of `group` by hand: its push, then `meanwhile` (what another process of the same
    /// machine, or another machine, does between the two phases), then its pull.
    func syncByHand(_ group: SyncGroup, meanwhile: () throws -> Void) throws {
        let connection = try PostgresConnection(try testDatabase())
        let state = try SyncState(path: group.statePath, device: group.device.id, key: group.device.stateKey)
        var report = SyncGroup.Report()
        try group.push(connection, state: state, report: &report)
        try meanwhile()
        try group.pull(connection, state: state, report: &report)
    }
}

extension SyncTests {
    @Test("The benchmark's import that keeps records as they arrive reads every record, checks them against the head, and leaves the vault and the state alone")
    func keptImportMeasuresTheWholeGroup() throws {
        let (groups, machines) = try threeMachines()
        try machines[0].vault.add(contentsOf: synchronizableItems(300, prefix: "kept"))
        try groups[0].sync()
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("lockbox-kept-\(UUID().uuidString)").path
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true, attributes: [.posixPermissions: 0o700])
        defer { try? FileManager.default.removeItem(atPath: directory) }

        let timings = try groups[1].measureKeptImport(at: directory + "/kept.db")
        #expect(timings.records == 300)
        #expect(try machines[1].count() == 0, "the measurement wrote to the vault")
        #expect(!FileManager.default.fileExists(atPath: groups[1].statePath), "the measurement wrote a sync state")

        // A record withheld by the database does not add up to the head.
        try PostgresConnection(try testDatabase()).execute(
            "DELETE FROM lockbox_sync_items WHERE group_id = $1 AND version = (SELECT min(version) FROM lockbox_sync_items WHERE group_id = $1)",
            [.text(groups[0].groupID)])
        let error = #expect(throws: LockboxError.self) { try groups[1].measureKeptImport(at: directory + "/again.db") }
        #expect(error?.code == .decode)
    }
}
