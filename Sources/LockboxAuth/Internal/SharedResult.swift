import Synchronization

/// Waits for a shared task's result, but lets the waiter leave early when its own task is
/// cancelled, without cancelling the shared task (awaiting `Task.value` would keep a cancelled
/// caller waiting; cancelling the shared task would fail everyone else).
enum SharedResult {
    static func wait<Success: Sendable>(for task: Task<Success, any Error>) async -> Result<Success, any Error> {
        let gate = Gate<Success>()
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

    /// Resumes a continuation exactly once, whichever of "done" and "cancelled" comes first,
    /// also when cancellation arrives before the continuation is installed.
    private final class Gate<Success: Sendable>: Sendable {
        private enum State {
            case waiting
            case installed(CheckedContinuation<Result<Success, any Error>, Never>)
            case resolvedEarly(Result<Success, any Error>)
            case finished
        }

        private let state = Mutex<State>(.waiting)

        func install(_ continuation: CheckedContinuation<Result<Success, any Error>, Never>) {
            let early: Result<Success, any Error>? = state.withLock { state in
                switch state {
                case .waiting:
                    state = .installed(continuation)
                    return nil
                case .resolvedEarly(let result):
                    state = .finished
                    return result
                case .installed, .finished:
                    preconditionFailure("SharedResult.Gate installed twice")
                }
            }
            if let early { continuation.resume(returning: early) }
        }

        func resume(with result: Result<Success, any Error>) {
            let continuation: CheckedContinuation<Result<Success, any Error>, Never>? = state.withLock { state in
                switch state {
                case .waiting:
                    state = .resolvedEarly(result)
                    return nil
                case .installed(let continuation):
                    state = .finished
                    return continuation
                case .resolvedEarly, .finished:
                    return nil
                }
            }
            continuation?.resume(returning: result)
        }
    }
}
