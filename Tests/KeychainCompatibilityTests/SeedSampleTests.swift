#if !canImport(Darwin)
import Foundation
import KeychainCompatibility
import Lockbox
import LockboxTestSupport
import Testing

/// The seeds' samples, run unchanged against a real vault in a temporary directory.
/// Each test gives the samples its own vault through `SecItemStore.withStore`.
@Suite struct SeedSampleTests {
    /// The status a sample threw as `KeychainError.unexpectedStatus`, or nil when it did not throw.
    func thrownStatus(_ body: () throws -> Void) -> OSStatus? {
        do {
            try body()
            return nil
        } catch KeychainError.unexpectedStatus(let status) {
            return status
        } catch {
            Issue.record("unexpected error \(error)")
            return nil
        }
    }

    // MARK: Seed 001/004: saveToken(token:service:) and readToken(service:)

    @Test func saveToken_thenReadToken_returnsTheSavedToken() throws {
        let fixture = try VaultFixture()
        let token = makeCanary("token")
        let read = try SecItemStore.withStore(fixture.vault) {
            try saveToken(token: token, service: "api.example.com")
            return try readToken(service: "api.example.com")
        }
        #expect(read == token)
    }

    @Test func saveToken_calledTwice_replacesTheTokenWithoutDuplicateError() throws {
        let fixture = try VaultFixture()
        let read = try SecItemStore.withStore(fixture.vault) {
            try saveToken(token: "first", service: "api.example.com")
            try saveToken(token: "second", service: "api.example.com")
            return try readToken(service: "api.example.com")
        }
        #expect(read == "second")
        var query = Query.genericPassword(service: "api.example.com", account: "auth_token")
        query.limit = .all
        #expect(try fixture.vault.items(matching: query).count == 1)
    }

    @Test func saveToken_storesWhenUnlockedThisDeviceOnlyInTheVault() throws {
        let fixture = try VaultFixture()
        try SecItemStore.withStore(fixture.vault) {
            try saveToken(token: "t", service: "api.example.com")
        }
        let item = try fixture.vault.item(matching: .genericPassword(service: "api.example.com", account: "auth_token"))
        #expect(item.attributes.accessibility == .whenUnlockedThisDeviceOnly)
        #expect(item.data == SecretBytes(utf8: "t"))
    }

    @Test func readToken_withNoSavedToken_throwsItemNotFoundStatus() throws {
        let fixture = try VaultFixture()
        // developer.apple.com/documentation/security/errsecitemnotfound
        SecItemStore.withStore(fixture.vault) {
            let status = thrownStatus { _ = try readToken(service: "missing") }
            #expect(status == errSecItemNotFound)
            #expect(status == -25300)
        }
    }

    @Test func readToken_whileVaultLocked_throwsInteractionNotAllowedNotNotFound() throws {
        let fixture = try VaultFixture()
        try SecItemStore.withStore(fixture.vault) {
            try saveToken(token: "t", service: "api.example.com")
        }
        fixture.vault.lockAll()
        // developer.apple.com/documentation/security/errsecinteractionnotallowed
        SecItemStore.withStore(fixture.vault) {
            #expect(thrownStatus { _ = try readToken(service: "api.example.com") } == errSecInteractionNotAllowed)
        }
    }

    // MARK: Seed 001/004: saveWithBiometry(data:key:)

    @Test func saveWithBiometry_onLinuxWithoutBiometry_throwsAuthFailedAndStoresNothing() throws {
        let fixture = try VaultFixture()
        // See docs/SECITEM.md#biometry: Apple's status where biometry is not available.
        SecItemStore.withStore(fixture.vault) {
            let status = thrownStatus { try saveWithBiometry(data: Data("secret".utf8), key: "biometric_key") }
            #expect(status == errSecAuthFailed)
            #expect(status == -25293)
        }
        var query = Query(.genericPassword)
        query.attributes.account = "biometric_key"
        #expect(try fixture.vault.contains(query) == false)
    }

    // MARK: Seed 001/004: saveSharedToken(token:)

    @Test func saveSharedToken_withTheGroupEntitled_storesTheTokenInThatGroup() throws {
        let fixture = try VaultFixture { $0.accessGroups = ["com.example.app", "group.com.example.shared"] }
        let token = Data(makeCanary("shared").utf8)
        SecItemStore.withStore(fixture.vault) {
            saveSharedToken(token: token)
        }
        let item = try fixture.vault.item(matching: .genericPassword(account: "shared_token", accessGroup: "group.com.example.shared"))
        #expect(item.data == SecretBytes(copying: token))
        #expect(item.attributes.accessibility == .whenUnlockedThisDeviceOnly)
    }

    @Test func saveSharedToken_withoutTheGroupEntitled_storesNothing() throws {
        let fixture = try VaultFixture { $0.accessGroups = ["com.example.app"] }
        SecItemStore.withStore(fixture.vault) {
            saveSharedToken(token: Data("t".utf8))
            // The sample ignores the status; it is errSecMissingEntitlement, as on iOS.
            // developer.apple.com/documentation/security/errsecmissingentitlement
            let status = SecItemAdd(
                [
                    kSecClass as String: kSecClassGenericPassword, kSecAttrAccount as String: "shared_token",
                    kSecAttrAccessGroup as String: "group.com.example.shared",
                ] as CFDictionary, nil)
            #expect(status == errSecMissingEntitlement)
        }
        #expect(try fixture.vault.contains(.genericPassword(account: "shared_token")) == false)
    }

    // MARK: Seed 002/003: saveToken(_:forAccount:) and retrieveToken(forAccount:)

    @Test func saveTokenForAccount_thenRetrieveToken_returnsTheToken() throws {
        let fixture = try VaultFixture()
        let token = makeCanary("jwt")
        SecItemStore.withStore(fixture.vault) {
            #expect(saveToken(token, forAccount: "alice"))
            #expect(saveToken(token, forAccount: "alice"), "the delete-then-add idiom never reports a duplicate")
            #expect(retrieveToken(forAccount: "alice") == token)
        }
    }

    @Test func retrieveToken_forUnknownAccount_returnsNil() throws {
        let fixture = try VaultFixture()
        SecItemStore.withStore(fixture.vault) {
            #expect(retrieveToken(forAccount: "nobody") == nil)
        }
    }

    @Test func saveWithUserPresence_storesTheItem_andAReadWithoutVerificationCannotOpenIt() throws {
        let fixture = try VaultFixture()
        SecItemStore.withStore(fixture.vault) {
            saveWithUserPresence(tokenData: Data("t".utf8), account: "alice")
            // Without an authentication context nobody can give the passphrase: the read fails
            // (errSecInteractionNotAllowed) and the sample's reader returns nil.
            #expect(retrieveToken(forAccount: "alice") == nil)
        }
        var query = Query(.genericPassword)
        query.attributes.account = "alice"
        #expect(try fixture.vault.contains(query))
        #expect(throws: LockboxError.self) { _ = try fixture.vault.data(matching: query) }
    }

    // MARK: Seed 002/003: updateToken(_:forAccount:) and deleteItem(forAccount:)

    @Test func updateToken_ofASavedToken_returnsTrueAndReplacesTheValue() throws {
        let fixture = try VaultFixture()
        SecItemStore.withStore(fixture.vault) {
            #expect(saveToken("old", forAccount: "alice"))
            #expect(updateToken("new", forAccount: "alice"))
            #expect(retrieveToken(forAccount: "alice") == "new")
        }
    }

    @Test func updateToken_withNoSavedToken_returnsFalse() throws {
        let fixture = try VaultFixture()
        // developer.apple.com/documentation/security/secitemupdate(_:_:): errSecItemNotFound
        SecItemStore.withStore(fixture.vault) {
            #expect(updateToken("new", forAccount: "nobody") == false)
            #expect(retrieveToken(forAccount: "nobody") == nil)
        }
    }

    @Test func deleteItem_ofASavedToken_returnsTrueThenFalse() throws {
        let fixture = try VaultFixture()
        SecItemStore.withStore(fixture.vault) {
            #expect(saveToken("t", forAccount: "alice"))
            #expect(deleteItem(forAccount: "alice"))
            #expect(retrieveToken(forAccount: "alice") == nil)
            // developer.apple.com/documentation/security/secitemdelete(_:): nothing left to delete
            #expect(deleteItem(forAccount: "alice") == false)
        }
    }

    // MARK: Seed 002/003: actor KeychainManager

    @Test func keychainManagerSaveToken_fromConcurrentTasks_savesEveryAccount() async throws {
        let fixture = try VaultFixture()
        let manager = KeychainManager()
        let saved = await SecItemStore.withStore(fixture.vault) {
            await withTaskGroup(of: Bool.self) { group in
                for index in 0..<4 {
                    group.addTask { await manager.saveToken("token-\(index)", for: "user-\(index)") }
                }
                return await group.reduce(into: [Bool]()) { $0.append($1) }
            }
        }
        #expect(saved == [true, true, true, true])
        SecItemStore.withStore(fixture.vault) {
            for index in 0..<4 {
                #expect(retrieveToken(forAccount: "user-\(index)") == "token-\(index)")
            }
        }
    }
}
#endif
