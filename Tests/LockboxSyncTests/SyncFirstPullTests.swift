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

    @Test("A first pull stopped mid-import (a storage fault in the vault's transaction), or after the vault's commit and before the state's, resumes without loss or duplication")
    func firstPullInterrupted() throws {
        let (groups, machines) = try threeMachines()
        let count = 600
        try machines[0].vault.add(contentsOf: synchronizableItems(count, prefix: "first"))
        try groups[0].sync()
        let counter = try groupCounter(groups[0])

        // How many storage operations a whole first pull takes on a new device.
        let counting = StorageFaults(kind: .ioError, failingOperation: Int.max, persistent: false)
        machines[2].vault.injectFaults(counting)
        let before = try? Data(contentsOf: URL(fileURLWithPath: groups[2].statePath))
        #expect(try groups[2].sync().pulled == count)
        machines[2].vault.injectFaults(nil)
        let operations = counting.operations
        #expect(operations > count, "the import's inserts are counted")

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
        try restoreState(before, at: groups[2].statePath)
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
