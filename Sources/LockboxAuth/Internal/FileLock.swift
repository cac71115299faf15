#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif
import LockboxCore

/// An exclusive `flock` on a lock file: single flight across processes sharing one vault.
/// The kernel releases it when the holder dies, so a crashed process never blocks the others.
final class FileLock: Sendable {
    private let descriptor: Int32

    private init(descriptor: Int32) {
        self.descriptor = descriptor
    }

    /// Waits for the lock on a thread outside the cooperative pool (flock blocks).
    static func acquire(path: String) async throws(AuthError) -> FileLock {
        try await BlockingCall.run { () throws(AuthError) in try acquireBlocking(path: path).get() }
    }

    private static func acquireBlocking(path: String) -> Result<FileLock, AuthError> {
        let directory = String(path[..<(path.lastIndex(of: "/") ?? path.endIndex)])
        if !directory.isEmpty, mkdir(directory, 0o700) != 0, errno != EEXIST {
            return .failure(.from(.init(.io, "Cannot create the lock directory \(directory) (errno \(errno)).")))
        }
        let descriptor = StandardDescriptors.movedAbove(open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0o600))
        guard descriptor >= 0 else {
            return .failure(.from(.init(.io, "Cannot open the lock file \(path) (errno \(errno)).")))
        }
        while flock(descriptor, LOCK_EX) != 0 {
            if errno == EINTR { continue }
            let code = errno
            close(descriptor)
            return .failure(.from(.init(.io, "Cannot lock \(path) (errno \(code)).")))
        }
        return .success(FileLock(descriptor: descriptor))
    }

    deinit {
        flock(descriptor, LOCK_UN)
        close(descriptor)
    }
}
