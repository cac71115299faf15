#if !canImport(Security)
import Foundation
import LockboxCore

// The four SecItem functions, with Apple's signatures and the iOS data-protection keychain's
// behaviour, over the store ``SecItemStore`` selects. They never throw and never crash on a
// malformed dictionary: every problem is a status, as on Apple platforms.

/// Adds an item.
///
/// ```swift
/// let status = SecItemAdd([
///     kSecClass as String: kSecClassGenericPassword,
///     kSecAttrService as String: "api.example.com",
///     kSecAttrAccount as String: "alice",
///     kSecValueData as String: Data(token.utf8),
/// ] as CFDictionary, nil)
/// ```
/// - Parameters:
///   - attributes: The class, attributes, `kSecValueData`, and optionally `kSecReturn*` keys.
///   - result: When not nil, receives the added item in the shape the `kSecReturn*` keys ask
///     for (nil when none is given).
/// - Returns: `errSecSuccess`; `errSecDuplicateItem` when an item with the same primary key
///   exists; `errSecParam` for a malformed dictionary (no `kSecClass`, say).
@discardableResult
public func SecItemAdd(_ attributes: CFDictionary, _ result: UnsafeMutablePointer<CFTypeRef?>?) -> OSStatus {
    result?.pointee = nil
    return status { () throws(LockboxError) in
        let request = try SecItemRequest(attributes, role: .add)
        let store = try SecItemStore.current()
        // An add dictionary without kSecClass was rejected above: it cannot use a persistent reference.
        var item = Item(request.itemClass!, attributes: request.attributes)
        item.data = request.data.map { SecretBytes(copying: $0) }
        item.accessControl = request.itemAccessControl
        try store.add(item)
        guard let result, !request.returning.isEmpty else { return }
        result.pointee = try addedItem(request, in: store)
    }
}

/// Finds items.
///
/// ```swift
/// var item: CFTypeRef?
/// let status = SecItemCopyMatching([
///     kSecClass as String: kSecClassGenericPassword,
///     kSecAttrAccount as String: "alice",
///     kSecReturnData as String: true,
/// ] as CFDictionary, &item)
/// let token = item as? Data
/// ```
/// - Parameters:
///   - query: The class, attributes to match, `kSecMatchLimit` (default one) and
///     `kSecReturn*` keys.
///   - result: Receives `Data`, `[String: Any]`, or with a limit above one an array of them.
/// - Returns: `errSecSuccess`; `errSecItemNotFound` when nothing matches;
///   `errSecInteractionNotAllowed` when the keychain is locked.
@discardableResult
public func SecItemCopyMatching(_ query: CFDictionary, _ result: UnsafeMutablePointer<CFTypeRef?>?) -> OSStatus {
    result?.pointee = nil
    return status { () throws(LockboxError) in
        let request = try SecItemRequest(query, role: .search)
        let store = try SecItemStore.current()
        let items = try search(request, in: store)
        result?.pointee = ResultEncoding.result(for: items, request: request)
    }
}

/// Changes every item that matches `query`.
///
/// - Parameters:
///   - query: The class and attributes to match.
///   - attributesToUpdate: The new attribute values and, optionally, `kSecValueData`. Only
///     item attributes: `kSecClass`, search and return keys are `errSecParam`.
/// - Returns: `errSecSuccess`; `errSecItemNotFound` when nothing matches;
///   `errSecDuplicateItem` when the change would give two items the same primary key.
@discardableResult
public func SecItemUpdate(_ query: CFDictionary, _ attributesToUpdate: CFDictionary) -> OSStatus {
    status { () throws(LockboxError) in
        let request = try SecItemRequest(query, role: .updateQuery)
        let changes = try SecItemRequest(attributesToUpdate, role: .updateAttributes, attributesOf: request.itemClass)
        let store = try SecItemStore.current()
        let update = ItemUpdate(attributes: changes.attributes, data: changes.data.map { SecretBytes(copying: $0) })
        try forEachClass(of: request) { (query) throws(LockboxError) in
            try store.update(matching: query, to: update)
        }
    }
}

/// Deletes every item that matches `query`.
///
/// - Returns: `errSecSuccess`; `errSecItemNotFound` when nothing matches.
@discardableResult
public func SecItemDelete(_ query: CFDictionary) -> OSStatus {
    status { () throws(LockboxError) in
        let request = try SecItemRequest(query, role: .delete)
        let store = try SecItemStore.current()
        try forEachClass(of: request) { (query) throws(LockboxError) in
            try store.delete(matching: query)
        }
    }
}

// MARK: - Internals

private func status(_ body: () throws(LockboxError) -> Void) -> OSStatus {
    do {
        try body()
        return errSecSuccess
    } catch {
        return error.status
    }
}

private func query(_ request: SecItemRequest, _ itemClass: ItemClass, limit: Query.MatchLimit) -> Query {
    var query = Query(
        itemClass, attributes: request.attributes, limit: limit, returning: request.returning,
        synchronizable: request.synchronizable)
    query.persistentReference = request.persistentReference
    query.authenticationContext = request.authenticationContext as? AuthenticationContext
    return query
}

/// Runs `body` on the request's class, or, for a persistent reference given without a class,
/// on each class until one has the item.
private func forEachClass(
    of request: SecItemRequest, _ body: (Query) throws(LockboxError) -> Void
) throws(LockboxError) {
    var query = query(request, request.itemClass ?? .genericPassword, limit: .all)
    query.returning = []
    if request.itemClass != nil {
        return try body(query)
    }
    for itemClass in ItemClass.allCases {
        query.itemClass = itemClass
        do {
            return try body(query)
        } catch LockboxError.itemNotFound {
            continue
        }
    }
    throw LockboxError(.itemNotFound, "No item has this persistent reference.")
}

private func search(_ request: SecItemRequest, in store: any ItemStore) throws(LockboxError) -> [Item] {
    let limit: Query.MatchLimit = request.limit == .one ? .one : .all
    var found: [Item] = []
    try forEachClass(of: request) { (classQuery) throws(LockboxError) in
        var searchQuery = classQuery
        searchQuery.limit = limit
        searchQuery.returning = request.returning
        found = try store.items(matching: searchQuery)
    }
    if case .count(let count) = request.limit {
        found = Array(found.prefix(count))
    }
    return found
}

/// The item SecItemAdd just added, in the shape its `kSecReturn*` keys ask for: the newest
/// item matching the added attributes.
private func addedItem(_ request: SecItemRequest, in store: any ItemStore) throws(LockboxError) -> CFTypeRef? {
    var lookup = query(request, request.itemClass!, limit: .all)
    lookup.synchronizable = request.attributes.synchronizable == true ? .synchronizable : .notSynchronizable
    lookup.returning = request.returning.union(.attributes)
    let candidates = try store.items(matching: lookup)
    let newest = candidates.max { ($0.attributes.creationDate ?? .distantPast) < ($1.attributes.creationDate ?? .distantPast) }
    var shape = request
    shape.limit = .one
    return ResultEncoding.result(for: newest.map { [$0] } ?? [], request: shape)
}
#endif
