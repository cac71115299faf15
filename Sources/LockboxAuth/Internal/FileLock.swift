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

    /// Waits for the lock on a thread outside the cooperative pool, for at most `limit`: a
    /// holder that stopped without dying (Ctrl-Z, SIGSTOP, a paused machine) keeps it for as long
    /// as it is stopped, and every other process waited without end and without a word.
    static func acquire(path: String, limit: Duration) async throws(AuthError) -> FileLock {
        try await BlockingCall.run { () throws(AuthError) in try acquireBlocking(path: path, limit: limit).get() }
    }

    private static func acquireBlocking(path: String, limit: Duration) -> Result<FileLock, AuthError> {
        let directory = String(path[..<(path.lastIndex(of: "/") ?? path.endIndex)])
        if !directory.isEmpty, mkdir(directory, 0o700) != 0, errno != EEXIST {
            return .failure(.from(.init(.io, "Cannot create the lock directory \(directory) (errno \(errno)).")))
        }
        let descriptor = StandardDescriptors.movedAbove(open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0o600))
        guard descriptor >= 0 else {
            return .failure(.from(.init(.io, "Cannot open the lock file \(path) (errno \(errno)).")))
        }
        let clock = ContinuousClock()
        let deadline = clock.now.advanced(by: limit)
        var pause = Duration.milliseconds(5)
        while flock(descriptor, LOCK_EX | LOCK_NB) != 0 {
            let code = errno
            if code == EINTR { continue }
            guard code == EWOULDBLOCK else {
                close(descriptor)
                return .failure(.from(.init(.io, "Cannot lock \(path) (errno \(code)).")))
            }
            guard clock.now < deadline else {
                close(descriptor)
                return .failure(
                    .from(
                        .init(
                            .notAvailable,
                            "Another process has held this session's refresh lock (\(path)) for over \(limit.components.seconds) s: it "
                                + "is stopped (Ctrl-Z, a paused machine) or stuck. The stored session is unchanged; resume or end that "
                                + "process, then try again.")))
            }
            // Short waits first (a refresh is usually quick), then a few a second: no CPU to speak of.
            var request = timespec(tv_sec: 0, tv_nsec: Int(pause.components.attoseconds / 1_000_000_000))
            nanosleep(&request, nil)
            pause = min(pause * 2, .milliseconds(200))
        }
        return .success(FileLock(descriptor: descriptor))
    }

    deinit {
        flock(descriptor, LOCK_UN)
        close(descriptor)
    }
}
