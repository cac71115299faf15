#if canImport(Glibc)
import Glibc
#endif
import LockboxCore
import Synchronization

/// An exclusive `flock(2)` on `VAULT.sync/GROUP.lock`, held for a whole sync: two processes
/// syncing one vault with one group take turns instead of pushing and pulling the same changes
/// side by side (which is safe, but repeats work). The kernel releases it when its holder dies,
/// so a killed sync never blocks the next one.
package final class SyncLock {
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
        // Made 0600, or narrowed to it, as the directory's other files (a link there is refused).
        try SyncFiles.prepareFile(path)
        let descriptor = StandardDescriptors.movedAbove(open(path, O_RDWR | O_CLOEXEC | O_NOFOLLOW))
        guard descriptor >= 0 else {
            throw LockboxError(
                .io, "Cannot open the sync lock \(path): \(String(cString: strerror(errno))). Fix it (a link there is refused; remove it), then try again.")
        }
        var told = false
        while flock(descriptor, LOCK_EX | LOCK_NB) != 0 {
            if errno == EWOULDBLOCK {
                if !waiting {
                    close(descriptor)
                    return nil
                }
                // Another process holds it: said once (the command line prints it), then waited for.
                if !told, let notice = Self.waitingNotice.withLock({ $0 }) {
                    notice("Waiting for another sync of this keychain to finish (it holds \(path)); a sync stopped with Ctrl-Z holds it until it is resumed or ended.")
                }
                told = true
                if flock(descriptor, LOCK_EX) == 0 { break }
                if errno == EINTR { continue }
            }
            guard errno == EINTR else {
                let code = errno
                close(descriptor)
                throw LockboxError(.io, "Cannot lock \(path) (errno \(code)).")
            }
        }
        self.descriptor = descriptor
    }

    /// Told, once, when a sync waits for another process's; the command line prints it.
    package static let waitingNotice = Mutex<(@Sendable (String) -> Void)?>(nil)

    deinit {
        flock(descriptor, LOCK_UN)
        close(descriptor)
    }
}
