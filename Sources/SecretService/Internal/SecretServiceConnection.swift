internal import CLibSecretLoader
import struct Foundation.Date
import LockboxCore

/// A libsecret proxy for the Secret Service on the session bus.
///
/// libsecret reaches the bus through GLib's process-wide session connection (GLib reads
/// `DBUS_SESSION_BUS_ADDRESS`, else `$XDG_RUNTIME_DIR/bus`, once per process). Every method
/// runs on the owning store's serial queue and takes that call's cancellable.
final class SecretServiceConnection {
    private let service: GObjectReference
    private let library: LibSecret

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

    func collection(at path: String, cancellable: Cancellation) throws(GLibFailure) -> StoredCollection {
        let raw = try GLibFailure.check(library) { error in
            library.secret_collection_new_for_dbus_path_sync(
                service.pointer, path, SECRET_COLLECTION_NONE, cancellable.pointer, error)
        }
        guard let raw else { throw GLibFailure(kind: .noSuchObject, message: "no collection at \(path)") }
        return StoredCollection(GObjectReference(taking: raw, library: library))
    }

    /// Creates or replaces the item whose attributes are exactly `attributes`.
    func createItem(
        in collection: StoredCollection, attributes: [String: String], label: String,
        secret: SecretBytes, replacing: Bool, cancellable: Cancellation
    ) throws(GLibFailure) {
        let value = SecretValueReference(secret, library: library)
        let table = AttributeTable(attributes, library: library)
        let flags = replacing ? SECRET_ITEM_CREATE_REPLACE : SECRET_ITEM_CREATE_NONE
        let item = try GLibFailure.check(library) { error in
            library.secret_item_create_sync(
                collection.reference.pointer, nil, table.pointer, label, value.pointer, flags,
                cancellable.pointer, error)
        }
        if let item { library.g_object_unref(UnsafeMutableRawPointer(item)) }
    }
}

/// A collection proxy, with its properties as loaded when it was opened.
final class StoredCollection {
    let reference: GObjectReference
    private var library: LibSecret { reference.library }

    init(_ reference: GObjectReference) {
        self.reference = reference
    }

    var isLocked: Bool { library.secret_collection_get_locked(reference.pointer) != 0 }

    var label: String {
        guard let label = library.secret_collection_get_label(reference.pointer) else { return "" }
        defer { library.g_free(label) }
        return String(cString: label)
    }

    /// Items whose attributes include all of `attributes`, locked ones too.
    func search(_ attributes: [String: String], cancellable: Cancellation) throws(GLibFailure) -> [StoredItem] {
        let table = AttributeTable(attributes, library: library)
        let list = try GLibFailure.check(library) { error in
            library.secret_collection_search_sync(
                reference.pointer, nil, table.pointer, SECRET_SEARCH_ALL, cancellable.pointer, error)
        }
        var items: [StoredItem] = []
        var node = list
        while let current = node {
            if let data = current.pointee.data {
                // The list owns one reference per item: take it over.
                items.append(StoredItem(GObjectReference(taking: OpaquePointer(data), library: library)))
            }
            node = current.pointee.next
        }
        library.g_list_free(list)
        return items
    }
}

/// An item proxy. Attributes, label and dates are its loaded properties; the secret is
/// fetched on demand.
final class StoredItem {
    let reference: GObjectReference
    private var library: LibSecret { reference.library }

    init(_ reference: GObjectReference) {
        self.reference = reference
    }

    var path: String {
        String(cString: library.g_dbus_proxy_get_object_path(reference.pointer))
    }

    var isLocked: Bool { library.secret_item_get_locked(reference.pointer) != 0 }

    var attributes: [String: String] {
        guard let table = library.secret_item_get_attributes(reference.pointer) else { return [:] }
        return AttributeTable(taking: table, library: library).dictionary
    }

    var label: String? {
        guard let label = library.secret_item_get_label(reference.pointer) else { return nil }
        defer { library.g_free(label) }
        return String(cString: label)
    }

    var created: Date? {
        let seconds = library.secret_item_get_created(reference.pointer)
        return seconds == 0 ? nil : Date(timeIntervalSince1970: Double(seconds))
    }

    var modified: Date? {
        let seconds = library.secret_item_get_modified(reference.pointer)
        return seconds == 0 ? nil : Date(timeIntervalSince1970: Double(seconds))
    }

    /// The item's secret, copied straight from libsecret's non-pageable buffer into guarded
    /// memory.
    func loadSecret(cancellable: Cancellation) throws(GLibFailure) -> SecretBytes {
        _ = try GLibFailure.check(library) { error in
            library.secret_item_load_secret_sync(reference.pointer, cancellable.pointer, error)
        }
        guard let value = library.secret_item_get_secret(reference.pointer) else { return .empty }
        defer { library.secret_value_unref(UnsafeMutableRawPointer(value)) }
        var length = 0
        guard let bytes = library.secret_value_get(value, &length), length > 0 else { return .empty }
        return SecretBytes(copying: UnsafeRawBufferPointer(start: bytes, count: length))
    }

    func setAttributes(_ attributes: [String: String], cancellable: Cancellation) throws(GLibFailure) {
        let table = AttributeTable(attributes, library: library)
        _ = try GLibFailure.check(library) { error in
            library.secret_item_set_attributes_sync(reference.pointer, nil, table.pointer, cancellable.pointer, error)
        }
    }

    func setLabel(_ label: String, cancellable: Cancellation) throws(GLibFailure) {
        _ = try GLibFailure.check(library) { error in
            library.secret_item_set_label_sync(reference.pointer, label, cancellable.pointer, error)
        }
    }

    func setSecret(_ secret: SecretBytes, cancellable: Cancellation) throws(GLibFailure) {
        let value = SecretValueReference(secret, library: library)
        _ = try GLibFailure.check(library) { error in
            library.secret_item_set_secret_sync(reference.pointer, value.pointer, cancellable.pointer, error)
        }
    }

    func delete(cancellable: Cancellation) throws(GLibFailure) {
        _ = try GLibFailure.check(library) { error in
            library.secret_item_delete_sync(reference.pointer, cancellable.pointer, error)
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
