import Dispatch
import FoundationEssentials
import LockboxCore
import Synchronization

/// Runs the store's libsecret calls one at a time on a private queue, and stops waiting for
/// one that outlives its deadline.
///
/// libsecret's `*_sync` calls block the calling thread on a D-Bus reply. A bus that accepts
/// a connection and never answers, or a keyring waiting on a prompt no one answers, would
/// hold the caller forever. Here the caller waits at most `timeout`; the late call is then
/// cancelled through its `GCancellable` and its result, whenever it comes, is discarded.
/// Calls queued behind a hung one time out in turn: the wait is bounded either way.
final class SerialWorker: Sendable {
    private let queue = DispatchQueue(label: "lockbox.secret-service")
    // Touched only on `queue`: the open connection, reused between calls.
    private let state: QueueConfined<SecretServiceConnection?>

    init() {
        state = QueueConfined(nil)
    }

    /// Runs `body` on the queue with the current connection slot and a fresh cancellable.
    func perform<Result: Sendable>(
        library: LibSecret,
        timeout: Duration,
        onTimeout: @escaping @Sendable () -> LockboxError,
        _ body: @escaping @Sendable (inout SecretServiceConnection?, Cancellation) throws(LockboxError) -> Result
    ) throws(LockboxError) -> Result {
        let cancellation = Cancellation(library: library)
        let outcome = Mutex<Swift.Result<Result, LockboxError>?>(nil)
        let done = DispatchSemaphore(value: 0)
        let state = self.state
        queue.async {
            // A call whose caller already gave up is not started at all.
            if cancellation.isCancelled {
                done.signal()
                return
            }
            let result: Swift.Result<Result, LockboxError>
            do throws(LockboxError) {
                result = .success(try body(&state.value, cancellation))
            } catch {
                result = .failure(error)
            }
            outcome.withLock { $0 = result }
            done.signal()
        }
        let (seconds, attoseconds) = timeout.components
        let nanoseconds = Int(seconds) * 1_000_000_000 + Int(attoseconds / 1_000_000_000)
        if done.wait(timeout: .now() + .nanoseconds(max(0, nanoseconds))) == .timedOut {
            cancellation.cancel()
            throw onTimeout()
        }
        guard let result = outcome.withLock({ $0 }) else { throw onTimeout() }
        return try result.get()
    }
}

/// A value that only the worker's serial queue reads and writes.
final class QueueConfined<Value>: @unchecked Sendable {
    // Safe because every access happens on SerialWorker's serial queue.
    var value: Value

    init(_ value: Value) {
        self.value = value
    }
}
