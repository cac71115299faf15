import Foundation
import Lockbox
import LockboxKeys
import LockboxSSHAgent
import LockboxTestSupport
import Testing

#if canImport(Glibc)
import Glibc
#endif

/// A vault with agent keys, and `lockbox-ssh-agent` serving it on a private socket.
final class AgentFixture: @unchecked Sendable {
    let vault: VaultFixture
    let keys: SoftwareKeyStore
    let directory = TemporaryDirectory("lockbox-agent")
    var socket: String { directory.file("run/lockbox/ssh-agent.sock") }
    private var agent: Process?
    let agentLog: String

    init() throws {
        vault = try VaultFixture()
        keys = SoftwareKeyStore(vault: vault.vault)
        agentLog = directory.file("agent.log")
        try FileManager.default.createDirectory(atPath: directory.file("run"), withIntermediateDirectories: true, attributes: [.posixPermissions: 0o700])
        try FileManager.default.createDirectory(atPath: directory.file("home"), withIntermediateDirectories: true, attributes: [.posixPermissions: 0o700])
    }

    /// Makes a key the agent offers.
    @discardableResult
    func generate(_ algorithm: KeyAlgorithm, comment: String, accessControl: AccessControl? = nil, purposes: KeyPurposes = [.sign, .verify])
        throws -> ManagedKey
    {
        var specification = KeySpecification(algorithm: algorithm, purposes: purposes)
        specification.applicationTag = ManagedKeySource.applicationTag
        specification.label = comment
        specification.accessControl = accessControl
        return try keys.generate(specification)
    }

    /// The environment of every program the tests run: a private HOME and runtime directory.
    func environment(_ extra: [String: String] = [:]) -> [String: String] {
        var environment = [
            "HOME": directory.file("home"), "XDG_RUNTIME_DIR": directory.file("run"), "PATH": ProcessInfo.processInfo.environment["PATH"] ?? "/usr/bin:/bin",
            "SSH_AUTH_SOCK": socket, "GIT_CONFIG_NOSYSTEM": "1",
        ]
        environment.merge(extra) { $1 }
        return environment
    }

    /// Starts the agent (through `lockbox ssh-agent` when `throughLockbox`), waits for its socket.
    func start(arguments: [String] = [], environment extra: [String: String] = [:], throughLockbox: Bool = false) throws {
        let process = Process()
        let binary = builtProduct(throughLockbox ? "lockbox" : "lockbox-ssh-agent")
        #expect(FileManager.default.isExecutableFile(atPath: binary), "\(binary) is not built")
        process.executableURL = URL(fileURLWithPath: binary)
        process.arguments = ["--keychain", vault.path] + (throughLockbox ? ["ssh-agent"] : []) + arguments
        // The agent opens the vault as this test process does (the same device key under
        // XDG_STATE_HOME or HOME); only its runtime directory is private.
        var agentEnvironment = ProcessInfo.processInfo.environment
        agentEnvironment["XDG_RUNTIME_DIR"] = directory.file("run")
        agentEnvironment.merge(extra) { $1 }
        process.environment = agentEnvironment
        _ = FileManager.default.createFile(atPath: agentLog, contents: nil)
        let log = try FileHandle(forWritingTo: URL(fileURLWithPath: agentLog))
        process.standardOutput = log
        process.standardError = log
        process.standardInput = FileHandle.nullDevice
        try process.run()
        agent = process
        for _ in 0..<200 {
            if FileManager.default.fileExists(atPath: socket), let connection = try? AgentClient(socket) {
                connection.close()
                return
            }
            guard process.isRunning else { break }
            usleep(25_000)
        }
        Issue.record("the agent did not start: \(self.log())")
        throw LockboxError(.io, "agent start")
    }

    func log() -> String {
        (try? String(contentsOfFile: agentLog, encoding: .utf8)) ?? ""
    }

    var isAgentRunning: Bool { agent?.isRunning ?? false }

    func stop() {
        guard let agent, agent.isRunning else { return }
        agent.terminate()
        agent.waitUntilExit()
    }

    /// Runs an OpenSSH or git program against the agent.
    func run(_ program: String, _ arguments: [String], input: String = "", environment extra: [String: String] = [:], directory: String? = nil)
        throws -> ProcessResult
    {
        let path = ["/usr/bin/\(program)", "/bin/\(program)"].first { FileManager.default.isExecutableFile(atPath: $0) }
        guard let path else {
            Issue.record("\(program) is not installed (Debian's openssh-client and git)")
            throw LockboxError(.notAvailable, program)
        }
        return try LockboxTestSupport.run(path, arguments, input: Array(input.utf8), environment: environment(extra), directory: directory, timeout: 60)
    }

    deinit {
        stop()
    }
}

/// A raw client of the agent socket, for sending what OpenSSH's tools never would.
///
/// It closes its socket once: a second `close` of the same number would close whatever another
/// thread of the test process opened meanwhile (a new keychain's SQLite file, say).
final class AgentClient {
    private(set) var descriptor: Int32

    init(_ path: String) throws {
        descriptor = socket(AF_UNIX, Int32(SOCK_STREAM.rawValue), 0)
        guard descriptor >= 0 else { throw LockboxError(.io, "socket") }
        var address = sockaddr_un()
        address.sun_family = sa_family_t(AF_UNIX)
        withUnsafeMutableBytes(of: &address.sun_path) { buffer in
            let bytes = Array(path.utf8)
            buffer.copyBytes(from: bytes)
            buffer[bytes.count] = 0
        }
        let connected = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(descriptor, $0, socklen_t(MemoryLayout<sockaddr_un>.size)) }
        }
        // The socket is closed by `deinit`, which runs after this throw too.
        guard connected == 0 else { throw LockboxError(.io, "connect") }
        var timeout = timeval(tv_sec: 20, tv_usec: 0)
        setsockopt(descriptor, SOL_SOCKET, SO_RCVTIMEO, &timeout, socklen_t(MemoryLayout<timeval>.size))
    }

    func send(_ bytes: [UInt8]) {
        _ = bytes.withUnsafeBytes { Glibc.send(descriptor, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
    }

    /// One reply body, nil when the agent closed the connection.
    func receive() -> [UInt8]? {
        guard let header = read(4) else { return nil }
        let length = Int(header[0]) << 24 | Int(header[1]) << 16 | Int(header[2]) << 8 | Int(header[3])
        return read(length)
    }

    /// Sends a body in a frame and reads the reply body.
    func request(_ body: [UInt8]) -> [UInt8]? {
        send(AgentReply.frame(body))
        return receive()
    }

    private func read(_ count: Int) -> [UInt8]? {
        var bytes = [UInt8](repeating: 0, count: count)
        var filled = 0
        while filled < count {
            let got = bytes.withUnsafeMutableBytes { Glibc.read(descriptor, $0.baseAddress! + filled, count - filled) }
            if got < 0 && errno == EINTR { continue }
            guard got > 0 else { return nil }
            filled += got
        }
        return bytes
    }

    func close() {
        guard descriptor >= 0 else { return }
        Glibc.close(descriptor)
        descriptor = -1
    }

    deinit {
        close()
    }
}

/// The private OpenSSH server scripts/sshd starts.
struct LocalSSHServer {
    let port: String
    let user: String
    let authorizedKeys: String

    static func running() throws -> LocalSSHServer {
        let state = ProcessInfo.processInfo.environment["LOCKBOX_SSHD_STATE"] ?? "/tmp/lockbox-sshd"
        guard let port = try? String(contentsOfFile: state + "/port", encoding: .utf8), let user = try? String(contentsOfFile: state + "/user", encoding: .utf8)
        else {
            Issue.record("no sshd is running for the tests: start it with scripts/sshd start (state in \(state))")
            throw LockboxError(.notAvailable, "sshd")
        }
        return LocalSSHServer(
            port: port.trimmingCharacters(in: .whitespacesAndNewlines), user: user.trimmingCharacters(in: .whitespacesAndNewlines),
            authorizedKeys: state + "/authorized_keys")
    }

    func authorize(_ line: String) throws {
        let handle = try FileHandle(forWritingTo: URL(fileURLWithPath: authorizedKeys))
        try handle.seekToEnd()
        try handle.write(contentsOf: Data((line + "\n").utf8))
        try handle.close()
    }

    func sshArguments(_ command: String) -> [String] {
        [
            "-F", "/dev/null", "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null",
            "-o", "IdentitiesOnly=no", "-o", "PasswordAuthentication=no", "-o", "LogLevel=ERROR", "-p", port, "\(user)@127.0.0.1", command,
        ]
    }
}
