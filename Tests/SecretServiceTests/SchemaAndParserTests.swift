import CredentialHelpers
import Foundation
import LockboxCore
import LockboxTestSupport
@testable import SecretService
import Testing

/// The attribute mapping, without a bus.
@Suite("Secret Service schema mapping")
struct SecretServiceSchemaTests {
    @Test func genericPassword_writesAccountAndUsername_andTheGenericSchema() {
        let stored = SecretServiceSchema.encode(.genericPassword, ItemAttributes(service: "S", account: "A"))
        #expect(stored["service"] == "S")
        #expect(stored["account"] == "A")
        #expect(stored["username"] == "A")
        #expect(stored["xdg:schema"] == "org.freedesktop.Secret.Generic")
        #expect(SecretServiceSchema.searches(for: .genericPassword, ItemAttributes(service: "S", account: "A")).count == 2)
    }

    @Test func internetPassword_usesGitLibsecretNames_andSchemeNames() {
        let attributes = ItemAttributes.internet(server: "h", account: "u", protocol: .https, port: 8443, path: "p")
        let stored = SecretServiceSchema.encode(.internetPassword, attributes)
        #expect(stored["server"] == "h" && stored["user"] == "u" && stored["protocol"] == "https")
        #expect(stored["port"] == "8443" && stored["object"] == "p")
        #expect(stored["xdg:schema"] == "org.gnome.keyring.NetworkPassword")
        let decoded = SecretServiceSchema.decode(stored, label: "x", created: nil, modified: nil)
        #expect(decoded?.0 == .internetPassword)
        #expect(decoded?.1.protocol == .https)
    }

    @Test(arguments: ItemClass.allCases)
    func encodeThenDecode_roundTripsEveryAttribute(itemClass: ItemClass) {
        var attributes = ItemAttributes(service: "svc", account: "acct", label: "L", accessibility: .afterFirstUnlock, accessGroup: "g")
        attributes.comment = "c"
        attributes.itemDescription = "d"
        attributes.generic = Data([0, 1, 2])
        attributes.synchronizable = true
        switch itemClass {
        case .genericPassword: break
        case .internetPassword:
            attributes.service = nil
            attributes.server = "server"
            attributes.protocol = InternetProtocol(rawValue: "gophr")
            attributes.port = 70
            attributes.path = "/p"
            attributes.securityDomain = "realm"
            attributes.authenticationType = .httpDigest
        case .key:
            attributes.service = nil
            attributes.account = nil
            attributes.keyClass = .private
            attributes.keyType = .ecSECPrimeRandom
            attributes.keySizeInBits = 256
            attributes.effectiveKeySize = 256
            attributes.applicationTag = Data("tag".utf8)
            attributes.applicationLabel = Data([9, 9])
        case .certificate:
            attributes.service = nil
            attributes.account = nil
            attributes.certificateType = 3
            attributes.subject = Data([1])
            attributes.issuer = Data([2])
            attributes.serialNumber = Data([3])
        }
        let stored = SecretServiceSchema.encode(itemClass, attributes)
        let decoded = SecretServiceSchema.decode(stored, label: "L", created: nil, modified: nil)
        #expect(decoded?.0 == itemClass)
        #expect(decoded?.1 == attributes)
    }

    @Test func foreignItems_areClassifiedByTheirAttributes_orIgnored() {
        #expect(SecretServiceSchema.itemClass(of: ["service": "S", "username": "u", "application": "Python keyring library"]) == .genericPassword)
        #expect(SecretServiceSchema.itemClass(of: ["server": "h", "protocol": "https", "user": "u"]) == .internetPassword)
        #expect(SecretServiceSchema.itemClass(of: ["lockbox-vault-id": "v", "xdg:schema": "io.lockbox.VaultKey"]) == nil)
        let keyring = SecretServiceSchema.decode(["service": "S", "username": "u"], label: "Password for 'u' on 'S'", created: nil, modified: nil)
        #expect(keyring?.1.account == "u")
        #expect(keyring?.1.label == "Password for 'u' on 'S'")
    }
}

/// Any bytes in: the parsers answer or throw, never crash.
@Suite("credential parsers under random input")
struct ParserRobustnessTests {
    @Test func randomBytes_neverCrashTheParsers_andWhatParsesReencodesFaithfully() {
        var generator = SeededGenerator("randomBytes_neverCrashTheParsers")
        let alphabet = Array("{}\":,\\u0123456789abcdefABCDEF=\n\r []protocol=host=password=url=https://@".utf8) + [0, 0xFF, 0xC3, 0xA9]
        var refused = 0
        for round in 0..<3000 {
            let length = Int.random(in: 0...64, using: &generator)
            let input: [UInt8] = (0..<length).map { _ in
                round.isMultiple(of: 3) ? UInt8.random(in: 0...255, using: &generator) : alphabet.randomElement(using: &generator)!
            }
            if let credential = try? GitCredential.parse(input) {
                // What was accepted serializes to lines that parse back to the same fields.
                let again = try? GitCredential.parse(credential.serialized())
                #expect(
                    again?.username == credential.username || credential.username?.contains("\n") == true,
                    "seed \(generator.seed), round \(round)")
            } else {
                refused += 1
            }
            if let object = try? FlatJSON.parseObject(input) {
                let encoded = FlatJSON.encodeObject(object.sorted { $0.key < $1.key }.map { ($0.key, $0.value) })
                #expect((try? FlatJSON.parseObject(encoded)) == object, "seed \(generator.seed), round \(round)")
            } else {
                refused += 1
            }
        }
        #expect(refused > 0, "random bytes should not all be valid")
    }

    /// Found by fuzzing (docs/FUZZING.md, target `git-credential`): `url=https://a%0D@host`
    /// gave the username "a\r", written as `username=a\r\n` and read back (by git too) as "a".
    /// A control character in any decoded part of the url is now refused outright.
    @Test func usernameEndingInCarriageReturn_isRefused_notChangedInTransit() {
        #expect(throws: GitCredential.ParseError.self) {
            try GitCredential.parse(Array("url=https://a%0D@example.com/\n".utf8))
        }
    }

    @Test func everyFlatJSONEncoding_parsesBackToTheSameBytes() throws {
        var generator = SeededGenerator("everyFlatJSONEncoding_parsesBackToTheSameBytes")
        for _ in 0..<500 {
            let value: [UInt8] = Array(String(decoding: (0..<Int.random(in: 0...40, using: &generator)).map { _ in
                UInt8.random(in: 0...127, using: &generator)
            }, as: UTF8.self).utf8)
            let encoded = FlatJSON.encodeObject([("k", value)])
            #expect(try FlatJSON.parseObject(encoded)["k"] == value, "seed \(generator.seed)")
        }
    }
}

/// One store used from many threads at once, as a server would.
@Suite("SecretServiceStore under concurrency")
struct ConcurrencyTests {
    @Test func manyThreadsAddingAndReading_allSucceed() throws {
        let store = try TestBus.store()
        let service = TestBus.unique("threads")
        let failures = Failures()
        DispatchQueue.concurrentPerform(iterations: 16) { index in
            do {
                try store.add(.genericPassword(service: service, account: "a\(index)", data: SecretBytes(utf8: "v\(index)")))
                let value = try store.data(matching: .genericPassword(service: service, account: "a\(index)"))
                if value.utf8String != "v\(index)" { failures.add("wrong value for \(index)") }
            } catch {
                failures.add("\(index): \(error)")
            }
        }
        #expect(failures.messages.isEmpty, "\(failures.messages)")
        var all = Query.genericPassword(service: service)
        all.limit = .all
        #expect(try store.items(matching: all).count == 16)
    }
}

final class Failures: @unchecked Sendable {
    // Guarded by `lock`.
    private let lock = NSLock()
    private var list: [String] = []
    func add(_ message: String) { lock.withLock { list.append(message) } }
    var messages: [String] { lock.withLock { list } }
}

/// The schema reads ItemAttributes.fields: every attribute a class stores survives a round trip,
/// and the attribute names are those the hand-written mapping used (and other tools read).
@Suite("Secret Service schema and the attribute table")
struct SecretServiceAttributeTableTests {
    /// The rows the Secret Service keeps for an item of `itemClass`.
    static func storedFields(_ itemClass: ItemClass) -> [AttributeField] {
        ItemAttributes.fields.filter { field in
            switch field.secretService {
            case .itemLabel, .itemCreated, .itemModified: true
            case .perClass: !field.secretService.names(for: itemClass).isEmpty
            }
        }
    }

    @Test(arguments: ItemClass.allCases)
    func everyAttributeTheClassStores_roundTrips(itemClass: ItemClass) throws {
        for variant in 0...1 {
            var attributes = AttributeSamples.attributes(Self.storedFields(itemClass), variant: variant)
            // The Secret Service keeps a flag only when it is set.
            if attributes.synchronizable == false { attributes.synchronizable = nil }
            let stored = SecretServiceSchema.encode(itemClass, attributes)
            let decoded = try #require(
                SecretServiceSchema.decode(stored, label: attributes.label, created: attributes.creationDate, modified: attributes.modificationDate))
            #expect(decoded.0 == itemClass)
            #expect(decoded.1 == attributes, "variant \(variant)")
        }
        // Every attribute stored as a Secret Service attribute is in the dictionary.
        let stored = SecretServiceSchema.encode(itemClass, AttributeSamples.attributes(Self.storedFields(itemClass)))
        for field in Self.storedFields(itemClass) {
            for name in field.secretService.names(for: itemClass) {
                #expect(stored[name] != nil, "\(field.name) as \(name)")
            }
        }
    }

    @Test(arguments: ItemClass.allCases)
    func attributesOfOtherClasses_areNotStored(itemClass: ItemClass) throws {
        let everything = AttributeSamples.attributes(ItemAttributes.fields)
        let stored = SecretServiceSchema.encode(itemClass, everything)
        let decoded = try #require(
            SecretServiceSchema.decode(stored, label: everything.label, created: everything.creationDate, modified: everything.modificationDate))
        #expect(decoded.1 == AttributeSamples.attributes(Self.storedFields(itemClass)))
    }

    /// The dictionaries the hand-written mapping produced for one fully populated value,
    /// captured before the table replaced it: items already in users' keyrings carry these names.
    @Test(arguments: [
        (ItemClass.genericPassword, [
            "account": "acct", "service": "svc", "username": "acct", "xdg:schema": "org.freedesktop.Secret.Generic",
        ]),
        (ItemClass.internetPassword, [
            "authtype": "httd", "domain": "realm", "object": "/path", "port": "8443", "protocol": "https",
            "server": "example.org", "user": "acct", "xdg:schema": "org.gnome.keyring.NetworkPassword",
        ]),
        (ItemClass.key, [
            "lockbox:application-label": "qrs=", "lockbox:application-tag": "dGFn", "lockbox:effective-key-size": "-1",
            "lockbox:key-class": "private", "lockbox:key-size": "256", "lockbox:key-type": "73", "xdg:schema": "io.lockbox.Item",
        ]),
        (ItemClass.certificate, [
            "lockbox:certificate-type": "3", "lockbox:issuer": "MAI=", "lockbox:serial-number": "BQ==", "lockbox:subject": "MAE=",
            "xdg:schema": "io.lockbox.Item",
        ]),
    ])
    func fullyPopulatedAttributes_encodeToTheNamesOfTheFirstMapping(itemClass: ItemClass, specific: [String: String]) {
        let common = [
            "lockbox:access-group": "group", "lockbox:accessibility": "afterFirstUnlockThisDeviceOnly",
            "lockbox:class": itemClass.rawValue, "lockbox:comment": "comment", "lockbox:description": "description",
            "lockbox:generic": "AAH+/w==", "lockbox:has-label": "1", "lockbox:synchronizable": "1",
        ]
        #expect(SecretServiceSchema.encode(itemClass, Self.fullyPopulated) == common.merging(specific) { $1 })
    }

    @Test func searches_areThoseOfTheFirstMapping() {
        let attributes = Self.fullyPopulated
        #expect(
            SecretServiceSchema.searches(for: .genericPassword, attributes)
                == [["service": "svc", "account": "acct"], ["service": "svc", "username": "acct"]])
        #expect(
            SecretServiceSchema.searches(for: .internetPassword, attributes)
                == [["server": "example.org", "protocol": "https", "port": "8443", "object": "/path", "user": "acct"]])
        #expect(SecretServiceSchema.searches(for: .key, attributes) == [["lockbox:class": "key"]])
        #expect(SecretServiceSchema.searches(for: .certificate, attributes) == [["lockbox:class": "certificate"]])
        #expect(SecretServiceSchema.searches(for: .genericPassword, ItemAttributes()) == [[:]])
        #expect(SecretServiceSchema.searches(for: .genericPassword, ItemAttributes(account: "a")) == [["account": "a"], ["username": "a"]])
    }

    static var fullyPopulated: ItemAttributes { AttributeSamples.fullyPopulated }
}

extension SecretServiceAttributeTableTests {
    /// docs/SECRET-SERVICE.md lists the schema for users of other tools: every name the table
    /// writes appears there, on the row of the attribute's Apple key.
    @Test func documentedSchema_namesEveryAttributeTheTableWrites() throws {
        let docs = URL(fileURLWithPath: #filePath).deletingLastPathComponent().appendingPathComponent("../../docs/SECRET-SERVICE.md")
        let rows = try String(contentsOf: docs, encoding: .utf8).split(separator: "\n").filter { $0.hasPrefix("| `kSecAttr") }
        let appleNames: [String: String] = [
            "comment": "Comment", "itemDescription": "Description", "generic": "Generic", "accessGroup": "AccessGroup",
            "synchronizable": "Synchronizable", "accessibility": "Accessible", "service": "Service", "account": "Account",
            "server": "Server", "protocol": "Protocol", "port": "Port", "path": "Path", "securityDomain": "SecurityDomain",
            "authenticationType": "AuthenticationType", "keyClass": "KeyClass", "keyType": "KeyType", "keySizeInBits": "KeySizeInBits",
            "effectiveKeySize": "EffectiveKeySize", "applicationTag": "ApplicationTag", "applicationLabel": "ApplicationLabel",
            "certificateType": "CertificateType", "subject": "Subject", "issuer": "Issuer", "serialNumber": "SerialNumber",
        ]
        for field in ItemAttributes.fields {
            guard case .perClass(let namesByClass, _) = field.secretService else { continue }
            let appleName = try #require(appleNames[field.name], "\(field.name) has no Apple name in this test")
            for name in Set(namesByClass.values.joined()) {
                let documented = rows.contains { row in
                    (row.contains("`kSecAttr\(appleName)`") || row.contains(" `\(appleName)` ") || row.contains("/ `\(appleName)`"))
                        && row.contains("`\(name)`")
                }
                #expect(documented, "\(field.name) as \(name)")
            }
        }
    }
}
