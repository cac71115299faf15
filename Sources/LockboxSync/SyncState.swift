import Dispatch
import FoundationEssentials
import LockboxCore
import VaultCrypto
import VaultStorage

#if canImport(Glibc)
import Glibc
#endif

/// What one device knows of its group, in a small SQLite file next to its vault
/// (`VAULT.sync/GROUP.db`, mode 0600), so that a sync reads and writes only what changed:
///
/// - `progress`: how far this device has pulled (`cursor`, a database version) and pushed
///   (`generation`, the vault's write generation its last push covered), the digest of the
///   last head it verified, and how many vault rows it knows.
/// - Per item (opaque identifier): its *entry*, the last version this device saw or wrote (its
///   stamp, content digest and whether it is a tombstone); the version and head element
///   (``SyncHead``) of its record as the last verified head lists it (a pull checks what it
///   receives against the next head from these: withheld or replayed records); and the vault
///   row that holds it.
/// - Per vault row (persistent reference): the item it holds; nil for a synchronizable row that
///   does not sync (ThisDeviceOnly, access control). A row known here and gone from the vault is
///   a delete.
/// - `applying_rows` (format 5): the rows a sync is adding to the vault, listed before the vault
///   commits them and dropped once this state records them (``applying``), one SQLite row per
///   listing under a MAC binding the list's serial and the listing's number, their count and
///   the serial in the progress.
///
/// Items and rows are kept in buckets (format 2): items by a digest of their identifier in
/// `item_buckets` (``itemBucketCount``), rows by their reference in `row_buckets`
/// (``rowBucketCount``), one SQLite row per bucket holding all of its records, with one MAC. A
/// new device's first pull of 10,000 items writes about 9,500 rows (and as many MACs) instead of
/// 30,000 rows and 20,000 MACs; a pull of ten changes rewrites the buckets of those ten items
/// and of their rows. The first
/// format (one SQLite row per entry, per vault row and per head element; `user_version` 0) and
/// the second (buckets without their list) are converted when the file is opened, in one
/// transaction, every MAC checked first.
///
/// Nothing in it is secret (identifiers are opaque, digests keyed); every bucket and the
/// progress carry a MAC made with the device's state key; every bucket's MAC is also listed in
/// `mac_groups` (one row per group of 64 buckets), and the progress holds a keyed digest of
/// each group's row (format 3), a group checked before the first of its buckets is read. So an
/// edited, swapped or removed bucket, an older copy of one put back, or an older progress over
/// newer buckets (any of which could make this device push a delete the user never made) is an
/// error, not a reason to act.
///
/// Each phase of a sync updates it in one SQLite transaction after the database committed; a
/// crash before that only repeats work: pushing an item whose record is already the
/// database's writes nothing, and pulling a record already applied changes nothing (the rows
/// it added are known from the list of rows being added).
final class SyncState {
    struct Entry: Equatable {
        var stamp: SyncStamp
        var contentDigest: [UInt8]
        var isTombstone: Bool
    }

    /// A row a sync is adding to the vault, or one of this vault a push is writing that this
    /// state does not know yet (``SyncState/applying``): the item it holds, and the entry of the
    /// record it holds (applied from the database, or written to it when `pushed`).
    struct Applying: Equatable {
        var id: String
        var entry: Entry
        /// Listed by a push before its database transaction: the record is the item's in the
        /// group only if the database holds it with this stamp.
        var pushed = false
    }

    /// One item's record as a verified head lists it.
    struct Listed: Equatable {
        var version: Int64
        var element: [UInt8]
    }

    /// What the state holds of one item.
    struct ItemRecord: Equatable {
        var entry: Entry?
        var listed: Listed?
        /// The vault row that holds it.
        var reference: Data?

        var isEmpty: Bool { entry == nil && listed == nil && reference == nil }
    }

    /// The format this build writes (`PRAGMA user_version`): 6, buckets whose MACs are also listed
    /// in `mac_groups`, each group's row digested in the progress, and the progress listing this
    /// device's writes no verified head has listed yet, the rows a pull is adding to the vault
    /// and the group's items held back by a local item of their key. (0: the first format; 2:
    /// buckets alone; 3: none of the lists; 4: no rows being added; 5: no items held back.)
    static let format = 6
    /// Buckets of items: about 12 items (3 KiB) each at 100,000, so that a pull of ten changes
    /// rewrites about as many bytes as ten rows per record did.
    static let itemBucketCount = 8192
    /// Buckets of rows (a row's record is a sixth of an item's): 25 rows (1 KiB) each at 100,000.
    static let rowBucketCount = 4096
    /// Buckets per group of MACs (``BucketDirectory``): 128 groups of item buckets, then 64 of
    /// row buckets, each a row of 64 slots of 32 bytes (2 KiB, which fits a page of the file
    /// with room to spare: a group is read, digested and rewritten without an overflow page).
    static let macGroupSize = 64

    private let database: Database
    private let key: SecretBytes
    let device: String
    private(set) var cursor: Int64
    private(set) var generation: Int
    /// The digest of the head at `cursor` this device verified; nil before its first verified
    /// pull (or in a state from before heads): the next pull then starts from version 0.
    private(set) var accumulator: [UInt8]?
    /// Records this device wrote while the database's head was not the one it had verified
    /// (another device wrote since its last pull): the version and head element of each, by
    /// item, until a pull verifies a head that lists them, or a later record of the item.
    /// A pull that does not receive one of them finds the write undone in the database.
    private(set) var unverifiedWrites: [String: Listed] = [:]
    /// Rows a pull was adding to the vault (the item each holds and its record's entry), listed
    /// before the vault committed them and dropped once this state recorded them: left here,
    /// the process stopped in between. Each such row the vault holds, or deleted since (its
    /// deletion record says when), is the item's; one it neither holds nor deleted was never
    /// committed. Without the list a row added so and deleted before this state learned of it
    /// would leave no trace here, and the next pull would bring the item back.
    private(set) var applying: [Data: Applying] = [:]
    /// The group's items a pull did not apply because an item of this vault that does not sync
    /// (ThisDeviceOnly, or under access control) holds their primary key: the user's local item
    /// is neither overwritten nor duplicated. Each pull tries them again (their records as the
    /// verified head lists them), and applies one once its key is free here.
    private(set) var heldBack: Set<String> = []
    /// The item a push listed the vault row `reference` as holding (``Applying/pushed``), if any.
    func pushedListing(of reference: Data) -> String? {
        applying[reference].flatMap { $0.pushed ? $0.id : nil }
    }
    /// Buckets read and verified so far (or written by this object), by index, while no other
    /// connection has written the file (`PRAGMA data_version` still `cachedVersion`).
    private var itemBuckets: [Int: [String: ItemRecord]] = [:]
    private var rowBuckets: [Int: [Data: String?]] = [:]
    /// The buckets' listed MACs, each group checked against the progress's digest of it when
    /// first met; kept while no other connection has written the file.
    private var directory: BucketDirectory?
    private var cachedVersion: Int?

    static func path(vault: String, groupID: String) -> String { vault + ".sync/" + groupID + ".db" }

    /// Removes the state at `path` (with its log) of a device identity this keychain no longer
    /// has: its MACs are under that device's state key, which went with it, so it can be neither
    /// checked nor used. Returns the device it names, if it can be read (a hint, not checked),
    /// nil when there was none.
    static func removeStale(path: String) throws(LockboxError) -> String? {
        // The mark of a refused reset goes with the state, also when the state itself is gone.
        if unlink(path + ".reset-refused") != 0 && errno != ENOENT {
            throw LockboxError(.io, "Cannot remove \(path).reset-refused, left by this keychain's earlier device. Check the directory's permissions.")
        }
        guard FileManager.default.fileExists(atPath: path) else { return nil }
        let device = device(atPath: path)
        for file in [path, path + "-wal", path + "-shm"] where unlink(file) != 0 && errno != ENOENT {
            throw LockboxError(.io, "Cannot remove \(file), the sync state of this keychain's earlier device. Check the directory's permissions.")
        }
        return device
    }

    /// The device a state at `path` names (without checking it), if any.
    static func device(atPath path: String) -> String? {
        guard FileManager.default.fileExists(atPath: path), let database = try? Database(path: path, create: false) else { return nil }
        let named = try? database.firstRow("SELECT device FROM progress") { (row: Statement) -> String in row.text(0) ?? "" }
        guard let text = named ?? nil, SyncGroup.isDeviceIdentifier(text) else { return nil }
        return text
    }

    /// The error for a state that fails its checks (edited, or damaged). The keychain is not
    /// affected, and restoring it from a backup would lose what it gained since: the state is
    /// rebuilt from the group instead (``SyncGroup/resetState()``).
    static func damaged(_ path: String) -> LockboxError {
        LockboxError(
            .decode,
            "This device's sync state (\(path)) failed its integrity check: it was modified, or is damaged. The keychain's "
                + "items are not affected: do not restore the keychain. Run `lockbox sync reset` to rebuild the state from the group: "
                + "for the items the group holds, its versions then replace this keychain's (the reset first says how many items "
                + "changed here since the last sync it would replace, if any, and asks for --discard-local-changes).")
    }

    /// Opens (creating when missing, converting one of the first format) the state of `device`
    /// in the group.
    convenience init(path: String, device: String, key: SecretBytes) throws(LockboxError) {
        let directory = String(path[..<(path.lastIndex(of: "/") ?? path.startIndex)])
        if !directory.isEmpty { try SyncFiles.prepareDirectory(directory) }
        try SyncFiles.prepareFile(path)
        for companion in [path + "-wal", path + "-shm"] { try SyncFiles.narrowIfPresent(companion) }
        do {
            try self.init(opening: path, device: device, key: key)
        } catch where Database.isDamage(error) {
            // SQLite's "not a database" or "damaged" is said of this state, with its remedy (not
            // a keychain restored from a backup).
            throw Self.damaged(path)
        }
    }

    private init(opening path: String, device: String, key: SecretBytes) throws(LockboxError) {
        database = try Database(path: path, create: true)
        // The write-ahead log is synced at checkpoints, not at every commit: a power loss may
        // then take back the last commits of this file, which leaves it as a crash just before
        // them would (behind the vault and the database, which a sync already recovers from:
        // it repeats work, never loses or duplicates any). The vault itself stays fully
        // synchronous.
        try database.execute("PRAGMA synchronous=NORMAL")
        // Nor is it checkpointed when this connection closes (at the end of every sync): a
        // sync then writes the file without a single sync of the disk. The log is kept short,
        // since the next connection reads all of it first: checkpointed automatically past 100
        // pages, and emptied after a large commit (``commit(_:)``).
        try database.keepWriteAheadLogOnClose()
        try database.execute("PRAGMA wal_autocheckpoint=100")
        self.key = key
        self.device = device
        try Self.prepare(database, key: key)
        let progress = try Self.readProgress(database, key: key)
        if let progress, progress.device == device {
            cursor = progress.cursor
            generation = progress.generation
            accumulator = progress.accumulator
            unverifiedWrites = try Self.decodeUnverified(progress.unverified, path: path)
            applying = try Self.readApplying(progress.applying, database, key: key)
            heldBack = try Self.decodeHeldBack(progress.heldBack, path: path)
        } else {
            cursor = 0
            generation = 0
            if progress != nil {
                // The state of another device identity (joined again): start over; the first
                // sync adopts what the database already holds.
                try database.execute(
                    "DELETE FROM item_buckets; DELETE FROM row_buckets; DELETE FROM mac_groups; DELETE FROM applying_rows; DELETE FROM progress")
            }
        }
    }

    // MARK: The file's format

    /// Creates the tables of ``format``, or converts a file of the first format, in one
    /// transaction. A file of a later format is refused.
    private static func prepare(_ database: Database, key: SecretBytes) throws(LockboxError) {
        let found = try database.userVersion
        guard found <= format else {
            throw LockboxError(
                .param,
                "The sync state \(database.path) has format \(found), newer than this Lockbox (\(format)). "
                    + "Upgrade Lockbox to sync this keychain.")
        }
        guard found < format else { return }
        try database.writeTransaction { () throws(LockboxError) in
            // Read again inside the transaction: another process may have converted it meanwhile.
            let found = try database.userVersion
            guard found < format else { return }
            let firstFormat = found == 0 ? try hasTable("entries", database) : false
            if found == 0, try hasTable("progress", database) {
                // The first format's progress, possibly from before heads.
                if try !hasColumn("accumulator", of: "progress", database) {
                    try database.execute("ALTER TABLE progress ADD COLUMN accumulator BLOB")
                }
                try database.execute("ALTER TABLE progress ADD COLUMN row_count INTEGER NOT NULL DEFAULT 0")
            }
            try database.execute(
                """
                CREATE TABLE IF NOT EXISTS progress (
                    id INTEGER PRIMARY KEY CHECK (id = 1), device TEXT NOT NULL, cursor INTEGER NOT NULL,
                    generation INTEGER NOT NULL, mac BLOB NOT NULL, accumulator BLOB, row_count INTEGER NOT NULL DEFAULT 0,
                    buckets BLOB, unverified BLOB, applying BLOB, held_back BLOB);
                CREATE TABLE IF NOT EXISTS item_buckets (bucket INTEGER PRIMARY KEY, body BLOB NOT NULL, mac BLOB NOT NULL);
                CREATE TABLE IF NOT EXISTS row_buckets (bucket INTEGER PRIMARY KEY, body BLOB NOT NULL, mac BLOB NOT NULL);
                CREATE TABLE IF NOT EXISTS mac_groups (grp INTEGER PRIMARY KEY, macs BLOB NOT NULL);
                CREATE TABLE IF NOT EXISTS applying_rows (listing INTEGER PRIMARY KEY, body BLOB NOT NULL, mac BLOB NOT NULL);
                """)
            if try !hasColumn("buckets", of: "progress", database) {
                try database.execute("ALTER TABLE progress ADD COLUMN buckets BLOB")
            }
            if try !hasColumn("unverified", of: "progress", database) {
                try database.execute("ALTER TABLE progress ADD COLUMN unverified BLOB")
            }
            if try !hasColumn("applying", of: "progress", database) {
                try database.execute("ALTER TABLE progress ADD COLUMN applying BLOB")
            }
            if try !hasColumn("held_back", of: "progress", database) {
                try database.execute("ALTER TABLE progress ADD COLUMN held_back BLOB")
            }
            if firstFormat {
                try convertFirstFormat(database, key: key)
            } else if found == 2 {
                try convertSecondFormat(database, key: key)
            } else if (3...5).contains(found),
                var progress = try readProgress(database, key: key, authenticated: { progressMAC($0, key: $1, format: found) })
            {
                // Its MAC does not cover the lists it lacks: none is taken from the file.
                if found == 3 { progress.unverified = [] }
                if found <= 4 { progress.applying = [] }
                progress.heldBack = found == 5 ? encodeHeldBack(try skippedItems(progress, database, key: key)) : []
                try writeProgress(progress, database, key: key)
            }
            // Rows of a list no progress of an earlier format vouched for.
            if found != 5 { try database.execute("DELETE FROM applying_rows") }
            try database.execute("PRAGMA user_version = \(format)")
        }
    }

    /// The items a state of format 5 skipped: a pull of that format did not apply a record whose
    /// key a local item that does not sync held, and moved its cursor past it, leaving the item
    /// a head element but neither a record of it nor a row (as nothing else does for long: an
    /// item whose row the pull left to the next push keeps its row). Held back from format 6,
    /// so that they arrive once their key is free (and are released at once otherwise).
    private static func skippedItems(_ progress: Progress, _ database: Database, key: SecretBytes) throws(LockboxError) -> Set<String> {
        let directory = try BucketDirectory.stored(progress: progress, database, key: key)
        var skipped: Set<String> = []
        for index in try directory.buckets(.items) {
            for (id, record) in try readItems(index, database, key: key, directory: directory)
            where record.listed != nil && record.entry == nil && record.reference == nil {
                skipped.insert(id)
            }
        }
        return skipped
    }

    private static func hasTable(_ name: String, _ database: Database) throws(LockboxError) -> Bool {
        let statement = try database.statement("SELECT count(*) FROM sqlite_schema WHERE type = 'table' AND name = ?")
        defer { statement.reset() }
        statement.bind(1, name)
        _ = try statement.step()
        return statement.integer(0) == 1
    }

    private static func hasColumn(_ column: String, of table: String, _ database: Database) throws(LockboxError) -> Bool {
        let statement = try database.statement("SELECT count(*) FROM pragma_table_info(?) WHERE name = ?")
        defer { statement.reset() }
        statement.bind(1, table)
        statement.bind(2, column)
        _ = try statement.step()
        return statement.integer(0) == 1
    }

    /// Moves every entry, row and head element of the first format into buckets, each row's
    /// and entry's MAC and the progress's checked first, and drops the old tables.
    private static func convertFirstFormat(_ database: Database, key: SecretBytes) throws(LockboxError) {
        let failure = SyncState.damaged(database.path)
        var progress: Progress?
        do {
            let statement = try database.statement("SELECT device, cursor, generation, mac, accumulator FROM progress WHERE id = 1")
            defer { statement.reset() }
            if try statement.step() {
                let read = Progress(
                    device: statement.text(0) ?? "", cursor: Int64(statement.integer(1) ?? -1), generation: statement.integer(2) ?? -1,
                    accumulator: statement.blob(4), rows: 0, buckets: [], unverified: [], applying: [], heldBack: [])
                guard SyncHead.equal(statement.blob(3) ?? [], firstFormatProgressMAC(read, key: key)) else { throw failure }
                progress = read
            }
        }
        var items: [String: ItemRecord] = [:]
        do {
            let statement = try database.statement("SELECT item_id, modified, writer, digest, tombstone, mac FROM entries")
            defer { statement.reset() }
            while try statement.step() {
                guard let id = statement.text(0) else { throw failure }
                let entry = Entry(
                    stamp: SyncStamp(modified: Int64(statement.integer(1) ?? 0), device: statement.text(2) ?? ""),
                    contentDigest: statement.blob(3) ?? [], isTombstone: statement.integer(4) == 1)
                guard SyncHead.equal(statement.blob(5) ?? [], firstFormatEntryMAC(id, entry, key: key)) else { throw failure }
                items[id, default: ItemRecord()].entry = entry
            }
        }
        var rows: [Data: String?] = [:]
        do {
            let statement = try database.statement("SELECT reference, item_id, mac FROM rows")
            defer { statement.reset() }
            while try statement.step() {
                let reference = statement.blob(0) ?? []
                let id = statement.text(1)
                guard SyncHead.equal(statement.blob(2) ?? [], firstFormatRowMAC(reference, id, key: key)) else { throw failure }
                rows.updateValue(id, forKey: Data(reference))
                if let id { items[id, default: ItemRecord()].reference = Data(reference) }
            }
        }
        do {
            // Head elements had no MAC: an edited one only makes the next head check fail.
            let statement = try database.statement("SELECT item_id, version, element FROM verified")
            defer { statement.reset() }
            while try statement.step() {
                guard let id = statement.text(0) else { throw failure }
                items[id, default: ItemRecord()].listed = Listed(version: Int64(statement.integer(1) ?? 0), element: statement.blob(2) ?? [])
            }
        }
        var itemBuckets: [Int: [String: ItemRecord]] = [:]
        for (id, record) in items { itemBuckets[bucket(of: id), default: [:]][id] = record }
        var rowBuckets: [Int: [Data: String?]] = [:]
        for (reference, id) in rows { rowBuckets[bucket(of: reference), default: [:]].updateValue(id, forKey: reference) }
        let directory = BucketDirectory.new(database, key: key)
        try write(items: itemBuckets, rows: rowBuckets, database, key: key, directory: directory)
        if var progress {
            progress.rows = rows.count
            progress.buckets = try directory.sealed()
            try writeProgress(progress, database, key: key)
        }
        try database.execute("DROP TABLE entries; DROP TABLE rows; DROP TABLE verified")
    }

    /// Lists every bucket's MAC of a state of format 2 in `mac_groups` (each bucket's MAC
    /// checked first) and puts their groups' digests in the progress (its MAC of format 2
    /// checked first).
    private static func convertSecondFormat(_ database: Database, key: SecretBytes) throws(LockboxError) {
        let failure = SyncState.damaged(database.path)
        // Its `buckets` column was just added, empty; format 2's MAC does not cover it.
        var progress = try readProgress(database, key: key) { progressMAC($0, key: $1, format: 2) }
        // Its MAC does not cover a list of unverified writes or rows being added: none is taken
        // from the file.
        progress?.unverified = []
        progress?.applying = []
        progress?.heldBack = []
        let directory = BucketDirectory.new(database, key: key)
        for kind in [BucketKind.items, .rows] {
            let statement = try database.statement("SELECT bucket, body, mac FROM \(kind.table)")
            defer { statement.reset() }
            while try statement.step() {
                guard let index = statement.integer(0), let mac = statement.blob(2),
                    SyncHead.equal(mac, bucketMAC(kind, index, statement.blob(1) ?? [], key: key))
                else { throw failure }
                try directory.set(kind, index, mac: mac)
            }
        }
        if var progress {
            progress.buckets = try directory.sealed()
            try writeProgress(progress, database, key: key)
        }
    }

    // MARK: MACs

    /// What `progress` holds.
    private struct Progress {
        var device: String
        var cursor: Int64
        var generation: Int
        var accumulator: [UInt8]?
        var rows: Int
        /// Each group of buckets' digest (``BucketDirectory``): a bucket removed, or an older copy
        /// put back, no longer matches its group's.
        var buckets: [UInt8]
        /// ``SyncState/unverifiedWrites``, encoded (empty for none).
        var unverified: [UInt8]
        /// The list of ``SyncState/applying``, whose rows are in `applying_rows`
        /// (``ApplyingList``), encoded (empty: serial 0, no row).
        var applying: [UInt8]
        /// ``SyncState/heldBack``, encoded (empty for none).
        var heldBack: [UInt8]
    }

    /// The progress's MAC in `format` (2: no sum of the buckets; 3: no list of unverified
    /// writes; 4: no list of rows being added; 5: no list of items held back; 6: the current one).
    private static func progressMAC(_ progress: Progress, key: SecretBytes, format: Int = SyncState.format) -> [UInt8] {
        var encoder = FieldEncoder()
        encoder.string(
            [
                "lockbox.sync.state.progress.v3", "lockbox.sync.state.progress.v5", "lockbox.sync.state.progress.v6",
                "lockbox.sync.state.progress.v7", "lockbox.sync.state.progress.v8",
            ][format - 2])
        encoder.string(progress.device)
        encoder.integer(Int(progress.cursor))
        encoder.integer(progress.generation)
        encoder.integer(progress.rows)
        encoder.bytes(progress.accumulator)
        if format >= 3 { encoder.bytes(progress.buckets) }
        if format >= 4 { encoder.bytes(progress.unverified) }
        if format >= 5 { encoder.bytes(progress.applying) }
        if format >= 6 { encoder.bytes(progress.heldBack) }
        return Crypto.keyedDigest(encoder.bytes, key: key)
    }

    private enum BucketKind: String {
        case items = "lockbox.sync.state.items.v2"
        case rows = "lockbox.sync.state.rows.v2"

        var table: String { self == .items ? "item_buckets" : "row_buckets" }
    }

    /// Every bucket's MAC as `mac_groups` lists them, checked a group at a time against the
    /// progress. The buckets of each kind are cut into groups of ``SyncState/macGroupSize``; each
    /// group is one row (a 32-byte slot per bucket, zeros for none), and the progress (under its
    /// MAC) holds a keyed digest of each group's row (32 zero bytes for a group without one). A
    /// group is read and checked the first time one of its buckets is read or written, so a sync
    /// of a few changes reads a few small rows, not every bucket's MAC. Each bucket's own MAC
    /// binds its body to its index; the group digests bind the set to the progress: a bucket
    /// removed, an older copy of one put back (with its MAC), or an
    /// older progress put back over newer buckets, no longer matches its group's digest. (The
    /// whole file put back as it was is a state from before the later syncs, as a crash leaves
    /// it; what a sync recovers from.)
    private final class BucketDirectory {
        static let groupSize = macGroupSize
        static let itemGroups = itemBucketCount / groupSize
        static let groupCount = itemGroups + rowBucketCount / groupSize
        static let digestSize = 32
        /// What the progress holds before any bucket exists.
        static let emptyDigests = [UInt8](repeating: 0, count: groupCount * digestSize)

        /// Each group's digest, as the progress holds them (changed groups updated by ``sealed()``).
        private var digests: [UInt8]
        /// The groups checked (or made here): each listed bucket's MAC.
        private var groups: [Int: [Int: [UInt8]]] = [:]
        private var changed: Set<Int> = []
        /// A directory built from nothing (a conversion): every group starts empty, unread.
        private let startsEmpty: Bool
        private let database: Database
        private let key: SecretBytes

        private init(digests: [UInt8], startsEmpty: Bool, _ database: Database, key: SecretBytes) {
            self.digests = digests
            self.startsEmpty = startsEmpty
            self.database = database
            self.key = key
        }

        /// A directory over what the file lists, checked against `progress` (none: no bucket
        /// may be listed) group by group as they are met.
        static func stored(progress: Progress?, _ database: Database, key: SecretBytes) throws(LockboxError) -> BucketDirectory {
            let digests = progress?.buckets ?? emptyDigests
            guard digests.count == emptyDigests.count else { throw SyncState.damaged(database.path) }
            return BucketDirectory(digests: digests, startsEmpty: false, database, key: key)
        }

        /// An empty directory whose buckets are all being written now (a conversion).
        static func new(_ database: Database, key: SecretBytes) -> BucketDirectory {
            BucketDirectory(digests: emptyDigests, startsEmpty: true, database, key: key)
        }

        static func group(_ kind: BucketKind, _ index: Int) -> Int { (kind == .items ? 0 : itemGroups) + index / groupSize }

        /// The MAC the directory lists for a bucket; nil when it lists none.
        func mac(_ kind: BucketKind, _ index: Int) throws(LockboxError) -> [UInt8]? {
            try listed(Self.group(kind, index))[index]
        }

        /// Every bucket of `kind` the directory lists, in order (each of its groups checked).
        func buckets(_ kind: BucketKind) throws(LockboxError) -> [Int] {
            let groups = kind == .items ? 0..<Self.itemGroups : Self.itemGroups..<Self.groupCount
            var found: [Int] = []
            for group in groups { found += try listed(group).keys.sorted() }
            return found
        }

        /// True when the progress vouches for no bucket at all.
        var listsNothing: Bool { SyncHead.equal(digests, Self.emptyDigests) }

        /// Records bucket `index`'s new MAC (nil: the bucket removed); its group's row and
        /// digest are written by ``sealed()``.
        func set(_ kind: BucketKind, _ index: Int, mac: [UInt8]?) throws(LockboxError) {
            let group = Self.group(kind, index)
            _ = try listed(group)
            groups[group]![index] = mac
            changed.insert(group)
        }

        /// Writes every changed group's row (removed when it lists nothing) and returns the
        /// group digests with theirs recomputed: what the progress written with these buckets
        /// holds.
        func sealed() throws(LockboxError) -> [UInt8] {
            let put = try database.statement("INSERT OR REPLACE INTO mac_groups (grp, macs) VALUES (?, ?)")
            let drop = try database.statement("DELETE FROM mac_groups WHERE grp = ?")
            defer {
                put.reset()
                drop.reset()
            }
            for group in changed.sorted() {
                let macs = groups[group] ?? [:]
                let row = Self.row(group, macs)
                if macs.isEmpty {
                    drop.reset()
                    drop.bind(1, group)
                    try drop.run()
                } else {
                    put.reset()
                    put.bind(1, group)
                    put.bind(2, row)
                    try put.run()
                }
                digests.replaceSubrange(group * Self.digestSize..<(group + 1) * Self.digestSize, with: Self.digest(group, macs.isEmpty ? nil : row, key: key))
            }
            changed.removeAll()
            return digests
        }

        /// The first bucket of a group (of its kind).
        private static func firstBucket(_ group: Int) -> Int { (group < itemGroups ? group : group - itemGroups) * groupSize }

        /// A group's row: one 32-byte slot per bucket of the group, in order, zeros for a
        /// bucket it does not list.
        private static func row(_ group: Int, _ macs: [Int: [UInt8]]) -> [UInt8] {
            var row = [UInt8](repeating: 0, count: groupSize * digestSize)
            let first = firstBucket(group)
            for (index, mac) in macs { row.replaceSubrange((index - first) * digestSize..<(index - first + 1) * digestSize, with: mac) }
            return row
        }

        /// A group's listed MACs: its row read (one row of `mac_groups`; none: it lists nothing)
        /// and checked against its digest the first time, kept after.
        private func listed(_ group: Int) throws(LockboxError) -> [Int: [UInt8]] {
            if let known = groups[group] { return known }
            var macs: [Int: [UInt8]] = [:]
            if !startsEmpty {
                let failure = SyncState.damaged(database.path)
                let statement = try database.statement("SELECT macs FROM mac_groups WHERE grp = ?")
                defer { statement.reset() }
                statement.bind(1, group)
                var row: [UInt8]?
                if try statement.step() {
                    guard let stored = statement.blob(0), stored.count == Self.groupSize * Self.digestSize else { throw failure }
                    row = stored
                    let first = Self.firstBucket(group)
                    for slot in 0..<Self.groupSize {
                        let mac = Array(stored[slot * Self.digestSize..<(slot + 1) * Self.digestSize])
                        if mac.contains(where: { $0 != 0 }) { macs[first + slot] = mac }
                    }
                    // A row listing nothing is never written.
                    guard !macs.isEmpty else { throw failure }
                }
                let expected = Array(digests[group * Self.digestSize..<(group + 1) * Self.digestSize])
                guard SyncHead.equal(Self.digest(group, row, key: key), expected) else { throw failure }
            }
            groups[group] = macs
            return macs
        }

        /// A keyed digest of a group's row, or 32 zero bytes for a group without one.
        static func digest(_ group: Int, _ row: [UInt8]?, key: SecretBytes) -> [UInt8] {
            guard let row else { return [UInt8](repeating: 0, count: digestSize) }
            var encoder = FieldEncoder(capacity: 64 + row.count)
            encoder.string("lockbox.sync.state.group.v1")
            encoder.integer(group)
            encoder.bytes(row)
            return encoder.withBytes { Crypto.keyedDigest($0, key: key) }
        }
    }

    private static func bucketMAC(_ kind: BucketKind, _ index: Int, _ body: [UInt8], key: SecretBytes) -> [UInt8] {
        var encoder = FieldEncoder(capacity: body.count + 64)
        encoder.string(kind.rawValue)
        encoder.integer(index)
        encoder.bytes(body)
        return encoder.withBytes { Crypto.keyedDigest($0, key: key) }
    }

    private static func firstFormatProgressMAC(_ progress: Progress, key: SecretBytes) -> [UInt8] {
        var encoder = FieldEncoder()
        encoder.string(progress.accumulator == nil ? "progress" : "progress.v2")
        encoder.string(progress.device)
        encoder.integer(Int(progress.cursor))
        encoder.integer(progress.generation)
        if let accumulator = progress.accumulator { encoder.bytes(accumulator) }
        return Crypto.keyedDigest(encoder.bytes, key: key)
    }

    private static func firstFormatEntryMAC(_ id: String, _ entry: Entry, key: SecretBytes) -> [UInt8] {
        var encoder = FieldEncoder()
        encoder.string("entry")
        encoder.string(id)
        encoder.integer(Int(entry.stamp.modified))
        encoder.string(entry.stamp.device)
        encoder.bytes(entry.contentDigest)
        encoder.integer(entry.isTombstone ? 1 : 0)
        return Crypto.keyedDigest(encoder.bytes, key: key)
    }

    private static func firstFormatRowMAC(_ reference: [UInt8], _ id: String?, key: SecretBytes) -> [UInt8] {
        var encoder = FieldEncoder()
        encoder.string("row")
        encoder.bytes(reference)
        encoder.string(id)
        return Crypto.keyedDigest(encoder.bytes, key: key)
    }

    // MARK: Buckets

    /// The bucket of `count` that bytes (an item's identifier, a row's reference) fall in:
    /// FNV-1a, fixed for the file's life (identifiers are keyed digests and references random,
    /// so the buckets fill evenly).
    private static func bucket(of bytes: some Sequence<UInt8>, count: Int) -> Int {
        var hash: UInt64 = 0xcbf2_9ce4_8422_2325
        for byte in bytes {
            hash ^= UInt64(byte)
            hash &*= 0x0000_0100_0000_01b3
        }
        return Int(hash % UInt64(count))
    }

    /// An item's bucket (of its identifier's UTF-8 bytes, read in place).
    static func bucket(of id: String) -> Int {
        var id = id
        return id.withUTF8 { bucket(of: UnsafeRawBufferPointer($0), count: itemBucketCount) }
    }

    /// A vault row's bucket.
    static func bucket(of reference: Data) -> Int { reference.withUnsafeBytes { bucket(of: $0, count: rowBucketCount) } }

    private static func encodeItems(_ records: [String: ItemRecord]) -> [UInt8] {
        var encoder = FieldEncoder(capacity: 64 + records.count * 192)
        encoder.integer(records.count)
        for (id, record) in records {
            encoder.string(id)
            if let entry = record.entry {
                encoder.integer(Int(entry.stamp.modified))
                encoder.string(entry.stamp.device)
                encoder.bytes(entry.contentDigest)
                encoder.integer(entry.isTombstone ? 1 : 0)
            } else {
                encoder.integer(nil)
            }
            if let listed = record.listed {
                encoder.integer(Int(listed.version))
                encoder.bytes(listed.element)
            } else {
                encoder.integer(nil)
            }
            encoder.bytes(record.reference.map { Array($0) })
        }
        return encoder.bytes
    }

    private static func decodeItems(_ body: [UInt8], bucket index: Int) throws(FieldDecoder.Malformed) -> [String: ItemRecord] {
        var decoder = FieldDecoder(body)
        guard let count = try decoder.integer(), count >= 0, count <= body.count else { throw FieldDecoder.Malformed() }
        var records: [String: ItemRecord] = [:]
        records.reserveCapacity(count)
        for _ in 0..<count {
            guard let id = try decoder.string(), bucket(of: id) == index, records[id] == nil else { throw FieldDecoder.Malformed() }
            var record = ItemRecord()
            if let modified = try decoder.integer() {
                guard let writer = try decoder.string(), let digest = try decoder.bytes(), let tombstone = try decoder.integer() else {
                    throw FieldDecoder.Malformed()
                }
                record.entry = Entry(stamp: SyncStamp(modified: Int64(modified), device: writer), contentDigest: digest, isTombstone: tombstone == 1)
            }
            if let version = try decoder.integer() {
                guard let element = try decoder.bytes() else { throw FieldDecoder.Malformed() }
                record.listed = Listed(version: Int64(version), element: element)
            }
            record.reference = try decoder.data()
            records[id] = record
        }
        guard decoder.isAtEnd else { throw FieldDecoder.Malformed() }
        return records
    }

    private static func encodeRows(_ rows: [Data: String?]) -> [UInt8] {
        var encoder = FieldEncoder(capacity: 64 + rows.count * 72)
        encoder.integer(rows.count)
        for (reference, id) in rows {
            encoder.bytes(reference)
            encoder.string(id)
        }
        return encoder.bytes
    }

    private static func decodeRows(_ body: [UInt8], bucket index: Int) throws(FieldDecoder.Malformed) -> [Data: String?] {
        var decoder = FieldDecoder(body)
        guard let count = try decoder.integer(), count >= 0, count <= body.count else { throw FieldDecoder.Malformed() }
        var rows: [Data: String?] = [:]
        rows.reserveCapacity(count)
        for _ in 0..<count {
            guard let reference = try decoder.data(), bucket(of: reference) == index, rows[reference] == nil else {
                throw FieldDecoder.Malformed()
            }
            rows.updateValue(try decoder.string(), forKey: reference)
        }
        guard decoder.isAtEnd else { throw FieldDecoder.Malformed() }
        return rows
    }

    /// A bucket's body as stored, its MAC checked, and that MAC the one `directory` lists; nil
    /// when the bucket has no row and the directory none either.
    private static func readBody(
        _ kind: BucketKind, _ index: Int, _ database: Database, key: SecretBytes, directory: BucketDirectory
    ) throws(LockboxError) -> [UInt8]? {
        let statement = try database.statement(
            kind == .items ? "SELECT body, mac FROM item_buckets WHERE bucket = ?" : "SELECT body, mac FROM row_buckets WHERE bucket = ?")
        defer { statement.reset() }
        statement.bind(1, index)
        let listed = try directory.mac(kind, index)
        guard try statement.step() else {
            // Removed, while the directory lists it.
            guard listed == nil else { throw SyncState.damaged(database.path) }
            return nil
        }
        let body = statement.blob(0) ?? []
        guard let mac = statement.blob(1), let listed, SyncHead.equal(mac, listed), SyncHead.equal(mac, bucketMAC(kind, index, body, key: key))
        else {
            throw SyncState.damaged(database.path)
        }
        return body
    }

    private static func readItems(
        _ index: Int, _ database: Database, key: SecretBytes, directory: BucketDirectory
    ) throws(LockboxError) -> [String: ItemRecord] {
        guard let body = try readBody(.items, index, database, key: key, directory: directory) else { return [:] }
        do {
            return try decodeItems(body, bucket: index)
        } catch {
            throw SyncState.damaged(database.path)
        }
    }

    private static func readRows(
        _ index: Int, _ database: Database, key: SecretBytes, directory: BucketDirectory
    ) throws(LockboxError) -> [Data: String?] {
        guard let body = try readBody(.rows, index, database, key: key, directory: directory) else { return [:] }
        do {
            return try decodeRows(body, bucket: index)
        } catch {
            throw SyncState.damaged(database.path)
        }
    }

    /// Writes buckets (an empty one is removed), in bucket order, and their MACs in `directory`
    /// (whose group digests the progress written with them must hold).
    private static func write(
        items: [Int: [String: ItemRecord]], rows: [Int: [Data: String?]], _ database: Database, key: SecretBytes,
        directory: BucketDirectory
    ) throws(LockboxError) {
        try writeBuckets(sealed(items, of: .items, key: key, encode: encodeItems), of: .items, database, directory: directory)
        try writeBuckets(sealed(rows, of: .rows, key: key, encode: encodeRows), of: .rows, database, directory: directory)
    }

    /// Each bucket's encoded body and its MAC, in bucket order (an empty bucket with neither:
    /// it is removed); on both cores when there are many (a first pull writes thousands).
    private static func sealed<Bucket: Sendable & Collection>(
        _ buckets: [Int: Bucket], of kind: BucketKind, key: SecretBytes, encode: @escaping @Sendable (Bucket) -> [UInt8]
    ) throws(LockboxError) -> [SealedBucket] {
        let ordered = buckets.sorted { $0.key < $1.key }
        return try SyncGroup.inParallel(ordered.count) { position -> SealedBucket in
            let (index, bucket) = ordered[position]
            guard !bucket.isEmpty else { return SealedBucket(index: index, body: nil, mac: []) }
            let body = encode(bucket)
            return SealedBucket(index: index, body: body, mac: bucketMAC(kind, index, body, key: key))
        }
    }

    /// A bucket about to be written: its body (nil: the bucket is removed) and the body's MAC.
    private struct SealedBucket: Sendable {
        var index: Int
        var body: [UInt8]?
        var mac: [UInt8]
    }

    /// Writes each bucket's encoded body with its MAC, or removes the bucket when it has none.
    private static func writeBuckets(
        _ buckets: [SealedBucket], of kind: BucketKind, _ database: Database, directory: BucketDirectory
    ) throws(LockboxError) {
        let put = try database.statement("INSERT OR REPLACE INTO \(kind.table) (bucket, body, mac) VALUES (?, ?, ?)")
        let drop = try database.statement("DELETE FROM \(kind.table) WHERE bucket = ?")
        defer {
            put.reset()
            drop.reset()
        }
        for bucket in buckets {
            if let body = bucket.body {
                put.reset()
                put.bind(1, bucket.index)
                put.bind(2, body)
                put.bind(3, bucket.mac)
                try put.run()
                try directory.set(kind, bucket.index, mac: bucket.mac)
            } else {
                drop.reset()
                drop.bind(1, bucket.index)
                try drop.run()
                try directory.set(kind, bucket.index, mac: nil)
            }
        }
    }

    /// The progress row, its MAC checked (`authenticated`: the MAC of the format it was written
    /// in; the current one unless a conversion reads it).
    private static func readProgress(
        _ database: Database, key: SecretBytes, authenticated: (Progress, SecretBytes) -> [UInt8] = { progressMAC($0, key: $1) }
    ) throws(LockboxError) -> Progress? {
        let statement = try database.statement(
            "SELECT device, cursor, generation, mac, accumulator, row_count, buckets, unverified, applying, held_back FROM progress WHERE id = 1")
        defer { statement.reset() }
        guard try statement.step() else { return nil }
        let progress = Progress(
            device: statement.text(0) ?? "", cursor: Int64(statement.integer(1) ?? -1), generation: statement.integer(2) ?? -1,
            accumulator: statement.blob(4), rows: statement.integer(5) ?? -1, buckets: statement.blob(6) ?? [],
            unverified: statement.blob(7) ?? [], applying: statement.blob(8) ?? [], heldBack: statement.blob(9) ?? [])
        guard let mac = statement.blob(3), SyncHead.equal(mac, authenticated(progress, key)) else {
            throw SyncState.damaged(database.path)
        }
        return progress
    }

    private static func writeProgress(_ progress: Progress, _ database: Database, key: SecretBytes) throws(LockboxError) {
        let statement = try database.statement(
            """
            INSERT OR REPLACE INTO progress (id, device, cursor, generation, mac, accumulator, row_count, buckets, unverified, applying,
                held_back)
            VALUES (1, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
            """)
        defer { statement.reset() }
        statement.bind(1, progress.device)
        statement.bind(2, Int(progress.cursor))
        statement.bind(3, progress.generation)
        statement.bind(4, progressMAC(progress, key: key))
        statement.bind(5, progress.accumulator)
        statement.bind(6, progress.rows)
        statement.bind(7, progress.buckets)
        statement.bind(8, progress.unverified)
        statement.bind(9, progress.applying)
        statement.bind(10, progress.heldBack)
        try statement.run()
    }

    /// The list of rows being added (``applying``) as the progress vouches for it: its serial,
    /// which every listing's MAC binds and which moves on each time a list is settled (so a
    /// listing of an earlier list put back fails its check), and how many listings it has
    /// (numbered from 0, so one removed, added or swapped does not add up). Each listing is one
    /// SQLite row of `applying_rows` holding the rows listed at once: listing rows writes them
    /// and the progress, whatever the list holds already.
    struct ApplyingList: Equatable {
        var serial = 0
        var count = 0

        var encoded: [UInt8] {
            guard self != ApplyingList() else { return [] }
            var encoder = FieldEncoder()
            encoder.integer(serial)
            encoder.integer(count)
            return encoder.bytes
        }

        init() {}

        init(_ bytes: [UInt8], path: String) throws(LockboxError) {
            guard !bytes.isEmpty else { return }
            var decoder = FieldDecoder(bytes)
            guard let serial = try? decoder.integer(), let count = try? decoder.integer(), serial >= 0, count >= 0, decoder.isAtEnd else {
                throw SyncState.damaged(path)
            }
            (self.serial, self.count) = (serial, count)
        }
    }

    /// One listing's body: its rows (in the dictionary's order: the MAC covers the bytes as
    /// they are).
    private static func applyingBody(_ rows: [Data: Applying]) -> [UInt8] {
        var encoder = FieldEncoder()
        encoder.integer(rows.count)
        for (reference, row) in rows {
            encoder.bytes(Array(reference))
            encoder.string(row.id)
            encoder.integer(Int(row.entry.stamp.modified))
            encoder.string(row.entry.stamp.device)
            encoder.bytes(row.entry.contentDigest)
            encoder.integer(row.entry.isTombstone ? 1 : 0)
            encoder.integer(row.pushed ? 1 : 0)
        }
        return encoder.bytes
    }

    private static func applyingMAC(serial: Int, listing: Int, body: [UInt8], key: SecretBytes) -> [UInt8] {
        var encoder = FieldEncoder()
        encoder.string("lockbox.sync.state.applying.v1")
        encoder.integer(serial)
        encoder.integer(listing)
        encoder.bytes(body)
        return Crypto.keyedDigest(encoder.bytes, key: key)
    }

    /// The rows of the list the progress's `list` vouches for: listings 0 to its count less
    /// one, each MAC checked, and no other (a listing where the progress vouches for none is
    /// as much an error).
    private static func readApplying(_ list: [UInt8], _ database: Database, key: SecretBytes) throws(LockboxError) -> [Data: Applying] {
        let failure = SyncState.damaged(database.path)
        let list = try ApplyingList(list, path: database.path)
        let statement = try database.statement("SELECT listing, body, mac FROM applying_rows ORDER BY listing")
        defer { statement.reset() }
        var rows: [Data: Applying] = [:]
        var listings = 0
        while try statement.step() {
            let body = statement.blob(1) ?? []
            guard statement.integer(0) == listings, let mac = statement.blob(2),
                SyncHead.equal(mac, applyingMAC(serial: list.serial, listing: listings, body: body, key: key))
            else { throw failure }
            listings += 1
            var decoder = FieldDecoder(body)
            guard let count = try? decoder.integer(), count > 0 else { throw failure }
            for _ in 0..<count {
                guard let reference = try? decoder.bytes(), let id = try? decoder.string(), let modified = try? decoder.integer(),
                    let device = try? decoder.string(), let digest = try? decoder.bytes(), let tombstone = try? decoder.integer(),
                    tombstone == 0 || tombstone == 1, let pushed = try? decoder.integer(), pushed == 0 || pushed == 1
                else { throw failure }
                rows[Data(reference)] = Applying(
                    id: id,
                    entry: Entry(stamp: SyncStamp(modified: Int64(modified), device: device), contentDigest: digest, isTombstone: tombstone == 1),
                    pushed: pushed == 1)
            }
            guard decoder.isAtEnd else { throw failure }
        }
        guard listings == list.count else { throw failure }
        return rows
    }

    /// Writes the list's changes inside a commit's transaction: every listing dropped and the
    /// serial moved on when `settles`, then `added` as the next listing. Returns the list the
    /// progress then vouches for.
    private static func writeApplying(
        _ stored: ApplyingList, settles: Bool, added: [Data: Applying], _ database: Database, key: SecretBytes
    ) throws(LockboxError) -> ApplyingList {
        var list = stored
        if settles && list.count > 0 {
            try database.execute("DELETE FROM applying_rows")
            list.serial += 1
            list.count = 0
        }
        guard !added.isEmpty else { return list }
        let body = applyingBody(added)
        let put = try database.statement("INSERT INTO applying_rows (listing, body, mac) VALUES (?, ?, ?)")
        defer { put.reset() }
        put.bind(1, list.count)
        put.bind(2, body)
        put.bind(3, applyingMAC(serial: list.serial, listing: list.count, body: body, key: key))
        try put.run()
        list.count += 1
        return list
    }

    /// ``unverifiedWrites`` as the progress holds them: item, version, element, in item order.
    private static func encodeUnverified(_ writes: [String: Listed]) -> [UInt8] {
        guard !writes.isEmpty else { return [] }
        var encoder = FieldEncoder()
        encoder.integer(writes.count)
        for id in writes.keys.sorted() {
            encoder.string(id)
            encoder.integer(Int(writes[id]!.version))
            encoder.bytes(writes[id]!.element)
        }
        return encoder.bytes
    }

    private static func decodeUnverified(_ bytes: [UInt8], path: String) throws(LockboxError) -> [String: Listed] {
        guard !bytes.isEmpty else { return [:] }
        let failure = SyncState.damaged(path)
        var decoder = FieldDecoder(bytes)
        guard let count = try? decoder.integer(), count > 0 else { throw failure }
        var writes: [String: Listed] = [:]
        for _ in 0..<count {
            guard let id = try? decoder.string(), let version = try? decoder.integer(), let element = try? decoder.bytes() else { throw failure }
            writes[id] = Listed(version: Int64(version), element: element)
        }
        guard decoder.isAtEnd, writes.count == count else { throw failure }
        return writes
    }

    /// ``heldBack`` as the progress holds it: the items' identifiers, in order.
    private static func encodeHeldBack(_ items: Set<String>) -> [UInt8] {
        guard !items.isEmpty else { return [] }
        var encoder = FieldEncoder()
        encoder.integer(items.count)
        for id in items.sorted() { encoder.string(id) }
        return encoder.bytes
    }

    private static func decodeHeldBack(_ bytes: [UInt8], path: String) throws(LockboxError) -> Set<String> {
        guard !bytes.isEmpty else { return [] }
        let failure = SyncState.damaged(path)
        var decoder = FieldDecoder(bytes)
        guard let count = try? decoder.integer(), count > 0, count <= bytes.count else { throw failure }
        var items: Set<String> = []
        for _ in 0..<count {
            guard let id = try? decoder.string() else { throw failure }
            items.insert(id)
        }
        guard decoder.isAtEnd, items.count == count else { throw failure }
        return items
    }

    /// Forgets the buckets read when another connection has written the file since.
    private func checkCache() throws(LockboxError) {
        let version = try database.dataVersion
        if version != cachedVersion {
            itemBuckets = [:]
            rowBuckets = [:]
            directory = nil
            cachedVersion = version
        }
    }

    /// The buckets' MACs as the progress vouches for them, kept while no other connection
    /// writes the file: each group read and checked before the first of its buckets is read, so
    /// that no bucket is taken for the state unless its group is the one the progress names.
    private func checkedDirectory() throws(LockboxError) -> BucketDirectory {
        try checkCache()
        if let directory { return directory }
        let loaded = try BucketDirectory.stored(progress: try Self.readProgress(database, key: key), database, key: key)
        directory = loaded
        return loaded
    }

    /// Runs a read in one snapshot of the file (inside a commit's transaction, in it): the
    /// progress, a group's MACs and a bucket are read as one connection committed them, never
    /// some from before another connection's commit and some from after.
    private func reading<T>(_ body: () throws(LockboxError) -> T) throws(LockboxError) -> T {
        if database.isInTransaction { return try body() }
        return try database.readTransaction(body)
    }

    /// Runs `body`, whose reads of this state see one snapshot of the file: many reads cost
    /// one transaction, not one each.
    func inSnapshot<T>(_ body: () throws(LockboxError) -> T) throws(LockboxError) -> T {
        try reading(body)
    }

    private func itemRecord(_ id: String) throws(LockboxError) -> ItemRecord? {
        let index = Self.bucket(of: id)
        // A bucket read since no other connection wrote the file is answered without a snapshot
        // (a sync asks for thousands of records, most in buckets it has read).
        try checkCache()
        if let bucket = itemBuckets[index] { return bucket[id] }
        return try reading { () throws(LockboxError) -> ItemRecord? in
            let directory = try checkedDirectory()
            if let bucket = itemBuckets[index] { return bucket[id] }
            let bucket = try Self.readItems(index, database, key: key, directory: directory)
            itemBuckets[index] = bucket
            return bucket[id]
        }
    }

    // MARK: Reading

    func entry(_ id: String) throws(LockboxError) -> Entry? {
        try itemRecord(id)?.entry
    }

    /// `id`'s entry as `pending` leaves it, if it sets one; else as committed.
    func entry(_ id: String, after pending: Changes) throws(LockboxError) -> Entry? {
        if let entry = pending.entries[id] { return entry }
        return try entry(id)
    }

    /// The item a vault row held at the last sync: `.some(nil)` for a row that does not sync,
    /// nil for a row this device does not know.
    func row(_ reference: Data) throws(LockboxError) -> String?? {
        let index = Self.bucket(of: reference)
        try checkCache()
        if let bucket = rowBuckets[index] { return bucket[reference] }
        return try reading { () throws(LockboxError) -> String?? in
            let directory = try checkedDirectory()
            if let bucket = rowBuckets[index] { return bucket[reference] }
            let bucket = try Self.readRows(index, database, key: key, directory: directory)
            rowBuckets[index] = bucket
            return bucket[reference]
        }
    }

    /// The vault row that holds `id`, if this device knows one.
    func reference(of id: String) throws(LockboxError) -> Data? {
        try itemRecord(id)?.reference
    }

    /// How many vault rows this device knows.
    var rowCount: Int {
        get throws(LockboxError) { try Self.readProgress(database, key: key)?.rows ?? 0 }
    }

    /// Every known row and the item it holds (the slow path that finds deletes).
    func allRows() throws(LockboxError) -> [Data: String?] {
        try reading { () throws(LockboxError) -> [Data: String?] in
            var rows: [Data: String?] = [:]
            let directory = try checkedDirectory()
            for index in try directory.buckets(.rows) {
                for (reference, id) in try Self.readRows(index, database, key: key, directory: directory) { rows.updateValue(id, forKey: reference) }
            }
            return rows
        }
    }


    /// The version and head element of `id`'s record in the last verified head; nil when that
    /// head lists no record of it.
    func verified(_ id: String) throws(LockboxError) -> Listed? {
        try itemRecord(id)?.listed
    }

    /// True when this device has recorded nothing yet (before its first pull). A state whose
    /// progress vouches for buckets that are no longer there is an error, not an empty state (which a
    /// pull would take for a new device's).
    var isEmpty: Bool {
        get throws(LockboxError) {
            let statement = try database.statement("SELECT EXISTS (SELECT 1 FROM item_buckets) OR EXISTS (SELECT 1 FROM row_buckets)")
            defer { statement.reset() }
            _ = try statement.step()
            guard statement.integer(0) == 0 else { return false }
            if let progress = try Self.readProgress(database, key: key), !SyncHead.equal(progress.buckets, BucketDirectory.emptyDigests) {
                throw SyncState.damaged(database.path)
            }
            return true
        }
    }

    /// True when the file has no bucket row and no group row.
    private static func holdsNoBuckets(_ database: Database) throws(LockboxError) -> Bool {
        let statement = try database.statement(
            "SELECT EXISTS (SELECT 1 FROM item_buckets) OR EXISTS (SELECT 1 FROM row_buckets) OR EXISTS (SELECT 1 FROM mac_groups)")
        defer { statement.reset() }
        _ = try statement.step()
        return statement.integer(0) == 0
    }

    /// Every item this device has an entry for (its last known record, tombstones included).
    func allEntries() throws(LockboxError) -> [String: Entry] {
        try reading { () throws(LockboxError) -> [String: Entry] in
            var entries: [String: Entry] = [:]
            let directory = try checkedDirectory()
            for index in try directory.buckets(.items) {
                for (id, record) in try Self.readItems(index, database, key: key, directory: directory) {
                    if let entry = record.entry { entries[id] = entry }
                }
            }
            return entries
        }
    }

    /// Drops the verified head from the progress, keeping everything else: the state of a device
    /// that synced before groups had heads (vault sync schema 3), which the tests make this way.
    func forgetVerifiedHead() throws(LockboxError) {
        try database.writeTransaction { () throws(LockboxError) in
            guard let progress = try Self.readProgress(database, key: key) else { return }
            try Self.writeProgress(
                Progress(
                    device: progress.device, cursor: progress.cursor, generation: progress.generation, accumulator: nil,
                    rows: progress.rows, buckets: progress.buckets, unverified: progress.unverified, applying: progress.applying,
                    heldBack: progress.heldBack),
                database, key: key)
        }
        accumulator = nil
    }

    /// Items with a live entry (not tombstones): how many, for `lockbox sync status`.
    var liveEntryCount: Int {
        get throws(LockboxError) {
            try reading { () throws(LockboxError) -> Int in
                var count = 0
                let directory = try checkedDirectory()
                for index in try directory.buckets(.items) {
                    count += try Self.readItems(index, database, key: key, directory: directory).values.count {
                        $0.entry.map { !$0.isTombstone } ?? false
                    }
                }
                return count
            }
        }
    }

    // MARK: Writing

    /// Changes of one phase, applied in one transaction.
    struct Changes {
        var entries: [String: Entry] = [:]
        /// Records of the newly verified head (with `replacesVerified`, all of them).
        var verified: [String: Listed] = [:]
        var replacesVerified = false
        /// The newly verified head's digest (with `cursor`, its counter).
        var accumulator: [UInt8]?
        /// Reference -> item (nil: a row that does not sync); `.none` as a value removes the row.
        /// Changed through ``setRow(_:_:)``.
        private(set) var rows: [Data: String??] = [:]
        /// Item -> the rows `rows` says hold it: a push or a pull of thousands of changes asks
        /// for an item's row once per change.
        private var holders: [String: Set<Data>] = [:]
        var cursor: Int64?
        /// This device's writes that no verified head lists yet, added to the state's
        /// (``SyncState/unverifiedWrites``), after dropping them all with `clearsUnverified`.
        var unverified: [String: Listed] = [:]
        var clearsUnverified = false
        /// Rows a pull is about to add to the vault, added to the state's
        /// (``SyncState/applying``), after dropping them all with `settlesApplying`.
        var applying: [Data: Applying] = [:]
        var settlesApplying = false
        /// Items held back (true) or no longer (false) (``SyncState/heldBack``).
        var heldBack: [String: Bool] = [:]

        /// Holds back the item `id` (``SyncState/heldBack``): no record of this pull's is taken
        /// as known for it.
        mutating func holdBack(_ id: String) {
            entries.removeValue(forKey: id)
            heldBack[id] = true
        }

        /// The state's items held back once these changes are committed.
        func heldBackItems(after state: SyncState) -> Set<String> {
            var items = state.heldBack
            for (id, held) in heldBack {
                if held { items.insert(id) } else { items.remove(id) }
            }
            return items
        }

        /// The state's rows being added once these changes are committed.
        func applyingRows(after state: SyncState) -> [Data: Applying] {
            (settlesApplying ? [:] : state.applying).merging(applying) { _, new in new }
        }

        /// Records what the vault row `reference` holds now: an item, nil for a row that does
        /// not sync, `.none` for a row gone.
        mutating func setRow(_ reference: Data, _ change: String??) {
            if case .some(.some(.some(let former))) = rows[reference] {
                holders[former]?.remove(reference)
                if holders[former]?.isEmpty == true { holders.removeValue(forKey: former) }
            }
            rows[reference] = change
            if case .some(.some(let id)) = change { holders[id, default: []].insert(reference) }
        }

        /// The state's unverified writes once these changes are committed.
        func unverifiedWrites(after state: SyncState) -> [String: Listed] {
            (clearsUnverified ? [:] : state.unverifiedWrites).merging(unverified) { _, new in new }
        }

        /// A row these changes say holds `id`, if any.
        func holder(of id: String) -> Data? {
            holders[id]?.first
        }
        var generation: Int?

        /// True when committing would write nothing new to a state at `cursor`, `generation`
        /// and `accumulator`.
        func changesNothing(of state: SyncState) -> Bool {
            unverifiedWrites(after: state) == state.unverifiedWrites && heldBackItems(after: state) == state.heldBack && applying.isEmpty && !(settlesApplying && !state.applying.isEmpty)
                && entries.isEmpty && verified.isEmpty && !replacesVerified && rows.isEmpty && (cursor ?? state.cursor) == state.cursor
                && (generation ?? state.generation) == state.generation && (accumulator ?? state.accumulator) == state.accumulator
        }
    }

    /// Records past which a commit empties the write-ahead log after it.
    static let largeCommit = 300

    /// Writes `changes` in one transaction; nothing when they change nothing (a sync with
    /// nothing to push or pull writes no local state). The buckets it changes are taken from
    /// what this object read only when no other connection has written the file since;
    /// otherwise they are read again inside the transaction, so that what another process wrote
    /// to them is kept, as it was with one row per record.
    func commit(_ changes: Changes) throws(LockboxError) {
        try commit(changes, beforeCommitting: {})
    }

    /// ``commit(_:)``, calling `beforeCommitting` once every change is written, inside the
    /// transaction: what it throws rolls the transaction back.
    private func commit(_ changes: Changes, beforeCommitting: () throws(LockboxError) -> Void) throws(LockboxError) {
        if changes.changesNothing(of: self) { return try beforeCommitting() }
        let database = self.database
        let key = self.key
        var items: [Int: [String: ItemRecord]] = [:]
        var rows: [Int: [Data: String?]] = [:]
        var written: BucketDirectory?
        let unverified = changes.unverifiedWrites(after: self)
        let applying = changes.applyingRows(after: self)
        let heldBack = changes.heldBackItems(after: self)
        do {
            try database.writeTransaction { () throws(LockboxError) in
                // Inside the write transaction: no other connection can write until it ends.
                let directory = try checkedDirectory()
                // A state that holds no bucket yet (before the first pull): every bucket is
                // empty, none is read.
                var holdsNone = directory.listsNothing
                if holdsNone { holdsNone = try Self.holdsNoBuckets(database) }
                items = itemBuckets
                rows = rowBuckets
                let stored = try Self.readProgress(database, key: key)
                var knownRows = stored?.rows ?? 0
                var changedItems: Set<Int> = []
                var changedRows: Set<Int> = []
                func load(_ id: String) throws(LockboxError) -> Int {
                    let index = Self.bucket(of: id)
                    if items[index] == nil { items[index] = holdsNone ? [:] : try Self.readItems(index, database, key: key, directory: directory) }
                    changedItems.insert(index)
                    return index
                }
                if changes.replacesVerified {
                    for index in try directory.buckets(.items) where items[index] == nil {
                        items[index] = try Self.readItems(index, database, key: key, directory: directory)
                    }
                    for index in items.keys where items[index]!.values.contains(where: { $0.listed != nil }) {
                        for id in items[index]!.keys { items[index]![id]!.listed = nil }
                        changedItems.insert(index)
                    }
                }
                for (id, entry) in changes.entries { items[try load(id)]![id, default: ItemRecord()].entry = entry }
                for (id, listed) in changes.verified { items[try load(id)]![id, default: ItemRecord()].listed = listed }
                for (reference, change) in changes.rows {
                    let index = Self.bucket(of: reference)
                    if rows[index] == nil { rows[index] = holdsNone ? [:] : try Self.readRows(index, database, key: key, directory: directory) }
                    changedRows.insert(index)
                    let old = rows[index]![reference]
                    if let change {
                        if old == nil { knownRows += 1 }
                        rows[index]!.updateValue(change, forKey: reference)
                    } else if old != nil {
                        knownRows -= 1
                        rows[index]!.removeValue(forKey: reference)
                    }
                    // The item side: which row holds it.
                    if case .some(.some(let former)) = old, change != .some(.some(former)) {
                        let bucket = try load(former)
                        if items[bucket]![former]?.reference == reference { items[bucket]![former]!.reference = nil }
                    }
                    if case .some(.some(let id)) = change { items[try load(id)]![id, default: ItemRecord()].reference = reference }
                }
                for index in changedItems where items[index]!.values.contains(where: \.isEmpty) {
                    items[index] = items[index]!.filter { !$0.value.isEmpty }
                }
                try Self.write(
                    items: items.filter { changedItems.contains($0.key) }, rows: rows.filter { changedRows.contains($0.key) }, database,
                    key: key, directory: directory)
                try Self.writeProgress(
                    Progress(
                        device: device, cursor: changes.cursor ?? cursor, generation: changes.generation ?? generation,
                        accumulator: changes.accumulator ?? accumulator, rows: knownRows,
                        buckets: try directory.sealed(), unverified: Self.encodeUnverified(unverified),
                        applying: try Self.writeApplying(
                            try ApplyingList(stored?.applying ?? [], path: database.path), settles: changes.settlesApplying,
                            added: changes.applying, database, key: key
                        ).encoded, heldBack: Self.encodeHeldBack(heldBack)), database, key: key)
                try beforeCommitting()
                written = directory
            }
        } catch {
            // The directory is changed in place as buckets are written: after a failed commit it
            // no longer describes the file, and is read again.
            directory = nil
            throw error
        }
        self.directory = written
        // This connection's own commit leaves `data_version` as it was: the buckets stay valid.
        itemBuckets = items
        rowBuckets = rows
        // A large commit (a first pull) leaves a long log that every later sync would read
        // when it opens the file: it is moved into the file and emptied now.
        if changes.entries.count + changes.verified.count + changes.rows.count > Self.largeCommit {
            database.truncateWriteAheadLog()
        }
        if let cursor = changes.cursor { self.cursor = cursor }
        if let generation = changes.generation { self.generation = generation }
        if let accumulator = changes.accumulator { self.accumulator = accumulator }
        unverifiedWrites = unverified
        self.applying = applying
        self.heldBack = heldBack
    }

    /// Lists `rows`, which a pull is about to add to the vault, in ``applying``, in a commit that
    /// reaches the disk before the vault's does (this file's other commits wait for a
    /// checkpoint): a row the vault then holds, or held and deleted, is never one this state
    /// has no trace of, even after a power loss.
    func recordApplying(_ rows: [Data: Applying]) throws(LockboxError) {
        guard !rows.isEmpty else { return }
        var changes = Changes()
        changes.applying = rows
        try database.execute("PRAGMA synchronous=FULL")
        defer { try? database.execute("PRAGMA synchronous=NORMAL") }
        try commit(changes)
    }

    /// Starts ``commit(_:)`` of `changes` on another thread, which writes them and then waits,
    /// inside its transaction, for ``PendingCommit/proceed()`` or ``PendingCommit/commit()``
    /// (which make them durable) or ``PendingCommit/abandon()`` (which rolls them back). A pull writes the local state this
    /// way while the vault commits the changes it applied: the state never records a change
    /// before the vault holds it. Until one of the two returns, this object is the other
    /// thread's: nothing else may use it.
    func startCommit(_ changes: Changes) -> PendingCommit {
        let pending = PendingCommit()
        let state = Handed(self)
        DispatchQueue.global(qos: .userInitiated).async {
            var abandoned = false
            do throws(LockboxError) {
                try state.value.commit(changes) { () throws(LockboxError) in
                    pending.decided.wait()
                    abandoned = !pending.proceeds
                    if abandoned { throw PendingCommit.abandonment }
                }
            } catch {
                // An abandoned commit rolled back, as asked, is not a failure; a rollback that
                // failed is.
                if !abandoned || error.message != PendingCommit.abandonment.message { pending.failure = error }
            }
            pending.ended.signal()
        }
        return pending
    }

    /// A commit ``startCommit(_:)`` started on another thread. Every one is ended by
    /// ``commit()`` or ``abandon()``: until it is decided, the other thread waits holding the
    /// state's write lock.
    final class PendingCommit: @unchecked Sendable {
        /// What the other thread throws to roll back an abandoned commit (never seen outside).
        fileprivate static let abandonment = LockboxError(.io, "The sync state's commit was abandoned.")
        fileprivate let decided = DispatchSemaphore(value: 0)
        fileprivate let ended = DispatchSemaphore(value: 0)
        // Written by one thread before a semaphore's signal, read by the other after its wait.
        fileprivate var proceeds = false
        fileprivate var failure: LockboxError?

        fileprivate init() {}

        /// Lets the transaction commit, without waiting for it (``commit()`` waits).
        func proceed() {
            decide(proceeding: true)
        }

        /// Lets the transaction commit, waits for it, and throws what the commit threw (also
        /// an error met while writing).
        func commit() throws(LockboxError) {
            decide(proceeding: true)
            wait()
            if let failure { throw failure }
        }

        /// Rolls the transaction back (unless ``proceed()`` let it commit) and waits for it.
        /// Returns what went wrong on the other thread, if anything (a rollback that failed
        /// leaves the state's connection unusable).
        @discardableResult
        func abandon() -> LockboxError? {
            decide(proceeding: false)
            wait()
            return failure
        }

        private var isDecided = false
        private var isEnded = false

        private func decide(proceeding: Bool) {
            guard !isDecided else { return }
            isDecided = true
            proceeds = proceeding
            decided.signal()
        }

        private func wait() {
            guard !isEnded else { return }
            isEnded = true
            ended.wait()
        }
    }

    /// The state handed to the thread of ``startCommit(_:)``, which alone uses it until the
    /// commit is settled.
    private struct Handed: @unchecked Sendable {
        let value: SyncState
        init(_ value: SyncState) { self.value = value }
    }

    /// Forgets what this device pushed and pulled (after a key rotation re-sealed every record).
    func reset() throws(LockboxError) {
        try database.writeTransaction { () throws(LockboxError) in
            try database.execute(
                "DELETE FROM item_buckets; DELETE FROM row_buckets; DELETE FROM mac_groups; DELETE FROM applying_rows; DELETE FROM progress")
        }
        itemBuckets = [:]
        rowBuckets = [:]
        directory = nil
        cursor = 0
        generation = 0
        accumulator = nil
        unverifiedWrites = [:]
        applying = [:]
        heldBack = []
    }
}

extension SyncState.Entry {
    /// The entry of `record`: what this device knows of the item once it saw or wrote it.
    init(_ record: SyncRecord) {
        self.init(stamp: record.stamp, contentDigest: record.contentDigest, isTombstone: record.isTombstone)
    }
}
