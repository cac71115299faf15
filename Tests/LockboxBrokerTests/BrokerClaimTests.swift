import Foundation
import Lockbox
import LockboxTestSupport
import Testing

@testable import LockboxBroker

/// One writer per vault: a program that has the vault open directly and `lockboxd` exclude each
/// other, whichever started first, across real processes.
@Suite("One writer per vault: lockboxd and embedded programs")
struct BrokerClaimTests {
    /// `lockbox` forced to the embedded vault (never the broker).
    static func embeddedEnvironment(_ fixture: BrokerFixture) -> [String: String] {
        var environment = ProcessInfo.processInfo.environment
        environment["LOCKBOX_BROKER"] = "0"
        environment["LOCKBOX_BACKEND"] = "vault"
        environment["LOCKBOX_KEYCHAIN"] = fixture.vaultPath
        environment["LOCKBOX_UNLOCK_CACHE"] = "keyring"
        return environment
    }

    /// Whether some process holds a lock on the vault's claim file now.
    static func claimIsHeld(_ fixture: BrokerFixture) -> Bool {
        let descriptor = open(BrokerClaim.lockPath(forVault: fixture.vaultPath), O_RDONLY | O_CLOEXEC)
        guard descriptor >= 0 else { return false }
        defer { close(descriptor) }
        return flock(descriptor, LOCK_EX | LOCK_NB) != 0
    }

    @Test("a program that opened the vault before any broker ran keeps lockboxd out until it exits; its write lands")
    func embeddedFirst_brokerRefused_namingTheProgram() throws {
        let fixture = try BrokerFixture()
        fixture.stop()
        // As a vault no broker ever served: no claim file beside it.
        unlink(BrokerClaim.lockPath(forVault: fixture.vaultPath))
        let environment = Self.embeddedEnvironment(fixture)
        let lockbox = builtProduct("lockbox")
        let unlocked = try run(
            lockbox, ["unlock", "--passphrase-stdin"], input: Array((BrokerFixture.passphraseText + "\n").utf8), environment: environment)
        #expect(unlocked.status == 0, "\(unlocked.standardError)")
        defer { _ = try? run(lockbox, ["lock"], environment: environment) }

        // A second process: `lockbox add` opens the vault, then waits for the secret on stdin.
        ignoreBrokenPipes()
        let writer = Process()
        writer.executableURL = URL(fileURLWithPath: lockbox)
        writer.arguments = ["add-generic-password", "-s", "claim", "-a", "alice"]
        writer.environment = environment
        let input = Pipe()
        let errors = Pipe()
        writer.standardInput = input
        writer.standardOutput = FileHandle.nullDevice
        writer.standardError = errors
        try writer.run()
        defer { if writer.isRunning { kill(writer.processIdentifier, SIGKILL) } }
        var held = false
        for _ in 0..<1000 where !held {
            held = Self.claimIsHeld(fixture)
            if !held { usleep(10_000) }
        }
        #expect(held, "the embedded program holds no claim on the vault")

        // The broker is refused, naming the program and what to do.
        let refused = try run(fixture.brokerd, ["--socket", fixture.socketPath, "--keychain", fixture.vaultPath], timeout: 30)
        #expect(refused.status == 1)
        #expect(refused.standardError.contains("opened it directly (embedded mode)"), "\(refused.standardError)")
        #expect(refused.standardError.contains("pid \(writer.processIdentifier) (lockbox)"), "\(refused.standardError)")
        #expect(refused.standardError.contains("(OSStatus -25291)"), "\(refused.standardError)")
        #expect(!BrokerStore.isRunning(socketPath: fixture.socketPath))

        // The program finishes its write, alone.
        let canary = makeCanary("claim")
        try input.fileHandleForWriting.write(contentsOf: Data((canary + "\n").utf8))
        try input.fileHandleForWriting.close()
        writer.waitUntilExit()
        let writerErrors = String(decoding: errors.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self)
        #expect(writer.terminationStatus == 0, "\(writerErrors)")

        // Once it let go, the broker starts (without walls, so that this test process reads
        // the program's group), and serves what the program wrote.
        try fixture.start(access: "user")
        let store = try fixture.store()
        try store.unlock(passphrase: SecretBytes(utf8: BrokerFixture.passphraseText))
        #expect(try store.data(matching: .genericPassword(service: "claim", account: "alice")) == SecretBytes(utf8: canary))
        // The embedded unlock's keys leave the kernel keyring once the broker let go of the file.
        fixture.stop()
        let locked = try run(lockbox, ["lock"], environment: environment)
        #expect(locked.status == 0, "\(locked.standardError)")
    }

    @Test("lockboxd takes the keys an embedded unlock left in the kernel keyring out as it claims the vault: a copy of the file opens locked")
    func brokerStart_takesTheKernelKeyringKeysOut() throws {
        let fixture = try BrokerFixture()
        fixture.stop()
        let lockbox = builtProduct("lockbox")
        var environment = Self.embeddedEnvironment(fixture)
        let canary = makeCanary("keyring")
        let unlocked = try run(
            lockbox, ["unlock", "--passphrase-stdin"], input: Array((BrokerFixture.passphraseText + "\n").utf8), environment: environment)
        #expect(unlocked.status == 0, "\(unlocked.standardError)")
        defer { _ = try? run(lockbox, ["lock", "--all"], environment: environment) }
        #expect(try run(lockbox, ["add-generic-password", "-s", "copy", "-a", "a"], input: Array((canary + "\n").utf8), environment: environment).status == 0)
        let copies = TemporaryDirectory("lockbox-broker-copy")
        func readCopy() throws -> ProcessResult {
            for suffix in ["", "-wal"] {
                unlink(copies.file("copy.lockbox") + suffix)
                if FileManager.default.fileExists(atPath: fixture.vaultPath + suffix) {
                    try FileManager.default.copyItem(atPath: fixture.vaultPath + suffix, toPath: copies.file("copy.lockbox") + suffix)
                }
            }
            unlink(copies.file("copy.lockbox-shm"))
            var copyEnvironment = environment
            copyEnvironment["LOCKBOX_KEYCHAIN"] = copies.file("copy.lockbox")
            return try run(lockbox, ["find-generic-password", "-s", "copy", "-a", "a", "-w"], environment: copyEnvironment)
        }
        // Before a broker: the keys the unlock left open a copy (the embedded design).
        let before = try readCopy()
        #expect(before.status == 0 && before.standardOutput.contains(canary), "\(before.standardError)")
        // The broker claims the vault: its keys are its own from then on.
        try fixture.start(access: "user")
        let after = try readCopy()
        #expect(after.status != 0 && !after.standardOutput.contains(canary), "a copy opened with the keyring's keys while the broker served")
        #expect(after.standardError.contains("-25308"), "\(after.standardError)")
        environment["LOCKBOX_KEYCHAIN"] = fixture.vaultPath
    }

    @Test("the claim file removed while lockboxd serves: the next request is refused, saying why, and the broker stops")
    func claimFileRemoved_brokerStops() throws {
        let fixture = try BrokerFixture()
        let store = try fixture.store()
        try store.unlock(passphrase: SecretBytes(utf8: BrokerFixture.passphraseText))
        let broker = fixture.process
        #expect(unlink(BrokerClaim.lockPath(forVault: fixture.vaultPath)) == 0)
        let refused = #expect(throws: LockboxError.self) { _ = try store.status() }
        #expect(refused?.message.contains("was removed or replaced: lockboxd stops") == true, "\(refused?.message ?? "")")
        for _ in 0..<500 where kill(broker, 0) == 0 { usleep(10_000) }
        #expect(kill(broker, 0) != 0, "lockboxd still runs without its claim")
        #expect(!BrokerStore.isRunning(socketPath: fixture.socketPath))
    }

    @Test("while lockboxd serves the vault, another process opening it directly is refused, naming the broker")
    func brokerFirst_embeddedProgramRefused_namingTheBroker() throws {
        let fixture = try BrokerFixture()
        let broker = try fixture.brokerProcess()
        let environment = Self.embeddedEnvironment(fixture)
        let lockbox = builtProduct("lockbox")
        let refused = try run(
            lockbox, ["add-generic-password", "-s", "claim", "-a", "bob"], input: Array("value\n".utf8), environment: environment)
        #expect(refused.status == 1)
        #expect(
            refused.standardError.contains("lockboxd serves the keychain \(fixture.vaultPath) (held by pid \(broker) (lockboxd))"),
            "\(refused.standardError)")
        #expect(refused.standardError.contains("LOCKBOX_BROKER=1"), "\(refused.standardError)")
        #expect(refused.standardError.contains("(OSStatus -25291)"), "\(refused.standardError)")
        // Reading is refused as well: the keys are the broker's.
        let read = try run(lockbox, ["find-generic-password", "-s", "claim", "-a", "bob"], environment: environment)
        #expect(read.status == 1, "\(read.standardError)")
        #expect(read.standardError.contains("serves the keychain"), "\(read.standardError)")
        // Through the broker, the same program works.
        let store = try fixture.store()
        try store.unlock(passphrase: SecretBytes(utf8: BrokerFixture.passphraseText))
        var brokered = fixture.clientEnvironment
        brokered["LOCKBOX_UNLOCK_CACHE"] = nil
        let added = try run(lockbox, ["add-generic-password", "-s", "claim", "-a", "bob"], input: Array("value\n".utf8), environment: brokered)
        #expect(added.status == 0, "\(added.standardError)")
        // Once the broker is stopped, the program opens the file itself.
        fixture.stop()
        let direct = try run(
            lockbox, ["unlock", "--passphrase-stdin"], input: Array((BrokerFixture.passphraseText + "\n").utf8), environment: environment)
        #expect(direct.status == 0, "\(direct.standardError)")
        let locked = try run(lockbox, ["lock"], environment: environment)
        #expect(locked.status == 0, "\(locked.standardError)")
    }
}
