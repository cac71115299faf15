import Foundation
import LockboxCore
import SecretService
import Testing

/// Generic passwords are shared both ways with the tools people already use.
@Suite("Secret Service interoperability: secret-tool and Python keyring")
struct InteroperabilityTests {
    @Test func lockboxItem_isFoundBySecretToolLookup() throws {
        let store = try TestBus.store()
        let secretTool = try Paths.tool("secret-tool", package: "libsecret-tools (apt-get install libsecret-tools)")
        let service = TestBus.unique("to-secret-tool")
        let canary = TestBus.canary()
        try store.add(.genericPassword(service: service, account: "alice", data: SecretBytes(utf8: canary)))
        let lookup = try runProcess(secretTool, ["lookup", "service", service, "account", "alice"])
        #expect(lookup.status == 0, "\(lookup.stderr)")
        #expect(lookup.stdout == canary)
    }

    @Test func secretToolItem_isFoundByLockbox() throws {
        let store = try TestBus.store()
        let secretTool = try Paths.tool("secret-tool", package: "libsecret-tools (apt-get install libsecret-tools)")
        let service = TestBus.unique("from-secret-tool")
        let canary = TestBus.canary()
        let stored = try runProcess(
            secretTool, ["store", "--label=from secret-tool", "service", service, "account", "alice"],
            input: Array(canary.utf8))
        try #require(stored.status == 0, "secret-tool store failed: \(stored.stderr)")
        let item = try store.item(matching: .genericPassword(service: service, account: "alice"))
        #expect(item.data?.utf8String == canary)
        #expect(item.attributes.label == "from secret-tool")
        // It is Lockbox's to update and delete too.
        try store.update(
            matching: .genericPassword(service: service, account: "alice"), to: ItemUpdate(data: SecretBytes(utf8: "rotated")))
        let lookup = try runProcess(secretTool, ["lookup", "service", service, "account", "alice"])
        #expect(lookup.stdout == "rotated")
        try store.delete(matching: .genericPassword(service: service, account: "alice"))
        #expect(try runProcess(secretTool, ["lookup", "service", service, "account", "alice"]).status != 0)
    }

    @Test func lockboxItem_isFoundByPythonKeyring() throws {
        let store = try TestBus.store()
        try Python.require("keyring", package: "keyring")
        let service = TestBus.unique("to-keyring")
        let canary = TestBus.canary()
        try store.add(.genericPassword(service: service, account: "alice", data: SecretBytes(utf8: canary)))
        let output = try Python.run(
            """
            import keyring, sys
            value = keyring.get_password(sys.argv[1], 'alice')
            sys.stdout.write('MISSING' if value is None else value)
            """, [service])
        #expect(output.status == 0, "\(output.stderr)")
        #expect(output.stdout == canary)
    }

    @Test func pythonKeyringItem_isFoundByLockbox_andDeletedForKeyring() throws {
        let store = try TestBus.store()
        try Python.require("keyring", package: "keyring")
        let service = TestBus.unique("from-keyring")
        let canary = TestBus.canary()
        let stored = try Python.run(
            "import keyring, sys\nkeyring.set_password(sys.argv[1], 'alice', sys.stdin.read())", [service],
            input: Array(canary.utf8))
        try #require(stored.status == 0, "keyring.set_password failed: \(stored.stderr)")
        let item = try store.item(matching: .genericPassword(service: service, account: "alice"))
        #expect(item.data?.utf8String == canary)
        #expect(item.attributes.account == "alice")
        try store.delete(matching: .genericPassword(service: service, account: "alice"))
        let after = try Python.run(
            "import keyring, sys\nsys.stdout.write(str(keyring.get_password(sys.argv[1], 'alice')))", [service])
        #expect(after.stdout == "None")
    }
}

/// Python 3 with the PyPI packages the tests drive (keyring, docker).
enum Python {
    static func run(
        _ script: String, _ arguments: [String], input: [UInt8] = [], environment: [String: String]? = nil,
        sourceLocation: SourceLocation = #_sourceLocation
    ) throws -> ProcessOutput {
        let python = try Paths.tool("python3", package: "python3", sourceLocation: sourceLocation)
        return try runProcess(python, ["-c", script] + arguments, input: input, environment: environment)
    }

    /// Fails naming the package when `module` is not importable.
    static func require(_ module: String, package: String, sourceLocation: SourceLocation = #_sourceLocation) throws {
        let check = try run("import \(module)", [], sourceLocation: sourceLocation)
        try #require(
            check.status == 0, "Python module \(module) is missing: pip install \(package)", sourceLocation: sourceLocation)
    }
}
