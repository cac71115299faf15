internal import CLibSecret
import LockboxCore

/// A GObject reference this process owns; dropped in `deinit`.
final class GObjectReference<Object>: @unchecked Sendable {
    // Used only on the store's serial queue (see ``SerialWorker``); GObject's reference
    // counting itself is thread-safe, so `deinit` may run anywhere.
    let raw: UnsafeMutableRawPointer

    /// Takes over a reference the caller owns (a "transfer full" return value).
    init(taking pointer: UnsafeMutableRawPointer) {
        self.raw = pointer
    }

    /// The object as its C type, for libsecret's typed signatures.
    var pointer: UnsafeMutablePointer<Object> { raw.assumingMemoryBound(to: Object.self) }

    /// The object for GLib signatures that take an opaque (incomplete) type.
    var opaque: OpaquePointer { OpaquePointer(raw) }

    deinit {
        g_object_unref(raw)
    }
}

/// A `GCancellable`: the store cancels it when a call outlives its timeout.
final class Cancellation: @unchecked Sendable {
    // GCancellable is documented as thread-safe: cancel from one thread, check from another.
    let pointer: UnsafeMutablePointer<GCancellable>

    init() {
        pointer = g_cancellable_new()
    }

    func cancel() {
        g_cancellable_cancel(pointer)
    }

    var isCancelled: Bool { g_cancellable_is_cancelled(pointer) != 0 }

    deinit {
        g_object_unref(UnsafeMutableRawPointer(pointer))
    }
}

/// A `GHashTable` of strings, as libsecret takes attributes.
final class AttributeTable {
    let pointer: OpaquePointer

    init(_ attributes: [String: String]) {
        pointer = g_hash_table_new_full(g_str_hash, g_str_equal, g_free, g_free)
        for (name, value) in attributes {
            g_hash_table_insert(pointer, g_strdup(name), g_strdup(value))
        }
    }

    /// Takes over a table the caller owns.
    init(taking pointer: OpaquePointer) {
        self.pointer = pointer
    }

    var dictionary: [String: String] {
        var result: [String: String] = [:]
        var iterator = GHashTableIter()
        g_hash_table_iter_init(&iterator, pointer)
        var key: gpointer? = nil
        var value: gpointer? = nil
        while g_hash_table_iter_next(&iterator, &key, &value) != 0 {
            guard let key, let value else { continue }
            result[String(cString: key.assumingMemoryBound(to: CChar.self))] =
                String(cString: value.assumingMemoryBound(to: CChar.self))
        }
        return result
    }

    deinit {
        g_hash_table_unref(pointer)
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
        _ body: (UnsafeMutablePointer<UnsafeMutablePointer<GError>?>) -> Result
    ) throws(GLibFailure) -> Result {
        var error: UnsafeMutablePointer<GError>? = nil
        let result = body(&error)
        if let error {
            defer { g_error_free(error) }
            throw GLibFailure(error)
        }
        return result
    }

    init(kind: Kind, message: String) {
        self.kind = kind
        self.message = message
        self.remoteName = nil
    }

    init(_ error: UnsafeMutablePointer<GError>) {
        let domain = error.pointee.domain
        let code = error.pointee.code
        var remote: String? = nil
        if let name = g_dbus_error_get_remote_error(error) {
            remote = String(cString: name)
            g_free(name)
        }
        remoteName = remote
        message = error.pointee.message.map { String(cString: $0) } ?? "unknown error"
        if domain == g_io_error_quark() {
            switch GIOErrorEnum(rawValue: UInt32(code)) {
            case G_IO_ERROR_CANCELLED: kind = .cancelled
            case G_IO_ERROR_TIMED_OUT: kind = .timedOut
            case G_IO_ERROR_CONNECTION_REFUSED: kind = .connectionRefused
            case G_IO_ERROR_NOT_FOUND: kind = .noSuchFile
            case G_IO_ERROR_CLOSED, G_IO_ERROR_BROKEN_PIPE, G_IO_ERROR_CONNECTION_CLOSED: kind = .closed
            default: kind = Self.kind(remoteName: remote)
            }
        } else if domain == secret_error_get_quark() {
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
