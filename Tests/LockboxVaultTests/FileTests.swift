import Foundation
import Lockbox
import LockboxTestSupport
import Synchronization
import Testing
import VaultStorage

#if canImport(Glibc)
import Glibc
#endif

@Suite("The vault file: permissions, schema, secrets at rest, several processes")
struct FileTests {
    @Test("a new vault is 0600 in a 0700 directory")
    func newVault_isPrivate() throws {
        let fixture = try VaultFixture()
        let file = try FileManager.default.attributesOfItem(atPath: fixture.path)
        let directory = try FileManager.default.attributesOfItem(atPath: (fixture.path as NSString).deletingLastPathComponent)
        #expect((file[.posixPermissions] as? Int) == 0o600)
        #expect((directory[.posixPermissions] as? Int) == 0o700)
    }

    @Test("a vault readable by others is refused with the chmod that fixes it")
    func looseFilePermissions_areRefused() throws {
        let fixture = try VaultFixture()
        chmod(fixture.path, 0o644)
        do {
            _ = try Vault.open(at: fixture.path)
            Issue.record("a world-readable vault opened")
        } catch {
            #expect(error.message.contains("chmod 600"))
        }
        chmod(fixture.path, 0o600)
        let directory = (fixture.path as NSString).deletingLastPathComponent
        chmod(directory, 0o755)
        do {
            _ = try Vault.open(at: fixture.path)
            Issue.record("a vault in an open directory opened")
        } catch {
            #expect(error.message.contains("chmod 700"))
        }
        chmod(directory, 0o700)
        _ = try Vault.open(at: fixture.path)
    }

    @Test("a log or shared-memory file left read-only (made while the keychain was) is given mode 0600 once the keychain is writable, never while it is read-only")
    func readOnlyLogFiles_areGivenBackWriteAccess() throws {
        let fixture = try VaultFixture()
        func mode(_ path: String) -> Int? { (try? FileManager.default.attributesOfItem(atPath: path))?[.posixPermissions] as? Int }
        let logs = [fixture.path + "-wal", fixture.path + "-shm"]
        for log in logs {
            #expect(FileManager.default.fileExists(atPath: log))
            chmod(log, 0o400)
        }
        chmod(fixture.path, 0o400)
        let readOnly = try fixture.reopen()
        for log in logs { #expect(mode(log) == 0o400, "\(log) widened while the keychain is read-only") }
        withExtendedLifetime(readOnly) {}
        chmod(fixture.path, 0o600)
        let reopened = try fixture.reopen()
        for log in logs { #expect(mode(log) == 0o600, "\(log)") }
        try reopened.unlock(passphrase: fixture.passphrase)
        try reopened.add(Item.genericPassword(service: "after.example", account: "a", data: SecretBytes(utf8: "v")))
    }

    @Test("opening a missing vault is errSecNoSuchKeychain and names `lockbox init`")
    func missingVault_throwsNoSuchKeychain() throws {
        let directory = TemporaryDirectory()
        do {
            _ = try Vault.open(at: directory.file("absent.lockbox"))
            Issue.record("a missing vault opened")
        } catch {
            #expect(error.status == -25294)
            #expect(error.message.contains("lockbox init"))
        }
    }


    @Test("an I/O error names SQLite's extended code and the system's reason, which a report of it needs")
    func ioError_namesItsCodeAndReason() {
        let shortRead: Int32 = 10 | (2 << 8)  // SQLITE_IOERR_SHORT_READ
        let error = Database.error(code: shortRead, message: "disk I/O error", path: "/k/x.lockbox", operation: "sqlite3_step", systemError: EIO)
        #expect(error.status == -36)
        #expect(error.message.contains("SQLite code 522: Input/output error"), "\(error.message)")
        #expect(error.message.contains("that file was not changed"), "\(error.message)")
        #expect(error.sqliteExtendedCode == shortRead)
        let unknownReason = Database.error(code: shortRead, message: "disk I/O error", path: "/k/x.lockbox", operation: "sqlite3_step")
        #expect(unknownReason.message.contains("(I/O error, SQLite code 522)"), "\(unknownReason.message)")
    }
    @Test("creating over an existing vault is errSecDuplicateKeychain")
    func createOverExisting_throwsDuplicateKeychain() throws {
        let fixture = try VaultFixture()
        do {
            _ = try Vault.create(at: fixture.path, passphrase: SecretBytes(utf8: "x"))
            Issue.record("an existing vault was overwritten")
        } catch {
            #expect(error.status == -25296)
        }
    }

    @Test("a vault from a newer schema is refused, and the current one is recorded")
    func newerSchema_isRefused() throws {
        let fixture = try VaultFixture()
        #expect(try fixture.vault.withDatabase { database throws(LockboxError) in try database.userVersion } == 7)
        // From schema 6: synchronizable rows' deletions are recorded with their time.
        let tables = try fixture.vault.withDatabase { database throws(LockboxError) -> Bool in
            try database.firstRow("SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = 'sync_deletions'") { $0.integer(0) } == 1
        }
        #expect(tables)
        // From schema 4: the identifier is the items' only UNIQUE index (primary keys are checked
        // through the lookup index); the indexes queries use are all there.
        let indexes = try fixture.vault.withDatabase { database throws(LockboxError) -> [String] in
            let statement = try database.statement(
                "SELECT group_concat(ii.name) || ':' || il.\"unique\" FROM pragma_index_list('items') il, pragma_index_info(il.name) ii GROUP BY il.name ORDER BY 1")
            var found: [String] = []
            while try statement.step() { found.append(statement.text(0) ?? "") }
            return found
        }
        #expect(indexes == ["id:1", "lookup_digest:0", "name_digest:0", "version:0"])
        try fixture.vault.withDatabase { database throws(LockboxError) in try database.execute("PRAGMA user_version = 99") }
        do {
            _ = try Vault.open(at: fixture.path)
            Issue.record("a newer schema opened")
        } catch {
            #expect(error.message.contains("newer"))
        }
    }

    @Test("the vault is opened with WAL, synchronous FULL and secure_delete")
    func pragmas_areDurableAndSecure() throws {
        let fixture = try VaultFixture()
        let values = try fixture.vault.withDatabase { database throws(LockboxError) -> [String] in
            var values: [String] = []
            for pragma in ["journal_mode", "synchronous", "secure_delete"] {
                let statement = try database.statement("PRAGMA \(pragma)")
                _ = try statement.step()
                values.append(statement.text(0) ?? "")
            }
            return values
        }
        #expect(values == ["wal", "2", "1"])
    }

    @Test("a canary secret and its attributes never appear in the vault file or its WAL")
    func canary_neverAppearsAtRest() throws {
        let fixture = try VaultFixture()
        let canary = makeCanary()
        let service = makeCanary("service")
        try fixture.vault.add(.genericPassword(service: service, account: "alice", data: SecretBytes(utf8: canary)))
        try fixture.vault.update(matching: .genericPassword(service: service, account: "alice"), to: ItemUpdate(data: SecretBytes(utf8: canary + "-2")))
        let directory = (fixture.path as NSString).deletingLastPathComponent
        #expect(filesContaining(canary, in: directory).isEmpty)
        #expect(filesContaining(service, in: directory).isEmpty)
        try fixture.vault.delete(matching: .genericPassword(service: service, account: "alice"))
        try fixture.vault.withDatabase { database throws(LockboxError) in try database.execute("PRAGMA wal_checkpoint(TRUNCATE)") }
        #expect(filesContaining(canary, in: directory).isEmpty)
        #expect(filesContaining(service, in: directory).isEmpty)
    }

    @Test("4 processes x 500 writes lose nothing and corrupt nothing")
    func concurrentWriterProcesses_loseNothing() throws {
        let fixture = try VaultFixture()
        let writer = builtProduct("lockbox-stress")
        #expect(FileManager.default.isExecutableFile(atPath: writer), "lockbox-stress is not built at \(writer)")
        let perProcess = 500
        let results = Mutex<[ProcessResult?]>([nil, nil, nil, nil])
        DispatchQueue.concurrentPerform(iterations: 4) { index in
            let result = try? run(writer, ["write", "--keychain", fixture.path, "--prefix", "p\(index)", "--count", "\(perProcess)"])
            results.withLock { $0[index] = result }
        }
        for (index, result) in results.withLock({ $0 }).enumerated() {
            let result = try #require(result, "writer \(index) did not run")
            #expect(result.status == 0, "writer \(index): \(result.standardError)")
            #expect(result.standardOutput.split(separator: "\n").count == perProcess)
        }
        var all = Query(.genericPassword, limit: .all, returning: [.data, .attributes])
        all.attributes.service = "stress"
        let items = try fixture.vault.items(matching: all)
        #expect(items.count == 4 * perProcess)
        for item in items {
            let account = try #require(item.attributes.account)
            #expect(item.data == SecretBytes(utf8: "value-\(account)"))
        }
        #expect(try fixture.vault.withDatabase { database throws(LockboxError) in try database.integrityCheck() } == "ok")
        let counter = try fixture.vault.data(matching: .genericPassword(service: "stress-shared", account: "counter"))
        #expect(counter.count > 0)
    }
}
