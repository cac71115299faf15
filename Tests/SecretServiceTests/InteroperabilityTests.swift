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

/// libsecret's secret-tool and Python keyring take no lock, and gnome-keyring replaces only an
/// item that has every attribute they give, so a writer with an attribute of its own
/// (keyring's `application`, a script's tag) adds a second item beside Lockbox's. Lockbox then reads the
/// newest copy and updates every copy.
@Suite("Secret Service duplicates written by other clients")
struct ForeignDuplicateTests {
    /// The Secret Service keeps whole seconds: waits until the next one begins, so the next
    /// write is strictly newer.
    static func nextSecond() {
        let now = Date().timeIntervalSince1970
        usleep(useconds_t((now.rounded(.down) + 1.05 - now) * 1_000_000))
    }

    static func keyringSet(_ service: String, _ account: String, _ value: String) throws {
        try Python.require("keyring", package: "keyring")
        let stored = try Python.run(
            "import keyring, sys\nkeyring.set_password(sys.argv[1], sys.argv[2], sys.stdin.read())", [service, account],
            input: Array(value.utf8))
        try #require(stored.status == 0, "keyring.set_password failed: \(stored.stderr)")
    }

    static func keyringGet(_ service: String, _ account: String) throws -> String {
        try Python.run(
            "import keyring, sys\nsys.stdout.write(str(keyring.get_password(sys.argv[1], sys.argv[2])))", [service, account]
        ).stdout
    }

    static func secretToolStore(_ attributes: [String], _ value: String) throws {
        let secretTool = try Paths.tool("secret-tool", package: "libsecret-tools")
        let stored = try runProcess(secretTool, ["store", "--label=copy"] + attributes, input: Array(value.utf8))
        try #require(stored.status == 0, "secret-tool store failed: \(stored.stderr)")
    }

    static func secretToolLookup(_ attributes: [String]) throws -> String {
        try runProcess(try Paths.tool("secret-tool", package: "libsecret-tools"), ["lookup"] + attributes).stdout
    }

    static func values(_ store: SecretServiceStore, _ query: Query) throws -> [String] {
        var query = query
        query.limit = .all
        query.returning = [.attributes, .data]
        return try store.items(matching: query).map { $0.data?.utf8String ?? "" }
    }

    @Test func keyringCopyBesideLockboxsItem_readReturnsTheNewest_andUpdateChangesEveryCopy() throws {
        let store = try TestBus.store()
        let service = TestBus.unique("dup-keyring")
        let query = Query.genericPassword(service: service, account: "alice")
        try store.add(.genericPassword(service: service, account: "alice", data: SecretBytes(utf8: "lockbox-first")))
        Self.nextSecond()
        try Self.keyringSet(service, "alice", "keyring-newer")
        try #require(try Self.values(store, query).count == 2, "keyring did not add a second item")

        #expect(try store.data(matching: query).utf8String == "keyring-newer")
        #expect(try Self.values(store, query).first == "keyring-newer")

        // An update that changes no key attribute (add -U, git approve) updates both copies.
        try store.update(matching: query, to: ItemUpdate(data: SecretBytes(utf8: "rotated")))
        #expect(try Self.values(store, query) == ["rotated", "rotated"])
        #expect(try Self.keyringGet(service, "alice") == "rotated")
        #expect(try Self.secretToolLookup(["service", service, "account", "alice"]) == "rotated")
    }

    @Test func secretToolCopyBesideLockboxsItem_readReturnsTheNewest_andUpdateChangesEveryCopy() throws {
        let store = try TestBus.store()
        let service = TestBus.unique("dup-secret-tool")
        let query = Query.genericPassword(service: service, account: "alice")
        try store.add(.genericPassword(service: service, account: "alice", data: SecretBytes(utf8: "lockbox-first")))
        Self.nextSecond()
        // With an attribute of its own; with only a subset of the item's, gnome-keyring would
        // replace Lockbox's item instead of adding one beside it.
        try Self.secretToolStore(["service", service, "account", "alice", "source", "a script"], "secret-tool-newer")
        try #require(try Self.values(store, query).count == 2, "secret-tool did not add a second item")
        #expect(try store.data(matching: query).utf8String == "secret-tool-newer")

        // One copy, pinned by its reference: its key does not change, so the other copy is no
        // obstacle.
        var lockboxCopy = query
        lockboxCopy.limit = .all
        lockboxCopy.returning = [.attributes, .data]
        let pinned = try #require(try store.items(matching: lockboxCopy).first { $0.data?.utf8String == "lockbox-first" })
        var exact = query
        exact.persistentReference = pinned.persistentReference
        try store.update(matching: exact, to: ItemUpdate(data: SecretBytes(utf8: "pinned")))
        #expect(Set(try Self.values(store, query)) == ["pinned", "secret-tool-newer"])

        // A change of a key attribute onto the copies' shared key is still a duplicate.
        try store.add(.genericPassword(service: service, account: "bob", data: SecretBytes(utf8: "bob")))
        var renamed = ItemUpdate()
        renamed.attributes.account = "alice"
        expectError(.duplicateItem) {
            try store.update(matching: .genericPassword(service: service, account: "bob"), to: renamed)
        }
    }

    @Test func twoForeignCopies_readReturnsTheNewest_whicheverToolWroteIt() throws {
        let store = try TestBus.store()
        for keyringFirst in [true, false] {
            let service = TestBus.unique("dup-order")
            if keyringFirst {
                try Self.keyringSet(service, "alice", "older")
                Self.nextSecond()
                try Self.secretToolStore(["service", service, "account", "alice"], "newer")
            } else {
                try Self.secretToolStore(["service", service, "account", "alice"], "older")
                Self.nextSecond()
                try Self.keyringSet(service, "alice", "newer")
            }
            let query = Query.genericPassword(service: service, account: "alice")
            try #require(try Self.values(store, query).count == 2)
            #expect(try store.data(matching: query).utf8String == "newer", "keyring first: \(keyringFirst)")
        }
    }
}
