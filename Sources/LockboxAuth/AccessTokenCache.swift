import Foundation
import LockboxCore

/// Where access tokens are shared between processes of the same user, in memory only: the
/// kernel keyring in `LockboxAuthKeyring`'s `KernelKeyringTokenCache`. Without one, an access
/// token lives in one ``CredentialsManager``'s memory, and every new process refreshes.
///
/// ``CredentialsManager`` reads the cache before refreshing (and again under the cross-process
/// lock, so a process that waited for another's refresh uses its token), writes it after each
/// refresh and sign-in, and removes the entry on logout, on `invalid_grant` or `invalid_client`,
/// and when a rotated refresh token could not be stored.
///
/// An implementation keeps an entry no longer than ``CachedAccessToken/freshUntil``, never
/// writes it to disk, and lets only the same user read it. Errors are reported, and the manager
/// treats a cache that fails as empty: a failing cache costs a refresh, never a session.
public protocol AccessTokenCache: Sendable {
    /// The session's cached token, or nil.
    func cachedAccessToken(for key: CredentialKey) async throws(LockboxError) -> CachedAccessToken?
    /// Stores `token` for the session, replacing any previous one, until its
    /// ``CachedAccessToken/freshUntil``.
    func storeAccessToken(_ token: CachedAccessToken, for key: CredentialKey) async throws(LockboxError)
    /// Removes the session's entry; no error when there is none.
    func removeAccessToken(for key: CredentialKey) async throws(LockboxError)
}

/// An access token as a cache holds it: the credentials, and until when another process may
/// use them without refreshing.
public struct CachedAccessToken: Sendable, CustomStringConvertible {
    /// The access token, its type, expiry and scope.
    public let credentials: Credentials
    /// The token's expiry minus the refresh leeway (see ``CredentialsManager/refreshLeeway(lifetime:)``).
    public let freshUntil: Date

    /// An entry for `credentials`, usable without a refresh until `freshUntil`.
    public init(credentials: Credentials, freshUntil: Date) {
        self.credentials = credentials
        self.freshUntil = freshUntil
    }

    /// The credentials' description (a fingerprint, never the token) and the freshness limit.
    public var description: String { "CachedAccessToken(\(credentials), freshUntil: \(freshUntil))" }
}
