import LockboxCore

#if canImport(Glibc)
import Glibc
#endif

/// Who may open a vault file: `lockboxd`, alone, or any number of embedded handles.
///
/// A broker keeps the vault's unlocked keys in its own memory; an embedded handle keeps them in
/// the kernel keyring. Both on one file would give two lock states for one vault, so they never
/// share it: the broker holds an exclusive `flock(2)` on `VAULT.broker` for as long as it
/// serves the vault, and every embedded handle of a vault that a broker has served holds a
/// shared one for its life. Whichever comes second is refused with a message naming the other.
/// The lock is on a file of its own, never on the vault file: closing any descriptor of the
/// vault file would drop SQLite's POSIX locks on it.
package final class BrokerClaim: Sendable {
    private let descriptor: Int32
    /// Whether this is the broker's exclusive claim.
    package let isExclusive: Bool

    private init(descriptor: Int32, isExclusive: Bool) {
        self.descriptor = descriptor
        self.isExclusive = isExclusive
    }

    deinit { close(descriptor) }

    /// The lock file beside the vault.
    package static func lockPath(forVault path: String) -> String { path + ".broker" }

    /// The broker's claim: creates the lock file (0600) and takes it exclusively.
    /// - Throws: `errSecNotAvailable` when another broker serves the vault or an embedded handle
    ///   has it open, naming what to do.
    package static func claimForBroker(vaultPath path: String) throws(LockboxError) -> BrokerClaim {
        let lockPath = lockPath(forVault: path)
        let descriptor = open(lockPath, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0o600)
        guard descriptor >= 0 else {
            throw LockboxError(
                .io, "Cannot open \(lockPath): \(String(cString: strerror(errno))).", cause: .systemCall("open", errno: errno))
        }
        guard try lock(descriptor, LOCK_EX | LOCK_NB) else {
            close(descriptor)
            throw LockboxError(
                .notAvailable,
                "The keychain \(path) is in use by another lockboxd or by a program that opened it directly (embedded mode). "
                    + "Stop that program, or use the running broker (LOCKBOX_BROKER=1), then start lockboxd again.")
        }
        return BrokerClaim(descriptor: descriptor, isExclusive: true)
    }

    /// An embedded handle's claim: nil when no broker ever served this vault (no lock file).
    /// - Throws: `errSecNotAvailable` while `lockboxd` serves the vault.
    static func claimForEmbedded(vaultPath path: String) throws(LockboxError) -> BrokerClaim? {
        let descriptor = open(lockPath(forVault: path), O_RDONLY | O_CLOEXEC | O_NOFOLLOW)
        guard descriptor >= 0 else { return nil }
        guard try lock(descriptor, LOCK_SH | LOCK_NB) else {
            close(descriptor)
            throw LockboxError(
                .notAvailable,
                "lockboxd serves the keychain \(path): its keys are in the broker's memory, so it is not opened directly here. "
                    + "Use it through the broker (set LOCKBOX_BROKER=1, or Keychain.Options.backend = .broker), "
                    + "or stop lockboxd (`lockbox status` with LOCKBOX_BROKER=1 shows its pid).")
        }
        return BrokerClaim(descriptor: descriptor, isExclusive: false)
    }

    /// Whether a `lockboxd` holds the vault's exclusive claim now.
    package static func isServedByBroker(vaultPath path: String) -> Bool {
        let descriptor = open(lockPath(forVault: path), O_RDONLY | O_CLOEXEC | O_NOFOLLOW)
        guard descriptor >= 0 else { return false }
        defer { close(descriptor) }
        return (try? lock(descriptor, LOCK_SH | LOCK_NB)) == false
    }

    /// Takes `operation`; false when another process holds a conflicting lock.
    private static func lock(_ descriptor: Int32, _ operation: Int32) throws(LockboxError) -> Bool {
        while flock(descriptor, operation) != 0 {
            switch errno {
            case EINTR: continue
            case EWOULDBLOCK: return false
            default:
                throw LockboxError(
                    .io, "Cannot lock the keychain's broker file: \(String(cString: strerror(errno))).",
                    cause: .systemCall("flock", errno: errno))
            }
        }
        return true
    }
}
