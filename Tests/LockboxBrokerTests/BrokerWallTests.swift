import Foundation
import Lockbox
import LockboxTestSupport
import Testing

@testable import LockboxBroker

/// What the broker promises against the user's other processes: access groups are walls, the
/// keys are nowhere but in the broker, and a process without the kernel keyring works.
@Suite("lockboxd's walls")
struct BrokerWallTests {
    @Test("two executables cannot read each other's items: naming the other's group gives -34018")
    func otherExecutablesGroup_isMissingEntitlement() throws {
        let fixture = try BrokerFixture()
        try fixture.store().unlock(passphrase: SecretBytes(utf8: BrokerFixture.passphraseText))
        let first = try fixture.application("first-app")
        let second = try fixture.application("second-app")
        let canary = makeCanary("wall")
        let added = try run(
            first, ["add-generic-password", "-s", "wall", "-a", "alice"], input: Array((canary + "\n").utf8),
            environment: fixture.clientEnvironment)
        #expect(added.status == 0, "\(added.standardError)")
        // The owner reads its own item.
        let own = try run(first, ["find-generic-password", "-s", "wall", "-a", "alice", "-w"], environment: fixture.clientEnvironment)
        #expect(own.status == 0, "\(own.standardError)")
        #expect(own.standardOutput.contains(canary))
        // The other application: its own groups hold nothing; the owner's group is refused.
        let unnamed = try run(second, ["find-generic-password", "-s", "wall", "-a", "alice", "-w"], environment: fixture.clientEnvironment)
        #expect(unnamed.status == 44, "\(unnamed.standardError)")
        #expect(!unnamed.standardOutput.contains(canary))
        let named = try run(
            second, ["find-generic-password", "-s", "wall", "-a", "alice", "--access-group", first, "-w"],
            environment: fixture.clientEnvironment)
        #expect(named.status == 1)
        #expect(named.standardError.contains("(OSStatus -34018)"), "\(named.standardError)")
        #expect(!named.standardOutput.contains(canary))
        // Nor can it delete or overwrite it.
        let deleted = try run(
            second, ["delete-generic-password", "-s", "wall", "-a", "alice", "--access-group", first], environment: fixture.clientEnvironment)
        #expect(deleted.standardError.contains("(OSStatus -34018)"), "\(deleted.standardError)")
        // And this test process, a third executable, is refused the same way.
        let store = try fixture.store()
        #expect(status { _ = try store.data(matching: .genericPassword(service: "wall", account: "alice", accessGroup: first)) } == -34018)
        // The lockbox command installed beside lockboxd reaches another group only after the
        // passphrase is entered again on its connection: without it, -34018 too.
        let cli = try run(
            builtProduct("lockbox"), ["find-generic-password", "-s", "wall", "-a", "alice", "--access-group", first, "-w"],
            environment: fixture.clientEnvironment)
        #expect(cli.status == 1, "\(cli.standardError)")
        #expect(cli.standardError.contains("(OSStatus -34018)"), "\(cli.standardError)")
        #expect(!cli.standardOutput.contains(canary))
        // Its status counts the items of its own groups only: another program's stay unseen.
        let theirs = try run(second, ["status"], environment: fixture.clientEnvironment)
        #expect(theirs.standardOutput.contains("items: 0"), "\(theirs.standardOutput) \(theirs.standardError)")
        let mine = try run(first, ["status"], environment: fixture.clientEnvironment)
        #expect(mine.standardOutput.contains("items: 1"), "\(mine.standardOutput) \(mine.standardError)")
        // Its dump lists its own groups, and says that other programs' are not listed.
        let dump = try run(builtProduct("lockbox"), ["dump"], environment: fixture.clientEnvironment)
        #expect(dump.status == 0 && !dump.standardOutput.contains("wall"), "\(dump.standardError)")
        #expect(dump.standardError.contains("other programs' groups are not listed"), "\(dump.standardError)")
    }

    @Test("a grant removed from the policy is gone from a connection already open, at its next request")
    func grantRemoved_isGoneFromAnOpenConnection() throws {
        let fixture = try BrokerFixture()
        fixture.stop()
        let home = fixture.directory.file("config")
        try FileManager.default.createDirectory(atPath: home + "/lockbox", withIntermediateDirectories: true, attributes: [.posixPermissions: 0o700])
        chmod(home, 0o700)
        let policy = home + "/lockbox/broker.conf"
        let me = try FileManager.default.destinationOfSymbolicLink(atPath: "/proc/self/exe")
        func write(_ text: String) throws {
            let temporary = policy + ".new"
            try text.write(toFile: temporary, atomically: false, encoding: .utf8)
            chmod(temporary, 0o600)
            #expect(rename(temporary, policy) == 0)
        }
        try write("[executable \(me)]\naccess-groups = org.example.shared\n")
        try fixture.start(access: "executable", configurationHome: home)
        let store = try fixture.store()
        try store.unlock(passphrase: SecretBytes(utf8: BrokerFixture.passphraseText))
        let canary = makeCanary("revoked")
        try store.add(.genericPassword(service: "grant", account: "a", data: SecretBytes(utf8: canary), accessGroup: "org.example.shared"))
        let query = Query.genericPassword(service: "grant", account: "a", accessGroup: "org.example.shared")
        #expect(try store.data(matching: query) == SecretBytes(utf8: canary))
        // The grant is taken away (an atomic replace, as an editor saves): the same connection
        // is refused from its next request on.
        try write("# no grant\n")
        #expect(status { _ = try store.data(matching: query) } == -34018)
        #expect(status { try store.delete(matching: query) } == -34018)
    }

    @Test("while unlocked in broker mode, the vault file and the kernel keyring give another process nothing usable")
    func brokerMode_keysNeitherInFileNorKeyring() throws {
        let fixture = try BrokerFixture()
        let store = try fixture.store()
        try store.unlock(passphrase: SecretBytes(utf8: BrokerFixture.passphraseText))
        let canary = makeCanary("broker-file")
        try store.add(.genericPassword(service: "file", account: "alice", data: SecretBytes(utf8: canary)))
        let identifier = try store.status().path
        #expect(identifier == fixture.vaultPath)
        // The file: no clear value anywhere in the vault's directory.
        #expect(filesContaining(canary, in: fixture.directory.path).isEmpty)
        // The kernel keyring, as another process of the user reads it: no Lockbox entry at all.
        let keys = try run("/usr/bin/keyctl", ["show", "@u"])
        #expect(keys.status == 0, "\(keys.standardError)")
        let vaultID = fixture.vaultIdentifier
        #expect(!keys.standardOutput.contains(vaultID), "\(keys.standardOutput)")
        // A process that opens the file itself is refused (the broker holds it) and, were it to
        // read the file anyway, has no key: the vault is locked to it.
        let direct = try run(
            builtProduct("lockbox"), ["--keychain", fixture.vaultPath, "find-generic-password", "-s", "file", "-a", "alice", "-w"],
            environment: ProcessInfo.processInfo.environment.merging(["LOCKBOX_BROKER": "0"]) { $1 })
        #expect(direct.status == 1)
        #expect(!direct.standardOutput.contains(canary))
        #expect(direct.standardError.contains("lockboxd serves the keychain"), "\(direct.standardError)")
        // The broker is not dumpable: the kernel gives its /proc files to root, so that the
        // user's other processes cannot read its memory (as root this shows nothing).
        let pid = try fixture.brokerProcess()
        var info = stat()
        #expect(stat("/proc/\(pid)/mem", &info) == 0)
        #expect(info.st_uid == 0, "lockboxd's memory is open to its user")
    }

    @Test("a client under a seccomp filter that forbids keyctl works through the broker")
    func noKernelKeyringClient_worksThroughBroker() throws {
        let fixture = try BrokerFixture()
        try fixture.store().unlock(passphrase: SecretBytes(utf8: BrokerFixture.passphraseText))
        let wrapper = NoKernelKeyring.wrapper(in: fixture.directory.path)
        let sandboxed = try run("/usr/bin/python3", [wrapper, "/usr/bin/keyctl", "show", "@u"])
        #expect(sandboxed.status != 0, "the wrapper left the keyring reachable")
        let lockbox = builtProduct("lockbox")
        let added = try run(
            "/usr/bin/python3", [wrapper, lockbox, "add-generic-password", "-s", "sandbox", "-a", "app"], input: Array("value\n".utf8),
            environment: fixture.clientEnvironment)
        #expect(added.status == 0, "\(added.standardError)")
        let read = try run(
            "/usr/bin/python3", [wrapper, lockbox, "find-generic-password", "-s", "sandbox", "-a", "app", "-w"],
            environment: fixture.clientEnvironment)
        #expect(read.status == 0, "\(read.standardError)")
        #expect(read.standardOutput == "value\n")
        let shown = try run("/usr/bin/python3", [wrapper, lockbox, "status"], environment: fixture.clientEnvironment)
        #expect(shown.standardOutput.contains("backend: broker"), "\(shown.standardOutput)")
    }
}
