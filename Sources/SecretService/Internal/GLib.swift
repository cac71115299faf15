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

/// A `GHashTable` of strings, as libsecret takes attributes.
final class AttributeTable {
    let pointer: OpaquePointer
    private let library: LibSecret

    init(_ attributes: [String: String], library: LibSecret) {
        self.library = library
        pointer = library.g_hash_table_new_full(library.g_str_hash, library.g_str_equal, library.g_free, library.g_free)
        for (name, value) in attributes {
            _ = library.g_hash_table_insert(pointer, library.g_strdup(name), library.g_strdup(value))
        }
    }

    /// Takes over a table the caller owns.
    init(taking pointer: OpaquePointer, library: LibSecret) {
        self.pointer = pointer
        self.library = library
    }

    var dictionary: [String: String] {
        var result: [String: String] = [:]
        var iterator = GHashTableIter()
        library.g_hash_table_iter_init(&iterator, pointer)
        var key: UnsafeMutableRawPointer? = nil
        var value: UnsafeMutableRawPointer? = nil
        while library.g_hash_table_iter_next(&iterator, &key, &value) != 0 {
            guard let key, let value else { continue }
            result[String(cString: key.assumingMemoryBound(to: CChar.self))] =
                String(cString: value.assumingMemoryBound(to: CChar.self))
        }
        return result
    }

    deinit {
        library.g_hash_table_unref(pointer)
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
