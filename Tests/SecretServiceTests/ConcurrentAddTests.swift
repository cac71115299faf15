import Foundation
import LockboxCore
@testable import SecretService
import Testing

/// Two writers adding one primary key at once end with one item and one `duplicateItem`,
/// although the Secret Service itself has no unique constraint.
@Suite("SecretServiceStore: concurrent adds of one primary key")
struct ConcurrentAddTests {
    @Test func twoProcessesAddingOneKey_everyRound_leaveOneItem_andOneDuplicateItemFailure() throws {
        _ = try TestBus.address()
        let lockbox = try Paths.product("lockbox")
        let store = try TestBus.store()
        let rounds = 30
        for round in 0..<rounds {
            let service = TestBus.unique("race-\(round)")
            let arguments = ["--backend", "secret-service", "add-generic-password", "-s", service, "-a", "alice"]
            let outputs = runTogether([
                (lockbox, arguments, Array("first".utf8)), (lockbox, arguments, Array("second".utf8)),
            ])
            let succeeded = outputs.filter { $0.status == 0 }
            let duplicates = outputs.filter { $0.status == 1 && $0.stderr.contains("-25299") }
            #expect(succeeded.count == 1 && duplicates.count == 1, "round \(round): \(outputs.map(\.combined))")
            var all = Query.genericPassword(service: service, account: "alice")
            all.limit = .all
            all.synchronizable = .any
            #expect(try store.items(matching: all).count == 1, "round \(round)")
        }
    }

    /// Adds alice's "ours" under `service`; returns the item and its object path.
    private func addOurs(_ service: String, to store: SecretServiceStore) throws -> (item: Item, path: String) {
        try store.add(.genericPassword(service: service, account: "alice", data: SecretBytes(utf8: "ours")))
        let ours = try store.item(matching: .genericPassword(service: service, account: "alice"))
        return (ours, try #require(ours.persistentReference.map { String(decoding: $0, as: UTF8.self) }))
    }

    @Test func duplicateFromAWriterWithoutTheLock_afterOurCreate_removesOurItem_andThrowsDuplicateItem() throws {
        let fresh = try FreshCollection()
        let store = fresh.store
        let service = TestBus.unique("late-duplicate")
        let (ours, oursPath) = try addOurs(service, to: store)
        // A plain create, without the lock or any check, stands in for a writer that created the
        // same key between our search and our create (another tool, or an older Lockbox).
        let theirs = ours.attributes
        _ = try SecretServiceStore(configuration: store.configuration).withCollection("create") {
            collection, cancellation throws(LockboxError) in
            try SecretServiceStore.translate("create") { () throws(GLibFailure) in
                try collection.createItem(
                    attributes: SecretServiceSchema.encode(.genericPassword, theirs), label: "theirs",
                    secret: SecretBytes(utf8: "theirs"), replacing: false, cancellable: cancellation)
            }
        }

        let added = ours.attributes
        let error = expectError(.duplicateItem) {
            try store.withCollection("check") { collection, cancellation throws(LockboxError) in
                try store.withdrawIfDuplicated(oursPath, .genericPassword, added, in: collection, cancellation)
            }
        }
        #expect(error?.message.contains("at the same time") == true)
        var all = Query.genericPassword(service: service, account: "alice")
        all.limit = .all
        all.returning = [.attributes, .data]
        let remaining = try store.items(matching: all)
        #expect(remaining.count == 1)
        #expect(remaining.first?.data?.utf8String == "theirs")
        #expect(remaining.first?.persistentReference.map { String(decoding: $0, as: UTF8.self) } != oursPath)
    }

    @Test func createWithoutADuplicate_staysAfterTheCheck() throws {
        let fresh = try FreshCollection()
        let store = fresh.store
        let service = TestBus.unique("alone")
        let (ours, oursPath) = try addOurs(service, to: store)
        let added = ours.attributes
        try store.withCollection("check") { collection, cancellation throws(LockboxError) in
            try store.withdrawIfDuplicated(oursPath, .genericPassword, added, in: collection, cancellation)
        }
        #expect(try store.data(matching: .genericPassword(service: service, account: "alice")).utf8String == "ours")
    }

    @Test func addWaitsWhileAnotherProcessHoldsTheWriteLock() throws {
        let fresh = try FreshCollection()
        let store = fresh.store
        let lockFile = try WriteLock.lockFilePath()
        let descriptor = open(lockFile, O_RDWR | O_CREAT | O_CLOEXEC, 0o600)
        try #require(descriptor >= 0, "cannot open \(lockFile): errno \(errno)")
        defer { close(descriptor) }
        try #require(flock(descriptor, LOCK_EX) == 0)
        let service = TestBus.unique("waits")
        let finished = DispatchSemaphore(value: 0)
        let outcome = AddOutcome()
        DispatchQueue.global().async {
            do {
                try store.add(.genericPassword(service: service, account: "alice", data: SecretBytes(utf8: "later")))
                outcome.set(nil)
            } catch {
                outcome.set(error)
            }
            finished.signal()
        }
        #expect(finished.wait(timeout: .now() + 0.5) == .timedOut, "the add must wait for the lock")
        flock(descriptor, LOCK_UN)
        #expect(finished.wait(timeout: .now() + 5) == .success)
        #expect(outcome.error == nil, "\(String(describing: outcome.error))")
        #expect(try store.data(matching: .genericPassword(service: service, account: "alice")).utf8String == "later")
    }

    @Test func withoutARuntimeDirectory_theLockLivesInAPrivateDirectoryUnderTmp() throws {
        _ = try TestBus.address()
        let lockbox = try Paths.product("lockbox")
        let service = TestBus.unique("no-runtime-dir")
        let added = try runProcess(
            lockbox, ["--backend", "secret-service", "add-generic-password", "-s", service, "-a", "alice"],
            input: Array("value".utf8), environment: environment(["XDG_RUNTIME_DIR": nil]))
        #expect(added.status == 0, "\(added.combined)")
        var status = stat()
        let directory = "/tmp/lockbox-\(geteuid())"
        try #require(lstat(directory, &status) == 0, "\(directory) was not created")
        #expect((status.st_mode & S_IFMT) == S_IFDIR)
        #expect(status.st_mode & 0o777 == 0o700)
        #expect(status.st_uid == geteuid())
        #expect(access(directory + "/secret-service.lock", F_OK) == 0)
        try TestBus.store().delete(matching: .genericPassword(service: service, account: "alice"))
    }
}

/// What a background add ended with.
private final class AddOutcome: @unchecked Sendable {
    // Written once by the background add before it signals, read after the wait.
    private(set) var error: (any Error)?
    func set(_ error: (any Error)?) { self.error = error }
}

/// Starts every command at once and waits for all of them.
private func runTogether(_ commands: [(String, [String], [UInt8])]) -> [ProcessOutput] {
    let results = Results(count: commands.count)
    DispatchQueue.concurrentPerform(iterations: commands.count) { index in
        let (executable, arguments, input) = commands[index]
        let output = (try? runProcess(executable, arguments, input: input, environment: environment(), timeout: 30))
            ?? ProcessOutput(status: -1, standardOutput: [], standardError: Array("could not start \(executable)".utf8))
        results.set(index, output)
    }
    return results.all
}

private final class Results: @unchecked Sendable {
    // Each slot is written by one worker of concurrentPerform, read after it returns.
    private var outputs: [ProcessOutput?]
    private let lock = NSLock()
    init(count: Int) { outputs = Array(repeating: nil, count: count) }
    func set(_ index: Int, _ output: ProcessOutput) { lock.withLock { outputs[index] = output } }
    var all: [ProcessOutput] { lock.withLock { outputs.compactMap { $0 } } }
}
