#if !canImport(Security)
import Foundation
import LockboxCore

/// Builds results in the shapes Security.framework returns them
/// (developer.apple.com/documentation/security/item-return-result-keys):
/// one return key gives that value alone (`Data` or `[String: Any]`); several give one
/// dictionary of the attributes plus `v_Data` / `v_PersistentRef`; a limit above one gives an
/// array of those, even for a single match.
enum ResultEncoding {
    static func result(for items: [Item], request: SecItemRequest) -> CFTypeRef? {
        guard !request.returning.isEmpty else { return nil }
        let values = items.map { value(for: $0, returning: request.returning) }
        if request.limit == .one {
            return values.first.map { $0 as AnyObject }
        }
        return values as AnyObject
    }

    private static func value(for item: Item, returning: Query.ReturnOptions) -> Any {
        let data = item.data.map { secret in secret.withUnsafeBytes { Data($0) } } ?? Data()
        let reference = item.persistentReference ?? Data()
        switch returning {
        case .data: return data
        case .persistentReference: return reference
        case .attributes: return attributes(of: item)
        default:
            var dictionary = returning.contains(.attributes) ? attributes(of: item) : [:]
            if returning.contains(.data) { dictionary[kSecValueData] = data }
            if returning.contains(.persistentReference) { dictionary[kSecValuePersistentRef] = reference }
            return dictionary
        }
    }

    /// An item's attributes keyed by Apple's attribute names; unset ones are left out.
    static func attributes(of item: Item) -> [String: Any] {
        let a = item.attributes
        var dictionary: [String: Any] = [kSecClass: ItemClassCode.code(for: item.itemClass)]
        func put(_ key: String, _ value: Any?) {
            if let value { dictionary[key] = value }
        }
        put(kSecAttrAccessible, (a.accessibility ?? .default).code)
        put(kSecAttrAccessGroup, a.accessGroup)
        dictionary[kSecAttrSynchronizable] = a.synchronizable ?? false
        put(kSecAttrCreationDate, a.creationDate)
        put(kSecAttrModificationDate, a.modificationDate)
        put(kSecAttrLabel, a.label)
        put(kSecAttrDescription, a.itemDescription)
        put(kSecAttrComment, a.comment)
        put(kSecAttrAccount, a.account)
        put(kSecAttrService, a.service)
        put(kSecAttrGeneric, a.generic)
        put(kSecAttrSecurityDomain, a.securityDomain)
        put(kSecAttrServer, a.server)
        put(kSecAttrProtocol, a.protocol?.rawValue)
        put(kSecAttrAuthenticationType, a.authenticationType?.rawValue)
        put(kSecAttrPort, a.port)
        put(kSecAttrPath, a.path)
        put(kSecAttrCertificateType, a.certificateType)
        put(kSecAttrSubject, a.subject)
        put(kSecAttrIssuer, a.issuer)
        put(kSecAttrSerialNumber, a.serialNumber)
        put(kSecAttrKeyClass, a.keyClass.map(KeyClassCode.code(for:)))
        put(kSecAttrApplicationLabel, a.applicationLabel)
        put(kSecAttrApplicationTag, a.applicationTag)
        put(kSecAttrKeySizeInBits, a.keySizeInBits)
        put(kSecAttrEffectiveKeySize, a.effectiveKeySize)
        if item.itemClass == .key { put(kSecAttrKeyType, a.keyType?.rawValue) }
        return dictionary
    }
}

extension Accessibility {
    var code: String { AccessibilityCode.code(for: self) }
}
#endif
