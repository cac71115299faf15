import Foundation
import LockboxCore
import SecretService
import Testing

/// Locked, absent and silent Secret Services: each is its own clear error, in bounded time.
@Suite("SecretServiceStore: locked, missing and hung services")
struct FailureModeTests {
    @Test func lockedCollection_throwsInteractionNotAllowed_neverItemNotFound() throws {
        _ = try TestBus.address()
        let password = TestBus.unique("collection-password")
        let label = TestBus.unique("Locked")
        let created = try runProcess(Paths.secretServiceScript, ["create-collection", label, password])
        try #require(created.status == 0, "create-collection failed: \(created.stderr)")
        let path = created.stdout.trimmingCharacters(in: .whitespacesAndNewlines)
        let store = try TestBus.store(collection: path)
        let service = TestBus.unique("locked")
        let canary = TestBus.canary()
        try store.add(.genericPassword(service: service, account: "alice", data: SecretBytes(utf8: canary)))

        let locked = try runProcess(Paths.secretServiceScript, ["lock", path])
        try #require(locked.status == 0, "lock failed: \(locked.stderr)")

        let started = Date()
        let readError = expectError(.interactionNotAllowed) {
            try store.data(matching: .genericPassword(service: service, account: "alice"))
        }
        #expect(readError?.message.contains("locked") == true)
        // Even a query that would match nothing is "locked", not "not found".
        expectError(.interactionNotAllowed) {
            try store.items(matching: .genericPassword(service: TestBus.unique("absent")))
        }
        expectError(.interactionNotAllowed) {
            try store.add(.genericPassword(service: service, account: "bob", data: SecretBytes(utf8: canary)))
        }
        expectError(.interactionNotAllowed) { try store.delete(matching: .genericPassword(service: service)) }
        #expect(Date().timeIntervalSince(started) < 5, "a locked collection must answer at once, without a prompt")
        #expect(readError.map { "\($0)".contains(canary) } == false)

        let unlocked = try runProcess(Paths.secretServiceScript, ["unlock", path, password])
        try #require(unlocked.status == 0, "unlock failed: \(unlocked.stderr)")
        #expect(try store.data(matching: .genericPassword(service: service, account: "alice")).utf8String == canary)
    }

    @Test func noSessionBus_throwsNotAvailableAtOnce_sayingSo() {
        let store = SecretServiceStore(configuration: .init(busAddress: nil, timeout: .seconds(2)))
        let started = Date()
        let error = expectError(.notAvailable) { try store.items(matching: .genericPassword(service: "s")) }
        #expect(error?.message.contains("No D-Bus session bus") == true)
        #expect(Date().timeIntervalSince(started) < 1)
        #expect(SecretServiceStore.Configuration.sessionBusAddress(environment: ["XDG_RUNTIME_DIR": "/nonexistent"]) == nil)
        #expect(
            SecretServiceStore.Configuration.sessionBusAddress(environment: ["DBUS_SESSION_BUS_ADDRESS": "unix:path=/x"])
                == "unix:path=/x")
    }

    @Test func helperWithoutSessionBus_exitsWithTheNoBusMessage() throws {
        let helper = try Paths.product("docker-credential-lockbox")
        let output = try runProcess(
            helper, ["list"],
            environment: helperEnvironment(["DBUS_SESSION_BUS_ADDRESS": nil, "XDG_RUNTIME_DIR": "/nonexistent"]),
            timeout: 10)
        #expect(output.status == 1)
        #expect(output.stdout.contains("No D-Bus session bus"))
        #expect(output.stdout.contains("-25291"))
    }

    @Test func helperWithBusAddressOfMissingSocket_exitsWithTheNoBusMessage() throws {
        let helper = try Paths.product("docker-credential-lockbox")
        let output = try runProcess(
            helper, ["list"],
            environment: helperEnvironment(["DBUS_SESSION_BUS_ADDRESS": "unix:path=/nonexistent/lockbox-bus"]),
            timeout: 10)
        #expect(output.status == 1)
        #expect(output.stdout.contains("No D-Bus session bus at unix:path=/nonexistent/lockbox-bus"), "\(output.combined)")
    }

    @Test func busThatNeverAnswers_failsWithinTheTimeout() throws {
        let helper = try Paths.product("git-credential-lockbox")
        let silent = try SilentSocket()
        let started = Date()
        let output = try runProcess(
            helper, ["get"], input: Array("protocol=https\nhost=example.com\n\n".utf8),
            environment: helperEnvironment(["DBUS_SESSION_BUS_ADDRESS": "unix:path=\(silent.path)"]), timeout: 30)
        let elapsed = Date().timeIntervalSince(started)
        #expect(output.status == 1)
        #expect(output.stderr.contains("did not answer within 5 s"), "\(output.combined)")
        #expect(elapsed < 12, "the helper must give up after its 5 s timeout, took \(elapsed) s")
        #expect(output.stdout.isEmpty)
    }
}

/// A Unix socket that takes connections (the kernel completes them from the backlog) and
/// never says a word: a hung D-Bus daemon.
final class SilentSocket {
    let path: String
    private let descriptor: Int32

    init() throws {
        path = NSTemporaryDirectory() + "lockbox-silent-\(UUID().uuidString.prefix(8)).sock"
        descriptor = socket(AF_UNIX, Int32(SOCK_STREAM.rawValue), 0)
        try #require(descriptor >= 0, "socket() failed")
        var address = sockaddr_un()
        address.sun_family = sa_family_t(AF_UNIX)
        let bytes = Array(path.utf8)
        try #require(bytes.count < MemoryLayout.size(ofValue: address.sun_path), "socket path too long")
        withUnsafeMutableBytes(of: &address.sun_path) { buffer in
            buffer.copyBytes(from: bytes)
            buffer[bytes.count] = 0
        }
        let bound = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                bind(descriptor, $0, socklen_t(MemoryLayout<sockaddr_un>.size))
            }
        }
        try #require(bound == 0, "bind(\(path)) failed: errno \(errno)")
        try #require(listen(descriptor, 16) == 0, "listen failed")
    }

    deinit {
        close(descriptor)
        unlink(path)
    }
}
