import FoundationEssentials
import LockboxCore
import VaultStorage

/// What changed among the synchronizable rows since a generation: the small, read-only answer
/// sync needs to push only changes (docs/SYNC.md, "Finding local changes").
public struct SynchronizableChanges: Sendable {
    /// The vault's write generation when the rows were listed (one snapshot with them). Pass it
    /// as `since` next time.
    public var generation: Int
    /// How many rows are marked synchronizable now (whatever their accessibility).
    public var count: Int
    /// Persistent references of the synchronizable rows written after `since`.
    public var changed: [Data]
    /// Persistent references of every synchronizable row, when asked for (`listingAll`).
    public var all: Set<Data>?
    /// True when the vault's generation is still `since`: nothing was written, and the rows
    /// were not listed (`count` is then 0).
    public var isUnchanged = false
}

extension Vault {
    /// The synchronizable rows written after generation `since`, found from the rows' plain
    /// columns (each row records the generation that wrote it) without opening any row: the
    /// cost is one pass over the rows' identifiers, not a decryption of every item.
    ///
    /// Nothing is opened, so nothing here is trusted as content: read each changed row through
    /// ``items(matching:)`` (which authenticates it) before using it. When nothing was written
    /// since `since`, the answer says so without listing (``SynchronizableChanges/isUnchanged``). A row whose generation
    /// column was edited fails that authentication when read.
    ///
    /// - Parameters:
    ///   - since: the `generation` of an earlier answer; 0 for every row.
    ///   - listingAll: also return every synchronizable row's reference (to find deletes).
    /// - Throws: `decode` when the integrity record fails its check or was rolled back.
    public func synchronizableChanges(since: Int, listingAll: Bool = false) throws(LockboxError) -> SynchronizableChanges {
        try withState { state throws(LockboxError) -> SynchronizableChanges in
            try state.database.readTransaction { () throws(LockboxError) -> SynchronizableChanges in
                let integrity = try currentIntegrity(state)
                let generation = integrity.state?.generation ?? 0
                // Every write moves the generation: an unchanged one needs no listing.
                if generation == since && since > 0 && !listingAll {
                    return SynchronizableChanges(generation: generation, count: 0, changed: [], all: nil, isUnchanged: true)
                }
                var changes = SynchronizableChanges(generation: generation, count: 0, changed: [], all: listingAll ? [] : nil)
                // The partial index `items_synchronizable` (schema 3) holds the synchronizable
                // rows by version: the count reads it alone, the changes only their entries.
                changes.count = try state.database.firstRow("SELECT count(*) FROM items WHERE synchronizable = 1") {
                    $0.integer(0) ?? 0
                } ?? 0
                let changed = try state.database.statement("SELECT id FROM items WHERE synchronizable = 1 AND version > ?")
                defer { changed.reset() }
                changed.bind(1, since)
                while try changed.step() { changes.changed.append(Data(changed.blob(0) ?? [])) }
                if listingAll {
                    let every = try state.database.statement("SELECT id FROM items WHERE synchronizable = 1")
                    defer { every.reset() }
                    while try every.step() { changes.all?.insert(Data(every.blob(0) ?? [])) }
                }
                return changes
            }
        }
    }
}

/// What ``Vault/importItems(count:_:)`` wrote.
public struct ImportedItems: Sendable {
    /// The new rows' persistent references, in the order the items were given.
    public var references: [Data]
    /// The vault's write generation just before the import, in the same transaction: equal to
    /// an earlier ``SynchronizableChanges/generation`` when nothing else was written since.
    public var previousGeneration: Int
    /// The generation the import wrote (its rows' version).
    public var generation: Int
}

extension Vault {
    /// Adds `count` items in one write transaction, asking for each as it is written: a sync
    /// that brings thousands of items opens each value just before it is sealed here, so only
    /// one is in memory at a time. The rows are sealed and counted in the integrity record as
    /// ``add(contentsOf:)`` does; the import commits once, all of it or (on any error, also one
    /// `item` throws) nothing.
    ///
    /// - Parameters:
    ///   - count: how many items `item` gives.
    ///   - item: the item at an index, `0..<count`, each asked for once, in order.
    /// - Returns: the rows' references and the generations before and of the import.
    /// - Throws: `duplicateItem` when an item is here already (nothing is written); what
    ///   `item` throws.
    public func importItems(count: Int, _ item: (Int) throws(LockboxError) -> Item) throws(LockboxError) -> ImportedItems {
        let now = currentDate()
        return try withState { state throws(LockboxError) -> ImportedItems in
            try writeRows(state) { writer throws(LockboxError) -> ImportedItems in
                var imported = ImportedItems(references: [], previousGeneration: writer.generation - 1, generation: writer.generation)
                imported.references.reserveCapacity(count)
                for index in 0..<count {
                    let prepared = try prepareForAdding(try item(index), now: now)
                    imported.references.append(Data(try insert(prepared, writer: writer, state: state)))
                }
                return imported
            }
        }
    }
}

extension Vault {
    /// Apple's rule, which SecItemAdd and SecItemUpdate enforce with `errSecParam`: an item with
    /// access control is not synchronizable. Its value needs the user of this machine (the
    /// presence key sealing its item key is this keychain's), so it could neither be read to be
    /// sent nor keep its protection elsewhere.
    static func checkSynchronizable(_ attributes: ItemAttributes, hasAccessControl: Bool) throws(LockboxError) {
        guard hasAccessControl, attributes.synchronizable == true else { return }
        throw LockboxError(
            .param,
            "An item with access control cannot be synchronizable: its value needs this machine's user. "
                + "Store it with synchronizable off, or without access control.")
    }
}
