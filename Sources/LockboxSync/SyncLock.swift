#if canImport(Glibc)
import Glibc
#endif
import LockboxCore

/// An exclusive `flock(2)` on `VAULT.sync/GROUP.lock`, held for a whole sync: two processes
/// syncing one vault with one group take turns instead of pushing and pulling the same changes
/// side by side (which is safe, but repeats work). The kernel releases it when its holder dies,
/// so a killed sync never blocks the next one.
final class SyncLock {
    private let descriptor: Int32

    /// Waits until no other process holds the lock of the state at `statePath`.
    convenience init(statePath: String) throws(LockboxError) {
        try self.init(lockPath: Self.lockPath(statePath))!
    }

    /// The lock of the state at `statePath` when no other process holds it; nil at once when
    /// one does (``SyncGroup/status()`` does not wait for a sync).
    static func ifFree(statePath: String) throws(LockboxError) -> SyncLock? {
        try SyncLock(lockPath: lockPath(statePath), waiting: false)
    }

    private static func lockPath(_ statePath: String) -> String {
        statePath.hasSuffix(".db") ? String(statePath.dropLast(3)) + ".lock" : statePath + ".lock"
    }

    /// Waits until no other process (or thread: each lock is a descriptor of its own) holds
    /// the lock file at `path`, made with its directory when missing; without `waiting`, nil
    /// when one does.
    init?(lockPath path: String, waiting: Bool = true) throws(LockboxError) {
        let directory = String(path[..<(path.lastIndex(of: "/") ?? path.startIndex)])
        if !directory.isEmpty { try SyncFiles.prepareDirectory(directory) }
        let descriptor = open(path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0o600)
        guard descriptor >= 0 else { throw LockboxError(.io, "Cannot open the sync lock \(path) (errno \(errno)).") }
        while flock(descriptor, waiting ? LOCK_EX : LOCK_EX | LOCK_NB) != 0 {
            if !waiting && errno == EWOULDBLOCK {
                close(descriptor)
                return nil
            }
            guard errno == EINTR else {
                let code = errno
                close(descriptor)
                throw LockboxError(.io, "Cannot lock \(path) (errno \(code)).")
            }
        }
        self.descriptor = descriptor
    }

    deinit {
        flock(descriptor, LOCK_UN)
        close(descriptor)
    }
}
