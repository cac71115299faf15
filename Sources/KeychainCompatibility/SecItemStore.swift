#if !canImport(Darwin)
import Lockbox
import Synchronization

/// Where the `SecItem*` functions keep items.
///
/// By default, the keychain `Keychain.open()` chooses (the vault at `LOCKBOX_KEYCHAIN` or
/// `~/.local/share/lockbox/default.lockbox`), opened on first use for the access groups of
/// ``entitlements()`` (docs/SECITEM.md, "Access groups"). Replace it for the whole
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
    private static let declaredEntitlements = Mutex<KeychainEntitlements?>(nil)

    /// Declares the application's identifier and access groups for the keychain this process
    /// opens by default (instead of an entitlements file beside the executable). Takes effect
    /// at the next open: call it before the first `SecItem*` call, or after ``setDefault(_:)``
    /// with nil.
    public static func setEntitlements(_ entitlements: KeychainEntitlements?) {
        declaredEntitlements.withLock { $0 = entitlements }
    }

    /// The entitlements the default keychain is opened with: the declared ones, else the
    /// executable's (``KeychainEntitlements/forMainExecutable()``).
    public static func entitlements() throws(LockboxError) -> KeychainEntitlements? {
        if let declared = declaredEntitlements.withLock({ $0 }) { return declared }
        return try KeychainEntitlements.forMainExecutable()
    }

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
        var options = Keychain.Options()
        if let entitlements = try entitlements() {
            // Declared entitlements that name no group (a file with neither
            // keychain-access-groups nor application-identifier, and no bundle identifier) give
            // no group, as on iOS; read as "no entitlements" they would open every group.
            let groups = entitlements.accessGroups
            guard !groups.isEmpty else {
                throw LockboxError(
                    .missingEntitlement,
                    "The declared entitlements name no keychain access group: add keychain-access-groups or "
                        + "application-identifier to the entitlements file, or a CFBundleIdentifier to Info.plist.")
            }
            options.vault.accessGroups = groups
        }
        let opened = try Keychain.open(options).store
        return processStore.withLock { shared in
            if let store = shared { return store }
            shared = opened
            return opened
        }
    }
}
#endif

#if !canImport(Darwin)
/// An object that can be the value of `kSecUseAuthenticationContext` (LocalAuthentication's
/// `LAContext`) besides Lockbox's own ``AuthenticationContext``.
package protocol SecAuthenticationContextProviding: AnyObject {
    var secItemAuthenticationContext: AuthenticationContext { get }
}

extension SecItemRequest {
    /// `kSecUseAuthenticationContext` as the vault takes it; `kSecUseAuthenticationUIFail`
    /// (or the deprecated `kSecUseNoAuthenticationUI`) forbids asking.
    var lockboxAuthenticationContext: AuthenticationContext? {
        var context = authenticationContext.flatMap(Self.authenticationContext(of:))
        if authenticationUI == kSecUseAuthenticationUIFail || authenticationUI == kSecUseAuthenticationUISkip {
            // A verification the context already holds is still used; nothing new is asked.
            context = context?.withoutInteraction() ?? AuthenticationContext(interactionNotAllowed: true)
        }
        return context
    }
}
#endif
