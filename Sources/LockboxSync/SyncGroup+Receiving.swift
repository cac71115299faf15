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
            var failure: LockboxError { LockboxError.syncDatabase() }
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
    /// Below this many, work runs on the calling thread.
    static let parallelMinimum = 256

    /// `body` for every index of `0..<count`, on the cores available (two on this machine),
    /// the results in order; the first error (by index) is thrown once all have run.
    static func inParallel<T: Sendable>(
        _ count: Int, _ body: @Sendable (Int) throws(LockboxError) -> T
    ) throws(LockboxError) -> [T] {
        guard count > 0 else { return [] }
        // A few records (an incremental pull) are opened here: waking threads costs more.
        guard count >= parallelMinimum else { return try (0..<count).map { index throws(LockboxError) in try body(index) } }
        let slices = (0..<min(parallelSlices, count)).map { slice in
            SliceResults<T>(count * slice / min(parallelSlices, count)..<count * (slice + 1) / min(parallelSlices, count))
        }
        DispatchQueue.concurrentPerform(iterations: slices.count) { slice in
            let results = slices[slice]
            for index in results.range {
                do throws(LockboxError) {
                    results.values.append(.success(try body(index)))
                } catch {
                    results.values.append(.failure(error))
                }
            }
        }
        var values: [T] = []
        values.reserveCapacity(count)
        for slice in slices {
            for result in slice.values {
                switch result {
                case .success(let value): values.append(value)
                case .failure(let error): throw error
                }
            }
        }
        return values
    }
}

/// The results of one slice of ``SyncGroup/inParallel(_:_:)``: written by the one thread that
/// runs the slice, read after `concurrentPerform` has returned (every slice done).
private final class SliceResults<T: Sendable>: @unchecked Sendable {
    let range: Range<Int>
    var values: [Result<T, LockboxError>] = []

    init(_ range: Range<Int>) {
        self.range = range
        values.reserveCapacity(range.count)
    }
}
