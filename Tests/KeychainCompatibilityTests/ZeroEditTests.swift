#if !canImport(Darwin)
import Foundation
import KeychainCompatibility
import Lockbox
import LockboxTestSupport
import Testing

/// What Keychain code written for iOS relies on beyond the four SecItem functions: the spellings
/// that must compile as they are, and the behaviours wrapper libraries' tests check. Each test
/// names the Apple page or source file its expectation comes from.
@Suite("Keychain code unchanged", .serialized)
struct ZeroEditTests {
    private func password(_ account: Any, service: Any = "api.example.com", _ extra: [String: Any] = [:]) -> [String: Any] {
        var attributes: [String: Any] = [
            kSecClass as String: kSecClassGenericPassword, kSecAttrService as String: service, kSecAttrAccount as String: account,
            kSecValueData as String: Data("secret".utf8),
        ]
        attributes.merge(extra) { $1 }
        return attributes
    }

    // MacTypes.h: `noErr = 0`; SecBase.h: errSecSuccess = 0.
    // CFError.h: CFErrorGetDomain, CFErrorGetCode, CFErrorCopyUserInfo.
    // SecRandom.h: SecRandomCopyBytes(kSecRandomDefault, count, bytes) returns 0 on success.
    @Test func foundationSpellings_compileAndWork() throws {
        #expect(noErr == errSecSuccess)
        var bytes = [UInt8](repeating: 0, count: 32)
        #expect(SecRandomCopyBytes(kSecRandomDefault, bytes.count, &bytes) == errSecSuccess)
        #expect(bytes != [UInt8](repeating: 0, count: 32))
        var error: Unmanaged<CFError>?
        #expect(SecAccessControlCreateWithFlags(kCFAllocatorDefault, "not-a-class" as CFString, .userPresence, &error) == nil)
        let failure = try #require(error?.takeRetainedValue())
        #expect(CFErrorGetCode(failure) == Int(errSecParam))
        #expect(CFErrorGetDomain(failure) as String == "NSOSStatusErrorDomain")
        #expect(CFErrorCopyUserInfo(failure).count > 0)

        // [String: AnyObject] and [String?: AnyObject] as CFDictionary; a CFString as AnyObject
        // (developer.apple.com/documentation/security/ksecclassgenericpassword: a CFString).
        let objects: [String: AnyObject] = [
            kSecClass as String: kSecClassGenericPassword, kSecAttrAccount as String: "alice" as AnyObject,
            kSecReturnData as String: kCFBooleanTrue,
        ]
        let optionalKeys: [String?: AnyObject] = [kSecClass as String: kSecClassGenericPassword as AnyObject]
        #expect((objects as CFDictionary).count == 3)
        #expect((optionalKeys as CFDictionary).count == 1)

        // SecAccessControl is a CF type on Apple platforms: Hashable.
        let first = try #require(SecAccessControlCreateWithFlags(nil, kSecAttrAccessibleWhenUnlocked, .userPresence, nil))
        let second = try #require(SecAccessControlCreateWithFlags(nil, kSecAttrAccessibleWhenUnlocked, .userPresence, nil))
        #expect(first == second)
        #expect(Set([first, second]).count == 1)
    }

    // iOS stores the account and service as blobs (securityd's schema, SecItemSchema.c:
    // `SECDB_ATTR(v6acct, "acct", Blob, ...)`, `SECDB_ATTR(v6svce, "svce", Blob, ...)`), so Data
    // given is stored and returned as Data, and a string of the same bytes is another value
    // (SQLite compares TEXT and BLOB values as different).
    @Test func dataAccountAndService_areStoredAndReturnedAsData() throws {
        let fixture = try VaultFixture()
        try SecItemStore.withStore(fixture.vault) {
            let account = Data("alice".utf8)
            let service = Data([0x00, 0xff, 0x10])
            #expect(SecItemAdd(password(account, service: service) as CFDictionary, nil) == errSecSuccess)
            var result: CFTypeRef?
            let query: [String: Any] = [
                kSecClass as String: kSecClassGenericPassword, kSecAttrAccount as String: account, kSecAttrService as String: service,
                kSecReturnAttributes as String: true, kSecReturnData as String: true,
            ]
            #expect(SecItemCopyMatching(query as CFDictionary, &result) == errSecSuccess)
            let attributes = try #require(result as? [String: Any])
            #expect(attributes[kSecAttrAccount as String] as? Data == account)
            #expect(attributes[kSecAttrService as String] as? Data == service)
            #expect(attributes[kSecValueData as String] as? Data == Data("secret".utf8))
            var text = query
            text[kSecAttrAccount as String] = "alice"
            #expect(SecItemCopyMatching(text as CFDictionary, &result) == errSecItemNotFound)
        }
    }

    // The same blob/text distinction, against a crafted string: a CFString may start with a NUL,
    // so the string that spells a Data account's stored text (NUL, `data:`, base64) is still
    // another account, and nothing done with it reaches the Data account's item.
    @Test func stringSpellingADataAccountsStoredText_isAnotherAccount() throws {
        let fixture = try VaultFixture()
        try SecItemStore.withStore(fixture.vault) {
            let account = Data("alice".utf8)
            let forged = "\u{0}data:" + account.base64EncodedString()
            #expect(SecItemAdd(password(account) as CFDictionary, nil) == errSecSuccess)
            let byForged: [String: Any] = [
                kSecClass as String: kSecClassGenericPassword, kSecAttrService as String: "api.example.com",
                kSecAttrAccount as String: forged,
            ]
            var result: CFTypeRef?
            #expect(SecItemCopyMatching(byForged as CFDictionary, &result) == errSecItemNotFound)
            #expect(SecItemUpdate(byForged as CFDictionary, [kSecValueData as String: Data("changed".utf8)] as CFDictionary) == errSecItemNotFound)
            #expect(SecItemDelete(byForged as CFDictionary) == errSecItemNotFound)
            #expect(SecItemAdd(password(forged) as CFDictionary, nil) == errSecSuccess)

            var forgedQuery = byForged
            forgedQuery[kSecReturnAttributes as String] = true
            #expect(SecItemCopyMatching(forgedQuery as CFDictionary, &result) == errSecSuccess)
            #expect((result as? [String: Any])?[kSecAttrAccount as String] as? String == forged)
            var dataQuery = forgedQuery
            dataQuery[kSecAttrAccount as String] = account
            dataQuery[kSecReturnData as String] = true
            #expect(SecItemCopyMatching(dataQuery as CFDictionary, &result) == errSecSuccess)
            let attributes = try #require(result as? [String: Any])
            #expect(attributes[kSecAttrAccount as String] as? Data == account)
            #expect(attributes[kSecValueData as String] as? Data == Data("secret".utf8))
        }
    }

    // Apple's SecAccessControl.c, SecAccessControlCreateWithFlags: every access control gets
    // `SecAccessControlAddConstraintForOperation(access_control, kAKSKeyOpDelete, kCFBooleanTrue)`,
    // so SecItemDelete never asks the user; kSecUseAuthenticationUISkip leaves
    // items that need authentication out of the results (SecItem.h, kSecUseAuthenticationUISkip:
    // "Specifies that the system should silently skip any items that require user authentication").
    @Test func accessControlledItems_deleteWithoutAuthentication_andUISkipSkipsThem() throws {
        let fixture = try VaultFixture()
        try SecItemStore.withStore(fixture.vault) {
            let control = try #require(SecAccessControlCreateWithFlags(nil, kSecAttrAccessibleWhenUnlockedThisDeviceOnly, .userPresence, nil))
            #expect(SecItemAdd(password("guarded", [kSecAttrAccessControl as String: control]) as CFDictionary, nil) == errSecSuccess)
            #expect(SecItemAdd(password("plain") as CFDictionary, nil) == errSecSuccess)

            var result: CFTypeRef?
            let all: [String: Any] = [
                kSecClass as String: kSecClassGenericPassword, kSecMatchLimit as String: kSecMatchLimitAll,
                kSecReturnAttributes as String: true, kSecReturnData as String: true,
                kSecUseAuthenticationUI as String: kSecUseAuthenticationUISkip,
            ]
            #expect(SecItemCopyMatching(all as CFDictionary, &result) == errSecSuccess)
            let rows = try #require(result as? [[String: Any]])
            #expect(rows.map { $0[kSecAttrAccount as String] as? String } == ["plain"])

            var failing = all
            failing[kSecUseAuthenticationUI as String] = kSecUseAuthenticationUIFail
            #expect(SecItemCopyMatching(failing as CFDictionary, &result) == errSecInteractionNotAllowed)

            let guarded: [String: Any] = [kSecClass as String: kSecClassGenericPassword, kSecAttrAccount as String: "guarded"]
            #expect(SecItemDelete(guarded as CFDictionary) == errSecSuccess)
            #expect(SecItemDelete(guarded as CFDictionary) == errSecItemNotFound)
        }
    }

    // Apple's securityd, SecDbQuery.c, query_create_with_limit: the implicit
    // `kSecAttrSynchronizable = false` is added only to queries "that did not specify a
    // kSecAttrSynchronizable attribute, and did not contain a persistent reference".
    @Test func persistentReference_findsASynchronizableItem() throws {
        let fixture = try VaultFixture()
        try SecItemStore.withStore(fixture.vault) {
            var added: CFTypeRef?
            let attributes = password("synced", [kSecAttrSynchronizable as String: true, kSecReturnPersistentRef as String: true])
            #expect(SecItemAdd(attributes as CFDictionary, &added) == errSecSuccess)
            let reference = try #require(added as? Data)
            var found: CFTypeRef?
            let query: [String: Any] = [kSecValuePersistentRef as String: reference, kSecReturnData as String: true]
            #expect(SecItemCopyMatching(query as CFDictionary, &found) == errSecSuccess)
            #expect(found as? Data == Data("secret".utf8))
            // Naming kSecAttrSynchronizable = false still excludes it.
            var excluded = query
            excluded[kSecAttrSynchronizable as String] = false
            #expect(SecItemCopyMatching(excluded as CFDictionary, &found) == errSecItemNotFound)
        }
    }

    // The process-wide store and entitlements: these tests share them, so they run in this
    // serialized suite.
    @Test func setDefault_outsideWithStore_sendsCallsToThatStore() throws {
        let fixture = try VaultFixture()
        SecItemStore.setDefault(fixture.vault)
        defer { SecItemStore.setDefault(nil) }
        #expect(SecItemAdd(password("set-default-\(UUID())") as CFDictionary, nil) == errSecSuccess)
        var query = Query.genericPassword(service: "api.example.com")
        query.limit = .all
        #expect(try fixture.vault.items(matching: query).count == 1)
    }

    // An iOS process whose entitlements hold no keychain access group gets
    // errSecMissingEntitlement (-34018) from every SecItem call; declared entitlements without a
    // group (an entitlements file with neither keychain-access-groups nor application-identifier,
    // and no bundle identifier) must not read as "no entitlements", which opens every group.
    @Test func declaredEntitlementsNamingNoGroup_areMissingEntitlement_notEveryGroup() throws {
        SecItemStore.setDefault(nil)
        SecItemStore.setEntitlements(KeychainEntitlements(applicationIdentifier: nil, keychainAccessGroups: [""]))
        defer { SecItemStore.setEntitlements(nil) }
        #expect(status { _ = try SecItemStore.current() } == errSecMissingEntitlement)
        let query: [String: Any] = [kSecClass as String: kSecClassGenericPassword, kSecMatchLimit as String: kSecMatchLimitAll]
        #expect(SecItemCopyMatching(query as CFDictionary, nil) == errSecMissingEntitlement)

        // Such a file: an Xcode entitlements file with other keys only.
        let directory = TemporaryDirectory("lockbox-entitlements-empty")
        let empty = directory.file("Empty.entitlements")
        try Data("<plist version=\"1.0\"><dict><key>aps-environment</key><string>development</string></dict></plist>".utf8)
            .write(to: URL(fileURLWithPath: empty))
        #expect(try KeychainEntitlements(contentsOf: URL(fileURLWithPath: empty)).accessGroups.isEmpty)
    }

    // Access groups: "Sharing access to keychain items among a collection of apps"
    // (developer.apple.com/documentation/security/sharing-access-to-keychain-items-among-a-collection-of-apps):
    // the app's groups are keychain-access-groups, then its application identifier, then its
    // app groups; the first is the default; any other group is errSecMissingEntitlement.
    @Test func entitlementsFile_declaresTheGroups_andOthersAreRefused() throws {
        let directory = TemporaryDirectory("lockbox-entitlements")
        let file = directory.file("App.entitlements")
        let plist = """
            <?xml version="1.0" encoding="UTF-8"?>
            <!DOCTYPE plist PUBLIC "-//Apple//DTD PLIST 1.0//EN" "http://www.apple.com/DTDs/PropertyList-1.0.dtd">
            <plist version="1.0"><dict>
                <key>application-identifier</key><string>TEAM.com.example.app</string>
                <key>keychain-access-groups</key><array><string>TEAM.com.example.shared</string></array>
                <key>com.apple.security.application-groups</key><array><string>group.com.example</string></array>
            </dict></plist>
            """
        try Data(plist.utf8).write(to: URL(fileURLWithPath: file))
        let entitlements = try KeychainEntitlements(contentsOf: URL(fileURLWithPath: file))
        #expect(entitlements.accessGroups == ["TEAM.com.example.shared", "TEAM.com.example.app", "group.com.example"])

        let fixture = try VaultFixture { $0.accessGroups = entitlements.accessGroups }
        SecItemStore.withStore(fixture.vault) {
            var added: CFTypeRef?
            #expect(SecItemAdd(password("a", [kSecReturnAttributes as String: true]) as CFDictionary, &added) == errSecSuccess)
            #expect((added as? [String: Any])?[kSecAttrAccessGroup as String] as? String == "TEAM.com.example.shared")
            #expect(SecItemAdd(password("b", [kSecAttrAccessGroup as String: "TEAM.com.example.app"]) as CFDictionary, nil) == errSecSuccess)
            #expect(SecItemAdd(password("c", [kSecAttrAccessGroup as String: "OTHER.com.example"]) as CFDictionary, nil) == errSecMissingEntitlement)
        }

        // The same declaration through the API.
        SecItemStore.setEntitlements(entitlements)
        #expect(try SecItemStore.entitlements() == entitlements)
        SecItemStore.setEntitlements(nil)

        let malformed = directory.file("Bad.entitlements")
        try Data("<plist version=\"1.0\"><dict><key>keychain-access-groups</key><string>x</string></dict></plist>".utf8)
            .write(to: URL(fileURLWithPath: malformed))
        #expect(throws: LockboxError.self) { try KeychainEntitlements(contentsOf: URL(fileURLWithPath: malformed)) }
    }
}
#endif
