import LockboxCore
import VaultCrypto
import VaultStorage

/// One item as stored: plain columns for what queries filter on, sealed blobs for the rest.
///
/// Every blob is bound (as associated data) to the vault, the item's id, class,
/// accessibility, access group, sync flag, device and access control, and (from row format 2)
/// to the digests that select the row and to the row's version. A blob copied to another row,
/// a row whose plain or digest columns were edited, or a row whose version was changed fails
/// to open. Whether a row is the *current* one (not a replayed older copy, not deleted) is the
/// integrity state's job (``IntegrityState``).
struct SealedRow {
    var rowID: Int = 0
    var id: [UInt8]
    var itemClass: ItemClass
    var accessibility: Accessibility
    var accessGroup: String
    var synchronizable: Bool
    /// "" for portable items; this machine's device identifier for `*ThisDeviceOnly` ones.
    var deviceID: String
    /// "" or the access-control flags (``AccessControl/description``).
    var accessControl: String
    var primaryDigest: [UInt8]
    var lookupDigest: [UInt8]
    var nameDigest: [UInt8]?
    /// 1: the first release's rows (no digest binding, no padding, no version); 2: digests,
    /// padding and version bound, the value under an item key; 3: current, the value bound to
    /// the sealed attributes and, for rows without access control, sealed under the class key.
    var format: Int = SealedRow.currentFormat
    /// The vault generation that wrote this row (0 for format-1 rows): unique per write.
    var version: Int = 0
    /// The `bucket` column as stored (nil for a row not read from the file). A row is served
    /// only when it equals ``bucket``.
    var storedBucket: Int?
    var wrappedKey: [UInt8]
    var metadata: [UInt8]
    var secret: [UInt8]

    static let currentFormat = 3

    /// The integrity bucket: the first byte of the lookup digest, so a query that names a full
    /// primary key knows which bucket to check even when it finds nothing (a deleted row).
    var bucket: Int { Self.bucket(ofLookupDigest: lookupDigest) }

    /// A row read from the file whose `bucket` column disagrees with its digest was moved
    /// outside the integrity count: tampering.
    var isInItsBucket: Bool { storedBucket.map { $0 == bucket } ?? true }

    /// A new row's identifier (its persistent reference): the generation of the write that
    /// creates it (8 bytes, big-endian), then 8 random bytes. Identifiers made later sort
    /// after earlier ones, so the index of identifiers grows at its right edge, where its page
    /// is in the cache and a full page splits without moving half of it, instead of at a
    /// random place in a large file; the random half keeps those of one write apart. The
    /// generation is in the row's `version` column already (until the row changes).
    static func newIdentifier(generation: Int) -> [UInt8] {
        var identifier = [UInt8](repeating: 0, count: 16)
        identifier.withUnsafeMutableBytes { bytes in
            bytes.storeBytes(of: UInt64(generation).bigEndian, as: UInt64.self)
            Crypto.fillRandom(UnsafeMutableRawBufferPointer(rebasing: bytes[8...]))
        }
        return identifier
    }

    static func bucket(ofLookupDigest digest: [UInt8]) -> Int {
        digest.isEmpty ? 0 : Int(digest[0])
    }

    enum Purpose: String {
        case itemKey = "key"
        case metadata = "meta"
        case data = "data"
    }

    /// True when the row's associated data binds its digests (format 2 and later).
    var bindsDigests: Bool { format >= 2 }

    /// True when the value's associated data binds the sealed attributes' bytes (format 3 and
    /// later): opening the value then authenticates the attributes column too, with one open.
    var bindsAttributesToValue: Bool { format >= 3 }

    /// True when the value is sealed under the class key itself, with no item key (format 3
    /// rows without access control). An access-controlled row keeps an item key, because that
    /// key is what the user's verification unlocks.
    var sealsValueWithClassKey: Bool { format >= 3 && accessControl.isEmpty }

    /// The associated data shared by the row's blobs; each appends its purpose.
    func associatedDataPrefix(vaultID: [UInt8]) -> FieldEncoder {
        // About 270 bytes for a row of the current format, and the purpose (and the attributes'
        // digest) appended to a copy of it.
        var encoder = FieldEncoder(capacity: 384)
        encoder.string("lockbox.item")
        encoder.integer(format)
        encoder.bytes(vaultID)
        encoder.bytes(id)
        encoder.string(itemClass.rawValue)
        encoder.string(accessibility.rawValue)
        encoder.string(accessGroup)
        encoder.integer(synchronizable ? 1 : 0)
        encoder.string(deviceID)
        encoder.string(accessControl)
        if format >= 2 {
            // Everything that selects the row is authenticated with it: swapping digests
            // between rows makes both fail to open instead of answering one name with
            // another item's value.
            encoder.bytes(primaryDigest)
            encoder.bytes(lookupDigest)
            encoder.bytes(nameDigest)
            encoder.integer(version)
        }
        return encoder
    }

    func associatedData(prefix: FieldEncoder, _ purpose: Purpose) -> [UInt8] {
        var encoder = prefix
        encoder.string(purpose.rawValue)
        return encoder.bytes
    }

    /// Seals an item under a fresh item key. `attributes` must carry the resolved access
    /// group, accessibility and sync flag; `encodedAttributes`, when given, is their
    /// `encoded()` (made once by a caller that needed it already).
    static func seal(
        id: [UInt8], itemClass: ItemClass, attributes: ItemAttributes, encodedAttributes: [UInt8]? = nil, data: SecretBytes,
        classKey: SecretBytes, indexKey: SecretBytes, vaultID: [UInt8], deviceID: String,
        accessControl: AccessControl?, presencePublicKey: [UInt8]?, version: Int
    ) -> SealedRow {
        let accessibility = attributes.accessibility ?? .default
        let digests = indexDigests(itemClass, attributes, key: indexKey)
        var row = SealedRow(
            id: id, itemClass: itemClass, accessibility: accessibility,
            accessGroup: attributes.accessGroup ?? Vault.defaultAccessGroup,
            synchronizable: attributes.synchronizable ?? false,
            deviceID: accessibility.isThisDeviceOnly ? deviceID : "",
            accessControl: accessControl?.description ?? "",
            primaryDigest: digests.primary, lookupDigest: digests.lookup, nameDigest: digests.name,
            format: currentFormat, version: version, wrappedKey: [], metadata: [], secret: [])
        row.sealContents(
            classKey: classKey, attributes: attributes, encodedAttributes: encodedAttributes, data: data, vaultID: vaultID,
            presencePublicKey: accessControl != nil ? presencePublicKey : nil)
        return row
    }

    /// A row's index digests under `key`: of its primary key (``PrimaryKey/encode(_:_:includingGroup:)``),
    /// of the same without the group (the lookup digest) and of its name, from one encoder:
    /// the lookup encoding is the primary one's beginning.
    static func indexDigests(
        _ itemClass: ItemClass, _ attributes: ItemAttributes, key: SecretBytes
    ) -> (primary: [UInt8], lookup: [UInt8], name: [UInt8]?) {
        var encoder = FieldEncoder()
        PrimaryKey.encode(itemClass, attributes, includingGroup: false, into: &encoder)
        let lookup = encoder.withBytes { Crypto.keyedDigest($0, key: key) }
        PrimaryKey.encodeGroup(attributes, into: &encoder)
        let primary = encoder.withBytes { Crypto.keyedDigest($0, key: key) }
        encoder.removeAll()
        let name = PrimaryKey.encodeName(itemClass, attributes, into: &encoder) ? encoder.withBytes { Crypto.keyedDigest($0, key: key) } : nil
        return (primary, lookup, name)
    }

    /// Seals the blobs of a row whose columns are set, in the row's format. From format 2 the
    /// value and attributes are padded (``Padding``) so the file does not show their exact
    /// lengths; from format 3 the value's associated data binds the sealed attributes, and a
    /// row without access control has no item key.
    mutating func sealContents(
        classKey: SecretBytes, attributes: ItemAttributes, encodedAttributes: [UInt8]? = nil, data: SecretBytes, vaultID: [UInt8],
        presencePublicKey: [UInt8]?
    ) {
        // One encoder: the prefix, then each blob's purpose (``associatedData(prefix:_:)``, the
        // value's ``valueAssociatedData(prefix:)``) in turn after it, read in place.
        var associated = associatedDataPrefix(vaultID: vaultID)
        let prefixLength = associated.byteCount
        // Attributes are sealed with the class key, not the item key: like iOS's metadata key,
        // they can be searched whenever the class is unlocked, without asking the user for an
        // access-controlled item's key.
        let encoded = encodedAttributes ?? attributes.encoded()
        associated.string(Purpose.metadata.rawValue)
        metadata = associated.withBytes { Crypto.seal(format >= 2 ? Padding.padded(encoded) : encoded, key: classKey, associatedData: $0) }
        let valueKey: SecretBytes
        if sealsValueWithClassKey {
            wrappedKey = []
            valueKey = classKey
        } else {
            valueKey = Crypto.generateKey()
            associated.truncate(to: prefixLength)
            associated.string(Purpose.itemKey.rawValue)
            wrappedKey = associated.withBytes { Crypto.seal(valueKey, key: classKey, associatedData: $0) }
            if !accessControl.isEmpty, let presencePublicKey {
                // A second lock: only the user's verification (the presence secret key) opens it.
                wrappedKey = Crypto.seal(wrappedKey, toPublicKey: presencePublicKey)
            }
        }
        associated.truncate(to: prefixLength)
        appendValuePurpose(to: &associated)
        secret = associated.withBytes { Crypto.seal(format >= 2 ? Padding.padded(data) : data, key: valueKey, associatedData: $0) }
    }

    /// The value's associated data: from format 3 it ends with the digest of the sealed
    /// attributes, so an edited attributes column makes the value fail to open.
    private func valueAssociatedData(prefix: FieldEncoder) -> [UInt8] {
        var encoder = prefix
        appendValuePurpose(to: &encoder)
        return encoder.bytes
    }

    /// What the value's associated data has after the prefix.
    private func appendValuePurpose(to encoder: inout FieldEncoder) {
        encoder.string(Purpose.data.rawValue)
        if bindsAttributesToValue { encoder.bytes(Crypto.digest(metadata)) }
    }

    /// Opens the key the value is sealed under: the class key itself for a format-3 row
    /// without access control, the row's item key otherwise. Access-controlled rows need the
    /// presence key pair as well.
    func openValueKey(
        classKey: SecretBytes, prefix: FieldEncoder, presence: (publicKey: [UInt8], secretKey: SecretBytes)? = nil
    ) throws(LockboxError) -> SecretBytes {
        if sealsValueWithClassKey {
            // No item key is ever written for such a row: one found in the file was put there.
            guard wrappedKey.isEmpty else { throw LockboxError.integrity() }
            return classKey
        }
        var inner = wrappedKey
        if !accessControl.isEmpty {
            guard let presence, let opened = try? Crypto.open(wrappedKey, publicKey: presence.publicKey, secretKey: presence.secretKey) else {
                throw LockboxError.integrity()
            }
            inner = opened
        }
        guard let key = try? Crypto.open(inner, key: classKey, associatedData: associatedData(prefix: prefix, .itemKey)),
            key.count == Crypto.keyByteCount
        else { throw LockboxError.integrity() }
        return key
    }

    func openAttributes(classKey: SecretBytes, prefix: FieldEncoder) throws(LockboxError) -> ItemAttributes {
        guard let opened = try? Crypto.openBytes(metadata, key: classKey, associatedData: associatedData(prefix: prefix, .metadata)),
            let bytes = format >= 2 ? Padding.unpadded(opened) : opened,
            var attributes = try? ItemAttributes(decoding: bytes)
        else { throw LockboxError.integrity() }
        // The plain columns were authenticated as associated data; they are the truth.
        attributes.accessibility = accessibility
        attributes.accessGroup = accessGroup
        attributes.synchronizable = synchronizable
        return attributes
    }

    /// Checks that the sealed attributes are authentic, without decoding them: for a read that
    /// returns the value alone, whose own associated data already binds what a query selects
    /// by. An edited attributes column is still an error, never a value served beside it.
    func authenticateAttributes(classKey: SecretBytes, prefix: FieldEncoder) throws(LockboxError) {
        guard (try? Crypto.openBytes(metadata, key: classKey, associatedData: associatedData(prefix: prefix, .metadata))) != nil
        else { throw LockboxError.integrity() }
    }

    /// Opens the value with the key ``openValueKey(classKey:prefix:presence:)`` returned. From
    /// format 3 this also authenticates the sealed attributes (their digest is bound).
    func openData(valueKey: SecretBytes, prefix: FieldEncoder) throws(LockboxError) -> SecretBytes {
        let associatedData = valueAssociatedData(prefix: prefix)
        guard format >= 2 else {
            guard let data = try? Crypto.open(secret, key: valueKey, associatedData: associatedData) else { throw LockboxError.integrity() }
            return data
        }
        // A malformed padding is as much tampering as a wrong tag.
        guard let data = try? Crypto.open(secret, key: valueKey, associatedData: associatedData, extracting: Padding.unpadded) else {
            throw LockboxError.integrity()
        }
        return data
    }

    /// The columns ``read(from:)`` expects, in order. Queries that need no metadata or value
    /// select NULL in their place and so copy nothing.
    static func columns(metadata: Bool = true, secret: Bool = true) -> String {
        "rowid, id, item_class, accessibility, access_group, synchronizable, wrapped_key, "
            + (metadata ? "metadata" : "NULL") + ", " + (secret ? "secret" : "NULL")
            + ", device_id, access_control, primary_digest, lookup_digest, name_digest, format, version, bucket"
    }

    /// A row selected with ``columns(metadata:secret:)``. A malformed row is `errSecDecode`.
    static func read(from statement: Statement) throws(LockboxError) -> SealedRow {
        guard let rowID = statement.integer(0), let id = statement.blob(1),
            let itemClass = statement.text(2).flatMap(ItemClass.init(rawValue:)),
            let accessibility = statement.text(3).flatMap(Accessibility.init(rawValue:)),
            let group = statement.text(4), let synchronizable = statement.integer(5),
            let wrappedKey = statement.blob(6), let deviceID = statement.text(9), let accessControl = statement.text(10),
            let primaryDigest = statement.blob(11), let lookupDigest = statement.blob(12),
            let format = statement.integer(14), (1...currentFormat).contains(format), let version = statement.integer(15)
        else {
            throw LockboxError.integrity()
        }
        return SealedRow(
            rowID: rowID, id: id, itemClass: itemClass, accessibility: accessibility, accessGroup: group,
            synchronizable: synchronizable != 0, deviceID: deviceID, accessControl: accessControl,
            primaryDigest: primaryDigest, lookupDigest: lookupDigest, nameDigest: statement.blob(13),
            format: format, version: version, storedBucket: statement.integer(16), wrappedKey: wrappedKey,
            metadata: statement.blob(7) ?? [], secret: statement.blob(8) ?? [])
    }

    func bindColumns(to statement: Statement) {
        statement.bind(1, id)
        statement.bind(2, itemClass.rawValue)
        statement.bind(3, accessibility.rawValue)
        statement.bind(4, accessGroup)
        statement.bind(5, synchronizable ? 1 : 0)
        statement.bind(6, primaryDigest)
        statement.bind(7, lookupDigest)
        statement.bind(8, nameDigest)
        statement.bind(9, wrappedKey)
        statement.bind(10, metadata)
        statement.bind(11, secret)
        statement.bind(12, deviceID)
        statement.bind(13, accessControl)
        statement.bind(14, format)
        statement.bind(15, version)
        statement.bind(16, bucket)
    }
}

/// Length hiding for sealed values and attributes: a 4-byte length, the bytes, then zeros up
/// to the bucket size. Buckets are 32, 64, 128 ... 4096 bytes, then multiples of 4096, so the
/// file shows a value's size class, not its length.
enum Padding {
    static func paddedSize(_ count: Int) -> Int {
        let needed = count + 4
        guard needed > 32 else { return 32 }
        guard needed > 4096 else { return 1 << (Int.bitWidth - (needed - 1).leadingZeroBitCount) }
        return (needed + 4095) / 4096 * 4096
    }

    static func padded(_ data: SecretBytes) -> SecretBytes {
        let size = paddedSize(data.count)
        return SecretBytes(capacity: size) { buffer in
            buffer.initializeMemory(as: UInt8.self, repeating: 0)
            var length = UInt32(data.count).littleEndian
            withUnsafeBytes(of: &length) { UnsafeMutableRawBufferPointer(rebasing: buffer[0..<4]).copyMemory(from: $0) }
            data.withUnsafeBytes { bytes in
                if bytes.count > 0 { UnsafeMutableRawBufferPointer(rebasing: buffer[4..<4 + bytes.count]).copyMemory(from: bytes) }
            }
            return size
        }
    }

    static func padded(_ bytes: [UInt8]) -> [UInt8] {
        var output = [UInt8](repeating: 0, count: paddedSize(bytes.count))
        let length = UInt32(bytes.count)
        for index in 0..<4 { output[index] = UInt8(truncatingIfNeeded: length >> (8 * UInt32(index))) }
        output.replaceSubrange(4..<4 + bytes.count, with: bytes)
        return output
    }

    /// The bytes of a padded buffer; nil when its length field or padding is malformed.
    static func unpadded(_ bytes: UnsafeRawBufferPointer) -> Range<Int>? {
        guard bytes.count >= 4 else { return nil }
        let length = (0..<4).reduce(0) { $0 | Int(bytes[$1]) << (8 * $1) }
        guard length <= bytes.count - 4, bytes.count == paddedSize(length) else { return nil }
        var nonzero: UInt8 = 0
        for index in (4 + length)..<bytes.count { nonzero |= bytes[index] }
        guard nonzero == 0 else { return nil }
        return 4..<4 + length
    }

    static func unpadded(_ bytes: [UInt8]) -> [UInt8]? {
        guard let range = bytes.withUnsafeBytes({ unpadded($0) }) else { return nil }
        return Array(bytes[range])
    }

    static func unpadded(_ data: SecretBytes) -> SecretBytes? {
        data.withUnsafeBytes { bytes in
            guard let range = unpadded(bytes) else { return nil }
            return SecretBytes(copying: UnsafeRawBufferPointer(rebasing: bytes[range]))
        }
    }
}
