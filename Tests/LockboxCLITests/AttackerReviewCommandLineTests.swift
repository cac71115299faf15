import Foundation
import Lockbox
import LockboxTestSupport
import Testing

/// The attacker review's findings through the programs users run: the file attacker edits the
/// keychain with the sqlite3 command-line tool between two `lockbox` calls.
@Suite("Attacker review: lockbox against an edited keychain file", .serialized)
struct AttackerReviewCommandLineTests: EditedKeychainSuite {
    let binary = builtProduct("lockbox")
    let directory = TemporaryDirectory("lockbox-cli-review")
    var keychain: String { directory.file("keychains/r.lockbox") }
    let passphrase = "review passphrase"

    static let columns =
        "id, item_class, accessibility, access_group, synchronizable, device_id, access_control, primary_digest, "
        + "lookup_digest, name_digest, wrapped_key, metadata, secret, format, version, bucket"

    @Test(
        "an older copy of a row put back twice with sqlite3: find -w exits 1 with -26275 and does not print the older secret")
    func replayedRowTwice_findFailsClosed() throws {
        try prepared()
        defer { _ = try? lockbox(["lock", "--all"]) }
        // The attacker keeps the row as it is now...
        try sqlite("CREATE TABLE kept AS SELECT \(Self.columns) FROM items WHERE rowid = 1")
        #expect(try lockbox(["add-generic-password", "-U", "-s", "svcA", "-a", "alice"], input: "alice-rotated\n").status == 0)
        // ...and later puts it back twice, in a table without the UNIQUE constraints.
        try sqlite(
            """
            CREATE TABLE loose (
                rowid INTEGER PRIMARY KEY, id BLOB, item_class TEXT, accessibility TEXT, access_group TEXT,
                synchronizable INTEGER, device_id TEXT, access_control TEXT, primary_digest BLOB, lookup_digest BLOB,
                name_digest BLOB, wrapped_key BLOB, metadata BLOB, secret BLOB, format INTEGER, version INTEGER, bucket INTEGER);
            INSERT INTO loose (rowid, \(Self.columns)) SELECT rowid, \(Self.columns) FROM items;
            INSERT INTO loose (rowid, \(Self.columns)) SELECT -1, \(Self.columns) FROM kept;
            INSERT INTO loose (rowid, \(Self.columns)) SELECT 0, \(Self.columns) FROM kept;
            DROP TABLE items; DROP TABLE kept;
            ALTER TABLE loose RENAME TO items;
            CREATE INDEX items_by_lookup ON items(lookup_digest);
            """)
        let find = try lockbox(["find-generic-password", "-s", "svcA", "-a", "alice", "-w"])
        #expect(!find.standardOutput.contains("alice-canary-1"), "the consumed value came back")
        #expect(find.status == 1)
        #expect(find.standardError.contains("(OSStatus -26275)"))
        #expect(try lockbox(["verify"]).status == 1)
    }

    @Test("the wrapped class keys deleted with sqlite3 from an unlocked keychain: -26275, never 'locked'")
    func classKeysDeleted_isTamperingNotLocked() throws {
        try prepared()
        defer { _ = try? lockbox(["lock", "--all"]) }
        try sqlite("DELETE FROM class_keys")
        let find = try lockbox(["find-generic-password", "-s", "svcA", "-a", "alice", "-w"])
        #expect(find.status == 1, "find ended with \(find.status): \(find.standardError)")
        #expect(find.standardError.contains("(OSStatus -26275)"), "\(find.standardError)")
        #expect(!find.standardError.contains("The keychain is locked"), "\(find.standardError)")
    }

    @Test("the schema version edited down with sqlite3: -26275 for a modified file, not a storage error, and the file is left as it is")
    func schemaVersionEdited_isTampering() throws {
        try prepared()
        defer { _ = try? lockbox(["lock", "--all"]) }
        for version in [0, 3, 5] {
            try sqlite("PRAGMA user_version = \(version)")
            let find = try lockbox(["find-generic-password", "-s", "svcA", "-a", "alice", "-w"])
            #expect(find.status == 1, "version \(version): \(find.standardError)")
            #expect(find.standardError.contains("schema version (\(version)) does not match its tables"), "\(find.standardError)")
            #expect(find.standardError.contains("(OSStatus -26275)"), "\(find.standardError)")
        }
    }

    @Test("the unlocked key the kernel keyring holds changed by another process of the user: the error names the keyring and the way to tell, not the file alone")
    func kernelKeyringKeyChanged_isNamed() throws {
        try prepared()
        defer { _ = try? lockbox(["lock", "--all"]) }
        let keyctl = "/usr/bin/keyctl"
        #expect(FileManager.default.isExecutableFile(atPath: keyctl), "keyctl (Debian's keyutils) is missing")
        let vaultID = try run("/usr/bin/sqlite3", [keychain, "SELECT lower(hex(value)) FROM header WHERE name = 'vault_id'"])
            .standardOutput.trimmingCharacters(in: .whitespacesAndNewlines)
        #expect(vaultID.count == 32, "no vault id in the header: \(vaultID)")
        let serial = try run(keyctl, ["search", "%:lockbox", "user", "lockbox:v1:\(vaultID):unlocked"]).standardOutput
            .trimmingCharacters(in: .whitespacesAndNewlines)
        #expect(!serial.isEmpty, "the unlocked key is not in the kernel keyring")
        let update = try run(keyctl, ["pupdate", serial], input: (0..<36).map { _ in UInt8.random(in: 0...255) })
        #expect(update.status == 0, "\(update.standardError)")
        let find = try lockbox(["find-generic-password", "-s", "svcA", "-a", "alice", "-w"])
        #expect(find.status == 1, "\(find.standardError)")
        #expect(find.standardError.contains("kernel keyring holds for it were changed"), "\(find.standardError)")
        #expect(find.standardError.contains("`lockbox lock --all`"), "\(find.standardError)")
        // Told apart as the error says: the file checks out once unlocked again.
        #expect(try lockbox(["lock", "--all"]).status == 0)
        #expect(try lockbox(["unlock", "--passphrase-stdin"], input: passphrase + "\n").status == 0)
        #expect(try lockbox(["verify"]).status == 0)
        #expect(try lockbox(["find-generic-password", "-s", "svcA", "-a", "alice", "-w"]).standardOutput == "alice-canary-1\n")
    }

    @Test(
        "a row hidden with sqlite3 (device_id edited): find exits 1 with -26275, not 44 (not found)")
    func hiddenRow_findFailsClosed() throws {
        try prepared()
        defer { _ = try? lockbox(["lock", "--all"]) }
        try sqlite("UPDATE items SET device_id = 'another-machine' WHERE rowid = 2")
        let find = try lockbox(["find-generic-password", "-s", "svcB", "-a", "bob", "-w"])
        #expect(find.status == 1, "find ended with \(find.status): \(find.standardError)")
        #expect(find.standardError.contains("(OSStatus -26275)"))
    }

    @Test("a row's synchronizable flag flipped with sqlite3: find exits 1 with -26275, and verify reports it")
    func flippedSynchronizable_findFailsClosed() throws {
        try prepared()
        defer { _ = try? lockbox(["lock", "--all"]) }
        try sqlite("UPDATE items SET synchronizable = 1 WHERE rowid = 2")
        let find = try lockbox(["find-generic-password", "-s", "svcB", "-a", "bob", "-w"])
        #expect(find.status == 1)
        #expect(find.standardError.contains("(OSStatus -26275)"))
        #expect(!find.standardOutput.contains("canary"))
        #expect(try lockbox(["verify"]).status == 1)
    }

    @Test(
        "an edited header: lock --all still takes the keys out of the kernel keyring (exit 0)")
    func tamperedHeader_lockAllStillLocks() throws {
        try prepared()
        try sqlite("UPDATE key_slots SET id = id + 100")
        let lock = try lockbox(["lock", "--all"])
        // Clean up whatever happens: put the slot back and lock.
        try sqlite("UPDATE key_slots SET id = id - 100")
        _ = try? lockbox(["lock", "--all"])
        #expect(lock.status == 0, "lock --all ended with \(lock.status): \(lock.standardError)")
    }

    @Test(
        "a failure counter set to Int.max with sqlite3: a wrong passphrase is refused (exit 1), lockbox does not crash",
        .timeLimit(.minutes(2)))
    func failureCounterAtMaximum_doesNotCrash() throws {
        try prepared()
        defer { _ = try? lockbox(["lock", "--all"]) }
        try sqlite("UPDATE unlock_attempts SET failures = 9223372036854775807")
        let unlock = try lockbox(["unlock", "--passphrase-stdin"], input: "a wrong guess\n")
        #expect(unlock.status == 1, "lockbox unlock ended with \(unlock.status): \(unlock.standardError)")
        #expect(unlock.standardError.contains("(OSStatus -25293)"))
    }
}
