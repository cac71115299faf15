import Foundation
import Lockbox
import LockboxCore
import LockboxTestSupport
import Testing
import VaultCrypto
import VaultStorage

@testable import LockboxVault

/// From schema 4 the integrity record (generation and MACs) travels with the group rows a
/// write changes; the record is the one of the highest generation. Putting back, bumping or
/// removing rows of it must fail closed, like the single row it replaces.
@Suite("Integrity record in the group rows")
struct IntegrityRecordTests {
    typealias GroupRow = IntegrityGroupRow

    func groups(_ database: Database) throws -> [GroupRow] { try GroupRow.all(in: database) }

    func put(_ row: GroupRow, into database: Database) throws { try row.put(into: database) }

    /// A vault with items in several groups, the group rows as they are, and a read through a
    /// fresh handle (another process) after `edit`.
    func readAfter(_ edit: (Database, _ before: [GroupRow], _ after: [GroupRow]) throws -> Void) throws -> Int32? {
        let fixture = try VaultFixture()
        for index in 0..<40 {
            try fixture.vault.add(.genericPassword(service: "svc.record", account: "user\(index)", data: SecretBytes(utf8: "value\(index)")))
        }
        let database = try Database(path: fixture.path, create: false)
        let before = try groups(database)
        try fixture.vault.update(matching: .genericPassword(service: "svc.record", account: "user7"), to: ItemUpdate(data: SecretBytes(utf8: "changed")))
        let after = try groups(database)
        try edit(database, before, after)
        return status {
            let reader = try fixture.reopen()
            for index in 0..<40 { _ = try reader.data(matching: .genericPassword(service: "svc.record", account: "user\(index)")) }
        }
    }

    @Test("untouched, every read succeeds: the record is the highest generation's, one write saves one row")
    func untouched_readsBack() throws {
        var changedRows = -1
        let outcome = try readAfter { _, before, after in
            changedRows = zip(before, after).filter { $0.0.generation != $0.1.generation }.count
            let highest = after.map(\.generation).max() ?? 0
            #expect(after.filter { $0.generation == highest }.count >= 1)
        }
        #expect(outcome == nil)
        // An update within one bucket rewrites that bucket's group row alone.
        #expect(changedRows == 1)
    }

    /// A handle keeps each group's and node's digest between writes and recomputes only what a
    /// write changed (record format 5). After every write, the record on disk is checked from
    /// scratch by `verify` and read by a new handle: a digest kept after its group changed
    /// would seal a record that no fresh computation matches.
    @Test("the tree's digests kept across writes match ones computed from scratch, after each of 60 writes in random buckets")
    func keptDigests_matchFreshOnes() throws {
        var generator = SeededGenerator("keptDigests_matchFreshOnes")
        let fixture = try VaultFixture()
        var present: [Int] = []
        for step in 0..<60 {
            let account = Int.random(in: 0..<400, using: &generator)
            let query = Query.genericPassword(service: "svc.tree", account: "user\(account)")
            if present.contains(account) {
                if Bool.random(using: &generator) {
                    try fixture.vault.update(matching: query, to: ItemUpdate(data: SecretBytes(utf8: "changed\(step)")))
                } else {
                    try fixture.vault.delete(matching: query)
                    present.removeAll { $0 == account }
                }
            } else {
                try fixture.vault.add(.genericPassword(service: "svc.tree", account: "user\(account)", data: SecretBytes(utf8: "value\(step)")))
                present.append(account)
            }
            #expect(try Vault.verify(at: fixture.path, configuration: fixture.vault.configuration).isSound, "step \(step), seed \(generator.seed)")
        }
        let reader = try fixture.reopen()
        for account in present {
            #expect(try reader.data(matching: .genericPassword(service: "svc.tree", account: "user\(account)")).count > 0, "seed \(generator.seed)")
        }
    }

    @Test("the changed group's row put back as it was before the write -> refused")
    func olderGroupRowReplayed_isRefused() throws {
        let outcome = try readAfter { database, before, after in
            let changed = try #require(zip(before, after).first { $0.0.generation != $0.1.generation }?.0)
            try put(changed, into: database)
        }
        #expect(outcome == -26275)
    }

    @Test("an older row given the highest generation (its MACs are then the record's) -> refused")
    func olderRowBumped_isRefused() throws {
        let outcome = try readAfter { database, _, after in
            let highest = after.map(\.generation).max() ?? 0
            var older = try #require(after.first { $0.generation < highest })
            older.generation = highest + 1
            try put(older, into: database)
        }
        #expect(outcome == -26275)
    }

    @Test("the record's row deleted -> refused")
    func recordRowDeleted_isRefused() throws {
        let outcome = try readAfter { database, _, _ in
            try database.execute("DELETE FROM integrity_groups WHERE generation = (SELECT max(generation) FROM integrity_groups)")
        }
        #expect(outcome == -26275)
    }

    @Test("two rows of the highest generation with different MACs -> refused")
    func disagreeingRecords_areRefused() throws {
        let outcome = try readAfter { database, _, after in
            let highest = after.map(\.generation).max() ?? 0
            var other = try #require(after.first { $0.generation < highest })
            other.generation = highest
            try put(other, into: database)
        }
        #expect(outcome == -26275)
    }

    @Test("vault_state, which keeps only the format, given a generation or MACs -> refused", arguments: [
        "UPDATE vault_state SET generation = 99", "UPDATE vault_state SET mac = randomblob(32)",
        "UPDATE vault_state SET always_mac = randomblob(32)", "UPDATE vault_state SET format = 3",
    ])
    func formatRowEdited_isRefused(edit: String) throws {
        let outcome = try readAfter { database, _, _ in try database.execute(edit) }
        #expect(outcome == -26275)
    }

    @Test("the whole record rolled back to an earlier write, rows included -> refused by the remembered generation")
    func wholeRecordRolledBack_isRefused() throws {
        let fixture = try VaultFixture()
        try fixture.vault.add(.genericPassword(service: "svc.record", account: "a", data: SecretBytes(utf8: "1")))
        try fixture.vault.withDatabase { database throws(LockboxError) in database.truncateWriteAheadLog() }
        let copy = fixture.path + ".older"
        try FileManager.default.copyItem(atPath: fixture.path, toPath: copy)
        try fixture.vault.update(matching: .genericPassword(service: "svc.record", account: "a"), to: ItemUpdate(data: SecretBytes(utf8: "2")))
        fixture.vault.lockAll()
        for suffix in ["", "-wal", "-shm"] { try? FileManager.default.removeItem(atPath: fixture.path + suffix) }
        try FileManager.default.moveItem(atPath: copy, toPath: fixture.path)
        let outcome = status {
            let reader = try fixture.reopen()
            try reader.unlock(passphrase: fixture.passphrase)
            _ = try reader.data(matching: .genericPassword(service: "svc.record", account: "a"))
        }
        #expect(outcome == -26275)
    }

    @Test("a header change with no row written moves the record, and the file verifies")
    func headerChange_movesTheRecord() throws {
        let fixture = try VaultFixture()
        try fixture.vault.add(.genericPassword(service: "svc.record", account: "a", data: SecretBytes(utf8: "1")))
        let before = try fixture.vault.status().generation ?? 0
        _ = try fixture.vault.changePassphrase(from: fixture.passphrase, to: SecretBytes(utf8: "another passphrase"))
        let after = try fixture.vault.status().generation ?? 0
        #expect(after > before)
        #expect(try Vault.verify(at: fixture.path, configuration: fixture.vault.configuration).isSound)
        #expect(try fixture.reopen().data(matching: .genericPassword(service: "svc.record", account: "a")) == SecretBytes(utf8: "1"))
    }

    /// A write updates its group rows in place and inserts only a row that is not there (a
    /// record converted from format 2 has none). A row deleted from a record that had it must
    /// be refused when the record is read, never made again by the next write.
    @Test("a group row holding an older record deleted under a running handle: its next write is refused and the row is not made again")
    func groupRowDeleted_isRefusedNotRecreated() throws {
        let fixture = try VaultFixture()
        for index in 0..<20 {
            try fixture.vault.add(.genericPassword(service: "svc.record", account: "user\(index)", data: SecretBytes(utf8: "value\(index)")))
        }
        let database = try Database(path: fixture.path, create: false)
        let rows = try groups(database)
        let highest = rows.map(\.generation).max() ?? 0
        let victim = try #require(rows.last { $0.generation < highest })
        try database.execute("DELETE FROM integrity_groups WHERE id = \(victim.id)")
        #expect(status { try fixture.vault.add(.genericPassword(service: "svc.record", account: "new", data: SecretBytes(utf8: "new"))) } == -26275)
        #expect(try groups(database).count == IntegrityState.groupCount - 1)
        #expect(status { _ = try fixture.reopen().data(matching: .genericPassword(service: "svc.record", account: "user1")) } == -26275)
        #expect((try? Vault.verify(at: fixture.path, configuration: fixture.vault.configuration))?.isSound != true)
    }

    // MARK: Record format 5's tree

    /// The tree's MACs, checked the way a handle checks a record it loads (a state made from the
    /// stored bytes, nothing cached): a record sealed over `accumulators`, then given other
    /// accumulators or another format. Both MACs are checked: the index root's, and the
    /// `always` one that alone is checked before the first unlock.
    @Test("format 5: any one accumulator changed, two groups of a node or two nodes swapped, groups moved within a node, the generation or the format changed -> both MACs refuse")
    func treeRecord_coversEveryAccumulatorInItsPlace() {
        let header = VaultHeader(vaultID: Crypto.randomBytes(16), slots: [], wrappedClassKeys: SmallMap(), presencePublicKey: nil, mac: [])
        let always = Crypto.generateKey()
        let keys = IntegrityState.Keys(indexRoot: Crypto.generateKey(), alwaysClassKey: always)
        let beforeFirstUnlock = IntegrityState.Keys(indexRoot: nil, alwaysClassKey: always)
        let accumulators = Crypto.randomBytes(IntegrityState.bucketCount * IntegrityState.accumulatorSize)
        var sealed = IntegrityState(generation: 41, accumulators: accumulators)
        sealed.seal(header: header, keys: keys)
        func accepted(_ bytes: [UInt8], generation: Int = 41, format: Int = IntegrityState.currentFormat) -> [Bool] {
            var state = IntegrityState(generation: generation, accumulators: bytes)
            state.mac = sealed.mac
            state.alwaysMAC = sealed.alwaysMAC
            state.format = format
            var early = state
            return [state.verify(header: header, keys: keys), early.verify(header: header, keys: beforeFirstUnlock)]
        }
        #expect(accepted(accumulators) == [true, true])
        let groupSize = IntegrityState.groupSize
        func group(_ bytes: [UInt8], _ index: Int) -> ArraySlice<UInt8> { bytes[index * groupSize..<(index + 1) * groupSize] }
        for bucket in 0..<IntegrityState.bucketCount {
            var edited = accumulators
            edited[bucket * IntegrityState.accumulatorSize + bucket % IntegrityState.accumulatorSize] ^= 0x01
            #expect(accepted(edited) == [false, false], "bucket \(bucket)")
        }
        for node in 0..<IntegrityState.nodeCount {
            let first = node * IntegrityState.groupsPerNode
            // Two groups of one node swapped.
            var swapped = accumulators
            swapped.replaceSubrange(first * groupSize..<(first + 1) * groupSize, with: group(accumulators, first + 1))
            swapped.replaceSubrange((first + 1) * groupSize..<(first + 2) * groupSize, with: group(accumulators, first))
            #expect(accepted(swapped) == [false, false], "node \(node)")
            // A node's groups rotated (its digest input is the same four digests, in another order).
            var rotated = accumulators
            for index in 0..<IntegrityState.groupsPerNode {
                let from = first + (index + 1) % IntegrityState.groupsPerNode
                rotated.replaceSubrange((first + index) * groupSize..<(first + index + 1) * groupSize, with: group(accumulators, from))
            }
            #expect(accepted(rotated) == [false, false], "node \(node)")
            // An accumulator moved from one group of the node to another (their sum unchanged).
            var moved = accumulators
            let from = first * groupSize, to = (first + 2) * groupSize + 5 * IntegrityState.accumulatorSize
            moved.replaceSubrange(to..<to + IntegrityState.accumulatorSize, with: accumulators[from..<from + IntegrityState.accumulatorSize])
            moved.replaceSubrange(from..<from + IntegrityState.accumulatorSize, with: accumulators[to..<to + IntegrityState.accumulatorSize])
            #expect(accepted(moved) == [false, false], "node \(node)")
        }
        // Two nodes swapped whole.
        let nodeBytes = IntegrityState.groupsPerNode * groupSize
        let nodesSwapped = Array(accumulators[nodeBytes..<2 * nodeBytes] + accumulators[0..<nodeBytes] + accumulators[(2 * nodeBytes)...])
        #expect(accepted(nodesSwapped) == [false, false])
        #expect(accepted(accumulators, generation: 40) == [false, false])
        #expect(accepted(accumulators, generation: 42) == [false, false])
        // The same record read as one of the older formats (keyed group digests, another label).
        #expect(accepted(accumulators, format: 4) == [false, false])
        #expect(accepted(accumulators, format: 3) == [false, false])
        #expect(accepted(accumulators, format: 2) == [false, false])
    }

    /// Each handle keeps the digests of the record it last wrote or verified. Two handles (two
    /// processes) writing in turn each see the other's record as new and must not seal over
    /// digests of their own older one.
    @Test("two handles writing in turn, in different groups: every record verifies from scratch and every value reads back from both")
    func twoHandlesWritingInTurn_keepNoStaleDigests() throws {
        let fixture = try VaultFixture()
        let other = try fixture.reopen()
        try other.unlock(passphrase: fixture.passphrase)
        let handles = [fixture.vault, other]
        var written: [String: String] = [:]
        for step in 0..<24 {
            let handle = handles[step % 2]
            let account = "user\(step % 7)"
            let value = "value \(step)"
            if written[account] == nil {
                try handle.add(.genericPassword(service: "svc.turns", account: account, data: SecretBytes(utf8: value)))
            } else {
                try handle.update(matching: .genericPassword(service: "svc.turns", account: account), to: ItemUpdate(data: SecretBytes(utf8: value)))
            }
            written[account] = value
            #expect(try Vault.verify(at: fixture.path, configuration: fixture.vault.configuration).isSound, "step \(step)")
            for (account, value) in written {
                for reader in handles {
                    #expect(try reader.data(matching: .genericPassword(service: "svc.turns", account: account)) == SecretBytes(utf8: value), "step \(step)")
                }
            }
        }
    }
}
