import LockboxCore
import VaultCrypto
import VaultStorage

#if canImport(Glibc)
import Glibc
#endif

extension Vault {
    /// The value of the one item `query` matches.
    ///
    /// The read behind every credential helper, `find-generic-password -w` and token lookup
    /// names one item by its primary key and wants its value alone. That read is answered here
    /// with the work it needs and no more: one statement (no explicit transaction), the row's
    /// columns read in place, its value opened, nothing decoded. Whatever it cannot answer
    /// that way (another query shape, an access-controlled or older row, a key, a locked
    /// class, nothing found, a file another connection changed since this handle last verified
    /// it) is answered by ``items(matching:)``, with every answer, error and prompt its rules
    /// give.
    ///
    /// The checks are those of ``items(matching:)`` for such a read: the rows come from a
    /// snapshot this handle verified (the integrity state and the bucket the digest names,
    /// compared through the file's change counter), every row found must be in that bucket,
    /// and the value's associated data binds the row's columns, digests, version and sealed
    /// attributes, so an edited, swapped, moved or replayed row fails to open.
    public func data(matching query: Query) throws(LockboxError) -> SecretBytes {
        if let value = try valueByPrimaryKey(query) { return value }
        return try dataThroughItems(matching: query)
    }

    /// The columns the value read selects, by position. Each text or blob column SQLite hands
    /// out is a copy it allocates, so the columns the read can know otherwise are not
    /// selected: the lookup digest is the one bound (rows are selected by equality with it),
    /// the class is the query's (the digested key includes it, and the value's associated data
    /// binds the class the row was sealed for: a row of another class fails to open, and an
    /// edited class column is caught by the bucket's count like any edited column), a wrapped
    /// key and access control are only measured (a row this read serves has neither), and a
    /// device is read only for the rows that have one.
    ///
    /// The general path and the integrity record read columns through SQLite's conversions
    /// (text up to its first NUL, invalid UTF-8 repaired, numbers coerced), this read reads
    /// their bytes. A row whose columns are not stored as Lockbox stores them (a flag column
    /// holding text, a text column holding a NUL or bytes beyond ASCII, an item key that is not
    /// an empty blob) would be seen differently by the two, so such a row, and any row this
    /// read would refuse, is left to the general path, which answers as it always has.
    private enum ValueColumn {
        static let id: Int32 = 0, accessibility: Int32 = 1, accessGroup: Int32 = 2, metadata: Int32 = 3, secret: Int32 = 4
        static let deviceID: Int32 = 5, primaryDigest: Int32 = 6, nameDigest: Int32 = 7, version: Int32 = 8, flags: Int32 = 9
        /// The bits of the `flags` column: what the read needs to know of the other columns,
        /// computed by SQLite (one column costs about as much as a small blob). `length` and
        /// `typeof` of a blob do not read it.
        static let synchronizable = 1, wrappedKey = 2, accessControl = 4, inBucket = 8, currentFormat = 16, plainFlag = 32
        static let sql =
            "SELECT id, accessibility, access_group, metadata, secret, "
            + "CASE WHEN device_id = '' THEN NULL ELSE device_id END, primary_digest, name_digest, version, "
            + "((synchronizable != 0) | ((typeof(wrapped_key) != 'blob' OR length(wrapped_key) != 0) << 1) "
            + "| ((access_control != '') << 2) | ((bucket = ?2) << 3) | ((format = \(SealedRow.currentFormat)) << 4) "
            + "| ((synchronizable IN (0, 1)) << 5)) "
            + "FROM items WHERE lookup_digest = ?1 ORDER BY rowid"
    }

    /// What the value read needs of a query (a query is large: it is not carried into the lock).
    private struct ValueRequest {
        var itemClass: ItemClass
        /// The primary key as the lookup digest encodes it.
        var encodedKey: FieldEncoder
        var group: String?
        var accessibility: Accessibility?
        var synchronizable: Query.SynchronizableMatch
    }

    /// The value, when `query` names one item by its primary key and the read needs nothing
    /// but this handle's verified state; nil to leave the answer to ``items(matching:)``.
    private func valueByPrimaryKey(_ query: Query) throws(LockboxError) -> SecretBytes? {
        guard query.persistentReference == nil, PrimaryKey.namesExactly(query.itemClass, query.attributes) else { return nil }
        var encodedKey = FieldEncoder()
        PrimaryKey.encode(query.itemClass, query.attributes, includingGroup: false, into: &encodedKey)
        let request = ValueRequest(
            itemClass: query.itemClass, encodedKey: encodedKey, group: query.attributes.accessGroup,
            accessibility: query.attributes.accessibility, synchronizable: query.synchronizable)
        if let group = request.group, let groups = configuration.accessGroups, !groups.contains(group) { return nil }
        return try withState { state throws(LockboxError) -> SecretBytes? in
            guard let indexKey = try state.keys.indexKey(for: request.itemClass) else { return nil }
            let lookupDigest = request.encodedKey.withBytes { Crypto.keyedDigest($0, key: indexKey) }
            let bucket = SealedRow.bucket(ofLookupDigest: lookupDigest)
            let statement: Statement
            if let cached = state.valueStatement {
                statement = cached
            } else {
                // Text is read as stored: in a file whose text is UTF-16 the bytes are not the
                // UTF-8 the associated data binds. Such a file is read by the general path.
                let encoding = try state.database.firstRow("PRAGMA encoding", read: { $0.text(0) }) ?? nil
                guard encoding == "UTF-8" else { return nil }
                statement = try state.database.statement(ValueColumn.sql)
                state.valueStatement = statement
            }
            // `withState` resets it, ending its snapshot, whichever way this returns.
            statement.bind(1, lookupDigest)
            statement.bind(2, bucket)
            guard try statement.step() else { return nil }
            // The statement's snapshot must be the one this handle verified; otherwise the
            // general path verifies the new one.
            guard let check = state.valueReadCheck, check.pagerVersion == state.database.pagerDataVersion,
                check.verifiedBuckets[bucket]
            else { return nil }
            // Rows in the digest's order, as the general path takes them; the first one the
            // query may see is the answer. (Verifying the bucket checked every row with this
            // digest against its bucket; each row read is checked again.)
            repeat {
                switch try openValue(of: statement, request, lookupDigest: lookupDigest, state: state) {
                case .opened(let value):
                    state.directValueReads += 1
                    return value
                case .notAdmitted: continue
                case .needsGeneralPath: return nil
                }
            } while try statement.step()
            return nil
        }
    }

    /// How many values this handle read by primary key without the general path (for tests).
    package var directValueReads: Int { withState { $0.directValueReads } }

    /// The part of ``IntegrityCache`` the value read checks: the snapshot it describes and the
    /// buckets verified in it. Nil while the cache has no verified state.
    struct ValueReadCheck {
        var pagerVersion: UInt32
        var verifiedBuckets: [Bool]

        init?(_ cache: IntegrityCache) {
            guard cache.state != nil, cache.keys != nil, let pagerVersion = cache.pagerVersion,
                cache.verifiedBuckets.count == IntegrityState.bucketCount
            else { return nil }
            self.pagerVersion = pagerVersion
            verifiedBuckets = cache.verifiedBuckets
        }
    }

    private enum ValueOutcome {
        case opened(SecretBytes)
        /// The row is not one the query may see (another group, accessibility, sync flag or
        /// machine): the next one may be.
        case notAdmitted
        /// The row needs what only ``items(matching:)`` does (user verification, decoding, a
        /// locked class's answer).
        case needsGeneralPath
    }

    /// Opens the value of the row `statement` is on, if the query may see it and it is a row
    /// this read handles. The associated data is the one ``SealedRow/associatedDataPrefix(vaultID:)``
    /// builds, written from the columns in place.
    private func openValue(
        of statement: Statement, _ request: ValueRequest, lookupDigest: [UInt8], state: State
    ) throws(LockboxError) -> ValueOutcome {
        typealias Column = ValueColumn
        // Column bytes are read in place: valid until the statement's next step, which comes
        // after this returns.
        // A NULL in a NOT NULL column reads as no bytes, and so fails the value's open.
        let id = statement.borrowedBlob(notNull: Column.id), group = statement.borrowedBlob(notNull: Column.accessGroup)
        let storedAccessibility = statement.borrowedBlob(notNull: Column.accessibility)
        let primaryDigest = statement.borrowedBlob(notNull: Column.primaryDigest)
        guard let flags = statement.integer(Column.flags), let version = statement.integer(Column.version) else {
            throw LockboxError.integrity()
        }
        let deviceID = statement.borrowedBlob(Column.deviceID)
        // Only rows stored as Lockbox stores them, in their bucket (see `ValueColumn`).
        guard flags & Column.plainFlag != 0, flags & Column.inBucket != 0, let accessibility = Accessibility(utf8: storedAccessibility),
            group.isPlainText, deviceID?.isPlainText ?? true
        else { return .needsGeneralPath }
        let synchronizable = flags & Column.synchronizable != 0
        // Admission, as `admits` decides it (the class is bound below).
        let visibleGroup: Bool
        if let wanted = request.group {
            visibleGroup = group.equals(wanted)
        } else if let groups = configuration.accessGroups {
            visibleGroup = groups.contains { group.equals($0) }
        } else {
            visibleGroup = true
        }
        guard deviceID.map({ $0.equals(state.device.identifier) }) ?? true, visibleGroup,
            request.synchronizable.matches(synchronizable), request.accessibility.map({ $0 == accessibility }) ?? true
        else { return .notAdmitted }
        // Format-3 rows without access control, of items that are not keys, sealed under a class
        // key this handle holds: anything else takes the general path.
        // (No item key is ever written for a row sealed under its class key: the general path
        // refuses one found there.)
        guard flags & Column.currentFormat != 0, flags & Column.accessControl == 0, flags & Column.wrappedKey == 0,
            request.itemClass != .key, let classKey = try state.keys.classKey(for: accessibility, header: state.header)
        else { return .needsGeneralPath }

        var associatedData = state.spareEncoder.take() ?? FieldEncoder()
        associatedData.removeAll()
        defer { state.spareEncoder = associatedData }
        associatedData.string("lockbox.item")
        associatedData.integer(SealedRow.currentFormat)
        associatedData.bytes(state.vaultID)
        associatedData.bytes(inPlace: id)
        associatedData.string(request.itemClass.rawValue)
        associatedData.bytes(inPlace: storedAccessibility)
        associatedData.bytes(inPlace: group)
        associatedData.integer(synchronizable ? 1 : 0)
        associatedData.bytes(inPlace: deviceID ?? UnsafeRawBufferPointer(start: nil, count: 0))
        associatedData.string("")
        associatedData.bytes(inPlace: primaryDigest)
        associatedData.bytes(lookupDigest)
        associatedData.bytes(inPlace: statement.borrowedBlob(Column.nameDigest))
        associatedData.integer(version)
        associatedData.string(SealedRow.Purpose.data.rawValue)
        associatedData.bytes(Crypto.digest(statement.borrowedBlob(notNull: Column.metadata)))
        let box = statement.borrowedBlob(notNull: Column.secret)
        // A malformed padding is as much tampering as a wrong tag.
        let opened = associatedData.withBytes { associatedData in
            try? Crypto.open(box, key: classKey, associatedDataInPlace: associatedData, extracting: Padding.unpadded)
        }
        guard let opened else { throw LockboxError.integrity() }
        return .opened(opened)
    }
}

extension Accessibility {
    /// Each class's raw value as UTF-8 (their lengths all differ).
    private static let utf8RawValues: [(bytes: [UInt8], value: Accessibility)] = allCases.map { (Array($0.rawValue.utf8), $0) }

    /// The class whose raw value is these UTF-8 bytes.
    init?(utf8 bytes: UnsafeRawBufferPointer) {
        for entry in Self.utf8RawValues where entry.bytes.count == bytes.count {
            guard entry.bytes.withUnsafeBytes({ memcmp($0.baseAddress!, bytes.baseAddress!, bytes.count) == 0 }) else { return nil }
            self = entry.value
            return
        }
        return nil
    }
}

extension UnsafeRawBufferPointer {
    /// True when every byte is ASCII and none is NUL: text that SQLite's conversions and
    /// Swift's `String` leave exactly as stored.
    var isPlainText: Bool {
        var outside: UInt8 = 0
        for byte in self { outside |= (byte &- 1) | byte }
        // A NUL wraps to 0xFF, a byte beyond ASCII has its high bit: either sets the high bit.
        return outside & 0x80 == 0
    }

    /// True when these are the UTF-8 bytes of `string`.
    func equals(_ string: String) -> Bool {
        var string = string
        return string.withUTF8 { utf8 in
            utf8.count == count && (count == 0 || memcmp(utf8.baseAddress!, baseAddress!, count) == 0)
        }
    }
}
