import Foundation
import Lockbox
import LockboxTestSupport
import Testing
import VaultStorage

@testable import LockboxVault

/// Every released file format keeps opening: the committed schema-1 vault and backup
/// (Tests/Fixtures/vault-v1, written by the first release) are opened, upgraded in place and
/// read back item by item.
@Suite("File format compatibility")
struct FormatCompatibilityTests {
    static let fixtures = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
        .appendingPathComponent("Fixtures/vault-v1").path
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

        init() throws {
            let manager = FileManager.default
            let keychains = directory.file("keychains")
            let state = directory.file("state")
            for folder in [keychains, state] {
                try manager.createDirectory(atPath: folder, withIntermediateDirectories: true, attributes: [.posixPermissions: 0o700])
            }
            path = keychains + "/v1.lockbox"
            try manager.copyItem(atPath: FormatCompatibilityTests.fixtures + "/v1.lockbox", toPath: path)
            try manager.copyItem(atPath: FormatCompatibilityTests.fixtures + "/device-key", toPath: state + "/device-key")
            try manager.setAttributes([.posixPermissions: 0o600], ofItemAtPath: path)
            try manager.setAttributes([.posixPermissions: 0o600], ofItemAtPath: state + "/device-key")
            var configuration = Vault.Configuration()
            configuration.unlockCache = .processMemory
            configuration.device = DeviceIdentity(keyPath: state + "/device-key", machineIDPath: FormatCompatibilityTests.fixtures + "/machine-id")
            self.configuration = configuration
        }
    }

    func checkEveryItem(_ vault: Vault) throws {
        for (query, value) in Self.expected {
            #expect(try vault.data(matching: query) == SecretBytes(utf8: value), "\(query.attributes.service ?? query.attributes.server ?? "")")
        }
        #expect(try vault.data(matching: .genericPassword(service: "svc.binary", account: "henry"))
            == SecretBytes(copying: Array("binary".utf8) + [0x00, 0x01, 0xff] + Array("tail".utf8)))
        var presence = Query.genericPassword(service: "svc.presence", account: "frank")
        presence.authenticationContext = AuthenticationContext(verifier: ScriptedVerifier(.passphrase("fixture-passphrase-v1")))
        #expect(try vault.data(matching: presence) == SecretBytes(utf8: "presence"))
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
        #expect(formats == [2])
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
