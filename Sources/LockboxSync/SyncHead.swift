import LockboxCore
import VaultCrypto

/// The group's head: the change counter and a digest of the exact set of records the database
/// holds at that counter, authenticated with the epoch's head key. Every push writes a new
/// head in the transaction that writes its records; every pull checks that the records it
/// received, added to what it verified before, give the head's digest, before it applies any
/// of them (docs/SYNC.md, "Withheld and replayed records").
///
/// The digest is a sum modulo 2^256 of one keyed element per record (item id, version, writer's
/// stamp, content digest, tombstone): a writer updates it by subtracting the element of the
/// record it replaces and adding its own, so neither side ever reads every record. Elements are
/// keyed digests: without the group's key nobody can compute one, so nobody can look for
/// another set of records with the same sum.
struct SyncHead: Equatable {
    var counter: Int64
    var accumulator: [UInt8]

    static let accumulatorSize = 32

    /// The head of a group with no record.
    static let empty = SyncHead(counter: 0, accumulator: [UInt8](repeating: 0, count: accumulatorSize))

    /// One record's element.
    static func element(itemID: String, version: Int64, record: SyncRecord, keys: SyncKeys) -> [UInt8] {
        var encoder = FieldEncoder()
        encoder.string("lockbox.sync.head-element.v1")
        encoder.string(itemID)
        encoder.integer(Int(version))
        encoder.integer(Int(record.stamp.modified))
        encoder.string(record.stamp.device)
        encoder.bytes(record.contentDigest)
        encoder.integer(record.isTombstone ? 1 : 0)
        return Crypto.keyedDigest(encoder.bytes, key: keys.elements)
    }

    /// Adds `element` to `accumulator` (``ModularSum``). An element or accumulator of another
    /// size (an edited local state) leaves an empty accumulator, which matches no head.
    static func add(_ element: [UInt8], to accumulator: inout [UInt8]) {
        guard element.count == accumulatorSize && accumulator.count == accumulatorSize else { return accumulator = [] }
        element.withUnsafeBytes { element in accumulator.withUnsafeMutableBytes { ModularSum.add(element, to: $0) } }
    }

    /// Subtracts `element` from `accumulator` (``ModularSum``); sizes as for ``add(_:to:)``.
    static func subtract(_ element: [UInt8], from accumulator: inout [UInt8]) {
        guard element.count == accumulatorSize && accumulator.count == accumulatorSize else { return accumulator = [] }
        element.withUnsafeBytes { element in accumulator.withUnsafeMutableBytes { ModularSum.subtract(element, from: $0) } }
    }

    private static func mac(group: String, counter: Int64, accumulator: [UInt8], keys: SyncKeys) -> [UInt8] {
        var encoder = FieldEncoder()
        encoder.string("lockbox.sync.head.v1")
        encoder.string(group)
        encoder.integer(Int(keys.epoch))
        encoder.integer(Int(counter))
        encoder.bytes(accumulator)
        return Crypto.keyedDigest(encoder.bytes, key: keys.heads)
    }

    /// The head as the group row stores it: counter, digest, MAC.
    func sealed(group: String, keys: SyncKeys) -> [UInt8] {
        var encoder = FieldEncoder()
        encoder.integer(Int(counter))
        encoder.bytes(accumulator)
        encoder.bytes(Self.mac(group: group, counter: counter, accumulator: accumulator, keys: keys))
        return encoder.bytes
    }

    /// The group row's head, checked: its MAC, and its counter against the row's. A group
    /// without a head is one with no record yet (counter 0); any other is refused.
    static func open(_ stored: [UInt8]?, counter: Int64, group: String, keys: SyncKeys) throws(LockboxError) -> SyncHead {
        guard let stored else {
            guard counter == 0 else { throw tampered() }
            return empty
        }
        var decoder = FieldDecoder(stored)
        guard let storedCounter = try? decoder.integer(), let accumulator = try? decoder.bytes(), let mac = try? decoder.bytes(),
            decoder.isAtEnd, accumulator.count == accumulatorSize, Int64(storedCounter) == counter,
            equal(mac, Self.mac(group: group, counter: counter, accumulator: accumulator, keys: keys))
        else { throw tampered() }
        return SyncHead(counter: counter, accumulator: accumulator)
    }

    static func equal(_ left: [UInt8], _ right: [UInt8]) -> Bool {
        left.count == right.count && left.withUnsafeBytes { a in right.withUnsafeBytes { b in constantTimeEquals(a, b) } }
    }

    /// The version after `counter`. No group writes 2^63 versions: a counter at the limit was
    /// set in the database, and must not trap.
    static func version(after counter: Int64) throws(LockboxError) -> Int64 {
        let (next, overflow) = counter.addingReportingOverflow(1)
        guard !overflow else { throw LockboxError.syncDatabase("The group's change counter") }
        return next
    }

    static func tampered() -> LockboxError {
        LockboxError(
            .decode,
            "The sync database's head (its list of the group's records) is missing, edited or does not match its counter. "
                + "Nothing was applied; have the database restored to its latest state.")
    }

    /// The records served do not add up to the head: some were withheld, replaced with older
    /// ones or otherwise changed.
    /// Records this device wrote that the database's head no longer lists.
    static func lostWrites(_ count: Int) -> LockboxError {
        LockboxError(
            .decode,
            "The sync database no longer holds \(count) record\(count == 1 ? "" : "s") this device wrote: the writes were undone "
                + "in the database, and its head lists an older record or none. Nothing was applied; the items keep their values here."
                + SyncGroup.recoveryHint)
    }

    static func withheld() -> LockboxError {
        LockboxError(
            .decode,
            "The sync database did not serve the records its head lists: records were withheld, deleted or replaced with older ones. "
                + "Nothing was applied; have the database restored to its latest state." + SyncGroup.recoveryHint)
    }
}

extension LockboxError {
    /// Data the sync database served failed its check: it was changed in the database, or
    /// written by something other than the group's devices. Not the keychain file's fault: the
    /// message must not send the user to a backup of it.
    package static func syncDatabase(_ what: String = "A record of the sync database") -> LockboxError {
        LockboxError(
            .decode,
            "\(what) failed its check: it was changed in the database, or written by something other than this group's devices. "
                + "Nothing was applied here and the local keychain is unaffected; have the database restored to its latest state.")
    }
}
