import Foundation
import LockboxCore
import LockboxTestSupport
import SecretService
import Testing

/// The private Secret Service the tests run against: `scripts/secret-service run -- ...`
/// starts it. Tests that need it and find none fail, naming what is missing.
enum TestBus {
    static let runHint = "run the tests inside `scripts/secret-service run -- swift test ...`"

    /// The session bus address, or a failure that says how to get one.
    static func address(sourceLocation: SourceLocation = #_sourceLocation) throws -> String {
        let address = ProcessInfo.processInfo.environment["DBUS_SESSION_BUS_ADDRESS"]
        return try #require(
            address.flatMap { $0.isEmpty ? nil : $0 },
            "No D-Bus session bus (DBUS_SESSION_BUS_ADDRESS is unset): \(runHint)",
            sourceLocation: sourceLocation)
    }

    /// A store on the test session's default collection (the unlocked login keyring).
    static func store(
        collection: String = "default", timeout: Duration = .seconds(5),
        sourceLocation: SourceLocation = #_sourceLocation
    ) throws -> SecretServiceStore {
        let address = try address(sourceLocation: sourceLocation)
        return SecretServiceStore(
            configuration: .init(busAddress: address, collection: collection, timeout: timeout))
    }

    /// A name no other test uses, so tests can share one keyring and run in parallel.
    static func unique(_ prefix: String) -> String {
        "\(prefix)-\(UUID().uuidString.prefix(8).lowercased())"
    }

    /// A secret that must never show up in any output or error text.
    static func canary() -> String {
        "canary-\(UUID().uuidString)"
    }
}

/// Paths of the repository and of the built products.
enum Paths {
    static let repositoryRoot: URL = URL(fileURLWithPath: #filePath)
        .deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()

    static var secretServiceScript: String { repositoryRoot.appendingPathComponent("scripts/secret-service").path }

    /// The directory of the test binary, where SwiftPM also puts the executables it built.
    static var products: URL {
        if let override = ProcessInfo.processInfo.environment["LOCKBOX_PRODUCTS_DIR"] {
            return URL(fileURLWithPath: override)
        }
        let executable = (try? FileManager.default.destinationOfSymbolicLink(atPath: "/proc/self/exe"))
            ?? CommandLine.arguments[0]
        var directory = URL(fileURLWithPath: executable).deletingLastPathComponent()
        // swift test may run an .xctest bundle's inner binary on some platforms.
        while directory.path.contains(".xctest") { directory.deleteLastPathComponent() }
        return directory
    }

    /// A built executable, or a failure saying how to build it.
    static func product(_ name: String, sourceLocation: SourceLocation = #_sourceLocation) throws -> String {
        let path = products.appendingPathComponent(name).path
        try #require(
            FileManager.default.isExecutableFile(atPath: path),
            "\(name) is not built at \(path): build with `swift build --build-tests` first",
            sourceLocation: sourceLocation)
        return path
    }

    /// An executable on PATH, or a failure naming the package that provides it.
    static func tool(_ name: String, package: String, sourceLocation: SourceLocation = #_sourceLocation) throws -> String {
        let path = ProcessInfo.processInfo.environment["PATH", default: "/usr/bin:/bin"]
            .split(separator: ":").map { "\($0)/\(name)" }
            .first { FileManager.default.isExecutableFile(atPath: $0) }
        return try #require(path, "\(name) not found on PATH: install \(package)", sourceLocation: sourceLocation)
    }
}

/// What a finished child process wrote and returned.
struct ProcessOutput {
    var status: Int32
    var standardOutput: [UInt8]
    var standardError: [UInt8]

    var stdout: String { String(decoding: standardOutput, as: UTF8.self) }
    var stderr: String { String(decoding: standardError, as: UTF8.self) }
    var combined: String { stdout + stderr }
}

/// Runs a real program to completion, feeding it `input`; kills it after `timeout`.
func runProcess(
    _ executable: String, _ arguments: [String], input: [UInt8] = [],
    environment: [String: String]? = nil, directory: String? = nil, timeout: TimeInterval = 60
) throws -> ProcessOutput {
    let result = try run(
        executable, arguments, input: input, environment: environment, directory: directory, timeout: timeout)
    return ProcessOutput(
        status: result.status, standardOutput: result.standardOutputBytes, standardError: result.standardErrorBytes)
}

extension SecretBytes {
    var utf8String: String { withUnsafeBytes { String(decoding: $0, as: UTF8.self) } }
}

/// The environment of this process with `changes` applied (nil removes a variable).
func environment(_ changes: [String: String?] = [:]) -> [String: String] {
    var result = ProcessInfo.processInfo.environment
    for (name, value) in changes { result[name] = value }
    return result
}

/// Expects `body` to throw a ``LockboxError`` with `code`; returns it for further checks.
@discardableResult
func expectError<Result>(
    _ code: LockboxError.Code, sourceLocation: SourceLocation = #_sourceLocation, _ body: () throws -> Result
) -> LockboxError? {
    do {
        _ = try body()
        Issue.record("expected \(code), but the call succeeded", sourceLocation: sourceLocation)
        return nil
    } catch let error as LockboxError {
        #expect(error.code == code, "\(error)", sourceLocation: sourceLocation)
        return error
    } catch {
        Issue.record("expected LockboxError \(code), got \(error)", sourceLocation: sourceLocation)
        return nil
    }
}

/// A collection of its own for one test, deleted afterwards: how a backend suite that
/// expects a fresh, empty store gets one from a shared gnome-keyring.
final class FreshCollection {
    let path: String
    let store: SecretServiceStore

    init(maximumValueSize: Int = 64 * 1024, sourceLocation: SourceLocation = #_sourceLocation) throws {
        let address = try TestBus.address(sourceLocation: sourceLocation)
        let created = try runProcess(
            Paths.secretServiceScript, ["create-collection", TestBus.unique("fresh"), TestBus.unique("password")])
        try #require(created.status == 0, "create-collection failed: \(created.stderr)", sourceLocation: sourceLocation)
        path = created.stdout.trimmingCharacters(in: .whitespacesAndNewlines)
        store = SecretServiceStore(
            configuration: .init(
                busAddress: address, collection: path, defaultAccessGroup: "default", maximumValueSize: maximumValueSize))
    }

    deinit {
        _ = try? runProcess(Paths.secretServiceScript, ["delete-collection", path])
    }
}

/// The environment for running the built helpers: this one, on the Secret Service backend.
func helperEnvironment(_ changes: [String: String?] = [:]) -> [String: String] {
    var changes = changes
    changes["LOCKBOX_BACKEND"] = "secret-service"
    return environment(changes)
}
