import LockboxCore

#if canImport(Glibc)
import Glibc
#endif

/// Where `lockboxd` listens, and the checks both sides make of it before trusting it.
public enum BrokerLocation {
    /// `LOCKBOX_BROKER_SOCKET`, else `$XDG_RUNTIME_DIR/lockbox/lockboxd.sock`.
    /// - Throws: `errSecNotAvailable` when neither is set.
    public static func socketPath() throws(LockboxError) -> String {
        if let explicit = ProcessEnvironment.nonEmpty("LOCKBOX_BROKER_SOCKET") { return explicit }
        guard let runtime = ProcessEnvironment.nonEmpty("XDG_RUNTIME_DIR"), runtime.hasPrefix("/") else {
            throw LockboxError(
                .notAvailable,
                "XDG_RUNTIME_DIR is not set, so there is no place for lockboxd's socket. Log in through a session that sets it "
                    + "(systemd-logind does), or set LOCKBOX_BROKER_SOCKET to a path in a private directory.")
        }
        return runtime + "/lockbox/lockboxd.sock"
    }

    /// The lock file `lockboxd` holds while it listens: a socket without its lock held is stale.
    static func lockPath(forSocket path: String) -> String { path + ".lock" }

    static func directory(of path: String) -> String {
        guard let slash = path.lastIndex(of: "/") else { return "." }
        let directory = String(path[..<slash])
        return directory.isEmpty ? "/" : directory
    }

    /// The socket's directory must be this user's and closed to others (0700).
    static func checkDirectory(_ directory: String) throws(LockboxError) {
        var info = stat()
        guard lstat(directory, &info) == 0 else {
            throw LockboxError(
                .notAvailable, "No broker directory at \(directory): lockboxd is not running.", cause: .systemCall("lstat", errno: errno))
        }
        guard info.st_mode & S_IFMT == S_IFDIR else {
            throw LockboxError(.io, "\(directory) is not a directory; remove it, and lockboxd makes its own there.")
        }
        guard info.st_uid == geteuid() else {
            throw LockboxError(
                .io,
                "The broker directory \(directory) belongs to another user (uid \(info.st_uid)): its socket is not trusted. "
                    + "Remove it, or set LOCKBOX_BROKER_SOCKET to a path in a directory of your own.")
        }
        let mode = info.st_mode & 0o777
        guard mode & 0o077 == 0 else {
            throw LockboxError(
                .io,
                "The broker directory \(directory) is open to other users (mode \(String(mode, radix: 8))): another user could "
                    + "replace its socket. Fix it with: chmod 700 '\(directory)'")
        }
    }

    /// The socket must be a socket of this user's, closed to others.
    static func checkSocket(_ path: String) throws(LockboxError) {
        var info = stat()
        guard lstat(path, &info) == 0 else {
            throw LockboxError(.notAvailable, "No broker socket at \(path): lockboxd is not running.", cause: .systemCall("lstat", errno: errno))
        }
        guard info.st_mode & S_IFMT == S_IFSOCK else {
            throw LockboxError(.io, "\(path) is not a socket; remove it, and lockboxd makes its socket there.")
        }
        guard info.st_uid == geteuid() else {
            throw LockboxError(
                .io,
                "The broker socket \(path) belongs to another user (uid \(info.st_uid)); it is not used. "
                    + "Remove it, or set LOCKBOX_BROKER_SOCKET to a path of your own.")
        }
        let mode = info.st_mode & 0o777
        guard mode & 0o077 == 0 else {
            throw LockboxError(
                .io, "The broker socket \(path) is open to other users (mode \(String(mode, radix: 8))). Fix it with: chmod 600 '\(path)'")
        }
    }

    /// Whether a `lockboxd` holds the socket's lock now (false: no broker; its socket is stale).
    public static func isHeld(socket path: String) -> Bool {
        let descriptor = open(lockPath(forSocket: path), O_RDONLY | O_CLOEXEC | O_NOFOLLOW)
        guard descriptor >= 0 else { return false }
        defer { close(descriptor) }
        var result: Int32
        repeat { result = flock(descriptor, LOCK_SH | LOCK_NB) } while result != 0 && errno == EINTR
        return result != 0 && errno == EWOULDBLOCK
    }
}
