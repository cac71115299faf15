import Dispatch
import FoundationEssentials
import LockboxCore
import VaultCrypto

/// One record a pull received, its metadata opened (its value still sealed).
struct ReceivedRecord: Sendable {
    var id: String
    var version: Int64
    var sealed: SealedValueRecord
    /// Its element in the group's head (``SyncHead/element(itemID:version:record:keys:)``).
    var element: [UInt8]
    /// False for a record whose item may not sync here, or is not the item its identifier
    /// names (a tombstone: true).
    var isFitting: Bool
}

extension SyncGroup {
    /// Opens the metadata of the records a pull fetched (rows of item id, version, payload),
    /// and makes each one's head element, on both cores: `counter` is the head's and `from`
    /// the version the pull asked above. Any record that fails to open, or whose version lies
    /// outside `from...counter`, is an error.
    func receive(_ rows: [[[UInt8]?]], from: Int64, counter: Int64, keys: SyncKeys) throws(LockboxError) -> [ReceivedRecord] {
        let groupID = self.groupID
        return try Self.inParallel(rows.count) { index throws(LockboxError) -> ReceivedRecord in
            // Made only on failure: a pull opens thousands of records.
            var failure: LockboxError { LockboxError.integrity("A record of the sync database") }
            let row = rows[index]
            guard row.count == 3, let idBytes = row[0], let payload = row[2] else { throw failure }
            let id = String(decoding: idBytes, as: UTF8.self)
            let version = try PostgresConnection.integer(binary: row[1])
            guard version > from, version <= counter else { throw failure }
            let sealed = try SealedValueRecord(payload, group: groupID, itemID: id, version: version, keys: keys)
            let element = SyncHead.element(itemID: id, version: version, record: sealed.record, keys: keys)
            let isFitting = sealed.record.item.map { Self.isEligible($0) && Self.itemID($0, keys: keys) == id } ?? true
            return ReceivedRecord(id: id, version: version, sealed: sealed, element: element, isFitting: isFitting)
        }
    }

    /// Slices of work handed to the threads: more than two, so that a core another process
    /// holds for a while does not leave half of the work waiting.
    static let parallelSlices = 16

    /// `body` for every index of `0..<count`, on the cores available (two on this machine),
    /// the results in order; the first error (by index) is thrown once all have run.
    static func inParallel<T: Sendable>(
        _ count: Int, _ body: @Sendable (Int) throws(LockboxError) -> T
    ) throws(LockboxError) -> [T] {
        guard count > 0 else { return [] }
        let slots = Slots<T>(count)
        defer { slots.release() }
        let slices = min(parallelSlices, count)
        DispatchQueue.concurrentPerform(iterations: slices) { slice in
            for index in (count * slice / slices)..<(count * (slice + 1) / slices) {
                do throws(LockboxError) {
                    slots.set(index, .success(try body(index)))
                } catch {
                    slots.set(index, .failure(error))
                }
            }
        }
        return try slots.results()
    }
}

/// Results written by several threads, each to its own indexes, and read once all are done.
private final class Slots<T: Sendable>: @unchecked Sendable {
    private let base: UnsafeMutablePointer<Result<T, LockboxError>>
    private let count: Int

    init(_ count: Int) {
        self.count = count
        base = .allocate(capacity: count)
    }

    func set(_ index: Int, _ value: Result<T, LockboxError>) {
        (base + index).initialize(to: value)
    }

    /// Every result, in order (after every `set`); the first failure thrown.
    func results() throws(LockboxError) -> [T] {
        var values: [T] = []
        values.reserveCapacity(count)
        var failure: LockboxError?
        for index in 0..<count {
            switch base[index] {
            case .success(let value): values.append(value)
            case .failure(let error): if failure == nil { failure = error }
            }
        }
        if let failure { throw failure }
        return values
    }

    /// After every `set` (`concurrentPerform` returns once every slice ran, and every slice
    /// sets each of its indexes).
    func release() {
        base.deinitialize(count: count)
        base.deallocate()
    }
}
