import FoundationEssentials
import Lockbox
import LockboxCore
import LockboxBrokerIdentity
import LockboxCommandLine

#if canImport(Glibc)
import Glibc
#endif

/// Runs a parsed invocation.
struct Runner {
    let invocation: Invocation
    var output = StandardStreams()

    static let secretLimit = 64 * 1024

    func run() throws(LockboxError) -> ExitStatus {
        switch invocation.command {
        case .help(let verb):
            if let verb {
                guard let text = Help.text(for: verb) else {
                    // Not echoed: a mistyped command line may have put a secret here.
                    output.error("lockbox: no such command (not shown, in case it is a secret)\n\n\(Help.overview)")
                    return .usage
                }
                output.print(text)
            } else {
                output.print(Help.overview)
            }
            return .success
        case .version:
            output.print("lockbox 0.1.0")
            return .success
        case .initialize(let fromStandardInput, let strength):
            let passphrase = try newPassphrase(fromStandardInput: fromStandardInput)
            var configuration = Vault.Configuration()
            configuration.keyDerivation = strength
            try applyEnvironment(to: &configuration)
            let path = Keychain.vaultPath(explicit: invocation.keychain)
            _ = try Vault.create(at: path, passphrase: passphrase, configuration: configuration)
            output.print("Created the keychain \(path) (unlocked).")
            return .success
        case .unlock(let fromStandardInput, let timeout):
            var options = keychainOptions()
            if let timeout { options.vault.idleTimeout = .seconds(timeout) }
            let opened = try Keychain.open(options)
            if let broker = opened.broker {
                // The broker keeps the keys; it is given the passphrase (or an empty one, which
                // unlocks a vault without a passphrase with this machine's secret).
                let status = try broker.status()
                guard status.hasPassphrase else {
                    try broker.unlock(passphrase: .empty)
                    return .success
                }
                for attempt in 1...(fromStandardInput ? 1 : Self.unlockAttempts) {
                    let passphrase = try existingPassphrase(fromStandardInput: fromStandardInput, prompt: "Passphrase for \(status.path): ")
                    do {
                        try broker.unlock(passphrase: passphrase)
                        return .success
                    } catch where error.code == .authFailed && attempt < Self.unlockAttempts && !fromStandardInput {
                        output.error("lockbox: \(error.description) Try again.")
                    }
                }
                preconditionFailure("the last attempt returns or throws")
            }
            guard let vault = opened.vault else {
                throw LockboxError(.unimplemented, "This command needs the vault backend.")
            }
            guard vault.hasPassphrase else {
                // No passphrase (removed on purpose): this machine's device secret unlocks.
                try vault.unlock()
                return .success
            }
            if fromStandardInput {
                try vault.unlock(passphrase: try existingPassphrase(fromStandardInput: true, prompt: ""))
                return .success
            }
            // An explicit unlock uses the desktop keyring when it is enrolled (it does not reopen
            // a vault by itself after a lock in the same session).
            if vault.enrolledKeepers.contains("secret-service") {
                do {
                    try vault.unlock(with: Keychain.desktopKeyring(keychainOptions()))
                    output.error("Unlocked with the desktop keyring.")
                    return .success
                } catch {
                    output.error("lockbox: the desktop keyring could not unlock it (\(error.message)); asking for the passphrase.")
                }
            }
            // At the terminal a mistyped passphrase gets three tries, as sudo and gpg give.
            for attempt in 1...Self.unlockAttempts {
                let passphrase = try existingPassphrase(fromStandardInput: false, prompt: "Passphrase for \(vault.path): ")
                do {
                    try vault.unlock(passphrase: passphrase)
                    return .success
                } catch where error.code == .authFailed && attempt < Self.unlockAttempts {
                    output.error("lockbox: \(error.description) Try again.")
                }
            }
            preconditionFailure("the last attempt returns or throws")
        case .lock(let all):
            // Locking needs no check of the file: a tampered keychain can still be locked.
            var options = keychainOptions()
            try applyEnvironment(to: &options.vault)
            let path = Keychain.vaultPath(explicit: options.path)
            let brokerAsked = try Keychain.brokerWanted(environmentValue: ProcessEnvironment.value("LOCKBOX_BROKER")) == true
            if options.backend == .broker || brokerAsked || BrokerClaim.isServedByBroker(vaultPath: path) {
                guard let broker = try Keychain.open(options).broker else {
                    throw LockboxError(.notAvailable, "lockboxd serves this keychain, but another backend was chosen; lock it through the broker.")
                }
                try broker.lock(all: all)
                return .success
            }
            try Vault.lock(at: path, configuration: options.vault, all: all)
            return .success
        case .status(let json):
            let opened = try Keychain.open(keychainOptions())
            if let broker = opened.broker {
                let status = try broker.status()
                if json {
                    // The device key is the broker's to use; where it lives is read from here.
                    let device = keychainOptions().vault.device
                    let deviceKey = "\((try? device.storage)?.description ?? "unreadable") (\(device.resolvedKeyPath))"
                    output.print(
                        Self.json(StatusReport(backend: opened.backend.rawValue, reason: opened.reason, vault: status, tpm: "", deviceKey: deviceKey)))
                } else {
                    output.print(Self.describe(status, backend: opened.backend.rawValue, reason: opened.reason))
                }
                return .success
            }
            guard let vault = opened.vault else {
                output.print("backend: \(opened.backend.rawValue) (\(opened.reason))\nstate: available")
                return .success
            }
            let status = try vault.status()
            let tpm = Self.tpmUse(vault, status: status)
            let device = vault.configuration.device
            var deviceKey = "\((try? device.storage)?.description ?? "unreadable") (\(device.resolvedKeyPath))"
            if let unavailable = vault.deviceKeyUnavailability {
                deviceKey += "; not available here, ThisDeviceOnly items cannot be read (OSStatus \(unavailable.status))"
            }
            if json {
                output.print(
                    Self.json(
                        StatusReport(backend: opened.backend.rawValue, reason: opened.reason, vault: status, tpm: tpm, deviceKey: deviceKey)))
            } else {
                output.print(
                    Self.describe(status, backend: opened.backend.rawValue, reason: opened.reason) + "\ntpm: \(tpm)\ndevice key: \(deviceKey)")
            }
            return .success
        case .verify(let acceptOlder, let json):
            var options = keychainOptions()
            try applyEnvironment(to: &options.vault)
            let report = try Vault.verify(at: Keychain.vaultPath(explicit: options.path), configuration: options.vault, acceptOlder: acceptOlder)
            if json {
                output.print(Self.json(report))
            } else {
                output.print("generation: \(report.generation.map(String.init) ?? "none") (remembered \(report.rememberedGeneration))")
                output.print("items: \(report.items), checked \(report.checkedItems), bound to other machines \(report.otherMachinesItems)")
                if let records = report.deletionRecords, records > 0 {
                    output.print("recorded deletions of synchronizable items: \(records), damaged \(report.damagedDeletionRecords ?? 0)")
                }
                if report.acceptedOlderGeneration { output.print("The older file was accepted on purpose.") }
                if let unopened = report.lockedForTheCopysPassphrase {
                    output.print(
                        "\(unopened) item(s) did not open with the keys unlocked before: they are the later file's (its passphrase was "
                            + "changed after this copy was made). The keychain is now locked: unlock it with the passphrase this copy was "
                            + "made with (`lockbox unlock`), then verify again.")
                }
                for problem in report.problems { output.print("problem: \(problem)") }
                output.print(
                    report.lockedForTheCopysPassphrase != nil
                        ? "Its items are checked once it is unlocked with that passphrase."
                        : report.isSound ? "The keychain file is sound." : "The keychain file does NOT check out.")
            }
            return report.isSound ? .success : .failure
        case .changePassphrase(let fromStandardInput):
            let vault = try openVault()
            let old: SecretBytes
            let new: SecretBytes
            if fromStandardInput {
                let input = try SecretInput.readAll(limit: 2 * SecretInput.passphraseLimit)
                let first = SecretInput.splitLine(input)
                old = first.line
                new = SecretInput.splitLine(first.rest).line
            } else {
                old = try existingPassphrase(fromStandardInput: false, prompt: "Current passphrase: ")
                new = try newPassphrase(fromStandardInput: false)
            }
            guard !new.isEmpty else { throw Self.emptyPassphrase }
            let change = try vault.changePassphrase(from: old, to: new)
            output.print("Passphrase changed; the keys were rotated and \(change.resealedItems) item(s) resealed.")
            for method in change.removedUnlockMethods {
                output.error(
                    "The \(method) unlock held the old key and was removed: enroll it again with `lockbox enroll \(method)`.")
            }
            return .success
        case .addPassword(let options):
            return try addPassword(options)
        case .findPassword(let options):
            return try findPassword(options)
        case .deletePassword(let options):
            let store = try Keychain.open(keychainOptions()).store
            var query = Query(options.itemClass, attributes: options.attributes, limit: .all, returning: [])
            query.synchronizable = options.synchronizable ? .synchronizable : .any
            let deleted = try store.delete(matching: query)
            output.error("Deleted \(deleted) item\(deleted == 1 ? "" : "s").")
            return .success
        case .dump(let json):
            return try dump(json: json)
        case .backup(let file, let fromStandardInput, let replacing):
            let vault = try openVault()
            // Before the passphrase is asked for: a path that will be refused costs no typing.
            try Vault.checkBackupTarget(file, replacing: replacing)
            let passphrase = try newPassphrase(fromStandardInput: fromStandardInput, prompt: "Backup passphrase: ")
            let summary = try vault.backup(to: file, passphrase: passphrase, replacing: replacing)
            output.error(
                "Backed up \(summary.exported) item(s) to \(file). Left out by design: \(summary.skippedThisDeviceOnly) "
                    + "ThisDeviceOnly, \(summary.skippedAccessControlled) access-controlled, "
                    + "\(summary.skippedNonExtractableKeys) non-extractable key\(summary.skippedNonExtractableKeys == 1 ? "" : "s").")
            return .success
        case .restore(let file, let fromStandardInput):
            let vault = try openVault()
            let passphrase = try existingPassphrase(fromStandardInput: fromStandardInput, prompt: "Backup passphrase: ")
            let summary = try vault.restore(from: file, passphrase: passphrase)
            output.error(
                "Restored from \(file): \(summary.added) added, \(summary.replaced) replaced by a newer copy, "
                    + "\(summary.kept) kept (the existing copy was as new or newer).")
            return .success
        case .removePassphrase(let fromStandardInput, let confirmed):
            let vault = try openVault()
            let passphrase = try existingPassphrase(fromStandardInput: fromStandardInput, prompt: "Current passphrase: ")
            // Unlocking checks the passphrase and lets the items that would go be counted.
            try vault.unlock(passphrase: passphrase)
            let doomed = try passcodeBoundItemCount(vault)
            let warning =
                "Removing the passphrase deletes \(doomed) whenPasscodeSetThisDeviceOnly or access-controlled item(s), "
                + "and the keychain then unlocks on this machine without a passphrase."
            if !confirmed {
                guard SecretInput.standardInputIsTerminal else {
                    output.error("lockbox: \(warning) Nothing was changed: pass --yes to confirm.")
                    return .usage
                }
                guard try SecretInput.confirm("\(warning)\nType yes to go on: ") else {
                    output.error("lockbox: Cancelled; nothing was changed.")
                    return .failure
                }
            }
            let deleted = try vault.removePassphrase(passphrase)
            output.error(
                "The passphrase is removed: this keychain now unlocks on this machine without one. "
                    + "\(deleted) whenPasscodeSetThisDeviceOnly or access-controlled item(s) were deleted.")
            return .success
        case .enroll(_, let remove):
            let vault = try openVault()
            let keyring = Keychain.desktopKeyring(keychainOptions())
            if remove {
                try vault.unenroll(keyring)
                output.error("The desktop keyring no longer unlocks this keychain.")
            } else {
                try vault.enroll(keyring)
                output.error("The desktop keyring (Secret Service) now unlocks this keychain with your login session.")
            }
            return .success
        case .setPassphrase(let fromStandardInput):
            let vault = try openVault()
            try vault.setPassphrase(try newPassphrase(fromStandardInput: fromStandardInput))
            output.error("Passphrase set.")
            return .success
        case .login, .token, .logout, .authStatus:
            preconditionFailure("OAuth commands run through AuthCommands")
        case .generateKey, .sign, .publicKey, .deleteKey, .enrollTPM, .sealDeviceKey, .unlockTPM:
            preconditionFailure("key commands run in lockbox-keys")
        case .sshAgent:
            preconditionFailure("ssh-agent runs in lockbox-ssh-agent")
        case .sync:
            preconditionFailure("sync runs in lockbox-sync")
        case .brokerUnits(let install, let lockboxd):
            let outcome =
                install
                ? try BrokerUnits.install(brokerCommand: [lockboxd ?? BrokerUnits.defaultBrokerExecutable])
                : try BrokerUnits.uninstall()
            output.print(outcome.message)
            return .success
        case .brokerControl(let stop):
            return try brokerControl(stop: stop)
        }
    }

    // MARK: The broker

    private func brokerControl(stop: Bool) throws(LockboxError) -> ExitStatus {
        let broker: BrokerStore
        do throws(LockboxError) {
            broker = try BrokerControl.connection()
        } catch where error.code == .notAvailable {
            // A broker that holds its socket's lock runs, even when it refused this connection
            // (every connection slot taken, say).
            if let socket = try? BrokerLocation.socketPath(), BrokerLocation.isHeld(socket: socket) {
                throw LockboxError(.notAvailable, "lockboxd runs (it holds \(socket)) but did not take this connection: \(error.message)")
            }
            guard stop else {
                output.print("lockboxd: not running (\(error.message))")
                return .failure
            }
            throw LockboxError(.notAvailable, "No lockboxd runs, so there is nothing to stop: \(error.message)")
        }
        if stop {
            let pid = try broker.stop()
            output.error("Stopped lockboxd (pid \(pid)); every write it acknowledged is in the keychain file. The keys it held are forgotten.")
            return .success
        }
        let status = try broker.status()
        let state = status.isUnlocked ? "unlocked" : status.wasUnlockedSinceBoot ? "locked (unlocked since it started)" : "locked"
        output.print(
            [
                "lockboxd: running, pid \(broker.brokerProcessIdentifier)",
                "socket: \(broker.socketPath)",
                "keychain: \(status.path)",
                "state: \(state)",
                "items: \(status.itemCount)",
            ].joined(separator: "\n"))
        return .success
    }

    // MARK: Items

    private func addPassword(_ options: PasswordOptions) throws(LockboxError) -> ExitStatus {
        // Apple's rule, as SecItemAdd and SecItemUpdate apply it: a synchronizable item never
        // leaves this device under a ThisDeviceOnly class (and one that synced would be deleted
        // from the group's other devices). Refused before the secret is read.
        if options.synchronizable, options.attributes.accessibility?.isThisDeviceOnly == true {
            throw LockboxError(
                .param,
                "A synchronizable item cannot use a ThisDeviceOnly accessibility: it would never leave this device, and one that "
                    + "synced would be deleted from the group's other devices. Leave out --synchronizable for an item of this device "
                    + "only, or choose an accessibility without ThisDeviceOnly.")
        }
        let store = try Keychain.open(keychainOptions()).store
        let secret: SecretBytes
        if SecretInput.standardInputIsTerminal {
            guard !options.raw else {
                throw LockboxError(.param, "--raw reads the secret's bytes from standard input: pipe them in instead of typing.")
            }
            // A new secret typed without echo is asked twice, so a typo is not stored.
            let name = options.attributes.service ?? options.attributes.server ?? "the item"
            secret = try SecretInput.prompt("Secret for \(name): ", limit: Self.secretLimit)
            if !secret.isEmpty || !options.allowEmpty {
                guard !secret.isEmpty else { throw Self.emptySecret }
                _ = try SecretInput.repeated(secret, limit: Self.secretLimit, mismatch: "The two entries differ; nothing was stored.")
            }
        } else {
            secret = try SecretInput.readSecret(raw: options.raw, limit: Self.secretLimit)
        }
        guard !secret.isEmpty || options.allowEmpty else { throw Self.emptySecret }
        var item = Item(options.itemClass, attributes: options.attributes, data: secret)
        item.accessControl = options.accessControl
        do {
            try store.add(item)
        } catch LockboxError.duplicateItem where options.updateIfExists {
            var match = options.attributes
            match.label = nil
            match.comment = nil
            match.itemDescription = nil
            match.accessibility = nil
            var changes = ItemAttributes()
            changes.label = options.attributes.label
            changes.comment = options.attributes.comment
            changes.itemDescription = options.attributes.itemDescription
            changes.accessibility = options.attributes.accessibility
            // The item of the same kind: the sync flag is part of an item's primary key.
            var query = Query(options.itemClass, attributes: match)
            query.synchronizable = options.synchronizable ? .synchronizable : .notSynchronizable
            try store.update(matching: query, to: ItemUpdate(attributes: changes, data: secret))
        }
        return .success
    }

    private func findPassword(_ options: PasswordOptions) throws(LockboxError) -> ExitStatus {
        let store = try Keychain.open(keychainOptions()).store
        var query = Query(
            options.itemClass, attributes: options.attributes, limit: .one,
            returning: options.printSecretOnly ? [.data] : [.attributes])
        query.synchronizable = options.synchronizable ? .synchronizable : .any
        guard let item = try store.items(matching: query).first else {
            throw LockboxError(.itemNotFound, "No matching item was found in the keychain.")
        }
        if options.printSecretOnly {
            guard let data = item.data else { return .failure }
            SecretInput.writeToStandardOutput(data, newline: !options.raw)
        } else if options.json {
            output.print(Self.json(ItemSummary(item)))
        } else {
            output.print(Self.describe(ItemSummary(item)))
        }
        return .success
    }

    /// Every item's attributes. A locked keychain shows what its open classes hold, then says
    /// how many items it left out and fails (-25308): a partial listing never passes for the whole.
    private func dump(json: Bool) throws(LockboxError) -> ExitStatus {
        let opened = try Keychain.open(keychainOptions())
        var summaries: [ItemSummary] = []
        var locked = 0
        for itemClass in ItemClass.allCases {
            var query = Query(itemClass, limit: .all, returning: [.attributes])
            query.synchronizable = .any
            do {
                if let vault = opened.vault {
                    let listing = try vault.listing(matching: query, showingLockedOnly: true)
                    summaries += listing.items.map(ItemSummary.init)
                    locked += listing.locked
                } else {
                    summaries += try opened.store.items(matching: query).map(ItemSummary.init)
                }
            } catch LockboxError.itemNotFound {
                continue
            }
        }
        if json {
            output.print(Self.json(summaries))
        } else {
            output.print(summaries.map(Self.describe).joined(separator: "\n\n"))
        }
        guard locked == 0 else {
            throw LockboxError.locked(
                "\(locked) item\(locked == 1 ? " is" : "s are") not shown above: \(locked == 1 ? "its class is" : "their classes are") locked. "
                    + "Unlock it with `lockbox unlock`, then run dump again.")
        }
        if opened.broker != nil {
            // The broker answers within this command's access groups: said, so that a short
            // listing is not taken for the whole keychain.
            output.error(
                "Through lockboxd, dump lists the access groups this command reaches; other programs' groups are not listed.")
        }
        return .success
    }

    // MARK: Passphrases

    private func newPassphrase(fromStandardInput: Bool, prompt: String = "New passphrase: ") throws(LockboxError) -> SecretBytes {
        if fromStandardInput {
            let passphrase = SecretInput.splitLine(try SecretInput.readAll(limit: SecretInput.passphraseLimit)).line
            guard !passphrase.isEmpty else { throw Self.emptyPassphrase }
            return passphrase
        }
        guard SecretInput.standardInputIsTerminal else { throw Self.noPassphraseSource }
        let first = try SecretInput.prompt(prompt, limit: SecretInput.passphraseLimit)
        guard !first.isEmpty else { throw Self.emptyPassphrase }
        return try SecretInput.repeated(first, limit: SecretInput.passphraseLimit, mismatch: "The two passphrases differ; nothing was changed.")
    }

    private func existingPassphrase(fromStandardInput: Bool, prompt: String) throws(LockboxError) -> SecretBytes {
        if fromStandardInput {
            return SecretInput.splitLine(try SecretInput.readAll(limit: SecretInput.passphraseLimit)).line
        }
        guard SecretInput.standardInputIsTerminal else { throw Self.noPassphraseSource }
        return try SecretInput.prompt(prompt, limit: SecretInput.passphraseLimit)
    }

    static let unlockAttempts = 3

    static let emptyPassphrase = LockboxError(.param, "The new passphrase is empty; nothing was changed. Give a passphrase.")

    static let emptySecret = LockboxError(
        .param,
        "The secret is empty (nothing on standard input, or Enter at the prompt); nothing was stored. "
            + "Check the variable or file you piped in, or pass --allow-empty to store an empty secret.")

    /// The items ``Vault/removePassphrase(_:)`` would delete: whenPasscodeSetThisDeviceOnly or
    /// access-controlled. The vault must be unlocked.
    private func passcodeBoundItemCount(_ vault: Vault) throws(LockboxError) -> Int {
        var count = 0
        for itemClass in ItemClass.allCases {
            var query = Query(itemClass, limit: .all, returning: [.attributes])
            query.synchronizable = .any
            do {
                count += try vault.items(matching: query).count {
                    $0.attributes.accessibility == .whenPasscodeSetThisDeviceOnly || $0.accessControl != nil
                }
            } catch LockboxError.itemNotFound {
                continue
            }
        }
        return count
    }

    static let noPassphraseSource = LockboxError(
        .notAvailable,
        "No way to ask for the passphrase: standard input is not a terminal. "
            + "Pass --passphrase-stdin and pipe the passphrase on standard input.")

    // MARK: Helpers

    /// The keychain options for this invocation: the path, and a terminal prompt for items
    /// protected by access control.
    func keychainOptions() -> Keychain.Options {
        var options = Keychain.Options(backend: invocation.backend, path: invocation.keychain)
        options.vault.authenticationContext = AuthenticationContext(verifier: TerminalVerifier())
        return options
    }

    private func openVault(_ options: Keychain.Options? = nil) throws(LockboxError) -> Vault {
        let opened = try Keychain.open(options ?? keychainOptions())
        guard let vault = opened.vault else {
            throw LockboxError(.unimplemented, "This command needs the vault backend.")
        }
        return vault
    }

    private func applyEnvironment(to configuration: inout Vault.Configuration) throws(LockboxError) {
        try Keychain.applyEnvironment(to: &configuration)
    }

    static func json<T: Encodable>(_ value: T) -> String {
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.prettyPrinted, .sortedKeys]
        encoder.dateEncodingStrategy = .iso8601
        guard let data = try? encoder.encode(value) else { return "{}" }
        return String(decoding: data, as: UTF8.self)
    }

    static func describe(_ status: VaultStatus, backend: String, reason: String) -> String {
        let state =
            status.isUnlocked ? "unlocked" : status.wasUnlockedSinceBoot ? "locked (unlocked since boot)" : "locked"
        var lines = [
            "keychain: \(status.path)",
            "backend: \(backend) (\(reason))",
            "state: \(state)",
            "readable now: " + (status.readableClasses.isEmpty ? "none" : status.readableClasses.map(\.rawValue).joined(separator: ", ")),
            "items: \(status.itemCount)",
            "unlock methods: " + status.unlockMethods.map { $0 == "device" ? "none needed on this machine" : $0 }.joined(separator: ", "),
            "unlock cache: \(status.unlockCache.rawValue)",
        ]
        if !status.hasPassphrase {
            lines.append("passphrase: none (removed; unlocks on this machine without one)")
        }
        if status.itemsBoundToOtherMachines > 0 {
            lines.append(
                "unavailable here: \(status.itemsBoundToOtherMachines) ThisDeviceOnly item(s) from another machine "
                    + "(the file was copied; they never open elsewhere)")
        }
        if status.failedUnlockAttempts > 0 {
            lines.append("failed unlock attempts: \(status.failedUnlockAttempts)")
        }
        return lines.joined(separator: "\n")
    }

    /// Whether this keychain uses a TPM (its unlock slot, hardware keys) and whether the machine
    /// has one. Asks no TPM: this binary does not load the tss2 libraries.
    static func tpmUse(_ vault: Vault, status: VaultStatus) -> String {
        var uses: [String] = []
        if status.unlockMethods.contains("tpm2") { uses.append("unlock method tpm2") }
        if status.isUnlocked {
            let keys = (try? vault.items(matching: Query(.key, limit: .all, returning: [.attributes]))) ?? []
            let hardware = keys.filter { ManagedKeyValue.isHardwareKey(descriptor: $0.attributes.generic) }.count
            if hardware > 0 { uses.append("\(hardware) hardware key\(hardware == 1 ? "" : "s")") }
        }
        let configured = ProcessEnvironment.value("LOCKBOX_TPM_TCTI").flatMap { $0.isEmpty ? nil : $0 }
        let device = configured ?? (access("/dev/tpmrm0", F_OK) == 0 ? "/dev/tpmrm0" : nil)
        let machine = device.map { "TPM 2.0 at \($0)" } ?? "no TPM 2.0 on this machine"
        return uses.isEmpty ? "not in use (\(machine))" : "in use: " + uses.joined(separator: ", ") + " (\(machine))"
    }

    static func describe(_ item: ItemSummary) -> String {
        var lines = ["class: \(item.itemClass)"]
        // Each value on its line: a control character an item's attribute holds (a newline
        // that would fake a line, an escape sequence for the terminal) is written as `\xNN`.
        func add(_ name: String, _ value: String?) {
            if let value { lines.append("\(name): \(PrintableText.oneLine(value))") }
        }
        add("service", item.service)
        add("server", item.server)
        add("protocol", item.protocol)
        add("port", item.port.map(String.init))
        add("path", item.path)
        add("securityDomain", item.securityDomain)
        add("authenticationType", item.authenticationType)
        add("account", item.account)
        add("label", item.label)
        add("comment", item.comment)
        add("description", item.description)
        add("accessibility", item.accessibility)
        add("accessGroup", item.accessGroup)
        add("keyType", item.keyType)
        add("applicationTag", item.applicationTag)
        add("token", item.token)
        add("synchronizable", item.synchronizable.map { $0 ? "yes" : "no" })
        add("created", item.created.map { $0.formatted(.iso8601) })
        add("modified", item.modified.map { $0.formatted(.iso8601) })
        return lines.joined(separator: "\n")
    }
}

struct StatusReport: Encodable {
    var backend: String
    var reason: String
    var vault: VaultStatus
    var tpm: String
    /// Where this machine's device key lives (`file`, `sealed by the TPM`), and its path.
    var deviceKey: String
}

/// An item's attributes for printing: never its data.
struct ItemSummary: Encodable {
    var itemClass: String
    var service, account, label, comment, description, accessibility, accessGroup: String?
    var server, `protocol`, path, securityDomain, authenticationType: String?
    var port: Int?
    var synchronizable: Bool?
    var created, modified: Date?
    /// Keys: the algorithm, the application tag (text, or hex when it is not), and where the
    /// private key lives (hardware: inside the TPM).
    var keyType, applicationTag, token: String?

    init(_ item: Item) {
        let attributes = item.attributes
        itemClass = item.itemClass.rawValue
        service = attributes.service
        account = attributes.account
        label = attributes.label
        comment = attributes.comment
        description = attributes.itemDescription
        accessibility = attributes.accessibility?.rawValue
        accessGroup = attributes.accessGroup
        server = attributes.server
        `protocol` = attributes.protocol?.rawValue
        path = attributes.path
        securityDomain = attributes.securityDomain
        authenticationType = attributes.authenticationType?.rawValue
        port = attributes.port
        synchronizable = attributes.synchronizable
        created = attributes.creationDate
        modified = attributes.modificationDate
        if item.itemClass == .key {
            keyType = attributes.keyType?.rawValue
            applicationTag = attributes.applicationTag.map { tag in
                String(bytes: tag, encoding: .utf8).flatMap { $0.allSatisfy { !$0.isNewline && $0.isASCII } ? $0 : nil }
                    ?? tag.map { ($0 < 16 ? "0" : "") + String($0, radix: 16) }.joined()
            }
            token = ManagedKeyValue.isHardwareKey(descriptor: attributes.generic) ? "hardware (TPM)" : "software"
        }
    }
}
