import KeyProviders
import LockboxCore
import Synchronization
import VaultCrypto
import VaultStorage

#if canImport(Glibc)
import Glibc
#endif

/// The vault's authenticated view of which rows are current.
///
/// Rows fall into 256 buckets (the first byte of their lookup digest). Each bucket has an
/// accumulator: the XOR of a keyed pseudo-random value of every row's `(id, version)` in it
/// (an XOR-MAC: without the key nobody can produce a matching set). The accumulators, a
/// generation counted up by every write, and the header are covered by two MACs: one keyed
/// from the lookup-index root (available from the first unlock), one from the `always` class
/// key (available before it, from the device key). So:
/// - a row replayed from an older copy carries an older version: its bucket no longer adds up;
/// - a deleted or inserted row changes its bucket's set the same way;
/// - an older copy of the whole file (or a lost WAL) has an older generation than the one this
///   machine remembers outside the file (``RememberedGeneration``).
///
/// Verifying a bucket reads the ids and versions of its rows (an index-only scan); results are
/// cached until another connection writes (`PRAGMA data_version`).
struct IntegrityState {
    static let bucketCount = 256
    static let accumulatorSize = 32
    /// A MAC (keyed BLAKE2b) of the record.
    static let macSize = 32
    /// Buckets are stored and digested in groups (schema 3): a write rewrites and rehashes the
    /// one group of its bucket, not all 8 KiB of accumulators.
    static let groupCount = 16
    static let bucketsPerGroup = bucketCount / groupCount
    static let groupSize = bucketsPerGroup * accumulatorSize
    /// How the record is kept: 2, the MACs over every accumulator, all in `vault_state`; 3, the
    /// MACs over a digest per group, the accumulators in `integrity_groups` and the generation
    /// and MACs in `vault_state`; 4, as 3 but the generation and MACs written into the rows of
    /// the groups a write changed (the record is the one with the highest generation), so a
    /// write rewrites one row instead of two (`vault_state` keeps only the format); 5, stored as
    /// 4, the MACs over a tree of digests (``authenticatedBytes(vaultID:headerBinding:keys:)``),
    /// so a write digests its group, one node and about 230 bytes twice instead of its group
    /// and about 660 bytes twice; 6, as 5, the MACs also covering ``deletions`` (kept in
    /// `vault_state.accumulators`, 32 bytes). Formats 3 and 4 authenticate the same bytes. A
    /// state of an older format is verified as such and rewritten in the current one at the
    /// next write.
    static let currentFormat = 6
    /// Format 5: groups per node of the tree (four nodes of four groups).
    static let groupsPerNode = 4
    static let nodeCount = groupCount / groupsPerNode

    var generation: Int
    var accumulators: [UInt8]
    /// Format 6: the modular sum of the values of the records in `sync_deletions` (the deletions
    /// of synchronizable rows, which sync stamps its tombstones with), so that a record removed
    /// or put back from an older copy no longer adds up. A state of an older format has none
    /// (zeros); the write that converts it sums the records it finds.
    private(set) var deletions = [UInt8](repeating: 0, count: IntegrityState.accumulatorSize)
    /// `deletions` changed since the state was read: the next save writes it.
    private var deletionsChanged = false
    /// Whether `deletions` is the sum of the records (read in format 6, set, or a new vault's
    /// zeros): a state of an older format, or a recount of the rows, has no sum until one is
    /// set, and sealing it before would cover a wrong one.
    private var deletionsKnown = true
    var mac: [UInt8] = []
    var alwaysMAC: [UInt8] = []
    var format = IntegrityState.currentFormat {
        // The cached digests are the format's: a state sealed in another one digests anew.
        didSet { if format != oldValue { forgetDigests() } }
    }
    /// Per group, 32 bytes: its digest in the state's format (5: BLAKE2b of the group's bytes;
    /// 3 and 4: keyed by the element key), valid where its bit of `knownGroups` is set, that is
    /// while its accumulators and the format are unchanged. Flat bytes and bit sets rather than
    /// an array per digest: every write copies the state, and a copy is then three buffers, not
    /// sixteen.
    private var groupDigests = [UInt8](repeating: 0, count: IntegrityState.groupCount * 32)
    private var knownGroups: UInt16 = 0
    /// Format 5: per node, 32 bytes, the digest of its groups' digests, valid where its bit of
    /// `knownNodes` is set.
    private var nodeDigests = [UInt8](repeating: 0, count: IntegrityState.nodeCount * 32)
    private var knownNodes: UInt8 = 0
    /// Groups whose stored row is out of date, a bit each (all of them for a state not read
    /// from the file).
    private var unsavedGroups = UInt16.max
    /// The format of the record in the file (nil before it is first saved): a save in the
    /// current format over an older record writes every group and marks `vault_state`.
    private var storedFormat: Int?

    static func empty() -> IntegrityState {
        IntegrityState(generation: 0, accumulators: [UInt8](repeating: 0, count: bucketCount * accumulatorSize))
    }

    init(generation: Int, accumulators: [UInt8]) {
        self.generation = generation
        self.accumulators = accumulators
    }

    /// The keys: `state` from the index root (nil before the first unlock), `always` from the
    /// `always` class key, which also keys the row elements.
    struct Keys {
        var state: SecretBytes?
        var always: SecretBytes
        var element: SecretBytes

        init(indexRoot: SecretBytes?, alwaysClassKey: SecretBytes) {
            state = indexRoot.map { Crypto.deriveKey(from: $0, context: "lbxstate", identifier: 1) }
            always = Crypto.deriveKey(from: alwaysClassKey, context: "lbxstate", identifier: 2)
            element = Crypto.deriveKey(from: alwaysClassKey, context: "lbxelemt", identifier: 1)
        }
    }

    /// A row's element: everything that selects or filters it (id, version, digests, class,
    /// accessibility, group, sync flag, device, access control), so that editing any of it
    /// (which would make a query miss the row) is noticed like a deletion.
    static func element(_ row: RowIdentity, key: SecretBytes) -> [UInt8] {
        encodedElement(row).withBytes { Crypto.keyedDigest($0, key: key) }
    }

    /// What ``element(_:key:)`` digests.
    private static func encodedElement(_ row: RowIdentity) -> FieldEncoder {
        encodedElement(
            id: row.id, version: row.version, primaryDigest: row.primaryDigest, lookupDigest: row.lookupDigest,
            nameDigest: row.nameDigest, itemClass: row.itemClass, accessibility: row.accessibility, accessGroup: row.accessGroup,
            synchronizable: row.synchronizable, deviceID: row.deviceID, accessControl: row.accessControl)
    }

    /// The same for a row being written, read from it in place (no ``RowIdentity`` copied).
    private static func encodedElement(_ row: SealedRow) -> FieldEncoder {
        encodedElement(
            id: row.id, version: row.version, primaryDigest: row.primaryDigest, lookupDigest: row.lookupDigest,
            nameDigest: row.nameDigest, itemClass: row.itemClass.rawValue, accessibility: row.accessibility.rawValue,
            accessGroup: row.accessGroup, synchronizable: row.synchronizable ? 1 : 0, deviceID: row.deviceID,
            accessControl: row.accessControl)
    }

    private static func encodedElement(
        id: [UInt8], version: Int, primaryDigest: [UInt8], lookupDigest: [UInt8], nameDigest: [UInt8]?, itemClass: String,
        accessibility: String, accessGroup: String, synchronizable: Int, deviceID: String, accessControl: String
    ) -> FieldEncoder {
        // About 210 bytes for a row of the current format.
        var encoder = FieldEncoder(capacity: 256)
        encoder.bytes(id)
        encoder.integer(version)
        encoder.bytes(primaryDigest)
        encoder.bytes(lookupDigest)
        encoder.bytes(nameDigest)
        encoder.string(itemClass)
        encoder.string(accessibility)
        encoder.string(accessGroup)
        encoder.integer(synchronizable)
        encoder.string(deviceID)
        encoder.string(accessControl)
        return encoder
    }

    /// What the integrity state counts of a row: its columns but the sealed blobs (which their
    /// own authentication covers, bound to the id and version).
    struct RowIdentity {
        var id: [UInt8]
        var version: Int
        var primaryDigest: [UInt8]
        var lookupDigest: [UInt8]
        var nameDigest: [UInt8]?
        var itemClass: String
        var accessibility: String
        var accessGroup: String
        var synchronizable: Int
        var deviceID: String
        var accessControl: String
        /// The stored `bucket` column (it must equal the lookup digest's bucket).
        var storedBucket: Int

        var bucket: Int { SealedRow.bucket(ofLookupDigest: lookupDigest) }

        init(_ row: SealedRow) {
            id = row.id
            version = row.version
            primaryDigest = row.primaryDigest
            lookupDigest = row.lookupDigest
            nameDigest = row.nameDigest
            itemClass = row.itemClass.rawValue
            accessibility = row.accessibility.rawValue
            accessGroup = row.accessGroup
            synchronizable = row.synchronizable ? 1 : 0
            deviceID = row.deviceID
            accessControl = row.accessControl
            storedBucket = row.storedBucket ?? row.bucket
        }

        /// Reads ``columns`` from `statement`, starting at column `first` (the plain way, with a
        /// `String` and an array per column; bucket checks and recounts read rows in place).
        init(_ statement: Statement, first: Int32) throws(LockboxError) {
            guard let id = statement.blob(first), let version = statement.integer(first + 1),
                let primary = statement.blob(first + 2), let lookup = statement.blob(first + 3),
                let itemClass = statement.text(first + 5), let accessibility = statement.text(first + 6),
                let group = statement.text(first + 7), let synchronizable = statement.integer(first + 8),
                let deviceID = statement.text(first + 9), let accessControl = statement.text(first + 10),
                let storedBucket = statement.integer(first + 11)
            else { throw LockboxError.integrity() }
            self.id = id
            self.version = version
            primaryDigest = primary
            lookupDigest = lookup
            nameDigest = statement.blob(first + 4)
            self.itemClass = itemClass
            self.accessibility = accessibility
            accessGroup = group
            self.synchronizable = synchronizable
            self.deviceID = deviceID
            self.accessControl = accessControl
            self.storedBucket = storedBucket
        }

        static let columns =
            "id, version, primary_digest, lookup_digest, name_digest, item_class, accessibility, access_group, "
            + "synchronizable, device_id, access_control, bucket"
    }

    /// Counts a row in its bucket. Accumulators are sums modulo 2^256 (little-endian), so a
    /// row present twice counts twice instead of cancelling out.
    mutating func add(_ row: RowIdentity, key: SecretBytes) {
        count(Self.encodedElement(row), bucket: row.bucket, key: key, adding: true)
    }

    mutating func remove(_ row: RowIdentity, key: SecretBytes) {
        count(Self.encodedElement(row), bucket: row.bucket, key: key, adding: false)
    }

    /// ``add(_:key:)-(RowIdentity,_)`` of a row being written.
    mutating func add(_ row: SealedRow, key: SecretBytes) {
        count(Self.encodedElement(row), bucket: row.bucket, key: key, adding: true)
    }

    /// ``remove(_:key:)-(RowIdentity,_)`` of a row being replaced or deleted.
    mutating func remove(_ row: SealedRow, key: SecretBytes) {
        count(Self.encodedElement(row), bucket: row.bucket, key: key, adding: false)
    }

    /// Adds or subtracts an element in `bucket`, digested into a buffer on the stack.
    private mutating func count(_ encoded: FieldEncoder, bucket: Int, key: SecretBytes, adding: Bool) {
        let start = bucket * Self.accumulatorSize
        withUnsafeTemporaryAllocation(byteCount: Self.accumulatorSize, alignment: 8) { element in
            encoded.withBytes { Crypto.keyedDigest($0, key: key, into: element) }
            accumulators.withUnsafeMutableBytes { accumulators in
                let bucket = UnsafeMutableRawBufferPointer(rebasing: accumulators[start..<start + Self.accumulatorSize])
                if adding {
                    ModularSum.add(UnsafeRawBufferPointer(element), to: bucket)
                } else {
                    ModularSum.subtract(UnsafeRawBufferPointer(element), from: bucket)
                }
            }
        }
        changed(bucket: bucket)
    }

    private mutating func changed(bucket: Int) {
        let group = bucket / Self.bucketsPerGroup
        knownGroups &= ~(1 << group)
        knownNodes &= ~(1 << (group / Self.groupsPerNode))
        unsavedGroups |= 1 << group
    }

    /// Every group is written at the next save (a state rebuilt or converted).
    mutating func markAllUnsaved() {
        unsavedGroups = .max
        forgetDigests()
    }

    private mutating func forgetDigests() {
        knownGroups = 0
        knownNodes = 0
    }

    /// Counts a deletion record (its value, ``Vault/deletionElement(mac:sumKey:)``) in
    /// ``deletions``, or takes one out.
    mutating func countDeletion(element value: [UInt8], adding: Bool) {
        precondition(value.count == Self.accumulatorSize)
        deletions.withUnsafeMutableBytes { sum in
            value.withUnsafeBytes { element in
                if adding { ModularSum.add(element, to: sum) } else { ModularSum.subtract(element, from: sum) }
            }
        }
        deletionsChanged = true
    }

    /// Sets ``deletions`` to the sum of the records as they are (a conversion, or records
    /// dropped on the user's request).
    mutating func setDeletions(_ sum: [UInt8]) {
        precondition(sum.count == Self.accumulatorSize)
        deletions = sum
        deletionsChanged = true
        deletionsKnown = true
    }

    /// True when ``deletions`` is part of what the MACs cover (format 6 and later).
    var coversDeletions: Bool { format >= 6 }

    /// True when ``deletions`` is known to be the records' sum, so that the state may be sealed
    /// in format 6; false for a state read in an older format or recounted, until it is set.
    var knowsDeletions: Bool { deletionsKnown }

    func accumulator(_ bucket: Int) -> ArraySlice<UInt8> {
        accumulators[bucket * Self.accumulatorSize..<(bucket + 1) * Self.accumulatorSize]
    }

    /// What the MACs cover: the vault, the generation, the accumulators and the header (through
    /// its digest, ``headerBinding(_:key:)``), in the state's format.
    ///
    /// Format 5 covers the accumulators through a tree: each group's 512 bytes are digested
    /// (BLAKE2b-256, no key: the MACs over the tree are what a forger lacks, and a collision of
    /// BLAKE2b is what replacing a group without changing them would need), each node digests
    /// the four digests of its groups (128 bytes), and the MACs cover the four nodes. Every
    /// digest's input has a fixed length and place, so no input of one level can stand for
    /// another's. Formats 3 and 4 cover one digest per group, keyed by the element key.
    private mutating func authenticatedBytes(vaultID: [UInt8], headerBinding: [UInt8], keys: Keys) -> FieldEncoder {
        let tree = format >= 5
        // About 30 bytes, then 37 per group or node, 37 for the header and 37 for the deletions.
        var encoder = FieldEncoder(capacity: 64 + 37 * (Self.groupCount + 2))
        encoder.string(format >= 6 ? "lockbox.state.v6" : tree ? "lockbox.state.v5" : "lockbox.state.v3")
        encoder.bytes(vaultID)
        encoder.integer(generation)
        if tree {
            let nodeSize = Self.groupsPerNode * 32
            for node in 0..<Self.nodeCount {
                if knownNodes & (1 << node) == 0 {
                    for group in node * Self.groupsPerNode..<(node + 1) * Self.groupsPerNode {
                        computeGroupDigest(group, key: nil)
                    }
                    groupDigests.withUnsafeBytes { groups in
                        nodeDigests.withUnsafeMutableBytes { nodes in
                            Crypto.digest(
                                UnsafeRawBufferPointer(rebasing: groups[node * nodeSize..<(node + 1) * nodeSize]),
                                into: UnsafeMutableRawBufferPointer(rebasing: nodes[node * 32..<(node + 1) * 32]))
                        }
                    }
                    knownNodes |= 1 << node
                }
                nodeDigests.withUnsafeBytes { encoder.bytes(inPlace: UnsafeRawBufferPointer(rebasing: $0[node * 32..<(node + 1) * 32])) }
            }
        } else {
            for group in 0..<Self.groupCount {
                computeGroupDigest(group, key: keys.element)
                groupDigests.withUnsafeBytes { encoder.bytes(inPlace: UnsafeRawBufferPointer(rebasing: $0[group * 32..<(group + 1) * 32])) }
            }
        }
        encoder.bytes(headerBinding)
        if format >= 6 { encoder.bytes(deletions) }
        return encoder
    }

    /// Makes group `group`'s digest (keyed by `key` in formats 3 and 4) when its accumulators
    /// changed since the last time.
    private mutating func computeGroupDigest(_ group: Int, key: SecretBytes?) {
        guard knownGroups & (1 << group) == 0 else { return }
        accumulators.withUnsafeBytes { bytes in
            let input = UnsafeRawBufferPointer(rebasing: bytes[group * Self.groupSize..<(group + 1) * Self.groupSize])
            groupDigests.withUnsafeMutableBytes { digests in
                let output = UnsafeMutableRawBufferPointer(rebasing: digests[group * 32..<(group + 1) * 32])
                if let key { Crypto.keyedDigest(input, key: key, into: output) } else { Crypto.digest(input, into: output) }
            }
        }
        knownGroups |= 1 << group
    }

    /// Format 2: every accumulator and the header's bytes, as they are.
    private func authenticatedBytesVersion2(vaultID: [UInt8], header: VaultHeader) -> FieldEncoder {
        var encoder = FieldEncoder()
        encoder.string("lockbox.state.v2")
        encoder.bytes(vaultID)
        encoder.integer(generation)
        encoder.bytes(accumulators)
        encoder.bytes(header.authenticatedBytes())
        encoder.bytes(header.mac)
        return encoder
    }

    /// The header as the state's MACs bind it: a digest of its authenticated bytes and its MAC,
    /// computed once per header (``Vault/State/headerBinding(key:)`` keeps it).
    static func headerBinding(_ header: VaultHeader, key: SecretBytes) -> [UInt8] {
        var encoder = FieldEncoder()
        encoder.bytes(header.authenticatedBytes())
        encoder.bytes(header.mac)
        return Crypto.keyedDigest(encoder.bytes, key: key)
    }

    mutating func seal(header: VaultHeader, keys: Keys) {
        seal(vaultID: header.vaultID, headerBinding: Self.headerBinding(header, key: keys.element), keys: keys)
    }

    /// Seals in the current format.
    mutating func seal(vaultID: [UInt8], headerBinding: [UInt8], keys: Keys) {
        guard let stateKey = keys.state else { preconditionFailure("writing the integrity state needs the index root") }
        precondition(deletionsKnown, "the deletion records' sum is set before a state of an older format is sealed")
        format = Self.currentFormat
        let bytes = authenticatedBytes(vaultID: vaultID, headerBinding: headerBinding, keys: keys)
        (mac, alwaysMAC) = bytes.withBytes { (Crypto.keyedDigest($0, key: stateKey), Crypto.keyedDigest($0, key: keys.always)) }
    }

    private mutating func verifiedBytes(header: VaultHeader, headerBinding: [UInt8]?, keys: Keys) -> FieldEncoder {
        if format == 2 { return authenticatedBytesVersion2(vaultID: header.vaultID, header: header) }
        return authenticatedBytes(
            vaultID: header.vaultID, headerBinding: headerBinding ?? Self.headerBinding(header, key: keys.element), keys: keys)
    }

    /// Checks the MAC the available keys allow: the index-root one when present, otherwise the
    /// `always` one.
    mutating func verify(header: VaultHeader, headerBinding: [UInt8]? = nil, keys: Keys) -> Bool {
        let bytes = verifiedBytes(header: header, headerBinding: headerBinding, keys: keys)
        if let stateKey = keys.state {
            return Self.equal(bytes.withBytes { Crypto.keyedDigest($0, key: stateKey) }, mac)
        }
        return Self.equal(bytes.withBytes { Crypto.keyedDigest($0, key: keys.always) }, alwaysMAC)
    }

    /// Checks every MAC the keys allow (both when the index root is there), for `verify`.
    mutating func verifyEvery(header: VaultHeader, keys: Keys) -> Bool {
        let bytes = verifiedBytes(header: header, headerBinding: nil, keys: keys)
        let always = Self.equal(bytes.withBytes { Crypto.keyedDigest($0, key: keys.always) }, alwaysMAC)
        guard let stateKey = keys.state else { return always }
        return always && Self.equal(bytes.withBytes { Crypto.keyedDigest($0, key: stateKey) }, mac)
    }

    static func equal(_ left: [UInt8], _ right: [UInt8]) -> Bool {
        guard left.count == right.count else { return false }
        return left.withUnsafeBytes { a in right.withUnsafeBytes { b in constantTimeEquals(a, b) } }
    }

    // MARK: Storage

    /// The stored state, or nil when the vault has none yet (a file from before schema 2 that
    /// has not been unlocked since). A malformed state is `errSecDecode`.
    ///
    /// From schema 3 the accumulators live in `integrity_groups`, one row per group. A state of
    /// format 2 whose accumulators are still in `vault_state` (written before the schema
    /// changed) is read from there, and all its groups are written at the next save. In format
    /// 4 the generation and MACs are those of the group rows with the highest generation
    /// (which one write saved together: they must agree); the other rows' are older records'.
    static func load(from database: Database) throws(LockboxError) -> IntegrityState? {
        let statement = try database.statement("SELECT generation, accumulators, mac, always_mac, format FROM vault_state WHERE id = 1")
        defer { statement.reset() }
        guard try statement.step() else { return nil }
        let malformed = LockboxError.integrity("The keychain's integrity record")
        guard let generation = statement.integer(0), generation >= 0, let inline = statement.blob(1),
            let mac = statement.blob(2), let alwaysMAC = statement.blob(3), let format = statement.integer(4), (2...6).contains(format)
        else { throw malformed }
        var state: IntegrityState
        if inline.count == bucketCount * accumulatorSize && format == 2 {
            state = IntegrityState(generation: generation, accumulators: inline)
            state.mac = mac
            state.alwaysMAC = alwaysMAC
        } else {
            // Up to format 5 `vault_state` holds no accumulators any more; from 6, the sum of
            // the deletion records.
            guard format >= 6 ? inline.count == accumulatorSize : inline.isEmpty else { throw malformed }
            // From format 4 `vault_state` holds the format alone (what a save left there).
            guard format < 4 || (generation == 0 && mac.isEmpty && alwaysMAC.isEmpty) else { throw malformed }
            let groups = try loadGroups(from: database, withRecord: format >= 4)
            state = IntegrityState(generation: generation, accumulators: groups.accumulators)
            state.unsavedGroups = 0
            if let record = groups.record {
                state.generation = record.generation
                state.mac = record.mac
                state.alwaysMAC = record.alwaysMAC
            } else {
                state.mac = mac
                state.alwaysMAC = alwaysMAC
            }
        }
        state.format = format
        state.storedFormat = format
        if format >= 6 { state.deletions = inline }
        state.deletionsKnown = format >= 6
        return state
    }

    private struct StoredGroups {
        var accumulators: [UInt8]
        /// From format 4: the record the rows of the highest generation carry.
        var record: (generation: Int, mac: [UInt8], alwaysMAC: [UInt8])?
    }

    private static func loadGroups(from database: Database, withRecord: Bool) throws(LockboxError) -> StoredGroups {
        let statement = try database.statement("SELECT id, accumulators, generation, mac, always_mac FROM integrity_groups ORDER BY id")
        defer { statement.reset() }
        let malformed = LockboxError.integrity("The keychain's integrity record")
        var groups = StoredGroups(accumulators: [])
        groups.accumulators.reserveCapacity(bucketCount * accumulatorSize)
        var expected = 0
        while try statement.step() {
            guard statement.integer(0) == expected, let group = statement.blob(1), group.count == groupSize else { throw malformed }
            groups.accumulators += group
            expected += 1
            guard withRecord else { continue }
            guard let generation = statement.integer(2), generation >= 0, let mac = statement.blob(3), mac.count == macSize,
                let alwaysMAC = statement.blob(4), alwaysMAC.count == macSize
            else { throw malformed }
            if let record = groups.record, record.generation >= generation {
                // One write saves every row it changes with the same record.
                if record.generation == generation && (record.mac != mac || record.alwaysMAC != alwaysMAC) { throw malformed }
                continue
            }
            groups.record = (generation, mac, alwaysMAC)
        }
        guard expected == groupCount else { throw malformed }
        return groups
    }

    /// The stored generation alone (for `status`); nil when there is no state.
    static func loadGeneration(from database: Database) throws(LockboxError) -> Int? {
        guard let (generation, format) = try database.firstRow("SELECT generation, format FROM vault_state WHERE id = 1", read: { ($0.integer(0), $0.integer(1)) })
        else { return nil }
        guard let format, format >= 4 else { return generation }
        return try database.firstRow("SELECT max(generation) FROM integrity_groups") { $0.integer(0) } ?? nil
    }

    /// Writes the groups that changed since the state was read, each with the generation and
    /// the MACs (from format 4). An existing row is updated where it is (the same size: SQLite
    /// overwrites the cell in place, where a replacement would delete it and insert it again).
    /// Over a record of an older format every group is written, and `vault_state` keeps only
    /// the format from then on.
    mutating func save(to database: Database) throws(LockboxError) {
        precondition(format == Self.currentFormat, "a state is saved in the current format")
        if storedFormat != Self.currentFormat {
            let statement = try database.statement(
                """
                INSERT INTO vault_state (id, generation, accumulators, mac, always_mac, format) VALUES (1, 0, ?, X'', X'', ?)
                ON CONFLICT (id) DO UPDATE SET generation = 0, accumulators = excluded.accumulators, mac = X'', always_mac = X'',
                    format = excluded.format
                """)
            statement.bind(1, deletions)
            statement.bind(2, format)
            try statement.run()
            unsavedGroups = .max
            deletionsChanged = false
        } else if deletionsChanged {
            // The same size as before: SQLite overwrites the cell in place.
            let statement = try database.statement("UPDATE vault_state SET accumulators = ? WHERE id = 1")
            statement.bind(1, deletions)
            try statement.run()
            statement.reset()
            deletionsChanged = false
        }
        // A write that changed no group (a header change) still moves the record: it goes into
        // the first group's row.
        if unsavedGroups == 0 { unsavedGroups = 1 }
        // Updated in place where the row is there (every write after the first), inserted
        // where it is not (a record converted from format 2, which had no group rows).
        let update = try database.statement(
            "UPDATE integrity_groups SET accumulators = ?1, generation = ?2, mac = ?3, always_mac = ?4 WHERE id = ?5")
        for index in 0..<Self.groupCount where unsavedGroups & (1 << index) != 0 {
            // Bound values are copied: the group's bytes are read in place.
            func bind(_ statement: Statement) {
                accumulators.withUnsafeBytes { bytes in
                    statement.bind(1, bytes: UnsafeRawBufferPointer(rebasing: bytes[index * Self.groupSize..<(index + 1) * Self.groupSize]))
                }
                statement.bind(2, generation)
                statement.bind(3, mac)
                statement.bind(4, alwaysMAC)
                statement.bind(5, index)
            }
            bind(update)
            try update.run()
            update.reset()
            if database.changes == 0 {
                let insert = try database.statement(
                    "INSERT INTO integrity_groups (accumulators, generation, mac, always_mac, id) VALUES (?1, ?2, ?3, ?4, ?5)")
                bind(insert)
                try insert.run()
                insert.reset()
            }
            unsavedGroups &= ~(1 << index)
        }
        storedFormat = Self.currentFormat
    }

    /// The accumulator of `bucket` recomputed from the rows whose lookup digest starts with the
    /// bucket's byte (a range of the lookup index). A row found there that belongs to another
    /// bucket (a digest that is not a blob sorts before every blob, into bucket 0's range), or
    /// an id present twice, is tampering; so is a row whose `bucket` column disagrees, which
    /// every row served is checked for too.
    static func computeAccumulator(bucket: Int, database: Database, key: SecretBytes) throws(LockboxError) -> [UInt8] {
        let statement: Statement
        switch bucket {
        case 0:
            statement = try database.statement("SELECT \(RowIdentity.columns) FROM items WHERE lookup_digest < X'01'")
        case bucketCount - 1:
            statement = try database.statement("SELECT \(RowIdentity.columns) FROM items WHERE lookup_digest >= X'FF'")
        default:
            statement = try database.statement(
                "SELECT \(RowIdentity.columns) FROM items WHERE lookup_digest >= ? AND lookup_digest < ?")
            statement.bind(1, [UInt8(bucket)])
            statement.bind(2, [UInt8(bucket + 1)])
        }
        defer { statement.reset() }
        var accumulator = [UInt8](repeating: 0, count: accumulatorSize)
        try countRows(statement, key: key) { rowBucket, element throws(LockboxError) in
            guard rowBucket == bucket else { throw LockboxError.integrity("The keychain's rows") }
            accumulator.withUnsafeMutableBytes { ModularSum.add(element, to: $0) }
        }
        return accumulator
    }

    /// Every row of the file counted by the bucket its lookup digest names, whatever its
    /// `bucket` column says. A misplaced bucket column or an id present twice is tampering.
    static func recount(database: Database, key: SecretBytes) throws(LockboxError) -> IntegrityState {
        var state = IntegrityState.empty()
        let statement = try database.statement("SELECT \(RowIdentity.columns) FROM items")
        defer { statement.reset() }
        try countRows(statement, key: key) { bucket, element in
            state.accumulators.withUnsafeMutableBytes {
                ModularSum.add(element, to: UnsafeMutableRawBufferPointer(rebasing: $0[bucket * accumulatorSize..<(bucket + 1) * accumulatorSize]))
            }
        }
        state.markAllUnsaved()
        state.deletionsKnown = false
        return state
    }

    /// Steps through the rows `statement` selects (``RowIdentity/columns``) and hands `count`
    /// each row's bucket (from its lookup digest) and element, the bytes ``element(_:key:)``
    /// digests for its ``RowIdentity``. The columns are encoded in place from SQLite's row into
    /// one reused buffer: a bucket check reads hundreds of rows, and a row costs no `String` or
    /// array of its own. A missing column, a `bucket` column that disagrees with the lookup
    /// digest, an id present twice or a primary digest present twice is tampering. (No write
    /// stores a second row of a primary key; a row hidden from the writer's check while the
    /// item was added again, then shown, would otherwise be counted beside the new one and
    /// served in its place.)
    private static func countRows(
        _ statement: Statement, key: SecretBytes, _ count: (Int, UnsafeRawBufferPointer) throws(LockboxError) -> Void
    ) throws(LockboxError) {
        var encoded = ElementEncoding()
        defer { encoded.deallocate() }
        let element = UnsafeMutableRawBufferPointer.allocate(byteCount: accumulatorSize, alignment: 8)
        defer { element.deallocate() }
        // Ids are 16 random bytes: two words each, sorted at the end to find one present twice.
        var ids: [IdentifierWords] = []
        ids.reserveCapacity(512)
        var otherIDs = Set<[UInt8]>()
        // Primary digests are 32 bytes: four words each, sorted at the end like the ids.
        var primaries: [DigestWords] = []
        primaries.reserveCapacity(512)
        var otherPrimaries = Set<[UInt8]>()
        var misplaced: LockboxError { LockboxError.integrity("The keychain's rows") }
        while try statement.step() {
            encoded.count = 0
            // Every column of the storage class Lockbox writes, checked before any is read (a
            // read may convert it). The element is made of bytes, and SQL finds no equality
            // between classes whatever the bytes: a digest edited to text, a group to a blob or
            // a flag to text would be counted as before while a query's SQL missed the row,
            // which would then read as not found.
            for column in 0..<Int32(writtenClasses.count) where statement.storageClass(column) != writtenClasses[Int(column)] {
                guard column == 4 && statement.storageClass(column) == .null else { throw misplaced }
            }
            guard let id = statement.borrowedBlob(0), let version = statement.integer(1),
                let primary = statement.borrowedBlob(2), let lookup = statement.borrowedBlob(3)
            else { throw LockboxError.integrity() }
            encoded.appendField(id)
            encoded.appendField(version)
            encoded.appendField(primary)
            encoded.appendField(lookup)
            if let name = statement.borrowedBlob(4) { encoded.appendField(name) } else { encoded.appendAbsent() }
            for column: Int32 in 5...7 {
                guard let text = statement.borrowedText(column) else { throw LockboxError.integrity() }
                encoded.appendTextField(text)
            }
            guard let synchronizable = statement.integer(8), let deviceID = statement.borrowedText(9),
                let accessControl = statement.borrowedText(10), let storedBucket = statement.integer(11)
            else { throw LockboxError.integrity() }
            encoded.appendField(synchronizable)
            encoded.appendTextField(deviceID)
            encoded.appendTextField(accessControl)
            let bucket = lookup.isEmpty ? 0 : Int(lookup[0])
            guard storedBucket == bucket else { throw misplaced }
            if id.count == 16 {
                ids.append(
                    IdentifierWords(
                        high: UInt64(bigEndian: id.loadUnaligned(as: UInt64.self)),
                        low: UInt64(bigEndian: id.loadUnaligned(fromByteOffset: 8, as: UInt64.self))))
            } else {
                guard otherIDs.insert(Array(id)).inserted else { throw misplaced }
            }
            if primary.count == 32 {
                primaries.append(DigestWords(primary))
            } else {
                guard otherPrimaries.insert(Array(primary)).inserted else { throw misplaced }
            }
            Crypto.keyedDigest(encoded.bytes, key: key, into: element)
            try count(bucket, UnsafeRawBufferPointer(element))
        }
        ids.sort()
        for index in ids.indices.dropFirst() where ids[index] == ids[index - 1] { throw misplaced }
        primaries.sort()
        for index in primaries.indices.dropFirst() where primaries[index] == primaries[index - 1] { throw misplaced }
    }

    /// A 32-byte digest as four words, compared as the bytes are.
    private struct DigestWords: Comparable {
        var words: (UInt64, UInt64, UInt64, UInt64)

        init(_ bytes: UnsafeRawBufferPointer) {
            words = (
                UInt64(bigEndian: bytes.loadUnaligned(as: UInt64.self)),
                UInt64(bigEndian: bytes.loadUnaligned(fromByteOffset: 8, as: UInt64.self)),
                UInt64(bigEndian: bytes.loadUnaligned(fromByteOffset: 16, as: UInt64.self)),
                UInt64(bigEndian: bytes.loadUnaligned(fromByteOffset: 24, as: UInt64.self)))
        }

        static func == (left: DigestWords, right: DigestWords) -> Bool { left.words == right.words }

        static func < (left: DigestWords, right: DigestWords) -> Bool { left.words < right.words }
    }

    /// The storage class of each of ``RowIdentity/columns`` as Lockbox writes it (the name
    /// digest may also be NULL).
    private static let writtenClasses: [StorageClass] = [
        .blob, .integer, .blob, .blob, .blob, .text, .text, .text, .integer, .text, .text, .integer,
    ]

    /// A 16-byte row id as two words, compared as the bytes are.
    private struct IdentifierWords: Comparable {
        var high: UInt64
        var low: UInt64

        static func < (left: IdentifierWords, right: IdentifierWords) -> Bool {
            (left.high, left.low) < (right.high, right.low)
        }
    }
}

/// A row's element input as ``FieldEncoder`` writes it, in one buffer reused from row to row
/// (appending to an array costs more than the bytes it copies, 20 fields a row).
private struct ElementEncoding {
    private var start = UnsafeMutableRawPointer.allocate(byteCount: 1024, alignment: 8)
    private var capacity = 1024
    /// Bytes written; set to 0 to start the next row.
    var count = 0

    var bytes: UnsafeRawBufferPointer { UnsafeRawBufferPointer(start: start, count: count) }

    func deallocate() { start.deallocate() }

    /// Room for `extra` more bytes (a column an attacker made long grows the buffer).
    @inline(__always)
    private mutating func reserve(_ extra: Int) {
        guard count + extra > capacity else { return }
        let grown = max(2 * capacity, count + extra)
        let bigger = UnsafeMutableRawPointer.allocate(byteCount: grown, alignment: 8)
        bigger.copyMemory(from: start, byteCount: count)
        start.deallocate()
        start = bigger
        capacity = grown
    }

    /// An absent field: the marker 0.
    @inline(__always)
    mutating func appendAbsent() {
        reserve(1)
        start.storeBytes(of: 0, toByteOffset: count, as: UInt8.self)
        count += 1
    }

    /// A present field: the marker 1, the length as 4 bytes little-endian, the bytes.
    @inline(__always)
    mutating func appendField(_ value: UnsafeRawBufferPointer) {
        reserve(5 + value.count)
        start.storeBytes(of: 1, toByteOffset: count, as: UInt8.self)
        start.storeBytes(of: UInt32(value.count).littleEndian, toByteOffset: count + 1, as: UInt32.self)
        if let base = value.baseAddress { (start + count + 5).copyMemory(from: base, byteCount: value.count) }
        count += 5 + value.count
    }

    /// An integer as ``FieldEncoder/integer(_:)`` writes it: 8 bytes little-endian.
    @inline(__always)
    mutating func appendField(_ value: Int) {
        Swift.withUnsafeBytes(of: UInt64(bitPattern: Int64(value)).littleEndian) { appendField($0) }
    }

    /// A text column as ``FieldEncoder/string(_:)`` writes the `String` that
    /// ``Statement/text(_:)`` makes of it: ASCII as it is, anything else decoded (invalid UTF-8
    /// repaired) and encoded again, so that the bytes are the same.
    @inline(__always)
    mutating func appendTextField(_ value: UnsafeRawBufferPointer) {
        if value.allSatisfy({ $0 < 0x80 }) { return appendField(value) }
        var string = String(decoding: value, as: UTF8.self)
        string.withUTF8 { appendField(UnsafeRawBufferPointer($0)) }
    }
}

/// The highest generation this machine has seen of a vault, kept outside the vault file (in
/// `$XDG_STATE_HOME/lockbox/generations/`), so that an older copy of the whole file, or a
/// deleted WAL, is noticed. Written after each commit without a sync of its own: after a crash
/// it can only lag behind the file (a missed detection), never run ahead (a false alarm).
///
/// The file's eight bytes are mapped shared into the process once it exists: every write of
/// the vault reads and advances it, and a memory access costs none of the two system calls
/// (with their inode time updates) that a `pread` and a `pwrite` did. Every process that maps
/// the file sees the same page, so advancing is an atomic maximum across processes, where a
/// read then a write could move it back. The directory is the user's own (0700): truncating
/// the file under a running process ends that process (`SIGBUS`), as killing it would.
///
/// The state directory is per environment: a process with another `XDG_STATE_HOME` (a sandbox,
/// a service manager) keeps a record of its own, and would take an older copy of the file, put
/// back after another environment wrote it, for current. With the kernel-keyring unlock cache
/// (the default), the generation is also kept in the user's `lockbox` keyring (an entry
/// `lockbox:v1:VAULT:generation`, eight bytes, not secret), which every process of the user
/// shares until reboot, and the higher of the two applies. Like the file, the entry is raised
/// after each commit: two processes raising it at once can leave it behind the file (a missed
/// detection), never ahead.
package final class RememberedGeneration {
    let path: String
    /// The mapped value, once the file exists and holds eight bytes.
    private var mapped: UnsafeMutablePointer<Atomic<UInt64>>?
    /// The kernel keyring entry's description, when the generation is shared through it.
    private let sharedDescription: String?
    /// The entry, once found or written.
    private var sharedSerial: KernelKeyring.Serial?
    /// The highest value this handle read from the entry or wrote to it: a commit writes only a
    /// higher one (one system call, `keyctl_update`), and reads nothing first.
    private var sharedKnown = 0

    /// One record per vault identity, wherever the file is and however its path is spelled:
    /// moving the file keeps its record; a copy of it used as a second vault shares the record
    /// (the older of the two is then refused until accepted with `lockbox verify --accept-older`).
    /// - Parameter sharing: also keep it in the kernel keyring, for the user's other environments.
    init(vaultID: [UInt8], vaultPath: String, device: DeviceIdentity, sharing: Bool = false) {
        let directory = FilePermissions.directory(of: device.resolvedKeyPath) + "/generations"
        path = directory + "/" + vaultID.hexString
        entryDescription = KeyCache.description(vaultID: vaultID.hexString, kind: .generation)
        sharedDescription = sharing ? entryDescription : nil
    }

    /// The kernel keyring entry's description, whether this handle shares through it or not:
    /// accepting an older file sets it back too (else the user's other processes would go on
    /// refusing the file the user accepted).
    private let entryDescription: String

    /// Whether this handle looked for the entry and found none: not searched for again (a
    /// search on every read would cost more than the read); this handle's own commit makes it.
    private var searchedInVain = false

    /// The generation in the kernel keyring; 0 when none (or the keyring cannot be used).
    private func shared() -> Int {
        guard let description = sharedDescription else { return 0 }
        for attempt in 0..<2 {
            if sharedSerial == nil && searchedInVain && attempt == 0 { return 0 }
            if sharedSerial == nil || attempt > 0 {
                sharedSerial = try? KernelKeyring.find(description)
                searchedInVain = sharedSerial == nil
            }
            guard let serial = sharedSerial else { return 0 }
            if let payload = KernelKeyring.readSmall(serial, capacity: 8) {
                guard payload.count == 8 else { return 0 }
                let value = Self.generation(of: payload)
                sharedKnown = max(sharedKnown, value)
                return value
            }
            // Gone (the keyring renewed, say): looked up once more.
        }
        return 0
    }

    /// Writes `generation` into the kernel keyring (best effort: a keyring that cannot be used
    /// leaves the state directory's record alone to apply).
    private func share(_ generation: Int) {
        guard let description = sharedDescription else { return }
        let payload = Self.bytes(of: generation)
        if let serial = sharedSerial, KernelKeyring.update(serial, with: payload) {
            sharedKnown = generation
            return
        }
        sharedSerial = try? KernelKeyring.storeSmall(payload, description: description)
        if sharedSerial != nil { sharedKnown = generation }
    }

    /// A generation as the kernel keyring's entry (and the state directory's file) holds it:
    /// eight bytes, little-endian.
    package static func bytes(of generation: Int) -> [UInt8] {
        (0..<8).map { UInt8(truncatingIfNeeded: UInt64(generation) >> (8 * $0)) }
    }

    package static func generation(of bytes: [UInt8]) -> Int {
        Int(truncatingIfNeeded: bytes.reversed().reduce(UInt64(0)) { $0 << 8 | UInt64($1) })
    }

    /// Sets the kernel keyring's record of a vault's generation (`vaultID` in hex) to
    /// `generation`, or removes it (nil), as putting back the whole state outside the file does:
    /// for tools that restore such a state on purpose (the tamper campaign).
    package static func setSharedGeneration(vaultID: String, to generation: Int?) {
        let description = KeyCache.description(vaultID: vaultID, kind: .generation)
        guard let generation else {
            try? KernelKeyring.remove(description: description)
            return
        }
        _ = try? KernelKeyring.storeSmall(Self.bytes(of: generation), description: description)
    }

    /// The failed-passphrase count mirrored beside the generation (see ``Vault/readAttempts``).
    var attemptsPath: String { path + ".attempts" }

    /// Whether this machine has recorded anything of this vault (it wrote or checked it here).
    var exists: Bool { FilePermissions.exists(path) }

    deinit {
        if let mapped { munmap(UnsafeMutableRawPointer(mapped), 8) }
    }

    /// Maps the file; with `creating`, creates it first (zero: nothing remembered). Nil when it
    /// does not exist (and is not to be created) or cannot be mapped.
    private func map(creating: Bool) -> UnsafeMutablePointer<Atomic<UInt64>>? {
        if let mapped { return mapped }
        if creating {
            let directory = FilePermissions.directory(of: path)
            if (try? FilePermissions.createPrivateDirectory(directory)) == nil { return nil }
        }
        let descriptor = Glibc.open(path, O_RDWR | O_CLOEXEC | O_NOFOLLOW | (creating ? O_CREAT : 0), 0o600)
        guard descriptor >= 0 else { return nil }
        defer { close(descriptor) }
        var status = stat()
        guard fstat(descriptor, &status) == 0, status.st_mode & S_IFMT == S_IFREG else { return nil }
        if status.st_size == 0 {
            // A new file: grown (never cut), so a process creating it at the same time loses
            // nothing.
            guard creating, ftruncate(descriptor, 8) == 0 else { return nil }
        } else if status.st_size < 8 {
            // Cut short: it holds no generation. Its bytes are not one.
            let zero = [UInt8](repeating: 0, count: 8)
            guard creating, zero.withUnsafeBytes({ pwrite(descriptor, $0.baseAddress, 8, 0) }) == 8 else { return nil }
        }
        guard let address = mmap(nil, 8, PROT_READ | PROT_WRITE, MAP_SHARED, descriptor, 0), address != MAP_FAILED else {
            return nil
        }
        let pointer = address.bindMemory(to: Atomic<UInt64>.self, capacity: 1)
        mapped = pointer
        return pointer
    }

    /// The remembered generation, the higher of the state directory's and the kernel
    /// keyring's; 0 when there is none.
    func read() -> Int {
        max(readHere(), shared())
    }

    /// The state directory's record alone.
    private func readHere() -> Int {
        guard let value = map(creating: false) else { return 0 }
        return Int(truncatingIfNeeded: UInt64(littleEndian: value.pointee.load(ordering: .acquiring)))
    }

    /// Remembers `generation` when it is higher than what is remembered.
    func advance(to generation: Int) {
        // Not read first: two processes raising it at once may leave it behind (a missed
        // detection), never ahead of the file.
        if sharedDescription != nil, generation > sharedKnown { share(generation) }
        guard generation > readHere(), let value = map(creating: true) else { return }
        var current = value.pointee.load(ordering: .relaxed)
        while Int(truncatingIfNeeded: UInt64(littleEndian: current)) < generation {
            let exchanged = value.pointee.compareExchange(
                expected: current, desired: UInt64(generation).littleEndian, ordering: .acquiringAndReleasing)
            if exchanged.exchanged { return }
            current = exchanged.original
        }
    }

    /// Remembers exactly `generation` (accepting an older file on purpose), here and in the
    /// kernel keyring.
    func write(_ generation: Int) {
        if sharedDescription != nil {
            share(generation)
        } else if let serial = try? KernelKeyring.find(entryDescription) {
            // This handle keeps its keys in its process only; the entry other processes read is
            // set back all the same, when there is one.
            _ = KernelKeyring.update(serial, with: Self.bytes(of: generation))
        }
        guard let value = map(creating: true) else { return }
        value.pointee.store(UInt64(generation).littleEndian, ordering: .releasing)
    }
}
