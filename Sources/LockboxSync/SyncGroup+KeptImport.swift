import Dispatch
import FoundationEssentials
import LockboxCore
import VaultCrypto
import VaultStorage

extension SyncGroup {
    /// Where a kept import's time went (``measureKeptImport(at:)``).
    package struct KeptImportTimings: Sendable {
        package var records = 0
        /// The counter, the head and every record, in one snapshot (as a pull fetches them).
        package var fetch = Duration.zero
        /// Every record's metadata opened, its head element and a lookup digest made (on other
        /// threads, a batch at a time), and each batch inserted as it is ready into a table of
        /// the vault's durability, in one transaction; the records summed and compared with the
        /// head before it commits.
        package var store = Duration.zero

        package init() {}
    }

    /// For the benchmark only: what a new device's first sync would cost if it kept the records
    /// as they arrive (docs/SYNC.md, "A design for the first sync within 3x"), measured on this
    /// group's records without touching the vault or the sync state. Everything such an import
    /// could not skip is done: the records fetched as a pull fetches them, every metadata box
    /// opened and checked as a pull checks it, the records summed against the group's head, a
    /// keyed digest per record standing for the lookup digest a query needs, and each record
    /// inserted with its version, payload, digest and head element into a new SQLite file at
    /// `path` (WAL, `synchronous=FULL`, the item id as primary key and one index on the
    /// digest), committed once. The opening runs on other threads while this one inserts, as
    /// an import built this way would. What it leaves out, the vault's integrity record (one sum per
    /// row) and a few clear columns, is small beside these.
    package func measureKeptImport(at path: String) throws(LockboxError) -> KeptImportTimings {
        var timer = PhaseTimer(KeptImportTimings())
        let keys = self.keys
        let connection = try PostgresConnection(database)
        let (head, rows) = try fetchRecords(connection, above: 0, cursor: 0, keys: keys)
        timer.lap(\.fetch)
        // Opened on other threads a batch at a time, two batches ahead, while this thread
        // inserts the batches already opened, in order; the head is checked before the commit.
        let lookupKey = Crypto.generateKey()
        let group = self
        let kept = try Database(path: path, create: true)
        try kept.execute(
            """
            CREATE TABLE records (item_id BLOB PRIMARY KEY, version INTEGER NOT NULL, payload BLOB NOT NULL, lookup BLOB NOT NULL,
                element BLOB NOT NULL);
            CREATE INDEX records_by_lookup ON records(lookup);
            """)
        try kept.writeTransaction { () throws(LockboxError) in
            let insert = try kept.statement("INSERT INTO records (item_id, version, payload, lookup, element) VALUES (?, ?, ?, ?, ?)")
            defer { insert.reset() }
            var accumulator = SyncHead.empty.accumulator
            var inFlight: [OpenedBatch] = []
            var next = 0
            func openAhead() {
                while inFlight.count < 2 && next < rows.count {
                    let range = next..<min(next + Self.keptBatch, rows.count)
                    let batch = OpenedBatch(range)
                    let slice = Array(rows[range])
                    DispatchQueue.global(qos: .userInitiated).async {
                        batch.result = Result { () throws(LockboxError) -> [(ReceivedRecord, [UInt8])] in
                            try group.receive(slice, from: 0, counter: head.counter, keys: keys).map { record in
                                (record, Crypto.keyedDigest(Array(record.id.utf8), key: lookupKey))
                            }
                        }
                        batch.finished.signal()
                    }
                    inFlight.append(batch)
                    next = range.upperBound
                }
            }
            defer { for batch in inFlight { batch.finished.wait() } }
            openAhead()
            while !inFlight.isEmpty {
                let batch = inFlight.removeFirst()
                batch.finished.wait()
                openAhead()
                for (offset, (record, lookup)) in try batch.result.get().enumerated() {
                    guard record.isFitting else { throw LockboxError.syncDatabase() }
                    SyncHead.add(record.element, to: &accumulator)
                    insert.reset()
                    insert.bind(1, Array(record.id.utf8))
                    insert.bind(2, Int(record.version))
                    insert.bind(3, rows[batch.range.lowerBound + offset][2] ?? [])
                    insert.bind(4, lookup)
                    insert.bind(5, record.element)
                    try insert.run()
                    timer.timings.records += 1
                }
            }
            guard SyncHead.equal(accumulator, head.accumulator) else { throw SyncHead.withheld() }
        }
        timer.lap(\.store)
        return timer.timings
    }
}

extension SyncGroup {
    /// Records opened per hand-over in ``measureKeptImport(at:)`` (under ``parallelMinimum``:
    /// each batch is opened on one thread).
    static let keptBatch = 128
}

/// A batch of records opened on another thread; `result` is written there before `finished`
/// is signalled and read here only after waiting for it.
private final class OpenedBatch: @unchecked Sendable {
    let range: Range<Int>
    var result: Result<[(ReceivedRecord, [UInt8])], LockboxError> = .success([])
    let finished = DispatchSemaphore(value: 0)

    init(_ range: Range<Int>) { self.range = range }
}
