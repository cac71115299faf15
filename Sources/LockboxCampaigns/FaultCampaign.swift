import Foundation
import Lockbox
import LockboxAuth
import VaultStorage

/// The fault-injection campaign: a scenario of writes runs once for every N, with the Nth
/// storage operation (statement or step) failing, once or from then on, for each kind of
/// fault. After each run the fault clears and a fresh connection checks the vault: integrity
/// ok, every step that threw left its old value, every step that returned left its new one,
/// and retrying the failed steps succeeds. Every error must be `.io` (-36) and say what to do.
package struct FaultCampaign {
    package enum Step: String, Sendable, CaseIterable {
        case add, update, delete, rotate, passphrase, backup
    }

    package struct Report: Sendable {
        /// Runs in which the injected fault fired.
        package var faultsInjected = 0
        package var errorsSeen = 0
        package var runs = 0
        package var checks = 0
        /// Storage operations in one fault-free run of the scenario, per combination.
        package var operationsPerScenario: [String: Int] = [:]
        package var violations: [String] = []
        package var seconds = 0.0

        package mutating func merge(_ other: Report) {
            faultsInjected += other.faultsInjected
            errorsSeen += other.errorsSeen
            runs += other.runs
            checks += other.checks
            operationsPerScenario.merge(other.operationsPerScenario) { $1 }
            violations += other.violations
            seconds += other.seconds
        }

        package var summary: String {
            var lines = ["fault campaign: \(runs) runs, \(faultsInjected) faults injected, \(errorsSeen) errors thrown, in \(String(format: "%.0f", seconds)) s"]
            for (name, count) in operationsPerScenario.sorted(by: { $0.key < $1.key }) {
                lines.append("  \(name): N = 1...\(count) (every storage operation of the scenario)")
            }
            lines.append("  consistency checks: \(checks); violations: \(violations.count)")
            for violation in violations.prefix(20) { lines.append("    - \(violation)") }
            return lines.joined(separator: "\n")
        }
    }

    package static let kinds: [StorageFaults.Kind] = [.diskFull, .ioError, .busy]

    /// Every kind, once and persistent, over the full scenario.
    package static func run(directory: String) throws -> Report {
        var report = Report()
        for kind in kinds {
            for persistent in [false, true] {
                report.merge(try run(kind: kind, persistent: persistent, steps: Step.allCases, directory: directory))
            }
        }
        return report
    }

    /// One kind, once or persistent, for N = 1, 2, ... until the scenario runs without reaching N
    /// (or for the first `maximumRuns` values of N).
    package static func run(
        kind: StorageFaults.Kind, persistent: Bool, steps: [Step], directory: String, maximumRuns: Int = .max
    ) throws -> Report {
        let start = Date()
        var report = Report()
        let name = "\(kind)-\(persistent ? "persistent" : "once")-\(steps.map(\.rawValue).joined(separator: "+"))"
        let root = directory + "/" + name
        var configuration = Vault.Configuration()
        configuration.keyDerivation = .interactive
        configuration.device = DeviceIdentity(keyPath: root + "/state/device-key")
        let path = root + "/vault/faults.lockbox"
        var passphrase = "fp-initial"
        let vault = try Vault.create(at: path, passphrase: SecretBytes(utf8: passphrase), configuration: configuration)
        defer { vault.lockAll() }
        let tokens = ItemStoreTokenStore(store: vault, key: CredentialKey(issuer: "https://issuer.invalid", clientID: "faults"))
        try vault.add(.genericPassword(service: "faults", account: "base", data: SecretBytes(utf8: "base-0")))
        var base = "base-0"
        var token: String?

        var failing = 1
        while true {
            let run = report.runs
            try vault.add(.genericPassword(service: "faults", account: "del-\(run)", data: SecretBytes(utf8: "d")))
            let backupPath = root + "/backup-\(run).lbx"
            let faults = StorageFaults(kind: kind, failingOperation: failing, persistent: persistent)
            vault.injectFaults(faults)
            var failed: Set<Step> = []
            for step in steps {
                do {
                    try perform(step, run: run, vault: vault, tokens: tokens, passphrase: passphrase, backup: backupPath)
                } catch {
                    failed.insert(step)
                    report.errorsSeen += 1
                    if error.code != .io || !error.message.lowercased().contains("try again") {
                        report.violations.append("\(name) N=\(failing) \(step): unclear error: \(error)")
                    }
                }
            }
            vault.injectFaults(nil)
            if ProcessInfo.processInfo.environment["LOCKBOX_CAMPAIGN_TRACE"] != nil {
                FileHandle.standardError.write(Data("\(name) N=\(failing) failed: \(failed.map(\.rawValue).sorted()) t=\(Date().timeIntervalSince(start))\n".utf8))
            }
            report.runs += 1
            let fired = faults.operations >= failing
            if fired { report.faultsInjected += 1 }
            if !fired && !failed.isEmpty {
                report.violations.append("\(name) N=\(failing): steps failed without a fault: \(failed)")
            }

            // A fresh connection, as the next process would see the file.
            let check = try Vault.open(at: path, configuration: configuration)
            report.checks += 1
            let integrity = try check.withDatabase { database throws(LockboxError) in try database.integrityCheck() }
            if integrity != "ok" { report.violations.append("\(name) N=\(failing): integrity_check says \(integrity)") }
            func value(_ account: String) -> String? {
                do {
                    let data = try check.data(matching: .genericPassword(service: "faults", account: account))
                    return data.withUnsafeBytes { String(decoding: $0, as: UTF8.self) }
                } catch LockboxError.itemNotFound {
                    return nil
                } catch {
                    report.violations.append("\(name) N=\(failing): reading \(account) failed: \(error)")
                    return "<unreadable>"
                }
            }
            func expect(_ step: Step, _ observed: String?, old: String?, new: String?) {
                report.checks += 1
                let wanted = failed.contains(step) ? old : new
                if observed != wanted {
                    report.violations.append(
                        "\(name) N=\(failing) \(step) \(failed.contains(step) ? "threw" : "returned"): found \(observed ?? "nothing"), expected \(wanted ?? "nothing")")
                }
            }
            if steps.contains(.add) { expect(.add, value("add-\(run)"), old: nil, new: "a-\(run)") }
            if steps.contains(.update) { expect(.update, value("base"), old: base, new: "u-\(run)") }
            if steps.contains(.delete) { expect(.delete, value("del-\(run)"), old: "d", new: nil) }
            if steps.contains(.rotate) {
                let checkTokens = ItemStoreTokenStore(store: check, key: tokens.key)
                let stored = (try? checkTokens.refreshToken())??.withUnsafeBytes { String(decoding: $0, as: UTF8.self) }
                expect(.rotate, stored, old: token, new: "rt-\(run)")
            }
            if steps.contains(.passphrase) {
                let new = "fp-\(run)"
                let current = failed.contains(.passphrase) ? passphrase : new
                report.checks += 1
                if (try? check.unlock(passphrase: SecretBytes(utf8: current))) == nil {
                    report.violations.append("\(name) N=\(failing): the passphrase \(failed.contains(.passphrase) ? "kept" : "set") does not unlock")
                }
            }
            if steps.contains(.backup) {
                report.checks += 1
                let exists = FileManager.default.fileExists(atPath: backupPath)
                let partial = ((try? FileManager.default.contentsOfDirectory(atPath: root)) ?? []).contains { $0.contains(".partial-") }
                if exists == failed.contains(.backup) || partial {
                    report.violations.append("\(name) N=\(failing): backup file present: \(exists), partial: \(partial), step failed: \(failed.contains(.backup))")
                }
                unlink(backupPath)
            }

            // The fault cleared: the failed steps now succeed on the same handle.
            for step in steps where failed.contains(step) {
                do {
                    try perform(step, run: run, vault: vault, tokens: tokens, passphrase: passphrase, backup: backupPath)
                } catch {
                    report.violations.append("\(name) N=\(failing) \(step): still fails after the fault cleared: \(error)")
                }
                unlink(backupPath)
            }
            if steps.contains(.passphrase) { passphrase = "fp-\(run)" }
            base = steps.contains(.update) ? "u-\(run)" : base
            token = steps.contains(.rotate) ? "rt-\(run)" : token
            // Back to the same items, so every run of the scenario takes the same operations.
            if !steps.contains(.delete) { try vault.delete(matching: .genericPassword(service: "faults", account: "del-\(run)")) }
            if steps.contains(.add) { try vault.delete(matching: .genericPassword(service: "faults", account: "add-\(run)")) }
            if !fired {
                report.operationsPerScenario[name] = faults.operations
                break
            }
            if report.runs >= maximumRuns { break }
            failing += 1
        }
        report.seconds = Date().timeIntervalSince(start)
        return report
    }

    static func perform(
        _ step: Step, run: Int, vault: Vault, tokens: ItemStoreTokenStore, passphrase: String, backup: String
    ) throws(LockboxError) {
        switch step {
        case .add: try vault.add(.genericPassword(service: "faults", account: "add-\(run)", data: SecretBytes(utf8: "a-\(run)")))
        case .update:
            try vault.update(matching: .genericPassword(service: "faults", account: "base"), to: ItemUpdate(data: SecretBytes(utf8: "u-\(run)")))
        case .delete: try vault.delete(matching: .genericPassword(service: "faults", account: "del-\(run)"))
        case .rotate: try tokens.saveRefreshToken(SecretBytes(utf8: "rt-\(run)"))
        case .passphrase: try vault.changePassphrase(from: SecretBytes(utf8: passphrase), to: SecretBytes(utf8: "fp-\(run)"))
        case .backup: _ = try vault.backup(to: backup, passphrase: SecretBytes(utf8: "faults-backup"), replacing: true)
        }
    }
}
