import FoundationEssentials
import LockboxCore
import VaultCrypto
import VaultStorage

/// What this connection has verified of the integrity state, valid while no other connection
/// writes (`PRAGMA data_version` unchanged).
///
/// A class: every operation looks at it several times, and as a value each look copied (and
/// released) its dozen arrays and keys. Whoever changes it assigns it to ``Vault/State/integrity``
/// again, which also refreshes what the value read keeps of it.
final class IntegrityCache {
    var dataVersion: Int
    /// Nil for a vault from before schema 2 that has not been upgraded yet.
    var state: IntegrityState?
    var keys: IntegrityState.Keys?
    var verifiedBuckets: [Bool]
    /// ``Database/pagerDataVersion`` of the snapshot this cache describes: a statement whose
    /// snapshot shows the same value reads exactly the file this cache verified (the value
    /// read of one item relies on it, `Vault+ValueRead.swift`). Nil when not known.
    var pagerVersion: UInt32?

    init(dataVersion: Int, state: IntegrityState?, keys: IntegrityState.Keys?, verifiedBuckets: [Bool], pagerVersion: UInt32? = nil) {
        self.dataVersion = dataVersion
        self.state = state
        self.keys = keys
        self.verifiedBuckets = verifiedBuckets
        self.pagerVersion = pagerVersion
    }
}

extension Vault {
    // MARK: Verifying

    /// The integrity state, verified, for an operation that reads rows. Call inside the
    /// operation's transaction so the state and the rows come from one snapshot.
    ///
    /// Call it first in a transaction, before any other statement: the remembered generation is
    /// read before the snapshot starts, so the snapshot holds at least every write it counts.
    func currentIntegrity(_ state: State) throws(LockboxError) -> IntegrityCache {
        // Confirmed already in this transaction: its snapshot, and so the state, is the same.
        if let cached = state.integrity, state.database.isInTransaction,
            state.integrityConfirmedIn == state.database.transactionSerial
        {
            return cached
        }
        let cache = try confirmIntegrity(state)
        if state.database.isInTransaction { state.integrityConfirmedIn = state.database.transactionSerial }
        return cache
    }

    private func confirmIntegrity(_ state: State) throws(LockboxError) -> IntegrityCache {
        // In a write transaction the snapshot is the latest from `BEGIN IMMEDIATE` on, so
        // SQLite's change counter already says whether anything but this connection's own
        // commits (after which the cache noted it) changed the file: the same value is the
        // same file, without `PRAGMA data_version`'s statement. (It also moves at another
        // connection's checkpoint: then the statement below decides.)
        if state.database.isInWriteTransaction, let cached = state.integrity, let known = cached.pagerVersion,
            known == state.database.pagerDataVersion
        {
            return cached
        }
        // Read before anything of the file: a generation another process committed (and
        // remembered) before this point is in the snapshot read below, so the snapshot is never
        // older than what is remembered unless the file was put back. (Read after it, a commit
        // landing between the two took a sound file for an older copy.)
        let remembered = state.rememberedGeneration.read()
        let dataVersion = try state.database.dataVersion
        if let cached = state.integrity, cached.dataVersion == dataVersion {
            // No other connection wrote since the cache was filled: what this connection sees
            // now (its own writes included) is what the cache describes.
            let pagerVersion = state.database.pagerDataVersion
            if cached.pagerVersion != pagerVersion {
                cached.pagerVersion = pagerVersion
                state.integrity = cached
            }
            return cached
        }
        // Another connection wrote: the header may have changed too, and with it the keys
        // derived from it here (a passphrase change makes a new `always` class key).
        let header = try VaultHeader.load(from: state.database)
        // (The MAC covers the whole header: comparing it is comparing the header, without
        // encoding either.)
        if header.mac != state.header.mac {
            state.keys.forgetDerivedKeys()
        }
        state.header = header
        guard var stored = try IntegrityState.load(from: state.database) else {
            guard header.version == 1, remembered == 0, try !hasCurrentFormatRows(state.database) else {
                throw LockboxError.integrity("The keychain's integrity record (it is missing)")
            }
            let cache = IntegrityCache(dataVersion: dataVersion, state: nil, keys: nil, verifiedBuckets: [])
            state.integrity = cache
            return cache
        }
        // A header of the first format beside an integrity record was edited back.
        guard header.version >= 2 else { throw LockboxError.integrity("The keychain header (its version)") }
        var keys = try integrityKeys(state)
        if let current = keys {
            var sound = stored.verify(header: header, headerBinding: state.headerBinding(key: current.element), keys: current)
            if !sound, state.keys.dropIfReplaced() {
                // Keys read before another process replaced them (its passphrase change committed
                // meanwhile): checked again with the keys there are now, or locked if none.
                guard let fresh = try integrityKeys(state) else { throw lockedError() }
                keys = fresh
                sound = stored.verify(header: header, headerBinding: state.headerBinding(key: fresh.element), keys: fresh)
            }
            guard sound else {
                // Checked with keys from the kernel keyring, which this user's processes can
                // change too: the way to tell which of the two changed comes before a restore.
                guard state.keys.mode == .kernelKeyring else { throw LockboxError.integrity("The keychain's integrity record") }
                throw LockboxError(
                    .decode,
                    "The keychain's integrity record failed its integrity check: the keychain file was modified or is damaged, or "
                        + "the unlocked keys this user's kernel keyring holds for it were changed. Run `lockbox lock --all`, unlock it "
                        + "again and run `lockbox verify`; restore it from a backup only if it still fails.")
            }
            // Only a verified generation can be compared or remembered.
            guard stored.generation >= remembered else { throw rolledBack(found: stored.generation, remembered: remembered) }
            state.rememberedGeneration.advance(to: stored.generation)
        }
        let cache = IntegrityCache(
            dataVersion: dataVersion, state: stored, keys: keys,
            verifiedBuckets: [Bool](repeating: false, count: IntegrityState.bucketCount),
            pagerVersion: state.database.pagerDataVersion)
        state.integrity = cache
        return cache
    }

    /// Checks that the rows of `buckets` are exactly the current ones.
    func verifyBuckets(_ buckets: some Sequence<Int>, state: State) throws(LockboxError) {
        let cache = try currentIntegrity(state)
        guard let stored = cache.state else { return }
        guard let keys = cache.keys else {
            // Neither the index root nor this machine's `always` key: nothing can be read.
            throw lockedError()
        }
        // Inside a write, the rows read include those it changed already, which its writer has
        // counted (a sync batch adds an item, then deletes another by reference): they are
        // compared with the writer's record. It is the record before the write plus exactly
        // the write's changes, so a bucket that matches it matched before the write too, and
        // stays verified whether the write commits or rolls back.
        let expected = state.activeWriter?.integrity ?? stored
        var changed = false
        for bucket in buckets where !cache.verifiedBuckets[bucket] {
            let computed = try IntegrityState.computeAccumulator(bucket: bucket, database: state.database, key: keys.element)
            guard IntegrityState.equal(computed, Array(expected.accumulator(bucket))) else {
                throw LockboxError(
                    .decode,
                    "The keychain file does not hold the rows it last wrote (a row was replayed from an older copy, "
                        + "added or removed outside Lockbox). Nothing was read. Check it with `lockbox verify`; "
                        + "restore it from a backup.")
            }
            cache.verifiedBuckets[bucket] = true
            changed = true
        }
        if changed { state.integrity = cache }
    }

    func verifyAllBuckets(state: State) throws(LockboxError) {
        try verifyBuckets(0..<IntegrityState.bucketCount, state: state)
    }

    /// The integrity keys available now; nil when neither is (before the first unlock on this
    /// machine).
    func integrityKeys(_ state: State) throws(LockboxError) -> IntegrityState.Keys? {
        guard let always = try state.keys.classKey(for: .always, header: state.header) else { return nil }
        let indexRoot = try state.keys.currentAfterFirstUnlockKeys()?.indexRoot
        return IntegrityState.Keys(indexRoot: indexRoot, alwaysClassKey: always)
    }

    private func hasCurrentFormatRows(_ database: Database) throws(LockboxError) -> Bool {
        try database.firstRow("SELECT 1 FROM items WHERE format >= 2 LIMIT 1") { _ in true } ?? false
    }

    func rolledBack(found: Int, remembered: Int) -> LockboxError {
        LockboxError(
            .decode,
            "The keychain file is older than the one this machine last wrote (generation \(found), expected at least "
                + "\(remembered)): it was replaced by an older copy, or its write-ahead log was lost. Nothing was read. "
                + "If you restored an older copy on purpose, accept it with `lockbox verify --accept-older`.")
    }

    /// Changes the header (a new class key, an enrolled unlock method, a passphrase slot) and
    /// reseals the integrity state for it, in one transaction. Works from the master key alone,
    /// before the unlocked keys are cached.
    func commitHeaderChange(
        _ state: State, master: SecretBytes, _ edit: (inout VaultHeader) throws(LockboxError) -> Void
    ) throws(LockboxError) {
        let device = state.device
        let generation = try state.database.writeTransaction { () throws(LockboxError) -> Int? in
            var header = try VaultHeader.load(from: state.database)
            guard header.verify(master: master) else { throw LockboxError.integrity("The keychain header") }
            var stored = try IntegrityState.load(from: state.database)
            var keys: IntegrityState.Keys?
            if var loaded = stored {
                guard let always = try KeyCache.unwrapClassKey(.always, header: header, master: master, device: device) else {
                    throw LockboxError.integrity("The always class key")
                }
                let current = IntegrityState.Keys(indexRoot: try header.indexRoot(master: master), alwaysClassKey: always)
                guard loaded.verify(header: header, keys: current) else { throw LockboxError.integrity("The keychain's integrity record") }
                let remembered = state.rememberedGeneration.read()
                guard loaded.generation >= remembered else { throw rolledBack(found: loaded.generation, remembered: remembered) }
                keys = current
                stored = loaded
            }
            try edit(&header)
            header.seal(master: master)
            try header.save(to: state.database)
            state.header = header
            guard var next = stored, let keys else { return nil }
            if !next.knowsDeletions, let stateKey = keys.state {
                // A record of an older format, converted by this write: the records as they are.
                next.setDeletions(try Self.deletionSumForConversion(in: state.database, stateKey: stateKey))
            }
            // The `always` key is the same (a new machine's copy of it at most), so the row
            // elements keep their values.
            next.generation += 1
            next.seal(header: header, keys: keys)
            try next.save(to: state.database)
            return next.generation
        }
        if let generation { state.rememberedGeneration.advance(to: generation) }
        state.integrity = nil
        state.keys.forgetDerivedKeys()
    }

    // MARK: Writing

    /// Applies row changes inside a write transaction and keeps the integrity state in step:
    /// every row written gets the new generation as its version.
    final class RowWriter {
        let database: Database
        var integrity: IntegrityState
        let keys: IntegrityState.Keys
        let generation: Int
        /// `PRAGMA data_version` as read inside this write transaction: no other connection
        /// can commit before it ends, and this connection's own commits do not change it.
        let dataVersion: Int
        /// Whether a row of a managed key (class `.key`) was inserted, replaced or deleted.
        private(set) var touchedKeyRows = false
        /// When this write is made (the vault's clock): the time a deleted synchronizable row's
        /// deletion is recorded with.
        let time: Date
        /// When set, the time deletions are recorded with instead of `time`: a delete another
        /// device made, applied here.
        var deletionTime: Date?
        private var prunedDeletions = false
        /// Derived at the first deletion this write records, then kept for the others.
        private var derivedDeletionKey: SecretBytes?
        private var derivedDeletionSumKey: SecretBytes?

        private func deletionKey(_ stateKey: SecretBytes) -> SecretBytes {
            if let derivedDeletionKey { return derivedDeletionKey }
            let key = Vault.deletionKey(stateKey)
            derivedDeletionKey = key
            return key
        }

        /// A deletion record's value in the integrity record's sum.
        private func deletionElement(mac: [UInt8], stateKey: SecretBytes) -> [UInt8] {
            let sumKey = derivedDeletionSumKey ?? Vault.deletionSumKey(deletionKey(stateKey))
            derivedDeletionSumKey = sumKey
            return Vault.deletionElement(mac: mac, sumKey: sumKey)
        }

        /// This machine's device identifier: a row bound to another is one this process cannot see.
        let device: String

        fileprivate init(
            database: Database, integrity: IntegrityState, keys: IntegrityState.Keys, dataVersion: Int, time: Date, device: String
        ) {
            self.device = device
            self.database = database
            self.integrity = integrity
            self.keys = keys
            self.dataVersion = dataVersion
            self.time = time
            generation = integrity.generation + 1
        }

        func insert(_ row: SealedRow) throws(LockboxError) {
            precondition(row.version == generation, "a new row carries the writing generation")
            try Self.checkStorable(row)
            try checkUnique(row, replacing: nil)
            let statement = try database.statement(
                """
                INSERT INTO items (id, item_class, accessibility, access_group, synchronizable, primary_digest,
                                   lookup_digest, name_digest, wrapped_key, metadata, secret, device_id, access_control,
                                   format, version, bucket)
                VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
                """)
            row.bindColumns(to: statement)
            try statement.run()
            integrity.add(row, key: keys.element)
            if row.itemClass == .key { touchedKeyRows = true }
        }

        func replace(_ old: SealedRow, with row: SealedRow) throws(LockboxError) {
            try Self.checkStorable(row)
            if row.primaryDigest != old.primaryDigest { try checkUnique(row, replacing: old.rowID) }
            let statement = try database.statement(
                """
                UPDATE items SET id = ?, item_class = ?, accessibility = ?, access_group = ?, synchronizable = ?,
                                 primary_digest = ?, lookup_digest = ?, name_digest = ?, wrapped_key = ?,
                                 metadata = ?, secret = ?, device_id = ?, access_control = ?, format = ?, version = ?,
                                 bucket = ?
                WHERE rowid = ?
                """)
            row.bindColumns(to: statement)
            statement.bind(17, old.rowID)
            try statement.run()
            integrity.remove(old, key: keys.element)
            integrity.add(row, key: keys.element)
            if old.itemClass == .key || row.itemClass == .key { touchedKeyRows = true }
        }

        func delete(_ old: SealedRow) throws(LockboxError) {
            let statement = try database.statement("DELETE FROM items WHERE rowid = ?")
            statement.bind(1, old.rowID)
            try statement.run()
            integrity.remove(old, key: keys.element)
            if old.itemClass == .key { touchedKeyRows = true }
            if old.synchronizable { try recordDeletion(of: old.id) }
        }

        /// Records when a synchronizable row was deleted (``Vault/deletionTimes(of:)``), under
        /// a MAC of the state key; records older than ``Vault/deletionsKept`` go at the same time.
        private func recordDeletion(of reference: [UInt8]) throws(LockboxError) {
            guard let stateKey = keys.state else { throw LockboxError.locked("Unlock the keychain to delete a synchronizable item.") }
            let milliseconds = Vault.milliseconds(deletionTime ?? time)
            if !prunedDeletions {
                prunedDeletions = true
                try pruneDeletions(stateKey: stateKey)
            }
            // A record of the same row already there (put back from an older copy, or a row
            // deleted twice): its MAC leaves the integrity record's sum with it.
            let existing = try database.statement("SELECT reference, deleted_at, generation, mac FROM sync_deletions WHERE reference = ?")
            existing.bind(1, reference)
            if try existing.step(), Vault.isSoundDeletionRecord(existing, key: deletionKey(stateKey)), let mac = existing.blob(3) {
                integrity.countDeletion(element: deletionElement(mac: mac, stateKey: stateKey), adding: false)
            }
            existing.reset()
            let mac = Vault.deletionMAC(reference: reference, milliseconds: milliseconds, generation: generation, key: deletionKey(stateKey))
            let statement = try database.statement(
                "INSERT OR REPLACE INTO sync_deletions (reference, deleted_at, generation, mac) VALUES (?, ?, ?, ?)")
            statement.bind(1, reference)
            statement.bind(2, Int(milliseconds))
            statement.bind(3, generation)
            statement.bind(4, mac)
            try statement.run()
            integrity.countDeletion(element: deletionElement(mac: mac, stateKey: stateKey), adding: true)
        }

        /// Drops the deletion records older than ``Vault/deletionsKept`` that are sound. A
        /// damaged one stays, so that sync and `lockbox verify` report it instead of an edited
        /// date making it vanish unnoticed.
        private func pruneDeletions(stateKey: SecretBytes) throws(LockboxError) {
            let key = deletionKey(stateKey)
            let old = try database.statement("SELECT reference, deleted_at, generation, mac FROM sync_deletions WHERE deleted_at < ?")
            defer { old.reset() }
            old.bind(1, Int(Vault.milliseconds(time) - Vault.deletionsKept))
            var expired: [(reference: [UInt8], mac: [UInt8])] = []
            while try old.step() {
                if Vault.isSoundDeletionRecord(old, key: key) { expired.append((old.blob(0) ?? [], old.blob(3) ?? [])) }
            }
            old.reset()
            guard !expired.isEmpty else { return }
            let delete = try database.statement("DELETE FROM sync_deletions WHERE reference = ?")
            defer { delete.reset() }
            for record in expired {
                delete.reset()
                delete.bind(1, record.reference)
                try delete.run()
                integrity.countDeletion(element: deletionElement(mac: record.mac, stateKey: stateKey), adding: false)
            }
        }

        /// SQLite keeps text up to its first NUL, and Lockbox binds text so: a row whose text
        /// columns held one would be stored cut there, while its element in the integrity record
        /// and its associated data are made of the whole text. It could never be opened, and
        /// its bucket would read as tampered, every other item of it with it. Every writer (an
        /// add, an update, a synced replace, a restore) comes through here.
        static func checkStorable(_ row: SealedRow) throws(LockboxError) {
            try checkStorable(accessGroup: row.accessGroup)
            guard !row.deviceID.utf8.contains(0), !row.accessControl.utf8.contains(0) else {
                throw LockboxError(
                    .param,
                    "The item's device identifier or access control holds a NUL character, which the keychain cannot store: "
                        + "check this machine's device identity.")
            }
        }

        /// An access group the file can store as it is (no NUL character).
        static func checkStorable(accessGroup: String) throws(LockboxError) {
            guard !accessGroup.utf8.contains(0) else {
                throw LockboxError(
                    .param, "An access group cannot contain a NUL character (the keychain stores text up to it): use a name without one.")
            }
        }

        /// A primary key names one item (Apple's rule: `errSecDuplicateItem`). Schema 4 keeps
        /// no index of primary digests for it: every row with the same primary key has the same
        /// lookup digest, so the lookup index finds them (almost always none), inside this write
        /// transaction, which no other connection's write can enter.
        ///
        /// The primary digests are compared as bytes, not by SQL: a digest column edited to hold
        /// the same bytes as text is counted as before by the integrity record (which reads
        /// bytes) and opens as before, but SQL's `=` with a blob would not find it.
        ///
        /// A row bound to another machine's device key (a `*ThisDeviceOnly` item of the machine
        /// the file was copied from, or of a process that found another device key file) counts
        /// too, but this process cannot see, update or delete it: its error says so.
        private func checkUnique(_ row: SealedRow, replacing rowID: Int?) throws(LockboxError) {
            let statement = try database.statement("SELECT rowid, primary_digest, device_id FROM items WHERE lookup_digest = ?")
            defer { statement.reset() }
            statement.bind(1, row.lookupDigest)
            while try statement.step() {
                guard statement.integer(0) != rowID, let stored = statement.borrowedBlob(1), stored.elementsEqual(row.primaryDigest)
                else { continue }
                let owner = statement.text(2) ?? ""
                guard owner.isEmpty || owner == device else { throw Vault.boundToAnotherDevice }
                throw LockboxError(.duplicateItem, "An item with the same primary key already exists.")
            }
        }

        fileprivate func finish(state: State) throws(LockboxError) {
            integrity.generation = generation
            integrity.seal(vaultID: state.header.vaultID, headerBinding: state.headerBinding(key: keys.element), keys: keys)
            try integrity.save(to: database)
        }
    }

    /// Runs `body` in a write transaction with a ``RowWriter`` over the verified integrity
    /// state; commits the rows and the new state together.
    func writeRows<T>(_ state: State, _ body: (RowWriter) throws(LockboxError) -> T) throws(LockboxError) -> T {
        try ensureUpgraded(state)
        var committed: IntegrityState?
        var sparedKeys = false
        var dataVersion = -1
        let changesBefore = state.database.totalChanges
        let value = try state.database.writeTransaction { () throws(LockboxError) -> T in
            let writer = try rowWriter(state)
            state.activeWriter = writer
            defer { state.activeWriter = nil }
            let value = try body(writer)
            try writer.finish(state: state)
            committed = writer.integrity
            sparedKeys = !writer.touchedKeyRows
            // Read inside the transaction (by `rowWriter`): a commit by another connection
            // right after ours changes it again, so the cache below never covers a write it
            // did not see.
            dataVersion = writer.dataVersion
            return value
        }
        if let committed {
            // Counted only once committed: a write that failed part-way changes the stamp, so
            // an opened key is checked against its row before its next use.
            if sparedKeys { state.changesSparingKeys += state.database.totalChanges - changesBefore }
            state.rememberedGeneration.advance(to: committed.generation)
            if let cache = state.integrity {
                // Buckets verified before stay verified: this connection applied exact changes.
                cache.state = committed
                if cache.verifiedBuckets.isEmpty { cache.verifiedBuckets = [Bool](repeating: false, count: IntegrityState.bucketCount) }
                cache.dataVersion = dataVersion
                // After the commit and outside any snapshot: the value moves again only when
                // this connection next commits or starts reading after another one committed.
                cache.pagerVersion = state.database.pagerDataVersion
                state.integrity = cache
            }
        }
        return value
    }

    /// A writer over the state as stored now (inside the write transaction), verified.
    private func rowWriter(_ state: State) throws(LockboxError) -> RowWriter {
        // Inside the write transaction the snapshot is the latest: the cache is current unless
        // another connection wrote (data_version), or it was filled before the index root was
        // at hand.
        var cache = try currentIntegrity(state)
        if cache.keys?.state == nil {
            state.integrity = nil
            cache = try currentIntegrity(state)
        }
        guard var stored = cache.state, let keys = cache.keys, let stateKey = keys.state else { throw lockedError() }
        if !stored.knowsDeletions {
            // A record of an older format has no sum of the deletion records: this write, which
            // converts it, starts from the records as they are.
            stored.setDeletions(try Self.deletionSumForConversion(in: state.database, stateKey: stateKey))
        }
        // `currentIntegrity` read the data version in this transaction (its confirmation is
        // per transaction, and this one has just begun).
        return RowWriter(
            database: state.database, integrity: stored, keys: keys, dataVersion: cache.dataVersion, time: currentDate(),
            device: state.device.identifier)
    }

    // MARK: Upgrading rows

    /// A vault file from before schema 2 gets its integrity state, its new `always` keys and
    /// resealed rows at the first chance that has the master key. Until then writes wait for
    /// it (`errSecInteractionNotAllowed`, "unlock once").
    func ensureUpgraded(_ state: State) throws(LockboxError) {
        // Known upgraded from this connection's cache: no query on the write path.
        if state.integrity?.state != nil { return }
        if try IntegrityState.load(from: state.database) != nil { return }
        guard let master = try state.keys.currentMaster() else {
            throw LockboxError.locked(
                "This keychain file was written by an earlier Lockbox and is upgraded at its next unlock: "
                    + "unlock it with `lockbox unlock` (or `unlock(passphrase:)`), then try again.")
        }
        try upgradeRows(state, master: master, presenceSecretKey: nil)
        if try IntegrityState.load(from: state.database) == nil {
            throw LockboxError.locked(
                "This keychain file was written by an earlier Lockbox and holds access-controlled items that its "
                    + "upgrade must reseal with the passphrase: unlock it with the passphrase (`lockbox unlock`), then try again.")
        }
    }

    /// Brings the header to version 2 and every row this machine can open to the current row
    /// format, in one transaction (a crash leaves the file as it was). Rows it cannot open yet
    /// stay as they are and are counted in the integrity state: another machine's
    /// `*ThisDeviceOnly` rows, and access-controlled rows when the unlock did not bring the
    /// passphrase (they follow at the next passphrase unlock).
    /// - Returns: whether anything was written.
    @discardableResult
    func upgradeRows(_ state: State, master: SecretBytes, presenceSecretKey: SecretBytes?) throws(LockboxError) -> Bool {
        let device = state.device
        let wrote = try state.database.writeTransaction { () throws(LockboxError) -> Int? in
            var header = try VaultHeader.load(from: state.database)
            guard header.verify(master: master) else { throw LockboxError.integrity("The keychain header") }
            let existing = try IntegrityState.load(from: state.database)
            if existing == nil {
                // Only a file of the first format has no record, and only the first upgrade
                // makes one: a record missing from a later file was deleted, and rebuilding it
                // from the rows would bless whatever rows were put in.
                guard header.version == 1, state.rememberedGeneration.read() == 0, try !hasCurrentFormatRows(state.database) else {
                    throw LockboxError.integrity("The keychain's integrity record (it is missing)")
                }
            }
            let legacyTDO = VaultHeader.ClassKeyID(accessibility: .alwaysThisDeviceOnly, device: device.identifier)
            let pending = try state.database.firstRow(
                "SELECT count(*) FROM items WHERE format = 1 AND device_id IN ('', ?)" + (presenceSecretKey == nil ? " AND access_control = ''" : ""),
                bind: { $0.bind(1, device.identifier) }, read: { $0.integer(0) ?? 0 }) ?? 0
            let needsHeader = header.version == 1 || header.wrappedClassKeys[legacyTDO] != nil
            guard existing == nil || needsHeader || pending > 0 else { return nil }
            if needsHeader && presenceSecretKey == nil {
                // The `always` keys are replaced by this upgrade: access-controlled rows of those
                // classes must be resealed in the same step, which needs the passphrase.
                let waiting = try state.database.firstRow(
                    """
                    SELECT count(*) FROM items WHERE format = 1 AND access_control != ''
                    AND accessibility IN ('always', 'alwaysThisDeviceOnly') AND device_id IN ('', ?)
                    """, bind: { $0.bind(1, device.identifier) }, read: { $0.integer(0) ?? 0 }) ?? 0
                if waiting > 0 { return nil }
            }
            // The deletion records' sum is carried over as it was verified (the state key stays):
            // a rebuild blesses no record removed or put back outside Lockbox, and a wrong set
            // blocks no unlock; only a record of an older format is summed from the table.
            let carriedDeletions = existing.flatMap { $0.knowsDeletions ? $0.deletions : nil }
            if let existing {
                // What is there must check out before the rows are resealed and recounted.
                try verifyBeforeRebuilding(existing, header: header, master: master, state: state)
            }

            // Old keys for the rows, then the header's new ones.
            var oldClassKeys = SmallMap<Accessibility, SecretBytes>()
            for accessibility in Accessibility.allCases {
                if let key = try KeyCache.unwrapClassKey(
                    accessibility, header: header, master: master, device: device, allowingVersion1: true)
                {
                    oldClassKeys[accessibility] = key
                }
            }
            if header.version == 1 {
                let indexRoot = try header.indexRoot(master: master)
                header.version = 2
                header.wrappedIndexRoot = Crypto.seal(indexRoot, key: master, associatedData: header.indexRootAssociatedData())
                // The version-1 `always` key could be computed from the file: replace it.
                KeyCache.seal(
                    Crypto.generateKey(), as: VaultHeader.ClassKeyID(accessibility: .always, device: ""), in: &header,
                    master: master, device: device)
            }
            if header.wrappedClassKeys[legacyTDO] != nil {
                header.wrappedClassKeys[legacyTDO] = nil
                KeyCache.seal(
                    Crypto.generateKey(),
                    as: VaultHeader.ClassKeyID(accessibility: .alwaysThisDeviceOnly, device: KeyCache.deviceEntryPrefix + device.identifier),
                    in: &header, master: master, device: device)
            }
            _ = try KeyCache.addMissingClassKeys(to: &header, master: master, device: device)
            header.seal(master: master)
            try header.save(to: state.database)
            state.header = header

            let indexRoot = try header.indexRoot(master: master)
            guard let always = try KeyCache.unwrapClassKey(.always, header: header, master: master, device: device) else {
                throw LockboxError.integrity("The always class key")
            }
            let keys = IntegrityState.Keys(indexRoot: indexRoot, alwaysClassKey: always)
            let generation = max(existing?.generation ?? 0, state.rememberedGeneration.read()) + 1

            // Rows of the first format had no bucket column: place them (any format-2 row must
            // already be in its bucket, or the recount below refuses the file).
            let legacy = try state.database.statement("SELECT rowid, lookup_digest, bucket FROM items WHERE format = 1")
            var placements: [(Int, Int)] = []
            while try legacy.step() {
                guard let rowID = legacy.integer(0), let lookup = legacy.blob(1) else { throw LockboxError.integrity() }
                let bucket = SealedRow.bucket(ofLookupDigest: lookup)
                if legacy.integer(2) != bucket { placements.append((rowID, bucket)) }
            }
            legacy.reset()
            for (rowID, bucket) in placements {
                let update = try state.database.statement("UPDATE items SET bucket = ? WHERE rowid = ?")
                update.bind(1, bucket)
                update.bind(2, rowID)
                try update.run()
            }

            // Reseal what can be opened here.
            let select = try state.database.statement(
                "SELECT \(SealedRow.columns()) FROM items WHERE format = 1 AND device_id IN ('', ?) ORDER BY rowid")
            select.bind(1, device.identifier)
            var legacyRows: [SealedRow] = []
            while try select.step() { legacyRows.append(try SealedRow.read(from: select)) }
            select.reset()
            let presence = presenceSecretKey.flatMap { key in header.presencePublicKey.map { (publicKey: $0, secretKey: key) } }
            for row in legacyRows {
                if !row.accessControl.isEmpty && presence == nil { continue }
                guard let oldKey = oldClassKeys[row.accessibility],
                    let newKey = try KeyCache.unwrapClassKey(row.accessibility, header: header, master: master, device: device)
                else { continue }
                try reseal(row, from: oldKey, to: newKey, presence: presence, header: header, version: generation, in: state.database)
            }

            // Every row is counted, including the ones left as they were.
            var integrity = try IntegrityState.recount(database: state.database, key: keys.element)
            if let carriedDeletions {
                integrity.setDeletions(carriedDeletions)
            } else if let stateKey = keys.state {
                integrity.setDeletions(try Self.deletionSumForConversion(in: state.database, stateKey: stateKey))
            }
            integrity.generation = generation
            integrity.seal(header: header, keys: keys)
            try integrity.save(to: state.database)
            return generation
        }
        guard let wrote else { return false }
        state.rememberedGeneration.advance(to: wrote)
        state.integrity = nil
        state.keys.forgetDerivedKeys()
        return true
    }

    /// Verifies a stored integrity state and every bucket with the keys `header` and `master`
    /// give, and the generation against the remembered one.
    func verifyBeforeRebuilding(_ stored: consuming IntegrityState, header: VaultHeader, master: SecretBytes, state: State) throws(LockboxError) {
        guard let always = try KeyCache.unwrapClassKey(.always, header: header, master: master, device: state.device) else {
            throw LockboxError.integrity("The always class key")
        }
        let keys = IntegrityState.Keys(indexRoot: try header.indexRoot(master: master), alwaysClassKey: always)
        guard stored.verify(header: header, keys: keys) else { throw LockboxError.integrity("The keychain's integrity record") }
        let remembered = state.rememberedGeneration.read()
        guard stored.generation >= remembered else { throw rolledBack(found: stored.generation, remembered: remembered) }
        let counted = try IntegrityState.recount(database: state.database, key: keys.element)
        guard IntegrityState.equal(counted.accumulators, stored.accumulators) else {
            throw LockboxError.integrity("The keychain's rows")
        }
    }
}
