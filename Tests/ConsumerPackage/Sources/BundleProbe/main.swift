// An application's first Keychain write, unchanged from iOS: the service is the bundle
// identifier, the access group the default one. Run with an Info.plist and an entitlements file
// beside the executable (scripts/consumer-package).
import Foundation
import Security

let service = Bundle.main.bundleIdentifier ?? "<no bundle identifier>"
print("bundle identifier: \(service)")
var added: CFTypeRef?
let status = SecItemAdd([
    kSecClass as String: kSecClassGenericPassword,
    kSecAttrService as String: service,
    kSecAttrAccount as String: "probe",
    kSecValueData as String: Data("probe".utf8),
    kSecReturnAttributes as String: true,
] as CFDictionary, &added)
print("add: \(status)")
if let attributes = added as? [String: Any] { print("access group: \(attributes[kSecAttrAccessGroup as String] as? String ?? "-")") }
let foreign = SecItemAdd([
    kSecClass as String: kSecClassGenericPassword,
    kSecAttrService as String: service,
    kSecAttrAccount as String: "foreign",
    kSecAttrAccessGroup as String: "OTHERTEAM.com.example.other",
    kSecValueData as String: Data("x".utf8),
] as CFDictionary, nil)
print("foreign group: \(foreign)")
SecItemDelete([kSecClass as String: kSecClassGenericPassword, kSecAttrService as String: service] as CFDictionary)
exit(status == errSecSuccess && foreign == errSecMissingEntitlement ? 0 : 1)
