import Dispatch
import FoundationEssentials
import LockboxCore
import VaultCrypto
import VaultStorage

extension Vault {
    /// ``applyChanges(count:_:)`` for a large batch, such as a new device's first sync: the same
    /// changes, made and counted the same way, in one write transaction, all of them or none;
    /// but `change` is called, and each new item prepared and sealed, on other threads, ahead
    /// of this thread, which writes the rows in order. A new item's row is the one ``add(_:)``
    /// writes, sealed by the same function
    /// (``sealForAdding(_:keys:vaultID:deviceID:presencePublicKey:version:)``: a new identifier,
    /// the value under its class key) and inserted, its primary key checked, by the same
    /// function (``insertSealed(_:writer:)``). A new item whose keys are not at hand
    /// before the transaction (a `ThisDeviceOnly` class, a locked class) or that has access
    /// control is prepared there and sealed here instead, exactly as ``add(_:)`` does, and so
    /// fails as it does.
    ///
    /// The transaction's pages stay in memory until its commit (a larger page cache for its
    /// length), instead of being written to the log and read back while it runs.
    ///
    /// - Parameters:
    ///   - count: how many changes `change` gives.
    ///   - change: the change at an index, `0..<count`, each asked for once, on other threads
    ///     (two at once, each going up its own range in order), up to two batches ahead of the
    ///     writes (so also past a change that fails).
    /// - Returns: the rows written and the generations before and of the changes.
    /// - Throws: as ``applyChanges(count:_:)``: nothing is written.
    public func applyChanges(
        count: Int, concurrently change: @escaping @Sendable (Int) throws(LockboxError) -> SyncedChange
    ) throws(LockboxError) -> AppliedChanges {
        try applyChanges(count: count, concurrently: change, beforeCommit: { _ throws(LockboxError) in }, afterCommit: {})
    }

    /// ``applyChanges(count:concurrently:)``, calling `beforeCommit` on this thread once every
    /// change is written, with what the call will return, just before the transaction commits
    /// (which may still fail), and `afterCommit` once it committed, before the log is moved
    /// into the file. Neither may use this vault; they may start and release work elsewhere
    /// that must wait for the commit (a sync writes its own state beside the vault's commit,
    /// and lets it commit while the vault moves its log), and `beforeCommit` may write what
    /// must be durable before the vault's commit (what it throws rolls the transaction back).
    /// Should the vault run the transaction again (after asking the user to verify),
    /// `beforeCommit` is called again.
    public func applyChanges(
        count: Int, concurrently change: @escaping @Sendable (Int) throws(LockboxError) -> SyncedChange,
        beforeCommit: (AppliedChanges) throws(LockboxError) -> Void, afterCommit: () -> Void
    ) throws(LockboxError) -> AppliedChanges {
        try applyChanges(count: count, concurrently: change, sizeLimit: nil, beforeCommit: beforeCommit, afterCommit: afterCommit)
    }

    /// ``applyChanges(count:concurrently:beforeCommit:afterCommit:)``, added and replaced items
    /// checked against `sizeLimit` instead of this store's limit (sync: ``syncedItemSizeLimit``).
    package func applyChanges(
        count: Int, concurrently change: @escaping @Sendable (Int) throws(LockboxError) -> SyncedChange, sizeLimit: Int?,
        beforeCommit: (AppliedChanges) throws(LockboxError) -> Void, afterCommit: () -> Void
    ) throws(LockboxError) -> AppliedChanges {
        let now = currentDate()
        return try withStateVerifyingUser { state throws(LockboxError) -> AppliedChanges in
            let restoreCache = try enlargePageCache(for: count, state: state)
            defer { restoreCache() }
            // The commit leaves the log where it is (SQLite would move a large transaction's
            // log into the file inside the commit); it is moved below, once `afterCommit` ran.
            state.database.setAutomaticCheckpoint(false)
            defer { state.database.setAutomaticCheckpoint(true) }
            var replaced = false
            let applied = try writeRows(state) { writer throws(LockboxError) -> AppliedChanges in
                let stager = ChangeStager(
                    vault: self, change: change, now: now, sizeLimit: sizeLimit, keys: sealingKeys(state), vaultID: state.header.vaultID,
                    deviceID: state.device.identifier, version: writer.generation)
                var applied = AppliedChanges(references: [], previousGeneration: writer.generation - 1, generation: writer.generation)
                applied.references.reserveCapacity(count)
                // Batches staged ahead, in order: two, so that both cores stage while this
                // thread also writes.
                var inFlight: [StagedBatch] = []
                var next = 0
                func stageAhead() {
                    while inFlight.count < Self.batchesAhead && next < count {
                        let end = min(next + Self.stagingBatch, count)
                        inFlight.append(stager.start(next..<end))
                        next = end
                    }
                }
                // The other threads finish their batches before the transaction ends, whatever happens here.
                defer { for batch in inFlight { batch.finished.wait() } }
                stageAhead()
                while !inFlight.isEmpty {
                    let batch = inFlight.removeFirst()
                    batch.finished.wait()
                    if batch.staged.count == batch.range.count { stageAhead() }
                    for staged in batch.staged {
                        switch staged {
                        case .failure(let error):
                            throw error
                        case .success(.sealed(let row)):
                            state.database.resetStatements()
                            try insertSealed(row, writer: writer)
                            applied.references.append(Data(row.id))
                        case .success(.prepared(let item)):
                            state.database.resetStatements()
                            applied.references.append(Data(try insert(item, writer: writer, state: state)))
                        case .success(.change(let change)):
                            let (reference, replacing) = try apply(change, now: now, sizeLimit: sizeLimit, writer: writer, state: state)
                            applied.references.append(reference)
                            if replacing { replaced = true }
                        }
                    }
                }
                try beforeCommit(applied)
                return applied
            }
            afterCommit()
            // Replaced and deleted values must not linger in the write-ahead log.
            if replaced { state.database.truncateWriteAheadLog() } else { state.database.checkpointWriteAheadLog() }
            return applied
        }
    }

    /// Changes staged per hand-over between the threads.
    static let stagingBatch = 128
    /// The largest page cache a bulk apply asks for, in KiB: 64 MiB, an import of about 20,000
    /// items without a spill.
    static let largestPageCache = 64 * 1024

    /// Batches staged at once, each on its own thread.
    static let batchesAhead = 2

    /// Raises the connection's page cache for a transaction of `count` changes (about 3 KiB of
    /// pages each: the row, its index entries, their share of split pages), so that SQLite does
    /// not spill its dirty pages to the log mid-transaction and read them back; returns what
    /// puts the previous size back. At most ``largestPageCache`` KiB: a larger import spills
    /// past it, as any transaction does.
    private func enlargePageCache(for count: Int, state: State) throws(LockboxError) -> () -> Void {
        let statement = try state.database.statement("PRAGMA cache_size")
        let previous = try statement.step() ? statement.integer(0) ?? -2000 : -2000
        statement.reset()
        // Negative sizes are KiB; positive ones pages.
        let previousKiB = previous < 0 ? -previous : previous * 2
        let wanted = min(count * 3, Self.largestPageCache)
        guard wanted > previousKiB else { return {} }
        try state.database.execute("PRAGMA cache_size = -\(wanted)")
        return { try? state.database.execute("PRAGMA cache_size = \(previous)") }
    }

    /// The class and index keys of every portable accessibility that can be written now, per
    /// item class, taken before the transaction so the other thread can seal with them (it
    /// must not touch the key cache). A combination missing here is sealed on the writing
    /// thread through ``keysForWriting(_:_:state:)``, which gives the error it gives.
    private func sealingKeys(_ state: State) -> SealingKeys {
        var keys = SealingKeys()
        for itemClass in ItemClass.allCases {
            for accessibility in Accessibility.allCases where !accessibility.isThisDeviceOnly {
                if let pair = try? keysForWriting(itemClass, accessibility, state: state) {
                    keys.pairs[SealingKeys.Combination(itemClass: itemClass, accessibility: accessibility)] = pair
                }
            }
        }
        return keys
    }
}

/// Keys by item class and accessibility, read-only once built.
private struct SealingKeys: Sendable {
    struct Combination: Hashable {
        var itemClass: ItemClass
        var accessibility: Accessibility
    }
    var pairs: [Combination: (classKey: SecretBytes, indexKey: SecretBytes)] = [:]
}

/// One change as the other thread hands it over.
private enum StagedChange {
    /// A new item, sealed: only its insert is left.
    case sealed(SealedRow)
    /// A new item, checked and completed, to seal on the writing thread.
    case prepared(Vault.PreparedItem)
    /// A replace or a delete, made on the writing thread.
    case change(SyncedChange)
}

/// A range of changes staged by the other thread; `staged` is written there before
/// `finished` is signalled and read here only after waiting for it.
private final class StagedBatch: @unchecked Sendable {
    let range: Range<Int>
    var staged: [Result<StagedChange, LockboxError>] = []
    let finished = DispatchSemaphore(value: 0)

    init(_ range: Range<Int>) {
        self.range = range
        staged.reserveCapacity(range.count)
    }
}

/// Asks for changes and seals new items off the writing thread.
private struct ChangeStager: Sendable {
    let vault: Vault
    let change: @Sendable (Int) throws(LockboxError) -> SyncedChange
    let now: Date
    let sizeLimit: Int?
    let keys: SealingKeys
    let vaultID: [UInt8]
    let deviceID: String
    let version: Int

    func start(_ range: Range<Int>) -> StagedBatch {
        let batch = StagedBatch(range)
        DispatchQueue.global(qos: .userInitiated).async {
            for index in range {
                do throws(LockboxError) {
                    batch.staged.append(.success(try stage(index)))
                } catch {
                    batch.staged.append(.failure(error))
                    break
                }
            }
            batch.finished.signal()
        }
        return batch
    }

    private func stage(_ index: Int) throws(LockboxError) -> StagedChange {
        let made = try change(index)
        guard case .add(let item) = made else { return .change(made) }
        let prepared = try vault.prepareForAdding(item, now: item.attributes.modificationDate ?? now, sizeLimit: sizeLimit)
        guard prepared.accessControl == nil,
            let pair = keys.pairs[.init(itemClass: prepared.itemClass, accessibility: prepared.attributes.accessibility ?? .default)]
        else { return .prepared(prepared) }
        return .sealed(
            Vault.sealForAdding(prepared, keys: pair, vaultID: vaultID, deviceID: deviceID, presencePublicKey: nil, version: version))
    }
}
