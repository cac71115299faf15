// A file that imports only Foundation, as files do on Apple platforms where Foundation brings
// Security along.
import Foundation

public enum LegacyTokenCache {
    public static func save(_ token: String, account: String) -> OSStatus {
        let query = [
            kSecClass: kSecClassGenericPassword,
            kSecAttrService: "legacy-cache",
            kSecAttrAccount: account,
        ] as [CFString: Any] as CFDictionary
        SecItemDelete(query)
        var attributes = query as! [CFString: Any]
        attributes[kSecValueData] = token.data(using: .utf8)!
        return SecItemAdd(attributes as CFDictionary, nil)
    }

    public static func load(account: String) -> String? {
        let query = [
            kSecClass: kSecClassGenericPassword,
            kSecAttrService: "legacy-cache",
            kSecAttrAccount: account,
            kSecReturnData: kCFBooleanTrue!,
            kSecMatchLimit: kSecMatchLimitOne,
        ] as [CFString: Any]
        var item: CFTypeRef?
        guard SecItemCopyMatching(query as CFDictionary, &item) == noErr, let data = item as? Data else { return nil }
        return String(decoding: data, as: UTF8.self)
    }
}
