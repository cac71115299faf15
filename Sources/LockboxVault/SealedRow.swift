import LockboxCore
import VaultCrypto
import VaultStorage

/// One item as stored: plain columns for what queries filter on, sealed blobs for the rest.
///
/// Every blob is bound (as associated data) to the vault, the item's id, class,
/// accessibility, access group and sync flag, and the schema version, so a blob copied to
/// another row, or a row whose plain columns were edited, fails to open.
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
    var wrappedKey: [UInt8]
    var metadata: [UInt8]
    var secret: [UInt8]

    enum Purpose: String {
        case itemKey = "key"
        case metadata = "meta"
        case data = "data"
    }

    /// The associated data shared by the row's three blobs; each appends its purpose.
    func associatedDataPrefix(vaultID: [UInt8]) -> FieldEncoder {
        var encoder = FieldEncoder()
        encoder.string("lockbox.item")
        encoder.integer(VaultSchema.current)
        encoder.bytes(vaultID)
        encoder.bytes(id)
        encoder.string(itemClass.rawValue)
        encoder.string(accessibility.rawValue)
        encoder.string(accessGroup)
        encoder.integer(synchronizable ? 1 : 0)
        encoder.string(deviceID)
        encoder.string(accessControl)
        return encoder
    }

    func associatedData(prefix: FieldEncoder, _ purpose: Purpose) -> [UInt8] {
        var encoder = prefix
        encoder.string(purpose.rawValue)
        return encoder.bytes
    }

    /// Seals an item under a fresh item key. `attributes` must carry the resolved access
    /// group, accessibility and sync flag.
    static func seal(
        id: [UInt8], itemClass: ItemClass, attributes: ItemAttributes, data: SecretBytes,
        classKey: SecretBytes, indexKey: SecretBytes, vaultID: [UInt8], deviceID: String,
        accessControl: AccessControl?, presencePublicKey: [UInt8]?
    ) -> SealedRow {
        let accessibility = attributes.accessibility ?? .default
        var row = SealedRow(
            id: id, itemClass: itemClass, accessibility: accessibility,
            accessGroup: attributes.accessGroup ?? Vault.defaultAccessGroup,
            synchronizable: attributes.synchronizable ?? false,
            deviceID: accessibility.isThisDeviceOnly ? deviceID : "",
            accessControl: accessControl?.description ?? "",
            primaryDigest: Crypto.keyedDigest(PrimaryKey.encode(itemClass, attributes), key: indexKey),
            lookupDigest: Crypto.keyedDigest(PrimaryKey.encode(itemClass, attributes, includingGroup: false), key: indexKey),
            nameDigest: PrimaryKey.encodeName(itemClass, attributes).map { Crypto.keyedDigest($0, key: indexKey) },
            wrappedKey: [], metadata: [], secret: [])
        let itemKey = Crypto.generateKey()
        let prefix = row.associatedDataPrefix(vaultID: vaultID)
        row.wrappedKey = Crypto.seal(itemKey, key: classKey, associatedData: row.associatedData(prefix: prefix, .itemKey))
        if accessControl != nil, let presencePublicKey {
            // A second lock: only the user's verification (the presence secret key) opens it.
            row.wrappedKey = Crypto.seal(row.wrappedKey, toPublicKey: presencePublicKey)
        }
        // Attributes are sealed with the class key, not the item key: like iOS's metadata key,
        // they can be searched whenever the class is unlocked, without asking the user for an
        // access-controlled item's key.
        row.metadata = Crypto.seal(attributes.encoded(), key: classKey, associatedData: row.associatedData(prefix: prefix, .metadata))
        row.secret = Crypto.seal(data, key: itemKey, associatedData: row.associatedData(prefix: prefix, .data))
        return row
    }

    /// Opens the item key. Access-controlled rows need the presence key pair as well.
    func openItemKey(
        classKey: SecretBytes, prefix: FieldEncoder, presence: (publicKey: [UInt8], secretKey: SecretBytes)? = nil
    ) throws(LockboxError) -> SecretBytes {
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
        guard let bytes = try? Crypto.openBytes(metadata, key: classKey, associatedData: associatedData(prefix: prefix, .metadata)),
            var attributes = try? ItemAttributes(decoding: bytes)
        else { throw LockboxError.integrity() }
        // The plain columns were authenticated as associated data; they are the truth.
        attributes.accessibility = accessibility
        attributes.accessGroup = accessGroup
        attributes.synchronizable = synchronizable
        return attributes
    }

    func openData(itemKey: SecretBytes, prefix: FieldEncoder) throws(LockboxError) -> SecretBytes {
        guard let data = try? Crypto.open(secret, key: itemKey, associatedData: associatedData(prefix: prefix, .data)) else {
            throw LockboxError.integrity()
        }
        return data
    }

    /// The columns ``read(from:)`` expects, in order. Queries that need no metadata or value
    /// select NULL in their place and so copy nothing.
    static func columns(metadata: Bool = true, secret: Bool = true) -> String {
        "rowid, id, item_class, accessibility, access_group, synchronizable, wrapped_key, "
            + (metadata ? "metadata" : "NULL") + ", " + (secret ? "secret" : "NULL") + ", device_id, access_control"
    }

    /// A row selected with ``columns(metadata:secret:)``. A malformed row is `errSecDecode`.
    static func read(from statement: Statement) throws(LockboxError) -> SealedRow {
        guard let rowID = statement.integer(0), let id = statement.blob(1),
            let itemClass = statement.text(2).flatMap(ItemClass.init(rawValue:)),
            let accessibility = statement.text(3).flatMap(Accessibility.init(rawValue:)),
            let group = statement.text(4), let synchronizable = statement.integer(5),
            let wrappedKey = statement.blob(6), let deviceID = statement.text(9), let accessControl = statement.text(10)
        else {
            throw LockboxError.integrity()
        }
        return SealedRow(
            rowID: rowID, id: id, itemClass: itemClass, accessibility: accessibility, accessGroup: group,
            synchronizable: synchronizable != 0, deviceID: deviceID, accessControl: accessControl,
            primaryDigest: [], lookupDigest: [], nameDigest: nil, wrappedKey: wrappedKey,
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
    }
}
