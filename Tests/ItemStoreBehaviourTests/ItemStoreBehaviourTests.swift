import Foundation
import Lockbox
import LockboxTestSupport
import SecretService
import Testing

/// The backends the behaviour suite runs against. Every `ItemStore` joins this list.
enum Backend: String, CaseIterable, CustomTestStringConvertible {
    case vaultWithKernelKeyring
    case vaultWithProcessMemory
    case secretService
    /// The vault served by a real `lockboxd` (every program reaching every group: the walls
    /// have their own suite, LockboxBrokerTests).
    case broker

    var testDescription: String { rawValue }

    /// A fresh, empty, unlocked store. The returned object keeps its resources alive.
    func makeStore(maximumValueSize: Int = 64 * 1024) throws -> (store: any ItemStore, owner: AnyObject) {
        switch self {
        case .vaultWithKernelKeyring, .vaultWithProcessMemory:
            let fixture = try VaultFixture { configuration in
                configuration.unlockCache = self == .vaultWithKernelKeyring ? .kernelKeyring : .processMemory
                configuration.maximumValueSize = maximumValueSize
            }
            return (fixture.vault, fixture)
        case .secretService:
            let collection = try SecretServiceCollection(maximumValueSize: maximumValueSize)
            return (collection.store, collection)
        case .broker:
            let served = try ServedVault(maximumValueSize: maximumValueSize)
            return (served.store, served)
        }
    }

    /// Locks the store made by ``makeStore(maximumValueSize:)`` as its user would (`lock`, or
    /// the desktop keyring's own lock).
    func lock(_ owner: AnyObject) throws {
        if let fixture = owner as? VaultFixture {
            fixture.vault.lock()
        } else if let collection = owner as? SecretServiceCollection {
            try collection.runScript(["lock", collection.path])
        } else if let served = owner as? ServedVault {
            try served.store.lock()
        }
    }

    /// Unlocks it again.
    func unlock(_ owner: AnyObject) throws {
        if let fixture = owner as? VaultFixture {
            try fixture.vault.unlock(passphrase: fixture.passphrase)
        } else if let collection = owner as? SecretServiceCollection {
            try collection.runScript(["unlock", collection.path, collection.password])
        } else if let served = owner as? ServedVault {
            try served.store.unlock(passphrase: SecretBytes(utf8: VaultFixture.passphraseText))
        }
    }
}

/// A fresh vault served by its own `lockboxd` (the built product), unlocked through it; the
/// broker is stopped when this goes away.
final class ServedVault {
    let directory = TemporaryDirectory("lbx-served")
    let store: BrokerStore
    let process: Int32

    struct StartFailed: Error, CustomStringConvertible {
        var description: String
    }

    init(maximumValueSize: Int) throws {
        let vaultPath = directory.file("keychains/served.lockbox")
        let socketPath = directory.file("run/lockboxd.sock")
        var configuration = Vault.Configuration()
        configuration.keyDerivation = .interactive
        configuration.unlockCache = .processMemory
        _ = try Vault.create(at: vaultPath, passphrase: SecretBytes(utf8: VaultFixture.passphraseText), configuration: configuration)
        let started = try run(
            builtProduct("lockboxd"),
            ["--detach", "--socket", socketPath, "--keychain", vaultPath, "--access", "user", "--maximum-value-size", "\(maximumValueSize)"],
            timeout: 60)
        guard started.status == 0 else { throw StartFailed(description: "lockboxd did not start: \(started.standardError)") }
        store = try BrokerStore.connect(socketPath: socketPath, vaultPath: vaultPath, startOnDemand: false)
        process = store.brokerProcessIdentifier
        try store.unlock(passphrase: SecretBytes(utf8: VaultFixture.passphraseText))
    }

    deinit {
        kill(process, SIGTERM)
    }
}

/// A fresh, empty, unlocked collection in the test session's gnome-keyring (the suite expects
/// an empty store), deleted afterwards. Needs `scripts/secret-service run -- swift test`.
final class SecretServiceCollection {
    static let script = URL(fileURLWithPath: #filePath)
        .deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
        .appendingPathComponent("scripts/secret-service").path
    let path: String
    let password: String
    let store: SecretServiceStore

    struct NoBus: Error, CustomStringConvertible {
        var description: String {
            "No D-Bus session bus (DBUS_SESSION_BUS_ADDRESS is unset): run the tests inside "
                + "`scripts/secret-service run -- swift test` (scripts/test does)."
        }
    }

    struct CreateFailed: Error, CustomStringConvertible {
        var description: String
    }

    init(maximumValueSize: Int) throws {
        guard let address = ProcessInfo.processInfo.environment["DBUS_SESSION_BUS_ADDRESS"], !address.isEmpty else {
            throw NoBus()
        }
        let suffix = UUID().uuidString.prefix(8).lowercased()
        password = "password-\(suffix)"
        let created = try run(Self.script, ["create-collection", "suite-\(suffix)", password])
        guard created.status == 0 else { throw CreateFailed(description: "create-collection failed: \(created.standardError)") }
        path = created.standardOutput.trimmingCharacters(in: .whitespacesAndNewlines)
        store = SecretServiceStore(
            configuration: .init(
                busAddress: address, collection: path, defaultAccessGroup: Vault.defaultAccessGroup,
                maximumValueSize: maximumValueSize))
    }

    /// Runs scripts/secret-service with `arguments`, failing on a non-zero status.
    func runScript(_ arguments: [String]) throws {
        let result = try run(Self.script, arguments)
        guard result.status == 0 else { throw CreateFailed(description: "\(arguments[0]) failed: \(result.standardError)") }
    }

    deinit {
        _ = try? run(Self.script, ["delete-collection", path])
    }
}

/// A representative item of each class, with its primary key set.
func sampleItem(_ itemClass: ItemClass, variant: Int = 0, secret: String = "secret") -> Item {
    var attributes = ItemAttributes()
    switch itemClass {
    case .genericPassword:
        attributes.service = "api.example.com"
        attributes.account = "alice\(variant)"
    case .internetPassword:
        attributes = .internet(
            server: "git.example.com", account: "alice\(variant)", protocol: .https, port: 443, path: "/repo",
            securityDomain: "", authenticationType: .httpBasic)
    case .key:
        attributes.keyClass = .symmetric
        attributes.keyType = .aes
        attributes.keySizeInBits = 256
        attributes.effectiveKeySize = 256
        attributes.applicationTag = Data("com.example.key.\(variant)".utf8)
        attributes.applicationLabel = Data([1, 2, 3])
    case .certificate:
        attributes.certificateType = 3
        attributes.issuer = Data("CN=Example CA".utf8)
        attributes.serialNumber = Data([0x01, UInt8(variant)])
        attributes.subject = Data("CN=alice".utf8)
    }
    attributes.label = "label \(variant)"
    return Item(itemClass, attributes: attributes, data: SecretBytes(utf8: secret))
}

/// A query for exactly `item` by its primary key.
func query(for item: Item, returning: Query.ReturnOptions = [.data, .attributes]) -> Query {
    var attributes = item.attributes
    attributes.label = nil
    attributes.subject = nil
    return Query(item.itemClass, attributes: attributes, limit: .one, returning: returning)
}

@Suite("ItemStore behaviour, every backend")
struct ItemStoreBehaviourTests {
    static let classes = ItemClass.allCases

    @Test("add then find returns the data", arguments: Backend.allCases, classes)
    func addThenFind_returnsData(backend: Backend, itemClass: ItemClass) throws {
        let (store, owner) = try backend.makeStore()
        defer { withExtendedLifetime(owner) {} }
        let item = sampleItem(itemClass, secret: "s3cret-\(itemClass)")
        try store.add(item)
        let found = try store.item(matching: query(for: item))
        #expect(found.data == SecretBytes(utf8: "s3cret-\(itemClass)"))
        #expect(found.itemClass == itemClass)
        #expect(found.attributes.label == "label 0")
        #expect(found.attributes.accessibility == .whenUnlocked)
        #expect(found.attributes.accessGroup == Vault.defaultAccessGroup)
        #expect(found.attributes.creationDate != nil)
        #expect(found.persistentReference != nil)
    }

    @Test("adding the same primary key twice is errSecDuplicateItem", arguments: Backend.allCases, classes)
    func addSamePrimaryKey_throwsDuplicateItem(backend: Backend, itemClass: ItemClass) throws {
        let (store, owner) = try backend.makeStore()
        defer { withExtendedLifetime(owner) {} }
        try store.add(sampleItem(itemClass))
        var again = sampleItem(itemClass, secret: "other")
        again.attributes.label = "a different label is not part of the key"
        #expect(status { try store.add(again) } == -25299)
        // Another primary key of the same class is fine.
        try store.add(sampleItem(itemClass, variant: 1))
    }

    @Test("duplicate rules follow each class's primary key", arguments: Backend.allCases)
    func duplicateRules_followPrimaryKeyPerClass(backend: Backend) throws {
        let (store, owner) = try backend.makeStore()
        defer { withExtendedLifetime(owner) {} }
        // Generic: same service and account in another access group or sync state is a new item.
        try store.add(.genericPassword(service: "s", account: "a", data: SecretBytes(utf8: "1")))
        try store.add(.genericPassword(service: "s", account: "a", data: SecretBytes(utf8: "2"), accessGroup: "other"))
        var synchronizable = Item.genericPassword(service: "s", account: "a", data: SecretBytes(utf8: "3"))
        synchronizable.attributes.synchronizable = true
        try store.add(synchronizable)
        // Accessibility is not part of the key.
        #expect(status { try store.add(.genericPassword(service: "s", account: "a", data: SecretBytes(utf8: "4"), accessibility: .afterFirstUnlock)) } == -25299)
        // Internet: a different port is a different item; everything equal is a duplicate.
        var internet = sampleItem(.internetPassword)
        try store.add(internet)
        internet.attributes.port = 8443
        try store.add(internet)
        #expect(status { try store.add(internet) } == -25299)
        // Key: same tag, different size is another key.
        var key = sampleItem(.key)
        try store.add(key)
        key.attributes.keySizeInBits = 128
        try store.add(key)
        // Certificate: same issuer and serial is a duplicate even with another subject.
        var certificate = sampleItem(.certificate)
        try store.add(certificate)
        certificate.attributes.subject = Data("CN=bob".utf8)
        #expect(status { try store.add(certificate) } == -25299)
    }

    @Test("no match is errSecItemNotFound for find, update and delete", arguments: Backend.allCases, classes)
    func noMatch_throwsItemNotFound(backend: Backend, itemClass: ItemClass) throws {
        let (store, owner) = try backend.makeStore()
        defer { withExtendedLifetime(owner) {} }
        try store.add(sampleItem(itemClass, variant: 1))
        let missing = query(for: sampleItem(itemClass, variant: 2))
        #expect(status { _ = try store.items(matching: missing) } == -25300)
        #expect(status { try store.update(matching: missing, to: ItemUpdate(data: SecretBytes(utf8: "x"))) } == -25300)
        #expect(status { try store.delete(matching: missing) } == -25300)
    }

    @Test("a locked store answers errSecInteractionNotAllowed for an item it holds, never not found", arguments: Backend.allCases, classes)
    func lockedStore_neverAnswersNotFound(backend: Backend, itemClass: ItemClass) throws {
        let (store, owner) = try backend.makeStore()
        defer { withExtendedLifetime(owner) {} }
        let item = sampleItem(itemClass, secret: "kept while locked")
        try store.add(item)
        try backend.lock(owner)
        var byLabel = Query(itemClass, limit: .all, returning: .attributes)
        byLabel.attributes.label = "label 0"
        let outcomes: [(String, Int32?)] = [
            ("the data", status { _ = try store.data(matching: query(for: item)) }),
            ("the item", status { _ = try store.item(matching: query(for: item, returning: .attributes)) }),
            ("every item of the class", status { _ = try store.items(matching: Query(itemClass, limit: .all, returning: [.data])) }),
            ("a match by label", status { _ = try store.items(matching: byLabel) }),
            ("an update", status { try store.update(matching: query(for: item), to: ItemUpdate(data: SecretBytes(utf8: "x"))) }),
            ("a delete", status { try store.delete(matching: query(for: item)) }),
        ]
        for (what, outcome) in outcomes {
            #expect(outcome == -25308, "\(what) while locked gave \(outcome.map(String.init) ?? "success")")
        }
        // Nothing was changed or removed while locked.
        try backend.unlock(owner)
        #expect(try store.data(matching: query(for: item)) == SecretBytes(utf8: "kept while locked"))
    }

    @Test("update replaces data and attributes", arguments: Backend.allCases, classes)
    func update_replacesDataAndAttributes(backend: Backend, itemClass: ItemClass) throws {
        let (store, owner) = try backend.makeStore()
        defer { withExtendedLifetime(owner) {} }
        let item = sampleItem(itemClass, secret: "old")
        try store.add(item)
        var changes = ItemAttributes()
        changes.comment = "rotated"
        try store.update(matching: query(for: item), to: ItemUpdate(attributes: changes, data: SecretBytes(utf8: "new")))
        let found = try store.item(matching: query(for: item))
        #expect(found.data == SecretBytes(utf8: "new"))
        #expect(found.attributes.comment == "rotated")
        #expect(found.attributes.label == "label 0")
        #expect(found.attributes.modificationDate! >= found.attributes.creationDate!)
    }

    @Test("an update that collides with another item is errSecDuplicateItem", arguments: Backend.allCases)
    func updateIntoExistingPrimaryKey_throwsDuplicateItem(backend: Backend) throws {
        let (store, owner) = try backend.makeStore()
        defer { withExtendedLifetime(owner) {} }
        try store.add(.genericPassword(service: "s", account: "a", data: SecretBytes(utf8: "1")))
        try store.add(.genericPassword(service: "s", account: "b", data: SecretBytes(utf8: "2")))
        var rename = ItemAttributes()
        rename.account = "a"
        #expect(status { try store.update(matching: .genericPassword(service: "s", account: "b"), to: ItemUpdate(attributes: rename)) } == -25299)
        // Nothing changed.
        #expect(try store.data(matching: .genericPassword(service: "s", account: "b")) == SecretBytes(utf8: "2"))
    }

    @Test("delete removes exactly the matching items", arguments: Backend.allCases, classes)
    func delete_removesOnlyMatches(backend: Backend, itemClass: ItemClass) throws {
        let (store, owner) = try backend.makeStore()
        defer { withExtendedLifetime(owner) {} }
        let first = sampleItem(itemClass, variant: 1)
        let second = sampleItem(itemClass, variant: 2)
        try store.add(first)
        try store.add(second)
        try store.delete(matching: query(for: first))
        #expect(status { _ = try store.item(matching: query(for: first)) } == -25300)
        #expect(try store.item(matching: query(for: second)).data == SecretBytes(utf8: "secret"))
    }

    @Test("limit one returns one item, limit all returns every match", arguments: Backend.allCases)
    func limit_oneAndAll(backend: Backend) throws {
        let (store, owner) = try backend.makeStore()
        defer { withExtendedLifetime(owner) {} }
        for account in ["a", "b", "c"] {
            try store.add(.genericPassword(service: "svc", account: account, data: SecretBytes(utf8: account)))
        }
        try store.add(.genericPassword(service: "elsewhere", account: "a", data: SecretBytes(utf8: "x")))
        var query = Query.genericPassword(service: "svc")
        query.limit = .one
        #expect(try store.items(matching: query).count == 1)
        query.limit = .all
        let all = try store.items(matching: query)
        #expect(all.count == 3)
        #expect(Set(all.compactMap(\.attributes.account)) == ["a", "b", "c"])
    }

    @Test("return options decide what comes back", arguments: Backend.allCases)
    func returnOptions_shapeResults(backend: Backend) throws {
        let (store, owner) = try backend.makeStore()
        defer { withExtendedLifetime(owner) {} }
        try store.add(.genericPassword(service: "svc", account: "a", data: SecretBytes(utf8: "v"), label: "L"))
        var query = Query.genericPassword(service: "svc", account: "a")
        query.returning = [.data]
        let dataOnly = try #require(store.items(matching: query).first)
        #expect(dataOnly.data == SecretBytes(utf8: "v"))
        #expect(dataOnly.attributes.label == nil)
        query.returning = [.attributes]
        let attributesOnly = try #require(store.items(matching: query).first)
        #expect(attributesOnly.data == nil)
        #expect(attributesOnly.attributes.label == "L")
        query.returning = [.data, .attributes]
        let both = try #require(store.items(matching: query).first)
        #expect(both.data == SecretBytes(utf8: "v") && both.attributes.label == "L")
    }

    @Test("a query matches on any subset of attributes", arguments: Backend.allCases)
    func query_matchesAttributeSubsets(backend: Backend) throws {
        let (store, owner) = try backend.makeStore()
        defer { withExtendedLifetime(owner) {} }
        var item = Item.genericPassword(service: "svc", account: "alice", data: SecretBytes(utf8: "1"), label: "work")
        item.attributes.comment = "primary"
        try store.add(item)
        try store.add(.genericPassword(service: "svc", account: "bob", data: SecretBytes(utf8: "2"), label: "home"))
        var byAccount = Query(.genericPassword, limit: .all)
        byAccount.attributes.account = "alice"
        #expect(try store.items(matching: byAccount).count == 1)
        var byLabel = Query(.genericPassword, limit: .all)
        byLabel.attributes.label = "home"
        #expect(try store.items(matching: byLabel).map(\.attributes.account) == ["bob"])
        var byServiceAndComment = Query(.genericPassword, limit: .all)
        byServiceAndComment.attributes.service = "svc"
        byServiceAndComment.attributes.comment = "primary"
        #expect(try store.items(matching: byServiceAndComment).map(\.attributes.account) == ["alice"])
        var noMatch = byServiceAndComment
        noMatch.attributes.comment = "absent"
        #expect(status { _ = try store.items(matching: noMatch) } == -25300)
        let everything = Query(.genericPassword, limit: .all)
        #expect(try store.items(matching: everything).count == 2)
        #expect(status { _ = try store.items(matching: Query(.internetPassword, limit: .all)) } == -25300)
    }

    @Test("a value over the size limit is errSecParam; at the limit it is stored", arguments: Backend.allCases)
    func oversizeValue_throwsParam(backend: Backend) throws {
        let (store, owner) = try backend.makeStore(maximumValueSize: 1024)
        defer { withExtendedLifetime(owner) {} }
        let atLimit = SecretBytes(copying: [UInt8](repeating: 7, count: 1024))
        try store.add(.genericPassword(service: "s", account: "fits", data: atLimit))
        #expect(try store.data(matching: .genericPassword(service: "s", account: "fits")) == atLimit)
        let over = SecretBytes(copying: [UInt8](repeating: 7, count: 1025))
        #expect(status { try store.add(.genericPassword(service: "s", account: "over", data: over)) } == -50)
        #expect(status { try store.update(matching: .genericPassword(service: "s", account: "fits"), to: ItemUpdate(data: over)) } == -50)
    }

    @Test("empty values and empty attribute strings are stored as given", arguments: Backend.allCases)
    func emptyValues_roundTrip(backend: Backend) throws {
        let (store, owner) = try backend.makeStore()
        defer { withExtendedLifetime(owner) {} }
        try store.add(.genericPassword(service: "", account: "", data: .empty))
        let found = try store.item(matching: .genericPassword(service: "", account: ""))
        #expect(found.data?.count == 0)
        #expect(found.attributes.service == "")
        // An empty account differs from an absent one: a query without account matches both.
        try store.add(Item(.genericPassword, attributes: ItemAttributes(service: ""), data: SecretBytes(utf8: "x")))
        var byService = Query(.genericPassword, limit: .all)
        byService.attributes.service = ""
        #expect(try store.items(matching: byService).count == 2)
    }

    @Test("synchronizable items match only when the query asks for them", arguments: Backend.allCases)
    func synchronizableItems_matchOnlyWhenAsked(backend: Backend) throws {
        let (store, owner) = try backend.makeStore()
        defer { withExtendedLifetime(owner) {} }
        var item = Item.genericPassword(service: "s", account: "a", data: SecretBytes(utf8: "synced"))
        item.attributes.synchronizable = true
        try store.add(item)
        var query = Query.genericPassword(service: "s", account: "a")
        #expect(status { _ = try store.items(matching: query) } == -25300)
        query.synchronizable = .any
        #expect(try store.items(matching: query).count == 1)
        query.synchronizable = .synchronizable
        #expect(try store.items(matching: query).first?.attributes.synchronizable == true)
    }

    @Test("a persistent reference finds its item", arguments: Backend.allCases)
    func persistentReference_findsItem(backend: Backend) throws {
        let (store, owner) = try backend.makeStore()
        defer { withExtendedLifetime(owner) {} }
        try store.add(.genericPassword(service: "s", account: "a", data: SecretBytes(utf8: "A")))
        try store.add(.genericPassword(service: "s", account: "b", data: SecretBytes(utf8: "B")))
        let reference = try #require(store.item(matching: .genericPassword(service: "s", account: "b")).persistentReference)
        var query = Query(.genericPassword, returning: [.data])
        query.persistentReference = reference
        #expect(try store.items(matching: query).first?.data == SecretBytes(utf8: "B"))
    }
}
