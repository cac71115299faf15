/// A handful of key-value pairs, found by linear search, in insertion order.
///
/// For the few class and index keys a vault holds. Unlike `Dictionary`, it puts no
/// requirement on its key type, so a process needs no run-time conformance lookup to create
/// one: in a statically linked binary each new `Dictionary` key type costs a scan of every
/// conformance record, which a command-line process that reads one secret and exits pays in
/// full.
package struct SmallMap<Key, Value> {
    package private(set) var entries: [(key: Key, value: Value)] = []

    package init() {}

    package var isEmpty: Bool { entries.isEmpty }
    package var count: Int { entries.count }
    package var keys: [Key] { entries.map(\.key) }

    package mutating func removeAll() {
        entries.removeAll()
    }
}

extension SmallMap where Key: Equatable {
    package subscript(key: Key) -> Value? {
        get {
            for entry in entries where entry.key == key { return entry.value }
            return nil
        }
        set {
            let index = entries.firstIndex { $0.key == key }
            switch (index, newValue) {
            case (let index?, let value?): entries[index].value = value
            case (let index?, nil): entries.remove(at: index)
            case (nil, let value?): entries.append((key, value))
            case (nil, nil): break
            }
        }
    }

    /// The pairs whose key satisfies `isIncluded`.
    package func filter(_ isIncluded: (Key) -> Bool) -> SmallMap {
        var result = SmallMap()
        result.entries = entries.filter { isIncluded($0.key) }
        return result
    }
}

extension SmallMap: Sendable where Key: Sendable, Value: Sendable {}
