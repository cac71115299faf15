import FoundationEssentials
import LockboxCore
import VaultCrypto
import VaultStorage

extension Vault {
    /// The rows selected by `condition` (SQL over the plain columns), without their sealed
    /// attributes and value.
    func rows(_ state: State, where condition: String) throws(LockboxError) -> [SealedRow] {
        let statement = try state.database.statement(
            "SELECT \(SealedRow.columns(metadata: false, secret: false)) FROM items WHERE \(condition) ORDER BY rowid")
        defer { statement.reset() }
        var rows: [SealedRow] = []
        while try statement.step() { rows.append(try SealedRow.read(from: statement)) }
        return rows
    }

    /// Reseals `row` from `oldKey` to `newKey` in the current row format at `version`, with a
    /// fresh item key where that format has one (an upgrade, a key rotation). Access-controlled
    /// rows need `presence`.
    func reseal(
        _ row: SealedRow, from oldKey: SecretBytes, to newKey: SecretBytes,
        presence: (publicKey: [UInt8], secretKey: SecretBytes)?, header: VaultHeader, version: Int, in database: Database
    ) throws(LockboxError) {
        let prefix = row.associatedDataPrefix(vaultID: header.vaultID)
        let valueKey = try row.openValueKey(classKey: oldKey, prefix: prefix, presence: presence)
        let attributes = try row.openAttributes(classKey: oldKey, prefix: prefix)
        let data = try row.openData(valueKey: valueKey, prefix: prefix)
        var next = row
        next.format = SealedRow.currentFormat
        next.version = version
        next.sealContents(
            classKey: newKey, attributes: attributes, data: data, vaultID: header.vaultID,
            presencePublicKey: row.accessControl.isEmpty ? nil : header.presencePublicKey)
        let update = try database.statement(
            "UPDATE items SET wrapped_key = ?, metadata = ?, secret = ?, format = ?, version = ?, bucket = ? WHERE rowid = ?")
        update.bind(1, next.wrappedKey)
        update.bind(2, next.metadata)
        update.bind(3, next.secret)
        update.bind(4, next.format)
        update.bind(5, next.version)
        update.bind(6, next.bucket)
        update.bind(7, row.rowID)
        try update.run()
    }

    /// Replaces the master key and every class key this machine holds, reseals every row this
    /// machine can open under the new keys, and rebuilds the integrity state, in one
    /// transaction. The integrity of the file is verified in full first, so a replayed row is
    /// never blessed by the rebuild. `editHeader` replaces the slot that wraps the new master.
    func rotateKeys(
        _ state: State, oldMaster: SecretBytes, newMaster: SecretBytes, presence: SecretBytes, expected: VaultHeader,
        editHeader: (inout VaultHeader) throws(LockboxError) -> Void
    ) throws(LockboxError) -> PassphraseChange {
        let device = state.device
        // The device-bound class keys could not be carried over: their items would be lost.
        if let unavailable = device.unavailability { throw unavailable }
        let change = try state.database.writeTransaction { () throws(LockboxError) -> (PassphraseChange, Int, VaultHeader) in
            state.integrity = nil
            var header = try VaultHeader.load(from: state.database)
            guard header.verify(master: oldMaster) else { throw LockboxError.integrity("The keychain header") }
            guard header.authenticatedBytes() == expected.authenticatedBytes() else {
                throw LockboxError(.io, "The keychain's passphrase changed while it was being changed. Try again.")
            }
            state.header = header
            // Everything as it stands must check out before it is resealed.
            guard let stored = try IntegrityState.load(from: state.database),
                let oldAlways = try KeyCache.unwrapClassKey(.always, header: header, master: oldMaster, device: device)
            else { throw LockboxError.integrity("The keychain's integrity record") }
            let indexRoot = try header.indexRoot(master: oldMaster)
            _ = oldAlways
            // Carried over as verified (the state key stays): the rebuild blesses no record
            // removed or put back outside Lockbox, and a wrong set blocks no passphrase change.
            let carriedDeletions = stored.knowsDeletions ? stored.deletions : nil
            try verifyBeforeRebuilding(stored, header: header, master: oldMaster, state: state)
            let remembered = state.rememberedGeneration.read()
            let previousMasters = try header.openPreviousMasters(master: oldMaster)
            var oldClassKeys = SmallMap<Accessibility, SecretBytes>()
            for accessibility in Accessibility.allCases {
                if let key = try KeyCache.unwrapClassKey(
                    accessibility, header: header, master: oldMaster, device: device, previousMasters: previousMasters)
                {
                    oldClassKeys[accessibility] = key
                }
            }

            // The new header: this machine's and the portable class keys are replaced; other
            // machines' *ThisDeviceOnly keys stay, with the old master kept for them.
            var removedMethods: [String] = []
            for slot in header.slots where slot.kind == .external {
                removedMethods.append(slot.externalKind)
            }
            header.slots.removeAll { $0.kind == .external }
            let mine: Set<String> = ["", device.identifier, KeyCache.deviceEntryPrefix + device.identifier]
            var othersRemain = false
            for id in header.wrappedClassKeys.keys {
                if mine.contains(id.device) {
                    header.wrappedClassKeys[id] = nil
                } else if id.device.hasPrefix(KeyCache.deviceEntryPrefix) && id.accessibility == .always {
                    // Another machine's copy of the old `always` key: it makes a new one from
                    // the master-wrapped key at its next unlock.
                    header.wrappedClassKeys[id] = nil
                } else if !id.device.hasPrefix(KeyCache.deviceEntryPrefix) {
                    othersRemain = true
                }
            }
            header.previousMasters = []
            if othersRemain {
                for key in [oldMaster] + previousMasters {
                    header.previousMasters.append(Crypto.seal(key, key: newMaster, associatedData: header.previousMasterAssociatedData()))
                }
            }
            header.wrappedIndexRoot = Crypto.seal(indexRoot, key: newMaster, associatedData: header.indexRootAssociatedData())
            try editHeader(&header)
            _ = try KeyCache.addMissingClassKeys(to: &header, master: newMaster, device: device)
            header.seal(master: newMaster)
            // Saved in the transaction; the handle takes it once it commits (a rotation that fails
            // leaves the handle with the header the file still has).
            try header.save(to: state.database)
            guard let newAlways = try KeyCache.unwrapClassKey(.always, header: header, master: newMaster, device: device) else {
                throw LockboxError.integrity("The always class key")
            }
            let newKeys = IntegrityState.Keys(indexRoot: indexRoot, alwaysClassKey: newAlways)
            let generation = max(stored.generation, remembered) + 1

            // Reseal every row this machine can open.
            let select = try state.database.statement(
                "SELECT \(SealedRow.columns()) FROM items WHERE device_id IN ('', ?) ORDER BY rowid")
            select.bind(1, device.identifier)
            var mineRows: [SealedRow] = []
            while try select.step() { mineRows.append(try SealedRow.read(from: select)) }
            select.reset()
            let presencePair = header.presencePublicKey.map { (publicKey: $0, secretKey: presence) }
            var resealed = 0
            for row in mineRows {
                guard let oldKey = oldClassKeys[row.accessibility],
                    let newKey = try KeyCache.unwrapClassKey(row.accessibility, header: header, master: newMaster, device: device)
                else { continue }
                try reseal(row, from: oldKey, to: newKey, presence: presencePair, header: header, version: generation, in: state.database)
                resealed += 1
            }
            var integrity = try IntegrityState.recount(database: state.database, key: newKeys.element)
            // The deletion records keep their MACs (the index root, and so the state key, stays).
            if let carriedDeletions {
                integrity.setDeletions(carriedDeletions)
            } else if let stateKey = newKeys.state {
                integrity.setDeletions(try Self.deletionSumForConversion(in: state.database, stateKey: stateKey))
            }
            integrity.generation = generation
            integrity.seal(header: header, keys: newKeys)
            try integrity.save(to: state.database)
            return (PassphraseChange(resealedItems: resealed, removedUnlockMethods: removedMethods), generation, header)
        }
        state.header = change.2
        state.rememberedGeneration.advance(to: change.1)
        state.integrity = nil
        state.keys.forgetDerivedKeys()
        state.database.truncateWriteAheadLog()
        return change.0
    }
}
