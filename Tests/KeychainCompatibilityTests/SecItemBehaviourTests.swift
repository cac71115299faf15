#if !canImport(Darwin)
import Foundation
import KeychainCompatibility
import Lockbox
import LockboxTestSupport
import Testing

/// Behaviour that needs more than one call: persistent references, lock state, the store the
/// functions use, and the Security spellings that must compile.
@Suite struct SecItemBehaviourTests {
    private func addPassword(account: String, data: String = "s3cret", _ extra: [String: Any] = [:]) -> OSStatus {
        var attributes: [String: Any] = [
            kSecClass as String: kSecClassGenericPassword,
            kSecAttrService as String: "api.example.com",
            kSecAttrAccount as String: account,
            kSecValueData as String: Data(data.utf8),
        ]
        attributes.merge(extra) { $1 }
        return SecItemAdd(attributes as CFDictionary, nil)
    }

    // developer.apple.com/documentation/security/ksecvaluepersistentref
    @Test func persistentReference_fromAdd_findsAndDeletesTheItemWithoutAClass() throws {
        let fixture = try VaultFixture()
        try SecItemStore.withStore(fixture.vault) {
            var added: CFTypeRef?
            let status = SecItemAdd(
                [
                    kSecClass as String: kSecClassGenericPassword, kSecAttrAccount as String: "alice",
                    kSecValueData as String: Data("v".utf8), kSecReturnPersistentRef as String: true,
                ] as CFDictionary, &added)
            #expect(status == errSecSuccess)
            let reference = try #require(added as? Data)

            var found: CFTypeRef?
            let query = [kSecValuePersistentRef as String: reference, kSecReturnData as String: true] as CFDictionary
            #expect(SecItemCopyMatching(query, &found) == errSecSuccess)
            #expect(found as? Data == Data("v".utf8))

            #expect(SecItemDelete([kSecValuePersistentRef as String: reference] as CFDictionary) == errSecSuccess)
            #expect(SecItemCopyMatching(query, &found) == errSecItemNotFound)
            #expect(found == nil)
        }
    }

    // developer.apple.com/documentation/security/errsecinteractionnotallowed
    @Test func copyMatching_whileVaultLocked_returnsInteractionNotAllowed() throws {
        let fixture = try VaultFixture()
        SecItemStore.withStore(fixture.vault) { #expect(addPassword(account: "alice") == errSecSuccess) }
        fixture.vault.lockAll()
        SecItemStore.withStore(fixture.vault) {
            var result: CFTypeRef?
            let query: [String: Any] = [kSecClass as String: kSecClassGenericPassword, kSecReturnData as String: true]
            #expect(SecItemCopyMatching(query as CFDictionary, &result) == errSecInteractionNotAllowed)
            #expect(result == nil)
        }
    }

    @Test func updateData_thenCopy_returnsNewDataAndKeepsCreationDate() throws {
        let fixture = try VaultFixture()
        try SecItemStore.withStore(fixture.vault) {
            #expect(addPassword(account: "alice", data: "old") == errSecSuccess)
            let query: [String: Any] = [kSecClass as String: kSecClassGenericPassword, kSecAttrAccount as String: "alice"]
            var before: CFTypeRef?
            #expect(SecItemCopyMatching(query.merging([kSecReturnAttributes as String: true]) { $1 } as CFDictionary, &before) == errSecSuccess)
            #expect(SecItemUpdate(query as CFDictionary, [kSecValueData as String: Data("new".utf8)] as CFDictionary) == errSecSuccess)
            var after: CFTypeRef?
            let both = query.merging([kSecReturnAttributes as String: true, kSecReturnData as String: true]) { $1 }
            #expect(SecItemCopyMatching(both as CFDictionary, &after) == errSecSuccess)
            let attributes = try #require(after as? [String: Any])
            #expect(attributes[kSecValueData as String] as? Data == Data("new".utf8))
            let created = (before as? [String: Any])?[kSecAttrCreationDate as String] as? Date
            #expect(created != nil)
            #expect(attributes[kSecAttrCreationDate as String] as? Date == created)
        }
    }

    // developer.apple.com/documentation/security/ksecattrsynchronizable
    @Test func deleteWithoutSynchronizable_leavesTheSynchronizableItem() throws {
        let fixture = try VaultFixture()
        SecItemStore.withStore(fixture.vault) {
            #expect(addPassword(account: "alice", data: "local") == errSecSuccess)
            #expect(addPassword(account: "alice", data: "synced", [kSecAttrSynchronizable as String: true]) == errSecSuccess)
            let query: [String: Any] = [kSecClass as String: kSecClassGenericPassword, kSecAttrAccount as String: "alice"]
            #expect(SecItemDelete(query as CFDictionary) == errSecSuccess)
            var result: CFTypeRef?
            let any = query.merging([
                kSecAttrSynchronizable as String: kSecAttrSynchronizableAny, kSecReturnData as String: true,
            ]) { $1 }
            #expect(SecItemCopyMatching(any as CFDictionary, &result) == errSecSuccess)
            #expect(result as? Data == Data("synced".utf8))
        }
    }

    @Test func returnedAttributes_useAppleKeysAndValues() throws {
        let fixture = try VaultFixture { $0.accessGroups = ["com.example.app"] }
        try SecItemStore.withStore(fixture.vault) {
            #expect(addPassword(account: "alice", [kSecAttrLabel as String: "API token"]) == errSecSuccess)
            var result: CFTypeRef?
            let query: [String: Any] = [
                kSecClass as String: kSecClassGenericPassword, kSecAttrAccount as String: "alice",
                kSecReturnAttributes as String: kCFBooleanTrue as Any,
            ]
            #expect(SecItemCopyMatching(query as CFDictionary, &result) == errSecSuccess)
            let attributes = try #require(result as? NSDictionary as? [String: Any])
            #expect(attributes["class"] as? String == "genp")
            #expect(attributes["acct"] as? String == "alice")
            #expect(attributes["svce"] as? String == "api.example.com")
            #expect(attributes["labl"] as? String == "API token")
            #expect(attributes["pdmn"] as? String == "ak", "Apple's default protection class")
            #expect(attributes["agrp"] as? String == "com.example.app", "the first entitled group is the default")
            #expect(attributes["sync"] as? Bool == false)
            #expect(attributes["v_Data"] == nil, "data only when kSecReturnData asks for it")
        }
    }

    @Test func internetPassword_roundTripsServerProtocolAndPort() throws {
        let fixture = try VaultFixture()
        try SecItemStore.withStore(fixture.vault) {
            let item: [String: Any] = [
                kSecClass as String: kSecClassInternetPassword,
                kSecAttrServer as String: "example.com",
                kSecAttrProtocol as String: kSecAttrProtocolHTTPS,
                kSecAttrPort as String: 443,
                kSecAttrAccount as String: "alice",
                kSecValueData as String: Data("pw".utf8),
            ]
            #expect(SecItemAdd(item as CFDictionary, nil) == errSecSuccess)
            #expect(SecItemAdd(item as CFDictionary, nil) == errSecDuplicateItem)
            var result: CFTypeRef?
            let query: [String: Any] = [
                kSecClass as String: kSecClassInternetPassword, kSecAttrServer as String: "example.com",
                kSecReturnAttributes as String: true, kSecReturnData as String: true,
            ]
            #expect(SecItemCopyMatching(query as CFDictionary, &result) == errSecSuccess)
            let attributes = try #require(result as? [String: Any])
            #expect(attributes[kSecAttrProtocol as String] as? String == "htps")
            #expect(attributes[kSecAttrPort as String] as? Int == 443)
            #expect(attributes[kSecValueData as String] as? Data == Data("pw".utf8))
        }
    }

    @Test func matchLimitAsNSNumber_isACount() throws {
        let fixture = try VaultFixture()
        SecItemStore.withStore(fixture.vault) {
            for account in ["a", "b", "c"] { #expect(addPassword(account: account) == errSecSuccess) }
            var result: CFTypeRef?
            let query: [String: Any] = [
                kSecClass as String: kSecClassGenericPassword, kSecReturnAttributes as String: NSNumber(value: true),
                kSecMatchLimit as String: NSNumber(value: 2),
            ]
            #expect(SecItemCopyMatching(query as CFDictionary, &result) == errSecSuccess)
            #expect((result as? [[String: Any]])?.count == 2)
        }
    }

    // MARK: The store

    // setDefault, process-wide, is tested in ZeroEditTests, serialized with the other tests of
    // the process-wide store and entitlements.

    @Test func withStore_nestedAndInChildTasks_eachCallSeesItsOwnVault() async throws {
        let first = try VaultFixture()
        let second = try VaultFixture()
        await SecItemStore.withStore(first.vault) {
            SecItemStore.withStore(second.vault) {
                #expect(addPassword(account: "inner") == errSecSuccess)
            }
            #expect(addPassword(account: "outer") == errSecSuccess)
            let child = await Task { addPassword(account: "child") }.value
            #expect(child == errSecSuccess)
        }
        #expect(try first.vault.contains(.genericPassword(account: "outer")))
        #expect(try first.vault.contains(.genericPassword(account: "child")))
        #expect(try !first.vault.contains(.genericPassword(account: "inner")))
        #expect(try second.vault.contains(.genericPassword(account: "inner")))
    }

    // MARK: Error messages and spellings

    // developer.apple.com/documentation/security/seccopyerrormessagestring(_:_:)
    @Test(arguments: [
        (errSecSuccess, 0, "No error."),
        (errSecParam, -50, "One or more parameters passed to a function were not valid."),
        (errSecUserCanceled, -128, "User canceled the operation."),
        (errSecAuthFailed, -25293, "The user name or passphrase you entered is not correct."),
        (errSecDuplicateItem, -25299, "The specified item already exists in the keychain."),
        (errSecItemNotFound, -25300, "The specified item could not be found in the keychain."),
        (errSecInteractionNotAllowed, -25308, "User interaction is not allowed."),
        (errSecDecode, -26275, "Unable to decode the provided data."),
        (errSecMissingEntitlement, -34018, "A required entitlement isn't present."),
    ])
    func errorConstant_hasAppleValueAndMessage(_ status: OSStatus, _ value: Int32, _ message: String) {
        #expect(status == value)
        #expect(SecCopyErrorMessageString(status, nil).map { $0 as String } == message)
    }

    @Test func errorMessage_ofUnknownStatus_namesTheNumber() {
        #expect(SecCopyErrorMessageString(-1, nil) == "OSStatus -1")
    }

    @Test func statusOfLockboxError_matchesTheSecItemConstant() {
        #expect(LockboxError.Code.itemNotFound.rawValue == errSecItemNotFound)
        #expect(LockboxError.Code.duplicateItem.rawValue == errSecDuplicateItem)
        #expect(LockboxError.Code.interactionNotAllowed.rawValue == errSecInteractionNotAllowed)
        #expect(LockboxError.Code.missingEntitlement.rawValue == errSecMissingEntitlement)
    }

    @Test func accessControlCreation_withInvalidProtection_returnsNilAndParamError() {
        var error: Unmanaged<CFError>?
        let control = SecAccessControlCreateWithFlags(kCFAllocatorDefault, "not-a-class", .userPresence, &error)
        #expect(control == nil)
        let reported = error?.takeRetainedValue()
        #expect(reported?.code == Int(errSecParam))
    }

    @Test func accessControlCreation_keepsProtectionAndFlags() throws {
        let control = try #require(
            SecAccessControlCreateWithFlags(nil, kSecAttrAccessibleAfterFirstUnlock as CFTypeRef, [.biometryAny, .or, .devicePasscode], nil))
        #expect(control.protection == .afterFirstUnlock)
        #expect(control.flags == [.biometryAny, .or, .devicePasscode])
        #expect(control.flags.rawValue == (1 << 1) | (1 << 14) | (1 << 4), "Apple's raw values")
    }

    @Test func securitySpellings_compileAndWork() throws {
        let fixture = try VaultFixture()
        try SecItemStore.withStore(fixture.vault) {
            // [CFString: Any] dictionaries, kCFBooleanTrue, and `CFTypeRef?` results, as Apple code writes them.
            let add: [CFString: Any] = [
                kSecClass: kSecClassGenericPassword, kSecAttrAccount: "bob", kSecValueData: Data("x".utf8) as CFData,
            ]
            #expect(SecItemAdd(add as CFDictionary, nil) == errSecSuccess)
            let query: [CFString: Any] = [
                kSecClass: kSecClassGenericPassword, kSecAttrAccount: "bob", kSecReturnData: kCFBooleanTrue!,
                kSecMatchLimit: kSecMatchLimitOne, kSecUseAuthenticationUI: kSecUseAuthenticationUIFail,
            ]
            var item: CFTypeRef?
            let status: OSStatus = SecItemCopyMatching(query as CFDictionary, &item)
            #expect(status == errSecSuccess)
            let data = try #require(item as? Data)
            #expect(String(data: data, encoding: .utf8) == "x")
        }
    }
}
#endif
