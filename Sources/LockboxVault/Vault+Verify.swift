import LockboxCore
import VaultCrypto
import VaultStorage

#if canImport(Glibc)
import Glibc
#endif

extension Vault {
    /// What ``verify(at:configuration:acceptOlder:)`` found.
    public struct VerificationReport: Sendable, Codable, Equatable {
        /// The file's write generation (nil for a file from before schema 2 not yet upgraded).
        public var generation: Int?
        /// The highest generation this machine remembers for the file.
        public var rememberedGeneration: Int
        public var items: Int
        /// Items whose attributes were opened and checked (the others are locked now or belong
        /// to another machine).
        public var checkedItems: Int
        /// Items bound to another machine, which only it can check.
        public var otherMachinesItems: Int
        /// What failed; empty when the file is sound.
        public var problems: [String]
        /// The file was older than remembered and was accepted on purpose.
        public var acceptedOlderGeneration: Bool
        /// Recorded deletions of synchronizable items (kept for sync), and how many of them
        /// fail their check; nil before the first unlock, when they cannot be checked.
        public var deletionRecords: Int?
        public var damagedDeletionRecords: Int?
        /// An older file accepted on purpose whose items the keys unlocked before could not open
        /// (they belong to the later file: its passphrase changed after this copy was made): the
        /// keychain was locked, to be unlocked with the passphrase of the copy. How many items.
        public var lockedForTheCopysPassphrase: Int?

        public var isSound: Bool { problems.isEmpty }
    }

    /// Checks the whole file: the integrity record and its MAC, every row against it, every
    /// readable row's attributes, and the generation against the one this machine remembers.
    /// With `acceptOlder`, a file that is sound but older than remembered (an older copy
    /// restored on purpose) is accepted: the remembered generation is set back to the file's.
    /// Needs at least the first unlock since boot (the integrity keys).
    public static func verify(
        at path: String, configuration: Configuration = Configuration(), acceptOlder: Bool = false
    ) throws(LockboxError) -> VerificationReport {
        let vault = try open(at: path, configuration: configuration, checked: false)
        // Set on the report once it is returned (a field set inside and returned through the
        // state's lock and the transaction came back with other bytes in this toolchain).
        var lockedUnopened: Int?
        var report = try vault.withState { state throws(LockboxError) -> VerificationReport in
            let remembered = state.rememberedGeneration.read()
            return try state.database.readTransaction { () throws(LockboxError) -> VerificationReport in
                state.integrity = nil
                let header = try VaultHeader.load(from: state.database)
                state.header = header
                var report = VerificationReport(
                    generation: nil, rememberedGeneration: remembered, items: 0, checkedItems: 0, otherMachinesItems: 0,
                    problems: [], acceptedOlderGeneration: false, lockedForTheCopysPassphrase: nil)
                report.items = try state.database.firstRow("SELECT count(*) FROM items") { $0.integer(0) ?? 0 } ?? 0
                guard let keys = try vault.integrityKeys(state) else {
                    throw LockboxError.locked("Unlock it once (`lockbox unlock`) so that it can be verified.")
                }
                let stored = try IntegrityState.load(from: state.database)
                if var stored {
                    report.generation = stored.generation
                    if !stored.verifyEvery(header: header, keys: keys) {
                        report.problems.append("The integrity record or the header was modified.")
                    }
                    do throws(LockboxError) {
                        let counted = try IntegrityState.recount(database: state.database, key: keys.element)
                        var bad = 0
                        for bucket in 0..<IntegrityState.bucketCount where counted.accumulator(bucket) != stored.accumulator(bucket) {
                            bad += 1
                        }
                        if bad > 0 {
                            report.problems.append(
                                "\(bad) of \(IntegrityState.bucketCount) groups of rows differ from what Lockbox wrote (rows replayed, added, removed or edited).")
                        }
                    } catch {
                        report.problems.append("Rows were moved out of their group or appear twice.")
                    }
                } else if header.version >= 2 || remembered > 0 {
                    report.problems.append("The integrity record is missing.")
                }
                // Every row this machine can open now.
                let statement = try state.database.statement("SELECT \(SealedRow.columns()) FROM items ORDER BY rowid")
                var failed = 0
                // Of those, rows that did not open at all (their bytes are covered by the
                // integrity record, checked above: a key that is not theirs).
                var unopened = 0
                while try statement.step() {
                    let row = try SealedRow.read(from: statement)
                    if !row.deviceID.isEmpty && row.deviceID != state.device.identifier {
                        report.otherMachinesItems += 1
                        continue
                    }
                    // A class locked now (its key not at hand, or kept for another device key) is
                    // not checked, as for any locked item.
                    let available: SecretBytes?
                    do throws(LockboxError) {
                        available = try state.keys.classKey(for: row.accessibility, header: header)
                    } catch where error.code == .interactionNotAllowed {
                        continue
                    } catch where error.code == .decode && report.problems.isEmpty {
                        // The header and the integrity record checked out, yet the unlocked master
                        // key does not open the class key: keys of another version of the file
                        // (the passphrase changed after an older copy was made), not a damaged row.
                        failed += 1
                        unopened += 1
                        continue
                    }
                    guard let classKey = available else { continue }
                    do throws(LockboxError) {
                        let prefix = row.associatedDataPrefix(vaultID: header.vaultID)
                        let attributes = try row.openAttributes(classKey: classKey, prefix: prefix)
                        // The value too, where no user verification is needed to reach it.
                        if row.accessControl.isEmpty {
                            _ = try row.openData(valueKey: try row.openValueKey(classKey: classKey, prefix: prefix), prefix: prefix)
                        }
                        if report.generation != nil, !row.isInItsBucket { failed += 1 }
                        if let indexKey = try state.keys.indexKey(for: row.itemClass),
                            Crypto.keyedDigest(PrimaryKey.encode(row.itemClass, attributes, includingGroup: false), key: indexKey)
                                != row.lookupDigest
                        {
                            failed += 1
                        }
                        report.checkedItems += 1
                    } catch {
                        failed += 1
                        unopened += 1
                    }
                }
                statement.reset()
                if let stateKey = keys.state {
                    let deletions = try Vault.assessDeletionRecords(in: state.database, key: Vault.deletionKey(stateKey), stored: stored)
                    if deletions.tableMissing {
                        if stored?.coversDeletions == true {
                            report.problems.append(
                                "The table of deleted synchronizable items is missing (removed outside Lockbox), and sync refuses to "
                                    + "run. `lockbox sync forget-damaged-deletions` makes it again, empty.")
                        }
                    } else {
                        report.deletionRecords = deletions.records
                        report.damagedDeletionRecords = deletions.damaged
                    }
                    if deletions.damaged > 0 {
                        report.problems.append(
                            "\(deletions.damaged) of \(deletions.records) recorded deletion(s) of synchronizable items were modified "
                                + "outside Lockbox, and sync refuses them. `lockbox sync forget-damaged-deletions` drops them; the "
                                + "deletes they recorded, if not yet synced, then lose to any later edit made on another device.")
                    } else if !deletions.sumMatches {
                        report.problems.append(
                            "The recorded deletions of synchronizable items are not the ones Lockbox wrote (a record removed or put "
                                + "back outside Lockbox), and sync refuses them. `lockbox sync forget-damaged-deletions` accepts them as "
                                + "they are; a delete whose record is gone, if not yet synced, then loses to any later edit made on "
                                + "another device.")
                    }
                }
                let older = (report.generation ?? remembered) < remembered
                // An older copy from before a passphrase change, while the keys of the later file
                // are unlocked: its rows are sound (the integrity record covers them) but do not
                // open with those keys. Accepted on purpose, it is locked, to be unlocked with the
                // passphrase it was made with (else every read would report it damaged).
                if older && acceptOlder && report.problems.isEmpty && failed > 0 && failed == unopened, let generation = report.generation {
                    state.rememberedGeneration.write(generation)
                    report.acceptedOlderGeneration = true
                    lockedUnopened = unopened
                    return report
                }
                if failed > 0 {
                    report.problems.append("\(failed) item(s) fail to open, do not match their lookup digest or sit outside their group.")
                }
                if older && report.problems.isEmpty && acceptOlder, let generation = report.generation {
                    state.rememberedGeneration.write(generation)
                    report.acceptedOlderGeneration = true
                } else if older {
                    report.problems.append(
                        "The file is older than the one this machine last wrote (generation \(report.generation ?? 0) < \(remembered)).")
                }
                return report
            }
        }
        report.lockedForTheCopysPassphrase = lockedUnopened
        if lockedUnopened != nil { vault.lockAll() }
        if report.acceptedOlderGeneration { Self.markOlderCopyAccepted(vaultPath: path) }
        return report
    }

    /// The file beside a keychain in a sync group (`VAULT.sync/older-copy-accepted`) that says
    /// an older copy of it was accepted: its rows are older than what its sync state recorded,
    /// and sync refuses them (they would bring back what was deleted or changed since) until
    /// `lockbox sync reset` rebuilds the state and removes the file. Written only for a keychain
    /// with a sync directory.
    package static func olderCopyMarkerPath(vaultPath: String) -> String { vaultPath + ".sync/older-copy-accepted" }

    private static func markOlderCopyAccepted(vaultPath: String) {
        var info = stat()
        guard lstat(vaultPath + ".sync", &info) == 0, info.st_mode & S_IFMT == S_IFDIR else { return }
        let marker = olderCopyMarkerPath(vaultPath: vaultPath)
        let descriptor = Glibc.open(marker, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0o600)
        guard descriptor >= 0 else { return }
        let text = Array("An older copy of this keychain was accepted (lockbox verify --accept-older): run `lockbox sync reset`.\n".utf8)
        _ = text.withUnsafeBytes { write(descriptor, $0.baseAddress, $0.count) }
        fsync(descriptor)
        close(descriptor)
    }
}
