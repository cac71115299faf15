import Dispatch
import Foundation
import Lockbox
import LockboxAuth
import LockboxCore
import Synchronization
import Testing

/// The real vault behind a gate: every call waits (blocking its thread, as a SQLite busy wait or
/// a D-Bus round trip does) until the test opens the gate, then runs on the vault.
final class GatedStore: ItemStore {
    let base: Vault
    private let gate = DispatchSemaphore(value: 0)
    private let state = Mutex<(entered: Int, open: Bool, openedByWatchdog: Bool, waiter: (count: Int, continuation: CheckedContinuation<Void, Never>)?)>(
        (0, false, false, nil))
    /// Calls that entered the store on a thread other than Lockbox's blocking threads (on
    /// Swift's cooperative pool, say).
    private let callsElsewhere = Mutex(0)

    init(base: Vault) {
        self.base = base
    }

    /// Suspends until `count` calls are blocked in the store.
    func waitUntilBlocked(_ count: Int) async {
        await withCheckedContinuation { continuation in
            let ready = state.withLock { state -> Bool in
                if state.entered >= count { return true }
                state.waiter = (count, continuation)
                return false
            }
            if ready { continuation.resume() }
        }
    }

    /// Lets every blocked and later call through.
    func open(byWatchdog: Bool = false) {
        let opened = state.withLock { state -> Bool in
            guard !state.open else { return false }
            state.open = true
            state.openedByWatchdog = byWatchdog
            return true
        }
        if opened { for _ in 0..<1000 { gate.signal() } }
    }

    /// Opens the gate after `seconds` from a Dispatch timer, so a stalled pool fails the test
    /// (the flag says so) instead of hanging it.
    func armWatchdog(seconds: Int) {
        DispatchQueue.global().asyncAfter(deadline: .now() + .seconds(seconds)) { [self] in open(byWatchdog: true) }
    }

    var openedByWatchdog: Bool { state.withLock { $0.openedByWatchdog } }

    var callsOffTheBlockingThreads: Int { callsElsewhere.withLock { $0 } }

    private func pass() {
        if !BlockingCall.isOnBlockingThread { callsElsewhere.withLock { $0 += 1 } }
        let resume: CheckedContinuation<Void, Never>? = state.withLock { state in
            state.entered += 1
            if let waiter = state.waiter, state.entered >= waiter.count {
                state.waiter = nil
                return waiter.continuation
            }
            return nil
        }
        resume?.resume()
        gate.wait()
        gate.signal()
    }

    func add(_ item: Item) throws(LockboxError) {
        pass()
        try base.add(item)
    }

    func items(matching query: Query) throws(LockboxError) -> [Item] {
        pass()
        return try base.items(matching: query)
    }

    func update(matching query: Query, to update: ItemUpdate) throws(LockboxError) {
        pass()
        try base.update(matching: query, to: update)
    }

    func delete(matching query: Query) throws(LockboxError) -> Int {
        pass()
        return try base.delete(matching: query)
    }
}

/// Blocking store calls (ItemStore's `async` counterparts, TokenStore, RevocationOutbox,
/// CredentialsManager) never hold a thread of Swift's cooperative pool.
@Suite("Store calls run off the cooperative pool", .serialized)
struct OffPoolTests {
    /// More callers than the pool has threads: if each held one, nothing else could run.
    static let callers = ProcessInfo.processInfo.activeProcessorCount * 2 + 2

    /// Something else that needs the pool: a child task that must be scheduled to finish.
    static func probeThePool() async -> Bool {
        await Task.detached { true }.value
    }

    @Test func blockedAsyncStoreCalls_leaveThePoolFree() async throws {
        let vault = try TestVault()
        let store = GatedStore(base: vault.vault)
        store.armWatchdog(seconds: 120)

        let calls = Task {
            try await withThrowingTaskGroup(of: Void.self) { group in
                for index in 0..<Self.callers {
                    group.addTask {
                        try await store.async.add(
                            .genericPassword(service: "off-pool", account: "caller-\(index)", data: SecretBytes(utf8: "value-\(index)")))
                    }
                }
                try await group.waitForAll()
            }
        }
        await store.waitUntilBlocked(Self.callers)
        let probed = await Self.probeThePool()

        #expect(probed)
        // Every blocked call waits on a thread of its own, none on the cooperative pool. (How
        // soon the probe ran is not the measure: Swift Testing runs the other suites' blocking
        // synchronous tests on the same pool, two threads on this machine.)
        #expect(store.callsOffTheBlockingThreads == 0, "a blocked store call held a thread that is not Lockbox's own")
        store.open()
        try await calls.value
        var query = Query.genericPassword(service: "off-pool")
        query.limit = .all
        #expect(try await vault.vault.async.items(matching: query).count == Self.callers)
    }

    @Test func credentialsManagersWaitingOnABlockedStore_leaveThePoolFree() async throws {
        let vault = try TestVault()
        let store = GatedStore(base: vault.vault)
        store.armWatchdog(seconds: 120)
        let managers = (0..<Self.callers).map { index in
            let configuration = ClientConfiguration(
                issuer: URL(string: "https://issuer.invalid")!, clientID: "client-\(index)",
                tokenEndpoint: URL(string: "https://issuer.invalid/token")!)
            return CredentialsManager(
                configuration: configuration,
                tokenStore: ItemStoreTokenStore(store: store, key: CredentialKey(configuration: configuration)))
        }

        let calls = Task {
            await withTaskGroup(of: Bool.self) { group in
                for manager in managers {
                    group.addTask {
                        do {
                            _ = try await manager.credentials()
                            return false
                        } catch {
                            return isAuthError(error, .signedOut, reason: .noCredentials)
                        }
                    }
                }
                return await group.reduce(into: [Bool]()) { $0.append($1) }
            }
        }
        await store.waitUntilBlocked(Self.callers)
        let probed = await Self.probeThePool()

        #expect(probed)
        // Every blocked call waits on a thread of its own, none on the cooperative pool. (How
        // soon the probe ran is not the measure: Swift Testing runs the other suites' blocking
        // synchronous tests on the same pool, two threads on this machine.)
        #expect(store.callsOffTheBlockingThreads == 0, "a blocked store call held a thread that is not Lockbox's own")
        store.open()
        let outcomes = await calls.value
        #expect(outcomes == Array(repeating: true, count: Self.callers))
    }

    @Test func revocationOutboxesWaitingOnABlockedStore_leaveThePoolFree() async throws {
        let vault = try TestVault()
        let store = GatedStore(base: vault.vault)
        store.armWatchdog(seconds: 120)
        let outbox = RevocationOutbox(store: store)

        let calls = Task {
            try await withThrowingTaskGroup(of: Int.self) { group in
                for _ in 0..<Self.callers {
                    group.addTask { try await outbox.pendingCount() }
                }
                return try await group.reduce(0, +)
            }
        }
        await store.waitUntilBlocked(Self.callers)
        let probed = await Self.probeThePool()

        #expect(probed)
        // Every blocked call waits on a thread of its own, none on the cooperative pool. (How
        // soon the probe ran is not the measure: Swift Testing runs the other suites' blocking
        // synchronous tests on the same pool, two threads on this machine.)
        #expect(store.callsOffTheBlockingThreads == 0, "a blocked store call held a thread that is not Lockbox's own")
        store.open()
        #expect(try await calls.value == 0)
    }
}
