import FoundationEssentials
import Lockbox
import LockboxBroker
import LockboxCommandLine
import LockboxKeys

#if canImport(Glibc)
import Glibc
#endif

/// The key and TPM verbs. Nothing here prints a private key: there is no verb for it.
struct KeyCommands {
    let invocation: Invocation
    var output = StandardStreams()

    /// The largest message `sign` reads from standard input.
    static let messageLimit = 16 * 1024 * 1024

    func run() throws(LockboxError) -> ExitStatus {
        switch invocation.command {
        case .generateKey(let options):
            let home = try openKeys()
            guard let algorithm = KeyAlgorithm(rawValue: options.algorithm) else {
                throw LockboxError(
                    .param,
                    "Unknown key algorithm; use one of " + KeyAlgorithm.allCases.map(\.rawValue).joined(separator: ", ") + ".")
            }
            var specification = KeySpecification(algorithm: algorithm, purposes: try purposes(options.purposes, algorithm: algorithm))
            specification.applicationTag = Data(options.tag.utf8)
            specification.label = options.label
            if let accessibility = options.accessibility { specification.accessibility = accessibility }
            specification.isSynchronizable = options.synchronizable
            if options.hardware {
                specification.token = .hardware
                if options.purposes.isEmpty { specification.purposes = [.sign, .verify] }
            }
            let keys: SoftwareKeyStore
            switch home {
            case .broker(let broker): return try generate(specification, options, in: broker)
            case .vault(let store): keys = store
            }
            guard try keys.keys(applicationTag: specification.applicationTag, label: options.label).isEmpty else {
                throw LockboxError(.duplicateItem, "A key with this tag (and label) exists; delete it first or pick another tag.")
            }
            let key = try keys.generate(specification)
            if options.json {
                output.print(Self.json(key))
            } else if let publicKey = key.publicKey {
                writeText(publicKey.pemRepresentation)
            }
            output.error("Made a \(key.token == .hardware ? "hardware (TPM)" : "software") \(algorithm) key for \(key.purposes).")
            return .success
        case .sign(let options):
            let home = try openKeys()
            // The key is found before standard input is read: a wrong tag fails without waiting.
            let key: ManagedKey? = if case .vault(let keys) = home { try findKey(options, in: keys) } else { nil }
            let message = try SecretInput.readAll(limit: Self.messageLimit, what: "The message to sign").withUnsafeBytes { Data($0) }
            let signature: Data
            switch (home, key) {
            case (.broker(let broker), _):
                signature = try broker.sign(message, applicationTag: Data(options.tag.utf8), label: options.label)
            case (.vault, let key?):
                signature = try key.sign(message)
            case (.vault, nil):
                throw LockboxError(.itemNotFound, "No key with this tag is in the keychain.")
            }
            if options.raw {
                signature.withUnsafeBytes { writeAll($0, to: STDOUT_FILENO) }
            } else {
                output.print(signature.base64EncodedString())
            }
            return .success
        case .publicKey(let options):
            let home = try openKeys()
            let publicKey: PublicKey
            switch home {
            case .broker(let broker):
                let der = try broker.publicKey(applicationTag: Data(options.tag.utf8), label: options.label)
                guard !der.isEmpty else { throw LockboxError(.param, "This key is symmetric and has no public half.") }
                publicKey = try PublicKey(derRepresentation: der)
            case .vault(let keys):
                let key = try findKey(options, in: keys)
                guard let half = key.publicKey else {
                    throw LockboxError(.param, "An \(key.algorithm) key is symmetric and has no public half.")
                }
                publicKey = half
            }
            switch options.format {
            case "der": publicKey.derRepresentation.withUnsafeBytes { writeAll($0, to: STDOUT_FILENO) }
            case "x963": publicKey.rawRepresentation.withUnsafeBytes { writeAll($0, to: STDOUT_FILENO) }
            case "openssh": output.print(try publicKey.openSSHRepresentation(comment: options.label ?? options.tag))
            default: writeText(publicKey.pemRepresentation)
            }
            return .success
        case .deleteKey(let options):
            let keys: SoftwareKeyStore
            switch try openKeys() {
            case .broker(let broker):
                guard options.label != "" else {
                    throw LockboxError(.unimplemented, "Through the broker, a key without a label is named by its tag alone; leave out --label.")
                }
                var query = Query(.key, limit: .all, returning: [.attributes], synchronizable: .any)
                query.attributes.applicationTag = Data(options.tag.utf8)
                query.attributes.label = options.label
                let matching: Int
                do {
                    matching = try broker.items(matching: query).count
                } catch LockboxError.itemNotFound {
                    throw LockboxError(.itemNotFound, "No key with this tag is in the keychain.")
                }
                try Self.checkDeletingSeveral(matching, options)
                query.returning = []
                let count = try broker.delete(matching: query)
                output.error("Deleted \(count) key\(count == 1 ? "" : "s").")
                return .success
            case .vault(let store): keys = store
            }
            let found = try matchingKeys(options, in: keys)
            guard !found.isEmpty else { throw LockboxError(.itemNotFound, "No key with this tag is in the keychain.") }
            try Self.checkDeletingSeveral(found.count, options)
            for key in found { try key.delete() }
            output.error("Deleted \(found.count) key\(found.count == 1 ? "" : "s").")
            return .success
        case .enrollTPM(let pcrs, let remove):
            let vault = try openVault()
            if remove {
                try vault.unenroll(sealingKind: "tpm2")
                output.error("The TPM unlock method was removed.")
            } else {
                try vault.enroll(sealing: TPMUnlockSlot(pcrs: pcrs))
                output.error(
                    "The TPM now unlocks this keychain (`lockbox unlock --tpm2`)"
                        + (pcrs.isEmpty ? "." : " while PCRs \(pcrs.map(String.init).joined(separator: ",")) keep their current values."))
            }
            return .success
        case .sealDeviceKey(let pcrs):
            let device = keychainOptions().vault.device
            let outcome = try device.sealWithTPM(pcrs: pcrs)
            let bound = pcrs.isEmpty ? "" : " while PCRs \(pcrs.map(String.init).joined(separator: ",")) keep their current values"
            switch outcome {
            case .migratedFromFile:
                output.error(
                    "The device key is now sealed by the TPM\(bound); the clear key file was replaced (\(device.resolvedKeyPath)). "
                        + "ThisDeviceOnly items stay readable here, and a copy of the file opens them nowhere else.")
            case .created:
                output.error("A new device key was made, sealed by the TPM\(bound) (\(device.resolvedKeyPath)).")
            case .resealed:
                output.error("The device key was sealed again by the TPM\(bound) (\(device.resolvedKeyPath)).")
            }
            return .success
        case .unlockTPM(let timeout):
            var options = keychainOptions()
            if let timeout { options.vault.idleTimeout = .seconds(timeout) }
            try openVault(options).unlock(sealing: TPMUnlockSlot())
            output.error("Unlocked with the TPM.")
            return .success
        default:
            preconditionFailure("lockbox-keys runs only the key commands")
        }
    }

    /// Text as it is (a PEM block ends with its own newline).
    private func writeText(_ text: String) {
        Array(text.utf8).withUnsafeBytes { writeAll($0, to: STDOUT_FILENO) }
    }

    /// Where the keys live: the vault's key store, or `lockboxd`, which makes and uses them
    /// inside itself (this process never holds the private key).
    private enum KeyHome {
        case vault(SoftwareKeyStore)
        case broker(BrokerStore)
    }

    private func openKeys() throws(LockboxError) -> KeyHome {
        let opened = try Keychain.open(keychainOptions())
        if let vault = opened.vault { return .vault(SoftwareKeyStore(vault: vault)) }
        if let broker = opened.broker { return .broker(broker) }
        throw LockboxError(
            .unimplemented, "Managed keys live in the vault or inside the broker; this keychain is \(opened.backend.rawValue).")
    }

    /// A key made inside the broker: non-extractable, in software (the broker's keys are its own).
    private func generate(_ specification: KeySpecification, _ options: KeyOptions, in broker: BrokerStore) throws(LockboxError) -> ExitStatus {
        guard specification.token != .hardware else {
            throw LockboxError(
                .unimplemented, "Through the broker, keys are made in software inside lockboxd; use the vault backend for a TPM key.")
        }
        guard !specification.isSynchronizable else {
            throw LockboxError(
                .unimplemented, "Keys made inside lockboxd stay in it; make a synchronizable key with the vault backend.")
        }
        let tag = specification.applicationTag ?? Data()
        let exists: Bool
        do throws(LockboxError) {
            _ = try broker.publicKey(applicationTag: tag, label: options.label)
            exists = true
        } catch where error.code == .itemNotFound {
            exists = false
        }
        guard !exists else {
            throw LockboxError(.duplicateItem, "A key with this tag (and label) exists; delete it first or pick another tag.")
        }
        let der = try broker.generateKey(
            algorithm: specification.algorithm.rawValue, purposes: specification.purposes.rawValue, applicationTag: tag, label: options.label)
        let publicKey = der.isEmpty ? nil : try PublicKey(derRepresentation: der)
        if options.json {
            output.print(
                Self.json(
                    algorithm: specification.algorithm, purposes: specification.purposes, token: "broker", label: options.label,
                    applicationLabel: nil, publicKey: publicKey))
        } else if let publicKey {
            writeText(publicKey.pemRepresentation)
        }
        output.error("Made a non-extractable \(specification.algorithm) key for \(specification.purposes) inside the broker.")
        return .success
    }

    /// The one key `options` name in the vault (the broker finds its keys itself, by tag and label).
    private func findKey(_ options: KeyOptions, in keys: SoftwareKeyStore) throws(LockboxError) -> ManagedKey {
        let found = try matchingKeys(options, in: keys)
        guard let key = found.first else { throw LockboxError(.itemNotFound, "No key with this tag is in the keychain.") }
        guard found.count == 1 else {
            throw LockboxError(.param, "\(found.count) keys have this tag; name one with --label (--label \"\" names the one without a label).")
        }
        return key
    }

    /// The keys with the tag `options` names, and its label: `--label ""` names the keys that
    /// have none, so that a key without a label beside labelled ones can still be named.
    private func matchingKeys(_ options: KeyOptions, in keys: SoftwareKeyStore) throws(LockboxError) -> [ManagedKey] {
        guard options.label == "" else { return try keys.keys(applicationTag: Data(options.tag.utf8), label: options.label) }
        return try keys.keys(applicationTag: Data(options.tag.utf8)).filter { ($0.label ?? "").isEmpty }
    }

    /// A delete that names several keys is done only with `--all`: nothing a user stored is
    /// deleted unless they asked for exactly that.
    private static func checkDeletingSeveral(_ count: Int, _ options: KeyOptions) throws(LockboxError) {
        guard count > 1, !options.all else { return }
        throw LockboxError(
            .param,
            "\(count) keys have this tag\(options.label == nil ? "" : " and label"); nothing was deleted. "
                + "Name one with --label (--label \"\" names the one without a label), or pass --all to delete all \(count).")
    }

    private func purposes(_ names: [String], algorithm: KeyAlgorithm) throws(LockboxError) -> KeyPurposes {
        guard !names.isEmpty else { return algorithm.possiblePurposes }
        var purposes: KeyPurposes = []
        for name in names {
            switch name {
            case "sign": purposes.insert(.sign)
            case "verify": purposes.insert(.verify)
            case "encrypt": purposes.insert(.encrypt)
            case "decrypt": purposes.insert(.decrypt)
            case "key-agreement", "keyAgreement": purposes.insert(.keyAgreement)
            default:
                throw LockboxError(.param, "Unknown key purpose; use sign, verify, encrypt, decrypt or key-agreement.")
            }
        }
        return purposes
    }

    private func keychainOptions() -> Keychain.Options {
        var options = Keychain.Options(backend: invocation.backend, path: invocation.keychain)
        options.vault.authenticationContext = AuthenticationContext(verifier: TerminalVerifier())
        if ProcessEnvironment.value("LOCKBOX_UNLOCK_CACHE") == "process" { options.vault.unlockCache = .processMemory }
        return options
    }

    private func openVault(_ options: Keychain.Options? = nil) throws(LockboxError) -> Vault {
        let opened = try Keychain.open(options ?? keychainOptions())
        guard let vault = opened.vault else {
            throw LockboxError(.unimplemented, "Managed keys live in the vault backend; this keychain is \(opened.backend.rawValue).")
        }
        return vault
    }

    static func json(_ key: ManagedKey) -> String {
        json(
            algorithm: key.algorithm, purposes: key.purposes, token: key.token.rawValue, label: key.label,
            applicationLabel: key.applicationLabel.map { ($0 < 16 ? "0" : "") + String($0, radix: 16) }.joined(),
            publicKey: key.publicKey)
    }

    static func json(
        algorithm: KeyAlgorithm, purposes: KeyPurposes, token: String, label: String?, applicationLabel: String?, publicKey: PublicKey?
    ) -> String {
        struct Summary: Encodable {
            var algorithm, purposes, token: String
            var label: String?
            var applicationLabel: String?
            var publicKey: String?
        }
        let summary = Summary(
            algorithm: algorithm.rawValue, purposes: purposes.description, token: token, label: label,
            applicationLabel: applicationLabel, publicKey: publicKey?.pemRepresentation)
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.prettyPrinted, .sortedKeys]
        guard let data = try? encoder.encode(summary) else { return "{}" }
        return String(decoding: data, as: UTF8.self)
    }
}
