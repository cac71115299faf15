import Foundation
import Lockbox
import LockboxCore
import LockboxTestSupport
import LockboxVault
import Testing
import VaultCrypto

@testable import LockboxSync

/// The database's administrator against the two boxes of a record and the grants of a removal:
/// a value box removed or taken from another write of the same version, a device key swapped
/// between the removal's reads, rows hidden from a count and rows repeated for a lookup.
extension SyncTests {
    @Suite("Sync: the administrator against a record's boxes and a removal's grants", .serialized)
    struct AdministratorAttacks {
        func itemID(_ group: SyncGroup, _ machine: Machine, _ service: String) throws -> String {
            var query = machine.query(service, "user")
            query.returning = [.attributes]
            return group.itemID(try machine.vault.item(matching: query))
        }

        /// The records table renamed `counted_items`, with a view the administrator defines in
        /// its place until ``restore()`` (rows matching `removingOnRestore` deleted then).
        final class RecordsBehindAView {
            let admin: PostgresConnection
            private let removingOnRestore: String?
            private var restored = false

            init(_ definition: String, removingOnRestore: String? = nil) throws {
                admin = try PostgresConnection(try testDatabase())
                self.removingOnRestore = removingOnRestore
                try admin.execute("ALTER TABLE lockbox_sync_items RENAME TO counted_items")
                do { try admin.execute(definition) } catch {
                    restore()
                    throw error
                }
            }

            func restore() {
                guard !restored else { return }
                restored = true
                _ = try? admin.execute("DROP VIEW IF EXISTS lockbox_sync_items")
                if let removingOnRestore { _ = try? admin.execute("DELETE FROM counted_items WHERE " + removingOnRestore) }
                _ = try? admin.execute("ALTER TABLE counted_items RENAME TO lockbox_sync_items")
            }
        }

        /// Three machines of one group, each holding x.example's first value, synced.
        func threeMachinesHoldingX1() throws -> ([SyncGroup], [Machine]) {
            let (groups, machines) = try threeMachines()
            try machines[0].add("x.example", "user", "x1")
            for group in groups { try group.sync() }
            return (groups, machines)
        }

        /// The metadata box of a payload, and what follows it (the value box's field).
        func split(_ payload: [UInt8]) -> (meta: [UInt8], value: [UInt8]) {
            let length = Int(payload[1]) | Int(payload[2]) << 8 | Int(payload[3]) << 16 | Int(payload[4]) << 24
            return (Array(payload[0..<(5 + length)]), Array(payload[(5 + length)...]))
        }

        @Test("A record served without its value box is refused on every device, before anything is applied: no device takes an empty value, none keeps going on an older one")
        func valueBoxRemovedIsRefused() throws {
            let (groups, machines) = try threeMachines()
            defer { withExtendedLifetime(machines) {} }
            try machines[0].add("a.example", "user", "secret1")
            for group in groups { try group.sync() }
            tick()
            try machines[0].set("a.example", "user", "secret2")
            try groups[0].sync()
            let a = try itemID(groups[0], machines[0], "a.example")
            let record = try #require(try storedRecords(groups[0].groupID).first { $0.id == a })
            // The payload's second field, the value box, made absent.
            try PostgresConnection(try testDatabase()).execute(
                "UPDATE lockbox_sync_items SET payload = $3 WHERE group_id = $1 AND item_id = $2",
                [.text(groups[0].groupID), .text(a), .bytes(split(record.payload).meta + [0])])
            for index in [1, 2] {
                let refused = #expect(throws: LockboxError.self) { try groups[index].sync() }
                #expect(refused?.code == .decode, "machine \(index)")
                #expect(try machines[index].value("a.example", "user") == "secret1")
            }
            let newcomer = try Machine()
            let joined = try SyncGroup.join(groups[0].groupID, vault: newcomer.vault, database: try testDatabase(), passphrase: groupPassphrase)
            #expect(throws: LockboxError.self) { try joined.sync() }
            #expect(try newcomer.value("a.example", "user") == nil)
        }

        @Test("A record whose value box is another write's of the same version (sealed before a restore of the database) is refused")
        func valueBoxOfAnotherWriteIsRefused() throws {
            let (groups, machines) = try threeMachines()
            defer { withExtendedLifetime(machines) {} }
            try machines[0].add("a.example", "user", "v0")
            for group in groups { try group.sync() }
            let backup = try SyncTests.DatabaseBackup(groups[0].groupID)
            let a = try itemID(groups[0], machines[0], "a.example")
            tick()
            try machines[0].set("a.example", "user", "written-by-A")
            try groups[0].sync()
            let fromA = try #require(try storedRecords(groups[0].groupID).first { $0.id == a })
            try backup.restore()
            tick()
            try machines[1].set("a.example", "user", "written-by-B")
            try groups[1].sync()
            let fromB = try #require(try storedRecords(groups[0].groupID).first { $0.id == a })
            #expect(fromA.version == fromB.version)
            try PostgresConnection(try testDatabase()).execute(
                "UPDATE lockbox_sync_items SET payload = $3 WHERE group_id = $1 AND item_id = $2",
                [.text(groups[0].groupID), .text(a), .bytes(split(fromB.payload).meta + split(fromA.payload).value)])
            let refused = #expect(throws: LockboxError.self) { try groups[2].sync() }
            #expect(refused?.code == .decode)
            #expect(try machines[2].value("a.example", "user") == "v0")
        }

        @Test("A removal seals the new key only to the device keys whose attestation it checked: a key the database shows a later read is granted nothing")
        func removalGrantsOnlyCheckedKeys() throws {
            let (groups, machines) = try threeMachines()
            defer { withExtendedLifetime(machines) {} }
            try machines[0].add("bank.example", "user", "canary-after-removal")
            for group in groups { try group.sync() }
            let admin = try PostgresConnection(try testDatabase())
            let group = groups[0].groupID
            let (adminPublic, adminSecret) = Crypto.generateKeyPair()
            // The devices table behind a view that shows the real keys to the first statement of
            // a transaction, and the administrator's key to every later one.
            try admin.execute("ALTER TABLE lockbox_sync_devices RENAME TO swapped_devices")
            try admin.execute("CREATE TABLE swapped_seen (tx timestamptz PRIMARY KEY, first_statement timestamptz)")
            try admin.execute("CREATE TABLE swapped_key (k bytea)")
            try admin.execute("INSERT INTO swapped_key VALUES ($1)", [.bytes(adminPublic)])
            try admin.execute(
                """
                CREATE FUNCTION swapped_pick(actual bytea) RETURNS bytea LANGUAGE plpgsql VOLATILE AS $f$
                DECLARE f timestamptz;
                BEGIN
                  SELECT first_statement INTO f FROM swapped_seen WHERE tx = now();
                  IF NOT FOUND THEN INSERT INTO swapped_seen VALUES (now(), statement_timestamp()); RETURN actual; END IF;
                  IF f = statement_timestamp() THEN RETURN actual; END IF;
                  RETURN (SELECT k FROM swapped_key);
                END $f$
                """)
            try admin.execute(
                """
                CREATE VIEW lockbox_sync_devices AS SELECT group_id, device_id, pulled_version, last_sync,
                  swapped_pick(public_key) AS public_key, attestation FROM swapped_devices
                """)
            let removal = outcome { try groups[0].removeDevice(groups[2].deviceID) }
            try admin.execute("DROP VIEW lockbox_sync_devices")
            try admin.execute("DROP FUNCTION swapped_pick(bytea)")
            try admin.execute("DROP TABLE swapped_seen")
            try admin.execute("DROP TABLE swapped_key")
            try admin.execute("ALTER TABLE swapped_devices RENAME TO lockbox_sync_devices")
            // Whether the removal went through or stopped, no grant opens with the administrator's key.
            var opened = 0
            for row in try admin.execute("SELECT sealed_key FROM lockbox_sync_key_grants WHERE group_id = $1", [.text(group)]) {
                var outer = FieldDecoder(try PostgresConnection.bytes(row[0]))
                if let box = try outer.bytes(), (try? Crypto.open(box, publicKey: adminPublic, secretKey: adminSecret)) != nil { opened += 1 }
            }
            #expect(opened == 0, "the removal (\(removal)) sealed \(opened) grant(s) to the administrator's key")
            // A removal on the real table goes through, and the others go on.
            if case .failure = removal { try groups[0].removeDevice(groups[2].deviceID) }
            try groups[1].sync()
            try groups[0].sync()
            #expect(try groups[0].devices().allSatisfy(\.isAttested))
            #expect(try groups[0].devices().count == 2)
        }

        @Test("A reset after this machine's record of its last pull was damaged still refuses a database rolled back below the state it replaces: the user's pushed edit is kept")
        func resetWithADamagedRecordRefusesARollback() throws {
            let (groups, machines) = try threeMachinesHoldingX1()
            defer { withExtendedLifetime(machines) {} }
            let backup = try SyncTests.DatabaseBackup(groups[0].groupID)
            tick()
            try machines[0].set("x.example", "user", "x2 (pushed)")
            try groups[0].sync()
            try backup.restore()
            let path = groups[0].pulledMark.path
            var bytes = [UInt8](try Data(contentsOf: URL(fileURLWithPath: path)))
            bytes[0] ^= 1
            try Data(bytes).write(to: URL(fileURLWithPath: path))
            #expect(throws: LockboxError.self) { try groups[0].sync() }
            let refused = #expect(throws: LockboxError.self) { try groups[0].resetState() }
            #expect(refused?.code == .decode, "\(refused?.message ?? "")")
            #expect(try machines[0].value("x.example", "user") == "x2 (pushed)")
        }

        @Test("Rows the database hides from a count but serves to the fetch are refused past the versions the head covers, in a pull and a recovery: none is held in memory beyond one")
        func rowsHiddenFromTheCountAreRefused() throws {
            let (groups, machines) = try threeMachinesHoldingX1()
            defer { withExtendedLifetime(machines) {} }
            let view = try RecordsBehindAView(
                """
                CREATE VIEW lockbox_sync_items AS SELECT * FROM counted_items
                WHERE item_id NOT LIKE 'junk%' OR current_query() NOT ILIKE '%count(*)%'
                """, removingOnRestore: "item_id LIKE 'junk%'")
            defer { view.restore() }
            try view.admin.execute(
                """
                INSERT INTO counted_items (group_id, item_id, version, device_id, payload)
                SELECT $1, 'junk' || i, 1000000 + i, 'x', decode(repeat(md5(i::text), 64), 'hex') FROM generate_series(1, 2000) i
                """, [.text(groups[0].groupID)])
            tick()
            try machines[0].set("x.example", "user", "x2")
            #expect(throws: LockboxError.self) { try groups[0].sync() }
            let pulled = #expect(throws: LockboxError.self) { try groups[1].sync() }
            #expect(pulled?.message.contains("more than its versions") == true, "\(pulled?.message ?? "")")
            let recovered = #expect(throws: LockboxError.self) { try groups[2].recoverDatabase() }
            #expect(recovered?.code == .decode || recovered?.message.contains("records") == true, "\(recovered?.message ?? "")")
        }

        @Test("Records a push looks up by item id, served many times over by the database, are refused after one row more than the items it names; the edit is kept and pushed once the table is back")
        func rowsRepeatedForALookupAreRefused() throws {
            let (groups, machines) = try threeMachinesHoldingX1()
            defer { withExtendedLifetime(machines) {} }
            // Every row a lookup by item id matches, served 3,000 times; other queries see the table.
            let view = try RecordsBehindAView(
                """
                CREATE VIEW lockbox_sync_items AS SELECT * FROM counted_items
                UNION ALL SELECT c.* FROM counted_items c, generate_series(1, 3000) WHERE current_query() ILIKE '%= ANY(%'
                """)
            defer { view.restore() }
            tick()
            try machines[0].set("x.example", "user", "x2")
            let refused = #expect(throws: LockboxError.self) { try groups[0].sync() }
            #expect(refused?.code == .decode, "\(refused?.message ?? "")")
            #expect(refused?.message.contains("failed its check") == true, "\(refused?.message ?? "")")
            view.restore()
            try groups[0].sync()
            for group in groups { try group.sync() }
            for machine in machines { #expect(try machine.value("x.example", "user") == "x2") }
        }
    }
}
