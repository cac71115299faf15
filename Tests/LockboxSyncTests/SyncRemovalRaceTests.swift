import Dispatch
import Foundation
import Lockbox
import LockboxTestSupport
import LockboxVault
import Testing

@testable import LockboxSync

private final class Box<T>: @unchecked Sendable { var value: T? }

extension SyncTests {
    @Suite("Device removal racing a pairing code and a join", .serialized)
    struct RemovalRaces {
        @Test("A pairing code made while a device is removed is not handed out with the former key: the removal deletes it, or the code is refused")
        func invitationRacingRemoval() throws {
            let (groups, machines) = try threeMachines()
            defer { withExtendedLifetime(machines) {} }
            let group = groups[0].groupID
            let drop = try slowInserts(into: "lockbox_sync_invitations", when: "NEW.group_id = '\(group)'")
            defer { drop() }
            let code = Box<Result<String, any Error>>()
            let done = DispatchSemaphore(value: 0)
            let thread = Thread { code.value = outcome { try groups[1].pairingCode() }; done.signal() }
            thread.start()
            #expect(try waitForSleeping("INSERT INTO lockbox_sync_invitations"))
            try groups[0].removeDevice(groups[2].deviceID)
            done.wait()
            drop()
            let pending = try PostgresConnection(try testDatabase()).execute(
                "SELECT count(*) FROM lockbox_sync_invitations WHERE group_id = $1", [.text(group)])
            #expect(try PostgresConnection.integer(pending.first?[0] ?? nil) == 0, "a pairing code of the former key outlived the removal")
            // A code shown before the removal committed was dropped by it, like any pending one:
            // refused as used or expired, never a join with the former key.
            if case .success(let shown)? = code.value {
                let machine = try Machine()
                switch outcome(of: { try SyncGroup.join(group, vault: machine.vault, database: try testDatabase(), pairingCode: shown) }) {
                case .success(let joined):
                    if case .failure(let error) = outcome(of: { try joined.sync() }) { Issue.record("the device that joined with it cannot sync: \(error)") }
                case .failure(let error):
                    #expect(error.localizedDescription.contains("already used or expired") || "\(error)".contains("already used or expired"), "\(error)")
                }
            }
        }

        @Test("A join registering while another device is removed is refused with a way out, keeps no key of its own, and joins with a new code")
        func joinRacingRemoval() throws {
            let (groups, machines) = try threeMachines()
            defer { withExtendedLifetime(machines) {} }
            try machines[0].add("a.example", "user", "a1")
            for group in groups { try group.sync() }
            let group = groups[0].groupID
            let code = try groups[0].pairingCode()
            let drop = try slowInserts(into: "lockbox_sync_devices", when: "NEW.group_id = '\(group)' AND NEW.pulled_version = 0")
            defer { drop() }
            let machine = try Machine()
            let joined = Box<Result<SyncGroup, any Error>>()
            let done = DispatchSemaphore(value: 0)
            let thread = Thread {
                joined.value = outcome { try SyncGroup.join(group, vault: machine.vault, database: try testDatabase(), pairingCode: code) }
                done.signal()
            }
            thread.start()
            #expect(try waitForSleeping("INSERT INTO lockbox_sync_devices"))
            try groups[0].removeDevice(groups[2].deviceID)
            done.wait()
            drop()
            switch joined.value {
            case .success(let member)?:
                // Registered before the removal listed the devices: granted the new key.
                try member.sync()
                #expect(try groups[0].devices().first { $0.id == member.deviceID }?.isAttested == true)
            case .failure(let error as LockboxError)?:
                #expect(error.code == .authFailed)
                #expect(error.message.contains("join again"), "\(error.message)")
                #expect(try SyncGroup.groups(in: machine.vault).isEmpty, "a refused join left the group's keys")
                let member = try SyncGroup.join(group, vault: machine.vault, database: try testDatabase(), pairingCode: try groups[0].pairingCode())
                try member.sync()
                #expect(try machine.value("a.example", "user") == "a1")
            default:
                Issue.record("the join ended with \(String(describing: joined.value))")
            }
        }
    }
}
