#if !canImport(Darwin)
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
        var dictionary: [String: Any] = [kSecClass as String: ItemClassCode.code(for: item.itemClass)]
        for field in ItemAttributes.fields {
            // "type" is kSecAttrKeyType only in a key's dictionary (elsewhere it is kSecAttrType).
            guard field.secItemClasses.contains(item.itemClass) || !SecItemRequest.unstoredKeys.contains(field.secItemKey),
                // Accessibility and synchronizable are always returned, with their defaults.
                let value = field.value(in: item.attributes) ?? field.valueWhenAbsent
            else { continue }
            if SecItemRequest.blobTextKeys.contains(field.secItemKey), case .text(let text) = value {
                dictionary[field.secItemKey] = BlobText.decode(text)
                continue
            }
            dictionary[field.secItemKey] = secItemValue(value, kind: field.kind)
        }
        return dictionary
    }

    /// A value as Security.framework returns it: `kSecAttrAccessible*` and `kSecAttrKeyClass*`
    /// codes, strings, `Data`, `Int`, `Date` and `Bool`.
    static func secItemValue(_ value: AttributeValue, kind: AttributeKind) -> Any {
        switch value {
        case .text(let text):
            switch kind {
            case .accessibility: Accessibility(rawValue: text).map(AccessibilityCode.code(for:)) ?? text
            case .keyClass: KeyClass(rawValue: text).map(KeyClassCode.code(for:)) ?? text
            default: text
            }
        case .bytes(let bytes): bytes
        case .integer(let integer): integer
        case .date(let date): date
        case .flag(let flag): flag
        }
    }
}

extension Accessibility {
    var code: String { AccessibilityCode.code(for: self) }
}
#endif
