import CProcessHardening
import FoundationEssentials
import Lockbox
import LockboxCommandLine
import LockboxSync

#if canImport(Glibc)
import Glibc
#endif

// Before anything opens a file or a socket: a standard descriptor left closed by the caller
// must not be taken by one (what the program prints or reads would go there).
_ = lockbox_reserve_standard_descriptors()

// `lockbox sync` runs here: `lockbox` hands the verb over, so that only sync loads libpq (and
// the TLS and authentication libraries it links).

// No core dumps and no same-user ptrace: this process holds the group keys.
_ = lockbox_harden_process()

let streams = StandardStreams()
let usage = """
    usage: lockbox [--keychain PATH] sync create --database CONNINFO [--passphrase-stdin] [--replace-group]
           lockbox [--keychain PATH] sync invite [--minutes N]
           lockbox [--keychain PATH] sync join GROUP --database CONNINFO [--passphrase-stdin] [--replace-group] [--merge]
           lockbox [--keychain PATH] sync status [--json]
           lockbox [--keychain PATH] sync now
           lockbox [--keychain PATH] sync remove-device DEVICE [--passphrase-stdin]
           lockbox [--keychain PATH] sync forget-damaged-deletions
           lockbox [--keychain PATH] sync recover
           lockbox [--keychain PATH] sync reset [--discard-local-changes]

    Keeps the items marked synchronizable (and not ThisDeviceOnly) the same on several machines,
    end-to-end encrypted, through a PostgreSQL database (docs/SYNC.md). CONNINFO is a libpq
    connection string or URI; name the password with passfile= or PGPASSFILE, never password=.
    create makes a group (this keychain is its first device) and prints its identifier; with
      --passphrase-stdin, devices may also join with that passphrase (12 characters at least,
      asked twice on a terminal). A keychain that syncs with a group already moves to the new
      one only with --replace-group (also for join).
    invite prints a one-time pairing code for another device, valid N minutes (default 10).
    join joins GROUP: it reads the pairing code (or, with --passphrase-stdin, the group
      passphrase) from standard input or the terminal. A keychain that already holds
      synchronizable items joins only with --merge: they are merged with the group's, and for
      an item both hold the later write wins on every device (the other value is gone).
      Back them up first (lockbox backup FILE).
    status shows the group, this device, the devices, the last sync and pending changes; an
      unreachable database is reported, and the keychain stays usable.
    now pushes this keychain's changes and pulls the other devices'.
    remove-device removes DEVICE and rotates the group key: it cannot read anything written
      afterwards. The group passphrase is dropped; --passphrase-stdin sets a new one.
    forget-damaged-deletions drops the records of deleted items that were modified outside
      Lockbox (`lockbox verify` counts them; sync refuses them). The deletes they recorded are
      then pushed as made just after the version this device knew: a later edit made on
      another device wins over them.
    recover puts back what the database lost, after it was restored from a backup (a sync
      then reports it rolled back, or missing records): every change this device knew that the
      database no longer holds is written again, deletes too; then it syncs. Only a database
      whose records add up to its signed head is taken. Run it on each device of the group.
    reset rebuilds this device's sync state from the group, when a sync reports it damaged or
      older than this device's last pull (removed, emptied, put back from a copy); then it
      syncs. For the items the group holds, the group's versions replace this keychain's: edits
      and deletes made here since the last sync are not sent. Items the group does not hold
      are sent as new. Nothing is deleted on the other devices. A state that is neither damaged
      nor behind is not rebuilt (sync now syncs it) unless --discard-local-changes is given,
      which replaces the changes made here since the last sync.
    """

/// Says what `superseded` means when a sync has some: values of this keychain replaced (or items
/// deleted) by later writes of other devices, which it never sent.
func reportSuperseded(_ report: SyncGroup.Report) {
    guard report.superseded > 0 else { return }
    let count = report.superseded
    streams.error(
        "lockbox sync: \(count) change\(count == 1 ? "" : "s") made here lost to a later write of another device (the later "
            + "write wins): \(count == 1 ? "that item now holds" : "those items now hold") the group's value\(count == 1 ? "" : "s"), "
            + "or \(count == 1 ? "was" : "were") deleted by its later delete.")
}

enum SyncCommand {
    case create(database: String, passphrase: Bool, replacing: Bool)
    case invite(minutes: Int)
    case join(group: String, database: String, passphrase: Bool, replacing: Bool, merging: Bool)
    case status(json: Bool)
    case now
    case removeDevice(String, passphrase: Bool)
    case forgetDamagedDeletions
    case recover
    case reset(discardingLocalChanges: Bool)
    case help
}

struct UsageProblem: Error {
    var message: String
}

/// The options each verb takes; any other is a usage error, not silently ignored.
let optionsOfVerb: [String: Set<String>] = [
    "create": ["--database", "--passphrase-stdin", "--replace-group"],
    "join": ["--database", "--passphrase-stdin", "--replace-group", "--merge"],
    "invite": ["--minutes"],
    "status": ["--json"],
    "now": [],
    "remove-device": ["--passphrase-stdin"],
    "forget-damaged-deletions": [],
    "recover": [],
    "reset": ["--discard-local-changes"],
]

/// Arguments are named by their position after `sync` (the verb is 1), never by their text: a
/// secret typed in the wrong place must not be echoed.
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
    // Positions counted after `sync`, the verb being 1.
    let verbIndex = arguments.count - remaining.count
    func lastPosition() -> Int { arguments.count - remaining.count - verbIndex }
    guard let verb = remaining.popFirst() else { throw UsageProblem(message: "sync needs a verb") }
    if ["--help", "-h", "help"].contains(verb) { return (keychain, .help) }
    guard let allowed = optionsOfVerb[verb] else {
        throw UsageProblem(message: "argument 1 after sync is not a sync verb (not shown, in case it is a secret)")
    }
    var database: String?
    var passphrase = false
    var replacing = false
    var json = false
    var discarding = false
    var merging = false
    var minutes = 10
    var positional: [(text: String, position: Int)] = []
    var given: Set<String> = []
    while let option = remaining.popFirst() {
        let at = lastPosition()
        if option.hasPrefix("-") {
            guard allowed.contains(option) else {
                throw UsageProblem(message: "argument \(at) after sync is not an option of sync \(verb) (not shown, in case it is a secret)")
            }
            // Given twice, an option is a mistake (two connection strings: which one?).
            guard given.insert(option).inserted else { throw UsageProblem(message: "\(option) is given more than once") }
        }
        switch option {
        case "--database": database = try value(option)
        case "--passphrase-stdin": passphrase = true
        case "--replace-group": replacing = true
        case "--json": json = true
        case "--discard-local-changes": discarding = true
        case "--merge": merging = true
        case "--minutes":
            guard let number = Int(try value(option)), (1...1440).contains(number) else {
                throw UsageProblem(message: "--minutes takes a number from 1 to 1440")
            }
            minutes = number
        default: positional.append((option, at))
        }
    }
    if let database { try checkConnectionString(database) }
    func needDatabase() throws(UsageProblem) -> String {
        guard let database else { throw UsageProblem(message: "\(verb) needs --database CONNINFO") }
        return database
    }
    func onePositional(_ what: String) throws(UsageProblem) -> String {
        guard let first = positional.first else { throw UsageProblem(message: "\(verb) needs \(what)") }
        guard positional.count == 1 else {
            throw UsageProblem(message: "argument \(positional[1].position) after sync is one too many for sync \(verb) (not shown, in case it is a secret)")
        }
        return first.text
    }
    switch verb {
    case "join":
        // Hexadecimal digits read the same in either case.
        let group = try onePositional("the group identifier")
        let identifier = SyncGroup.isGroupIdentifier(group.lowercased()) ? group.lowercased() : group
        return (
            keychain, .join(group: identifier, database: try needDatabase(), passphrase: passphrase, replacing: replacing, merging: merging)
        )
    case "remove-device":
        // Hexadecimal digits read the same in either case, as for a group identifier.
        let device = try onePositional("the device identifier")
        return (keychain, .removeDevice(SyncGroup.isDeviceIdentifier(device.lowercased()) ? device.lowercased() : device, passphrase: passphrase))
    default:
        break
    }
    if let extra = positional.first {
        throw UsageProblem(message: "argument \(extra.position) after sync is not taken by sync \(verb) (not shown, in case it is a secret)")
    }
    switch verb {
    case "create": return (keychain, .create(database: try needDatabase(), passphrase: passphrase, replacing: replacing))
    case "invite": return (keychain, .invite(minutes: minutes))
    case "status": return (keychain, .status(json: json))
    case "now": return (keychain, .now)
    case "recover": return (keychain, .recover)
    case "reset": return (keychain, .reset(discardingLocalChanges: discarding))
    default: return (keychain, .forgetDamagedDeletions)
    }
}

/// A connection string is kept in a file of lines and must hold no secret: one with a control
/// character (a line break would cut it where it is saved, dropping what follows, such as
/// `sslmode=verify-full`) or naming a password is refused, without repeating it.
func checkConnectionString(_ database: String) throws(UsageProblem) {
    guard !database.allSatisfy(\.isWhitespace) else {
        throw UsageProblem(message: "the connection string is empty: give the database to sync through (host=... dbname=..., or a postgresql:// URI)")
    }
    guard !database.unicodeScalars.contains(where: { $0.value < 0x20 || $0.value == 0x7F }) else {
        throw UsageProblem(message: "the connection string holds a line break or another control character: give it on one line")
    }
    switch PostgresConnection.namesPassword(database) {
    case nil:
        throw UsageProblem(message: "the connection string is not one libpq can read (not shown, in case it holds a secret)")
    case true?:
        throw UsageProblem(
            message: "the connection string names a password (password= or sslpassword=, not shown): put a password in a password file "
                + "(passfile=, PGPASSFILE) instead, and give the client key without a passphrase (a file of mode 0600)")
    case false?:
        break
    }
}

/// Which group this keychain syncs with, and through which database: `VAULT.sync/config`
/// (mode 0600; two lines, no secret: a connection string names a password file, never a password).
struct SyncConfiguration {
    var group: String
    var database: String

    static func path(vault: Vault) -> String { vault.path + ".sync/config" }

    static func load(vault: Vault) throws(LockboxError) -> SyncConfiguration {
        let path = path(vault: vault)
        // Only a regular file, not through a link, and no larger than a configuration is (a
        // connection string is short): read as the sync's other files are.
        let data: [UInt8]
        switch SyncFiles.readDeviceRecord(path, limit: 64 * 1024) {
        case .absent:
            // Only a configuration that is not there means no group: one this user cannot read
            // (or a directory in its place) is reported as it is, not as "in no group", which
            // would send the user to make a new one.
            throw LockboxError(.itemNotFound, "This keychain is in no sync group. Create one with `lockbox sync create` or join one with `lockbox sync join`.")
        case .unreadable:
            throw LockboxError(
                .io,
                "Cannot read the sync configuration \(path) (its permissions or its directory's, not a regular file, a link, or "
                    + "over 64 KiB). Give the file and its directory back to this user (chown; mode 0600 for the file, 0700 for the "
                    + "directory), or remove what is in its place and join again, then try again.")
        case .bytes(let bytes):
            data = bytes
        }
        try? SyncFiles.narrowIfPresent(path)
        var fields: [String: String] = [:]
        for line in String(decoding: data, as: UTF8.self).split(separator: "\n") {
            guard let equals = line.firstIndex(of: "=") else { continue }
            fields[String(line[..<equals])] = String(line[line.index(after: equals)...])
        }
        guard let group = fields["group"], SyncGroup.isGroupIdentifier(group), let database = fields["database"] else {
            throw LockboxError(
                .decode,
                "The sync configuration \(path) is damaged (or empty). If this keychain is in a group, join it again with "
                    + "`lockbox sync join GROUP --database CONNINFO --replace-group` (`lockbox sync status` on another device shows "
                    + "the group); if it never joined one, remove that file.")
        }
        do {
            try checkConnectionString(database)
        } catch {
            throw LockboxError(.decode, "The sync configuration \(path) was edited: \(error.message). Fix its database= line.")
        }
        return SyncConfiguration(group: group, database: database)
    }

    /// Whether the configuration can be written: its directory made (mode 0700) or there, a
    /// directory this user may write in.
    static func checkWritable(vault: Vault) throws(LockboxError) {
        try SyncFiles.prepareDirectory(SyncFiles.directory(vault: vault.path))
    }

    func save(vault: Vault) throws(LockboxError) {
        try SyncFiles.prepareDirectory(SyncFiles.directory(vault: vault.path))
        try Vault.writeAtomically(Array("group=\(group)\ndatabase=\(database)\n".utf8), to: Self.path(vault: vault), what: "the sync configuration")
    }
}

func openVault(_ keychain: String?) throws(LockboxError) -> Vault {
    guard let vault = try Keychain.open(Keychain.Options(backend: .vault, path: keychain)).vault else {
        throw LockboxError(.unimplemented, "Sync needs the vault backend.")
    }
    return vault
}

/// A passphrase or pairing code: from the terminal, or the first line of standard input (as
/// `lockbox init --passphrase-stdin` reads one).
func readSecret(_ prompt: String) throws(LockboxError) -> SecretBytes {
    if SecretInput.standardInputIsTerminal { return try SecretInput.prompt(prompt) }
    return SecretInput.splitLine(try SecretInput.readAll(limit: SecretInput.passphraseLimit)).line
}

/// A new group passphrase: asked twice on a terminal, so that a typo does not become a
/// passphrase nobody knows.
func readNewPassphrase(_ prompt: String) throws(LockboxError) -> SecretBytes {
    guard SecretInput.standardInputIsTerminal else { return try readSecret(prompt) }
    let first = try SecretInput.prompt(prompt, limit: SecretInput.passphraseLimit)
    return try SecretInput.repeated(first, limit: SecretInput.passphraseLimit, mismatch: "The two passphrases differ; nothing was changed.")
}

/// Refuses to move a keychain that already syncs with a group to another one unless asked:
/// its items would stop following the first group without a word.
/// Joining the group the keychain already names is allowed: a device removed from it joins
/// again that way.
func checkNotInGroup(_ vault: Vault, replacing: Bool, joining: String? = nil) throws(LockboxError) {
    guard !replacing, FileManager.default.fileExists(atPath: SyncConfiguration.path(vault: vault)) else { return }
    let current: String
    do {
        current = try SyncConfiguration.load(vault: vault).group
    } catch where error.code == .decode {
        // Names no group: not taken for one it names.
        throw LockboxError(
            .duplicateItem,
            "The sync configuration \(SyncConfiguration.path(vault: vault)) names no group (it is empty or damaged). If this keychain "
                + "never joined a group, remove that file; otherwise add --replace-group.")
    }
    if let joining, current == joining { return }
    throw LockboxError(
        .duplicateItem,
        "This keychain already syncs with the group \(shown(current)). "
            + "To sync it with another group instead, add --replace-group; it then stays listed as a device of the first group "
            + "until a device there removes it (`lockbox sync remove-device`).")
}

/// Text the database gave (device identifiers, dates), as a terminal may show it: printable
/// ASCII as it is, anything else escaped and quoted, so a row cannot forge lines or hide marks
/// with control sequences.
func shown(_ text: String) -> String {
    if text.unicodeScalars.allSatisfy({ (0x21...0x7E).contains($0.value) }) { return text }
    var escaped = "\""
    for scalar in text.unicodeScalars {
        switch scalar.value {
        case 0x22: escaped += "\\\""
        case 0x5C: escaped += "\\\\"
        case 0x20...0x7E: escaped.unicodeScalars.append(scalar)
        default: escaped += "\\u{" + String(scalar.value, radix: 16) + "}"
        }
    }
    return escaped + "\""
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
    case .create(let database, let withPassphrase, let replacing):
        let vault = try openVault(keychain)
        try checkNotInGroup(vault, replacing: replacing)
        try SyncGroup.requireUnlocked(vault, "Unlock it to create a sync group.")
        let passphrase = withPassphrase ? try readNewPassphrase("Group passphrase: ") : nil
        // Before the group is made: one whose configuration then could not be saved would be
        // left in the database and the keychain, its identifier never shown.
        try SyncConfiguration.checkWritable(vault: vault)
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
        streams.print("pairing code \(code) (one use, \(minutes) minute\(minutes == 1 ? "" : "s"))")
        return .success
    case .join(let groupID, let database, let withPassphrase, let replacing, let merging):
        try SyncGroup.checkGroupIdentifier(groupID)
        let vault = try openVault(keychain)
        try checkNotInGroup(vault, replacing: replacing, joining: groupID)
        try SyncGroup.requireUnlocked(vault, "Unlock it to join a sync group.")
        // Before the pairing code is read and used up: joining merges this keychain's
        // synchronizable items with the group's, and where both hold an item the later write
        // wins everywhere, the other value gone for good. Only when asked for.
        let held = try vault.synchronizableChanges(since: 0).count
        if held > 0 && !merging {
            throw LockboxError(
                .param,
                "This keychain already holds \(held) synchronizable item\(held == 1 ? "" : "s"). Joining merges "
                    + "\(held == 1 ? "it" : "them") with the group's: for an item both hold, the later write wins on every device "
                    + "and the other value is gone (a later delete in the group deletes it here). Nothing was changed, and no "
                    + "pairing code was used. Back them up first (`lockbox backup FILE`), then join again with --merge.")
        }
        // Before the pairing code is read and used up: a join that could not save would waste it.
        try SyncConfiguration.checkWritable(vault: vault)
        let group: SyncGroup
        if withPassphrase {
            group = try SyncGroup.join(groupID, vault: vault, database: database, passphrase: try readSecret("Group passphrase: "))
        } else {
            let code = try readSecret("Pairing code: ")
            let text = code.withUnsafeBytes { String(decoding: $0, as: UTF8.self) }
            group = try SyncGroup.join(groupID, vault: vault, database: database, pairingCode: text)
        }
        // Joined: a pairing code is used up from here on, a passphrase is not.
        let usedUp = withPassphrase ? "" : "the pairing code is used up; "
        do {
            try SyncConfiguration(group: group.groupID, database: database).save(vault: vault)
        } catch {
            // The keys and the device are kept: the same command with a new code (or the
            // passphrase) joins again as the same device and saves the configuration.
            throw LockboxError(
                error.code,
                "Joined as device \(group.deviceID) (\(usedUp)the keychain keeps the group's keys), but the sync configuration "
                    + "could not be saved: \(error.message) Then run the same join again (\(withPassphrase ? "with the group passphrase" : "with a new pairing code")): "
                    + "this keychain joins as the same device.")
        }
        streams.print("joined \(group.groupID) as device \(group.deviceID)")
        if let replaced = group.replacedDevice {
            streams.print(
                "this keychain was device \(replaced) of the group before (its device key is gone): remove it from a device of "
                    + "the group with `lockbox sync remove-device \(replaced)`")
        }
        do {
            let report = try group.sync()
            streams.print("first sync: pulled \(report.pulled), pushed \(report.pushed), superseded \(report.superseded)")
            reportSuperseded(report)
            for note in report.notes { streams.error("lockbox sync: note: " + note) }
        } catch {
            // Joined all the same. What to do next is the error's own advice (sync again
            // later, a reset, ...); no join again is needed.
            throw LockboxError(
                error.code,
                "Joined as device \(group.deviceID) (\(usedUp)no need to join again), but the first sync failed: " + error.message)
        }
        return .success
    case .now:
        let vault = try openVault(keychain)
        let configuration = try SyncConfiguration.load(vault: vault)
        let report = try SyncGroup(configuration.group, vault: vault, database: configuration.database).sync()
        streams.print("pushed \(report.pushed), pulled \(report.pulled), superseded \(report.superseded)")
        reportSuperseded(report)
        for note in report.notes { streams.error("lockbox sync: note: " + note) }
        return .success
    case .reset(let discarding):
        let vault = try openVault(keychain)
        let configuration = try SyncConfiguration.load(vault: vault)
        let report = try SyncGroup(configuration.group, vault: vault, database: configuration.database)
            .resetState(discardingLocalChanges: discarding)
        streams.print("rebuilt this device's sync state from the group; pushed \(report.pushed), pulled \(report.pulled)")
        return .success
    case .recover:
        let vault = try openVault(keychain)
        let configuration = try SyncConfiguration.load(vault: vault)
        let recovery = try SyncGroup(configuration.group, vault: vault, database: configuration.database).recoverDatabase()
        streams.print("checked the database's \(recovery.checked) record\(recovery.checked == 1 ? "" : "s") against its head")
        if recovery.restored == 0 {
            streams.print("it had lost nothing this device knew; nothing was put back")
        } else {
            streams.print(
                "put back \(recovery.restored) change\(recovery.restored == 1 ? "" : "s") this device knew and the database had lost "
                    + "(\(recovery.restoredDeletions) of them delete\(recovery.restoredDeletions == 1 ? "" : "s"))")
        }
        let report = recovery.sync
        streams.print("then synced: pushed \(report.pushed), pulled \(report.pulled), superseded \(report.superseded)")
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
                "Accepted the records of deleted items as they are now: they did not add up to what the keychain had recorded "
                    + "(records removed, put back or altered outside Lockbox). A delete whose record is gone, if not yet synced, "
                    + "now loses to any later edit made on another device.")
        }
        return .success
    case .removeDevice(let device, let withPassphrase):
        let vault = try openVault(keychain)
        let configuration = try SyncConfiguration.load(vault: vault)
        let group = try SyncGroup(configuration.group, vault: vault, database: configuration.database)
        try SyncGroup.requireUnlocked(vault, "Unlock it to remove a device.")
        let passphrase = withPassphrase ? try readNewPassphrase("New group passphrase: ") : nil
        let removal: SyncGroup.DeviceRemoval
        do {
            removal = try group.removeDevice(device, newPassphrase: passphrase)
        } catch where error.code == .decode {
            // A database whose data fails its checks stops a removal, and a device being removed
            // that can write it may keep it so: the way to cut it off that needs nothing of the
            // database is a new group.
            throw LockboxError(
                error.code,
                error.message + " Nothing was removed. To cut the device off without waiting for that, make a new group from this "
                    + "keychain (`lockbox sync create --database CONNINFO --replace-group`) and join the other devices to it.")
        }
        streams.print(
            removal.unfinishedHere == nil
                ? "removed \(shown(device)); the group key is now at epoch \(group.keyEpoch)" : "removed \(shown(device)) from the group")
        if !removal.wasListed {
            streams.print(
                "it was no longer listed in the database (its row deleted there); the key was replaced all the same, and it was given none")
        }
        func listed(_ devices: [String]) -> String { devices.map(shown).joined(separator: ", ") }
        if !removal.keeping.isEmpty { streams.print("given the new key: \(listed(removal.keeping)) and this device") }
        if !removal.firstSeen.isEmpty {
            streams.print(
                "seen by this device for the first time: \(listed(removal.firstSeen)). Any device of the group can add one; check that "
                    + "each is yours (`lockbox sync status` on it shows its identifier), and remove any that is not")
        }
        if !removal.keyReplaced.isEmpty {
            streams.print(
                "not given the new key, and removed: \(listed(removal.keyReplaced)) (its public key in the database is not the one this "
                    + "device saw it with: another device of the group replaced it). Join it again with a pairing code")
        }
        if !removal.missing.isEmpty {
            streams.print(
                "not given the new key: \(listed(removal.missing)) (seen by this device before, but no longer listed in the database: "
                    + "their rows were deleted there). If they are yours, join them again with a pairing code")
        }
        if removal.clearedFleetTokens > 0 {
            streams.print(
                "cleared \(removal.clearedFleetTokens) fleet token(s) that did not open with the group's key (changed in the "
                    + "database): sign those sessions in again")
        }
        if !removal.unattested.isEmpty {
            streams.print(
                "not given the new key, and removed: \(listed(removal.unattested)) (its row was not written by a device of the group). "
                    + "If it is yours, join it again with a pairing code")
        }
        streams.print(
            passphrase == nil
                ? "the group passphrase, if there was one, is dropped: do not join devices with it again (a copy of the database "
                    + "from before this removal would hand them the key the removed device holds); use `lockbox sync invite`"
                : "join new devices with the new passphrase only: the former one would open a copy of the database from before "
                    + "this removal, whose key the removed device holds")
        // Best effort: the removal is done whatever this finds.
        if let sessions = try? group.signedInFleetSessions(), sessions > 0 {
            streams.print(
                "the group holds \(sessions) signed-in fleet session(s): the removed device may still hold their tokens; "
                    + "sign each out (which revokes it at the server) and in again")
        }
        if let unfinished = removal.unfinishedHere {
            streams.error("lockbox sync: \(unfinished.description)")
            return .failure
        }
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
                "\"pendingLocalChanges\": \(status.pendingLocalChanges)", "\"stateBehind\": \(status.stateBehind)",
                "\"olderKeychain\": \(status.olderKeychain)",
                "\"syncedItems\": \(status.syncedItems)",
                "\"unverifiedWrites\": \(status.unverifiedWrites)", "\"heldBack\": \(status.heldBack)",
                "\"databaseReachable\": \(status.unreachable == nil)",
                "\"deletionRecords\": \(status.deletionRecords.records)", "\"deletionRecordsSound\": \(status.deletionRecords.isSound)",
            ]
            if let lastSync = status.lastSync { fields.append("\"lastSync\": \(jsonString(lastSync))") }
            if let problem = status.deviceRecordProblem { fields.append("\"deviceRecordProblem\": \(jsonString(problem))") }
            if let transport = status.transport { fields.append("\"transport\": \(jsonString(transport))") }
            if let head = status.headFingerprint { fields.append("\"head\": \(jsonString(head))") }
            if let remote = status.pendingRemoteVersions { fields.append("\"pendingRemoteVersions\": \(remote)") }
            // One key for what kept the database's part from being shown; `databaseReachable`
            // tells an unreachable database from one whose answer a sync would refuse.
            if let error = status.unreachable ?? status.databaseProblem { fields.append("\"databaseError\": \(jsonString(error))") }
            // Absent when the database did not answer: an empty list would say the group has none.
            if let listed = status.devices {
                let devices = listed.map { device in
                    "{\"id\": \(jsonString(device.id)), \"pulledVersion\": \(device.pulledVersion), \"lastSync\": \(device.lastSync.map(jsonString) ?? "null"), \"attested\": \(device.isAttested), \"keyReplaced\": \(device.isKeyReplaced)}"
                }
                fields.append("\"devices\": [\(devices.joined(separator: ", "))]")
            }
            streams.print("{" + fields.joined(separator: ", ") + "}")
        } else {
            streams.print("group:            \(status.groupID)")
            streams.print("this device:      \(status.deviceID)")
            streams.print("key epoch:        \(status.keyEpoch)")
            streams.print("verified head:    version \(status.pulledVersion), \(status.headFingerprint ?? "none yet")")
            let unknownLastSync = status.unreachable != nil ? "unknown: the database is unreachable" : "unknown: the database's answer was refused"
            streams.print("last sync:        \(status.lastSync.map(shown) ?? (status.unreachable == nil && status.databaseProblem == nil ? "never" : unknownLastSync))")
            streams.print("synced items:     \(status.syncedItems)")
            streams.print(
                status.stateBehind
                    ? "pending here:     none counted: this device's sync state is behind its last pull (`lockbox sync reset` rebuilds it)"
                    : status.olderKeychain
                        ? "pending here:     none counted: this keychain is an older copy than its sync state recorded (`lockbox sync reset` rebuilds the state)"
                        : "pending here:     \(status.pendingLocalChanges) change(s) for the next push")
            if status.unverifiedWrites > 0 {
                streams.print(
                    "written here:     \(status.unverifiedWrites) record(s) while another device wrote, "
                        + "to be found in the group's head by the next sync")
            }
            if status.heldBack > 0 {
                streams.print(
                    "held back:        \(status.heldBack) of the group's item(s) not applied here: an item of this keychain that does "
                        + "not sync (ThisDeviceOnly or under access control) has the same key; it is kept, and the group's "
                        + "arrives at the first sync after it is deleted or made to sync")
            }
            if let problem = status.deviceRecordProblem { streams.print("devices seen:     \(problem)") }
            if status.deletionRecords.isSound {
                streams.print("deletion records: \(status.deletionRecords.records) (deletes made or applied here, kept 180 days for sync), sound")
            } else {
                streams.print(
                    "deletion records: the records of deleted items were modified outside Lockbox: sync refuses them; "
                        + "`lockbox sync forget-damaged-deletions` repairs them")
            }
            if let unreachable = status.unreachable {
                streams.print("database:         unreachable (\(PostgresConnection.printable(unreachable))); the keychain is fully usable, sync later")
            } else if let problem = status.databaseProblem {
                streams.print("database:         a sync would fail: \(PostgresConnection.printable(problem)) The keychain is fully usable.")
            } else {
                if let transport = status.transport { streams.print("database:         \(transport)") }
                streams.print("pending remote:   \(status.pendingRemoteVersions ?? 0) version(s) not pulled yet")
                streams.print("devices:")
                for device in status.devices ?? [] {
                    let mark = device.id == status.deviceID ? " (this device)" : ""
                    let trust =
                        !device.isAttested
                        ? " UNATTESTED: not written by a device of the group"
                        : !device.isKeyReplaced ? ""
                        : device.id == status.deviceID
                            ? " KEY REPLACED: another device put its key in this device's row (`lockbox sync now` writes it back)"
                            : " KEY REPLACED: not the key this device first saw it with (remove it, then join it again)"
                    streams.print(
                        "  \(shown(device.id))  pulled \(device.pulledVersion)  last sync \(device.lastSync.map(shown) ?? "never")\(mark)\(trust)")
                }
            }
        }
        return .success
    }
}

// A sync that waits for another process's says so (on standard error), once.
SyncLock.waitingNotice.withLock { $0 = { streams.error("lockbox sync: " + $0) } }

guard let arguments = ProgramArguments.checked(program: "lockbox sync") else { exit(ExitStatus.usage.rawValue) }
let status: ExitStatus
do {
    let (keychain, command) = try parse(arguments)
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
exit(StandardOutput.exitStatus(status))
