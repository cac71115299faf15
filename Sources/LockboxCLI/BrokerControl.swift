import Lockbox
import Synchronization

/// The connection `lockbox broker status` and `stop` use, made first thing in `main`: the broker
/// identifies a client by its `/proc` files, which this process hides once it hardens itself.
enum BrokerControl {
    private static let early = Mutex<Result<BrokerStore, LockboxError>?>(nil)

    /// Connects now, keeping the connection or the error for ``connection()``.
    static func connectEarly() {
        let result: Result<BrokerStore, LockboxError>
        do throws(LockboxError) {
            result = .success(try BrokerStore.control())
        } catch {
            result = .failure(error)
        }
        early.withLock { $0 = result }
    }

    /// The early connection, else a new one.
    static func connection() throws(LockboxError) -> BrokerStore {
        if let result = early.withLock({ $0 }) { return try result.get() }
        return try BrokerStore.control()
    }
}
