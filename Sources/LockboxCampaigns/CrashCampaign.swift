import Foundation
import Lockbox
import LockboxAuth
import Synchronization
import VaultStorage

#if canImport(Glibc)
import Glibc
#endif

/// The crash campaign: runs `lockbox-stress churn` writers against one vault and SIGKILLs each
/// at a random moment, then checks the vault from a fresh connection: `PRAGMA integrity_check`
/// is ok, every item holds its acknowledged value (or, for the write in flight, its old or its
/// new one), nothing fails to decrypt, the passphrase is the old or the new one, and every
/// backup on disk is complete and restorable.
package struct CrashCampaign {
    package static let operations = ["add", "update", "delete", "passphrase", "backup", "rotate"]

    package struct Options: Sendable {
        package var iterations: Int
        /// The built `lockbox-stress`.
        package var writer: String
        /// A private directory for the vault, the device key and the backups.
        package var directory: String

        package init(iterations: Int, writer: String, directory: String) {
            self.iterations = iterations
            self.writer = writer
            self.directory = directory
        }
    }

    package struct Report: Sendable {
        package var kills = 0
        /// Kills by the operation in flight ("between" when none was).
        package var killsDuring: [String: Int] = [:]
        package var acknowledgedWrites = 0
        package var integrityChecks = 0
        package var itemChecks = 0
        package var inFlightFoundOld = 0
        package var inFlightFoundNew = 0
        package var passphraseChecks = 0
        package var backupsRestored = 0
        package var partialBackupFilesLeft = 0
        package var violations: [String] = []
        package var seconds = 0.0

        package var summary: String {
            var lines = ["crash campaign: \(kills) kills in \(String(format: "%.0f", seconds)) s"]
            lines.append(
                "  kills during: "
                    + (CrashCampaign.operations + ["between"]).map { "\($0) \(killsDuring[$0, default: 0])" }.joined(separator: ", "))
            lines.append("  acknowledged writes: \(acknowledgedWrites)")
            lines.append("  integrity checks: \(integrityChecks) (all ok: \(violations.isEmpty ? "yes" : "no"))")
            lines.append("  item checks: \(itemChecks); writes in flight found old: \(inFlightFoundOld), new: \(inFlightFoundNew)")
            lines.append("  passphrase checks: \(passphraseChecks); backups restored: \(backupsRestored); partial backup files left by kills: \(partialBackupFilesLeft)")
            lines.append("  violations (lost, torn or undecryptable items, failed checks): \(violations.count)")
            for violation in violations.prefix(20) { lines.append("    - \(violation)") }
            return lines.joined(separator: "\n")
        }
    }

    struct Line {
        var acknowledged: Bool
        var operation: String
        var key: String
        var value: String
    }

    package static func run(_ options: Options, progress: (String) -> Void = { _ in }) throws -> Report {
        let start = Date()
        var report = Report()
        let vaultPath = options.directory + "/vault/crash.lockbox"
        let deviceKey = options.directory + "/state/device-key"
        let backups = options.directory + "/backups"
        try FileManager.default.createDirectory(atPath: backups, withIntermediateDirectories: true, attributes: [.posixPermissions: 0o700])
        var configuration = Vault.Configuration()
        configuration.keyDerivation = .interactive
        configuration.device = DeviceIdentity(keyPath: deviceKey)
        var passphrase = "pp-initial"
        let creator = try Vault.create(at: vaultPath, passphrase: SecretBytes(utf8: passphrase), configuration: configuration)
        defer { creator.lockAll() }
        var scratchConfiguration = configuration
        scratchConfiguration.unlockCache = .processMemory
        let scratch = try Vault.create(
            at: options.directory + "/scratch/scratch.lockbox", passphrase: SecretBytes(utf8: "scratch"),
            configuration: scratchConfiguration)

        var values: [String: String] = [:]
        var token: String?

        for iteration in 0..<options.iterations {
            let focus = operations[iteration % operations.count]
            let lines = try runAndKill(
                options.writer,
                ["churn", "--keychain", vaultPath, "--device-key", deviceKey, "--backups", backups, "--focus", focus],
                passphrase: passphrase,
                delayMilliseconds: Int.random(in: 0...(focus == "passphrase" || focus == "backup" ? 900 : 150)),
                report: &report)

            // Replay what the writer said: acknowledged writes are facts; a begun one is in flight.
            var inFlight: Line?
            var acknowledgedBackups: [String: Int] = [:]
            var passphraseChanged = false
            for line in lines {
                if !line.acknowledged {
                    inFlight = line
                    continue
                }
                inFlight = nil
                report.acknowledgedWrites += 1
                switch line.operation {
                case "add", "update": values[line.key] = line.value
                case "delete": values[line.key] = nil
                case "passphrase":
                    passphrase = line.value
                    passphraseChanged = true
                case "backup": acknowledgedBackups[line.key] = Int(line.value) ?? -1
                default: token = line.value
                }
            }
            report.killsDuring[inFlight?.operation ?? "between", default: 0] += 1

            // Check from a fresh connection, as the next process to open the file would.
            let vault = try Vault.open(at: vaultPath, configuration: configuration)
            let integrity = try vault.withDatabase { database throws(LockboxError) in try database.integrityCheck() }
            report.integrityChecks += 1
            if integrity != "ok" { report.violations.append("kill \(iteration): integrity_check says \(integrity)") }

            // The passphrase: the acknowledged one, or for a change in flight the old or the new.
            // Checked first: a writer killed during a change leaves the keychain locked (its
            // cached keys were dropped before the change committed), and this unlocks it.
            if let pending = inFlight, pending.operation == "passphrase" {
                report.passphraseChecks += 1
                if (try? vault.unlock(passphrase: SecretBytes(utf8: pending.value))) != nil {
                    passphrase = pending.value
                    report.inFlightFoundNew += 1
                } else if (try? vault.unlock(passphrase: SecretBytes(utf8: passphrase))) != nil {
                    report.inFlightFoundOld += 1
                } else {
                    report.violations.append("kill \(iteration) during a passphrase change: neither passphrase unlocks")
                }
            } else if passphraseChanged {
                report.passphraseChecks += 1
                if (try? vault.unlock(passphrase: SecretBytes(utf8: passphrase))) == nil {
                    report.violations.append("kill \(iteration): the acknowledged passphrase does not unlock")
                }
            }

            var all = Query(.genericPassword, limit: .all, returning: [.data, .attributes])
            all.attributes.service = "crash"
            var found: [String: String] = [:]
            do {
                for item in try vault.items(matching: all) {
                    found[item.attributes.account ?? "?"] = item.data.map { $0.withUnsafeBytes { String(decoding: $0, as: UTF8.self) } }
                }
            } catch LockboxError.itemNotFound {
                // No items yet (or all deleted).
            } catch {
                report.violations.append("kill \(iteration): reading the items failed: \(error)")
            }
            for key in Set(values.keys).union(found.keys).union(inFlight.map { [$0.key] } ?? []) where key.hasPrefix("k") {
                report.itemChecks += 1
                let old = values[key]
                let observed = found[key]
                if let pending = inFlight, pending.key == key, ["add", "update", "delete"].contains(pending.operation) {
                    let new: String? = pending.operation == "delete" ? nil : pending.value
                    if observed == new {
                        report.inFlightFoundNew += 1
                    } else if observed == old {
                        report.inFlightFoundOld += 1
                    } else {
                        report.violations.append("kill \(iteration) during \(pending.operation) \(key): found \(observed ?? "nothing"), expected \(old ?? "nothing") or \(new ?? "nothing")")
                    }
                    values[key] = observed
                } else if observed != old {
                    report.violations.append("kill \(iteration): \(key) holds \(observed ?? "nothing"), acknowledged \(old ?? "nothing")")
                    values[key] = observed
                }
            }

            // The refresh token, written as LockboxAuth's token store writes it.
            let tokens = ItemStoreTokenStore(
                store: vault, key: CredentialKey(issuer: "https://issuer.invalid", clientID: "crash-campaign"))
            report.itemChecks += 1
            do {
                let stored = try tokens.refreshToken().map { $0.withUnsafeBytes { String(decoding: $0, as: UTF8.self) } }
                if let pending = inFlight, pending.operation == "rotate" {
                    if stored == pending.value { report.inFlightFoundNew += 1 } else if stored == token { report.inFlightFoundOld += 1 } else {
                        report.violations.append("kill \(iteration) during rotation: token \(stored ?? "none"), expected \(token ?? "none") or \(pending.value)")
                    }
                    token = stored
                } else if stored != token {
                    report.violations.append("kill \(iteration): refresh token \(stored ?? "none"), acknowledged \(token ?? "none")")
                    token = stored
                }
            } catch {
                report.violations.append("kill \(iteration): reading the refresh token failed: \(error)")
            }

            // Backups: an acknowledged one is complete; none is ever half-written in place.
            let files = (try? FileManager.default.contentsOfDirectory(atPath: backups)) ?? []
            for name in files {
                let file = backups + "/" + name
                defer { unlink(file) }
                if name.contains(".partial-") {
                    report.partialBackupFilesLeft += 1
                    continue
                }
                do {
                    let restored = try scratch.restore(from: file, passphrase: SecretBytes(utf8: "campaign-backup"))
                    report.backupsRestored += 1
                    if let exported = acknowledgedBackups[file], restored.added + restored.replaced + restored.kept != exported {
                        report.violations.append("kill \(iteration): backup \(name) restored \(restored) of \(exported) items")
                    }
                } catch {
                    report.violations.append("kill \(iteration): backup \(name) does not restore: \(error)")
                }
            }
            for file in acknowledgedBackups.keys where !files.contains((file as NSString).lastPathComponent) {
                report.violations.append("kill \(iteration): acknowledged backup \(file) is missing")
            }
            if (iteration + 1) % 50 == 0 {
                progress("\(iteration + 1) kills, \(report.acknowledgedWrites) acknowledged writes, \(report.violations.count) violations")
            }
        }
        report.seconds = Date().timeIntervalSince(start)
        return report
    }

    /// Starts the writer, waits until it is ready, lets it run `delayMilliseconds`, SIGKILLs
    /// it, and returns what it printed.
    static func runAndKill(
        _ writer: String, _ arguments: [String], passphrase: String, delayMilliseconds: Int, report: inout Report
    ) throws -> [Line] {
        let process = Process()
        process.executableURL = URL(fileURLWithPath: writer)
        process.arguments = arguments
        let input = Pipe()
        let output = Pipe()
        let errors = Pipe()
        process.standardInput = input
        process.standardOutput = output
        process.standardError = errors
        try process.run()
        // A writer that fails before reading its passphrase shows up in its output; the write
        // itself may then meet a closed pipe.
        try? input.fileHandleForWriting.write(contentsOf: Data((passphrase + "\n").utf8))
        try? input.fileHandleForWriting.close()

        let collected = Mutex<(text: String, finished: Bool)>(("", false))
        let reader = output.fileHandleForReading
        let thread = Thread {
            while true {
                let data = reader.availableData
                if data.isEmpty { break }
                collected.withLock { $0.text += String(decoding: data, as: UTF8.self) }
            }
            collected.withLock { $0.finished = true }
        }
        thread.start()
        let deadline = Date().addingTimeInterval(60)
        while !collected.withLock({ $0.text.hasPrefix("ready\n") || $0.finished }) && Date() < deadline {
            usleep(1_000)
        }
        if collected.withLock({ $0.text.hasPrefix("ready\n") }) {
            usleep(UInt32(delayMilliseconds * 1_000))
        }
        let exitedByItself = !process.isRunning
        kill(process.processIdentifier, SIGKILL)
        process.waitUntilExit()
        while !collected.withLock({ $0.finished }) { usleep(1_000) }
        let errorText = String(decoding: errors.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self)
        if !exitedByItself && process.terminationReason == .uncaughtSignal {
            report.kills += 1
        } else {
            report.violations.append("the writer stopped before the kill (\(arguments.last ?? "")): \(errorText)")
        }
        return collected.withLock { $0.text }.split(separator: "\n").compactMap { text in
            let fields = text.split(separator: " ").map(String.init)
            guard fields.count == 4, fields[0] == "begin" || fields[0] == "ok" else { return nil }
            return Line(acknowledged: fields[0] == "ok", operation: fields[1], key: fields[2], value: fields[3])
        }
    }
}

