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

    static func run<Success: Sendable>(
        _ limit: Duration, _ operation: @escaping @Sendable () async throws -> Success
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
                try await Task.sleep(for: limit)
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
