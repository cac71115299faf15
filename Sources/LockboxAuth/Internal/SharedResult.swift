import Synchronization

/// Waits for a shared task's result, but lets the waiter leave early when its own task is
/// cancelled, without cancelling the shared task (awaiting `Task.value` would keep a cancelled
/// caller waiting; cancelling the shared task would fail everyone else).
enum SharedResult {
    static func wait<Success: Sendable>(for task: Task<Success, any Error>) async -> Result<Success, any Error> {
        let gate = OnceContinuation<Result<Success, any Error>>()
        return await withTaskCancellationHandler {
            await withCheckedContinuation { continuation in
                gate.install(continuation)
                Task {
                    let result = await task.result
                    gate.resume(with: result)
                }
            }
        } onCancel: {
            gate.resume(with: .failure(CancellationError()))
        }
    }
}

/// Resumes a continuation exactly once, with whichever value comes first, also when a value
/// arrives before the continuation is installed.
final class OnceContinuation<Value: Sendable>: Sendable {
    private enum State {
        case waiting
        case installed(CheckedContinuation<Value, Never>)
        case resolvedEarly(Value)
        case finished
    }

    private let state = Mutex<State>(.waiting)

    func install(_ continuation: CheckedContinuation<Value, Never>) {
        let early: Value? = state.withLock { state in
            switch state {
            case .waiting:
                state = .installed(continuation)
                return nil
            case .resolvedEarly(let value):
                state = .finished
                return value
            case .installed, .finished:
                preconditionFailure("OnceContinuation installed twice")
            }
        }
        if let early { continuation.resume(returning: early) }
    }

    func resume(with value: Value) {
        let continuation: CheckedContinuation<Value, Never>? = state.withLock { state in
            switch state {
            case .waiting:
                state = .resolvedEarly(value)
                return nil
            case .installed(let continuation):
                state = .finished
                return continuation
            case .resolvedEarly, .finished:
                return nil
            }
        }
        continuation?.resume(returning: value)
    }
}

/// Runs an operation with a total deadline. The caller gets control back when the deadline
/// passes even if the operation ignores cancellation (it is cancelled, not awaited).
enum Deadline {
    enum Outcome<Success: Sendable>: Sendable {
        case finished(Result<Success, any Error>)
        case expired
        case cancelled
    }

    /// How long the operation is still given when the deadline's timer woke up well after the
    /// deadline (``pauseThreshold`` or more): the process was stopped meanwhile (SIGSTOP, a
    /// paused virtual machine, heavy swapping), and an answer that arrived while it was may be
    /// waiting in its socket. Taking the request as failed would throw away a token response
    /// the server has already answered (for a rotated refresh token: the next request presents
    /// the used-up one, which the server takes for reuse and revokes the session).
    static let pausedGrace: Duration = .seconds(2)
    static let pauseThreshold: Duration = .seconds(1)

    /// - Parameter sleep: how the timer waits (a test stands in a timer woken late, as a
    ///   stopped process's is).
    static func run<Success: Sendable>(
        _ limit: Duration, sleep: @escaping @Sendable (Duration) async throws -> Void = { try await Task.sleep(for: $0) },
        _ operation: @escaping @Sendable () async throws -> Success
    ) async -> Outcome<Success> {
        let gate = OnceContinuation<Outcome<Success>>()
        let work = Task {
            do {
                gate.resume(with: .finished(.success(try await operation())))
            } catch {
                gate.resume(with: .finished(.failure(error)))
            }
        }
        let timer = Task {
            do {
                let start = ContinuousClock.now
                try await sleep(limit)
                // Woken late: the process was not running at the deadline. What the operation
                // can finish now (an answer already received) it is given the time to.
                if ContinuousClock.now - start >= limit + pauseThreshold { try await Task.sleep(for: pausedGrace) }
                gate.resume(with: .expired)
            } catch {}
        }
        let outcome = await withTaskCancellationHandler {
            await withCheckedContinuation { gate.install($0) }
        } onCancel: {
            gate.resume(with: .cancelled)
        }
        timer.cancel()
        if case .finished = outcome {} else { work.cancel() }
        return outcome
    }
}
