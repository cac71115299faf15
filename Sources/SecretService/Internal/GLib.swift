internal import CLibSecretLoader
import LockboxCore

/// A GObject reference this process owns; dropped in `deinit`.
final class GObjectReference: @unchecked Sendable {
    // Used only on the store's serial queue (see ``SerialWorker``); GObject's reference
    // counting itself is thread-safe, so `deinit` may run anywhere.
    let pointer: OpaquePointer
    let library: LibSecret

    /// Takes over a reference the caller owns (a "transfer full" return value).
    init(taking pointer: OpaquePointer, library: LibSecret) {
        self.pointer = pointer
        self.library = library
    }

    deinit {
        library.g_object_unref(UnsafeMutableRawPointer(pointer))
    }
}

/// A `GCancellable`: the store cancels it when a call outlives its timeout.
final class Cancellation: @unchecked Sendable {
    // GCancellable is documented as thread-safe: cancel from one thread, check from another.
    let pointer: OpaquePointer
    private let library: LibSecret

    init(library: LibSecret) {
        self.library = library
        pointer = library.g_cancellable_new()
    }

    func cancel() {
        library.g_cancellable_cancel(pointer)
    }

    var isCancelled: Bool { library.g_cancellable_is_cancelled(pointer) != 0 }

    deinit {
        library.g_object_unref(UnsafeMutableRawPointer(pointer))
    }
}

/// A `GVariant` this process holds one reference to: the arguments and replies of D-Bus calls.
/// The reference is dropped in `deinit`; a function that keeps the value (a tuple, a call's
/// message) takes its own.
final class VariantValue {
    let pointer: OpaquePointer
    private let library: LibSecret

    /// Takes over a reference the caller owns (a reply, a child value: "transfer full").
    init(owning pointer: OpaquePointer, library: LibSecret) {
        self.pointer = pointer
        self.library = library
    }

    /// Takes over a newly made, floating value by sinking it.
    private init(floating pointer: OpaquePointer, library: LibSecret) {
        self.pointer = library.g_variant_ref_sink(pointer)
        self.library = library
    }

    deinit {
        library.g_variant_unref(UnsafeMutableRawPointer(pointer))
    }

    // MARK: Making values

    static func string(_ value: String, library: LibSecret) -> VariantValue {
        VariantValue(floating: library.g_variant_new_string(value), library: library)
    }

    /// `v`: `value` boxed, as D-Bus property values travel.
    static func boxed(_ value: VariantValue, library: LibSecret) -> VariantValue {
        VariantValue(floating: library.g_variant_new_variant(value.pointer), library: library)
    }

    static func tuple(_ values: [VariantValue], library: LibSecret) -> VariantValue {
        let pointers = values.map(\.pointer)
        let tuple = pointers.withUnsafeBufferPointer { buffer in
            library.g_variant_new_tuple(buffer.baseAddress, buffer.count)
        }
        return withExtendedLifetime(values) { VariantValue(floating: tuple, library: library) }
    }

    /// `a{ss}`: the Secret Service's attribute dictionaries.
    static func stringDictionary(_ dictionary: [String: String], library: LibSecret) -> VariantValue {
        let entries = dictionary.sorted { $0.key < $1.key }.map { name, value in
            let key = string(name, library: library)
            let value = string(value, library: library)
            return VariantValue(floating: library.g_variant_new_dict_entry(key.pointer, value.pointer), library: library)
        }
        let pointers = entries.map(\.pointer)
        let array = "{ss}".withCString { entryType in
            pointers.withUnsafeBufferPointer { buffer in
                library.g_variant_new_array(OpaquePointer(entryType), buffer.baseAddress, buffer.count)
            }
        }
        return withExtendedLifetime(entries) { VariantValue(floating: array, library: library) }
    }

    // MARK: Reading values

    /// The D-Bus type signature, such as `a{sv}`.
    var typeString: String { String(cString: library.g_variant_get_type_string(pointer)) }

    /// The children of a container (tuple, array, dictionary entry).
    var children: [VariantValue] {
        (0..<library.g_variant_n_children(pointer)).map { index in
            VariantValue(owning: library.g_variant_get_child_value(pointer, index), library: library)
        }
    }

    /// The value inside a `v`, or nil when this is not one.
    var unboxed: VariantValue? {
        guard typeString == "v" else { return nil }
        return VariantValue(owning: library.g_variant_get_variant(pointer), library: library)
    }

    /// An `s` or `o` as a string; nil for any other type.
    var string: String? {
        let type = typeString
        guard type == "s" || type == "o" else { return nil }
        return String(cString: library.g_variant_get_string(pointer, nil))
    }

    /// A `b`; nil for any other type.
    var bool: Bool? {
        guard typeString == "b" else { return nil }
        return library.g_variant_get_boolean(pointer) != 0
    }

    /// A `t`; nil for any other type.
    var uint64: UInt64? {
        guard typeString == "t" else { return nil }
        return UInt64(library.g_variant_get_uint64(pointer))
    }

    /// The entries of a dictionary with string keys (`a{sv}`, `a{ss}`), by key; empty for any
    /// other type.
    var entries: [String: VariantValue] {
        guard typeString.hasPrefix("a{s") else { return [:] }
        var result: [String: VariantValue] = [:]
        for entry in children {
            let parts = entry.children
            guard parts.count == 2, let key = parts[0].string else { continue }
            result[key] = parts[1]
        }
        return result
    }

    /// An `a{ss}` as a dictionary; nil for any other type.
    var stringDictionary: [String: String]? {
        guard typeString == "a{ss}" else { return nil }
        return entries.compactMapValues(\.string)
    }

    /// An `ao` as paths; nil for any other type.
    var objectPaths: [String]? {
        guard typeString == "ao" else { return nil }
        return children.compactMap(\.string)
    }
}

/// What a failed GLib call reported, copied out of its `GError` (which is then freed).
struct GLibFailure: Error {
    enum Kind {
        case cancelled
        case timedOut
        case connectionRefused
        case noSuchFile
        case closed
        case serviceUnknown
        case locked
        case noSuchObject
        case other
    }

    let kind: Kind
    let message: String
    let remoteName: String?

    /// Runs `body` with a `GError **`; returns its result, or throws what it reported.
    static func check<Result>(
        _ library: LibSecret, _ body: (UnsafeMutablePointer<UnsafeMutablePointer<GError>?>) -> Result
    ) throws(GLibFailure) -> Result {
        var error: UnsafeMutablePointer<GError>? = nil
        let result = body(&error)
        if let error {
            defer { library.g_error_free(error) }
            throw GLibFailure(error, library: library)
        }
        return result
    }

    init(kind: Kind, message: String) {
        self.kind = kind
        self.message = message
        self.remoteName = nil
    }

    init(_ error: UnsafeMutablePointer<GError>, library: LibSecret) {
        let domain = error.pointee.domain
        let code = error.pointee.code
        var remote: String? = nil
        if let name = library.g_dbus_error_get_remote_error(error) {
            remote = String(cString: name)
            library.g_free(name)
        }
        remoteName = remote
        message = error.pointee.message.map { String(cString: $0) } ?? "unknown error"
        if domain == library.g_io_error_quark() {
            switch GIOErrorEnum(rawValue: UInt32(code)) {
            case G_IO_ERROR_CANCELLED: kind = .cancelled
            case G_IO_ERROR_TIMED_OUT: kind = .timedOut
            case G_IO_ERROR_CONNECTION_REFUSED: kind = .connectionRefused
            case G_IO_ERROR_NOT_FOUND: kind = .noSuchFile
            case G_IO_ERROR_CLOSED, G_IO_ERROR_BROKEN_PIPE, G_IO_ERROR_CONNECTION_CLOSED: kind = .closed
            default: kind = Self.kind(remoteName: remote)
            }
        } else if domain == library.secret_error_get_quark() {
            switch SecretError(rawValue: UInt32(code)) {
            case SECRET_ERROR_IS_LOCKED: kind = .locked
            case SECRET_ERROR_NO_SUCH_OBJECT: kind = .noSuchObject
            default: kind = .other
            }
        } else {
            kind = Self.kind(remoteName: remote)
        }
    }

    private static func kind(remoteName: String?) -> Kind {
        switch remoteName {
        case "org.freedesktop.DBus.Error.ServiceUnknown", "org.freedesktop.DBus.Error.NameHasNoOwner":
            .serviceUnknown
        case "org.freedesktop.Secret.Error.IsLocked": .locked
        case "org.freedesktop.Secret.Error.NoSuchObject", "org.freedesktop.DBus.Error.UnknownMethod",
            "org.freedesktop.DBus.Error.UnknownObject":
            .noSuchObject
        case "org.freedesktop.DBus.Error.NoReply", "org.freedesktop.DBus.Error.Timeout": .timedOut
        default: .other
        }
    }
}
