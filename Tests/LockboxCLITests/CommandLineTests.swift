import Foundation
import Lockbox
import LockboxTestSupport
import Testing

/// End-to-end: the built `lockbox` binary, its stdout, stderr and exit status.
@Suite("lockbox command line, end to end")
struct CommandLineTests {
    let binary = builtProduct("lockbox")
    let directory = TemporaryDirectory("lockbox-cli")
    var keychain: String { directory.file("keychains/cli.lockbox") }
    static let passphrase = Array("cli passphrase\n".utf8)

    func lockbox(_ arguments: [String], input: String = "", environment: [String: String]? = nil) throws -> ProcessResult {
        #expect(FileManager.default.isExecutableFile(atPath: binary), "the lockbox binary is not built at \(binary)")
        return try run(binary, arguments, input: Array(input.utf8), environment: environment)
    }

    func initialized() throws -> CommandLineTests {
        let result = try run(binary, ["--keychain", keychain, "init", "--passphrase-stdin", "--kdf", "interactive"], input: Self.passphrase)
        #expect(result.status == 0, "init failed: \(result.standardError)")
        return self
    }

    func cleanUp() throws {
        _ = try lockbox(["--keychain", keychain, "lock", "--all"])
    }

    @Test("the scripted forms work as written: init, add, find -w, delete, lock, unlock")
    func scriptedForms_workAsWritten() throws {
        let cli = try initialized()
        defer { try? cli.cleanUp() }
        let add = try lockbox(["--keychain", keychain, "add-generic-password", "-s", "SERVICE", "-a", "ACCOUNT"], input: "s3cret\n")
        #expect(add.status == 0)
        #expect(add.standardOutput.isEmpty && add.standardError.isEmpty)

        let find = try lockbox(["--keychain", keychain, "find-generic-password", "-s", "SERVICE", "-a", "ACCOUNT", "-w"])
        #expect(find.status == 0)
        #expect(find.standardOutput == "s3cret\n")
        #expect(find.standardError.isEmpty)

        #expect(try lockbox(["--keychain", keychain, "lock"]).status == 0)
        let locked = try lockbox(["--keychain", keychain, "find-generic-password", "-s", "SERVICE", "-a", "ACCOUNT", "-w"])
        #expect(locked.status == 1)
        #expect(locked.standardOutput.isEmpty)
        #expect(locked.standardError.contains("(OSStatus -25308)"))

        let unlock = try run(binary, ["--keychain", keychain, "unlock", "--passphrase-stdin"], input: Self.passphrase)
        #expect(unlock.status == 0, "unlock: \(unlock.standardError)")
        #expect(try lockbox(["--keychain", keychain, "find-generic-password", "-s", "SERVICE", "-a", "ACCOUNT", "-w"]).standardOutput == "s3cret\n")

        let delete = try lockbox(["--keychain", keychain, "delete-generic-password", "-s", "SERVICE", "-a", "ACCOUNT"])
        #expect(delete.status == 0)
        let gone = try lockbox(["--keychain", keychain, "find-generic-password", "-s", "SERVICE", "-a", "ACCOUNT", "-w"])
        #expect(gone.status == 44)
        #expect(gone.standardError.contains("(OSStatus -25300)"))
    }

    @Test("a wrong passphrase exits 1 with errSecAuthFailed")
    func wrongPassphrase_exitsWithAuthFailed() throws {
        let cli = try initialized()
        defer { try? cli.cleanUp() }
        _ = try lockbox(["--keychain", keychain, "lock"])
        let result = try lockbox(["--keychain", keychain, "unlock", "--passphrase-stdin"], input: "not it\n")
        #expect(result.status == 1)
        #expect(result.standardError.contains("(OSStatus -25293)"))
    }

    @Test("unlock without a terminal or --passphrase-stdin names the way to pass it")
    func unlockWithoutPassphraseSource_namesTheOption() throws {
        let cli = try initialized()
        defer { try? cli.cleanUp() }
        let result = try lockbox(["--keychain", keychain, "unlock"])
        #expect(result.status == 1)
        #expect(result.standardError.contains("--passphrase-stdin"))
    }

    @Test("a secret on the command line is refused with usage status 64")
    func secretInArguments_isRefused() throws {
        let cli = try initialized()
        defer { try? cli.cleanUp() }
        let result = try lockbox(["--keychain", keychain, "add-generic-password", "-s", "S", "-a", "A", "-w", "hunter2"])
        #expect(result.status == 64)
        #expect(result.standardError.contains("never taken from the command line"))
        #expect(try lockbox(["--keychain", keychain, "find-generic-password", "-s", "S", "-a", "A"]).status == 44)
    }

    @Test("usage errors exit 64 and every verb has --help", arguments: [
        "init", "unlock", "lock", "status", "change-passphrase", "add-generic-password", "find-generic-password",
        "delete-generic-password", "add-internet-password", "find-internet-password", "delete-internet-password", "dump",
    ])
    func help_existsForEveryVerb(verb: String) throws {
        let help = try lockbox([verb, "--help"])
        #expect(help.status == 0)
        #expect(help.standardOutput.contains("usage: lockbox"))
        #expect(help.standardOutput.contains(verb))
        let bad = try lockbox([verb, "--no-such-option"])
        #expect(bad.status == 64)
    }

    @Test("an unknown command exits 64")
    func unknownCommand_exits64() throws {
        #expect(try lockbox(["frobnicate"]).status == 64)
        #expect(try lockbox([]).status == 64)
        #expect(try lockbox(["--help"]).status == 0)
    }

    @Test("LOCKBOX_KEYCHAIN chooses the vault when --keychain is absent")
    func environmentVariable_choosesVault() throws {
        let cli = try initialized()
        defer { try? cli.cleanUp() }
        var environment = ProcessInfo.processInfo.environment
        environment["LOCKBOX_KEYCHAIN"] = keychain
        _ = try lockbox(["add-generic-password", "-s", "env", "-a", "a"], input: "from-env", environment: environment)
        #expect(try lockbox(["--keychain", keychain, "find-generic-password", "-s", "env", "-a", "a", "-w"]).standardOutput == "from-env\n")
    }

    @Test("the default vault follows XDG_DATA_HOME")
    func defaultVault_followsXDG() throws {
        var environment = ProcessInfo.processInfo.environment
        environment["LOCKBOX_KEYCHAIN"] = nil
        environment["XDG_DATA_HOME"] = directory.file("xdg-data")
        let result = try run(binary, ["init", "--passphrase-stdin", "--kdf", "interactive"], input: Self.passphrase, environment: environment)
        #expect(result.status == 0, "\(result.standardError)")
        #expect(FileManager.default.fileExists(atPath: directory.file("xdg-data/lockbox/default.lockbox")))
        _ = try run(binary, ["lock", "--all"], environment: environment)
    }

    @Test("-U updates an existing item instead of failing with a duplicate")
    func updateFlag_replacesExistingItem() throws {
        let cli = try initialized()
        defer { try? cli.cleanUp() }
        _ = try lockbox(["--keychain", keychain, "add-generic-password", "-s", "S", "-a", "A"], input: "one")
        let duplicate = try lockbox(["--keychain", keychain, "add-generic-password", "-s", "S", "-a", "A"], input: "two")
        #expect(duplicate.status == 1)
        #expect(duplicate.standardError.contains("(OSStatus -25299)"))
        #expect(try lockbox(["--keychain", keychain, "add-generic-password", "-s", "S", "-a", "A", "-U"], input: "two").status == 0)
        #expect(try lockbox(["--keychain", keychain, "find-generic-password", "-s", "S", "-a", "A", "-w"]).standardOutput == "two\n")
    }

    @Test("--synchronizable adds an item sync carries, beside a local one of the same name; find, -U and delete with it touch only that one")
    func synchronizableFlag_addsFindsUpdatesAndDeletesTheSyncedItem() throws {
        let cli = try initialized()
        defer { try? cli.cleanUp() }
        let name = ["-s", "S", "-a", "A"]
        func run(_ verb: String, _ arguments: [String], input: String = "") throws -> ProcessResult {
            try lockbox(["--keychain", keychain, verb] + arguments, input: input)
        }
        #expect(try run("add-generic-password", name + ["--synchronizable"], input: "synced").status == 0)
        // The sync flag is part of the primary key: a local item of the same name is another item.
        #expect(try run("add-generic-password", name, input: "local").status == 0)
        #expect(try run("add-generic-password", name + ["--synchronizable"], input: "again").standardError.contains("-25299"))
        #expect(try run("add-generic-password", name + ["--synchronizable", "-U"], input: "synced-2").status == 0)
        #expect(try run("find-generic-password", name + ["--synchronizable", "-w"]).standardOutput == "synced-2\n")
        let json = try run("find-generic-password", name + ["--synchronizable", "--json"]).standardOutput
        #expect(json.contains("\"synchronizable\" : true"))
        let deleted = try run("delete-generic-password", name + ["--synchronizable"])
        #expect(deleted.status == 0 && deleted.standardError.contains("Deleted 1 item."))
        #expect(try run("find-generic-password", name + ["-w"]).standardOutput == "local\n")
        #expect(try run("find-generic-password", name + ["--synchronizable", "-w"]).status == 44)
    }

    @Test("internet passwords add, find and delete by server, protocol and port")
    func internetPasswords_roundTrip() throws {
        let cli = try initialized()
        defer { try? cli.cleanUp() }
        let key = ["-s", "git.example.com", "-a", "alice", "-r", "https", "-P", "443"]
        #expect(try lockbox(["--keychain", keychain, "add-internet-password"] + key + ["-p", "/repo"], input: "tok").status == 0)
        #expect(try lockbox(["--keychain", keychain, "find-internet-password", "-s", "git.example.com", "-w"]).standardOutput == "tok\n")
        let attributes = try lockbox(["--keychain", keychain, "find-internet-password", "-s", "git.example.com", "--json"])
        #expect(attributes.standardOutput.contains("\"protocol\" : \"htps\""))
        #expect(try lockbox(["--keychain", keychain, "delete-internet-password"] + key).status == 0)
        #expect(try lockbox(["--keychain", keychain, "find-internet-password", "-s", "git.example.com"]).status == 44)
    }

    @Test("status reports lock state, readable classes and the backend's reason")
    func status_reportsLockState() throws {
        let cli = try initialized()
        defer { try? cli.cleanUp() }
        let unlocked = try lockbox(["--keychain", keychain, "status"])
        #expect(unlocked.standardOutput.contains("state: unlocked"))
        #expect(unlocked.standardOutput.contains("backend: vault"))
        _ = try lockbox(["--keychain", keychain, "lock"])
        let locked = try lockbox(["--keychain", keychain, "status", "--json"])
        let json = try JSONSerialization.jsonObject(with: Data(locked.standardOutput.utf8)) as? [String: Any]
        let vault = json?["vault"] as? [String: Any]
        #expect(vault?["isUnlocked"] as? Bool == false)
        #expect((vault?["readableClasses"] as? [String])?.contains("afterFirstUnlock") == true)
        #expect((vault?["readableClasses"] as? [String])?.contains("whenUnlocked") == false)
    }

    @Test("change-passphrase reads old and new from stdin")
    func changePassphrase_fromStandardInput() throws {
        let cli = try initialized()
        defer { try? cli.cleanUp() }
        let change = try lockbox(["--keychain", keychain, "change-passphrase", "--passphrase-stdin"], input: "cli passphrase\nnew passphrase\n")
        #expect(change.status == 0, "\(change.standardError)")
        _ = try lockbox(["--keychain", keychain, "lock"])
        #expect(try lockbox(["--keychain", keychain, "unlock", "--passphrase-stdin"], input: "cli passphrase\n").status == 1)
        #expect(try lockbox(["--keychain", keychain, "unlock", "--passphrase-stdin"], input: "new passphrase\n").status == 0)
    }

    @Test("a canary secret appears in no output, error or file except find -w")
    func canary_appearsNowhereButFindW() throws {
        let cli = try initialized()
        defer { try? cli.cleanUp() }
        let canary = makeCanary()
        var outputs: [ProcessResult] = []
        outputs.append(try lockbox(["--keychain", keychain, "add-generic-password", "-s", "canary", "-a", "a", "-l", "label"], input: canary))
        outputs.append(try lockbox(["--keychain", keychain, "add-generic-password", "-s", "canary", "-a", "a"], input: canary))
        outputs.append(try lockbox(["--keychain", keychain, "find-generic-password", "-s", "canary", "-a", "a"]))
        outputs.append(try lockbox(["--keychain", keychain, "find-generic-password", "-s", "canary", "-a", "a", "--json"]))
        outputs.append(try lockbox(["--keychain", keychain, "dump"]))
        outputs.append(try lockbox(["--keychain", keychain, "dump", "--json"]))
        outputs.append(try lockbox(["--keychain", keychain, "status", "--json"]))
        outputs.append(try lockbox(["--keychain", keychain, "add-generic-password", "-s", "canary", "-a", "a", "-w", canary]))
        _ = try lockbox(["--keychain", keychain, "lock"])
        outputs.append(try lockbox(["--keychain", keychain, "find-generic-password", "-s", "canary", "-a", "a", "-w"]))
        for output in outputs {
            #expect(!output.standardOutput.contains(canary))
            #expect(!output.standardError.contains(canary))
        }
        #expect(outputs[4].standardOutput.contains("canary"), "dump lists the item's attributes")
        #expect(filesContaining(canary, in: directory.path).isEmpty)
    }

    @Test("dump --json lists attributes as JSON and never data")
    func dumpJSON_listsAttributes() throws {
        let cli = try initialized()
        defer { try? cli.cleanUp() }
        _ = try lockbox(["--keychain", keychain, "add-generic-password", "-s", "one", "-a", "a"], input: "x")
        _ = try lockbox(["--keychain", keychain, "add-internet-password", "-s", "two.example", "-a", "b"], input: "y")
        let dump = try lockbox(["--keychain", keychain, "dump", "--json"])
        let items = try JSONSerialization.jsonObject(with: Data(dump.standardOutput.utf8)) as? [[String: Any]]
        #expect(items?.count == 2)
        #expect(items?.contains { $0["service"] as? String == "one" } == true)
        #expect(items?.allSatisfy { $0["data"] == nil } == true)
    }

    @Test("accessibility, access control and access groups are set from the command line")
    func protectionOptions_workAsWritten() throws {
        let cli = try initialized()
        defer { try? cli.cleanUp() }
        let add = try lockbox(
            ["--keychain", keychain, "add-generic-password", "-s", "svc", "-a", "bg", "--accessibility", "afterFirstUnlockThisDeviceOnly",
             "--access-group", "team.shared"], input: "background")
        #expect(add.status == 0, "\(add.standardError)")
        _ = try lockbox(["--keychain", keychain, "add-generic-password", "-s", "svc", "-a", "fg"], input: "foreground")
        _ = try lockbox(["--keychain", keychain, "lock"])
        // afterFirstUnlock survives the lock; whenUnlocked does not.
        #expect(try lockbox(["--keychain", keychain, "find-generic-password", "-s", "svc", "-a", "bg", "-w"]).standardOutput == "background\n")
        #expect(try lockbox(["--keychain", keychain, "find-generic-password", "-s", "svc", "-a", "fg", "-w"]).status == 1)
        let json = try lockbox(["--keychain", keychain, "find-generic-password", "-s", "svc", "-a", "bg", "--json"])
        #expect(json.standardOutput.contains("\"accessGroup\" : \"team.shared\""))
        #expect(json.standardOutput.contains("afterFirstUnlockThisDeviceOnly"))
        let bad = try lockbox(["--keychain", keychain, "add-generic-password", "-s", "svc", "-a", "x", "--accessibility", "sometimes"], input: "x")
        #expect(bad.status == 64)

        _ = try run(binary, ["--keychain", keychain, "unlock", "--passphrase-stdin"], input: Self.passphrase)
        let controlled = try lockbox(
            ["--keychain", keychain, "add-generic-password", "-s", "bank", "-a", "alice", "--access-control", "userPresence"], input: "pin")
        #expect(controlled.status == 0, "\(controlled.standardError)")
        // No terminal to ask for the passphrase on: the value is not released.
        let read = try lockbox(["--keychain", keychain, "find-generic-password", "-s", "bank", "-a", "alice", "-w"])
        #expect(read.status == 1)
        #expect(read.standardError.contains("(OSStatus -25308)"))
        #expect(read.standardOutput.isEmpty)
        // Its attributes, and so its existence, are still visible.
        #expect(try lockbox(["--keychain", keychain, "find-generic-password", "-s", "bank", "-a", "alice"]).status == 0)
    }

    @Test("backup and restore with the backup passphrase on stdin")
    func backupAndRestore_fromStandardInput() throws {
        let cli = try initialized()
        defer { try? cli.cleanUp() }
        _ = try lockbox(["--keychain", keychain, "add-generic-password", "-s", "svc", "-a", "portable"], input: "p-value")
        _ = try lockbox(
            ["--keychain", keychain, "add-generic-password", "-s", "svc", "-a", "bound", "--accessibility", "whenUnlockedThisDeviceOnly"],
            input: "b-value")
        let file = directory.file("backup.lbx")
        let backup = try lockbox(["--keychain", keychain, "backup", file, "--passphrase-stdin"], input: "backup words\n")
        #expect(backup.status == 0, "\(backup.standardError)")
        #expect(backup.standardError.contains("Backed up 1 item"))
        _ = try lockbox(["--keychain", keychain, "delete-generic-password", "-s", "svc", "-a", "portable"])
        let wrong = try lockbox(["--keychain", keychain, "restore", file, "--passphrase-stdin"], input: "other words\n")
        #expect(wrong.status == 1)
        #expect(wrong.standardError.contains("(OSStatus -25293)"))
        let restore = try lockbox(["--keychain", keychain, "restore", file, "--passphrase-stdin"], input: "backup words\n")
        #expect(restore.status == 0, "\(restore.standardError)")
        #expect(restore.standardError.contains("1 added"))
        #expect(try lockbox(["--keychain", keychain, "find-generic-password", "-s", "svc", "-a", "portable", "-w"]).standardOutput == "p-value\n")
        #expect(filesContaining("p-value", in: directory.path).isEmpty)
    }

    @Test("remove-passphrase: the keychain unlocks without one on this machine; set-passphrase restores it")
    func removeAndSetPassphrase() throws {
        var environment = ProcessInfo.processInfo.environment
        environment["XDG_STATE_HOME"] = directory.file("state")
        let result = try run(binary, ["--keychain", keychain, "init", "--passphrase-stdin", "--kdf", "interactive"], input: Self.passphrase, environment: environment)
        #expect(result.status == 0)
        defer { _ = try? run(binary, ["--keychain", keychain, "lock", "--all"], environment: environment) }
        _ = try run(binary, ["--keychain", keychain, "add-generic-password", "-s", "p", "-a", "a", "--accessibility", "whenPasscodeSetThisDeviceOnly"], input: Array("x".utf8), environment: environment)
        let removed = try run(binary, ["--keychain", keychain, "remove-passphrase", "--passphrase-stdin", "--yes"], input: Self.passphrase, environment: environment)
        #expect(removed.status == 0, "\(removed.standardError)")
        #expect(removed.standardError.contains("1 whenPasscodeSetThisDeviceOnly"))
        _ = try run(binary, ["--keychain", keychain, "lock"], environment: environment)
        #expect(try run(binary, ["--keychain", keychain, "unlock"], environment: environment).status == 0)
        #expect(try run(binary, ["--keychain", keychain, "status"], environment: environment).standardOutput.contains("passphrase: none"))
        let set = try run(binary, ["--keychain", keychain, "set-passphrase", "--passphrase-stdin"], input: Array("again\n".utf8), environment: environment)
        #expect(set.status == 0, "\(set.standardError)")
        _ = try run(binary, ["--keychain", keychain, "lock"], environment: environment)
        #expect(try run(binary, ["--keychain", keychain, "unlock", "--passphrase-stdin"], input: Array("again\n".utf8), environment: environment).status == 0)
    }
}
