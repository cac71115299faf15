import LockboxCore

/// A lock that makes refreshes single-flight beyond one process: ``CredentialsManager`` takes
/// it before each refresh, then reads the cached access token and the stored refresh token
/// again, so a token another holder rotated is never presented twice.
///
/// Without one, the manager uses an `flock` on a file in its `lockDirectory` (one machine).
/// `LockboxFleet`'s PostgreSQL advisory lock is one for a fleet of machines.
public protocol RefreshLock: Sendable {
    /// Waits until this caller holds the lock for `key`. The lock is held until the returned
    /// value is released; an implementation must also lose it when its holder dies.
    /// Implementations wait outside Swift's cooperative pool.
    func acquire(for key: CredentialKey) async throws(AuthError) -> any RefreshLockHold
}

/// A held ``RefreshLock``: released when the last reference to it goes away.
public protocol RefreshLockHold: AnyObject, Sendable {
    /// Called by ``CredentialsManager`` with the lock held, just before it presents the stored
    /// refresh token, with the longest its request may take. A lock that can be lost without
    /// its holder knowing (one held by a database connection) checks here that it still holds
    /// it, and records the refresh in flight, so that a holder after it (should it be lost)
    /// waits for the rotated token rather than presenting the same one. The default does
    /// nothing (an `flock` is lost only with its process).
    /// - Throws: when the lock is no longer held: nothing is presented.
    func presenting(within limit: Duration) async throws(AuthError)

    /// Called by ``CredentialsManager`` once the refresh it holds the lock for has ended (its
    /// rotated token stored, or the refresh failed), just before it lets the lock go: a lock
    /// that recorded the refresh in flight ends that record here, so that the next holder does
    /// not wait for it, even when this process exits at once. The default does nothing.
    func ended() async
}

extension RefreshLockHold {
    /// Does nothing: a lock lost only with its holder's process (an `flock`) needs no check.
    public func presenting(within limit: Duration) async throws(AuthError) {}

    /// Does nothing: an `flock` records nothing.
    public func ended() async {}
}

extension FileLock: RefreshLockHold {}
