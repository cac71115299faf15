import Dispatch

/// The async counterparts of an ``ItemStore``'s calls, as GRDB pairs `read` with an async
/// `read`: each runs the store's blocking call on a thread outside Swift's cooperative pool and
/// suspends the caller until it returns, so a SQLite busy wait or a D-Bus round trip never
/// stalls the tasks that share the pool.
///
/// ```swift
/// let token = try await vault.async.data(matching: .genericPassword(service: "api", account: "me"))
/// ```
///
/// Errors are the store's. A task cancelled while its call runs still waits for the call to
/// finish (a store call cannot be interrupted halfway); it is bounded by the store's own
/// timeouts.
public struct AsyncItemStore: Sendable {
    /// The store whose calls this runs.
    public let store: any ItemStore

    /// Async access to `store`: each call runs off Swift's cooperative pool.
    public init(_ store: any ItemStore) {
        self.store = store
    }

    /// ``ItemStore/add(_:)``, off the cooperative pool.
    public func add(_ item: Item) async throws(LockboxError) {
        let store = self.store
        try await BlockingCall.run { () throws(LockboxError) in try store.add(item) }
    }

    /// ``ItemStore/items(matching:)``, off the cooperative pool.
    public func items(matching query: Query) async throws(LockboxError) -> [Item] {
        let store = self.store
        return try await BlockingCall.run { () throws(LockboxError) in try store.items(matching: query) }
    }

    /// ``ItemStore/data(matching:)``, off the cooperative pool.
    public func data(matching query: Query) async throws(LockboxError) -> SecretBytes {
        let store = self.store
        return try await BlockingCall.run { () throws(LockboxError) in try store.data(matching: query) }
    }

    /// ``ItemStore/item(matching:)``, off the cooperative pool.
    public func item(matching query: Query) async throws(LockboxError) -> Item {
        let store = self.store
        return try await BlockingCall.run { () throws(LockboxError) in try store.item(matching: query) }
    }

    /// ``ItemStore/contains(_:)``, off the cooperative pool.
    public func contains(_ query: Query) async throws(LockboxError) -> Bool {
        let store = self.store
        return try await BlockingCall.run { () throws(LockboxError) in try store.contains(query) }
    }

    /// ``ItemStore/update(matching:to:)``, off the cooperative pool.
    public func update(matching query: Query, to update: ItemUpdate) async throws(LockboxError) {
        let store = self.store
        try await BlockingCall.run { () throws(LockboxError) in try store.update(matching: query, to: update) }
    }

    /// ``ItemStore/delete(matching:)``, off the cooperative pool.
    @discardableResult
    public func delete(matching query: Query) async throws(LockboxError) -> Int {
        let store = self.store
        return try await BlockingCall.run { () throws(LockboxError) in try store.delete(matching: query) }
    }
}

extension ItemStore {
    /// This store's async calls, which never block Swift's cooperative thread pool.
    public var async: AsyncItemStore { AsyncItemStore(self) }
}

/// Runs blocking work on a Dispatch queue and suspends the caller until it is done: the one
/// way Lockbox's async APIs call something that may block (a store, `flock`).
package enum BlockingCall {
    private static let queue = DispatchQueue(label: "lockbox.blocking-calls", qos: .userInitiated, attributes: .concurrent)

    package static func run<Success: Sendable, Failure: Error>(
        _ body: @escaping @Sendable () throws(Failure) -> Success
    ) async throws(Failure) -> Success {
        let result: Result<Success, Failure> = await withCheckedContinuation { continuation in
            queue.async {
                do throws(Failure) {
                    continuation.resume(returning: .success(try body()))
                } catch {
                    continuation.resume(returning: .failure(error))
                }
            }
        }
        return try result.get()
    }
}
