import FoundationEssentials

#if canImport(Glibc)
import Glibc
#endif
import LockboxCore

/// Keychain items in the desktop keychain: GNOME Keyring, KWallet or KeePassXC behind the
/// freedesktop Secret Service, through libsecret.
///
/// Each Keychain item is one Secret Service item whose attributes carry the Keychain
/// attributes (docs/SECRET-SERVICE.md has the table). Generic passwords are shared with
/// `secret-tool` and Python `keyring`; internet passwords with git's libsecret helper.
///
/// Every call is bounded by ``Configuration/timeout``: a bus that does not answer becomes
/// `notAvailable`, never a hang. A locked collection is `interactionNotAllowed`, never
/// "not found"; Lockbox never raises an unlock prompt itself.
///
/// ```swift
/// let store = SecretServiceStore()
/// try store.add(.genericPassword(service: "api.example.com", account: "alice",
///                                data: SecretBytes(utf8: token)))
/// ```
public final class SecretServiceStore: ItemStore {
    /// Where and how the store talks to the Secret Service.
    public struct Configuration: Sendable {
        /// The session bus address, as found in the environment; nil means there is none and
        /// every call fails with `notAvailable` at once. libsecret itself always uses GLib's
        /// session bus, which GLib finds the same way.
        public var busAddress: String?
        /// The collection: an alias (`default`, the login keyring; `session`, in memory only)
        /// or an object path (`/org/freedesktop/secrets/collection/login`).
        public var collection: String
        /// How long one call may take before it fails with `notAvailable`.
        public var timeout: Duration
        /// The access group of items added without one, and of items other tools wrote
        /// (which have none); nil leaves them without.
        public var defaultAccessGroup: String?
        /// The largest value accepted, in bytes; larger ones are `param`.
        public var maximumValueSize: Int

        public init(
            busAddress: String? = Configuration.sessionBusAddress(),
            collection: String = "default",
            timeout: Duration = .seconds(5),
            defaultAccessGroup: String? = nil,
            maximumValueSize: Int = 64 * 1024
        ) {
            self.busAddress = busAddress
            self.collection = collection
            self.timeout = timeout
            self.defaultAccessGroup = defaultAccessGroup
            self.maximumValueSize = maximumValueSize
        }

        /// The session bus as D-Bus clients find it: `DBUS_SESSION_BUS_ADDRESS`, else the
        /// systemd user bus at `$XDG_RUNTIME_DIR/bus`; nil when neither exists. `environment`: nil
        /// for this process's own.
        public static func sessionBusAddress(environment: [String: String]? = nil) -> String? {
            // One getenv per name unless a whole environment is given.
            let lookup: (String) -> String? = { name in
                guard let environment else { return ProcessEnvironment.nonEmpty(name) }
                return environment[name].flatMap { $0.isEmpty ? nil : $0 }
            }
            if let address = lookup("DBUS_SESSION_BUS_ADDRESS") {
                return address
            }
            if let runtime = lookup("XDG_RUNTIME_DIR") {
                let socket = runtime + "/bus"
                var status = stat()
                if stat(socket, &status) == 0, (status.st_mode & S_IFMT) == S_IFSOCK {
                    return "unix:path=" + socket
                }
            }
            return nil
        }
    }

    public let configuration: Configuration
    private let worker = SerialWorker()
    private let loadLibrary: @Sendable () throws(LockboxError) -> LibSecret

    /// A store on the Secret Service that `configuration` names. Nothing is loaded or
    /// connected until the first call: libsecret itself is opened then (see
    /// docs/SECRET-SERVICE.md), and its absence is `notAvailable` from every call.
    public convenience init(configuration: Configuration = Configuration()) {
        self.init(configuration: configuration, library: LibSecret.load)
    }

    /// A store that reaches libsecret through `library` rather than the process's table.
    init(configuration: Configuration, library: @escaping @Sendable () throws(LockboxError) -> LibSecret) {
        self.configuration = configuration
        self.loadLibrary = library
    }

    // MARK: ItemStore

    public func add(_ item: Item) throws(LockboxError) {
        var attributes = item.attributes
        if attributes.accessGroup == nil { attributes.accessGroup = configuration.defaultAccessGroup }
        if attributes.accessibility == nil { attributes.accessibility = .default }
        let itemClass = item.itemClass
        let data = item.data ?? .empty
        try checkSize(data)
        let newAttributes = attributes
        try withCollection("add an item") { collection, cancellation throws(LockboxError) in
            // Search, create and check under the write lock: another Lockbox process adding
            // the same key waits here instead of finding nothing and creating a second item.
            try WriteLock.holding(cancellation) { () throws(LockboxError) in
                let attributes = newAttributes
                let key = PrimaryKey.encode(itemClass, attributes)
                let existing = try self.candidates(itemClass, attributes, in: collection, cancellation)
                if existing.contains(where: { PrimaryKey.encode(itemClass, $0.attributes) == key }) {
                    throw LockboxError(.duplicateItem, "An item with the same primary key already exists in the keychain.")
                }
                // Asked before creating: in a locked collection some providers prompt on create.
                try self.ensureUnlocked(collection, cancellation)
                let created = try Self.translate("add an item") { () throws(GLibFailure) in
                    try collection.createItem(
                        attributes: SecretServiceSchema.encode(itemClass, attributes),
                        label: SecretServiceSchema.displayLabel(itemClass, attributes), secret: data,
                        replacing: false, cancellable: cancellation)
                }
                try self.withdrawIfDuplicated(created, itemClass, attributes, in: collection, cancellation)
            }
        }
    }

    /// The check after a create, for writers that do not take the write lock (other tools,
    /// older Lockbox versions): when an item with the same primary key appeared meanwhile, the
    /// one just created is removed again and the add fails as a duplicate, so one item stays.
    func withdrawIfDuplicated(
        _ created: String, _ itemClass: ItemClass, _ attributes: ItemAttributes, in collection: StoredCollection,
        _ cancellation: Cancellation
    ) throws(LockboxError) {
        let key = PrimaryKey.encode(itemClass, attributes)
        let others: [Match]
        do {
            others = try candidates(itemClass, attributes, in: collection, cancellation, excluding: created)
        } catch LockboxError.interactionNotAllowed {
            // Locked since the create: nothing can be compared, and the new item stays.
            return
        }
        guard others.contains(where: { PrimaryKey.encode(itemClass, $0.attributes) == key }) else { return }
        try Self.translate("remove the item that duplicates another") { () throws(GLibFailure) in
            try collection.deleteItem(created, cancellable: cancellation)
        }
        throw LockboxError(
            .duplicateItem, "Another program added an item with the same primary key to the keychain at the same time.")
    }

    public func items(matching query: Query) throws(LockboxError) -> [Item] {
        try withCollection("search") { collection, cancellation throws(LockboxError) in
            // Every match, newest first: another client (secret-tool, Python keyring) may have
            // added a copy beside Lockbox's, and the last one written is the one to answer with.
            var matches = Self.newestFirst(try self.matches(query, in: collection, cancellation))
            if query.limit == .one { matches = Array(matches.prefix(1)) }
            guard !matches.isEmpty else {
                try self.ensureUnlocked(collection, cancellation)
                throw LockboxError(.itemNotFound, "No matching item was found in the keychain.")
            }
            // One call for every secret, and only for the items returned.
            var secrets: [String: SecretBytes] = [:]
            if query.returning.contains(.data) {
                secrets = try Self.translate("read an item's secret") { () throws(GLibFailure) in
                    try collection.secrets(ofItems: matches.map(\.path), cancellable: cancellation)
                }
            }
            return matches.map { match in
                var item = Item(
                    query.itemClass,
                    attributes: query.returning.contains(.attributes) ? match.attributes : ItemAttributes())
                if query.returning.contains(.data) { item.data = secrets[match.path] ?? .empty }
                item.persistentReference = Data(match.path.utf8)
                return item
            }
        }
    }

    public func update(matching query: Query, to update: ItemUpdate) throws(LockboxError) {
        if let data = update.data { try checkSize(data) }
        try withCollection("update items") { collection, cancellation throws(LockboxError) in
            // Under the write lock, as for add: the duplicate check and the writes are one step
            // for every Lockbox process.
            try WriteLock.holding(cancellation) { () throws(LockboxError) in
                let targets = try self.matches(query, in: collection, cancellation)
                guard !targets.isEmpty else {
                    try self.ensureUnlocked(collection, cancellation)
                    throw LockboxError(.itemNotFound, "No matching item was found in the keychain.")
                }
                let itemClass = query.itemClass
                let changed = targets.map { target in
                    var attributes = target.attributes
                    attributes.apply(update.attributes)
                    return attributes
                }
                // Apple's rule: no change may make two items share a primary key. Copies that
                // already share one (another client added an item beside Lockbox's) and keep it
                // are no new collision: each of them is updated, so the copies stay alike.
                let oldKeys = targets.map { PrimaryKey.encode(itemClass, $0.attributes) }
                let newKeys = changed.map { PrimaryKey.encode(itemClass, $0) }
                let targetPaths = Set(targets.map(\.path))
                for index in targets.indices where newKeys[index] != oldKeys[index] {
                    if newKeys.indices.contains(where: { $0 != index && newKeys[$0] == newKeys[index] }) {
                        throw LockboxError(.duplicateItem, "The update would give two items the same primary key.")
                    }
                    let others = try self.candidates(itemClass, changed[index], in: collection, cancellation)
                        .filter { !targetPaths.contains($0.path) }
                    if others.contains(where: { PrimaryKey.encode(itemClass, $0.attributes) == newKeys[index] }) {
                        throw LockboxError(.duplicateItem, "The update would give two items the same primary key.")
                    }
                }
                for (target, attributes) in zip(targets, changed) {
                    try Self.translate("update an item") { () throws(GLibFailure) in
                        var stored = SecretServiceSchema.encode(itemClass, attributes)
                        // Keep what another tool stored next to our attributes (keyring's `application`).
                        for (name, value) in target.storedAttributes where stored[name] == nil && !name.hasPrefix("lockbox:") {
                            stored[name] = value
                        }
                        try collection.setAttributes(stored, ofItem: target.path, cancellable: cancellation)
                        if update.attributes.label != nil {
                            try collection.setLabel(
                                SecretServiceSchema.displayLabel(itemClass, attributes), ofItem: target.path,
                                cancellable: cancellation)
                        }
                        if let data = update.data {
                            try collection.setSecret(data, ofItem: target.path, cancellable: cancellation)
                        }
                    }
                }
            }
        }
    }

    @discardableResult
    public func delete(matching query: Query) throws(LockboxError) -> Int {
        try withCollection("delete items") { collection, cancellation throws(LockboxError) -> Int in
            let targets = try self.matches(query, in: collection, cancellation)
            guard !targets.isEmpty else {
                try self.ensureUnlocked(collection, cancellation)
                throw LockboxError(.itemNotFound, "No matching item was found in the keychain.")
            }
            for target in targets {
                try Self.translate("delete an item") { () throws(GLibFailure) in
                    try collection.deleteItem(target.path, cancellable: cancellation)
                }
            }
            return targets.count
        }
    }

    private func checkSize(_ data: SecretBytes) throws(LockboxError) {
        guard data.count <= configuration.maximumValueSize else {
            throw LockboxError(
                .param, "The value is \(data.count) bytes; this keychain takes at most \(configuration.maximumValueSize).")
        }
    }

    // MARK: Matching

    struct Match {
        let path: String
        /// The item's Secret Service attributes, as stored.
        let storedAttributes: [String: String]
        let itemClass: ItemClass
        let attributes: ItemAttributes
    }

    /// Stored items of `itemClass` that may share `attributes`' primary key.
    private func candidates(
        _ itemClass: ItemClass, _ attributes: ItemAttributes, in collection: StoredCollection,
        _ cancellation: Cancellation, excluding excluded: String? = nil
    ) throws(LockboxError) -> [Match] {
        var query = Query(itemClass, synchronizable: .any)
        // Search on the key's searchable attributes only; PrimaryKey decides exactly.
        switch itemClass {
        case .genericPassword:
            query.attributes.service = attributes.service
            query.attributes.account = attributes.account
        case .internetPassword:
            query.attributes.server = attributes.server
        case .key, .certificate:
            break
        }
        return try matches(query, in: collection, cancellation, excluding: excluded)
    }

    /// `matches` with the most recently modified first (then the most recently created); the
    /// Secret Service's order otherwise. Its times have whole seconds: copies written within
    /// one second keep the service's order.
    static func newestFirst(_ matches: [Match]) -> [Match] {
        guard matches.count > 1 else { return matches }
        let distantPast = Date(timeIntervalSince1970: 0)
        return matches.enumerated().sorted { left, right in
            let leftTimes = (left.element.attributes.modificationDate ?? distantPast, left.element.attributes.creationDate ?? distantPast)
            let rightTimes = (right.element.attributes.modificationDate ?? distantPast, right.element.attributes.creationDate ?? distantPast)
            if leftTimes != rightTimes { return leftTimes > rightTimes }
            return left.offset < right.offset
        }.map(\.element)
    }

    /// The stored items that match `query` exactly, in the Secret Service's order.
    /// A matching item that is locked is `interactionNotAllowed`.
    private func matches(
        _ query: Query, in collection: StoredCollection, _ cancellation: Cancellation,
        excluding excluded: String? = nil
    ) throws(LockboxError) -> [Match] {
        var seen = Set<String>(excluded.map { [$0] } ?? [])
        var result: [Match] = []
        let persistentPath = query.persistentReference.flatMap { String(data: $0, encoding: .utf8) }
        for search in SecretServiceSchema.searches(for: query.itemClass, query.attributes) {
            let found = try Self.translate("search") { () throws(GLibFailure) in
                try collection.search(search, cancellable: cancellation)
            }
            for path in found {
                guard seen.insert(path).inserted else { continue }
                if let persistentPath, path != persistentPath { continue }
                let properties = try Self.translate("read an item") { () throws(GLibFailure) in
                    try collection.properties(ofItem: path, cancellable: cancellation)
                }
                // Deleted since the search.
                guard let properties else { continue }
                if properties.isLocked {
                    throw LockboxError.locked(
                        "A matching item in the Secret Service is locked. Unlock it in the desktop keyring and try again.")
                }
                guard
                    let (itemClass, decoded) = SecretServiceSchema.decode(
                        properties.attributes, label: properties.label, created: properties.created,
                        modified: properties.modified),
                    itemClass == query.itemClass
                else { continue }
                var attributes = decoded
                // What other tools wrote belongs to the default group, readable while unlocked.
                if attributes.accessGroup == nil { attributes.accessGroup = configuration.defaultAccessGroup }
                if attributes.accessibility == nil { attributes.accessibility = .default }
                guard
                    attributes.matches(query.attributes),
                    query.synchronizable.matches(attributes.synchronizable)
                else { continue }
                result.append(
                    Match(path: path, storedAttributes: properties.attributes, itemClass: itemClass, attributes: attributes))
            }
        }
        return result
    }

    /// Throws `interactionNotAllowed` when the collection is locked. Asked only where no item
    /// answered it: a found item carries its own lock state, which is the collection's.
    func ensureUnlocked(_ collection: StoredCollection, _ cancellation: Cancellation) throws(LockboxError) {
        let locked = try Self.translate("read the keyring's lock state") { () throws(GLibFailure) in
            try collection.isLocked(cancellable: cancellation)
        }
        guard locked else { return }
        let label = collection.label(cancellable: cancellation)
        throw LockboxError.locked(
            "The Secret Service collection \"\(label.isEmpty ? configuration.collection : label)\" is locked. "
                + "Unlock it (log in to the desktop session, or unlock it in Seahorse) and try again.")
    }

    /// Throws the reason the Secret Service cannot be used (no bus, no daemon, no
    /// collection, no answer in time). A locked collection is available: it is just locked.
    public func checkAvailable() throws(LockboxError) {
        do {
            try withCollection("connect to the keyring") { collection, cancellation throws(LockboxError) in
                try self.ensureUnlocked(collection, cancellation)
            }
        } catch LockboxError.interactionNotAllowed {
            return
        }
    }

    // MARK: Plumbing

    /// Runs `body` on the worker with the store's collection.
    ///
    /// The connection and the collection's path are kept between calls: a call costs only
    /// its own D-Bus requests. They are opened again when the bus connection has closed, or
    /// when the collection has vanished (deleted, or an alias that now names another one).
    /// Whether the collection is locked is the body's question (``ensureUnlocked(_:_:)``).
    func withCollection<Result: Sendable>(
        _ what: String,
        _ body: @escaping @Sendable (StoredCollection, Cancellation) throws(LockboxError) -> Result
    ) throws(LockboxError) -> Result {
        let configuration = self.configuration
        // Loaded here, on first use, rather than linked: see LibSecret.
        let library = try loadLibrary()
        guard let address = configuration.busAddress else {
            throw LockboxError(
                .notAvailable,
                "No D-Bus session bus: DBUS_SESSION_BUS_ADDRESS is not set and $XDG_RUNTIME_DIR/bus does not exist. "
                    + "The Secret Service needs a desktop session (or run the program inside `dbus-run-session`), "
                    + "or choose the vault backend.")
        }
        let seconds = Self.describe(configuration.timeout)
        return try worker.perform(
            library: library,
            timeout: configuration.timeout,
            onTimeout: {
                LockboxError(
                    .notAvailable,
                    "The Secret Service did not answer within \(seconds) (while trying to \(what); D-Bus at \(address)). "
                        + "The bus or the keyring daemon is not responding.")
            }
        ) { slot, cancellation throws(LockboxError) in
            if slot?.isClosed == true { slot = nil }
            let connection: SecretServiceConnection
            if let open = slot {
                connection = open
            } else {
                do throws(GLibFailure) {
                    connection = try SecretServiceConnection(library: library, cancellable: cancellation)
                } catch {
                    throw Self.connectionError(error, address: address)
                }
                slot = connection
            }
            var resolvedAgain = false
            while true {
                let collection = try Self.openCollection(configuration.collection, connection, cancellation)
                do throws(LockboxError) {
                    return try body(collection, cancellation)
                } catch {
                    guard collection.vanished else { throw error }
                    connection.collection = nil
                    // An alias may name another collection now. Whatever the body wrote went with
                    // the collection that is gone: run it once more on what the alias names today.
                    if !configuration.collection.hasPrefix("/"), !resolvedAgain {
                        resolvedAgain = true
                        continue
                    }
                    throw LockboxError(.notAvailable, "The Secret Service has no collection at \(collection.path).")
                }
            }
        }
    }

    /// The collection the connection already resolved, or `name` resolved now. Whether it
    /// exists is learnt from the first call on it.
    private static func openCollection(
        _ name: String, _ connection: SecretServiceConnection, _ cancellation: Cancellation
    ) throws(LockboxError) -> StoredCollection {
        if let open = connection.collection { return open }
        let path = try translate("find the keyring") { () throws(GLibFailure) in
            try connection.collectionPath(name, cancellable: cancellation)
        }
        guard let path else {
            throw LockboxError(
                .notAvailable,
                "The Secret Service has no \"\(name)\" collection. Create a login keyring (log in to the desktop, "
                    + "or start gnome-keyring-daemon with --unlock), or name an existing collection.")
        }
        let collection = StoredCollection(connection: connection, path: path)
        connection.collection = collection
        return collection
    }

    static func translate<Result>(
        _ what: String, _ body: () throws(GLibFailure) -> Result
    ) throws(LockboxError) -> Result {
        do {
            return try body()
        } catch {
            throw translateFailure(error, what)
        }
    }

    static func translateFailure(_ failure: GLibFailure, _ what: String) -> LockboxError {
        switch failure.kind {
        case .locked:
            return LockboxError.locked("The Secret Service refused to \(what) because the item or keyring is locked.")
        case .noSuchObject:
            return LockboxError(.itemNotFound, "The item was removed from the Secret Service while trying to \(what).")
        case .serviceUnknown:
            return LockboxError(
                .notAvailable,
                "No Secret Service provider is running on the session bus (install and start gnome-keyring, "
                    + "KeePassXC or KWallet), or choose the vault backend.")
        case .cancelled, .timedOut:
            return LockboxError(.notAvailable, "The Secret Service did not answer in time while trying to \(what).")
        case .connectionRefused, .noSuchFile, .closed:
            return LockboxError(.notAvailable, "The D-Bus session bus went away while trying to \(what): \(failure.message)")
        case .other:
            return LockboxError(.io, "The Secret Service failed to \(what): \(failure.message)")
        }
    }

    private static func connectionError(_ failure: GLibFailure, address: String) -> LockboxError {
        switch failure.kind {
        case .connectionRefused, .noSuchFile:
            return LockboxError(
                .notAvailable,
                "No D-Bus session bus at \(address): \(failure.message). The Secret Service needs a running "
                    + "session bus (a desktop session, or `dbus-run-session`), or choose the vault backend.")
        default:
            return translateFailure(failure, "connect to the D-Bus session bus at \(address)")
        }
    }

    private static func describe(_ duration: Duration) -> String {
        let (seconds, attoseconds) = duration.components
        let milliseconds = seconds * 1000 + attoseconds / 1_000_000_000_000_000
        return milliseconds % 1000 == 0 ? "\(milliseconds / 1000) s" : "\(milliseconds) ms"
    }
}
