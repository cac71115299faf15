import Foundation
import Lockbox
import LockboxAuth
import LockboxCore
import LockboxTestSupport
import LockboxVault
import Testing

@testable import LockboxFleet
@testable import LockboxSync

#if canImport(Glibc)
import Glibc
#endif

/// Makes `path` impossible to unlink (immutable as root, whose permissions are not checked;
/// its directory read-only otherwise), or possible again.
private func pin(_ path: String, _ pinned: Bool) throws {
    if getuid() == 0 {
        let chattr = Process()
        chattr.executableURL = URL(fileURLWithPath: "/usr/bin/chattr")
        chattr.arguments = [pinned ? "+i" : "-i", path]
        try chattr.run()
        chattr.waitUntilExit()
        #expect(chattr.terminationStatus == 0)
    } else {
        let directory = (path as NSString).deletingLastPathComponent
        chmod(directory, pinned ? 0o500 : 0o700)
    }
}

/// How a Lockbox from before its times were in the database's clock read the shared access token (what machines
/// not yet upgraded run).
private func previousLockboxCachedAccessToken(_ group: SyncGroup, for key: CredentialKey) throws(LockboxError) -> CachedAccessToken? {
    let session = group.fleetSessionID(key.storageAccount)
    guard let stored = try group.readFleet(try group.fleetConnection(), session: session, field: .accessToken) else { return nil }
    var decoder = FieldDecoder(stored.details)
    guard let type = try? decoder.string(), let expires = try? decoder.integer(), let fresh = try? decoder.integer(),
        let scope = try? decoder.string(), decoder.isAtEnd
    else { throw LockboxError.syncDatabase("A fleet session in the sync database") }
    let credentials = Credentials(
        accessToken: stored.secret, tokenType: type, expiresAt: Date(timeIntervalSince1970: Double(expires) / 1000),
        scope: scope.split(separator: " ").map(String.init))
    let freshUntil = Date(timeIntervalSince1970: Double(fresh) / 1000)
    return freshUntil > Date() ? CachedAccessToken(credentials: credentials, freshUntil: freshUntil) : nil
}

extension SyncTests {
    @Suite("Sync and fleet: size limits, a join that cannot finish, a fleet upgraded machine by machine", .serialized)
    struct LimitsAndUpgrades {
        @Test("An item sync brought in over this store's own limit can have its attributes changed here (renamed, made not synchronizable)")
        func attributesOfALargeSyncedItemCanBeChanged() throws {
            let (groups, machines) = try threeMachines()
            defer { withExtendedLifetime(machines) {} }
            let large = try machines[0].reopened { $0.maximumValueSize = 256 * 1024 }
            let big = [UInt8](repeating: 7, count: 100 * 1024)
            var item = Item.genericPassword(service: "large.example", account: "user", data: SecretBytes(copying: big))
            item.attributes.synchronizable = true
            try large.add(item)
            try groups[0].sync()
            try groups[1].sync()
            #expect(try machines[1].bytes("large.example") == big)
            // B (the default 64 KiB store) renames the item it holds: its value is not written.
            var renamed = ItemAttributes()
            renamed.label = "renamed on B"
            let rename = outcome {
                try machines[1].vault.update(matching: machines[1].query("large.example", "user"), to: ItemUpdate(attributes: renamed))
            }
            #expect((try? rename.get()) != nil, "renaming the synced item on B: \(rename)")
            // Nor can B stop syncing it (the way out the push's refusal names).
            var local = ItemAttributes()
            local.synchronizable = false
            let unsync = outcome {
                try machines[1].vault.update(matching: machines[1].query("large.example", "user"), to: ItemUpdate(attributes: local))
            }
            #expect((try? unsync.get()) != nil, "making the synced item not synchronizable on B: \(unsync)")
        }

        @Test("A recovery writes no record over sync's limit (refused as a push refuses it, naming the way out): the other devices keep pulling")
        func recoveryWritesNoRecordOverTheSyncLimit() throws {
            let (groups, machines) = try threeMachines()
            defer { withExtendedLifetime(machines) {} }
            let huge = try machines[0].reopened { $0.maximumValueSize = 32 << 20 }
            try machines[0].add("grown.example", "user", "v1")
            for group in groups { try group.sync() }
            let backup = try DatabaseBackup(groups[0].groupID)
            tick()
            try machines[0].set("grown.example", "user", "v2")
            try groups[0].sync()
            try backup.restore()
            // A, whose store allows 32 MiB, makes the item larger than sync carries (a push
            // would refuse it), then recovers the database, which lost v2.
            tick()
            let tooLarge = [UInt8](repeating: 5, count: (16 << 20) + 1)
            try huge.update(matching: machines[0].query("grown.example", "user"), to: ItemUpdate(data: SecretBytes(copying: tooLarge)))
            let recovered = outcome { try groups[0].recoverDatabase() }
            let largest = try PostgresConnection(try testDatabase()).execute(
                "SELECT max(length(payload)) FROM lockbox_sync_items WHERE group_id = $1", [.text(groups[0].groupID)]
            ).first?.first ?? nil
            #expect(Int(largest ?? "0")! < 16 << 20, "recovery (\(recovered)) wrote a record of \(largest ?? "?") bytes")
            #expect("\(recovered)".contains("sync's limit"), "\(recovered)")
            // The way out the refusal names: the item made not synchronizable; the recovery then
            // goes through, and C, which saw nothing after the backup, gets a change A makes next.
            var local = ItemAttributes()
            local.synchronizable = false
            try huge.update(matching: machines[0].query("grown.example", "user"), to: ItemUpdate(attributes: local))
            try groups[0].recoverDatabase()
            try machines[0].add("after.example", "user", "after")
            try groups[0].sync()
            let pulled = outcome { try groups[2].sync() }
            #expect((try? pulled.get()) != nil, "C's sync after A's recovery: \(pulled)")
            #expect(try machines[2].value("after.example", "user") == "after")
        }

        @Test("A join whose removal of the earlier device's stale state fails, joined again once the cause is fixed, removes that state: the new device syncs")
        func joinAgainAfterAFailedRemovalOfTheStaleState() throws {
            let (groups, machines) = try threeMachines()
            defer { withExtendedLifetime(machines) {} }
            try machines[0].add("mail.example", "alice", "v1")
            for group in groups { try group.sync() }
            // B's device key deleted: B joins again as a new device, and its earlier state is stale.
            try machines[1].vault.delete(
                matching: Query.genericPassword(service: SyncGroup.deviceService, account: groups[1].groupID, accessGroup: SyncGroup.keyAccessGroup))
            let statePath = SyncState.path(vault: machines[1].vault.path, groupID: groups[1].groupID)
            #expect(FileManager.default.fileExists(atPath: statePath))
            // The stale state cannot be removed at first (a directory left read-only, a file a
            // run as another user left): the join fails, naming it.
            try pin(statePath, true)
            let failed = outcome {
                try SyncGroup.join(groups[0].groupID, vault: machines[1].vault, database: try testDatabase(), passphrase: groupPassphrase)
            }
            try pin(statePath, false)
            #expect((try? failed.get()) == nil && "\(failed)".contains("Cannot remove"), "the first join: \(failed)")
            // The user fixes it and joins again.
            let joined = try SyncGroup.join(groups[0].groupID, vault: machines[1].vault, database: try testDatabase(), passphrase: groupPassphrase)
            let synced = outcome { try joined.sync() }
            #expect((try? synced.get()) != nil, "the new device's first sync: \(synced)")
            #expect(try machines[1].value("mail.example", "alice") == "v1")
        }

        @Test("A machine still running the previous Lockbox reads the shared access token an upgraded machine stored")
        func previousLockboxReadsTheSharedAccessToken() async throws {
            let (groups, machines) = try threeMachines()
            defer { withExtendedLifetime(machines) {} }
            let key = CredentialKey(issuer: "https://issuer.example", clientID: "fleet-mixed")
            let credentials = Credentials(
                accessToken: SecretBytes(utf8: "access token"), tokenType: "Bearer", expiresAt: Date().addingTimeInterval(300), scope: ["api"])
            // An upgraded machine stores the token it refreshed.
            try await FleetAccessTokenCache(group: groups[0]).storeAccessToken(
                CachedAccessToken(credentials: credentials, freshUntil: Date().addingTimeInterval(270)), for: key)
            #expect(try await FleetAccessTokenCache(group: groups[1]).cachedAccessToken(for: key) != nil)
            // A machine not upgraded yet (the previous commit's reader).
            let previous = outcome { try previousLockboxCachedAccessToken(groups[2], for: key) }
            let served = (try? previous.get()) ?? nil
            #expect(served != nil, "the previous Lockbox's read of the shared access token: \(previous)")
        }
    }
}
