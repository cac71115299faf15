import Glibc
import KeyProviders
import Lockbox
import LockboxTestSupport
import Testing
import VaultStorage

/// Every keyutils and SQLite call is checked, and the error it makes keeps its cause (errno or
/// SQLite's extended result code) for callers and tests to match.
@Suite("Checked system calls and errors that keep their cause")
struct SystemCallTests {
    // MARK: SQLite

    @Test("a duplicate item is duplicateItem, found before anything is written, and the file is left as it was")
    func duplicatePrimaryKey_throwsDuplicateItem_beforeWriting() throws {
        let fixture = try VaultFixture()
        try fixture.vault.add(.genericPassword(service: "svc", account: "alice", data: SecretBytes(utf8: "v")))
        let before = try fixture.vault.status().generation
        let error = #expect(throws: LockboxError.self) {
            try fixture.vault.add(.genericPassword(service: "svc", account: "alice", data: SecretBytes(utf8: "w")))
        }
        #expect(error?.code == .duplicateItem)
        // The lookup index found it (schema 4 has no UNIQUE index of primary digests): no
        // SQLite constraint fired.
        #expect(error?.sqliteExtendedCode == nil)
        #expect(try fixture.vault.status().generation == before)
        #expect(try fixture.vault.data(matching: .genericPassword(service: "svc", account: "alice")) == SecretBytes(utf8: "v"))
        // An update that would give an item another's primary key is refused the same way.
        try fixture.vault.add(.genericPassword(service: "svc", account: "bob", data: SecretBytes(utf8: "b")))
        let renamed = #expect(throws: LockboxError.self) {
            try fixture.vault.update(
                matching: .genericPassword(service: "svc", account: "bob"), to: ItemUpdate(attributes: ItemAttributes(account: "alice")))
        }
        #expect(renamed?.code == .duplicateItem)
        #expect(try fixture.vault.data(matching: .genericPassword(service: "svc", account: "bob")) == SecretBytes(utf8: "b"))
        // The same name in another access group, or synchronizable, is another item.
        try fixture.vault.add(.genericPassword(service: "svc", account: "alice", data: SecretBytes(utf8: "g"), accessGroup: "team.other"))
        var synchronizable = Item.genericPassword(service: "svc", account: "alice", data: SecretBytes(utf8: "s"), accessibility: .afterFirstUnlock)
        synchronizable.attributes.synchronizable = true
        try fixture.vault.add(synchronizable)
    }

    @Test("a CHECK constraint violation is not reported as a duplicate item")
    func checkConstraintViolation_isNotDuplicateItem_andKeepsItsCode() throws {
        let fixture = try VaultFixture()
        let error = #expect(throws: LockboxError.self) {
            try fixture.vault.withDatabase { database throws(LockboxError) in
                // unlock_attempts allows only the row id = 1.
                try database.execute("INSERT INTO unlock_attempts (id, failures, last_failure) VALUES (2, 0, 0)")
            }
        }
        #expect(error?.code == .io)
        #expect(error?.code != .duplicateItem)
        #expect(error?.sqliteExtendedCode == 275)  // SQLITE_CONSTRAINT_CHECK
        #expect(error?.message.contains("CHECK constraint failed") == true)
    }

    @Test("a UNIQUE violation on another column than the primary digest is not a duplicate item")
    func uniqueViolationOnItemID_isNotDuplicateItem() throws {
        let fixture = try VaultFixture()
        try fixture.vault.add(.genericPassword(service: "svc", account: "alice", data: SecretBytes(utf8: "v")))
        let error = #expect(throws: LockboxError.self) {
            try fixture.vault.withDatabase { database throws(LockboxError) in
                // A copy of the row with a fresh primary digest but the same random id.
                try database.execute(
                    """
                    INSERT INTO items (id, item_class, accessibility, access_group, synchronizable, primary_digest,
                                       lookup_digest, name_digest, wrapped_key, metadata, secret, device_id, access_control)
                    SELECT id, item_class, accessibility, access_group, synchronizable, randomblob(32),
                           lookup_digest, name_digest, wrapped_key, metadata, secret, device_id, access_control
                    FROM items LIMIT 1
                    """)
            }
        }
        #expect(error?.code == .io)
        #expect(error?.sqliteExtendedCode == 2067)
        #expect(error?.message.contains("items.id") == true)
    }

    @Test("a bind that SQLite refuses makes the next step throw, with the code, and nothing is written")
    func refusedBind_throwsAtStep_withTooBigCode() throws {
        let fixture = try VaultFixture()
        let canary = makeCanary("bind")
        let error = #expect(throws: LockboxError.self) {
            try fixture.vault.withDatabase { database throws(LockboxError) in
                database.limitValueLength(to: 64)
                let statement = try database.statement("SELECT length(?)")
                statement.bind(1, Array((canary + String(repeating: "x", count: 100)).utf8))
                _ = try statement.step()
            }
        }
        #expect(error?.sqliteExtendedCode == 18)  // SQLITE_TOOBIG
        #expect(error?.cause?.operation == "sqlite3_bind")
        #expect(error.map { !"\($0)".contains(canary) && !$0.message.contains(canary) } == true)
        // The failure does not stick to the statement: after a reset it works again.
        let length = try fixture.vault.withDatabase { database throws(LockboxError) -> Int? in
            database.limitValueLength(to: 1_000_000_000)
            let statement = try database.statement("SELECT length(?)")
            statement.bind(1, [UInt8](repeating: 1, count: 10))
            _ = try statement.step()
            return statement.integer(0)
        }
        #expect(length == 10)
    }

    // MARK: Kernel keyring

    @Test("setting the timeout of a key that does not exist throws with its errno")
    func setTimeoutOnMissingKey_throwsWithErrno() throws {
        let serial = try KernelKeyring.store(SecretBytes(utf8: "x"), description: "lockbox:test:timeout", timeout: nil)
        try KernelKeyring.remove(serial)
        do {
            try KernelKeyring.setTimeout(serial, seconds: 5)
            Issue.record("keyctl_set_timeout on a removed key succeeded")
        } catch {
            #expect(error.operation == "keyctl_set_timeout")
            #expect(error.isMissing)
            #expect([ENOKEY, EKEYREVOKED, EKEYEXPIRED].contains(error.errno))
        }
    }

    @Test("a stored key carries the idle timeout the kernel enforces")
    func storeWithTimeout_appliesTheKernelTimeout() throws {
        let description = "lockbox:test:expiry:\(getpid())"
        let serial = try KernelKeyring.store(SecretBytes(utf8: "x"), description: description, timeout: 1000)
        defer { try? KernelKeyring.remove(serial) }
        // /proc/keys shows the remaining time of each key ("perm" for none).
        let keys = try run("/bin/cat", ["/proc/keys"]).standardOutput
        let line = keys.split(separator: "\n").first { $0.hasPrefix(String(serial, radix: 16).leftPadded(to: 8)) }
        #expect(line != nil, "key \(serial) missing from /proc/keys")
        #expect(line.map { !$0.contains(" perm ") && $0.contains(description) } == true)
    }

    @Test("a key the kernel refuses to invalidate or revoke makes remove throw EACCES, not pass silently")
    func removeRefusedByKernel_throwsWithEACCES() throws {
        let description = "lockbox:test:remove:\(getpid())"
        // Expires by itself in 2 s: once its permissions are taken away nothing else can remove it.
        let serial = try KernelKeyring.store(SecretBytes(utf8: "x"), description: description, timeout: 2)
        // View and read only: no search (needed to invalidate), no setattr (needed to revoke).
        let setperm = try run("/usr/bin/keyctl", ["setperm", String(serial), "0x03030000"])
        #expect(setperm.status == 0, "keyctl setperm failed: \(setperm.standardError)")
        do {
            try KernelKeyring.remove(serial)
            Issue.record("remove succeeded on a key that may not be invalidated or revoked")
        } catch {
            #expect(error.operation == "keyctl_revoke")
            #expect(error.errno == EACCES)
        }
        // It was unlinked from the `lockbox` keyring first (which gives its quota back).
        #expect {
            _ = try KernelKeyring.find(description)
        } throws: { error in
            guard case .missing = error as? KernelKeyring.Absence else { return false }
            return true
        }
        // Removing by description ends too, with the kernel's refusal (the key matches but
        // may not be searched), instead of retrying forever.
        let again = try KernelKeyring.store(SecretBytes(utf8: "x"), description: description, timeout: 2)
        #expect(try run("/usr/bin/keyctl", ["setperm", String(again), "0x03030000"]).status == 0)
        do {
            try KernelKeyring.remove(description: description)
            Issue.record("remove(description:) passed over a key it could not remove")
        } catch {
            #expect(error.errno == EACCES)
        }
    }

    @Test("a failed keyctl names the call and its errno in the LockboxError")
    func unreadableKey_surfacesErrnoInLockboxError() throws {
        do {
            _ = try KernelKeyring.read(-12345)
            Issue.record("reading a bogus serial succeeded")
        } catch {
            switch error {
            case .missing: break
            case .unavailable(let failure):
                #expect(failure.cause.errno == failure.errno)
                #expect(failure.reason.hasPrefix("keyctl_read failed"))
            }
        }
    }
}

extension String {
    fileprivate func leftPadded(to width: Int) -> String {
        String(repeating: "0", count: max(0, width - count)) + self
    }
}
