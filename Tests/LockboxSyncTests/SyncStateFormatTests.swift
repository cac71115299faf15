import Foundation
import Lockbox
import LockboxCore
import LockboxTestSupport
import Testing
import VaultCrypto
import VaultStorage

@testable import LockboxSync

/// The local sync state's format 2 (buckets) and the conversion of a state of the first format
/// (Tests/Fixtures/sync-state-v1, written by that format's code).
@Suite("Sync state: buckets, and the first format converted")
struct SyncStateFormatTests {
    static let fixture = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
        .appendingPathComponent("Fixtures/sync-state-v1/state.db").path
    static let key = SecretBytes(copying: [UInt8](repeating: 0x5a, count: 32))
    static let device = "fixture-device"

    // What the fixture holds (see its README).
    static func itemID(_ index: Int) -> String {
        Array(SHA256.hash(Array("item \(index)".utf8)).prefix(20)).map { String(format: "%02x", $0) }.joined()
    }
    static func reference(_ index: Int) -> Data { Data(SHA256.hash(Array("row \(index)".utf8)).prefix(16)) }
    static func isTombstone(_ index: Int) -> Bool { index % 10 == 9 }
    static func entry(_ index: Int) -> SyncState.Entry {
        SyncState.Entry(
            stamp: SyncStamp(modified: 1_700_000_000_000 + Int64(index), device: index % 2 == 0 ? "fixture-device" : "other-device"),
            contentDigest: isTombstone(index) ? [] : [UInt8](repeating: UInt8(index % 256), count: 32), isTombstone: isTombstone(index))
    }
    static func listed(_ index: Int) -> SyncState.Listed {
        SyncState.Listed(version: Int64(index + 1), element: [UInt8](repeating: UInt8((index * 7) % 256), count: 32))
    }

    /// A copy of the fixture in a fresh directory.
    static func copyOfFixture() throws -> (TemporaryDirectory, String) {
        let directory = TemporaryDirectory("lockbox-sync-state")
        let path = directory.file("vault.sync/group.db")
        try FileManager.default.createDirectory(atPath: directory.file("vault.sync"), withIntermediateDirectories: true)
        try FileManager.default.copyItem(atPath: fixture, toPath: path)
        return (directory, path)
    }

    static func userVersion(_ path: String) throws -> Int {
        try Database(path: path, create: false).userVersion
    }

    static func tables(_ path: String) throws -> Set<String> {
        let database = try Database(path: path, create: false)
        let statement = try database.statement("SELECT name FROM sqlite_schema WHERE type = 'table'")
        var names: Set<String> = []
        while try statement.step() { names.insert(statement.text(0) ?? "") }
        statement.reset()
        return names
    }

    /// Everything the fixture holds, read through `state`.
    static func expectFixtureContent(_ state: SyncState) throws {
        #expect(state.cursor == 400)
        #expect(state.generation == 77)
        #expect(state.accumulator == [UInt8](repeating: 0xa5, count: 32))
        #expect(try !state.isEmpty)
        #expect(try state.rowCount == 365)
        #expect(try state.liveEntryCount == 360)
        for index in 0..<400 {
            let id = itemID(index)
            #expect(try state.entry(id) == entry(index))
            #expect(try state.verified(id) == listed(index))
            #expect(try state.reference(of: id) == (isTombstone(index) ? nil : reference(index)))
            #expect(try state.row(reference(index)) == (isTombstone(index) ? nil : .some(.some(id))))
        }
        for index in 400..<405 { #expect(try state.row(reference(index)) == .some(.none)) }
        let rows = try state.allRows()
        #expect(rows.count == 365)
        #expect(rows[reference(0)] == .some(itemID(0)))
        #expect(rows[reference(402)] == .some(.none))
        #expect(try state.entry(itemID(400)) == nil)
    }

    @Test("A state of the first format is converted when opened: every entry, row, head element and the progress read back")
    func firstFormatConverted() throws {
        let (directory, path) = try Self.copyOfFixture()
        _ = directory
        #expect(try Self.userVersion(path) == 0)
        #expect(try Self.tables(path).isSuperset(of: ["entries", "rows", "verified", "progress"]))
        try Self.expectFixtureContent(try SyncState(path: path, device: Self.device, key: Self.key))
        #expect(try Self.userVersion(path) == SyncState.format)
        #expect(try Self.tables(path) == ["progress", "item_buckets", "row_buckets", "mac_groups", "applying_rows"])
        // Opened again, in its new format.
        let state = try SyncState(path: path, device: Self.device, key: Self.key)
        try Self.expectFixtureContent(state)
        // And written: a row moves to another item, a row goes away, a new head replaces the old.
        var changes = SyncState.Changes()
        changes.setRow(Self.reference(0), .some(Self.itemID(9)))
        changes.setRow(Self.reference(1), .some(nil))
        changes.setRow(Self.reference(400), .none)
        changes.entries[Self.itemID(9)] = Self.entry(8)
        changes.verified[Self.itemID(3)] = Self.listed(5)
        changes.replacesVerified = true
        changes.cursor = 401
        try state.commit(changes)
        let reread = try SyncState(path: path, device: Self.device, key: Self.key)
        #expect(reread.cursor == 401)
        #expect(reread.generation == 77)
        #expect(try reread.rowCount == 364)
        #expect(try reread.reference(of: Self.itemID(9)) == Self.reference(0))
        #expect(try reread.reference(of: Self.itemID(0)) == nil)
        #expect(try reread.reference(of: Self.itemID(1)) == nil)
        #expect(try reread.row(Self.reference(1)) == .some(.none))
        #expect(try reread.row(Self.reference(400)) == nil)
        #expect(try reread.entry(Self.itemID(9)) == Self.entry(8))
        #expect(try reread.entry(Self.itemID(0)) == Self.entry(0))
        #expect(try reread.verified(Self.itemID(3)) == Self.listed(5))
        #expect(try reread.verified(Self.itemID(4)) == nil, "the replaced head's elements are gone")
    }

    @Test("A first-format state with an edited entry, or opened with another key, is refused and left as it was")
    func editedFirstFormatRefused() throws {
        let (directory, path) = try Self.copyOfFixture()
        _ = directory
        let wrongKey = #expect(throws: LockboxError.self) {
            _ = try SyncState(path: path, device: Self.device, key: SecretBytes(copying: [UInt8](repeating: 0x5b, count: 32)))
        }
        #expect(wrongKey?.code == .decode)
        let database = try Database(path: path, create: false)
        let edit = try database.statement("UPDATE entries SET modified = modified + 1 WHERE item_id = ?")
        edit.bind(1, Self.itemID(7))
        try edit.run()
        edit.reset()
        let edited = #expect(throws: LockboxError.self) { _ = try SyncState(path: path, device: Self.device, key: Self.key) }
        #expect(edited?.code == .decode)
        #expect(try Self.userVersion(path) == 0, "a refused conversion changes nothing")
        #expect(try Self.tables(path).contains("entries"))
    }

    @Test("An edited, swapped or emptied bucket is refused (errSecDecode), not acted on")
    func editedBucketRefused() throws {
        let (directory, path) = try Self.copyOfFixture()
        _ = directory
        _ = try SyncState(path: path, device: Self.device, key: Self.key)
        let database = try Database(path: path, create: false)
        let bucket = SyncState.bucket(of: Self.itemID(5))
        let original = try #require(database.firstRow("SELECT body FROM item_buckets WHERE bucket = \(bucket)") { $0.blob(0) ?? [] })
        var edited = original
        edited[edited.count - 3] ^= 1
        let put = try database.statement("UPDATE item_buckets SET body = ? WHERE bucket = ?")
        put.bind(1, edited)
        put.bind(2, bucket)
        try put.run()
        put.reset()
        let state = try SyncState(path: path, device: Self.device, key: Self.key)
        let error = #expect(throws: LockboxError.self) { _ = try state.entry(Self.itemID(5)) }
        #expect(error?.code == .decode)
        // Another bucket's row (body and MAC) moved into this bucket's place.
        let other = try #require(database.firstRow("SELECT bucket FROM item_buckets WHERE bucket != \(bucket) LIMIT 1") { $0.integer(0) ?? -1 })
        try database.execute("DELETE FROM item_buckets WHERE bucket = \(bucket)")
        try database.execute("UPDATE item_buckets SET bucket = \(bucket) WHERE bucket = \(other)")
        let swapped = #expect(throws: LockboxError.self) {
            _ = try SyncState(path: path, device: Self.device, key: Self.key).entry(Self.itemID(5))
        }
        #expect(swapped?.code == .decode)
        // The row count edited in the progress.
        try database.execute("UPDATE progress SET row_count = row_count + 1")
        let counted = #expect(throws: LockboxError.self) { _ = try SyncState(path: path, device: Self.device, key: Self.key) }
        #expect(counted?.code == .decode)
    }

    /// Copies, as an attacker with write access to the file would, every row that holds bucket
    /// `bucket` of `kind` (0 items, 1 rows), or the progress when `bucket` is nil, from
    /// `snapshot` (an older copy of the state) over the current ones; with `remove`, deletes
    /// them instead.
    static func edit(_ path: String, kind: Int, bucket: Int?, from snapshot: String? = nil, remove: Bool = false) throws {
        let database = try Database(path: path, create: false)
        let table = kind == 0 ? "item_buckets" : "row_buckets"
        let hasGroups = try database.firstRow("SELECT count(*) FROM sqlite_schema WHERE name = 'mac_groups'") { $0.integer(0) ?? 0 } == 1
        // The bucket's group row in `mac_groups` (the groups of item buckets first) and its slot
        // (32 bytes) in it. (`||` makes text of blobs: the result is cast back.)
        let size = SyncState.macGroupSize
        let group = bucket.map { (kind == 0 ? 0 : SyncState.itemBucketCount / size) + $0 / size }
        let slot = bucket.map { ($0 % size) * 32 }
        if let snapshot {
            try database.execute("ATTACH DATABASE '\(snapshot)' AS old")
            if let bucket, let group, let slot {
                try database.execute("DELETE FROM \(table) WHERE bucket = \(bucket)")
                try database.execute("INSERT INTO \(table) SELECT * FROM old.\(table) WHERE bucket = \(bucket)")
                if hasGroups {
                    // The older copy's slot put in the current group row (the other buckets'
                    // slots as they are now), or the older group row when there is none now: a
                    // bucket row no group lists is left out of every listing (and refused when
                    // read by its index), so an attacker who wants it counted lists it too.
                    try database.execute("INSERT OR IGNORE INTO mac_groups SELECT * FROM old.mac_groups WHERE grp = \(group)")
                    try database.execute(
                        """
                        UPDATE mac_groups SET macs = CAST(substr(macs, 1, \(slot))
                            || coalesce((SELECT substr(macs, \(slot + 1), 32) FROM old.mac_groups WHERE grp = \(group)), zeroblob(32))
                            || substr(macs, \(slot + 33)) AS BLOB) WHERE grp = \(group)
                        """)
                }
            } else {
                try database.execute("INSERT OR REPLACE INTO progress SELECT * FROM old.progress")
            }
            try database.execute("DETACH DATABASE old")
        } else if remove, let bucket, let group, let slot {
            try database.execute("DELETE FROM \(table) WHERE bucket = \(bucket)")
            if hasGroups {
                try database.execute(
                    "UPDATE mac_groups SET macs = CAST(substr(macs, 1, \(slot)) || zeroblob(32) || substr(macs, \(slot + 33)) AS BLOB) WHERE grp = \(group)")
            }
        }
    }

    @Test("A bucket removed, or an older copy of a bucket or of the progress put back, is refused (errSecDecode), not read as the state")
    func removedOrReplayedBucketRefused() throws {
        let directory = TemporaryDirectory("lockbox-sync-state")
        let path = directory.file("vault.sync/group.db")
        let snapshot = directory.file("older.db")
        let first = Self.itemID(1)
        let second = Self.itemID(2)
        let state = try SyncState(path: path, device: "device-r", key: Self.key)
        // Item 1 in row 1, item 2 in row 2: the state an attacker copies.
        var changes = SyncState.Changes()
        changes.entries[first] = Self.entry(1)
        changes.entries[second] = Self.entry(2)
        changes.setRow(Self.reference(1), .some(first))
        changes.setRow(Self.reference(2), .some(second))
        changes.cursor = 10
        try state.commit(changes)
        try Database(path: path, create: false).execute("VACUUM INTO '\(snapshot)'")
        // Then item 1 changes, row 2 goes away (its delete pushed).
        changes = SyncState.Changes()
        changes.entries[first] = Self.entry(11)
        changes.setRow(Self.reference(2), .none)
        changes.cursor = 20
        try state.commit(changes)
        try Database(path: path, create: false).execute("VACUUM INTO '\(directory.file("current.db"))'")
        func restore() throws {
            for id in [first, second] { try Self.edit(path, kind: 0, bucket: SyncState.bucket(of: id), from: directory.file("current.db")) }
            for index in [1, 2] {
                try Self.edit(path, kind: 1, bucket: SyncState.bucket(of: Self.reference(index)), from: directory.file("current.db"))
            }
            try Self.edit(path, kind: 0, bucket: nil, from: directory.file("current.db"))
            // Every group row as it was (an edit may have added one the current state has not).
            let database = try Database(path: path, create: false)
            try database.execute("ATTACH DATABASE '\(directory.file("current.db"))' AS old")
            try database.execute("DELETE FROM mac_groups; INSERT INTO mac_groups SELECT * FROM old.mac_groups")
            try database.execute("DETACH DATABASE old")
            let state = try SyncState(path: path, device: "device-r", key: Self.key)
            #expect(try state.entry(first) == Self.entry(11))
            #expect(try state.row(Self.reference(2)) == nil)
        }
        // Each group of buckets is checked when one of its buckets is first read: what was
        // edited is refused at the first read that would use it, and by the full listings (of
        // rows, the slow path that finds deletes; of entries, for `sync status`), which read
        // every group.
        func expectRefused(_ comment: Comment) {
            let error = #expect(throws: LockboxError.self, comment) {
                let state = try SyncState(path: path, device: "device-r", key: Self.key)
                _ = try state.entry(first)
                _ = try state.entry(second)
                _ = try state.row(Self.reference(1))
                _ = try state.row(Self.reference(2))
                _ = try state.isEmpty
                var changes = SyncState.Changes()
                changes.cursor = 30
                try state.commit(changes)
            }
            #expect(error?.code == .decode, comment)
            let listing = #expect(throws: LockboxError.self, comment) {
                let state = try SyncState(path: path, device: "device-r", key: Self.key)
                _ = try state.allRows()
                _ = try state.liveEntryCount
            }
            #expect(listing?.code == .decode, comment)
        }
        try restore()
        // The group rows (in `mac_groups`, item groups first) of item 1's bucket and row 1's.
        let itemGroup = SyncState.bucket(of: first) / SyncState.macGroupSize
        let rowGroup = SyncState.itemBucketCount / SyncState.macGroupSize + SyncState.bucket(of: Self.reference(1)) / SyncState.macGroupSize

        let edits: [(Comment, () throws -> Void)] = [
            // Item 1's older entry.
            ("an older item bucket", { try Self.edit(path, kind: 0, bucket: SyncState.bucket(of: first), from: snapshot) }),
            // Row 2 known again, which a push takes for a delete of item 2.
            ("an older row bucket", { try Self.edit(path, kind: 1, bucket: SyncState.bucket(of: Self.reference(2)), from: snapshot) }),
            ("a removed item bucket", { try Self.edit(path, kind: 0, bucket: SyncState.bucket(of: first), remove: true) }),
            ("a removed row bucket", { try Self.edit(path, kind: 1, bucket: SyncState.bucket(of: Self.reference(1)), remove: true) }),
            // Cursor 10, with the newer buckets.
            ("an older progress", { try Self.edit(path, kind: 0, bucket: nil, from: snapshot) }),
            // The group row of item 1's bucket cut to its first half (its other slots gone).
            ("a group row cut short", {
                try Database(path: path, create: false).execute(
                    "UPDATE mac_groups SET macs = CAST(substr(macs, 1, \(SyncState.macGroupSize * 16)) AS BLOB) WHERE grp = \(itemGroup)")
            }),
            // The group rows of item 1's bucket and of row 1's bucket trade places.
            ("two group rows swapped", {
                try Database(path: path, create: false).execute(
                    """
                    UPDATE mac_groups SET grp = -1 WHERE grp = \(itemGroup);
                    UPDATE mac_groups SET grp = \(itemGroup) WHERE grp = \(rowGroup);
                    UPDATE mac_groups SET grp = \(rowGroup) WHERE grp = -1;
                    """)
            }),
        ]
        for (comment, edit) in edits {
            try edit()
            expectRefused(comment)
            try restore()
        }
        // Every bucket removed: not a new, empty state.
        try Self.edit(path, kind: 0, bucket: SyncState.bucket(of: first), remove: true)
        try Self.edit(path, kind: 0, bucket: SyncState.bucket(of: second), remove: true)
        try Self.edit(path, kind: 1, bucket: SyncState.bucket(of: Self.reference(1)), remove: true)
        let emptied = #expect(throws: LockboxError.self) { _ = try SyncState(path: path, device: "device-r", key: Self.key).isEmpty }
        #expect(emptied?.code == .decode)
        try restore()
    }

    /// Turns a state of this format back into one of format 2 as that format's code wrote it:
    /// no `mac_groups`, no group digests in the progress, whose MAC is format 2's.
    static func secondFormat(_ path: String) throws {
        _ = try earlierFormat(
            path, label: "lockbox.sync.state.progress.v3", covered: [],
            then: "DROP TABLE mac_groups; ALTER TABLE progress DROP COLUMN buckets; PRAGMA user_version = 2")
    }

    /// Gives the progress the MAC of an earlier format, as that format's code made it: its
    /// label, then the device, cursor, generation, row count and accumulator, then the columns
    /// `covered` (each empty when NULL); then runs `then`, which drops what the format lacked.
    /// Returns the columns after `covered` up to the current format's last, as they were.
    static func earlierFormat(_ path: String, label: String, covered: [String], then sql: String) throws -> [[UInt8]] {
        let later = ["buckets", "unverified", "applying", "held_back"].filter { !covered.contains($0) }
        let database = try Database(path: path, create: false)
        let columns = (["device", "cursor", "generation", "row_count", "accumulator"] + covered + later).joined(separator: ", ")
        let count = covered.count + later.count
        var encoder = FieldEncoder()
        encoder.string(label)
        let found: [[UInt8]]? = try database.firstRow("SELECT \(columns) FROM progress") { (row: Statement) -> [[UInt8]] in
            encoder.string(row.text(0) ?? "")
            for index: Int32 in 1...3 { encoder.integer(row.integer(index) ?? 0) }
            encoder.bytes(row.blob(4))
            return (0..<count).map { (index: Int) -> [UInt8] in row.blob(Int32(5 + index)) ?? [] }
        }
        let progress = try #require(found)
        for column in progress.prefix(covered.count) { encoder.bytes(column) }
        let put = try database.statement("UPDATE progress SET mac = ?")
        put.bind(1, Crypto.keyedDigest(encoder.bytes, key: key))
        try put.run()
        put.reset()
        try database.execute(sql)
        return Array(progress.dropFirst(covered.count))
    }

    @Test("A state of format 2 (buckets without their list) is converted when opened, every bucket's MAC checked first")
    func secondFormatConverted() throws {
        let (directory, path) = try Self.copyOfFixture()
        _ = directory
        _ = try SyncState(path: path, device: Self.device, key: Self.key)
        try Self.secondFormat(path)
        #expect(try Self.userVersion(path) == 2)
        try Self.expectFixtureContent(try SyncState(path: path, device: Self.device, key: Self.key))
        #expect(try Self.userVersion(path) == SyncState.format)
        try Self.expectFixtureContent(try SyncState(path: path, device: Self.device, key: Self.key))

        // One with an edited bucket is refused and left as it was.
        let (other, edited) = try Self.copyOfFixture()
        _ = other
        _ = try SyncState(path: edited, device: Self.device, key: Self.key)
        try Self.secondFormat(edited)
        try Database(path: edited, create: false).execute(
            "UPDATE row_buckets SET body = body || x'00' WHERE bucket = \(SyncState.bucket(of: Self.reference(3)))")
        let error = #expect(throws: LockboxError.self) { _ = try SyncState(path: edited, device: Self.device, key: Self.key) }
        #expect(error?.code == .decode)
        #expect(try Self.userVersion(edited) == 2)
    }

    @Test("Two connections writing items of one bucket: each commit keeps what the other wrote")
    func concurrentWritersKeepEachOther() throws {
        let directory = TemporaryDirectory("lockbox-sync-state")
        let path = directory.file("vault.sync/group.db")
        // Two items that share a bucket.
        let first = Self.itemID(0)
        let second = try #require((1..<200_000).lazy.map(Self.itemID).first { SyncState.bucket(of: $0) == SyncState.bucket(of: first) })
        let one = try SyncState(path: path, device: "device-d", key: Self.key)
        #expect(try one.entry(first) == nil)
        let other = try SyncState(path: path, device: "device-d", key: Self.key)
        var changes = SyncState.Changes()
        changes.entries[second] = Self.entry(2)
        try other.commit(changes)
        changes = SyncState.Changes()
        changes.entries[first] = Self.entry(1)
        try one.commit(changes)
        #expect(try one.entry(second) == Self.entry(2), "the other connection's entry was lost")
        let reread = try SyncState(path: path, device: "device-d", key: Self.key)
        #expect(try reread.entry(first) == Self.entry(1))
        #expect(try reread.entry(second) == Self.entry(2))
    }

    @Test("A new state is written in buckets; a first pull's worth of records reads back whole")
    func newStateInBuckets() throws {
        let directory = TemporaryDirectory("lockbox-sync-state")
        let path = directory.file("vault.sync/group.db")
        let state = try SyncState(path: path, device: "device-b", key: Self.key)
        #expect(try state.isEmpty)
        var changes = SyncState.Changes()
        for index in 0..<3000 {
            changes.entries[Self.itemID(index)] = Self.entry(index)
            changes.verified[Self.itemID(index)] = Self.listed(index)
            changes.setRow(Self.reference(index), .some(Self.itemID(index)))
        }
        changes.replacesVerified = true
        changes.cursor = 3000
        changes.accumulator = [UInt8](repeating: 1, count: 32)
        try state.commit(changes)
        #expect(try Self.userVersion(path) == SyncState.format)
        let rows = try Database(path: path, create: false).firstRow("SELECT count(*) FROM item_buckets") { $0.integer(0) ?? 0 } ?? 0
        #expect(rows > 0 && rows <= SyncState.itemBucketCount)
        let reread = try SyncState(path: path, device: "device-b", key: Self.key)
        #expect(try reread.rowCount == 3000)
        #expect(try reread.liveEntryCount == 3000 - 300)
        for index in stride(from: 0, to: 3000, by: 7) {
            #expect(try reread.entry(Self.itemID(index)) == Self.entry(index))
            #expect(try reread.verified(Self.itemID(index)) == Self.listed(index))
            #expect(try reread.reference(of: Self.itemID(index)) == Self.reference(index))
        }
        // Another device identity starts over.
        let other = try SyncState(path: path, device: "device-c", key: Self.key)
        #expect(other.cursor == 0)
        #expect(try other.isEmpty)
    }

    /// Turns a state of this format back into one of format 3 as that format's code wrote it: no
    /// list of unverified writes, the progress's MAC format 3's. The state must list none.
    static func thirdFormat(_ path: String) throws {
        let dropped = try earlierFormat(
            path, label: "lockbox.sync.state.progress.v5", covered: ["buckets"],
            then:
                "ALTER TABLE progress DROP COLUMN unverified; ALTER TABLE progress DROP COLUMN applying; ALTER TABLE progress DROP COLUMN held_back; PRAGMA user_version = 3")
        #expect(dropped[0].isEmpty)
    }

    /// Turns a state of this format back into one of format 4 as that format's code wrote it: no
    /// list of rows being added, the progress's MAC format 4's. The state must list none.
    static func fourthFormat(_ path: String) throws {
        let dropped = try earlierFormat(
            path, label: "lockbox.sync.state.progress.v6", covered: ["buckets", "unverified"],
            then: "ALTER TABLE progress DROP COLUMN applying; ALTER TABLE progress DROP COLUMN held_back; DROP TABLE applying_rows; PRAGMA user_version = 4")
        #expect(try SyncState.ApplyingList(dropped[0], path: path).count == 0)
    }

    /// Turns a state of this format back into one of format 5 as that format's code wrote it: no
    /// list of items held back, the progress's MAC format 5's. The state must list none.
    static func fifthFormat(_ path: String) throws {
        let dropped = try earlierFormat(
            path, label: "lockbox.sync.state.progress.v7", covered: ["buckets", "unverified", "applying"],
            then: "ALTER TABLE progress DROP COLUMN held_back; PRAGMA user_version = 5")
        #expect(dropped[0].isEmpty)
    }

    @Test("A state of format 5 is converted when opened, its unverified writes and rows being added kept; the items held back are kept under the progress's MAC, an edit of them refused")
    func fifthFormatConvertedAndHeldBackKept() throws {
        let (directory, path) = try Self.copyOfFixture()
        _ = directory
        let (state, unverified) = try Self.withUnverifiedWrite(path)
        let adding = [Self.reference(900): Self.applying(1)]
        try state.recordApplying(adding)
        try Self.fifthFormat(path)
        #expect(try Self.userVersion(path) == 5)
        let converted = try Self.converted(path, keeping: unverified)
        #expect(converted.applying == adding)
        #expect(converted.heldBack.isEmpty)

        // Held back, read back, added to, released.
        var held = SyncState.Changes()
        held.heldBack = [Self.itemID(2): true, Self.itemID(3): true]
        try converted.commit(held)
        #expect(try SyncState(path: path, device: Self.device, key: Self.key).heldBack == [Self.itemID(2), Self.itemID(3)])
        var released = SyncState.Changes()
        released.heldBack = [Self.itemID(2): false, Self.itemID(4): true]
        try converted.commit(released)
        #expect(converted.heldBack == [Self.itemID(3), Self.itemID(4)])
        let reopened = try SyncState(path: path, device: Self.device, key: Self.key)
        #expect(reopened.heldBack == [Self.itemID(3), Self.itemID(4)])
        #expect(reopened.unverifiedWrites == unverified.unverified)
        #expect(reopened.applying == adding)
        try Self.expectFixtureContent(reopened)

        // The list edited in the file (emptied, an item dropped or added): refused, not taken
        // for items that may be applied here.
        let earlier = try copyState(path)
        try converted.commit(held)
        try Self.expectRefused(path, after: [
            "UPDATE progress SET held_back = NULL", "UPDATE progress SET held_back = substr(held_back, 1, length(held_back) - 1)",
        ])
        // An earlier list put in the progress: refused.
        do {
            let (other, replayed) = try Self.copyOfFixture()
            _ = other
            try restoreState(try copyState(path), at: replayed)
            try restoreState(earlier, at: replayed + ".earlier")
            try Database(path: replayed, create: false).execute(
                "ATTACH DATABASE '\(replayed).earlier' AS earlier; UPDATE progress SET held_back = (SELECT held_back FROM earlier.progress)")
            let error = #expect(throws: LockboxError.self) { _ = try SyncState(path: replayed, device: Self.device, key: Self.key) }
            #expect(error?.code == .decode)
        }
    }

    /// The state at `path`, given one unverified write (what its conversions must keep).
    static func withUnverifiedWrite(_ path: String) throws -> (SyncState, SyncState.Changes) {
        let state = try SyncState(path: path, device: device, key: key)
        var unverified = SyncState.Changes()
        unverified.unverified = [itemID(1): listed(401)]
        try state.commit(unverified)
        return (state, unverified)
    }

    /// The state at `path` opened (converted to this format), with the fixture's content and
    /// the unverified write of `unverified` (``withUnverifiedWrite(_:)``).
    static func converted(_ path: String, keeping unverified: SyncState.Changes) throws -> SyncState {
        let converted = try SyncState(path: path, device: device, key: key)
        #expect(try userVersion(path) == SyncState.format)
        try expectFixtureContent(converted)
        #expect(converted.unverifiedWrites == unverified.unverified)
        return converted
    }

    /// A copy of the state at `path` with each of `edits` made to it is refused when opened
    /// (errSecDecode), not read as the state.
    static func expectRefused(_ path: String, after edits: [String]) throws {
        for edit in edits {
            let (other, edited) = try copyOfFixture()
            _ = other
            try restoreState(try copyState(path), at: edited)
            try Database(path: edited, create: false).execute(edit)
            let error = #expect(throws: LockboxError.self, "\(edit)") { _ = try SyncState(path: edited, device: device, key: key) }
            #expect(error?.code == .decode)
        }
    }

    static func applying(_ index: Int) -> SyncState.Applying {
        SyncState.Applying(id: itemID(index), entry: entry(index))
    }

    @Test("A state of format 4 is converted when opened (no row being added, its unverified writes kept); the rows being added are kept under the progress's MAC, an edit of them refused, a list put in a format-4 file outside Lockbox not taken")
    func fourthFormatConvertedAndRowsBeingAddedKept() throws {
        let (directory, path) = try Self.copyOfFixture()
        _ = directory
        let (_, unverified) = try Self.withUnverifiedWrite(path)
        try Self.fourthFormat(path)
        #expect(try Self.userVersion(path) == 4)
        let converted = try Self.converted(path, keeping: unverified)
        #expect(converted.applying.isEmpty)

        // Listed, read back, added to, settled.
        let first = [Self.reference(900): Self.applying(1), Self.reference(901): Self.applying(2)]
        try converted.recordApplying(first)
        #expect(try SyncState(path: path, device: Self.device, key: Self.key).applying == first)
        try converted.recordApplying([Self.reference(902): Self.applying(3)])
        var expected = first
        expected[Self.reference(902)] = Self.applying(3)
        #expect(try SyncState(path: path, device: Self.device, key: Self.key).applying == expected)
        try Self.expectFixtureContent(try SyncState(path: path, device: Self.device, key: Self.key))

        // The list edited in the file (a listing dropped, copied, renumbered or edited, the
        // progress's list removed): refused. A listing dropped would forget a delete made here.
        try Self.expectRefused(path, after: [
            "DELETE FROM applying_rows WHERE rowid = (SELECT min(rowid) FROM applying_rows)", "UPDATE progress SET applying = NULL",
            "UPDATE applying_rows SET body = body || x'00' WHERE rowid = (SELECT min(rowid) FROM applying_rows)",
            "INSERT INTO applying_rows SELECT listing + 2, body, mac FROM applying_rows WHERE rowid = (SELECT min(rowid) FROM applying_rows)",
            "UPDATE applying_rows SET listing = listing + 5 WHERE rowid = (SELECT max(rowid) FROM applying_rows)",
        ])
        // A row of an earlier list put back after the list was settled: refused too.
        let earlier = try copyState(path)

        var settled = SyncState.Changes()
        settled.settlesApplying = true
        try converted.commit(settled)
        #expect(try SyncState(path: path, device: Self.device, key: Self.key).applying.isEmpty)
        #expect(try SyncState(path: path, device: Self.device, key: Self.key).unverifiedWrites == unverified.unverified)
        try converted.recordApplying([Self.reference(904): Self.applying(4)])
        do {
            let (other, replayed) = try Self.copyOfFixture()
            _ = other
            try restoreState(try copyState(path), at: replayed)
            let database = try Database(path: replayed, create: false)
            try restoreState(earlier, at: replayed + ".earlier")
            try database.execute("ATTACH DATABASE '\(replayed).earlier' AS earlier; INSERT OR REPLACE INTO applying_rows SELECT * FROM earlier.applying_rows LIMIT 1")
            let error = #expect(throws: LockboxError.self) { _ = try SyncState(path: replayed, device: Self.device, key: Self.key) }
            #expect(error?.code == .decode)
        }
        try converted.commit(settled)

        // A format-4 file given a list outside Lockbox: its MAC never covered one, none is taken.
        try converted.recordApplying([Self.reference(905): Self.applying(5)])
        let rows = try copyState(path)
        try converted.commit(settled)
        try Self.fourthFormat(path)
        let database = try Database(path: path, create: false)
        try restoreState(rows, at: path + ".rows")
        try database.execute(
            """
            ALTER TABLE progress ADD COLUMN applying BLOB; ATTACH DATABASE '\(path).rows' AS rows;
            CREATE TABLE applying_rows AS SELECT * FROM rows.applying_rows; DETACH DATABASE rows
            """)
        #expect(try SyncState(path: path, device: Self.device, key: Self.key).applying.isEmpty)
    }

    @Test("A state of format 3 is converted when opened (no unverified write); the unverified writes are kept under the progress's MAC, an edit of them refused")
    func thirdFormatConvertedAndUnverifiedWritesKept() throws {
        let (directory, path) = try Self.copyOfFixture()
        _ = directory
        _ = try SyncState(path: path, device: Self.device, key: Self.key)
        try Self.thirdFormat(path)
        #expect(try Self.userVersion(path) == 3)
        let converted = try SyncState(path: path, device: Self.device, key: Self.key)
        #expect(try Self.userVersion(path) == SyncState.format)
        try Self.expectFixtureContent(converted)
        #expect(converted.unverifiedWrites.isEmpty)

        // Written, read back, added to, cleared.
        var changes = SyncState.Changes()
        changes.unverified = [Self.itemID(1): Self.listed(401), Self.itemID(2): Self.listed(402)]
        try converted.commit(changes)
        #expect(try SyncState(path: path, device: Self.device, key: Self.key).unverifiedWrites == changes.unverified)
        var more = SyncState.Changes()
        more.unverified = [Self.itemID(2): Self.listed(403), Self.itemID(3): Self.listed(404)]
        try converted.commit(more)
        let expected = [Self.itemID(1): Self.listed(401), Self.itemID(2): Self.listed(403), Self.itemID(3): Self.listed(404)]
        #expect(converted.unverifiedWrites == expected)
        #expect(try SyncState(path: path, device: Self.device, key: Self.key).unverifiedWrites == expected)

        // The list edited in the file (an entry dropped, so a lost write would go unnoticed): refused.
        let (other, edited) = try Self.copyOfFixture()
        _ = other
        try restoreState(try copyState(path), at: edited)
        let database = try Database(path: edited, create: false)
        try database.execute("UPDATE progress SET unverified = NULL")
        let error = #expect(throws: LockboxError.self) { _ = try SyncState(path: edited, device: Self.device, key: Self.key) }
        #expect(error?.code == .decode)

        var cleared = SyncState.Changes()
        cleared.clearsUnverified = true
        try converted.commit(cleared)
        #expect(try SyncState(path: path, device: Self.device, key: Self.key).unverifiedWrites.isEmpty)
        try Self.expectFixtureContent(try SyncState(path: path, device: Self.device, key: Self.key))
    }

    @Test("A state of format 3 whose progress gained a list of unverified writes outside Lockbox is converted without it (its MAC never covered one)")
    func thirdFormatTakesNoListFromTheFile() throws {
        let (directory, path) = try Self.copyOfFixture()
        _ = directory
        _ = try SyncState(path: path, device: Self.device, key: Self.key)
        try Self.thirdFormat(path)
        var list = FieldEncoder()
        list.integer(1)
        list.string(Self.itemID(5))
        list.integer(999_999)
        list.bytes([UInt8](repeating: 7, count: 32))
        let database = try Database(path: path, create: false)
        try database.execute("ALTER TABLE progress ADD COLUMN unverified BLOB")
        let put = try database.statement("UPDATE progress SET unverified = ?")
        put.bind(1, list.bytes)
        try put.run()
        put.reset()
        let converted = try SyncState(path: path, device: Self.device, key: Self.key)
        #expect(converted.unverifiedWrites.isEmpty)
        #expect(try SyncState(path: path, device: Self.device, key: Self.key).unverifiedWrites.isEmpty)
        try Self.expectFixtureContent(converted)
    }
}
