#if canImport(Glibc)
import Glibc
#endif

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

/// Runs blocking work on a thread of Lockbox's own and suspends the caller until it is done:
/// the one way Lockbox's async APIs call something that may block (a store, `flock`).
package enum BlockingCall {
    /// Marks the threads blocking calls run on (a thread-specific value; no name API of
    /// pthreads is visible to Swift here).
    static let marker: pthread_key_t = {
        var key = pthread_key_t()
        precondition(pthread_key_create(&key, nil) == 0, "BlockingCall: pthread_key_create failed")
        return key
    }()

    /// Whether the calling thread is one of the threads blocking calls run on.
    package static var isOnBlockingThread: Bool { pthread_getspecific(marker) != nil }

    package static func run<Success: Sendable, Failure: Error>(
        _ body: @escaping @Sendable () throws(Failure) -> Success
    ) async throws(Failure) -> Success {
        let result: Result<Success, Failure> = await withCheckedContinuation { continuation in
            BlockingThreads.shared.submit {
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

/// Threads for blocking calls: an idle one takes each job, or a new one is started, so a call
/// never waits for another call to stop blocking. Dispatch's concurrent queues on Linux share
/// a pool sized to the processors, which grows only when a monitor notices it stalled (under a
/// busy machine, minutes later): blocked store calls could hold back each other and Swift's
/// cooperative pool. A thread idle for 10 seconds exits.
final class BlockingThreads: @unchecked Sendable {
    // @unchecked: `jobs` and `idle` are read and written only with `lock` held.
    static let shared = BlockingThreads()
    private static let idleSeconds = 10

    private let lock: UnsafeMutablePointer<pthread_mutex_t>
    private let wake: UnsafeMutablePointer<pthread_cond_t>
    private var jobs: [@Sendable () -> Void] = []
    private var idle = 0

    private init() {
        lock = .allocate(capacity: 1)
        wake = .allocate(capacity: 1)
        precondition(pthread_mutex_init(lock, nil) == 0 && pthread_cond_init(wake, nil) == 0, "BlockingThreads: pthread init failed")
    }

    func submit(_ job: @escaping @Sendable () -> Void) {
        pthread_mutex_lock(lock)
        jobs.append(job)
        let needsThread = jobs.count > idle
        if !needsThread { pthread_cond_signal(wake) }
        pthread_mutex_unlock(lock)
        if needsThread { startThread() }
    }

    private func startThread() {
        var attributes = pthread_attr_t()
        pthread_attr_init(&attributes)
        defer { pthread_attr_destroy(&attributes) }
        pthread_attr_setdetachstate(&attributes, Int32(PTHREAD_CREATE_DETACHED))
        var thread = pthread_t()
        let context = Unmanaged.passRetained(self).toOpaque()
        let result = pthread_create(&thread, &attributes, { context in
            Unmanaged<BlockingThreads>.fromOpaque(context!).takeRetainedValue().work()
            return nil
        }, context)
        // Without a thread the job would wait forever: a resource limit reached is a crash
        // that names it, not a hang.
        precondition(result == 0, "BlockingThreads: pthread_create failed with \(result)")
    }

    private func work() {
        // Any non-null value: the marker only says "one of ours".
        _ = pthread_setspecific(BlockingCall.marker, UnsafeRawPointer(bitPattern: 1))
        pthread_mutex_lock(lock)
        while true {
            if !jobs.isEmpty {
                let job = jobs.removeFirst()
                pthread_mutex_unlock(lock)
                job()
                pthread_mutex_lock(lock)
                continue
            }
            var deadline = timespec()
            clock_gettime(CLOCK_REALTIME, &deadline)
            deadline.tv_sec += Self.idleSeconds
            idle += 1
            let waited = pthread_cond_timedwait(wake, lock, &deadline)
            idle -= 1
            if waited == ETIMEDOUT && jobs.isEmpty {
                pthread_mutex_unlock(lock)
                return
            }
        }
    }
}
