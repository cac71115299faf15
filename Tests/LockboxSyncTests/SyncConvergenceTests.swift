import Foundation
import Lockbox
import LockboxCore
import LockboxTestSupport
import LockboxVault
import Testing

@testable import LockboxSync

private func syncAll(_ groups: [SyncGroup], rounds: Int = 2) throws {
    for _ in 0..<rounds { for group in groups { try group.sync() } }
}

/// An https internet password of account "alice" at `server`, with an optional port.
private func web(_ server: String, port: Int?, _ value: String) -> Item {
    var attributes = ItemAttributes.internet(server: server, account: "alice", protocol: .https, port: port)
    attributes.synchronizable = true
    return Item(.internetPassword, attributes: attributes, data: SecretBytes(utf8: value))
}

/// `machine`'s synchronizable internet passwords by port: row and value.
private func webs(_ machine: Machine) throws -> [Int?: (reference: Data, value: String)] {
    let query = Query(.internetPassword, limit: .all, returning: [.attributes, .data, .persistentReference], synchronizable: .synchronizable)
    guard try machine.vault.contains(query) else { return [:] }
    var found: [Int?: (reference: Data, value: String)] = [:]
    for item in try machine.vault.items(matching: query) {
        found[item.attributes.port] = (item.persistentReference!, item.data!.withUnsafeBytes { String(decoding: $0, as: UTF8.self) })
    }
    return found
}

private func setWeb(_ machine: Machine, port: Int?, _ value: String) throws {
    var query = Query(.internetPassword, synchronizable: .synchronizable)
    query.persistentReference = try #require(try webs(machine)[port]).reference
    try machine.vault.update(matching: query, to: ItemUpdate(data: SecretBytes(utf8: value)))
}

private struct AheadClock: LockboxClock {
    let offset: Duration
    func sinceEpoch() -> Duration { SystemClock().sinceEpoch() + offset }
    func uptime() -> Duration { SystemClock().uptime() }
    func sleep(for duration: Duration) { SystemClock().sleep(for: duration) }
}

extension ItemAttributes {
    fileprivate func with(_ change: (inout ItemAttributes) -> Void) -> ItemAttributes {
        var copy = self
        change(&copy)
        return copy
    }
}

extension SyncTests {
    @Suite("Sync: convergence across classes, sizes, clocks and handles", .serialized)
    struct Convergence {
        @Test("A portless internet password and its sibling with a port: each edit reaches every machine, neither row taken for the other, nothing deleted")
        func partialPrimaryKeyMapsTheWrongRow() throws {
            let (groups, machines) = try threeMachines()
            try machines[0].vault.add(web("git.example", port: 8443, "8443 v1"))  // the lower rowid on A
            try machines[0].vault.add(web("git.example", port: nil, "default v1"))
            try syncAll(groups)
            try setWeb(machines[0], port: nil, "default from A")
            tick()
            try setWeb(machines[1], port: nil, "default from B")
            try setWeb(machines[1], port: 8443, "8443 from B")
            try groups[1].sync()
            #expect(try groups[0].sync().superseded == 1)  // A's edit loses: B's record applied on A
            try syncAll(groups)
            for (index, machine) in machines.enumerated() {
                #expect(try webs(machine)[nil]?.value == "default from B", "machine \(index)")
                #expect(try webs(machine)[8443]?.value == "8443 from B", "machine \(index): B's edit of the sibling")
            }
            tick()
            try setWeb(machines[0], port: 8443, "8443 from A")  // A edits only the sibling
            try syncAll(groups)
            for (index, machine) in machines.enumerated() {
                #expect(try webs(machine)[8443]?.value == "8443 from A", "machine \(index)")
                #expect(try webs(machine)[nil]?.value == "default from B", "machine \(index): portless item after A edited the sibling")
            }
        }

        @Test("A value over this keychain's own size limit, from a store that allows more, arrives: sync's limit applies, not the store's; a local edit that lost to it is replaced by it")
        func valueOverTheStoreLimitArrives() throws {
            let (groups, machines) = try threeMachines()
            // A's store allows 256 KiB (as lockboxd --max-value-size does); B and C keep the default 64 KiB.
            let large = try machines[0].reopened { $0.maximumValueSize = 256 * 1024 }
            let big = [UInt8](repeating: 7, count: 100 * 1024)
            var item = Item.genericPassword(service: "large.example", account: "user", data: SecretBytes(copying: big))
            item.attributes.synchronizable = true
            try large.add(item)
            try machines[0].add("small.example", "user", "small")
            try machines[0].add("grown.example", "user", "v1")
            for group in groups { try group.sync() }
            #expect(try machines[1].bytes("large.example") == big)
            #expect(try machines[1].value("small.example", "user") == "small")
            // B edits an item; A, later, makes it larger than B's store allows: A's write wins on B too.
            try machines[1].set("grown.example", "user", "edited on B, earlier")
            tick()
            try large.update(matching: machines[0].query("grown.example", "user"), to: ItemUpdate(data: SecretBytes(copying: big)))
            try groups[0].sync()
            try groups[1].sync()
            #expect(try machines[1].bytes("grown.example") == big, "B kept its edit, which lost")
            for group in groups + groups { try group.sync() }
            for (index, machine) in machines.enumerated() {
                #expect(try machine.bytes("grown.example") == big, "machine \(index)")
                #expect(try machine.bytes("large.example") == big, "machine \(index)")
                #expect(try machine.verify())
            }
            // B's own writes stay under B's limit.
            let refused = #expect(throws: LockboxError.self) {
                try machines[1].vault.update(matching: machines[1].query("grown.example", "user"), to: ItemUpdate(data: SecretBytes(copying: big + [1])))
            }
            #expect(refused?.code == .param)
        }

        @Test("An item over sync's own limit (a store configured for more) is refused by the push, with what to do, before anything of it is written")
        func itemOverTheSyncLimitRefused() throws {
            let (groups, machines) = try threeMachines()
            let huge = try machines[0].reopened { $0.maximumValueSize = 32 << 20 }
            var item = Item.genericPassword(service: "huge.example", account: "user", data: SecretBytes(copying: [UInt8](repeating: 3, count: (16 << 20) + 1)))
            item.attributes.synchronizable = true
            try huge.add(item)
            let refused = #expect(throws: LockboxError.self) { try groups[0].sync() }
            #expect(refused?.code == .param)
            #expect(refused?.message.contains("sync's limit") == true)
            try groups[1].sync()
            #expect(try machines[1].bytes("huge.example") == nil)
            // Made not synchronizable: the rest syncs again.
            var local = ItemAttributes()
            local.synchronizable = false
            try huge.update(matching: machines[0].query("huge.example", "user"), to: ItemUpdate(attributes: local))
            try machines[0].add("after.example", "user", "after")
            try groups[0].sync()
            try groups[1].sync()
            #expect(try machines[1].value("after.example", "user") == "after")
        }

        @Test("A sync through a handle restricted to some access groups is refused before anything is read or written: the other groups' items are not taken for deletes")
        func restrictedHandleRefused() throws {
            let (groups, machines) = try threeMachines()
            for group in ["app.one", "app.two"] {
                var item = Item.genericPassword(service: "\(group).example", account: "user", data: SecretBytes(utf8: "v1"), accessGroup: group)
                item.attributes.synchronizable = true
                try machines[1].vault.add(item)
            }
            try syncAll(groups)
            try machines[1].set("app.two.example", "user", "two edited")
            let restricted = try machines[1].reopened { $0.accessGroups = ["app.one", SyncGroup.keyAccessGroup] }
            let refused = #expect(throws: LockboxError.self) {
                _ = try SyncGroup(groups[1].groupID, vault: restricted, database: try testDatabase())
            }
            #expect(refused?.code == .param)
            #expect(refused?.message.contains("whole keychain") == true)
            for attempt in [
                { () throws -> Void in _ = try SyncGroup.create(vault: restricted, database: try testDatabase()) },
                { () throws -> Void in _ = try SyncGroup.join(groups[0].groupID, vault: restricted, database: try testDatabase(), passphrase: groupPassphrase) },
            ] {
                #expect(throws: LockboxError.self) { try attempt() }
            }
            try syncAll(groups)
            for (index, machine) in machines.enumerated() {
                #expect(try machine.value("app.two.example", "user") == "two edited", "machine \(index)")
                #expect(try machine.value("app.one.example", "user") == "v1", "machine \(index)")
            }
        }

        @Test(
            "An item made ThisDeviceOnly, or renamed, never wins over an edit made elsewhere since, even when the editor's clock runs behind (the same stamp), whichever device identifier is the greater",
            arguments: [true, false])
        func undatedDeleteTiesWithAnEdit(changerIsGreater: Bool) throws {
            // C's clock is an hour ahead: the records it writes are in A's and B's future.
            let (groups, machines) = try threeMachines(clocks: [nil, nil, AheadClock(offset: .seconds(3600))])
            try machines[2].add("tdo.example", "user", "v1")
            try machines[2].add("renamed.example", "user", "v1")
            try syncAll(groups)
            let greater = groups[0].deviceID > groups[1].deviceID ? 0 : 1
            let (changer, editor) = changerIsGreater ? (greater, 1 - greater) : (1 - greater, greater)
            var local = ItemAttributes()
            local.accessibility = .afterFirstUnlockThisDeviceOnly
            try machines[changer].vault.update(matching: machines[changer].query("tdo.example", "user"), to: ItemUpdate(attributes: local))
            var renamed = ItemAttributes()
            renamed.service = "new-name.example"
            try machines[changer].vault.update(matching: machines[changer].query("renamed.example", "user"), to: ItemUpdate(attributes: renamed))
            tick()
            try machines[editor].set("tdo.example", "user", "edited")
            try machines[editor].set("renamed.example", "user", "edited")
            try groups[changer].sync()
            try syncAll(groups)
            for index in [editor, 2] {
                #expect(try machines[index].value("tdo.example", "user") == "edited", "machine \(index): made ThisDeviceOnly elsewhere")
                #expect(try machines[index].value("renamed.example", "user") == "edited", "machine \(index): renamed elsewhere")
            }
        }

        @Test("A sync reports as superseded only local edits whose winning record it applied")
        func supersededCountedThoughNotApplied() throws {
            let (groups, machines) = try threeMachines()
            try machines[0].add("count.example", "user", "v1")
            try syncAll(groups)
            try machines[0].set("count.example", "user", "from A")
            tick()
            try machines[1].set("count.example", "user", "from B")
            try groups[1].sync()
            let machine = machines[0]
            // Another process edits the row between A's push and its applying B's record.
            groups[0].beforeApplyingSuperseding.withLock {
                $0 = { () throws(LockboxError) in
                    tick()
                    do { try machine.set("count.example", "user", "from A again") } catch { throw error as! LockboxError }
                }
            }
            let report = try groups[0].sync()
            groups[0].beforeApplyingSuperseding.withLock { $0 = nil }
            #expect(try machines[0].value("count.example", "user") == "from A again")  // B's record was not applied
            #expect(report.superseded == 0, "\(report)")
        }

        // MARK: Probes that held (kept as regression checks)

        @Test("A certificate and a fully keyed internet password arrive with every attribute; a label edit elsewhere converges")
        func certificateAndInternetPassword() throws {
            let (groups, machines) = try threeMachines()
            var certificate = ItemAttributes()
            certificate.certificateType = 3
            certificate.issuer = Data([0x30, 0x03, 0x01, 0x00, 0x02])
            certificate.serialNumber = Data([0x02, 0x01, 0x07])
            certificate.subject = Data([0x30, 0x00])
            certificate.label = "cert"
            certificate.synchronizable = true
            try machines[0].vault.add(Item(.certificate, attributes: certificate, data: SecretBytes(copying: [0x30, 0x82, 0, 0])))
            var web = ItemAttributes.internet(
                server: "full.example", account: "bob", protocol: .https, port: 443, path: "/login", securityDomain: "realm",
                authenticationType: .htmlForm)
            web.synchronizable = true
            try machines[0].vault.add(Item(.internetPassword, attributes: web, data: SecretBytes(utf8: "pw")))
            for _ in 0..<2 { for group in groups { try group.sync() } }
            var change = ItemAttributes()
            change.label = "cert relabelled"
            try machines[2].vault.update(
                matching: Query(.certificate, attributes: certificate, synchronizable: .synchronizable), to: ItemUpdate(attributes: change))
            for _ in 0..<2 { for group in groups { try group.sync() } }
            for machine in machines {
                var query = Query(.certificate, limit: .all, returning: [.attributes, .data], synchronizable: .synchronizable)
                let certs = try machine.vault.items(matching: query)
                #expect(certs.count == 1)
                #expect(certs.first?.attributes.label == "cert relabelled")
                #expect(certs.first?.attributes.subject == Data([0x30, 0x00]))
                query = Query(.internetPassword, limit: .all, returning: [.attributes], synchronizable: .synchronizable)
                let found = try machine.vault.items(matching: query)
                #expect(found.count == 1)
                #expect(found.first.map { SyncRecord.travelling($0.attributes) } == SyncRecord.travelling(web).with { $0.accessibility = .default; $0.accessGroup = Vault.defaultAccessGroup })
            }
        }

        @Test("Binary, empty and limit-sized values arrive byte for byte")
        func binaryValues() throws {
            let (groups, machines) = try threeMachines()
            let values: [String: [UInt8]] = [
                "binary.example": [0, 0xFF, 0xFE, 0, 0x80, 0xC0, 0],
                "empty.example": [],
                "limit.example": (0..<(64 * 1024)).map { UInt8(truncatingIfNeeded: $0 &* 31 &+ 7) },
            ]
            for (service, value) in values {
                var item = Item.genericPassword(service: service, account: "user", data: SecretBytes(copying: value))
                item.attributes.synchronizable = true
                try machines[0].vault.add(item)
            }
            for group in groups { try group.sync() }
            for machine in machines.dropFirst() {
                for (service, value) in values { #expect(try machine.bytes(service) == value, "\(service)") }
            }
            for group in groups { #expect(try group.sync().changedNothing) }
        }

        @Test("Edits in the same millisecond (one frozen clock) converge to the greater device's")
        func sameMillisecond() throws {
            let clock = ManualClock()
            let (groups, machines) = try threeMachines(clocks: [clock, clock, clock])
            try machines[0].add("tie.example", "user", "v1")
            try machines[0].add("tie2.example", "user", "v1")
            for group in groups { try group.sync() }
            try machines[0].set("tie.example", "user", "from A")
            try machines[1].set("tie.example", "user", "from B")
            try machines[0].delete("tie2.example", "user")
            try machines[1].set("tie2.example", "user", "from B")
            try groups[0].sync()
            try groups[1].sync()
            for group in groups { try group.sync() }
            let bWins = groups[1].deviceID > groups[0].deviceID
            for machine in machines {
                #expect(try machine.value("tie.example", "user") == (bWins ? "from B" : "from A"))
                #expect(try machine.value("tie2.example", "user") == (bWins ? "from B" : nil))
            }
        }

        @Test("An accessibility change on one machine and a later value edit on another converge, attribute for attribute")
        func accessibilityAndEdit() throws {
            let (groups, machines) = try threeMachines()
            try machines[0].add("acc.example", "user", "v1", accessibility: .afterFirstUnlock)
            for group in groups { try group.sync() }
            var change = ItemAttributes()
            change.accessibility = .whenUnlocked
            try machines[0].vault.update(matching: machines[0].query("acc.example", "user"), to: ItemUpdate(attributes: change))
            tick()
            try machines[1].set("acc.example", "user", "v2")
            try groups[0].sync()
            try groups[1].sync()
            for group in groups { try group.sync() }
            for machine in machines {
                var query = machine.query("acc.example", "user")
                query.returning = [.attributes]
                #expect(try machine.vault.item(matching: query).attributes.accessibility == .afterFirstUnlock)
                #expect(try machine.value("acc.example", "user") == "v2")
            }
        }

        @Test("A removed device's offline edit reaches the group once it joins again")
        func removedDeviceOfflineEdit() throws {
            let (groups, machines) = try threeMachines()
            try machines[0].add("rot.example", "user", "v1")
            try machines[0].add("rot2.example", "user", "v1")
            for group in groups { try group.sync() }
            try machines[2].set("rot.example", "user", "offline on C")
            try groups[0].removeDevice(groups[2].deviceID)
            tick()
            try machines[0].set("rot2.example", "user", "after removal")
            try groups[0].sync()
            #expect(throws: LockboxError.self) { try groups[2].sync() }
            let code = try groups[0].pairingCode()
            let rejoined = try SyncGroup.join(groups[0].groupID, vault: machines[2].vault, database: try testDatabase(), pairingCode: code)
            try rejoined.sync()
            try groups[0].sync()
            try groups[1].sync()
            for machine in machines {
                #expect(try machine.value("rot.example", "user") == "offline on C")
                #expect(try machine.value("rot2.example", "user") == "after removal")
            }
        }
    }
}
