import Foundation
#if canImport(FoundationNetworking)
import FoundationNetworking
#endif
import Glibc
import Lockbox
import LockboxAuth
import LockboxTestSupport
import Synchronization
import Testing

/// Why a test that needs a peer could not run. Thrown, so the test fails with this message.
struct MissingPeer: Error, CustomStringConvertible {
    let description: String
}

/// The test OAuth server started by `scripts/oauth-server start`.
struct TestServer: Sendable {
    static let clientID = "lockbox-cli"
    static let stateDirectory = ProcessInfo.processInfo.environment["LOCKBOX_OAUTH_STATE"] ?? "/tmp/lockbox-oauth-server"

    let url: URL

    /// The running server, or a failure naming what is missing.
    static func running() async throws -> TestServer {
        let text: String
        if let fromEnvironment = ProcessInfo.processInfo.environment["LOCKBOX_TEST_OAUTH_URL"], !fromEnvironment.isEmpty {
            text = fromEnvironment
        } else if let fromFile = try? String(contentsOfFile: stateDirectory + "/url", encoding: .utf8) {
            text = fromFile
        } else {
            throw MissingPeer(
                description: "The test OAuth server is not running: no LOCKBOX_TEST_OAUTH_URL and no \(stateDirectory)/url. "
                    + "Start it with `scripts/oauth-server start`.")
        }
        guard let url = URL(string: text.trimmingCharacters(in: .whitespacesAndNewlines)) else {
            throw MissingPeer(description: "The test OAuth server URL is malformed: \(text)")
        }
        let server = TestServer(url: url)
        do {
            _ = try await server.admin("GET", "health")
        } catch {
            throw MissingPeer(
                description: "The test OAuth server at \(url) does not answer (\(error)). "
                    + "Start it with `scripts/oauth-server start` (it also trusts its test CA).")
        }
        try await server.admin("POST", "test/reset")
        return server
    }

    /// The URL of the listener whose certificate comes from an untrusted CA.
    static func rogueURL() throws -> URL {
        guard let text = try? String(contentsOfFile: stateDirectory + "/rogue-url", encoding: .utf8),
            let url = URL(string: text.trimmingCharacters(in: .whitespacesAndNewlines))
        else {
            throw MissingPeer(description: "No \(stateDirectory)/rogue-url: start the server with `scripts/oauth-server start`.")
        }
        return url
    }

    @discardableResult
    func admin(_ method: String, _ path: String, _ body: [String: Any]? = nil) async throws -> Any {
        var request = URLRequest(url: url.appendingPathComponent(path))
        request.httpMethod = method
        if let body {
            request.httpBody = try JSONSerialization.data(withJSONObject: body)
            request.setValue("application/json", forHTTPHeaderField: "Content-Type")
        }
        let (data, response) = try await URLSession.shared.data(for: request)
        guard let http = response as? HTTPURLResponse, http.statusCode == 200 else {
            throw MissingPeer(description: "The test server refused \(method) \(path)")
        }
        return try JSONSerialization.jsonObject(with: data)
    }

    func faults(_ faults: [String: Any]) async throws {
        try await admin("POST", "test/faults", faults)
    }

    func counters() async throws -> [String: Int] {
        try await admin("GET", "test/counters") as? [String: Int] ?? [:]
    }

    func log() async throws -> [[String: Any]] {
        try await admin("GET", "test/log") as? [[String: Any]] ?? []
    }

    func logEvents() async throws -> [String] {
        try await log().compactMap { $0["event"] as? String }
    }

    func configuration(clientID: String = TestServer.clientID, scope: [String] = ["api"]) async throws -> ClientConfiguration {
        try await ClientConfiguration.discover(issuer: url, clientID: clientID, scope: scope)
    }

    func api(_ path: String, method: String = "GET") -> URLRequest {
        var request = URLRequest(url: url.appendingPathComponent(path))
        request.httpMethod = method
        return request
    }

    /// Signs in through the authorization code flow, playing the browser: the test server
    /// approves at once and redirects to the loopback listener.
    func signIn(_ manager: CredentialsManager) async throws -> TokenResponse {
        let session = try AuthorizationCodeFlow(configuration: manager.configuration).start()
        async let browser: Void = {
            _ = try? await URLSession.shared.data(from: session.authorizationURL)
        }()
        let tokens = try await session.waitForTokens(timeout: .seconds(20))
        await browser
        try await manager.signIn(with: tokens)
        return tokens
    }
}

/// The real vault, in a fresh private directory, with fast key derivation; its keys are
/// forgotten when the test ends.
struct TestVault {
    let fixture: VaultFixture

    init() throws {
        fixture = try VaultFixture()
    }

    var vault: Vault { fixture.vault }
    var directory: TemporaryDirectory { fixture.directory }
    static let passphrase = SecretBytes(utf8: VaultFixture.passphraseText)

    var lockDirectory: String { vault.path + ".oauth-locks" }

    func tokenStore(for configuration: ClientConfiguration, accessibility: Accessibility = .afterFirstUnlockThisDeviceOnly) -> ItemStoreTokenStore {
        ItemStoreTokenStore(store: vault, key: CredentialKey(configuration: configuration), accessibility: accessibility, configuration: configuration)
    }

    func manager(
        _ configuration: ClientConfiguration, events: EventRecorder = EventRecorder(),
        accessibility: Accessibility = .afterFirstUnlockThisDeviceOnly, transport: any HTTPTransport = URLSessionTransport(),
        clock: ShiftedClock = ShiftedClock()
    ) -> CredentialsManager {
        CredentialsManager(
            configuration: configuration, tokenStore: tokenStore(for: configuration, accessibility: accessibility),
            transport: transport, lockDirectory: lockDirectory,
            outbox: RevocationOutbox(store: vault, transport: transport, events: events.record),
            now: clock.now, events: events.record)
    }
}

/// The real transport, noting each request as it starts, so a test can wait for "the refresh
/// has reached the server" instead of sleeping and hoping it has.
final class ObservedTransport: HTTPTransport {
    private let inner = URLSessionTransport()
    private let started = Mutex<[String]>([])

    func send(_ request: URLRequest) async throws -> (Data, HTTPURLResponse) {
        note(request)
        return try await inner.send(request)
    }

    func send(_ request: URLRequest, options: HTTPRequestOptions) async throws -> (Data, HTTPURLResponse) {
        note(request)
        return try await inner.send(request, options: options)
    }

    private func note(_ request: URLRequest) {
        started.withLock { $0.append(request.url?.path ?? "") }
    }

    /// How many requests to a path ending in `suffix` have started.
    func requestsStarted(toPathEnding suffix: String) -> Int {
        started.withLock { $0.filter { $0.hasSuffix(suffix) }.count }
    }

    /// Waits until one more request to `suffix` than `count` has started.
    func waitForRequest(toPathEnding suffix: String, after count: Int) async throws -> Bool {
        try await eventually { requestsStarted(toPathEnding: suffix) > count }
    }
}

/// The manager's idea of the time: the real time plus an offset the test moves forward, so a
/// token expires without waiting (the server keeps the real time).
final class ShiftedClock: Sendable {
    private let offset = Mutex<TimeInterval>(0)

    var now: @Sendable () -> Date { { [self] in Date().addingTimeInterval(offset.withLock { $0 }) } }

    func advance(by duration: Duration) {
        let (seconds, attoseconds) = duration.components
        offset.withLock { $0 += Double(seconds) + Double(attoseconds) / 1e18 }
    }
}

/// Collects events for assertions.
final class EventRecorder: Sendable {
    private let storage = Mutex<[AuthEvent]>([])

    var record: @Sendable (AuthEvent) -> Void {
        { event in self.storage.withLock { $0.append(event) } }
    }

    var events: [AuthEvent] { storage.withLock { $0 } }

    func count(_ kind: AuthEvent.Kind) -> Int {
        events.filter { $0.kind == kind }.count
    }
}

/// Runs the helper executable built next to the test bundle.
struct Worker {
    static var executable: String { builtProduct("lockbox-auth-worker") }

    static func launch(vault: TestVault, server: TestServer, _ arguments: [String]) throws -> Process {
        let path = executable
        guard FileManager.default.isExecutableFile(atPath: path) else {
            throw MissingPeer(description: "lockbox-auth-worker is not built next to the tests: run `swift build --build-tests` first.")
        }
        let process = Process()
        process.executableURL = URL(fileURLWithPath: path)
        process.arguments = ["--vault", vault.vault.path, "--issuer", server.url.absoluteString, "--client-id", TestServer.clientID] + arguments
        process.standardOutput = Pipe()
        // Events go to a file: a pipe nobody reads could fill up and stall the worker.
        let log = vault.directory.path + "/worker-\(UUID().uuidString).log"
        _ = FileManager.default.createFile(atPath: log, contents: nil)
        process.standardError = FileHandle(forWritingAtPath: log)
        process.environment = ProcessInfo.processInfo.environment.merging(["LOCKBOX_WORKER_LOG": log]) { $1 }
        try process.run()
        return process
    }

    /// Runs to completion and returns the JSON line it printed.
    static func run(vault: TestVault, server: TestServer, _ arguments: [String]) async throws -> [String: Any] {
        let process = try launch(vault: vault, server: server, arguments)
        return try await output(of: process)
    }

    static func output(of process: Process) async throws -> [String: Any] {
        let pipe = process.standardOutput as! Pipe
        let data: Data = await withCheckedContinuation { continuation in
            DispatchQueue.global().async {
                let data = pipe.fileHandleForReading.readDataToEndOfFile()
                process.waitUntilExit()
                continuation.resume(returning: data)
            }
        }
        let line = String(decoding: data, as: UTF8.self).trimmingCharacters(in: .whitespacesAndNewlines)
        var result = (try? JSONSerialization.jsonObject(with: Data(line.utf8))) as? [String: Any] ?? ["outcome": "no_output", "raw": line]
        if let log = process.environment?["LOCKBOX_WORKER_LOG"] {
            result["events"] = (try? String(contentsOfFile: log, encoding: .utf8)) ?? ""
        }
        return result
    }
}

/// Polls `condition` until it holds or `timeout` passes.
func eventually(timeout: Duration = .seconds(10), _ condition: () async throws -> Bool) async throws -> Bool {
    let deadline = ContinuousClock.now + timeout
    while ContinuousClock.now < deadline {
        if try await condition() { return true }
        try await Task.sleep(for: .milliseconds(50))
    }
    return false
}

/// Long enough that every `credentials(minTTL:)` call refreshes.
let forceRefresh = Duration.seconds(86_400 * 365)

func isSignedIn(_ state: CredentialsState) -> Bool {
    if case .signedIn = state { return true }
    return false
}

/// Every regular file below `directory`.
func regularFiles(in directory: TemporaryDirectory) -> [String] {
    guard let enumerator = FileManager.default.enumerator(atPath: directory.path) else { return [] }
    return enumerator.compactMap { $0 as? String }.map { directory.file($0) }.filter { file in
        var isDirectory: ObjCBool = false
        return FileManager.default.fileExists(atPath: file, isDirectory: &isDirectory) && !isDirectory.boolValue
    }
}

/// Whether `error` is an ``AuthError`` with `code` and, when given, the sign-out reason, OAuth
/// error and HTTP status: tests match codes, never message text.
func isAuthError(
    _ error: any Error, _ code: AuthError.Code, reason: SignOutReason? = nil, oauthError: String? = nil, status: Int? = nil
) -> Bool {
    guard let error = error as? AuthError, error.code == code else { return false }
    if let reason, error.signOutReason != reason { return false }
    if let oauthError, error.oauthError != oauthError { return false }
    if let status, error.httpStatus != status { return false }
    return true
}

/// A `lockbox login` started with `arguments` and read until it says it waits for a person
/// ("Ctrl-C cancels"), or until its standard error closes.
struct WaitingLogin {
    let process = Process()
    let errors = Pipe()
    /// What it wrote to standard error so far.
    var said = ""

    init(_ arguments: [String], environment: [String: String]? = nil) throws {
        // Its signals at their default action, as a terminal's session has them: the test runner
        // may have been started with some ignored (under su, say), which the child would keep.
        process.executableURL = URL(fileURLWithPath: "/usr/bin/env")
        process.arguments = ["--default-signal=INT,TERM,HUP", builtProduct("lockbox")] + arguments
        if let environment { process.environment = environment }
        process.standardError = errors
        process.standardOutput = Pipe()
        try process.run()
        while !said.contains("Ctrl-C cancels") {
            let chunk = errors.fileHandleForReading.availableData
            if chunk.isEmpty { break }
            said += String(decoding: chunk, as: UTF8.self)
        }
    }

    /// Sends `signal`, waits for the exit, and returns everything it wrote to standard error.
    mutating func stop(with signal: Int32) -> String {
        kill(process.processIdentifier, signal)
        process.waitUntilExit()
        said += String(decoding: errors.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self)
        return said
    }
}
