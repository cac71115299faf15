import Foundation
import Lockbox
import LockboxTestSupport
import Testing

@testable import LockboxBroker

/// A vault made without ever touching the kernel keyring, served by a real `lockboxd` (the
/// built product) on a socket of its own; the broker is stopped when the fixture goes away.
final class BrokerFixture: @unchecked Sendable {
    static let passphraseText = "correct horse battery staple"
    let directory = TemporaryDirectory("lbx-broker")
    let vaultPath: String
    let socketPath: String
    let brokerd = builtProduct("lockboxd")
    /// The vault's identity, which would name its kernel-keyring entries.
    let vaultIdentifier: String

    init(access: String = "executable") throws {
        vaultPath = directory.file("keychains/test.lockbox")
        socketPath = directory.file("run/lockboxd.sock")
        var configuration = Vault.Configuration()
        configuration.keyDerivation = .interactive
        configuration.unlockCache = .processMemory
        vaultIdentifier = try Vault.create(at: vaultPath, passphrase: SecretBytes(utf8: Self.passphraseText), configuration: configuration)
            .identifier
        try start(access: access)
    }

    /// Starts `lockboxd --detach`, which returns once the broker listens.
    /// With `configurationHome`, the broker reads its policy from `configurationHome/lockbox/`.
    func start(access: String = "executable", configurationHome: String? = nil) throws {
        var environment = ProcessInfo.processInfo.environment
        if let configurationHome { environment["XDG_CONFIG_HOME"] = configurationHome }
        let started = try run(
            brokerd, ["--detach", "--socket", socketPath, "--keychain", vaultPath, "--access", access], environment: environment,
            timeout: 60)
        #expect(started.status == 0, "lockboxd did not start: \(started.standardError)")
        process = try brokerProcess()
    }

    /// The running broker's process id, as it was started.
    private(set) var process: Int32 = 0

    /// A client store on the fixture's socket, not starting a broker on its own.
    func store(startOnDemand: Bool = false) throws -> BrokerStore {
        try BrokerStore.connect(socketPath: socketPath, vaultPath: vaultPath, startOnDemand: startOnDemand)
    }

    /// The broker's process id, asked of the broker.
    func brokerProcess() throws -> Int32 {
        try store().brokerProcessIdentifier
    }

    /// The environment for a child process that goes through this broker.
    var clientEnvironment: [String: String] {
        var environment = ProcessInfo.processInfo.environment
        environment["LOCKBOX_BROKER"] = "1"
        environment["LOCKBOX_BROKER_SOCKET"] = socketPath
        environment["LOCKBOX_KEYCHAIN"] = vaultPath
        environment["LOCKBOX_BROKERD"] = brokerd
        return environment
    }

    /// Sends `signal` to the broker and waits until it is gone.
    func stop(signal: Int32 = SIGTERM) {
        let pid = process
        guard pid > 0 else { return }
        process = 0
        kill(pid, signal)
        for _ in 0..<500 where kill(pid, 0) == 0 { usleep(10_000) }
    }

    /// A copy of the `lockbox` command at its own path: to the broker, another application.
    func application(_ name: String) throws -> String {
        let directory = self.directory.file("apps/" + name)
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        let path = directory + "/" + name
        try FileManager.default.copyItem(atPath: builtProduct("lockbox"), toPath: path)
        return path
    }

    deinit { stop() }
}
