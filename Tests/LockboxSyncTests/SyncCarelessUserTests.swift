import Foundation
import Lockbox
import LockboxTestSupport
import LockboxVault
import Synchronization
import Testing
import VaultStorage

@testable import LockboxSync

#if canImport(Glibc)
import Glibc
#endif

private final class Box<T>: @unchecked Sendable {
    var value: T
    init(_ value: T) { self.value = value }
}

/// A careless user at the command line: a reset asked for when nothing is wrong, a
/// configuration made unreadable or edited, a passphrase piped twice, a sync started while
/// another is stopped, a device that keeps the group locked.
extension SyncTests {
    @Suite("Sync: the careless user's mistakes, said plainly and costing nothing", .serialized)
    struct CarelessUser {
        @Test("A reset of a sound state is refused, naming the changes it would replace, and nothing changes; --discard-local-changes rebuilds it")
        func resetOfASoundStateIsRefused() throws {
            let database = try testDatabase()
            let (groups, machines) = try threeMachines()
            defer { withExtendedLifetime(machines) {} }
            try machines[0].add("kept.example", "user", "k1")
            try machines[0].add("gone.example", "user", "g1")
            for group in groups { try group.sync() }
            tick()
            try machines[1].set("kept.example", "user", "edited on B")
            try machines[1].delete("gone.example", "user")
            let refused = #expect(throws: LockboxError.self) { try groups[1].resetState() }
            #expect(refused?.code == .param)
            #expect(refused?.message.contains("2 changes") == true, "\(refused?.message ?? "")")
            #expect(refused?.message.contains("--discard-local-changes") == true)
            // From the command line too; nothing was changed, and the changes sync.
            try SyncCLI.configure(machines[1], group: groups[1].groupID, database: database)
            let command = try SyncCLI.run(machines[1], ["sync", "reset"])
            #expect(command.status == 1 && command.standardError.contains("--discard-local-changes"), "\(command.standardError)")
            try groups[1].sync()
            for group in groups { try group.sync() }
            for machine in machines {
                #expect(try machine.value("kept.example", "user") == "edited on B")
                #expect(try machine.value("gone.example", "user") == nil)
            }
            // Asked for plainly: the group's versions replace this keychain's.
            tick()
            try machines[1].set("kept.example", "user", "edited again on B")
            let forced = try SyncCLI.run(machines[1], ["sync", "reset", "--discard-local-changes"])
            #expect(forced.status == 0, "\(forced.standardError)")
            #expect(try machines[1].value("kept.example", "user") == "edited on B")
            #expect(try SyncCLI.run(machines[1], ["sync", "now"]).status == 0)
        }

        @Test("A configuration that cannot be read is not taken for no group; a damaged one names the join that mends it; an edited one naming a password is refused without echoing it")
        func configurationProblemsAreNamed() throws {
            let database = try testDatabase()
            let machine = try Machine()
            let other = try Machine()
            let group = try SyncGroup.create(vault: other.vault, database: database)
            _ = try SyncGroup.join(group.groupID, vault: machine.vault, database: database, pairingCode: try group.pairingCode())
            let path = machine.vault.path + ".sync/config"
            // A directory in its place (what a permissions problem looks like to root, too).
            try? FileManager.default.removeItem(atPath: path)
            try FileManager.default.createDirectory(atPath: path, withIntermediateDirectories: true)
            let unreadable = try SyncCLI.run(machine, ["sync", "now"])
            #expect(unreadable.status == 1, "\(unreadable.status) \(unreadable.standardError)")
            #expect(unreadable.standardError.contains("Cannot read the sync configuration"), "\(unreadable.standardError)")
            #expect(!unreadable.standardError.contains("no sync group"))
            try FileManager.default.removeItem(atPath: path)
            // Damaged: the way out works as given.
            try Data("group=\n".utf8).write(to: URL(fileURLWithPath: path))
            let damaged = try SyncCLI.run(machine, ["sync", "now"])
            #expect(damaged.status == 1 && damaged.standardError.contains("--replace-group"), "\(damaged.standardError)")
            let joined = try SyncCLI.run(
                machine, ["sync", "join", group.groupID, "--database", database, "--replace-group"], input: try group.pairingCode() + "\n")
            #expect(joined.status == 0, "\(joined.standardError)")
            // Edited by hand to name a password: refused, the password not shown.
            try Data("group=\(group.groupID)\ndatabase=\(database) password=canary-db-password\n".utf8).write(to: URL(fileURLWithPath: path))
            let edited = try SyncCLI.run(machine, ["sync", "now"])
            #expect(edited.status == 1 && edited.standardError.contains("database= line"), "\(edited.standardError)")
            #expect(!edited.standardError.contains("canary-db-password"))
            // A configuration left open to others is narrowed when read.
            try SyncCLI.configure(machine, group: group.groupID, database: database)
            chmod(path, 0o644)
            #expect(try SyncCLI.run(machine, ["sync", "now"]).status == 0)
            #expect(try FileManager.default.attributesOfItem(atPath: path)[.posixPermissions] as? Int == 0o600)
        }

        @Test("--passphrase-stdin takes the first line, as lockbox init does: a passphrase piped twice is not one with a line break in it")
        func passphraseFromStandardInputIsTheFirstLine() throws {
            let database = try testDatabase()
            let first = try Machine()
            let second = try Machine()
            // Two short lines are not one long passphrase.
            let short = try SyncCLI.run(first, ["sync", "create", "--database", database, "--passphrase-stdin"], input: "abcdefg\nabcdefg\n")
            #expect(short.status == 1, "\(short.standardOutput) \(short.standardError)")
            let created = try SyncCLI.run(
                first, ["sync", "create", "--database", database, "--passphrase-stdin"], input: "a group passphrase\na group passphrase\n")
            #expect(created.status == 0, "\(created.standardError)")
            let group = created.standardOutput.trimmingCharacters(in: .whitespacesAndNewlines)
            let joined = try SyncCLI.run(
                second, ["sync", "join", group, "--database", database, "--passphrase-stdin"], input: "a group passphrase\n")
            #expect(joined.status == 0, "\(joined.standardError)")
        }

        @Test("A sync that waits for another process's says so once, then goes on when it ends")
        func waitingForAnotherSyncIsSaid() throws {
            let database = try testDatabase()
            let machine = try Machine()
            let group = try SyncGroup.create(vault: machine.vault, database: database)
            try SyncCLI.configure(machine, group: group.groupID, database: database)
            let lockPath = machine.vault.path + ".sync/" + group.groupID + ".lock"
            let descriptor = open(lockPath, O_RDWR | O_CREAT | O_CLOEXEC, 0o600)
            #expect(descriptor >= 0 && flock(descriptor, LOCK_EX) == 0)
            let result = Box<ProcessResult?>(nil)
            let done = DispatchSemaphore(value: 0)
            DispatchQueue.global().async {
                result.value = try? SyncCLI.run(machine, ["sync", "now"], timeout: 60)
                done.signal()
            }
            #expect(done.wait(timeout: .now() + 2) == .timedOut, "the sync did not wait")
            flock(descriptor, LOCK_UN)
            close(descriptor)
            done.wait()
            let finished = try #require(result.value)
            #expect(finished.status == 0, "\(finished.standardError)")
            #expect(finished.standardError.contains("Waiting for another sync of this keychain"), "\(finished.standardError)")
        }

        @Test("A role without the privileges a sync needs is told so, never \"no sync group\" (exit 44) or \"sync again later\"; an older schema it may not upgrade names the owner's upgrade")
        func missingPrivilegesAreNamed() throws {
            let database = try testDatabase()
            let passfile = try #require(database.split(separator: " ").first { $0.hasPrefix("passfile=") }.map { String($0.dropFirst(9)) })
            let password = try #require(
                try String(contentsOfFile: passfile, encoding: .utf8).split(separator: "\n").first.map { String($0.split(separator: ":").last!) })
            let suffix = String(UInt32.random(in: 0...UInt32.max), radix: 16)
            let role = "lbx_limited_" + suffix
            let schema = "lbx_hidden_" + suffix
            let admin = try PostgresConnection(database)
            try admin.execute("CREATE SCHEMA \(schema)")
            try admin.execute("CREATE ROLE \(role) LOGIN PASSWORD '\(password)'")
            defer {
                _ = try? admin.execute("DROP SCHEMA \(schema) CASCADE")
                _ = try? admin.execute("DROP OWNED BY \(role)")
                _ = try? admin.execute("DROP ROLE \(role)")
            }
            let directory = TemporaryDirectory("lockbox-sync-role")
            let limitedPassfile = directory.file("pgpass")
            _ = FileManager.default.createFile(
                atPath: limitedPassfile, contents: Data("*:*:*:\(role):\(password)\n".utf8), attributes: [.posixPermissions: 0o600])
            func connection(_ user: String?, _ file: String?) -> String {
                database.split(separator: " ").map { word in
                    if let user, word.hasPrefix("user=") { return "user=" + user }
                    if let file, word.hasPrefix("passfile=") { return "passfile=" + file }
                    return String(word)
                }.joined(separator: " ") + " options='-c search_path=\(schema)'"
            }
            let machine = try Machine()
            try machine.add("x.example", "user", "x1")
            let group = try SyncGroup.create(vault: machine.vault, database: connection(nil, nil))
            try group.sync()
            let limited = try SyncGroup(group.groupID, vault: machine.vault, database: connection(role, limitedPassfile))
            func refused(_ what: String) -> LockboxError? {
                let error = #expect(throws: LockboxError.self, "\(what)") { try limited.sync() }
                #expect(error?.code != .itemNotFound, "\(what): \(error?.message ?? "")")
                #expect(error?.message.contains("Sync again later") == false, "\(what): \(error?.message ?? "")")
                return error
            }
            // No USAGE on the schema that holds the tables.
            let hidden = refused("no USAGE on the schema")
            #expect(hidden?.message.contains("lacks a privilege") == true, "\(hidden?.message ?? "")")
            #expect(hidden?.message.contains("schema it may not use") == true, "\(hidden?.message ?? "")")
            // USAGE, but no right on the tables.
            try admin.execute("GRANT USAGE ON SCHEMA \(schema) TO \(role)")
            let tables = refused("no right on the tables")
            #expect(tables?.message.contains("lacks a privilege") == true, "\(tables?.message ?? "")")
            // Every right but ownership, on a schema one version older: it cannot be upgraded here.
            try admin.execute("GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA \(schema) TO \(role)")
            try admin.execute("ALTER TABLE \(schema).lockbox_fleet_sessions DROP COLUMN refresh_in_flight_until")
            try admin.execute("DELETE FROM \(schema).lockbox_sync_schema WHERE version = \(SyncSchema.currentVersion)")
            let older = refused("an older schema")
            #expect(older?.message.contains("schema version \(SyncSchema.currentVersion - 1)") == true, "\(older?.message ?? "")")
            #expect(older?.message.contains("owner") == true, "\(older?.message ?? "")")
            // The owner's sync upgrades it; the role then syncs.
            try group.sync()
            try machine.set("x.example", "user", "x2")
            try limited.sync()
            #expect(try machine.value("x.example", "user") == "x2")
        }

        @Test("A device that keeps the group locked: the wait ends with an error that says so, and a transaction left idle is ended by the server")
        func aGroupKeptLockedIsSaid() throws {
            let database = try testDatabase()
            let machines = [try Machine(), try Machine()]
            let group = try SyncGroup.create(vault: machines[0].vault, database: database)
            // Sessions end a transaction left idle, as they wait for locks, 2 minutes.
            let connection = try PostgresConnection(database)
            #expect(try connection.execute("SHOW idle_in_transaction_session_timeout").first?[0] == "2min")
            #expect(try connection.execute("SHOW lock_timeout").first?[0] == "2min")
            // Another device's transaction holds the group row (here, a short wait to show it).
            let holder = try PostgresConnection(database)
            try holder.execute("BEGIN")
            try holder.execute("SELECT 1 FROM lockbox_sync_groups WHERE group_id = $1 FOR UPDATE", [.text(group.groupID)])
            try machines[0].add("x.example", "user", "x1")
            let waiting = try SyncGroup(group.groupID, vault: machines[0].vault, database: database + " options='-c lock_timeout=700'")
            let refused = #expect(throws: LockboxError.self) { try waiting.sync() }
            #expect(refused?.message.contains("kept the sync group locked") == true, "\(refused?.message ?? "")")
            try holder.execute("ROLLBACK")
            try waiting.sync()
        }

        enum StateDamage: String, CaseIterable, Sendable { case droppedTable, newerFormat, garbage, cutShort }

        @Test(
            "A reset rebuilds a state damaged in any way (a table dropped, a newer format, garbage, cut short): with no flag when nothing changed here since the last sync, only with --discard-local-changes when an item did, even once the refused state is removed by hand",
            arguments: StateDamage.allCases)
        func resetRebuildsAnyDamagedState(damage: StateDamage) throws {
            let (groups, machines) = try threeMachines()
            defer { withExtendedLifetime(machines) {} }
            try machines[0].add("x.example", "user", "x1")
            for group in groups { try group.sync() }
            let path = groups[0].statePath
            func sql(_ statement: String) throws {
                let database = try Database(path: path, create: false)
                try database.execute(statement)
            }
            switch damage {
            case .droppedTable: try sql("DROP TABLE mac_groups")
            case .newerFormat: try sql("PRAGMA user_version = 99")
            case .garbage:
                try restoreState(StateCopy(file: Data(repeating: 0x41, count: 8192), log: nil), at: path)
            case .cutShort:
                let file = try Data(contentsOf: URL(fileURLWithPath: path))
                try restoreState(StateCopy(file: file.prefix(100), log: nil), at: path)
            }
            // (A change here since, which the sync must look up in the state.)
            tick()
            try machines[0].set("x.example", "user", "x2 here")
            let failed = #expect(throws: LockboxError.self) { try groups[0].sync() }
            // Said of the sync state, with its remedy: never as a keychain to restore.
            if damage != .newerFormat {
                #expect(failed?.message.contains("lockbox sync reset") == true, "\(failed?.message ?? "")")
            }
            #expect(failed?.message.contains("Restore it from a backup") == false, "\(failed?.message ?? "")")
            // The damaged state cannot say whether that change was sent: the reset says it would
            // replace it, and changes nothing.
            let refused = #expect(throws: LockboxError.self) { try groups[0].resetState() }
            #expect(refused?.code == .param)
            #expect(refused?.message.contains("1 item the group holds changed in this keychain") == true, "\(refused?.message ?? "")")
            #expect(refused?.message.contains("--discard-local-changes") == true)
            #expect(try machines[0].value("x.example", "user") == "x2 here")
            // The refused state removed by hand (a state behind, which a reset otherwise rebuilds
            // without counting): the reset stays refused until the flag.
            for file in [path, path + "-wal", path + "-shm"] { unlink(file) }
            let stillRefused = #expect(throws: LockboxError.self) { try groups[0].resetState() }
            #expect(stillRefused?.code == .param, "\(stillRefused?.message ?? "")")
            #expect(try machines[0].value("x.example", "user") == "x2 here")
            try groups[0].resetState(discardingLocalChanges: true)
            #expect(access(groups[0].refusedResetPath, F_OK) != 0, "the mark of the refused reset stays")
            try groups[0].sync()
            // The group's version replaces this keychain's, as the reset says.
            #expect(try machines[0].value("x.example", "user") == "x1")
            // Damaged again with nothing changed here since the last sync: no flag needed.
            try groups[0].sync()
            switch damage {
            case .droppedTable: try sql("DROP TABLE mac_groups")
            case .newerFormat: try sql("PRAGMA user_version = 99")
            case .garbage: try restoreState(StateCopy(file: Data(repeating: 0x41, count: 8192), log: nil), at: path)
            case .cutShort:
                let file = try Data(contentsOf: URL(fileURLWithPath: path))
                try restoreState(StateCopy(file: file.prefix(100), log: nil), at: path)
            }
            tick()
            try machines[1].set("x.example", "user", "x3 there")
            try groups[1].sync()
            try groups[0].resetState()
            #expect(try machines[0].value("x.example", "user") == "x3 there")
        }
    }
}
