import Foundation
import Lockbox
import LockboxTestSupport
import Synchronization
import Testing

@testable import LockboxBroker

/// `lockbox broker status` and `lockbox broker stop` against a real `lockboxd`.
@Suite("lockbox broker status and stop")
struct BrokerStopTests {
    @Test("stop during writes loses no acknowledged write; status says running, then not running; stop with none says so")
    func stop_duringWrites_losesNoAcknowledgedWrite() throws {
        let fixture = try BrokerFixture()
        let store = try fixture.store()
        try store.unlock(passphrase: SecretBytes(utf8: BrokerFixture.passphraseText))
        let pid = try fixture.brokerProcess()
        let lockbox = builtProduct("lockbox")
        var environment = fixture.clientEnvironment
        environment["LOCKBOX_BROKER"] = nil

        let shown = try run(lockbox, ["broker", "status"], environment: environment)
        #expect(shown.status == 0, "\(shown.standardError)")
        #expect(shown.standardOutput.contains("lockboxd: running, pid \(pid)"), "\(shown.standardOutput)")
        #expect(shown.standardOutput.contains("keychain: \(fixture.vaultPath)"), "\(shown.standardOutput)")
        #expect(shown.standardOutput.contains("state: unlocked"), "\(shown.standardOutput)")

        // A program that is not the lockbox command may not stop it.
        #expect(status { try store.stop() } == -34018)
        #expect(BrokerStore.isAlive(pid), "the broker stopped for a program that may not stop it")

        // Writes from another connection while the stop comes.
        let acknowledged = Mutex<[String]>([])
        let finished = Atomic<Bool>(false)
        let writer = try fixture.store()
        let thread = Thread {
            for index in 0..<5000 {
                let account = "a\(index)"
                do {
                    try writer.add(.genericPassword(service: "stop", account: account, data: SecretBytes(utf8: "v\(index)")))
                    acknowledged.withLock { $0.append(account) }
                } catch {
                    break
                }
            }
            finished.store(true, ordering: .sequentiallyConsistent)
        }
        thread.start()
        while acknowledged.withLock({ $0.count }) < 50 && !finished.load(ordering: .sequentiallyConsistent) { usleep(1000) }
        let stopped = try run(lockbox, ["broker", "stop"], environment: environment, timeout: 120)
        #expect(stopped.status == 0, "\(stopped.standardError)")
        #expect(stopped.standardError.contains("Stopped lockboxd (pid \(pid))"), "\(stopped.standardError)")
        #expect(!BrokerStore.isAlive(pid), "lockboxd still runs")
        #expect(!FileManager.default.fileExists(atPath: fixture.socketPath), "the socket was left behind")
        while !finished.load(ordering: .sequentiallyConsistent) { usleep(1000) }
        let written = acknowledged.withLock { $0 }
        #expect(written.count >= 50)
        #expect(written.count < 5000, "the writes all ended before the stop: nothing was checked")

        // Every acknowledged write is in the file, opened directly now that the broker is gone.
        var configuration = Vault.Configuration()
        configuration.unlockCache = .processMemory
        let vault = try Vault.open(at: fixture.vaultPath, configuration: configuration)
        try vault.unlock(passphrase: SecretBytes(utf8: BrokerFixture.passphraseText))
        let stored = Set(try vault.items(matching: Query(.genericPassword, attributes: {
            var attributes = ItemAttributes()
            attributes.service = "stop"
            return attributes
        }(), limit: .all, returning: [.attributes])).compactMap(\.attributes.account))
        let lost = written.filter { !stored.contains($0) }
        #expect(lost.isEmpty, "acknowledged but lost: \(lost.prefix(10))")
        withExtendedLifetime(vault) {}

        // None runs now: status says so and exits 1; stop says there is nothing to stop.
        let none = try run(lockbox, ["broker", "status"], environment: environment)
        #expect(none.status == 1)
        #expect(none.standardOutput.contains("lockboxd: not running"), "\(none.standardOutput)")
        let nothing = try run(lockbox, ["broker", "stop"], environment: environment)
        #expect(nothing.status == 1)
        #expect(nothing.standardError.contains("No lockboxd runs, so there is nothing to stop"), "\(nothing.standardError)")
        #expect(nothing.standardError.contains("(OSStatus -25291)"), "\(nothing.standardError)")
    }

    @Test("stop refuses a broker socket another user listens on, and leaves that process running")
    func stop_otherUsersBroker_isRefused() throws {
        guard getuid() == 0 else {
            // Only root can listen as another user on a socket of its own; the check is the same code.
            #expect(getuid() != 0)
            return
        }
        let directory = TemporaryDirectory("lbx-other")
        let runDirectory = directory.file("run")
        mkdir(runDirectory, 0o700)
        let socketPath = runDirectory + "/lockboxd.sock"
        // Bound by this user (so the file is ours, 0600), listened on by uid 65534.
        let script = """
            import os, socket, sys, time
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.bind(sys.argv[1]); os.chmod(sys.argv[1], 0o600)
            os.setgid(65534); os.setuid(65534)
            s.listen(4)
            print("listening", flush=True)
            while True:
                c, _ = s.accept()
                time.sleep(0.1)
                c.close()
            """
        let listener = Process()
        listener.executableURL = URL(fileURLWithPath: "/usr/bin/python3")
        listener.arguments = ["-c", script, socketPath]
        let output = Pipe()
        listener.standardOutput = output
        try listener.run()
        // SIGKILL: the test runner's children inherit its blocked signals.
        defer { kill(listener.processIdentifier, SIGKILL) }
        _ = output.fileHandleForReading.availableData
        var environment = ProcessInfo.processInfo.environment
        environment["LOCKBOX_BROKER_SOCKET"] = socketPath
        let refused = try run(builtProduct("lockbox"), ["broker", "stop"], environment: environment, timeout: 60)
        #expect(refused.status == 1)
        #expect(refused.standardError.contains("runs as uid 65534, not as you"), "\(refused.standardError)")
        #expect(listener.isRunning, "the other user's process was stopped")
    }
}
