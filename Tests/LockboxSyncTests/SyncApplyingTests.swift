import Foundation
import Lockbox
import LockboxTestSupport
import LockboxVault
import Synchronization
import Testing
import VaultStorage

@testable import LockboxSync

/// B pulls one item from A; its state is then put back as it was once the pull listed the row it
/// adds: as a process killed after the vault's commit, before the state's, leaves it.
private func pullStoppedAfterTheVaultsCommit(_ groups: [SyncGroup], _ machines: [Machine], service: String) throws {
    try groups[1].sync()
    try machines[0].add(service, "user", "from A")
    try groups[0].sync()
    let listed = Mutex<StateCopy?>(nil)
    let path = groups[1].statePath
    let pulled = try pulledVersion(groups[1])
    groups[1].afterListingAdded.withLock { $0 = { listed.withLock { $0 = try? copyState(path) } } }
    #expect(try groups[1].sync().pulled == 1)
    groups[1].afterListingAdded.withLock { $0 = nil }
    let copy: StateCopy = try #require(listed.withLock { $0 }, "the pull listed no row it adds")
    try restoreStoppedSync(copy, of: groups[1], pulled: pulled)
    tick()
}

private func update(_ machine: Machine, _ service: String, _ change: (inout ItemAttributes) -> Void) throws(LockboxError) {
    var attributes = ItemAttributes()
    change(&attributes)
    try machine.vault.update(matching: machine.query(service, "user"), to: ItemUpdate(attributes: attributes))
}

/// Syncs `group`, then puts its state back as the sync's last listing of rows left it: as a
/// process killed after the last commit of the vault or the database, before the state's,
/// leaves it.
@discardableResult
private func syncStoppedBeforeItsStateCommit(_ group: SyncGroup) throws -> SyncGroup.Report {
    let listed = Mutex<StateCopy?>(nil)
    let path = group.statePath
    let pulled = try pulledVersion(group)
    group.afterListingAdded.withLock { $0 = { listed.withLock { $0 = try? copyState(path) } } }
    defer { group.afterListingAdded.withLock { $0 = nil } }
    let report = try group.sync()
    let copy: StateCopy = try #require(listed.withLock { $0 }, "the sync listed no row")
    try restoreStoppedSync(copy, of: group, pulled: pulled)
    return report
}

/// Deletes `services` (account "user") on machine B, then syncs B, A and C: no machine holds
/// anything any more, every vault is sound, and nothing changes at the next syncs.
private func expectDeletedEverywhere(_ services: [String], _ groups: [SyncGroup], _ machines: [Machine]) throws {
    tick()
    for service in services { try machines[1].delete(service, "user") }
    try groups[1].sync()
    #expect(try machines[1].count() == 0, "the pull brought back an item deleted here")
    try groups[0].sync()
    try groups[2].sync()
    for machine in machines {
        #expect(try machine.count() == 0, "an item deleted here is back")
        #expect(try machine.verify())
    }
    for group in groups { #expect(try group.sync().changedNothing) }
}

/// One sync of `group` in which an item (a synchronizable generic password, account "user") is
/// written to `machine`'s vault after the push and before the pull, as another process writes
/// it; `prepare` sees the sync's state first.
private func syncWritingBetweenPushAndPull(
    _ group: SyncGroup, _ machine: Machine, service: String, value: String, prepare: (SyncState) -> Void = { _ in }
) throws {
    try syncWritingBetweenPushAndPull(group, prepare: prepare) { () throws(LockboxError) in
        var item = Item.genericPassword(service: service, account: "user", data: SecretBytes(utf8: value))
        item.attributes.synchronizable = true
        try machine.vault.add(item)
    }
}

/// One sync of `group` that runs `write` after its push and before its pull.
private func syncWritingBetweenPushAndPull(
    _ group: SyncGroup, prepare: (SyncState) -> Void = { _ in }, write: () throws(LockboxError) -> Void
) throws {
    try group.session { connection, state throws(LockboxError) in
        prepare(state)
        var report = SyncGroup.Report()
        let floor = try group.push(connection, state: state, report: &report)
        try write()
        try group.pull(connection, state: state, report: &report, floor: floor)
    }
}

/// This machine's clock, offset (a machine whose clock runs ahead or behind).
private struct SkewedClock: LockboxClock {
    let offset: Duration
    func sinceEpoch() -> Duration { SystemClock().sinceEpoch() + offset }
    func uptime() -> Duration { SystemClock().uptime() }
    func sleep(for duration: Duration) { SystemClock().sleep(for: duration) }
}

/// One sync of `group`, whose push runs `write` (as another process of the machine) just before
/// it applies the records that won over its changes.
@discardableResult
private func syncWritingBeforeSuperseding(_ group: SyncGroup, _ write: @escaping @Sendable () throws(LockboxError) -> Void) throws -> SyncGroup.Report {
    group.beforeApplyingSuperseding.withLock {
        $0 = { () throws(LockboxError) in
            tick()
            try write()
        }
    }
    defer { group.beforeApplyingSuperseding.withLock { $0 = nil } }
    return try group.sync()
}

/// The rows a sync lists in its state before the vault commits them (``SyncState/applying``),
/// settled by the next sync after a process stopped between the two commits.
///
/// Nested in the serialized suite of the sync tests: none of them runs while another stops the
/// database (SyncDeviceTests.swift, the restart test).
extension SyncTests {
    @Suite("Sync: rows listed before the vault's commit", .serialized)
    struct SyncApplyingTests {
        @Test(
            "An item pulled, the process stopped before its state's commit, then made local here (not synchronizable, or ThisDeviceOnly): its delete is pushed, one local copy stays, no synchronizable copy comes back",
            arguments: [false, true])
        func madeLocalAfterPullWithoutItsState(thisDeviceOnly: Bool) throws {
            let (groups, machines) = try threeMachines()
            try pullStoppedAfterTheVaultsCommit(groups, machines, service: "local.example")
            try update(machines[1], "local.example") { attributes in
                if thisDeviceOnly { attributes.accessibility = .whenUnlockedThisDeviceOnly } else { attributes.synchronizable = false }
            }
            try groups[1].sync()
            try groups[0].sync()
            try groups[2].sync()
            #expect(try machines[1].count() == 1, "the pull added the item back beside the copy made local")
            if !thisDeviceOnly { #expect(try machines[1].value("local.example", "user") == nil, "a synchronizable copy is back") }
            #expect(try machines[0].count() == 0, "the item left sync on B but lives on on A: no delete pushed")
            #expect(try machines[2].count() == 0)
            for machine in machines { #expect(try machine.verify()) }
        }

        @Test("An item pulled, the process stopped before its state's commit, then renamed here: the rename reaches the others, no copy of the old name left")
        func renamedAfterPullWithoutItsState() throws {
            let (groups, machines) = try threeMachines()
            try pullStoppedAfterTheVaultsCommit(groups, machines, service: "old.example")
            try update(machines[1], "old.example") { $0.service = "new.example" }
            try groups[1].sync()
            try groups[0].sync()
            for machine in machines.prefix(2) {
                #expect(try machine.count() == 1)
                #expect(try machine.value("new.example", "user") == "from A")
            }
        }

        @Test("After a pull stopped before its state's commit, `sync status` counts what the next sync pushes: nothing for the row kept, the delete of one deleted here", arguments: [false, true])
        func statusCountsWhatTheSyncPushes(deleted: Bool) throws {
            let (groups, machines) = try threeMachines()
            try pullStoppedAfterTheVaultsCommit(groups, machines, service: "status.example")
            if deleted { try machines[1].delete("status.example", "user") }
            let status = try groups[1].status()
            #expect(status.syncedItems == 1)
            let report = try groups[1].sync()
            #expect(status.pendingLocalChanges == report.pushed, "status said \(status.pendingLocalChanges) pending; the sync pushed \(report.pushed)")
            #expect(report.pushed == (deleted ? 1 : 0))
        }

        @Test(
            "An item a pull added, whose state the process did not save (killed after the vault's commit), then deleted here, stays deleted everywhere",
            arguments: [1, SyncGroup.bulkApplyMinimum])
        func deleteAfterPullWithoutItsState(count: Int) throws {
            let (groups, machines) = try threeMachines()
            try groups[1].sync()
            for index in 0..<count { try machines[0].add("gone\(index).example", "user", "from A") }
            try groups[0].sync()
            #expect(try syncStoppedBeforeItsStateCommit(groups[1]).pulled == count)
            try expectDeletedEverywhere((0..<count).map { "gone\($0).example" }, groups, machines)
        }

        @Test(
            "An item added here and pushed, the process stopped before its state's commit, then deleted here: the delete reaches the others, the item does not come back",
            arguments: [1, 600])
        func deleteAfterPushWithoutItsState(count: Int) throws {
            let (groups, machines) = try threeMachines()
            for group in groups { try group.sync() }
            try machines[1].vault.add(contentsOf: synchronizableItems(count, prefix: "pushed"))
            // 600: two transactions; the state as the second listing left it.
            #expect(try syncStoppedBeforeItsStateCommit(groups[1]).pushed == count)
            try expectDeletedEverywhere((0..<count).map { "pushed\($0).example" }, groups, machines)
        }

        @Test("A push whose database transaction never committed after it listed its rows: the next sync pushes the items, nothing is taken for pushed or deleted")
        func pushListedButNeverCommitted() throws {
            let (groups, machines) = try threeMachines()
            for group in groups { try group.sync() }
            try machines[1].add("unsent.example", "user", "from B")
            try machines[1].add("unsent-then-gone.example", "user", "from B")
            groups[1].afterListingAdded.withLock { $0 = { () throws(LockboxError) in throw LockboxError(.io, "stopped before the database's commit") } }
            #expect(throws: LockboxError.self) { try groups[1].sync() }
            groups[1].afterListingAdded.withLock { $0 = nil }
            // Deleted here before it ever reached the group: nothing to push for it.
            try machines[1].delete("unsent-then-gone.example", "user")
            #expect(try groups[1].sync().pushed == 1)
            try groups[0].sync()
            #expect(try machines[0].value("unsent.example", "user") == "from B")
            #expect(try machines[0].count() == 1)
            for group in groups { _ = try group.sync() }
            for group in groups { #expect(try group.sync().changedNothing) }
        }

        @Test("`sync status` settles a list left behind only when no sync holds the lock, and opens the state after taking it")
        func statusSettlesOnlyUnderTheLock() throws {
            let (groups, machines) = try threeMachines()
            try pullStoppedAfterTheVaultsCommit(groups, machines, service: "locked.example")
            let group = groups[1]
            let reopened = { () throws -> SyncState in try SyncState(path: group.statePath, device: group.device.id, key: group.device.stateKey) }
            do {
                // Another process's sync holds the lock: status neither waits nor settles.
                let held = try SyncLock(statePath: group.statePath)
                _ = try group.status()
                #expect(try !reopened().applying.isEmpty, "status settled the list while a sync held the lock")
                withExtendedLifetime(held) {}
            }
            let status = try group.status()
            #expect(try reopened().applying.isEmpty)
            #expect(status.pendingLocalChanges == 0)
            #expect(try group.sync().pulled == 0)
        }

        @Test("An item of the same primary key kept here as ThisDeviceOnly is neither overwritten nor duplicated by the group's, and the sync goes on with the other items")
        func thisDeviceOnlyItemOfTheSameKey() throws {
            let (groups, machines) = try threeMachines()
            try groups[1].sync()
            try machines[1].add("dup.example", "user", "local only", accessibility: .whenUnlockedThisDeviceOnly, synchronizable: true)
            try groups[1].sync()
            try machines[0].add("dup.example", "user", "from A")
            try machines[0].add("other.example", "user", "from A")
            try groups[0].sync()
            try groups[1].sync()
            try groups[1].sync()
            #expect(try machines[1].value("other.example", "user") == "from A", "the other item never arrived")
            #expect(try machines[1].value("dup.example", "user") == "local only", "the item kept on this device was overwritten")
            #expect(try machines[1].count() == 2)
            #expect(try machines[0].value("dup.example", "user") == "from A")
            #expect(try machines[1].verify())
        }

        @Test("An item written here during a sync, after its push, with the content of an earlier record but later than an edit elsewhere, keeps its time")
        func sameContentWrittenDuringTheSync() throws {
            let (groups, machines) = try threeMachines()
            for group in groups { try group.sync() }
            // C writes "same" first; A writes "other" later (offline); B writes "same" last.
            try machines[2].add("late.example", "user", "same")
            try groups[2].sync()
            tick()
            try machines[0].add("late.example", "user", "other")
            tick()
            // Written here (another process) after the push, before the pull: the last write of all.
            try syncWritingBetweenPushAndPull(groups[1], machines[1], service: "late.example", value: "same")
            try groups[1].sync()
            try groups[0].sync()
            for group in groups { try group.sync() }
            for machine in machines { #expect(try machine.value("late.example", "user") == "same", "an edit older than the last write won") }
        }

        @Test(
            "An item pushed, the process stopped before its state's commit, then edited on another device, then deleted here (the last write): the delete wins everywhere",
            arguments: [false, true])
        func pushedThenReplacedThenDeleted(stopped: Bool) throws {
            let (groups, machines) = try threeMachines()
            for group in groups { try group.sync() }
            try machines[1].add("x.example", "user", "from B")
            if stopped { #expect(try syncStoppedBeforeItsStateCommit(groups[1]).pushed == 1) } else { try groups[1].sync() }
            tick()
            try groups[0].sync()
            try machines[0].set("x.example", "user", "edited on A")
            try groups[0].sync()
            tick()
            try machines[1].delete("x.example", "user")
            for group in [groups[1], groups[0], groups[1]] { try group.sync() }
            #expect(try machines[1].count() == 0, "B's delete, the last write, was undone on B")
            #expect(try machines[0].count() == 0, "B's delete, the last write, never reached A")
        }

        @Test(
            "An item renamed here, or made to sync (ThisDeviceOnly before), pushed, the process stopped before its state's commit, then deleted here: it does not come back",
            arguments: [false, true], [false, true])
        func changedRowPushedThenDeleted(madeToSync: Bool, stopped: Bool) throws {
            let (groups, machines) = try threeMachines()
            for group in groups { try group.sync() }
            if madeToSync {
                try machines[1].add("item.example", "user", "from B", accessibility: .whenUnlockedThisDeviceOnly, synchronizable: true)
            } else {
                try machines[1].add("old.example", "user", "from B")
            }
            try groups[1].sync()
            try groups[0].sync()
            tick()
            try update(machines[1], madeToSync ? "item.example" : "old.example") { attributes in
                if madeToSync { attributes.accessibility = .whenUnlocked } else { attributes.service = "item.example" }
            }
            if stopped { try syncStoppedBeforeItsStateCommit(groups[1]) } else { try groups[1].sync() }
            tick()
            try machines[1].delete("item.example", "user")
            for group in [groups[1], groups[0], groups[1]] { try group.sync() }
            #expect(try machines[1].count() == 0, "the item, deleted here, came back")
            #expect(try machines[0].count() == 0, "the delete never reached A (or the old name stayed)")
            for group in groups { #expect(try group.sync().changedNothing) }
        }

        @Test(
            "An item made ThisDeviceOnly, or renamed, here (another process) after the push, while another device edited or deleted it, is neither overwritten nor deleted by the pull",
            arguments: [false, true], [false, true])
        func changedHereBetweenPushAndPull(deletedElsewhere: Bool, renamed: Bool) throws {
            let (groups, machines) = try threeMachines()
            try machines[1].add("x.example", "user", "shared")
            for group in [groups[1], groups[0]] { try group.sync() }
            if deletedElsewhere { try machines[0].delete("x.example", "user") } else { try machines[0].set("x.example", "user", "edited on A") }
            try groups[0].sync()
            tick()
            try syncWritingBetweenPushAndPull(groups[1]) { () throws(LockboxError) in
                try update(machines[1], "x.example") { attributes in
                    if renamed { attributes.service = "y.example" } else { attributes.accessibility = .whenUnlockedThisDeviceOnly }
                }
            }
            var query = Query.genericPassword(service: renamed ? "y.example" : "x.example", account: "user")
            query.synchronizable = .any
            query.returning = [.attributes, .data]
            let held = try machines[1].vault.item(matching: query)
            #expect(held.data == SecretBytes(utf8: "shared"), "the pull overwrote the item changed here")
            if !renamed { #expect(held.attributes.accessibility == .whenUnlockedThisDeviceOnly, "the pull made the item sync again") }
            for group in groups { try group.sync() }
            #expect(try machines[1].verify())
        }

        @Test("A pull that falls back to one record at a time (an item of the same key written here after its push) adds the new items in one transaction, their rows listed once")
        func fallbackListsOnce() throws {
            let (groups, machines) = try threeMachines()
            try groups[1].sync()
            let count = 300
            try machines[0].vault.add(contentsOf: synchronizableItems(count, prefix: "fb"))
            try groups[0].sync()
            let listings = Mutex<[Int]>([])
            let group = groups[1]
            // Written here after the push: the pull's one vault transaction fails (duplicateItem).
            try syncWritingBetweenPushAndPull(group, machines[1], service: "fb0.example", value: "mine") { state in
                nonisolated(unsafe) let listed = state
                group.afterListingAdded.withLock { $0 = { listings.withLock { $0.append(listed.applying.count) } } }
            }
            group.afterListingAdded.withLock { $0 = nil }
            #expect(listings.withLock { $0 } == [count - 1], "the rows were listed in \(listings.withLock { $0.count }) commits")
            #expect(try machines[1].count() == count)
            #expect(try machines[1].value("fb0.example", "user") == "mine")
            #expect(try machines[1].verify())
        }

        @Test(
            "An item changed here by another process (deleted, made ThisDeviceOnly, edited, written again) between the push's read and its applying of a later record from elsewhere: neither overwritten, deleted nor brought back; the rule settles it",
            arguments: ["deleted", "madeLocal", "edited", "writtenAgain"])
        func changedHereWhileTheRecordThatWonIsApplied(change: String) throws {
            let (groups, machines) = try threeMachines()
            try machines[0].add("x.example", "user", "v1")
            for group in groups { try group.sync() }
            try machines[1].set("x.example", "user", "edited on B")
            tick()
            try machines[0].set("x.example", "user", "edited on A")
            try groups[0].sync()
            let machine = machines[1]
            let report = try syncWritingBeforeSuperseding(groups[1]) { () throws(LockboxError) in
                switch change {
                case "deleted": try machine.vault.delete(matching: machine.query("x.example", "user"))
                case "madeLocal": try update(machine, "x.example") { $0.accessibility = .whenUnlockedThisDeviceOnly }
                case "edited": try machine.vault.update(matching: machine.query("x.example", "user"), to: ItemUpdate(data: SecretBytes(utf8: "later on B")))
                default: try machine.vault.update(matching: machine.query("x.example", "user"), to: ItemUpdate(data: SecretBytes(utf8: "edited on B")))
                }
            }
            // The record that won was not applied (the row changed meanwhile): not counted.
            #expect(report.superseded == 0)
            for group in [groups[1], groups[0], groups[2], groups[1]] { try group.sync() }
            // A delete has its time (the vault records it) and wins; an item made local has none
            // and loses to the edit made elsewhere, which the local item holds back here.
            let expected: String? = ["deleted": nil, "madeLocal": "edited on A", "edited": "later on B", "writtenAgain": "edited on B"][change]!
            for (index, machine) in machines.enumerated() {
                if index == 1 && change == "madeLocal" {
                    var query = machine.query("x.example", "user")
                    query.returning = [.attributes, .data]
                    let kept = try machine.vault.item(matching: query)
                    #expect(kept.attributes.accessibility == .whenUnlockedThisDeviceOnly, "the item made ThisDeviceOnly here was made to sync again")
                    #expect(kept.data.map { String(decoding: $0.withUnsafeBytes { Array($0) }, as: UTF8.self) } == "edited on B", "the item kept here was overwritten")
                    #expect(try machine.count() == 1)
                    #expect(try groups[1].status().heldBack == 1)
                } else {
                    #expect(try machine.value("x.example", "user") == expected, "the change made here last was lost (machine \(index))")
                }
                #expect(try machine.verify())
            }
        }

        @Test(
            "An item deleted, or made ThisDeviceOnly, here, whose delete lost to a later edit elsewhere, and written again here (another process) before the push applies that edit: the write made here last wins everywhere",
            arguments: ["reAdded", "madeToSyncAgain"])
        func writtenAgainWhileTheDeleteThatLostIsSettled(change: String) throws {
            let (groups, machines) = try threeMachines()
            try machines[0].add("x.example", "user", "v1")
            for group in groups { try group.sync() }
            tick()
            if change == "reAdded" {
                try machines[1].delete("x.example", "user")
            } else {
                try update(machines[1], "x.example") { $0.accessibility = .whenUnlockedThisDeviceOnly }
            }
            tick()
            try machines[0].set("x.example", "user", "edited on A")
            try groups[0].sync()
            let machine = machines[1]
            try syncWritingBeforeSuperseding(groups[1]) { () throws(LockboxError) in
                if change == "reAdded" {
                    var item = Item.genericPassword(service: "x.example", account: "user", data: SecretBytes(utf8: "written on B last"))
                    item.attributes.synchronizable = true
                    try machine.vault.add(item)
                } else {
                    var attributes = ItemAttributes()
                    attributes.accessibility = .afterFirstUnlock
                    try machine.vault.update(
                        matching: machine.query("x.example", "user"), to: ItemUpdate(attributes: attributes, data: SecretBytes(utf8: "written on B last")))
                }
            }
            for group in [groups[1], groups[0], groups[2], groups[1]] { try group.sync() }
            for (index, machine) in machines.enumerated() {
                #expect(try machine.value("x.example", "user") == "written on B last", "B's write, the last of all, was overwritten (machine \(index))")
                #expect(try machine.count() == 1)
                #expect(try machine.verify())
            }
        }

        @Test(
            "An item made ThisDeviceOnly, not synchronizable, or renamed here is a delete for the group without a time of its own: it never wins over an edit made elsewhere since the last sync, before or after it, even once the item it holds now is edited here",
            arguments: [
                ("thisDeviceOnly", "editedElsewhereFirst"), ("thisDeviceOnly", "changedHereFirst"), ("thisDeviceOnly", "changedHereFirstThenEdited"),
                ("notSynchronizable", "changedHereFirstThenEdited"), ("renamed", "editedElsewhereFirst"), ("renamed", "changedHereFirstThenEdited"),
            ])
        func madeLocalOrRenamedNeverWinsOverAnEditElsewhere(change: String, order: String) throws {
            let (groups, machines) = try threeMachines()
            try machines[0].add("x.example", "user", "v1")
            for group in groups { try group.sync() }
            func changeHere() throws {
                try update(machines[1], "x.example") { attributes in
                    switch change {
                    case "thisDeviceOnly": attributes.accessibility = .whenUnlockedThisDeviceOnly
                    case "notSynchronizable": attributes.synchronizable = false
                    default: attributes.service = "y.example"
                    }
                }
            }
            tick()
            if order == "editedElsewhereFirst" { try machines[0].set("x.example", "user", "edited on A") } else { try changeHere() }
            tick()
            if order == "editedElsewhereFirst" { try changeHere() } else { try machines[0].set("x.example", "user", "edited on A") }
            var own = "v1"
            if order == "changedHereFirstThenEdited" {
                // B then edits the item it holds now: not the moment x stopped syncing here.
                tick()
                own = "B's own later value"
                var query = machines[1].query(change == "renamed" ? "y.example" : "x.example", "user")
                query.synchronizable = change == "notSynchronizable" ? .notSynchronizable : .synchronizable
                try machines[1].vault.update(matching: query, to: ItemUpdate(data: SecretBytes(utf8: own)))
            }
            for group in [groups[0], groups[1], groups[0], groups[2], groups[1]] { try group.sync() }
            for index in [0, 2] {
                #expect(try machines[index].value("x.example", "user") == "edited on A", "an edit made elsewhere was lost to the change here (machine \(index))")
                if change == "renamed" { #expect(try machines[index].value("y.example", "user") == own) }
            }
            switch change {
            case "renamed":
                #expect(try machines[1].value("y.example", "user") == own)
                #expect(try machines[1].value("x.example", "user") == "edited on A")
            case "notSynchronizable":
                // Its own item (the sync flag is part of the key) beside the group's.
                #expect(try machines[1].value("x.example", "user") == "edited on A")
                #expect(try machines[1].count() == 2)
            default:
                #expect(try machines[1].value("x.example", "user") == own, "the item kept here was overwritten")
                #expect(try groups[1].status().heldBack == 1)
            }
            for machine in machines { #expect(try machine.verify()) }
        }

        @Test(
            "An item renamed here, synced with the process stopped before its state's commit, then renamed back or made ThisDeviceOnly: the change made last wins everywhere, whatever the clocks say; nothing is lost",
            arguments: ["renamedBack", "madeLocal"], ["sameClocks", "writerAhead", "thisBehind"])
        func renamedThenChangedAgainAfterAStoppedSync(then: String, skew: String) throws {
            let hour = Duration.seconds(3600)
            let offsets: [Duration] = ["writerAhead": [hour, .zero, .zero], "thisBehind": [.zero, .zero - hour, .zero]][skew] ?? [.zero, .zero, .zero]
            let (groups, machines) = try threeMachines(clocks: offsets.map { $0 == .zero ? nil : SkewedClock(offset: $0) })
            try machines[0].add("x.example", "user", "v1")
            for group in groups { try group.sync() }
            tick()
            try update(machines[1], "x.example") { $0.service = "y.example" }
            #expect(try syncStoppedBeforeItsStateCommit(groups[1]).pushed == 2)
            tick()
            if then == "renamedBack" {
                try update(machines[1], "y.example") { $0.service = "x.example" }
            } else {
                try update(machines[1], "y.example") { $0.accessibility = .whenUnlockedThisDeviceOnly }
            }
            // Status counts the item renamed back (or the old name's delete); not yet the delete
            // of the name it had, which a sync counts once it finds the stopped push's record in
            // the group (status settles no listing of a push without the database).
            let pendingHere = try groups[1].status().pendingLocalChanges
            #expect(pendingHere == 1)
            for group in [groups[1], groups[0], groups[2], groups[1], groups[0], groups[2]] { try group.sync() }
            for (index, machine) in machines.enumerated() {
                if then == "renamedBack" {
                    #expect(try machine.value("x.example", "user") == "v1", "the item renamed back is lost (machine \(index))")
                } else {
                    #expect(try machine.value("x.example", "user") == nil, "machine \(index)")
                }
                if then == "madeLocal" && index == 1 {
                    #expect(try machine.value("y.example", "user") == "v1", "the item made local here is lost")
                    #expect(try groups[1].status().heldBack == 0)
                } else {
                    #expect(try machine.value("y.example", "user") == nil, "the name given up here stays in the group (machine \(index))")
                }
                #expect(try machine.count() == (then == "madeLocal" && index != 1 ? 0 : 1))
                #expect(try machine.verify())
            }
            for group in groups { #expect(try group.sync().changedNothing) }
        }

        @Test(
            "A value saved again unchanged here (a credential helper stores it after each use) undoes neither an edit nor a delete made elsewhere since, nor a later record met during the sync",
            arguments: ["edited", "deleted", "editedDuringTheSync"])
        func savedAgainUnchangedUndoesNothing(elsewhere: String) throws {
            let (groups, machines) = try threeMachines()
            try machines[0].add("git.example", "user", "old token")
            for group in groups { try group.sync() }
            tick()
            if elsewhere == "deleted" { try machines[1].delete("git.example", "user") } else { try machines[1].set("git.example", "user", "new token") }
            try groups[1].sync()
            tick()
            let machine = machines[0]
            if elsewhere == "editedDuringTheSync" {
                try syncWritingBetweenPushAndPull(groups[0]) { () throws(LockboxError) in
                    try machine.vault.update(matching: machine.query("git.example", "user"), to: ItemUpdate(data: SecretBytes(utf8: "old token")))
                }
            } else {
                try machine.set("git.example", "user", "old token")
            }
            for group in [groups[0], groups[1], groups[2], groups[0]] { try group.sync() }
            for (index, machine) in machines.enumerated() {
                #expect(
                    try machine.value("git.example", "user") == (elsewhere == "deleted" ? nil : "new token"),
                    "a value saved again unchanged undid the change made elsewhere (machine \(index))")
                #expect(try machine.verify())
            }
            for group in groups { #expect(try group.sync().changedNothing) }
        }
        @Test(
            "A rename whose push never reached the database, then undone: nothing was written, so an edit or a delete made elsewhere meanwhile is kept, as without the stopped push",
            arguments: ["edited", "deleted"], [false, true])
        func renameNeverCommittedThenUndone(elsewhere: String, stopped: Bool) throws {
            let (groups, machines) = try threeMachines()
            try machines[0].add("x.example", "user", "v1")
            for group in groups { try group.sync() }
            tick()
            try update(machines[1], "x.example") { $0.service = "y.example" }
            if stopped {
                // The push lists its rows, then stops before the database's commit.
                groups[1].afterListingAdded.withLock { $0 = { () throws(LockboxError) in throw LockboxError(.io, "stopped before the database's commit") } }
                #expect(throws: LockboxError.self) { try groups[1].sync() }
                groups[1].afterListingAdded.withLock { $0 = nil }
            }
            tick()
            if elsewhere == "deleted" { try machines[0].delete("x.example", "user") } else { try machines[0].set("x.example", "user", "v2") }
            try groups[0].sync()
            tick()
            // Renamed back: the row holds x again, with the content this device knew.
            try update(machines[1], "y.example") { $0.service = "x.example" }
            for group in [groups[1], groups[0], groups[2], groups[1], groups[0], groups[2]] { try group.sync() }
            for (index, machine) in machines.enumerated() {
                #expect(
                    try machine.value("x.example", "user") == (elsewhere == "deleted" ? nil : "v2"),
                    "the change made elsewhere was undone by a rename that never reached the group (machine \(index))")
                #expect(try machine.value("y.example", "user") == nil)
                #expect(try machine.verify())
            }
            for group in groups { #expect(try group.sync().changedNothing) }
        }
    }
}
