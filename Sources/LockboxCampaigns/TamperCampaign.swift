import Foundation
import Lockbox
import LockboxVault
import VaultStorage

/// The tamper campaign: the attacker who can write the vault file, but holds neither the
/// passphrase nor this machine's device key, edits every column of every table that reads use,
/// and of `sync_deletions`, the records of deleted synchronizable items that sync reads (flipped bytes,
/// truncations, NULL and empty values, values swapped between rows, values and whole rows
/// replayed from an older copy of the same vault, deleted and duplicated rows) and the file as
/// a whole (an older copy put in place, a lost or cut write-ahead log). Each edit starts from a
/// pristine copy; then every item is read back through handles in every state that matters:
///
/// - `live`: a handle opened (and read) before the edit, keys in the kernel keyring;
/// - `keyring`: a fresh `Vault.open` while the keys are still in the kernel keyring;
/// - `locked`: a fresh handle with no keys (as after `lockAll()` or a reboot): only the
///   `always` classes are readable;
/// - `unlock`: a fresh handle, `lockAll()`, then `unlock(passphrase:)`, the access-controlled
///   item read with the passphrase as its user verification;
///
/// and `Vault.verify(at:)` checks the file. The deletion times recorded for the two deleted
/// synchronizable items are read in every state too (`Vault.deletionTimes(of:)`, what a sync
/// stamps its tombstones with): the same time, or a closed failure; no record where the
/// unedited file has one is counted apart ("forgotten": sync would then stamp that delete just
/// after the version it knew, so it would lose to any later edit; the integrity record's sum of
/// the records makes it a closed failure instead); any other time is a violation. Each read is compared with the same read on the
/// unedited file: the right value, or the same status as without the edit, is "unaffected";
/// `errSecDecode` (-26275) is a closed failure, as is `errSecInteractionNotAllowed` (-25308)
/// where the edit took a key away, and `errSecAuthFailed` (-25293) where the edit made the
/// passphrase slot unopenable (a key-slot edit reads as a wrong passphrase). Anything else is
/// a violation: a value that is not the item's current one (another item's, an older one, a
/// forged one), a value served where the unedited file was locked, "not found" for an item that
/// exists (a row hidden by an edit is a deletion nobody noticed), any other status, and an
/// attempt counter that an edit brought below its true count. A crash ends the run (the
/// process's exit status shows it, and the edit in flight is printed on standard error).
package struct TamperCampaign {
    package struct Options: Sendable {
        package var directory: String
        /// One mutation per column and table (the CI version) instead of all of them.
        package var sample: Bool
        /// Called with each edit before it is tried.
        package var trace: (@Sendable (String) -> Void)?

        package init(directory: String, sample: Bool = false, trace: (@Sendable (String) -> Void)? = nil) {
            self.directory = directory
            self.sample = sample
            self.trace = trace
        }
    }

    /// Counts for one table/column/mutation (or the totals).
    package struct Tally: Sendable, Equatable {
        package var edits = 0
        package var reads = 0
        /// The item's current value.
        package var correct = 0
        /// The same status as on the unedited file (locked, or not found for a deleted item).
        package var unchanged = 0
        package var failClosed = 0
        package var violations = 0

        mutating func add(_ other: Tally) {
            edits += other.edits
            reads += other.reads
            correct += other.correct
            unchanged += other.unchanged
            failClosed += other.failClosed
            violations += other.violations
        }
    }

    package struct Key: Hashable, Sendable, Comparable {
        package var table: String
        package var column: String
        package var mutation: String

        package static func < (left: Key, right: Key) -> Bool {
            (left.table, left.column, left.mutation) < (right.table, right.column, right.mutation)
        }
    }

    package struct Report: Sendable {
        package var tallies: [Key: Tally] = [:]
        /// Table order as tried, for the summary.
        package var tableOrder: [String] = []
        package var totals = Tally()
        /// Closed failures by status.
        package var closedByStatus: [Int32: Int] = [:]
        package var violations: [String] = []
        /// Edits SQLite refused (NOT NULL, UNIQUE, PRIMARY KEY): no attacker edit, not counted.
        package var refused = 0
        /// Edits that would change nothing (the older copy holds the same value).
        package var identical = 0
        package var verifyDetected = 0
        package var verifySound = 0
        /// Edits that made some read fail closed while `verify` called the file sound.
        package var verifyMissed: [String: Int] = [:]
        package var verifyMissedTargets: [String: [String]] = [:]
        /// Violating reads by table.column and kind, and the rows they were seen on.
        package var violationKinds: [String: Int] = [:]
        package var violationTargets: [String: [String]] = [:]
        package var throttleChecks = 0
        /// What `unlock(passphrase:)` gave in the `unlock` state, by status (0: unlocked), and the
        /// `Vault.open` failures of the fresh handles.
        package var unlockOutcomes: [Int32: Int] = [:]
        package var openFailures: [Int32: Int] = [:]
        /// Counter checks (not reads) that found the count brought down: part of the violations.
        package var counterViolations = 0
        /// Deletion-time reads among the reads, and those that found no record where the
        /// unedited file has one (a record removed or moved: not a violation, see above).
        package var deletionReads = 0
        package var forgottenDeletions = 0
        package var forgottenTargets: [String] = []
        /// Reads not made because an edited attempt counter made the unlock wait 30 s (the
        /// counter counts as tampered: the longest delay applies).
        package var throttledUnlocks = 0
        package var states: [String] = []
        /// Times the kernel keyring had lost the vault's keys (to other programs' unlocks) and
        /// they were put back; edits tried again because it happened during their reads.
        package var keyringRestores = 0
        package var retried = 0
        package var items = 0
        package var seconds = 0.0

        package var summary: String {
            var lines: [String] = []
            lines.append(
                "tamper campaign: \(totals.edits) edits, \(totals.reads) reads in \(String(format: "%.0f", seconds)) s; "
                    + "\(items) items, states: \(states.joined(separator: ", ")), plus Vault.verify")
            lines.append(
                "  totals: fail-closed \(totals.failClosed), unaffected-correct \(totals.correct), "
                    + "unaffected-same-status \(totals.unchanged), violations \(totals.violations)")
            let statuses = closedByStatus.sorted { $0.key > $1.key }.map { "\($0.key): \($0.value)" }.joined(separator: ", ")
            lines.append("  fail-closed by status: \(statuses.isEmpty ? "none" : statuses)")
            lines.append(
                "  verify: detected \(verifyDetected), sound \(verifySound); sound although a read failed closed: "
                    + "\(verifyMissed.values.reduce(0, +))")
            for (what, count) in verifyMissed.sorted(by: { $0.key < $1.key }) {
                lines.append("    - \(what): \(count) edits, of \((verifyMissedTargets[what] ?? []).joined(separator: ", "))")
            }
            let unlocks = unlockOutcomes.sorted { $0.key > $1.key }.map { "\($0.key == 0 ? "unlocked" : String($0.key)): \($0.value)" }
            let opens = openFailures.sorted { $0.key > $1.key }.map { "\($0.key): \($0.value)" }
            lines.append(
                "  unlock(passphrase:) in the unlock state: \(unlocks.joined(separator: ", ")); fresh Vault.open refused: "
                    + (opens.isEmpty ? "never" : opens.joined(separator: ", ")))
            lines.append(
                "  attempt counter checked after \(throttleChecks) edits; unlocks not tried because the edited counter "
                    + "imposed the 30 s delay: \(throttledUnlocks)")
            lines.append(
                "  recorded deletions read: \(deletionReads); forgotten (a record gone: that delete then loses to later edits): "
                    + "\(forgottenDeletions)\(forgottenTargets.isEmpty ? "" : ", by " + forgottenTargets.joined(separator: ", "))")
            lines.append("  edits refused by SQLite's constraints (not counted): \(refused); replays identical to the file: \(identical)")
            lines.append("  keys put back in the kernel keyring after other programs' unlocks freed them: \(keyringRestores); edits tried again: \(retried)")
            lines.append("")
            let header = "  " + pad("table", 16) + pad("column", 26) + pad("mutation", 26)
                + ["edits", "reads", "closed", "correct", "same", "VIOL"].map { padLeft($0, 7) }.joined()
            lines.append(header)
            for table in tableOrder {
                for (key, tally) in tallies.filter({ $0.key.table == table }).sorted(by: { $0.key < $1.key }) {
                    lines.append(
                        "  " + pad(key.table, 16) + pad(key.column, 26) + pad(key.mutation, 26)
                            + [tally.edits, tally.reads, tally.failClosed, tally.correct, tally.unchanged, tally.violations]
                            .map { padLeft(String($0), 7) }.joined())
                }
            }
            lines.append("")
            lines.append("  violations: \(totals.violations) (reads and counter checks), by column and kind:")
            for (kind, count) in violationKinds.sorted(by: { $0.key < $1.key }) {
                lines.append("    - \(kind): \(count), on \((violationTargets[kind] ?? []).joined(separator: ", "))")
            }
            if !violations.isEmpty { lines.append("  the first of them:") }
            for violation in violations.prefix(12) { lines.append("    - \(violation)") }
            return lines.joined(separator: "\n")
        }

        private func pad(_ text: String, _ width: Int) -> String {
            text.count >= width ? text + " " : text + String(repeating: " ", count: width - text.count)
        }

        private func padLeft(_ text: String, _ width: Int) -> String {
            text.count >= width ? " " + text : String(repeating: " ", count: width - text.count) + text
        }
    }

    package static func run(_ options: Options) throws -> Report {
        let start = Date()
        let campaign = try Campaign(options: options)
        // Nothing stays in the kernel keyring, also when the run fails.
        defer { campaign.finish() }
        var report = try campaign.run()
        report.seconds = Date().timeIntervalSince(start)
        return report
    }
}

// MARK: - Values

/// A stored SQLite value with its storage class.
enum SQLValue: Equatable {
    case null
    case integer(Int)
    case real(Double)
    case text([UInt8])
    case blob([UInt8])

    /// The SQL expression to put in a statement for this value, and the binding it needs.
    var expression: String {
        switch self {
        case .null: "NULL"
        case .text: "CAST(? AS TEXT)"
        default: "?"
        }
    }

    /// Binds the value at `index` when its expression has a placeholder; returns the next index.
    func bind(_ statement: Statement, _ index: Int32) -> Int32 {
        switch self {
        case .null: return index
        case .integer(let value): statement.bind(index, value)
        case .real(let value): statement.bind(index, value)
        case .text(let bytes), .blob(let bytes): statement.bind(index, bytes)
        }
        return index + 1
    }

    var bytes: [UInt8]? {
        switch self {
        case .text(let bytes), .blob(let bytes): bytes
        default: nil
        }
    }

    static func read(_ statement: Statement, typeColumn: Int32) -> SQLValue {
        switch statement.text(typeColumn) {
        case "integer": .integer(statement.integer(typeColumn + 1) ?? 0)
        case "real": .real(statement.double(typeColumn + 1) ?? 0)
        case "text": .text(statement.blob(typeColumn + 1) ?? [])
        case "blob": .blob(statement.blob(typeColumn + 1) ?? [])
        default: .null
        }
    }
}

/// One row of a table: its values by column.
struct TableRow {
    var values: [String: SQLValue]
}

/// A table's layout and how its rows are named.
struct TableSpec {
    var name: String
    var columns: [String]
    /// The columns that identify a row in this file (its primary key).
    var key: [String]
    /// The columns that identify the same row in the older copy.
    var match: [String]
    /// The column whose value names a row in reports (header fields are rows).
    var fieldColumn: String?

    static let all: [TableSpec] = [
        TableSpec(name: "items", columns: [], key: ["rowid"], match: ["id"]),
        TableSpec(name: "header", columns: [], key: ["name"], match: ["name"], fieldColumn: "name"),
        TableSpec(name: "key_slots", columns: [], key: ["id"], match: ["id"]),
        TableSpec(name: "class_keys", columns: [], key: ["accessibility", "device_id"], match: ["accessibility", "device_id"]),
        TableSpec(name: "vault_state", columns: [], key: ["id"], match: ["id"]),
        TableSpec(name: "integrity_groups", columns: [], key: ["id"], match: ["id"]),
        TableSpec(name: "unlock_attempts", columns: [], key: ["id"], match: ["id"]),
        TableSpec(name: "sync_deletions", columns: [], key: ["reference"], match: ["reference"]),
    ]
}

// MARK: - Items read back

/// An item of the campaign's vault and how an application would ask for it.
struct Probe {
    var name: String
    var item: Item
    var query: Query
    /// The value in the older copy (nil: the item did not exist yet).
    var olderValue: String?
    /// The value in the pristine file (nil: deleted since the older copy).
    var currentValue: String?
    /// The value written after the pristine copy, which lives only in the write-ahead log.
    var walValue: String? = nil
}

enum ReadResult: Equatable {
    case value([UInt8])
    case status(Int32)

    var label: String {
        switch self {
        case .value: "a value"
        case .status(let status): "\(status)"
        }
    }
}

/// The OSStatus `body` throws; nil when it returns.
func status(_ body: () throws -> Void) -> Int32? {
    do {
        try body()
        return nil
    } catch let error as LockboxError {
        return error.status
    } catch {
        return 1
    }
}

struct FixedPassphrase: PresenceVerifier {
    let passphrase: String
    func passphrase(for request: AuthenticationRequest) throws(LockboxError) -> SecretBytes { SecretBytes(utf8: passphrase) }
}

// MARK: - Edits

struct Edit {
    enum Base {
        case pristine
        /// The pristine file with one more write that lives only in the write-ahead log.
        case withWAL
    }

    var table: String
    var column: String
    var mutation: String
    /// The row or field edited, for violation reports.
    var target: String
    var base: Base = .pristine
    /// False for edits of the whole file: a handle opened before keeps reading the file it opened.
    var live = true
    var apply: (Campaign) throws -> Void
}

/// Thrown by an edit SQLite refuses (a NOT NULL, UNIQUE or PRIMARY KEY constraint).
struct Refused: Error {}

/// The kernel keyring lost the vault's keys during an edit's reads: the edit is tried again.
struct KeyringLost: Error {}

// MARK: - The campaign

final class Campaign {
    let options: TamperCampaign.Options
    let root: String
    let path: String
    let passphrase = "tamper-current"
    let initialPassphrase = "tamper-initial"
    var keyringConfiguration: Vault.Configuration
    var memoryConfiguration: Vault.Configuration
    let keyring: Bool
    var probes: [Probe] = []
    /// The deleted synchronizable items and their rows' references (the keys of their records).
    var deletionProbes: [(name: String, reference: Data)] = []
    /// Pristine file bytes, the older copy, and the write-ahead-log base (main file and WAL).
    var pristine = Data()
    var older = Data()
    var walMain = Data()
    var wal = Data()
    /// The remembered generations (outside the file) for each base.
    var rememberedPristine: [String: Data] = [:]
    var rememberedWAL: [String: Data] = [:]
    var generationsDirectory: String
    /// Rows of each table in the pristine file and the older copy.
    var pristineRows: [String: [TableRow]] = [:]
    var olderRows: [String: [TableRow]] = [:]
    var specs: [String: TableSpec] = [:]
    /// Item names by row id (`items.id`).
    var probeByRowID: [[UInt8]: String] = [:]
    /// What each read gives on the unedited file, per base, state and item.
    var baseline: [String: ReadResult] = [:]
    var failuresRecorded = 4
    var report = TamperCampaign.Report()
    static let states = ["live", "keyring", "locked", "unlock"]

    init(options: TamperCampaign.Options) throws {
        self.options = options
        root = options.directory + "/tamper"
        path = root + "/vault/tamper.lockbox"
        var configuration = Vault.Configuration()
        configuration.keyDerivation = .interactive
        configuration.idleTimeout = .zero
        configuration.device = DeviceIdentity(keyPath: root + "/state/device-key")
        keyringConfiguration = configuration
        keyringConfiguration.unlockCache = .kernelKeyring
        memoryConfiguration = configuration
        memoryConfiguration.unlockCache = .processMemory
        generationsDirectory = root + "/state/generations"

        // The kernel keyring holds the keys for the `live` and `keyring` states; without it
        // (some containers forbid keyctl) those states are left out and the summary says so.
        let (vault, keyring) = try Self.create(path: path, passphrase: initialPassphrase, keyring: keyringConfiguration, memory: memoryConfiguration)
        self.keyring = keyring
        do {
            try setUp(vault)
        } catch {
            vault.lockAll()
            throw error
        }
    }

    static func create(
        path: String, passphrase: String, keyring: Vault.Configuration, memory: Vault.Configuration
    ) throws -> (Vault, Bool) {
        let created = Result { () throws(LockboxError) -> Vault in
            try Vault.create(at: path, passphrase: SecretBytes(utf8: passphrase), configuration: keyring)
        }
        switch created {
        case .success(let vault): return (vault, true)
        case .failure(let error) where error.code == .notAvailable:
            for suffix in ["", "-wal", "-shm"] { unlink(path + suffix) }
            return (try Vault.create(at: path, passphrase: SecretBytes(utf8: passphrase), configuration: memory), false)
        case .failure(let error): throw error
        }
    }

    var states: [String] { keyring ? Self.states : ["locked", "unlock"] }

    // MARK: Setting up

    func makeProbes() -> [Probe] {
        func generic(
            _ name: String, service: String, account: String, _ accessibility: Accessibility, group: String = Vault.defaultAccessGroup,
            synchronizable: Bool = false, accessControl: AccessControl? = nil, older: String?, current: String?
        ) -> Probe {
            var item = Item.genericPassword(
                service: service, account: account, data: SecretBytes(utf8: older ?? current ?? ""), accessibility: accessibility,
                accessGroup: group)
            item.attributes.synchronizable = synchronizable
            item.accessControl = accessControl
            var query = Query.genericPassword(service: service, account: account, accessGroup: group)
            query.synchronizable = synchronizable ? .synchronizable : .notSynchronizable
            query.returning = [.data]
            return Probe(name: name, item: item, query: query, olderValue: older, currentValue: current)
        }
        var probes = [
            generic("mail/alice", service: "mail", account: "alice", .whenUnlocked, older: "alice-v1", current: "alice-v2"),
            generic("mail/bob", service: "mail", account: "bob", .whenUnlocked, older: "bob-v1", current: "bob-v1"),
            generic("team/mail/alice", service: "mail", account: "alice", .whenUnlocked, group: "team.shared", older: "team-alice", current: "team-alice"),
            generic("oauth/refresh", service: "oauth", account: "refresh", .afterFirstUnlock, older: "rt-1", current: "rt-2"),
            generic("daemon/token", service: "daemon", account: "token", .afterFirstUnlockThisDeviceOnly, older: "daemon-1", current: "daemon-1"),
            generic("vpn/carol", service: "vpn", account: "carol", .whenUnlockedThisDeviceOnly, older: "vpn-1", current: "vpn-1"),
            generic("bank/otp", service: "bank", account: "otp", .whenPasscodeSetThisDeviceOnly, older: "otp-1", current: "otp-1"),
            generic("boot/pin", service: "boot", account: "pin", .always, older: "pin-1", current: "pin-2"),
            generic("boot/tdo", service: "boot", account: "tdo", .alwaysThisDeviceOnly, older: "tdo-1", current: "tdo-1"),
            generic("sync/alice", service: "sync", account: "alice", .afterFirstUnlock, synchronizable: true, older: "sync-1", current: "sync-1"),
            generic("safe/alice", service: "safe", account: "alice", .whenUnlocked, accessControl: .userPresence, older: "safe-1", current: "safe-1"),
            generic("gone/item", service: "gone", account: "item", .whenUnlocked, older: "gone-1", current: nil),
            // Deleted synchronizable items: their deletions are recorded for sync.
            generic("sync/gone-a", service: "sync-gone", account: "a", .afterFirstUnlock, synchronizable: true, older: "sga-1", current: nil),
            generic("sync/gone-b", service: "sync-gone", account: "b", .whenUnlocked, synchronizable: true, older: "sgb-1", current: nil),
            generic("late/item", service: "late", account: "item", .afterFirstUnlock, older: nil, current: "late-1"),
        ]
        var walItem = generic("wal/item", service: "wal", account: "item", .whenUnlocked, older: nil, current: nil)
        walItem.walValue = "wal-1"
        probes.append(walItem)
        // Internet passwords: one asked for by its full primary key, one by server and account
        // (as the git credential helper asks).
        var full = Item(
            .internetPassword,
            attributes: .internet(
                server: "git.example.com", account: "alice", protocol: .https, port: 443, path: "/repo", securityDomain: "",
                authenticationType: .htmlForm),
            data: SecretBytes(utf8: "git-1"))
        full.attributes.accessibility = .whenUnlocked
        var fullQuery = Query(.internetPassword, attributes: full.attributes)
        fullQuery.attributes.accessibility = nil
        fullQuery.attributes.accessGroup = Vault.defaultAccessGroup
        fullQuery.returning = [.data]
        probes.append(Probe(name: "inet/git", item: full, query: fullQuery, olderValue: "git-1", currentValue: "git-2"))
        var partial = Item(
            .internetPassword, attributes: .internet(server: "registry.example.com", account: "bob", protocol: .https),
            data: SecretBytes(utf8: "registry-1"))
        partial.attributes.accessibility = .afterFirstUnlock
        var partialQuery = Query(.internetPassword, attributes: .internet(server: "registry.example.com", account: "bob"))
        partialQuery.returning = [.data]
        probes.append(Probe(name: "inet/registry", item: partial, query: partialQuery, olderValue: "registry-1", currentValue: "registry-1"))
        return probes
    }

    /// Runs a setup step, naming it in the error.
    func step(_ name: String, _ body: () throws -> Void) throws {
        do {
            try body()
        } catch let error as LockboxError {
            throw LockboxError(error.code, "tamper campaign setup: \(name): \(error.message)")
        }
    }

    func setUp(_ vault: Vault) throws {
        probes = makeProbes()
        // The older copy: every item but the late one, before the updates and the passphrase change.
        try vault.add(contentsOf: probes.filter { $0.olderValue != nil }.map(\.item))
        try vault.withDatabase { database throws(LockboxError) in database.truncateWriteAheadLog() }
        older = try Data(contentsOf: URL(fileURLWithPath: path))

        for probe in probes {
            if let current = probe.currentValue, let olderValue = probe.olderValue, current != olderValue {
                try step("update \(probe.name)") { try vault.update(matching: probe.query, to: ItemUpdate(data: SecretBytes(utf8: current))) }
            }
        }
        for probe in probes where probe.currentValue == nil && probe.olderValue != nil {
            if probe.item.attributes.synchronizable == true {
                var query = probe.query
                query.returning = [.attributes]
                guard let reference = try vault.items(matching: query).first?.persistentReference else {
                    throw LockboxError(.param, "tamper campaign: \(probe.name) has no persistent reference")
                }
                deletionProbes.append((probe.name, reference))
                probeByRowID[Array(reference)] = probe.name
            }
            try step("delete \(probe.name)") { _ = try vault.delete(matching: probe.query) }
        }
        // A passphrase change rotates the master and class keys and reseals every row: the
        // older copy's key slot, class keys and rows all differ from the pristine ones.
        try vault.changePassphrase(from: SecretBytes(utf8: initialPassphrase), to: SecretBytes(utf8: passphrase))
        for probe in probes where probe.olderValue == nil && probe.currentValue != nil {
            var item = probe.item
            item.data = SecretBytes(utf8: probe.currentValue!)
            try vault.add(item)
        }
        for probe in probes where probe.currentValue != nil {
            var query = probe.query
            query.returning = [.attributes]
            query.authenticationContext = AuthenticationContext(interactionNotAllowed: true)
            if probe.item.accessControl != nil {
                query.authenticationContext = AuthenticationContext(verifier: FixedPassphrase(passphrase: passphrase))
            }
            guard let reference = try vault.items(matching: query).first?.persistentReference else {
                throw LockboxError(.param, "tamper campaign: \(probe.name) has no persistent reference")
            }
            probeByRowID[Array(reference)] = probe.name
        }
        // Failed unlocks recorded in the file: an edit must never bring the count down.
        let guesser = try Vault.open(at: path, configuration: memoryConfiguration)
        for _ in 0..<failuresRecorded {
            let failure = status { try guesser.unlock(passphrase: SecretBytes(utf8: "wrong guess")) }
            guard failure == LockboxError.Code.authFailed.rawValue else {
                throw LockboxError(.param, "tamper campaign: a wrong passphrase gave \(failure ?? 0)")
            }
        }
        guard try guesser.status().failedUnlockAttempts == failuresRecorded else {
            throw LockboxError(.param, "tamper campaign: the attempt counter did not count \(failuresRecorded) failures")
        }
        try vault.withDatabase { database throws(LockboxError) in database.truncateWriteAheadLog() }
        guard !FileManager.default.fileExists(atPath: path + "-wal") || fileSize(path + "-wal") == 0 else {
            throw LockboxError(.param, "tamper campaign: the write-ahead log was not checkpointed")
        }
        pristine = try Data(contentsOf: URL(fileURLWithPath: path))
        rememberedPristine = try snapshotGenerations()

        // The write-ahead-log base: one more write, copied while it lives only in the WAL.
        try restore(.pristine)
        do {
            let writer = try Vault.open(at: path, configuration: keyring ? keyringConfiguration : memoryConfiguration)
            if !keyring { try writer.unlock(passphrase: SecretBytes(utf8: passphrase)) }
            // An update or a deletion checkpoints the log at once; an addition does not.
            var item = probe("wal/item").item
            item.data = SecretBytes(utf8: probe("wal/item").walValue!)
            try writer.add(item)
            walMain = try Data(contentsOf: URL(fileURLWithPath: path))
            wal = try Data(contentsOf: URL(fileURLWithPath: path + "-wal"))
            rememberedWAL = try snapshotGenerations()
        }
        guard !wal.isEmpty else { throw LockboxError(.param, "tamper campaign: the write-ahead log is empty") }

        // The tables as stored, to edit and replay from.
        let olderPath = root + "/older.lockbox"
        try writeFile(olderPath, older)
        try restore(.pristine)
        for var spec in TableSpec.all {
            let raw = try Database(path: path, create: false)
            spec.columns = try columns(of: spec.name, in: raw)
            specs[spec.name] = spec
            pristineRows[spec.name] = try rows(of: spec, in: raw)
            let olderDatabase = try Database(path: olderPath, create: false)
            olderRows[spec.name] = try rows(of: spec, in: olderDatabase)
        }
        unlink(olderPath)
        for suffix in ["-wal", "-shm"] { unlink(olderPath + suffix) }
        if keyring {
            try FileManager.default.createDirectory(
                atPath: root + "/sentinel", withIntermediateDirectories: true, attributes: [.posixPermissions: 0o700])
            try writeFile(sentinelPath, pristine)
            try ensureKeyring()
        }

        // The unedited file in every state: what each read gives without an attack.
        for base in [Edit.Base.pristine, .withWAL] {
            let control = Edit(table: "(none)", column: "", mutation: "control", target: "", base: base) { _ in }
            let results = try observe(control)
            for (key, result) in results.reads { baseline[key] = result }
            try checkBaseline(base: base)
        }
    }

    /// The unedited file must read as designed, or the campaign measures nothing.
    func checkBaseline(base: Edit.Base) throws {
        for state in states {
            for deletion in deletionProbes {
                let got = baseline[readKey(base, state, deletionKey(deletion.name))]
                let expected = state == "locked" ? ReadResult.status(LockboxError.Code.interactionNotAllowed.rawValue) : nil
                guard let got, expected.map({ got == $0 }) ?? (got.label == "a value") else {
                    throw LockboxError(
                        .param, "tamper campaign: the unedited file gives \(got?.label ?? "nothing") for the deletion of \(deletion.name) in state \(state)")
                }
            }
            for probe in probes {
                let got = baseline[readKey(base, state, probe.name)]
                let expected = expectedUnedited(probe, state: state, base: base)
                guard got == expected else {
                    throw LockboxError(
                        .param, "tamper campaign: the unedited file gives \(got?.label ?? "nothing") for \(probe.name) in state \(state), expected \(expected.label)")
                }
            }
        }
    }

    func expectedUnedited(_ probe: Probe, state: String, base: Edit.Base) -> ReadResult {
        let accessibility = probe.item.attributes.accessibility ?? .whenUnlocked
        guard let value = base == .withWAL ? probe.walValue ?? probe.currentValue : probe.currentValue else {
            return .status(state == "locked" ? LockboxError.Code.interactionNotAllowed.rawValue : LockboxError.Code.itemNotFound.rawValue)
        }
        switch state {
        case "locked":
            return accessibility.availability == .always ? .value(Array(value.utf8)) : .status(LockboxError.Code.interactionNotAllowed.rawValue)
        case "unlock":
            return .value(Array(value.utf8))
        default:
            return probe.item.accessControl != nil ? .status(LockboxError.Code.interactionNotAllowed.rawValue) : .value(Array(value.utf8))
        }
    }

    func probe(_ name: String) -> Probe { probes.first { $0.name == name }! }

    // MARK: The kernel keyring

    /// An unedited copy of the vault, whose handles tell whether the kernel keyring still holds
    /// the vault's keys: other programs of this user unlocking many vaults can make Lockbox free
    /// the least recently unlocked ones' entries, and a read would then be "locked" for a reason
    /// that has nothing to do with the edit.
    var sentinelPath: String { root + "/sentinel/tamper.lockbox" }

    func keyringHolds() -> Bool {
        // Opened without its checks: the sentinel is a copy of the same vault, which the edits'
        // writes may have left behind the generation this machine remembers for it.
        guard let vault = try? Vault.open(at: sentinelPath, configuration: keyringConfiguration, checked: false),
            let status = try? vault.status()
        else { return false }
        return status.isUnlocked && status.wasUnlockedSinceBoot
    }

    /// Puts the keys back in the kernel keyring when they are gone.
    func ensureKeyring() throws {
        guard !keyringHolds() else { return }
        report.keyringRestores += 1
        let vault = try Vault.open(at: sentinelPath, configuration: keyringConfiguration, checked: false)
        try vault.unlock(passphrase: SecretBytes(utf8: passphrase))
        guard keyringHolds() else { throw LockboxError(.notAvailable, "tamper campaign: the kernel keyring does not keep the vault's keys") }
    }

    func finish() {
        // Leave nothing in the kernel keyring.
        try? restore(.pristine)
        if keyring, let vault = try? Vault.open(at: path, configuration: keyringConfiguration) { vault.lockAll() }
    }

    // MARK: Files

    func fileSize(_ path: String) -> Int {
        ((try? FileManager.default.attributesOfItem(atPath: path))?[.size] as? NSNumber)?.intValue ?? 0
    }

    func writeFile(_ path: String, _ data: Data) throws {
        unlink(path)
        guard FileManager.default.createFile(atPath: path, contents: data, attributes: [.posixPermissions: 0o600]) else {
            throw LockboxError(.io, "tamper campaign: cannot write \(path)")
        }
    }

    func snapshotGenerations() throws -> [String: Data] {
        var files: [String: Data] = [:]
        for name in (try? FileManager.default.contentsOfDirectory(atPath: generationsDirectory)) ?? [] {
            files[name] = try Data(contentsOf: URL(fileURLWithPath: generationsDirectory + "/" + name))
        }
        return files
    }

    /// Puts a base in place: the file, no WAL (or the base's WAL), and the generation this
    /// machine remembers for it.
    func restore(_ base: Edit.Base) throws {
        for suffix in ["", "-wal", "-shm"] { unlink(path + suffix) }
        switch base {
        case .pristine: try writeFile(path, pristine)
        case .withWAL:
            try writeFile(path, walMain)
            try writeFile(path + "-wal", wal)
        }
        let remembered = base == .pristine ? rememberedPristine : rememberedWAL
        for name in (try? FileManager.default.contentsOfDirectory(atPath: generationsDirectory)) ?? [] where remembered[name] == nil {
            unlink(generationsDirectory + "/" + name)
        }
        for (name, data) in remembered { try writeFile(generationsDirectory + "/" + name, data) }
        // The kernel keyring's record too (every environment's): set to the base's generation.
        for name in Set(((try? FileManager.default.contentsOfDirectory(atPath: generationsDirectory)) ?? []) + Array(remembered.keys))
        where name.count == 32 && !name.contains(".") {
            let bytes = remembered[name].map { Array($0) }
            RememberedGeneration.setSharedGeneration(
                vaultID: name, to: bytes.flatMap { $0.count == 8 ? RememberedGeneration.generation(of: $0) : nil })
        }
    }

    // MARK: Raw tables

    func columns(of table: String, in database: Database) throws -> [String] {
        let statement = try database.statement("PRAGMA table_info(\(table))")
        defer { statement.reset() }
        var names: [String] = []
        while try statement.step() { if let name = statement.text(1) { names.append(name) } }
        return names
    }

    func rows(of spec: TableSpec, in database: Database) throws -> [TableRow] {
        let selection = spec.columns.map { "typeof(\($0)), \($0)" }.joined(separator: ", ")
        let statement = try database.statement("SELECT \(selection) FROM \(spec.name) ORDER BY \(spec.key.joined(separator: ", "))")
        defer { statement.reset() }
        var rows: [TableRow] = []
        while try statement.step() {
            var values: [String: SQLValue] = [:]
            for (index, column) in spec.columns.enumerated() { values[column] = SQLValue.read(statement, typeColumn: Int32(index * 2)) }
            rows.append(TableRow(values: values))
        }
        return rows
    }

    /// Replaces `old` rows of a table with `new` ones in one transaction (delete, then insert with
    /// every column given): an UPDATE of any column, keys included, a swap, a replay, a deletion
    /// (no new rows) or a duplicate (the old row kept among the new ones).
    func replace(_ table: String, _ old: [TableRow], with new: [TableRow]) throws {
        let spec = specs[table]!
        let database = try Database(path: path, create: false)
        try database.execute("PRAGMA ignore_check_constraints = ON")
        do {
            try database.writeTransaction { () throws(LockboxError) in
                for row in old {
                    let condition = spec.key.map { column in
                        row.values[column]! == .null ? "\(column) IS NULL" : "\(column) = \(row.values[column]!.expression)"
                    }
                    let statement = try database.statement("DELETE FROM \(table) WHERE " + condition.joined(separator: " AND "))
                    var index: Int32 = 1
                    for column in spec.key { index = row.values[column]!.bind(statement, index) }
                    try statement.run()
                    guard database.changes == 1 else { throw LockboxError(.param, "tamper campaign: no row to replace in \(table)") }
                }
                for row in new {
                    let columns = spec.columns
                    let statement = try database.statement(
                        "INSERT INTO \(table) (\(columns.joined(separator: ", "))) VALUES ("
                            + columns.map { (row.values[$0] ?? .null).expression }.joined(separator: ", ") + ")")
                    var index: Int32 = 1
                    for column in columns { index = (row.values[column] ?? .null).bind(statement, index) }
                    try statement.run()
                }
            }
        } catch {
            // SQLITE_CONSTRAINT, or SQLITE_MISMATCH (a row id that is not an integer): the
            // schema forbids this edit.
            if let code = error.sqliteExtendedCode, code & 0xff == 19 || code & 0xff == 20 { throw Refused() }
            throw error
        }
    }

    // MARK: Observing

    struct Observation {
        var reads: [String: ReadResult] = [:]
        /// Verify's verdict: nil sound, otherwise what it reported or threw.
        var verifyProblem: String??
        var failures: Int?
        var unlockSkipped = false
        var openFailures: [String: Int32] = [:]
    }

    func readKey(_ base: Edit.Base, _ state: String, _ probe: String) -> String { "\(base)|\(state)|\(probe)" }

    func read(_ vault: Vault, _ probe: Probe, context: AuthenticationContext?) -> ReadResult {
        var query = probe.query
        if let context { query.authenticationContext = context }
        do {
            let data = try vault.data(matching: query)
            return .value(data.withUnsafeBytes { Array($0) })
        } catch {
            return .status(error.status)
        }
    }

    func readAll(_ vault: Vault?, state: String, base: Edit.Base, openStatus: Int32?, context: Bool, into observation: inout Observation) {
        for probe in probes {
            let key = readKey(base, state, probe.name)
            guard let vault else {
                observation.reads[key] = .status(openStatus ?? 0)
                continue
            }
            let verification = context && probe.item.accessControl != nil
                ? AuthenticationContext(verifier: FixedPassphrase(passphrase: passphrase)) : nil
            observation.reads[key] = read(vault, probe, context: verification)
        }
        for deletion in deletionProbes {
            let key = readKey(base, state, deletionKey(deletion.name))
            guard let vault else {
                observation.reads[key] = .status(openStatus ?? 0)
                continue
            }
            do {
                let time = try vault.deletionTimes(of: [deletion.reference])[deletion.reference]
                observation.reads[key] = time.map { .value(Array(String($0.timeIntervalSince1970).utf8)) }
                    ?? .status(LockboxError.Code.itemNotFound.rawValue)
            } catch {
                observation.reads[key] = .status(error.status)
            }
        }
    }

    /// The read name of a deleted item's recorded deletion time.
    func deletionKey(_ name: String) -> String { "deletion of " + name }

    func open(_ configuration: Vault.Configuration, state: String, into observation: inout Observation) -> (Vault?, Int32?) {
        let (vault, status) = open(configuration)
        if let status { observation.openFailures[state] = status }
        return (vault, status)
    }

    func open(_ configuration: Vault.Configuration) -> (Vault?, Int32?) {
        do {
            return (try Vault.open(at: path, configuration: configuration), nil)
        } catch {
            return (nil, error.status)
        }
    }

    /// Restores the edit's base, applies the edit and reads everything in every state.
    func observe(_ edit: Edit) throws -> Observation {
        if keyring { try ensureKeyring() }
        try restore(edit.base)
        var observation = Observation()
        var live: Vault?
        if keyring && edit.live {
            live = try Vault.open(at: path, configuration: keyringConfiguration)
            var warmUp = Observation()
            readAll(live, state: "live", base: edit.base, openStatus: nil, context: false, into: &warmUp)
        }
        try edit.apply(self)

        if keyring {
            // A handle opened before a whole-file edit keeps reading the file it opened: nothing to see.
            if edit.live { readAll(live, state: "live", base: edit.base, openStatus: nil, context: false, into: &observation) }
            live = nil
            let (vault, status) = open(keyringConfiguration, state: "keyring", into: &observation)
            readAll(vault, state: "keyring", base: edit.base, openStatus: status, context: false, into: &observation)
        }

        // Verify before anything writes to the file (an unlock clears the attempt counter).
        do {
            let report = try Vault.verify(at: path, configuration: keyring ? keyringConfiguration : memoryConfiguration)
            observation.verifyProblem = report.isSound ? .some(nil) : .some(report.problems.joined(separator: " "))
        } catch {
            observation.verifyProblem = .some("\(error.status)")
        }

        let (locked, lockedStatus) = open(memoryConfiguration, state: "locked", into: &observation)
        locked?.lockAll()
        readAll(locked, state: "locked", base: edit.base, openStatus: lockedStatus, context: false, into: &observation)
        if let locked { observation.failures = try? locked.status().failedUnlockAttempts }

        // An edited attempt counter counts as the longest delay (30 s): the unlock would wait
        // it out. The counter itself is checked above; the reads would be those of `keyring`.
        let wait = Vault.delay(afterFailures: observation.failures ?? 0)
        if wait > Vault.delay(afterFailures: failuresRecorded) {
            observation.unlockSkipped = true
        } else {
            let (vault, status) = open(memoryConfiguration, state: "unlock-open", into: &observation)
            if let vault {
                vault.lockAll()
                do {
                    try vault.unlock(passphrase: SecretBytes(utf8: passphrase))
                } catch {
                    observation.openFailures["unlock"] = error.status
                }
            }
            readAll(vault, state: "unlock", base: edit.base, openStatus: status, context: true, into: &observation)
        }
        // Keys freed from the keyring meanwhile make the `live` and `keyring` reads meaningless.
        if keyring && !keyringHolds() { throw KeyringLost() }
        return observation
    }

    // MARK: Classifying

    func classify(_ edit: Edit, _ observation: Observation, into report: inout TamperCampaign.Report) {
        let key = TamperCampaign.Key(table: edit.table, column: edit.column, mutation: edit.mutation)
        var tally = TamperCampaign.Tally()
        tally.edits = 1
        var closed = false
        var violations: [(String, String)] = []
        // A status other than the unedited file's: a closed failure, or a violation described
        // by `what`.
        func countChanged(_ status: Int32, state: String, place: String, what: String) {
            if isClosed(status, state: state) {
                tally.failClosed += 1
                closed = true
                report.closedByStatus[status, default: 0] += 1
            } else {
                tally.violations += 1
                violations.append((place, what))
            }
        }
        for state in states {
            if state == "unlock" && observation.unlockSkipped {
                report.throttledUnlocks += 1
                continue
            }
            for deletion in deletionProbes {
                let name = deletionKey(deletion.name)
                let readKey = readKey(edit.base, state, name)
                guard let got = observation.reads[readKey], let before = baseline[readKey] else { continue }
                tally.reads += 1
                report.deletionReads += 1
                switch (got, before) {
                case (.value(let value), .value(let expected)) where value == expected:
                    tally.correct += 1
                case (.value, _):
                    tally.violations += 1
                    violations.append(("\(state) \(name)", "a WRONG deletion time"))
                case (.status(let status), .status(let expected)) where status == expected:
                    tally.unchanged += 1
                case (.status(let status), .value) where status == LockboxError.Code.itemNotFound.rawValue:
                    // A record gone: that delete is then stamped just after the version known.
                    tally.correct += 1
                    report.forgottenDeletions += 1
                    let target = "\(edit.table).\(edit.column) \(edit.mutation)"
                    if !report.forgottenTargets.contains(target) { report.forgottenTargets.append(target) }
                case (.status(let status), _):
                    countChanged(
                        status, state: state, place: "\(state) \(name)", what: "status \(status) where the unedited file gives \(before.label)")
                }
            }
            for probe in probes {
                let readKey = readKey(edit.base, state, probe.name)
                guard let got = observation.reads[readKey], let before = baseline[readKey] else { continue }
                tally.reads += 1
                switch (got, before) {
                case (.value(let value), .value(let expected)) where value == expected:
                    tally.correct += 1
                case (.value(let value), _):
                    tally.violations += 1
                    violations.append(("\(state) \(probe.name)", describe(value, for: probe, before: before)))
                case (.status(let status), .status(let expected)) where status == expected:
                    tally.unchanged += 1
                case (.status(let status), _):
                    let what = status == LockboxError.Code.itemNotFound.rawValue
                        ? "not found (-25300) for an item that is there" : "status \(status) where the unedited file gives \(before.label)"
                    countChanged(status, state: state, place: "\(state) \(probe.name)", what: what)
                }
            }
        }
        if !observation.unlockSkipped && observation.openFailures["unlock-open"] == nil {
            report.unlockOutcomes[observation.openFailures["unlock"] ?? 0, default: 0] += 1
        }
        for (state, status) in observation.openFailures where state != "unlock" { report.openFailures[status, default: 0] += 1 }
        if let failures = observation.failures {
            report.throttleChecks += 1
            if failures < failuresRecorded {
                tally.violations += 1
                report.counterViolations += 1
                violations.append(("counter", "the attempt counter reads fewer failed unlocks than were made"))
            }
        }
        switch observation.verifyProblem {
        case .some(.none):
            report.verifySound += 1
            if closed {
                let column = "\(edit.table).\(edit.column)"
                report.verifyMissed[column, default: 0] += 1
                if !(report.verifyMissedTargets[column] ?? []).contains(edit.target) {
                    report.verifyMissedTargets[column, default: []].append(edit.target)
                }
            }
        case .some(.some):
            report.verifyDetected += 1
        case .none:
            break
        }
        for (place, kind) in violations {
            report.violations.append("\(edit.table).\(edit.column) \(edit.mutation) [\(edit.target)]: \(place): \(kind)")
            report.violationKinds["\(edit.table).\(edit.column): \(kind)", default: 0] += 1
            if !(report.violationTargets["\(edit.table).\(edit.column): \(kind)"] ?? []).contains(edit.target) {
                report.violationTargets["\(edit.table).\(edit.column): \(kind)", default: []].append(edit.target)
            }
        }
        report.tallies[key, default: TamperCampaign.Tally()].add(tally)
        report.totals.add(tally)
        if !report.tableOrder.contains(edit.table) { report.tableOrder.append(edit.table) }
    }

    /// Closed failures: errSecDecode always; errSecInteractionNotAllowed (a key the edit took
    /// away reads as locked); errSecAuthFailed (an edited key slot reads as a wrong passphrase)
    /// only where a passphrase is checked.
    func isClosed(_ status: Int32, state: String) -> Bool {
        switch status {
        case LockboxError.Code.decode.rawValue, LockboxError.Code.interactionNotAllowed.rawValue: true
        case LockboxError.Code.authFailed.rawValue: state == "unlock"
        default: false
        }
    }

    func describe(_ value: [UInt8], for probe: Probe, before: ReadResult) -> String {
        let text = String(decoding: value, as: UTF8.self)
        if case .status(let status) = before { return "a value served where the unedited file gives \(status)" }
        if text == probe.olderValue { return "its OLDER value" }
        if probes.contains(where: { $0.name != probe.name && [$0.currentValue, $0.olderValue, $0.walValue].contains(text) }) {
            return "ANOTHER item's value"
        }
        return "a WRONG (forged) value"
    }

    // MARK: Running

    func run() throws -> TamperCampaign.Report {
        report.states = states
        report.items = probes.count
        let (edits, identical) = makeEdits()
        report.identical = identical
        for edit in edits {
            options.trace?("\(edit.table).\(edit.column) \(edit.mutation) [\(edit.target)]")
            var observation: Observation?
            var refused = false
            for _ in 0..<3 where observation == nil && !refused {
                do {
                    observation = try observe(edit)
                } catch is Refused {
                    report.refused += 1
                    refused = true
                } catch is KeyringLost {
                    report.retried += 1
                }
            }
            if refused { continue }
            guard let observation else {
                throw LockboxError(.notAvailable, "tamper campaign: the kernel keyring kept losing the vault's keys")
            }
            classify(edit, observation, into: &report)
        }
        return report
    }
}

// MARK: - The edits

extension Campaign {
    /// Items edited with every mutation of every column; the others get one mutation per
    /// column and the row-level edits.
    static let fullyEditedItems: Set<String> = ["mail/alice", "oauth/refresh", "boot/pin", "boot/tdo", "inet/git", "safe/alice"]

    func rowLabel(_ spec: TableSpec, _ row: TableRow) -> String {
        switch spec.name {
        case "items":
            if case .blob(let id) = row.values["id"] ?? .null, let name = probeByRowID[id] { return name }
            return "row"
        case "sync_deletions":
            if case .blob(let reference) = row.values["reference"] ?? .null, let name = probeByRowID[reference] { return "deletion of " + name }
            return "deletion"
        case "header":
            return String(decoding: row.values["name"]?.bytes ?? [], as: UTF8.self)
        case "class_keys":
            let accessibility = String(decoding: row.values["accessibility"]?.bytes ?? [], as: UTF8.self)
            let device = String(decoding: row.values["device_id"]?.bytes ?? [], as: UTF8.self)
            return accessibility + (device.isEmpty ? "" : device.hasPrefix("v2:") ? "@v2:device" : "@device")
        default:
            return "id " + (row.values[spec.key[0]].map { if case .integer(let value) = $0 { String(value) } else { "?" } } ?? "?")
        }
    }

    func columnLabel(_ spec: TableSpec, _ column: String, _ row: TableRow) -> String {
        spec.name == "header" ? "\(column)[\(rowLabel(spec, row))]" : column
    }

    /// The value mutations of one stored value: flipped bytes at several offsets, a truncation,
    /// an empty value and NULL for text and blobs; neighbours, a flipped second byte and NULL for
    /// integers. Each also changes storage class with the same bytes or number (a blob stored
    /// as text, text as a blob, an integer as a real and as text), which SQL's comparisons and
    /// conversions see differently from the bytes.
    func valueMutations(_ value: SQLValue) -> [(String, SQLValue)] {
        switch value {
        case .blob(let bytes), .text(let bytes):
            let wrap: ([UInt8]) -> SQLValue = { if case .text = value { .text($0) } else { .blob($0) } }
            func flipped(_ index: Int) -> SQLValue {
                var copy = bytes
                copy[index] ^= 0x01
                return wrap(copy)
            }
            var list: [(String, SQLValue)] = []
            if bytes.count > 2 { list.append(("flip middle byte", flipped(bytes.count / 2))) }
            if !bytes.isEmpty { list.append(("flip first byte", flipped(0))) }
            if bytes.count > 1 { list.append(("flip last byte", flipped(bytes.count - 1))) }
            if bytes.count > 1 { list.append(("truncate", wrap(Array(bytes.dropLast())))) }
            if !bytes.isEmpty { list.append(("empty", wrap([]))) }
            // An empty value (a portable item's device) gets one: another machine's identifier.
            if bytes.isEmpty { list.append(("set (other value)", wrap(Array("0123456789abcdef".utf8)))) }
            list.append(("null", .null))
            if case .text = value { list.append(("as blob (same bytes)", .blob(bytes))) } else { list.append(("as text (same bytes)", .text(bytes))) }
            return list
        case .integer(let integer):
            return [
                ("+1", .integer(integer + 1)), ("-1", .integer(integer - 1)), ("flip byte 1", .integer(integer ^ 0x100)), ("null", .null),
                ("as real (same number)", .real(Double(integer))), ("as text (not a number)", .text(Array("n\(integer)".utf8))),
            ]
        case .real(let real):
            return [("+1000000", .real(real + 1_000_000)), ("zero", .real(0)), ("null", .null)]
        case .null:
            return [("set (32 bytes)", .blob([UInt8](repeating: 0x5a, count: 32)))]
        }
    }

    func matching(_ spec: TableSpec, _ row: TableRow, in rows: [TableRow]) -> TableRow? {
        rows.first { candidate in spec.match.allSatisfy { candidate.values[$0] == row.values[$0] } }
    }

    func makeEdits() -> (edits: [Edit], identical: Int) {
        var edits: [Edit] = []
        var identical = 0
        for base in TableSpec.all {
            let spec = specs[base.name]!
            let rows = pristineRows[spec.name] ?? []
            let older = olderRows[spec.name] ?? []
            for (index, row) in rows.enumerated() {
                let label = rowLabel(spec, row)
                let full = !options.sample && (spec.name != "items" || Self.fullyEditedItems.contains(label))
                // The sample edits one row of each table (every field of the header).
                if options.sample && spec.name != "header" && index > 0 { continue }
                for column in spec.columns {
                    let value = row.values[column] ?? .null
                    let columnName = columnLabel(spec, column, row)
                    var mutations = valueMutations(value)
                    if !full { mutations = Array(mutations.prefix(1)) }
                    for (name, changed) in mutations {
                        var edited = row
                        edited.values[column] = changed
                        edits.append(Edit(table: spec.name, column: columnName, mutation: name, target: label) { campaign in
                            try campaign.replace(spec.name, [row], with: [edited])
                        })
                    }
                    guard !options.sample else { continue }
                    // The value of the next row (another item, field or class key).
                    if rows.count > 1 {
                        let partner = rows[(index + 1) % rows.count]
                        if partner.values[column] != value {
                            var first = row
                            var second = partner
                            first.values[column] = partner.values[column]
                            second.values[column] = value
                            edits.append(
                                Edit(table: spec.name, column: columnName, mutation: "swap with next row", target: label + " <> " + rowLabel(spec, partner)) { campaign in
                                    try campaign.replace(spec.name, [row, partner], with: [first, second])
                                })
                        }
                    }
                    if let previous = matching(spec, row, in: older) {
                        if previous.values[column] == value {
                            identical += 1
                        } else {
                            var edited = row
                            edited.values[column] = previous.values[column]
                            edits.append(Edit(table: spec.name, column: columnName, mutation: "replay value from older", target: label) { campaign in
                                try campaign.replace(spec.name, [row], with: [edited])
                            })
                        }
                    }
                }
                // Row-level edits.
                let rowColumn = spec.name == "header" ? "(row \(label))" : "(row)"
                if let previous = matching(spec, row, in: older) {
                    var replayed = previous
                    for column in spec.key { replayed.values[column] = row.values[column] }
                    if replayed.values == row.values {
                        identical += 1
                    } else {
                        edits.append(Edit(table: spec.name, column: rowColumn, mutation: "replay row from older", target: label) { campaign in
                            try campaign.replace(spec.name, [row], with: [replayed])
                        })
                    }
                }
                if options.sample && index > 0 { continue }
                edits.append(Edit(table: spec.name, column: rowColumn, mutation: "delete row", target: label) { campaign in
                    try campaign.replace(spec.name, [row], with: [])
                })
                for (name, copy) in duplicates(of: row, spec: spec) {
                    edits.append(Edit(table: spec.name, column: rowColumn, mutation: name, target: label) { campaign in
                        try campaign.replace(spec.name, [], with: [copy])
                    })
                }
            }
            // Rows of the older copy that the pristine file no longer has (a deleted item): put back.
            for previous in older where matching(spec, previous, in: rows) == nil {
                var resurrected = previous
                if spec.name == "items" { resurrected.values["rowid"] = .null }
                edits.append(Edit(table: spec.name, column: "(row)", mutation: "replay deleted row from older", target: "gone") { campaign in
                    try campaign.replace(spec.name, [], with: [resurrected])
                })
            }
        }
        edits += fileEdits()
        return (edits, identical)
    }

    /// Copies of a row that the schema allows: a new id (and primary digest, and group, for
    /// items), another device for a class key, another slot id, another id for the one-row tables.
    func duplicates(of row: TableRow, spec: TableSpec) -> [(String, TableRow)] {
        var copy = row
        switch spec.name {
        case "items":
            copy.values["rowid"] = .null
            copy.values["id"] = .blob((0..<16).map { _ in UInt8.random(in: 0...255) })
            copy.values["primary_digest"] = .blob((0..<32).map { _ in UInt8.random(in: 0...255) })
            var otherGroup = copy
            otherGroup.values["access_group"] = .text(Array("other.group".utf8))
            return [("duplicate row (new id)", copy), ("duplicate row (new id, other group)", otherGroup)]
        case "header":
            copy.values["name"] = .text((row.values["name"]?.bytes ?? []) + Array("-copy".utf8))
        case "class_keys":
            copy.values["device_id"] = .text((row.values["device_id"]?.bytes ?? []) + Array("0".utf8))
        case "key_slots", "vault_state", "unlock_attempts":
            // vault_state and unlock_attempts allow id 1 only (a CHECK constraint, which the
            // attacker's connection ignores).
            copy.values[spec.key[0]] = .integer(2)
        case "integrity_groups":
            // Ids 0 to 15 are taken; 16 is outside the CHECK constraint.
            copy.values[spec.key[0]] = .integer(16)
        case "sync_deletions":
            // The same time, generation and MAC under another row's reference.
            copy.values["reference"] = .blob((0..<16).map { _ in UInt8.random(in: 0...255) })
        default:
            break
        }
        return [("duplicate row", copy)]
    }

    /// Whole-file attacks.
    func fileEdits() -> [Edit] {
        let path = self.path
        var edits = [
            Edit(table: "(file)", column: "main file", mutation: "older copy in place", target: "file", live: false) { campaign in
                for suffix in ["-wal", "-shm"] { unlink(path + suffix) }
                try campaign.writeFile(path, campaign.older)
            },
            Edit(table: "(file)", column: "main file", mutation: "older copy, current WAL", target: "file", base: .withWAL, live: false) { campaign in
                unlink(path + "-shm")
                try campaign.writeFile(path, campaign.older)
            },
            Edit(table: "(file)", column: "main file", mutation: "truncated to half", target: "file", live: false) { campaign in
                truncate(path, off_t(campaign.pristine.count / 2))
            },
            Edit(table: "(file)", column: "write-ahead log", mutation: "deleted before checkpoint", target: "file", base: .withWAL, live: false) { _ in
                for suffix in ["-wal", "-shm"] { unlink(path + suffix) }
            },
            Edit(table: "(file)", column: "write-ahead log", mutation: "truncated to half", target: "file", base: .withWAL, live: false) { campaign in
                unlink(path + "-shm")
                truncate(path + "-wal", off_t(campaign.wal.count / 2))
            },
            Edit(table: "(file)", column: "write-ahead log", mutation: "cut to its header", target: "file", base: .withWAL, live: false) { _ in
                unlink(path + "-shm")
                truncate(path + "-wal", 32)
            },
            Edit(table: "(file)", column: "write-ahead log", mutation: "last frame byte flipped", target: "file", base: .withWAL, live: false) { campaign in
                unlink(path + "-shm")
                var bytes = campaign.wal
                bytes[bytes.count - 100] ^= 0x01
                try campaign.writeFile(path + "-wal", bytes)
            },
        ]
        if !options.sample {
            // One flipped byte in the middle of each page of the file.
            let pageSize = 4096
            for page in 0..<(pristine.count / pageSize) {
                edits.append(
                    Edit(table: "(file)", column: "main file", mutation: "byte flipped in each page", target: "page \(page + 1)", live: false) { campaign in
                        var bytes = campaign.pristine
                        bytes[page * pageSize + pageSize / 2] ^= 0x01
                        try campaign.writeFile(path, bytes)
                    })
            }
        }
        return edits
    }
}
