import CProcessHardening
import FoundationEssentials
import Lockbox
import LockboxCommandLine
import LockboxSync

#if canImport(Glibc)
import Glibc
#endif

// `lockbox sync` runs here: `lockbox` hands the verb over, so that only sync loads libpq (and
// the TLS and authentication libraries it links).

// No core dumps and no same-user ptrace: this process holds the group keys.
_ = lockbox_harden_process()

let streams = StandardStreams()
let usage = """
    usage: lockbox [--keychain PATH] sync create --database CONNINFO [--passphrase-stdin]
           lockbox [--keychain PATH] sync invite [--minutes N]
           lockbox [--keychain PATH] sync join GROUP --database CONNINFO [--passphrase-stdin]
           lockbox [--keychain PATH] sync status [--json]
           lockbox [--keychain PATH] sync now
           lockbox [--keychain PATH] sync remove-device DEVICE [--passphrase-stdin]
           lockbox [--keychain PATH] sync forget-damaged-deletions

    Keeps the items marked synchronizable (and not ThisDeviceOnly) the same on several machines,
    end-to-end encrypted, through a PostgreSQL database (docs/SYNC.md). CONNINFO is a libpq
    connection string or URI; name the password with passfile= or PGPASSFILE, never password=.
    create makes a group (this keychain is its first device) and prints its identifier; with
      --passphrase-stdin, devices may also join with that passphrase.
    invite prints a one-time pairing code for another device, valid N minutes (default 10).
    join joins GROUP: it reads the pairing code (or, with --passphrase-stdin, the group
      passphrase) from standard input or the terminal.
    status shows the group, this device, the devices, the last sync and pending changes; an
      unreachable database is reported, and the keychain stays usable.
    now pushes this keychain's changes and pulls the other devices'.
    remove-device removes DEVICE and rotates the group key: it cannot read anything written
      afterwards. The group passphrase is dropped; --passphrase-stdin sets a new one.
    forget-damaged-deletions drops the records of deleted items that were modified outside
      Lockbox (`lockbox verify` counts them; sync refuses them). The deletes they recorded are
      then pushed as made just after the version this device knew: a later edit made on
      another device wins over them.
    """

enum SyncCommand {
    case create(database: String, passphrase: Bool)
    case invite(minutes: Int)
    case join(group: String, database: String, passphrase: Bool)
    case status(json: Bool)
    case now
    case removeDevice(String, passphrase: Bool)
    case forgetDamagedDeletions
    case help
}

struct UsageProblem: Error {
    var message: String
}

func parse(_ arguments: [String]) throws(UsageProblem) -> (keychain: String?, command: SyncCommand) {
    var remaining = arguments[...]
    var keychain: String?
    func value(_ option: String) throws(UsageProblem) -> String {
        guard let value = remaining.popFirst() else { throw UsageProblem(message: "\(option) needs a value") }
        return value
    }
    while let first = remaining.first, first == "--keychain" {
        remaining.removeFirst()
        keychain = try value("--keychain")
    }
    guard let verb = remaining.popFirst() else { throw UsageProblem(message: "sync needs a verb") }
    var database: String?
    var passphrase = false
    var json = false
    var minutes = 10
    var positional: [String] = []
    while let option = remaining.popFirst() {
        switch option {
        case "--database": database = try value(option)
        case "--passphrase-stdin": passphrase = true
        case "--json": json = true
        case "--minutes":
            guard let number = Int(try value(option)), (1...1440).contains(number) else {
                throw UsageProblem(message: "--minutes takes a number from 1 to 1440")
            }
            minutes = number
        default:
            guard !option.hasPrefix("-") else { throw UsageProblem(message: "unknown option \(option)") }
            positional.append(option)
        }
    }
    if let database, database.contains("password") {
        throw UsageProblem(message: "the connection string names a password: put it in a password file (passfile=, PGPASSFILE) instead")
    }
    func needDatabase() throws(UsageProblem) -> String {
        guard let database else { throw UsageProblem(message: "\(verb) needs --database CONNINFO") }
        return database
    }
    let command: SyncCommand
    switch verb {
    case "--help", "-h", "help": command = .help
    case "create": command = .create(database: try needDatabase(), passphrase: passphrase)
    case "invite": command = .invite(minutes: minutes)
    case "join":
        guard positional.count == 1 else { throw UsageProblem(message: "join needs the group identifier") }
        return (keychain, .join(group: positional[0], database: try needDatabase(), passphrase: passphrase))
    case "status": command = .status(json: json)
    case "now": command = .now
    case "forget-damaged-deletions": command = .forgetDamagedDeletions
    case "remove-device":
        guard positional.count == 1 else { throw UsageProblem(message: "remove-device needs the device identifier") }
        return (keychain, .removeDevice(positional[0], passphrase: passphrase))
    default: throw UsageProblem(message: "unknown sync verb \(verb)")
    }
    guard positional.isEmpty else { throw UsageProblem(message: "\(verb) takes no argument \(positional[0])") }
    return (keychain, command)
}

/// Which group this keychain syncs with, and through which database: `VAULT.sync/config`
/// (mode 0600; two lines, no secret: a connection string names a password file, never a password).
struct SyncConfiguration {
    var group: String
    var database: String

    static func path(vault: Vault) -> String { vault.path + ".sync/config" }

    static func load(vault: Vault) throws(LockboxError) -> SyncConfiguration {
        guard let data = FileManager.default.contents(atPath: path(vault: vault)) else {
            throw LockboxError(.itemNotFound, "This keychain is in no sync group. Create one with `lockbox sync create` or join one with `lockbox sync join`.")
        }
        var fields: [String: String] = [:]
        for line in String(decoding: data, as: UTF8.self).split(separator: "\n") {
            guard let equals = line.firstIndex(of: "=") else { continue }
            fields[String(line[..<equals])] = String(line[line.index(after: equals)...])
        }
        guard let group = fields["group"], let database = fields["database"] else {
            throw LockboxError(.decode, "The sync configuration \(path(vault: vault)) is damaged. Join the group again.")
        }
        return SyncConfiguration(group: group, database: database)
    }

    func save(vault: Vault) throws(LockboxError) {
        let path = Self.path(vault: vault)
        let directory = String(path[..<(path.lastIndex(of: "/") ?? path.startIndex)])
        let oldMask = umask(0o077)
        defer { umask(oldMask) }
        do {
            try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
            try Data("group=\(group)\ndatabase=\(database)\n".utf8).write(to: URL(fileURLWithPath: path), options: .atomic)
        } catch {
            throw LockboxError(.io, "Cannot write \(path). Check the directory's permissions.")
        }
    }
}

func openVault(_ keychain: String?) throws(LockboxError) -> Vault {
    guard let vault = try Keychain.open(Keychain.Options(backend: .vault, path: keychain)).vault else {
        throw LockboxError(.unimplemented, "Sync needs the vault backend.")
    }
    return vault
}

func readSecret(_ prompt: String) throws(LockboxError) -> SecretBytes {
    if SecretInput.standardInputIsTerminal { return try SecretInput.prompt(prompt) }
    return try SecretInput.readSecret(raw: false, limit: SecretInput.passphraseLimit)
}

func jsonString(_ text: String) -> String {
    var escaped = "\""
    for scalar in text.unicodeScalars {
        switch scalar {
        case "\"": escaped += "\\\""
        case "\\": escaped += "\\\\"
        case _ where scalar.value < 0x20:
            let hex = String(scalar.value, radix: 16)
            escaped += "\\u" + String(repeating: "0", count: 4 - hex.count) + hex
        default: escaped.unicodeScalars.append(scalar)
        }
    }
    return escaped + "\""
}

func run(keychain: String?, command: SyncCommand) throws(LockboxError) -> ExitStatus {
    switch command {
    case .help:
        streams.print(usage)
        return .success
    case .create(let database, let withPassphrase):
        let vault = try openVault(keychain)
        let passphrase = withPassphrase ? try readSecret("Group passphrase: ") : nil
        let group = try SyncGroup.create(vault: vault, database: database, passphrase: passphrase)
        try SyncConfiguration(group: group.groupID, database: database).save(vault: vault)
        streams.print(group.groupID)
        return .success
    case .invite(let minutes):
        let vault = try openVault(keychain)
        let configuration = try SyncConfiguration.load(vault: vault)
        let group = try SyncGroup(configuration.group, vault: vault, database: configuration.database)
        let code = try group.pairingCode(validFor: .seconds(minutes * 60))
        streams.print("group \(group.groupID)")
        streams.print("pairing code \(code) (one use, \(minutes) minutes)")
        return .success
    case .join(let groupID, let database, let withPassphrase):
        let vault = try openVault(keychain)
        let group: SyncGroup
        if withPassphrase {
            group = try SyncGroup.join(groupID, vault: vault, database: database, passphrase: try readSecret("Group passphrase: "))
        } else {
            let code = try readSecret("Pairing code: ")
            let text = code.withUnsafeBytes { String(decoding: $0, as: UTF8.self) }
            group = try SyncGroup.join(groupID, vault: vault, database: database, pairingCode: text)
        }
        try SyncConfiguration(group: group.groupID, database: database).save(vault: vault)
        let report = try group.sync()
        streams.print("joined \(group.groupID) as device \(group.deviceID); pulled \(report.pulled), pushed \(report.pushed)")
        return .success
    case .now:
        let vault = try openVault(keychain)
        let configuration = try SyncConfiguration.load(vault: vault)
        let report = try SyncGroup(configuration.group, vault: vault, database: configuration.database).sync()
        streams.print("pushed \(report.pushed), pulled \(report.pulled), superseded \(report.superseded)")
        return .success
    case .forgetDamagedDeletions:
        // The keychain's own records: no group or database needed.
        let vault = try openVault(keychain)
        let repair = try vault.forgetDamagedDeletionRecords()
        if repair.changedNothing {
            streams.print("No recorded deletion is damaged; nothing was dropped.")
        }
        if repair.dropped > 0 {
            streams.print(
                "Dropped \(repair.dropped) damaged record(s) of deleted items. Those deletes, if not yet synced, now lose to any later "
                    + "edit made on another device.")
        }
        if repair.acceptedChangedSet {
            streams.print(
                "Accepted the records of deleted items as they are now (some were removed or put back outside Lockbox). A delete "
                    + "whose record is gone, if not yet synced, now loses to any later edit made on another device.")
        }
        return .success
    case .removeDevice(let device, let withPassphrase):
        let vault = try openVault(keychain)
        let configuration = try SyncConfiguration.load(vault: vault)
        let group = try SyncGroup(configuration.group, vault: vault, database: configuration.database)
        let passphrase = withPassphrase ? try readSecret("New group passphrase: ") : nil
        try group.removeDevice(device, newPassphrase: passphrase)
        streams.print("removed \(device); the group key is now at epoch \(group.keyEpoch)")
        return .success
    case .status(let json):
        let vault = try openVault(keychain)
        let configuration = try SyncConfiguration.load(vault: vault)
        let group = try SyncGroup(configuration.group, vault: vault, database: configuration.database)
        let status = try group.status()
        if json {
            var fields = [
                "\"group\": \(jsonString(status.groupID))", "\"device\": \(jsonString(status.deviceID))",
                "\"keyEpoch\": \(status.keyEpoch)", "\"pulledVersion\": \(status.pulledVersion)",
                "\"pendingLocalChanges\": \(status.pendingLocalChanges)", "\"syncedItems\": \(status.syncedItems)",
                "\"databaseReachable\": \(status.unreachable == nil)",
                "\"deletionRecords\": \(status.deletionRecords.records)", "\"deletionRecordsSound\": \(status.deletionRecords.isSound)",
            ]
            if let lastSync = status.lastSync { fields.append("\"lastSync\": \(jsonString(lastSync))") }
            if let head = status.headFingerprint { fields.append("\"head\": \(jsonString(head))") }
            if let remote = status.pendingRemoteVersions { fields.append("\"pendingRemoteVersions\": \(remote)") }
            if let unreachable = status.unreachable { fields.append("\"databaseError\": \(jsonString(unreachable))") }
            let devices = (status.devices ?? []).map { device in
                "{\"id\": \(jsonString(device.id)), \"pulledVersion\": \(device.pulledVersion), \"lastSync\": \(device.lastSync.map(jsonString) ?? "null"), \"attested\": \(device.isAttested)}"
            }
            fields.append("\"devices\": [\(devices.joined(separator: ", "))]")
            streams.print("{" + fields.joined(separator: ", ") + "}")
        } else {
            streams.print("group:            \(status.groupID)")
            streams.print("this device:      \(status.deviceID)")
            streams.print("key epoch:        \(status.keyEpoch)")
            streams.print("verified head:    version \(status.pulledVersion), \(status.headFingerprint ?? "none yet")")
            streams.print("last sync:        \(status.lastSync ?? "never")")
            streams.print("synced items:     \(status.syncedItems)")
            streams.print("pending here:     \(status.pendingLocalChanges) changed row(s) since the last push")
            if status.deletionRecords.isSound {
                streams.print("deleted here:     \(status.deletionRecords.records) recorded deletion(s), sound")
            } else {
                streams.print(
                    "deleted here:     the records of deleted items were modified outside Lockbox: sync refuses them; "
                        + "`lockbox sync forget-damaged-deletions` repairs them")
            }
            if let unreachable = status.unreachable {
                streams.print("database:         unreachable (\(unreachable)); the keychain is fully usable, sync later")
            } else {
                streams.print("pending remote:   \(status.pendingRemoteVersions ?? 0) version(s) not pulled yet")
                streams.print("devices:")
                for device in status.devices ?? [] {
                    let mark = device.id == status.deviceID ? " (this device)" : ""
                    let trust = device.isAttested ? "" : " UNATTESTED: not written by a device of the group"
                    streams.print("  \(device.id)  pulled \(device.pulledVersion)  last sync \(device.lastSync ?? "never")\(mark)\(trust)")
                }
            }
        }
        return .success
    }
}

let status: ExitStatus
do {
    let (keychain, command) = try parse(Array(CommandLine.arguments.dropFirst()))
    do {
        status = try run(keychain: keychain, command: command)
    } catch {
        streams.error("lockbox sync: \(error.description)")
        status = error.code == .itemNotFound ? .itemNotFound : .failure
    }
} catch {
    streams.error("lockbox sync: \(error.message)")
    streams.error("")
    streams.error(usage)
    status = .usage
}
exit(status.rawValue)
