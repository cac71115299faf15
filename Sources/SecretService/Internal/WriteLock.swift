#if canImport(Glibc)
import Glibc
#endif
import LockboxCore

/// The per-user lock Lockbox processes hold while they check a primary key and write: the
/// Secret Service has no transactions and no unique constraint, so two processes adding one
/// key could otherwise both search, both find nothing, and both create.
///
/// An `flock` on `$XDG_RUNTIME_DIR/lockbox-secret-service.lock`, else on
/// `/tmp/lockbox-<uid>/secret-service.lock` in a directory that must be the caller's own, mode
/// 0700. The kernel releases it when the holder exits or dies. Other programs do not take it:
/// `SecretServiceStore` checks again after creating (see `withdrawIfDuplicated`).
enum WriteLock {
    /// Runs `body` holding the lock. Waits in short naps rather than in a blocking `flock`, so
    /// a call whose caller gave up (`cancellation`) stops waiting.
    static func holding<Result>(
        _ cancellation: Cancellation, _ body: () throws(LockboxError) -> Result
    ) throws(LockboxError) -> Result {
        let path = try lockFilePath()
        let descriptor = StandardDescriptors.movedAbove(open(path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0o600))
        guard descriptor >= 0 else {
            throw LockboxError(.io, "Cannot open the lock file \(path): \(String(cString: strerror(errno))).")
        }
        // Closing the descriptor releases the lock.
        defer { close(descriptor) }
        var pause: useconds_t = 200
        while flock(descriptor, LOCK_EX | LOCK_NB) != 0 {
            let code = errno
            if code == EINTR { continue }
            guard code == EWOULDBLOCK else {
                throw LockboxError(.io, "Cannot lock \(path): \(String(cString: strerror(code))).")
            }
            if cancellation.isCancelled {
                throw LockboxError(.notAvailable, "Gave up waiting for \(path), which another Lockbox process holds.")
            }
            usleep(pause)
            pause = min(pause * 2, 10_000)
        }
        return try body()
    }

    /// Where the lock file lives; creates the private directory under /tmp when there is no
    /// runtime directory.
    static func lockFilePath() throws(LockboxError) -> String {
        if let runtime = ProcessEnvironment.nonEmpty("XDG_RUNTIME_DIR") {
            return runtime + "/lockbox-secret-service.lock"
        }
        let user = geteuid()
        let directory = "/tmp/lockbox-\(user)"
        if mkdir(directory, 0o700) != 0 && errno != EEXIST {
            throw LockboxError(.io, "Cannot create the directory \(directory): \(String(cString: strerror(errno))).")
        }
        // Another user may have made it first, or put a link there: use it only if it is ours.
        var status = stat()
        guard lstat(directory, &status) == 0 else {
            throw LockboxError(.io, "Cannot read \(directory): \(String(cString: strerror(errno))).")
        }
        guard (status.st_mode & S_IFMT) == S_IFDIR, status.st_uid == user, status.st_mode & 0o077 == 0 else {
            throw LockboxError(
                .io,
                "\(directory) is not a private directory of yours (a directory owned by uid \(user), mode 0700), "
                    + "so Lockbox cannot keep its Secret Service lock there. Remove it, or set XDG_RUNTIME_DIR.")
        }
        return directory + "/secret-service.lock"
    }
}
