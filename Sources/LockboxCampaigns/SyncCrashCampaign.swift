import Foundation
import Lockbox
import LockboxSync
import LockboxVault

#if canImport(Glibc)
import Glibc
#endif

/// The sync crash campaign: three machines (vaults with their own device keys) in one sync
/// group, local writes on a random machine, then `lockbox sync now` on a random machine,
/// SIGKILLed at a random moment (or left to finish); in some rounds two machines sync at once,
/// or two processes of one machine, each killed at its own moment; and, when the campaign owns
/// its database, in some rounds the database is crashed mid-sync and started again. After every
/// run each machine that synced must pass its full check; at the end every machine syncs until nothing changes, and each
/// must hold exactly what the last write of each item left (the later write wins, a delete
/// included), with one record per item in the database: nothing lost, duplicated or brought
/// back.
package struct SyncCrashCampaign {
    package struct Options: Sendable {
        package var iterations: Int
        /// The built `lockbox` (which hands `sync` to `lockbox-sync` beside it).
        package var lockbox: String
        /// A PostgreSQL connection string (scripts/postgres start).
        package var database: String
        /// A private directory for the machines.
        package var directory: String
        /// `scripts/postgres` of the campaign's own database, which `crash` crashes (no
        /// checkpoint, connections cut) and starts again, with `LOCKBOX_POSTGRES_STATE` in the
        /// environment; nil when the database is shared and must stay up.
        package var postgresScript: String?

        package init(iterations: Int, lockbox: String, database: String, directory: String, postgresScript: String? = nil) {
            self.iterations = iterations
            self.lockbox = lockbox
            self.database = database
            self.directory = directory
            self.postgresScript = postgresScript
        }
    }

    package struct Report: Sendable {
        package var kills = 0
        /// Syncs that finished before their kill came.
        package var finished = 0
        /// Rounds where two machines synced at once, and where two processes of one machine did.
        package var concurrentRounds = 0
        package var sameMachineRounds = 0
        /// Rounds where the database crashed mid-sync, and the syncs that then failed on their
        /// own, as they may (the database went away), or finished.
        package var databaseCrashes = 0
        package var failedWithTheDatabase = 0
        package var localWrites = 0
        package var vaultChecks = 0
        package var itemChecks = 0
        package var violations: [String] = []
        package var seconds = 0.0

        package var summary: String {
            var lines = ["sync crash campaign: \(kills + finished) syncs of `lockbox sync now` in \(String(format: "%.0f", seconds)) s"]
            lines.append("  killed mid-sync: \(kills); finished before the kill: \(finished)")
            lines.append("  rounds with two machines syncing at once: \(concurrentRounds); with two processes of one machine: \(sameMachineRounds)")
            lines.append(
                "  rounds with the database crashed mid-sync and started again: \(databaseCrashes); syncs that then failed on their own "
                    + "(the database gone): \(failedWithTheDatabase)")
            lines.append("  local writes (adds, updates, deletes) on the three machines: \(localWrites)")
            lines.append("  full vault checks after a run: \(vaultChecks); items compared after convergence: \(itemChecks)")
            lines.append("  violations (failed checks, lost, stale, duplicated or resurrected items, failed syncs): \(violations.count)")
            for violation in violations.prefix(20) { lines.append("    - \(violation)") }
            return lines.joined(separator: "\n")
        }
    }

    /// One machine: its vault, opened in this process (which keeps it unlocked for the
    /// command-line runs), and the environment those runs get.
    final class Machine {
        let home: String
        let vault: Vault

        init(_ home: String) throws {
            self.home = home
            for directory in [home, home + "/data", home + "/data/lockbox", home + "/state", home + "/state/lockbox", home + "/config"] {
                try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true, attributes: [.posixPermissions: 0o700])
            }
            var configuration = Vault.Configuration()
            configuration.keyDerivation = .interactive
            configuration.device = DeviceIdentity(keyPath: home + "/state/lockbox/device-key")
            vault = try Vault.create(
                at: home + "/data/lockbox/default.lockbox", passphrase: SecretBytes(utf8: "sync campaign machine"), configuration: configuration)
        }

        var environment: [String: String] {
            var environment = ProcessInfo.processInfo.environment
            environment["XDG_DATA_HOME"] = home + "/data"
            environment["XDG_STATE_HOME"] = home + "/state"
            environment["XDG_CONFIG_HOME"] = home + "/config"
            environment["HOME"] = home
            return environment
        }

        func query(_ service: String) -> Query {
            var query = Query.genericPassword(service: service, account: "user")
            query.synchronizable = .synchronizable
            return query
        }

        func value(_ service: String) throws -> String? {
            var query = query(service)
            query.returning = [.data]
            guard try vault.contains(query) else { return nil }
            return try vault.data(matching: query).withUnsafeBytes { String(decoding: $0, as: UTF8.self) }
        }

        /// Every synchronizable generic password's service and value (not the group's key).
        func contents() throws -> [String: String] {
            var query = Query(.genericPassword, limit: .all, synchronizable: .synchronizable)
            query.returning = [.attributes, .data]
            guard try vault.contains(query) else { return [:] }
            var contents: [String: String] = [:]
            for item in try vault.items(matching: query) where item.attributes.accessGroup != "lockbox.sync" {
                let value = item.data?.withUnsafeBytes { String(decoding: $0, as: UTF8.self) } ?? ""
                if contents.updateValue(value, forKey: item.attributes.service ?? "") != nil {
                    contents[item.attributes.service ?? ""] = "<two items of one key>"
                }
            }
            return contents
        }

        func isSound() throws -> Bool {
            let report = try Vault.verify(at: vault.path, configuration: vault.configuration)
            return report.isSound && report.checkedItems == report.items
        }
    }

    /// Items the campaign writes: few, so that machines often write the same one.
    static let keys = 24

    /// What a round runs: one sync; two at once, on two machines or as two processes of one;
    /// one while the database crashes (one sync when the database must stay up).
    enum RoundKind {
        case one, twoMachines, twoProcessesOfOneMachine, databaseCrash
    }

    /// The rounds' kinds, in a cycle of 20 (the machines and moments within each are random):
    /// two machines at once in 4, two processes of one machine in 2, a database crash in 1.
    /// The first twelve rounds hold each kind of the two syncs at once, so that a short run
    /// meets them.
    static let roundKinds: [RoundKind] = (0..<20).map { round in
        switch round {
        case 2, 7, 12, 17: .twoMachines
        case 4, 14: .twoProcessesOfOneMachine
        case 9: .databaseCrash
        default: .one
        }
    }

    package static func run(_ options: Options, progress: (String) -> Void = { _ in }) throws -> Report {
        var report = Report()
        let start = Date()
        let machines = try (0..<3).map { try Machine(options.directory + "/machine-\($0)") }
        defer { for machine in machines { machine.vault.lockAll() } }
        let passphrase = SecretBytes(utf8: "sync campaign group")
        let group = try SyncGroup.create(vault: machines[0].vault, database: options.database, passphrase: passphrase)
        var groups = [group]
        for machine in machines.dropFirst() {
            groups.append(try SyncGroup.join(group.groupID, vault: machine.vault, database: options.database, passphrase: passphrase))
        }
        for machine in machines {
            try FileManager.default.createDirectory(atPath: machine.vault.path + ".sync", withIntermediateDirectories: true)
            try Data("group=\(group.groupID)\ndatabase=\(options.database)\n".utf8).write(
                to: URL(fileURLWithPath: machine.vault.path + ".sync/config"))
        }
        // What each item holds after the last write made to it (nil: deleted), on any machine.
        var model: [String: String?] = [:]
        // Each item's writes, and each run of `lockbox sync now`, in order: printed with a violation.
        var history: [String] = []
        var sequence = 0
        var generator = SystemRandomNumberGenerator()

        for iteration in 0..<options.iterations {
            // Local writes on one machine, each after the one before on the clock (a write's
            // stamp is its time in milliseconds).
            let writerIndex = Int.random(in: 0..<3, using: &generator)
            let writer = machines[writerIndex]
            for _ in 0..<Int.random(in: 1...3, using: &generator) {
                usleep(2_000)
                sequence += 1
                let service = "crash\(Int.random(in: 0..<keys, using: &generator)).example"
                let value = "value-\(sequence)"
                if try writer.value(service) != nil {
                    if Int.random(in: 0..<4, using: &generator) == 0 {
                        try writer.vault.delete(matching: writer.query(service))
                        model[service] = .some(nil)
                        history.append("\(service): deleted on machine \(writerIndex)")
                    } else {
                        try writer.vault.update(matching: writer.query(service), to: ItemUpdate(data: SecretBytes(utf8: value)))
                        model[service] = value
                        history.append("\(service): \(value) on machine \(writerIndex) (update)")
                    }
                } else if case .some(.some) = model[service] {
                    // The group holds it and this machine has not received it yet: an add here
                    // would be another item of the same key, which sync settles by the later
                    // write; one deleted again before it synced never reaches the group, whose
                    // item stays (docs/SYNC.md, "Conflicts"). Not written.
                    continue
                } else {
                    var item = Item.genericPassword(service: service, account: "user", data: SecretBytes(utf8: value))
                    item.attributes.synchronizable = true
                    try writer.vault.add(item)
                    model[service] = value
                    history.append("\(service): \(value) on machine \(writerIndex) (add)")
                }
                report.localWrites += 1
            }
            // One machine syncs, killed at a random moment of its run (or not at all); or two at
            // once (two machines, or two processes of one), each killed at its own moment; or
            // one while the database crashes under it.
            let kind = Self.roundKinds[iteration % Self.roundKinds.count]
            let crashing = options.postgresScript != nil && kind == .databaseCrash
            var syncingIndices = [Int.random(in: 0..<3, using: &generator)]
            switch kind {
            case .twoMachines:
                syncingIndices.append((syncingIndices[0] + Int.random(in: 1...2, using: &generator)) % 3)
                report.concurrentRounds += 1
            case .twoProcessesOfOneMachine:
                syncingIndices.append(syncingIndices[0])
                report.sameMachineRounds += 1
            case .one, .databaseCrash:
                break
            }
            let runs = syncingIndices.map { index in
                Run(
                    arguments: ["--keychain", machines[index].vault.path, "sync", "now"], environment: machines[index].environment,
                    killAfterMilliseconds: crashing ? nil : Int.random(in: 0...100, using: &generator))
            }
            var crash: (afterMilliseconds: Int, body: @Sendable () throws -> Void)?
            if crashing, let script = options.postgresScript {
                crash = (Int.random(in: 0...60, using: &generator), { try crashDatabase(script) })
                report.databaseCrashes += 1
            }
            let outcomes = try runTogether(options.lockbox, runs, crash: crash)
            for (index, outcome) in zip(syncingIndices, outcomes) {
                history.append("sync on machine \(index)\(crashing ? " (database crashed)" : ""): \(outcome)")
                switch outcome {
                case .killed: report.kills += 1
                case .finished(0, _): report.finished += 1
                case .finished(1, _) where crashing:
                    // The database went away under it: a clean failure, which the next sync repairs.
                    report.failedWithTheDatabase += 1
                case .finished(let status, let errors):
                    report.violations.append("iteration \(iteration): lockbox sync now exited \(status) on its own: \(errors.prefix(300))")
                }
            }
            for index in Set(syncingIndices) {
                report.vaultChecks += 1
                if try !machines[index].isSound() {
                    report.violations.append("iteration \(iteration): machine \(index)'s vault failed its full check after the run")
                }
            }
            if iteration % 25 == 24 { progress("\(iteration + 1) of \(options.iterations) runs, \(report.kills) killed") }
        }

        // Every machine syncs until nothing changes anywhere (two quiet rounds).
        var quietRounds = 0
        var rounds = 0
        while quietRounds < 2 && rounds < 8 {
            rounds += 1
            var changed = false
            for (index, group) in groups.enumerated() {
                do {
                    if try !group.sync().changedNothing { changed = true }
                } catch {
                    report.violations.append("convergence: machine \(index)'s sync failed: \(error)")
                }
            }
            quietRounds = changed ? 0 : quietRounds + 1
        }
        if quietRounds < 2 { report.violations.append("convergence: the machines still changed after \(rounds) rounds of syncs") }
        let expected = model.compactMapValues { $0 }
        for (index, machine) in machines.enumerated() {
            let contents = try machine.contents()
            report.itemChecks += max(contents.count, expected.count)
            for (service, value) in expected where contents[service] != value {
                report.violations.append("machine \(index): \(service) holds \(contents[service] ?? "nothing"), its last write was \(value)")
            }
            for service in contents.keys where expected[service] == nil {
                report.violations.append("machine \(index): \(service) is back (its last write deleted it)")
            }
            if try !machine.isSound() { report.violations.append("machine \(index): the vault failed its full check at the end") }
        }
        // The history of the items a violation names, for whoever reads the report.
        let named = Set(report.violations.compactMap { $0.split(separator: " ").first { $0.hasSuffix(".example") }.map(String.init) })
        if ProcessInfo.processInfo.environment["LOCKBOX_CAMPAIGN_TRACE"] != nil {
            for line in history where named.contains(where: { line.hasPrefix($0 + ":") }) || line.hasPrefix("sync") {
                progress(line)
            }
        }
        report.seconds = Date().timeIntervalSince(start)
        return report
    }

    enum Outcome {
        case killed
        case finished(Int32, String)
    }

    /// One run of the program: its arguments and environment, and when to SIGKILL it (nil: let
    /// it finish, within ``longestRun``).
    struct Run {
        var arguments: [String]
        var environment: [String: String]
        var killAfterMilliseconds: Int?
    }

    /// Runs `script crash` and returns once the database accepts connections again.
    static func crashDatabase(_ script: String) throws {
        let environment = ProcessInfo.processInfo.environment
        guard case .finished(0, _) = try runTogether(script, [Run(arguments: ["crash"], environment: environment, killAfterMilliseconds: nil)])[0]
        else { throw DatabaseDidNotComeBack(script: script) }
    }

    /// `scripts/postgres crash` failed: the campaign cannot go on without its database.
    struct DatabaseDidNotComeBack: Error, CustomStringConvertible {
        var script: String
        var description: String { "\(script) crash failed: the database did not come back" }
    }

    /// How long a run left to finish may take before it counts as hung (and is killed).
    static let longestRun: TimeInterval = 120

    /// Starts every run of `program` at once, SIGKILLs each at its moment unless it has exited
    /// by then, calls `crash` (synchronously) that long after the start, and says what became
    /// of each run. A run killed because it outlived ``longestRun`` is a finished run with
    /// status -1. The runs are spawned and reaped here (posix_spawn, waitpid), not through
    /// Process, whose watch over its children can miss one that exits beside another.
    static func runTogether(
        _ program: String, _ runs: [Run], crash: (afterMilliseconds: Int, body: @Sendable () throws -> Void)? = nil
    ) throws -> [Outcome] {
        let outputDirectory = FileManager.default.temporaryDirectory.appendingPathComponent("lockbox-sync-campaign-\(UUID().uuidString)").path
        try FileManager.default.createDirectory(atPath: outputDirectory, withIntermediateDirectories: true, attributes: [.posixPermissions: 0o700])
        defer { try? FileManager.default.removeItem(atPath: outputDirectory) }
        struct Child {
            var pid: pid_t
            var output: String
            var deadline: Date?
            var status: Int32?
            var killed = false
            var hung = false
        }
        var children: [Child] = []
        defer {
            for child in children where child.status == nil {
                kill(child.pid, SIGKILL)
                var status: Int32 = 0
                waitpid(child.pid, &status, 0)
            }
        }
        let start = Date()
        for (index, run) in runs.enumerated() {
            let output = outputDirectory + "/\(index)"
            var actions = posix_spawn_file_actions_t()
            posix_spawn_file_actions_init(&actions)
            defer { posix_spawn_file_actions_destroy(&actions) }
            posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0)
            posix_spawn_file_actions_addopen(&actions, 1, output, O_WRONLY | O_CREAT | O_TRUNC, 0o600)
            posix_spawn_file_actions_adddup2(&actions, 1, 2)
            let argv = ([program] + run.arguments).map { strdup($0) } + [nil]
            let environment = run.environment.map { strdup("\($0.key)=\($0.value)") } + [nil]
            defer { for pointer in argv + environment { free(pointer) } }
            var pid: pid_t = 0
            let spawned = posix_spawn(&pid, program, &actions, nil, argv, environment)
            guard spawned == 0 else { throw CocoaError(.fileReadUnknown, userInfo: ["spawn": "\(program): errno \(spawned)"]) }
            children.append(Child(pid: pid, output: output, deadline: run.killAfterMilliseconds.map { start.addingTimeInterval(Double($0) / 1000) }))
        }
        var crashPending = crash
        while children.contains(where: { $0.status == nil }) || crashPending != nil {
            let now = Date()
            if let pending = crashPending, now >= start.addingTimeInterval(Double(pending.afterMilliseconds) / 1000) {
                crashPending = nil
                try pending.body()
                continue
            }
            for index in children.indices where children[index].status == nil {
                var status: Int32 = 0
                if waitpid(children[index].pid, &status, WNOHANG) == children[index].pid {
                    children[index].status = status
                } else if let deadline = children[index].deadline, now >= deadline, !children[index].killed {
                    kill(children[index].pid, SIGKILL)
                    children[index].killed = true
                } else if now.timeIntervalSince(start) > longestRun, !children[index].hung {
                    kill(children[index].pid, SIGKILL)
                    children[index].hung = true
                }
            }
            usleep(1_000)
        }
        return children.map { child in
            let text = (try? String(contentsOfFile: child.output, encoding: .utf8)) ?? ""
            let status = child.status ?? 0
            // WIFSIGNALED / WEXITSTATUS, spelled out (the C macros are not imported).
            let signal = status & 0x7f
            let exitStatus = (status >> 8) & 0xff
            if child.hung { return .finished(-1, "did not finish within \(Int(longestRun)) s: " + text) }
            if signal != 0 { return child.killed && signal == SIGKILL ? .killed : .finished(-signal, "killed by signal \(signal): " + text) }
            return .finished(exitStatus, text)
        }
    }
}
