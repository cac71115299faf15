import Foundation
import Lockbox
import LockboxCore
import LockboxTestSupport
import LockboxVault
import Synchronization
import Testing

@testable import LockboxSync

/// The system clock, counting the vault's readings of it; at reading number `at` it first runs
/// an action: another process of the machine writing at that moment of a sync.
private final class WriterAtReading: LockboxClock, @unchecked Sendable {
    private struct Plan {
        var count = 0
        var at = Int.max
        var action: (@Sendable () -> Void)?
    }

    private let plan = Mutex(Plan())

    func sinceEpoch() -> Duration {
        let due = plan.withLock { plan -> (@Sendable () -> Void)? in
            plan.count += 1
            guard plan.count == plan.at, let action = plan.action else { return nil }
            plan.action = nil
            return action
        }
        due?()
        return SystemClock().sinceEpoch()
    }

    func uptime() -> Duration { SystemClock().uptime() }
    func sleep(for duration: Duration) { SystemClock().sleep(for: duration) }

    /// Runs `action` at the `at`-th reading from now on (never with `Int.max`).
    func arm(at: Int, _ action: @escaping @Sendable () -> Void) { plan.withLock { $0 = Plan(count: 0, at: at, action: action) } }
    var readings: Int { plan.withLock { $0.count } }
    var fired: Bool { plan.withLock { $0.action == nil } }
}

/// Other processes of the same machine writing while a sync runs, and an item deleted and
/// created again: the later write is what every device ends with.
extension SyncTests {
    @Suite("Sync: writes made here by other processes during a sync, and items created again", .serialized)
    struct ConcurrentWriters {
        /// Machine 1 changes an item (`remote`); then machine 0 pulls that change while another
        /// handle of machine 0 (another process) edits the item, at each moment the vault reads
        /// its clock during the sync before its transaction (inside it, the edit waits for the
        /// sync's commit, and is simply later). Returns, per moment, what the machines ended
        /// with when it was not that later edit.
        func editsDuringAPull(remote: (Machine) throws -> Void) throws -> [Int: [String]] {
            var lost: [Int: [String]] = [:]
            var moments: Int?
            var moment = 0
            while moment < (moments ?? 1) {
                let clock = WriterAtReading()
                let (groups, machines) = try threeMachines(clocks: [clock, nil, nil])
                try machines[0].add("x.example", "user", "v1")
                try groups[0].sync()
                try groups[1].sync()
                try remote(machines[1])
                try groups[1].sync()
                tick()
                let other = try machines[0].reopened { $0.clock = SystemClock() }
                let failure = Mutex<String?>(nil)
                clock.arm(at: moment == 0 ? Int.max : moment) {
                    var query = Query.genericPassword(service: "x.example", account: "user")
                    query.synchronizable = .synchronizable
                    do {
                        try other.update(matching: query, to: ItemUpdate(data: SecretBytes(utf8: "later, here")))
                    } catch {
                        failure.withLock { $0 = "\(error)" }
                    }
                }
                try groups[0].sync()
                if moments == nil {
                    // The first run only counts the readings; the last is inside the transaction.
                    moments = clock.readings
                    moment = 1
                    continue
                }
                #expect(clock.fired && failure.withLock { $0 } == nil, "moment \(moment): \(failure.withLock { $0 } ?? "no write")")
                for _ in 0..<2 { for group in groups { try group.sync() } }
                let values = try machines.map { try $0.value("x.example", "user") ?? "gone" }
                if values != ["later, here", "later, here", "later, here"] { lost[moment] = values }
                moment += 1
            }
            #expect((moments ?? 0) > 1, "the sync read the clock \(moments ?? 0) time(s): no moment before its transaction to write at")
            return lost
        }

        @Test("An edit made here by another process while a pull applies another device's earlier edit is kept everywhere")
        func editDuringAPulledEdit() throws {
            let lost = try editsDuringAPull { try $0.set("x.example", "user", "from machine 1") }
            #expect(lost.isEmpty, "the later edit was lost at these moments: \(lost)")
        }

        @Test("An edit made here by another process while a pull applies another device's earlier delete is kept everywhere")
        func editDuringAPulledDelete() throws {
            let lost = try editsDuringAPull { try $0.delete("x.example", "user") }
            #expect(lost.isEmpty, "the later edit was lost at these moments: \(lost)")
        }

        @Test("An item deleted and created again with the value it had, after another device deleted or edited it, comes back everywhere", arguments: [false, true])
        func itemCreatedAgainWithTheSameValue(afterAnEdit: Bool) throws {
            let (groups, machines) = try threeMachines()
            defer { withExtendedLifetime(machines) {} }
            try machines[0].add("x.example", "user", "v1")
            for group in groups { try group.sync() }
            if afterAnEdit {
                try machines[0].set("x.example", "user", "v2")
            } else {
                try machines[0].delete("x.example", "user")
            }
            try groups[0].sync()
            tick()
            // Later, machine 1 (not yet pulled) deletes the item and creates it again, as it was.
            try machines[1].delete("x.example", "user")
            try machines[1].add("x.example", "user", "v1")
            for _ in 0..<2 { for group in groups { try group.sync() } }
            for machine in machines { #expect(try machine.value("x.example", "user") == "v1") }
        }

        @Test("A value saved again unchanged in its row (as a credential helper stores after each use) still does not undo an edit made elsewhere")
        func valueSavedAgainUnchangedDoesNotUndoAnEdit() throws {
            let (groups, machines) = try threeMachines()
            defer { withExtendedLifetime(machines) {} }
            try machines[0].add("x.example", "user", "v1")
            for group in groups { try group.sync() }
            try machines[0].set("x.example", "user", "v2")
            try groups[0].sync()
            tick()
            try machines[1].set("x.example", "user", "v1")
            for _ in 0..<2 { for group in groups { try group.sync() } }
            for machine in machines { #expect(try machine.value("x.example", "user") == "v2") }
        }
    }
}
