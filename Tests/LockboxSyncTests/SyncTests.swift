import Foundation
import Lockbox
import LockboxTestSupport
import LockboxVault
import Synchronization
import Testing
import VaultStorage

@testable import LockboxSync

/// The test database that scripts/postgres starts (scripts/test exports its connection string).
func testDatabase() throws -> String {
    try #require(
        ProcessInfo.processInfo.environment["LOCKBOX_TEST_POSTGRES"],
        "LOCKBOX_TEST_POSTGRES is not set: start PostgreSQL with `scripts/postgres start` and export its output")
}

/// A simulated machine: its own XDG tree (data, state: its own device key) and vault.
final class Machine: @unchecked Sendable {
    let directory = TemporaryDirectory("lockbox-sync-machine")
    let vault: Vault

    /// - Parameter clock: this machine's clock (a machine whose clock runs ahead or behind).
    init(clock: (any LockboxClock)? = nil) throws {
        var configuration = Vault.Configuration()
        configuration.keyDerivation = .interactive
        if let clock { configuration.clock = clock }
        configuration.device = DeviceIdentity(keyPath: directory.file("state/lockbox/device-key"))
        vault = try Vault.create(
            at: directory.file("data/lockbox/default.lockbox"), passphrase: SecretBytes(utf8: "machine passphrase"),
            configuration: configuration)
    }

    deinit { vault.lockAll() }

    func add(_ service: String, _ account: String, _ value: String, accessibility: Accessibility? = nil, synchronizable: Bool = true) throws {
        var item = Item.genericPassword(service: service, account: account, data: SecretBytes(utf8: value), accessibility: accessibility)
        item.attributes.synchronizable = synchronizable
        try vault.add(item)
    }

    func query(_ service: String, _ account: String) -> Query {
        var query = Query.genericPassword(service: service, account: account)
        query.synchronizable = .synchronizable
        return query
    }

    /// The value of a synchronizable item, nil when there is none.
    func value(_ service: String, _ account: String) throws -> String? {
        var query = query(service, account)
        query.limit = .all
        query.returning = [.data]
        guard try vault.contains(query) else { return nil }
        let data = try vault.data(matching: query)
        return data.withUnsafeBytes { bytes in String(decoding: bytes, as: UTF8.self) }
    }

    func set(_ service: String, _ account: String, _ value: String) throws {
        try vault.update(matching: query(service, account), to: ItemUpdate(data: SecretBytes(utf8: value)))
    }

    func delete(_ service: String, _ account: String) throws {
        try vault.delete(matching: query(service, account))
    }

    /// The bytes of the synchronizable generic password `service` (account "user"), nil when
    /// there is none.
    func bytes(_ service: String) throws -> [UInt8]? {
        var query = query(service, "user")
        query.returning = [.data]
        guard try vault.contains(query) else { return nil }
        return try vault.data(matching: query).withUnsafeBytes { Array($0) }
    }

    /// A second handle on this machine's vault, its configuration changed by `change` (a larger
    /// size limit, some access groups only), unlocked.
    func reopened(_ change: (inout Vault.Configuration) -> Void) throws -> Vault {
        var configuration = vault.configuration
        change(&configuration)
        let handle = try Vault.open(at: vault.path, configuration: configuration)
        if !(try handle.isUnlocked) { try handle.unlock(passphrase: SecretBytes(utf8: "machine passphrase")) }
        return handle
    }

    /// The vault's own full check (integrity record, every row) after sync changed it.
    func verify() throws -> Bool {
        let report = try Vault.verify(at: vault.path, configuration: vault.configuration)
        return report.isSound && report.checkedItems == report.items
    }

    func count() throws -> Int {
        var query = Query(.genericPassword, limit: .all, synchronizable: .any)
        query.returning = [.attributes]
        guard try vault.contains(query) else { return 0 }
        // Not the group key, which each machine keeps for itself.
        return try vault.items(matching: query).filter { $0.attributes.accessGroup != SyncGroup.keyAccessGroup }.count
    }
}

let groupPassphrase = SecretBytes(utf8: "group passphrase for the sync tests")

/// Three machines in one new group: the first creates it, the others join.
/// `count` synchronizable generic passwords, services "`prefix`0.example" ..., account "user",
/// values "value 0" ...
func synchronizableItems(_ count: Int, prefix: String) -> [Item] {
    (0..<count).map { index in
        var item = Item.genericPassword(service: "\(prefix)\(index).example", account: "user", data: SecretBytes(utf8: "value \(index)"))
        item.attributes.synchronizable = true
        return item
    }
}

/// `clocks`: each machine's clock (nil: the system's).
func threeMachines(clocks: [(any LockboxClock)?] = [nil, nil, nil]) throws -> (groups: [SyncGroup], machines: [Machine]) {
    let database = try testDatabase()
    let machines = try clocks.map { clock in try Machine(clock: clock) }
    let first = try SyncGroup.create(vault: machines[0].vault, database: database, passphrase: groupPassphrase)
    var groups = [first]
    for machine in machines.dropFirst() {
        groups.append(try SyncGroup.join(first.groupID, vault: machine.vault, database: database, passphrase: groupPassphrase))
    }
    return (groups, machines)
}

/// A copy of a sync state: its file and its write-ahead log (the state keeps its log when its
/// connection closes, so the file alone may be an older state, or an empty one).
struct StateCopy {
    let file: Data
    let log: Data?
}

/// The sync state at `path` as it is now.
func copyState(_ path: String) throws -> StateCopy {
    StateCopy(file: try Data(contentsOf: URL(fileURLWithPath: path)), log: try? Data(contentsOf: URL(fileURLWithPath: path + "-wal")))
}

/// Puts back a copy of a sync state (``copyState(_:)``); nil removes the state.
func restoreState(_ copy: StateCopy?, at path: String) throws {
    for suffix in ["-wal", "-shm"] { try? FileManager.default.removeItem(atPath: path + suffix) }
    guard let copy else { return try FileManager.default.removeItem(atPath: path) }
    try copy.file.write(to: URL(fileURLWithPath: path))
    if let log = copy.log { try log.write(to: URL(fileURLWithPath: path + "-wal")) }
}

/// How far `group`'s state had pulled, as this machine recorded it (``SyncPulledMark``); 0 when
/// nothing is recorded.
func pulledVersion(_ group: SyncGroup) throws -> Int64 {
    group.pulledMark.read().cursor ?? 0
}

/// Puts back a copy of `group`'s sync state taken during a sync, and the machine's record of the
/// device's pulls as it was before that sync (`pulled`): what a process stopped before its
/// state's commit leaves (the record is raised after the state's commit).
func restoreStoppedSync(_ copy: StateCopy?, of group: SyncGroup, pulled: Int64) throws {
    try restoreState(copy, at: group.statePath)
    group.pulledMark.record(pulled, exactly: true)
}

/// Waits until a statement containing `text` sleeps in the database (slowed by a trigger).
func waitForSleeping(_ text: String) throws -> Bool {
    let watcher = try PostgresConnection(try testDatabase())
    for _ in 0..<200 {
        let rows = try watcher.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'PgSleep' AND query LIKE $1", [.text("%" + text + "%")])
        if try PostgresConnection.integer(rows.first?[0] ?? nil) > 0 { return true }
        Thread.sleep(forTimeInterval: 0.1)
    }
    return false
}

/// A trigger that holds each matching insert into `table` for `seconds`: the window a removal
/// is run in. Returns what drops it.
func slowInserts(into table: String, when condition: String, seconds: Int = 3) throws -> () -> Void {
    let setup = try PostgresConnection(try testDatabase())
    try setup.execute(
        "CREATE OR REPLACE FUNCTION lockbox_test_slow() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN PERFORM pg_sleep(\(seconds)); RETURN NEW; END $$")
    try setup.execute(
        "CREATE TRIGGER lockbox_test_slow BEFORE INSERT ON \(table) FOR EACH ROW WHEN (\(condition)) EXECUTE FUNCTION lockbox_test_slow()")
    return {
        _ = try? setup.execute("DROP TRIGGER IF EXISTS lockbox_test_slow ON \(table)")
        _ = try? setup.execute("DROP FUNCTION IF EXISTS lockbox_test_slow()")
    }
}

/// What `body` returned or threw (a test that reports either in its message).
func outcome<T>(of body: () throws -> T) -> Result<T, any Error> {
    do { return .success(try body()) } catch { return .failure(error) }
}

/// A later modification time than anything before it (the rule compares milliseconds).
func tick() { usleep(5_000) }

@Suite("Sync through PostgreSQL", .serialized)
struct SyncTests {
    @Test("An item added on one machine reaches the two others; edits on two machines converge to the later one")
    func concurrentEditsConverge() throws {
        let (groups, machines) = try threeMachines()
        try machines[0].add("mail.example", "alice", "v1")
        #expect(try groups[0].sync().pushed == 1)
        for group in groups.dropFirst() { try group.sync() }
        #expect(try machines[1].value("mail.example", "alice") == "v1")
        #expect(try machines[2].value("mail.example", "alice") == "v1")

        // Both edit before either syncs; the second edit is the later one and wins everywhere.
        try machines[0].set("mail.example", "alice", "from A")
        tick()
        try machines[1].set("mail.example", "alice", "from B")
        try groups[0].sync()
        try groups[1].sync()
        for group in groups { try group.sync() }
        for machine in machines {
            #expect(try machine.value("mail.example", "alice") == "from B")
            #expect(try machine.count() == 1)
            #expect(try machine.verify())
        }
        // Nothing left to do: a further round writes and applies nothing.
        for group in groups {
            let report = try group.sync()
            #expect(report.changedNothing)
        }
    }

    @Test("An edit made offline syncs later; a delete propagates and an older offline edit does not bring the item back")
    func offlineEditsAndDeletes() throws {
        let (groups, machines) = try threeMachines()
        try machines[0].add("db.example", "app", "one")
        try machines[0].add("ci.example", "bot", "token-1")
        for group in groups { try group.sync() }
        #expect(try machines[2].value("ci.example", "bot") == "token-1")

        // Machine C is offline: it edits both items.
        try machines[2].set("db.example", "app", "edited offline")
        try machines[2].set("ci.example", "bot", "token-2")
        tick()
        // Later, A deletes one of them and syncs; B follows.
        try machines[0].delete("db.example", "app")
        try groups[0].sync()
        try groups[1].sync()
        #expect(try machines[1].value("db.example", "app") == nil)

        // C comes back: its edit of the deleted item is older than the delete and loses; its
        // other edit wins.
        let report = try groups[2].sync()
        #expect(report.superseded == 1)
        for group in groups { try group.sync() }
        for machine in machines {
            #expect(try machine.value("db.example", "app") == nil)
            #expect(try machine.value("ci.example", "bot") == "token-2")
            #expect(try machine.verify())
        }
    }

    @Test("A delete made offline is stamped with when it was made: an edit made elsewhere after it, synced first, wins; a later delete still wins")
    func offlineDeleteLosesToALaterEdit() throws {
        let (groups, machines) = try threeMachines()
        try machines[0].add("wiki.example", "editor", "one")
        try machines[0].add("mail.example", "editor", "one")
        for group in groups { try group.sync() }

        // Machine C, offline, deletes both; afterwards A edits the first and syncs.
        try machines[2].delete("wiki.example", "editor")
        try machines[2].delete("mail.example", "editor")
        tick()
        try machines[0].set("wiki.example", "editor", "edited after the delete")
        try groups[0].sync()
        // C comes back: its delete of the first is older than A's edit and loses (the item
        // comes back to C); its delete of the second, which nobody edited since, wins.
        try groups[2].sync()
        for group in groups { try group.sync() }
        for machine in machines {
            #expect(try machine.value("wiki.example", "editor") == "edited after the delete")
            #expect(try machine.value("mail.example", "editor") == nil)
            #expect(try machine.verify())
        }

        // A later delete of the edited item (after the edit, before anything else) wins.
        tick()
        try machines[1].delete("wiki.example", "editor")
        try groups[1].sync()
        for group in groups { try group.sync() }
        for machine in machines { #expect(try machine.value("wiki.example", "editor") == nil) }
    }

    @Test("A delete pushed after another device's delete of the item keeps its own, later time: an edit made between the two, pushed last, loses to it")
    func laterDeleteKeepsItsTimeOverAnEarlierDelete() throws {
        let (groups, machines) = try threeMachines()
        try machines[0].add("twice.example", "user", "one")
        for group in groups { try group.sync() }
        // C deletes and syncs; A, offline, edits; then B deletes, the last write of all.
        try machines[2].delete("twice.example", "user")
        try groups[2].sync()
        tick()
        try machines[0].set("twice.example", "user", "edited between the deletes")
        tick()
        try machines[1].delete("twice.example", "user")
        // B's tombstone meets C's in the database: the same content, but a later write.
        try groups[1].sync()
        // A's edit, older than B's delete, loses to it.
        try groups[0].sync()
        for group in groups { try group.sync() }
        for machine in machines {
            #expect(try machine.value("twice.example", "user") == nil, "an edit made before the last delete came back")
            #expect(try machine.verify())
        }

        // The same with edits of the same content: the later write's time is kept.
        try machines[0].add("same.example", "user", "one")
        for group in groups { try group.sync() }
        try machines[2].set("same.example", "user", "same")
        try groups[2].sync()
        tick()
        try machines[0].set("same.example", "user", "other")
        tick()
        try machines[1].set("same.example", "user", "same")
        try groups[1].sync()
        try groups[0].sync()
        for group in groups { try group.sync() }
        for machine in machines { #expect(try machine.value("same.example", "user") == "same", "an edit older than the last write won") }
    }

    @Test("A pulled change whose local state was lost (a crash between the two commits) is pushed again with its own time: a later edit made elsewhere still wins")
    func reappliedChangeKeepsItsTime() throws {
        let (groups, machines) = try threeMachines()
        try machines[0].add("wiki.example", "editor", "one")
        try machines[0].add("mail.example", "editor", "one")
        for group in groups { try group.sync() }
        try machines[0].set("wiki.example", "editor", "from A")
        try machines[0].delete("mail.example", "editor")
        try groups[0].sync()
        // C edits both later, offline.
        tick()
        try machines[2].set("wiki.example", "editor", "from C")
        try machines[2].set("mail.example", "editor", "from C")
        tick()
        // B pulls A's edit and delete; its vault commits, its state is lost.
        let path = groups[1].statePath
        let saved = try copyState(path)
        let pulled = try pulledVersion(groups[1])
        try groups[1].sync()
        #expect(try machines[1].value("wiki.example", "editor") == "from A")
        #expect(try machines[1].value("mail.example", "editor") == nil)
        try restoreStoppedSync(saved, of: groups[1], pulled: pulled)
        // C's later edits reach the database; then B takes what it applied for changes of its
        // own and pushes them: with the times A made them, they lose to C's.
        try groups[2].sync()
        try groups[1].sync()
        for group in groups { try group.sync() }
        for machine in machines {
            #expect(try machine.value("wiki.example", "editor") == "from C")
            #expect(try machine.value("mail.example", "editor") == "from C")
            #expect(try machine.verify())
        }
    }

    @Test("A change from a machine whose clock runs a day ahead is dated now here, not in the future; a later edit here still wins")
    func aheadClockIsNotCarriedIntoTheFuture() throws {
        let database = try testDatabase()
        let ahead = ManualClock()
        ahead.advance(by: .seconds(24 * 3600))
        let machines = [try Machine(clock: ahead), try Machine()]
        let groups = [
            try SyncGroup.create(vault: machines[0].vault, database: database, passphrase: groupPassphrase),
        ]
        let joined = try SyncGroup.join(groups[0].groupID, vault: machines[1].vault, database: database, passphrase: groupPassphrase)
        try machines[0].add("clock.example", "alice", "from the future")
        try groups[0].sync()
        try joined.sync()
        var query = machines[1].query("clock.example", "alice")
        query.returning = [.attributes]
        let received = try #require(try machines[1].vault.items(matching: query).first)
        let now = Date()
        #expect(try #require(received.attributes.modificationDate) <= now)
        #expect(try #require(received.attributes.creationDate) <= now)
        // An edit made here afterwards (dated now, a day before the record's stamp) still wins:
        // it is stamped after the version this machine knew.
        tick()
        try machines[1].set("clock.example", "alice", "edited here later")
        try joined.sync()
        try groups[0].sync()
        for machine in machines { #expect(try machine.value("clock.example", "alice") == "edited here later") }
    }

    @Test("A recorded deletion edited in the keychain file is refused (errSecDecode), not used as a time; once dropped on request, the delete loses to a later edit")
    func editedDeletionRecordIsRefused() throws {
        let (groups, machines) = try threeMachines()
        try machines[0].add("wiki.example", "editor", "one")
        for group in groups { try group.sync() }
        try machines[2].delete("wiki.example", "editor")
        // The attacker moves the delete later, so that it would beat edits made after it.
        let attacker = try Database(path: machines[2].vault.path, create: false)
        try attacker.execute("UPDATE sync_deletions SET deleted_at = deleted_at + 86400000")
        #expect(attacker.totalChanges == 1)
        let error = #expect(throws: LockboxError.self) { try groups[2].sync() }
        #expect(error?.code == .decode)
        #expect(error?.message.contains("lockbox sync forget-damaged-deletions") == true)
        #expect(try machines[0].value("wiki.example", "editor") == "one", "a refused delete reached the group")

        // Meanwhile A edits the item; once C drops the damaged record, its delete is pushed as
        // made just after the version C knew, and loses to that edit.
        tick()
        try machines[0].set("wiki.example", "editor", "edited after the delete")
        try groups[0].sync()
        #expect(try machines[2].vault.forgetDamagedDeletionRecords().dropped == 1)
        #expect(try machines[2].verify())
        try groups[2].sync()
        for group in groups { try group.sync() }
        for machine in machines {
            #expect(try machine.value("wiki.example", "editor") == "edited after the delete")
            #expect(try machine.verify())
        }
    }

    @Test("ThisDeviceOnly and non-synchronizable items never reach the database; no service, account or value is in clear")
    func databaseHoldsNoClearText() throws {
        let (groups, machines) = try threeMachines()
        let canaries = (0..<6).map { makeCanary("sync\($0)") }
        try machines[0].add(canaries[0], canaries[1], canaries[2])
        try machines[0].add(canaries[3], "local", canaries[4], accessibility: .whenUnlockedThisDeviceOnly)
        try machines[0].add(canaries[5], "local", canaries[4], synchronizable: false)
        try groups[0].sync()
        try groups[1].sync()
        #expect(try machines[1].value(canaries[0], canaries[1]) == canaries[2])
        #expect(try machines[1].count() == 1)

        let connection = try PostgresConnection(try testDatabase())
        let rows = try connection.execute(
            "SELECT item_id, version, device_id, payload FROM lockbox_sync_items WHERE group_id = $1", [.text(groups[0].groupID)])
        #expect(rows.count == 1)
        // Every table, as text, and every bytea column decoded.
        var dump = ""
        for table in [
            "lockbox_sync_groups", "lockbox_sync_items", "lockbox_sync_devices", "lockbox_sync_schema", "lockbox_sync_key_grants",
            "lockbox_sync_invitations", "lockbox_fleet_sessions",
        ] {
            for row in try connection.execute("SELECT t::text FROM \(table) t") { dump += (row[0] ?? "") + "\n" }
        }
        var bytes = Array(dump.utf8)
        for column in [
            ("payload", "lockbox_sync_items"), ("key_wrap", "lockbox_sync_groups"), ("public_key", "lockbox_sync_devices"),
            ("sealed_key", "lockbox_sync_key_grants"), ("key_wrap", "lockbox_sync_invitations"),
            ("refresh_token", "lockbox_fleet_sessions"), ("access_token", "lockbox_fleet_sessions"),
        ] {
            for row in try connection.execute("SELECT \(column.0) FROM \(column.1) WHERE \(column.0) IS NOT NULL") {
                bytes += try PostgresConnection.bytes(row[0])
            }
        }
        #expect(dump.contains(groups[0].groupID))
        for canary in canaries + ["mail.example", "alice"] {
            #expect(!contains(bytes, Array(canary.utf8)), "\(canary) is in the database in clear")
        }
    }

    @Test("A sync that stops after its push committed, before its state was saved, neither loses nor duplicates")
    func crashAfterCommit() throws {
        let (groups, machines) = try threeMachines()
        try machines[0].add("a.example", "one", "1")
        try groups[0].sync()
        let before = try copyState(groups[0].statePath)
        let pulled = try pulledVersion(groups[0])
        try machines[0].add("b.example", "two", "2")
        try machines[0].set("a.example", "one", "1b")
        let counter = { () throws -> String? in
            try PostgresConnection(try testDatabase()).execute(
                "SELECT counter FROM lockbox_sync_groups WHERE group_id = $1", [.text(groups[0].groupID)]).first?[0] ?? nil
        }
        try groups[0].sync()
        let afterFirst = try counter()
        // As if the process died right after the push's commit: the state file is the old one.
        try restoreStoppedSync(before, of: groups[0], pulled: pulled)
        let report = try groups[0].sync()
        #expect(report.pulled == 0)
        #expect(try counter() == afterFirst, "the repeated push wrote new versions")
        try groups[1].sync()
        #expect(try machines[1].count() == 2)
        #expect(try machines[1].value("a.example", "one") == "1b")
        #expect(try machines[1].value("b.example", "two") == "2")
    }

    @Test("A pull repeated after a crash, or after the state file was lost, applies and writes nothing twice")
    func crashDuringPull() throws {
        let (groups, machines) = try threeMachines()
        try groups[1].sync()
        let empty = try copyState(groups[1].statePath)
        try machines[0].add("p.example", "one", "1")
        try machines[0].add("p.example", "two", "2")
        try groups[0].sync()
        let pulled = try pulledVersion(groups[1])
        #expect(try groups[1].sync().pulled == 2)
        let counter = try PostgresConnection(try testDatabase()).execute(
            "SELECT counter FROM lockbox_sync_groups WHERE group_id = $1", [.text(groups[0].groupID)]).first?[0]
        // As if machine B died after applying, before saving its cursor.
        try restoreStoppedSync(empty, of: groups[1], pulled: pulled)
        #expect(try groups[1].sync().changedNothing)
        // And with no state at all: refused (it could take the items for edits made here), and
        // rebuilt from the group on request, which writes nothing.
        try restoreState(nil, at: groups[1].statePath)
        #expect(throws: LockboxError.self) { try groups[1].sync() }
        let report = try groups[1].resetState()
        #expect(report.pushed == 0)
        #expect(report.superseded == 0)
        #expect(try machines[1].count() == 2)
        let after = try PostgresConnection(try testDatabase()).execute(
            "SELECT counter FROM lockbox_sync_groups WHERE group_id = $1", [.text(groups[0].groupID)]).first?[0]
        #expect(after == counter, "a repeated pull wrote new versions")
        #expect(try machines[1].verify())
    }

    @Test("Rows a pull listed as being added whose vault transaction never committed are applied by the next sync, nothing deleted")
    func rowsListedButNeverCommitted() throws {
        let (groups, machines) = try threeMachines()
        try groups[1].sync()
        let count = SyncGroup.bulkApplyMinimum + 2
        for index in 0..<count { try machines[0].add("late\(index).example", "user", "from A") }
        try machines[0].add("small.example", "user", "from A")
        try groups[0].sync()
        // The vault's transaction rolled back after the rows were listed (a disk full at its commit).
        groups[1].afterListingAdded.withLock { $0 = { () throws(LockboxError) in throw LockboxError(.io, "stopped before the vault's commit") } }
        #expect(throws: LockboxError.self) { try groups[1].sync() }
        groups[1].afterListingAdded.withLock { $0 = nil }
        #expect(try machines[1].count() == 0)
        #expect(try groups[1].sync().pulled == count + 1)
        #expect(try machines[1].count() == count + 1)
        try groups[0].sync()
        #expect(try machines[0].count() == count + 1, "a row listed and never committed was taken for a delete")
        for group in groups { _ = try group.sync() }
        for group in groups { #expect(try group.sync().changedNothing) }
        for machine in machines { #expect(try machine.verify()) }
    }

    @Test("An item a push brought back (another device's later edit won over a delete here), whose state the process did not save, deleted again here, stays deleted")
    func deleteAgainAfterSupersedingWithoutItsState() throws {
        let (groups, machines) = try threeMachines()
        try machines[0].add("twice.example", "user", "1")
        try groups[0].sync()
        try groups[1].sync()
        try machines[1].delete("twice.example", "user")
        tick()
        try machines[0].set("twice.example", "user", "2")
        try groups[0].sync()
        // B's delete loses to A's later edit: its push adds the item back, listing the row first.
        let listed = Mutex<StateCopy?>(nil)
        let path = groups[1].statePath
        groups[1].afterListingAdded.withLock { $0 = { listed.withLock { $0 = try? copyState(path) } } }
        let pulled = try pulledVersion(groups[1])
        #expect(try groups[1].sync().superseded == 1)
        groups[1].afterListingAdded.withLock { $0 = nil }
        #expect(try machines[1].value("twice.example", "user") == "2")
        let copy: StateCopy = try #require(listed.withLock { $0 }, "the push listed no row it adds")
        try restoreStoppedSync(copy, of: groups[1], pulled: pulled)
        tick()
        try machines[1].delete("twice.example", "user")
        try groups[1].sync()
        try groups[0].sync()
        try groups[2].sync()
        for machine in machines {
            #expect(try machine.count() == 0, "a delete made after the push brought the item back is lost")
            #expect(try machine.verify())
        }
    }

    @Test("A new device imports what it pulls in one vault transaction: a record failing mid-import leaves its vault as it was; the next sync imports all, every item reads back, the vault verifies")
    func bulkImportIsAtomic() throws {
        let (groups, machines) = try threeMachines()
        let count = 200
        try machines[0].vault.add(contentsOf: synchronizableItems(count, prefix: "bulk"))
        try groups[0].sync()
        // The newest record's value box damaged: its metadata opens, its value (the last item
        // the import asks for) does not.
        let connection = try PostgresConnection(try testDatabase())
        let id = groups[0].groupID
        let last = try connection.execute(
            "SELECT item_id, payload FROM lockbox_sync_items WHERE group_id = $1 ORDER BY version DESC LIMIT 1", [.text(id)])[0]
        let original = try PostgresConnection.bytes(last[1])
        var damaged = original
        damaged[damaged.count - 1] ^= 1
        try connection.execute(
            "UPDATE lockbox_sync_items SET payload = $3 WHERE group_id = $1 AND item_id = $2", [.text(id), .text(last[0]!), .bytes(damaged)])
        let error = #expect(throws: LockboxError.self) { try groups[1].sync() }
        #expect(error?.code == .decode)
        #expect(try machines[1].count() == 0, "a failed import left items behind")
        #expect(try machines[1].verify())
        try connection.execute(
            "UPDATE lockbox_sync_items SET payload = $3 WHERE group_id = $1 AND item_id = $2", [.text(id), .text(last[0]!), .bytes(original)])
        #expect(try groups[1].sync().pulled == count)
        #expect(try machines[1].count() == count)
        for index in 0..<count {
            #expect(try machines[1].value("bulk\(index).example", "user") == "value \(index)")
        }
        #expect(try machines[1].verify())
        #expect(try groups[1].sync().changedNothing)
        // Edits and deletes are applied in one vault transaction too.
        tick()
        for index in 0..<50 { try machines[0].set("bulk\(index).example", "user", "edited \(index)") }
        for index in 50..<70 { try machines[0].delete("bulk\(index).example", "user") }
        try groups[0].sync()
        #expect(try groups[1].sync().pulled == 70)
        #expect(try machines[1].count() == count - 20)
        #expect(try machines[1].value("bulk7.example", "user") == "edited 7")
        #expect(try machines[1].value("bulk60.example", "user") == nil)
        #expect(try machines[1].value("bulk99.example", "user") == "value 99")
        #expect(try machines[1].verify())
        // ... and known afterwards: a delete there reaches the first machine.
        try machines[1].delete("bulk7.example", "user")
        #expect(try groups[1].sync().pushed == 1)
        try groups[0].sync()
        #expect(try machines[0].value("bulk7.example", "user") == nil)
    }

    @Test("A connection dropped in the middle of a push leaves nothing half-written; the next sync completes it")
    func droppedConnection() throws {
        let (groups, machines) = try threeMachines()
        for index in 0..<5 { try machines[0].add("svc\(index).example", "user", "value \(index)") }
        // Another session holds the group row, so the push waits inside its transaction; that
        // session then kills the waiting backend, as a network failure would.
        let blocker = try PostgresConnection(try testDatabase())
        try blocker.execute("BEGIN")
        try blocker.execute("SELECT counter FROM lockbox_sync_groups WHERE group_id = $1 FOR UPDATE", [.text(groups[0].groupID)])
        let failed = Mutex(false)
        let done = DispatchSemaphore(value: 0)
        let group = groups[0]
        Thread.detachNewThread {
            do { try group.sync() } catch { failed.withLock { $0 = true } }
            done.signal()
        }
        // A third session looks: inside a transaction, pg_stat_activity is a snapshot.
        let watcher = try PostgresConnection(try testDatabase())
        var killed = false
        for _ in 0..<200 where !killed {
            let rows = try watcher.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE '%FOR UPDATE%' AND pid <> pg_backend_pid()")
            killed = !rows.isEmpty
            if !killed { usleep(20_000) }
        }
        #expect(killed)
        if !killed { try blocker.execute("ROLLBACK") }
        done.wait()
        if killed { try blocker.execute("ROLLBACK") }
        #expect(failed.withLock { $0 })
        let rows = try blocker.execute("SELECT count(*) FROM lockbox_sync_items WHERE group_id = $1", [.text(groups[0].groupID)])
        #expect(rows.first?[0] == "0")
        #expect(try groups[0].sync().pushed == 5)
        try groups[1].sync()
        #expect(try machines[1].count() == 5)
    }

    @Test("A database rolled back below what a device saw, or a record moved to another version, is an error")
    func rollbackAndReplayAreErrors() throws {
        let (groups, machines) = try threeMachines()
        try machines[0].add("r.example", "user", "first")
        try groups[0].sync()
        try groups[1].sync()
        let connection = try PostgresConnection(try testDatabase())
        let id = groups[0].groupID
        // A record relabelled with a newer version fails to open.
        let old = try connection.execute("SELECT item_id, payload FROM lockbox_sync_items WHERE group_id = $1", [.text(id)])
        try machines[0].set("r.example", "user", "second")
        try groups[0].sync()
        try connection.execute(
            "UPDATE lockbox_sync_items SET payload = $3, version = 100 WHERE group_id = $1 AND item_id = $2",
            [.text(id), .text(old[0][0]!), .bytes(try PostgresConnection.bytes(old[0][1]))])
        try connection.execute("UPDATE lockbox_sync_groups SET counter = 100 WHERE group_id = $1", [.text(id)])
        #expect(throws: LockboxError.self) { try groups[1].sync() }
        #expect(try machines[1].value("r.example", "user") == "first")
        // The counter set back below what machine A pulled.
        try connection.execute("UPDATE lockbox_sync_groups SET counter = 0 WHERE group_id = $1", [.text(id)])
        let error = #expect(throws: LockboxError.self) { try groups[0].sync() }
        #expect(error?.code == .decode)
    }

    @Test("An unreachable database is an error that changes nothing; the vault stays usable")
    func unreachableDatabase() throws {
        let (groups, machines) = try threeMachines()
        try machines[0].add("u.example", "user", "kept")
        // A socket directory with no server in it.
        let closed = TemporaryDirectory("lockbox-sync-closed")
        let unreachable = "host=\(closed.path) port=1 dbname=postgres user=lockbox connect_timeout=2"
        let offline = try SyncGroup(groups[0].groupID, vault: machines[0].vault, database: unreachable)
        let error = #expect(throws: LockboxError.self) { try offline.sync() }
        #expect(error?.code == .notAvailable)
        #expect(try machines[0].value("u.example", "user") == "kept")
        try machines[0].set("u.example", "user", "still writable")
        #expect(try groups[0].sync().pushed == 1)
        try groups[1].sync()
        #expect(try machines[1].value("u.example", "user") == "still writable")
    }

    @Test("A push nobody else's write came between leaves the device at the head it wrote: the pull after it fetches none of its own records; one that another device's write came before fetches and checks them")
    func pushInStep() throws {
        let (groups, machines) = try threeMachines()
        let counter = { () throws -> Int64 in
            try PostgresConnection.integer(
                try PostgresConnection(try testDatabase()).execute(
                    "SELECT counter FROM lockbox_sync_groups WHERE group_id = $1", [.text(groups[0].groupID)]).first?[0] ?? nil)
        }
        let cursor = { (group: SyncGroup) throws -> Int64 in
            try SyncState(path: group.statePath, device: group.device.id, key: group.device.stateKey).cursor
        }
        // The group's creator, before it verified any head: the group is empty.
        for index in 0..<3 { try machines[0].add("s\(index).example", "user", "v\(index)") }
        #expect(try groups[0].sync().pushed == 3)
        #expect(groups[0].lastPullTimings.withLock { $0.records } == 0)
        #expect(try cursor(groups[0]) == (try counter()))
        try groups[1].sync()
        #expect(groups[1].lastPullTimings.withLock { $0.records } == 3)

        // In step again: an edit and a delete.
        try machines[1].set("s0.example", "user", "edited")
        try machines[1].delete("s1.example", "user")
        #expect(try groups[1].sync().pushed == 2)
        #expect(groups[1].lastPullTimings.withLock { $0.records } == 0)
        #expect(try cursor(groups[1]) == (try counter()))

        // Another device wrote first: the push is not in step, and the pull fetches and checks
        // that device's record and its own.
        try machines[2].add("other.example", "user", "from C")
        try groups[2].sync()
        try machines[0].set("s2.example", "user", "edited on A")
        #expect(try groups[0].sync().pushed == 1)
        #expect(groups[0].lastPullTimings.withLock { $0.records } >= 2)
        #expect(try cursor(groups[0]) == (try counter()))
        for group in groups { try group.sync() }
        for machine in machines {
            #expect(try machine.value("s0.example", "user") == "edited")
            #expect(try machine.value("s1.example", "user") == nil)
            #expect(try machine.value("s2.example", "user") == "edited on A")
            #expect(try machine.value("other.example", "user") == "from C")
            #expect(try machine.verify())
        }
        // Every device's verified head is the database's: a further round fetches nothing.
        for group in groups {
            #expect(try group.sync().changedNothing)
            #expect(group.lastPullTimings.withLock { $0.records } == 0)
        }
    }

    @Test("A keychain locked in the middle of a push (another process locked it) stops the push: an edited item is never taken for a gone one and deleted on the other machines")
    func lockedMidPush() throws {
        let (groups, machines) = try threeMachines()
        try machines[0].add("locked.example", "alice", "v1", accessibility: .whenUnlocked)
        try machines[0].add("open.example", "bob", "b1", accessibility: .afterFirstUnlock)
        for group in groups { try group.sync() }
        #expect(try machines[1].value("locked.example", "alice") == "v1")
        try machines[0].set("locked.example", "alice", "v2")
        try machines[0].set("open.example", "bob", "b2")

        // The sync checked that the keychain was unlocked; it is locked before the push reads the
        // changed rows (the push run as the sync runs it, past that check).
        let connection = try PostgresConnection(try testDatabase())
        let state = try SyncState(path: groups[0].statePath, device: groups[0].device.id, key: groups[0].device.stateKey)
        machines[0].vault.lock()
        var report = SyncGroup.Report()
        let error = #expect(throws: LockboxError.self) { try groups[0].push(connection, state: state, report: &report) }
        #expect(error?.code == .interactionNotAllowed)
        #expect(report.pushed == 0)
        // The status, which reads the rows as a push does, says locked too.
        #expect(throws: LockboxError.self) { try groups[0].pendingChanges(state: state) }

        // Nothing reached the group: the other machines still read the item.
        try groups[1].sync()
        #expect(try machines[1].value("locked.example", "alice") == "v1")
        #expect(try machines[1].value("open.example", "bob") == "b1")
        // Unlocked again, the next sync pushes both edits.
        try machines[0].vault.unlock(passphrase: SecretBytes(utf8: "machine passphrase"))
        #expect(try groups[0].sync().pushed == 2)
        try groups[1].sync()
        #expect(try machines[1].value("locked.example", "alice") == "v2")
        #expect(try machines[1].value("open.example", "bob") == "b2")
    }

    @Test("Joining with a wrong passphrase fails; a joined vault keeps the group key as a ThisDeviceOnly item")
    func joining() throws {
        let database = try testDatabase()
        let (groups, machines) = try threeMachines()
        let stranger = try Machine()
        let error = #expect(throws: LockboxError.self) {
            try SyncGroup.join(groups[0].groupID, vault: stranger.vault, database: database, passphrase: SecretBytes(utf8: "wrong"))
        }
        #expect(error?.code == .authFailed)
        var query = Query.genericPassword(service: SyncGroup.keyService, account: groups[0].groupID, accessGroup: SyncGroup.keyAccessGroup)
        query.returning = [.attributes]
        let item = try machines[1].vault.item(matching: query)
        #expect(item.attributes.accessibility == .afterFirstUnlockThisDeviceOnly)
        #expect(item.attributes.synchronizable != true)
        // The group opens again from the vault alone.
        let reopened = try SyncGroup(groups[0].groupID, vault: machines[1].vault, database: database)
        #expect(try reopened.sync().changedNothing)
    }
}
