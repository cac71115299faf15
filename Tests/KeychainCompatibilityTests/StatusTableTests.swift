#if !canImport(Darwin)
import Foundation
import KeychainCompatibility
import LockboxTestSupport
import Testing

/// One SecItem call on a fresh vault, the status Apple documents for it, and the shape of the
/// result. Each case names the developer.apple.com page the behaviour comes from; where iOS's
/// data-protection keychain and macOS's file keychain differ, iOS is the reference.
struct StatusCase: Sendable, CustomTestStringConvertible {
    typealias Dictionary = @Sendable () -> [String: Any]

    enum Call: Sendable {
        case add(Dictionary)
        case copy(Dictionary)
        case update(Dictionary, Dictionary)
        case delete(Dictionary)
    }

    /// What `result` must hold after the call.
    enum Shape: Sendable {
        case none
        case data(String)
        case persistentReference
        case dictionary(keys: Set<String>)
        case dataArray([String])
        case dictionaryArray(count: Int, keys: Set<String>)
    }

    let name: String
    /// The Apple documentation page, as a path on developer.apple.com.
    let reference: String
    var setup: [Dictionary] = []
    let call: Call
    let status: OSStatus
    var shape: Shape = .none

    var testDescription: String { name }
}

// MARK: Dictionaries the cases share

private func password(
    _ service: String = "api.example.com", _ account: String = "alice", data: String = "s3cret",
    _ extra: [String: Any] = [:]
) -> [String: Any] {
    var dictionary: [String: Any] = [
        kSecClass as String: kSecClassGenericPassword,
        kSecAttrService as String: service,
        kSecAttrAccount as String: account,
        kSecValueData as String: Data(data.utf8),
    ]
    dictionary.merge(extra) { $1 }
    return dictionary
}

private func search(_ service: String = "api.example.com", _ account: String? = "alice", extra: [String: Any] = [:]) -> [String: Any] {
    var dictionary: [String: Any] = [kSecClass as String: kSecClassGenericPassword, kSecAttrService as String: service]
    if let account { dictionary[kSecAttrAccount as String] = account }
    dictionary.merge(extra) { $1 }
    return dictionary
}

private func accessControl(_ flags: SecAccessControlCreateFlags) -> SecAccessControl? {
    SecAccessControlCreateWithFlags(nil, kSecAttrAccessibleWhenUnlockedThisDeviceOnly, flags, nil)
}

private let attributeKeys: Set<String> = Set([
    kSecClass, kSecAttrService, kSecAttrAccount, kSecAttrAccessible, kSecAttrAccessGroup, kSecAttrSynchronizable,
    kSecAttrCreationDate, kSecAttrModificationDate,
].map { $0 as String })

extension StatusCase {
    static let table: [StatusCase] = [
        // MARK: SecItemAdd
        StatusCase(
            name: "add of an existing primary key -> errSecDuplicateItem",
            reference: "/documentation/security/errsecduplicateitem",
            setup: [{ password() }], call: .add({ password(data: "other") }), status: errSecDuplicateItem),
        StatusCase(
            name: "add without kSecClass -> errSecParam",
            reference: "/documentation/security/secitemadd(_:_:)",
            call: .add({ [kSecAttrAccount as String: "alice", kSecValueData as String: Data()] }), status: errSecParam),
        StatusCase(
            name: "add of an existing service and account, synchronizable -> success (sync is part of the key)",
            reference: "/documentation/security/ksecattrsynchronizable",
            setup: [{ password() }], call: .add({ password(data: "synced", [kSecAttrSynchronizable as String: true]) }),
            status: errSecSuccess),
        StatusCase(
            name: "add with kSecAttrSynchronizableAny -> errSecParam",
            reference: "/documentation/security/ksecattrsynchronizableany",
            call: .add({ password("a", "b", [kSecAttrSynchronizable as String: kSecAttrSynchronizableAny]) }),
            status: errSecParam),
        StatusCase(
            name: "add synchronizable with a ThisDeviceOnly accessibility -> errSecParam",
            reference: "/documentation/security/ksecattraccessible",
            call: .add({
                password(
                    "a", "b",
                    [
                        kSecAttrSynchronizable as String: true,
                        kSecAttrAccessible as String: kSecAttrAccessibleAfterFirstUnlockThisDeviceOnly,
                    ])
            }), status: errSecParam),
        StatusCase(
            name: "add with kSecValueData that is not Data -> errSecParam",
            reference: "/documentation/security/ksecvaluedata",
            call: .add({ password("a", "b", [kSecValueData as String: "text"]) }), status: errSecParam),
        StatusCase(
            name: "add with an attribute of another class (kSecAttrServer on a generic password) -> errSecNoSuchAttr",
            reference: "/documentation/security/errsecnosuchattr",
            call: .add({ password("a", "b", [kSecAttrServer as String: "example.com"]) }), status: errSecNoSuchAttr),
        StatusCase(
            name: "add with an unknown kSecClass value -> errSecNoSuchClass",
            reference: "/documentation/security/errsecnosuchclass",
            call: .add({ [kSecClass as String: "nope", kSecAttrAccount as String: "b"] }), status: errSecNoSuchClass),
        StatusCase(
            name: "add with kSecReturnAttributes -> the new item's attributes",
            reference: "/documentation/security/secitemadd(_:_:)",
            call: .add({ password("a", "b", [kSecReturnAttributes as String: true]) }), status: errSecSuccess,
            shape: .dictionary(keys: attributeKeys)),
        StatusCase(
            name: "add with kSecReturnData and kSecReturnAttributes -> one dictionary with v_Data",
            reference: "/documentation/security/item-return-result-keys",
            call: .add({ password("a", "b", data: "v", [kSecReturnAttributes as String: true, kSecReturnData as String: true]) }),
            status: errSecSuccess, shape: .dictionary(keys: attributeKeys.union([kSecValueData as String]))),

        // MARK: SecItemAdd with kSecAttrAccessControl
        StatusCase(
            name: "add with .biometryCurrentSet on a machine without biometry -> errSecAuthFailed",
            reference: "/documentation/security/secaccesscontrolcreateflags/biometrycurrentset",
            call: .add({ password("a", "b", [kSecAttrAccessControl as String: accessControl(.biometryCurrentSet) as Any]) }),
            status: errSecAuthFailed),
        StatusCase(
            name: "add with .biometryAny on a machine without biometry -> errSecAuthFailed",
            reference: "/documentation/security/secaccesscontrolcreateflags/biometryany",
            call: .add({ password("a", "b", [kSecAttrAccessControl as String: accessControl(.biometryAny) as Any]) }),
            status: errSecAuthFailed),
        StatusCase(
            name: "add with .userPresence -> stored; reads then need the passphrase re-entered",
            reference: "/documentation/security/secaccesscontrolcreateflags/userpresence",
            call: .add({ password("a", "b", [kSecAttrAccessControl as String: accessControl(.userPresence) as Any]) }),
            status: errSecSuccess),
        StatusCase(
            name: "add with [.biometryAny, .or, .devicePasscode] -> the passcode branch: stored",
            reference: "/documentation/security/secaccesscontrolcreateflags/or",
            call: .add({
                password("a", "b", [kSecAttrAccessControl as String: accessControl([.biometryAny, .or, .devicePasscode]) as Any])
            }), status: errSecSuccess),
        StatusCase(
            name: "add with an access control without constraints -> success, its protection class kept",
            reference: "/documentation/security/secaccesscontrolcreatewithflags(_:_:_:_:)",
            call: .add({
                password("a", "b", [kSecAttrAccessControl as String: accessControl([]) as Any, kSecReturnAttributes as String: true])
            }), status: errSecSuccess, shape: .dictionary(keys: attributeKeys)),
        StatusCase(
            name: "add synchronizable with .userPresence -> errSecParam (securityd: access control is not synchronizable)",
            reference: "/documentation/security/ksecattrsynchronizable",
            call: .add({
                password(
                    "a", "b",
                    [
                        kSecAttrAccessControl as String: SecAccessControlCreateWithFlags(nil, kSecAttrAccessibleWhenUnlocked, .userPresence, nil)
                            as Any,
                        kSecAttrSynchronizable as String: true,
                    ])
            }), status: errSecParam),
        StatusCase(
            name: "add with kSecAttrAccessible disagreeing with the access control's protection -> errSecParam",
            reference: "/documentation/security/ksecattraccesscontrol",
            call: .add({
                password(
                    "a", "b",
                    [
                        kSecAttrAccessControl as String: accessControl([]) as Any,
                        kSecAttrAccessible as String: kSecAttrAccessibleAlways,
                    ])
            }), status: errSecParam),

        // MARK: SecItemCopyMatching: statuses
        StatusCase(
            name: "copy without kSecClass -> errSecParam",
            reference: "/documentation/security/secitemcopymatching(_:_:)",
            setup: [{ password() }], call: .copy({ [kSecAttrAccount as String: "alice", kSecReturnData as String: true] }),
            status: errSecParam),
        StatusCase(
            name: "copy with no match -> errSecItemNotFound, no result",
            reference: "/documentation/security/errsecitemnotfound",
            call: .copy({ search(extra: [kSecReturnData as String: true]) }), status: errSecItemNotFound),
        StatusCase(
            name: "copy of a synchronizable item without kSecAttrSynchronizable -> errSecItemNotFound",
            reference: "/documentation/security/ksecattrsynchronizable",
            setup: [{ password(data: "synced", [kSecAttrSynchronizable as String: true]) }],
            call: .copy({ search(extra: [kSecReturnData as String: true]) }), status: errSecItemNotFound),
        StatusCase(
            name: "copy with kSecAttrSynchronizable true -> only the synchronizable item",
            reference: "/documentation/security/ksecattrsynchronizable",
            setup: [{ password(data: "local") }, { password(data: "synced", [kSecAttrSynchronizable as String: true]) }],
            call: .copy({ search(extra: [kSecAttrSynchronizable as String: true, kSecReturnData as String: true]) }),
            status: errSecSuccess, shape: .data("synced")),
        StatusCase(
            name: "copy with kSecAttrSynchronizableAny, limit all -> synchronizable and not",
            reference: "/documentation/security/ksecattrsynchronizableany",
            setup: [{ password(data: "local") }, { password(data: "synced", [kSecAttrSynchronizable as String: true]) }],
            call: .copy({
                search(extra: [
                    kSecAttrSynchronizable as String: kSecAttrSynchronizableAny, kSecReturnData as String: true,
                    kSecMatchLimit as String: kSecMatchLimitAll,
                ])
            }), status: errSecSuccess, shape: .dataArray(["local", "synced"])),
        StatusCase(
            name: "copy of an item added without kSecAttrAccessible, by kSecAttrAccessibleWhenUnlocked -> found",
            reference: "/documentation/security/restricting-keychain-item-accessibility",
            setup: [{ password() }],
            call: .copy({
                search(extra: [kSecAttrAccessible as String: kSecAttrAccessibleWhenUnlocked, kSecReturnData as String: true])
            }), status: errSecSuccess, shape: .data("s3cret")),
        StatusCase(
            name: "copy returning a reference to a key, none stored -> errSecItemNotFound",
            reference: "/documentation/security/ksecreturnref",
            call: .copy({ [kSecClass as String: kSecClassKey, kSecReturnRef as String: true] }), status: errSecItemNotFound),
        StatusCase(
            name: "copy returning a reference to a certificate -> errSecUnimplemented (no SecCertificate on Linux)",
            reference: "/documentation/security/ksecreturnref",
            call: .copy({ [kSecClass as String: kSecClassCertificate, kSecReturnRef as String: true] }), status: errSecUnimplemented),

        // MARK: SecItemCopyMatching: result shapes
        StatusCase(
            name: "copy returning data, limit one -> Data",
            reference: "/documentation/security/item-return-result-keys",
            setup: [{ password() }],
            call: .copy({ search(extra: [kSecReturnData as String: true, kSecMatchLimit as String: kSecMatchLimitOne]) }),
            status: errSecSuccess, shape: .data("s3cret")),
        StatusCase(
            name: "copy returning attributes -> [String: Any]",
            reference: "/documentation/security/ksecreturnattributes",
            setup: [{ password() }], call: .copy({ search(extra: [kSecReturnAttributes as String: true]) }),
            status: errSecSuccess, shape: .dictionary(keys: attributeKeys)),
        StatusCase(
            name: "copy returning data and attributes -> one dictionary with v_Data",
            reference: "/documentation/security/item-return-result-keys",
            setup: [{ password() }],
            call: .copy({ search(extra: [kSecReturnData as String: true, kSecReturnAttributes as String: true]) }),
            status: errSecSuccess, shape: .dictionary(keys: attributeKeys.union([kSecValueData as String]))),
        StatusCase(
            name: "copy returning a persistent reference -> Data",
            reference: "/documentation/security/ksecreturnpersistentref",
            setup: [{ password() }], call: .copy({ search(extra: [kSecReturnPersistentRef as String: true]) }),
            status: errSecSuccess, shape: .persistentReference),
        StatusCase(
            name: "copy returning data and a persistent reference -> dictionary with v_Data and v_PersistentRef",
            reference: "/documentation/security/item-return-result-keys",
            setup: [{ password() }],
            call: .copy({ search(extra: [kSecReturnData as String: true, kSecReturnPersistentRef as String: true]) }),
            status: errSecSuccess, shape: .dictionary(keys: [kSecValueData as String, kSecValuePersistentRef as String])),
        StatusCase(
            name: "copy returning attributes, limit all -> [[String: Any]]",
            reference: "/documentation/security/ksecmatchlimitall",
            setup: [{ password("api.example.com", "alice") }, { password("api.example.com", "bob") }],
            call: .copy({ search("api.example.com", nil, extra: [kSecReturnAttributes as String: true, kSecMatchLimit as String: kSecMatchLimitAll]) }),
            status: errSecSuccess, shape: .dictionaryArray(count: 2, keys: attributeKeys)),
        StatusCase(
            name: "copy returning attributes, limit all, one match -> an array of one",
            reference: "/documentation/security/secitemcopymatching(_:_:)",
            setup: [{ password() }],
            call: .copy({ search(extra: [kSecReturnAttributes as String: true, kSecMatchLimit as String: kSecMatchLimitAll]) }),
            status: errSecSuccess, shape: .dictionaryArray(count: 1, keys: attributeKeys)),
        StatusCase(
            name: "copy returning data and attributes, limit all -> [[String: Any]] with v_Data",
            reference: "/documentation/security/item-return-result-keys",
            setup: [{ password("api.example.com", "alice") }, { password("api.example.com", "bob") }],
            call: .copy({
                search("api.example.com", nil, extra: [
                    kSecReturnAttributes as String: true, kSecReturnData as String: true,
                    kSecMatchLimit as String: kSecMatchLimitAll,
                ])
            }), status: errSecSuccess, shape: .dictionaryArray(count: 2, keys: attributeKeys.union([kSecValueData as String]))),
        StatusCase(
            name: "copy returning data, limit all -> [Data]",
            reference: "/documentation/security/ksecmatchlimitall",
            setup: [{ password("api.example.com", "alice", data: "a") }, { password("api.example.com", "bob", data: "b") }],
            call: .copy({ search("api.example.com", nil, extra: [kSecReturnData as String: true, kSecMatchLimit as String: kSecMatchLimitAll]) }),
            status: errSecSuccess, shape: .dataArray(["a", "b"])),
        StatusCase(
            name: "copy with kSecMatchLimit 2 of three matches -> an array of two",
            reference: "/documentation/security/ksecmatchlimit",
            setup: [{ password("s", "a", data: "x") }, { password("s", "b", data: "x") }, { password("s", "c", data: "x") }],
            call: .copy({ search("s", nil, extra: [kSecReturnData as String: true, kSecMatchLimit as String: 2]) }),
            status: errSecSuccess, shape: .dataArray(["x", "x"])),
        StatusCase(
            name: "copy with no kSecReturn key -> success, no result",
            reference: "/documentation/security/item-return-result-keys",
            setup: [{ password() }], call: .copy({ search() }), status: errSecSuccess, shape: .none),

        // MARK: SecItemUpdate
        StatusCase(
            name: "update without kSecClass -> errSecParam",
            reference: "/documentation/security/secitemupdate(_:_:)",
            setup: [{ password() }],
            call: .update({ [kSecAttrAccount as String: "alice"] }, { [kSecValueData as String: Data()] }), status: errSecParam),
        StatusCase(
            name: "update of a missing item -> errSecItemNotFound",
            reference: "/documentation/security/secitemupdate(_:_:)",
            call: .update({ search() }, { [kSecValueData as String: Data("new".utf8)] }), status: errSecItemNotFound),
        StatusCase(
            name: "update of every match -> success",
            reference: "/documentation/security/secitemupdate(_:_:)",
            setup: [{ password("s", "a") }, { password("s", "b") }],
            call: .update({ search("s", nil) }, { [kSecAttrLabel as String: "renamed"] }), status: errSecSuccess),
        StatusCase(
            name: "update with kSecClass in attributesToUpdate -> errSecParam",
            reference: "/documentation/security/secitemupdate(_:_:)",
            setup: [{ password() }],
            call: .update({ search() }, { [kSecClass as String: kSecClassGenericPassword] }), status: errSecParam),
        StatusCase(
            name: "update with a return key in attributesToUpdate -> errSecParam",
            reference: "/documentation/security/secitemupdate(_:_:)",
            setup: [{ password() }],
            call: .update({ search() }, { [kSecReturnData as String: true] }), status: errSecParam),
        StatusCase(
            name: "update setting an attribute of another class -> errSecNoSuchAttr",
            reference: "/documentation/security/errsecnosuchattr",
            setup: [{ password() }],
            call: .update({ search() }, { [kSecAttrServer as String: "example.com"] }), status: errSecNoSuchAttr),
        StatusCase(
            name: "update giving an item another's primary key -> errSecDuplicateItem",
            reference: "/documentation/security/errsecduplicateitem",
            setup: [{ password("s", "a") }, { password("s", "b") }],
            call: .update({ search("s", "a") }, { [kSecAttrAccount as String: "b"] }), status: errSecDuplicateItem),

        // MARK: SecItemDelete
        StatusCase(
            name: "delete without kSecClass -> errSecParam",
            reference: "/documentation/security/secitemdelete(_:)",
            setup: [{ password() }], call: .delete({ [kSecAttrAccount as String: "alice"] }), status: errSecParam),
        StatusCase(
            name: "delete of a missing item -> errSecItemNotFound",
            reference: "/documentation/security/secitemdelete(_:)",
            call: .delete({ search() }), status: errSecItemNotFound),
        StatusCase(
            name: "delete with the add dictionary, data included -> success",
            reference: "/documentation/security/secitemdelete(_:)",
            setup: [{ password() }], call: .delete({ password() }), status: errSecSuccess),
    ]
}

@Suite struct StatusTableTests {
    @Test(arguments: StatusCase.table)
    func call_returnsAppleStatusAndResultShape(_ testCase: StatusCase) throws {
        let fixture = try VaultFixture()
        var result: CFTypeRef?
        let status = SecItemStore.withStore(fixture.vault) { () -> OSStatus in
            for setup in testCase.setup {
                let added = SecItemAdd(setup() as CFDictionary, nil)
                #expect(added == errSecSuccess, "setup of \(testCase.name)")
            }
            switch testCase.call {
            case .add(let attributes): return SecItemAdd(attributes() as CFDictionary, &result)
            case .copy(let query): return SecItemCopyMatching(query() as CFDictionary, &result)
            case .update(let query, let attributes): return SecItemUpdate(query() as CFDictionary, attributes() as CFDictionary)
            case .delete(let query): return SecItemDelete(query() as CFDictionary)
            }
        }
        #expect(status == testCase.status, "\(testCase.name) (\(testCase.reference))")
        check(result, is: testCase.shape)
    }

    private func check(_ result: CFTypeRef?, is shape: StatusCase.Shape) {
        switch shape {
        case .none:
            #expect(result == nil)
        case .data(let text):
            #expect((result as? Data).map { String(decoding: $0, as: UTF8.self) } == text)
        case .persistentReference:
            let reference = result as? Data
            #expect(reference?.isEmpty == false)
            #expect(result as? [String: Any] == nil)
        case .dictionary(let keys):
            let dictionary = result as? [String: Any]
            #expect(dictionary != nil)
            #expect(keys.isSubset(of: Set(dictionary?.keys ?? [:].keys)))
            #expect(result as? [Any] == nil, "a single match is not wrapped in an array")
        case .dataArray(let texts):
            let values = result as? [Data]
            #expect(values?.map { String(decoding: $0, as: UTF8.self) }.sorted() == texts.sorted())
        case .dictionaryArray(let count, let keys):
            let dictionaries = result as? [[String: Any]]
            #expect(dictionaries?.count == count)
            for dictionary in dictionaries ?? [] {
                #expect(keys.isSubset(of: Set(dictionary.keys)))
            }
        }
    }
}
#endif
