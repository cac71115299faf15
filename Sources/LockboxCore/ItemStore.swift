/// A place that keeps Keychain items: the SPI every backend implements (the vault, the
/// Secret Service, Apple's Keychain).
///
/// The calls are synchronous, like `SecItemAdd` and friends, so the SecItem-compatible layer
/// can sit on any store; backends bound every blocking wait with a timeout. Call them from a
/// background task where a UI must not wait.
///
/// Results follow the Keychain's: no match is ``LockboxError/Code/itemNotFound``; a
/// primary-key collision is ``LockboxError/Code/duplicateItem``; a store that is locked is
/// ``LockboxError/Code/interactionNotAllowed``, never "not found".
public protocol ItemStore: Sendable {
    /// Adds an item. `attributes.accessibility` defaults to ``Accessibility/default`` and
    /// `attributes.accessGroup` to the store's default group.
    /// - Throws: `duplicateItem` when an item with the same primary key exists; `param` for a
    ///   value over the store's size limit; `interactionNotAllowed` when locked.
    func add(_ item: Item) throws(LockboxError)

    /// The items matching `query`, at most one when `query.limit` is `.one`.
    /// - Throws: `itemNotFound` when nothing matches; `interactionNotAllowed` when a
    ///   candidate cannot be read because the store is locked.
    func items(matching query: Query) throws(LockboxError) -> [Item]

    /// The value of the one item matching `query` (the first, when several match). A store
    /// may answer it faster than ``items(matching:)``; the default implementation asks that.
    /// - Throws: as ``items(matching:)``.
    func data(matching query: Query) throws(LockboxError) -> SecretBytes

    /// Applies `update` to every item matching `query`.
    /// - Throws: `itemNotFound` when nothing matches; `duplicateItem` when the change would
    ///   make two items share a primary key.
    func update(matching query: Query, to update: ItemUpdate) throws(LockboxError)

    /// Deletes every item matching `query`, as `SecItemDelete` does: a query that names no
    /// attribute deletes every item of its class (in the store's access groups).
    /// - Returns: how many items were deleted (at least one).
    /// - Throws: `itemNotFound` when nothing matches; `interactionNotAllowed` when the store is
    ///   locked: a locked store deletes nothing, since it cannot read what it would delete.
    @discardableResult
    func delete(matching query: Query) throws(LockboxError) -> Int
}

extension ItemStore {
    /// The value of the one item matching `query`.
    public func data(matching query: Query) throws(LockboxError) -> SecretBytes {
        try dataThroughItems(matching: query)
    }

    /// ``data(matching:)`` answered by ``items(matching:)``: the default, and what a store with
    /// a faster way falls back to.
    package func dataThroughItems(matching query: Query) throws(LockboxError) -> SecretBytes {
        var query = query
        query.limit = .one
        query.returning = [.data]
        guard let data = try items(matching: query).first?.data else {
            throw LockboxError(.itemNotFound, "No matching item was found in the keychain.")
        }
        return data
    }

    /// The one item matching `query`, with attributes and data.
    public func item(matching query: Query) throws(LockboxError) -> Item {
        var query = query
        query.limit = .one
        query.returning = [.data, .attributes]
        guard let item = try items(matching: query).first else {
            throw LockboxError(.itemNotFound, "No matching item was found in the keychain.")
        }
        return item
    }

    /// Whether an item matches, without reading its value.
    /// - Throws: `interactionNotAllowed` when the answer depends on a locked item: a locked
    ///   store never answers "no".
    public func contains(_ query: Query) throws(LockboxError) -> Bool {
        var query = query
        query.limit = .one
        query.returning = []
        do {
            return try !items(matching: query).isEmpty
        } catch LockboxError.itemNotFound {
            return false
        }
    }
}
