import Foundation
import Lockbox
import LockboxTestSupport
import Testing
import VaultStorage

@testable import LockboxVault

/// Every released file format keeps opening: the committed schema-1 vault and backup
/// (Tests/Fixtures/vault-v1, written by the first release) and the schema-2, 3, 4 and 6 vaults
/// (Tests/Fixtures/vault-v2, vault-v3, vault-v4, vault-v6) are opened, upgraded in place and
/// read back item by item.
@Suite("File format compatibility")
struct FormatCompatibilityTests {
    static let fixtureRoot = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
        .appendingPathComponent("Fixtures").path
    static let fixtures = fixtureRoot + "/vault-v1"
    static let passphrase = SecretBytes(utf8: "fixture-passphrase-v1")

    static let expected: [(Query, String)] = [
        (.genericPassword(service: "svc.example", account: "alice", accessGroup: "default"), "generic-secret-1"),
        (.genericPassword(service: "svc.example", account: "bob"), "after-first-unlock"),
        (.genericPassword(service: "svc.example", account: "carol"), "device-bound"),
        (.genericPassword(service: "svc.always", account: "dave"), "always-readable"),
        (.genericPassword(service: "svc.passcode", account: "erin"), "passcode-bound"),
        (.genericPassword(service: "svc.example", account: "alice", accessGroup: "team.shared"), "grouped"),
        (Query(.internetPassword, attributes: .internet(server: "git.example.com", account: "gail", protocol: .https, path: "/repo")), "net-pass"),
    ]

    /// A copy of the fixture vault with its device identity, in a fresh directory.
    struct Copy {
        let directory = TemporaryDirectory("lockbox-v1")
        let path: String
        let configuration: Vault.Configuration

        /// `version`: the fixture's schema version (Tests/Fixtures/vault-v<version>).
        init(version: Int = 1) throws {
            let manager = FileManager.default
            let fixtures = FormatCompatibilityTests.fixtureRoot + "/vault-v\(version)"
            let keychains = directory.file("keychains")
            let state = directory.file("state")
            for folder in [keychains, state] {
                try manager.createDirectory(atPath: folder, withIntermediateDirectories: true, attributes: [.posixPermissions: 0o700])
            }
            path = keychains + "/v\(version).lockbox"
            try manager.copyItem(atPath: fixtures + "/v\(version).lockbox", toPath: path)
            try manager.copyItem(atPath: fixtures + "/device-key", toPath: state + "/device-key")
            try manager.setAttributes([.posixPermissions: 0o600], ofItemAtPath: path)
            try manager.setAttributes([.posixPermissions: 0o600], ofItemAtPath: state + "/device-key")
            var configuration = Vault.Configuration()
            configuration.unlockCache = .processMemory
            configuration.device = DeviceIdentity(keyPath: state + "/device-key", machineIDPath: fixtures + "/machine-id")
            self.configuration = configuration
        }
    }

    /// The fixture's items; the schema-2 fixture changed bob's value and added ivan.
    func checkEveryItem(_ vault: Vault, version: Int = 1) throws {
        for (query, value) in Self.expected {
            if version >= 2 && query.attributes.account == "bob" {
                #expect(try vault.data(matching: query) == SecretBytes(utf8: "changed-at-v2"))
                continue
            }
            #expect(try vault.data(matching: query) == SecretBytes(utf8: value), "\(query.attributes.service ?? query.attributes.server ?? "")")
        }
        #expect(try vault.data(matching: .genericPassword(service: "svc.binary", account: "henry"))
            == SecretBytes(copying: Array("binary".utf8) + [0x00, 0x01, 0xff] + Array("tail".utf8)))
        var presence = Query.genericPassword(service: "svc.presence", account: "frank")
        presence.authenticationContext = AuthenticationContext(verifier: ScriptedVerifier(.passphrase("fixture-passphrase-v1")))
        #expect(try vault.data(matching: presence) == SecretBytes(utf8: "presence"))
        if version >= 2 {
            var query = Query.genericPassword(service: "svc.v2", account: "ivan")
            query.returning = [.attributes, .data]
            let ivan = try vault.items(matching: query)
            #expect(ivan.first?.data == SecretBytes(utf8: version == 2 ? "written-at-v2" : "changed-at-v3"))
            #expect(ivan.first?.attributes.label == "label v2")
        }
        if version >= 3 {
            var judy = Query.genericPassword(service: "svc.v3", account: "judy")
            judy.returning = [.attributes, .data]
            let found = try vault.items(matching: judy)
            #expect(found.first?.data == SecretBytes(utf8: version == 3 ? "written-at-v3" : "changed-at-v4"))
            #expect(found.first?.attributes.label == "label v3")
            var ken = Query.genericPassword(service: "svc.v3", account: "ken")
            ken.synchronizable = .any
            #expect(try vault.data(matching: ken) == SecretBytes(utf8: "synchronizable-at-v3"))
            // ken; from schema 6 also mona.
            let changes = try vault.synchronizableChanges(since: 0)
            let synchronizable = version >= 6 ? 2 : 1
            #expect(changes.count == synchronizable && changes.changed.count == synchronizable)
        }
        if version >= 4 {
            var liam = Query.genericPassword(service: "svc.v4", account: "liam")
            liam.returning = [.attributes, .data]
            let found = try vault.items(matching: liam)
            #expect(found.first?.data == SecretBytes(utf8: "written-at-v4"))
            #expect(found.first?.attributes.label == "label v4")
        }
    }

    /// The integrity record as stored: its format, the bytes left in `vault_state`, the groups.
    func storedRecord(_ vault: Vault) throws -> (format: Int, inline: Int, groups: Int) {
        try vault.withDatabase { database throws(LockboxError) in
            let format = try database.firstRow("SELECT format, length(accumulators) FROM vault_state") {
                ($0.integer(0) ?? 0, $0.integer(1) ?? -1)
            }
            let groups = try database.firstRow("SELECT count(*) FROM integrity_groups") { $0.integer(0) ?? 0 } ?? 0
            return (format?.0 ?? 0, format?.1 ?? -1, groups)
        }
    }

    @Test("the schema-2 vault opens, every item reads back, and its first write moves the integrity record to groups")
    func version2Vault_opensAndConverts() throws {
        let copy = try Copy(version: 2)
        let vault = try Vault.open(at: copy.path, configuration: copy.configuration)
        #expect(try vault.withDatabase { database throws(LockboxError) in try database.userVersion } == VaultSchema.current)
        #expect(status { _ = try vault.data(matching: .genericPassword(service: "svc.example", account: "alice")) } == -25308)
        // Until a write, the record stays in its format-2 place and is verified as such.
        #expect(try storedRecord(vault) == (2, 8192, 0))
        try vault.unlock(passphrase: Self.passphrase)
        try checkEveryItem(vault, version: 2)
        #expect(try Vault.verify(at: copy.path, configuration: copy.configuration).isSound)
        let before = try vault.status().generation
        #expect(before == 3)

        try vault.update(matching: .genericPassword(service: "svc.v2", account: "ivan"), to: ItemUpdate(data: SecretBytes(utf8: "at-v3")))
        #expect(try storedRecord(vault) == (IntegrityState.currentFormat, IntegrityState.accumulatorSize, 16))
        // The updated row is resealed in row format 3 (its value under the class key, bound to
        // its attributes); the others stay in format 2 and read as they are.
        let rowFormats = try vault.withDatabase { database throws(LockboxError) in
            let statement = try database.statement("SELECT format, count(*), sum(length(wrapped_key) = 0) FROM items GROUP BY format ORDER BY format")
            var counts: [[Int]] = []
            while try statement.step() { counts.append([statement.integer(0) ?? 0, statement.integer(1) ?? 0, statement.integer(2) ?? 0]) }
            return counts
        }
        #expect(rowFormats.count == 2 && rowFormats.last == [3, 1, 1] && rowFormats.first?.first == 2 && rowFormats.first?.last == 0)
        #expect(try vault.data(matching: .genericPassword(service: "svc.example", account: "bob")) == SecretBytes(utf8: "changed-at-v2"))
        var presence = Query.genericPassword(service: "svc.presence", account: "frank")
        presence.authenticationContext = AuthenticationContext(verifier: ScriptedVerifier(.passphrase("fixture-passphrase-v1")))
        #expect(try vault.data(matching: presence) == SecretBytes(utf8: "presence"))
        #expect(try vault.status().generation == 4)
        // Another handle (another process) reads the converted file, and writes go on there.
        let other = try Vault.open(at: copy.path, configuration: copy.configuration)
        try other.unlock(passphrase: Self.passphrase)
        #expect(try other.data(matching: .genericPassword(service: "svc.v2", account: "ivan")) == SecretBytes(utf8: "at-v3"))
        try other.add(.genericPassword(service: "svc.v3", account: "judy", data: SecretBytes(utf8: "new")))
        #expect(try vault.data(matching: .genericPassword(service: "svc.v3", account: "judy")) == SecretBytes(utf8: "new"))
        #expect(try Vault.verify(at: copy.path, configuration: copy.configuration).isSound)

        // The groups are authenticated: a group's accumulators swapped with another's is a
        // tampered record, never a read.
        try vault.withDatabase { database throws(LockboxError) in
            let select = try database.statement("SELECT id, accumulators FROM integrity_groups ORDER BY id")
            var groups: [[UInt8]] = []
            while try select.step() { groups.append(select.blob(1) ?? []) }
            select.reset()
            let empty = [UInt8](repeating: 0, count: 512)
            guard let used = groups.firstIndex(where: { $0 != empty }), let unused = groups.firstIndex(of: empty) else {
                Issue.record("the fixture should leave some groups empty and others not")
                return
            }
            for (id, bytes) in [(used, empty), (unused, groups[used])] {
                let update = try database.statement("UPDATE integrity_groups SET accumulators = ? WHERE id = ?")
                update.bind(1, bytes)
                update.bind(2, id)
                try update.run()
                update.reset()
            }
        }
        #expect(status {
            let third = try Vault.open(at: copy.path, configuration: copy.configuration)
            _ = try third.data(matching: .genericPassword(service: "svc.v3", account: "judy"))
        } == -26275)
    }

    @Test("the schema-3 vault opens, every item reads back, writes go on, and the record verifies throughout")
    func version3Vault_opensAndWrites() throws {
        let copy = try Copy(version: 3)
        let vault = try Vault.open(at: copy.path, configuration: copy.configuration)
        #expect(try vault.withDatabase { database throws(LockboxError) in try database.userVersion } == VaultSchema.current)
        #expect(status { _ = try vault.data(matching: .genericPassword(service: "svc.example", account: "alice")) } == -25308)
        try vault.unlock(passphrase: Self.passphrase)
        try checkEveryItem(vault, version: 3)
        #expect(try Vault.verify(at: copy.path, configuration: copy.configuration).isSound)
        #expect(try vault.status().generation == 6)

        // Until a write, the record stays in its format-3 place (generation and MACs in
        // `vault_state`); the first write moves them into the group rows.
        #expect(try storedRecord(vault) == (3, 0, 16))
        try vault.update(matching: .genericPassword(service: "svc.v3", account: "judy"), to: ItemUpdate(data: SecretBytes(utf8: "at-v4")))
        #expect(try storedRecord(vault) == (IntegrityState.currentFormat, IntegrityState.accumulatorSize, 16))
        let record = try vault.withDatabase { database throws(LockboxError) in
            try database.firstRow("SELECT length(mac) + length(always_mac), generation FROM vault_state") { [$0.integer(0), $0.integer(1)] }
        }
        #expect(record == [0, 0])
        try vault.add(.genericPassword(service: "svc.v4", account: "leo", data: SecretBytes(utf8: "new")))
        // The same name once more is a duplicate, in the old rows and the new.
        #expect(status { try vault.add(.genericPassword(service: "svc.v4", account: "leo", data: SecretBytes(utf8: "again"))) } == -25299)
        #expect(status { try vault.add(.genericPassword(service: "svc.v3", account: "judy", data: SecretBytes(utf8: "again"))) } == -25299)
        #expect(
            status { try vault.add(.genericPassword(service: "svc.example", account: "alice", data: SecretBytes(utf8: "again"), accessGroup: "default")) }
                == -25299)
        try vault.delete(matching: .genericPassword(service: "svc.v3", account: "judy"))
        try vault.add(.genericPassword(service: "svc.v3", account: "judy", data: SecretBytes(utf8: "re-added")))
        #expect(try vault.status().generation == 10)
        let other = try Vault.open(at: copy.path, configuration: copy.configuration)
        try other.unlock(passphrase: Self.passphrase)
        #expect(try other.data(matching: .genericPassword(service: "svc.v3", account: "judy")) == SecretBytes(utf8: "re-added"))
        #expect(try other.data(matching: .genericPassword(service: "svc.v4", account: "leo")) == SecretBytes(utf8: "new"))
        #expect(try other.data(matching: .genericPassword(service: "svc.v2", account: "ivan")) == SecretBytes(utf8: "changed-at-v3"))
        #expect(try Vault.verify(at: copy.path, configuration: copy.configuration).isSound)
    }

    @Test("the schema-4 vault opens, every item reads back, its first write moves the record to the tree of digests, and edits stay refused")
    func version4Vault_opensAndConverts() throws {
        let copy = try Copy(version: 4)
        let vault = try Vault.open(at: copy.path, configuration: copy.configuration)
        #expect(try vault.withDatabase { database throws(LockboxError) in try database.userVersion } == VaultSchema.current)
        #expect(status { _ = try vault.data(matching: .genericPassword(service: "svc.example", account: "alice")) } == -25308)
        try vault.unlock(passphrase: Self.passphrase)
        try checkEveryItem(vault, version: 4)
        #expect(try Vault.verify(at: copy.path, configuration: copy.configuration).isSound)
        #expect(try vault.status().generation == 8)
        // Until a write, the record stays in format 4 and is verified as such.
        #expect(try storedRecord(vault) == (4, 0, 16))
        let formatFour = try groupRows(vault)

        try vault.update(matching: .genericPassword(service: "svc.v4", account: "liam"), to: ItemUpdate(data: SecretBytes(utf8: "at-v5")))
        #expect(try storedRecord(vault) == (IntegrityState.currentFormat, IntegrityState.accumulatorSize, 16))
        // The conversion writes every group with the new record.
        #expect(try groupRows(vault).allSatisfy { $0.generation == 9 })
        try vault.add(.genericPassword(service: "svc.v5", account: "mia", data: SecretBytes(utf8: "new")))
        #expect(status { try vault.add(.genericPassword(service: "svc.v4", account: "liam", data: SecretBytes(utf8: "again"))) } == -25299)
        let other = try Vault.open(at: copy.path, configuration: copy.configuration)
        try other.unlock(passphrase: Self.passphrase)
        #expect(try other.data(matching: .genericPassword(service: "svc.v4", account: "liam")) == SecretBytes(utf8: "at-v5"))
        #expect(try other.data(matching: .genericPassword(service: "svc.v5", account: "mia")) == SecretBytes(utf8: "new"))
        try other.delete(matching: .genericPassword(service: "svc.v3", account: "judy"))
        #expect(status { _ = try vault.data(matching: .genericPassword(service: "svc.v3", account: "judy")) } == -25300)
        #expect(try Vault.verify(at: copy.path, configuration: copy.configuration).isSound)
        #expect(try vault.status().generation == 11)
        let converted = try groupRows(vault)

        // Each edit of the converted record is refused by a new handle (a new process), and
        // putting the record back as it was undoes it.
        let edits: [(String, (inout [GroupRow]) -> Void)] = [
            ("the format marked 4 again", { _ in }),
            ("two groups' accumulators swapped", { rows in
                let used = rows.firstIndex { $0.accumulators != [UInt8](repeating: 0, count: 512) }!
                let unused = rows.firstIndex { $0.accumulators == [UInt8](repeating: 0, count: 512) }!
                (rows[used].accumulators, rows[unused].accumulators) = (rows[unused].accumulators, rows[used].accumulators)
            }),
            ("one accumulator byte changed", { rows in rows[rows.count / 2].accumulators[7] ^= 1 }),
            ("the format-4 record of the fixture put back", { rows in rows = formatFour }),
        ]
        for (index, (name, edit)) in edits.enumerated() {
            var rows = converted
            edit(&rows)
            try vault.withDatabase { database throws(LockboxError) in
                try Self.write(rows, to: database)
                if index == 0 { try database.execute("UPDATE vault_state SET format = 4") }
            }
            #expect(status {
                let edited = try Vault.open(at: copy.path, configuration: copy.configuration)
                try edited.unlock(passphrase: Self.passphrase)
                _ = try edited.data(matching: .genericPassword(service: "svc.v5", account: "mia"))
            } == -26275, "\(name)")
            try putBack(converted, format: IntegrityState.currentFormat, in: vault)
        }
        let restored = try Vault.open(at: copy.path, configuration: copy.configuration)
        try restored.unlock(passphrase: Self.passphrase)
        #expect(try restored.data(matching: .genericPassword(service: "svc.v5", account: "mia")) == SecretBytes(utf8: "new"))
        #expect(try Vault.verify(at: copy.path, configuration: copy.configuration).isSound)
    }

    @Test("the schema-6 vault opens, every item reads back, its recorded deletion reads back with its time; its first write sums the record into the integrity record")
    func version6Vault_opensWithItsDeletionRecord() throws {
        let copy = try Copy(version: 6)
        let vault = try Vault.open(at: copy.path, configuration: copy.configuration)
        #expect(try vault.withDatabase { database throws(LockboxError) in try database.userVersion } == VaultSchema.current)
        try vault.unlock(passphrase: Self.passphrase)
        try checkEveryItem(vault, version: 6)
        var mona = Query.genericPassword(service: "svc.v6", account: "mona")
        mona.synchronizable = .synchronizable
        mona.returning = [.attributes, .data]
        let found = try vault.items(matching: mona)
        #expect(found.first?.data == SecretBytes(utf8: "written-at-v6"))
        #expect(found.first?.attributes.label == "label v6")
        var nick = Query.genericPassword(service: "svc.v6", account: "nick")
        nick.synchronizable = .any
        #expect(try !vault.contains(nick))
        let reference = Data([0, 0, 0, 0, 0, 0, 0, 0x0a, 0x4b, 0x9d, 0x9e, 0xc9, 0xf4, 0x4e, 0xd3, 0x40])
        #expect(try vault.deletionTimes(of: [reference]) == [reference: Date(timeIntervalSince1970: 1_796_409_357.767)])
        let report = try Vault.verify(at: copy.path, configuration: copy.configuration)
        #expect(report.isSound)
        #expect(report.generation == 11)
        // Writes go on; an edited record of the fixture is refused.
        mona.returning = []
        #expect(try storedRecord(vault) == (5, 0, 16))
        try vault.update(matching: mona, to: ItemUpdate(data: SecretBytes(utf8: "at-v7")))
        #expect(try vault.data(matching: mona) == SecretBytes(utf8: "at-v7"))
        // That write converted the record to format 6, summing the fixture's deletion record:
        // removing it is now found, and putting it back undoes that.
        #expect(try storedRecord(vault) == (IntegrityState.currentFormat, IntegrityState.accumulatorSize, 16))
        try vault.withDatabase { database throws(LockboxError) in
            try database.execute("CREATE TEMP TABLE saved AS SELECT * FROM sync_deletions; DELETE FROM sync_deletions")
        }
        #expect(status { _ = try vault.deletionTimes(of: [reference]) } == -26275)
        try vault.withDatabase { database throws(LockboxError) in try database.execute("INSERT INTO sync_deletions SELECT * FROM saved") }
        #expect(try vault.deletionTimes(of: [reference]).count == 1)
        try vault.withDatabase { database throws(LockboxError) in try database.execute("UPDATE sync_deletions SET deleted_at = deleted_at + 1") }
        #expect(status { _ = try vault.deletionTimes(of: [reference]) } == -26275)
    }

    @Test("the schema-6 vault copied to another machine: its first unlock there changes the header and converts the record, summing the deletion record")
    func version6Vault_onAnotherMachine_convertsWithItsDeletionRecord() throws {
        let copy = try Copy(version: 6)
        var configuration = copy.configuration
        configuration.device = DeviceIdentity(
            keyPath: copy.directory.file("state/other-device-key"), machineIDPath: copy.directory.file("state/other-machine-id"))
        try "0123456789abcdef0123456789abcdef\n".write(toFile: copy.directory.file("state/other-machine-id"), atomically: true, encoding: .utf8)
        let vault = try Vault.open(at: copy.path, configuration: configuration)
        #expect(try storedRecord(vault) == (5, 0, 16))
        try vault.unlock(passphrase: Self.passphrase)
        // The unlock added this machine's class keys: a header change, which sealed the record anew.
        #expect(try storedRecord(vault) == (IntegrityState.currentFormat, IntegrityState.accumulatorSize, 16))
        let reference = Data([0, 0, 0, 0, 0, 0, 0, 0x0a, 0x4b, 0x9d, 0x9e, 0xc9, 0xf4, 0x4e, 0xd3, 0x40])
        #expect(try vault.deletionTimes(of: [reference]) == [reference: Date(timeIntervalSince1970: 1_796_409_357.767)])
        var mona = Query.genericPassword(service: "svc.v6", account: "mona")
        mona.synchronizable = .synchronizable
        #expect(try vault.data(matching: mona) == SecretBytes(utf8: "written-at-v6"))
        try vault.withDatabase { database throws(LockboxError) in try database.execute("DELETE FROM sync_deletions") }
        #expect(status { _ = try vault.deletionTimes(of: [reference]) } == -26275)
    }

    /// Formats 4 and 5 are stored alike and told apart by `vault_state.format` alone, which
    /// the MACs do not cover: each format's MACs must fail when read as the other's.
    @Test("the schema-4 vault's record marked format 5 before its conversion, and its format-4 record and format put back after it -> refused")
    func version4Vault_formatRelabelled_isRefused() throws {
        let copy = try Copy(version: 4)
        let vault = try Vault.open(at: copy.path, configuration: copy.configuration)
        try vault.unlock(passphrase: Self.passphrase)
        let formatFour = try groupRows(vault)
        func readByNewHandle() -> Int32? {
            status {
                let edited = try Vault.open(at: copy.path, configuration: copy.configuration)
                try edited.unlock(passphrase: Self.passphrase)
                _ = try edited.data(matching: .genericPassword(service: "svc.v4", account: "liam"))
            }
        }
        try vault.withDatabase { database throws(LockboxError) in try database.execute("UPDATE vault_state SET format = 5") }
        #expect(readByNewHandle() == -26275)
        try vault.withDatabase { database throws(LockboxError) in try database.execute("UPDATE vault_state SET format = 4") }
        #expect(readByNewHandle() == nil)

        try vault.update(matching: .genericPassword(service: "svc.v4", account: "liam"), to: ItemUpdate(data: SecretBytes(utf8: "at-v5")))
        let converted = try groupRows(vault)
        try putBack(formatFour, format: 4, in: vault)
        #expect(readByNewHandle() == -26275)
        try putBack(converted, format: IntegrityState.currentFormat, in: vault)
        #expect(readByNewHandle() == nil)
        #expect(try Vault.verify(at: copy.path, configuration: copy.configuration).isSound)
    }

    /// The conversion to format 5 rewrites `vault_state` and every group row in one
    /// transaction: a statement refused part-way (here a trigger stands for a full disk or an
    /// I/O error on the tenth row) must leave the format-4 record whole and readable, and the
    /// handle must convert it at its next write as if nothing had happened.
    @Test("a conversion of the schema-4 record that fails part-way leaves the format-4 record whole, and the next write converts it")
    func version4Vault_conversionFailingPartWay_leavesRecordWhole() throws {
        let copy = try Copy(version: 4)
        let vault = try Vault.open(at: copy.path, configuration: copy.configuration)
        try vault.unlock(passphrase: Self.passphrase)
        let before = try groupRows(vault)
        let liam = Query.genericPassword(service: "svc.v4", account: "liam")
        let value = try vault.data(matching: liam)
        try vault.withDatabase { database throws(LockboxError) in
            try database.execute(
                "CREATE TRIGGER refuse_group_9 BEFORE UPDATE ON integrity_groups WHEN old.id = 9 BEGIN SELECT RAISE(ABORT, 'refused'); END")
        }
        #expect(status { try vault.update(matching: liam, to: ItemUpdate(data: SecretBytes(utf8: "at-v5"))) } != nil)
        #expect(try storedRecord(vault) == (4, 0, 16))
        #expect(try groupRows(vault) == before)
        #expect(try vault.data(matching: liam) == value)
        let other = try Vault.open(at: copy.path, configuration: copy.configuration)
        try other.unlock(passphrase: Self.passphrase)
        #expect(try other.data(matching: liam) == value)

        try vault.withDatabase { database throws(LockboxError) in try database.execute("DROP TRIGGER refuse_group_9") }
        try vault.update(matching: liam, to: ItemUpdate(data: SecretBytes(utf8: "at-v5")))
        #expect(try storedRecord(vault) == (IntegrityState.currentFormat, IntegrityState.accumulatorSize, 16))
        #expect(try groupRows(vault).allSatisfy { $0.generation == 9 })
        #expect(try other.data(matching: liam) == SecretBytes(utf8: "at-v5"))
        #expect(try Vault.verify(at: copy.path, configuration: copy.configuration).isSound)
    }

    typealias GroupRow = IntegrityGroupRow

    func groupRows(_ vault: Vault) throws -> [GroupRow] {
        try vault.withDatabase { database throws(LockboxError) in try GroupRow.all(in: database) }
    }

    static func write(_ rows: [GroupRow], to database: Database) throws(LockboxError) {
        for row in rows { try row.put(into: database) }
    }

    /// Puts integrity group rows back and marks the record's format, as an edit of the file would.
    func putBack(_ rows: [GroupRow], format: Int, in vault: Vault) throws {
        try vault.withDatabase { database throws(LockboxError) in
            try Self.write(rows, to: database)
            try database.execute("UPDATE vault_state SET format = \(format)")
        }
    }

    @Test("the schema-1 vault opens, is upgraded at its first unlock, and every item reads back exactly")
    func version1Vault_opensAndUpgrades() throws {
        let copy = try Copy()
        let vault = try Vault.open(at: copy.path, configuration: copy.configuration)
        #expect(try vault.withDatabase { database throws(LockboxError) in try database.userVersion } == VaultSchema.current)
        // Locked, it says so; it never says "not found".
        #expect(status { _ = try vault.data(matching: .genericPassword(service: "svc.example", account: "alice")) } == -25308)
        try vault.unlock(passphrase: Self.passphrase)
        try checkEveryItem(vault)
        let formats = try vault.withDatabase { database throws(LockboxError) in
            let statement = try database.statement("SELECT DISTINCT format FROM items")
            var formats: [Int] = []
            while try statement.step() { formats.append(statement.integer(0) ?? 0) }
            return formats
        }
        // The upgrade reseals every row in the current row format.
        #expect(formats == [3])
        #expect(try vault.status().generation != nil)
        // Another handle (another process) reads it too, and writes go on.
        let other = try Vault.open(at: copy.path, configuration: copy.configuration)
        try other.unlock(passphrase: Self.passphrase)
        try checkEveryItem(other)
        try other.update(matching: .genericPassword(service: "svc.example", account: "bob"), to: ItemUpdate(data: SecretBytes(utf8: "changed")))
        #expect(try vault.data(matching: .genericPassword(service: "svc.example", account: "bob")) == SecretBytes(utf8: "changed"))
        #expect(try Vault.verify(at: copy.path, configuration: copy.configuration).isSound)
    }

    @Test("the schema-1 backup restores into a new vault")
    func version1Backup_restores() throws {
        let fixture = try VaultFixture()
        let summary = try fixture.vault.restore(
            from: Self.fixtures + "/v1.lockbox-backup", passphrase: SecretBytes(utf8: "fixture-backup-passphrase"))
        #expect(summary.added == 6)
        #expect(try fixture.vault.data(matching: .genericPassword(service: "svc.example", account: "alice", accessGroup: "team.shared"))
            == SecretBytes(utf8: "grouped"))
        #expect(try fixture.vault.data(matching: .genericPassword(service: "svc.always", account: "dave")) == SecretBytes(utf8: "always-readable"))
    }

    @Test("a failure at any step of the upgrade leaves a vault that opens and upgrades later")
    func interruptedUpgrade_leavesAnOpenableVault() throws {
        // How many storage operations a full upgrade takes.
        let probe = try Copy()
        let counting = StorageFaults(kind: .ioError, failingOperation: Int.max, persistent: false)
        let vault = try Vault.open(at: probe.path, configuration: probe.configuration)
        vault.injectFaults(counting)
        try vault.unlock(passphrase: Self.passphrase)
        let total = counting.operations
        #expect(total > 20)
        // Fail each step in turn (every fourth, to keep the run short), then recover.
        for failing in stride(from: 1, through: total, by: 4) {
            let copy = try Copy()
            let interrupted = try Vault.open(at: copy.path, configuration: copy.configuration)
            interrupted.injectFaults(StorageFaults(kind: .ioError, failingOperation: failing, persistent: true))
            _ = try? interrupted.unlock(passphrase: Self.passphrase)
            let recovered = try Vault.open(at: copy.path, configuration: copy.configuration)
            try recovered.unlock(passphrase: Self.passphrase)
            try checkEveryItem(recovered)
        }
    }
}
