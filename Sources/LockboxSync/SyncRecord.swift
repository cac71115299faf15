import FoundationEssentials
import LockboxCore
import VaultCrypto

/// The keys a group's secrets derive, each purpose its own subkey. The group has a base key,
/// fixed for its life, which names items and digests their contents (so identifiers and the
/// local state survive a rotation), and an epoch key, replaced when a device is removed, which
/// seals everything the database holds: a removed device keeps the base key but opens nothing
/// sealed afterwards.
struct SyncKeys: Sendable {
    /// Seals records (epoch key).
    let sealing: SecretBytes
    /// Attests devices' public keys: a MAC over group, device and key (epoch key).
    let devices: SecretBytes
    /// Seals fleet sessions' tokens (epoch key).
    let fleet: SecretBytes
    /// Authenticates the group's head (``SyncHead``) (epoch key).
    let heads: SecretBytes
    /// Makes the head's per-record elements (base key, so they survive a rotation).
    let elements: SecretBytes
    /// Names items: opaque identifiers are keyed digests of primary keys (base key).
    let naming: SecretBytes
    /// Digests of item contents, to tell changed items from unchanged ones (base key).
    let content: SecretBytes
    /// The key epoch: 0 at creation, one more at each rotation.
    let epoch: Int64
    /// Both secrets as stored in the vault and wrapped for other devices: base key, epoch key.
    let secrets: SecretBytes

    init(secrets: SecretBytes, epoch: Int64) {
        precondition(secrets.count == 2 * Crypto.keyByteCount, "the group secrets are two keys")
        let base = SecretBytes(capacity: Crypto.keyByteCount) { buffer in
            secrets.withUnsafeBytes { buffer.copyMemory(from: UnsafeRawBufferPointer(rebasing: $0[0..<Crypto.keyByteCount])) }
            return Crypto.keyByteCount
        }
        let epochKey = SecretBytes(capacity: Crypto.keyByteCount) { buffer in
            secrets.withUnsafeBytes { buffer.copyMemory(from: UnsafeRawBufferPointer(rebasing: $0[Crypto.keyByteCount...])) }
            return Crypto.keyByteCount
        }
        naming = Crypto.deriveKey(from: base, context: "lbxsync1", identifier: 2)
        content = Crypto.deriveKey(from: base, context: "lbxsync1", identifier: 3)
        sealing = Crypto.deriveKey(from: epochKey, context: "lbxsync2", identifier: 1)
        devices = Crypto.deriveKey(from: epochKey, context: "lbxsync2", identifier: 5)
        fleet = Crypto.deriveKey(from: epochKey, context: "lbxsync2", identifier: 6)
        heads = Crypto.deriveKey(from: epochKey, context: "lbxsync2", identifier: 7)
        elements = Crypto.deriveKey(from: base, context: "lbxsync1", identifier: 4)
        self.epoch = epoch
        self.secrets = secrets
    }

    /// New secrets: a fresh base key and epoch key.
    static func generate() -> SyncKeys {
        SyncKeys(secrets: joined(Crypto.generateKey(), Crypto.generateKey()), epoch: 0)
    }

    /// The same base key with a fresh epoch key, one epoch later.
    func rotated() -> SyncKeys {
        let base = SecretBytes(capacity: Crypto.keyByteCount) { buffer in
            secrets.withUnsafeBytes { buffer.copyMemory(from: UnsafeRawBufferPointer(rebasing: $0[0..<Crypto.keyByteCount])) }
            return Crypto.keyByteCount
        }
        return SyncKeys(secrets: Self.joined(base, Crypto.generateKey()), epoch: epoch + 1)
    }

    private static func joined(_ first: SecretBytes, _ second: SecretBytes) -> SecretBytes {
        SecretBytes(capacity: first.count + second.count) { buffer in
            first.withUnsafeBytes { buffer.copyMemory(from: $0) }
            second.withUnsafeBytes { UnsafeMutableRawBufferPointer(rebasing: buffer[first.count...]).copyMemory(from: $0) }
            return first.count + second.count
        }
    }
}

/// Which of two writes of one item wins: the later modification; at equal times, the greater
/// device identifier. Every device orders the same pair the same way, so all converge.
struct SyncStamp: Sendable, Hashable, Comparable {
    /// Milliseconds since 1970 on the writer's clock.
    var modified: Int64
    var device: String

    static func < (lhs: SyncStamp, rhs: SyncStamp) -> Bool {
        (lhs.modified, lhs.device) < (rhs.modified, rhs.device)
    }
}

/// One item's state as a record in the database, opened.
struct SyncRecord: Sendable {
    var stamp: SyncStamp
    /// Nil for a tombstone.
    var item: Item?
    /// The keyed digest of the item's content (class, attributes without dates, value); empty
    /// for a tombstone.
    var contentDigest: [UInt8]

    var isTombstone: Bool { item == nil }

    static func associatedData(group: String, itemID: String, version: Int64) -> [UInt8] {
        var encoder = FieldEncoder()
        encoder.string("lockbox.sync.record.v2")
        encoder.string(group)
        encoder.string(itemID)
        encoder.integer(Int(version))
        return encoder.bytes
    }

    /// The attributes that travel: not the dates (a receiving vault dates the change with the
    /// record's stamp).
    static func travelling(_ attributes: ItemAttributes) -> ItemAttributes {
        var attributes = attributes
        attributes.creationDate = nil
        attributes.modificationDate = nil
        return attributes
    }

    static func contentDigest(_ item: Item, keys: SyncKeys) -> [UInt8] {
        var encoder = FieldEncoder()
        encoder.string(item.itemClass.rawValue)
        encoder.bytes(travelling(item.attributes).encoded())
        let head = encoder.bytes
        // The value is digested from guarded memory, prefixed by the rest.
        let input = SecretBytes(capacity: head.count + (item.data?.count ?? 0) + 1) { buffer in
            buffer.copyBytes(from: head)
            var count = head.count
            if let data = item.data {
                buffer[count] = 1
                data.withUnsafeBytes { bytes in
                    UnsafeMutableRawBufferPointer(rebasing: buffer[(count + 1)...]).copyMemory(from: bytes)
                }
                count += 1 + data.count
            }
            return count
        }
        return Crypto.keyedDigest(input, key: keys.content)
    }

    /// The sealed payload: the record's metadata and attributes in one box, the value in another.
    func seal(group: String, itemID: String, version: Int64, keys: SyncKeys) -> [UInt8] {
        let associated = Self.associatedData(group: group, itemID: itemID, version: version)
        var meta = FieldEncoder()
        meta.integer(Int(stamp.modified))
        meta.string(stamp.device)
        meta.string(item?.itemClass.rawValue)
        meta.bytes(item.map { Self.travelling($0.attributes).encoded() })
        meta.bytes(contentDigest)
        var payload = FieldEncoder()
        payload.bytes(Crypto.seal(meta.bytes, key: keys.sealing, associatedData: associated + [0]))
        payload.bytes(item?.data.map { Crypto.seal($0, key: keys.sealing, associatedData: associated + [1]) })
        return payload.bytes
    }

    /// Opens a payload; any mismatch (another item's or version's record, an edited byte) is an
    /// integrity error.
    static func open(_ payload: [UInt8], group: String, itemID: String, version: Int64, keys: SyncKeys) throws(LockboxError) -> SyncRecord {
        try SealedValueRecord(payload, group: group, itemID: itemID, version: version, keys: keys).opened(keys: keys)
    }
}

/// A record whose metadata is open and whose value is still sealed: a pull decides from the
/// metadata what to do, and opens a value only as it writes it, so that thousands of values are
/// never in memory at once.
struct SealedValueRecord: Sendable {
    /// The record, with an item without its value.
    var record: SyncRecord
    let valueBox: [UInt8]?
    private let associated: [UInt8]

    init(_ payload: [UInt8], group: String, itemID: String, version: Int64, keys: SyncKeys) throws(LockboxError) {
        associated = SyncRecord.associatedData(group: group, itemID: itemID, version: version)
        // Made only on failure: a pull opens thousands of records.
        var failure: LockboxError { LockboxError.syncDatabase() }
        let metaBox: [UInt8]
        do {
            var outer = FieldDecoder(payload)
            guard let box = try outer.bytes() else { throw failure }
            metaBox = box
            valueBox = try outer.bytes()
            guard outer.isAtEnd else { throw failure }
        } catch { throw failure }
        guard let meta = try? Crypto.openBytes(metaBox, key: keys.sealing, associatedData: associated + [0]) else { throw failure }
        let modified: Int
        let device: String
        let className: String?
        let attributeBytes: [UInt8]?
        let digest: [UInt8]?
        do {
            var decoder = FieldDecoder(meta)
            guard let time = try decoder.integer(), let writer = try decoder.string() else { throw failure }
            modified = time
            device = writer
            className = try decoder.string()
            attributeBytes = try decoder.bytes()
            digest = try decoder.bytes()
            guard decoder.isAtEnd else { throw failure }
        } catch { throw failure }
        let stamp = SyncStamp(modified: Int64(modified), device: device)
        guard let className else {
            guard valueBox == nil else { throw failure }
            record = SyncRecord(stamp: stamp, item: nil, contentDigest: [])
            return
        }
        guard let itemClass = ItemClass(rawValue: className), let attributeBytes,
            let attributes = try? ItemAttributes(decoding: attributeBytes), let digest
        else { throw failure }
        record = SyncRecord(stamp: stamp, item: Item(itemClass, attributes: attributes), contentDigest: digest)
    }

    /// The record with its value opened, checked against the content digest its metadata
    /// holds. The two boxes are sealed apart (the value stays sealed until it is written), so
    /// the database could otherwise serve the metadata without its value box, or with the value
    /// box of another write of the same version (one sealed before a restore or in a fork):
    /// either gives an item whose content is not the one its writer digested, and is refused.
    func opened(keys: SyncKeys) throws(LockboxError) -> SyncRecord {
        guard record.item != nil else { return record }
        var record = record
        if let valueBox {
            guard let value = try? Crypto.open(valueBox, key: keys.sealing, associatedData: associated + [1]) else {
                throw LockboxError.syncDatabase()
            }
            record.item?.data = value
        }
        guard let item = record.item, SyncHead.equal(SyncRecord.contentDigest(item, keys: keys), record.contentDigest) else {
            throw LockboxError.syncDatabase()
        }
        return record
    }
}
