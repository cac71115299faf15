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
        try self.init(lockPath: statePath.hasSuffix(".db") ? String(statePath.dropLast(3)) + ".lock" : statePath + ".lock")
    }

    /// Waits until no other process (or thread: each lock is a descriptor of its own) holds
    /// the lock file at `path`, made with its directory when missing.
    init(lockPath path: String) throws(LockboxError) {
        let directory = String(path[..<(path.lastIndex(of: "/") ?? path.startIndex)])
        if !directory.isEmpty && mkdir(directory, 0o700) != 0 && errno != EEXIST {
            throw LockboxError(.io, "Cannot create \(directory) (errno \(errno)). Check its parent's permissions.")
        }
        let descriptor = open(path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0o600)
        guard descriptor >= 0 else { throw LockboxError(.io, "Cannot open the sync lock \(path) (errno \(errno)).") }
        while flock(descriptor, LOCK_EX) != 0 {
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
