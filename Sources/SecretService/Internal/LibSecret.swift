internal import CLibSecretLoader
import LockboxCore

/// libsecret's and GLib's functions, through the table `lockbox_libsecret_load` fills the
/// first time the Secret Service is used. Call them by name:
/// `library.secret_item_get_label(item)`.
///
/// Nothing links libsecret: a process that never touches the Secret Service never loads it,
/// and one on a machine without it gets `notAvailable` saying what to install.
@dynamicMemberLookup
struct LibSecret: @unchecked Sendable {
    // The loader fills the table before returning it and never writes or frees it afterwards,
    // so any thread may read it.
    private let table: UnsafePointer<lockbox_libsecret>

    private init(_ table: UnsafePointer<lockbox_libsecret>) {
        self.table = table
    }

    subscript<Function>(dynamicMember function: KeyPath<lockbox_libsecret, Function>) -> Function {
        table.pointee[keyPath: function]
    }

    /// The process's libsecret (`libsecret-1.so.0`), opened on the first call; later calls
    /// return the same table, or the same error.
    /// - Throws: `notAvailable`, naming what is missing and the package to install.
    static func load() throws(LockboxError) -> LibSecret {
        try resolve { error, size in lockbox_libsecret_load(error, size) }
    }

    /// `library` opened on its own, apart from the process's table.
    /// - Throws: `notAvailable`, naming `library` or the function it lacks.
    static func open(_ library: String) throws(LockboxError) -> LibSecret {
        try resolve { error, size in lockbox_libsecret_open(library, error, size) }
    }

    private static func resolve(
        _ load: (UnsafeMutablePointer<CChar>, Int) -> UnsafePointer<lockbox_libsecret>?
    ) throws(LockboxError) -> LibSecret {
        var message = [CChar](repeating: 0, count: 512)
        let table = message.withUnsafeMutableBufferPointer { buffer in
            load(buffer.baseAddress!, buffer.count)
        }
        guard let table else {
            let reason = String(decoding: message.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self)
            throw LockboxError(
                .notAvailable,
                "The Secret Service backend needs libsecret, which could not be loaded (\(reason)). "
                    + "Install it (apt-get install libsecret-1-0), or choose the vault backend.")
        }
        return LibSecret(table)
    }
}
