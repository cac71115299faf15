internal import CLibSecretLoader
import struct Foundation.Date
import LockboxCore

/// A libsecret proxy for the Secret Service on the session bus, and the open collection.
///
/// libsecret reaches the bus through GLib's process-wide session connection (GLib reads
/// `DBUS_SESSION_BUS_ADDRESS`, else `$XDG_RUNTIME_DIR/bus`, once per process). The store keeps
/// one connection, and the collection it resolved, until the bus connection closes. Every
/// method runs on the owning store's serial queue and takes that call's cancellable.
final class SecretServiceConnection {
    /// The bus name every Secret Service provider owns.
    static let busName = "org.freedesktop.secrets"

    fileprivate let service: GObjectReference
    fileprivate let library: LibSecret
    /// The collection the store works in, once resolved; dropped when it vanishes.
    var collection: StoredCollection?

    init(library: LibSecret, cancellable: Cancellation) throws(GLibFailure) {
        self.library = library
        let raw = try GLibFailure.check(library) { error in
            library.secret_service_open_sync(
                library.secret_service_get_type(), nil, SECRET_SERVICE_NONE, cancellable.pointer, error)
        }
        guard let raw else {
            throw GLibFailure(kind: .other, message: "could not open the Secret Service")
        }
        service = GObjectReference(taking: raw, library: library)
        // GLib's shared session connection exits the process when the bus goes away; a
        // keychain library must report that as an error instead.
        if let connection = library.g_dbus_proxy_get_connection(service.pointer) {
            library.g_dbus_connection_set_exit_on_close(connection, 0)
        }
    }

    var isClosed: Bool {
        guard let connection = library.g_dbus_proxy_get_connection(service.pointer) else {
            return true
        }
        return library.g_dbus_connection_is_closed(connection) != 0
    }

    /// The object path of `collection`: an alias (`default`, `login`, `session`) is resolved;
    /// a path is returned as it is. Nil when the alias is not set.
    func collectionPath(_ collection: String, cancellable: Cancellation) throws(GLibFailure) -> String? {
        if collection.hasPrefix("/") { return collection }
        let path = try GLibFailure.check(library) { error in
            library.secret_service_read_alias_dbus_path_sync(service.pointer, collection, cancellable.pointer, error)
        }
        guard let path else { return nil }
        defer { library.g_free(path) }
        return String(cString: path)
    }

    /// One D-Bus method call to the Secret Service, straight on the bus connection: no proxy
    /// object, no signal subscription. The reply's type is checked against `replyType`.
    fileprivate func call(
        _ path: String, _ interface: String, _ method: String, _ arguments: [VariantValue],
        replyType: StaticString, cancellable: Cancellation
    ) throws(GLibFailure) -> VariantValue {
        guard let connection = library.g_dbus_proxy_get_connection(service.pointer) else {
            throw GLibFailure(kind: .closed, message: "the D-Bus connection is gone")
        }
        let parameters = VariantValue.tuple(arguments, library: library)
        // G_VARIANT_TYPE("...") is the type string's address, cast.
        let type = OpaquePointer(replyType.utf8Start)
        let reply = try GLibFailure.check(library) { error in
            library.g_dbus_connection_call_sync(
                connection, Self.busName, path, interface, method, parameters.pointer, type,
                G_DBUS_CALL_FLAGS_NONE, -1, cancellable.pointer, error)
        }
        guard let reply else { throw GLibFailure(kind: .other, message: "\(method) returned nothing") }
        return VariantValue(owning: reply, library: library)
    }

    fileprivate func property(
        _ name: String, of path: String, interface: String, cancellable: Cancellation
    ) throws(GLibFailure) -> VariantValue? {
        let reply = try call(
            path, "org.freedesktop.DBus.Properties", "Get",
            [.string(interface, library: library), .string(name, library: library)],
            replyType: "(v)", cancellable: cancellable)
        return reply.children.first?.unboxed
    }

    fileprivate func setProperty(
        _ name: String, of path: String, interface: String, to value: VariantValue, cancellable: Cancellation
    ) throws(GLibFailure) {
        _ = try call(
            path, "org.freedesktop.DBus.Properties", "Set",
            [.string(interface, library: library), .string(name, library: library), .boxed(value, library: library)],
            replyType: "()", cancellable: cancellable)
    }
}

/// What the Secret Service says about one item: its properties, read in one call.
struct ItemProperties {
    let path: String
    let isLocked: Bool
    let attributes: [String: String]
    let label: String?
    let created: Date?
    let modified: Date?
}

/// A collection, addressed by its object path. There is no proxy and nothing cached: every
/// question is one D-Bus call answered as the collection is now, so a collection that another
/// client locked or deleted is noticed by the next call.
final class StoredCollection {
    private static let collectionInterface = "org.freedesktop.Secret.Collection"
    private static let itemInterface = "org.freedesktop.Secret.Item"

    let connection: SecretServiceConnection
    let path: String
    /// Set when a call found no collection at `path`: the store then resolves it again.
    private(set) var vanished = false
    private var library: LibSecret { connection.library }

    init(connection: SecretServiceConnection, path: String) {
        self.connection = connection
        self.path = path
    }

    /// Runs a call on the collection itself, noting when the collection is gone.
    private func onCollection<Result>(_ body: () throws(GLibFailure) -> Result) throws(GLibFailure) -> Result {
        do {
            return try body()
        } catch {
            if error.kind == .noSuchObject { vanished = true }
            throw error
        }
    }

    /// The collection's `Locked` property, as it is now.
    func isLocked(cancellable: Cancellation) throws(GLibFailure) -> Bool {
        try onCollection { () throws(GLibFailure) in
            let value = try connection.property("Locked", of: path, interface: Self.collectionInterface, cancellable: cancellable)
            guard let locked = value?.bool else {
                throw GLibFailure(kind: .other, message: "the collection's Locked property is not a boolean")
            }
            return locked
        }
    }

    /// The collection's label, for messages; empty when it cannot be read.
    func label(cancellable: Cancellation) -> String {
        let value = try? connection.property("Label", of: path, interface: Self.collectionInterface, cancellable: cancellable)
        return value?.string ?? ""
    }

    /// The paths of items whose attributes include all of `attributes`, locked ones too.
    func search(_ attributes: [String: String], cancellable: Cancellation) throws(GLibFailure) -> [String] {
        try onCollection { () throws(GLibFailure) in
            let reply = try connection.call(
                path, Self.collectionInterface, "SearchItems", [.stringDictionary(attributes, library: library)],
                replyType: "(ao)", cancellable: cancellable)
            return reply.children.first?.objectPaths ?? []
        }
    }

    /// An item's properties; nil when the item no longer exists.
    func properties(ofItem item: String, cancellable: Cancellation) throws(GLibFailure) -> ItemProperties? {
        let reply: VariantValue
        do {
            reply = try connection.call(
                item, "org.freedesktop.DBus.Properties", "GetAll", [.string(Self.itemInterface, library: library)],
                replyType: "(a{sv})", cancellable: cancellable)
        } catch where error.kind == .noSuchObject {
            return nil
        }
        let properties = reply.children.first?.entries ?? [:]
        // gnome-keyring answers an item that was just deleted with no properties at all.
        guard let locked = properties["Locked"]?.unboxed?.bool else { return nil }
        func date(_ name: String) -> Date? {
            guard let seconds = properties[name]?.unboxed?.uint64, seconds > 0 else { return nil }
            return Date(timeIntervalSince1970: Double(seconds))
        }
        return ItemProperties(
            path: item, isLocked: locked,
            attributes: properties["Attributes"]?.unboxed?.stringDictionary ?? [:],
            label: properties["Label"]?.unboxed?.string,
            created: date("Created"), modified: date("Modified"))
    }

    /// The secrets of `items`, in one call, copied straight from libsecret's non-pageable
    /// buffers into guarded memory. An item the service returns no secret for (locked or
    /// removed meanwhile) is a `locked` failure: its secret is not readable.
    func secrets(ofItems items: [String], cancellable: Cancellation) throws(GLibFailure) -> [String: SecretBytes] {
        guard !items.isEmpty else { return [:] }
        let library = self.library
        let paths: [UnsafeMutablePointer<CChar>?] = items.map { library.g_strdup($0) } + [nil]
        defer { for path in paths { library.g_free(path) } }
        let table = try GLibFailure.check(library) { error in
            paths.withUnsafeBufferPointer { buffer in
                buffer.baseAddress!.withMemoryRebound(to: UnsafePointer<CChar>?.self, capacity: buffer.count) { array in
                    library.secret_service_get_secrets_for_dbus_paths_sync(
                        connection.service.pointer, array, cancellable.pointer, error)
                }
            }
        }
        guard let table else { throw GLibFailure(kind: .other, message: "GetSecrets returned nothing") }
        defer { library.g_hash_table_unref(table) }
        var result: [String: SecretBytes] = [:]
        for item in items {
            guard let value = library.g_hash_table_lookup(table, item) else {
                throw GLibFailure(kind: .locked, message: "no secret was returned for \(item)")
            }
            var length = 0
            if let bytes = library.secret_value_get(OpaquePointer(value), &length), length > 0 {
                result[item] = SecretBytes(copying: UnsafeRawBufferPointer(start: bytes, count: length))
            } else {
                result[item] = .empty
            }
        }
        return result
    }

    /// Creates an item (or, `replacing`, replaces the one whose attributes are exactly
    /// `attributes`); returns its path.
    func createItem(
        attributes: [String: String], label: String, secret: SecretBytes, replacing: Bool, cancellable: Cancellation
    ) throws(GLibFailure) -> String {
        let library = self.library
        let value = SecretValueReference(secret, library: library)
        let properties = library.g_hash_table_new_full(library.g_str_hash, library.g_str_equal, library.g_free, library.g_variant_unref)
        defer { library.g_hash_table_unref(properties) }
        let labelValue = VariantValue.string(label, library: library)
        let attributesValue = VariantValue.stringDictionary(attributes, library: library)
        _ = library.g_hash_table_insert(
            properties, library.g_strdup("\(Self.itemInterface).Label"),
            UnsafeMutableRawPointer(library.g_variant_ref(labelValue.pointer)))
        _ = library.g_hash_table_insert(
            properties, library.g_strdup("\(Self.itemInterface).Attributes"),
            UnsafeMutableRawPointer(library.g_variant_ref(attributesValue.pointer)))
        let flags = replacing ? SECRET_ITEM_CREATE_REPLACE : SECRET_ITEM_CREATE_NONE
        let service = connection.service.pointer
        let created = try onCollection { () throws(GLibFailure) in
            try Self.create(library, service, path, properties, value.pointer, flags, cancellable)
        }
        guard let created else { throw GLibFailure(kind: .other, message: "CreateItem returned no item") }
        defer { library.g_free(created) }
        return String(cString: created)
    }

    private static func create(
        _ library: LibSecret, _ service: OpaquePointer, _ path: String, _ properties: OpaquePointer,
        _ value: OpaquePointer, _ flags: SecretItemCreateFlags, _ cancellable: Cancellation
    ) throws(GLibFailure) -> UnsafeMutablePointer<CChar>? {
        try GLibFailure.check(library) { error in
            library.secret_service_create_item_dbus_path_sync(
                service, path, properties, value, flags, cancellable.pointer, error)
        }
    }

    func deleteItem(_ item: String, cancellable: Cancellation) throws(GLibFailure) {
        _ = try GLibFailure.check(library) { error in
            library.secret_service_delete_item_dbus_path_sync(connection.service.pointer, item, cancellable.pointer, error)
        }
    }

    func setAttributes(_ attributes: [String: String], ofItem item: String, cancellable: Cancellation) throws(GLibFailure) {
        try connection.setProperty(
            "Attributes", of: item, interface: Self.itemInterface,
            to: .stringDictionary(attributes, library: library), cancellable: cancellable)
    }

    func setLabel(_ label: String, ofItem item: String, cancellable: Cancellation) throws(GLibFailure) {
        try connection.setProperty(
            "Label", of: item, interface: Self.itemInterface, to: .string(label, library: library), cancellable: cancellable)
    }

    /// Replaces an item's secret through a libsecret item proxy, which encrypts it for the
    /// session.
    func setSecret(_ secret: SecretBytes, ofItem item: String, cancellable: Cancellation) throws(GLibFailure) {
        let library = self.library
        let raw = try GLibFailure.check(library) { error in
            library.secret_item_new_for_dbus_path_sync(
                connection.service.pointer, item, SECRET_ITEM_NONE, cancellable.pointer, error)
        }
        guard let raw else { throw GLibFailure(kind: .noSuchObject, message: "no item at \(item)") }
        let proxy = GObjectReference(taking: raw, library: library)
        let value = SecretValueReference(secret, library: library)
        _ = try GLibFailure.check(library) { error in
            library.secret_item_set_secret_sync(proxy.pointer, value.pointer, cancellable.pointer, error)
        }
    }
}

/// A `SecretValue` (libsecret keeps its bytes in non-pageable memory and wipes them).
final class SecretValueReference {
    let pointer: OpaquePointer
    private let library: LibSecret

    init(_ secret: SecretBytes, library: LibSecret) {
        self.library = library
        // Text when it is UTF-8 (what keyring and secret-tool expect to read back), else bytes.
        let isText = secret.withUnsafeBytes { String(validating: $0, as: UTF8.self) != nil }
        let contentType = isText ? "text/plain" : "application/octet-stream"
        pointer = secret.withUnsafeBytes { bytes in
            if let base = bytes.baseAddress, bytes.count > 0 {
                return library.secret_value_new(base.assumingMemoryBound(to: CChar.self), bytes.count, contentType)
            }
            return library.secret_value_new("", 0, contentType)
        }
    }

    deinit {
        library.secret_value_unref(UnsafeMutableRawPointer(pointer))
    }
}
