import Foundation
import Lockbox
import LockboxCore
import LockboxTestSupport
import LockboxVault
import Testing
import VaultCrypto

@testable import LockboxSync

/// A device of the group as the attacker: it holds the key that attests devices' rows, and the
/// database role every device syncs with.
extension SyncTests {
    /// Rewrites `victim`'s row with a public key of `attacker`'s making, attested with the key
    /// every device of the group holds (what a device about to be removed can do).
    func replaceKey(of victim: String, by attacker: SyncGroup) throws -> (publicKey: [UInt8], secretKey: SecretBytes) {
        let (publicKey, secretKey) = Crypto.generateKeyPair()
        try PostgresConnection(try testDatabase()).execute(
            "UPDATE lockbox_sync_devices SET public_key = $3, attestation = $4 WHERE group_id = $1 AND device_id = $2",
            [
                .text(attacker.groupID), .text(victim), .bytes(publicKey),
                .bytes(attacker.attestation(victim, publicKey, keys: attacker.keys)),
            ])
        return (publicKey, secretKey)
    }

    func grants(_ group: String, epoch: Int64) throws -> [String] {
        try PostgresConnection(try testDatabase()).execute(
            "SELECT device_id FROM lockbox_sync_key_grants WHERE group_id = $1 AND epoch = $2 ORDER BY device_id", [.text(group), .integer(epoch)]
        ).map { $0[0] ?? "" }
    }

    @Test("A device about to be removed that attests a key of its own in another device's row gets no key through it: the removal keeps the key it saw, and says so")
    func removedDeviceCannotHijackAnotherRow() throws {
        let (groups, machines) = try threeMachines()
        defer { withExtendedLifetime(machines) {} }
        let (a, b, c) = (groups[0], groups[1], groups[2])
        try machines[0].add("before.example", "user", "before")
        for group in groups { try group.sync() }
        // Device B, before its removal, puts a key of its own making in C's row.
        let stolen = try replaceKey(of: c.deviceID, by: b)
        let seen = try a.devices()
        #expect(seen.first { $0.id == c.deviceID }?.isKeyReplaced == true, "\(seen)")
        #expect(seen.first { $0.id == b.deviceID }?.isKeyReplaced == false)

        let removal = try a.removeDevice(b.deviceID)
        #expect(removal.keyReplaced == [c.deviceID])
        #expect(removal.keeping.isEmpty && removal.firstSeen.isEmpty && removal.wasListed)
        // The only grant of the new epoch is the remover's own: nothing sealed to B's key.
        #expect(try grants(a.groupID, epoch: a.keyEpoch) == [a.deviceID])
        #expect(try !a.devices().contains { $0.id == c.deviceID || $0.id == b.deviceID })
        _ = stolen

        // C, given no key, says it was removed; joined again with a pairing code, it is the same
        // device with the key A saw, and reads what is written afterwards.
        let refused = #expect(throws: LockboxError.self) { try c.sync() }
        #expect(refused?.code == .authFailed, "\(String(describing: refused))")
        let rejoined = try SyncGroup.join(a.groupID, vault: machines[2].vault, database: try testDatabase(), pairingCode: try a.pairingCode())
        #expect(rejoined.deviceID == c.deviceID)
        try machines[0].add("after.example", "user", "written after the removal")
        try a.sync()
        try rejoined.sync()
        #expect(try machines[2].value("after.example", "user") == "written after the removal")
        #expect(try a.devices().first { $0.id == c.deviceID }?.isKeyReplaced == false)
        #expect(throws: LockboxError.self) { try b.sync() }
        // A later removal made here keeps C, joined again.
        let fourth = try Machine()
        let other = try SyncGroup.join(a.groupID, vault: fourth.vault, database: try testDatabase(), pairingCode: try a.pairingCode())
        try a.sync()
        let later = try a.removeDevice(other.deviceID)
        #expect(later.keeping == [c.deviceID] && later.keyReplaced.isEmpty, "\(later)")
    }

    @Test("A device row added by a device of the group (attested with the key every device holds) is named by the removal as seen for the first time")
    func addedRowIsNamedAsFirstSeen() throws {
        let (groups, machines) = try threeMachines()
        defer { withExtendedLifetime(machines) {} }
        let (a, b) = (groups[0], groups[1])
        for group in groups { try group.sync() }
        let (publicKey, _) = Crypto.generateKeyPair()
        let planted = "00112233aabbccdd"
        try PostgresConnection(try testDatabase()).execute(
            "INSERT INTO lockbox_sync_devices (group_id, device_id, pulled_version, public_key, attestation) VALUES ($1, $2, 0, $3, $4)",
            [.text(a.groupID), .text(planted), .bytes(publicKey), .bytes(b.attestation(planted, publicKey, keys: b.keys))])
        let removal = try a.removeDevice(b.deviceID)
        #expect(removal.firstSeen == [planted])
        #expect(Set(removal.keeping) == [planted, groups[2].deviceID])
        // Seen once, it is known from now on: a later removal does not name it again.
        let again = try a.removeDevice(planted)
        #expect(again.firstSeen.isEmpty && again.keeping == [groups[2].deviceID])
    }

    @Test("A device whose row was deleted from the database is still removed by a device that saw it: the key is replaced, and it reads nothing written afterwards; an identifier never seen is refused")
    func deviceWithDeletedRowIsRemoved() throws {
        let (groups, machines) = try threeMachines()
        defer { withExtendedLifetime(machines) {} }
        let (a, b) = (groups[0], groups[1])
        for group in groups { try group.sync() }
        try PostgresConnection(try testDatabase()).execute(
            "DELETE FROM lockbox_sync_devices WHERE group_id = $1 AND device_id = $2", [.text(a.groupID), .text(b.deviceID)])
        let epoch = a.keyEpoch
        let removal = try a.removeDevice(b.deviceID)
        #expect(!removal.wasListed)
        #expect(a.keyEpoch == epoch + 1)
        #expect(try grants(a.groupID, epoch: a.keyEpoch) == [a.deviceID, groups[2].deviceID].sorted())
        try machines[0].add("after.example", "user", "not for B")
        try a.sync()
        let refused = #expect(throws: LockboxError.self) { try b.sync() }
        #expect(refused?.code == .authFailed)
        #expect(try machines[1].value("after.example", "user") == nil)
        try groups[2].sync()
        #expect(try machines[2].value("after.example", "user") == "not for B")
        // Neither listed nor seen: refused as before, nothing rotated.
        let unknown = #expect(throws: LockboxError.self) { try a.removeDevice("0123456789abcdef") }
        #expect(unknown?.code == .itemNotFound)
        #expect(a.keyEpoch == epoch + 1)
    }

    @Test("Grants of the next epoch planted in the database do not stop a removal, and are replaced by its own")
    func plantedGrantsDoNotBlockRemoval() throws {
        let (groups, machines) = try threeMachines()
        defer { withExtendedLifetime(machines) {} }
        let (a, b, c) = (groups[0], groups[1], groups[2])
        for group in groups { try group.sync() }
        try PostgresConnection(try testDatabase()).execute(
            "INSERT INTO lockbox_sync_key_grants (group_id, device_id, epoch, sealed_key) VALUES ($1, $2, $3, $4)",
            [.text(a.groupID), .text(c.deviceID), .integer(a.keyEpoch + 1), .bytes([1, 2, 3])])
        try a.removeDevice(b.deviceID)
        try machines[0].add("after.example", "user", "for C")
        try a.sync()
        try c.sync()
        #expect(try machines[2].value("after.example", "user") == "for C")
    }

    @Test("A record of the devices seen that was changed outside Lockbox stops a removal, naming the file; removed, the removal goes on")
    func damagedDeviceRecordStopsRemoval() throws {
        let (groups, machines) = try threeMachines()
        defer { withExtendedLifetime(machines) {} }
        let (a, b) = (groups[0], groups[1])
        for group in groups { try group.sync() }
        let path = a.knownDevices.path
        var bytes = try #require(FileManager.default.contents(atPath: path))
        bytes[bytes.count / 2] ^= 1
        try bytes.write(to: URL(fileURLWithPath: path))
        let refused = #expect(throws: LockboxError.self) { try a.removeDevice(b.deviceID) }
        #expect(refused?.message.contains(path) == true && refused?.message.contains("Nothing was removed") == true, "\(String(describing: refused))")
        #expect(try a.devices().contains { $0.id == b.deviceID })
        // A sync goes on meanwhile (it records nothing into the damaged file).
        try a.sync()
        try FileManager.default.removeItem(atPath: path)
        let removal = try a.removeDevice(b.deviceID)
        #expect(removal.firstSeen == [groups[2].deviceID])
    }

    @Test("A key put in a device's own row is marked on it and written back at its next sync, so a device joining afterwards records the real key")
    func ownRowIsWrittenBack() throws {
        let (groups, machines) = try threeMachines()
        defer { withExtendedLifetime(machines) {} }
        let (a, b) = (groups[0], groups[1])
        for group in groups { try group.sync() }
        _ = try replaceKey(of: a.deviceID, by: b)
        #expect(try a.status().devices?.first { $0.id == a.deviceID }?.isKeyReplaced == true)
        try a.sync()
        let row = try PostgresConnection(try testDatabase()).execute(
            "SELECT public_key FROM lockbox_sync_devices WHERE group_id = $1 AND device_id = $2", [.text(a.groupID), .text(a.deviceID)])
        #expect(try PostgresConnection.bytes(try #require(row.first?[0])) == a.device.publicKey)
        // A device that joins now records A's own key, and a removal of B from it grants A.
        let late = try Machine()
        let joined = try SyncGroup.join(a.groupID, vault: late.vault, database: try testDatabase(), pairingCode: try a.pairingCode())
        try joined.sync()
        let removal = try joined.removeDevice(b.deviceID)
        #expect(removal.keyReplaced.isEmpty && removal.keeping.contains(a.deviceID), "\(removal)")
        withExtendedLifetime(late) {}
    }

    @Test("Rows whose identifiers are not a device's (very long ones that would swell the record of devices seen, two that differ only as bytes) are unattested, never recorded, and removed by the next removal, which they cannot block")
    func foreignIdentifiersAreNotDevices() throws {
        let (groups, machines) = try threeMachines()
        defer { withExtendedLifetime(machines) {} }
        let (a, b) = (groups[0], groups[1])
        for group in groups { try group.sync() }
        let connection = try PostgresConnection(try testDatabase())
        let (publicKey, _) = Crypto.generateKeyPair()
        let long = String(repeating: "a", count: 2_500)
        for id in [long, "\u{00E9}", "e\u{0301}"] {
            try connection.execute(
                "INSERT INTO lockbox_sync_devices (group_id, device_id, pulled_version, public_key, attestation) VALUES ($1, $2, 0, $3, $4)",
                [.text(a.groupID), .text(id), .bytes(publicKey), .bytes(b.attestation(id, publicKey, keys: b.keys))])
        }
        try a.sync()
        let listed = try a.devices()
        #expect(listed.filter { !$0.isAttested }.count == 3)
        let record = try #require(FileManager.default.contents(atPath: a.knownDevices.path))
        #expect(record.count < 1_000, "the record of devices seen holds \(record.count) bytes")
        let removal = try a.removeDevice(b.deviceID)
        #expect(removal.unattested.count == 3 && removal.keeping == [groups[2].deviceID], "\(removal)")
        #expect(try a.devices().count == 2)
    }

    @Test("A FIFO where the records of the last pull and of the devices seen belong does not hang a sync or status; status names the record, and a removal is refused")
    func fifoInPlaceOfTheRecordsDoesNotHang() throws {
        let (groups, machines) = try threeMachines()
        defer { withExtendedLifetime(machines) {} }
        let (a, b) = (groups[0], groups[1])
        for group in groups { try group.sync() }
        for path in [a.knownDevices.path, a.pulledMark.path] {
            try FileManager.default.removeItem(atPath: path)
            #expect(mkfifo(path, 0o600) == 0)
        }
        // A pulled mark that is not a file is damaged: the sync refuses, and says so, at once.
        #expect(throws: LockboxError.self) { try a.sync() }
        try FileManager.default.removeItem(atPath: a.pulledMark.path)
        try a.sync()
        let status = try a.status()
        #expect(status.deviceRecordProblem?.contains(a.knownDevices.path) == true, "\(String(describing: status.deviceRecordProblem))")
        #expect(throws: LockboxError.self) { try a.removeDevice(b.deviceID) }
    }

    @Test("A removal names the devices it saw before whose rows were deleted from the database: they get no key")
    func removalNamesMissingDevices() throws {
        let (groups, machines) = try threeMachines()
        defer { withExtendedLifetime(machines) {} }
        let (a, b, c) = (groups[0], groups[1], groups[2])
        for group in groups { try group.sync() }
        try PostgresConnection(try testDatabase()).execute(
            "DELETE FROM lockbox_sync_devices WHERE group_id = $1 AND device_id = $2", [.text(a.groupID), .text(c.deviceID)])
        let removal = try a.removeDevice(b.deviceID)
        #expect(removal.missing == [c.deviceID] && removal.keeping.isEmpty, "\(removal)")
    }

    @Test("A fleet session row that does not open (planted in the database) does not stop a removal: its tokens are cleared and said so, and the removed device reads nothing written afterwards")
    func plantedFleetSessionDoesNotBlockRemoval() throws {
        let (groups, machines) = try threeMachines()
        defer { withExtendedLifetime(machines) {} }
        let (a, b, c) = (groups[0], groups[1], groups[2])
        for group in groups { try group.sync() }
        try PostgresConnection(try testDatabase()).execute(
            "INSERT INTO lockbox_fleet_sessions (group_id, session_id, version, refresh_token, access_token) VALUES ($1, $2, 1, $3, $3)",
            [.text(a.groupID), .text("planted"), .bytes([1, 2, 3, 4])])
        let removal = try a.removeDevice(b.deviceID)
        #expect(removal.clearedFleetTokens == 2, "\(removal)")
        try machines[0].add("after.example", "user", "not for B")
        try a.sync()
        #expect(throws: LockboxError.self) { try b.sync() }
        try c.sync()
        #expect(try machines[2].value("after.example", "user") == "not for B")
        #expect(try machines[1].value("after.example", "user") == nil)
    }

    @Test("A device that joins with a pairing code starts from the inviting device's record: a key a member put in the inviter's row before the join is found, and a removal made from the new device seals nothing to it")
    func pairingCodeCarriesTheInvitersRecord() throws {
        let database = try testDatabase()
        let first = try Machine()
        let a = try SyncGroup.create(vault: first.vault, database: database)
        let second = try Machine()
        let b = try SyncGroup.join(a.groupID, vault: second.vault, database: database, pairingCode: try a.pairingCode())
        try a.sync()
        try b.sync()
        // B puts a key of its own in A's row; before A syncs again, D joins with A's code.
        let stolen = try replaceKey(of: a.deviceID, by: b)
        let fourth = try Machine()
        let d = try SyncGroup.join(a.groupID, vault: fourth.vault, database: database, pairingCode: try a.pairingCode())
        #expect(d.knownDevices.read().devices?[a.deviceID] == a.device.publicKey, "the code did not carry A's own key")
        try d.sync()
        #expect(try d.devices().first { $0.id == a.deviceID }?.isKeyReplaced == true)
        let removal = try d.removeDevice(b.deviceID)
        #expect(removal.keyReplaced == [a.deviceID], "\(removal)")
        // Nothing of the new epoch is sealed to B's key: the only grant is D's own.
        #expect(try grants(a.groupID, epoch: d.keyEpoch) == [d.deviceID])
        _ = stolen
        // A joins again with a code from D, as the same device, and reads what D writes.
        let rejoined = try SyncGroup.join(a.groupID, vault: first.vault, database: database, pairingCode: try d.pairingCode())
        #expect(rejoined.deviceID == a.deviceID)
        try fourth.add("after.example", "user", "for A, not B")
        try d.sync()
        try rejoined.sync()
        #expect(try first.value("after.example", "user") == "for A, not B")
        #expect(throws: LockboxError.self) { try b.sync() }
        withExtendedLifetime((second, fourth)) {}
    }

    @Test("A pairing code made by an earlier Lockbox (the group keys alone) still joins, and one whose record was changed in the database is refused")
    func pairingCodeRecordIsOptionalButSealed() throws {
        let database = try testDatabase()
        let first = try Machine()
        let a = try SyncGroup.create(vault: first.vault, database: database)
        // As an earlier Lockbox made them: three fields.
        let code = "ABCD-EFGH-JKMN-PQRS"
        let wrap = try SyncGroup.wrapKeys(a.keys, groupID: a.groupID, purpose: "invitation:ABCD", secret: SecretBytes(utf8: "ABCDEFGHJKMNPQRS"))
        let connection = try PostgresConnection(database)
        try connection.execute(
            "INSERT INTO lockbox_sync_invitations (group_id, invitation_id, key_wrap, expires_at) VALUES ($1, 'ABCD', $2, now() + interval '10 minutes')",
            [.text(a.groupID), .bytes(wrap)])
        let joining = try Machine()
        #expect(try SyncGroup.join(a.groupID, vault: joining.vault, database: database, pairingCode: code).groupID == a.groupID)
        // A record changed in the database: the join is refused (as any changed wrap).
        let fresh = try a.pairingCode()
        let invitation = String(PairingCode.normalized(fresh).prefix(4))
        let stored = try #require(try connection.execute(
            "SELECT key_wrap FROM lockbox_sync_invitations WHERE group_id = $1 AND invitation_id = $2", [.text(a.groupID), .text(invitation)]).first)
        var bytes = try PostgresConnection.bytes(stored[0])
        bytes[bytes.count - 1] ^= 1
        try connection.execute(
            "UPDATE lockbox_sync_invitations SET key_wrap = $3 WHERE group_id = $1 AND invitation_id = $2",
            [.text(a.groupID), .text(invitation), .bytes(bytes)])
        let other = try Machine()
        let refused = #expect(throws: LockboxError.self) { try SyncGroup.join(a.groupID, vault: other.vault, database: database, pairingCode: fresh) }
        #expect(refused?.code == .decode, "\(String(describing: refused))")
        // A wrap cut back to three fields, to pass for an earlier Lockbox's and carry no record:
        // its keys no longer open (the code is refused), so nothing joins without the record.
        let cutCode = try a.pairingCode()
        let cutInvitation = String(PairingCode.normalized(cutCode).prefix(4))
        let whole = try #require(try connection.execute(
            "SELECT key_wrap FROM lockbox_sync_invitations WHERE group_id = $1 AND invitation_id = $2", [.text(a.groupID), .text(cutInvitation)]).first)
        var fields = FieldDecoder(try PostgresConnection.bytes(whole[0]))
        var cut = FieldEncoder()
        cut.bytes(try fields.bytes())
        cut.integer(try fields.integer())
        cut.bytes(try fields.bytes())
        #expect((try? fields.bytes()) != nil, "the code carried no record")
        try connection.execute(
            "UPDATE lockbox_sync_invitations SET key_wrap = $3 WHERE group_id = $1 AND invitation_id = $2",
            [.text(a.groupID), .text(cutInvitation), .bytes(cut.bytes)])
        let downgraded = #expect(throws: LockboxError.self) {
            try SyncGroup.join(a.groupID, vault: other.vault, database: database, pairingCode: cutCode)
        }
        #expect(downgraded?.code == .authFailed, "\(String(describing: downgraded))")
        withExtendedLifetime((joining, other)) {}
    }

    @Test("An inviting device passes on only the devices listed now, with the keys it first saw, and none it sees as replaced: a key it took from the database in a window is not spread to the devices it invites")
    func invitationPassesOnOnlyWhatTheListConfirms() throws {
        let (groups, machines) = try threeMachines()
        defer { withExtendedLifetime(machines) {} }
        let (a, b, c) = (groups[0], groups[1], groups[2])
        for group in groups { try group.sync() }
        // D joins with the passphrase while B's key is in C's row: D records B's key for C.
        _ = try replaceKey(of: c.deviceID, by: b)
        let fourth = try Machine()
        let d = try SyncGroup.join(a.groupID, vault: fourth.vault, database: try testDatabase(), passphrase: groupPassphrase)
        try d.sync()
        // C writes its own key back; D now sees C as replaced, and does not pass its entry on.
        try c.sync()
        #expect(try d.devices().first { $0.id == c.deviceID }?.isKeyReplaced == true)
        let fifth = try Machine()
        let e = try SyncGroup.join(a.groupID, vault: fifth.vault, database: try testDatabase(), pairingCode: try d.pairingCode())
        try e.sync()
        #expect(try e.devices().first { $0.id == c.deviceID }?.isKeyReplaced == false)
        #expect(e.knownDevices.read().devices?[c.deviceID] == c.device.publicKey)
        // A device removed since is not passed on either: E's removals do not name it as missing.
        try a.removeDevice(b.deviceID)
        try d.sync()
        let sixth = try Machine()
        let f = try SyncGroup.join(a.groupID, vault: sixth.vault, database: try testDatabase(), pairingCode: try d.pairingCode())
        #expect(f.knownDevices.read().devices?[b.deviceID] == nil)
        withExtendedLifetime((fourth, fifth, sixth)) {}
    }
}
