import Foundation
import Lockbox
import LockboxCore
import LockboxTestSupport
import LockboxVault
import Testing

@testable import LockboxSync

/// A keychain made anew at `machine`'s path (the old file removed, as a user who forgot the
/// passphrase does), unlocked.
private func keychainMadeAnew(_ machine: Machine) throws -> Vault {
    let path = machine.vault.path
    machine.vault.lockAll()
    for suffix in ["", "-wal", "-shm"] { try? FileManager.default.removeItem(atPath: path + suffix) }
    return try Vault.create(at: path, passphrase: SecretBytes(utf8: "a new passphrase"), configuration: machine.vault.configuration)
}

/// A copy of `machine`'s whole tree (keychain, its device key, its sync state), as a home
/// directory copied to another machine; its keychain opened and unlocked.
private func copiedKeychain(_ machine: Machine, into directory: TemporaryDirectory) throws -> Vault {
    let copy = Process()
    copy.executableURL = URL(fileURLWithPath: "/bin/cp")
    copy.arguments = ["-a", machine.directory.path + "/.", directory.path]
    try copy.run()
    copy.waitUntilExit()
    #expect(copy.terminationStatus == 0)
    var configuration = machine.vault.configuration
    configuration.device = DeviceIdentity(keyPath: directory.file("state/lockbox/device-key"))
    let vault = try Vault.open(at: directory.file("data/lockbox/default.lockbox"), configuration: configuration)
    if !(try vault.isUnlocked) { try vault.unlock(passphrase: SecretBytes(utf8: "machine passphrase")) }
    return vault
}

/// `machine`'s keychain opened where the device key file is another (a shell or service with
/// another XDG_STATE_HOME), unlocked there; `machine`'s own handle locked first.
private func keychainWithAnotherIdentity(_ machine: Machine, keyIn elsewhere: TemporaryDirectory) throws -> Vault {
    var configuration = machine.vault.configuration
    configuration.device = DeviceIdentity(keyPath: elsewhere.file("state/lockbox/device-key"))
    machine.vault.lockAll()
    let other = try Vault.open(at: machine.vault.path, configuration: configuration)
    try other.unlock(passphrase: SecretBytes(utf8: "machine passphrase"))
    return other
}

/// The number of rows of `table` for `group` in the test database.
private func rows(_ table: String, group: String) throws -> Int {
    let connection = try PostgresConnection(try testDatabase())
    let found = try connection.execute("SELECT count(*) FROM \(table) WHERE group_id = $1", [.text(group)])
    return Int(try PostgresConnection.integer(found.first?.first ?? nil))
}

extension SyncTests {
    /// Devices that come back under another identity, or two keychains under one, and the
    /// database's own rows: what a careless user and an administrator leave behind.
    @Suite("Sync: device identities, removals, pairing codes and the database's tables")
    struct Identity {
        @Test("A keychain made anew at the same path joins again as a new device: the state its earlier device left is removed, not reported as tampered with, and the earlier device is named")
        func keychainMadeAnewJoinsAgain() throws {
            let (groups, machines) = try threeMachines()
            try machines[0].add("mail.example", "alice", "v1")
            for group in groups { try group.sync() }
            let earlier = groups[1].deviceID
            let earlierRecords = [groups[1].pulledMark.path, groups[1].knownDevices.path]
            #expect(FileManager.default.fileExists(atPath: earlierRecords[0]))
            let fresh = try keychainMadeAnew(machines[1])
            let joined = try SyncGroup.join(groups[0].groupID, vault: fresh, database: try testDatabase(), passphrase: groupPassphrase)
            #expect(joined.deviceID != earlier)
            #expect(joined.replacedDevice == earlier)
            // The earlier device's own records (its last pull, the devices it saw) go with it.
            for path in earlierRecords { #expect(!FileManager.default.fileExists(atPath: path), "\(path) was left") }
            #expect(try joined.sync().pulled == 1)
            var query = machines[1].query("mail.example", "alice")
            query.returning = [.data]
            #expect(try fresh.data(matching: query) == SecretBytes(utf8: "v1"))
            #expect(try joined.status().databaseProblem == nil)
            // Its earlier identity is removed from another device; the new one keeps syncing.
            try groups[0].removeDevice(earlier)
            try machines[0].set("mail.example", "alice", "v2")
            try groups[0].sync()
            try joined.sync()
            #expect(try fresh.data(matching: query) == SecretBytes(utf8: "v2"))
        }

        @Test("A pairing-code join killed after it made the device key, before it removed the state an earlier device left: the next join removes that state, names the earlier device, and syncs")
        func joinStoppedAfterItsDeviceKeyIsFinishedByTheNext() throws {
            let (groups, machines) = try threeMachines()
            defer { withExtendedLifetime(machines) {} }
            try machines[0].add("mail.example", "alice", "v1")
            for group in groups { try group.sync() }
            let earlier = groups[1].deviceID
            let fresh = try keychainMadeAnew(machines[1])
            // What the stopped join left: a device key of the group, no group key.
            let leftover = try DeviceSecret.create(groupID: groups[0].groupID, in: fresh)
            let joined = try SyncGroup.join(groups[0].groupID, vault: fresh, database: try testDatabase(), pairingCode: try groups[0].pairingCode())
            #expect(joined.deviceID == leftover.id)
            #expect(joined.replacedDevice == earlier)
            #expect(try joined.sync().pulled == 1)
            #expect(try joined.status().databaseProblem == nil)
        }

        @Test("A join through a handle that cannot see this keychain's device key (another device identity: XDG_STATE_HOME or machine-id differs) removes nothing the real device still uses")
        func joinUnderAnotherIdentityKeepsTheValidState() throws {
            let (groups, machines) = try threeMachines()
            try machines[0].add("kept.example", "user", "v1")
            try machines[0].add("deleted.example", "user", "v1")
            for group in groups { try group.sync() }
            // B deletes an item; not synced yet.
            try machines[1].delete("deleted.example", "user")
            let statePath = SyncState.path(vault: machines[1].vault.path, groupID: groups[1].groupID)
            #expect(FileManager.default.fileExists(atPath: statePath))
            // The same keychain opened where the device key file is another (a shell or service
            // with another XDG_STATE_HOME): its ThisDeviceOnly items, the group and device keys
            // among them, are not visible; the user joins "again", as the error suggests.
            let elsewhere = TemporaryDirectory("lockbox-sync-other-identity")
            let other = try keychainWithAnotherIdentity(machines[1], keyIn: elsewhere)
            let hidden = #expect(throws: LockboxError.self) { _ = try SyncGroup(groups[1].groupID, vault: other, database: try testDatabase()) }
            // Said as it is: joined, from another environment; not "has not joined".
            #expect(hidden?.message.contains("joined the sync group") == true, "\(hidden?.message ?? "")")
            #expect(hidden?.message.contains("XDG_STATE_HOME") == true, "\(hidden?.message ?? "")")
            #expect(hidden?.message.contains("has not joined") == false, "\(hidden?.message ?? "")")
            // Whatever the join does (here: refused, the invisible device key holding its primary key),
            // the state of the device whose key this keychain still holds must stay.
            var outcome = "joined"
            do {
                _ = try SyncGroup.join(groups[0].groupID, vault: other, database: try testDatabase(), passphrase: groupPassphrase)
            } catch { outcome = "join refused: \(error)" }
            #expect(FileManager.default.fileExists(atPath: statePath), "the state of device \(groups[1].deviceID), whose key this keychain still holds, was removed (\(outcome))")
            // Back in the usual environment (unlocked there again): B's delete must still reach the group.
            other.lockAll()
            machines[1].vault.lockAll()
            try machines[1].vault.unlock(passphrase: SecretBytes(utf8: "machine passphrase"))
            try groups[1].sync()
            try groups[0].sync()
            #expect(try machines[1].value("deleted.example", "user") == nil, "B's delete undone on B")
            #expect(try machines[0].value("deleted.example", "user") == nil, "B's delete never reached A")
        }

        @Test("A join with a pairing code from an environment whose device key cannot be kept (another XDG_STATE_HOME) is refused before the code is used: the code still joins another device")
        func joinThatCannotKeepADeviceKeyLeavesTheCode() throws {
            let (groups, machines) = try threeMachines()
            defer { withExtendedLifetime(machines) {} }
            for group in groups { try group.sync() }
            let elsewhere = TemporaryDirectory("lockbox-sync-other-identity")
            let other = try keychainWithAnotherIdentity(machines[1], keyIn: elsewhere)
            let code = try groups[0].pairingCode()
            let refused = #expect(throws: LockboxError.self) {
                try SyncGroup.join(groups[0].groupID, vault: other, database: try testDatabase(), pairingCode: code)
            }
            #expect(refused?.code == .duplicateItem, "\(String(describing: refused))")
            other.lockAll()
            let fresh = try Machine()
            #expect(try SyncGroup.join(groups[0].groupID, vault: fresh.vault, database: try testDatabase(), pairingCode: code).groupID == groups[0].groupID)
            // A wrong code takes back the device key it made: the next join, with a good code, is the same as a first one.
            let later = try Machine()
            #expect(throws: LockboxError.self) {
                try SyncGroup.join(groups[0].groupID, vault: later.vault, database: try testDatabase(), pairingCode: "ABCD-EFGH-JKMN-PQRS")
            }
            #expect(try DeviceSecret.load(groupID: groups[0].groupID, from: later.vault) == nil)
            #expect(try SyncGroup.join(groups[0].groupID, vault: later.vault, database: try testDatabase(), pairingCode: try groups[0].pairingCode()).groupID == groups[0].groupID)
            withExtendedLifetime(fresh) {}
        }

        @Test("A keychain whose device key was deleted says to join again, and joins again as a new device")
        func deviceKeyDeleted() throws {
            let (groups, machines) = try threeMachines()
            try machines[0].add("mail.example", "alice", "v1")
            for group in groups { try group.sync() }
            let earlier = groups[1].deviceID
            try machines[1].vault.delete(
                matching: Query.genericPassword(service: SyncGroup.deviceService, account: groups[1].groupID, accessGroup: SyncGroup.keyAccessGroup))
            let refused = #expect(throws: LockboxError.self) {
                _ = try SyncGroup(groups[1].groupID, vault: machines[1].vault, database: try testDatabase())
            }
            #expect(refused?.code == .itemNotFound)
            #expect(refused?.message.contains("Join the group again") == true)
            let joined = try SyncGroup.join(groups[0].groupID, vault: machines[1].vault, database: try testDatabase(), passphrase: groupPassphrase)
            #expect(joined.replacedDevice == earlier)
            #expect(try joined.sync().changedNothing)
            #expect(try machines[1].value("mail.example", "alice") == "v1")
        }

        @Test("A removal refuses the group's current passphrase as the new one (the removed device would join again with it), and changes nothing")
        func removalRefusesTheCurrentPassphrase() throws {
            let (groups, machines) = try threeMachines()
            defer { withExtendedLifetime(machines) {} }
            let removed = groups[2].deviceID
            let refused = #expect(throws: LockboxError.self) { try groups[0].removeDevice(removed, newPassphrase: groupPassphrase) }
            #expect(refused?.code == .param)
            #expect(try rows("lockbox_sync_devices", group: groups[0].groupID) == 3)
            #expect(try groups[0].status().keyEpoch == 0)
            // A new passphrase: removed, and the old one no longer joins.
            try groups[0].removeDevice(removed, newPassphrase: SecretBytes(utf8: "a new group passphrase"))
            let machine = try Machine()
            #expect(throws: LockboxError.self) {
                _ = try SyncGroup.join(groups[0].groupID, vault: machine.vault, database: try testDatabase(), passphrase: groupPassphrase)
            }
            _ = try SyncGroup.join(groups[0].groupID, vault: machine.vault, database: try testDatabase(), passphrase: SecretBytes(utf8: "a new group passphrase"))
        }

        @Test("Two keychains with one device identity (a home directory copied) that write one item in the same millisecond converge; neither keeps its own value showing nothing pending")
        func copiedKeychainConverges() throws {
            let clock = ManualClock()
            let (groups, machines) = try threeMachines(clocks: [clock, clock, clock])
            try machines[0].add("clone.example", "user", "v1")
            for group in groups { try group.sync() }
            let directory = TemporaryDirectory("lockbox-sync-copied")
            let copied = try copiedKeychain(machines[1], into: directory)
            let twin = try SyncGroup(groups[1].groupID, vault: copied, database: try testDatabase())
            #expect(twin.deviceID == groups[1].deviceID)
            try machines[1].set("clone.example", "user", "from B")
            try copied.update(matching: machines[1].query("clone.example", "user"), to: ItemUpdate(data: SecretBytes(utf8: "from B's copy")))
            try groups[1].sync()
            try twin.sync()
            for group in groups { try group.sync() }
            try twin.sync()
            var query = machines[1].query("clone.example", "user")
            query.returning = [.data]
            let values = try machines.map { try $0.value("clone.example", "user") } + [String(decoding: Data(try copied.data(matching: query).withUnsafeBytes { Array($0) }), as: UTF8.self)]
            #expect(Set(values).count == 1, "the machines did not converge: \(values)")
            #expect(values.first == "from B's copy")
            #expect(try twin.status().pendingLocalChanges == 0)
        }

        @Test("An expired pairing code's row, which holds the group's secrets sealed under the code, is deleted by the next sync of any device; an unexpired one is kept")
        func expiredPairingCodesDeleted() throws {
            let (groups, machines) = try threeMachines()
            defer { withExtendedLifetime(machines) {} }
            _ = try groups[0].pairingCode(validFor: .seconds(1))
            _ = try groups[0].pairingCode(validFor: .seconds(600))
            #expect(try rows("lockbox_sync_invitations", group: groups[0].groupID) == 2)
            usleep(1_200_000)
            try groups[2].sync()
            #expect(try rows("lockbox_sync_invitations", group: groups[0].groupID) == 1)
        }

        @Test("Only creating a group makes the sync tables: a status, sync or join pointed at a database without them is an error that creates nothing there")
        func noTablesMadeOutsideCreate() throws {
            let (groups, machines) = try threeMachines()
            let name = "lockbox_empty_\(UInt32.random(in: 0...UInt32.max))"
            let admin = try PostgresConnection(try testDatabase())
            try admin.execute("CREATE DATABASE \(name)")
            defer { _ = try? admin.execute("DROP DATABASE \(name)") }
            let elsewhere = try testDatabase().replacingOccurrences(of: "dbname=postgres", with: "dbname=\(name)")
            #expect(elsewhere.contains(name))
            let group = SyncGroup(groupID: groups[1].groupID, vault: machines[1].vault, database: elsewhere, keys: groups[1].keys, device: groups[1].device)
            let status = try group.status()
            #expect(status.databaseProblem?.contains("holds no sync group") == true)
            let failed = #expect(throws: LockboxError.self) { try group.sync() }
            #expect(failed?.code == .itemNotFound)
            let joining = try Machine()
            #expect(throws: LockboxError.self) {
                _ = try SyncGroup.join(groups[0].groupID, vault: joining.vault, database: elsewhere, passphrase: groupPassphrase)
            }
            let tables = try PostgresConnection(elsewhere).execute("SELECT count(*) FROM pg_tables WHERE tablename LIKE 'lockbox%'")
            #expect(try PostgresConnection.integer(tables.first?.first ?? nil) == 0)
            // Creating a group there makes them.
            _ = try SyncGroup.create(vault: joining.vault, database: elsewhere)
            let made = try PostgresConnection(elsewhere).execute("SELECT count(*) FROM pg_tables WHERE tablename LIKE 'lockbox%'")
            #expect(try PostgresConnection.integer(made.first?.first ?? nil) > 0)
        }
    }
}
