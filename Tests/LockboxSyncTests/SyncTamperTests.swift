import Dispatch
import Foundation
import Lockbox
import LockboxTestSupport
import LockboxVault
import Synchronization
import Testing

@testable import LockboxSync

/// The database administrator's edits, made directly in the tables: each must be an error
/// (`errSecDecode`) that applies nothing, on a device that already synced and on a new one.
extension SyncTests {
    /// A group whose records have a history: `a`, `b`, `c` written and synced everywhere, then
    /// `a` edited and `d` added by machine A, which alone has synced since. Returns the record
    /// of `a` as it was before the edit.
    func groupWithHistory() throws -> (groups: [SyncGroup], machines: [Machine], oldA: (version: Int64, payload: [UInt8])) {
        let (groups, machines) = try threeMachines()
        for name in ["a", "b", "c"] { try machines[0].add("\(name).example", "user", "\(name)1") }
        for group in groups { try group.sync() }
        let id = try itemID(groups[0], machines[0], "a.example")
        let old = try #require(try storedRecords(groups[0].groupID).first { $0.id == id })
        tick()
        try machines[0].set("a.example", "user", "a2")
        try machines[0].add("d.example", "user", "d1")
        try groups[0].sync()
        return (groups, machines, (old.version, old.payload))
    }

    func itemID(_ group: SyncGroup, _ machine: Machine, _ service: String) throws -> String {
        var query = machine.query(service, "user")
        query.returning = [.attributes]
        return group.itemID(try machine.vault.item(matching: query))
    }

    /// A machine that joins now: it has seen nothing, so only the head can tell it what is missing.
    func newcomer(_ group: SyncGroup) throws -> (SyncGroup, Machine) {
        let machine = try Machine()
        return (try SyncGroup.join(group.groupID, vault: machine.vault, database: try testDatabase(), passphrase: groupPassphrase), machine)
    }

    /// Machine B (synced before A's last push) and a newcomer both refuse the database as it is,
    /// with `errSecDecode`, and apply nothing.
    func expectRefusedEverywhere(_ groups: [SyncGroup], _ machines: [Machine], _ what: Comment) throws {
        let error = #expect(throws: LockboxError.self, what) { try groups[1].sync() }
        #expect(error?.code == .decode, what)
        #expect(try machines[1].value("a.example", "user") == "a1", what)
        #expect(try machines[1].value("d.example", "user") == nil, what)
        let (late, lateMachine) = try newcomer(groups[0])
        let lateError = #expect(throws: LockboxError.self, what) { try late.sync() }
        #expect(lateError?.code == .decode, what)
        #expect(try lateMachine.count() == 0, what)
        #expect(try machines[1].verify() && lateMachine.verify(), what)
    }

    @Test("A record the administrator deletes is detected by a device that has not pulled it and by a new device; nothing is applied")
    func deletedRecordIsDetected() throws {
        let (groups, machines, _) = try groupWithHistory()
        let connection = try PostgresConnection(try testDatabase())
        let id = try itemID(groups[0], machines[0], "d.example")
        let saved = try #require(try storedRecords(groups[0].groupID).first { $0.id == id })
        try connection.execute("DELETE FROM lockbox_sync_items WHERE group_id = $1 AND item_id = $2", [.text(groups[0].groupID), .text(id)])
        try expectRefusedEverywhere(groups, machines, "a deleted record")
        // The writer, which knows the record, refuses to write over its absence.
        try machines[0].set("d.example", "user", "d2")
        let writer = #expect(throws: LockboxError.self) { try groups[0].sync() }
        #expect(writer?.code == .decode)
        // Put back as it was: every device syncs again.
        try connection.execute(
            "INSERT INTO lockbox_sync_items (group_id, item_id, version, device_id, payload) VALUES ($1, $2, $3, $4, $5)",
            [.text(groups[0].groupID), .text(id), .integer(saved.version), .text(groups[0].deviceID), .bytes(saved.payload)])
        try groups[0].sync()
        try groups[1].sync()
        #expect(try machines[1].value("d.example", "user") == "d2")
        #expect(try machines[1].value("a.example", "user") == "a2")
    }

    @Test("An item's record replaced with its older ciphertext (at its older version) is refused, never applied")
    func replayedOlderRecordIsRefused() throws {
        let (groups, machines, oldA) = try groupWithHistory()
        let connection = try PostgresConnection(try testDatabase())
        let id = try itemID(groups[0], machines[0], "a.example")
        try connection.execute(
            "UPDATE lockbox_sync_items SET version = $3, payload = $4 WHERE group_id = $1 AND item_id = $2",
            [.text(groups[0].groupID), .text(id), .integer(oldA.version), .bytes(oldA.payload)])
        try expectRefusedEverywhere(groups, machines, "an older record replayed")
        // The device that wrote the newer version refuses the old one when it writes the item.
        try machines[0].set("a.example", "user", "a3")
        let writer = #expect(throws: LockboxError.self) { try groups[0].sync() }
        #expect(writer?.code == .decode)
        #expect(try machines[0].value("a.example", "user") == "a3")
        // The older record with a new version number fails to open (the version is sealed in).
        try connection.execute(
            "UPDATE lockbox_sync_items SET version = (SELECT counter FROM lockbox_sync_groups WHERE group_id = $1) WHERE group_id = $1 AND item_id = $2",
            [.text(groups[0].groupID), .text(id)])
        let relabelled = #expect(throws: LockboxError.self) { try groups[1].sync() }
        #expect(relabelled?.code == .decode)
        #expect(try machines[1].value("a.example", "user") == "a1")
    }

    @Test("Two records' ciphertexts swapped, or two records' versions swapped, fail to open; nothing is applied")
    func swappedRecordsAreRefused() throws {
        let (groups, machines, _) = try groupWithHistory()
        let connection = try PostgresConnection(try testDatabase())
        let group = groups[0].groupID
        let b = try itemID(groups[0], machines[0], "b.example")
        let d = try itemID(groups[0], machines[0], "d.example")
        let records = try storedRecords(group)
        let recordB = try #require(records.first { $0.id == b })
        let recordD = try #require(records.first { $0.id == d })
        func put(_ id: String, version: Int64, payload: [UInt8]) throws {
            try connection.execute(
                "UPDATE lockbox_sync_items SET version = $3, payload = $4 WHERE group_id = $1 AND item_id = $2",
                [.text(group), .text(id), .integer(version), .bytes(payload)])
        }
        try put(b, version: recordB.version, payload: recordD.payload)
        try put(d, version: recordD.version, payload: recordB.payload)
        try expectRefusedEverywhere(groups, machines, "payloads swapped")
        try put(b, version: recordD.version, payload: recordB.payload)
        try put(d, version: recordB.version, payload: recordD.payload)
        try expectRefusedEverywhere(groups, machines, "versions swapped")
        try put(b, version: recordB.version, payload: recordB.payload)
        try put(d, version: recordD.version, payload: recordD.payload)
        try groups[1].sync()
        #expect(try machines[1].value("d.example", "user") == "d1")
    }

    @Test("A group without a head gets one only from a device that synced it before heads, checked against what it saw; a new device refuses it")
    func groupFromBeforeHeadsGetsOne() throws {
        let (groups, machines) = try threeMachines()
        for name in ["l1", "l2", "l3"] { try machines[0].add("\(name).example", "user", name) }
        try groups[0].sync()
        try groups[1].sync()
        let connection = try PostgresConnection(try testDatabase())
        let group = groups[0].groupID
        // As a group written before schema 3 would be: records, and no head.
        try connection.execute("UPDATE lockbox_sync_groups SET head = NULL WHERE group_id = $1", [.text(group)])
        // Machine C has synced nothing: it cannot tell that from a head removed to hide records.
        let refused = #expect(throws: LockboxError.self) { try groups[2].sync() }
        #expect(refused?.code == .decode && refused?.message.contains("no head") == true, "\(String(describing: refused))")
        #expect(try machines[2].count() == 0)
        // Machines that verified a head refuse a group without one.
        let tampered = #expect(throws: LockboxError.self) { try groups[0].sync() }
        #expect(tampered?.code == .decode)

        // Machine B as a device that synced before heads: it vouches for the records, but only
        // for a set holding every record it saw, at least as new.
        let stateB = try SyncState(path: groups[1].statePath, device: groups[1].deviceID, key: groups[1].device.stateKey)
        try stateB.forgetVerifiedHead()
        let hidden = try #require(try storedRecords(group).first)
        try connection.execute("DELETE FROM lockbox_sync_items WHERE group_id = $1 AND item_id = $2", [.text(group), .text(hidden.id)])
        let withheld = #expect(throws: LockboxError.self) { try groups[1].sync() }
        #expect(withheld?.code == .decode)
        #expect(try connection.execute("SELECT head FROM lockbox_sync_groups WHERE group_id = $1", [.text(group)]).first?[0] == nil)
        try connection.execute(
            "INSERT INTO lockbox_sync_items (group_id, item_id, version, device_id, payload) VALUES ($1, $2, $3, $4, $5)",
            [.text(group), .text(hidden.id), .integer(hidden.version), .text(groups[0].deviceID), .bytes(hidden.payload)])
        #expect(try groups[1].sync().changedNothing)
        #expect(try connection.execute("SELECT head FROM lockbox_sync_groups WHERE group_id = $1", [.text(group)]).first?[0] != nil)
        // Then the others verify it: C pulls everything, A goes on.
        #expect(try groups[2].sync().pulled == 3)
        #expect(try machines[2].value("l2.example", "user") == "l2")
        try machines[1].set("l1.example", "user", "l1 again")
        try groups[1].sync()
        try groups[0].sync()
        #expect(try machines[0].value("l1.example", "user") == "l1 again")
    }

    @Test("A device whose first pull failed after its push cannot vouch for a group whose head was removed")
    func failedFirstPullCannotVouch() throws {
        let (groups, machines) = try threeMachines()
        for name in ["a", "b"] { try machines[0].add("\(name).example", "user", name) }
        try groups[0].sync()
        let connection = try PostgresConnection(try testDatabase())
        let group = groups[0].groupID
        // Machine C's first sync pushes its own item, then its pull fails on a damaged record.
        let target = try #require(try storedRecords(group).first)
        var damaged = target.payload
        damaged[damaged.count - 1] ^= 1
        try connection.execute(
            "UPDATE lockbox_sync_items SET payload = $3 WHERE group_id = $1 AND item_id = $2", [.text(group), .text(target.id), .bytes(damaged)])
        try machines[2].add("own.example", "user", "own")
        #expect(throws: LockboxError.self) { try groups[2].sync() }
        #expect(try storedRecords(group).count == 3, "the push before the failed pull was not committed")
        // The record put back, the other one removed with the head: C has pushed, never pulled.
        try connection.execute(
            "UPDATE lockbox_sync_items SET payload = $3 WHERE group_id = $1 AND item_id = $2", [.text(group), .text(target.id), .bytes(target.payload)])
        let other = try #require(try storedRecords(group).first { $0.id != target.id && $0.version < 3 })
        try connection.execute("DELETE FROM lockbox_sync_items WHERE group_id = $1 AND item_id = $2", [.text(group), .text(other.id)])
        try connection.execute("UPDATE lockbox_sync_groups SET head = NULL WHERE group_id = $1", [.text(group)])
        let refused = #expect(throws: LockboxError.self) { try groups[2].sync() }
        #expect(refused?.code == .decode && refused?.message.contains("no head") == true, "\(String(describing: refused))")
        #expect(try connection.execute("SELECT head FROM lockbox_sync_groups WHERE group_id = $1", [.text(group)]).first?[0] == nil)
        #expect(try machines[2].value("own.example", "user") == "own")
    }

    @Test("A record hidden by removing the head is refused by a new device and by the others; a counter at its limit is an error, not a trap")
    func headRemovedToHideARecord() throws {
        let (groups, machines) = try threeMachines()
        for name in ["a", "b", "c", "d"] { try machines[0].add("\(name).example", "user", name) }
        try groups[0].sync()
        try groups[1].sync()
        try machines[0].add("e.example", "user", "e")
        try groups[0].sync()
        let connection = try PostgresConnection(try testDatabase())
        let group = groups[0].groupID
        let newest = try #require(try storedRecords(group).last)
        try connection.execute("DELETE FROM lockbox_sync_items WHERE group_id = $1 AND item_id = $2", [.text(group), .text(newest.id)])
        try connection.execute("UPDATE lockbox_sync_groups SET head = NULL WHERE group_id = $1", [.text(group)])
        #expect(throws: LockboxError.self) { try groups[2].sync() }
        #expect(throws: LockboxError.self) { try groups[1].sync() }
        #expect(try machines[2].count() == 0 && machines[1].count() == 4)
        // The record put back and the counter set to the largest version: a device that synced
        // before heads signs a head at that counter, and its push (a local change) is an error,
        // not a trap; its change stays.
        try connection.execute(
            "INSERT INTO lockbox_sync_items (group_id, item_id, version, device_id, payload) VALUES ($1, $2, $3, $4, $5)",
            [.text(group), .text(newest.id), .integer(newest.version), .text(groups[0].deviceID), .bytes(newest.payload)])
        try connection.execute("UPDATE lockbox_sync_groups SET counter = $2 WHERE group_id = $1", [.text(group), .integer(Int64.max)])
        try SyncState(path: groups[1].statePath, device: groups[1].deviceID, key: groups[1].device.stateKey).forgetVerifiedHead()
        try machines[1].add("mine.example", "user", "local")
        let limit = #expect(throws: LockboxError.self) { try groups[1].sync() }
        #expect(limit?.code == .decode && limit?.message.contains("counter") == true, "\(String(describing: limit))")
        #expect(try machines[1].value("mine.example", "user") == "local")
        #expect(try machines[1].verify() && machines[2].verify())
    }

    @Test("The head rolled back, edited or removed is refused by the devices that saw a later one")
    func rolledBackHeadIsRefused() throws {
        let (groups, machines) = try threeMachines()
        let connection = try PostgresConnection(try testDatabase())
        let group = groups[0].groupID
        let headNow = { () throws -> (counter: Int64, head: [UInt8]) in
            let row = try connection.execute("SELECT counter, head FROM lockbox_sync_groups WHERE group_id = $1", [.text(group)])[0]
            return (try PostgresConnection.integer(row[0]), try PostgresConnection.bytes(row[1]))
        }
        func setHead(counter: Int64, head: [UInt8]?) throws {
            try connection.execute(
                "UPDATE lockbox_sync_groups SET counter = $2, head = $3 WHERE group_id = $1",
                [.text(group), .integer(counter), head.map { .bytes($0) } ?? .null])
        }
        try machines[0].add("h.example", "user", "h1")
        try groups[0].sync()
        let old = try headNow()
        try machines[0].set("h.example", "user", "h2")
        try groups[0].sync()
        try groups[1].sync()
        let current = try headNow()
        #expect(current.counter > old.counter)

        // The older head with its counter: below what both devices saw.
        try setHead(counter: old.counter, head: old.head)
        for index in 0..<2 {
            let error = #expect(throws: LockboxError.self) { try groups[index].sync() }
            #expect(error?.code == .decode)
        }
        // The older head beside the current counter: it names another counter.
        try setHead(counter: current.counter, head: old.head)
        let mismatched = #expect(throws: LockboxError.self) { try groups[1].sync() }
        #expect(mismatched?.code == .decode)
        // One bit of the digest changed: the MAC fails.
        var edited = current.head
        edited[edited.count / 2] ^= 1
        try setHead(counter: current.counter, head: edited)
        let flipped = #expect(throws: LockboxError.self) { try groups[2].sync() }
        #expect(flipped?.code == .decode)
        #expect(try machines[2].count() == 0)
        // No head at all, once there are records.
        try setHead(counter: current.counter, head: nil)
        let missing = #expect(throws: LockboxError.self) { try groups[1].sync() }
        #expect(missing?.code == .decode)
        // The current head back: everyone syncs.
        try setHead(counter: current.counter, head: current.head)
        for group in groups { try group.sync() }
        #expect(try machines[2].value("h.example", "user") == "h2")
        #expect(try machines[1].value("h.example", "user") == "h2")
    }
}

extension SyncTests {
    @Test("A lock the database never releases ends a sync with an error; rows added beyond the versions are refused before they are fetched; a forged key epoch leaves status usable")
    func hostileDatabaseWaitsAndRows() throws {
        let database = try testDatabase()
        let (groups, machines) = try threeMachines()
        try machines[0].add("w.example", "user", "w1")
        try groups[0].sync()
        try groups[1].sync()
        let group = groups[0].groupID
        // Every connection waits for locks for a bounded time unless its options say otherwise.
        #expect(try PostgresConnection(database).execute("SHOW lock_timeout").first?[0] == PostgresConnection.lockTimeout)
        // The group row held by another session: with a short timeout of its own, a push ends
        // with an error instead of waiting, and the local change stays for the next sync.
        let holder = try PostgresConnection(database)
        try holder.execute("BEGIN")
        try holder.execute("SELECT 1 FROM lockbox_sync_groups WHERE group_id = $1 FOR UPDATE", [.text(group)])
        let impatient = try SyncGroup(group, vault: machines[1].vault, database: database + " options='-c lock_timeout=1s'")
        try machines[1].set("w.example", "user", "w2")
        let started = Date()
        let waited = #expect(throws: LockboxError.self) { try impatient.sync() }
        #expect(waited?.message.contains("kept the sync group locked") == true, "\(String(describing: waited))")
        #expect(Date().timeIntervalSince(started) < 30)
        try holder.execute("ROLLBACK")
        #expect(try groups[1].sync().pushed == 1)
        #expect(try groups[0].sync().pulled == 1)

        // Twenty large rows at versions already taken: refused before any is fetched.
        let connection = try PostgresConnection(database)
        let counter = try PostgresConnection.integer(
            try connection.execute("SELECT counter FROM lockbox_sync_groups WHERE group_id = $1", [.text(group)])[0][0])
        try connection.execute(
            """
            INSERT INTO lockbox_sync_items (group_id, item_id, version, device_id, payload)
            SELECT $1, 'junk' || n, $2, 'x', convert_to(repeat('A', 1024 * 1024), 'UTF8') FROM generate_series(1, 20) n
            """, [.text(group), .integer(counter)])
        let flooded = #expect(throws: LockboxError.self) { try groups[2].sync() }
        #expect(flooded?.code == .decode && flooded?.message.contains("more than its versions") == true, "\(String(describing: flooded))")
        #expect(try machines[2].count() == 0)
        try connection.execute("DELETE FROM lockbox_sync_items WHERE group_id = $1 AND item_id LIKE 'junk%'", [.text(group)])
        #expect(try groups[2].sync().pulled == 1)

        // The key epoch moved ahead with no grant: a sync says this device holds no key for it;
        // status still shows the local part, and the problem.
        try connection.execute("UPDATE lockbox_sync_groups SET key_epoch = $2 WHERE group_id = $1", [.text(group), .integer(1 << 62)])
        let noKey = #expect(throws: LockboxError.self) { try groups[1].sync() }
        #expect(noKey?.code == .authFailed)
        let status = try groups[1].status()
        #expect(status.unreachable == nil && status.databaseProblem?.contains("no key") == true)
        #expect(status.syncedItems == 1)
        try connection.execute("UPDATE lockbox_sync_groups SET key_epoch = 0 WHERE group_id = $1", [.text(group)])
        #expect(try groups[1].sync().changedNothing)
        #expect(try machines[1].verify())
    }
}

/// The administrator against a push: the group row put back to an older head while a device
/// writes, with or without records the device wrote or saw.
extension SyncTests {
    func groupHead(_ group: String) throws -> (counter: Int64, head: [UInt8]) {
        let row = try #require(
            try PostgresConnection(try testDatabase()).execute(
                "SELECT counter, head FROM lockbox_sync_groups WHERE group_id = $1", [.text(group)]
            ).first)
        return (try PostgresConnection.integer(row[0]), try PostgresConnection.bytes(row[1]))
    }

    func putGroupHead(_ group: String, _ head: (counter: Int64, head: [UInt8])) throws {
        try PostgresConnection(try testDatabase()).execute(
            "UPDATE lockbox_sync_groups SET counter = $2, head = $3 WHERE group_id = $1", [.text(group), .integer(head.counter), .bytes(head.head)])
    }

    func putRecord(_ group: String, _ id: String, version: Int64, payload: [UInt8]) throws {
        try PostgresConnection(try testDatabase()).execute(
            "UPDATE lockbox_sync_items SET version = $3, payload = $4 WHERE group_id = $1 AND item_id = $2",
            [.text(group), .text(id), .integer(version), .bytes(payload)])
    }

    func stateOf(_ group: SyncGroup) throws -> SyncState {
        try SyncState(path: group.statePath, device: group.device.id, key: group.device.stateKey)
    }

    /// Three machines that all hold `x.example` ("x1", written by the first) and have synced it.
    func itemSyncedEverywhere() throws -> (groups: [SyncGroup], machines: [Machine], group: String) {
        let (groups, machines) = try threeMachines()
        try machines[0].add("x.example", "user", "x1")
        for syncing in groups { try syncing.sync() }
        return (groups, machines, groups[0].groupID)
    }

    @Test("The group row put back to the head a device verified, another device's newer record kept: the device's push is refused, not taken for in step, and its state does not move")
    func pushOverRolledBackHead() throws {
        let (groups, machines, group) = try itemSyncedEverywhere()
        let verified = try groupHead(group)
        tick()
        try machines[1].set("x.example", "user", "x2 from B")
        try groups[1].sync()
        let honest = try groupHead(group)
        try putGroupHead(group, verified)
        tick()
        try machines[0].set("x.example", "user", "x3 from A")
        let error = #expect(throws: LockboxError.self) { try groups[0].sync() }
        #expect(error?.code == .decode)
        #expect(try stateOf(groups[0]).cursor == verified.counter)
        // Nothing A wrote: the others still sync, and once the row is honest again A's edit,
        // the later one, reaches them.
        try putGroupHead(group, honest)
        #expect(try groups[0].sync().pushed == 1)
        for syncing in groups { try syncing.sync() }
        for machine in machines {
            #expect(try machine.value("x.example", "user") == "x3 from A")
            #expect(try machine.verify())
        }
        // The group row put back below what every device verified: sync status reports it, and
        // still shows the local part.
        try putGroupHead(group, verified)
        let status = try groups[0].status()
        #expect(status.databaseProblem?.contains("rolled back") == true, "\(String(describing: status.databaseProblem))")
        #expect(status.pendingLocalChanges == 0)
    }

    @Test("Not in step (another device wrote since), a push over a record the administrator put back to its older ciphertext is refused before it writes, instead of vouching for it in the head it writes; once the record is honest the push goes through")
    func pushNotInStepOverReplayedRecord() throws {
        let (groups, machines, group) = try itemSyncedEverywhere()
        let id = try itemID(groups[0], machines[0], "x.example")
        let older = try #require(try storedRecords(group).first { $0.id == id })
        tick()
        try machines[1].set("x.example", "user", "x2 from B")
        try groups[1].sync()
        let honest = try #require(try storedRecords(group).first { $0.id == id })
        try putRecord(group, id, version: older.version, payload: older.payload)
        let before = try groupHead(group)
        tick()
        try machines[0].set("x.example", "user", "x3 from A")
        let error = #expect(throws: LockboxError.self) { try groups[0].sync() }
        #expect(error?.code == .decode)
        #expect(try groupHead(group) == before, "nothing written")
        #expect(try machines[0].value("x.example", "user") == "x3 from A")
        try putRecord(group, id, version: honest.version, payload: honest.payload)
        #expect(try groups[0].sync().pushed == 1)
        for syncing in groups { try syncing.sync() }
        for machine in machines { #expect(try machine.value("x.example", "user") == "x3 from A") }
    }

    @Test("Two devices pushing 1,500 new items each at the same moment, in batches that interleave: every batch's check of the head passes, and all three devices converge")
    func concurrentBatchedPushes() throws {
        let (groups, machines) = try threeMachines()
        try machines[0].vault.add(contentsOf: synchronizableItems(1500, prefix: "a-"))
        try machines[1].vault.add(contentsOf: synchronizableItems(1500, prefix: "b-"))
        let failures = Mutex<[String]>([])
        DispatchQueue.concurrentPerform(iterations: 2) { index in
            do { try groups[index].sync() } catch { failures.withLock { $0.append("\(error)") } }
        }
        #expect(failures.withLock { $0 }.isEmpty)
        for group in groups + groups { try group.sync() }
        for machine in machines { #expect(try machine.count() == 3000) }
        #expect(try storedRecords(groups[0].groupID).count == 3000)
        for group in groups { #expect(try stateOf(group).unverifiedWrites.isEmpty) }
    }

    @Test("Not in step, a push over a record the administrator deleted, of an item this device never knew, is refused before it writes")
    func pushNotInStepOverWithheldRecord() throws {
        let (groups, machines, group) = try itemSyncedEverywhere()
        tick()
        try machines[1].add("y.example", "user", "y1 from B")
        try groups[1].sync()
        let id = try itemID(groups[1], machines[1], "y.example")
        try PostgresConnection(try testDatabase()).execute(
            "DELETE FROM lockbox_sync_items WHERE group_id = $1 AND item_id = $2", [.text(group), .text(id)])
        let before = try groupHead(group)
        tick()
        // A adds the same item: it knows no record of it, and the head lists B's.
        try machines[0].add("y.example", "user", "y from A")
        let error = #expect(throws: LockboxError.self) { try groups[0].sync() }
        #expect(error?.code == .decode)
        #expect(try groupHead(group) == before, "nothing written")
    }

    @Test("A push whose state was not saved (a crash) meets the group row put back under its own record: the record above the head is refused, the change is not taken for pushed, and reaches the others once the row is honest")
    func recordAboveHead() throws {
        let (groups, machines, group) = try itemSyncedEverywhere()
        let verified = try groupHead(group)
        let id = try itemID(groups[0], machines[0], "x.example")
        let old = try #require(try storedRecords(group).first { $0.id == id })
        let before = try copyState(groups[0].statePath)
        let pulled = try pulledVersion(groups[0])
        tick()
        try machines[0].set("x.example", "user", "x2")
        try groups[0].sync()
        // As if A died before its push's state commit; the administrator puts the group row
        // back to the head A verified, keeping A's new record.
        try restoreStoppedSync(before, of: groups[0], pulled: pulled)
        try putGroupHead(group, verified)
        let error = #expect(throws: LockboxError.self) { try groups[0].sync() }
        #expect(error?.code == .decode)
        // The administrator hides the new record too (the old one back): A writes its change
        // again, and it reaches the others.
        try putRecord(group, id, version: old.version, payload: old.payload)
        #expect(try groups[0].sync().pushed == 1)
        for syncing in groups.dropFirst() { try syncing.sync() }
        for machine in machines { #expect(try machine.value("x.example", "user") == "x2") }
    }

    @Test("A push undone by the administrator before the pull of the same sync (the group row put back below what the push wrote) is an error, not a silent loss")
    func pushUndoneBeforePull() throws {
        let (groups, machines, group) = try itemSyncedEverywhere()
        try machines[2].add("y.example", "user", "y1")
        try groups[2].sync()
        let beforePush = try groupHead(group)
        let id = try itemID(groups[0], machines[0], "x.example")
        let old = try #require(try storedRecords(group).first { $0.id == id })
        tick()
        try machines[0].set("x.example", "user", "x2")
        let connection = try PostgresConnection(try testDatabase())
        let state = try stateOf(groups[0])
        var report = SyncGroup.Report()
        // Not in step (C wrote since A's last pull): the pull must fetch, and finds the push undone.
        let floor = try groups[0].push(connection, state: state, report: &report)
        #expect(report.pushed == 1)
        #expect(floor > beforePush.counter)
        try putGroupHead(group, beforePush)
        try putRecord(group, id, version: old.version, payload: old.payload)
        let error = #expect(throws: LockboxError.self) { try groups[0].pull(connection, state: state, report: &report, floor: floor) }
        #expect(error?.code == .decode)
        #expect(error?.message.contains("rolled back") == true)
    }
}
