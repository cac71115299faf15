import Foundation
import Lockbox
import LockboxTestSupport
import LockboxVault
import Synchronization
import Testing

@testable import LockboxSync

#if canImport(Glibc)
import Glibc
#endif

/// A TCP port that accepts connections (the kernel completes them from the listen queue) and
/// never answers: a server that hangs.
final class SilentServer {
    let descriptor: Int32
    let port: UInt16

    init() throws {
        let socketDescriptor = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_addr.s_addr = inet_addr("127.0.0.1")
        address.sin_port = 0
        let bound = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(socketDescriptor, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
        }
        guard bound == 0 && listen(socketDescriptor, 8) == 0 else {
            close(socketDescriptor)
            throw LockboxError(.io, "cannot listen on a loopback port")
        }
        var length = socklen_t(MemoryLayout<sockaddr_in>.size)
        _ = withUnsafeMutablePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(socketDescriptor, $0, &length) }
        }
        descriptor = socketDescriptor
        port = UInt16(bigEndian: address.sin_port)
    }

    deinit { close(descriptor) }
}

/// A loopback relay to the test PostgreSQL that forwards both ways until ``stall()``, then
/// stops passing the server's bytes on: a server that took the login and stopped answering.
final class StallingRelay: @unchecked Sendable {
    let listener: Int32
    let port: UInt16
    private let stalled = Mutex(false)
    private let target: UInt16

    init(to target: UInt16) throws {
        self.target = target
        let server = try SilentServer()
        listener = dup(server.descriptor)
        port = server.port
        let listening = listener
        Thread.detachNewThread { [self] in
            let client = accept(listening, nil, nil)
            guard client >= 0 else { return }
            let upstream = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
            var address = sockaddr_in()
            address.sin_family = sa_family_t(AF_INET)
            address.sin_addr.s_addr = inet_addr("127.0.0.1")
            address.sin_port = self.target.bigEndian
            let connected = withUnsafePointer(to: &address) {
                $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(upstream, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
            }
            guard connected == 0 else { return }
            Thread.detachNewThread { self.pump(from: client, to: upstream, always: true) }
            self.pump(from: upstream, to: client, always: false)
        }
    }

    private func pump(from source: Int32, to destination: Int32, always: Bool) {
        var buffer = [UInt8](repeating: 0, count: 65536)
        while true {
            let count = buffer.withUnsafeMutableBytes { read(source, $0.baseAddress, $0.count) }
            guard count > 0 else { return }
            if !always && stalled.withLock({ $0 }) { continue }
            _ = buffer.withUnsafeBytes { write(destination, $0.baseAddress, count) }
        }
    }

    func stall() { stalled.withLock { $0 = true } }

    deinit { close(listener) }
}

extension SyncTests {
    @Test("A server that took the login and then stopped answering: the statement ends with an error after the reply timeout, and the connection is not used again")
    func stalledServerEndsTheWait() throws {
        let database = try testDatabase()
        let port = try #require(database.split(separator: " ").first { $0.hasPrefix("port=") }.flatMap { UInt16($0.dropFirst(5)) })
        let relay = try StallingRelay(to: port)
        // The password file names the server's port: a copy names the relay's.
        let directory = TemporaryDirectory("lockbox-relay")
        let passfile = try #require(database.split(separator: " ").first { $0.hasPrefix("passfile=") }.map { String($0.dropFirst(9)) })
        let entries = try String(contentsOfFile: passfile, encoding: .utf8).replacingOccurrences(of: ":\(port):", with: ":\(relay.port):")
        try entries.write(toFile: directory.file("pgpass"), atomically: true, encoding: .utf8)
        try FileManager.default.setAttributes([.posixPermissions: 0o600], ofItemAtPath: directory.file("pgpass"))
        let viaRelay = database.split(separator: " ").map { word -> String in
            if word.hasPrefix("port=") { return "port=\(relay.port)" }
            if word.hasPrefix("passfile=") { return "passfile=" + directory.file("pgpass") }
            return String(word)
        }.joined(separator: " ")
        let connection = try PostgresConnection(viaRelay, replyTimeout: .seconds(2))
        #expect(try connection.execute("SELECT 1").first?[0] == "1")
        relay.stall()
        let started = Date()
        let stopped = #expect(throws: LockboxError.self) { try connection.execute("SELECT 2") }
        #expect(stopped?.code == .notAvailable && stopped?.message.contains("stopped answering") == true, "\(String(describing: stopped))")
        #expect(Date().timeIntervalSince(started) < 20)
        let after = #expect(throws: LockboxError.self) { try connection.execute("SELECT 3") }
        #expect(after?.code == .notAvailable)
        // The default is longer than any lock wait the server allows.
        #expect(PostgresConnection.defaultReplyTimeout > .seconds(120))
    }

    @Test("lockbox sync refuses a password in a URI, a connection string on several lines, stray arguments and options of other verbs, without echoing them")
    func commandLineRefusals() throws {
        let database = try testDatabase()
        let machine = try Machine()
        let canary = makeCanary("sync-argument")
        func refused(_ arguments: [String], _ what: String) throws {
            let result = try SyncCLI.run(machine, arguments)
            #expect(result.status == 64, "\(what): status \(result.status), \(result.standardError)")
            #expect(!result.standardOutput.contains(canary) && !result.standardError.contains(canary), "\(what) echoed its argument")
        }
        // A password in a URI's user information, or as a URI parameter: refused, never saved.
        try refused(["sync", "create", "--database", "postgresql://lockbox:\(canary)@127.0.0.1:1/postgres"], "a URI with a password")
        try refused(["sync", "create", "--database", "postgresql://lockbox@127.0.0.1:1/postgres?password=\(canary)"], "a URI parameter")
        try refused(["sync", "create", "--database", "host=127.0.0.1 password = '\(canary)'"], "password with spaces")
        try refused(["sync", "join", String(repeating: "a", count: 32), "--database", "host=127.0.0.1 password=\(canary)"], "join")
        #expect(!FileManager.default.fileExists(atPath: machine.vault.path + ".sync/config"))
        // A line break would cut the string where it is saved, dropping what follows it.
        try refused(["sync", "create", "--database", "host=127.0.0.1 dbname=postgres\nsslmode=verify-full \(canary)"], "two lines")
        try refused(["sync", "create", "--database", "host='unterminated \(canary)"], "unreadable")
        // Stray arguments and options: named by position only.
        try refused(["sync", "now", canary], "a stray argument")
        try refused(["sync", canary], "an unknown verb")
        try refused(["sync", "now", "--" + canary], "an unknown option")
        try refused(["sync", "create", "--database", database, "--passphrase-stdin", canary], "an argument after an option")
        try refused(["sync", "remove-device", "0123456789abcdef", canary], "a second device")
        let stray = try SyncCLI.run(machine, ["sync", "now", canary])
        #expect(stray.standardError.contains("argument 2 after sync"), "\(stray.standardError)")
        // Options of other verbs are refused, not ignored (a --database given to now would
        // otherwise be dropped for the saved one).
        try refused(["sync", "now", "--database", database], "--database for now")
        try refused(["sync", "status", "--passphrase-stdin"], "--passphrase-stdin for status")
        try refused(["sync", "now", "--json"], "--json for now")
        try refused(["sync", "status", "--minutes", "5"], "--minutes for status")
        try refused(["--backend", "secret-service", "sync", "status"], "another backend")
        var desktop = SyncCLI.environment(machine)
        desktop["LOCKBOX_BACKEND"] = "secret-service"
        let viaEnvironment = try LockboxTestSupport.run(
            builtProduct("lockbox"), ["--keychain", machine.vault.path, "sync", "status"], input: [], environment: desktop, timeout: nil)
        #expect(viaEnvironment.status == 64, "LOCKBOX_BACKEND=secret-service: \(viaEnvironment.standardError)")
        // A group identifier of the wrong form: refused before anything runs, not repeated.
        let badGroup = try SyncCLI.run(machine, ["sync", "join", canary, "--database", database], input: "ABCD-EFGH-JKLM-NPQR\n")
        #expect(badGroup.status == 1 && badGroup.standardError.contains("-50"), "\(badGroup.standardError)")
        #expect(!badGroup.standardError.contains(canary))
        // A password file whose name holds the word is no password.
        #expect(PostgresConnection.namesPassword("host=127.0.0.1 passfile=/home/user/passwords.pgpass user=password_admin") == false)
        #expect(PostgresConnection.namesPassword("postgresql://lockbox@127.0.0.1/postgres") == false)
        #expect(PostgresConnection.namesPassword("postgresql://lockbox:secret@127.0.0.1/postgres") == true)
        #expect(PostgresConnection.namesPassword("host='unterminated") == nil)
        // The passphrase of the client's TLS key is a secret too.
        #expect(PostgresConnection.namesPassword("host=127.0.0.1 sslcert=/k/c.pem sslkey=/k/k.pem sslpassword=keypass") == true)
        #expect(PostgresConnection.namesPassword("postgresql://lockbox@127.0.0.1/postgres?sslpassword=keypass") == true)
    }

    @Test("lockbox sync: an option given twice, an empty connection string refused; a group identifier in upper case joins; a create that could not save its configuration makes no group; offline, --json lists no devices")
    func carelessArguments() throws {
        let database = try testDatabase()
        let machine = try Machine()
        for (arguments, what) in [
            (["sync", "create", "--database", database, "--database", database], "--database twice"),
            (["sync", "status", "--json", "--json"], "--json twice"),
            (["sync", "create", "--database", ""], "an empty connection string"),
            (["sync", "create", "--database", "  "], "a blank connection string"),
        ] {
            let result = try SyncCLI.run(machine, arguments)
            #expect(result.status == 64, "\(what): status \(result.status), \(result.standardError)")
        }
        // A create whose configuration cannot be written makes no group, in the database or the keychain.
        let groupsBefore = try PostgresConnection(database).execute("SELECT count(*) FROM lockbox_sync_groups")
        #expect(FileManager.default.createFile(atPath: machine.vault.path + ".sync", contents: Data()))
        let blocked = try SyncCLI.run(machine, ["sync", "create", "--database", database])
        #expect(blocked.status == 1 && blocked.standardError.contains("nothing was created"), "\(blocked.standardError)")
        let groupsAfter = try PostgresConnection(database).execute("SELECT count(*) FROM lockbox_sync_groups")
        #expect(try PostgresConnection.integer(groupsAfter.first?.first ?? nil) == PostgresConnection.integer(groupsBefore.first?.first ?? nil))
        #expect(try SyncGroup.groups(in: machine.vault).isEmpty)
        try FileManager.default.removeItem(atPath: machine.vault.path + ".sync")
        // A group identifier is hexadecimal: upper case is the same identifier.
        let first = try Machine()
        let group = try SyncGroup.create(vault: first.vault, database: database)
        let joined = try SyncCLI.run(machine, ["sync", "join", group.groupID.uppercased(), "--database", database], input: try group.pairingCode() + "\n")
        #expect(joined.status == 0, "\(joined.standardError)")
        #expect(try SyncGroup.groups(in: machine.vault) == [group.groupID])
        // Offline: the devices are unknown, not an empty list.
        try SyncCLI.configure(machine, group: group.groupID, database: "host=127.0.0.1 port=1 dbname=postgres user=lockbox connect_timeout=2")
        let offline = try SyncCLI.run(machine, ["sync", "status", "--json"])
        #expect(offline.status == 0 && offline.standardOutput.contains("\"databaseReachable\": false"), "\(offline.standardOutput)")
        #expect(!offline.standardOutput.contains("\"devices\""), "\(offline.standardOutput)")
    }

    @Test("Joining needs the keychain unlocked before the pairing code is used; a keychain in a group is moved to another only with --replace-group")
    func joiningChecksFirst() throws {
        let database = try testDatabase()
        let first = try Machine()
        let second = try Machine()
        let group = try SyncGroup.create(vault: first.vault, database: database)
        let code = try group.pairingCode()
        second.vault.lock()
        let locked = #expect(throws: LockboxError.self) {
            try SyncGroup.join(group.groupID, vault: second.vault, database: database, pairingCode: code)
        }
        #expect(locked?.code == .interactionNotAllowed)
        // The code is still good once the keychain is unlocked.
        try second.vault.unlock(passphrase: SecretBytes(utf8: "machine passphrase"))
        let joined = try SyncGroup.join(group.groupID, vault: second.vault, database: database, pairingCode: code)
        #expect(joined.groupID == group.groupID)
        // Inviting, creating and removing need it unlocked too.
        first.vault.lock()
        #expect(throws: LockboxError.self) { try group.pairingCode() }
        #expect(throws: LockboxError.self) { try group.removeDevice(joined.deviceID) }
        #expect(throws: LockboxError.self) { try SyncGroup.create(vault: first.vault, database: database) }
        try first.vault.unlock(passphrase: SecretBytes(utf8: "machine passphrase"))
        // A group passphrase short enough to guess offline is refused.
        let short = #expect(throws: LockboxError.self) {
            try SyncGroup.create(vault: first.vault, database: database, passphrase: SecretBytes(utf8: "a"))
        }
        #expect(short?.code == .param)
        #expect(throws: LockboxError.self) {
            try SyncGroup.create(vault: first.vault, database: database, passphrase: SecretBytes(utf8: String(repeating: " ", count: 20) + "abc"))
        }
        #expect(throws: LockboxError.self) { try group.removeDevice(joined.deviceID, newPassphrase: SecretBytes(utf8: "short")) }
        #expect(try group.devices().count == 2, "a refused removal removed the device")

        // From the command line: a keychain that syncs with a group is not moved silently.
        try SyncCLI.configure(first, group: group.groupID, database: database)
        let moved = try SyncCLI.run(first, ["sync", "create", "--database", database])
        #expect(moved.status == 1 && moved.standardError.contains("--replace-group"), "\(moved.standardError)")
        #expect(try String(contentsOfFile: first.vault.path + ".sync/config", encoding: .utf8).contains(group.groupID))
        let replaced = try SyncCLI.run(first, ["sync", "create", "--database", database, "--replace-group"])
        #expect(replaced.status == 0, "\(replaced.standardError)")
        let newGroup = replaced.standardOutput.trimmingCharacters(in: .whitespacesAndNewlines)
        #expect(newGroup != group.groupID && SyncGroup.isGroupIdentifier(newGroup))
        #expect(try String(contentsOfFile: first.vault.path + ".sync/config", encoding: .utf8).contains(newGroup))
        // A device removed from its group joins it again with a new code: the group it names
        // already is no other group.
        let rejoining = try Machine()
        let member = try SyncGroup.join(newGroup, vault: rejoining.vault, database: database, pairingCode: try SyncGroup(newGroup, vault: first.vault, database: database).pairingCode())
        try SyncCLI.configure(rejoining, group: newGroup, database: database)
        try SyncGroup(newGroup, vault: first.vault, database: database).removeDevice(member.deviceID)
        let removed = try SyncCLI.run(rejoining, ["sync", "now"])
        #expect(removed.status == 1 && removed.standardError.contains("-25293") && removed.standardError.contains("join again"), "\(removed.standardError)")
        let newCode = try SyncGroup(newGroup, vault: first.vault, database: database).pairingCode()
        let again = try SyncCLI.run(rejoining, ["sync", "join", newGroup, "--database", database], input: newCode + "\n")
        #expect(again.status == 0, "join again: \(again.standardError)")
        #expect(try SyncCLI.run(rejoining, ["sync", "now"]).status == 0)
        // A join to a group the database does not hold says so.
        let third = try Machine()
        let missing = try SyncCLI.run(third, ["sync", "join", String(repeating: "0", count: 32), "--database", database], input: "ABCD-EFGH-JKLM-NPQR\n")
        #expect(missing.status == 44 && missing.standardError.contains("no sync group"), "\(missing.standardError)")
    }

    @Test("Joining a keychain that already holds synchronizable items needs --merge, asked before the pairing code is used; the join then counts and explains its items that lost to the group's later writes")
    func joiningMergesOnlyWhenAsked() throws {
        let database = try testDatabase()
        let first = try Machine()
        let joining = try Machine()
        // The joining keychain's own items, written before the group's.
        try joining.add("kept.example", "a", "mine")
        try joining.add("deleted.example", "a", "mine too")
        try joining.add("replaced.example", "a", "mine as well")
        try joining.add("local.example", "a", "stays here", synchronizable: false)
        tick()
        let group = try SyncGroup.create(vault: first.vault, database: database)
        try first.add("deleted.example", "a", "theirs")
        try first.add("replaced.example", "a", "theirs, later")
        try group.sync()
        tick()
        try first.delete("deleted.example", "a")
        try group.sync()

        let code = try group.pairingCode()
        let refused = try SyncCLI.run(joining, ["sync", "join", group.groupID, "--database", database], input: code + "\n")
        #expect(refused.status == 1, "\(refused.standardError)")
        #expect(refused.standardError.contains("already holds 3 synchronizable items"), "\(refused.standardError)")
        #expect(refused.standardError.contains("--merge") && refused.standardError.contains("lockbox backup"), "\(refused.standardError)")
        #expect(try SyncGroup.groups(in: joining.vault).isEmpty)
        #expect(try joining.value("deleted.example", "a") == "mine too")
        #expect(try group.devices().count == 1)

        // The same code still joins: it was not used.
        let joined = try SyncCLI.run(joining, ["sync", "join", group.groupID, "--database", database, "--merge"], input: code + "\n")
        #expect(joined.status == 0, "\(joined.standardError)")
        #expect(joined.standardOutput.contains("superseded 2"), "\(joined.standardOutput)")
        #expect(joined.standardError.contains("2 changes made here lost to a later write of another device"), "\(joined.standardError)")
        #expect(try joining.value("deleted.example", "a") == nil)
        #expect(try joining.value("replaced.example", "a") == "theirs, later")
        #expect(try joining.value("kept.example", "a") == "mine")
        var local = Query.genericPassword(service: "local.example", account: "a")
        local.returning = [.data]
        #expect(try joining.vault.data(matching: local) == SecretBytes(utf8: "stays here"))
        try group.sync()
        #expect(try first.value("kept.example", "a") == "mine")
        // A keychain with no synchronizable item joins without the flag.
        let empty = try Machine()
        try empty.add("local.example", "a", "not synced", synchronizable: false)
        let plain = try SyncCLI.run(empty, ["sync", "join", group.groupID, "--database", database], input: try group.pairingCode() + "\n")
        #expect(plain.status == 0, "\(plain.standardError)")
    }

    @Test("sync status: what the next push would write; device rows from the database shown escaped; offline, the last sync unknown; a silent server times out")
    func statusIsAccurateAndSafe() throws {
        let database = try testDatabase()
        let (groups, machines) = try threeMachines()
        try SyncCLI.configure(machines[0], group: groups[0].groupID, database: database)
        try machines[0].add("keep.example", "a", "one")
        try machines[0].add("drop.example", "a", "two")
        try groups[0].sync()
        #expect(try groups[0].status().pendingLocalChanges == 0)
        // ThisDeviceOnly items never leave: nothing pending.
        try machines[0].add("local.example", "a", "three", accessibility: .whenUnlockedThisDeviceOnly)
        #expect(try groups[0].status().pendingLocalChanges == 0)
        // An add, an edit and a delete: three changes for the next push.
        try machines[0].add("new.example", "a", "four")
        try machines[0].set("keep.example", "a", "edited")
        try machines[0].delete("drop.example", "a")
        #expect(try groups[0].status().pendingLocalChanges == 3)
        #expect(try groups[0].sync().pushed == 3)
        #expect(try groups[0].status().pendingLocalChanges == 0)

        // A device row the database's administrator added, with a line break and a terminal
        // escape that would forge a line and hide the mark.
        let connection = try PostgresConnection(database)
        let forged = "evil\n  \(groups[1].deviceID)  pulled 9  last sync now\u{1B}[8m"
        try connection.execute(
            "INSERT INTO lockbox_sync_devices VALUES ($1, $2, 0, $3, $3, now())",
            [.text(groups[0].groupID), .text(forged), .bytes([UInt8](repeating: 0, count: 32))])
        let status = try SyncCLI.run(machines[0], ["sync", "status"])
        #expect(status.status == 0, "\(status.standardError)")
        #expect(!status.standardOutput.contains("\u{1B}"), "a control sequence from the database reached the terminal")
        let lines = status.standardOutput.split(separator: "\n")
        let forgedLine = try #require(lines.first { $0.contains("evil") })
        #expect(forgedLine.contains("UNATTESTED") && forgedLine.contains("\\u{a}"), "\(forgedLine)")
        #expect(lines.filter { $0.contains(groups[1].deviceID) }.count == 2, "the forged row made a line of its own")
        // The test server is on this machine (loopback, libpq's default sslmode=prefer): TLS,
        // with nothing of the server verified, and status says so.
        #expect(lines.contains { $0.hasPrefix("database:         TLS") && $0.hasSuffix("the server not verified (sslmode=prefer)") }, "\(status.standardOutput)")

        // Offline: the last sync is unknown, not "never".
        let closed = TemporaryDirectory("lockbox-sync-closed")
        try SyncCLI.configure(machines[0], group: groups[0].groupID, database: "host=\(closed.path) port=1 dbname=postgres user=lockbox")
        let offline = try SyncCLI.run(machines[0], ["sync", "status"])
        #expect(offline.status == 0 && offline.standardOutput.contains("last sync:        unknown"), "\(offline.standardOutput)")

        // A server that accepts and never answers: the default connect timeout ends the wait.
        let silent = try SilentServer()
        try SyncCLI.configure(machines[0], group: groups[0].groupID, database: "host=127.0.0.1 port=\(silent.port) dbname=postgres user=lockbox")
        let started = Date()
        let hung = try SyncCLI.run(machines[0], ["sync", "status"], timeout: 60)
        let waited = Date().timeIntervalSince(started)
        #expect(hung.status == 0 && hung.standardOutput.contains("unreachable"), "status: \(hung.status) \(hung.standardOutput)")
        #expect(waited < Double(PostgresConnection.defaultConnectTimeout) * 3, "status waited \(waited) s for a silent server")
    }

    @Test("The server's notices and warnings never reach the terminal: a trigger's warning with terminal sequences, dressed as Lockbox's advice, is not printed")
    func serverNoticesAreNotPrinted() throws {
        let database = try testDatabase()
        let machine = try Machine()
        let group = try SyncGroup.create(vault: machine.vault, database: database)
        try SyncCLI.configure(machine, group: group.groupID, database: database)
        try machine.add("notice.example", "user", "value")
        let connection = try PostgresConnection(database)
        let function = "lockbox_test_warn_\(group.groupID)"
        try connection.execute(
            """
            CREATE FUNCTION \(function)() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN
                IF NEW.group_id = '\(group.groupID)' THEN
                    RAISE WARNING E'\\x1b[2J\\x1b[31mlockbox sync: the sync state is damaged: run `lockbox sync reset --discard-local-changes`\\x1b]0;pwned\\x07';
                END IF;
                RETURN NEW;
            END $$
            """)
        try connection.execute(
            "CREATE TRIGGER \(function) BEFORE INSERT OR UPDATE ON lockbox_sync_items FOR EACH ROW EXECUTE FUNCTION \(function)()")
        defer {
            _ = try? connection.execute("DROP TRIGGER \(function) ON lockbox_sync_items")
            _ = try? connection.execute("DROP FUNCTION \(function)()")
        }
        let synced = try SyncCLI.run(machine, ["sync", "now"])
        #expect(synced.status == 0, "\(synced.standardError)")
        #expect(try storedRecords(group.groupID).count == 1, "the trigger's row was not written: the warning was not raised")
        #expect(!synced.standardError.contains("\u{1b}") && !synced.standardError.contains("\u{07}"), "\(synced.standardError.debugDescription)")
        #expect(!synced.standardError.contains("reset --discard-local-changes"), "\(synced.standardError)")
    }

    @Test("A group passphrase of invisible characters (NUL bytes, no-break spaces, control or format characters) is refused; one of twelve letters among them is taken; an empty one at join is refused before any work")
    func invisiblePassphrasesAreRefused() throws {
        let database = try testDatabase()
        let machine = try Machine()
        for weak: [UInt8] in [
            [UInt8](repeating: 0, count: 12), Array(String(repeating: "\u{00A0}", count: 12).utf8), Array(1...17),
            Array(String(repeating: "\u{200B}", count: 12).utf8), Array(String(repeating: "\u{3000}", count: 6).utf8) + Array("abcde".utf8),
        ] {
            let refused = #expect(throws: LockboxError.self) {
                try SyncGroup.create(vault: machine.vault, database: database, passphrase: SecretBytes(copying: weak))
            }
            #expect(refused?.code == .param, "\(weak)")
        }
        let passphrase = "\u{00A0}twelve words!!\u{00A0}\u{0000}"
        let group = try SyncGroup.create(vault: machine.vault, database: database, passphrase: SecretBytes(utf8: passphrase))
        let joining = try Machine()
        let empty = #expect(throws: LockboxError.self) {
            try SyncGroup.join(group.groupID, vault: joining.vault, database: database, passphrase: SecretBytes(utf8: ""))
        }
        #expect(empty?.code == .param && empty?.message.contains("empty") == true, "\(String(describing: empty))")
        #expect(try SyncGroup.join(group.groupID, vault: joining.vault, database: database, passphrase: SecretBytes(utf8: passphrase)).groupID == group.groupID)
    }

    @Test("After a removal set a new group passphrase, the former one is refused with advice that names the current one, not the one the group was created with")
    func formerPassphraseAdviceNamesTheCurrentOne() throws {
        let (groups, machines) = try threeMachines()
        defer { withExtendedLifetime(machines) {} }
        try groups[0].removeDevice(groups[1].deviceID, newPassphrase: SecretBytes(utf8: "the passphrase set by the removal"))
        let late = try Machine()
        let refused = #expect(throws: LockboxError.self) {
            try SyncGroup.join(groups[0].groupID, vault: late.vault, database: try testDatabase(), passphrase: groupPassphrase)
        }
        #expect(refused?.code == .authFailed)
        #expect(refused?.message.contains("current passphrase") == true && refused?.message.contains("removal") == true, "\(String(describing: refused))")
        #expect(refused?.message.contains("created with.") == false)
    }

    @Test("An empty sync configuration on a keychain that never joined a group is not taken for a group: create and status say it names none, and removing it is the way out")
    func emptyConfigurationNamesNoGroup() throws {
        let database = try testDatabase()
        let machine = try Machine()
        try FileManager.default.createDirectory(atPath: machine.vault.path + ".sync", withIntermediateDirectories: true)
        try Data().write(to: URL(fileURLWithPath: machine.vault.path + ".sync/config"))
        let create = try SyncCLI.run(machine, ["sync", "create", "--database", database])
        #expect(create.status == 1 && create.standardError.contains("names no group"), "\(create.standardError)")
        #expect(!create.standardError.contains("already syncs"))
        let status = try SyncCLI.run(machine, ["sync", "status"])
        #expect(status.status == 1 && status.standardError.contains("if it never joined one, remove that file"), "\(status.standardError)")
        try FileManager.default.removeItem(atPath: machine.vault.path + ".sync/config")
        #expect(try SyncCLI.run(machine, ["sync", "create", "--database", database]).status == 0)
    }

    @Test("A removal stopped by a database whose records fail their checks names the way to cut the device off that needs nothing of the database: a new group")
    func removalStoppedByTheDatabaseNamesANewGroup() throws {
        let (groups, machines) = try threeMachines()
        defer { withExtendedLifetime(machines) {} }
        try machines[0].add("x.example", "user", "x")
        for group in groups { try group.sync() }
        let target = try #require(try storedRecords(groups[0].groupID).first)
        var damaged = target.payload
        damaged[damaged.count - 1] ^= 1
        try PostgresConnection(try testDatabase()).execute(
            "UPDATE lockbox_sync_items SET payload = $3 WHERE group_id = $1 AND item_id = $2",
            [.text(groups[0].groupID), .text(target.id), .bytes(damaged)])
        try SyncCLI.configure(machines[0], group: groups[0].groupID, database: try testDatabase())
        let removal = try SyncCLI.run(machines[0], ["sync", "remove-device", groups[1].deviceID])
        #expect(removal.status == 1, "\(removal.standardError)")
        #expect(removal.standardError.contains("Nothing was removed") && removal.standardError.contains("--replace-group"), "\(removal.standardError)")
        #expect(try groups[0].devices().contains { $0.id == groups[1].deviceID })
    }

    @Test("A join whose first sync fails says it joined and as which device, that no join again is needed, and speaks of a used-up pairing code only when one was used")
    func joinWhoseFirstSyncFails() throws {
        let database = try testDatabase()
        let first = try Machine()
        let passphrase = "a group passphrase of some words"
        let group = try SyncGroup.create(vault: first.vault, database: database, passphrase: SecretBytes(utf8: passphrase))
        try first.add("join.example", "user", "joined value")
        try group.sync()
        // The administrator damages the one record: a new device's first pull refuses it.
        let target = try #require(try storedRecords(group.groupID).first)
        var damaged = target.payload
        damaged[damaged.count - 1] ^= 1
        let connection = try PostgresConnection(database)
        try connection.execute(
            "UPDATE lockbox_sync_items SET payload = $3 WHERE group_id = $1 AND item_id = $2",
            [.text(group.groupID), .text(target.id), .bytes(damaged)])

        let withPassphrase = try Machine()
        let joined = try SyncCLI.run(
            withPassphrase, ["sync", "join", group.groupID, "--database", database, "--passphrase-stdin"], input: passphrase + "\n")
        #expect(joined.status != 0 && joined.status != 44, "\(joined.standardError)")
        #expect(joined.standardError.contains("Joined as device") && joined.standardError.contains("no need to join again"), "\(joined.standardError)")
        #expect(!joined.standardError.contains("pairing code"), "a passphrase join spoke of a pairing code: \(joined.standardError)")
        #expect(!joined.standardError.contains(passphrase) && !joined.standardOutput.contains(passphrase))
        // It is a device of the group, and its configuration was saved: `sync now` fails as
        // the first sync did, not as a keychain in no group.
        let devices = try group.devices().map(\.id)
        #expect(devices.count == 2)
        #expect(try String(contentsOfFile: withPassphrase.vault.path + ".sync/config", encoding: .utf8).contains(group.groupID))

        let withCode = try Machine()
        let code = try group.pairingCode()
        let joinedWithCode = try SyncCLI.run(withCode, ["sync", "join", group.groupID, "--database", database], input: code + "\n")
        #expect(joinedWithCode.status != 0 && joinedWithCode.status != 44, "\(joinedWithCode.standardError)")
        #expect(
            joinedWithCode.standardError.contains("Joined as device") && joinedWithCode.standardError.contains("the pairing code is used up"),
            "\(joinedWithCode.standardError)")
        #expect(!joinedWithCode.standardError.contains(code))
        // Once the record is put back, both devices sync without joining again.
        try connection.execute(
            "UPDATE lockbox_sync_items SET payload = $3 WHERE group_id = $1 AND item_id = $2",
            [.text(group.groupID), .text(target.id), .bytes(target.payload)])
        for machine in [withPassphrase, withCode] {
            let synced = try SyncCLI.run(machine, ["sync", "now"])
            #expect(synced.status == 0, "\(synced.standardError)")
            #expect(try machine.value("join.example", "user") == "joined value")
        }
    }

    @Test("A pairing code with a letter no code holds is refused before it is used, and the right one then joins; remove-device takes a device identifier in upper case")
    func mistypedCodeAndUpperCaseDevice() throws {
        let database = try testDatabase()
        let first = try Machine()
        let group = try SyncGroup.create(vault: first.vault, database: database)
        let code = try group.pairingCode()
        let second = try Machine()
        // The same code with its first character replaced by U, which no code holds.
        let mistyped = "U" + code.dropFirst()
        let refused = #expect(throws: LockboxError.self) { try SyncGroup.join(group.groupID, vault: second.vault, database: database, pairingCode: mistyped) }
        #expect(refused?.code == .param)
        #expect(refused?.message.contains("it was not used") == true)
        let joined = try SyncGroup.join(group.groupID, vault: second.vault, database: database, pairingCode: code)
        try SyncCLI.configure(first, group: group.groupID, database: database)
        let removed = try SyncCLI.run(first, ["sync", "remove-device", joined.deviceID.uppercased()])
        #expect(removed.status == 0, "\(removed.standardError)")
        #expect(try !group.devices().contains { $0.id == joined.deviceID })
    }
}
