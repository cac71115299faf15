import Foundation
import Lockbox
import LockboxTestSupport
import Testing
import VaultCrypto
import VaultStorage

@testable import LockboxVault

/// Bucket checks and recounts read each row's columns in place; they must give exactly the
/// accumulators of the plain way (a `RowIdentity` per row, its element, a byte-by-byte sum), on
/// ordinary rows and on rows an attacker edited into odd shapes, or stored vaults would no
/// longer verify (or an edit would go unnoticed).
@Suite("Integrity: rows counted in place as the plain way counts them")
struct IntegrityCountingTests {
    /// A table with the columns the integrity state reads, without the vault's constraints, so
    /// that rows of any shape can be planted.
    func makeTable() throws -> (TemporaryDirectory, Database) {
        let directory = TemporaryDirectory("lockbox-counting")
        let database = try Database(path: directory.file("rows.db"), create: true)
        try database.execute(
            """
            CREATE TABLE items (
                id BLOB, version INTEGER, primary_digest BLOB, lookup_digest BLOB, name_digest BLOB, item_class TEXT,
                accessibility TEXT, access_group TEXT, synchronizable INTEGER, device_id TEXT, access_control TEXT, bucket INTEGER);
            CREATE INDEX items_by_lookup ON items(lookup_digest);
            """)
        return (directory, database)
    }

    /// Inserts a row whose values are SQL literals.
    func plant(_ database: Database, _ values: [String]) throws {
        try database.execute("INSERT INTO items (\(IntegrityState.RowIdentity.columns)) VALUES (\(values.joined(separator: ", ")))")
    }

    func hex(_ bytes: [UInt8]) -> String { "X'" + bytes.map { String(format: "%02X", $0) }.joined() + "'" }

    /// An ordinary row in bucket `bucket`.
    func ordinary(_ index: Int, bucket: UInt8, group: String = "'com.example.app'", device: String = "''") -> [String] {
        let lookup = [bucket] + Crypto.randomBytes(31)
        return [
            hex(Crypto.randomBytes(16)), String(index), hex(Crypto.randomBytes(32)), hex(lookup),
            index % 3 == 0 ? "NULL" : hex(Crypto.randomBytes(32)), "'genp'", "'ak'", group, String(index % 2), device, "''",
            String(bucket),
        ]
    }

    /// The accumulators the plain way gives: every row's `RowIdentity`, its element, and a sum
    /// modulo 2^256 byte by byte.
    func plainAccumulators(_ database: Database, key: SecretBytes) throws -> [UInt8] {
        var accumulators = [UInt8](repeating: 0, count: IntegrityState.bucketCount * IntegrityState.accumulatorSize)
        let rows = try database.statement("SELECT \(IntegrityState.RowIdentity.columns) FROM items")
        defer { rows.reset() }
        while try rows.step() {
            let row = try IntegrityState.RowIdentity(rows, first: 0)
            let element = IntegrityState.element(row, key: key)
            var carry = 0
            for index in 0..<IntegrityState.accumulatorSize {
                let position = row.bucket * IntegrityState.accumulatorSize + index
                let sum = Int(accumulators[position]) + Int(element[index]) + carry
                accumulators[position] = UInt8(truncatingIfNeeded: sum)
                carry = sum >> 8
            }
        }
        return accumulators
    }

    func expectSameCounts(_ database: Database, key: SecretBytes) throws {
        let plain = try plainAccumulators(database, key: key)
        let recounted = try IntegrityState.recount(database: database, key: key)
        // Compared as booleans: a failure names the bucket, not 8 KiB of bytes.
        let sameRecount = recounted.accumulators == plain
        #expect(sameRecount)
        for bucket in 0..<IntegrityState.bucketCount {
            let computed = try IntegrityState.computeAccumulator(bucket: bucket, database: database, key: key)
            let same = computed == Array(plain[bucket * 32..<(bucket + 1) * 32])
            #expect(same, "bucket \(bucket)")
        }
    }

    @Test("ordinary rows, odd text (non-ASCII, invalid UTF-8, a NUL inside, a number) and odd ids count as the plain way counts them")
    func countsMatchThePlainWay() throws {
        let (directory, database) = try makeTable()
        _ = directory
        let key = Crypto.generateKey()
        // Several rows per bucket, so that sums carry across bytes and words.
        for index in 0..<600 { try plant(database, ordinary(index, bucket: UInt8(index % 7 == 0 ? 255 : index % 5))) }
        try plant(database, ordinary(600, bucket: 9, group: "'équipe.例え'"))
        try plant(database, ordinary(601, bucket: 9, group: "CAST(X'61C3FF62' AS TEXT)"))
        try plant(database, ordinary(602, bucket: 10, device: "CAST(X'610062' AS TEXT)"))
        // A number in a text column is stored as text.
        try plant(database, ordinary(603, bucket: 10, group: "42"))
        var short = ordinary(605, bucket: 12)
        short[0] = "X'0102'"
        try plant(database, short)
        try expectSameCounts(database, key: key)
        // Sums that wrap: many elements of one row's columns (each its own id, version and
        // primary key) in one bucket.
        let repeated = ordinary(700, bucket: 13)
        for copy in 0..<40 {
            var row = repeated
            row[0] = hex(Crypto.randomBytes(16))
            row[1] = String(copy)
            row[2] = hex(Crypto.randomBytes(32))
            try plant(database, row)
        }
        try expectSameCounts(database, key: key)
    }

    @Test(
        "an id or a primary digest present twice, a bucket column that disagrees, a missing column, a column of another storage class: each refused by recount and by the bucket's check")
    func refusals() throws {
        let key = Crypto.generateKey()
        func expectRefused(_ edit: (Database) throws -> Void, bucket: Int) throws {
            let (directory, database) = try makeTable()
            _ = directory
            for index in 0..<20 { try plant(database, ordinary(index, bucket: 3)) }
            try edit(database)
            #expect(throws: LockboxError.self) { try IntegrityState.recount(database: database, key: key) }
            #expect(throws: LockboxError.self) { try IntegrityState.computeAccumulator(bucket: bucket, database: database, key: key) }
        }
        // The same 16-byte id twice, and the same short id twice.
        try expectRefused({ try $0.execute("INSERT INTO items SELECT * FROM items WHERE version = 4") }, bucket: 3)
        try expectRefused(
            { database in
                var row = ordinary(50, bucket: 3)
                row[0] = "X'0102'"
                try plant(database, row)
                row[1] = "51"
                try plant(database, row)
            }, bucket: 3)
        // Another row of the same primary key (its own id and version), and the same with a
        // primary digest that is not 32 bytes.
        try expectRefused(
            { database in
                try database.execute(
                    """
                    INSERT INTO items SELECT randomblob(16), 99, primary_digest, lookup_digest, name_digest, item_class,
                        accessibility, access_group, synchronizable, device_id, access_control, bucket
                    FROM items WHERE version = 4
                    """)
            }, bucket: 3)
        try expectRefused(
            { database in
                try database.execute("UPDATE items SET primary_digest = X'0102' WHERE version IN (4, 5)")
            }, bucket: 3)
        try expectRefused({ try $0.execute("UPDATE items SET bucket = 4 WHERE version = 4") }, bucket: 3)
        // The same bytes in another storage class, which SQL compares as unequal.
        for edit in [
            "id = 12345", "primary_digest = CAST(primary_digest AS TEXT)", "name_digest = CAST(lookup_digest AS TEXT)",
            "access_group = CAST(access_group AS BLOB)", "accessibility = CAST(accessibility AS BLOB)", "synchronizable = 'no'",
            "version = 4.5",
        ] {
            try expectRefused({ try $0.execute("UPDATE items SET \(edit) WHERE version = 4") }, bucket: 3)
        }
        try expectRefused({ try $0.execute("UPDATE items SET device_id = NULL WHERE version = 4") }, bucket: 3)
        try expectRefused({ try $0.execute("UPDATE items SET version = NULL WHERE version = 4") }, bucket: 3)
        // A lookup digest that is not a blob sorts into bucket 0's range.
        try expectRefused({ try $0.execute("UPDATE items SET lookup_digest = 7, bucket = 3 WHERE version = 4") }, bucket: 0)
    }
}
