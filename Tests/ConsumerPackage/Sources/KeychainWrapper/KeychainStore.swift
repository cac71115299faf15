// A Keychain wrapper in the style of the popular open-source ones (a store with set/get/delete,
// allKeys, Data accounts, access groups, synchronizable items, persistent references and access
// control). Written for iOS; it compiles on Linux unchanged.
import Foundation
import Security

public enum KeychainStoreError: Error, Equatable {
    case unhandled(status: OSStatus)
    case unexpectedData
    case itemNotFound
    case duplicate
    case missingEntitlement
}

public struct KeychainStore {
    public enum Accessibility {
        case whenUnlocked, afterFirstUnlock, whenUnlockedThisDeviceOnly, afterFirstUnlockThisDeviceOnly

        var value: CFString {
            switch self {
            case .whenUnlocked: return kSecAttrAccessibleWhenUnlocked
            case .afterFirstUnlock: return kSecAttrAccessibleAfterFirstUnlock
            case .whenUnlockedThisDeviceOnly: return kSecAttrAccessibleWhenUnlockedThisDeviceOnly
            case .afterFirstUnlockThisDeviceOnly: return kSecAttrAccessibleAfterFirstUnlockThisDeviceOnly
            }
        }
    }

    public let service: String
    public let accessGroup: String?
    public let synchronizable: Bool
    public let accessibility: Accessibility

    public init(service: String? = nil, accessGroup: String? = nil, synchronizable: Bool = false,
                accessibility: Accessibility = .afterFirstUnlock) {
        // Like many wrappers: the service defaults to the bundle identifier.
        self.service = service ?? Bundle.main.bundleIdentifier ?? "KeychainStore"
        self.accessGroup = accessGroup
        self.synchronizable = synchronizable
        self.accessibility = accessibility
    }

    private func baseQuery(account: String? = nil) -> [String: AnyObject] {
        var query: [String: AnyObject] = [
            kSecClass as String: kSecClassGenericPassword,
            kSecAttrService as String: service as AnyObject,
        ]
        if let account = account { query[kSecAttrAccount as String] = account as AnyObject }
        if let accessGroup = accessGroup { query[kSecAttrAccessGroup as String] = accessGroup as AnyObject }
        query[kSecAttrSynchronizable as String] = synchronizable ? kCFBooleanTrue : kCFBooleanFalse
        return query
    }

    private static func check(_ status: OSStatus) throws {
        switch status {
        case noErr: return
        case errSecItemNotFound: throw KeychainStoreError.itemNotFound
        case errSecDuplicateItem: throw KeychainStoreError.duplicate
        case errSecMissingEntitlement: throw KeychainStoreError.missingEntitlement
        default: throw KeychainStoreError.unhandled(status: status)
        }
    }

    // MARK: set / get / delete

    public func set(_ data: Data, forKey key: String) throws {
        var query = baseQuery(account: key)
        let status = SecItemCopyMatching(query as CFDictionary, nil)
        if status == errSecSuccess {
            let attributes: [String: AnyObject] = [kSecValueData as String: data as AnyObject]
            try Self.check(SecItemUpdate(query as CFDictionary, attributes as CFDictionary))
            return
        }
        query[kSecValueData as String] = data as AnyObject
        query[kSecAttrAccessible as String] = accessibility.value
        try Self.check(SecItemAdd(query as CFDictionary, nil))
    }

    public func set(_ string: String, forKey key: String) throws {
        try set(Data(string.utf8), forKey: key)
    }

    public func data(forKey key: String) throws -> Data? {
        var query = baseQuery(account: key)
        query[kSecReturnData as String] = kCFBooleanTrue
        query[kSecMatchLimit as String] = kSecMatchLimitOne
        var result: AnyObject?
        let status = withUnsafeMutablePointer(to: &result) { SecItemCopyMatching(query as CFDictionary, UnsafeMutablePointer($0)) }
        if status == errSecItemNotFound { return nil }
        try Self.check(status)
        guard let data = result as? Data else { throw KeychainStoreError.unexpectedData }
        return data
    }

    public func string(forKey key: String) throws -> String? {
        try data(forKey: key).flatMap { String(data: $0, encoding: .utf8) }
    }

    @discardableResult
    public func remove(forKey key: String) throws -> Bool {
        let status = SecItemDelete(baseQuery(account: key) as CFDictionary)
        if status == errSecItemNotFound { return false }
        try Self.check(status)
        return true
    }

    public func removeAll() throws {
        let status = SecItemDelete(baseQuery() as CFDictionary)
        if status != errSecItemNotFound { try Self.check(status) }
    }

    public func allKeys() throws -> [String] {
        var query = baseQuery()
        query[kSecReturnAttributes as String] = kCFBooleanTrue
        query[kSecMatchLimit as String] = kSecMatchLimitAll
        var result: CFTypeRef?
        let status = SecItemCopyMatching(query as CFDictionary, &result)
        if status == errSecItemNotFound { return [] }
        try Self.check(status)
        guard let items = result as? [[String: Any]] else { throw KeychainStoreError.unexpectedData }
        return items.compactMap { $0[kSecAttrAccount as String] as? String }.sorted()
    }

    // MARK: Data accounts (binary identifiers as accounts)

    public func set(_ data: Data, forDataAccount account: Data) throws {
        let query: [String: Any] = [
            kSecClass as String: kSecClassGenericPassword,
            kSecAttrService as String: service,
            kSecAttrAccount as String: account,
            kSecValueData as String: data,
        ]
        SecItemDelete(query as CFDictionary)
        try Self.check(SecItemAdd(query as CFDictionary, nil))
    }

    public func dataAccounts() throws -> [Data] {
        let query: [String: Any] = [
            kSecClass as String: kSecClassGenericPassword,
            kSecAttrService as String: service,
            kSecReturnAttributes as String: true,
            kSecMatchLimit as String: kSecMatchLimitAll,
        ]
        var result: CFTypeRef?
        let status = SecItemCopyMatching(query as CFDictionary, &result)
        if status == errSecItemNotFound { return [] }
        try Self.check(status)
        return (result as? [[String: Any]] ?? []).compactMap { $0[kSecAttrAccount as String] as? Data }
    }

    // MARK: Persistent references

    public func persistentReference(forKey key: String) throws -> Data? {
        var query = baseQuery(account: key)
        query[kSecReturnPersistentRef as String] = kCFBooleanTrue
        var result: CFTypeRef?
        let status = SecItemCopyMatching(query as CFDictionary, &result)
        if status == errSecItemNotFound { return nil }
        try Self.check(status)
        return result as? Data
    }

    public static func data(forPersistentReference reference: Data) throws -> Data? {
        let query: [String: AnyObject] = [
            kSecValuePersistentRef as String: reference as AnyObject,
            kSecReturnData as String: kCFBooleanTrue,
        ]
        var result: CFTypeRef?
        let status = SecItemCopyMatching(query as CFDictionary, &result)
        if status == errSecItemNotFound { return nil }
        try check(status)
        return result as? Data
    }

    // MARK: Access control

    public func setProtected(_ data: Data, forKey key: String) throws {
        var error: Unmanaged<CFError>?
        guard let access = SecAccessControlCreateWithFlags(kCFAllocatorDefault, kSecAttrAccessibleWhenPasscodeSetThisDeviceOnly,
                                                           .userPresence, &error) else {
            let code = error.map { CFErrorGetCode($0.takeRetainedValue()) } ?? -1
            throw KeychainStoreError.unhandled(status: OSStatus(code))
        }
        var query = baseQuery(account: key)
        query[kSecAttrAccessControl as String] = access
        query[kSecValueData as String] = data as AnyObject
        try Self.check(SecItemAdd(query as CFDictionary, nil))
    }

    public func protectedData(forKey key: String, skipIfAuthenticationNeeded: Bool = false, context: AnyObject? = nil) throws -> Data? {
        var query = baseQuery(account: key)
        query[kSecReturnData as String] = kCFBooleanTrue
        query[kSecUseOperationPrompt as String] = "Read your token" as AnyObject
        if skipIfAuthenticationNeeded { query[kSecUseAuthenticationUI as String] = kSecUseAuthenticationUISkip }
        if let context = context { query[kSecUseAuthenticationContext as String] = context }
        var result: CFTypeRef?
        let status = SecItemCopyMatching(query as CFDictionary, &result)
        if status == errSecItemNotFound { return nil }
        try Self.check(status)
        return result as? Data
    }

    // MARK: Random

    public static func randomKey(count: Int = 32) throws -> Data {
        var bytes = [UInt8](repeating: 0, count: count)
        let status = SecRandomCopyBytes(kSecRandomDefault, bytes.count, &bytes)
        guard status == errSecSuccess else { throw KeychainStoreError.unhandled(status: status) }
        return Data(bytes)
    }
}
