import Foundation
import Lockbox
import LockboxTestSupport
import Testing
import VaultCrypto
import VaultStorage

@testable import LockboxVault

/// The attacker who can write the vault file (but holds neither the passphrase nor this
/// machine's device key): swaps, forges, replays, deletes and rolls back rows and whole files.
/// Every attack must end in a closed failure (`errSecDecode`), never in another item's value,
/// a forged value or an older one.
@Suite("Integrity: swapped, forged, replayed and rolled-back rows")
struct IntegrityAttackTests {
    static let columns = [
        "id", "item_class", "accessibility", "access_group", "synchronizable", "device_id", "access_control",
        "primary_digest", "lookup_digest", "name_digest", "wrapped_key", "metadata", "secret", "format", "version", "bucket",
    ]

    /// A vault with alice's and bob's items, and a raw connection for the edits.
    func makeVault() throws -> (VaultFixture, Database) {
        let fixture = try VaultFixture()
        try fixture.vault.add(.genericPassword(service: "svcA", account: "alice", data: SecretBytes(utf8: "alice-secret")))
        try fixture.vault.add(.genericPassword(service: "svcB", account: "bob", data: SecretBytes(utf8: "bob-secret")))
        return (fixture, try Database(path: fixture.path, create: false))
    }

    /// Every column of a row, as stored.
    func snapshot(_ database: Database, account rowID: Int) throws -> [String: [UInt8]?] {
        var values: [String: [UInt8]?] = [:]
        for column in Self.columns {
            let read = try database.statement("SELECT quote(\(column)) FROM items WHERE rowid = ?")
            read.bind(1, rowID)
            #expect(try read.step())
            values[column] = read.text(0).map { Array($0.utf8) }
            read.reset()
        }
        return values
    }

    /// Writes `values` (SQL literals from `quote()`) over the row.
    func restore(_ database: Database, rowID: Int, _ values: [String: [UInt8]?]) throws {
        let assignments = Self.columns.map { column in
            "\(column) = " + (values[column]!.map { String(decoding: $0, as: UTF8.self) } ?? "NULL")
        }
        try database.execute("UPDATE items SET \(assignments.joined(separator: ", ")) WHERE rowid = \(rowID)")
    }

    /// Swaps one column's values between rows 1 and 2 (through a temporary value, as the
    /// primary digest is unique).
    func swap(_ column: String, in database: Database) throws {
        try database.execute(
            """
            CREATE TEMP TABLE IF NOT EXISTS saved (rowid INTEGER PRIMARY KEY, value BLOB);
            DELETE FROM saved;
            INSERT INTO saved SELECT rowid, \(column) FROM items WHERE rowid IN (1, 2);
            UPDATE items SET \(column) = randomblob(32) WHERE rowid = 1;
            UPDATE items SET \(column) = (SELECT value FROM saved WHERE rowid = 1) WHERE rowid = 2;
            UPDATE items SET \(column) = (SELECT value FROM saved WHERE rowid = 2) WHERE rowid = 1;
            """)
    }

    /// The status of reading `service`/`account`, recording an issue when a value comes back
    /// that is not `expected`.
    func readStatus(_ vault: Vault, _ service: String, _ account: String, expected: String? = nil) -> Int32? {
        do {
            let value = try vault.data(matching: .genericPassword(service: service, account: account))
            if let expected {
                #expect(value == SecretBytes(utf8: expected))
            } else {
                Issue.record("a value came back after the attack")
            }
            return nil
        } catch {
            return error.status
        }
    }

    @Test("swapping the digest columns of two rows: both reads fail closed, neither gets the other's value",
          arguments: [["lookup_digest"], ["lookup_digest", "primary_digest"], ["lookup_digest", "primary_digest", "name_digest"]])
    func swappedDigests_failClosed(columns: [String]) throws {
        let (fixture, database) = try makeVault()
        for column in columns { try swap(column, in: database) }
        #expect(readStatus(fixture.vault, "svcA", "alice") == -26275)
        #expect(readStatus(fixture.vault, "svcB", "bob") == -26275)
    }

    @Test("the same swap seen from a new process: the CLI path gets errSecDecode, not bob's secret")
    func swappedDigests_reopenedHandle_failsClosed() throws {
        let (fixture, database) = try makeVault()
        try swap("lookup_digest", in: database)
        try swap("primary_digest", in: database)
        let reopened = try fixture.reopen()
        #expect(readStatus(reopened, "svcA", "alice") == -26275)
    }

    @Test("an older copy of a row put back (a consumed refresh token) is errSecDecode")
    func replayedRow_failsClosed() throws {
        let (fixture, database) = try makeVault()
        let old = try snapshot(database, account: 1)
        try fixture.vault.update(matching: .genericPassword(service: "svcA", account: "alice"), to: ItemUpdate(data: SecretBytes(utf8: "rotated")))
        try restore(database, rowID: 1, old)
        #expect(readStatus(fixture.vault, "svcA", "alice") == -26275)
        #expect(readStatus(try fixture.reopen(), "svcA", "alice") == -26275)
    }

    @Test("a row deleted outside Lockbox is errSecDecode for its name, not errSecItemNotFound")
    func deletedRow_failsClosed() throws {
        let (fixture, database) = try makeVault()
        try database.execute("DELETE FROM items WHERE rowid = 2")
        #expect(readStatus(try fixture.reopen(), "svcB", "bob") == -26275)
    }

    @Test("a copy of a row added as a new row is errSecDecode")
    func duplicatedRow_failsClosed() throws {
        let (fixture, database) = try makeVault()
        try database.execute(
            """
            INSERT INTO items (id, item_class, accessibility, access_group, synchronizable, device_id, access_control,
                               primary_digest, lookup_digest, name_digest, wrapped_key, metadata, secret, format, version, bucket)
            SELECT randomblob(16), item_class, accessibility, 'other', synchronizable, device_id, access_control,
                   randomblob(32), lookup_digest, name_digest, wrapped_key, metadata, secret, format, version, bucket
            FROM items WHERE rowid = 1
            """)
        #expect(readStatus(try fixture.reopen(), "svcA", "alice") == -26275)
    }

    @Test("a row sealed with a class key the attacker chose is never served, before or after the first unlock",
          arguments: [Accessibility.always, .alwaysThisDeviceOnly, .whenUnlocked])
    func forgedRow_isRefused(accessibility: Accessibility) throws {
        let (fixture, database) = try makeVault()
        try fixture.vault.add(.genericPassword(service: "svcC", account: "carol", data: SecretBytes(utf8: "carol"), accessibility: accessibility))
        // The version-1 weakness: a wrapping key computed from the vault's identity. The attacker
        // replaces the class key with one of their own and seals a value with it.
        let header = try VaultHeader.load(from: database)
        var identity = header.vaultID
        identity += [UInt8](repeating: 0, count: 32 - identity.count)
        let fromFile = Crypto.deriveKey(from: SecretBytes(copying: identity), context: "lbxalway", identifier: 1)
        let forgedClassKey = Crypto.generateKey()
        for id in header.wrappedClassKeys.keys where id.accessibility == accessibility {
            let wrapped = Crypto.seal(forgedClassKey, key: fromFile, associatedData: header.classKeyAssociatedData(id))
            let write = try database.statement("UPDATE class_keys SET wrapped_key = ? WHERE accessibility = ? AND device_id = ?")
            write.bind(1, wrapped)
            write.bind(2, id.accessibility.rawValue)
            write.bind(3, id.device)
            try write.run()
        }
        // Reseal carol's row with the forged class key (same columns, a value of their choice).
        let rows = try database.statement("SELECT \(SealedRow.columns()) FROM items WHERE rowid = 3")
        #expect(try rows.step())
        var row = try SealedRow.read(from: rows)
        rows.reset()
        let attributes = ItemAttributes(service: "svcC", account: "carol")
        row.sealContents(
            classKey: forgedClassKey, attributes: attributes, data: SecretBytes(utf8: "forged"),
            vaultID: header.vaultID, presencePublicKey: nil)
        let write = try database.statement("UPDATE items SET wrapped_key = ?, metadata = ?, secret = ? WHERE rowid = 3")
        write.bind(1, row.wrappedKey)
        write.bind(2, row.metadata)
        write.bind(3, row.secret)
        try write.run()

        fixture.vault.lockAll()
        // Before the first unlock (a new boot): the changed header fails at open or read.
        do {
            let rebooted = try fixture.reopen()
            #expect(readStatus(rebooted, "svcC", "carol") != nil)
            #expect(status { try rebooted.unlock(passphrase: fixture.passphrase) } == -26275)
        } catch let error as LockboxError {
            #expect(error.status == -26275)
        }
    }

    @Test("an older copy of the whole file put in place is errSecDecode until accepted on purpose")
    func rolledBackFile_isDetected() throws {
        let (fixture, _) = try makeVault()
        try fixture.vault.withDatabase { database throws(LockboxError) in database.truncateWriteAheadLog() }
        let copy = fixture.path + ".old"
        try FileManager.default.copyItem(atPath: fixture.path, toPath: copy)
        try fixture.vault.update(matching: .genericPassword(service: "svcA", account: "alice"), to: ItemUpdate(data: SecretBytes(utf8: "rotated")))
        // The attacker (or a careless restore) puts the old file back, WAL and all gone.
        try putBack(copy, at: fixture.path)
        var rolledBack: LockboxError?
        do {
            let reopened = try fixture.reopen()
            _ = try reopened.data(matching: .genericPassword(service: "svcA", account: "alice"))
        } catch let error as LockboxError {
            rolledBack = error
        }
        #expect(rolledBack?.status == -26275)
        #expect(rolledBack?.message.contains("older") == true)
        // Accepting it on purpose (after restoring a file backup) makes it readable again.
        let report = try Vault.verify(at: fixture.path, configuration: fixture.vault.configuration, acceptOlder: true)
        #expect(report.acceptedOlderGeneration)
        #expect(try fixture.reopen().data(matching: .genericPassword(service: "svcA", account: "alice")) == SecretBytes(utf8: "alice-secret"))
    }

    @Test("an older copy put in place is refused also by a process with another XDG_STATE_HOME that never saw the later writes, until accepted on purpose")
    func rolledBackFile_isDetectedInAnotherEnvironment() throws {
        let (fixture, _) = try makeVault()
        let query = Query.genericPassword(service: "svcA", account: "alice")
        let otherKey = fixture.directory.file("other-state/device-key")
        // The other environment unlocks and reads once: its own record holds the generation of
        // the copy.
        let other = try fixture.reopen { $0.device = DeviceIdentity(keyPath: otherKey) }
        try other.unlock(passphrase: fixture.passphrase)
        #expect(try other.data(matching: query) == SecretBytes(utf8: "alice-secret"))
        try fixture.vault.withDatabase { database throws(LockboxError) in database.truncateWriteAheadLog() }
        let copy = fixture.path + ".old"
        try FileManager.default.copyItem(atPath: fixture.path, toPath: copy)
        try fixture.vault.update(matching: query, to: ItemUpdate(data: SecretBytes(utf8: "rotated")))
        try putBack(copy, at: fixture.path)
        // Before, the other environment, whose state directory had seen nothing later, served
        // the older value; the kernel keyring's record is every environment's.
        let environments: [(inout Vault.Configuration) -> Void] = [{ $0.device = DeviceIdentity(keyPath: otherKey) }, { _ in }]
        for environment in environments {
            do {
                let value = try fixture.reopen(configure: environment).data(matching: query)
                Issue.record("an older copy was served: \(value == SecretBytes(utf8: "alice-secret") ? "the older value" : "a value")")
            } catch let error as LockboxError {
                #expect(error.status == -26275)
                #expect(error.message.contains("older"), "\(error.message)")
            }
        }
        // Accepted by a process that keeps its keys to itself: the keyring's record is set back
        // too, or every other process would go on refusing the file.
        var processOnly = fixture.vault.configuration
        processOnly.unlockCache = .processMemory
        let report = try Vault.verify(at: fixture.path, configuration: processOnly, acceptOlder: true)
        #expect(report.acceptedOlderGeneration)
        #expect(try fixture.reopen { $0.device = DeviceIdentity(keyPath: otherKey) }.data(matching: query) == SecretBytes(utf8: "alice-secret"))
        #expect(try fixture.reopen().data(matching: query) == SecretBytes(utf8: "alice-secret"))
    }

    @Test("an older copy from before a passphrase change, accepted on purpose while the later file's keys are unlocked, is locked to be unlocked with the copy's passphrase, never reported damaged")
    func olderCopyFromBeforeAPassphraseChange_isAcceptedAndLocked() throws {
        let fixture = try VaultFixture()
        var kept = Item.genericPassword(service: "svc", account: "afu", data: SecretBytes(utf8: "kept after first unlock"))
        kept.attributes.accessibility = .afterFirstUnlock
        try fixture.vault.add(kept)
        try fixture.vault.add(.genericPassword(service: "svc", account: "unlocked", data: SecretBytes(utf8: "kept while unlocked")))
        try fixture.vault.withDatabase { database throws(LockboxError) in database.truncateWriteAheadLog() }
        let copy = fixture.path + ".old"
        try FileManager.default.copyItem(atPath: fixture.path, toPath: copy)
        try fixture.vault.changePassphrase(from: fixture.passphrase, to: SecretBytes(utf8: "the later passphrase"))
        try putBack(copy, at: fixture.path)
        #expect(status { _ = try fixture.reopen().data(matching: .genericPassword(service: "svc", account: "afu")) } == -26275)
        let report = try Vault.verify(at: fixture.path, configuration: fixture.vault.configuration, acceptOlder: true)
        #expect(report.acceptedOlderGeneration, "\(report.problems)")
        #expect(report.lockedForTheCopysPassphrase == 2, "\(report)")
        // Locked, never damaged; the copy's passphrase opens it as it was.
        let reopened = try fixture.reopen()
        #expect(status { _ = try reopened.data(matching: .genericPassword(service: "svc", account: "afu")) } == -25308)
        #expect(status { try reopened.unlock(passphrase: SecretBytes(utf8: "the later passphrase")) } == -25293)
        try reopened.unlock(passphrase: fixture.passphrase)
        #expect(try reopened.data(matching: .genericPassword(service: "svc", account: "afu")) == SecretBytes(utf8: "kept after first unlock"))
        #expect(try reopened.data(matching: .genericPassword(service: "svc", account: "unlocked")) == SecretBytes(utf8: "kept while unlocked"))
        #expect(try Vault.verify(at: fixture.path, configuration: fixture.vault.configuration).isSound)
    }

    @Test("a lost write-ahead log (the file without its latest writes) is errSecDecode")
    func lostWriteAheadLog_isDetected() throws {
        let (fixture, _) = try makeVault()
        try fixture.vault.withDatabase { database throws(LockboxError) in database.truncateWriteAheadLog() }
        // A write that lives only in the WAL, then the file as it is on disk without it.
        let keepOpen = try Database(path: fixture.path, create: false)
        try fixture.vault.add(.genericPassword(service: "svcD", account: "dave", data: SecretBytes(utf8: "new")))
        let copy = fixture.path + ".without-wal"
        try FileManager.default.copyItem(atPath: fixture.path, toPath: copy)
        _ = keepOpen
        let directory = TemporaryDirectory("lockbox-wal")
        let moved = directory.file("v/test.lockbox")
        try FileManager.default.createDirectory(atPath: directory.file("v"), withIntermediateDirectories: true, attributes: [.posixPermissions: 0o700])
        try FileManager.default.copyItem(atPath: copy, toPath: moved)
        // Same vault at the same path: put the WAL-less copy in place.
        for suffix in ["-wal", "-shm"] { try? FileManager.default.removeItem(atPath: fixture.path + suffix) }
        try FileManager.default.removeItem(atPath: fixture.path)
        try FileManager.default.copyItem(atPath: moved, toPath: fixture.path)
        #expect(status { _ = try fixture.reopen().data(matching: .genericPassword(service: "svcA", account: "alice")) } == -26275)
    }

    @Test("the file shows a value's size class, not its length")
    func values_arePadded() throws {
        let fixture = try VaultFixture()
        try fixture.vault.add(.genericPassword(service: "s", account: "short", data: SecretBytes(utf8: "x")))
        try fixture.vault.add(.genericPassword(service: "s", account: "longer", data: SecretBytes(utf8: "exactly twenty bytes")))
        let sizes = try fixture.vault.withDatabase { database throws(LockboxError) in
            let statement = try database.statement("SELECT length(secret), length(metadata) FROM items ORDER BY rowid")
            var sizes: [[Int]] = []
            while try statement.step() { sizes.append([statement.integer(0)!, statement.integer(1)!]) }
            return sizes
        }
        #expect(sizes[0] == sizes[1])
        #expect(Padding.paddedSize(0) == 32 && Padding.paddedSize(28) == 32 && Padding.paddedSize(29) == 64)
        #expect(Padding.paddedSize(64 * 1024) == 68 * 1024)
        for length in [0, 1, 27, 28, 29, 4092, 4093, 65536] {
            let data = SecretBytes(copying: [UInt8](repeating: 0x0a, count: length))
            #expect(Padding.unpadded(Padding.padded(data)) == data)
        }
        // Garbage padding is refused, not trimmed.
        var bad = [UInt8](repeating: 0, count: 32)
        bad[0] = 3
        bad[20] = 1
        #expect(Padding.unpadded(bad) == nil)
    }

    @Test("every passphrase check counts against one throttle, and editing the counter does not reset it")
    func passphraseChecks_shareOneThrottle() throws {
        let fixture = try VaultFixture()
        let wrong = SecretBytes(utf8: "guess")
        #expect(status { try fixture.vault.changePassphrase(from: wrong, to: SecretBytes(utf8: "n")) } == -25293)
        #expect(status { try fixture.vault.removePassphrase(wrong) } == -25293)
        #expect(try fixture.vault.status().failedUnlockAttempts == 2)
        // Deleting or editing the counter in the file is tampering: the longest delay applies.
        try fixture.vault.withDatabase { database throws(LockboxError) in try database.execute("DELETE FROM unlock_attempts") }
        #expect(try fixture.vault.status().failedUnlockAttempts >= Vault.tamperedFailureCount)
        try fixture.vault.withDatabase { database throws(LockboxError) in
            try database.execute("INSERT INTO unlock_attempts (id, failures, last_failure, mac) VALUES (1, 0, 0, zeroblob(32))")
        }
        #expect(try fixture.vault.status().failedUnlockAttempts >= Vault.tamperedFailureCount)
    }

    @Test("a user-verification prompt answered wrongly counts as a failed attempt")
    func presencePrompt_isThrottled() throws {
        let fixture = try VaultFixture()
        var item = Item.genericPassword(service: "bank", account: "alice", data: SecretBytes(utf8: "pin"))
        item.accessControl = .userPresence
        try fixture.vault.add(item)
        var query = Query.genericPassword(service: "bank", account: "alice")
        query.authenticationContext = AuthenticationContext(verifier: ScriptedVerifier(.passphrase("guess")))
        #expect(status { _ = try fixture.vault.data(matching: query) } == -25293)
        #expect(status { _ = try fixture.vault.data(matching: query) } == -25293)
        #expect(try fixture.vault.status().failedUnlockAttempts == 2)
    }

    @Test("eight handles unlocking one vault at once all succeed")
    func concurrentUnlocks_allSucceed() async throws {
        let fixture = try VaultFixture()
        try fixture.vault.add(.genericPassword(service: "svc", account: "a", data: SecretBytes(utf8: "v")))
        fixture.vault.lockAll()
        let path = fixture.path
        let configuration = fixture.vault.configuration
        let passphrase = fixture.passphrase
        let failures = await withTaskGroup(of: Int32?.self) { group in
            for _ in 0..<8 {
                group.addTask {
                    status {
                        let handle = try Vault.open(at: path, configuration: configuration)
                        try handle.unlock(passphrase: passphrase)
                        _ = try handle.data(matching: .genericPassword(service: "svc", account: "a"))
                    }
                }
            }
            var failures: [Int32] = []
            for await result in group { if let result { failures.append(result) } }
            return failures
        }
        #expect(failures.isEmpty)
    }
}

/// What the disk keeps after a delete or an update returns.
@Suite("Deleted values do not linger")
struct LingeringValueTests {
    func fileBytes(_ path: String) -> [UInt8] {
        (FileManager.default.contents(atPath: path)).map(Array.init) ?? []
    }

    func contains(_ haystack: [UInt8], _ needle: [UInt8]) -> Bool {
        guard needle.count <= haystack.count, !needle.isEmpty else { return false }
        for start in 0...(haystack.count - needle.count) where haystack[start] == needle[0] {
            if Array(haystack[start..<start + needle.count]) == needle { return true }
        }
        return false
    }

    @Test("after a delete or an update returns, the old sealed value is in neither the file nor the WAL", arguments: ["delete", "update"])
    func deletedValue_isGoneFromFileAndWriteAheadLog(operation: String) throws {
        let fixture = try VaultFixture()
        let query = Query.genericPassword(service: "svc", account: "gone")
        try fixture.vault.add(.genericPassword(service: "svc", account: "gone", data: SecretBytes(utf8: "soon-deleted-canary")))
        try fixture.vault.add(.genericPassword(service: "svc", account: "stays", data: SecretBytes(utf8: "kept")))
        let sealed = try fixture.vault.withDatabase { database throws(LockboxError) in
            try database.firstRow("SELECT secret FROM items WHERE rowid = 1") { $0.blob(0) ?? [] } ?? []
        }
        #expect(sealed.count > 40)
        // The sealed value is in the WAL now.
        #expect(contains(fileBytes(fixture.path + "-wal") + fileBytes(fixture.path), Array(sealed.suffix(32))))
        if operation == "delete" {
            #expect(try fixture.vault.delete(matching: query) == 1)
        } else {
            try fixture.vault.update(matching: query, to: ItemUpdate(data: SecretBytes(utf8: "replacement")))
        }
        let onDisk = fileBytes(fixture.path) + fileBytes(fixture.path + "-wal")
        #expect(!contains(onDisk, Array(sealed.suffix(32))), "the old sealed value is still on disk after \(operation)")
        #expect(fileBytes(fixture.path + "-wal").isEmpty)
    }
}
