#if !canImport(Security)
import Lockbox
import Synchronization

/// Where the `SecItem*` functions keep items.
///
/// By default, the keychain `Keychain.open()` chooses (the vault at `LOCKBOX_KEYCHAIN` or
/// `~/.local/share/lockbox/default.lockbox`), opened on first use. Replace it for the whole
/// process with ``setDefault(_:)``, or for one task and everything it calls with
/// ``withStore(_:operation:)``: any ``ItemStore`` works.
///
/// ```swift
/// let vault = try Vault.open(at: path)
/// SecItemStore.setDefault(vault)
/// let status = SecItemAdd(query as CFDictionary, nil)
/// ```
public enum SecItemStore {
    @TaskLocal private static var taskStore: (any ItemStore)?
    private static let processStore = Mutex<(any ItemStore)?>(nil)

    /// Makes `store` the one every `SecItem*` call in this process uses (outside
    /// ``withStore(_:operation:)``). Pass nil to return to `Keychain.open()`'s choice.
    public static func setDefault(_ store: (any ItemStore)?) {
        processStore.withLock { $0 = store }
    }

    /// Runs `operation` with `SecItem*` calls going to `store`, in this task and the tasks it
    /// creates. Tests use this to give each test its own vault.
    public static func withStore<Result>(
        _ store: any ItemStore, operation: () throws -> Result
    ) rethrows -> Result {
        try $taskStore.withValue(store, operation: operation)
    }

    /// The asynchronous form of ``withStore(_:operation:)``.
    public static func withStore<Result>(
        _ store: any ItemStore, isolation: isolated (any Actor)? = #isolation,
        operation: () async throws -> Result
    ) async rethrows -> Result {
        try await $taskStore.withValue(store, operation: operation)
    }

    /// The store the next `SecItem*` call will use, opening the default keychain if needed.
    /// - Throws: The error `Keychain.open()` gives when there is no usable keychain.
    public static func current() throws(LockboxError) -> any ItemStore {
        if let store = taskStore { return store }
        if let store = processStore.withLock({ $0 }) { return store }
        let opened = try Keychain.open().store
        return processStore.withLock { shared in
            if let store = shared { return store }
            shared = opened
            return opened
        }
    }
}
#endif
