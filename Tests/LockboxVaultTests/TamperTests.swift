import Foundation
import Lockbox
import LockboxTestSupport
import Testing
import VaultCrypto
import VaultStorage

@testable import LockboxVault

/// Edits the vault file behind the vault's back, then checks that every read fails closed:
/// `errSecDecode`, no data, no crash.
@Suite("Tampering with the vault file")
struct TamperTests {
    /// A vault with two items, and a second handle whose SQLite connection does the edits.
    func makeTamperedVault(_ edit: (Database) throws -> Void) throws -> VaultFixture {
        let fixture = try VaultFixture()
        try fixture.vault.add(.genericPassword(service: "svc", account: "alice", data: SecretBytes(utf8: "alice-secret")))
        try fixture.vault.add(.genericPassword(service: "svc", account: "bob", data: SecretBytes(utf8: "bob-secret")))
        let database = try Database(path: fixture.path, create: false)
        try edit(database)
        return fixture
    }

    func flipByte(_ column: String, at offset: Int, account: String = "alice", in database: Database) throws {
        // Rows are in insertion order: alice is row 1, bob row 2.
        let row = account == "alice" ? 1 : 2
        let read = try database.statement("SELECT \(column) FROM items WHERE rowid = ?")
        read.bind(1, row)
        #expect(try read.step())
        var blob = try #require(read.blob(0))
        let index = offset >= 0 ? offset : blob.count + offset
        blob[index] ^= 0x01
        let write = try database.statement("UPDATE items SET \(column) = ? WHERE rowid = ?")
        write.bind(1, blob)
        write.bind(2, row)
        try write.run()
    }

    func readStatus(_ vault: Vault, account: String = "alice", returning: Query.ReturnOptions = [.data, .attributes]) -> Int32? {
        var query = Query.genericPassword(service: "svc", account: account)
        query.returning = returning
        do {
            let items = try vault.items(matching: query)
            Issue.record("a tampered item was returned: \(items)")
            return 0
        } catch {
            return error.status
        }
    }

    @Test("a flipped ciphertext byte fails with errSecDecode", arguments: [30, -1, -17])
    func flippedCiphertext_failsWithDecode(offset: Int) throws {
        let fixture = try makeTamperedVault { try flipByte("secret", at: offset, in: $0) }
        #expect(readStatus(fixture.vault, returning: [.data]) == -26275)
        // The neighbour is untouched.
        #expect(try fixture.vault.data(matching: .genericPassword(service: "svc", account: "bob")) == SecretBytes(utf8: "bob-secret"))
    }

    @Test("a flipped nonce byte fails with errSecDecode", arguments: [0, 23])
    func flippedNonce_failsWithDecode(offset: Int) throws {
        let fixture = try makeTamperedVault { try flipByte("secret", at: offset, in: $0) }
        #expect(readStatus(fixture.vault, returning: [.data]) == -26275)
    }

    /// Two access-controlled items: their rows keep a wrapped item key (the one the user's
    /// verification unlocks), which rows without access control no longer have.
    func makeTamperedAccessControlledVault(_ edit: (Database) throws -> Void) throws -> VaultFixture {
        let fixture = try VaultFixture()
        for (account, secret) in [("alice", "alice-secret"), ("bob", "bob-secret")] {
            var item = Item.genericPassword(service: "svc", account: account, data: SecretBytes(utf8: secret))
            item.accessControl = .userPresence
            try fixture.vault.add(item)
        }
        let database = try Database(path: fixture.path, create: false)
        try edit(database)
        return fixture
    }

    func readVerifiedStatus(_ vault: Vault, account: String = "alice") -> Int32? {
        var query = Query.genericPassword(service: "svc", account: account)
        query.authenticationContext = AuthenticationContext(verifier: ScriptedVerifier(.passphrase(VaultFixture.passphraseText)))
        do {
            let data = try vault.data(matching: query)
            Issue.record("a tampered item was returned: \(data)")
            return 0
        } catch {
            return error.status
        }
    }

    @Test("a flipped wrapped item key fails with errSecDecode", arguments: [0, 30, -1])
    func flippedWrappedKey_failsWithDecode(offset: Int) throws {
        let fixture = try makeTamperedAccessControlledVault { try flipByte("wrapped_key", at: offset, in: $0) }
        #expect(readVerifiedStatus(fixture.vault) == -26275)
        // The untouched neighbour still reads with the user's verification.
        var query = Query.genericPassword(service: "svc", account: "bob")
        query.authenticationContext = AuthenticationContext(verifier: ScriptedVerifier(.passphrase(VaultFixture.passphraseText)))
        #expect(try fixture.vault.data(matching: query) == SecretBytes(utf8: "bob-secret"))
    }

    @Test("a wrapped item key moved to another access-controlled row fails with errSecDecode")
    func wrappedKeyMovedToAnotherRow_failsWithDecode() throws {
        let fixture = try makeTamperedAccessControlledVault { database in
            try database.execute("UPDATE items SET wrapped_key = (SELECT wrapped_key FROM items WHERE rowid = 1) WHERE rowid = 2")
        }
        #expect(readVerifiedStatus(fixture.vault, account: "bob") == -26275)
    }

    @Test("an item key planted in a row sealed under its class key fails with errSecDecode")
    func plantedItemKey_failsWithDecode() throws {
        let fixture = try makeTamperedVault { database in
            // Rows without access control have no item key: their value is sealed under the class key.
            #expect(try database.firstRow("SELECT length(wrapped_key) FROM items WHERE rowid = 1") { $0.integer(0) } == 0)
            try database.execute("UPDATE items SET wrapped_key = randomblob(72) WHERE rowid = 1")
        }
        #expect(readStatus(fixture.vault, returning: [.data]) == -26275)
        #expect(readStatus(fixture.vault) == -26275)
    }

    @Test("a value read alone fails with errSecDecode when only the attributes column was edited", arguments: [0, 30, -1])
    func valueReadAlone_failsWhenAttributesEdited(offset: Int) throws {
        let fixture = try makeTamperedVault { try flipByte("metadata", at: offset, in: $0) }
        #expect(status { _ = try fixture.vault.data(matching: .genericPassword(service: "svc", account: "alice")) } == -26275)
        #expect(try fixture.vault.data(matching: .genericPassword(service: "svc", account: "bob")) == SecretBytes(utf8: "bob-secret"))
    }

    @Test("flipped sealed metadata fails with errSecDecode", arguments: [0, 30, -1])
    func flippedMetadata_failsWithDecode(offset: Int) throws {
        let fixture = try makeTamperedVault { try flipByte("metadata", at: offset, in: $0) }
        #expect(readStatus(fixture.vault, returning: [.attributes]) == -26275)
    }

    @Test("a blob moved to another row fails with errSecDecode", arguments: ["secret", "metadata"])
    func blobMovedToAnotherRow_failsWithDecode(column: String) throws {
        let fixture = try makeTamperedVault { database in
            try database.execute("UPDATE items SET \(column) = (SELECT \(column) FROM items WHERE rowid = 1) WHERE rowid = 2")
        }
        #expect(readStatus(fixture.vault, account: "bob") == -26275)
    }

    @Test("a whole row's blobs copied under another id fail with errSecDecode")
    func rowCopiedUnderAnotherID_failsWithDecode() throws {
        let fixture = try makeTamperedVault { database in
            try database.execute(
                """
                UPDATE items SET wrapped_key = (SELECT wrapped_key FROM items WHERE rowid = 1),
                                 metadata = (SELECT metadata FROM items WHERE rowid = 1),
                                 secret = (SELECT secret FROM items WHERE rowid = 1)
                WHERE rowid = 2
                """)
        }
        #expect(readStatus(fixture.vault, account: "bob") == -26275)
    }

    @Test("changing the class column fails closed with errSecDecode")
    func changedClassColumn_failsWithDecode() throws {
        let fixture = try makeTamperedVault { try $0.execute("UPDATE items SET item_class = 'internetPassword'") }
        // The rows now claim to be internet passwords; reading them as such must not open.
        do {
            _ = try fixture.vault.items(matching: Query(.internetPassword, limit: .all, returning: [.data]))
            Issue.record("tampered rows were returned")
        } catch {
            #expect(error.status == -26275)
        }
        // The rows the query would have found were edited: tampering, not "not found".
        #expect(readStatus(fixture.vault) == -26275)
    }

    @Test("changing the access group column fails with errSecDecode")
    func changedAccessGroupColumn_failsWithDecode() throws {
        let fixture = try makeTamperedVault { try $0.execute("UPDATE items SET access_group = 'intruder' WHERE rowid = 1") }
        #expect(readStatus(fixture.vault) == -26275)
    }

    @Test("changing the accessibility column fails with errSecDecode")
    func changedAccessibilityColumn_failsWithDecode() throws {
        let fixture = try makeTamperedVault { try $0.execute("UPDATE items SET accessibility = 'afterFirstUnlock' WHERE rowid = 1") }
        #expect(readStatus(fixture.vault) == -26275)
    }

    /// Opens the vault at `path` and unlocks it: the status of the first step that fails.
    private func openAndUnlockStatus(_ path: String, _ passphrase: SecretBytes) -> Int32? {
        do {
            let reopened = try Vault.open(at: path)
            try reopened.unlock(passphrase: passphrase)
            return nil
        } catch {
            return error.status
        }
    }

    @Test("a modified header fails the next open or unlock with errSecDecode", arguments: ["vault_id", "mac", "class_key"])
    func modifiedHeader_failsUnlockWithDecode(field: String) throws {
        let fixture = try makeTamperedVault { database in
            switch field {
            case "class_key":
                let read = try database.statement("SELECT wrapped_key FROM class_keys WHERE accessibility = 'whenUnlocked'")
                #expect(try read.step())
                var blob = try #require(read.blob(0))
                blob[30] ^= 0x01
                let write = try database.statement("UPDATE class_keys SET wrapped_key = ? WHERE accessibility = 'whenUnlocked'")
                write.bind(1, blob)
                try write.run()
            default:
                let read = try database.statement("SELECT value FROM header WHERE name = ?")
                read.bind(1, field)
                #expect(try read.step())
                var blob = try #require(read.blob(0))
                blob[3] ^= 0x01
                let write = try database.statement("UPDATE header SET value = ? WHERE name = ?")
                write.bind(1, blob)
                write.bind(2, field)
                try write.run()
            }
        }
        fixture.vault.lockAll()
        // The header is covered by the integrity record, checked at open with this machine's
        // device key, and by its own MAC, checked at unlock.
        #expect(openAndUnlockStatus(fixture.path, fixture.passphrase) == -26275)
    }

    @Test("Argon2id parameters lowered below the floor are refused as tampering")
    func loweredKeyDerivationParameters_failUnlockWithDecode() throws {
        let fixture = try makeTamperedVault { database in
            let read = try database.statement("SELECT parameters FROM key_slots WHERE id = 1")
            #expect(try read.step())
            let stored = try #require(read.blob(0))
            var parameters = try #require(PassphraseKeyDerivation(decoding: stored))
            parameters.memoryLimit = 8 * 1024
            parameters.operationsLimit = 1
            let write = try database.statement("UPDATE key_slots SET parameters = ? WHERE id = 1")
            write.bind(1, parameters.encoded())
            try write.run()
        }
        fixture.vault.lockAll()
        #expect(openAndUnlockStatus(fixture.path, fixture.passphrase) == -26275)
    }

    @Test("Argon2id parameters changed within the allowed range are errSecDecode, not a wrong passphrase")
    func changedKeyDerivationParameters_doNotUnlock() throws {
        let fixture = try makeTamperedVault { database in
            let read = try database.statement("SELECT parameters FROM key_slots WHERE id = 1")
            #expect(try read.step())
            let stored = try #require(read.blob(0))
            var parameters = try #require(PassphraseKeyDerivation(decoding: stored))
            parameters.operationsLimit += 1
            let write = try database.statement("UPDATE key_slots SET parameters = ? WHERE id = 1")
            write.bind(1, parameters.encoded())
            try write.run()
        }
        fixture.vault.lockAll()
        // Edited parameters are tampering, told apart from a wrong passphrase: the integrity
        // record covers the header and is checked with this machine's device key.
        #expect(openAndUnlockStatus(fixture.path, fixture.passphrase) == -26275)
    }

    @Test("a file that is not a vault is errSecDecode, not a crash")
    func garbageFile_failsWithDecode() throws {
        let directory = TemporaryDirectory()
        let path = directory.file("garbage.lockbox")
        _ = FileManager.default.createFile(atPath: path, contents: Data((0..<8192).map { UInt8(truncatingIfNeeded: $0 &* 31) }), attributes: [.posixPermissions: 0o600])
        do {
            _ = try Vault.open(at: path)
            Issue.record("garbage opened")
        } catch {
            #expect(error.status == -26275)
        }
    }
}
