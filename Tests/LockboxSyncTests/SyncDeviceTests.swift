import Foundation
import Lockbox
import LockboxTestSupport
import LockboxVault
import Synchronization
import Testing
import VaultStorage

@testable import LockboxSync

/// The repository's root (for scripts/postgres).
let repositoryRoot = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent().path

/// Runs `scripts/postgres VERB` on the test server (`LOCKBOX_POSTGRES_STATE`), through
/// posix_spawn and waitpid: the server it starts outlives the script.
func postgres(_ verb: String) throws {
    let state = try #require(
        ProcessInfo.processInfo.environment["LOCKBOX_POSTGRES_STATE"],
        "LOCKBOX_POSTGRES_STATE is not set: scripts/test sets it with the server it starts")
    var actions = posix_spawn_file_actions_t()
    posix_spawn_file_actions_init(&actions)
    defer { posix_spawn_file_actions_destroy(&actions) }
    for descriptor: Int32 in [0, 1, 2] {
        posix_spawn_file_actions_addopen(&actions, descriptor, "/dev/null", descriptor == 0 ? O_RDONLY : O_WRONLY, 0)
    }
    let script: String = repositoryRoot + "/scripts/postgres"
    let words: [String] = ["/bin/bash", script, verb]
    let arguments: [UnsafeMutablePointer<CChar>?] = words.map { strdup($0) } + [nil]
    defer { arguments.forEach { free($0) } }
    var environment = ProcessInfo.processInfo.environment
    environment["LOCKBOX_POSTGRES_STATE"] = state
    let assignments: [String] = environment.map { "\($0.key)=\($0.value)" }
    let variables: [UnsafeMutablePointer<CChar>?] = assignments.map { strdup($0) } + [nil]
    defer { variables.forEach { free($0) } }
    var pid: pid_t = 0
    #expect(posix_spawn(&pid, "/bin/bash", &actions, nil, arguments, variables) == 0)
    var status: Int32 = 0
    while waitpid(pid, &status, 0) < 0 && errno == EINTR {}
    #expect(status == 0, "scripts/postgres \(verb) ended with status \(status)")
}

/// Every record of a group as stored: (item id, version, payload).
func storedRecords(_ groupID: String) throws -> [(id: String, version: Int64, payload: [UInt8])] {
    try PostgresConnection(try testDatabase()).execute(
        "SELECT item_id, version, payload FROM lockbox_sync_items WHERE group_id = $1 ORDER BY version", [.text(groupID)]
    ).map { row in (row[0] ?? "", try PostgresConnection.integer(row[1]), try PostgresConnection.bytes(row[2])) }
}

extension SyncTests {
    @Test("A pairing code lets one device join once; a second use, a wrong code or an expired code is refused")
    func pairingCodeJoinsOnce() throws {
        let database = try testDatabase()
        let first = try Machine()
        let group = try SyncGroup.create(vault: first.vault, database: database)
        try first.add("pair.example", "alice", "paired value")
        try group.sync()
        let code = try group.pairingCode()
        #expect(code.count == 19 && code.filter { $0 == "-" }.count == 3)

        let second = try Machine()
        let joined = try SyncGroup.join(group.groupID, vault: second.vault, database: database, pairingCode: code.lowercased())
        try joined.sync()
        #expect(try second.value("pair.example", "alice") == "paired value")
        #expect(joined.deviceID != group.deviceID)

        let third = try Machine()
        let reused = #expect(throws: LockboxError.self) {
            try SyncGroup.join(group.groupID, vault: third.vault, database: database, pairingCode: code)
        }
        #expect(reused?.code == .authFailed)
        // A wrong guess uses the code up: the right code no longer works after it.
        let fresh = try group.pairingCode()
        var wrong = Array(fresh)
        wrong[18] = wrong[18] == "A" ? "B" : "A"
        #expect(throws: LockboxError.self) {
            try SyncGroup.join(group.groupID, vault: third.vault, database: database, pairingCode: String(wrong))
        }
        #expect(throws: LockboxError.self) { try SyncGroup.join(group.groupID, vault: third.vault, database: database, pairingCode: fresh) }
        let expired = try group.pairingCode(validFor: .seconds(0))
        let late = #expect(throws: LockboxError.self) {
            try SyncGroup.join(group.groupID, vault: third.vault, database: database, pairingCode: expired)
        }
        #expect(late?.code == .authFailed)
        // Without a passphrase the group cannot be joined by one.
        let noPassphrase = #expect(throws: LockboxError.self) {
            try SyncGroup.join(group.groupID, vault: third.vault, database: database, passphrase: SecretBytes(utf8: "anything"))
        }
        #expect(noPassphrase?.code == .authFailed)
        // The database holds no code in clear.
        let dump = try PostgresConnection(database).execute("SELECT t::text FROM lockbox_sync_invitations t").map { $0[0] ?? "" }.joined()
        #expect(!dump.contains(PairingCode.normalized(code)) && !dump.contains(PairingCode.normalized(fresh)))
    }

    @Test("Pushes and a device removal writing more records than one statement holds: every record at its own version, read back whole")
    func recordsSpanningStatements() throws {
        let (groups, machines) = try threeMachines()
        let count = 2 * SyncGroup.recordsPerStatement + 203
        try machines[0].vault.add(contentsOf: synchronizableItems(count, prefix: "many"))
        #expect(try groups[0].sync().pushed == count)
        func versions() throws -> [Int64] { try storedRecords(groups[0].groupID).map(\.version) }
        #expect(try versions() == Array(1...Int64(count)))
        #expect(try groups[1].sync().pulled == count)
        #expect(try machines[1].count() == count)
        // Replacing existing records, more than a statement's worth, with some deleted among them.
        tick()
        let edited = SyncGroup.recordsPerStatement + 100
        for index in 0..<edited { try machines[1].set("many\(index).example", "user", "edited \(index)") }
        for index in edited..<(edited + 10) { try machines[1].delete("many\(index).example", "user") }
        #expect(try groups[1].sync().pushed == edited + 10)
        #expect(try storedRecords(groups[0].groupID).count == count)
        #expect(try Set(versions()).count == count)
        #expect(try groups[0].sync().pulled == edited + 10)
        #expect(try machines[0].value("many0.example", "user") == "edited 0")
        #expect(try machines[0].value("many\(edited - 1).example", "user") == "edited \(edited - 1)")
        #expect(try machines[0].value("many\(edited).example", "user") == nil)
        #expect(try machines[0].value("many\(count - 1).example", "user") == "value \(count - 1)")
        // A removal re-seals every record under the new key; the remaining device reads them all.
        let before = try storedRecords(groups[0].groupID).map(\.id).sorted()
        try groups[0].removeDevice(groups[2].deviceID)
        let after = try storedRecords(groups[0].groupID)
        #expect(after.map(\.id).sorted() == before)
        #expect(Set(after.map(\.version)).count == count)
        #expect(after.allSatisfy { $0.version > Int64(count + edited + 10) })
        for record in after {
            _ = try SyncRecord.open(record.payload, group: groups[0].groupID, itemID: record.id, version: record.version, keys: groups[0].keys)
        }
        // The remover had verified the head it replaced: it is at the new one, with nothing to
        // fetch; the other device fetches every re-sealed record and applies none.
        #expect(try groups[0].status().pendingRemoteVersions == 0)
        #expect(try groups[0].sync().changedNothing)
        #expect(groups[0].lastPullTimings.withLock { $0.records } == 0)
        #expect(try groups[1].status().pendingRemoteVersions == count)
        #expect(try groups[1].sync().changedNothing)
        #expect(groups[1].lastPullTimings.withLock { $0.records } == count)
        #expect(try machines[1].count() == count - 10)
        #expect(try machines[1].value("many\(count - 1).example", "user") == "value \(count - 1)")
        #expect(try machines[1].verify())
    }

    @Test("Records of large values are written in statements of a bounded size: 300 values of 60 KiB (about 18 MiB) pushed and pulled whole")
    func largeValuesSpanStatements() throws {
        let (groups, machines) = try threeMachines()
        let count = 300
        let items = (0..<count).map { index in
            var item = Item.genericPassword(
                service: "large\(index).example", account: "user",
                data: SecretBytes(copying: Array(repeating: UInt8(truncatingIfNeeded: index), count: 60 * 1024)))
            item.attributes.synchronizable = true
            return item
        }
        #expect(count * 60 * 1024 > SyncGroup.bytesPerStatement)
        try machines[0].vault.add(contentsOf: items)
        #expect(try groups[0].sync().pushed == count)
        #expect(try storedRecords(groups[0].groupID).map(\.version) == Array(1...Int64(count)))
        #expect(try groups[1].sync().pulled == count)
        var query = machines[1].query("large\(count - 1).example", "user")
        query.returning = [.data]
        let value = try machines[1].vault.data(matching: query)
        #expect(value.count == 60 * 1024)
        #expect(value.withUnsafeBytes { $0.allSatisfy { $0 == UInt8(truncatingIfNeeded: count - 1) } })
        #expect(try machines[1].verify())
    }

    @Test("A removed device opens nothing written after its removal, cannot sync, and cannot rejoin with the old passphrase")
    func removedDeviceReadsNothingNew() throws {
        let (groups, machines) = try threeMachines()
        try machines[0].add("rm.example", "shared", "before removal")
        for group in groups { try group.sync() }
        #expect(try machines[2].value("rm.example", "shared") == "before removal")
        let oldKeys = groups[2].keys
        let removed = groups[2].deviceID

        try groups[0].removeDevice(removed)
        #expect(groups[0].keyEpoch == 1)
        let canary = makeCanary("after-removal")
        try machines[0].set("rm.example", "shared", canary)
        try machines[0].add("rm.example", "new", canary)
        try groups[0].sync()

        // Every record now in the database, read with the removed device's keys: none opens.
        let records = try storedRecords(groups[0].groupID)
        #expect(records.count == 2)
        for record in records {
            #expect(throws: LockboxError.self) {
                try SyncRecord.open(record.payload, group: groups[0].groupID, itemID: record.id, version: record.version, keys: oldKeys)
            }
        }
        // The removed device is told so and keeps its items.
        let error = #expect(throws: LockboxError.self) { try groups[2].sync() }
        #expect(error?.code == .authFailed)
        #expect(try machines[2].value("rm.example", "shared") == "before removal")
        #expect(try machines[2].value("rm.example", "new") == nil)
        // The remaining device catches up through its grant.
        try groups[1].sync()
        #expect(groups[1].keyEpoch == 1)
        #expect(try machines[1].value("rm.example", "shared") == canary)
        #expect(try machines[1].value("rm.example", "new") == canary)
        // The old passphrase no longer opens the group; devices list no longer names it.
        let rejoin = #expect(throws: LockboxError.self) {
            try SyncGroup.join(groups[0].groupID, vault: machines[2].vault, database: try testDatabase(), passphrase: groupPassphrase)
        }
        #expect(rejoin?.code == .authFailed)
        let devices = try groups[1].devices()
        #expect(devices.map(\.id).sorted() == [groups[0].deviceID, groups[1].deviceID].sorted())
        #expect(devices.allSatisfy { $0.isAttested })
        // Edits keep flowing between the two that remain, both ways.
        try machines[1].set("rm.example", "new", "from B")
        try groups[1].sync()
        try groups[0].sync()
        #expect(try machines[0].value("rm.example", "new") == "from B")
    }

    @Test("A grant the database made up (sealed to the device, without the previous key's MAC) is refused")
    func forgedGrantIsRefused() throws {
        let (groups, machines) = try threeMachines()
        defer { withExtendedLifetime(machines) {} }
        let connection = try PostgresConnection(try testDatabase())
        let id = groups[0].groupID
        // The administrator plays a rotation: a key of its own, sealed to device B's public key.
        let rows = try connection.execute(
            "SELECT public_key FROM lockbox_sync_devices WHERE group_id = $1 AND device_id = $2", [.text(id), .text(groups[1].deviceID)])
        let publicKey = try PostgresConnection.bytes(rows.first?[0] ?? nil)
        let made = SyncKeys.generate().rotated()
        let forged = groups[1].grant(made, to: groups[1].deviceID, publicKey: publicKey, under: SyncKeys.generate())
        try connection.execute(
            "INSERT INTO lockbox_sync_key_grants (group_id, device_id, epoch, sealed_key) VALUES ($1, $2, 1, $3)",
            [.text(id), .text(groups[1].deviceID), .bytes(forged)])
        try connection.execute("UPDATE lockbox_sync_groups SET key_epoch = 1 WHERE group_id = $1", [.text(id)])
        let error = #expect(throws: LockboxError.self) { try groups[1].sync() }
        #expect(error?.code == .decode)
        #expect(groups[1].keyEpoch == 0)
    }

    @Test("A sync reads only the rows written since the last push; deletes are still found")
    func incrementalPushReadsOnlyChangedRows() throws {
        let (groups, machines) = try threeMachines()
        for index in 0..<40 { try machines[0].add("inc\(index).example", "user", "value \(index)") }
        #expect(try groups[0].sync().examined == 40)
        #expect(try groups[0].sync().examined == 0)
        try machines[0].set("inc3.example", "user", "changed 3")
        try machines[0].set("inc17.example", "user", "changed 17")
        let report = try groups[0].sync()
        #expect(report.examined == 2)
        #expect(report.pushed == 2)
        try machines[0].delete("inc5.example", "user")
        let deleting = try groups[0].sync()
        #expect(deleting.pushed == 1)
        // A non-synchronizable item's writes do not count.
        try machines[0].add("local.example", "user", "local", synchronizable: false)
        #expect(try groups[0].sync().examined == 0)
        try groups[1].sync()
        #expect(try machines[1].count() == 39)
        #expect(try machines[1].value("inc3.example", "user") == "changed 3")
        #expect(try machines[1].value("inc5.example", "user") == nil)
        // The rows a pull imported are recorded by that pull: the next push reads none of them.
        let next = try groups[1].sync()
        #expect(next.examined == 0 && next.pushed == 0)
        // ... and knows them: a delete of one on the machine that pulled it propagates.
        try machines[1].delete("inc7.example", "user")
        #expect(try groups[1].sync().pushed == 1)
        try groups[0].sync()
        #expect(try machines[0].value("inc7.example", "user") == nil)
        #expect(try machines[0].value("inc8.example", "user") == "value 8")
    }

    @Test("The database stopped in the middle of a sync, then started again: nothing lost or doubled, the vault usable meanwhile")
    func databaseRestartedMidSync() throws {
        // Alone: the sync crash campaign of the reliability tests, in another suite, must not
        // see the server stop.
        try TestDatabaseUse.holding(exclusive: true) { try restartedMidSync() }
    }

    private func restartedMidSync() throws {
        let (groups, machines) = try threeMachines()
        for index in 0..<6 { try machines[0].add("restart\(index).example", "user", "value \(index)") }
        // Another session holds the group row, so the push waits inside its transaction while
        // the server goes away (a fast shutdown cuts every connection).
        let blocker = try PostgresConnection(try testDatabase())
        try blocker.execute("BEGIN")
        try blocker.execute("SELECT counter FROM lockbox_sync_groups WHERE group_id = $1 FOR UPDATE", [.text(groups[0].groupID)])
        let outcome = Mutex<String?>(nil)
        let done = DispatchSemaphore(value: 0)
        let group = groups[0]
        Thread.detachNewThread {
            do { try group.sync() } catch { outcome.withLock { $0 = "\(error)" } }
            done.signal()
        }
        usleep(300_000)
        try postgres("halt")
        done.wait()
        #expect(outcome.withLock { $0 } != nil, "the sync survived its server going away")
        // While it is down: an error that says so, and the vault reads and writes.
        let down = #expect(throws: LockboxError.self) { try groups[0].sync() }
        #expect(down?.code == .notAvailable)
        try machines[0].set("restart0.example", "user", "edited while down")
        #expect(try machines[0].value("restart1.example", "user") == "value 1")
        try postgres("resume")
        #expect(try groups[0].sync().pushed == 6)
        try groups[1].sync()
        #expect(try machines[1].count() == 6)
        #expect(try machines[1].value("restart0.example", "user") == "edited while down")
        #expect(try storedRecords(groups[0].groupID).count == 6)
        #expect(try machines[1].verify())
    }

    @Test("A sync process killed at any point (SIGKILL) loses and duplicates nothing; the next sync completes")
    func killedClientMidSync() throws {
        let database = try testDatabase()
        let (groups, machines) = try threeMachines()
        let count = 600
        try machines[0].vault.add(contentsOf: synchronizableItems(count, prefix: "kill"))
        try SyncCLI.configure(machines[0], group: groups[0].groupID, database: database)
        // Killed sooner and later: before, during and after the push's transaction.
        var finished = 0
        for delay in [0.02, 0.05, 0.1, 0.15, 0.25, 0.4] {
            let result = try SyncCLI.run(machines[0], ["sync", "now"], timeout: delay)
            if result.status == 0 { finished += 1 }
            try machines[0].set("kill\(Int(delay * 100) % count).example", "user", "edit before kill \(delay)")
        }
        #expect(finished < 6, "no sync was killed before it finished")
        let final = try SyncCLI.run(machines[0], ["sync", "now"])
        #expect(final.status == 0, "lockbox sync now: \(final.standardError)")
        try groups[0].sync()
        try groups[1].sync()
        #expect(try machines[1].count() == count)
        #expect(try machines[1].value("kill25.example", "user") == "edit before kill 0.25")
        #expect(try machines[1].value("kill599.example", "user") == "value 599")
        let records = try storedRecords(groups[0].groupID)
        #expect(records.count == count)
        #expect(Set(records.map(\.version)).count == count, "two records share a version")
        #expect(try machines[0].verify() && machines[1].verify())
    }
}

extension SyncTests {
    @Test("A key made with `lockbox generate-key --synchronizable` reaches the other devices and signs there; one made without stays here")
    func synchronizableKeyFromTheCommandLineSyncs() throws {
        let (groups, machines) = try threeMachines()
        defer { withExtendedLifetime(machines) {} }
        let made = try SyncCLI.run(machines[0], ["generate-key", "--tag", "synced-key", "--algorithm", "ed25519", "--synchronizable"])
        #expect(made.status == 0, "\(made.standardError)")
        let local = try SyncCLI.run(machines[0], ["generate-key", "--tag", "local-key", "--algorithm", "ed25519"])
        #expect(local.status == 0, "\(local.standardError)")
        for group in groups { try group.sync() }
        let there = try SyncCLI.run(machines[1], ["public-key", "--tag", "synced-key"])
        #expect(there.status == 0, "\(there.standardError)")
        #expect(there.standardOutput == made.standardOutput, "another public key on the other device")
        let signed = try SyncCLI.run(machines[1], ["sign", "--tag", "synced-key"], input: "message")
        #expect(signed.status == 0, "\(signed.standardError)")
        #expect(try SyncCLI.run(machines[1], ["public-key", "--tag", "local-key"]).status == 44)
        // What cannot leave this machine is refused before anything is made.
        let bound = try SyncCLI.run(
            machines[0], ["generate-key", "--tag", "bound-key", "--accessibility", "whenUnlockedThisDeviceOnly", "--synchronizable"])
        #expect(bound.status != 0 && bound.standardError.contains("ThisDeviceOnly"), "\(bound.standardError)")
        #expect(try SyncCLI.run(machines[0], ["public-key", "--tag", "bound-key"]).status == 44)
    }

    @Test("A sync killed while the server still commits its push: the next sync waits for that commit before it settles the push's listing, so a delete made meanwhile is pushed and the item does not come back")
    func syncKilledDuringItsCommitDoesNotBringBackADelete() throws {
        let database = try testDatabase()
        let (groups, machines) = try threeMachines()
        defer { withExtendedLifetime(machines) {} }
        try machines[0].add("first.example", "user", "first")
        for group in groups { try group.sync() }
        // Commits of records take 3 s at the server (a deferred trigger), as on a loaded server
        // or with a synchronous standby.
        let admin = try PostgresConnection(database)
        let slow = try SlowCommits(admin)
        defer { slow.remove() }
        try slow.set(milliseconds: 3000)
        try machines[0].add("slow.example", "user", "slow-1")
        try SyncCLI.configure(machines[0], group: groups[0].groupID, database: database)
        let process = Process()
        process.executableURL = URL(fileURLWithPath: builtProduct("lockbox"))
        process.arguments = ["--keychain", machines[0].vault.path, "sync", "now"]
        process.environment = SyncCLI.environment(machines[0])
        process.standardOutput = FileHandle.nullDevice
        process.standardError = FileHandle.nullDevice
        try process.run()
        // Killed once its COMMIT is at the server (sleeping in the trigger).
        var committing = false
        for _ in 0..<200 where !committing {
            usleep(50_000)
            committing = try !admin.execute("SELECT 1 FROM pg_stat_activity WHERE wait_event = 'PgSleep'").isEmpty
        }
        kill(process.processIdentifier, SIGKILL)
        process.waitUntilExit()
        try #require(committing, "the sync never reached its commit")
        try slow.set(milliseconds: 0)
        // Deleted while that commit still runs; the next sync pushes the delete.
        try machines[0].delete("slow.example", "user")
        try groups[0].sync()
        usleep(3_500_000)
        for group in groups { try group.sync() }
        for machine in machines {
            #expect(try machine.value("slow.example", "user") == nil, "the deleted item came back")
        }
        #expect(try machines[1].value("first.example", "user") == "first")
    }

    @Test("The database records a device's last sync as when it began, so that a reset of a damaged state counts an edit made while that sync ran as not sent")
    func lastSyncIsWhenTheSyncBegan() throws {
        let database = try testDatabase()
        let (groups, machines) = try threeMachines()
        defer { withExtendedLifetime(machines) {} }
        let admin = try PostgresConnection(database)
        let slow = try SlowCommits(admin)
        defer { slow.remove() }
        try slow.set(milliseconds: 2000)
        try machines[0].add("slow.example", "user", "v")
        let before = try admin.execute("SELECT extract(epoch FROM clock_timestamp())::float8").first?[0].flatMap { Double($0) } ?? 0
        try groups[0].sync()
        let recorded = try admin.execute(
            "SELECT extract(epoch FROM last_sync)::float8 FROM lockbox_sync_devices WHERE group_id = $1 AND device_id = $2",
            [.text(groups[0].groupID), .text(groups[0].deviceID)]
        ).first?[0].flatMap { Double($0) } ?? 0
        // The push's commit alone took 2 s: the record is from before it, not from the end.
        #expect(recorded >= before - 1 && recorded < before + 1.5, "last sync \(recorded - before) s after the sync began")
    }

    @Test("A keychain put back from an older copy and accepted is not synced as it is (its items deleted since would come back everywhere): the sync says so, and the reset it names gives the group's versions precedence")
    func olderKeychainAcceptedIsNotSyncedAsItIs() throws {
        let database = try testDatabase()
        let (groups, machines) = try threeMachines()
        defer { withExtendedLifetime(machines) {} }
        let machine = machines[2]
        try machine.add("one.example", "user", "one")
        try machine.add("nl.example", "user", "nl-1")
        for group in groups { try group.sync() }
        try machine.vault.withDatabase { database throws(LockboxError) in database.truncateWriteAheadLog() }
        let path = machine.vault.path
        let copy = machine.directory.file("older-copy.lockbox")
        try FileManager.default.copyItem(atPath: path, toPath: copy)
        tick()
        try machine.delete("one.example", "user")
        try machine.set("nl.example", "user", "nl-2")
        try groups[2].sync()
        try groups[0].sync()
        #expect(try machines[0].value("one.example", "user") == nil)
        // The older file put back (its log gone) and accepted, as after restoring a file backup.
        for suffix in ["-wal", "-shm"] { try? FileManager.default.removeItem(atPath: path + suffix) }
        #expect(rename(copy, path) == 0)
        try SyncCLI.configure(machine, group: groups[0].groupID, database: database)
        let accepted = try SyncCLI.run(machine, ["verify", "--accept-older"])
        #expect(accepted.status == 0, "\(accepted.standardError)")
        // Writes made since take the keychain's generation past the state's: still an older copy.
        for index in 0..<4 {
            let added = try SyncCLI.run(machine, ["add-generic-password", "-s", "new\(index).example", "-a", "user", "--synchronizable"], input: "n")
            #expect(added.status == 0, "\(added.standardError)")
        }
        let status = try SyncCLI.run(machine, ["sync", "status", "--json"])
        #expect(status.standardOutput.contains("\"olderKeychain\": true"), "\(status.standardOutput) \(status.standardError)")
        let refused = try SyncCLI.run(machine, ["sync", "now"])
        #expect(refused.status != 0)
        #expect(refused.standardError.contains("older than what its sync state recorded"), "\(refused.standardError)")
        #expect(refused.standardError.contains("lockbox sync reset"))
        // Nothing reached the group: the item deleted there stays deleted.
        try groups[0].sync()
        #expect(try machines[0].value("one.example", "user") == nil)
        // The reset: the group's versions replace the keychain's, the deleted item is deleted again.
        let reset = try SyncCLI.run(machine, ["sync", "reset"])
        #expect(reset.status == 0, "\(reset.standardError)")
        #expect(try SyncCLI.run(machine, ["find-generic-password", "-s", "one.example", "-a", "user", "-w"]).status == 44)
        let kept = try SyncCLI.run(machine, ["find-generic-password", "-s", "nl.example", "-a", "user", "-w"])
        #expect(kept.standardOutput == "nl-2\n", "\(kept.standardOutput) \(kept.standardError)")
        try groups[0].sync()
        #expect(try machines[0].value("one.example", "user") == nil)
        #expect(try machines[0].value("nl.example", "user") == "nl-2")
        // The items written since the copy was put back are the keychain's own: sent.
        #expect(try machines[0].value("new3.example", "user") == "n")
        #expect(!FileManager.default.fileExists(atPath: Vault.olderCopyMarkerPath(vaultPath: path)))
        #expect(try SyncCLI.run(machine, ["sync", "now"]).status == 0)
    }

    @Test("A removal that commits in the database but cannot be recorded here (a full disk) is reported as done, with that failure; the next sync takes the new key")
    func removalUnrecordedHereIsReportedAsDone() throws {
        let (groups, machines) = try threeMachines()
        try machines[0].add("x.example", "user", "x1")
        for group in groups { try group.sync() }
        let removed = groups[2].deviceID
        // Every write of the remover's keychain fails from now on, as on a full disk.
        machines[0].vault.injectFaults(StorageFaults(kind: .diskFull, failingOperation: 1, persistent: true))
        let removal = try groups[0].removeDevice(removed)
        machines[0].vault.injectFaults(nil)
        let unfinished = try #require(removal.unfinishedHere, "the local failure was not reported")
        #expect(unfinished.message.contains("The device was removed from the sync group"), "\(unfinished.message)")
        #expect(unfinished.message.contains("lockbox sync now"))
        #expect(!unfinished.message.contains("nothing was changed"), "\(unfinished.message)")
        #expect(removal.keeping == [groups[1].deviceID])
        // It did happen: the database is at the new epoch, the removed device holds no key for it.
        let epoch = try PostgresConnection(try testDatabase()).execute(
            "SELECT key_epoch FROM lockbox_sync_groups WHERE group_id = $1", [.text(groups[0].groupID)])
        #expect(epoch.first?[0] == "1")
        #expect(groups[0].keyEpoch == 0)
        #expect(throws: LockboxError.self) { try groups[2].sync() }
        // The remover's next sync takes the new key from its own grant, and syncs.
        try machines[0].set("x.example", "user", "x2")
        try groups[0].sync()
        #expect(groups[0].keyEpoch == 1)
        try groups[1].sync()
        #expect(try machines[1].value("x.example", "user") == "x2")
        withExtendedLifetime(machines) {}
    }

    @Test("A new device's first sync killed (SIGKILL) at any point leaves its vault with all the items or none; the next sync completes")
    func killedFirstPullIsAllOrNothing() throws {
        let database = try testDatabase()
        let (groups, machines) = try threeMachines()
        let count = 600
        try machines[0].vault.add(contentsOf: synchronizableItems(count, prefix: "pull"))
        try groups[0].sync()
        try SyncCLI.configure(machines[1], group: groups[0].groupID, database: database)
        var finished = 0
        var killed = 0
        // From before the import starts to past its end: on a quiet machine the whole first
        // sync of 600 items can take under 0.1 s.
        for delay in [0.02, 0.05, 0.1, 0.15, 0.2, 0.3, 0.45, 0.6, 0.8] where finished == 0 {
            let result = try SyncCLI.run(machines[1], ["sync", "now"], timeout: delay)
            if result.status == 0 { finished += 1 } else { killed += 1 }
            // One vault transaction: all of them or none, and the vault sound either way.
            let present = try machines[1].count()
            #expect(present == 0 || present == count, "a killed import left \(present) of \(count) items")
            #expect(try machines[1].verify())
        }
        #expect(killed > 0, "no sync was killed before it finished")
        let final = try SyncCLI.run(machines[1], ["sync", "now"])
        #expect(final.status == 0, "lockbox sync now: \(final.standardError)")
        #expect(try machines[1].count() == count)
        #expect(try machines[1].value("pull599.example", "user") == "value 599")
        #expect(try groups[1].sync().changedNothing)
        #expect(try storedRecords(groups[0].groupID).count == count, "the new device wrote records")
    }

    @Test("Two syncs of one vault take turns: lockbox sync now waits while another process holds the vault's sync lock, then syncs")
    func syncsOfOneVaultTakeTurns() throws {
        let (groups, machines) = try threeMachines()
        try SyncCLI.configure(machines[0], group: groups[0].groupID, database: try testDatabase())
        try machines[0].add("turns.example", "alice", "one")
        var held: SyncLock? = try SyncLock(statePath: groups[0].statePath)
        let process = Process()
        process.executableURL = URL(fileURLWithPath: builtProduct("lockbox"))
        process.arguments = ["--keychain", machines[0].vault.path, "sync", "now"]
        process.environment = SyncCLI.environment(machines[0])
        process.standardInput = FileHandle.nullDevice
        process.standardOutput = FileHandle.nullDevice
        process.standardError = FileHandle.nullDevice
        try process.run()
        usleep(800_000)
        #expect(process.isRunning, "the sync did not wait for the lock")
        #expect(try storedRecords(groups[0].groupID).isEmpty, "the sync pushed while another process held the lock")
        withExtendedLifetime(held) {}
        held = nil
        process.waitUntilExit()
        #expect(process.terminationStatus == 0)
        #expect(try storedRecords(groups[0].groupID).count == 1)
        // Nothing is left behind that would block the next sync.
        #expect(try groups[0].sync().changedNothing)
    }

    @Test("lockbox sync: create, invite, join with the code on standard input, now, status; status with the database down; forget-damaged-deletions")
    func commandLine() throws {
        let database = try testDatabase()
        let first = try Machine()
        let second = try Machine()
        let created = try SyncCLI.run(first, ["sync", "create", "--database", database])
        #expect(created.status == 0, "sync create: \(created.standardError)")
        let groupID = created.standardOutput.trimmingCharacters(in: .whitespacesAndNewlines)
        #expect(groupID.count == 32)
        let canary = makeCanary("cli-sync")
        try first.add("cli.example", "alice", canary)
        #expect(try SyncCLI.run(first, ["sync", "now"]).status == 0)

        let invite = try SyncCLI.run(first, ["sync", "invite"])
        #expect(invite.status == 0, "sync invite: \(invite.standardError)")
        let code = try #require(invite.standardOutput.split(separator: " ").first { $0.count == 19 && $0.contains("-") })
        let joined = try SyncCLI.run(second, ["sync", "join", groupID, "--database", database], input: String(code) + "\n")
        #expect(joined.status == 0, "sync join: \(joined.standardError)")
        #expect(try second.value("cli.example", "alice") == canary)
        #expect(!joined.standardOutput.contains(canary) && !joined.standardError.contains(canary))

        let status = try SyncCLI.run(second, ["sync", "status", "--json"])
        #expect(status.status == 0, "sync status: \(status.standardError)")
        let json = try #require(try JSONSerialization.jsonObject(with: Data(status.standardOutput.utf8)) as? [String: Any])
        #expect(json["group"] as? String == groupID)
        #expect(json["databaseReachable"] as? Bool == true)
        #expect((json["devices"] as? [[String: Any]])?.count == 2)
        #expect(json["pendingRemoteVersions"] as? Int == 0)
        let text = try SyncCLI.run(first, ["sync", "status"])
        #expect(text.standardOutput.contains("(this device)") && text.standardOutput.contains("last sync:"))
        // Both devices verified the same head at the same version: the same fingerprint.
        let firstJSON = try #require(
            try JSONSerialization.jsonObject(with: Data(try SyncCLI.run(first, ["sync", "status", "--json"]).standardOutput.utf8)) as? [String: Any])
        let head = try #require(json["head"] as? String)
        #expect(head.count == 16)
        #expect(firstJSON["pulledVersion"] as? Int == json["pulledVersion"] as? Int)
        #expect(firstJSON["head"] as? String == head)
        #expect(text.standardOutput.contains("verified head:    version"))

        // The database unreachable: status says so and succeeds; a sync fails with -25291;
        // the keychain works.
        let closed = TemporaryDirectory("lockbox-sync-closed")
        try SyncCLI.configure(second, group: groupID, database: "host=\(closed.path) port=1 dbname=postgres user=lockbox connect_timeout=2")
        let offline = try SyncCLI.run(second, ["sync", "status"])
        #expect(offline.status == 0, "sync status offline: \(offline.standardError)")
        #expect(offline.standardOutput.contains("unreachable") && offline.standardOutput.contains("fully usable"))
        let failed = try SyncCLI.run(second, ["sync", "now"])
        #expect(failed.status == 1 && failed.standardError.contains("-25291"))
        #expect(try second.value("cli.example", "alice") == canary)
        // A connection string with a password is refused before anything runs.
        let password = try SyncCLI.run(second, ["sync", "create", "--database", "host=x password=hunter2"])
        #expect(password.status == 64)

        // A recorded deletion edited in the file: verify reports it, sync refuses it and says
        // what to do, forget-damaged-deletions drops it, and sync goes on.
        try first.add("gone.example", "alice", "to delete")
        #expect(try SyncCLI.run(first, ["sync", "now"]).status == 0)
        try first.delete("gone.example", "alice")
        let attacker = try Database(path: first.vault.path, create: false)
        try attacker.execute("UPDATE sync_deletions SET mac = zeroblob(32)")
        #expect(attacker.totalChanges == 1)
        let verify = try SyncCLI.run(first, ["verify"])
        #expect(verify.status == 1 && verify.standardOutput.contains("damaged 1"), "verify: \(verify.standardOutput)")
        // Status says so before a sync fails on it.
        let damagedStatus = try SyncCLI.run(first, ["sync", "status", "--json"])
        #expect(damagedStatus.standardOutput.contains("\"deletionRecordsSound\": false"), "\(damagedStatus.standardOutput)")
        #expect(try SyncCLI.run(first, ["sync", "status"]).standardOutput.contains("forget-damaged-deletions"))
        let refused = try SyncCLI.run(first, ["sync", "now"])
        #expect(refused.status == 1 && refused.standardError.contains("-26275"))
        #expect(refused.standardError.contains("lockbox sync forget-damaged-deletions"))
        let forgot = try SyncCLI.run(first, ["sync", "forget-damaged-deletions"])
        #expect(forgot.status == 0 && forgot.standardOutput.contains("Dropped 1"), "forget: \(forgot.standardError)")
        #expect(try SyncCLI.run(first, ["sync", "forget-damaged-deletions"]).standardOutput.contains("nothing was dropped"))
        #expect(try SyncCLI.run(first, ["verify"]).status == 0)
        #expect(try SyncCLI.run(first, ["sync", "status", "--json"]).standardOutput.contains("\"deletionRecordsSound\": true"))
        #expect(try SyncCLI.run(first, ["sync", "now"]).status == 0)
        #expect(try first.value("gone.example", "alice") == nil)
    }
}

/// Commits of records made slow at the server (a deferred trigger that sleeps), as on a loaded
/// server or with a synchronous standby: a COMMIT sent is still running there for that long.
struct SlowCommits {
    let admin: PostgresConnection

    init(_ admin: PostgresConnection) throws {
        self.admin = admin
        try admin.execute("CREATE TABLE lockbox_test_slow_commit (ms integer)")
        try admin.execute("INSERT INTO lockbox_test_slow_commit VALUES (0)")
        try admin.execute(
            """
            CREATE FUNCTION lockbox_test_sleepy() RETURNS trigger LANGUAGE plpgsql AS $$
            DECLARE d integer; BEGIN SELECT ms INTO d FROM lockbox_test_slow_commit LIMIT 1;
            IF d > 0 THEN PERFORM pg_sleep(d / 1000.0); END IF; RETURN NULL; END $$
            """)
        try admin.execute(
            """
            CREATE CONSTRAINT TRIGGER lockbox_test_slow AFTER INSERT OR UPDATE ON lockbox_sync_items
            DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION lockbox_test_sleepy()
            """)
    }

    /// How long each commit of records now takes at the server.
    func set(milliseconds: Int) throws {
        try admin.execute("UPDATE lockbox_test_slow_commit SET ms = \(milliseconds)")
    }

    func remove() {
        _ = try? admin.execute("DROP TRIGGER lockbox_test_slow ON lockbox_sync_items")
        _ = try? admin.execute("DROP FUNCTION lockbox_test_sleepy()")
        _ = try? admin.execute("DROP TABLE lockbox_test_slow_commit")
    }
}

/// Runs the built `lockbox` (which hands `sync` to `lockbox-sync`) on a machine's vault, with
/// the machine's XDG tree, so it finds the same device key.
enum SyncCLI {
    static func environment(_ machine: Machine) -> [String: String] {
        var environment = ProcessInfo.processInfo.environment
        environment["XDG_DATA_HOME"] = machine.directory.file("data")
        environment["XDG_STATE_HOME"] = machine.directory.file("state")
        environment["XDG_CONFIG_HOME"] = machine.directory.file("config")
        environment["HOME"] = machine.directory.path
        return environment
    }

    static func run(_ machine: Machine, _ arguments: [String], input: String = "", timeout: Double? = nil) throws -> ProcessResult {
        try LockboxTestSupport.run(
            builtProduct("lockbox"), ["--keychain", machine.vault.path] + arguments, input: Array(input.utf8),
            environment: environment(machine), timeout: timeout)
    }

    /// Writes the configuration `lockbox sync create/join` would (group and database).
    static func configure(_ machine: Machine, group: String, database: String) throws {
        try FileManager.default.createDirectory(atPath: machine.vault.path + ".sync", withIntermediateDirectories: true)
        try Data("group=\(group)\ndatabase=\(database)\n".utf8).write(to: URL(fileURLWithPath: machine.vault.path + ".sync/config"))
    }
}
