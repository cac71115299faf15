import Dispatch
import Foundation
import Lockbox
import LockboxCore
import LockboxTestSupport
import LockboxVault
import Testing

@testable import LockboxSync

#if canImport(Glibc)
import Glibc
#endif

private func mode(_ path: String) -> Int {
    var info = stat()
    return lstat(path, &info) == 0 ? Int(info.st_mode & 0o777) : -1
}

extension SyncTests {
    @Suite("Sync files: modes, the process's umask, and a directory that cannot be written", .serialized)
    struct SyncFiles {
        @Test("Threads opening sync states at once: every file 0600 and directory 0700, and the process's umask is left as it was")
        func umaskLeftAlone() throws {
            let directory = TemporaryDirectory("lockbox-sync-umask")
            let original = umask(0o022)
            defer { umask(original) }
            let key = SecretBytes(copying: [UInt8](repeating: 0x5a, count: 32))
            DispatchQueue.concurrentPerform(iterations: 2) { worker in
                for round in 0..<100 {
                    _ = try? SyncState(path: directory.file("v\(worker)-\(round).sync/group.db"), device: "device", key: key)
                }
            }
            #expect(umask(0o022) == 0o022, "the process's umask was changed")
            var lax: [String] = []
            for worker in 0..<2 {
                for round in 0..<100 {
                    let folder = directory.file("v\(worker)-\(round).sync")
                    if mode(folder) != 0o700 { lax.append(folder) }
                    if mode(folder + "/group.db") != 0o600 { lax.append(folder + "/group.db") }
                }
            }
            #expect(lax.isEmpty, "\(lax.count) with another mode, such as \(lax.prefix(3))")
        }

        @Test("A sync directory and state file left with looser modes are narrowed to 0700 and 0600, the state's log and shared memory made 0600")
        func looseModesNarrowed() throws {
            let (groups, machines) = try threeMachines()
            defer { withExtendedLifetime(machines) {} }
            try machines[0].add("x.example", "user", "1")
            try groups[0].sync()
            let path = groups[0].statePath
            let folder = String(path[..<path.lastIndex(of: "/")!])
            try restoreState(try copyState(path), at: path)
            chmod(folder, 0o755)
            chmod(path, 0o644)
            try groups[0].sync()
            #expect(mode(folder) == 0o700)
            for file in [path, path + "-wal", path + "-shm"] where FileManager.default.fileExists(atPath: file) {
                #expect(mode(file) == 0o600, "\(file)")
            }
        }

        @Test("A state path that is a symbolic link is refused, not followed")
        func linkedStateRefused() throws {
            let (groups, machines) = try threeMachines()
            defer { withExtendedLifetime(machines) {} }
            try groups[0].sync()
            let path = groups[0].statePath
            let elsewhere = TemporaryDirectory("lockbox-sync-link").file("elsewhere.db")
            try restoreState(nil, at: path)
            try FileManager.default.createSymbolicLink(atPath: path, withDestinationPath: elsewhere)
            let error = #expect(throws: LockboxError.self) { try groups[0].sync() }
            #expect(error?.code == .io)
            #expect(!FileManager.default.fileExists(atPath: elsewhere))
        }

        @Test("A state's log or shared memory replaced by a link is refused in words that name it, not the keychain, and the sync goes on once it is removed")
        func linkedStateLogRefusedByName() throws {
            let (groups, machines) = try threeMachines()
            defer { withExtendedLifetime(machines) {} }
            try groups[0].sync()
            let elsewhere = TemporaryDirectory("lockbox-sync-link").file("elsewhere")
            for suffix in ["-wal", "-shm"] {
                let companion = groups[0].statePath + suffix
                // (The log may hold the last commits: put back as it was afterwards.)
                let kept = try? Data(contentsOf: URL(fileURLWithPath: companion))
                try? FileManager.default.removeItem(atPath: companion)
                try FileManager.default.createSymbolicLink(atPath: companion, withDestinationPath: elsewhere)
                let error = #expect(throws: LockboxError.self) { try groups[0].sync() }
                #expect(error?.code == .io)
                #expect(error?.message.contains(companion) == true && error?.message.contains("cannot be opened") == false, "\(error?.message ?? "")")
                #expect(!FileManager.default.fileExists(atPath: elsewhere))
                try FileManager.default.removeItem(atPath: companion)
                if let kept { try kept.write(to: URL(fileURLWithPath: companion)) }
                try groups[0].sync()
            }
        }

        @Test("A join whose sync directory cannot be written fails before it uses up the pairing code, which then joins once fixed")
        func joinKeepsTheCodeWhenItCannotSave() throws {
            let database = try testDatabase()
            let first = try Machine()
            let group = try SyncGroup.create(vault: first.vault, database: database)
            let code = try group.pairingCode()
            let second = try Machine()
            let blocker = second.vault.path + ".sync"
            try Data("not a directory".utf8).write(to: URL(fileURLWithPath: blocker))
            let failed = try SyncCLI.run(second, ["sync", "join", group.groupID, "--database", database], input: code + "\n")
            #expect(failed.status == 1)
            #expect(failed.standardError.contains(blocker), "\(failed.standardError)")
            #expect(throws: LockboxError.self) { try SyncGroup.join(group.groupID, vault: second.vault, database: database, pairingCode: code) }
            try FileManager.default.removeItem(atPath: blocker)
            let again = try SyncCLI.run(second, ["sync", "join", group.groupID, "--database", database], input: code + "\n")
            #expect(again.status == 0, "the code was used up by a join that could not save: \(again.standardError)")
            #expect(try group.devices().count == 2)
        }

        @Test("A group the database no longer holds: sync, status and the command line say what to do, and the keychain keeps its items")
        func groupGoneSaysWhatToDo() throws {
            let database = try testDatabase()
            let machine = try Machine()
            let group = try SyncGroup.create(vault: machine.vault, database: database)
            try machine.add("a.example", "user", "a1")
            try group.sync()
            try SyncCLI.configure(machine, group: group.groupID, database: database)
            try PostgresConnection(database).execute("DELETE FROM lockbox_sync_groups WHERE group_id = $1", [.text(group.groupID)])
            let error = #expect(throws: LockboxError.self) { try group.sync() }
            #expect(error?.code == .itemNotFound)
            #expect(error?.message.contains("lockbox sync create --replace-group") == true, "\(error?.message ?? "")")
            #expect(try group.status().databaseProblem?.contains("lockbox sync create --replace-group") == true)
            for verb in [["sync", "now"], ["sync", "recover"]] {
                let result = try SyncCLI.run(machine, verb)
                #expect(result.standardError.contains("lockbox sync create --replace-group"), "\(verb): \(result.standardError)")
            }
            #expect(try machine.value("a.example", "user") == "a1")
        }
    }
}
