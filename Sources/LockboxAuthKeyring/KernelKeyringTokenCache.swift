import Foundation
import KeyProviders
import LockboxAuth
import LockboxCore

/// The shared access-token cache in the Linux kernel keyring: an ``AccessTokenCache`` whose
/// entries are `user` keys in this user's `lockbox` keyring (in `@u`), readable by this user's
/// processes only, never swapped or written to disk, gone at reboot, and timed out by the kernel
/// when the token stops being fresh (its expiry minus the refresh leeway).
///
/// ```swift
/// let manager = CredentialsManager(
///     configuration: configuration, tokenStore: tokenStore, lockDirectory: lockDirectory,
///     accessTokenCache: try KernelKeyringTokenCache(namespace: lockDirectory))
/// ```
///
/// Any process of the same user can read an entry, as it can read the unlocked vault: the
/// cache shares tokens between a user's processes, not with other users (docs/AUTH.md).
public struct KernelKeyringTokenCache: AccessTokenCache {
    /// What separates this cache's entries from those of other keychains: pass the same value
    /// in every process sharing one token store (the CLI uses the keychain's lock directory).
    public let namespace: String
    private let now: @Sendable () -> Date

    /// - Throws: `notAvailable` when this kernel or process has no usable keyring (no keyutils
    ///   support, a seccomp filter): the message names the option that turns the cache off.
    public init(namespace: String, now: @escaping @Sendable () -> Date = { Date() }) throws(LockboxError) {
        guard KernelKeyring.isAvailable else {
            throw LockboxError(
                .notAvailable,
                "The kernel keyring is not available in this process, and the shared access-token cache lives there. Turn the "
                    + "cache off: pass `accessTokenCache: nil` to CredentialsManager, or set LOCKBOX_ACCESS_TOKEN_CACHE=off for "
                    + "the lockbox CLI; access tokens then live in each process's memory.")
        }
        self.namespace = namespace
        self.now = now
    }

    public func cachedAccessToken(for key: CredentialKey) async throws(LockboxError) -> CachedAccessToken? {
        let entry: AccessTokenKeyring.Entry?
        do {
            entry = try AccessTokenKeyring.read(namespace: namespace, identity: key.storageAccount)
        } catch {
            switch error {
            case .missing: return nil
            case .unavailable(let failure): throw Self.error(failure)
            }
        }
        guard let entry else { return nil }
        let credentials = Credentials(
            accessToken: entry.token, tokenType: entry.tokenType, expiresAt: Self.date(entry.expiresAtMilliseconds),
            scope: entry.scope.split(separator: " ").map(String.init))
        return CachedAccessToken(credentials: credentials, freshUntil: Self.date(entry.freshUntilMilliseconds))
    }

    public func storeAccessToken(_ token: CachedAccessToken, for key: CredentialKey) async throws(LockboxError) {
        let remaining = token.freshUntil.timeIntervalSince(now())
        // The kernel counts whole seconds: round down, so the entry never outlives its freshness.
        guard remaining >= 1 else {
            try await removeAccessToken(for: key)
            return
        }
        // A token whose lifetime the server did not give is shared as one that ends with its
        // freshness (the manager shares such a token for a minute).
        let expiresAt = token.credentials.expiresAt ?? token.freshUntil
        let entry = AccessTokenKeyring.Entry(
            token: token.credentials.accessToken, tokenType: token.credentials.tokenType,
            expiresAtMilliseconds: Self.milliseconds(expiresAt), freshUntilMilliseconds: Self.milliseconds(token.freshUntil),
            scope: token.credentials.scope.joined(separator: " "), identity: key.storageAccount)
        do {
            try AccessTokenKeyring.store(entry, namespace: namespace, timeout: UInt32(min(remaining, Double(UInt32.max))))
        } catch {
            throw Self.error(error)
        }
    }

    public func removeAccessToken(for key: CredentialKey) async throws(LockboxError) {
        do {
            try AccessTokenKeyring.remove(namespace: namespace, identity: key.storageAccount)
        } catch {
            throw Self.error(error)
        }
    }

    private static func error(_ failure: KernelKeyring.Failure) -> LockboxError {
        let code: LockboxError.Code = failure.isQuotaExceeded ? .allocate : .notAvailable
        return LockboxError(
            code,
            "The access-token cache in the kernel keyring failed (\(failure.reason))"
                + (failure.isQuotaExceeded ? "; the user's key quota is used up (/proc/sys/kernel/keys/maxkeys, maxbytes)" : "")
                + ". Set LOCKBOX_ACCESS_TOKEN_CACHE=off to do without it.",
            cause: failure.cause)
    }

    private static func milliseconds(_ date: Date) -> Int64 {
        Int64((date.timeIntervalSince1970 * 1000).rounded(.down))
    }

    private static func date(_ milliseconds: Int64) -> Date {
        Date(timeIntervalSince1970: Double(milliseconds) / 1000)
    }
}
