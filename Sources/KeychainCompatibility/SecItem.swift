#if !canImport(Darwin)
import Foundation
import LockboxCore
import Lockbox
import LockboxKeys

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
        if let key = request.keyReference {
            let added = try addKey(key, request)
            guard let result, !request.returning.isEmpty || request.returnsReference else { return }
            result.pointee = request.returnsReference && request.returning.isEmpty ? added : try keyResults(request, found: [added])
            return
        }
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
        if request.returnsReference, request.itemClass == .key {
            result?.pointee = try keyResults(request, found: nil)
            return
        }
        var items = try search(request, in: store)
        if request.itemClass == .key, request.returning.contains(.data) {
            items = try withKeyRepresentations(items, request)
        }
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
    query.authenticationContext = request.lockboxAuthenticationContext
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
    let skipsProtected = request.authenticationUI == kSecUseAuthenticationUISkip
    try forEachClass(of: request) { (classQuery) throws(LockboxError) in
        var searchQuery = classQuery
        searchQuery.limit = limit
        searchQuery.returning = request.returning
        guard skipsProtected else {
            found = try store.items(matching: searchQuery)
            return
        }
        // kSecUseAuthenticationUISkip: items that would need the user are left out of the
        // results, silently (SecItem.h). Their attributes are readable without the user; only
        // the unprotected ones are then read in full.
        searchQuery.limit = .all
        searchQuery.returning = [.attributes, .persistentReference]
        let candidates = try store.items(matching: searchQuery).filter { $0.accessControl == nil }
        found = []
        for candidate in candidates {
            guard let reference = candidate.persistentReference else { continue }
            var one = classQuery
            one.persistentReference = reference
            one.synchronizable = .any
            one.returning = request.returning
            found += try store.items(matching: one)
            if limit == .one && !found.isEmpty { break }
        }
        if found.isEmpty { throw LockboxError(.itemNotFound, "No item matches without the user's authentication.") }
    }
    if case .count(let count) = request.limit {
        found = Array(found.prefix(count))
    }
    return found
}

// MARK: Keys

/// SecItemAdd with `kSecValueRef`: a key made in this process goes into the keychain; a key
/// already there is a duplicate.
private func addKey(_ key: SecKey, _ request: SecItemRequest) throws(LockboxError) -> SecKey {
    let representation: SecretBytes
    switch key.material {
    case .stored, .brokered:
        throw LockboxError(.duplicateItem, "This key is already in the keychain.")
    case .publicKey:
        throw LockboxError(.unimplemented, "Public keys are not stored as keychain items here; keep the private key, or the public key's bytes.")
    case .memory(let secret, _):
        representation = secret
    }
    var specification = KeySpecification(algorithm: .p256, purposes: KeyAlgorithm.p256.possiblePurposes)
    specification.applicationTag = request.attributes.applicationTag
    specification.label = request.attributes.label
    specification.accessGroup = request.attributes.accessGroup
    specification.accessibility = request.attributes.accessibility ?? .default
    specification.accessControl = request.itemAccessControl
    // The bytes were in the application's hands already: an added key stays extractable
    // (as on iOS) unless kSecAttrIsExtractable says otherwise.
    specification.isExtractable = request.isExtractable ?? true
    let keys = try SecKeyStore.current()
    let matching = try keys.keys(applicationTag: specification.applicationTag, label: nil).filter {
        $0.publicKey == key.publicKey && $0.accessibility == specification.accessibility
    }
    guard matching.isEmpty else { throw LockboxError(.duplicateItem, "This key is already in the keychain.") }
    return SecKey(.stored(try keys.importKey(p256PrivateRepresentation: representation, specification)), context: request.lockboxAuthenticationContext)
}

/// `kSecReturnData` for a key made by the SecKey functions gives what iOS gives: its external
/// representation (`04 || X || Y || D`), and only for an extractable key. Key items stored as
/// plain `kSecValueData` keep their bytes.
private func withKeyRepresentations(_ items: [Item], _ request: SecItemRequest) throws(LockboxError) -> [Item] {
    guard let keys = try? SecKeyStore.current() else { return items }
    var result: [Item] = []
    for var item in items {
        var lookup = query(request, .key, limit: .all)
        lookup.persistentReference = item.persistentReference
        lookup.synchronizable = .any
        if let reference = item.persistentReference, let managed = try keys.keys(matching: lookup).first,
            managed.persistentReference == reference
        {
            item.data = try keys.exportPrivateKey(of: managed, context: request.lockboxAuthenticationContext)
        }
        result.append(item)
    }
    return result
}

/// `kSecReturnRef` for keys: `SecKey` objects (alone, or under `v_Ref` in attribute dictionaries).
private func keyResults(_ request: SecItemRequest, found: [SecKey]?) throws(LockboxError) -> CFTypeRef? {
    var keys: [SecKey]
    if let found {
        keys = found
    } else {
        var lookup = query(request, .key, limit: .all)
        lookup.returning = [.attributes, .persistentReference]
        let context = request.lockboxAuthenticationContext
        if let broker = try SecItemStore.current() as? BrokerStore {
            lookup.returning = [.attributes, .persistentReference]
            keys = BrokeredKey.keys(in: try broker.items(matching: lookup), store: broker).map { SecKey(.brokered($0), context: context) }
        } else {
            keys = try SecKeyStore.current().keys(matching: lookup).map { SecKey(.stored($0), context: context) }
        }
        if keys.isEmpty { throw LockboxError(.itemNotFound, "No key matches the query.") }
    }
    switch request.limit {
    case .one: keys = Array(keys.prefix(1))
    case .count(let count): keys = Array(keys.prefix(count))
    case .all: break
    }
    let values: [AnyObject] = keys.map { key in
        guard !request.returning.isEmpty else { return key }
        var dictionary = (SecKeyCopyAttributes(key)?.stringKeyed) ?? [:]
        dictionary[kSecValueRef] = key
        if request.returning.contains(.persistentReference), case .stored(let managed) = key.material {
            dictionary[kSecValuePersistentRef] = managed.persistentReference
        }
        if request.returning.contains(.persistentReference), case .brokered(let brokered) = key.material,
            let reference = brokered.persistentReference
        {
            dictionary[kSecValuePersistentRef] = reference
        }
        return dictionary as NSDictionary
    }
    return request.limit == .one ? values.first : values as NSArray
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
